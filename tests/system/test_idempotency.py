"""Idempotency-Key (SPEC §10.3) on POST /v1/runs, POST /v1/artifacts and
PUT …/files/…: the same key from the same user within 24 hours answers
what the first request answered without doing it again; the same key with
another request is 422 idempotency_mismatch."""

import threading
import time

from harness import check, eq, expect_error, new_id
from test_files import files_url, get, put
from test_runs import run

COUNT = "_ = open('count.txt', 'a').write('x')\nprint('ran')\n"


def keyed_run(ctx, user, body, idem, status=200):
    r = ctx.post("/v1/runs", body, key=ctx.key(user), headers={"Idempotency-Key": idem},
                 timeout=180)
    eq(r.status, status, f"keyed run {r!r}")
    return r


def count(ctx, user, cid):
    return run(ctx, user, cid, "print(open('count.txt').read())")["stdout_tail"]


def test_a_retried_run_runs_once(ctx):
    user, cid, idem = "idem-run", new_id(), "retry-" + new_id()
    body = {"conversation_id": cid, "code": COUNT}
    first = keyed_run(ctx, user, body, idem).json()
    eq(first["stdout_tail"], "ran\n", "the first ran")
    again = keyed_run(ctx, user, body, idem).json()
    eq(again["run_id"], first["run_id"], "the retry is answered the same run")
    eq(again["stdout_tail"], "ran\n", "and its answer")
    eq(count(ctx, user, cid), "x\n", "the code ran once")
    # the key is a user's: another user's same key is its own request
    other = keyed_run(ctx, "idem-run-other", dict(body, conversation_id=new_id()), idem).json()
    check(other["run_id"] != first["run_id"], "another user's key is another request")
    # another body with the key: refused, nothing run
    r = ctx.post("/v1/runs", dict(body, code=COUNT + "print(2)"), key=ctx.key(user),
                 headers={"Idempotency-Key": idem})
    expect_error(r, 422, "idempotency_mismatch")
    eq(count(ctx, user, cid), "x\n", "still once")
    # the same body written otherwise (key order, spacing) is the same request
    r = ctx.post("/v1/runs", ('{"code": %s,  "conversation_id": "%s"}' %
                              (__import__("json").dumps(COUNT), cid)).encode(),
                 key=ctx.key(user), headers={"Idempotency-Key": idem,
                                             "Content-Type": "application/json"})
    eq((r.status, r.json()["run_id"]), (200, first["run_id"]), "the same JSON, reordered")


def test_a_retry_while_the_first_runs_waits_for_it(ctx):
    user, cid, idem = "idem-wait", new_id(), "wait-" + new_id()
    body = {"conversation_id": cid, "code": "import time\ntime.sleep(3)\n" + COUNT}
    got = {}

    def first():
        got["first"] = keyed_run(ctx, user, body, idem).json()

    t = threading.Thread(target=first)
    t.start()
    time.sleep(1)
    second = keyed_run(ctx, user, body, idem).json()
    t.join(timeout=120)
    eq(second["run_id"], got["first"]["run_id"], "the retry got the first's run")
    eq(second["status"], "ok", f"after it ended: {second}")
    eq(ctx.psql(f"SELECT count(*) FROM runs WHERE user_id = '{user}'"), "1", "one run recorded")
    eq(count(ctx, user, cid), "x\n", "the code ran once")


def test_a_detached_retry_names_the_same_run(ctx):
    user, cid, idem = "idem-det", new_id(), "det-" + new_id()
    body = {"conversation_id": cid, "code": COUNT, "wait": False}
    a = keyed_run(ctx, user, body, idem, status=202)
    b = keyed_run(ctx, user, body, idem, status=202)
    eq(b.json(), a.json(), "the same 202")
    eq(b.header("Location"), a.header("Location"), "the same Location")
    time.sleep(2)
    eq(count(ctx, user, cid), "x\n", "ran once")


def test_a_failed_first_releases_its_key(ctx):
    user, idem = "idem-fail", "fail-" + new_id()
    body = {"conversation_id": new_id(), "code": "1", "inputs": [new_id()]}
    expect_error(ctx.post("/v1/runs", body, key=ctx.key(user), headers={"Idempotency-Key": idem}),
                 404, "input_not_found")
    r = keyed_run(ctx, user, {"conversation_id": new_id(), "code": "print(1)"}, idem)
    eq(r.json()["stdout_tail"], "1\n", "the key was free again: a new request ran")


def test_a_day_later_the_key_is_new(ctx):
    user, cid, idem = "idem-day", new_id(), "day-" + new_id()
    body = {"conversation_id": cid, "code": COUNT}
    first = keyed_run(ctx, user, body, idem).json()
    ctx.psql(f"UPDATE idempotency_keys SET created_at = now() - interval '25 hours'"
             f" WHERE user_id = '{user}'")
    again = keyed_run(ctx, user, body, idem).json()
    check(again["run_id"] != first["run_id"], "after 24 hours it is a new request")
    eq(count(ctx, user, cid), "xx\n", "which ran")


def test_uploads_and_file_writes(ctx):
    user, cid = "idem-up", new_id()
    key = ctx.key(user)
    url = f"/v1/artifacts?conversation_id={cid}&filename=a.bin"
    hdr = {"Content-Type": "application/octet-stream", "Idempotency-Key": "up-1"}
    a = ctx.post(url, b"abc" * 1000, key=key, headers=hdr)
    eq(a.status, 201, f"uploaded {a!r}")
    b = ctx.post(url, b"abc" * 1000, key=key, headers=hdr)
    eq((b.status, b.json()), (201, a.json()), "the retry: the same artifact, the same version")
    listed = ctx.get(f"/v1/artifacts?conversation_id={cid}", key=key).json()["artifacts"]
    eq([x["current_version"] for x in listed], [1], f"one artifact, one version: {listed}")
    expect_error(ctx.post(url, b"abd" * 1000, key=key, headers=hdr), 422, "idempotency_mismatch")
    expect_error(ctx.post(url, b"abc" * 999, key=key, headers=hdr), 422, "idempotency_mismatch")
    # a file written, changed by the code, the write retried: not written again
    w = put(ctx, user, cid, "in.txt", b"first", headers={"Idempotency-Key": "put-1"})
    run(ctx, user, cid, "_ = open('in.txt', 'w').write('changed')")
    w2 = put(ctx, user, cid, "in.txt", b"first", headers={"Idempotency-Key": "put-1"})
    eq(w2.json(), w.json(), "the retry is answered the first's answer")
    eq(get(ctx, user, cid, "in.txt").body, b"changed", "and the file was not written again")
    r = ctx.request("PUT", files_url(cid, "in.txt"), body=b"other", key=key,
                    headers={"Content-Type": "application/octet-stream",
                             "Idempotency-Key": "put-1"})
    expect_error(r, 422, "idempotency_mismatch")
    # another path with the key is another request
    r = ctx.request("PUT", files_url(cid, "two.txt"), body=b"first", key=key,
                    headers={"Content-Type": "application/octet-stream",
                             "Idempotency-Key": "put-1"})
    expect_error(r, 422, "idempotency_mismatch")


def test_malformed_keys(ctx):
    key = ctx.key("idem-bad")
    for bad in ("x" * 129, "a\tb", "é"):
        r = ctx.post("/v1/runs", {"conversation_id": new_id(), "code": "1"}, key=key,
                     headers={"Idempotency-Key": bad})
        expect_error(r, 400, "invalid_request")
    r = ctx.post("/v1/runs", {"conversation_id": new_id(), "code": "1"}, key=key,
                 headers={"Idempotency-Key": "x" * 128})
    eq(r.status, 200, "128 characters are fine")
