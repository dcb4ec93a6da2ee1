"""RAGFlow as the caller (SPEC §10.7): its own, unchanged SelfManagedProvider
(tests/peers/ragflow) pointed at codexec-ragflow.conf's listener, which adds
the key RAGFlow does not send; and codexec's native provider
(integrations/ragflow/codexec_provider.py) over the same RAGFlow interface."""

import base64
import filecmp
import json
import os
import sys

import stack
from harness import check, eq, wait_until

PEERS = os.path.join(stack.REPO, "tests", "peers")
sys.path.insert(0, os.path.join(PEERS, "ragflow"))
sys.path.insert(0, os.path.join(stack.REPO, "integrations", "ragflow"))

from agent.sandbox.providers.base import SandboxProvider  # noqa: E402
from agent.sandbox.providers.self_managed import SelfManagedProvider  # noqa: E402
from codexec_provider import CodexecProvider  # noqa: E402

_ready = {}

ARGS = r'''
def main(a, b, c, n, s, nested):
    print("called")
    return {"a": a, "b": b, "c": c, "n": n, "s": s, "nested": nested}
'''

ARTIFACTS = r'''
import os
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

def main():
    os.makedirs("artifacts/sub", exist_ok=True)
    plt.plot([1, 2, 3])
    plt.savefig("artifacts/plot.png")
    open("artifacts/data.csv", "w").write("a,b\n1,2\n")
    open("artifacts/notes.txt", "w").write("not a type RAGFlow takes")
    open("artifacts/empty.json", "w").close()
    open("artifacts/big.json", "w").write("[" + "0," * (6 << 20) + "0]")
    open("artifacts/sub/deep.png", "wb").write(b"\x89PNG")
    open("outside.csv", "w").write("x\n")
    return "done"
'''


# Code that takes over codexec's file helper in its own kernel (it may: the
# kernel is the tenant's) and lists a file outside artifacts/.
HIJACK = r'''
import sys
from IPython.display import display

class Same:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False

def _lie(ip):
    mime = "application/vnd.codexec.file+json"
    display({mime: {"op": "page", "files": [
        {"path": "x.png", "type": "file", "size": 1, "mtime": "2026-01-01T00:00:00Z"},
        {"path": "artifacts/a/b.png", "type": "file", "size": 1, "mtime": "2026-01-01T00:00:00Z"}]}},
        raw=True)
    display({mime: {"ok": True}}, raw=True)

def main():
    sys._codexec_files_v = Same()
    sys._codexec_files = _lie
    return "planted"
'''


def listener(ctx):
    if "port" not in _ready:
        ctx.st.set_ragflow_key(ctx.key("ragflow"))  # (it waits until the listener answers)
        _ready["port"] = ctx.st.ragflow_port
    return f"http://127.0.0.1:{_ready['port']}"


def self_managed(ctx, endpoint=None):
    p = SelfManagedProvider()
    check(p.initialize({"endpoint": endpoint or listener(ctx), "timeout": 120}),
          "RAGFlow's SelfManagedProvider initializes (its health check passes)")
    return p


def test_vendored_peers_are_the_shared_ones(ctx):
    shared = os.path.normpath(os.path.join(stack.REPO, "..", "shared", "peers"))
    if not os.path.isdir(shared):
        print("# ../shared/peers is not beside this checkout: nothing to compare")
        return
    for root, _, files in os.walk(shared):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), shared)
            check(filecmp.cmp(os.path.join(shared, rel), os.path.join(PEERS, rel), shallow=False),
                  f"tests/peers/{rel} is the shared peers' file, unchanged")


def test_health_and_the_key(ctx):
    p = self_managed(ctx)
    check(p.health_check(), "healthz through the listener")
    check(self_managed(ctx, listener(ctx) + "/compat/ragflow").health_check(),
          "... with the endpoint given as the compat path")
    r = ctx.get("/compat/ragflow/healthz")
    eq(r.status, 401, "without the listener's key: 401")
    r = ctx.get("/compat/ragflow/healthz", key=ctx.key("ragflow"))
    eq((r.status, r.json()), (200, {"status": "ok"}), "with a key")
    port = _ready["port"]
    for method, path in (("GET", "/v1/health"), ("GET", "/v1/artifacts?conversation_id=x"),
                         ("POST", "/mcp"), ("GET", "/metrics"),
                         # normalised by nginx to a route it passes, routed by codexec as sent
                         ("DELETE", "/v1/artifacts/..%2F..%2Fcompat%2Fragflow%2Fhealthz"),
                         ("GET", "/v1/runs/..%2F..%2Fcompat/ragflow/healthz"),
                         ("GET", "/compat/ragflow/healthz/../../../v1/health")):
        r = ctx.request(method, path, port=port)
        eq(r.status, 404, f"the listener passes only RAGFlow's routes, not {method} {path}")
    eq(ctx.request("GET", "/compat/ragflow/run", port=port).status, 403, "run takes POST only")
    big = {"code_b64": base64.b64encode(b"#" * (5 << 20)).decode()}
    eq(ctx.post("/compat/ragflow/run", big, port=port).status, 413, "a body over 4 MiB: 413")
    code = base64.b64encode(b"def main():\n    return 1").decode()
    r = ctx.post("/compat/ragflow/run", {"code_b64": code}, port=port,
                 headers={"On-Behalf-Of": "someone", "Authorization": "Bearer cx_forged"})
    eq((r.status, r.json()["status"]), (200, "success"),
       "a caller's own Authorization and On-Behalf-Of never reach codexec through the listener")


def run(p, code, language="python", arguments=None, timeout=120):
    inst = p.create_instance(language)
    try:
        return p.execute_code(inst.instance_id, code, language, timeout=timeout, arguments=arguments)
    finally:
        p.destroy_instance(inst.instance_id)


def check_results(p, what, run_timeout=120):
    """The flows, with RAGFlow's interface; run_timeout: what execute_code
    is given for the run that times out (the self-managed protocol has
    none: the server's ragflow_timeout applies)."""
    args = {"a": None, "b": True, "c": False, "n": 1.5, "s": "it's \"quoted\"\n", "nested": [None, {}]}
    r = run(p, ARGS, arguments=args)
    eq((r.exit_code, r.metadata["status"]), (0, "success"), f"{what}: main() ran: {r}")
    eq(r.stdout, "called\n", f"{what}: its stdout")
    eq((r.metadata["result_present"], r.metadata["result_value"], r.metadata["result_type"]),
       (True, args, "json"), f"{what}: null, true, false and strings arrive as data")
    r = run(p, "def main():\n    return None")
    eq((r.metadata["result_present"], r.metadata["result_value"]), (True, None),
       f"{what}: main() returned None is a result")
    r = run(p, "def main():\n    print('before')\n    return 1 / 0")
    eq((r.exit_code, r.metadata["status"], r.stdout), (1, "program_error", ""), f"{what}: an error: {r}")
    check("ZeroDivisionError" in r.stderr, f"{what}: its traceback in stderr: {r.stderr!r}")
    eq(run(p, "x = 1").metadata["status"], "program_error", f"{what}: no main()")
    r = run(p, "import time\ndef main():\n    time.sleep(60)", timeout=run_timeout)
    eq((r.exit_code, r.metadata["status"]), (-124, "resource_limit_exceeded"), f"{what}: a timeout: {r}")
    r = run(p, "def main():\n    x = bytearray(3 << 30)\n    x[::4096] = b'x' * len(x[::4096])\n    return len(x)")
    eq((r.exit_code, r.metadata["status"]), (-137, "resource_limit_exceeded"), f"{what}: memory: {r}")
    r = run(p, ARTIFACTS)
    arts = {a["name"]: a for a in r.metadata["artifacts"]}
    eq(sorted(arts), ["data.csv", "plot.png"], f"{what}: artifacts/ within RAGFlow's rules")
    eq(base64.b64decode(arts["data.csv"]["content_b64"]), b"a,b\n1,2\n", f"{what}: the csv")
    eq(arts["data.csv"]["mime_type"], "text/csv", f"{what}: its type")
    png = base64.b64decode(arts["plot.png"]["content_b64"])
    check(png[:4] == b"\x89PNG" and arts["plot.png"]["size"] == len(png), f"{what}: the png")


def test_self_managed_provider(ctx):
    p = self_managed(ctx)
    check_results(p, "SelfManagedProvider")
    check_nodejs(p, "SelfManagedProvider")


# RAGFlow's Node.js shape: an async main exported, Node's require().
NODE_MAIN = ("const path = require('path');\n"
             "async function main(args) {\n"
             "  console.log('hi from node');\n"
             "  return { joined: path.join(args.a, 'b'), n: args.n + 1, f: args.f };\n}\n"
             "module.exports = { main };\n")


def check_nodejs(p, what):
    r = run(p, NODE_MAIN, language="nodejs", arguments={"a": "x", "n": 41, "f": None})
    eq((r.metadata["status"], r.exit_code), ("success", 0), f"{what}: nodejs {r}")
    eq(r.metadata["result_value"], {"joined": "x/b", "n": 42, "f": None}, f"{what}: main's value")
    check("hi from node" in r.stdout, f"{what}: its output {r.stdout!r}")
    r = run(p, "async function main() { throw new RangeError('nope'); }", language="nodejs")
    eq(r.metadata["status"], "program_error", f"{what}: a JavaScript error {r}")
    check("nope" in r.stderr, f"{what}: its message in stderr {r.stderr!r}")


def test_a_lying_kernel(ctx):
    """What the kernel lists is the tenant's: a path outside artifacts/ or
    below it is left out, and codexec-fcgi goes on."""
    p = self_managed(ctx)
    r = run(p, HIJACK)
    eq((r.metadata["status"], r.metadata["result_value"], r.metadata["artifacts"]),
       ("success", "planted", []), f"nothing of the lie returned: {r}")
    check(p.health_check(), "codexec-fcgi still answers")


def test_compat_refusals(ctx):
    key = ctx.key("ragflow")
    for body, why in (({}, "no code"), ({"code_b64": "!!"}, "not base64"),
                      ({"code_b64": base64.b64encode(b"\xff\xfe").decode()}, "not UTF-8"),
                      ({"code_b64": base64.b64encode(b"x = 1\x00").decode()}, "a NUL"),
                      ({"code_b64": "eA==", "arguments": [1]}, "arguments not an object"),
                      ({"code_b64": "eA==", "language": "cobol"}, "an unknown language")):
        r = ctx.post("/compat/ragflow/run", body, key=key)
        eq(r.status, 400, f"{why}: {r.body[:200]}")
    eq(ctx.post("/compat/ragflow/run", {"code_b64": "eA=="}).status, 401, "no key")
    # each call's conversation is closed after it
    # (a kernel the gateway could not delete at once, after a memory bomb
    # killed it, is the reaper's within a sweep or two)
    wait_until(lambda: ctx.psql("SELECT count(*) FROM sessions WHERE user_id = 'ragflow'"
                                " AND conversation_id LIKE 'ragflow-run-%'") == "0", 60,
               "no conversation of RAGFlow's calls left open")


def native(ctx, **config):
    p = CodexecProvider()
    ok, err = p.validate_config(dict({"endpoint": f"http://127.0.0.1:{ctx.st.http_port}",
                                      "api_key": ctx.key("u-ragflow-native")}, **config))
    check(ok, f"validate_config: {err}")
    check(p.initialize(dict({"endpoint": f"http://127.0.0.1:{ctx.st.http_port}",
                             "api_key": ctx.key("u-ragflow-native"), "timeout": 10}, **config)),
          "CodexecProvider initializes")
    return p


def test_native_provider(ctx):
    p = native(ctx)
    check(isinstance(p, SandboxProvider), "a RAGFlow SandboxProvider")
    schema = CodexecProvider.get_config_schema()
    check(schema["api_key"].get("secret") and schema["endpoint"]["required"], f"its schema: {schema}")
    for bad in ({"endpoint": "ftp://x", "api_key": "cx_" + "a" * 43}, {"endpoint": "http://h", "api_key": ""},
                {"endpoint": "http://h", "api_key": "cx_" + "a" * 43, "timeout": 0}):
        check(not p.validate_config(bad)[0], f"validate_config refuses {bad}")
    check(not CodexecProvider().initialize({"endpoint": f"http://127.0.0.1:{ctx.st.http_port}",
                                            "api_key": "cx_" + "A" * 43}), "a wrong key: not initialized")
    check_results(p, "CodexecProvider", run_timeout=5)
    # stateful per instance: the same conversation across its calls
    inst = p.create_instance("python")
    try:
        eq(inst.metadata["conversation_id"], f"ragflow-{inst.instance_id}", "the instance's conversation")
        p.execute_code(inst.instance_id, "def main():\n    global kept\n    kept = 41\n    return kept", "python")
        r = p.execute_code(inst.instance_id, "def main():\n    return kept + 1", "python", arguments={})
        eq(r.metadata["result_value"], 42, "state kept between an instance's calls")
    finally:
        check(p.destroy_instance(inst.instance_id), "destroyed")
    r = ctx.get(f"/v1/conversations/ragflow-{inst.instance_id}/session", key=ctx.key("u-ragflow-native"))
    eq(r.status, 404, "its session closed")
    eq(p.get_supported_languages(), ["python", "nodejs", "javascript", "r"],
       "its languages: what the server's health says it runs")
    check_nodejs(p, "CodexecProvider")
    json.dumps(schema)  # the admin API serves it as JSON
