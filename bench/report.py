#!/usr/bin/python3
"""Assembles the benchmark results: plots (gnuplot, PNG) and RESULTS.md.

Usage: bench/report.py --out DIR --command "bench/run.sh ..." [--env FILE]
Reads DIR/<name>.json written by the benchmarks, writes DIR/results/*.png and DIR/RESULTS.md.

README's Performance figures are RESULTS.md's headlines, copied between two markers, so that
every figure there comes from one run of bench/run.sh; the headlines are rendered from that
run's raw output, DIR/results/*.json (and, between two more markers, the headline lines of
results/agent_day.json, the optional agent-day benchmark run on its own):
       bench/report.py --readme README.md --out bench          rewrites RESULTS.md's headlines
                                                               and README's blocks
       bench/report.py --readme README.md --out bench --check  fails when they differ, or when
                                                               a figure of bench/figures.py
                                                               differs from its raw output (a test)
A benchmark run on its own rewrites only its section of RESULTS.md:
       bench/report.py --out bench --section agent_day
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

import agent_day
import figures
import lib

ORDER = ["overhead", "streaming", "switch", "footprint", "seed", "stall", "policy", "seedbytes", "churn", "agent_day"]


def sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> list[str]:
    ls = {}
    for line in sh(["lscpu"]).splitlines():
        k, _, v = line.partition(":")
        ls[k.strip()] = v.strip()
    mem = sh(["free", "-h"]).splitlines()
    memline = mem[1].split() if len(mem) > 1 else []
    return ["CPU: %s, %s CPU(s) (nproc %s), %s" % (ls.get("Model name", "?"), ls.get("CPU(s)", "?"), sh(["nproc"]),
                                                   ", ".join(x for x in (ls.get("Hypervisor vendor") and
                                                                         "hypervisor " + ls["Hypervisor vendor"],
                                                                         ls.get("L3 cache") and "L3 " + ls["L3 cache"])
                                                             if x)),
            "Memory: %s total (free -h: %s)" % (memline[1] if len(memline) > 1 else "?", " ".join(memline[1:7])),
            "Kernel: %s" % sh(["uname", "-srm"]),
            "Load average at report time: %s" % lib.read("/proc/loadavg").strip()]


# ----------------------------------------------------------------------------- plots
def gnuplot(script: str, out_png: str) -> bool:
    try:
        p = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        lib.log("gnuplot failed: %s" % e)
        return False
    if p.returncode != 0 or not os.path.exists(out_png) or os.path.getsize(out_png) == 0:
        lib.log("gnuplot failed for %s: %s" % (out_png, p.stderr[-500:]))
        return False
    return True


HEAD = """set terminal pngcairo size %d,%d font "DejaVu Sans,10"
set output "%s"
set grid
set key top left
"""


def plot_overhead(rd: str) -> bool:
    dat = os.path.join(rd, "overhead-stub.dat")
    if not os.path.exists(dat):
        return False
    png = os.path.join(rd, "overhead.png")
    s = HEAD % (1100, 420, png) + f"""
set multiplot layout 1,2 title "Resident path, nginx stub upstream (wrk, keep-alive; median of repetitions)"
set logscale x 2
set xtics (1, 16, 64)
set xrange [0.8:80]
set xlabel "concurrent clients"
set ylabel "p50 latency, ms"
set logscale y
plot "{dat}" u 1:2 w lp lw 2 t "direct", "" u 1:3 w lp lw 2 t "kvpersist (one session)", \
     "" u 1:4 w lp lw 2 t "nginx proxy", "" u 1:5 w lp lw 2 dt 2 t "kvpersist passthrough"
unset logscale y
set ylabel "requests/s"
set key top right
plot "{dat}" u 1:10 w lp lw 2 t "direct", "" u 1:11 w lp lw 2 t "kvpersist (one session)", \
     "" u 1:12 w lp lw 2 t "nginx proxy", "" u 1:13 w lp lw 2 dt 2 t "kvpersist passthrough"
unset multiplot
"""
    return gnuplot(s, png)


def plot_streaming(rd: str) -> bool:
    stub = os.path.join(rd, "streaming-stub.dat")
    real = os.path.join(rd, "streaming-real.dat")
    if not os.path.exists(stub):
        return False
    png = os.path.join(rd, "streaming.png")
    panels = [("stub source", stub)] + ([("real llama-server (tap)", real)] if os.path.exists(real) else [])
    s = HEAD % (550 * len(panels), 420, png) + "set multiplot layout 1,%d title \"SSE event delay at the client, CDF\"\n" % len(panels)
    for title, f in panels:
        s += f"""set title "{title}"
set logscale x
set xlabel "delay per event, ms (log)"
set ylabel "fraction of events"
set yrange [0:1]
set key bottom right
plot "{f}" u 1:2 w l lw 2 t "direct", "" u 3:4 w l lw 2 t "kvpersist", "" u 5:6 w l lw 2 t "nginx proxy"
"""
    s += "unset multiplot\n"
    return gnuplot(s, png)


def plot_switch(rd: str, model: str) -> bool:
    dat = os.path.join(rd, "switch.dat")
    if not os.path.exists(dat):
        return False
    png = os.path.join(rd, "switch.png")
    s = HEAD % (900, 560, png) + f"""
set title "Time to first token of a returning session ({model} model, 2 CPU cores; median, min..max bars)"
set logscale x 2
set logscale y
set xlabel "prompt tokens"
set ylabel "TTFT, ms (log)"
set format x "%.0f"
set key top left
plot "{dat}" u 1:2:8:9 w yerrorlines lw 2 pt 7 t "cold re-prefill", \\
     "" u 1:6 w lp lw 2 pt 5 dt 2 t "after restart: direct", \\
     "" u 1:7 w lp lw 2 pt 5 t "after restart: kvpersist", \\
     "" u 1:4:10:11 w yerrorlines lw 2 pt 9 t "switch: kvpersist, save on the path", \\
     "" u 1:14:15:16 w yerrorlines lw 2 pt 13 t "switch: kvpersist, default config", \\
     "" u 1:3:12:13 w yerrorlines lw 2 pt 11 dt 3 t "switch: llama-server RAM cache", \\
     "" u 1:5 w lp lw 1 pt 1 t "resident"
"""
    return gnuplot(s, png)


# ----------------------------------------------------------------------------- headlines
def samples(d: dict) -> str:
    return "1 sample" if d["n"] == 1 else "median of %d" % d["n"]


def headlines(results: dict) -> list[str]:
    out = []
    sw = results.get("switch", {}).get("headline", {})
    sizes = [k for k in sw if k.isdigit()]
    if sizes:
        big = max(sizes, key=int)
        h = sw[big]
        # a run whose save-on-the-path arm saved nothing on the path says so (bench/switch.py's notes)
        no_save = h.get("save_ms", {}).get("max", 1) == 0
        out.append("**Session switch, %s-token prompts**: a returning session's first token after %.0f ms through "
                   "kvpersist%s vs %.1f s with a cold re-prefill: **%.0fx faster** (median; min..max of all pairs "
                   "%.0fx..%.0fx). llama-server's own RAM prompt cache: %.0f ms (kvpersist / RAM cache = **%.2fx**)."
                   % (big, h["kv_switch"]["median"],
                      " (in this run a restore only: the departing session had been saved ahead, see the notes "
                      "of section 3 in bench/RESULTS.md)" if no_save else "", h["cold"]["median"] / 1000,
                      h["cold"]["median"] / h["kv_switch"]["median"], h["speedup_vs_cold"]["min"],
                      h["speedup_vs_cold"]["max"], h["ramcache"]["median"],
                      h["kv_switch"]["median"] / h["ramcache"]["median"]))
        out.append("**After a llama-server restart** (%s tokens): %.0f ms through kvpersist (%s; restore from disk, "
                   "page cache evicted) vs %.1f s directly (%s; the RAM cache is gone, so it is a cold prefill): "
                   "**%.0fx**."
                   % (big, h["kv_restart"]["median"], samples(h["kv_restart"]), h["ramcache_restart"]["median"] / 1000,
                      samples(h["ramcache_restart"]), h["ramcache_restart"]["median"] / h["kv_restart"]["median"]))
        if "default_switch" in h:
            per = [(k, sw[k]) for k in sorted(sizes, key=int)]
            n_ok = sum(v.get("default_no_wait", 0) for _, v in per)
            n_all = sum(v.get("default_switches", 0) for _, v in per)
            out.append("**Session switch with the default configuration** (sent %g s after the previous reply, like a "
                       "user): switches that waited for no save: %s; in all **%d of %d (%.0f%%)**. Default switch / "
                       "llama-server's RAM cache TTFT: %s. An owner who answers the moment the early checkpoint starts "
                       "(%s tokens) waits %.0f ms more than a resident turn (%.0f vs %.0f ms)."
                       % (h.get("pause_s", 3), ", ".join("%s tokens %d of %d" % (k, v["default_no_wait"],
                                                                                  v["default_switches"])
                                                         for k, v in per),
                          n_ok, n_all, 100.0 * n_ok / max(1, n_all),
                          ", ".join("%s tokens **%.2fx**" % (k, v["default_switch"]["median"] / v["ramcache"]["median"])
                                    for k, v in per),
                          big, h["midsave"]["median"] - h["midsave_resident"]["median"], h["midsave"]["median"],
                          h["midsave_resident"]["median"]))
        elif "early_switch" in h:
            out.append("**With the early checkpoint** (checkpoint.earlyMs, %s tokens): the switch is a restore only, "
                       "%.0f ms: **%.2fx** llama-server's RAM cache. An owner who answers the moment that checkpoint "
                       "starts waits %.0f ms more than a resident turn (%.0f vs %.0f ms)."
                       % (big, h["early_switch"]["median"], h["early_switch"]["median"] / h["ramcache"]["median"],
                          h["midsave"]["median"] - h["midsave_resident"]["median"], h["midsave"]["median"],
                          h["midsave_resident"]["median"]))
        terms = [round(h[k]["median"], 1) for k in ("kv_switch", "save_ms", "restore_ms", "kv_resident")]
        out.append("**kvpersist's own share of a switch** (%s tokens): %.1f ms of %.0f ms, the median over %d "
                   "switches of (switch TTFT - llama-server's save_ms - restore_ms - the TTFT of the resident turn "
                   "that followed it); the medians of those terms, %s ms, give %.1f ms%s."
                   % (big, h["share_ms"]["median"], h["kv_switch"]["median"], h["share_ms"]["n"],
                      " - ".join("%.1f" % t for t in terms), terms[0] - sum(terms[1:]),
                      "; with the default configuration %.1f ms" % h["default_share_ms"]["median"]
                      if "default_share_ms" in h else
                      "; with the early checkpoint %.1f ms" % h["early_share_ms"]["median"]
                      if "early_share_ms" in h else ""))
        own = h.get("default_own_ms") or h.get("early_own_ms") or {}
        if own.get("median") is not None:
            out.append("**kvpersist's own time before forwarding a switch** (%s tokens, from its log): %.1f ms with "
                       "the %s, %.1f ms with the save on the path (the rest of the share above is "
                       "llama-server's)." % (big, own["median"], "default configuration" if "default_own_ms" in h
                                             else "early checkpoint", h["own_ms"]["median"]))
        if sw.get("skipped"):
            out.append("Not measured (over the time budget): %s-token prompts." % ", ".join(map(str, sw["skipped"])))
    sd = results.get("seed", {}).get("headline", {})
    for size in sorted((k for k in sd if k.isdigit()), key=int):
        h = sd[size]
        out.append("**A new session seeded from a saved prefix** (%s shared tokens): first token after %.0f ms vs "
                   "%.1f s cold: **%.0fx** (llama-server reused %.0f%% of the prompt; the resident floor is %.0f ms)."
                   % (size, h["seeded"]["median"], h["cold"]["median"] / 1000, h["speedup"],
                      h["reuse_pct"]["median"], h["resident"]["median"]))
    sl = results.get("stall", {}).get("headline", {})
    if sl.get("stalled"):
        out.append("**A hung disk on one server** (its manifest fsyncs blocked): another server's SSE events arrive "
                   "%.2f ms after they were written at p99 (max %.2f ms), vs %.2f ms (max %.2f ms) with no stall; "
                   "%d manifest writes timed out into the failure policy."
                   % (sl["stalled"]["p99"], sl["stalled"]["max"], sl["quiet"]["p99"], sl["quiet"]["max"],
                      sl["file_timeouts"]))
    po = results.get("policy", {}).get("headline", {})
    if po.get("default"):
        out.append("**The default policy and a single conversation** (%d turns %g s apart, %s tokens, %s model): "
                   "turns 2..%d TTFT %s ms with the default configuration vs %s ms with checkpoint.earlyMs 0 "
                   "(**%.2fx**); save calls %s: %d vs %d."
                   % (po["turns"], po["pause_s"], po["tokens"], po.get("model", "?"), po["turns"],
                      lib.fmt_mmm(po["default"], 0), lib.fmt_mmm(po["early_off"], 0), po["ratio"],
                      "during " + po["saves_counted"] if "saves_counted" in po else
                      "from the first request (see the notes of \"The default checkpoint policy\")",
                      po["saves_default"], po["saves_early_off"]))
    sb = results.get("seedbytes", {}).get("headline", {})
    if sb:
        out.append("**Bytes a seed reads per byte of prefix it reuses** (new sessions sharing %s tokens; bytes from "
                   "llama-server's restore replies): %s."
                   % (next(iter(sb.values()))["shared_tokens"],
                      "; ".join("donor of %s tokens: first seed **%.2fx** (from: %s), the following ones **%s** "
                                "(from: %s)" % (v["donor_tokens"], v["first"], v["first_from"],
                                                   lib.fmt_mmm(v["later"], 2, "x"), " / ".join(v["later_from"]))
                                for _, v in sorted(sb.items(), key=lambda kv: int(kv[0])))))
    ch = results.get("churn", {}).get("headline", {})
    if ch.get("budget"):
        out.append("**Disk budget over a churn of %d sessions** (server-owned mode, prompts of %d-%d tokens, "
                   "retention.maxTotalBytes %s bytes, about %g snapshots): at most %s bytes in the slot directory, "
                   "**%.2fx the budget**; %d files at the end (%d of them empty-slot headers), %d sessions evicted."
                   % (ch["sessions"], ch["tokens"][0], ch["tokens"][1], "{:,}".format(ch["budget"]),
                      ch["budget_sessions"], "{:,}".format(ch["max_bytes"]), ch["max_ratio"], ch["files_end"],
                      ch["headers_end"], ch["evicted"]))
    ov = results.get("overhead", {}).get("headline", {})
    if ov.get("stub"):
        c1 = ov["stub"]["1"]
        txt = ("**Resident-path overhead** (1 client, stub upstream): kvpersist adds %s ms at p50 and %s ms at p99, "
               "nginx adds %s ms at p50 (median (min..max) over repetitions); requests/s vs direct: kvpersist %s, "
               "nginx %s." % (lib.fmt_mmm(c1["kvpersist"]["added_p50"]), lib.fmt_mmm(c1["kvpersist"]["added_p99"]),
                              lib.fmt_mmm(c1["nginx"]["added_p50"]), lib.fmt_mmm(c1["kvpersist"]["rps_ratio"], 2),
                              lib.fmt_mmm(c1["nginx"]["rps_ratio"], 2)))
        if "16" in ov["stub"] and "64" in ov["stub"]:
            g = lambda c, p: ov["stub"][c].get(p, {}).get("rps", {}).get("median") or 0  # noqa: E731
            txt += (" At 16 and 64 clients of one session kvpersist serves one request at a time (the slot lease): "
                    "%.0f and %.0f requests/s; the same relay without the lease (passthrough) %.0f and %.0f; "
                    "nginx %.0f and %.0f." % (g("16", "kvpersist"), g("64", "kvpersist"),
                                              g("16", "kvpersist passthrough"), g("64", "kvpersist passthrough"),
                                              g("16", "nginx"), g("64", "nginx")))
        if ov.get("caution"):
            txt = "(CAUTION: %s) %s" % (ov["caution"], txt)
        out.append(txt)
    if ov.get("real"):
        r = ov["real"]
        out.append("**Against llama-server** (ci model, max_tokens 1, 1 client): p50 %.2f ms direct, %.2f ms through "
                   "kvpersist (+%s ms), %.2f ms through nginx."
                   % (r["direct"]["p50"]["median"], r["kvpersist"]["p50"]["median"],
                      lib.fmt_mmm(r["kvpersist"]["added_p50"]), r["nginx"]["p50"]["median"]))
    st = results.get("streaming", {}).get("headline", {})
    if st.get("stub"):
        k = st["stub"]["kvpersist"]
        n = st["stub"]["nginx"]
        out.append("**Streaming fidelity** (stub emitting one event every 20 ms): kvpersist adds %s ms per event at "
                   "p50 and %s ms at p99 (nginx: %s / %s); %d of %d events merged (nginx: %d)."
                   % (lib.fmt_mmm(k["added_p50"]), lib.fmt_mmm(k["added_p99"]), lib.fmt_mmm(n["added_p50"]),
                      lib.fmt_mmm(n["added_p99"]), k["merged"], k["events"], n["merged"]))
    if st.get("real"):
        k = st["real"]["kvpersist"]
        out.append("From a real llama-server: %s ms at p50, %s ms at p99 (nginx: %s / %s); %d events merged that had "
                   "left llama-server separately."
                   % (lib.fmt_mmm(k["added_p50"]), lib.fmt_mmm(k["added_p99"]),
                      lib.fmt_mmm(st["real"]["nginx"]["added_p50"]), lib.fmt_mmm(st["real"]["nginx"]["added_p99"]),
                      k["merged"]))
    fp = results.get("footprint", {}).get("headline", {})
    if fp.get("memory"):
        m = fp["memory"]
        out.append("**Footprint**: %.1f MiB RSS idle, %.1f MiB with 256 concurrent streams (about %.0f KiB per "
                   "stream)." % (m["idle_warm"] / 1024, m["streams_peak"] / 1024, m["per_stream_kib"]))
    if fp.get("instructions"):
        i = fp["instructions"]
        out.append("**Instructions** (callgrind): %s per resident request and %s per SSE event; %.1fx and %.1fx "
                   "nginx's." % ("{:,.0f}".format(i["kvpersist"]["per_request"]["median"]),
                                 "{:,.0f}".format(i["kvpersist"]["per_event"]["median"]),
                                 i["per_request_ratio"], i["per_event_ratio"]))
    return out


def section_md(name: str, r: dict, plots: dict) -> list[str]:
    """One benchmark's section of RESULTS.md: its driver, tables, notes and plots."""
    md = ["## %d. %s" % (ORDER.index(name) + 1, r["title"]), "",
          "Driver: `%s`; run %s, %.0f s, kvpersist %s; load average before / after: %s / %s"
          % (r["command"], r.get("date", "?"), r.get("seconds", 0), r.get("revision", "?"),
             " ".join(r.get("load_start", "?").split()[:3]), " ".join(r.get("load_end", "?").split()[:3])), ""]
    for sec in r["sections"]:
        md += ["### " + sec["title"], ""]
        if sec.get("command"):
            md += ["Command: `%s`" % sec["command"], ""]
        md += [sec["table"], ""]
    if r["notes"]:
        md += ["- " + n for n in r["notes"]] + [""]
    for p in r.get("plots", []):
        if plots.get(p.split(".")[0]) and p.split(".")[0] != "switch":
            md += ["![%s](results/%s)" % (r["title"], p), ""]
    return md


def replace_section(out: str, name: str) -> int:
    """Rewrites one benchmark's section of an existing RESULTS.md from its results/<name>.json
    (appended when RESULTS.md has none), leaving every other line as it is: for a benchmark run
    on its own (bench/run.sh lists which)."""
    path = os.path.join(out, "RESULTS.md")
    with open(os.path.join(out, "results", name + ".json")) as f:
        r = json.load(f)
    with open(path) as f:
        lines = f.read().split("\n")
    head = "## %d. " % (ORDER.index(name) + 1)
    start = next((i for i, l in enumerate(lines) if l.startswith(head)), None)
    if start is None:
        start = end = len(lines)
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    body = section_md(name, r, {})
    new = lines[:start] + ([""] if start and lines[start - 1] else []) + body + lines[end:]
    with open(path, "w") as f:
        f.write("\n".join(new).rstrip("\n") + "\n")
    return 0


# ----------------------------------------------------------------------------- README
README_BEGIN = "<!-- bench/report.py: figures from bench/RESULTS.md; do not edit by hand -->"
README_END = "<!-- end of bench/report.py figures -->"


def readme_block(results_md: str) -> str:
    """The lines README carries for a RESULTS.md: its run's command, date and revision, then its
    headlines, verbatim."""
    lines = results_md.splitlines()
    meta = [next((l for l in lines if l.startswith(p)), p + " ?") for p in ("- Command:", "- Date:", "- kvpersist:")]
    try:
        start = lines.index("## Headlines") + 1
    except ValueError:
        return ""
    heads = []
    for l in lines[start:]:
        if l.startswith("#") or l.startswith("!["):
            break
        if l.strip():
            heads.append(l)
    run = "; ".join(m[2:] for m in meta)
    return "\n".join(["From the run in `bench/RESULTS.md` (%s):" % run, ""] + heads)


def read_results(out: str) -> dict:
    """bench/run.sh's raw output: DIR/results/<name>.json of each benchmark that ran."""
    results = {}
    for name in ORDER:
        p = os.path.join(out, "results", name + ".json")
        if os.path.exists(p):
            with open(p) as f:
                results[name] = json.load(f)
    return results


def with_headlines(results_md: str, heads: list[str]) -> str:
    """RESULTS.md with its headline section replaced by `heads`, the rest as it is."""
    lines = results_md.split("\n")
    try:
        start = lines.index("## Headlines") + 2
    except ValueError:
        return results_md
    end = start
    while end < len(lines) and not (lines[end].startswith("#") or lines[end].startswith("![")):
        end += 1
    return "\n".join(lines[:start] + heads + [""] + lines[end:])


AGENT_DAY_BEGIN = "<!-- bench/report.py: agent day figures from bench/results/agent_day.json; do not edit by hand -->"
AGENT_DAY_END = "<!-- end of bench/report.py agent day figures -->"


def agent_day_block(out: str) -> str:
    """README's lines for the agent-day benchmark (optional, run on its own: bench/run.sh --only
    agent_day): its run's date and revision, then its headline lines, rendered from its raw
    output (results/agent_day/)."""
    path = os.path.join(out, "results", "agent_day.json")
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        r = json.load(f)
    days, _, fk = agent_day.read_raw(out)
    lines = agent_day.readme_lines(days, fk, r["headline"]["model"])[0]
    return "\n".join(["From `bench/RESULTS.md` section %d (`bench/agent_day.py`, run %s, kvpersist %s):"
                      % (ORDER.index("agent_day") + 1, r.get("date", "?"), r.get("revision", "?")), ""]
                     + ["- " + l for l in lines])


def agent_day_problems(out: str) -> list[str]:
    """Where results/agent_day.json's headline or RESULTS.md's agent-day section differ from what
    the raw output gives (bench/agent_day.py --rerender and report.py --section write them)."""
    path = os.path.join(out, "results", "agent_day.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        r = json.load(f)
    with open(os.path.join(out, "RESULTS.md")) as f:
        results_md = f.read()
    problems = []
    days, _, fk = agent_day.read_raw(out)
    if r["headline"]["lines"] != agent_day.readme_lines(days, fk, r["headline"]["model"])[0]:
        problems.append("%s's headline differs from its raw output; run bench/agent_day.py --rerender" % path)
    if "\n".join(section_md("agent_day", r, {})) not in results_md:
        problems.append("%s/RESULTS.md's agent-day section differs from %s; run bench/report.py --out %s "
                        "--section agent_day" % (out, path, out))
    return problems


def with_block(text: str, begin_marker: str, end_marker: str, block: str) -> str | None:
    """text with the lines between the two markers replaced by block; None when either is missing."""
    begin, end = text.find(begin_marker), text.find(end_marker)
    if not block or begin < 0 or end < begin:
        return None
    return text[:begin + len(begin_marker)] + "\n" + block + "\n" + text[end:]


def sync_readme(readme: str, out: str, check: bool) -> int:
    """Renders RESULTS.md's headlines again from DIR/results/*.json and README's block from
    RESULTS.md; with `check`, changes nothing and fails when either differs, or when a figure of
    bench/figures.py differs from its raw output."""
    results_path = os.path.join(out, "RESULTS.md")
    with open(results_path) as f:
        results_md = f.read()
    rendered = with_headlines(results_md, ["- " + h for h in headlines(read_results(out))])
    block = readme_block(rendered)
    with open(readme) as f:
        text = f.read()
    new = with_block(text, README_BEGIN, README_END, block)
    if new is None:
        print("report: %s has no figures block or RESULTS.md no headlines" % readme, file=sys.stderr)
        return 1
    if AGENT_DAY_BEGIN in new:
        new = with_block(new, AGENT_DAY_BEGIN, AGENT_DAY_END, agent_day_block(out))
        if new is None:
            print("report: %s has an agent day block but %s/results/agent_day.json no headline lines (or the "
                  "block no end marker)" % (readme, out), file=sys.stderr)
            return 1
    if not check:
        for path, old, fresh in ((results_path, results_md, rendered), (readme, text, new)):
            if fresh != old:
                with open(path, "w") as f:
                    f.write(fresh)
        return 0
    problems = []
    if rendered != results_md:
        problems.append("%s's headlines differ from what %s/results/*.json give" % (results_path, out))
    if new != text:
        problems.append("README's figures differ from %s's headlines or results/agent_day.json" % results_path)
    if problems:
        problems.append("run bench/report.py --readme %s --out %s" % (readme, out))
    problems += agent_day_problems(out) + figures.problems()
    for p in problems:
        print("report: " + p, file=sys.stderr)
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", default="bench/run.sh")
    ap.add_argument("--env", default=None, help="JSON with revision, llama-server, models, started")
    ap.add_argument("--failed", default="", help="comma-separated benchmarks that failed")
    ap.add_argument("--model-name", default="bench")
    ap.add_argument("--readme", default=None, help="copy RESULTS.md's headlines into this README, nothing else")
    ap.add_argument("--check", action="store_true", help="with --readme: only check that they are there")
    ap.add_argument("--section", default=None, choices=ORDER,
                    help="rewrite only this benchmark's section of an existing RESULTS.md, nothing else")
    a = ap.parse_args()
    if a.readme:
        return sync_readme(a.readme, a.out, a.check)
    if a.section:
        return replace_section(a.out, a.section)
    rd = os.path.join(a.out, "results")
    os.makedirs(rd, exist_ok=True)
    env = json.load(open(a.env)) if a.env and os.path.exists(a.env) else {}
    results = read_results(a.out)
    plots = {"overhead": plot_overhead(rd), "streaming": plot_streaming(rd),
             "switch": plot_switch(rd, env.get("switch_model", a.model_name))}
    quick = any(r.get("quick") for r in results.values())
    md = ["# kvpersist benchmark results", ""]
    if quick:
        md += ["**--quick run: tiny sizes, ci model, one or two repetitions. These numbers only show that the "
               "benchmark machinery works; do not quote them.**", ""]
    md += ["- Command: `%s` (from the repository root)" % a.command,
           "- Date: started %s (UTC), took %s; report written %s" % (
               env.get("started", "?"), env.get("elapsed", "?"),
               datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")),
           "- kvpersist: %s" % env.get("revision", "?"),
           "- llama-server: %s" % env.get("llama_server", "?"),
           "- Models: %s" % env.get("models", "?")]
    md += ["- " + m for m in machine()]
    md += ["- Benchmarks ran at niceness %s; before each one the run waited up to %s s for the 1-minute load "
           "average to drop below 1.5 (other sessions share this machine); each section shows the load average "
           "before and after it." % (env.get("nice", "0"), env.get("wait_quiet", "0")),
           "", "The machine is a shared 2-core VM: absolute times move with its load, so every headline figure "
           "is a ratio or a difference of figures measured in the same run, interleaved where possible, with "
           "median (min..max) over repetitions. These are measurements, not tests: nothing here passes or fails "
           "on speed.", ""]
    if a.failed:
        md += ["**Benchmarks that failed in this run: %s** (see the run's output)." % a.failed, ""]
    hl = headlines(results)
    if hl:
        md += ["## Headlines", ""] + ["- " + h for h in hl] + [""]
    if plots.get("switch"):
        md += ["![TTFT of a returning session](results/switch.png)", ""]
    for name in ORDER:
        if name in results:
            md += section_md(name, results[name], plots)
    path = os.path.join(a.out, "RESULTS.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    lib.log("wrote %s and %d plot(s) in %s" % (path, sum(1 for v in plots.values() if v), rd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
