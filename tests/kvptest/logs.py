"""kvpersist's log lines (plain `TS LEVEL EVENT k=v ...` or JSON), parsed into LogLine."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

LOG_RE = re.compile(r"^(\S+)\s+(ERROR|WARN|INFO|DEBUG)\s+(\S+)(.*)$")
FIELD_RE = re.compile(r'([A-Za-z_][\w.\-]*)=("(?:[^"\\]|\\.)*"|\S*)')


@dataclass
class LogLine:
    raw: str
    time: float            # monotonic time KvPersist read it
    level: str = ""
    event: str = ""
    fields: dict = field(default_factory=dict)


def parse_log_line(raw: str, t: float = 0.0) -> LogLine:
    line = LogLine(raw=raw, time=t)
    s = raw.strip()
    if s.startswith("{"):
        try:
            j = json.loads(s)
            line.level = str(j.get("level", "")).upper()
            line.event = str(j.get("event", ""))
            line.fields = {k: str(v) for k, v in j.items() if k not in ("ts", "level", "event")}
            return line
        except ValueError:
            pass
    m = LOG_RE.match(s)
    if not m:
        return line
    line.level, line.event = m.group(2), m.group(3)
    for k, v in FIELD_RE.findall(m.group(4)):
        if v.startswith('"'):
            try:
                v = json.loads(v)
            except ValueError:
                v = v[1:-1]
        line.fields[k] = v
    return line


