#!/usr/bin/python3
"""Benchmark 3: session switch and restart, time to first token (TTFT).

Two sessions, A and B, each with a prompt of S tokens, take turns on one llama-server slot.
For each prompt size S, three fresh llama-server processes (-np 1, same -c) run side by side,
only one of them busy at a time, and their turns are interleaved so that machine noise hits
them alike:

  kvpersist  llama-server --slot-save-path --no-cache-idle-slots, kvpersist in front with
             checkpoint.idleMs 0 and earlyMs 0 (no checkpoint ahead of time), so that every
             switch saves on its path: A (cold), B (cold),
             then R times: A returns (save B + restore A), A again (resident), B returns (save
             A + restore B), B again (resident). Then llama-server is restarted (snapshot files
             evicted from the page cache first: a real disk read) and A returns (and again for
             B): kvpersist notices the restart and restores from disk.
  default    the same with kvpersist's default configuration (no checkpoint settings: the early
             checkpoint, checkpoint.earlyMs 1000, runs since two sessions take turns on one
             slot), and each switch is sent like a user would: --pause seconds (default 3)
             after the previous turn's reply ended, whatever the checkpoint is doing. Each
             return of a session is preceded by two turns of the departing one: a resident
             turn, then its next turn sent the moment its early checkpoint starts ("mid-save":
             what the early checkpoint costs an owner who comes back at the worst moment);
             the switch follows that turn's reply after the pause. For every switch the
             driver records whether it waited for a save: whether a save call on the slot
             (kv.session.save.start to the end of its /slots call, kv.backend.call
             action=save, in kvpersist's debug log) was in flight or started between the
             request being sent and its first SSE data event.
  ram-cache  llama-server's own prompt cache, no kvpersist (defaults: --cache-ram 8192, idle
             slots cached): the same turns, then a restart, then A returns (the RAM cache is
             empty, so this is a cold prefill).
  cold       llama-server --cache-ram 0, no kvpersist: A, B, then A (and B) return and are
             prefilled again from scratch.

TTFT is the time from sending the request to the first SSE data event at the client (streamed
chat completion, max_tokens 4; SSE comments, such as the ":" keep-alive ping llama-server sends
after 30 s without data, are not data events). kvpersist's own share of a switch is
    switch TTFT - (save_ms + restore_ms as llama-server reported them) - resident TTFT
(the resident turn that immediately follows, which prefills the same number of new tokens):
what is left is kvpersist's coordination, the extra HTTP calls, and noise. save + restore is
the physical floor of a save/restore design.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from kvptest.prompt_text import sized_text

import lib
from lib import BenchError, fmt, fmt_mmm, md_table, mmm

FOLLOWUPS = ["Thanks. Now list the three most frequent words.", "Good. Which word appears first?",
             "Fine. Which word appears last?", "And the longest word?", "Count the sentences.",
             "Name a word that appears twice.", "Summarise in one line.", "Any word with five letters?"]


def make_prompt(ls: lib.LlamaServer, session: str, target: int) -> str:
    return sized_text("Session %s. Read these notes and summarise them.\n\n" % session,
                      "kvp-bench-%s-%d" % (session, target), target, ls.tokenize,
                      tolerance=max(3, target // 500))


class Conversation:
    def __init__(self, sid: str, prompt: str):
        self.sid = sid
        self.messages = [{"role": "user", "content": prompt}]
        self.k = 0

    def turn(self, port: int, max_tokens: int, timeout: float) -> dict:
        body = {"messages": self.messages, "stream": True, "max_tokens": max_tokens, "temperature": 0,
                "seed": 1, "logit_bias": lib.BAN_BYTE_TOKENS}
        wall_off = time.time() - time.monotonic_ns() / 1e9   # log timestamps are wall-clock
        r = lib.sse_request(port, "/v1/chat/completions", body, {"X-Session-Id": self.sid}, timeout=timeout)
        t_end = time.monotonic()
        if not r["events"]:
            raise BenchError("no SSE events from port %d" % port)
        ttft = next(((t - r["t_send"]) / 1e9 for t, ev, _ in r["events"] if ev.startswith(b"data:")), None)
        if ttft is None:
            raise BenchError("no SSE data event from port %d" % port)
        first_tok = next(((t - r["t_send"]) / 1e9 for t, ev, _ in r["events"] if lib._has_content(ev)), None)
        reply, timings = [], {}
        for _, ev, _ in r["events"]:
            j = lib.event_json(ev)
            if not j:
                continue
            if "error" in j:
                raise BenchError("error event: %s" % json.dumps(j["error"])[:300])
            reply.append(lib.chunk_content(j))
            if j.get("timings"):
                timings = j["timings"]
        self.messages.append({"role": "assistant", "content": "".join(reply)})
        self.messages.append({"role": "user", "content": FOLLOWUPS[self.k % len(FOLLOWUPS)]})
        self.k += 1
        return {"ttft": ttft, "first_token": first_tok, "pings": len(r["comments"]), "prompt_n": timings.get("prompt_n"),
                "cache_n": timings.get("cache_n"), "prompt_ms": timings.get("prompt_ms"),
                "t_send_wall": r["t_send"] / 1e9 + wall_off, "t_end": t_end}


def evict_page_cache(d: str) -> int:
    n = 0
    for f in os.listdir(d):
        p = os.path.join(d, f)
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return n


def kv_switch_ms(kv: lib.KvPersist, mark: int) -> tuple[float, float, float, list[str]]:
    """(save_ms + restore_ms as llama-server reported them, wall time of the management HTTP
    calls as kvpersist measured them (debug kv.backend.call lines), the events), since mark."""
    save = restore = calls = 0.0
    evs = []
    for e, f in kv.events(mark):
        if e.startswith("kv.session.") or e.startswith("kv.backend.") or e.startswith("kv.snapshot."):
            if e != "kv.backend.call":
                evs.append(e)
        if e == "kv.session.save.success":
            save += float(f.get("ms", 0))
        elif e == "kv.session.restore.success":
            restore += float(f.get("ms", 0))
        elif e == "kv.backend.call" and f.get("action") in ("save", "restore", "erase"):
            calls += float(f.get("ms", 0))
    return save, restore, calls, evs


def timed_lines(kv: lib.KvPersist, mark: int):
    """(ms timestamp, event, raw line) of kvpersist's log lines after line `mark`."""
    import datetime
    for raw in lib.read(kv.log_path).splitlines()[mark:]:
        parts = raw.split()
        if len(parts) < 3:
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                tzinfo=datetime.timezone.utc).timestamp() * 1000
        except ValueError:
            continue
        yield t, parts[2], raw


def manifest_ms(kv: lib.KvPersist, mark: int) -> float:
    """Time between the end of the save call (its kv.backend.call line) and kv.session.save.success,
    from the log's millisecond timestamps: kvpersist's manifest write (temp file, fsync, rename,
    directory fsync) after a save."""
    total, t_call = 0.0, None
    for t, event, line in timed_lines(kv, mark):
        if event == "kv.backend.call" and "action=save" in line:
            t_call = t
        elif event == "kv.session.save.success" and t_call is not None:
            total += t - t_call
            t_call = None
    return total


def wait_event(kv: lib.KvPersist, mark: int, event: str, timeout: float) -> None:
    """Waits until kvpersist logs `event` after line `mark`."""
    lib.wait_until(lambda: any(e == event for e, _ in kv.events(mark)), timeout,
                   "kvpersist to log %s" % event, [kv.proc], interval=0.002)


def save_calls(kv: lib.KvPersist, mark: int, slot: str = "0") -> list[list]:
    """[start ms, end ms or None] of each save call on the slot after line `mark`, from kvpersist's
    debug log: kv.session.save.start to the end of its /slots call (kv.backend.call action=save);
    saves of one slot never overlap."""
    calls = []
    for t, event, raw in timed_lines(kv, mark):
        if event == "kv.session.save.start" and re.search(r" slot=%s\b" % slot, raw):
            calls.append([t, None])
        elif event == "kv.backend.call" and "action=save" in raw and re.search(r" slot=%s\b" % slot, raw):
            for c in calls:
                if c[1] is None:
                    c[1] = t
                    break
    return calls


def waited_for_save(kv: lib.KvPersist, mark: int, r: dict) -> dict:
    """Did the request r wait for a save? A save call on its slot that was in flight when it was
    sent or started before its first SSE data event (log timestamps: 1 ms). `mark` must be from
    before any save that could still be in flight at the send."""
    t_send = r["t_send_wall"] * 1000
    t_first = t_send + r["ttft"] * 1000
    hit = [c for c in save_calls(kv, mark) if c[0] < t_first and (c[1] is None or c[1] > t_send)]
    return {"waited": bool(hit), "save_started_ms": [round(c[0] - t_send, 1) for c in hit],
            "save_call_ms": [None if c[1] is None else round(c[1] - c[0], 1) for c in hit]}


def own_ms(kv: lib.KvPersist, mark: int) -> float | None:
    """kvpersist's own time on a switch before the request is forwarded, from its log (1 ms
    timestamps): from the lease's grant (kv.slot.acquire) to the end of the later of the restore
    and the departing session's commit (kv.session.restore.success, kv.session.save.success),
    minus the wall time of the /slots calls in between. What is left is the strand's work, the
    file pool's round trips and, when it outlasts the restore, the commit."""
    t_acquire, t_end, calls = None, None, 0.0
    for t, event, raw in timed_lines(kv, mark):
        if event == "kv.slot.acquire" and t_acquire is None:
            t_acquire = t
        elif event in ("kv.session.restore.success", "kv.session.save.success") and t_acquire is not None:
            t_end = t if t_end is None else max(t_end, t)
        elif event == "kv.backend.call" and t_acquire is not None and re.search(r"action=(save|restore|erase)", raw):
            m = re.search(r" ms=([0-9.]+)", raw)
            calls += float(m.group(1)) if m else 0.0
        elif event == "kv.request.done":
            break
    return None if t_acquire is None or t_end is None else t_end - t_acquire - calls


def log_turn(cfg: str, size: int, what: str, r: dict) -> None:
    lib.log("switch %s %5d %-16s TTFT %8.1f ms  prompt_n %s cache_n %s" % (
        cfg, size, what, r["ttft"] * 1000, r.get("prompt_n"), r.get("cache_n")))


def run_size(a, size: int, prompts: dict, reps: int, work: str, out: dict) -> None:
    """The four configurations run side by side (four llama-server processes, only one busy at a
    time), their turns interleaved, so that machine noise hits them alike."""
    d = os.path.join(work, "size-%d" % size)
    sd = os.path.join(d, "slots")
    os.makedirs(sd, exist_ok=True)
    sd_default = os.path.join(d, "slots-default")
    os.makedirs(sd_default, exist_ok=True)
    servers = {
        "kvpersist": lib.LlamaServer(a.llama_server, a.model, a.ctx, d, name="llama-kvpersist", slot_dir=sd),
        "default": lib.LlamaServer(a.llama_server, a.model, a.ctx, d, name="llama-default", slot_dir=sd_default),
        "ramcache": lib.LlamaServer(a.llama_server, a.model, a.ctx, d, name="llama-ramcache", no_cache_idle=False),
        "cold": lib.LlamaServer(a.llama_server, a.model, a.ctx, d, name="llama-cold", cache_ram=0),
    }
    kv = kvd = None
    try:
        for cfg, ls in servers.items():
            ls.start()
            out["cmd_" + cfg] = ls.command_line()
        kv = lib.KvPersist(a.kvpersist, servers["kvpersist"].port, d,
                           extra={"log": {"level": "debug"}, "checkpoint": {"idleMs": 0, "earlyMs": 0}})
        # the default configuration: debug level only, to read the save calls
        kvd = lib.KvPersist(a.kvpersist, servers["default"].port, d, name="kvpersist-default",
                            extra={"log": {"level": "debug"}})
        port = {"kvpersist": kv.port, "default": kvd.port, "ramcache": servers["ramcache"].port,
                "cold": servers["cold"].port}
        proxy = {"kvpersist": kv, "default": kvd}
        conv = {cfg: {s: Conversation("bench-%s-%d" % (s, size), prompts[s]) for s in "AB"} for cfg in servers}

        def turn(cfg, s, what):
            r = conv[cfg][s].turn(port[cfg], a.max_tokens, a.timeout)
            log_turn(cfg, size, s + " " + what, r)
            return r

        for s in "AB":                      # first turns: cold everywhere
            for cfg in servers:
                r = turn(cfg, s, "first")
                out.setdefault(cfg + "_first", []).append(r)
                if cfg == "cold" and s == "B":
                    out.setdefault("cold_return", []).append(r)   # the slot held A: a cold switch
        n_cold = 0
        for rep in range(reps):
            for s in "AB":
                for cfg in servers:
                    if cfg == "cold":
                        if n_cold >= a.cold_reps:
                            continue
                        n_cold += 1
                    block_mark = proxy[cfg].lines() if cfg in proxy else 0
                    if cfg == "default":
                        # the departing session takes a resident turn, then answers the moment its
                        # early checkpoint starts (mid-save); the switch comes --pause s after that reply
                        dep = "B" if s == "A" else "A"
                        pre = turn(cfg, dep, "resident")
                        wait_event(kvd, kvd.lines(), "kv.session.save.start", 120)
                        mid = turn(cfg, dep, "mid-save")
                        mid["resident"] = pre["ttft"]
                        out.setdefault("default_midsave", []).append(mid)
                        time.sleep(max(0.0, mid["t_end"] + a.pause - time.monotonic()))
                    mark = proxy[cfg].lines() if cfg in proxy else 0
                    r = turn(cfg, s, "returns")
                    if cfg in proxy:
                        time.sleep(0.05)
                        save, restore, calls, evs = kv_switch_ms(proxy[cfg], mark)
                        if "kv.session.restore.success" not in evs:
                            raise BenchError("%s did not restore session %s on its return (log: %s)" % (cfg, s, evs))
                        r.update(save_ms=save, restore_ms=restore, calls_ms=calls,
                                 manifest_ms=manifest_ms(proxy[cfg], mark), own_ms=own_ms(proxy[cfg], mark))
                        r.update(waited_for_save(proxy[cfg], block_mark, r))
                        if cfg == "default" and r["waited"]:
                            lib.log("switch default %d: %s's return waited for a save (started %s ms after "
                                    "the request; calls %s ms)" % (size, s, r["save_started_ms"], r["save_call_ms"]))
                    res_r = turn(cfg, s, "resident")
                    r["resident"] = res_r["ttft"]
                    if cfg in proxy:
                        r["share"] = r["ttft"] - (r["save_ms"] + r["restore_ms"]) / 1000 - res_r["ttft"]
                        r["outside_calls"] = r["ttft"] - r["calls_ms"] / 1000 - res_r["ttft"]
                    key = {"kvpersist": "kv_switch", "default": "default_switch", "ramcache": "ramcache_return",
                           "cold": "cold_return"}[cfg]
                    out.setdefault(key, []).append(r)
                    out.setdefault({"kvpersist": "kv", "default": "default", "ramcache": "ramcache",
                                    "cold": "cold"}[cfg] + "_resident", []).append(res_r)
        servers["cold"].stop()
        servers["default"].stop()
        # restarts: llama-server goes away and comes back. kvpersist restores from disk (snapshot files
        # evicted from the page cache first); llama-server's RAM cache is empty (a cold prefill, costly,
        # so only one at large sizes).
        for i, s in enumerate("AB"[:a.restarts]):
            ls = servers["kvpersist"]
            ls.stop()
            out["evicted_bytes"] = evict_page_cache(sd)
            ls.start()
            mark = kv.lines()
            r = turn("kvpersist", s, "after restart")
            time.sleep(0.05)
            save, restore, calls, evs = kv_switch_ms(kv, mark)
            r.update(save_ms=save, restore_ms=restore, calls_ms=calls, events=evs)
            if "kv.session.restore.success" not in evs:
                raise BenchError("kvpersist did not restore session %s after the llama-server restart (log: %s)"
                                 % (s, evs))
            out.setdefault("kv_restart", []).append(r)
            if i == 0 or size <= 8192:
                ls = servers["ramcache"]
                ls.stop()
                ls.start()
                out.setdefault("ramcache_restart", []).append(turn("ramcache", s, "after restart"))
    finally:
        for k in (kv, kvd):
            if k:
                k.stop()
        for ls in servers.values():
            ls.stop()


def S(xs, key="ttft", scale=1.0):
    return mmm([x[key] * scale for x in xs if x.get(key) is not None])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lib.common_args(ap)
    lib.prompt_size_args(ap, "returns per session per size")
    ap.add_argument("--cold-reps", type=int, default=None, help="cold returns per size (besides B's first turn)")
    ap.add_argument("--restarts", type=int, default=None, choices=(1, 2),
                    help="llama-server restarts per config and size (default 2; 1 with --quick)")
    ap.add_argument("--pause", type=float, default=3.0,
                    help="seconds between a reply and the next switch in the default configuration (a user)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip a size whose estimated run time (from the previous size's cold prefill) exceeds this")
    a = ap.parse_args()
    lib.install_signal_handlers()
    sizes = [int(x) for x in (a.sizes or ("1024,2048" if a.quick else "4096,8192,16384")).split(",")]
    a.ctx = a.ctx or (max(sizes) + 4096 if max(sizes) >= 8192 else 4096)
    reps = a.reps or (1 if a.quick else 3)
    a.restarts = a.restarts or (1 if a.quick else 2)
    a.cold_reps = a.cold_reps if a.cold_reps is not None else (1 if a.quick else 2)
    budget = a.budget_s or (600 if a.quick else 1500)
    work = lib.work_dir(a, "switch")
    res = lib.Result("switch", "Session switch and restart", a.out, sys.argv, a.quick)
    data = {}
    skipped = []
    try:
        prev = None
        for size in sizes:
            if prev is not None:
                # cold prefill grows faster than linearly; about 8 + cold_reps cold prefills per size
                est = prev["cold_s"] * (size / prev["size"]) ** 1.6 * (8 + a.cold_reps)
                if est > budget:
                    skipped.append((size, est))
                    lib.log("switch: skipping %d tokens (estimated %.0f s > budget %.0f s)" % (size, est, budget))
                    continue
            t0 = time.monotonic()
            out = data[size] = {}
            # prompts: tokenized on a short-lived server of the same model
            tmp = lib.LlamaServer(a.llama_server, a.model, 512, work, name="tokenizer-%d" % size).start()
            prompts = {s: make_prompt(tmp, s, size) for s in "AB"}
            out["prompt_tokens"] = {s: tmp.tokenize(prompts[s]) for s in "AB"}
            tmp.stop()
            run_size(a, size, prompts, reps, work, out)
            out["seconds"] = time.monotonic() - t0
            prev = {"size": size, "cold_s": S(out["cold_return"])["median"]}
            lib.log("switch: %d tokens done in %.0f s" % (size, out["seconds"]))
    finally:
        lib.Proc.stop_all()

    # ------------------------------------------------------------------ tables
    ms = 1000.0
    rows, prow, shares = [], [], []
    for size, o in data.items():
        cold = S(o["cold_return"], scale=ms)
        kvs = S(o["kv_switch"], scale=ms)
        ear = S(o["default_switch"], scale=ms)
        waits = [x for x in o["default_switch"] if x.get("waited") is not None]
        no_wait = sum(1 for x in waits if not x["waited"])
        ram = S(o["ramcache_return"], scale=ms)
        kres = S(o["kv_resident"], scale=ms)
        kvr = S(o["kv_restart"], scale=ms)
        ramr = S(o["ramcache_restart"], scale=ms)
        mid = S(o["default_midsave"], scale=ms)
        mid_res = S(o["default_midsave"], "resident", ms)
        sp_cold = mmm([c / k for c in [x["ttft"] for x in o["cold_return"]] for k in [x["ttft"] for x in o["kv_switch"]]])
        rows.append([size, fmt_mmm(cold, 0), fmt_mmm(ram, 0), fmt_mmm(kvs, 0), fmt_mmm(ear, 0), fmt_mmm(kres, 0),
                     fmt_mmm(ramr, 0), fmt_mmm(kvr, 0),
                     "%.1fx" % (cold["median"] / kvs["median"]), "%.2fx" % (kvs["median"] / ram["median"]),
                     "%.2fx" % (ear["median"] / ram["median"]), "%.1fx" % (ramr["median"] / kvr["median"])])
        prow.append([size, cold["median"], ram["median"], kvs["median"], kres["median"], ramr["median"],
                     kvr["median"], cold["min"], cold["max"], kvs["min"], kvs["max"], ram["min"], ram["max"],
                     ear["median"], ear["min"], ear["max"]])
        sv = S(o["kv_switch"], "save_ms")
        rs = S(o["kv_switch"], "restore_ms")
        sh = S(o["kv_switch"], "share", ms)
        cl = S(o["kv_switch"], "calls_ms")
        oc = S(o["kv_switch"], "outside_calls", ms)
        mf = S(o["kv_switch"], "manifest_ms")
        esh = S(o["default_switch"], "share", ms)
        shares.append([size, "save on the path", fmt_mmm(kvs, 0), fmt_mmm(sv, 1), fmt_mmm(rs, 1), fmt_mmm(cl, 1),
                       fmt_mmm(kres, 1), fmt_mmm(sh, 1), fmt(100 * sh["median"] / kvs["median"], 1) + "%",
                       fmt_mmm(oc, 1), fmt_mmm(mf, 0), fmt_mmm(S(o["kv_switch"], "own_ms"), 1)])
        shares.append([size, "default", fmt_mmm(ear, 0), fmt_mmm(S(o["default_switch"], "save_ms"), 1),
                       fmt_mmm(S(o["default_switch"], "restore_ms"), 1), fmt_mmm(S(o["default_switch"], "calls_ms"), 1),
                       fmt_mmm(S(o["default_resident"], scale=ms), 1), fmt_mmm(esh, 1),
                       fmt(100 * esh["median"] / ear["median"], 1) + "%",
                       fmt_mmm(S(o["default_switch"], "outside_calls", ms), 1), fmt_mmm(S(o["default_switch"], "manifest_ms"), 0),
                       fmt_mmm(S(o["default_switch"], "own_ms"), 1)])
        o["summary"] = {"cold": cold, "kv_switch": kvs, "default_switch": ear, "ramcache": ram, "kv_resident": kres,
                        "default_no_wait": no_wait, "default_switches": len(waits), "pause_s": a.pause,
                        "kv_restart": kvr, "ramcache_restart": ramr, "speedup_vs_cold": sp_cold, "save_ms": sv,
                        "restore_ms": rs, "share_ms": sh, "default_share_ms": esh, "calls_ms": cl,
                        "outside_calls_ms": oc, "manifest_ms": mf, "midsave": mid, "midsave_resident": mid_res,
                        "own_ms": S(o["kv_switch"], "own_ms"), "default_own_ms": S(o["default_switch"], "own_ms")}
    if not data:
        raise BenchError("no size was measured")
    first = data[next(iter(data))]
    head = ["prompt tokens", "cold re-prefill", "RAM cache (built-in)", "kvpersist switch",
            "kvpersist switch, default config", "resident", "restart: direct", "restart: kvpersist",
            "cold / kvpersist", "kvpersist / RAM cache", "default / RAM cache", "restart: direct / kvpersist"]
    res.table("TTFT of a returning session, ms, %s model (-c %d; median (min..max); %d returns per config and "
              "size, %d cold)" % (a.model_name, a.ctx, 2 * reps, 1 + a.cold_reps), md_table(head, rows),
              command="kvpersist: %s + kvpersist serve (checkpoint.idleMs 0, earlyMs 0; default: no checkpoint settings, "
                      "each switch %g s after the previous reply); RAM cache: %s; cold: %s"
                      % (first["cmd_kvpersist"], a.pause, first["cmd_ramcache"], first["cmd_cold"]))
    res.table("Switches with the default configuration that waited for no save (--pause %g s after the previous "
              "reply, like a user)" % a.pause,
              md_table(["prompt tokens", "switches that waited for no save", "default switch TTFT",
                        "RAM cache TTFT", "default / RAM cache", "save calls on a switch's path: started at, ms"],
                       [[size, "%d of %d (%.0f%%)" % (o["summary"]["default_no_wait"], o["summary"]["default_switches"],
                                                      100.0 * o["summary"]["default_no_wait"]
                                                      / max(1, o["summary"]["default_switches"])),
                         fmt_mmm(o["summary"]["default_switch"], 0), fmt_mmm(o["summary"]["ramcache"], 0),
                         "%.2fx" % (o["summary"]["default_switch"]["median"] / o["summary"]["ramcache"]["median"]),
                         "; ".join("%s (call %s)" % (x["save_started_ms"], x["save_call_ms"])
                                   for x in o["default_switch"] if x.get("waited")) or "-"]
                        for size, o in data.items()]),
              command="a switch waited for a save when a save call on the slot (kv.session.save.start to its "
                      "kv.backend.call action=save, debug log, 1 ms timestamps) was in flight when the request was "
                      "sent or started before its first SSE data event; \"started at\" is relative to the send")
    res.table("kvpersist's own share of a switch, ms: switch TTFT - (save_ms + restore_ms) - resident TTFT",
              md_table(["prompt tokens", "kvpersist", "switch TTFT", "save_ms", "restore_ms",
                        "save+restore HTTP calls", "resident TTFT", "kvpersist share", "share of switch",
                        "share outside the calls", "save call end to commit", "kvpersist's own, from its log"],
                       shares),
              command="save_ms/restore_ms: llama-server's timings, from kvpersist's kv.session.save.success / "
                      "restore.success lines; HTTP calls: wall time of the /slots calls (kv.backend.call, "
                      "--log-level debug)")
    res.table("What the default policy costs an owner who comes back at the worst moment: its next turn sent the "
              "moment its early checkpoint starts, ms",
              md_table(["prompt tokens", "resident TTFT before", "TTFT mid-save", "added"],
                       [[size, fmt_mmm(o["summary"]["midsave_resident"], 0), fmt_mmm(o["summary"]["midsave"], 0),
                         fmt(o["summary"]["midsave"]["median"] - o["summary"]["midsave_resident"]["median"], 0)]
                        for size, o in data.items()]),
              command="default configuration: after a resident turn, wait for kv.session.save.start, then send")
    res.note("\"share outside the calls\" = switch TTFT - wall time of the /slots HTTP calls - resident TTFT: "
             "kvpersist's own work on a switch. \"save call end to commit\": from kvpersist's log timestamps "
             "(1 ms resolution), the time between the end of the save call and kv.session.save.success, i.e. the "
             "commit (snapshot fsync in shared-filesystem mode, then the manifest written atomically). It runs "
             "alongside the arriving session's restore (docs/design.md §11), so only the part that outlasts the "
             "restore is on the switch's path. The difference between the calls' wall time and llama-server's "
             "save_ms + restore_ms is llama-server's task queue and HTTP handling around the file I/O. With the "
             "default configuration the early checkpoint (checkpoint.earlyMs 1000, on while more sessions take "
             "turns than there are slots) saves the departing session before the switch arrives %g s after its "
             "reply, so save_ms is 0 unless the switch waited for a save." % a.pause)
    res.dat("switch.dat", "tokens cold ramcache kv_switch resident ramcache_restart kv_restart cold_min cold_max "
            "kv_min kv_max ram_min ram_max default default_min default_max", prow)
    res.plots.append("switch.png")
    for size, o in data.items():
        kr = o["kv_restart"][0]
        res.note("%d tokens: after a restart kvpersist logged %s; %s bytes of snapshot files were evicted from the "
                 "page cache before llama-server came back (the restore reads the disk); llama-server reused "
                 "(cache_n) %s of %s prompt tokens. Restarts: %d through kvpersist, %d direct." % (
                     size, ", ".join(dict.fromkeys(e for e in kr.get("events", []) if not e.endswith(".start"))),
                     "{:,}".format(o.get("evicted_bytes", 0)), kr.get("cache_n"),
                     (kr.get("prompt_n") or 0) + (kr.get("cache_n") or 0), len(o["kv_restart"]),
                     len(o["ramcache_restart"])))
    for size, est in skipped:
        res.note("%d tokens: NOT measured; the estimated run time (%.0f s, from the previous size's cold prefill) "
                 "exceeded the budget of %.0f s (--budget-s)." % (size, est, budget))
    res.note("TTFT = request sent to the first SSE data event at the client (stream, max_tokens %d; llama-server's "
             "\":\" keep-alive pings during prefills over 30 s are not data events); prompts are random words; "
             "llama-server's timings (cache_n) show the reuse on every restored or cached turn." % a.max_tokens)
    res.headline = {str(k): v["summary"] for k, v in data.items()}
    res.headline["skipped"] = [s for s, _ in skipped]
    with open(os.path.join(a.out, "results", "switch-raw.json"), "w") as f:
        json.dump({str(k): {kk: vv for kk, vv in v.items() if kk != "summary"} for k, v in data.items()}, f, indent=1)
    res.save()
    return 0


if __name__ == "__main__":
    lib.run_main(main)
