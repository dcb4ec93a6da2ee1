"""The kernel image (packaging/kernel-image.list): the data stack agents
expect works inside the sandbox, under its limits, out of the box."""

import json
import os
import shutil
import subprocess

from harness import check, eq, metric, wait_until
from test_pool import pool_rows, set_pool
from test_runs import run
from test_sandbox import client, gateway, run as kernel_run

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"

WORKFLOW = r'''
import pandas as pd
import matplotlib.pyplot as plt
from openpyxl import Workbook
from docx import Document
from reportlab.pdfgen import canvas
from lxml import etree

df = pd.read_csv("inputs/sales.csv")
total = df.groupby("region")["amount"].sum().sort_index()
print(total.to_dict())

fig, ax = plt.subplots()
total.plot.bar(ax=ax)
fig.savefig("chart.png")
plt.show()

wb = Workbook()
ws = wb.active
ws.append(["region", "amount"])
for region, amount in total.items():
    ws.append([region, int(amount)])
wb.save("summary.xlsx")

doc = Document()
doc.add_heading("Sales", 0)
doc.add_paragraph(f"{len(df)} rows")
doc.save("report.docx")

c = canvas.Canvas("report.pdf")
c.drawString(72, 720, "Sales report")
c.save()
print(etree.tostring(etree.fromstring("<a><b/></a>")).decode())
'''


def download(ctx, user, a):
    r = ctx.get(a["download_url"], key=ctx.key(user))
    eq(r.status, 200, f"download of {a['path']}")
    return r.body


def test_the_data_workflow_end_to_end(ctx):
    user = "img-data"
    up = ctx.post("/v1/artifacts?conversation_id=c1&filename=sales.csv",
                  b"region,amount\nnorth,10\nsouth,5\nnorth,7\n", key=ctx.key(user),
                  headers={"Content-Type": "application/octet-stream"})
    eq(up.status, 201, f"upload {up!r}")
    r = run(ctx, user, "c1", WORKFLOW, inputs=[up.json()["artifact_id"]], timeout=120)
    eq(r["status"], "ok", f"the workflow ran: {r.get('error')} {r.get('stderr_tail')}")
    eq(r["stdout_tail"], "{'north': 17, 'south': 5}\n<a><b/></a>\n", "pandas read the uploaded CSV; lxml parses")
    arts = {a["path"]: a for a in r["artifacts"]}
    eq(sorted(arts), ["chart.png", "output-1.png", "report.docx", "report.pdf", "summary.xlsx"],
       "every file and the inline figure became an artifact")
    want = {"chart.png": "image/png", "output-1.png": "image/png", "summary.xlsx": XLSX,
            "report.docx": DOCX, "report.pdf": "application/pdf"}
    eq({p: a["mime_type"] for p, a in arts.items()}, want, "libmagic's MIME types")
    for p in ("chart.png", "output-1.png"):
        check(download(ctx, user, arts[p])[:8] == b"\x89PNG\r\n\x1a\n", f"{p} is a PNG")
    check(download(ctx, user, arts["report.pdf"])[:5] == b"%PDF-", "the PDF is a PDF")
    check(download(ctx, user, arts["summary.xlsx"])[:2] == b"PK", "the xlsx is a zip")
    # and the kernel state carries on: the next run uses the frame
    r = run(ctx, user, "c1", "print(int(df.amount.sum()))")
    eq(r["stdout_tail"], "22\n", "the DataFrame lives on in the session")


PROBE = r'''
import json, os, resource, time, warnings
t0 = time.monotonic()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import numpy, pandas, matplotlib, matplotlib.pyplot, scipy, scipy.linalg, sklearn
    import matplotlib.font_manager as fm
    a = numpy.random.default_rng(1).random((300, 300))
    scipy.linalg.inv(a)
cache = matplotlib.get_cachedir()
lists = sorted(f for f in os.listdir(cache) if f.startswith("fontlist"))
def writable(p):
    try:
        open(p, "a").close()
        return True
    except OSError:
        return False
print(json.dumps({
    "as": resource.getrlimit(resource.RLIMIT_AS)[0],
    "cache": cache, "lists": lists,
    "list_writable": [writable(os.path.join(cache, f)) for f in lists],
    "font_warnings": [str(w.message)[:200] for w in caught if "font" in str(w.message).lower()],
    "fonts": len(fm.fontManager.ttflist),
    "threads": os.environ.get("OPENBLAS_NUM_THREADS"),
}))
'''


def test_imports_under_the_sandbox_limits(ctx):
    """pandas, matplotlib, scipy and sklearn import under the rlimits, and
    matplotlib uses the font list built at install time, read-only."""
    r = run(ctx, "img-limits", "c1", PROBE, timeout=120)
    eq(r["status"], "ok", f"imports under the sandbox: {r.get('error')} {r.get('stderr_tail')}")
    p = json.loads(r["stdout_tail"].strip().splitlines()[-1])
    check(0 < p["as"] <= 8 << 30, f"the address-space limit is on ({p['as']})")
    eq(p["cache"], "/tmp/.matplotlib", "matplotlib's cache directory")
    check(p["lists"] and p["list_writable"] == [False] * len(p["lists"]),
          f"the font list is the read-only one built at install time: {p}")
    eq(p["font_warnings"], [], "no font cache rebuilt or refused")
    check(p["fonts"] > 0, "fonts found")
    eq(p["threads"], "1", "BLAS threads bounded per kernel")
    with open(os.path.join(ctx.st.kernel_cache, "matplotlib", p["lists"][0])) as f:
        check(json.load(f).get("_version"), "the host-side cache is matplotlib's font list")


def test_preloaded_pooled_kernels(ctx):
    """kernel_preload: pooled kernels import the modules while they warm,
    without leaving a name in the user's namespace; a module that does not
    exist is logged and skipped, the kernel still serves."""
    st = ctx.st
    st.conf_extra["kernel_preload"] = "numpy, pandas, matplotlib.pyplot, no_such_module_x"
    try:
        set_pool(ctx, 1)
        wait_until(lambda: len(pool_rows(ctx)) == 1, 120, "a preloaded pooled kernel")
        trips = metric(ctx, "gateway_round_trips")
        r = run(ctx, "img-preload", "c1",
                "import sys\nprint('pandas' in sys.modules, 'matplotlib.pyplot' in sys.modules,"
                " 'pandas' in dir(), 'm' in dir())")
        eq(r["status"], "ok", f"{r!r}")
        eq(metric(ctx, "gateway_round_trips") - trips, 1,
           "one round trip: the kernel has the epilogue (the template's; test_runs checks"
           " a kernel of its own)")
        eq(r["stdout_tail"], "True True False False\n",
           "modules preloaded, nothing bound in the user's namespace")
        check("kernel_preload: a module failed to import" in ctx.log_text(),
              "the failed preload is logged")
        r = run(ctx, "img-preload", "c1",
                "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
        eq([a["path"] for a in r["artifacts"]], ["output-1.png"],
           "inline figures still work in a preloaded kernel")
    finally:
        st.conf_extra.pop("kernel_preload")
        set_pool(ctx, 0)
        subprocess.run([st.admin, "--config", st.conf, "pool", "drain"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_another_python_environment_is_bound_read_only(ctx):
    """sandbox.conf's python_env: a venv of the operator's, used by the
    kernel, never writable by it."""
    st = ctx.st
    env = os.path.join(st.var, "pyenv")
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", "--system-site-packages",
                    env], check=True)
    site = subprocess.run([os.path.join(env, "bin", "python3"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    with open(os.path.join(site, "cx_operator_mod.py"), "w") as f:
        f.write("WHERE = __file__\n")
    subprocess.run(["chmod", "-R", "a+rX", env], check=True)
    name = ctx.test_kernelspec({"python_env": env})
    ws = os.path.join(st.workspaces, "pyenv-ws")
    os.makedirs(ws, exist_ok=True)
    st.chown_kernel(ws)
    k = gateway(ctx, "POST", "/api/kernels", {"name": name, "path": "pyenv-ws"})
    kc = client(ctx, k["id"])
    try:
        out = kernel_run(kc, "import sys, cx_operator_mod\nprint(sys.prefix, cx_operator_mod.WHERE)\n"
                             "try:\n    open(cx_operator_mod.WHERE, 'a')\n    print('WRITABLE')\n"
                             "except OSError as e:\n    print(type(e).__name__)\n"
                             "import pandas\nprint('pandas', pandas.__version__ > '1')")
        lines = out.strip().splitlines()
        eq(lines[0].split()[0], env, "the kernel runs in the operator's environment")
        check(lines[0].split()[1].startswith(site), f"its module came from there: {lines[0]}")
        check(lines[1] in ("OSError", "PermissionError"),
              f"the environment is read-only inside the sandbox: {lines[1]}")
        eq(lines[2], "pandas True", "system packages still reach it")
    finally:
        kc.stop_channels()
        gateway(ctx, "DELETE", f"/api/kernels/{k['id']}")
