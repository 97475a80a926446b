#!/usr/bin/python3
"""Benchmark 7: what the default checkpoint policy costs a single conversation.

kvpersist's early checkpoint (checkpoint.earlyMs 1000, on by default) saves a slot's owner
soon after a turn end, but only while more sessions took turns recently than there are slots
(README "Early checkpoint"); one conversation alone should never pay for it. Two fresh
llama-server processes (-np 1, --slot-save-path, --no-cache-idle-slots, same -c) run side by
side, only one busy at a time, each with a kvpersist in front:

  default    kvpersist's default configuration (log.level debug only, to read its save calls)
  early off  the same with checkpoint.earlyMs 0

One conversation (a prompt of S tokens, then short follow-ups) takes N turns on each, the two
interleaved turn by turn (which one goes first alternates), each turn sent --pause seconds
(default 3) after the same conversation's previous reply ended, like a user reading it.

Reported: the TTFT of turns 2..N (the first is a cold prefill on both) per configuration,
median (min..max), the ratio default / early off (per turn pair and of the medians), and the
save calls each kvpersist made from the end of the first round (both cold first turns: while
one arm's runs, the other's idle checkpoint may fire) until --pause seconds after the last
reply (kv.session.save.start in its debug log), with the turns that waited for one (as in
bench/switch.py: a save call on the slot in flight at the send or started before the first
SSE data event). TTFT as in bench/switch.py: request sent to the first SSE data event.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import lib
from lib import BenchError, fmt_mmm, md_table, mmm
from switch import Conversation, make_prompt, save_calls, waited_for_save

ARMS = ("default", "early off")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lib.common_args(ap)
    lib.prompt_size_args(ap, "(unused: see --turns)")
    ap.add_argument("--turns", type=int, default=None, help="turns of the conversation (default 6; 3 with --quick)")
    ap.add_argument("--pause", type=float, default=3.0, help="seconds between a reply and the next turn")
    a = ap.parse_args()
    lib.install_signal_handlers()
    size = int((a.sizes or ("1024" if a.quick else "8192")).split(",")[0])
    a.ctx = a.ctx or size + 2048
    turns = a.turns or (3 if a.quick else 6)
    if turns < 2:
        raise BenchError("--turns must be at least 2")
    work = lib.work_dir(a, "policy")
    res = lib.Result("policy", "The default checkpoint policy and a single conversation", a.out, sys.argv, a.quick)
    tmp = lib.LlamaServer(a.llama_server, a.model, 512, work, name="tokenizer").start()
    prompt = make_prompt(tmp, "P", size)
    prompt_tokens = tmp.tokenize(prompt)
    tmp.stop()
    servers, proxies, rows = {}, {}, {arm: [] for arm in ARMS}
    try:
        for i, arm in enumerate(ARMS):
            sd = os.path.join(work, "slots-%d" % i)
            os.makedirs(sd, exist_ok=True)
            servers[arm] = lib.LlamaServer(a.llama_server, a.model, a.ctx, work, name="llama-%d" % i,
                                           slot_dir=sd).start()
            extra = {"log": {"level": "debug"}}
            if arm == "early off":
                extra["checkpoint"] = {"earlyMs": 0}
            proxies[arm] = lib.KvPersist(a.kvpersist, servers[arm].port, work, name="kvpersist-%d" % i, extra=extra)
        marks = {arm: proxies[arm].lines() for arm in ARMS}
        conv = {arm: Conversation("bench-policy-%d" % size, prompt) for arm in ARMS}
        last_end = {arm: 0.0 for arm in ARMS}
        for k in range(turns):
            for arm in (ARMS if k % 2 == 0 else tuple(reversed(ARMS))):
                time.sleep(max(0.0, last_end[arm] + a.pause - time.monotonic()))
                kv = proxies[arm]
                mark = kv.lines()
                r = conv[arm].turn(kv.port, a.max_tokens, a.timeout)
                last_end[arm] = r["t_end"]
                time.sleep(0.05)
                r.update(waited_for_save(kv, marks[arm], r))
                r["turn"] = k + 1
                r["events"] = [e for e, _ in kv.events(mark) if e.startswith("kv.session.")]
                rows[arm].append(r)
                lib.log("policy %-9s %5d turn %d  TTFT %8.1f ms  prompt_n %s cache_n %s%s"
                        % (arm, size, k + 1, r["ttft"] * 1000, r["prompt_n"], r["cache_n"],
                           "  (waited for a save)" if r["waited"] else ""))
            if k == 0:
                # saves are counted from here: while the other arm's cold first turn runs (tens of
                # seconds), an arm's idle checkpoint (idleMs, 30 s) may save it, as it always has
                save_marks = {arm: proxies[arm].lines() for arm in ARMS}
        time.sleep(max(0.0, max(last_end.values()) + a.pause - time.monotonic()))
        saves = {arm: len(save_calls(proxies[arm], save_marks[arm])) for arm in ARMS}
        cmd = servers["default"].command_line()
    finally:
        lib.Proc.stop_all()

    ms = 1000.0
    later = {arm: mmm([r["ttft"] * ms for r in rows[arm][1:]]) for arm in ARMS}
    first = {arm: rows[arm][0]["ttft"] * ms for arm in ARMS}
    pairs = mmm([d["ttft"] / o["ttft"] for d, o in zip(rows["default"][1:], rows["early off"][1:])])
    waited = {arm: sum(1 for r in rows[arm] if r["waited"]) for arm in ARMS}
    table = []
    for arm in ARMS:
        table.append([arm, "%d" % prompt_tokens, "%.0f" % first[arm], fmt_mmm(later[arm], 0),
                      "%d" % saves[arm], "%d of %d" % (waited[arm], turns)])
    res.table("One conversation, %d turns %g s apart: TTFT, ms, %s model (-c %d; turns 2..%d: median (min..max))"
              % (turns, a.pause, a.model_name, a.ctx, turns),
              md_table(["kvpersist", "prompt tokens", "turn 1 (cold)", "turns 2..%d" % turns,
                        "save calls during turns 2..%d" % turns, "turns that waited for a save"], table),
              command="%s + kvpersist serve (default: log.level debug only; early off: checkpoint.earlyMs 0)" % cmd)
    ratio = later["default"]["median"] / later["early off"]["median"]
    res.table("default / early off, turns 2..%d" % turns,
              md_table(["ratio of the medians", "per turn pair: median (min..max)"],
                       [["%.2fx" % ratio, fmt_mmm(pairs, 2, "x")]]))
    res.note("Save calls: kv.session.save.start lines in each kvpersist's debug log from the end of the first "
             "round (both arms' cold first turns) until %g s after the last reply; a single conversation on a "
             "single slot is never contended, so the default's early checkpoint should make none (its idle "
             "checkpoint, 30 s, does not fire between turns %g s apart)." % (a.pause, a.pause))
    res.headline = {"tokens": prompt_tokens, "turns": turns, "pause_s": a.pause, "default": later["default"],
                    "early_off": later["early off"], "ratio": ratio, "pair_ratio": pairs,
                    "saves_default": saves["default"], "saves_early_off": saves["early off"],
                    "waited_default": waited["default"], "waited_early_off": waited["early off"],
                    "saves_counted": "turns 2..%d" % turns, "model": a.model_name}
    res.save()
    return 0


if __name__ == "__main__":
    lib.run_main(main)
