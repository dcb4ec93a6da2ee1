"""Fault injection: every unit test once more, with its Nth allocation
failing, for every N (or, where a program is slow, for N spread evenly
over its allocations, the first ones always included).

A run passes when the program ends by itself (any exit code: a failed
assertion or "Bail out!" is a clean answer to a failed allocation), within
its time, without a sanitizer report: no crash, no leak under ASan, no
undefined behaviour. The allocator is tests/unit/failalloc.c.

Used by tests/run.py in the sanitizers flavour; also on its own:
    tests/faultinject.py --build build/sanitizers [--budget SECONDS] [PROGRAM...]
(with the environment of a test stack: CODEXEC_TEST_PG and the gateway's).
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import time

MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


def programs(build):
    out = []
    for p in sorted(glob.glob(os.path.join(build, "tests", "unit", "test_*"))):
        if os.access(p, os.X_OK) and not p.endswith((".o", ".log", ".trs", ".c")):
            out.append(p)
    return out


def run_once(prog, env, n, timeout):
    e = dict(env, CX_FAIL_ALLOC=str(n))
    t0 = time.monotonic()
    try:
        p = subprocess.run([prog], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, text=True, errors="replace")
    except subprocess.TimeoutExpired:
        return "timed out", "", time.monotonic() - t0
    out = p.stdout
    if p.returncode < 0:
        return f"killed by signal {-p.returncode}", out, time.monotonic() - t0
    for m in MARKERS:
        if m in out:
            return m.rstrip(":"), out, time.monotonic() - t0
    return None, out, time.monotonic() - t0


def plan(count, per_run, budget):
    """Which allocations to fail: all of them if the budget allows."""
    if count <= 0:
        return []
    runs = max(3, int(budget / max(per_run, 0.001)))
    if runs >= count:
        return list(range(1, count + 1))
    first = list(range(1, min(count, 32, runs // 2) + 1))
    rest = max(0, runs - len(first))
    step = (count - len(first)) / rest if rest else 0
    spread = [len(first) + 1 + int(i * step) for i in range(rest)]
    return sorted(set(first + [n for n in spread if n <= count]))


def inject(prog, env, budget, timeout=200):
    """(failed allocations tried, allocations in all, problems). The
    timeout is above the longest deadline of the code under test (a pooled
    kernel's warm-up waits 120 s): a failed allocation that leaves a wait to
    run to its deadline is a clean answer; one that hangs is not."""
    why, out, took = run_once(prog, env, 0, timeout)
    m = re.search(r"^failalloc: (\d+)$", out, re.M)
    if why or not m:
        return 0, 0, [f"the counting run failed: {why or 'no failalloc count'}\n{out[-2000:]}"]
    count = int(m.group(1))
    problems = []
    ns = plan(count, took, budget)
    for n in ns:
        why, out, _ = run_once(prog, env, n, timeout)
        if why:
            i = max((out.find(mk) for mk in MARKERS if mk in out), default=-1)
            problems.append(f"allocation {n} of {count}: {why}\n{out[max(0, i - 200):i + 2500]}")
            if len(problems) >= 3:
                break
    return len(ns), count, problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--budget", type=float, default=30, help="seconds per program")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    bad = 0
    for prog in programs(a.build):
        if a.names and os.path.basename(prog) not in a.names:
            continue
        tried, count, problems = inject(prog, os.environ, a.budget)
        print(f"{'ok' if not problems else 'not ok'} - {os.path.basename(prog)}: "
              f"{tried} of {count} allocations failed in turn")
        for p in problems:
            print("\n".join("#   " + line for line in p.splitlines()))
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
