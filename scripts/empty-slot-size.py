#!/usr/bin/python3
"""empty-slot-size.py - the size of the file llama-server writes when it saves an empty slot.

kvpersist's disk budget and purge in server-owned mode (README "Retention", docs/design.md §12)
have llama-server save an erased slot over a snapshot's files; this prints what such a file
holds: llama-server (KVP_LLAMA_SERVER, KVP_MODEL) started with a slot directory, slot 0 erased
and saved, the reply's n_written and the file's size.

Usage: PYTHONPATH=tests /usr/bin/python3 scripts/empty-slot-size.py
       (scripts/record-figures.sh empty-slot keeps its output)
"""

import os
import sys
import tempfile

from kvptest.http_client import http_request
from kvptest.upstreams import RealUpstream


def main() -> int:
    with tempfile.TemporaryDirectory() as work:
        llama = RealUpstream(work, extra_args=["-np", "1"]).start()
        try:
            erase = http_request(llama.port, "POST", "/slots/0?action=erase", body={}, timeout=30)
            save = http_request(llama.port, "POST", "/slots/0?action=save", body={"filename": "empty.bin"}, timeout=30)
            size = os.path.getsize(os.path.join(llama.save_dir, "empty.bin"))
        finally:
            llama.stop()
    print("erase: %d %s" % (erase.status, erase.body.decode()[:200]))
    print("save: %d %s" % (save.status, save.body.decode()[:300]))
    print("empty slot file: %d bytes" % size)
    return 0 if erase.status == 200 and save.status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
