"""Runs that outlive their client (SPEC §10.3): wait: false answers 202
with Location, GET /v1/runs/{id} while it runs, GET /v1/runs/{id}/events
(replayed from the start, resumed after Last-Event-ID, live while the run
runs), POST /v1/runs/{id}/cancel, and a run whose codexec-fcgi was killed
ending as an error instead of "running" forever."""

import json
import signal
import threading
import time

import fcgi_client
import openapi_check
from harness import check, eq, expect_error, new_id, wait_until
from test_capacity import stop
from test_runs import run
from test_stream import Stream, stream

TICKS = "import time\nfor i in range(6):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.4)\n"
TICKS_OUT = "".join(f"tick {i}\n" for i in range(6))


def detach(ctx, user, code, cid=None, port=None, **extra):
    body = dict({"conversation_id": cid or new_id(), "code": code, "wait": False}, **extra)
    r = ctx.post("/v1/runs", body, key=ctx.key(user), port=port)
    eq(r.status, 202, f"a detached run is accepted: {r!r}")
    openapi_check.SPEC.check("POST", "/v1/runs", 202, {"content-type": r.header("Content-Type")},
                             r.body)
    out = r.json()
    eq(out["status"], "running", "running")
    eq(r.header("Location"), f"/v1/runs/{out['run_id']}", "Location names the run")
    return out["run_id"]


def post_at(ctx, sock, user, body, idem=None):
    """POST /v1/runs straight to a codexec-fcgi's socket: (status, answer)."""
    params = {"HTTP_AUTHORIZATION": f"Bearer {ctx.key(user)}", "CONTENT_TYPE": "application/json"}
    if idem:
        params["HTTP_IDEMPOTENCY_KEY"] = idem
    status, _, out = fcgi_client.request(sock, "POST", "/v1/runs", json.dumps(body).encode(), params)
    return status, json.loads(out)


def detach_at(ctx, sock, user, code):
    """A detached run in the codexec-fcgi at sock; its id."""
    status, out = post_at(ctx, sock, user, {"conversation_id": new_id(), "wait": False,
                                            "timeout": 120, "code": code})
    eq(status, 202, f"accepted: {out!r}")
    return out["run_id"]


def record(ctx, user, run_id):
    r = ctx.get(f"/v1/runs/{run_id}", key=ctx.key(user))
    eq(r.status, 200, f"the run's record {r!r}")
    return r.json()


def ended(ctx, user, run_id, timeout=60):
    wait_until(lambda: record(ctx, user, run_id)["status"] != "running", timeout,
               f"run {run_id} ends")
    return record(ctx, user, run_id)


def events(ctx, user, run_id, last=None, port=None):
    headers = {} if last is None else {"Last-Event-ID": str(last)}
    s = Stream(port or ctx.st.http_port, ctx.key(user), None, path=f"/v1/runs/{run_id}/events",
               method="GET", headers=headers)
    eq(s.resp.status, 200, "the events stream answers 200")
    check(s.header("Content-Type").startswith("text/event-stream"), "as text/event-stream")
    return s


def named(s):
    """The stream's events (not its comments) as (id, name, data)."""
    return [(i, e[1], e[2]) for i, e in zip(s.ids, s.events) if e[1] != ":"]


def stdout_of(evs):
    return "".join(d["text"] for _, n, d in evs if n == "stdout")


def test_a_detached_run_goes_on_without_its_client(ctx):
    user, cid = "det-a", new_id()
    run_id = detach(ctx, user, TICKS + "_ = open('made.txt', 'w').write('x')\n", cid=cid)
    rec = record(ctx, user, run_id)
    eq(rec["status"], "running", f"running while its code runs: {rec}")
    openapi_check.SPEC.check("GET", "/v1/runs/{id}", 200, {"content-type": "application/json"},
                             json.dumps(rec).encode())
    # the conversation is held by it: a second run waits its turn, as ever
    done = ended(ctx, user, run_id)
    eq(done["status"], "ok", f"ended ok: {done}")
    eq(done["stdout_tail"], TICKS_OUT, "its whole answer in the record")
    eq([a["path"] for a in done["artifacts"]], ["made.txt"], "its file captured")
    check(done["result_present"] is False, "the answer's fields are there")
    eq(run(ctx, user, cid, "print(i)")["stdout_tail"], "5\n", "the session kept its state")


def test_events_replayed_cut_and_resumed(ctx):
    user = "det-ev"
    run_id = detach(ctx, user, TICKS)
    s = events(ctx, user, run_id)
    # read until the second stdout event, then cut the connection mid-run
    while len([e for e in named(s) if e[1] == "stdout"]) < 2:
        check(s.next() is not None, "the stream goes on while the run runs")
    first = named(s)
    s.close()
    eq(first[0][1], "run", f"the stream starts at the run's start: {first}")
    eq(first[0][2]["run_id"], run_id, "the run event names the run")
    eq([i for i, _, _ in first], list(range(1, len(first) + 1)), "ids 1, 2, ... in order")
    check(record(ctx, user, run_id)["status"] == "running", "cut while the run still ran")
    last = first[-1][0]
    s = events(ctx, user, run_id, last=last)
    s.all()
    rest = named(s)
    eq(rest[0][0], last + 1, f"resumed right after Last-Event-ID {last}: {rest[:2]}")
    eq(rest[-1][1], "result", "ends with the result")
    eq(rest[-1][2]["status"], "ok", "the result is the run's answer")
    eq(rest[-1][2]["stdout_tail"], TICKS_OUT, "with its output")
    eq(stdout_of(first + rest), TICKS_OUT, "nothing lost, nothing twice across the cut")
    # after the end, the whole story again from the start
    s = events(ctx, user, run_id)
    s.all()
    again = named(s)
    eq([(i, n) for i, n, _ in again[:-1]], [(i, n) for i, n, _ in (first + rest)[:-1]],
       "a replay tells the same events with the same ids")
    eq(again[-1][0], again[-2][0] + 1, "the result's id follows the last event's")
    eq(stdout_of(again), TICKS_OUT, "the output, whole")
    # a resume after the result's id gives the result alone
    s = events(ctx, user, run_id, last=again[-1][0])
    s.all()
    eq([n for _, n, _ in named(s)], ["result"], "only the result")


def test_a_streamed_run_resumes_through_events(ctx):
    user = "det-stream"
    s = stream(ctx, user, TICKS)
    while not any(n == "stdout" for _, n, _ in named(s)):
        check(s.next() is not None, "streaming")
    got = named(s)
    s.close()  # the client goes away; the run goes on
    check(all(i is not None for i, _, _ in got), f"a streamed run's events carry ids: {got}")
    run_id = got[0][2]["run_id"]
    r = events(ctx, user, run_id, last=got[-1][0])
    r.all()
    rest = named(r)
    eq(stdout_of(got + rest), TICKS_OUT, "the rest of the output after the cut")
    eq(rest[-1][1], "result", "and the result")


def test_cancel_a_busy_run(ctx):
    user, cid = "det-cancel", new_id()
    run(ctx, user, cid, "x = 41")
    run_id = detach(ctx, user, "import time\nwhile True:\n    time.sleep(0.1)\n", cid=cid,
                    timeout=120)
    wait_until(lambda: ctx.psql(f"SELECT count(*) FROM run_events WHERE run_id = '{run_id}'"
                                " AND data LIKE '%executing%'") == "1", 30, "executing")
    r = ctx.post(f"/v1/runs/{run_id}/cancel", key=ctx.key(user))
    eq(r.status, 202, f"cancel accepted {r!r}")
    openapi_check.SPEC.check("POST", "/v1/runs/{id}/cancel", 202,
                             {"content-type": r.header("Content-Type")}, r.body)
    eq(r.json(), {"run_id": run_id, "status": "running"}, "the run, still ending")
    done = ended(ctx, user, run_id, timeout=30)
    eq((done["status"], done["error_name"]), ("error", "Cancelled"), f"cancelled: {done}")
    eq(done["session"]["reset"], False, "interrupted, not restarted: its state is kept")
    eq(run(ctx, user, cid, "print(x + 1)")["stdout_tail"], "42\n", "the session works on")
    expect_error(ctx.post(f"/v1/runs/{run_id}/cancel", key=ctx.key(user)), 409, "run_ended")


def test_cancel_a_run_that_ignores_interrupts(ctx):
    user, cid = "det-stubborn", new_id()
    code = ("import time\nwhile True:\n    try:\n        time.sleep(0.1)\n"
            "    except KeyboardInterrupt:\n        pass\n")
    result = {}
    t = threading.Thread(target=lambda: result.update(run(ctx, user, cid, code, timeout=120)))
    t.start()
    try:
        wait_until(lambda: ctx.psql(f"SELECT count(*) FROM runs WHERE user_id = '{user}'"
                                    " AND status = 'running'") == "1", 30, "the run started")
        run_id = ctx.psql(f"SELECT id FROM runs WHERE user_id = '{user}' AND status = 'running'")
        time.sleep(1)
        eq(ctx.post(f"/v1/runs/{run_id}/cancel", key=ctx.key(user)).status, 202, "cancelled")
    finally:
        t.join(timeout=90)
    eq((result.get("status"), result.get("error_name")), ("error", "Cancelled"),
       f"the waiting client is answered Cancelled: {result}")
    eq(result["session"]["reset"], True, "restarted after the grace period, and said so")
    eq(run(ctx, user, cid, "print('again')")["stdout_tail"], "again\n", "the session works on")


def test_cancel_reaches_another_process(ctx):
    """The run is in a second codexec-fcgi; the cancel comes through nginx
    to the first: the notice carries it across."""
    sock, proc = ctx.spawn_fcgi("cancel-b")
    user = "det-cross"
    try:
        run_id = detach_at(ctx, sock, user, "import time\nwhile True:\n    time.sleep(0.1)\n")
        time.sleep(2)
        eq(ctx.post(f"/v1/runs/{run_id}/cancel", key=ctx.key(user)).status, 202, "cancel")
        done = ended(ctx, user, run_id, timeout=30)
        eq(done["error_name"], "Cancelled", f"the other process stopped it: {done}")
    finally:
        stop(proc)


def test_cancel_while_pending_approval(ctx):
    user = "det-pending"
    key = ctx.key(user, approval=True)
    r = ctx.post("/v1/runs", {"conversation_id": new_id(), "code": "1", "wait": False}, key=key)
    eq((r.status, r.json()["status"]), (202, "pending_approval"), f"waits for approval {r!r}")
    run_id = r.json()["run_id"]
    r = ctx.post(f"/v1/runs/{run_id}/cancel", key=key)
    eq((r.status, r.json()["status"]), (202, "error"), f"ended at once {r!r}")
    rec = ctx.get(f"/v1/runs/{run_id}", key=key).json()
    eq((rec["status"], rec["error_name"]), ("error", "Cancelled"), f"{rec}")
    expect_error(ctx.post(f"/v1/runs/{run_id}/approve", key=ctx.key(user)), 404)


def test_a_killed_process_leaves_no_run_running(ctx):
    sock, proc = ctx.spawn_fcgi("killed-det")
    user = "det-killed"
    try:
        run_id = detach_at(ctx, sock, user, "import time; time.sleep(100)")
        time.sleep(1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        stop(proc)
    eq(record(ctx, user, run_id)["status"], "running", "its record still says running")
    # the next codexec-fcgi to start (a restart) sweeps it at once
    sock, proc = ctx.spawn_fcgi("killed-det", {"reaper_interval": "1"})
    try:
        done = ended(ctx, user, run_id, timeout=30)
    finally:
        stop(proc)
    eq((done["status"], done["error_name"]), ("error", "Abandoned"), f"ended as lost: {done}")
    check("process" in done.get("error", ""), f"and says why: {done}")
    s = events(ctx, user, run_id)
    s.all()
    eq(named(s)[-1][2]["error_name"], "Abandoned", "its events end with that result")
    counted, summed = kept(ctx, user)
    check(counted == summed and counted > 64, f"its kept events are counted: {counted}, {summed}")


def kept(ctx, user):
    """(the user's kept bytes as counted, the sum over their runs' records
    and Idempotency-Keys)"""
    out = ctx.psql(f"SELECT (SELECT bytes FROM user_kept_answers WHERE user_id = '{user}'),"
                   f" (SELECT sum(kept_bytes) FROM runs WHERE user_id = '{user}'),"
                   f" (SELECT sum(kept_bytes) FROM idempotency_keys WHERE user_id = '{user}')")
    counted, runs, keys = (int(x) if x else 0 for x in out.split("|"))
    return counted, runs + keys


def test_a_user_s_kept_answers_are_bounded(ctx):
    """user_quota_answer_bytes: past it, a user's oldest kept answers and
    events are forgotten early (the records stay); another user's are not;
    run_answer_ttl's forgetting takes them off the count. An
    Idempotency-Key's answer counts too."""
    user, other, cid = "det-kept", "det-kept-other", new_id()
    big = "print('y' * 300000, flush=True)"  # kept as events: ~300 KB a run
    sock, proc = ctx.spawn_fcgi("det-kept", {"user_quota_answer_bytes": "1M"})
    ids = []
    try:
        theirs = detach_at(ctx, sock, other, big)
        ended(ctx, other, theirs)
        for i in range(6):
            status, out = post_at(ctx, sock, user, {"conversation_id": cid, "wait": False,
                                                    "code": big + f"\nprint({i})"},
                                  idem=f"kept-{i}" if i == 5 else None)
            eq(status, 202, f"accepted: {out!r}")
            ids.append(out["run_id"])
            eq(ended(ctx, user, ids[-1])["status"], "ok", "it ran")
    finally:
        stop(proc)
    counted, summed = kept(ctx, user)
    eq(counted, summed, "the user's count is the sum of their runs' and keys' kept bytes")
    check(int(ctx.psql(f"SELECT kept_bytes FROM idempotency_keys WHERE user_id = '{user}'")) > 0,
          "the key's answer is counted")
    check(900_000 < counted <= 1 << 20, f"within the quota: {counted} bytes")
    first, last = record(ctx, user, ids[0]), record(ctx, user, ids[-1])
    eq(first["status"], "ok", f"the oldest run's record stays: {first}")
    check("stdout_tail" not in first, f"its answer was forgotten: {first}")
    eq(last["stdout_tail"].splitlines()[-1], "5", f"the newest run's answer is kept: {last}")
    s = events(ctx, user, ids[0])
    s.all()
    eq([n for _, n, _ in named(s)], ["result"], "the oldest run's events went with its answer")
    s = events(ctx, user, ids[-1])
    s.all()
    eq(len(stdout_of(named(s))), 300003, "the newest run's events are kept, whole")
    check("stdout_tail" in record(ctx, other, theirs), "another user's answer is untouched")
    # run_answer_ttl's sweep takes what it forgets off the count
    sock, proc = ctx.spawn_fcgi("det-kept-ttl", {"run_answer_ttl": "1", "reaper_interval": "1"})
    try:
        idem = int(ctx.psql(f"SELECT kept_bytes FROM idempotency_keys WHERE user_id = '{user}'"))
        wait_until(lambda: kept(ctx, user) == (idem, idem), 30,
                   "the sweep forgets the answers and counts down (the key stays a day)")
    finally:
        stop(proc)
    check("stdout_tail" not in record(ctx, user, ids[-1]), "the newest answer forgotten too")


def test_limits_and_refusals(ctx):
    user, other = "det-lim", "det-lim-other"
    sock, proc = ctx.spawn_fcgi("det-lim", {"max_concurrent_runs_per_user": "1"}, workers=4)
    try:
        run_id = detach_at(ctx, sock, user, "import time; time.sleep(4)")
        status, out = post_at(ctx, sock, user, {"conversation_id": new_id(), "wait": False,
                                                "code": "1"})
        eq(status, 429, f"a detached run counts as a run in progress: {out!r}")
        eq(out["error"]["code"], "too_many_runs", "too_many_runs")
    finally:
        stop(proc)
    ended(ctx, user, run_id)
    key = ctx.key(user)
    expect_error(ctx.get(f"/v1/runs/{run_id}/events", key=ctx.key(other)), 404, "not_found")
    expect_error(ctx.post(f"/v1/runs/{run_id}/cancel", key=ctx.key(other)), 404, "not_found")
    expect_error(ctx.get(f"/v1/runs/{new_id()}/events", key=key), 404)
    expect_error(ctx.get("/v1/runs/not-a-uuid/events", key=key), 404)
    expect_error(ctx.post(f"/v1/runs/{run_id}/cancel", key=key), 409, "run_ended")
    for bad in ("abc", "-1", "1" * 12, "1 2"):
        expect_error(ctx.get(f"/v1/runs/{run_id}/events", key=key,
                             headers={"Last-Event-ID": bad}), 400, "invalid_request")
    for wait in ("no", 0, None):
        expect_error(ctx.post("/v1/runs", {"conversation_id": "x", "code": "1", "wait": wait},
                              key=key), 400, "invalid_request")
    expect_error(ctx.get(f"/v1/runs/{run_id}/events"), 401)


def live_events(ctx, port=None):
    """A detached run's events followed while it runs: its first output
    arrives long before its end (the web server passes them on unbuffered).
    Returns when the first output and the result arrived, after the stream's
    start."""
    user = "det-live"
    run_id = detach(ctx, user, TICKS, port=port)
    s = events(ctx, user, run_id, port=port)
    s.all()
    outs = [e for e in s.events if e[1] == "stdout"]
    eq("".join(e[2]["text"] for e in outs), TICKS_OUT, "the output, whole")
    first, end = outs[0][0], s.events[-1][0]
    check(end - first >= 1.0, f"the first output came {end - first:.2f}s before the end (want "
          ">= 1 s of the run's 2 s)")
    return first - s.t0, end - s.t0


def test_events_arrive_live_through_nginx(ctx):
    first, end = live_events(ctx)
    print(f"# through nginx: first output after {first * 1000:.0f} ms, result after "
          f"{end * 1000:.0f} ms")
