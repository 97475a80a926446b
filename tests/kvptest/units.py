"""systemd unit files, read as systemd reads them (sections, repeated keys, continuation lines)."""

from __future__ import annotations


def parse_unit(path) -> dict:
    """{section: [(key, value), ...]} with continuation lines joined; keys may repeat."""
    out: dict = {}
    section = None
    pending = ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if pending:
                line = pending + line.lstrip()
                pending = ""
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            s = line.strip()
            if not s or s[0] in "#;":
                continue
            if s.startswith("[") and s.endswith("]"):
                section = s[1:-1]
                out.setdefault(section, [])
                continue
            k, _, v = s.partition("=")
            assert section, "directive outside a section: %r" % s
            out[section].append((k.strip(), v.strip()))
    return out


def directive(unit: dict, section: str, key: str, all_values=False):
    vals = [v for k, v in unit.get(section, []) if k == key]
    return vals if all_values else (vals[-1] if vals else None)
