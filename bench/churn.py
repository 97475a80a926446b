#!/usr/bin/python3
"""Benchmark 9: disk used against retention.maxTotalBytes over a churn of sessions.

kvpersist's default server-owned mode (llama-server --slot-save-path; kvpersist never sees
the files) keeps the snapshot files under retention.maxTotalBytes by having llama-server
overwrite the least recently used sessions' files with an empty slot right after each save
(README "Retention", docs/design.md §12 "Disk budget"); tests/integration/test_disk_budget_real.py
checks it with short prompts. This measures it with prompts of varied length:

One llama-server (ci model, -np 1, --slot-save-path, --no-cache-idle-slots, --cache-ram 0)
with kvpersist in front (default configuration; no shared filesystem). First a calibration:
two sessions of the mean prompt length through a kvpersist with no budget give the bytes of
one snapshot; then the slot directory is emptied and a new kvpersist (new state directory)
runs with retention.maxTotalBytes = --budget-sessions (default 10) such snapshots. Then N
distinct sessions (default 100; 40 with --quick), one after the other, each with a prompt of
a length drawn uniformly from --tokens (default 1000-3000; 150-450 with --quick) and one or
two turns (chosen at random, seed 24).

Sampled: the bytes of every file in the slot directory (the empty-slot headers overwrites
leave included) every 20 ms by a background thread and after each session, with kvpersist's
own view after each session (the kvpersist_snapshot_bytes gauge, /metrics). Reported: the
maximum bytes / budget (target: never over 1), the files in the directory at the end (and how
many are empty-slot headers), the evictions (kv.gc.evicted) and any kv.gc.over_budget.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import threading
import time

from kvptest.prompt_text import sized_text

import lib
from lib import md_table
from switch import Conversation


def dir_usage(path: str) -> tuple[int, int, int]:
    """(bytes, files, files under 1 KiB: empty-slot headers) of the files in path."""
    total = files = small = 0
    for n in os.listdir(path):
        try:
            sz = os.path.getsize(os.path.join(path, n))
        except OSError:
            continue     # replaced or removed while listing
        total += sz
        files += 1
        small += sz < 1024
    return total, files, small


def metric(kv: lib.KvPersist, name: str) -> float | None:
    vals = [float(m.group(1)) for m in re.finditer(r"^%s(?:\{[^}]*\})? ([0-9.e+-]+)$" % name, kv.metrics(), re.M)]
    return sum(vals) if vals else None


class Sampler(threading.Thread):
    """The slot directory's bytes every `interval` s; keeps the maximum."""

    def __init__(self, path: str, interval: float = 0.02):
        super().__init__(daemon=True)
        self.path, self.interval = path, interval
        self.max_bytes, self.samples = 0, 0
        self.stop_ev = threading.Event()

    def run(self) -> None:
        while not self.stop_ev.is_set():
            self.max_bytes = max(self.max_bytes, dir_usage(self.path)[0])
            self.samples += 1
            self.stop_ev.wait(self.interval)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lib.common_args(ap)
    lib.prompt_size_args(ap, "(unused)")
    ap.add_argument("--sessions", type=int, default=None, help="distinct sessions (default 100; 40 with --quick)")
    ap.add_argument("--tokens", default=None, help="prompt length range MIN-MAX (default 1000-3000; 150-450 quick)")
    ap.add_argument("--budget-sessions", type=float, default=10, help="budget in snapshots of the mean prompt length")
    a = ap.parse_args()
    lib.install_signal_handlers()
    n_sessions = a.sessions or (40 if a.quick else 100)
    lo, hi = (int(x) for x in (a.tokens or ("150-450" if a.quick else "1000-3000")).split("-"))
    a.ctx = a.ctx or max(4096, hi + 1024)
    rng = random.Random(24)
    work = lib.work_dir(a, "churn")
    res = lib.Result("churn", "Disk used against the budget over a churn of sessions", a.out, sys.argv, a.quick)
    sd = os.path.join(work, "slots")
    os.makedirs(sd, exist_ok=True)
    ls = lib.LlamaServer(a.llama_server, a.model, a.ctx, work, name="llama-churn", slot_dir=sd, cache_ram=0).start()
    sampler = None
    try:
        def prompt(i: int, n: int) -> str:
            return sized_text("Session %d. Read these notes.\n\n" % i, "kvp-bench-churn-%d" % i, n, ls.tokenize,
                              tolerance=max(5, n // 50))

        def turn(kv, conv, what):
            r = conv.turn(kv.port, a.max_tokens, a.timeout)
            lib.log("churn %-14s ttft %.3f s  prompt_n %s cache_n %s" % (what, r["ttft"], r["prompt_n"], r["cache_n"]))
            return r

        # calibration: one snapshot of the mean length
        mean = (lo + hi) // 2
        cal = lib.KvPersist(a.kvpersist, ls.port, work, name="kvpersist-calibration")
        for i in range(2):
            turn(cal, Conversation("bench-cal-%d" % i, prompt(-1 - i, mean)), "calibration %d" % i)
        lib.wait_until(lambda: any(e == "kv.session.save.success" for e, _ in cal.events()), 60,
                       "the calibration session's save", [cal.proc])
        f = next(f for e, f in cal.events() if e == "kv.session.save.success")
        snapshot = int(f["bytes"])
        cal.stop()
        for n in os.listdir(sd):
            os.remove(os.path.join(sd, n))
        budget = int(a.budget_sessions * snapshot)
        kv = lib.KvPersist(a.kvpersist, ls.port, work, name="kvpersist-churn",
                           extra={"retention": {"maxTotalBytes": budget}})
        sampler = Sampler(sd)
        sampler.start()
        rows, turns, lengths = [], 0, []
        for i in range(n_sessions):
            n = rng.randint(lo, hi)
            k = rng.choice((1, 2))
            conv = Conversation("bench-churn-%d" % i, prompt(i, n))
            for j in range(k):
                r = turn(kv, conv, "s%d turn %d" % (i, j + 1))
                if j == 0:
                    lengths.append((r["prompt_n"] or 0) + (r["cache_n"] or 0))
            turns += k
            used, files, small = dir_usage(sd)
            view = metric(kv, "kvpersist_snapshot_bytes")
            rows.append([i + 1, used, view if view is not None else -1, budget, files])
        time.sleep(1.0)
        sampler.stop_ev.set()
        sampler.join(5)
        used, files, small = dir_usage(sd)
        evs = kv.events()
        evicted = sum(1 for e, _ in evs if e == "kv.gc.evicted")
        over = sum(1 for e, _ in evs if e == "kv.gc.over_budget")
        failed = sum(1 for e, _ in evs if e in ("kv.gc.overwrite_failed", "kv.session.save.failed"))
        kv.stop()
        cmd = ls.command_line()
    finally:
        if sampler:
            sampler.stop_ev.set()
        lib.Proc.stop_all()

    peak_sessions = max(r[1] for r in rows)
    peak = max(peak_sessions, sampler.max_bytes)
    view_peak = max(r[2] for r in rows)
    res.table("Bytes in llama-server's --slot-save-path over %d sessions (%d turns), budget %s bytes (%g snapshots "
              "of %d tokens), %s model" % (n_sessions, turns, "{:,}".format(budget), a.budget_sessions, mean,
                                          a.model_name),
              md_table(["budget", "max bytes (every 20 ms)", "max / budget", "max after a session",
                        "kvpersist's view, max", "files at the end", "of which empty-slot headers",
                        "bytes at the end", "sessions evicted", "kv.gc.over_budget", "failed saves or overwrites"],
                       [["{:,}".format(budget), "{:,}".format(peak), "%.2f" % (peak / budget),
                         "{:,}".format(peak_sessions), "{:,}".format(int(view_peak)) if view_peak >= 0 else "-",
                         files, small, "{:,}".format(used), evicted, over, failed]]),
              command="%s + kvpersist serve (retention.maxTotalBytes %d)" % (cmd, budget))
    res.note("Prompts of %d..%d tokens (uniform, seed 24; first turns measured %d..%d), one or two turns each; a "
             "snapshot of %d tokens was %s bytes (calibration). The background sampler read the directory %d times. "
             "kvpersist's view is the kvpersist_snapshot_bytes gauge after each session." % (
                 lo, hi, min(lengths), max(lengths), mean, "{:,}".format(snapshot), sampler.samples))
    res.dat("churn.dat", "session dir_bytes kvpersist_view budget files", rows)
    res.headline = {"budget": budget, "snapshot_bytes": snapshot, "budget_sessions": a.budget_sessions,
                    "max_bytes": peak, "max_ratio": peak / budget, "files_end": files, "headers_end": small,
                    "evicted": evicted, "over_budget": over, "sessions": n_sessions, "turns": turns,
                    "tokens": [lo, hi], "model": a.model_name}
    res.save()
    return 0


if __name__ == "__main__":
    lib.run_main(main)
