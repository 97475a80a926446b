"""kvpersist's YAML config file, written with PyYAML."""

from __future__ import annotations

import os
import uuid

import yaml


def to_yaml(obj: dict) -> str:
    """Block-style YAML in the dict's own key order. safe_dump quotes every string that would
    read back as another type ("on", "1", "null", "") and never folds a long line."""
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=1 << 30)


def write_config(obj: dict, directory: str, name: str | None = None) -> str:
    """Writes to_yaml(obj) to DIRECTORY/NAME (default kvpersist-<random>.yaml); returns the path."""
    path = os.path.join(directory, name or "kvpersist-%s.yaml" % uuid.uuid4().hex[:8])
    with open(path, "w") as f:
        f.write(to_yaml(obj))
    return path
