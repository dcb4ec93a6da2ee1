#!/usr/bin/python3
"""This checkout's benchmark figures against another revision's, measured
in the same session on the same machine, in alternating rounds.

    tests/bench/against.py --rev 3753c1f [--rounds 3] [--only run --only concurrency]

The other revision is checked out (git worktree) and built under
var/bench-against/<rev>; each round runs its tests/bench/bench.py, then
this checkout's, each on a stack of its own (one at a time). A figure's
ratio to its floor (the raw execute, measured in the same bench) is what
is compared: the machine's speed drifts from minute to minute, the ratio
much less, and alternating rounds spread what drift is left over both.
Prints each ratio's median per revision and today's over the other's,
then the figures themselves the same way: where a change made the floor
itself faster (the gateway, which the raw execute goes through too), the
ratio moves although the figure did not. Not a test: nothing passes or
fails.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

ROW = re.compile(r"^(\S+)\s+(.+?)\s+(-?\d+\.\d+) (\S*)\s+vs (.+?)\s+(\d+\.\d+)×")


def build(rev):
    """A worktree of rev, built (once) as the quickstart builds."""
    tree = os.path.join(REPO, "var", "bench-against", rev)
    if not os.path.isdir(tree):
        os.makedirs(os.path.dirname(tree), exist_ok=True)
        subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", tree, rev], check=True,
                       stdout=subprocess.DEVNULL)
    # the test object store's npm packages (the bench's s3 section), as
    # this checkout has them when the lock is the same, else installed
    mods = os.path.join(tree, "tests", "s3", "node_modules")
    if not os.path.isdir(mods):
        same = subprocess.run(["cmp", "-s", os.path.join(REPO, "tests", "s3", "package-lock.json"),
                               os.path.join(tree, "tests", "s3", "package-lock.json")]).returncode == 0
        if same:
            subprocess.run(["cp", "-a", os.path.join(REPO, "tests", "s3", "node_modules"), mods],
                           check=True)
        else:
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=os.path.dirname(mods),
                           check=True, stdout=subprocess.DEVNULL)
    b = os.path.join(tree, "build")
    if not os.path.exists(os.path.join(b, "fcgi", "codexec-fcgi")):
        subprocess.run(["sh", "-c", "./autogen.sh >/dev/null 2>&1 && mkdir -p build && cd build && "
                        "../configure >/dev/null && make -j2 >/dev/null && make -j2 check TESTS= >/dev/null"],
                       cwd=tree, check=True)
    return tree, b


def bench(tree, build_dir, only, seconds, runs):
    argv = ["/usr/bin/python3", os.path.join(tree, "tests", "bench", "bench.py"), "--build", build_dir,
            "--doc", os.devnull, "--seconds", str(seconds), "--runs", str(runs)]
    for o in only:
        argv += ["--only", o]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    got = {}
    for line in p.stdout.splitlines():
        if line.startswith("# warning"):
            print(line, flush=True)
        m = ROW.match(line)
        if m and m.group(1) != "limits":
            got[(m.group(1), m.group(2).strip())] = (float(m.group(6)), float(m.group(3)), m.group(4))
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", required=True, help="the revision to compare against (last round's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", action="append", default=None)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    a = ap.parse_args()
    only = a.only or ["run", "concurrency"]
    tree, old_build = build(a.rev)
    old, new = {}, {}
    for r in range(a.rounds):
        for name, t, b, into in ((a.rev, tree, old_build, old), ("today", REPO, a.build, new)):
            print(f"# round {r + 1}/{a.rounds}: {name}", flush=True)
            for k, v in bench(t, b, only, a.seconds, a.runs).items():
                into.setdefault(k, []).append(v)
    keys = sorted(set(old) & set(new))
    print(f"\nratios to the floor\n{'what':<64} {a.rev:>10} {'today':>8} {'today/' + a.rev:>16}")
    for k in keys:
        table_row(k, [v[0] for v in old[k]], [v[0] for v in new[k]], "×")
    print(f"\nthe figures\n{'what':<64} {a.rev:>10} {'today':>8} {'today/' + a.rev:>16}")
    for k in keys:
        table_row(k, [v[1] for v in old[k]], [v[1] for v in new[k]], " " + old[k][0][2])
    return 0


def table_row(k, old, new, unit):
    o, n = statistics.median(old), statistics.median(new)
    print(f"{k[0] + ': ' + k[1]:<64} {o:>9.2f}{unit} {n:>7.2f}{unit} {n / o:>15.2f}×  "
          f"(rounds: {', '.join(f'{x:.2f}' for x in old)} | {', '.join(f'{x:.2f}' for x in new)})")


if __name__ == "__main__":
    sys.exit(main())
