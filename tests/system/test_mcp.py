"""/mcp, the MCP server (SPEC §10.6), driven by the official TypeScript
SDK's client (tests/mcp/client.mjs, @modelcontextprotocol/sdk over
Streamable HTTP) through nginx, and its refusals with raw HTTP."""

import base64
import json
import os
import subprocess

import stack
from harness import check, eq, new_id, wait_until

CLIENT = os.path.join(stack.REPO, "tests", "mcp", "client.mjs")


def sdk(ctx, scenario, key, port=None, extra=None, timeout=240):
    """Runs a scenario of the SDK's client; what it saw, as a dict."""
    url = f"http://127.0.0.1:{port or ctx.st.http_port}/mcp"
    args = ["node", CLIENT, scenario, url, key] + ([extra] if extra else [])
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                       cwd=os.path.dirname(CLIENT))
    check(p.returncode == 0 and p.stdout.strip(),
          f"the SDK client ran: rc={p.returncode} stderr={p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    check("fatal" not in out, f"the SDK client failed: {out.get('fatal')}")
    return out


def texts(result):
    return "\n".join(b.get("text", "") for b in result.get("content", []) if b["type"] == "text")


def check_flow(ctx, o, user):
    """What the SDK's client saw in the flow, held to what it should be."""
    sid = o["session_id"]
    check(isinstance(sid, str) and len(sid) == 32, f"a session id: {sid!r}")
    eq(o["protocol_version"], "2025-11-25", "the version the SDK asked for")
    eq(o["server"]["name"], "codexec", "serverInfo")
    check("tools" in o["capabilities"] and "resources" in o["capabilities"], "capabilities")
    eq(o["ping"], {}, "ping")
    eq(sorted(o["tools"]), sorted(["run_code", "write_file", "read_file", "list_files",
                                   "list_artifacts", "get_download_link", "reset_session"]),
       "tools/list")
    eq(texts(o["text"]), "42\n", f"run_code's text: {o['text']}")
    eq(o["text"]["isError"], False, "a run that went well")
    eq(o["text"]["structuredContent"]["status"], "ok", "structuredContent is the run's answer")
    eq(o["text"]["structuredContent"]["session"]["conversation_id"], f"mcp-{sid}",
       "the session's own conversation")
    eq(texts(o["state"]), "43\n", "state kept between calls")
    eq(o["error"]["isError"], True, f"an error of the code: {o['error']}")
    check("ZeroDivisionError" in texts(o["error"]), f"the error's name in its text: {o['error']}")
    images = [b for b in o["image"]["content"] if b["type"] == "image"]
    check(len(images) == 1 and images[0]["mimeType"] == "image/png", f"plt.show() as an image: "
          f"{[b['type'] for b in o['image']['content']]}")
    check(base64.b64decode(images[0]["data"]).startswith(b"\x89PNG"), "the image is a PNG")
    links = [b for b in o["artifact"]["content"] if b["type"] == "resource_link"]
    check(len(links) == 1 and links[0]["name"] == "report.csv" and
          links[0]["uri"].startswith("codexec://artifacts/"), f"the artifact's resource_link: {links}")
    eq(o["write"]["structuredContent"]["size"], 14, f"write_file: {o['write']}")
    eq(o["read"]["content"], [{"type": "text", "text": "hello from mcp"}], "read_file of text")
    blob = o["read_bin"]["content"][0]
    eq(blob["type"], "resource", f"read_file of bytes: {blob}")
    eq(base64.b64decode(blob["resource"]["blob"]), bytes([0, 1, 2, 255]), "the bytes")
    paths = [f["path"] for f in o["list"]["structuredContent"]["files"]]
    check("data/in.txt" in paths and "bin.dat" in paths, f"list_files: {paths}")
    eq(texts(o["code_sees"]), "hello from mcp\n", "the code sees the file at /mnt/data")
    check("error" in o["bad_path"] and "invalid" in o["bad_path"]["error"].lower(),
          f"a hostile path is a JSON-RPC error: {o['bad_path']}")
    eq(o["bad_path"].get("code"), -32602, "its code")
    eq(o["no_tool"].get("code"), -32602, f"an unknown tool: {o['no_tool']}")
    uris = [r["uri"] for r in o["resources"]["resources"]]
    check(any(links[0]["uri"].startswith(u) for u in uris), f"resources/list: {uris}")
    eq(o["resource_read"]["contents"][0]["text"], "a,b\n1,2\n", "resources/read of the csv")
    eq(o["resource_missing"].get("code"), -32002, f"a missing resource: {o['resource_missing']}")
    arts = o["artifacts"]["structuredContent"]["artifacts"]
    check(any(a["path"] == "report.csv" for a in arts), f"list_artifacts: {arts}")
    url = o["download_link"]["structuredContent"]["url"]
    check(url.startswith("http://127.0.0.1:") and "/v1/artifacts/" in url and "sig=" in url,
          f"an absolute signed link: {url}")
    return sid


def check_live(ctx, o, user, sid):
    p = o["progress"]
    ticks = [e for e in p["events"] if "tick" in (e.get("message") or "")]
    check(len(ticks) >= 2, f"progress notifications with the output: {p['events']}")
    check(ticks[0]["ms"] < p["end_ms"] - 1000,
          f"the first arrived before the run ended: {ticks[0]['ms']} ms of {p['end_ms']} ms")
    check(all(b["progress"] > a["progress"] for a, b in zip(p["events"], p["events"][1:])),
          "progress increases")
    c = o["cancel"]
    check(c["rejected"], f"the SDK gave the cancelled call up: {c}")  # (its own doing: the
    # server's part is the run ending Cancelled and the conversation free, below)
    check("result" in o["after_cancel"], f"the next run: {o['after_cancel']}")
    eq(texts(o["after_cancel"]["result"]), "after\n", f"the next run: {o['after_cancel']}")
    check(o["after_cancel"]["ms"] < 10000, f"... without waiting for the cancelled run: {o['after_cancel']}")
    wait_until(lambda: ctx.psql(
        f"SELECT count(*) FROM runs WHERE user_id = '{user}' AND conversation_id = 'mcp-{sid}'"
        " AND error_name = 'Cancelled'") == "1", 20, "the cancelled run ends Cancelled")
    eq(o["reset"]["structuredContent"], {"conversation_id": f"mcp-{sid}", "closed": True},
       "reset_session")
    eq(texts(o["after_reset"]), "False\n", "a fresh kernel after the reset")
    eq(o["terminate"], {"session_id": None}, "DELETE ended the session")
    check("error" in o["after_delete"] and "404" in o["after_delete"]["error"],
          f"the ended session is 404: {o['after_delete']}")


def test_the_sdk_client_through_nginx(ctx):
    user = "u-mcp"
    o = sdk(ctx, "flow", ctx.key(user))
    sid = check_flow(ctx, o, user)
    check_live(ctx, o, user, sid)


def test_run_code_in_each_language(ctx):
    """run_code's language: JavaScript and R through the SDK's client, an
    R plot as image content, a mismatch as a JSON-RPC error."""
    o = sdk(ctx, "languages", ctx.key("u-mcp-lang"), extra="lang-" + new_id())
    eq((texts(o["js"]), o["js"]["isError"]), ("42\n", False), f"JavaScript: {o['js']}")
    eq(o["js_state"]["structuredContent"]["result"], "43", f"JavaScript's state: {o['js_state']}")
    eq((texts(o["r"]), o["r"]["isError"]), ("42 \n", False), f"R: {o['r']}")
    images = [b for b in o["r_plot"]["content"] if b["type"] == "image"]
    check(len(images) == 1 and base64.b64decode(images[0]["data"]).startswith(b"\x89PNG"),
          f"an R plot as image content: {[b['type'] for b in o['r_plot']['content']]}")
    eq(o["r_error"]["isError"], True, f"an R error: {o['r_error']}")
    check("nope" in texts(o["r_error"]), f"its message: {texts(o['r_error'])!r}")
    eq(o["mismatch"].get("code"), -32602, f"a run in another language: {o['mismatch']}")
    check("language_mismatch" in json.dumps(o["mismatch"]) or "runs r" in o["mismatch"]["error"],
          f"... said so: {o['mismatch']}")


def rpc(ctx, body, key=None, headers=None, sid=None, version="2025-06-18", method="POST"):
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if sid:
        h["Mcp-Session-Id"] = sid
    if version:
        h["MCP-Protocol-Version"] = version
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    return ctx.request(method, "/mcp", body=body, headers=h, key=key)


INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}}}


def test_refusals(ctx):
    key, other = ctx.key("u-mcp-raw"), ctx.key("u-mcp-other")
    r = rpc(ctx, INIT, version=None)
    eq(r.status, 401, "no key")
    eq(r.header("WWW-Authenticate"), "Bearer", "WWW-Authenticate")
    eq(rpc(ctx, INIT, key="cx_" + "A" * 43, version=None).status, 401, "a wrong key")
    r = rpc(ctx, INIT, key=key, version=None, headers={"Origin": "https://evil.example"})
    eq(r.status, 403, "a foreign Origin")
    check("error" in r.json(), "... answered as JSON-RPC")
    r = rpc(ctx, INIT, key=key, version=None)
    eq(r.status, 200, f"initialize: {r.body[:300]}")
    sid = r.header("Mcp-Session-Id")
    eq(r.json()["result"]["protocolVersion"], "2025-06-18", "the version asked for")
    r = rpc(ctx, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, key=other, sid=sid)
    eq(r.status, 404, "another key's Mcp-Session-Id")
    r = rpc(ctx, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, key=key)
    eq(r.status, 400, "no Mcp-Session-Id")
    r = rpc(ctx, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, key=key, sid=sid,
            version="2024-01-01")
    eq(r.status, 400, "an unsupported MCP-Protocol-Version")
    for body, code in (('{"jsonrpc": "2.0", "id": 1, "method": ', -32700),
                       ("[]", -32600), (json.dumps([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]), -32600),
                       ('{"jsonrpc": "1.0", "id": 1, "method": "ping"}', -32600),
                       ('{"jsonrpc": "2.0", "id": null, "method": "ping"}', -32600),
                       ('{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}', -32600),
                       ('{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}', -32600),
                       ('{"jsonrpc": "2.0", "id": 1}', -32600),
                       ('{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "ping"}', -32700),
                       ('"ping"', -32700), ("\x00", -32700)):
        r = rpc(ctx, body, key=key, sid=sid)
        eq(r.status, 400, f"malformed {body!r}: {r.body[:200]}")
        eq(r.json()["error"]["code"], code, f"its JSON-RPC code ({body!r})")
        check("id" not in r.json(), "no id in an answer to what could not be read")
    r = rpc(ctx, {"jsonrpc": "2.0", "id": "x" * 300, "method": "ping"}, key=key, sid=sid)
    eq(r.status, 400, "an id of 300 bytes")
    r = rpc(ctx, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "write_file", "arguments": {"path": "big", "content": "x" * (5 << 20)}}}),
            key=key, sid=sid)
    eq(r.status, 413, "a message over max_run_body_bytes")
    r = rpc(ctx, {"jsonrpc": "2.0", "id": 7, "method": "nope/nope"}, key=key, sid=sid)
    eq((r.status, r.json()["error"]["code"], r.json()["id"]), (200, -32601, 7), "an unknown method")
    r = rpc(ctx, {"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                  "params": {"name": "run_code", "arguments": {"code": "1", "evil": True}}},
            key=key, sid=sid)
    eq(r.json()["error"]["code"], -32602, "an argument the tool does not take")
    r = rpc(ctx, {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                  "params": {"name": "run_code", "arguments": {"code": 5}}}, key=key, sid=sid)
    eq(r.json()["error"]["data"]["code"], "invalid_request", "codexec's code in data")
    r = rpc(ctx, {"jsonrpc": "2.0", "method": "notifications/initialized"}, key=key, sid=sid)
    eq(r.status, 202, "a notification")
    r = rpc(ctx, {"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": 12345}}, key=key, sid=sid)
    eq(r.status, 202, "a cancel of no call")
    r = rpc(ctx, {"jsonrpc": "2.0", "id": 3, "result": {}}, key=key, sid=sid)
    eq(r.status, 202, "a response")
    r = rpc(ctx, INIT, key=key, sid=sid, version=None)
    eq(r.status, 400, "initialize with a session id")
    r = ctx.request("GET", "/mcp", key=key, headers={"Accept": "text/event-stream"})
    eq(r.status, 405, "GET: no stream of the server's own")
    r = ctx.request("PUT", "/mcp", key=key, body=b"{}", headers={"Content-Type": "application/json"})
    eq(r.status, 405, "PUT")
    r = rpc(ctx, INIT, key=key, version=None, headers={"Content-Type": "text/plain"})
    eq(r.status, 415, "not JSON")
    eq(ctx.request("DELETE", "/mcp", key=other, headers={"Mcp-Session-Id": sid}).status, 404,
       "another key can't end it")
    eq(ctx.request("DELETE", "/mcp", key=key, headers={"Mcp-Session-Id": sid}).status, 204,
       "DELETE")
    eq(rpc(ctx, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, key=key, sid=sid).status, 404,
       "an ended session")
    # the SDK's own client with another key's session
    o = sdk(ctx, "open", key)
    f = sdk(ctx, "foreign", other, extra=o["session_id"])
    check("error" in f["use"] and "404" in f["use"]["error"], f"the SDK with another key's session: {f}")


def test_on_behalf_users_apart(ctx):
    """Two end users of one service key: each MCP session is its user's."""
    svc = ctx.admin("key", "create", "--user", "svc-mcp", "--on-behalf").stdout.strip().split()[-1]
    a = {"On-Behalf-Of": "alice"}
    b = {"On-Behalf-Of": "bob"}
    r = rpc(ctx, INIT, key=svc, version=None, headers=a)
    eq(r.status, 200, "alice's initialize")
    sid = r.header("Mcp-Session-Id")
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "run_code", "arguments": {"code": "print('alice')"}}}
    r = rpc(ctx, call, key=svc, sid=sid, headers=a)
    eq(r.json()["result"]["content"][0]["text"], "alice\n", f"alice's run: {r.body[:300]}")
    eq(rpc(ctx, call, key=svc, sid=sid, headers=b).status, 404, "bob can't use alice's session")
    eq(rpc(ctx, call, key=svc, sid=sid).status, 404, "nor the service itself")
    eq(ctx.psql("SELECT user_id FROM runs WHERE conversation_id = 'mcp-" + sid + "'"),
       "svc-mcp:alice", "the run is alice's")


def test_browsers_by_origin(ctx):
    """mcp_allowed_origins: a listed Origin gets CORS (its preflight, the
    session id exposed); any other is refused before the key is looked at;
    the session keeps the version it agreed on."""
    import fcgi_client
    sock, proc = ctx.spawn_fcgi("mcp-origins", {"mcp_allowed_origins": "https://app.example.com"})
    try:
        key = ctx.key("u-mcp-origin")
        pre = {"HTTP_ORIGIN": "https://app.example.com",
               "HTTP_ACCESS_CONTROL_REQUEST_METHOD": "POST"}
        status, h, _ = fcgi_client.request(sock, "OPTIONS", "/mcp", b"", pre)
        eq(status, 204, "a listed Origin's preflight")
        eq(h.get("access-control-allow-origin"), "https://app.example.com", "allowed")
        check("Mcp-Session-Id" in h.get("access-control-allow-headers", ""), f"its headers: {h}")
        status, _, _ = fcgi_client.request(sock, "OPTIONS", "/mcp", b"",
                                           dict(pre, HTTP_ORIGIN="https://evil.example.com"))
        eq(status, 403, "another Origin's preflight")
        params = {"HTTP_ORIGIN": "https://app.example.com", "HTTP_AUTHORIZATION": f"Bearer {key}",
                  "CONTENT_TYPE": "application/json"}
        status, h, body = fcgi_client.request(sock, "POST", "/mcp", json.dumps(INIT).encode(), params)
        eq(status, 200, f"initialize from the listed Origin: {body[:200]}")
        eq(h.get("access-control-expose-headers"), "Mcp-Session-Id", "the session id readable")
        sid = h.get("mcp-session-id")
        ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
        status, _, body = fcgi_client.request(sock, "POST", "/mcp", ping, dict(
            params, HTTP_MCP_SESSION_ID=sid, HTTP_MCP_PROTOCOL_VERSION="2025-06-18"))
        eq((status, json.loads(body)["result"]), (200, {}), "ping at the agreed version")
        status, _, _ = fcgi_client.request(sock, "POST", "/mcp", ping, dict(
            params, HTTP_MCP_SESSION_ID=sid, HTTP_MCP_PROTOCOL_VERSION="2025-11-25"))
        eq(status, 400, "another version than the session agreed")
        status, _, _ = fcgi_client.request(sock, "POST", "/mcp", json.dumps(INIT).encode(),
                                           dict(params, HTTP_ORIGIN="https://evil.example.com",
                                                HTTP_AUTHORIZATION="Bearer nope"))
        eq(status, 403, "a foreign Origin is refused before the key is checked")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_call_the_run_lane_refuses_is_a_json_rpc_error(ctx):
    """An attacker's review: a run_code call refused by the run lane (the
    user's runs at max_concurrent_runs_per_user) was answered the API's
    way, a 429 with codexec's error object and no JSON-RPC id, which an
    MCP client takes for a broken transport. It is the call's JSON-RPC
    error now, answered 200 like the call's other problems, with
    Retry-After."""
    import threading
    import fcgi_client
    sock, proc = ctx.spawn_fcgi("mcp-lane", {"max_concurrent_runs_per_user": "1"}, workers=4)
    user = "u-mcp-lane"
    key = ctx.key(user)
    params = {"HTTP_AUTHORIZATION": f"Bearer {key}", "CONTENT_TYPE": "application/json"}
    held = {}

    def hold():
        held["answer"] = fcgi_client.request(sock, "POST", "/v1/runs", json.dumps(
            {"conversation_id": new_id(), "code": "import time; time.sleep(5)"}).encode(), params)

    t = threading.Thread(target=hold)
    try:
        status, h, body = fcgi_client.request(sock, "POST", "/mcp", json.dumps(INIT).encode(), params)
        eq(status, 200, f"initialize: {body[:200]}")
        mcp = dict(params, HTTP_MCP_SESSION_ID=h.get("mcp-session-id"),
                   HTTP_MCP_PROTOCOL_VERSION="2025-06-18")
        t.start()
        wait_until(lambda: ctx.psql(f"SELECT count(*) FROM runs WHERE user_id = '{user}'"
                                    " AND status = 'running'") == "1", 30,
                   "the user's one run slot held")
        call = {"jsonrpc": "2.0", "id": 41, "method": "tools/call",
                "params": {"name": "run_code", "arguments": {"code": "1"}}}
        status, h, body = fcgi_client.request(sock, "POST", "/mcp", json.dumps(call).encode(), mcp)
        eq(status, 200, f"the refused call's answer: {body[:300]}")
        answer = json.loads(body)
        eq((answer.get("jsonrpc"), answer.get("id")), ("2.0", 41), f"the call's JSON-RPC: {answer}")
        eq(answer["error"]["data"]["code"], "too_many_runs", f"codexec's code in data: {answer}")
        eq(answer["error"]["data"]["status"], 429, "its HTTP status in data")
        check(h.get("retry-after"), f"Retry-After: {h}")
    finally:
        if t.is_alive():
            t.join(timeout=30)
        proc.terminate()
        proc.wait(timeout=20)
    eq(held["answer"][0], 200, "the run that held the slot")
