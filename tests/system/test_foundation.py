"""The HTTP surface through nginx: health, auth, errors, limits, resilience."""

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time

import fcgi_client
from harness import check, eq, expect_error, metric, new_id, wait_until

ZERO = "00000000-0000-0000-0000-000000000000"


def test_health_through_nginx(ctx):
    r = ctx.get("/v1/health")
    eq(r.status, 200, f"health {r!r}")
    body = r.json()
    eq(body["status"], "ok", "status")
    eq(body["checks"], {"postgresql": "ok", "gateway": "ok", "storage": "ok",
                        "gateways": {ctx.st.gateway_url: "ok"}}, "checks")
    eq(r.header("Content-Type"), "application/json", "content type")
    check(re.fullmatch(r"[0-9a-f]{32}", r.header("X-Request-Id") or ""), "request id header")


def test_health_with_key(ctx):
    r = ctx.get("/v1/health", key=ctx.key("alice"))
    eq(r.status, 200, "health with a key")


def test_unauthorized_without_key(ctx):
    r = ctx.get(f"/v1/runs/{ZERO}")
    expect_error(r, 401, "unauthorized")
    eq(r.header("WWW-Authenticate"), "Bearer", "challenge")
    expect_error(ctx.post("/v1/runs", {"conversation_id": "c", "code": "1"}), 401, "unauthorized")


def test_unauthorized_with_bad_keys(ctx):
    good = ctx.key("alice")
    bad = [
        good[:-1] + ("A" if good[-1] != "A" else "B"),  # one character off
        good[:-1],  # truncated
        "cx_" + "A" * 43,
        "' OR '1'='1",
        "x" * 5000,
        good + " ",  # trailing space is trimmed by the parser, so add junk instead
    ]
    bad[-1] = good + "x"
    for k in bad:
        expect_error(ctx.get(f"/v1/runs/{ZERO}", key=k), 401, "unauthorized")
    for hdr in ["Basic YWxpY2U6cHc=", "Bearer", "bearer", "Token " + good, "Bearer\t" + good + "\0"]:
        r = ctx.get(f"/v1/runs/{ZERO}", headers={"Authorization": hdr.replace("\0", "")})
        eq(r.status, 401, f"Authorization: {hdr[:20]!r}")


def test_revoked_key_is_refused(ctx):
    """A key's check is kept by each process (download_cache_entries) and
    forgotten the moment it is revoked: PostgreSQL tells every process."""
    key = ctx.st.create_key("revokee")
    hits = metric(ctx, "key_cache_hits")
    eq(ctx.get(f"/v1/runs/{ZERO}", key=key).status, 404, "fresh key works")
    eq(ctx.get(f"/v1/runs/{ZERO}", key=key).status, 404, "and again")
    check(metric(ctx, "key_cache_hits") > hits, "the second check came from the cache")
    ids = [l.split("\t")[0] for l in ctx.admin("key", "list", "--user", "revokee").stdout.splitlines()[1:]]
    eq(len(ids), 1, "one key listed")
    ctx.admin("key", "revoke", ids[0])
    t0 = time.monotonic()
    while ctx.get(f"/v1/runs/{ZERO}", key=key).status != 401 and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    took = time.monotonic() - t0
    print(f"# the revoked key refused after {took * 1000:.0f} ms")
    check(took < 1.0, f"the revoked key refused within a second ({took:.2f} s)")
    expect_error(ctx.get(f"/v1/runs/{ZERO}", key=key), 401, "unauthorized")
    r = ctx.admin("key", "revoke", ids[0], check=False)
    check(r.returncode != 0, "revoking twice fails")


def test_admin_version_config_check_and_options_anywhere(ctx):
    """codexec-admin --version and codexec-fcgi --version; `config check`
    reads the file as the server does (ok, or the line that is wrong, exit
    1); --config is taken before or after the command."""
    st = ctx.st
    r = st.run([st.admin, "--version"])
    check(re.fullmatch(r"codexec-admin \d+\.\d+\.\d+\n", r.stdout), f"admin version {r.stdout!r}")
    r = st.run([os.path.join(st.bin, "codexec-fcgi"), "--version"])
    check(re.fullmatch(r"codexec-fcgi \d+\.\d+\.\d+\n", r.stdout), f"fcgi version {r.stdout!r}")
    r = st.run([st.admin, "config", "check", "--config", st.conf])
    eq(r.returncode, 0, "config check of the stack's configuration")
    check(r.stdout.startswith(f"{st.conf}: ok"), f"says ok {r.stdout!r}")
    bad = os.path.join(st.var, "bad.conf")
    with open(bad, "w") as f:
        f.write("workers = 4\nno_such_key = 1\n")
    r = st.run([st.admin, f"--config={bad}", "config", "check"], check=False)
    eq(r.returncode, 1, "a bad configuration fails the check")
    check(f"{bad}:2:" in r.stderr and "no_such_key" in r.stderr, f"names the line {r.stderr!r}")
    r = st.run([st.admin, "key", "list", "--config", st.conf])
    eq(r.returncode, 0, "--config after the command")
    r = st.run([st.admin, "key", "list", "--config"], check=False)
    eq(r.returncode, 2, "--config without its file is a usage error")
    r = st.run([st.admin, "--config", st.conf, "key", "create", "--user", "--", "--config"])
    check(re.fullmatch(r"cx_[A-Za-z0-9_-]{43}\n", r.stdout), "after --, --config is an argument")
    # Under systemd stderr is the journal (ExecStartPre=codexec-admin
    # migrate): each message carries its priority.
    with tempfile.TemporaryFile() as err:
        fst = os.fstat(err.fileno())
        env = dict(os.environ, JOURNAL_STREAM=f"{fst.st_dev}:{fst.st_ino}")
        rc = subprocess.run([st.admin, f"--config={bad}", "config", "check"], stderr=err,
                            env=env).returncode
        err.seek(0)
        text = err.read().decode()
    check(rc == 1 and text.startswith("<3>codexec-admin: ") and "no_such_key" in text,
          f"an error at priority 3 in the journal: {text!r}")
    os.unlink(bad)


def test_admin_key_create_prints_only_the_key(ctx):
    r = ctx.admin("key", "create", "--user", "bob", "--label", "laptop")
    lines = r.stdout.splitlines()
    eq(len(lines), 1, "one line on stdout")
    check(re.fullmatch(r"cx_[A-Za-z0-9_-]{43}", lines[0]), f"key shape {lines[0][:6]}…")
    key = lines[0]
    check(key not in r.stderr, "the key is not repeated on stderr")
    # The key authenticates as bob: bob sees bob's run, not alice's.
    bob_run, alice_run = new_id(), new_id()
    ctx.psql(f"INSERT INTO runs (id, user_id, conversation_id, status, code_length, code_sha256)"
             f" VALUES ('{bob_run}', 'bob', 'c1', 'ok', 3, '{'0' * 64}'),"
             f" ('{alice_run}', 'alice', 'c1', 'ok', 3, '{'0' * 64}')")
    r = ctx.get(f"/v1/runs/{bob_run}", key=key)
    eq(r.status, 200, f"bob reads his run {r!r}")
    eq(r.json()["run_id"], bob_run, "run id")
    check("code" not in r.json(), "the run record carries no code")
    # Another user's run answers exactly like a missing one.
    foreign = ctx.get(f"/v1/runs/{alice_run}", key=key)
    missing = ctx.get(f"/v1/runs/{new_id()}", key=key)
    malformed = ctx.get("/v1/runs/not-a-uuid", key=key)
    for resp in (foreign, missing, malformed):
        expect_error(resp, 404, "not_found")
    eq(foreign.body, missing.body, "foreign and missing bodies are identical")
    eq(malformed.body, missing.body, "malformed and missing bodies are identical")
    listing = ctx.admin("key", "list").stdout
    check(key not in listing and key[3:] not in listing, "key list never shows keys")


def test_malformed_json_is_400(ctx):
    key = ctx.key("alice")
    for body in [b"{", b"[]", b"\"x\"", b"{\"conversation_id\": \"c\", \"code\": }", b"",
                 b"{\"a\":1}{", b"\xff\xfe{}", b"{\"code\": \"\xc0\xaf\", \"conversation_id\": \"c\"}",
                 b"{\"conversation_id\":\"c\",\"conversation_id\":\"d\",\"code\":\"1\"}"]:
        r = ctx.post("/v1/runs", body, key=key, headers={"Content-Type": "application/json"})
        expect_error(r, 400, "invalid_request")


def test_invalid_fields_are_400(ctx):
    key = ctx.key("alice")
    cases = [
        {"conversation_id": "c", "code": ""},
        {"conversation_id": "c", "code": "   \n"},
        {"conversation_id": "c/../../etc", "code": "1"},
        {"conversation_id": "c'; DROP TABLE runs; --", "code": "1"},
        {"conversation_id": "c" * 129, "code": "1"},
        {"conversation_id": "c", "code": "1", "capture_artifacts": "false"},
        {"conversation_id": "c", "code": "1", "timeout": -1},
        {"conversation_id": "c", "code": "1", "ttl": "60"},
        {"conversation_id": "c", "code": "1", "inputs": ["../../etc/passwd"]},
        {"conversation_id": "c", "code": "1", "arguments": [1, 2]},
        {"conversation_id": "c", "code": 1},
    ]
    for c in cases:
        r = ctx.post("/v1/runs", c, key=key)
        expect_error(r, 400, "invalid_request")
    eq(ctx.psql("SELECT count(*) FROM runs WHERE conversation_id LIKE 'c%DROP%'"), "0", "no row")


def test_unsupported_media_type(ctx):
    r = ctx.post("/v1/runs", b"conversation_id=c&code=1", key=ctx.key("alice"),
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    expect_error(r, 415)


def test_oversized_body_is_413(ctx):
    key = ctx.key("alice")
    # Over codexec's max_body_bytes (2M here) but under nginx's limit (8M):
    # codexec itself refuses it.
    big = b"{\"conversation_id\":\"c\",\"code\":\"" + b"x" * (3 << 20) + b"\"}"
    expect_error(ctx.post("/v1/runs", big, key=key, headers={"Content-Type": "application/json"}),
                 413, "payload_too_large")
    # Code over max_code_bytes (1M) in a body under the body limit.
    code = b"{\"conversation_id\":\"c\",\"code\":\"" + b"y" * ((1 << 20) + 10) + b"\"}"
    expect_error(ctx.post("/v1/runs", code, key=key, headers={"Content-Type": "application/json"}),
                 413, "payload_too_large")
    # Over nginx's own limit: nginx answers, and still in JSON.
    huge = b"z" * (9 << 20)
    expect_error(ctx.post("/v1/runs", huge, key=key, headers={"Content-Type": "application/json"}),
                 413, "payload_too_large")


def test_unknown_routes_are_404(ctx):
    key = ctx.key("alice")
    for path in ["/v1/nope", "/v1/runs/a/b/c", "/v1/", "/v1/health/x", "/v1/runs/%2e%2e/x",
                 "/v1/runs//approve", "/v1/runs/" + "a" * 4000]:
        r = ctx.get(path, key=key)
        expect_error(r, 404, "not_found")


def test_wrong_method_is_405(ctx):
    key = ctx.key("alice")
    r = ctx.request("DELETE", "/v1/runs", key=key)
    expect_error(r, 405, "method_not_allowed")
    check("POST" in (r.header("Allow") or ""), f"Allow header {r.header('Allow')!r}")
    r = ctx.request("POST", "/v1/health", key=key)
    expect_error(r, 405)
    eq(r.header("Allow"), "GET, HEAD", "Allow on health")
    r = ctx.request("PUT", f"/v1/runs/{ZERO}", key=key)
    expect_error(r, 405)


def test_metrics(ctx):
    ctx.get("/v1/health")
    ctx.get("/v1/nope")
    r = ctx.get("/metrics")
    eq(r.status, 200, "metrics")
    text = r.body.decode()
    check(r.header("Content-Type").startswith("text/plain"), "text format")
    m = re.search(r'^codexec_http_requests_total\{route="health",status="200"\} (\d+)$', text, re.M)
    check(m and int(m.group(1)) >= 1, "health requests counted")
    check(re.search(r'^codexec_http_requests_total\{route="not_found",status="404"\} \d+$', text, re.M),
          "404s counted")
    check(re.search(r'^codexec_http_request_duration_seconds_bucket\{route="health",le="\+Inf"\} \d+$',
                    text, re.M), "latency histogram")
    check("# TYPE codexec_http_request_duration_seconds histogram" in text, "histogram type")


def test_hostile_headers_and_paths(ctx):
    key = ctx.key("alice")
    r = ctx.get(f"/v1/runs/{ZERO}", key=key, headers={"X-Evil": "a" * 6000})
    check(r.status in (404, 400, 431, 494), f"big header handled: {r.status}")
    r = ctx.get("/v1/runs/%00", key=key)
    check(r.status in (400, 404), f"NUL in path: {r.status}")
    r = ctx.get("/v1/health?x=%ff%fe&y=" + "a" * 3000)
    eq(r.status, 200, "odd query strings are ignored where unused")
    # The request id from a client is never echoed into our logs or headers.
    r = ctx.get("/v1/health", headers={"X-Request-Id": "evil line"})
    check(re.fullmatch(r"[0-9a-f]{32}", r.header("X-Request-Id")), "own request id")


def test_logs_carry_no_secrets_or_code(ctx):
    key = ctx.key("alice")
    marker = "SECRET_CODE_MARKER_4242"
    ctx.post("/v1/runs", {"conversation_id": "c", "code": f"print('{marker}')", "timeout": -1},
             key=key)
    ctx.get(f"/v1/runs/{ZERO}", key=key)
    text = ctx.log_text()
    check(marker not in text, "code body not logged")
    check(key not in text and key[3:20] not in text, "API key not logged")
    check(ctx.st.gateway_token not in text, "gateway token not logged")
    check(re.search(r"req=[0-9a-f]{32} ", text), "request ids on lines")


def test_postgresql_restart_needs_no_codexec_restart(ctx):
    key = ctx.key("alice")
    eq(ctx.get(f"/v1/runs/{ZERO}", key=key).status, 404, "before")
    # Cut every connection codexec holds, as a PostgreSQL restart does.
    ctx.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
             " WHERE datname = 'codexec' AND pid <> pg_backend_pid()")
    for _ in range(10):  # every worker thread meets a dead connection once
        r = ctx.get(f"/v1/runs/{ZERO}", key=key)
        eq(r.status, 404, f"after the cut {r!r}")
    st = ctx.st
    st.run(["/usr/lib/postgresql/15/bin/pg_ctl", "-D", st.pg_data, "-m", "fast", "-w", "restart",
            "-l", os.path.join(st.logdir, "postgresql.log")], user=st.db_user)
    for _ in range(10):
        r = ctx.get(f"/v1/runs/{ZERO}", key=key)
        eq(r.status, 404, f"after a restart {r!r}")
    health_becomes(ctx, 200)


def health_becomes(ctx, status):
    """The health answer once it reflects a change: its checks are shared
    and may be up to a second old."""
    return wait_until(lambda: (lambda r: r if r.status == status else None)(ctx.get("/v1/health")),
                      10, f"/v1/health answering {status}")


def test_health_names_what_failed(ctx):
    st = ctx.st
    st.kill_pidfile("jupyter")
    try:
        r = health_becomes(ctx, 503)
        body = expect_error(r, 503, "unavailable")
        eq(body["status"], "unavailable", "status")
        check(body["checks"]["gateway"].startswith("failed"), f"gateway named: {body['checks']}")
        eq(body["checks"]["postgresql"], "ok", "postgresql still ok")
        eq(r.header("Retry-After"), "5", "Retry-After")
        check(st.gateway_token not in r.body.decode(), "no token in the body")
    finally:
        st.start_jupyter()
    health_becomes(ctx, 200)
    # Storage that cannot take writes.
    mode = os.stat(st.storage).st_mode & 0o7777
    os.chmod(st.storage, 0o500)
    try:
        if os.geteuid() == 0 and st.user == "root":
            return
        r = health_becomes(ctx, 503)
        body = expect_error(r, 503, "unavailable")
        check(body["checks"]["storage"].startswith("failed"), f"storage named: {body['checks']}")
    finally:
        os.chmod(st.storage, mode)


def test_graceful_stop_finishes_requests_in_flight(ctx):
    """SIGTERM while a request is mid-body: it still gets its answer, new
    connections are refused, and the process exits."""
    st = ctx.st
    key = ctx.key("alice")
    body = json.dumps({"conversation_id": "c", "code": "1", "timeout": -1}).encode()
    req = fcgi_client.Request(st.socket, "POST", "/v1/runs",
                              {"HTTP_AUTHORIZATION": f"Bearer {key}"}, len(body))
    req.send_body(body[:5])
    time.sleep(0.3)  # the worker is now blocked reading the body
    pid = st.pid("codexec-fcgi")
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)
    check(st.pid("codexec-fcgi"), "still running while a request is in flight")
    req.send_body(body[5:])
    status, headers, resp = req.finish()
    eq(status, 400, f"the in-flight request was answered: {resp!r}")
    wait_until(lambda: not st.pid("codexec-fcgi"), 15, "codexec-fcgi to exit")
    check("stopping; requests in flight will finish" in ctx.log_text(), "stop logged")
    st.start_fcgi()
    health_becomes(ctx, 200)


def test_listens_on_fd0_when_spawned(ctx):
    """A web server (or spawn-fcgi) hands codexec-fcgi its listening socket
    as fd 0."""
    st = ctx.st
    path = os.path.join(st.rundir, "fd0.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(16)
    # Same settings without `listen`: then fd 0 is the listening socket.
    conf = os.path.join(st.var, "fd0.conf")
    with open(st.conf) as f, open(conf, "w") as out:
        out.writelines(l for l in f if not l.startswith("listen "))
    os.chmod(conf, 0o640)  # it holds the gateway's token, as codexec.conf does
    st.chown(conf)
    proc = subprocess.Popen(st.as_user() + [os.path.join(st.bin, "codexec-fcgi"), "--config",
                                            conf, "--workers", "2"],
                            stdin=srv.fileno(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    srv.close()
    try:
        status, headers, body = fcgi_client.request(path, "GET", "/v1/health")
        eq(status, 200, f"health over fd 0: {body!r}")
        status, _, _ = fcgi_client.request(path, "GET", "/v1/nope")
        eq(status, 404, "routing over fd 0")
    finally:
        proc.send_signal(signal.SIGTERM)
        eq(proc.wait(timeout=20), 0, "clean exit on SIGTERM")
        os.unlink(path)


def test_socket_activation_survives_a_stop(ctx):
    """Under systemd socket activation (LISTEN_FDS=1, the socket as fd 3)
    the listening socket is systemd's too: a stopped codexec-fcgi must leave
    it listening, so the next connection starts the next process. (Found by
    package-test: shutdown() of the socket on SIGTERM made codexec.socket
    fail with "resources".) The test holds the socket as systemd does."""
    st = ctx.st
    path = os.path.join(st.rundir, "activated.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(16)
    st.chown(path)
    conf = os.path.join(st.var, "activated.conf")
    with open(st.conf) as f, open(conf, "w") as out:
        out.writelines(l for l in f if not l.startswith("listen "))
    os.chmod(conf, 0o640)
    st.chown(conf)

    def start():
        # LISTEN_PID must be the program's own pid: a shell sets it and execs
        cmd = st.as_user() + ["/bin/sh", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"', "sh",
                              os.path.join(st.bin, "codexec-fcgi"), "--config", conf,
                              "--workers", "2"]
        # the socket becomes fd 3 in the child only (preexec_fn runs before
        # the child closes what pass_fds does not keep)
        return subprocess.Popen(cmd, pass_fds=(3,), preexec_fn=lambda: os.dup2(srv.fileno(), 3),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
    try:
        for i in range(2):
            proc = start()
            try:
                status, _, body = fcgi_client.request(path, "GET", "/v1/health")
                eq(status, 200, f"process {i}: health over the activated socket: {body!r}")
            finally:
                proc.send_signal(signal.SIGTERM)
                eq(proc.wait(timeout=20), 0, f"process {i}: clean exit on SIGTERM")
            # the socket still listens: a client can connect (and wait)
            c = socket.socket(socket.AF_UNIX)
            c.settimeout(5)
            c.connect(path)
            c.close()
    finally:
        srv.close()
        os.unlink(path)


def test_kept_connections_are_closed(ctx):
    """With `fastcgi_keep_conn on`, libfcgi would keep a worker waiting on the
    idle connection (holding the acceptor role, so nobody accepts): codexec
    closes every connection after its response instead. Two workers, an idle
    kept connection, and other requests still get through."""
    path, proc = ctx.spawn_fcgi("keep")
    try:
        kept = fcgi_client.Request(path, "GET", "/v1/nope", keep_conn=True)
        status, _, _ = kept.finish(close=False)
        eq(status, 404, "a request on a kept connection")
        kept.sock.settimeout(10)
        eq(kept.sock.recv(1), b"", "codexec closed the kept connection after the response")
        kept.sock.close()
        idle = fcgi_client.Request(path, "GET", "/v1/nope", keep_conn=True)
        idle.finish(close=False)  # left open by the client
        for _ in range(4):
            status, _, _ = fcgi_client.request(path, "GET", "/v1/nope")
            eq(status, 404, "other connections are served")
        idle.sock.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        eq(proc.wait(timeout=20), 0, "clean exit on SIGTERM")


def test_concurrent_requests(ctx):
    key = ctx.key("alice")
    errors = []

    def worker():
        for _ in range(25):
            r = ctx.get(f"/v1/runs/{ZERO}", key=key)
            if r.status != 404:
                errors.append(r.status)

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    eq(errors, [], "every concurrent request answered correctly")
