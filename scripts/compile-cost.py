#!/usr/bin/python3
"""compile-cost.py - CPU time (user + sys) of compiling one file with other compilers and flags.

README "CI" explains the optimization levels of CI's builds with these figures. Each case
compiles one source file with the include directories and definitions of its target (from a
non-unity build's compile_commands.json, which this script configures once in its own build
directory), its optimization and debug flags replaced, and prints the CPU time the compiler
used. CPU time is the measure of work on a shared machine; wall time moves with its load.

Usage: /usr/bin/python3 scripts/compile-cost.py [--build DIR]
       (scripts/record-figures.sh compile keeps its output)
"""

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The sanitizer builds' own flags (CMakeLists.txt KVP_SANITIZE and KVP_FUZZ, scripts/sanitize.sh)
ASAN = "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize=function -fsanitize=fuzzer-no-link"
TSAN = "-fsanitize=thread -fno-omit-frame-pointer"
# (file, compiler, flags replacing its -O and -g, what the case is for)
CASES = [
    ("tests/proxy/control/coordinator_test.cpp", "g++", "-O2 -g", "a test file as RelWithDebInfo builds it"),
    ("tests/proxy/control/coordinator_test.cpp", "g++", "-O0 -g", "a test file at -O0, as every build now compiles it"),
    ("proxy/data/server.cpp", "clang++", "-O1 -g1 " + ASAN, "ASan+UBSan at -O1"),
    ("proxy/data/server.cpp", "clang++", "-O0 -g1 " + ASAN, "ASan+UBSan at -O0, as scripts/sanitize.sh builds"),
    ("proxy/data/server.cpp", "g++", "-O1 -g1 " + TSAN, "TSan at -O1, as scripts/sanitize.sh builds"),
    ("proxy/data/server.cpp", "g++", "-O0 -g1 " + TSAN, "TSan at -O0"),
]


def compile_commands(build: str) -> dict:
    if not os.path.exists(os.path.join(build, "compile_commands.json")):
        subprocess.run(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DKVP_UNITY=OFF",
                        "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                       check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(build, "compile_commands.json")) as f:
        return {os.path.relpath(e["file"], ROOT): e for e in json.load(f)}


def case_command(entry: dict, compiler: str, flags: str) -> list[str]:
    """The target's command for one file: its -I, -D, -std and warnings kept; compiler, -O, -g
    and the output replaced."""
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    cleaned, i = [], 0
    while i < len(args):
        a = args[i]
        if a in ("-o", "-MT", "-MF"):
            i += 2
            continue
        sse2_off = a == "-DRAPIDJSON_SSE2" and "-fsanitize" in flags   # CMakeLists.txt: none under sanitizers
        if re.fullmatch(r"-O\d|-g\d?|-c|-MD", a) or a == entry["file"] or i == 0 or sse2_off:
            i += 1
            continue
        cleaned.append(a)
        i += 1
    return [compiler] + cleaned + shlex.split(flags) + ["-c", entry["file"]]


def compile_once(cmd: list[str], cwd: str) -> tuple[float, int]:
    """The compile's CPU time and how many warnings it printed (g++'s TSan warns about
    atomic_thread_fence in every header that uses it); its object goes to a temporary file."""
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run(cmd + ["-o", os.path.join(tmp, "out.o")], cwd=cwd, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit("compile failed: %s\n%s" % (" ".join(cmd), r.stderr[-3000:]))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, sum(1 for line in r.stderr.splitlines() if ": warning: " in line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-compile-cost"))
    a = ap.parse_args()
    commands = compile_commands(a.build)
    versions = {c: subprocess.run([c, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
                for c in sorted({c for _, c, _, _ in CASES})}
    for c, v in versions.items():
        print("%s: %s" % (c, v))
    print("sanitizer flags: ASan+UBSan %s; TSan %s" % (ASAN, TSAN))
    print("%-34s %-8s %-8s %8s %8s %8s  %s" % ("file", "compiler", "-O -g", "cpu_s", "wall_s", "warnings", "case"))
    for path, compiler, flags, why in CASES:
        entry = commands[path]
        started = time.monotonic()
        cpu, warnings = compile_once(case_command(entry, compiler, flags), entry["directory"])
        print("%-34s %-8s %-8s %8.1f %8.1f %8d  %s" % (path, compiler, " ".join(flags.split()[:2]), cpu,
                                                         time.monotonic() - started, warnings, why),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
