"""kvpersist's session identity, as core/identity.cpp computes it, and test session ids."""

from __future__ import annotations

import hashlib
import uuid

FAKE_MODEL = "/models/fake-model-Q8_0.gguf"   # fake_llama.FakeLlamaServer's default model_path


def _field(v: bytes) -> bytes:
    return b"%d:" % len(v) + v + b";"


def _bytes(v: str | bytes) -> bytes:
    return v if isinstance(v, bytes) else v.encode("utf-8")


def session_hash(session: str | bytes, model: str = FAKE_MODEL, instance: str = "default") -> str:
    """core::session_hash: the hex SHA-256 over length-prefixed fields that names a session's
    manifest and snapshots. `session` may be bytes (ids that are not valid UTF-8)."""
    data = b"kvpersist-session-v1;" + _field(_bytes(instance)) + _field(_bytes(model)) + _field(_bytes(session))
    return hashlib.sha256(data).hexdigest()


MAX_SESSION_ID_BYTES = 256  # core::max_session_id_bytes


def kept_session_id(session: str | bytes) -> bytes:
    """core::bounded_session_id: the session id kvpersist keeps for a header value; one over
    256 bytes becomes "sha256:" and the hex digest of the whole value."""
    raw = _bytes(session)
    if len(raw) <= MAX_SESSION_ID_BYTES:
        return raw
    return b"sha256:" + hashlib.sha256(raw).hexdigest().encode()


def abbrev(h: str) -> str:
    """What kvpersist logs and reports of a session hash: its first 8 hex digits."""
    return h[:8]


def sid_factory(prefix: str, digits: int = 12):
    """sid(tag) -> "PREFIX-TAG-<digits random hex>": a fresh session id per call, so tests never
    share a snapshot (its name is the hash of the id)."""
    def sid(tag: str) -> str:
        return "%s-%s-%s" % (prefix, tag, uuid.uuid4().hex[:digits])
    return sid


sid = sid_factory("sess")
