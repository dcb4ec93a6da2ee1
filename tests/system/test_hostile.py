"""Hostile kernels and clients can't hurt the server.

Each test reproduces what a tenant's code or an HTTP client could do to
codexec-fcgi (exhaust its descriptors, grow its memory or lists without
bound, starve its reaper, hammer its health check) and shows it bounded,
and the service still serving."""

import base64
import os
import re
import subprocess
import threading
import time
import uuid

import fcgi_client
from harness import check, eq, expect_error, new_id, wait_until
from test_runs import gateway, run

EMPTY_SHA = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")


def fcgi_pid(ctx):
    pid = ctx.st.pid("codexec-fcgi")
    check(pid, "codexec-fcgi runs")
    return pid


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class FdWatch:
    """Samples codexec-fcgi's open descriptors while a block runs."""

    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0, threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, open_fds(self.pid))
            except OSError:
                pass
            time.sleep(0.01)

    def __enter__(self):
        self.base = open_fds(self.pid)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        return False


FORGE = r"""
from IPython.display import display
M = "application/vnd.codexec.capture+json"
for i in range(600):
    display({M: {"op": "file", "n": 100000 + i, "path": f"forged/{i}.txt"}}, raw=True)
    display({M: {"op": "end", "n": 100000 + i, "size": 0, "sha256": "%s"}}, raw=True)
display({M: {"op": "done", "skipped": [{"path": f"s/{i}", "reason": "too_large"}
                                       for i in range(6000)]}}, raw=True)
""" % EMPTY_SHA


def test_forged_capture_records_are_capped(ctx):
    """Found: 4,000 forged file/end pairs held 3,300 descriptors at once and
    committed 2,111 artifacts (max_captured_files is 64). Now the files
    stop at 64, and the skipped list (with 6,000 forged entries more) at
    64 + 4096 and one entry that says so. (600 pairs here: a flood of
    thousands of messages can overrun the kernel's ZeroMQ high-water mark,
    which drops messages, the idle status among them: OutputLost.)"""
    user, cid = "forger", new_id()
    with FdWatch(fcgi_pid(ctx)) as w:
        r = run(ctx, user, cid, FORGE, timeout=120)
    eq(r["status"], "ok", f"the run itself is fine: {r.get('error_name')}")
    check(len(r["artifacts"]) <= 64, f"at most max_captured_files artifacts: {len(r['artifacts'])}")
    skipped = r.get("skipped", [])
    eq(len(skipped), 64 + 4096 + 1, "the skipped list is capped")
    eq(skipped[-1], {"path": "", "reason": "too_many_skipped"}, "and says it was cut")
    check(any(s["reason"] == "too_many_files" for s in skipped), "too_many_files is reported")
    check(w.peak - w.base < 40, f"descriptors stay bounded: {w.base} -> peak {w.peak}")
    r = run(ctx, user, cid, "print('again')")
    eq(r["stdout_tail"], "again\n", "the conversation works on")


def test_a_thousand_images_are_capped(ctx):
    """A notebook that honestly shows 1,000 images: artifacts up to
    max_captured_files, the rest said, and the process unharmed."""
    user, cid = "plotter", new_id()
    code = ("from IPython.display import Image, display\nimport base64\n"
            f"png = base64.b64decode({base64.b64encode(PNG).decode()!r})\n"
            "for i in range(1000):\n    display(Image(data=png))\n")
    with FdWatch(fcgi_pid(ctx)) as w:
        r = run(ctx, user, cid, code, timeout=120)
    eq(r["status"], "ok", "the run")
    eq(len(r["artifacts"]), 64, "max_captured_files images become artifacts")
    check(all(a["path"].startswith("output-") for a in r["artifacts"]), "as outputs")
    check(any(s["reason"] == "too_many_files" for s in r["skipped"]), "the rest are said")
    check(w.peak - w.base < 40, f"descriptors stay bounded: {w.base} -> peak {w.peak}")


def fcgi_metrics(sock):
    status, _, body = fcgi_client.request(sock, "GET", "/metrics", params={"REMOTE_ADDR": "127.0.0.1"})
    eq(status, 200, "metrics")
    return body.decode()


def test_emfile_then_serving_again(ctx):
    """Found: once accept() failed with EMFILE, idle workers exited one by
    one and the process stayed up serving nothing. A codexec-fcgi started
    with 40 descriptors (prlimit, as LimitNOFILE= would) and 24 workers is
    driven to EMFILE for real by uploads that stop half-way (each holds its
    connection, a PostgreSQL connection and a staging file); once they go,
    it must serve again, with every worker."""
    sock, proc = ctx.spawn_fcgi("emfile", workers=24, wrap=["prlimit", "--nofile=40:40", "--"])
    key = ctx.key("emfile-user")
    before = ctx.log_text().count("accept() failed; backing off (24:")
    held = []
    try:
        eq(int(re.search(r"^codexec_workers (\d+)$", fcgi_metrics(sock), re.M).group(1)), 24,
           "24 workers")
        cid = new_id()
        for i in range(30):
            try:
                r = fcgi_client.Request(sock, "POST", f"/v1/artifacts?conversation_id={cid}"
                                        f"&filename=f{i}.bin", {"HTTP_AUTHORIZATION": f"Bearer {key}",
                                                                "CONTENT_TYPE": "application/octet-stream"},
                                        body_length=100000)
                r.send_body(b"x" * 1000)
                held.append(r)
            except OSError:
                break
            time.sleep(0.05)
        wait_until(lambda: before < ctx.log_text().count("accept() failed; backing off (24:"), 30,
                   "accept() failing with EMFILE")
    finally:
        for r in held:
            r.sock.close()
    statuses = []

    def ask():
        try:
            statuses.append(fcgi_client.request(sock, "GET", "/v1/health")[0])
        except OSError as e:
            statuses.append(repr(e))
    try:
        wait_until(lambda: fcgi_client.request(sock, "GET", "/v1/health")[0] == 200, 30,
                   "serving again")
        threads = [threading.Thread(target=ask) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        eq(statuses, [200] * 20, "every request is served again")
        text = fcgi_metrics(sock)
        eq(int(re.search(r"^codexec_workers (\d+)$", text, re.M).group(1)), 24, "no worker exited")
        check(int(re.search(r"^codexec_accept_errors_total (\d+)$", text, re.M).group(1)) > 0,
              "accept errors are counted")
        check(proc.poll() is None, "the process lives")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_health_is_cheap_to_hammer(ctx):
    """Found: every GET /v1/health pinged PostgreSQL, called the gateway
    twice and synced a file. Now the checks are shared, at most a second
    old: 300 requests cost a few rounds of checks, not 300."""
    def rest():
        return int(re.search(r"^codexec_gateway_rest_requests_total (\d+)$",
                             ctx.get("/metrics").body.decode(), re.M).group(1))
    before, t0 = rest(), time.monotonic()
    statuses = []

    def hammer():
        for _ in range(30):
            statuses.append(ctx.get("/v1/health").status)
    threads = [threading.Thread(target=hammer) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    eq(set(statuses), {200}, "all healthy")
    calls = rest() - before
    # two gateway calls per round of checks, one round per second at most
    # (+10: the reaper may delete a kernel meanwhile)
    check(calls <= 2 * (int(elapsed) + 2) + 10,
          f"{calls} gateway calls for 300 checks in {elapsed:.1f}s")


def test_metrics_only_for_the_allow_list(ctx):
    """Found: /metrics was public. It answers loopback by default and the
    addresses in metrics_allow; anyone else gets 403."""
    sock, proc = ctx.spawn_fcgi("metrics-default")
    try:
        for addr, want in (("127.0.0.1", 200), ("::1", 200), ("::ffff:127.0.0.1", 200),
                           ("203.0.113.7", 403), ("", 403)):
            status, _, body = fcgi_client.request(sock, "GET", "/metrics",
                                                  params={"REMOTE_ADDR": addr})
            eq(status, want, f"/metrics from {addr!r}: {body[:200]!r}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    sock, proc = ctx.spawn_fcgi("metrics-net", {"metrics_allow": "203.0.113.0/24"})
    try:
        status, _, _ = fcgi_client.request(sock, "GET", "/metrics",
                                           params={"REMOTE_ADDR": "203.0.113.7"})
        eq(status, 200, "an allowed network")
        status, _, _ = fcgi_client.request(sock, "GET", "/metrics",
                                           params={"REMOTE_ADDR": "127.0.0.1"})
        eq(status, 403, "loopback is no longer in the list")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_run_bodies_have_their_own_cap(ctx):
    """Run bodies are buffered whole: they have their own cap
    (max_run_body_bytes, 1536K in this suite), below uploads' (2M)."""
    body = {"conversation_id": new_id(), "code": "x = 1", "arguments": {"blob": "a" * 1700000}}
    r = ctx.post("/v1/runs", body, key=ctx.key("big-body"))
    expect_error(r, 413, "payload_too_large")
    check("1572864" in r.json()["error"]["message"], f"the message names the cap: {r!r}")
    data = b"b" * 1700000
    r = ctx.request("POST", f"/v1/artifacts?conversation_id={new_id()}&filename=big.bin", body=data,
                    headers={"Content-Type": "application/octet-stream"}, key=ctx.key("big-body"))
    eq(r.status, 201, "an upload of the same size is fine")


def test_pending_approvals_are_capped_per_user(ctx):
    user = "many-pending"
    key = ctx.key(user, approval=True)
    cid = new_id()
    try:
        for i in range(16):
            r = ctx.post("/v1/runs", {"conversation_id": cid, "code": f"x = {i}"}, key=key)
            eq(r.status, 202, f"pending run {i}")
        r = ctx.post("/v1/runs", {"conversation_id": cid, "code": "x = 17"}, key=key)
        expect_error(r, 429, "quota_exceeded")
        r = ctx.post("/v1/runs", {"conversation_id": cid, "code": "x = 1"},
                     key=ctx.key("another-pending", approval=True))
        eq(r.status, 202, "another user is not affected")
    finally:  # decided, as an approver would, so that no other test sees them
        users = "('many-pending', 'another-pending')"
        ctx.psql("DELETE FROM pending_runs p USING runs r WHERE r.id = p.run_id"
                 f" AND r.user_id IN {users}")
        ctx.psql(f"UPDATE runs SET status = 'rejected' WHERE user_id IN {users}"
                 " AND status = 'pending_approval'")


def test_no_output_lost_after_the_kernel_dies(ctx):
    """Found: right after a kernel died, the next run answered OutputLost
    (its output channel was not yet live). Now every (re)start waits for
    iopub; ten deaths in a row, each followed by a run that must print."""
    user, cid = "phoenix", new_id()
    run(ctx, user, cid, "x = 1")
    for i in range(10):
        r = run(ctx, user, cid, "import os; os._exit(3)")
        eq(r["status"], "error", f"death {i}")
        r = run(ctx, user, cid, f"print('again {i}')")
        eq((r["status"], r["stdout_tail"], r.get("error_name")), ("ok", f"again {i}\n", None),
           f"the run after death {i}")


def session_row(ctx, user, cid):
    return ctx.psql(f"SELECT count(*) FROM sessions WHERE user_id = '{user}'"
                    f" AND conversation_id = '{cid}'")


def test_reaper_is_not_starved(ctx):
    """Found: the workspace was emptied by a cell in the tenant's own
    kernel, so an unreadable directory kept the row and a fresh cleaning
    kernel was started every sweep; 16 such rows blocked reaping for
    everyone. Now nothing runs in the kernel (it is deleted; its workspace
    is a tmpfs that goes with it), failures back off per row, and 20 rows
    whose kernels can't be deleted hold nobody up."""
    st = ctx.st
    for i in range(20):
        # a kernel id the gateway client refuses: its deletion always fails
        ctx.psql("INSERT INTO sessions (id, user_id, conversation_id, gateway_url, workspace,"
                 f" kernel_id, expires_at) VALUES (gen_random_uuid(), 'reap-blocker', 'b{i}',"
                 f" '{st.gateway_url}', 'w-x', 'not/a/kernel', now() - interval '1 minute')")
    try:
        user, cid = "reaped", new_id()
        run(ctx, user, cid, "import os\nos.makedirs('d/e')\nopen('d/e/f', 'w').write('x')\n"
                            "os.chmod('d/e', 0)\nos.chmod('d', 0)", ttl=1)
        kernel = ctx.psql(f"SELECT kernel_id FROM sessions WHERE user_id = '{user}'")
        wait_until(lambda: session_row(ctx, user, cid) == "0", 40,
                   "the expired session with an unreadable directory is reaped")
        eq(gateway(ctx, "GET", f"/api/kernels/{kernel}")[0], 404, "its kernel is gone")
        rows = ctx.psql("SELECT count(*) FROM sessions WHERE user_id = 'reap-blocker'"
                        " AND cleanup_failures > 0 AND cleanup_after > now()")
        check(int(rows) >= 16, f"the blocked rows back off: {rows}")
    finally:
        ctx.psql("DELETE FROM sessions WHERE user_id = 'reap-blocker'")


def test_a_lost_database_connection_stops_the_run(ctx):
    """Found: the conversation's advisory lock was lost silently when the
    PostgreSQL connection reconnected, letting two runs into one kernel.
    Now the run holding it stops with 503 when its connection dies, and
    the conversation works afterwards."""
    user, cid = "lock-loser", new_id()
    run(ctx, user, cid, "x = 1")
    result = {}

    def slow():
        result["r"] = ctx.post("/v1/runs", {"conversation_id": cid,
                                            "code": "import time\ntime.sleep(6)\nprint('done')"},
                               key=ctx.key(user), timeout=120)
    t = threading.Thread(target=slow)
    t.start()
    time.sleep(2)
    ctx.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'codexec'"
             " AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
    t.join(timeout=120)
    r = result["r"]
    expect_error(r, 503, "unavailable")
    # its end is recorded on a new connection (found: the run's record was
    # left 'running' while the lost connection was still pinned)
    eq(ctx.psql(f"SELECT count(*) FROM runs WHERE user_id = '{user}' AND conversation_id = '{cid}'"
                " AND status = 'running'"), "0", "no run of it is left running")
    wait_until(lambda: ctx.post("/v1/runs", {"conversation_id": cid, "code": "print(x)"},
                                key=ctx.key(user)).status == 200, 30,
               "the conversation runs again")


def test_dots_inside_names_are_stored(ctx):
    """Found: a user id or file name with '..' inside (john..doe) could never
    be stored: the whole run's capture rolled back."""
    r = run(ctx, "john..doe", new_id(), "open('a..b.txt', 'w').write('x')")
    eq([a["path"] for a in r["artifacts"]], ["a..b.txt"], "captured")
    r = ctx.request("POST", f"/v1/artifacts?conversation_id={new_id()}&filename=x..y.csv",
                    body=b"a,b\n", headers={"Content-Type": "text/csv"}, key=ctx.key("john..doe"))
    eq(r.status, 201, f"uploaded: {r!r}")


def test_fsck_repair_spares_a_file_between_rename_and_commit(ctx):
    """Found: fsck --repair on a live system could delete a file between its
    rename into place and its COMMIT. A transaction that holds the storage
    lock as a commit does, with a file in place and its row not yet
    committed: fsck waits, then finds the row and keeps the file."""
    st = ctx.st
    key = f"artifacts/fsck-race/{uuid.uuid4()}/v1/f.txt"
    path = os.path.join(st.storage, key)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write("x")
    d = path
    while d != st.storage:  # codexec's, so that a wrong repair could remove it
        st.chown(d, st.user)
        d = os.path.dirname(d)
    psql = subprocess.Popen(
        ["/usr/lib/postgresql/15/bin/psql", "-h", st.pg_run, "-p", str(st.pg_port), "-U", "codexec",
         "-d", "codexec", "-v", "ON_ERROR_STOP=1", "-q"], stdin=subprocess.PIPE, text=True)
    psql.stdin.write("BEGIN;\nSELECT pg_advisory_xact_lock_shared(hashtextextended('storage', 3));\n"
                     "INSERT INTO artifacts (id, user_id, conversation_id, path, kind, current_version)"
                     f" VALUES ('{key.split('/')[2]}', 'fsck-race', 'c', 'f.txt', 'file', 1);\n"
                     "INSERT INTO artifact_versions (artifact_id, version, filename, mime_type, size,"
                     f" sha256, storage_key, produced_by) VALUES ('{key.split('/')[2]}', 1, 'f.txt',"
                     " 'text/plain', 1, '2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881',"
                     f" '{key}', '{{}}');\n")
    psql.stdin.flush()
    time.sleep(1)
    fsck = subprocess.Popen(ctx.st.as_user() + [st.admin, "--config", st.conf, "fsck", "--repair"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(2)
    check(fsck.poll() is None, "fsck waits for the commit in flight")
    check(os.path.exists(path), "the file is still there")
    psql.stdin.write("COMMIT;\n")
    psql.stdin.close()
    psql.wait(timeout=30)
    out, _ = fsck.communicate(timeout=60)
    check(os.path.exists(path), f"fsck kept the committed file: {out}")
    check(key not in out, f"and did not report it: {out}")
    r = ctx.admin("fsck", check=False)
    check(key not in r.stdout, "a later fsck agrees")
    ctx.psql("DELETE FROM artifacts WHERE user_id = 'fsck-race'")
    os.unlink(path)
