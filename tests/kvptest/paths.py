"""Where things are: the repository root and the kvpersist binary under test."""

from __future__ import annotations

import os

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def kvpersist_bin() -> str:
    # Absolute: kvpersist runs with its state dir as the working directory.
    return os.path.abspath(os.environ.get("KVPERSIST_BIN") or os.path.join(REPO_ROOT, "build", "kvpersist"))
