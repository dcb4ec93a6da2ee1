"""DocsGPT as the caller (SPEC §10.8): its own, unchanged SandboxManager
(tests/peers/docsgpt) over codexec's backend, CodexecSandbox
(integrations/docsgpt/codexec_sandbox.py), against the real stack."""

import os
import sys
import time

import stack
from harness import check, eq, wait_until

sys.path.insert(0, os.path.join(stack.REPO, "tests", "peers", "docsgpt"))
sys.path.insert(0, os.path.join(stack.REPO, "integrations", "docsgpt"))

from application.sandbox.base import CodeSandbox, SandboxGoneError  # noqa: E402
from application.sandbox.manager import SandboxManager  # noqa: E402
from codexec_sandbox import CodexecSandbox  # noqa: E402

_keys = {}


def svc(ctx):
    if "svc" not in _keys:
        _keys["svc"] = ctx.admin("key", "create", "--user", "docsgpt",
                                 "--on-behalf").stdout.strip().split()[-1]
    return _keys["svc"]


def backend(ctx, on_behalf_of=None, **kw):
    return CodexecSandbox(f"http://127.0.0.1:{ctx.st.http_port}", svc(ctx), on_behalf_of, **kw)


def test_the_manager_over_codexec(ctx):
    b = backend(ctx, "user-1")
    check(isinstance(b, CodeSandbox), "a DocsGPT CodeSandbox")
    m = SandboxManager(b, max_ttl=600, max_sessions=4)
    sid = "conv-" + os.urandom(4).hex()
    m.open(sid)
    r = m.exec(sid, "import json\nx = 41\nprint(json.dumps({'a': [1, 2]}))")
    eq((r.status, r.exit_code, r.stdout), ("ok", 0, '{"a": [1, 2]}\n'), f"exec: {r}")
    check(not r.runtime_invalidated, "a first run on an opened session keeps it")
    r = m.exec(sid, "x += 1\nx")
    eq(r.results[0].data["text/plain"], "42", f"state kept, the value in results: {r}")
    r = m.exec(sid, "print('a' * 20000)\nimport sys\nprint('e', file=sys.stderr)")
    eq((len(r.stdout), r.stderr), (20001, "e\n"), "the whole stdout and stderr")
    r = m.exec(sid, "1 / 0")
    eq((r.status, r.exit_code, r.error_name, r.error_value), ("error", 1, "ZeroDivisionError",
                                                              "division by zero"), f"an error: {r}")
    check(any("ZeroDivisionError" in line for line in r.traceback), f"its traceback: {r.traceback}")
    r = m.exec(sid, "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n"
                    "from IPython.display import HTML, display\ndisplay(HTML('<b>hi</b>'))")
    eq([p.format for p in r.plots], ["png"], f"a figure as a plot: {r}")
    check(r.plots[0].content_base64.startswith("iVBOR"), "base64 of a PNG")
    check(any(d.data.get("text/html") == "<b>hi</b>" for d in r.display_data), f"display_data: {r}")
    r = m.exec(sid, "import time\ntime.sleep(30)", timeout=2)
    check(r.status == "error" and "timeout" in (r.error_name + r.error_value).lower(),
          f"a timeout DocsGPT recognises: {r}")
    # files
    m.put_file(sid, "inputs/data.csv", b"a,b\n1,2\n")
    m.put_file(sid, "state.json", b"{}")
    eq(m.get_file(sid, "inputs/data.csv"), b"a,b\n1,2\n", "put then get")
    r = m.exec(sid, "import pandas as pd\nprint(int(pd.read_csv('inputs/data.csv').b.sum()))\n"
                    "import os\nos.makedirs('artifacts/tok', exist_ok=True)\n"
                    "open('artifacts/tok/out.txt', 'w').write('out')")
    eq(r.stdout, "2\n", "the code reads what was put")
    files = m.list_files(sid)
    check({"inputs/data.csv", "state.json", "artifacts/tok/out.txt"} <= set(files),
          f"list_files: {files}")
    m.remove_path(sid, "artifacts/tok")
    check("artifacts/tok/out.txt" not in m.list_files(sid), "remove_path took the tree")
    try:
        m.get_file(sid, "missing.txt")
        check(False, "a missing file raises")
    except IOError as e:
        check(not isinstance(e, SandboxGoneError), f"a missing file is not a gone session: {e!r}")
    # a reset: the code kills its kernel; the manager drops its handle
    r = m.exec(sid, "import os\nos._exit(1)")
    check(r.runtime_invalidated and not m.has_session(sid),
          f"runtime_invalidated: the manager dropped the session: {r}")
    m.open(sid)
    r = m.exec(sid, "print('x' in dir())")
    eq(r.stdout, "False\n", "a cold kernel after the reset")
    check(m.get_file(sid, "inputs/data.csv") == b"a,b\n1,2\n", "the files outlived the kernel")
    m.close(sid)
    r = ctx.get(f"/v1/conversations/{sid}/session", key=svc(ctx), headers={"On-Behalf-Of": "user-1"})
    eq(r.status, 404, "close ended codexec's session")
    try:
        b.list_files(sid)
        check(False, "a file operation on a closed session raises")
    except SandboxGoneError:
        pass


def test_ttl_expiry_and_users_apart(ctx):
    users = {"s-alice": "alice", "s-bob": "bob"}
    b = backend(ctx, lambda sid: users[sid.split(":")[0]] if ":" in sid else users.get(sid))
    m = SandboxManager(b, max_ttl=1)
    m.open("s-alice")
    m.put_file("s-alice", "secret.txt", b"alice's")
    m.open("s-bob")
    check("secret.txt" not in m.list_files("s-bob"), "bob's workspace is his own")
    eq(ctx.psql("SELECT count(*) FROM sessions WHERE user_id = 'docsgpt:alice'"), "1",
       "alice's session is hers")
    r = ctx.get("/v1/conversations/s-alice/files/secret.txt", key=svc(ctx),
                headers={"On-Behalf-Of": "bob"})
    eq(r.status, 404, "bob can't read alice's file by its name")
    time.sleep(1.5)
    reaped = m.reap_expired()
    eq(sorted(reaped), ["s-alice", "s-bob"], "the manager's TTL expired both")
    wait_until(lambda: ctx.psql("SELECT count(*) FROM sessions WHERE user_id IN "
                                "('docsgpt:alice', 'docsgpt:bob')") == "0", 30,
               "... and closed them in codexec, each as its own user")
