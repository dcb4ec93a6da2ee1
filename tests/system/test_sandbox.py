"""The sandboxed kernelspec: what a kernel can and cannot reach.

These talk to kernels the way the Jupyter server does (jupyter_client over
the ipc sockets), so they hold before codexec's own gateway client exists."""

import json
import os
import urllib.request

from harness import check, eq, wait_until


def gateway(ctx, method, path, body=None):
    st = ctx.st
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(st.gateway_url + path, data=data, method=method,
                                 headers={"Authorization": f"token {st.gateway_token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read()
        return json.loads(text) if text else None


def start_kernel(ctx, name):
    ws = os.path.join(ctx.st.workspaces, name)
    os.makedirs(ws, exist_ok=True)
    ctx.st.chown_kernel(ws)
    k = gateway(ctx, "POST", "/api/kernels", {"name": "python3-sandbox", "path": name})
    return k["id"], ws


def client(ctx, kernel_id):
    from jupyter_client import BlockingKernelClient
    cf = os.path.join(ctx.st.jdir, "runtime", f"kernel-{kernel_id}.json")
    wait_until(lambda: os.path.exists(cf), 30, "connection file")
    kc = BlockingKernelClient(connection_file=cf)
    kc.load_connection_file()
    kc.start_channels(hb=False)  # heartbeats add timing flakiness, not coverage
    kc.wait_for_ready(timeout=60)
    return kc


def run(kc, code):
    out = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("ERROR " + msg["content"]["ename"] + ": " + msg["content"]["evalue"])

    kc.execute_interactive(code, timeout=60, output_hook=hook)
    return "".join(out)


PROBE = r'''
import os, socket, json, glob
r = {}
r["uid"] = os.getuid()
r["pid"] = os.getpid()
r["cwd"] = os.getcwd()
r["jpy_parent"] = "JPY_PARENT_PID" in os.environ
r["root"] = sorted(os.listdir("/"))
def tryit(fn):
    try:
        return "ok:" + str(fn())[:200]
    except Exception as e:
        return "denied:" + type(e).__name__
r["other_ws"] = tryit(lambda: os.listdir(OTHER_WS))
r["other_file"] = tryit(lambda: open(os.path.join(OTHER_WS, "secret.txt")).read())
r["runtime"] = tryit(lambda: sorted(os.listdir(RUNTIME)))
r["other_conn"] = tryit(lambda: open(os.path.join(RUNTIME, "kernel-" + OTHER_ID + ".json")).read())
def connect_other():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    s.connect(os.path.join(RUNTIME, "kernel-" + OTHER_ID + "-ipc-1"))
    return "connected"
r["other_socket"] = tryit(connect_other)
def net():
    s = socket.create_connection(("127.0.0.1", GATEWAY_PORT), timeout=2)
    return "connected"
r["network"] = tryit(net)
r["write_usr"] = tryit(lambda: open("/usr/pwned", "w"))
r["write_etc"] = tryit(lambda: open("/etc/pwned", "w"))
r["procs"] = len([p for p in os.listdir("/proc") if p.isdigit()])
open("mine.txt", "w").write("kernel wrote this")
print(json.dumps(r))
'''


def test_kernels_cannot_reach_each_other(ctx):
    st = ctx.st
    a_id, a_ws = start_kernel(ctx, "iso-a")
    b_id, b_ws = start_kernel(ctx, "iso-b")
    with open(os.path.join(b_ws, "secret.txt"), "w") as f:
        f.write("b's secret")
    ka = client(ctx, a_id)
    kb = client(ctx, b_id)
    try:
        runtime = os.path.join(st.jdir, "runtime")
        code = (f"OTHER_WS = {b_ws!r}\nRUNTIME = {runtime!r}\nOTHER_ID = {b_id!r}\n"
                f"GATEWAY_PORT = {st.gateway_port}\n" + PROBE)
        out = run(ka, code)
        r = json.loads(out.strip().splitlines()[-1])
        eq(r["uid"], 65534, "uid inside")
        check(r["pid"] < 10, f"own pid namespace (pid {r['pid']})")
        check(r["procs"] < 10, f"sees only its own processes ({r['procs']})")
        eq(r["cwd"], "/workspace", "starts in its workspace")
        eq(r["jpy_parent"], False, "JPY_PARENT_PID removed")
        check("workspace" in r["root"] and "root" not in r["root"] and "home" not in r["root"],
              f"minimal root {r['root']}")
        check(r["other_ws"].startswith("denied"), f"other workspace listed: {r['other_ws']}")
        check(r["other_file"].startswith("denied"), f"other file read: {r['other_file']}")
        check(r["other_conn"].startswith("denied"), f"other connection file: {r['other_conn']}")
        check(r["other_socket"].startswith("denied"), f"other socket: {r['other_socket']}")
        check(r["runtime"].startswith("ok:"), "own runtime dir visible")
        check(b_id not in r["runtime"], f"no trace of the other kernel: {r['runtime']}")
        check(a_id in r["runtime"], "own sockets visible")
        check(r["network"].startswith("denied"), f"network reachable: {r['network']}")
        check(r["write_usr"].startswith("denied"), "read-only /usr")
        check(r["write_etc"].startswith("denied"), "read-only /etc")
        # The workspace is a sized tmpfs of the kernel's own: nothing it
        # writes reaches the host's disk.
        eq(os.listdir(a_ws), [], "nothing the kernel wrote is on the host's disk")
        eq(run(ka, "print(open('mine.txt').read())").strip(), "kernel wrote this",
           "the kernel keeps what it wrote")
        # And the other way round, B cannot see A.
        code_b = (f"OTHER_WS = {a_ws!r}\nRUNTIME = {runtime!r}\nOTHER_ID = {a_id!r}\n"
                  f"GATEWAY_PORT = {st.gateway_port}\n" + PROBE)
        rb = json.loads(run(kb, code_b).strip().splitlines()[-1])
        check(rb["other_file"].startswith("denied") and rb["other_socket"].startswith("denied"),
              f"B cannot reach A: {rb}")
    finally:
        ka.stop_channels()
        kb.stop_channels()
        gateway(ctx, "DELETE", f"/api/kernels/{a_id}")
        gateway(ctx, "DELETE", f"/api/kernels/{b_id}")


def test_rlimits_apply(ctx):
    k_id, _ = start_kernel(ctx, "limits")
    kc = client(ctx, k_id)
    try:
        out = run(kc, "import resource\n"
                      "print(resource.getrlimit(resource.RLIMIT_AS)[0],"
                      " resource.getrlimit(resource.RLIMIT_NPROC)[0],"
                      " resource.getrlimit(resource.RLIMIT_FSIZE)[0])")
        a, n, f = (int(x) for x in out.split())
        check(0 < a <= 8 << 30, f"address space limited ({a})")
        check(0 < n <= 4096, f"processes limited ({n})")
        check(0 < f <= 4 << 30, f"file size limited ({f})")
        out = run(kc, "try:\n    b = bytearray(16 << 30)\n    print('allocated')\n"
                      "except MemoryError:\n    print('MemoryError')")
        eq(out.strip(), "MemoryError", "a 16 GiB allocation fails")
    finally:
        kc.stop_channels()
        gateway(ctx, "DELETE", f"/api/kernels/{k_id}")
