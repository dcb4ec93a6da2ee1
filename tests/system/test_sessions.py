"""The sessions API (SPEC §10.2): create or warm, read, list, extend."""

import threading
import time

from harness import check, eq, expect_error, new_id, wait_until
from test_runs import run


def session_url(cid):
    return f"/v1/conversations/{cid}/session"


def test_create_read_extend(ctx):
    cid = "sess-" + new_id()
    key = ctx.key("u-sess")
    r = ctx.post(session_url(cid), {"ttl": 120}, key=key)
    eq(r.status, 201, f"created {r!r}")
    s = r.json()
    eq((s["conversation_id"], s["created"], s["language"], s["state"]), (cid, True, "python", "idle"),
       "the object")
    check(s["expires_at"].endswith("Z"), "expires_at is UTC")
    # warm: the first run finds the kernel up and the session not new
    t0 = time.monotonic()
    first = run(ctx, "u-sess", cid, "print('warm')")
    eq(first["session"]["created"], False, "the run did not create it")
    eq(first["stdout_tail"], "warm\n", "ran")
    print(f"# first run after a warm session: {(time.monotonic() - t0) * 1000:.0f} ms")
    r = ctx.post(session_url(cid), {"ttl": 3600}, key=key)
    eq(r.status, 200, "it existed")
    eq(r.json()["created"], False, "not created again")
    longer = r.json()["expires_at"]
    check(longer > s["expires_at"], f"extended: {longer} > {s['expires_at']}")
    r = ctx.post(session_url(cid), {"ttl": 1}, key=key)
    eq(r.json()["expires_at"], longer, "never shrunk")
    # an empty body is the defaults
    r = ctx.request("POST", session_url(cid), key=key)
    eq(r.status, 200, f"no body {r!r}")
    g = ctx.get(session_url(cid), key=key)
    eq(g.status, 200, "read")
    eq(g.json(), {"conversation_id": cid, "created": False, "language": "python",
                  "expires_at": longer, "state": "idle"}, "the same object")
    listed = ctx.get("/v1/conversations", key=key).json()["conversations"]
    check(any(c["conversation_id"] == cid for c in listed), f"listed: {listed}")
    # another user sees none of it
    expect_error(ctx.get(session_url(cid), key=ctx.key("u-sess-other")), 404, "not_found")
    check(all(c["conversation_id"] != cid for c in
              ctx.get("/v1/conversations", key=ctx.key("u-sess-other")).json()["conversations"]),
          "not in another user's list")
    eq(ctx.request("DELETE", session_url(cid), key=key).status, 204, "closed")
    expect_error(ctx.get(session_url(cid), key=key), 404, "not_found")
    check(all(c["conversation_id"] != cid for c in
              ctx.get("/v1/conversations", key=key).json()["conversations"]), "not listed")


def test_busy_while_a_run_holds_it(ctx):
    cid = "sess-" + new_id()
    key = ctx.key("u-sess-busy")
    eq(ctx.post(session_url(cid), {}, key=key).status, 201, "created")
    t = threading.Thread(target=run, args=(ctx, "u-sess-busy", cid, "import time; time.sleep(4)"))
    t.start()
    try:
        wait_until(lambda: ctx.get(session_url(cid), key=key).json()["state"] == "busy",
                   timeout=10, what="busy while the run holds it")
        listed = ctx.get("/v1/conversations", key=key).json()["conversations"]
        eq([c["state"] for c in listed if c["conversation_id"] == cid], ["busy"], "listed busy")
    finally:
        t.join()
    eq(ctx.get(session_url(cid), key=key).json()["state"], "idle", "idle again")


def test_bad_requests(ctx):
    key = ctx.key("u-sess")
    cid = "sess-" + new_id()
    for body in ({"ttl": "x"}, {"ttl": 1.5}, {"language": "cobol"}, {"language": 3},
                 {"nope": 1}):
        expect_error(ctx.post(session_url(cid), body, key=key), 400, "invalid_request")
    expect_error(ctx.post(session_url(cid), b"{", key=key,
                          headers={"Content-Type": "application/json"}), 400)
    expect_error(ctx.post(session_url("bad$id"), {}, key=key), 400, "invalid_request")
    expect_error(ctx.get(session_url("bad$id"), key=key), 404, "not_found")
    expect_error(ctx.post(session_url(cid), {}), 401, "unauthorized")
    expect_error(ctx.get("/v1/conversations"), 401, "unauthorized")
    expect_error(ctx.get(session_url(cid), key=key), 404, "not_found")
    # a body is JSON (SPEC §9); an empty one is the defaults (test_create_read_extend)
    expect_error(ctx.post(session_url(cid), "{}", key=key, headers={"Content-Type": "text/plain"}),
                 415, "unsupported_media_type")
    expect_error(ctx.get(session_url(cid), key=key), 404, "not_found")
    r = ctx.post(session_url(cid), key=key, headers={"Content-Type": "application/json"})
    eq(r.status, 201, f"an empty body with its JSON type is {{}}: {r!r}")
    eq(ctx.request("DELETE", session_url(cid), key=key).status, 204, "closed")
