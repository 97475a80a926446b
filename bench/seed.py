#!/usr/bin/python3
"""Benchmark 5: a new session seeded from a saved prefix, time to first token (TTFT).

Agent harnesses start every session with the same system prompt (and tools). For each shared
size S, two fresh llama-server processes (-np 1, same -c) run side by side, only one busy at
a time:

  kvpersist  llama-server --slot-save-path --no-cache-idle-slots --cache-ram 0, kvpersist in
             front (default `sharing: instance`): session A (a system prompt of S tokens and a
             short question) runs cold; an unrelated short session takes the slot (A is saved);
             then R times: a brand-new session B_i (the same system prompt, another question)
             runs its first turn (kvpersist restores the saved snapshot that shares the
             longest prefix: a seed), then its second turn (resident), then the unrelated
             session takes the slot again.
  cold       llama-server --cache-ram 0, no kvpersist: the same turns; every new session's
             first turn prefills the shared system prompt again.

Reported: the new session's first-turn TTFT, seeded vs cold (same request, same run), its
resident second turn (the floor of a seed: a restore plus a resident turn), and how much of
the prompt llama-server reused (cache_n). TTFT as in bench/switch.py: request sent to the
first SSE data event.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from kvptest.prompt_text import sized_text

import lib
from lib import BenchError, fmt_mmm, md_table, mmm
from switch import Conversation


def system_prompt(ls: lib.LlamaServer, target: int) -> str:
    return sized_text("You are a coding agent. Follow these rules and notes.\n\n",
                      "kvp-bench-seed-%d" % target, target, ls.tokenize, tolerance=max(3, target // 500))


def session(sid: str, system: str, question: str) -> Conversation:
    c = Conversation(sid, question)
    c.messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return c


def run_size(a, size: int, system: str, reps: int, work: str, out: dict) -> None:
    d = os.path.join(work, "seed-%d" % size)
    sd = os.path.join(d, "slots")
    os.makedirs(sd, exist_ok=True)
    servers = {
        "kvpersist": lib.LlamaServer(a.llama_server, a.model, a.ctx, d, name="llama-seed", slot_dir=sd,
                                     cache_ram=0),
        "cold": lib.LlamaServer(a.llama_server, a.model, a.ctx, d, name="llama-cold", cache_ram=0),
    }
    kv = None
    try:
        for cfg, ls in servers.items():
            ls.start()
            out["cmd_" + cfg] = ls.command_line()
        kv = lib.KvPersist(a.kvpersist, servers["kvpersist"].port, d)
        port = {"kvpersist": kv.port, "cold": servers["cold"].port}

        def turn(cfg: str, conv: Conversation, what: str) -> dict:
            r = conv.turn(port[cfg], a.max_tokens, a.timeout)
            lib.log("seed %-9s %6d  %-22s ttft %.3f s  prompt_n %s cache_n %s"
                    % (cfg, size, what, r["ttft"], r["prompt_n"], r["cache_n"]))
            return r

        def evict(cfg: str, i: int) -> None:
            turn(cfg, session("bench-other-%d-%d" % (size, i), "Be brief.", "Say hello %d." % i), "other")

        for cfg in servers:
            out.setdefault("first_" + cfg, []).append(
                turn(cfg, session("bench-A-%d" % size, system, "Task A: summarise the notes."), "A (cold)"))
            evict(cfg, 0)
        for i in range(reps):
            for cfg in servers:
                if cfg == "cold" and i >= a.cold_reps:
                    continue
                b = session("bench-B%d-%d" % (i, size), system, "Task B%d: list three rules." % i)
                mark = kv.lines() if cfg == "kvpersist" else 0
                r = turn(cfg, b, "new session B%d" % i)
                if cfg == "kvpersist":
                    time.sleep(0.05)
                    seeds = [f for ev, f in kv.events(mark)
                             if ev == "kv.session.restore.success" and f.get("source") == "seed"]
                    if not seeds:
                        raise BenchError("kvpersist did not seed new session B%d (log: %s)"
                                         % (i, [ev for ev, _ in kv.events(mark)]))
                    r["restore_ms"] = float(seeds[-1].get("ms", 0))
                r["resident"] = turn(cfg, b, "B%d again (resident)" % i)["ttft"]
                out.setdefault("new_" + cfg, []).append(r)
                evict(cfg, i + 1)
    finally:
        if kv:
            kv.stop()
        for ls in servers.values():
            ls.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lib.common_args(ap)
    lib.prompt_size_args(ap, "new sessions per size")
    ap.add_argument("--cold-reps", type=int, default=None, help="cold first turns per size")
    a = ap.parse_args()
    lib.install_signal_handlers()
    sizes = [int(x) for x in (a.sizes or ("1024" if a.quick else "4096,8192,16384")).split(",")]
    a.ctx = a.ctx or max(sizes) + 2048
    reps = a.reps or (1 if a.quick else 3)
    a.cold_reps = a.cold_reps or (1 if a.quick or max(sizes) > 8192 else 2)
    work = lib.work_dir(a, "seed")
    res = lib.Result("seed", "A new session seeded from a saved prefix", a.out, sys.argv, a.quick)
    data = {}
    try:
        for size in sizes:
            t0 = time.monotonic()
            out = data[size] = {}
            tmp = lib.LlamaServer(a.llama_server, a.model, 512, work, name="tokenizer-%d" % size).start()
            system = system_prompt(tmp, size)
            out["system_tokens"] = tmp.tokenize(system)
            tmp.stop()
            run_size(a, size, system, reps, work, out)
            out["seconds"] = time.monotonic() - t0
            lib.log("seed: %d tokens done in %.0f s" % (size, out["seconds"]))
    finally:
        lib.Proc.stop_all()

    ms = 1000.0
    rows = []
    for size, o in data.items():
        cold = mmm([r["ttft"] * ms for r in o["new_cold"]])
        seeded = mmm([r["ttft"] * ms for r in o["new_kvpersist"]])
        resident = mmm([r["resident"] * ms for r in o["new_kvpersist"]])
        restore = mmm([r["restore_ms"] for r in o["new_kvpersist"]])
        reuse = mmm([100.0 * (r["cache_n"] or 0) / ((r["prompt_n"] or 0) + (r["cache_n"] or 0) or 1)
                     for r in o["new_kvpersist"]])
        rows.append([o["system_tokens"], fmt_mmm(cold, 0), fmt_mmm(seeded, 0), fmt_mmm(restore, 1),
                     fmt_mmm(resident, 0), "%.1fx" % (cold["median"] / seeded["median"]),
                     "%.0f%%" % reuse["median"]])
        o["summary"] = {"cold": cold, "seeded": seeded, "resident": resident, "restore_ms": restore,
                        "reuse_pct": reuse, "speedup": cold["median"] / seeded["median"]}
    if not data:
        raise BenchError("no size was measured")
    first = data[next(iter(data))]
    res.table("First-turn TTFT of a new session sharing a system prompt with a saved one, ms, %s model "
              "(-c %d; median (min..max); %d new sessions per size, %d cold)"
              % (a.model_name, a.ctx, reps, a.cold_reps),
              md_table(["shared tokens", "cold (no kvpersist)", "seeded (kvpersist)", "restore_ms",
                        "resident 2nd turn", "cold / seeded", "prompt reused"], rows),
              command="kvpersist: %s + kvpersist serve; cold: %s" % (first["cmd_kvpersist"], first["cmd_cold"]))
    res.note("Each new session's first turn: the shared system prompt plus a question of about 10 tokens. "
             "\"restore_ms\" is llama-server's restore time as kvpersist logged it; the resident second turn is "
             "the same session's next request, the floor a seed can approach.")
    res.headline = {str(k): v["summary"] for k, v in data.items()}
    res.save()
    return 0


if __name__ == "__main__":
    lib.run_main(main)
