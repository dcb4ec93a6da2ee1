"""POST /v1/runs through nginx against a real Jupyter server with the
sandboxed kernelspec."""

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request

import fcgi_client
from harness import check, eq, expect_error, metric, wait_until


def run(ctx, user, cid, code, status=200, **extra):
    body = {"conversation_id": cid, "code": code}
    body.update(extra)
    r = ctx.post("/v1/runs", body, key=ctx.key(user), timeout=180)
    eq(r.status, status, f"run status {r!r}")
    return r.json()


def gateway(ctx, method, path):
    st = ctx.st
    req = urllib.request.Request(st.gateway_url + path, method=method,
                                 headers={"Authorization": f"token {st.gateway_token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
            return r.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as e:
        return e.code, None


def session_kernel(ctx, user, cid):
    return ctx.psql(f"SELECT kernel_id FROM sessions WHERE user_id = '{user}'"
                    f" AND conversation_id = '{cid}'")


def test_state_persists_across_runs(ctx):
    r = run(ctx, "u-state", "c1", "x = 6 * 7\nprint(x)\nx")
    eq(r["status"], "ok", "first run")
    eq(r["stdout_tail"], "42\n", "stdout")
    eq(r["result"], "42", "result of the last expression")
    eq(r["session"]["created"], True, "created")
    eq(r["session"]["reset"], False, "not reset")
    eq(r["session"]["conversation_id"], "c1", "conversation id")
    check(r["session"]["expires_at"].endswith("Z"), "expires_at is UTC")
    check("stderr_tail" not in r, "no stderr_tail when empty")
    eq(r["artifacts"], [], "artifacts list")
    eq(r["truncated"], False, "not truncated")
    check(isinstance(r["execution_ms"], int), "execution_ms")
    r2 = run(ctx, "u-state", "c1", "x += 1\nprint(x)")
    eq(r2["stdout_tail"], "43\n", "state kept")
    eq(r2["session"]["created"], False, "same session")
    eq(r2["session"]["reset"], False, "not reset")
    eq(r2["result"], None, "no expression, no result")


def test_run_record(ctx):
    code = "print('record')"
    r = run(ctx, "u-record", "c1", code)
    rec = ctx.get(f"/v1/runs/{r['run_id']}", key=ctx.key("u-record")).json()
    eq(rec["status"], "ok", "status")
    eq(rec["code_length"], len(code), "code length")
    eq(rec["code_sha256"], hashlib.sha256(code.encode()).hexdigest(), "code sha256")
    check("code" not in rec, "no code in the record")
    check(rec["finished_at"] and rec["execution_ms"] is not None, "timings")
    expect_error(ctx.get(f"/v1/runs/{r['run_id']}", key=ctx.key("u-other")), 404, "not_found")


def test_users_never_share_a_kernel(ctx):
    run(ctx, "u-alice", "shared", "secret = 'alice'")
    r = run(ctx, "u-bob", "shared", "print(secret)")
    eq(r["status"], "error", "bob cannot see alice's variable")
    eq(r["error_name"], "NameError", "NameError")
    check(session_kernel(ctx, "u-alice", "shared") != session_kernel(ctx, "u-bob", "shared"),
          "two kernels")
    r = run(ctx, "u-bob", "shared", "import os\nprint(sorted(os.listdir('/workspace')))\n"
                                    "open('bob.txt','w').write('b')")
    r = run(ctx, "u-alice", "shared", "import os\nprint(os.path.exists('bob.txt'))")
    eq(r["stdout_tail"], "False\n", "separate workspaces")


def test_exceptions_and_tracebacks(ctx):
    r = run(ctx, "u-exc", "c1", "def f():\n    return 1 / 0\nprint('before')\nf()")
    eq(r["status"], "error", "status")
    eq(r["error"], "ZeroDivisionError: division by zero", "error")
    eq(r["error_name"], "ZeroDivisionError", "error_name")
    check("\x1b" not in r["traceback"], "no ANSI codes")
    check("return 1 / 0" in r["traceback"] and "ZeroDivisionError" in r["traceback"],
          f"traceback {r['traceback']!r}")
    eq(r["stdout_tail"], "before\n", "output before the error kept")
    r = run(ctx, "u-exc", "c1", "import sys\nprint('to stderr', file=sys.stderr)\nraise ValueError('bad \"value\"\\nline2')")
    eq(r["error"], "ValueError: bad \"value\"\nline2", "error with quotes and newline")
    eq(r["stderr_tail"], "to stderr\n", "stderr tail")
    r = run(ctx, "u-exc", "c1", "print('after')")
    eq(r["status"], "ok", "the session goes on after an error")


def test_syntax_error(ctx):
    r = run(ctx, "u-exc", "c2", "def (:")
    eq(r["status"], "error", "status")
    eq(r["error_name"], "SyntaxError", "SyntaxError")


def test_timeout_interrupts(ctx):
    t0 = time.monotonic()
    r = run(ctx, "u-timeout", "c1", "import time\nstate = 'kept'\ntime.sleep(30)", timeout=1)
    elapsed = time.monotonic() - t0
    eq(r["status"], "error", "status")
    eq(r["error"], "TimeoutError: execution exceeded 1s", "error text")
    eq(r["error_name"], "TimeoutError", "error name")
    check(elapsed < 1 + 2 + 10, f"answered in seconds ({elapsed:.1f}s)")
    eq(r["session"]["reset"], False, "an interruptible cell keeps the kernel")
    r = run(ctx, "u-timeout", "c1", "print(state)")
    eq(r["stdout_tail"], "kept\n", "state survived the interrupt")
    eq(r["session"]["reset"], False, "still not reset")


def test_interrupt_proof_loop_resets(ctx):
    run(ctx, "u-stubborn", "c1", "state = 1")
    code = ("import time\nwhile True:\n    try:\n        time.sleep(0.1)\n"
            "    except KeyboardInterrupt:\n        pass\n")
    t0 = time.monotonic()
    r = run(ctx, "u-stubborn", "c1", code, timeout=1)
    elapsed = time.monotonic() - t0
    eq(r["error_name"], "TimeoutError", "timeout")
    eq(r["session"]["reset"], True, "kernel restarted: reset said")
    check(elapsed < 1 + 2 + 15, f"answered within timeout + grace ({elapsed:.1f}s)")
    r = run(ctx, "u-stubborn", "c1", "print('alive'); print('state' in globals())")
    eq(r["status"], "ok", f"next run works {r}")
    eq(r["stdout_tail"], "alive\nFalse\n", "state is gone, as said")
    eq(r["session"]["reset"], False, "the restart is not reported twice")


def test_kernel_exit_is_a_clean_error(ctx):
    run(ctx, "u-exit", "c1", "x = 1")
    r = run(ctx, "u-exit", "c1", "import os\nos._exit(3)", timeout=20)
    eq(r["status"], "error", f"status {r}")
    eq(r["error_name"], "KernelDied", "error name")
    eq(r["session"]["reset"], True, "reset")
    r = wait_until(lambda: (lambda x: x if x["status"] == "ok" else None)(
        run(ctx, "u-exit", "c1", "print('back')", timeout=20)), 60, "a working run")
    eq(r["stdout_tail"], "back\n", "the next run works")


def test_vanished_kernel_is_replaced(ctx):
    run(ctx, "u-vanish", "c1", "x = 1")
    kid = session_kernel(ctx, "u-vanish", "c1")
    status, _ = gateway(ctx, "DELETE", f"/api/kernels/{kid}")
    eq(status, 204, "deleted behind codexec's back")
    r = run(ctx, "u-vanish", "c1", "print('x' in globals())")
    eq(r["status"], "ok", "run works")
    eq(r["stdout_tail"], "False\n", "a new kernel")
    eq(r["session"]["reset"], True, "reset said")
    eq(r["session"]["created"], False, "same session")
    check(session_kernel(ctx, "u-vanish", "c1") != kid, "kernel id changed")


def test_restart_behind_our_back_is_reported(ctx):
    run(ctx, "u-restart", "c1", "x = 1")
    kid = session_kernel(ctx, "u-restart", "c1")
    status, _ = gateway(ctx, "POST", f"/api/kernels/{kid}/restart")
    eq(status, 200, "restarted behind codexec's back")
    # The server's channels for our open WebSocket reconnect to the new
    # process within moments; a run in that instant can only say OutputLost.
    time.sleep(2)
    trips = metric(ctx, "gateway_round_trips")
    r = run(ctx, "u-restart", "c1", "print('x' in globals())\nopen('after.txt', 'w').write('a')",
            timeout=30)
    eq(r["stdout_tail"], "False\n", "state lost")
    eq(r["session"]["reset"], True, "and said so")
    # The new process is a fork of the kernel template, which compiled
    # codexec's epilogue and capture helper once (launcher/template.py):
    # no second request for the sources (a kernel started on its own says
    # it has none, and a second request brings them: test_kernel, unit). A
    # reset run commits no capture; the next one rescans, and finds what
    # it wrote.
    eq(metric(ctx, "gateway_round_trips") - trips, 1, "one round trip: the template's sources")
    trips = metric(ctx, "gateway_round_trips")
    r = run(ctx, "u-restart", "c1", "open('next.txt', 'w').write('b')", timeout=30)
    eq(sorted(a["path"] for a in r["artifacts"]), ["after.txt", "next.txt"],
       "the next run captures both")
    eq(metric(ctx, "gateway_round_trips") - trips, 1, "in one round trip: the kernel kept them")


def quiet_for(ctx, kid, seconds):
    """Whether the gateway has heard nothing of the kernel for seconds.
    (Its execution_state is not asked: it is the last status the server's
    own output socket heard, and after a restart that socket, connecting
    again through the launcher's relay, can miss all of the new process's
    statuses: the state then stays the last one it heard, the "busy" of
    the old process's shutdown request, whose "idle" that process may die
    before sending. Found so: CI waited a minute for "idle" under the
    sanitizers; of 42 restarts of such a kernel in a row, 15 left the
    server saying "busy" or "starting" 4 s later.)"""
    from datetime import datetime, timezone
    req = urllib.request.Request(f"{ctx.st.gateway_url}/api/kernels/{kid}",
                                 headers={"Authorization": f"token {ctx.st.gateway_token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        m = json.loads(r.read())
    last = datetime.fromisoformat(m["last_activity"].replace("Z", "+00:00"))
    return (m["execution_state"] != "dead" and
            (datetime.now(timezone.utc) - last).total_seconds() > seconds)


def relay_up(ctx, kid, since):
    """Whether a launch's relay bound the kernel's endpoint names since the
    time since (launcher/relay.c, listen_at: each launch renames its own
    sockets over them; their change time tells, not their inode numbers,
    which a name's new socket may reuse)."""
    base = os.path.join(ctx.st.jdir, "runtime", f"kernel-{kid}-ipc-")
    try:
        return all(os.stat(f"{base}{n}").st_ctime >= since for n in range(1, 6))
    except FileNotFoundError:
        return False


def test_a_kernel_without_the_sources_asks_for_them(ctx):
    """A kernel started on its own (sandbox.conf: template = false, as
    JavaScript and R kernels always are) has none of codexec's epilogue
    after a restart: it says so, and a second request brings the sources;
    the next run needs one round trip again."""
    name = ctx.test_kernelspec({"template": "false"})
    sock, proc = ctx.spawn_fcgi("no-template", {"kernel_name": name, "kernel_pool_size": "0"})
    key = ctx.key("u-notemplate")

    def post(code):
        body = json.dumps({"conversation_id": "c1", "code": code, "timeout": 30}).encode()
        status, _, out = fcgi_client.request(sock, "POST", "/v1/runs", body,
                                             {"HTTP_AUTHORIZATION": f"Bearer {key}"})
        eq(status, 200, f"{out[:300]!r}")
        return json.loads(out)

    def trips():
        _, _, text = fcgi_client.request(sock, "GET", "/metrics", b"", {"REMOTE_ADDR": "127.0.0.1"})
        return int(re.search(rb"^codexec_gateway_round_trips_total (\d+)$", text, re.M).group(1))

    try:
        eq(post("import os\nprint(os.getpid() != 1)")["stdout_tail"], "True\n",
           "a kernel of its own (not the template's pid 1)")
        kid = session_kernel(ctx, "u-notemplate", "c1")
        since = time.time() - 0.05  # (the file system's clock ticks coarser than ours)
        status, _ = gateway(ctx, "POST", f"/api/kernels/{kid}/restart")
        eq(status, 200, "restarted behind codexec's back")
        # Up: the server answers a restart once the new launcher started,
        # and a kernel started with bwrap takes a second or two; the server's
        # sockets connect again to its relay each on a 100 ms timer (found:
        # a run sent before lost its output, the server's output channel
        # not yet joined). Settled: the suite's reaper (reaper_interval 1)
        # may take its start's messages for talk and restart it once more.
        wait_until(lambda: relay_up(ctx, kid, since), 60, "the new process's relay listens")
        time.sleep(1)
        wait_until(lambda: quiet_for(ctx, kid, 3), 60, "the restarted kernel settles")
        before = trips()
        r = post("print('x' in globals())")
        eq((r["status"], r["stdout_tail"], r["session"]["reset"]), ("ok", "False\n", True),
           "the restart is said")
        eq(trips() - before, 2, "one more round trip, for the sources")
        before = trips()
        post("y = 1")
        eq(trips() - before, 1, "in one round trip: the kernel kept them")
        # A run sent at once waits in the server's queue for the new
        # process, which may take it before the server's output channel
        # joined it (what it printed then lost: OutputLost; the server's
        # sockets connect each on its own timer, so not every time: three
        # rounds). Either way its answer says the restart (found: an
        # OutputLost one said reset false, the epilogue its last cell could
        # not carry never asked).
        for i in range(3):
            post("y = 1")
            status, _ = gateway(ctx, "POST", f"/api/kernels/{kid}/restart")
            eq(status, 200, "restarted behind codexec's back again")
            r = post("print('y' in globals())")
            eq(r["session"]["reset"], True, f"the restart is said, the output lost or not: {r}")
            check(r["status"] == "ok" and r["stdout_tail"] == "False\n" or
                  r.get("error_name") == "OutputLost", f"the new process's own answer: {r}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        ctx.psql("DELETE FROM sessions WHERE user_id = 'u-notemplate'")


def test_a_pooled_kernel_of_its_own_has_the_sources_from_its_warm_cell(ctx):
    """A pooled kernel started on its own (template = false: none of the
    template's copy of the epilogue) gets the sources in its warm cell, also
    when a kernel_preload module fails (IPython then skips the cell's
    expressions): the conversation's first run sends none and is one round
    trip. A pooled kernel deleted behind codexec's back before its claim is
    replaced by a kernel started for the run."""
    name = ctx.test_kernelspec({"template": "false"})
    sock, proc = ctx.spawn_fcgi("no-template-pool", {
        "kernel_name": name, "kernel_pool_size": "1", "kernel_preload": "json, no_such_module_x"})
    key = ctx.key("u-notemplate-pool")

    def ready():
        return ctx.psql("SELECT kernel_id FROM prestarted_kernels WHERE ready"
                        f" AND kernel_name = '{name}'")

    def trips():
        _, _, text = fcgi_client.request(sock, "GET", "/metrics", b"", {"REMOTE_ADDR": "127.0.0.1"})
        return int(re.search(rb"^codexec_gateway_round_trips_total (\d+)$", text, re.M).group(1))

    try:
        pooled = wait_until(ready, 90, "a pooled kernel of its own")
        before = trips()
        body = json.dumps({"conversation_id": "c1", "code": "import os\nprint(os.getpid() != 1)",
                           "timeout": 30}).encode()
        status, _, out = fcgi_client.request(sock, "POST", "/v1/runs", body,
                                             {"HTTP_AUTHORIZATION": f"Bearer {key}"})
        eq(status, 200, f"{out[:300]!r}")
        r = json.loads(out)
        eq((r["stdout_tail"], r["session"]["created"]), ("True\n", True),
           "a new conversation on a kernel of its own")
        eq(session_kernel(ctx, "u-notemplate-pool", "c1"), pooled.strip(), "the pooled one")
        eq(trips() - before, 1, "one round trip: the warm cell loaded the epilogue")
        # a pooled kernel gone before its claim: the run starts one of its
        # own, which no warm cell has served (its round trips depend on when
        # the dead kernel's connection is found closed: not counted here)
        gone = wait_until(ready, 90, "the pool refilled").strip()
        status, _ = gateway(ctx, "DELETE", f"/api/kernels/{gone}")
        eq(status, 204, "the pooled kernel deleted behind codexec's back")
        body = json.dumps({"conversation_id": "c2", "code": "print(1)", "timeout": 60}).encode()
        status, _, out = fcgi_client.request(sock, "POST", "/v1/runs", body,
                                             {"HTTP_AUTHORIZATION": f"Bearer {key}"})
        eq(status, 200, f"{out[:300]!r}")
        eq(json.loads(out)["stdout_tail"], "1\n", "the run, on a kernel started for it")
        check(session_kernel(ctx, "u-notemplate-pool", "c2") not in ("", gone),
              "not the deleted kernel")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        ctx.psql("DELETE FROM sessions WHERE user_id = 'u-notemplate-pool'")
        subprocess.run([ctx.st.admin, "--config", ctx.st.conf, "pool", "drain"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


TAKING_TURNS = r"""
import sys, types
ip = get_ipython()
f = [getattr(sys, a) for a in dir(sys) if a.startswith("_codexec_epi_")][0]
g = f.__globals__
g2 = dict(g)  # another version of the epilogue: its own namespace and Answer class
g2["Answer"] = type("Answer", (), {k: v for k, v in vars(g["Answer"]).items()
                                    if k not in ("__dict__", "__weakref__")})
for name in ("answer_formatting", "epilogue"):
    g2[name] = types.FunctionType(g[name].__code__, g2, name)
token = sys._codexec_kernel
for i in range(1500):
    (f if i % 2 else g2["epilogue"])(token, False)  # each puts its formatter in place
out = ip.user_expressions({"x": "[1, 2]", "a": "g2['Answer']('{}')"})
fmt, depth = ip._format_user_obj, 0
while getattr(fmt, "codexec_answer", None) is not None:  # codexec's formatters over IPython's
    depth += 1
    fmt = dict(zip(fmt.__code__.co_freevars, (c.cell_contents for c in fmt.__closure__)))["slow"]
print(out["x"].get("data", out["x"]), out["a"].get("data", out["a"]), depth)
"""


def test_epilogue_versions_taking_turns_keep_ipython_s_formatting(ctx):
    """The epilogue formats its own answer itself (lib/epilogue.py,
    answer_formatting). Two versions of it on one kernel (two codexecs
    sharing a Jupyter server during an upgrade) each put their formatter
    in place as they take turns: over IPython's own, never over the other's
    (a chain grew by one a turn: 1,501 formatters after 1,500 turns, seen
    so before the fix; past the recursion limit every other value failed
    to format, RecursionError)."""
    run(ctx, "u-turns", "c", "x = 0")
    r = run(ctx, "u-turns", "c", TAKING_TURNS)
    eq(r["stdout_tail"], "{'text/plain': '[1, 2]'} {'text/plain': '{}'} 1\n",
       f"a value and the other version's answer formatted, one formatter over IPython's: {r}")
    r = run(ctx, "u-turns", "c", "print(1)")
    eq((r["stdout_tail"], r["session"]["reset"]), ("1\n", False), "and the next run's epilogue answers")


def test_concurrent_runs_in_one_conversation_are_serialised(ctx):
    run(ctx, "u-serial", "c1", "import time\nlog = []")
    results = []

    def one(i):
        code = (f"t0 = time.time()\ntime.sleep(0.3)\nlog.append(({i}, t0, time.time()))\n"
                f"print(len(log))")
        results.append(run(ctx, "u-serial", "c1", code, timeout=30))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    eq(sorted(r["stdout_tail"] for r in results), ["1\n", "2\n", "3\n", "4\n", "5\n"],
       "every run happened, one after another")
    r = run(ctx, "u-serial", "c1", "spans = sorted((a, b) for _, a, b in log)\n"
                                    "print(all(spans[i][1] <= spans[i + 1][0] for i in range(4)))")
    eq(r["stdout_tail"], "True\n", "no two runs overlapped in the kernel")


def test_busy_conversation_is_409(ctx):
    run(ctx, "u-busy", "c1", "import time")
    first = {}

    def long_run():
        first["r"] = run(ctx, "u-busy", "c1", "time.sleep(8)", timeout=30)

    t = threading.Thread(target=long_run)
    t.start()
    time.sleep(1.5)
    r = ctx.post("/v1/runs", {"conversation_id": "c1", "code": "1"}, key=ctx.key("u-busy"))
    expect_error(r, 409, "conversation_busy")
    # a plain run is recorded with its conversation's lock (lib/run.c); one
    # refused the lock is recorded on its own, and ended as an error
    eq(ctx.psql("SELECT status FROM runs WHERE user_id = 'u-busy' AND conversation_id = 'c1'"
                " AND code_length = 1"), "error", "the refused run has its record")
    t.join()
    eq(first["r"]["status"], "ok", "the long run finished")
    eq(ctx.psql("SELECT count(*) FROM runs WHERE user_id = 'u-busy' AND conversation_id = 'c1'"
                " AND status = 'ok' AND started_at IS NOT NULL"), "2", "the others' records ended ok")


def test_sixteen_conversations_at_once(ctx):
    results = {}

    def one(i):
        results[i] = run(ctx, f"u-many-{i}", f"conv-{i}", f"import os\nprint({i} * 2, os.getcwd())",
                         timeout=60)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    eq(len(results), 16, "all answered")
    for i, r in results.items():
        eq(r["status"], "ok", f"conversation {i}")
        eq(r["stdout_tail"], f"{i * 2} /workspace\n", f"output of {i}")


def test_arguments_travel_as_data(ctx):
    args = {"a": None, "b": True, "c": False, "d": "quote ' \" and \\ backslash\nnew line",
            "e": [1, 2.5, {"x": None}], "f": "'''; import os; os._exit(1); '''", "g": "\u00e9\u4e2d"}
    code = "def main(**kw):\n    return {'got': kw, 'n': len(kw)}"
    r = run(ctx, "u-args", "c1", code, arguments=args)
    eq(r["status"], "ok", f"status {r}")
    eq(r["result"], {"got": args, "n": len(args)}, "result is main's JSON return value")
    r = run(ctx, "u-args", "c1", "print(sorted(k for k in globals() if 'codexec' in k))")
    eq(r["stdout_tail"], "[]\n", "nothing of the call is left in the user's namespace")
    r = run(ctx, "u-args", "c2", "x = 1", arguments={"a": 1})
    eq(r["status"], "error", "main missing")
    eq(r["error_name"], "NameError", "named")
    r = run(ctx, "u-args", "c3", "def main(a):\n    return object()", arguments={"a": 1})
    eq(r["error_name"], "TypeError", "non-JSON return value")
    r = run(ctx, "u-args", "c4", "def main(a):\n    return a\n1/0", arguments={"a": 1})
    eq(r["error_name"], "ZeroDivisionError", "main is not called after a failing cell")
    eq(r["result"], None, "no result")


def test_output_flood_is_truncated(ctx):
    code = "import sys\nwhile True:\n    sys.stdout.write('y' * 9999 + '\\n')"
    r = run(ctx, "u-flood", "c1", code, timeout=60)
    eq(r["status"], "error", "status")
    # Interrupted at the limit; or, where the gateway's output reaches codexec
    # slower than the kernel writes (through a proxy), the kernel's own
    # message queue meets its memory limit first and it dies: both end the
    # flood cleanly.
    what = {k: v for k, v in r.items() if k != "stdout_tail"}
    check((r["truncated"] and r["error_name"] == "OutputLimitExceeded") or
          (r["error_name"] == "KernelDied" and r["session"]["reset"]), f"ended: {what}")
    check(len(r["stdout_tail"]) <= 4000, f"tail bounded ({len(r['stdout_tail'])})")
    r = run(ctx, "u-flood", "c1", "print('quiet')")
    eq(r["stdout_tail"], "quiet\n", "the session goes on")
    eq(r["truncated"], False, "not truncated now")


def test_tail_keeps_the_last_characters(ctx):
    r = run(ctx, "u-tail", "c1", "print(''.join(chr(0x4e00 + i % 50) for i in range(10000)), end='')\nprint('END')")
    t = r["stdout_tail"]
    eq(len(t), 4000, "4000 characters, not bytes")
    check(t.endswith("END\n"), "the end is kept")


def test_close_session(ctx):
    run(ctx, "u-close", "c1", "x = 1\nimport os\nos.makedirs('d/e')\nopen('d/e/f.txt', 'w').write('f')\n"
                              "os.symlink('/etc', 'l')\nopen('.hidden', 'w').write('h')")
    kid = session_kernel(ctx, "u-close", "c1")
    r = ctx.request("DELETE", "/v1/conversations/c1/session", key=ctx.key("u-close"))
    eq(r.status, 204, f"closed {r!r}")
    status, _ = gateway(ctx, "GET", f"/api/kernels/{kid}")
    eq(status, 404, "kernel deleted")
    r = run(ctx, "u-close", "c1", "import os\nprint('x' in globals(), sorted(os.listdir('.')))")
    eq(r["session"]["created"], True, "a new session")
    eq(r["stdout_tail"], "False []\n", "with nothing of the old one: state and workspace gone")
    expect_error(ctx.request("DELETE", "/v1/conversations/nope/session", key=ctx.key("u-close")),
                 404, "not_found")
    expect_error(ctx.request("DELETE", "/v1/conversations/c1/session", key=ctx.key("u-other")),
                 404, "not_found")
    # nginx normalises this to /etc/session, outside codexec's locations, and
    # refuses it itself; what matters is that nothing is deleted.
    r = ctx.request("DELETE", "/v1/conversations/..%2F..%2Fetc/session", key=ctx.key("u-close"))
    check(r.status in (400, 404, 405), f"path trick refused: {r.status}")
    r = ctx.request("DELETE", "/v1/conversations/a%20b/session", key=ctx.key("u-close"))
    expect_error(r, 404, "not_found")


def test_session_cap_evicts_least_recently_used(ctx):
    user = "u-cap"
    for i in range(4):  # the test stack's max_sessions_per_user
        run(ctx, user, f"c{i}", f"v = {i}")
    run(ctx, user, "c0", "v")  # c0 is now the most recently used; c1 the least
    r = run(ctx, user, "c4", "v = 4")
    eq(r["session"]["created"], True, "room was made")
    eq(ctx.psql(f"SELECT count(*) FROM sessions WHERE user_id = '{user}' AND kernel_id IS NOT NULL"),
       "4", "still at the cap")
    r = run(ctx, user, "c1", "print('v' in globals())")
    eq(r["session"]["reset"], True, "the evicted conversation says reset")
    eq(r["stdout_tail"], "False\n", "its state is gone")
    r = run(ctx, user, "c0", "print(v)")
    eq((r["stdout_tail"], r["session"]["reset"], r.get("error")), ("0\n", False, None),
       "the recently used one kept its state")


def test_session_cap_all_busy_is_429(ctx):
    user = "u-cap-busy"
    threads = []
    for i in range(4):
        run(ctx, user, f"b{i}", "import time")
    for i in range(4):
        t = threading.Thread(target=lambda i=i: run(ctx, user, f"b{i}", "time.sleep(6)", timeout=30))
        t.start()
        threads.append(t)
    time.sleep(2)
    r = ctx.post("/v1/runs", {"conversation_id": "b9", "code": "1"}, key=ctx.key(user))
    expect_error(r, 429, "quota_exceeded")
    for t in threads:
        t.join()


def test_ttl_is_extended_never_shrunk(ctx):
    r1 = run(ctx, "u-ttl", "c1", "1", ttl=3000)
    r2 = run(ctx, "u-ttl", "c1", "1", ttl=5)
    eq(r2["session"]["expires_at"] >= r1["session"]["expires_at"], True, "never shrunk")
    r3 = run(ctx, "u-ttl", "c1", "1", ttl=999999)
    check(r3["session"]["expires_at"] >= r2["session"]["expires_at"], "extended (clamped)")


def test_reaper_closes_expired_sessions(ctx):
    run(ctx, "u-reap", "c1", "x = 1", ttl=1)
    kid = session_kernel(ctx, "u-reap", "c1")
    wait_until(lambda: session_kernel(ctx, "u-reap", "c1") == "", 30, "the reaper")
    status, _ = gateway(ctx, "GET", f"/api/kernels/{kid}")
    eq(status, 404, "its kernel is gone")
    r = run(ctx, "u-reap", "c1", "print('x' in globals())")
    eq(r["session"]["created"], True, "a later run starts afresh")


def test_approval_gating(ctx):
    key = ctx.key("u-approve", approval=True)
    approver = ctx.key("u-approve")  # the same user's key without the gate
    r = ctx.post("/v1/runs", {"conversation_id": "c1", "code": "print('approved')"}, key=key)
    eq(r.status, 202, f"pending {r!r}")
    body = r.json()
    eq(body["status"], "pending_approval", "status")
    run_id = body["run_id"]
    eq(ctx.get(f"/v1/runs/{run_id}", key=key).json()["status"], "pending_approval", "record")
    eq(ctx.psql("SELECT count(*) FROM sessions WHERE user_id = 'u-approve'"), "0",
       "nothing ran yet")
    other = ctx.key("u-approve-other")
    expect_error(ctx.post(f"/v1/runs/{run_id}/approve", key=other), 404, "not_found")
    r = ctx.post(f"/v1/runs/{run_id}/approve", key=approver, timeout=120)
    eq(r.status, 200, f"approved {r!r}")
    eq(r.json()["stdout_tail"], "approved\n", "ran")
    eq(r.json()["run_id"], run_id, "same run id")
    expect_error(ctx.post(f"/v1/runs/{run_id}/approve", key=approver), 404, "not_found")
    eq(ctx.get(f"/v1/runs/{run_id}", key=key).json()["status"], "ok", "record updated")
    # reject
    r = ctx.post("/v1/runs", {"conversation_id": "c1", "code": "print('no')"}, key=key)
    rid = r.json()["run_id"]
    r = ctx.post(f"/v1/runs/{rid}/reject", key=approver)
    eq(r.status, 200, "rejected")
    eq(r.json()["status"], "rejected", "status")
    expect_error(ctx.post(f"/v1/runs/{rid}/approve", key=approver), 404, "not_found")
    eq(ctx.psql("SELECT count(*) FROM pending_runs"), "0", "pending requests are not kept")
    # expiry
    r = ctx.post("/v1/runs", {"conversation_id": "c1", "code": "print(1)"}, key=key)
    rid = r.json()["run_id"]
    ctx.psql(f"UPDATE pending_runs SET expires_at = now() - interval '1 second' WHERE run_id = '{rid}'")
    expect_error(ctx.post(f"/v1/runs/{rid}/approve", key=approver), 410, "expired")
    eq(ctx.get(f"/v1/runs/{rid}", key=key).json()["status"], "expired", "record says expired")
    expect_error(ctx.post("/v1/runs/not-a-uuid/approve", key=approver), 404)


def test_pending_code_is_not_kept_after_the_decision(ctx):
    key = ctx.key("u-approve", approval=True)
    r = ctx.post("/v1/runs", {"conversation_id": "c9", "code": "print('PENDING_MARKER')"}, key=key)
    rid = r.json()["run_id"]
    check("PENDING_MARKER" in ctx.psql("SELECT request::text FROM pending_runs"), "kept while pending")
    eq(ctx.post(f"/v1/runs/{rid}/reject", key=ctx.key("u-approve")).status, 200, "rejected")
    check("PENDING_MARKER" not in ctx.psql("SELECT coalesce(string_agg(request::text, ''), '') FROM pending_runs"),
          "gone after the decision")


def test_logs_carry_no_code_or_output(ctx):
    marker = "RUN_LOG_MARKER_7731"
    run(ctx, "u-logs", "c1", f"print('{marker}')\nraise ValueError('{marker}')")
    run(ctx, "u-logs", "c1", "def main(a):\n    return a", arguments={"a": marker})
    text = ctx.log_text()
    check(marker not in text, "no code, output or error text in codexec's logs")
    check(ctx.st.gateway_token not in text, "no gateway token")
    check("code_sha256=" in text, "code hashes are logged instead")


def test_idle_connections_are_drained(ctx):
    """With several codexec processes, a conversation's kernel broadcasts the
    output of runs served by one process to the idle pooled WebSocket of
    another too; unread, Jupyter Server would buffer it without bound. Idle
    pooled connections are read and emptied every second."""
    user, cid = "u-idle", "c1"
    run(ctx, user, cid, "x = 1")  # this process now keeps a connection to the kernel
    sock, proc = ctx.spawn_fcgi("idle2")
    try:
        before = metric(ctx, "gateway_stale_messages")
        body = json.dumps({"conversation_id": cid, "code": "for i in range(200): print(i)"}).encode()
        status, _, out = fcgi_client.request(sock, "POST", "/v1/runs", body,
                                             {"HTTP_AUTHORIZATION": f"Bearer {ctx.key(user)}"})
        eq(status, 200, f"a run served by the other process: {out[:200]!r}")
        wait_until(lambda: metric(ctx, "gateway_stale_messages") > before, 15,
                   "the idle connection to be drained without a run")
    finally:
        proc.send_signal(signal.SIGTERM)
        eq(proc.wait(timeout=20), 0, "clean exit on SIGTERM")
