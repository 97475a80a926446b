"""kvpersist's session manifests (<state>/sessions/*.json) as the tests read them."""

from __future__ import annotations

import json
import os

from kvptest import fake_llama


def manifests(state_dir: str) -> list[dict]:
    out = []
    d = os.path.join(state_dir, "sessions")
    if not os.path.isdir(d):
        return out
    for name in sorted(os.listdir(d)):
        if name.endswith(".json"):
            try:
                with open(os.path.join(d, name)) as f:
                    j = json.load(f)
            except (OSError, ValueError):
                continue
            j["_file"] = name
            out.append(j)
    return out


def manifest_for(state_dir: str, session: str) -> dict | None:
    for m in manifests(state_dir):
        if m.get("sessionId") == session:
            return m
    return None


def strict_manifests(state_dir: str) -> dict[str, dict]:
    """Every *.json under <state>/sessions, parsed strictly (UTF-8, JSON); raises if one does not
    parse. *.tmp files are left out: kvpersist never reads them."""
    out = {}
    d = os.path.join(state_dir, "sessions")
    if not os.path.isdir(d):
        return out
    for name in sorted(os.listdir(d)):
        if name.endswith(".json"):
            with open(os.path.join(d, name), "rb") as f:
                raw = f.read()
            try:
                out[name] = json.loads(raw.decode("utf-8"))
            except ValueError as e:
                raise AssertionError("manifest %s does not parse (%s): %r" % (name, e, raw[:200]))
    return out


def check_manifests_trustworthy(state_dir: str, save_dir: str):
    """Each manifest parses; a ready one points at a snapshot file that exists, that the fake can
    read back in full, with the token count the manifest records."""
    for name, m in strict_manifests(state_dir).items():
        assert m["sessionHash"] + ".json" == name, name
        if m["state"] == "ready":
            path = os.path.join(save_dir, m["snapshotFile"])
            assert os.path.isfile(path), "ready manifest %s points at a missing %s" % (name, m["snapshotFile"])
            tokens, nbytes = fake_llama.FakeLlamaServer.read_snapshot(path)
            assert len(tokens) == m["tokens"] and nbytes == m["bytes"], (name, len(tokens), m["tokens"])
        else:
            assert m["state"] == "invalid" and m.get("invalidReason"), m
