#!/usr/bin/python3
"""Benchmark 8: bytes a seed reads per byte of prefix it reuses (prefix snapshots).

A seed restores a whole saved snapshot (the donor), though llama-server keeps only the prefix
the new session shares with it; so kvpersist makes a snapshot of the shared prefix alone after
a wasteful seed, and later new sessions seed from that (README "New sessions start warm",
docs/design.md §3). This measures what the new sessions read, with the method of
tests/integration/test_prefix_snapshots.py (test_a_seed_reads_at_most_125x_the_prefix_it_reuses).
It is about bytes, not time, so the full run uses the ci model too (fast); -c is the largest
donor plus 4096, and above 16384 the model's training context (16384 for the ci model, which
llama-server's slots would be capped at) is raised with --override-kv llama.context_length.

For each donor size D, a fresh llama-server (-np 1, --slot-save-path, --no-cache-idle-slots,
--cache-ram 0) with kvpersist in front (default configuration, log.level debug):

  donor A     a system prompt of S shared tokens and a first message bringing it to D tokens
              (D = S: a short question), then an unrelated session takes the slot (A saved);
  new B_i     R times: a new session with the same system prompt and a short question of its
              own (a seed: kvpersist restores the snapshot sharing the longest prefix, the
              one that reads the fewest bytes among those), then, once kvpersist has made
              or skipped a prefix snapshot (kv.prefix.saved / kv.prefix.skipped), an unrelated
              session takes the slot again.

Bytes read: llama-server's n_read in its reply to POST /slots/0?action=restore, which
kvpersist logs as `bytes` on kv.session.restore.success (with the `from` snapshot and
`tokens`, n_restored). Bytes of the reused prefix: the tokens llama-server reused on that
turn (timings.cache_n) times the donor's bytes per token (its save reply's n_written /
n_saved, logged as `bytes` and `tokens` on kv.session.save.success). The issue's target: at
most 1.25x with a donor four times the shared prefix.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from kvptest.manifests import manifests
from kvptest.prompt_text import sized_text

import lib
from lib import BenchError, fmt_mmm, md_table, mmm
from seed import session, system_prompt

CTX_TRAIN = 16384   # both test models' llama.context_length (scripts/test-model.sh)


def run_donor(a, donor: int, system: str, filler: str, work: str, out: dict) -> None:
    d = os.path.join(work, "donor-%d" % donor)
    sd = os.path.join(d, "slots")
    os.makedirs(sd, exist_ok=True)
    extra = ["--override-kv", "llama.context_length=int:%d" % a.ctx] if a.ctx > CTX_TRAIN else []
    ls = lib.LlamaServer(a.llama_server, a.model, a.ctx, d, name="llama-seedbytes", slot_dir=sd, cache_ram=0,
                         extra=extra).start()
    out["cmd"] = ls.command_line()
    kv = lib.KvPersist(a.kvpersist, ls.port, d, extra={"log": {"level": "debug"}})
    try:
        def turn(conv, what):
            r = conv.turn(kv.port, a.max_tokens, a.timeout)
            lib.log("seedbytes %6d  %-22s ttft %.3f s  prompt_n %s cache_n %s"
                    % (donor, what, r["ttft"], r["prompt_n"], r["cache_n"]))
            return r

        def other(i):
            turn(session("bench-other-%d-%d" % (donor, i), "Be brief.", "Say hello %d." % i), "other %d" % i)

        question = "Task A: summarise the notes." if not filler else "Task A: summarise the notes.\n\n" + filler
        ra = turn(session("bench-donor-%d" % donor, system, question), "donor A")
        out["donor_tokens"] = (ra["prompt_n"] or 0) + (ra["cache_n"] or 0)
        other(0)
        for i in range(a.new):
            mark = kv.lines()
            r = turn(session("bench-new%d-%d" % (i, donor), system, "Task B%d: list three rules." % i), "new B%d" % i)
            time.sleep(0.05)
            seeds = [f for ev, f in kv.events(mark) if ev == "kv.session.restore.success" and f.get("source") == "seed"]
            if not seeds:
                raise BenchError("kvpersist did not seed new session B%d (log: %s)"
                                 % (i, [ev for ev, _ in kv.events(mark)]))
            r.update(read=int(seeds[-1]["bytes"]), restored=int(seeds[-1]["tokens"]), source=seeds[-1]["from"],
                     restore_ms=float(seeds[-1].get("ms", 0)))
            out.setdefault("new", []).append(r)
            # a prefix snapshot is wanted right after a wasteful seed's reply; made once the owner is saved
            time.sleep(0.5)
            if any(ev == "kv.prefix.wanted" for ev, _ in kv.events(mark)):
                lib.wait_until(lambda: any(ev in ("kv.prefix.saved", "kv.prefix.skipped") for ev, _ in kv.events(mark)),
                               120, "kvpersist to make a prefix snapshot (kv.prefix.saved)", [kv.proc, ls.proc])
            other(i + 1)
        time.sleep(0.2)
        evs = kv.events()
        out["prefix_events"] = [(ev, f) for ev, f in evs if ev.startswith("kv.prefix.")]
        out["saves"] = [f for ev, f in evs if ev == "kv.session.save.success"]
        out["manifests"] = {m.get("sessionHash", "")[:8]: m.get("sessionId", "") for m in manifests(
            os.path.join(d, "kvpersist-state"))}
    finally:
        kv.stop()
        ls.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lib.common_args(ap)
    lib.prompt_size_args(ap, "(unused: see --new)")
    ap.add_argument("--shared", type=int, default=None, help="shared system prompt tokens (default 4096; 256 quick)")
    ap.add_argument("--donors", default=None, help="donor sizes in tokens (default 4096,16384,32768; 256,1024 quick)")
    ap.add_argument("--new", type=int, default=None, help="new sessions per donor (default 3; 2 quick)")
    a = ap.parse_args()
    lib.install_signal_handlers()
    shared = a.shared or (256 if a.quick else 4096)
    donors = [int(x) for x in (a.donors or ("256,1024" if a.quick else "4096,16384,32768")).split(",")]
    a.ctx = a.ctx or max(max(donors) + 4096, 4096)
    a.new = a.new or (2 if a.quick else 3)
    work = lib.work_dir(a, "seedbytes")
    res = lib.Result("seedbytes", "Bytes a seed reads per byte it reuses (prefix snapshots)", a.out, sys.argv,
                     a.quick)
    tmp = lib.LlamaServer(a.llama_server, a.model, 512, work, name="tokenizer").start()
    system = system_prompt(tmp, shared)
    shared_tokens = tmp.tokenize(system)
    fillers = {D: sized_text("More notes.\n\n", "kvp-bench-donor-%d" % D, D - shared, tmp.tokenize,
                             tolerance=max(3, (D - shared) // 200)) if D > shared + 64 else "" for D in donors}
    tmp.stop()
    data = {}
    try:
        for D in donors:
            t0 = time.monotonic()
            data[D] = {}
            run_donor(a, D, system, fillers[D], work, data[D])
            lib.log("seedbytes: donor %d done in %.0f s" % (D, time.monotonic() - t0))
    finally:
        lib.Proc.stop_all()

    rows, head = [], {}
    for D, o in data.items():
        names = o["manifests"]
        donor_hash = o["new"][0]["source"]
        ds = [f for f in o["saves"] if f.get("session") == donor_hash]
        if not ds:
            raise BenchError("no save of the donor %s in kvpersist's log" % donor_hash)
        bpt = int(ds[0]["bytes"]) / int(ds[0]["tokens"])

        def kind(h):
            if h == donor_hash:
                return "donor"
            return "prefix snapshot" if names.get(h, "").startswith("prefix:") else "a new session's snapshot"
        for r in o["new"]:
            r["ratio"] = r["read"] / ((r["cache_n"] or 1) * bpt)
            r["kind"] = kind(r["source"])
        f, later = o["new"][0], o["new"][1:]
        lr = mmm([r["ratio"] for r in later])
        # prefix snapshots of the shared system prompt: made from the donor or a new session (the
        # unrelated sessions share a short system prompt of their own and may get one too)
        saved = [fl for ev, fl in o["prefix_events"] if ev == "kv.prefix.saved"
                 and not names.get(fl.get("from", ""), "").startswith("bench-other")]
        rows.append([o["donor_tokens"], shared_tokens, "%.0f" % bpt, "{:,}".format(f["read"]), f["cache_n"],
                     "%.2fx" % f["ratio"], f["kind"], fmt_mmm(mmm([r["cache_n"] or 0 for r in later]), 0),
                     fmt_mmm(lr, 2, "x"),
                     ", ".join(sorted(set(r["kind"] for r in later))) or "-",
                     "%s tokens" % saved[-1].get("tokens") if saved else "none"])
        head[str(D)] = {"donor_tokens": o["donor_tokens"], "shared_tokens": shared_tokens, "bytes_per_token": bpt,
                        "first": f["ratio"], "first_from": f["kind"], "later": lr,
                        "later_from": sorted(set(r["kind"] for r in later)), "prefix_saved": bool(saved)}
    if not data:
        raise BenchError("no donor size was measured")
    first = data[next(iter(data))]
    res.table("Bytes read / bytes of the reused prefix, new sessions sharing %d tokens with a donor, %s model "
              "(-c %d; %d new sessions per donor: the first, then the following ones, median (min..max))"
              % (shared_tokens, a.model_name, a.ctx, a.new),
              md_table(["donor tokens", "shared tokens", "bytes per token", "1st seed: bytes read", "1st: reused tokens",
                        "1st: read / reused", "1st: from", "following: reused tokens", "following: read / reused",
                        "following: from",
                        "prefix snapshot made"], rows),
              command="%s + kvpersist serve (default configuration, log.level debug)" % first["cmd"])
    res.note("Bytes read: llama-server's n_read for each seed's restore (kvpersist's kv.session.restore.success "
             "`bytes`); bytes per token: the donor's save (n_written / n_saved); reused: the seeded turn's "
             "timings.cache_n. \"a new session's snapshot\": an earlier new session's own snapshot (its system "
             "prompt and a short exchange) shared the prefix and read fewer bytes than the donor.")
    res.headline = head
    res.save()
    return 0


if __name__ == "__main__":
    lib.run_main(main)
