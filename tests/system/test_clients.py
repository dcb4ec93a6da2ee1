"""The clients for agent developers (SPEC §10.8), against the real stack:
clients/python installed with pip into a venv without a network, and
clients/typescript generated from docs/openapi.yaml, type-checked, built and
run with Node. Each runs the same flow (tests/clients/flow.py, flow.mjs);
what it saw is held here to what the API answers."""

import atexit
import json
import os
import shutil
import subprocess
import tempfile

import stack
from harness import check, eq

CLIENTS = os.path.join(stack.REPO, "clients")
FLOWS = os.path.join(stack.REPO, "tests", "clients")
_venv = {}


def ctx_tmp():
    return "/var/tmp" if os.path.isdir("/var/tmp") else None


def venv_python():
    """A venv with clients/python installed by pip, with no index and no
    network: what `pip install ./clients/python` does on a user's host."""
    if "py" not in _venv:
        d = tempfile.mkdtemp(prefix="cx-client-venv-", dir=ctx_tmp())
        atexit.register(shutil.rmtree, d, True)
        subprocess.run(["/usr/bin/python3", "-m", "venv", d], check=True, capture_output=True)
        p = subprocess.run([os.path.join(d, "bin", "pip"), "install", "--no-index",
                            os.path.join(CLIENTS, "python")], capture_output=True, text=True,
                           env=dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1"))
        check(p.returncode == 0, f"pip install ./clients/python: {p.stdout[-1500:]}{p.stderr[-1500:]}")
        _venv["py"] = os.path.join(d, "bin", "python")
    return _venv["py"]


def svc_key(ctx):
    if "svc" not in _venv:
        _venv["svc"] = ctx.admin("key", "create", "--user", "svc-clients",
                                 "--on-behalf").stdout.strip().split()[-1]
    return _venv["svc"]


def slots(ctx):
    """The user's run slots in the stack's codexec-fcgi (lane.c)."""
    conf = dict(l.split(" = ", 1) for l in open(ctx.st.conf).read().splitlines() if " = " in l)
    n = int(conf.get("max_concurrent_runs_per_user", "0"))
    return str(n or max(1, int(conf.get("workers", "16")) // 4))


def run_flow(argv, what):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=FLOWS)
    check(p.returncode == 0 and p.stdout.strip(),
          f"{what} ran: rc={p.returncode} {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def check_flow(ctx, o, user, url):
    eq(o["run"]["stdout_tail"], "42\n", f"run: {o['run']}")
    eq(o["languages"], ["r", "42 \n", 42], f"R and JavaScript: {o['languages']}")
    eq((o["arguments"]["result"], o["arguments"]["result_present"]), ([None, True, False], True),
       "main(**arguments): null, true and false as data")
    _, died, after = o["reset"]
    eq((died["error_name"], died["session"]["reset"]), ("KernelDied", True),
       "the code killed its kernel: session.reset")
    eq(after["stdout_tail"], "False kept\n", f"a fresh kernel, the files kept: {after}")
    eq(o["ttl"]["expired"], 404, "a session past its TTL is gone")
    evs = [e for e, _ in o["stream"]]
    check(evs[0] == "run" and evs[-1] == "result" and "stdout" in evs, f"stream's events: {evs}")
    eq(o["stream"][-1][1]["stdout_tail"], "0\n1\n", "the stream's result")
    d = o["detached"]
    eq(d["accepted"]["status"], "running", f"wait false: {d}")
    eq((d["record"]["status"], d["record"]["stdout_tail"]), ("ok", "late\n"), "wait()")
    check(d["events"][0] == "run" and d["events"][-1] == "result", f"events(): {d['events']}")
    c = o["cancel"]
    eq((c["record"]["status"], c["record"]["error_name"]), ("error", "Cancelled"), f"cancel: {c}")
    eq(o["write"]["size"], 8, f"files.write: {o['write']}")
    eq(o["write_stream"]["size"] if "write_stream" in o else o["write_bytes"]["size"], 3 << 20,
       "a 3 MiB write")
    eq(o["read"], "a,b\n1,2\n", "files.read")
    eq(o["list"], ["big.bin", "data", "data/in.csv", "keep.txt"], "files.list")
    eq(o["code_sees"], "a,b\n1,2\n 3145728\n", "the code sees the files")
    eq(o["after_delete"], ["big.bin", "keep.txt"], "files.delete recursive")
    eq((o["missing"]["error"]["code"], o["missing"]["error"]["status"]), ("not_found", 404),
       "a missing file is the client's error, with code and status")
    eq(o["bad_cid"]["error"]["code"], "invalid_request", "a bad conversation id")
    check("chart.png" in o["artifacts"], f"artifacts.list: {o['artifacts']}")
    dl = o["downloads"]
    check(dl["png"] and dl["link_same"] and dl.get("to_file", True), f"downloads and links: {dl}")
    check(dl["link_url"].startswith(url + "/v1/artifacts/"), f"an absolute link: {dl['link_url']}")
    check(o["session_create"]["created"] and o["session_get"]["state"] in ("idle", "busy"),
          f"sessions: {o['session_create']} {o['session_get']}")
    check(any(s.endswith("-s") for s in o["sessions"]), f"sessions.list: {o['sessions']}")
    eq(o["session_gone"]["error"]["status"], 404, "a closed session")
    r = o["retry"]
    check(r.get("refused"), f"a run past the user's slots was refused: {r}")
    ra = r["refused"].get("retry_after", r["refused"].get("retryAfter"))
    eq((r["refused"]["code"], r["refused"]["status"], ra), ("too_many_runs", 429, 1),
       f"a refusal with Retry-After, not retried: {r}")
    eq(r["stdout"], "through\n", f"... and retried until it went through: {r}")
    eq(o["on_behalf"], "alice\n", "On-Behalf-Of")
    eq(o["alice_reads"], "a", "alice reads her file")
    eq(o["bob_cannot"]["error"]["status"], 404, "bob does not see alice's")
    check(int(ctx.psql("SELECT count(*) FROM runs WHERE user_id = 'svc-clients:alice'")) >= 1,
          "the run is alice's")


def test_python_client(ctx):
    url = f"http://127.0.0.1:{ctx.st.http_port}"
    o = run_flow([venv_python(), "flow.py", url, ctx.key("u-pyclient"), svc_key(ctx), slots(ctx)],
                 "the Python client")
    check("/site-packages/codexec/" in o["module"], f"the installed package: {o['module']}")
    check_flow(ctx, o, "u-pyclient", url)


def npm(args, what):
    p = subprocess.run(["npm", "--prefix", os.path.join(CLIENTS, "typescript")] + args,
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"{what}: {p.stdout[-2000:]}{p.stderr[-2000:]}")


def test_typescript_client(ctx):
    # the types are docs/openapi.yaml's, generated: the file in the tree is
    # what the generator makes of today's spec; then type-checked and built
    npm(["run", "check-generated"], "src/openapi.ts is generated from docs/openapi.yaml")
    npm(["run", "build"], "tsc type-checks and builds the client")
    url = f"http://127.0.0.1:{ctx.st.http_port}"
    o = run_flow(["node", "flow.mjs", url, ctx.key("u-tsclient"), svc_key(ctx), slots(ctx)],
                 "the TypeScript client")
    o.setdefault("downloads", {})["to_file"] = True
    check_flow(ctx, o, "u-tsclient", url)
