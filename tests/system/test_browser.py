"""Headless Chromium (Debian's chromium, driven by playwright-core from npm):
a signed link clicked in a page, the artifacts page with its image preview
checked by its pixels, its download links, and HTML that never renders."""

import html
import json
import os
import re
import subprocess
import zlib

from harness import check, eq
from test_runs import run

HERE = os.path.dirname(os.path.abspath(__file__))
BROWSER = os.path.join(os.path.dirname(HERE), "browser")


def solid_png(w, h, rgb):
    raw = b"".join(b"\x00" + bytes(rgb) * w for _ in range(h))

    def chunk(t, d):
        return (len(d).to_bytes(4, "big") + t + d
                + zlib.crc32(t + d).to_bytes(4, "big"))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", w.to_bytes(4, "big") + h.to_bytes(4, "big")
                                          + b"\x08\x02\x00\x00\x00")
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def node(script, cfg):
    """Runs a browser script of tests/browser with cfg; its JSON answer."""
    p = subprocess.run(["node", os.path.join(BROWSER, script), json.dumps(cfg)],
                       cwd=BROWSER, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=180)
    check(p.returncode == 0, f"node ran: {p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    check("error" not in out, f"browser script: {out.get('error')}")
    return out


def test_chromium_downloads_and_artifacts_page(ctx):
    user = "b-chromium"
    key = ctx.key(user)
    png = solid_png(60, 40, (255, 0, 128))
    report = "Quartalsbericht \u00fcber \"Q3\".csv"
    r = run(ctx, user, "c1", f"open('a-chart.png', 'wb').write({png!r})\n"
                             f"open({report!r}, 'w').write('a,b\\n1,2\\n')\n"
                             "open('x.html', 'w').write('<script>alert(1)</script>')")
    arts = {a["path"]: a for a in r["artifacts"]}
    rep = arts[report]
    link = ctx.post(f"/v1/artifacts/{rep['artifact_id']}/links", {}, key=key).json()["url"]
    html_link = ctx.post(f"/v1/artifacts/{arts['x.html']['artifact_id']}/links", {}, key=key).json()["url"]
    base = f"http://127.0.0.1:{ctx.st.http_port}"
    cfg = {"base": base, "key": key, "link": base + link, "page": base + "/v1/conversations/c1/artifacts.html",
           "html": base + html_link}
    out = node("artifacts.mjs", cfg)
    eq(out["link"]["name"], rep["filename"], "the signed link saves under the artifact's name")
    eq(out["link"]["sha256"], rep["sha256"], "with the exact bytes")
    eq(out["page_status"], 200, "the page loads")
    check("default-src 'none'" in out["page_csp"], "the page has a strict CSP")
    eq(out["image"], {"w": 60, "h": 40}, "the preview image loaded (natural size)")
    r0, g0, b0 = out["pixel"]
    check(abs(r0 - 255) <= 8 and g0 <= 8 and abs(b0 - 128) <= 8,
          f"the screenshot shows the image's colour: {out['pixel']}")
    eq(sorted(out["links"]), sorted(a["filename"] for a in arts.values()), "a link per artifact")
    first = sorted(arts.values(), key=lambda a: a["path"])[0]
    eq(out["page_download"]["sha256"], first["sha256"], "the page's first link downloads its bytes")
    eq(out["page_download"]["name"], first["filename"], "under its name")
    eq(out["html_rendered"], False, "an HTML artifact never runs in the browser")
    eq(out["html_downloaded"], True, "it is downloaded instead")


def test_page_escapes_and_scopes(ctx):
    user = "b-page"
    key = ctx.key(user)
    run(ctx, user, "c1", "open('<img src=x onerror=alert(1)>.txt', 'w').write('x')")
    r = ctx.get("/v1/conversations/c1/artifacts.html", key=key)
    eq(r.status, 200, "page")
    body = r.body.decode()
    check("<img src=x" not in body, "file names are escaped")
    check("&lt;img src=x onerror=alert(1)&gt;" in body, "and shown")
    check(r.header("Content-Type").startswith("text/html"), "HTML")
    check("&lt;img src=x onerror=alert(1)&gt;" in body[body.index("Files in the workspace"):],
          "listed as a file of the workspace too, escaped")
    r = ctx.request("PUT", "/v1/conversations/c1/files/data/in%20put.csv", body=b"a,b\n",
                    key=key, headers={"Content-Type": "application/octet-stream"})
    eq(r.status, 201, "a file written")
    body = ctx.get("/v1/conversations/c1/artifacts.html", key=key).body.decode()
    files = body[body.index("Files in the workspace"):]
    check("<code>data/in put.csv</code>" in files and "4 B" in files,
          f"the workspace's files are on the page: {files[:600]}")
    check("<code>data</code></td><td>dir" in files, "its directories too")
    r = ctx.get("/v1/conversations/c1/artifacts.html", key=ctx.key("b-other"))
    check("onerror" not in r.body.decode() and "No artifacts yet" in r.body.decode(),
          "another user sees none of it")
    check("No live session" in r.body.decode(), "nor its workspace")
    eq(ctx.get("/v1/conversations/c1/artifacts.html").status, 401, "needs auth")
    # the page's signed links name the current version and serve its bytes
    run(ctx, user, "c2", "open('v.txt', 'w').write('one')")
    run(ctx, user, "c2", "open('v.txt', 'w').write('two')")
    body = ctx.get("/v1/conversations/c2/artifacts.html", key=key).body.decode()
    hrefs = re.findall(r'<a href="([^"]+)" download>', body)
    eq(len(hrefs), 1, "one link per artifact")
    url = html.unescape(hrefs[0])
    check("version=2&" in url, f"the current version: {url}")
    r = ctx.get(url)
    eq((r.status, r.body), (200, b"two"), "a link from the page downloads without a key")


def readme_reader():
    """The fetch() reader docs/api.md documents, verbatim."""
    with open(os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs", "api.md")) as f:
        text = f.read()
    m = re.search(r"```js\n(async function runStreaming.*?)```", text, re.S)
    check(m is not None, "docs/api.md shows the stream reader")
    return m.group(1)


def test_chromium_reads_a_stream_with_fetch(ctx):
    """docs/api.md's fetch() reader, run in Chromium against nginx: stdout
    arrives while the code sleeps, and the result event is the answer."""
    key = ctx.key("b-stream")
    cfg = {"base": f"http://127.0.0.1:{ctx.st.http_port}", "key": key, "reader": readme_reader(),
           "cid": "c1", "code": "import time\nprint('a', flush=True)\ntime.sleep(1)\nprint('b')"}
    out = node("stream.mjs", cfg)
    ev = out["events"]
    eq(ev[0][1], "run", f"the run event first: {[e[1] for e in ev]}")
    outs = [e for e in ev if e[1] == "stdout"]
    eq("".join(e[2]["text"] for e in outs), "a\nb\n", "the output")
    ta = next(e[0] for e in outs if "a" in e[2]["text"])
    tb = next(e[0] for e in outs if "b" in e[2]["text"])
    check(tb - ta >= 600, f"a arrived {tb - ta:.0f} ms before b in the page")
    eq(ev[-1][1], "result", "the result last")
    eq(ev[-1][2]["stdout_tail"], "a\nb\n", "the answer")
    eq(ev[-1][2]["status"], "ok", "ok")
