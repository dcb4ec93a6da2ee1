"""A run's whole output and its rich results (SPEC §10.3): output "full",
results (the display bundles, text inline, images as artifacts) and
result_present."""

from harness import check, eq, expect_error, new_id
from test_runs import run


def test_output_full(ctx):
    cid = "res-" + new_id()
    code = ("import sys\n"
            "for i in range(3000):\n    print(f'line {i:05}')\n"
            "print('oops', file=sys.stderr)")
    r = run(ctx, "u-res", cid, code, output="full")
    want = "".join(f"line {i:05}\n" for i in range(3000))
    eq(r["stdout"], want, "stdout whole (the tail is not)")
    check(len(r["stdout_tail"]) < len(want), "the tail is a tail")
    eq(r["stderr"], "oops\n", "stderr whole")
    r = run(ctx, "u-res", cid, "print('x')")
    check("stdout" not in r and "stderr" not in r, "only when asked")
    r = run(ctx, "u-res", cid, "print('x')", output="tail")
    check("stdout" not in r, "tail is the default")
    r = run(ctx, "u-res", cid, "1", output="full")
    eq((r["stdout"], r["stderr"]), ("", ""), "empty, but there")
    for bad in ("all", 1, None, ["full"]):
        expect_error(ctx.post("/v1/runs", {"conversation_id": cid, "code": "1", "output": bad},
                              key=ctx.key("u-res")), 400, "invalid_request")


def test_output_full_stops_at_the_limit(ctx):
    """max_output_bytes (1M in the suite) bounds the whole output too."""
    r = run(ctx, "u-res", "res-" + new_id(),
            "import sys\nfor _ in range(4096):\n    sys.stdout.write('y' * 1023 + '\\n')",
            output="full", timeout=120)
    eq(r["truncated"], True, "truncated")
    check(len(r["stdout"]) <= 1 << 20, f"at most max_output_bytes: {len(r['stdout'])}")


def test_result_present(ctx):
    cid = "res-" + new_id()
    eq((run(ctx, "u-res", cid, "1 + 1")["result_present"]), True, "an expression's value")
    r = run(ctx, "u-res", cid, "x = 1")
    eq((r["result"], r["result_present"]), (None, False), "no value")
    r = run(ctx, "u-res", cid, "None")
    eq((r["result"], r["result_present"]), (None, False), "None displays nothing")
    r = run(ctx, "u-res", cid, "def main():\n    return None", arguments={})
    eq((r["result"], r["result_present"]), (None, True), "main() returned None: present")
    r = run(ctx, "u-res", cid, "def main(a):\n    return a", arguments={"a": [1, None]})
    eq((r["result"], r["result_present"]), ([1, None], True), "main()'s value")


def test_results_bundles(ctx):
    cid = "res-" + new_id()
    code = r"""
import matplotlib
matplotlib.use("module://matplotlib_inline.backend_inline")
import matplotlib.pyplot as plt
from IPython.display import display, HTML, Markdown, JSON
import pandas as pd
display(HTML("<b>bold</b>"))
display(Markdown("# title"))
display({"application/json": {"k": [1, 2]}}, raw=True)
display({"text/plain": "big", "text/html": "x" * 70000}, raw=True)
display({"application/vnd.unknown": "no"}, raw=True)
plt.plot([1, 2, 3])
plt.show()
pd.DataFrame({"a": [1, 2]})
"""
    r = run(ctx, "u-res", cid, code)
    eq(r["status"], "ok", f"ran {r.get('error')}")
    res = r["results"]
    types = [e["type"] for e in res]
    eq(types, ["display_data"] * 5 + ["execute_result"],
       f"in order, the unknown type's bundle left out: {res}")
    eq(res[0]["data"]["text/html"], "<b>bold</b>", "HTML inline")
    eq(res[1]["data"]["text/markdown"], "# title", "markdown inline")
    eq(res[2]["data"]["application/json"], {"k": [1, 2]}, "JSON as JSON")
    eq(res[3]["data"], {"text/plain": "big", "text/html": {"truncated": True}}, "over 64 KiB")
    png = res[4]["data"]["image/png"]
    arts = {a["artifact_id"]: a for a in r["artifacts"]}
    check(png["artifact_id"] in arts, f"the figure is an artifact of the run: {png} {arts}")
    eq(arts[png["artifact_id"]]["mime_type"], "image/png", "a PNG")
    eq(png["version"], arts[png["artifact_id"]]["version"], "its version")
    check("text/plain" in res[4]["data"], "the figure's text too")
    check("<table" in res[5]["data"]["text/html"], "a DataFrame's HTML")
    eq(r["result"], res[5]["data"]["text/plain"], "the result is the last expression's text")
    # without capture: no artifact to name, the bundle keeps its text
    r = run(ctx, "u-res", cid, "import matplotlib.pyplot as plt\nplt.plot([1])\nplt.show()",
            capture_artifacts=False)
    check(all("image/png" not in e["data"] for e in r["results"]), f"no artifact: {r['results']}")
    eq(run(ctx, "u-res", cid, "x = 2")["results"], [], "none")


def test_plt_show_under_any_backend(ctx):
    """plt.show() is captured whatever backend the code selected: Agg shows
    nothing of itself, the kernel's start-up hook displays the figures."""
    cid = new_id()
    code = ("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3])\nplt.figure()\nplt.plot([3, 2])\nplt.show()\n"
            "print(sorted(n for n in globals() if 'codexec' in n), plt.get_fignums())")
    r = run(ctx, "u-res-agg", cid, code)
    eq(r["status"], "ok", f"ran {r.get('error')}")
    pngs = [e["data"]["image/png"] for e in r["results"] if "image/png" in e["data"]]
    eq(len(pngs), 2, f"both figures shown: {r['results']}")
    arts = {a["artifact_id"]: a for a in r["artifacts"]}
    check(all(p["artifact_id"] in arts and arts[p["artifact_id"]]["mime_type"] == "image/png"
              for p in pngs), f"each a PNG artifact of the run: {pngs} {arts}")
    eq(r["stdout_tail"], "[] []\n", "no name of the hook in the namespace; the figures closed")
    # a figure only saved is a file, not a display
    r = run(ctx, "u-res-agg", cid, "plt.plot([1]); plt.savefig('f.png'); plt.close('all')")
    eq([e for e in r["results"] if "image/png" in e["data"]], [], "no display")
    eq([a["path"] for a in r["artifacts"]], ["f.png"], "the saved file")
