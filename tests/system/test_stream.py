"""Streaming runs: POST /v1/runs with Accept: text/event-stream answers
Server-Sent Events as the run goes (run, status, stdout, stderr, display)
and a final result whose data is the JSON a non-streaming run answers.
Through nginx here; through Apache in test_apache, and read by Chromium's
fetch() in test_browser."""

import http.client
import json
import socket
import threading
import time

import fcgi_client
import openapi_check
from harness import check, eq, new_id, wait_until
from test_runs import run


class Stream:
    """One streaming request, its events read as they arrive, each with
    the time it arrived: (t, name, data); a comment line is (t, ":", text).
    ids holds each event's id: line (None without one), in step with events."""

    def __init__(self, port, key, body, path="/v1/runs", accept="text/event-stream",
                 method="POST", headers=None):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.t0 = time.monotonic()
        headers = dict({"Authorization": f"Bearer {key}", "Accept": accept}, **(headers or {}))
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        self.resp = self.conn.getresponse()
        self.head_at = time.monotonic()
        self.events = []
        self.ids = []

    def header(self, name):
        return self.resp.getheader(name)

    def next(self):
        """The next event or comment, None at the end of the stream."""
        name, data, ev_id = None, [], None
        while True:
            line = self.resp.readline()
            if not line:
                return None
            t = time.monotonic()
            line = line.decode("utf-8").rstrip("\n").rstrip("\r")
            if line.startswith(":"):
                ev = (t, ":", line[1:].strip())
                self.events.append(ev)
                self.ids.append(None)
                return ev
            if line == "":
                if name is None and not data:
                    continue
                ev = (t, name or "message", json.loads("\n".join(data)))
                self.events.append(ev)
                self.ids.append(ev_id)
                return ev
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "id":
                ev_id = int(value)
            elif field == "data":
                data.append(value)

    def all(self):
        while self.next() is not None:
            pass
        self.close()
        return self.events

    def named(self, name):
        return [e for e in self.events if e[1] == name]

    def result(self):
        r = self.named("result")
        eq(len(r), 1, f"one result event: {[e[1] for e in self.events]}")
        eq(self.events[-1][1], "result", "the result is the last event")
        return r[0][2]

    def close(self):
        self.conn.close()


def stream(ctx, user, code, port=None, **extra):
    body = {"conversation_id": extra.pop("cid", new_id()), "code": code}
    body.update(extra)
    s = Stream(port or ctx.st.http_port, ctx.key(user), body)
    eq(s.resp.status, 200, "a stream answers 200")
    check(s.header("Content-Type").startswith("text/event-stream"),
          f"text/event-stream: {s.header('Content-Type')}")
    return s


def check_result_schema(data):
    """The result event's data is a POST /v1/runs answer, by the OpenAPI
    document."""
    openapi_check.SPEC.check("POST", "/v1/runs", 200, {"content-type": "application/json"},
                             json.dumps(data).encode())


def timed_a_then_b(ctx, port=None):
    """A cell that prints a, sleeps a second and prints b: a reaches the
    client well before b. Returns the two arrival times, after the stream's."""
    s = stream(ctx, "st-timing", "import time\nprint('a', flush=True)\ntime.sleep(1)\nprint('b')",
               port=port)
    s.all()
    outs = s.named("stdout")
    text = "".join(e[2]["text"] for e in outs)
    eq(text, "a\nb\n", f"the output, whole: {s.events}")
    ta = next(e[0] for e in outs if "a" in e[2]["text"])
    tb = next(e[0] for e in outs if "b" in e[2]["text"])
    check(tb - ta >= 0.6, f"a arrived {tb - ta:.3f}s before b (want >= 0.6 s of the 1 s sleep)")
    eq(s.result()["stdout_tail"], "a\nb\n", "the result has the tail")
    return ta - s.t0, tb - s.t0


def test_output_arrives_as_it_happens(ctx):
    ta, tb = timed_a_then_b(ctx)
    print(f"# through nginx: a after {ta * 1000:.0f} ms, b after {tb * 1000:.0f} ms")


def test_events_in_order_and_the_result_is_the_answer(ctx):
    user = "st-order"
    code = ("import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
            "open('report.txt', 'w').write('r')\n"
            "import matplotlib.pyplot as plt\n"
            "plt.plot([1, 2])\nplt.show()\n6 * 7")
    s = stream(ctx, user, code)
    s.all()
    names = [e[1] for e in s.events if e[1] != ":"]
    eq(names[0], "run", f"run first: {names}")
    res = s.result()
    eq(s.events[0][2]["run_id"], res["run_id"], "run names the run")
    states = [e[2]["state"] for e in s.named("status")]
    eq(states, ["queued", "executing", "capturing"], "status changes")
    ex = [e[2] for e in s.named("status") if e[2]["state"] == "executing"][0]
    eq(ex["session"]["created"], True, "executing says which session")
    eq("".join(e[2]["text"] for e in s.named("stdout")), "out\n", "stdout")
    eq("".join(e[2]["text"] for e in s.named("stderr")), "err\n", "stderr")
    disp = [e[2] for e in s.named("display")]
    eq(len(disp), 1, f"one display: {disp}")
    eq(disp[0]["mime_type"], "image/png", "the plot")
    arts = {a["path"]: a for a in res["artifacts"]}
    check(disp[0]["path"] in arts, f"announced by the artifact it becomes: {disp} {sorted(arts)}")
    eq(arts[disp[0]["path"]]["mime_type"], "image/png", "an image artifact")
    check("report.txt" in arts, "files are captured")
    eq(res["result"], "42", "the last expression")
    check_result_schema(res)
    # The non-streaming answer for the same code, in a conversation of the
    # same name of another user's
    plain = run(ctx, user + "-plain", res["session"]["conversation_id"], code)

    def comparable(a):
        a = json.loads(json.dumps(a))
        for k in ("run_id", "execution_ms"):
            a.pop(k)
        a["session"].pop("expires_at")
        for art in a["artifacts"]:
            for k in ("artifact_id", "download_url"):
                art.pop(k)
        a["artifacts"].sort(key=lambda x: x["path"])
        for r in a["results"]:  # each run's own artifacts: the same but for their ids
            for v in r["data"].values():
                if isinstance(v, dict):
                    v.pop("artifact_id", None)
        return a
    eq(comparable(res), comparable(plain), "the result event's data is the non-streaming answer")
    # ...and the run's record has it
    rec = ctx.get(f"/v1/runs/{res['run_id']}", key=ctx.key(user)).json()
    eq(rec["status"], "ok", "recorded")
    eq(rec["artifacts"], res["artifacts"], "with its answer")
    eq(rec["stdout_tail"], "out\n", "and tails")
    check("code" not in rec, "never the code")


def test_errors_in_the_stream(ctx):
    user = "st-err"
    s = stream(ctx, user, "print('before')\n1/0")
    s.all()
    res = s.result()
    eq(res["status"], "error", "the code's error")
    eq(res["error_name"], "ZeroDivisionError", "named")
    check_result_schema(res)
    # Refused before the run began: an ordinary answer, no stream
    s = Stream(ctx.st.http_port, ctx.key(user), {"conversation_id": "c", "code": "1",
                                                 "inputs": ["00000000-0000-0000-0000-000000000000"]})
    eq(s.resp.status, 404, "a missing input is a 404, not a stream")
    eq(json.loads(s.resp.read())["error"]["code"], "input_not_found", "its error")
    s.close()
    s = Stream(ctx.st.http_port, ctx.key(user), {"conversation_id": "c", "code": ""})
    eq(s.resp.status, 400, "a blank code is a 400")
    s.close()


def test_hostile_output_cannot_forge_events(ctx):
    """Output is JSON inside one data line: no line break, no event of the
    kernel's making."""
    forged = "\\n\\nevent: result\\ndata: {\\\"status\\\": \\\"forged\\\"}\\n\\n\\r\\r: x\\r\\n"
    s = stream(ctx, "st-forge", f"import sys\nsys.stdout.write('{forged}')\n"
                                "sys.stderr.write('\\u2028\\u0085\\x00')\nsys.stderr.flush()")
    s.all()
    eq(len(s.named("result")), 1, "one result")
    eq(s.result()["status"], "ok", "the real one")
    out = "".join(e[2]["text"] for e in s.named("stdout"))
    eq(out, json.loads('"' + forged + '"'), "the output arrives as text, whole")
    eq("".join(e[2]["text"] for e in s.named("stderr")), "\u2028\u0085\x00", "odd characters too")
    # a NUL in what the kernel sends (its error's message, say) is kept, and
    # the run ends when it ends
    t0 = time.monotonic()
    s = stream(ctx, "st-forge", "print('a\\x00b')\nraise ValueError('x\\x00y')", timeout=20)
    s.all()
    res = s.result()
    check(time.monotonic() - t0 < 15, f"the run ended with its error, not at its timeout: {res}")
    check(res["error"].startswith("ValueError: x"), f"the error (up to the NUL): {res}")
    eq(res["stdout_tail"], "a\x00b\n", "the tail, whole")
    eq("".join(e[2]["text"] for e in s.named("stdout")), "a\x00b\n", "the stream, whole")
    rec = ctx.get(f"/v1/runs/{res['run_id']}", key=ctx.key("st-forge")).json()
    eq((rec["status"], rec["error_name"]), ("error", "ValueError"), "its end is recorded")
    eq(rec["stdout_tail"], "a\x00b\n", "with its answer, NUL and all")
    # an exception class's name is the code's to choose: kept to 128 bytes
    s = stream(ctx, "st-forge", "raise type('E' * 100000, (Exception,), {})('long')")
    s.all()
    res = s.result()
    eq(res["error_name"], "E" * 128, "the name, clipped")
    rec = ctx.get(f"/v1/runs/{res['run_id']}", key=ctx.key("st-forge")).json()
    eq(rec["error_name"], "E" * 128, "recorded so")
    check(len(json.dumps(rec)) < 300 * 1024, "a kept answer stays small")


def test_heartbeats_while_quiet(ctx):
    s = stream(ctx, "st-quiet", "import time\ntime.sleep(17)\nprint('done')", timeout=60)
    s.all()
    beats = [e for e in s.events if e[1] == ":"]
    check(len(beats) >= 1, f"a comment line while the code is quiet: {[e[1] for e in s.events]}")
    eq(s.result()["stdout_tail"], "done\n", "then the result")


def test_output_limit_ends_a_stream(ctx):
    s = stream(ctx, "st-flood", "import sys\nwhile True:\n    sys.stdout.write('y' * 9999 + '\\n')",
               timeout=60)
    s.all()
    res = s.result()
    eq(res["status"], "error", "the run ends")
    sent = sum(len(e[2]["text"]) for e in s.named("stdout"))
    check(sent <= 1024 * 1024, f"no more than max_output_bytes (the suite's 1M) is streamed: {sent}")
    check(res["truncated"] or res["error_name"] == "KernelDied", f"truncated: {res}")


def test_a_client_that_goes_away_loses_nothing(ctx):
    """The client disconnects after the run event: the run completes, its
    files are captured, and GET /v1/runs/{id} has its answer."""
    user = "st-gone"
    s = stream(ctx, user, "import time\nprint('x', flush=True)\ntime.sleep(2)\n"
                          "open('late.txt', 'w').write('written after the client left')")
    t, name, data = s.next()
    eq(name, "run", "the run event first")
    run_id = data["run_id"]
    s.resp.fp.raw._sock.shutdown(socket.SHUT_RDWR)  # gone, mid-run
    s.close()
    key = ctx.key(user)
    rec = wait_until(lambda: (lambda r: r if r.get("status") not in ("running", None) else None)(
        ctx.get(f"/v1/runs/{run_id}", key=key).json()), 60, "the run ends")
    eq(rec["status"], "ok", f"it completed: {rec}")
    arts = {a["path"]: a for a in rec["artifacts"]}
    check("late.txt" in arts, f"its file was captured: {rec}")
    got = ctx.get(arts["late.txt"]["download_url"], key=key)
    eq(got.body, b"written after the client left", "and stored")
    eq(rec["stdout_tail"], "x\n", "its answer is kept")


def test_approval_gated_runs_stream_after_approval(ctx):
    user = "st-gated"
    gated = ctx.key(user, approval=True)
    s = Stream(ctx.st.http_port, gated, {"conversation_id": "c1", "code": "print('approved')"})
    eq(s.resp.status, 202, "the first request is the 202 it always was")
    body = json.loads(s.resp.read())
    s.close()
    eq(body["status"], "pending_approval", "pending")
    s = Stream(ctx.st.http_port, ctx.key(user), None, path=f"/v1/runs/{body['run_id']}/approve")
    eq(s.resp.status, 200, "approval streams")
    s.all()
    eq(s.events[0][1], "run", "from the run event")
    eq(s.result()["stdout_tail"], "approved\n", "to the result")
    s = Stream(ctx.st.http_port, ctx.key(user), None, path=f"/v1/runs/{body['run_id']}/approve")
    eq(s.resp.status, 404, "approved once")
    s.close()


def test_a_busy_conversation_in_the_stream(ctx):
    """The conversation stays busy past busy_wait: the stream, already
    begun, ends with a result event holding the error a plain request
    answers."""
    user, cid = "st-busy", new_id()
    run(ctx, user, cid, "1")
    t = threading.Thread(target=lambda: run(ctx, user, cid, "import time\ntime.sleep(8)"))
    t.start()
    time.sleep(1.5)
    try:
        s = stream(ctx, user, "print('never')", cid=cid)
        s.all()
        res = s.result()
        eq(res["error"]["code"], "conversation_busy", f"the error: {res}")
        eq([e[2]["state"] for e in s.named("status")], ["queued"], "it waited in the queue")
    finally:
        t.join(60)


def test_a_client_that_stops_reading_holds_nothing(ctx):
    """A client that keeps its connection but stops reading (straight on
    codexec's socket, where no web server buffers for it): after 10 s
    without progress codexec counts it gone; the run ends as it would have
    and is recorded, the worker free."""
    user = "st-stall"
    body = json.dumps({"conversation_id": new_id(),
                       "code": "import sys\nfor i in range(95):\n    sys.stdout.write('z' * 9999 + '\\n')\n"
                               "    sys.stdout.flush()"}).encode()
    req = fcgi_client.Request(ctx.st.socket, "POST", "/v1/runs", body_length=len(body),
                              params={"HTTP_AUTHORIZATION": f"Bearer {ctx.key(user)}",
                                      "HTTP_ACCEPT": "text/event-stream"})
    req.send_body(body)
    req.sock.sendall(fcgi_client._record(fcgi_client.STDIN, 1, b""))
    head = b""
    while b"event: run" not in head or b"\n\n" not in head.split(b"event: run", 1)[1]:
        head += req.sock.recv(4096)
    run_id = json.loads(head.split(b"event: run\ndata: ", 1)[1].split(b"\n", 1)[0])["run_id"]
    t0 = time.monotonic()  # from here on nothing is read
    rec = wait_until(lambda: (lambda r: r if r.get("status") not in ("running", None) else None)(
        ctx.get(f"/v1/runs/{run_id}", key=ctx.key(user)).json()), 60, "the run ends")
    took = time.monotonic() - t0
    req.sock.close()
    eq(rec["status"], "ok", f"it ran to its end: {rec}")
    eq(rec["stdout_tail"][-10:], "z" * 9 + "\n", "its answer is kept")
    check(took < 40, f"the stalled client held the run {took:.1f} s (the send timeout is 10 s)")
    print(f"# the stalled client held the run {took:.1f} s")
