"""The Python client (clients/python, installed with pip into a venv)
against a live codexec: run by tests/system/test_clients.py with the venv's
python as `flow.py URL KEY SVC_KEY`. Prints one JSON object of what each
step saw; the test holds it to what it should be."""

import io
import json
import os
import sys
import tempfile
import time
import urllib.request

import codexec

url, key, svc, slots = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
out = {"module": codexec.__file__}
cx = codexec.Client(url, key)
cid = "py-client-" + os.urandom(4).hex()


def step(name, fn):
    try:
        out[name] = fn()
    except codexec.Error as e:
        out[name] = {"error": {"code": e.code, "status": e.status, "message": e.message,
                               "retry_after": e.retry_after}}


step("run", lambda: cx.run("x = 6 * 7\nprint(x)", cid))
# the other languages: a session opened in R, a JavaScript main() with arguments
step("languages", lambda: [cx.sessions.create(cid + "-lang-r", language="r")["language"],
                           cx.run('x <- 6 * 7\ncat(x, "\\n")', cid + "-lang-r", language="r")["stdout_tail"],
                           cx.run("const main = async (a) => a.n * 2;", cid + "-lang-js",
                                  language="javascript", arguments={"n": 21})["result"]])
# RAGFlow's shape: main(**arguments), the arguments as data
step("arguments", lambda: cx.run("def main(a, b, c):\n    return [a, b, c]", cid,
                                 arguments={"a": None, "b": True, "c": False}))
# DocsGPT's: a kernel the code killed comes back empty, the files stay
step("reset", lambda: [cx.files.write(cid, "keep.txt", b"kept"),
                       cx.run("import os\nos._exit(1)", cid),
                       cx.run("print('x' in dir(), open('keep.txt').read())", cid)])
step("stream", lambda: [[ev, data] for ev, data in
                         cx.stream("import time\nfor i in range(2):\n    print(i, flush=True)\n    time.sleep(0.3)", cid)])


def detached():
    a = cx.run("import time\ntime.sleep(1)\nprint('late')", cid, wait=False)
    rec = cx.wait(a["run_id"], timeout=60)
    events = [ev for ev, _ in cx.events(a["run_id"])]
    return {"accepted": a, "record": rec, "events": events}


step("detached", detached)


def cancel():
    a = cx.run("import time\ntime.sleep(30)", cid, wait=False)
    time.sleep(0.5)
    c = cx.cancel(a["run_id"])
    return {"cancel": c, "record": cx.wait(a["run_id"], timeout=30)}


step("cancel", cancel)
step("write", lambda: cx.files.write(cid, "data/in.csv", b"a,b\n1,2\n"))
step("write_stream", lambda: cx.files.write(cid, "big.bin", io.BytesIO(b"z" * (3 << 20))))
step("read", lambda: cx.files.read(cid, "data/in.csv").decode())
step("list", lambda: sorted(f["path"] for f in cx.files.list(cid, recursive=True)))
step("code_sees", lambda: cx.run("print(open('/mnt/data/data/in.csv').read(), len(open('big.bin','rb').read()))", cid)["stdout_tail"])
step("delete", lambda: cx.files.delete(cid, "data", recursive=True))
step("after_delete", lambda: sorted(f["path"] for f in cx.files.list(cid, recursive=True)))
step("missing", lambda: cx.files.read(cid, "nope.txt"))
step("bad_cid", lambda: cx.run("1", "no spaces allowed"))
step("chart", lambda: cx.run("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                             "plt.plot([1, 2])\nplt.savefig('chart.png')", cid))
step("artifacts", lambda: [a["path"] for a in cx.artifacts.list(cid)])


def downloads():
    art = [a for a in cx.artifacts.list(cid) if a["path"] == "chart.png"][0]
    data = cx.artifacts.download(art["artifact_id"])
    path = os.path.join(tempfile.mkdtemp(), "chart.png")
    n = cx.artifacts.download(art["artifact_id"], version=1, to=path)
    link = cx.artifacts.link(art["artifact_id"], expires_in=60)
    with urllib.request.urlopen(link["url"]) as r:  # a browser: no key
        linked = r.read()
    return {"png": data[:4] == b"\x89PNG", "to_file": n == len(data) == os.path.getsize(path),
            "link_url": link["url"], "link_same": linked == data}


step("downloads", downloads)
step("session_create", lambda: cx.sessions.create(cid + "-s", ttl=120))
step("session_get", lambda: cx.sessions.get(cid + "-s"))
step("sessions", lambda: [s["conversation_id"] for s in cx.sessions.list()])
step("session_close", lambda: cx.sessions.close(cid + "-s"))
step("session_gone", lambda: cx.sessions.get(cid + "-s"))


def ttl():
    cx.sessions.create(cid + "-t", ttl=1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            cx.sessions.get(cid + "-t")
        except codexec.Error as e:
            return {"expired": e.status}
        time.sleep(0.5)
    return {"expired": None}


step("ttl", ttl)


def retried():
    # the user's run slots (max_concurrent_runs_per_user) taken by detached
    # runs of one conversation (one runs, the others wait for it): a run is
    # refused 429 with Retry-After: 1, and the client waits and tries again
    busy = [cx.run("import time\ntime.sleep(30)", f"{cid}-busy", wait=False) for i in range(slots)]
    refused = None
    try:
        codexec.Client(url, key, retries=0).run("1", cid + "-r0")
    except codexec.Error as e:
        refused = {"code": e.code, "status": e.status, "retry_after": e.retry_after}
    # the slots freed: every busy run cancelled
    t0 = time.monotonic()
    for b in busy:
        try:
            cx.cancel(b["run_id"])
        except codexec.Error:
            pass  # (one that gave up waiting has ended already)
    r = codexec.Client(url, key, retries=15).run("print('through')", cid + "-r")
    for b in busy:
        cx.wait(b["run_id"], timeout=60)
    return {"refused": refused, "stdout": r["stdout_tail"], "waited": time.monotonic() - t0}


step("retry", retried)
alice = codexec.Client(url, svc, on_behalf_of="alice")
step("on_behalf", lambda: alice.run("open('secret.txt', 'w').write('a'); print('alice')", "shared")["stdout_tail"])
step("alice_reads", lambda: alice.files.read("shared", "secret.txt").decode())
step("bob_cannot", lambda: codexec.Client(url, svc, on_behalf_of="bob").files.read("shared", "secret.txt"))
print(json.dumps(out))
