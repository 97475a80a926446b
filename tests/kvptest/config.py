"""kvpersist's YAML config file, written with PyYAML."""

from __future__ import annotations

import json
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


def env_config() -> dict:
    """Config merged under every kvpersist KvPersist starts (a test's own config wins), for
    whole-suite runs such as scripts/sanitize.sh: KVP_EXTRA_CONFIG is a JSON object
    (e.g. '{"threads": 4}'), KVP_THREADS=N is short for {"threads": N}."""
    extra: dict = {}
    raw = os.environ.get("KVP_EXTRA_CONFIG", "").strip()
    if raw:
        extra = json.loads(raw)
        if not isinstance(extra, dict):
            raise ValueError("KVP_EXTRA_CONFIG must be a JSON object: %r" % raw)
    threads = os.environ.get("KVP_THREADS", "").strip()
    if threads:
        extra["threads"] = int(threads)
    return extra


def deep_merge(base: dict, over: dict | None) -> dict:
    """A copy of `base` with `over` merged in (nested maps merged, everything else replaced)."""
    out = dict(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out
