"""Fault injection with real failures: PostgreSQL stopped, the Jupyter
server killed, storage full (a small tmpfs) or read-only (remounted), in
the middle of a run, an upload and a download. Every answer is a clean
4xx/5xx or a run that says what it could not store; nothing is left
half-stored that fsck can't explain. The matrix is in docs/reliability.md."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import fcgi_client
from harness import check, eq, expect_error, new_id, wait_until
from test_runs import run

PG_BIN = "/usr/lib/postgresql/15/bin"


def staging_files(storage):
    d = os.path.join(storage, ".staging")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def upload(ctx, user, data, name="f.bin", cid=None):
    return ctx.request("POST", f"/v1/artifacts?conversation_id={cid or new_id()}&filename={name}",
                       body=data, headers={"Content-Type": "application/octet-stream"},
                       key=ctx.key(user))


def fsck_clean(ctx, conf, ids=()):
    """fsck over conf's storage finds no file it can't explain (no orphan or
    staging file, no mismatch) and nothing wrong with the artifacts ids.
    (The database is the suite's: rows of other storages are not ours.)"""
    st = ctx.st
    r = st.run([st.admin, "--config", conf, "fsck"], check=False)
    for what in ("orphan file", "stale staging file", "mismatch"):
        check(what not in r.stdout, f"fsck finds no {what}: {r.stdout}")
    for i in ids:
        check(i not in r.stdout, f"fsck does not name {i}: {r.stdout}")


def pg_stop(st):
    st.run([f"{PG_BIN}/pg_ctl", "-D", st.pg_data, "-m", "fast", "-w", "stop"], user=st.db_user)


def health_becomes(ctx, status):
    return wait_until(lambda: (lambda r: r if r.status == status else None)(ctx.get("/v1/health")),
                      15, f"/v1/health answering {status}")


def test_postgresql_down(ctx):
    """PostgreSQL stopped: runs, uploads and downloads answer 503 with
    Retry-After-able errors; an upload cut off by it leaves no staging file;
    everything works again once it is back, without restarting codexec."""
    st = ctx.st
    user = "fault-pg"
    r = upload(ctx, user, b"kept")
    eq(r.status, 201, "an artifact before")
    art = r.json()["artifact_id"]
    key = ctx.key(user)
    before = staging_files(st.storage)
    # an upload in flight when the database goes
    body = b"x" * 300000
    req = fcgi_client.Request(st.socket, "POST", f"/v1/artifacts?conversation_id={new_id()}&filename=cut.bin",
                              {"HTTP_AUTHORIZATION": f"Bearer {key}",
                               "CONTENT_TYPE": "application/octet-stream"}, len(body))
    req.send_body(body[:100000])
    time.sleep(0.3)
    pg_stop(st)
    try:
        req.send_body(body[100000:])
        status, _, resp = req.finish()
        check(status in (500, 503), f"the cut upload answers 5xx: {status} {resp[:200]!r}")
        eq(staging_files(st.storage), before, "no staging file left behind")
        r = ctx.post("/v1/runs", {"conversation_id": new_id(), "code": "1"}, key=key)
        expect_error(r, 503, "unavailable")
        expect_error(upload(ctx, user, b"y"), 503, "unavailable")
        expect_error(ctx.get(f"/v1/artifacts/{art}/content", key=key), 503, "unavailable")
        body = expect_error(health_becomes(ctx, 503), 503, "unavailable")
        check(body["checks"]["postgresql"].startswith("failed"), "health names PostgreSQL")
    finally:
        st.start_pg()
    health_becomes(ctx, 200)
    eq(ctx.get(f"/v1/artifacts/{art}/content", key=key).body, b"kept", "the download works again")
    eq(upload(ctx, user, b"z").status, 201, "uploads work again")
    eq(run(ctx, user, new_id(), "print(1)")["stdout_tail"], "1\n", "runs work again")


def run_in_thread(ctx, user, cid, code):
    """A run posted from a thread, started: the thread, and a dict whose
    "r" is the answer once the thread is joined."""
    result = {}

    def post():
        result["r"] = ctx.post("/v1/runs", {"conversation_id": cid, "code": code}, key=ctx.key(user),
                               timeout=120)
    t = threading.Thread(target=post)
    t.start()
    return t, result


def test_gateway_killed_mid_run(ctx):
    """The Jupyter server dies during a run: the run answers 502; uploads
    and downloads never needed it; once it is back the conversation runs
    again, in a new kernel that says so."""
    st = ctx.st
    user, cid = "fault-gw", new_id()
    run(ctx, user, cid, "x = 1")
    art = upload(ctx, user, b"bytes").json()["artifact_id"]
    t, result = run_in_thread(ctx, user, cid, "import time\ntime.sleep(5)")
    time.sleep(1.5)
    st.kill_pidfile("jupyter")
    try:
        t.join(timeout=120)
        r = result["r"]
        check(r.status in (502, 503), f"the run answers 502/503: {r!r}")
        eq(upload(ctx, user, b"more").status, 201, "uploads go on without the gateway")
        eq(ctx.get(f"/v1/artifacts/{art}/content", key=ctx.key(user)).body, b"bytes",
           "downloads go on without the gateway")
        r = ctx.post("/v1/runs", {"conversation_id": cid, "code": "1"}, key=ctx.key(user))
        check(r.status in (502, 503), f"a run while it is down: {r!r}")
    finally:
        st.start_jupyter()
    r = wait_until(lambda: (lambda r: r if r.status == 200 else None)(
        ctx.post("/v1/runs", {"conversation_id": cid, "code": "print('back')"}, key=ctx.key(user),
                 timeout=120)), 60, "the conversation runs again")
    body = r.json()
    eq(body["stdout_tail"], "back\n", "in a new kernel")
    eq(body["session"]["reset"], True, "which says its state is gone")


NO_IDLE = """
k = get_ipython().kernel
publish = k._publish_status
k._publish_status = lambda status, *a, **kw: None if status == "idle" else publish(status, *a, **kw)
"""


def test_a_gateway_going_away_after_the_reply_is_502(ctx):
    """Found in CI: the Jupyter server, stopped mid-run, failed in its own
    shutdown (a kernel it meant to shut down was already gone) and
    lingered, its port closed and our WebSocket open; the run's reply came,
    its idle status never, and the run answered 200 OutputLost. A server
    that refuses its port then is going away: 502. Here the gateway's
    proxy (nginx, the suite's way to the server) quits gracefully, closing
    its port and keeping the open WebSocket, and the kernel sends no idle
    status (the code saw to it)."""
    st = ctx.st
    user, cid = "fault-gw-away", new_id()
    r = run(ctx, user, cid, NO_IDLE, timeout=30)
    eq(r.get("error_name"), "OutputLost", f"a reply and no idle status, the gateway there: {r}")
    t, result = run_in_thread(ctx, user, cid, "print(1)")
    time.sleep(1)  # the reply is in; the run waits for the idle status
    proxy = st.pid("gateway-proxy")
    os.kill(proxy, signal.SIGQUIT)
    try:
        t.join(timeout=120)
        r = result["r"]
        eq(r.status, 502, f"the gateway's failure: {r!r}")
    finally:
        st.start_gateway_proxy()
    wait_until(lambda: (lambda r: r.status == 200 and r.json()["stdout_tail"] == "back\n")(
        ctx.post("/v1/runs", {"conversation_id": new_id(), "code": "print('back')"},
                 key=ctx.key(user))), 30, "runs work again")
    eq(ctx.request("DELETE", f"/v1/conversations/{cid}/session", key=ctx.key(user)).status, 204,
       "the silenced kernel's session closed")


def test_a_missed_probe_costs_no_session_its_state(ctx):
    """A gateway too busy to answer one probe (here: stopped for the probe's
    3 s; in the wild, swamped by a tenant's output flood) is probed once
    more before a session's kernel is given up: while the failed probe's
    answer is fresh, the conversation keeps its kernel and its state."""
    st = ctx.st
    user, cid = "fault-probe", new_id()
    run(ctx, user, cid, "x = 41")
    pid = st.gateway_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        # (not the reaper's probe: with the server stopped, its sweep may
        # be waiting on a kernel deletion) A new conversation's start probes
        # once the last answer is 2 s old, and answers 502 after its probes
        # failed (or after its kernel start timed out, if a probe was then
        # in flight and the stale answer sent it on).
        time.sleep(2.2)
        r = ctx.post("/v1/runs", {"conversation_id": new_id(), "code": "1"},
                     key=ctx.key("fault-probe-new"), timeout=300)
        check(r.status in (502, 503), f"a start while the server does not answer: {r!r}")
    finally:
        os.kill(pid, signal.SIGCONT)
    # at once, while the failed probe's answer is fresh
    r = run(ctx, user, cid, "print(x + 1)")
    eq(r["stdout_tail"], "42\n", "the same kernel, its state kept")
    eq(r["session"]["reset"], False, "no reset")


def test_a_new_conversation_while_no_gateway_is_usable(ctx):
    """Every gateway known to be down: a new conversation answers codexec's
    own 502 (not nginx's, after a worker died), the process stays up, and
    conversations start again once the gateway is back."""
    st = ctx.st
    fcgi = st.pid("codexec-fcgi")
    st.kill_pidfile("jupyter")
    try:
        # the first finds it gone and says so; the next ones start from
        # that answer
        for _ in range(3):
            r = ctx.post("/v1/runs", {"conversation_id": new_id(), "code": "1"},
                         key=ctx.key("fault-nogw"))
            expect_error(r, 502, "gateway_error")
        eq(st.pid("codexec-fcgi"), fcgi, "codexec-fcgi is the same process")
    finally:
        st.start_jupyter()
    r = wait_until(lambda: (lambda r: r if r.status == 200 else None)(
        ctx.post("/v1/runs", {"conversation_id": new_id(), "code": "print(2)"},
                 key=ctx.key("fault-nogw"), timeout=120)), 60, "conversations start again")
    eq(r.json()["stdout_tail"], "2\n", "a new conversation runs")


class SmallStorage:
    """A codexec-fcgi of its own whose storage is a 1 MiB tmpfs."""

    def __init__(self, ctx, name):
        self.ctx, st = ctx, ctx.st
        self.dir = tempfile.mkdtemp(prefix="cx-small-", dir=st.var)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0750", "tmpfs", self.dir],
                       check=True)
        st.chown(self.dir, st.user)
        self.sock, self.proc = ctx.spawn_fcgi(name, {"storage_dir": self.dir, "delivery": "direct"})
        self.conf = os.path.join(st.var, f"{name}.conf")

    def request(self, method, uri, body=b"", key=None, ctype="application/json"):
        params = {"CONTENT_TYPE": ctype}
        if key:
            params["HTTP_AUTHORIZATION"] = f"Bearer {key}"
        status, _, out = fcgi_client.request(self.sock, method, uri, body, params)
        return status, (json.loads(out) if out[:1] == b"{" else out)

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        subprocess.run(["umount", self.dir], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def test_storage_full(ctx):
    """Storage full (ENOSPC): an upload answers 500 and leaves nothing; a
    run still answers, listing what it could not store as storage_error;
    what was stored before downloads; fsck finds nothing."""
    s = SmallStorage(ctx, "full")
    key = ctx.key("fault-full")
    try:
        status, a = s.request("POST", "/v1/artifacts?conversation_id=c&filename=small.txt",
                              b"small", key, "text/plain")
        eq(status, 201, f"a small upload fits: {a}")
        status, out = s.request("POST", "/v1/artifacts?conversation_id=c&filename=big.bin",
                                b"x" * (2 << 20), key, "application/octet-stream")
        eq((status, out["error"]["code"]), (500, "internal_error"), f"too big for the disk: {out}")
        eq(staging_files(s.dir), [], "nothing staged is left")
        status, r = s.request("POST", "/v1/runs", json.dumps(
            {"conversation_id": new_id(), "code": "open('big.bin', 'wb').write(b'x' * (2 << 20))\n"
                                                   "open('ok.txt', 'w').write('fits')"}).encode(), key)
        eq(status, 200, f"the run answers: {r}")
        eq({x["path"]: x["reason"] for x in r.get("skipped", [])}.get("big.bin"), "storage_error",
           f"the file that did not fit is said: {r.get('skipped')}")
        eq(staging_files(s.dir), [], "nothing staged is left after the run")
        status, body = s.request("GET", f"/v1/artifacts/{a['artifact_id']}/content", key=key)
        eq((status, body), (200, b"small"), "what was stored downloads")
        fsck_clean(ctx, s.conf, [a["artifact_id"]] + [x["artifact_id"] for x in r["artifacts"]])
    finally:
        s.close()


def test_storage_read_only(ctx):
    """Storage read-only (EROFS, as after an I/O error): uploads answer 500,
    health names storage, downloads go on; back to read-write, all works."""
    s = SmallStorage(ctx, "rofs")
    key = ctx.key("fault-ro")
    try:
        status, a = s.request("POST", "/v1/artifacts?conversation_id=c&filename=a.txt", b"before",
                              key, "text/plain")
        eq(status, 201, "an upload before")
        subprocess.run(["mount", "-o", "remount,ro", s.dir], check=True)
        status, out = s.request("POST", "/v1/artifacts?conversation_id=c&filename=b.txt", b"after",
                                key, "text/plain")
        eq((status, out["error"]["code"]), (500, "internal_error"), f"read-only: {out}")
        status, body = s.request("GET", f"/v1/artifacts/{a['artifact_id']}/content", key=key)
        eq((status, body), (200, b"before"), "downloads go on")
        wait_until(lambda: s.request("GET", "/v1/health")[0] == 503, 15, "health says so")
        status, h = s.request("GET", "/v1/health")
        check(h["checks"]["storage"].startswith("failed"), f"storage named: {h['checks']}")
        subprocess.run(["mount", "-o", "remount,rw", s.dir], check=True)
        status, b = s.request("POST", "/v1/artifacts?conversation_id=c&filename=b.txt", b"after",
                              key, "text/plain")
        eq(status, 201, "uploads work again")
        fsck_clean(ctx, s.conf, [a["artifact_id"], b["artifact_id"]])
    finally:
        s.close()
