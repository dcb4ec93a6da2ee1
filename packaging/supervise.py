#!/usr/bin/python3
"""supervise.py COMMAND...: runs COMMAND and starts it again when it dies.

The quickstart's stand-in for systemd's Restart=on-failure, for the one
service every tenant shares (the Jupyter server): if it is killed (by the
kernel's OOM killer at its memory bound, say) it is back within seconds,
and codexec's next run in each conversation gets a new kernel and says
session.reset. SIGTERM, SIGINT and SIGHUP go to the command; after one of
the first two the supervisor exits with it. Restarts back off from one
second to ten while the command keeps dying within a minute of its start.

Standard library only; one line per event on stderr.
"""

import signal
import subprocess
import sys
import time


def main(argv):
    if not argv:
        print("usage: supervise.py COMMAND...", file=sys.stderr)
        return 2
    state = {"child": None, "stopping": False}

    def forward(sig, _frame):
        if sig in (signal.SIGTERM, signal.SIGINT):
            state["stopping"] = True
        if state["child"] and state["child"].poll() is None:
            state["child"].send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    backoff = 1
    while True:
        started = time.monotonic()
        state["child"] = subprocess.Popen(argv)
        while True:
            try:
                code = state["child"].wait()
                break
            except InterruptedError:
                continue
        if state["stopping"]:
            return code if code >= 0 else 128 - code
        lived = time.monotonic() - started
        backoff = 1 if lived > 60 else min(backoff * 2, 10)
        print(f"supervise: {argv[0]} ended ({code}) after {lived:.0f}s; starting it again "
              f"in {backoff}s", file=sys.stderr, flush=True)
        deadline = time.monotonic() + backoff
        while not state["stopping"] and time.monotonic() < deadline:
            time.sleep(0.1)
        if state["stopping"]:
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
