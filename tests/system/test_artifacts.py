"""Capture: files a run produced or changed become artifact versions."""

import hashlib
import os
import re

from harness import check, eq, expect_error, metric, new_id
from test_runs import run


def by_path(r):
    return {a["path"]: a for a in r["artifacts"]}


def skipped(r):
    return {s["path"]: s["reason"] for s in r.get("skipped", [])}


def stored_bytes(ctx, user, a):
    """The version's bytes, read from the storage (a file, or the test
    object store's object) at the key the server derives."""
    data = ctx.stored(f"artifacts/{user}/{a['artifact_id']}/v{a['version']}/{a['filename']}")
    check(data is not None, f"stored: {a['artifact_id']} v{a['version']}")
    return data


def test_produced_file_is_persisted(ctx):
    user = "a-persist"
    r = run(ctx, user, "c1", "open('report.txt', 'w').write('wrote report\\n')\n"
                             "import os\nos.makedirs('sub', exist_ok=True)\n"
                             "open('sub/data.csv', 'w').write('a,b\\n1,2\\n')")
    arts = by_path(r)
    eq(sorted(arts), ["report.txt", "sub/data.csv"], "captured paths")
    a = arts["report.txt"]
    eq(a["size"], 13, "server-computed size")
    eq(a["sha256"], hashlib.sha256(b"wrote report\n").hexdigest(), "server-computed sha256")
    eq(a["mime_type"], "text/plain", "libmagic MIME")
    eq(a["kind"], "file", "kind")
    eq(a["version"], 1, "first version")
    eq(a["filename"], "report.txt", "filename")
    eq(a["download_url"], f"/v1/artifacts/{a['artifact_id']}/content?version=1", "download url")
    eq(stored_bytes(ctx, user, a), b"wrote report\n", "bytes at the derived storage key")
    eq(arts["sub/data.csv"]["mime_type"], "text/csv", "text/plain refined by .csv")
    eq(arts["sub/data.csv"]["kind"], "data", "csv is data")
    rec = ctx.get(f"/v1/artifacts/{a['artifact_id']}", key=ctx.key(user)).json()
    eq(rec["versions"][0]["produced_by"],
       {"tool": "code_executor", "action": "run_code", "run_id": r["run_id"]}, "produced_by")
    eq(ctx.psql(f"SELECT count(*) FROM artifact_versions WHERE storage_key LIKE 'artifacts/{user}/%'"),
       "2", "two rows")


def test_versions_and_unchanged_files(ctx):
    user = "a-version"
    r1 = run(ctx, user, "c1", "open('out.txt', 'w').write('one')")
    r2 = run(ctx, user, "c1", "x = 1")
    eq(r2["artifacts"], [], "an unchanged file is not captured again")
    r3 = run(ctx, user, "c1", "open('out.txt', 'w').write('two!')")
    a1, a3 = r1["artifacts"][0], r3["artifacts"][0]
    eq(a3["artifact_id"], a1["artifact_id"], "same path, same artifact")
    eq(a3["version"], 2, "next version")
    r4 = run(ctx, user, "c1", "open('out.txt', 'w').write('two!')")
    eq(r4["artifacts"], [], "rewritten with the same bytes: no new version")
    rec = ctx.get(f"/v1/artifacts/{a1['artifact_id']}", key=ctx.key(user)).json()
    eq([v["version"] for v in rec["versions"]], [1, 2], "versions listed")
    eq(rec["current_version"], 2, "current version")
    eq(stored_bytes(ctx, user, a1), b"one", "version 1 kept")
    lst = ctx.get("/v1/artifacts?conversation_id=c1", key=ctx.key(user)).json()
    eq([a["path"] for a in lst["artifacts"]], ["out.txt"], "listed")
    expect_error(ctx.get(f"/v1/artifacts/{a1['artifact_id']}", key=ctx.key("a-other")), 404,
                 "not_found")
    eq(ctx.get("/v1/artifacts?conversation_id=c1", key=ctx.key("a-other")).json()["artifacts"], [],
       "another user sees nothing")
    expect_error(ctx.get("/v1/artifacts", key=ctx.key(user)), 400, "invalid_request")
    expect_error(ctx.get("/v1/artifacts?conversation_id=a%2F..", key=ctx.key(user)), 400)


def test_special_files_are_skipped_never_followed(ctx):
    user = "a-special"
    code = ("import os, socket\n"
            "os.symlink('/etc/passwd', 'pw')\n"
            "os.symlink('/workspace', 'loop')\n"
            "os.mkfifo('fifo')\n"
            "s = socket.socket(socket.AF_UNIX); s.bind('sock')\n"
            "open('real.txt', 'w').write('real')\n")
    r = run(ctx, user, "c1", code)
    eq(sorted(by_path(r)), ["real.txt"], "only the regular file")
    eq(skipped(r), {"pw": "symlink", "loop": "symlink", "fifo": "not_regular",
                    "sock": "not_regular"}, "listed with reasons")
    r = run(ctx, user, "c1", "x = 1")
    eq(r.get("skipped", []), [], "not listed again while unchanged")
    check(all(b"root:" not in ctx.stored(k) for k in ctx.store_keys(f"artifacts/{user}/")),
          "/etc/passwd never copied")


def test_exclusions_and_outputs(ctx):
    user = "a-exclude"
    code = ("import os\n"
            "for d in ('inputs', 'tmp', '.hidden_dir', '__pycache__', 'keep'): os.makedirs(d, exist_ok=True)\n"
            "for p in ('inputs/x.txt', 'tmp/x.txt', '.hidden_dir/x.txt', '__pycache__/x.pyc', '.dot',\n"
            "          'a.tmp', 'b.lock', 'c.pyc', 'keep/y.txt', 'z.png'): open(p, 'w').write(p)\n")
    r = run(ctx, user, "c1", code)
    eq(sorted(by_path(r)), ["keep/y.txt", "z.png"], "default exclusions")
    r = run(ctx, user, "c2", code + "open('report.tmp', 'w').write('named')\n",
            outputs=["*.png", "report.tmp", "inputs/*"])
    eq(sorted(by_path(r)), ["report.tmp", "z.png"], "outputs restricts, and names an excluded file")


def test_caps_are_listed_and_not_offered_again(ctx):
    user = "a-caps"
    r = run(ctx, user, "c1", "with open('big.bin', 'wb') as f:\n"
                             "    f.seek(700 * 1024 * 1024); f.write(b'x')  # sparse: past max_artifact_bytes (600M)\n"
                             "open('small.txt', 'w').write('s')", timeout=120)
    eq(sorted(by_path(r)), ["small.txt"], "the small one")
    eq(skipped(r), {"big.bin": "too_large"}, "the big one skipped as too_large")
    r = run(ctx, user, "c1", "x = 1")
    eq(r.get("skipped", []), [], "not offered again until it changes")
    r = run(ctx, user, "c2", "import os\nos.makedirs('many', exist_ok=True)\n"
                             "for i in range(3000):\n"
                             "    open(f'many/f{i:04d}.txt', 'w').write(str(i))", timeout=120)
    eq(len(r["artifacts"]), 64, "max_captured_files")
    reasons = skipped(r)
    eq(len(reasons), 3000 - 64, "the rest listed")
    check(set(reasons.values()) == {"too_many_files"}, "as too_many_files")
    r = run(ctx, user, "c2", "x = 1", timeout=120)
    eq((r["artifacts"], r.get("skipped", [])), ([], []), "a no-op run over 3000 files")


def test_hostile_names(ctx):
    user = "a-names"
    # (s3rver keeps an object in a file named after its key's last part
    # plus up to 22 bytes: 233 is its longest name)
    longest = 250 if ctx.backend == "local" else 229
    code = ("names = ['a\\r\\nb.txt', '\\u00fcber \\u6587\\u4ef6.txt', 'x' * %d + '.txt',\n" % longest +
            "         'quote\"s.txt', 'semi;colon.txt', '..weird', '- dash.txt']\n"
            "for n in names: open(n, 'w').write(n)\n")
    r = run(ctx, user, "c1", code)
    arts = by_path(r)
    eq(len(arts), 6, f"all but the dot-file captured: {sorted(arts)}")
    for path, a in arts.items():
        fn = a["filename"]
        check("/" not in fn and "\r" not in fn and "\n" not in fn and '"' not in fn and
              not fn.startswith("."), f"safe filename {fn!r}")
        check(len(fn.encode()) <= 255, "at most 255 bytes")
        eq(stored_bytes(ctx, user, a), path.encode(), f"bytes of {path!r}")
    check("\u00fcber \u6587\u4ef6.txt" in arts, "non-ASCII path kept")
    eq(arts["\u00fcber \u6587\u4ef6.txt"]["filename"], "\u00fcber \u6587\u4ef6.txt", "non-ASCII filename")
    eq(arts["a\r\nb.txt"]["filename"], "ab.txt", "CR/LF removed")


def test_user_keys_in_storage_are_safe(ctx):
    for user in ["../../etc", "user with space", "."]:
        r = run(ctx, user, "c1", "open('f.txt', 'w').write('x')")
        key = ctx.psql(f"SELECT storage_key FROM artifact_versions WHERE artifact_id ="
                       f" '{r['artifacts'][0]['artifact_id']}'")
        check(re.fullmatch(r"artifacts/h-[0-9a-f]{32}/[0-9a-f-]{36}/v1/f\.txt", key),
              f"hashed user key: {key}")


def test_matplotlib_png_becomes_an_artifact(ctx):
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"
    r = run(ctx, "a-plot", "c1", code, timeout=120)
    eq(r["status"], "ok", f"status {r.get('error')}")
    arts = by_path(r)
    check("output-1.png" in arts, f"output-1.png in {sorted(arts)}")
    a = arts["output-1.png"]
    eq(a["mime_type"], "image/png", "libmagic says PNG")
    eq(a["kind"], "image", "kind image")
    check(stored_bytes(ctx, "a-plot", a)[:8] == b"\x89PNG\r\n\x1a\n", "PNG bytes")


def test_file_written_during_capture(ctx):
    code = ("import threading, time\n"
            "def writer():\n"
            "    with open('growing.log', 'a') as f:\n"
            "        for i in range(4000):\n"
            "            f.write('line %d\\n' % i); f.flush(); time.sleep(0.0005)\n"
            "threading.Thread(target=writer, daemon=True).start()\n"
            "time.sleep(0.05)")
    r = run(ctx, "a-race", "c1", code, timeout=60)
    eq(r["status"], "ok", "status")
    for a in r["artifacts"]:
        data = stored_bytes(ctx, "a-race", a)
        eq(hashlib.sha256(data).hexdigest(), a["sha256"], "stored bytes match the sha256")
        eq(len(data), a["size"], "and the size")


def test_quota_exhaustion(ctx):
    user = "a-quota"  # user_quota_artifacts = 100 on the test stack
    code = "for i in range({0}, {1}): open(f'q{{i:03d}}.txt', 'w').write(str(i))"
    r = run(ctx, user, "c1", code.format(0, 64))
    eq(len(r["artifacts"]), 64, "first batch")
    r = run(ctx, user, "c1", code.format(64, 128))
    eq(len(r["artifacts"]), 36, "up to the quota")
    eq(sorted(set(skipped(r).values())), ["quota_exceeded"], "the rest: quota_exceeded")
    eq(len(skipped(r)), 28, "listed")
    eq(ctx.psql(f"SELECT count(*) FROM artifacts WHERE user_id = '{user}'"), "100", "at the quota")


def test_delete(ctx):
    user = "a-delete"
    r = run(ctx, user, "c1", "open('gone.txt', 'w').write('bye')")
    a = r["artifacts"][0]
    key = f"artifacts/{user}/{a['artifact_id']}/v1/gone.txt"
    check(ctx.stored(key) == b"bye", "stored")
    expect_error(ctx.request("DELETE", f"/v1/artifacts/{a['artifact_id']}", key=ctx.key("a-other")),
                 404, "not_found")
    eq(ctx.request("DELETE", f"/v1/artifacts/{a['artifact_id']}", key=ctx.key(user)).status, 204,
       "deleted")
    eq(ctx.stored(key), None, "bytes removed")
    expect_error(ctx.get(f"/v1/artifacts/{a['artifact_id']}", key=ctx.key(user)), 404, "not_found")
    expect_error(ctx.request("DELETE", f"/v1/artifacts/{a['artifact_id']}", key=ctx.key(user)), 404)
    expect_error(ctx.request("DELETE", "/v1/artifacts/not-a-uuid", key=ctx.key(user)), 404)
    r = run(ctx, user, "c1", "open('gone.txt', 'w').write('again')")
    eq(r["artifacts"][0]["version"], 1, "a new artifact after the delete")


def round_trips(ctx, user, cid, code):
    names = ["gateway_round_trips", "gateway_rest_requests", "gateway_ws_connects"]
    before = [metric(ctx, n) for n in names]
    r = run(ctx, user, cid, code)
    return r, [metric(ctx, n) - b for n, b in zip(names, before)]


def test_round_trips_do_not_grow_with_the_workspace(ctx):
    """The protocol's promise: a run costs the same gateway round trips
    whatever the workspace holds (counted, not timed). The test stack serves
    one request at a time here, so the counters move only for these runs."""
    user = "a-trips"
    run(ctx, user, "empty", "x = 0")
    run(ctx, user, "full", "import os\nfor i in range(50):\n"
                           "    open(f'f{i:02d}.bin', 'wb').write(os.urandom(65536))")
    # (the reaper's sweep lists the gateway's kernels every reaper_interval:
    # a sweep that lands inside one of the two runs counts one REST call
    # there; it can't land in three pairs in a row)
    for _ in range(3):
        _, empty = round_trips(ctx, user, "empty", "x = 1")
        r, full = round_trips(ctx, user, "full", "x = 1")
        if full == empty == [1, 0, 0]:
            break
    eq(r["artifacts"], [], "nothing changed")
    eq(full, empty, "same round trips with 50 files of 64 KiB as with none")
    eq(empty, [1, 0, 0], "one pipelined batch, no REST call, no new WebSocket")


def test_failed_cells_still_capture(ctx):
    """The capture rides on the run's last cell, which the kernel skips when
    the cell raises: then one more request captures, so a failed run loses
    nothing (and costs one more round trip, failed runs only)."""
    user = "a-fail"
    r, trips = round_trips(ctx, user, "c1", "open('before.txt', 'w').write('b')\nraise ValueError('x')")
    eq((r["status"], r["error_name"]), ("error", "ValueError"), "the cell failed")
    eq([a["path"] for a in r["artifacts"]], ["before.txt"], "what it wrote is captured")
    eq(trips[0], 2, "a failed cell costs one more round trip")
    _, trips = round_trips(ctx, user, "c1", "x = 1")
    eq(trips[0], 1, "a run that succeeds costs one")
    r = run(ctx, user, "c1", "def main(n):\n    open('m.txt', 'w').write(str(n))\n    raise KeyError(n)",
            arguments={"n": 3})
    eq((r["status"], [a["path"] for a in r["artifacts"]]), ("error", ["m.txt"]),
       "main() failing after writing a file")
    r = run(ctx, user, "c1", "def main(n):\n    open('m.txt', 'w').write(str(n * 2))\n    return n",
            arguments={"n": 4})
    eq((r["status"], r["result"], [a["path"] for a in r["artifacts"]]), ("ok", 4, ["m.txt"]),
       "main() succeeding")
    eq(r["artifacts"][0]["version"], 2, "the next version")


def test_forged_capture_messages(ctx):
    """User code can publish messages that look like the capture protocol's:
    they can neither escape the workspace nor stop the real capture."""
    user = "a-forge"
    code = ("from IPython.display import display\n"
            "M = 'application/vnd.codexec.capture+json'\n"
            "for m in [{'op': 'file', 'n': 0, 'path': '../../etc/evil', 'size': 3},\n"
            "          {'op': 'done', 'skipped': [{'path': '../x', 'reason': 'y'}]},\n"
            "          {'op': 'file', 'n': 7, 'path': 'forged.txt', 'size': 5},\n"
            "          {'op': 'chunk', 'n': 7, 'data': 'aGVsbG8='},\n"
            "          {'op': 'end', 'n': 7, 'size': 5, 'sha256': '0' * 64},\n"
            "          {'op': 'file', 'n': 8, 'path': 'half.txt', 'size': 5}]:\n"
            "    display({M: m}, raw=True)\n"
            "open('real.txt', 'w').write('real')\n")
    r = run(ctx, user, "c1", code)
    eq(r["status"], "ok", f"{r!r}")
    eq([a["path"] for a in r["artifacts"]], ["real.txt"], "only the real file is an artifact")
    a = r["artifacts"][0]
    eq(ctx.get(f"/v1/artifacts/{a['artifact_id']}/content", key=ctx.key(user)).body, b"real",
       "its bytes")
    eq(sorted((s["path"], s["reason"]) for s in r.get("skipped", [])),
       [("../../etc/evil", "invalid_name"), ("forged.txt", "corrupt_transfer"),
        ("half.txt", "incomplete_transfer")], "forgeries are reported as what they are")
    eq(os.path.exists("/etc/evil"), False, "nothing was written outside the storage")


def test_large_file_travels_in_binary(ctx):
    """A file's bytes come as binary WebSocket frames, not base64 in JSON:
    every byte value, several chunks, none of it counted as base64."""
    user = "a-binary"
    b64_0, cap0 = metric(ctx, "capture_base64_bytes"), metric(ctx, "capture_bytes")
    code = ("import os\nrnd = os.urandom((5 << 20) + 12345)\n"
            "open('big.bin', 'wb').write(rnd)\n"
            "open('bytes.bin', 'wb').write(bytes(range(256)) * 3)\n"
            "import hashlib\nprint(hashlib.sha256(rnd).hexdigest())")
    r = run(ctx, user, "c1", code)
    eq(r["status"], "ok", f"{r!r}")
    arts = by_path(r)
    eq(sorted(arts), ["big.bin", "bytes.bin"], "both captured")
    eq(arts["big.bin"]["size"], (5 << 20) + 12345, "size")
    eq(arts["big.bin"]["sha256"], r["stdout_tail"].strip(), "the kernel's bytes, hashed by the server")
    body = ctx.get(f"/v1/artifacts/{arts['big.bin']['artifact_id']}/content", key=ctx.key(user)).body
    eq(hashlib.sha256(body).hexdigest(), arts["big.bin"]["sha256"], "downloaded whole")
    eq(stored_bytes(ctx, user, arts["bytes.bin"]), bytes(range(256)) * 3, "every byte value")
    eq(metric(ctx, "capture_base64_bytes"), b64_0, "nothing came base64")
    check(metric(ctx, "capture_bytes") >= cap0 + (5 << 20), "capture_bytes counts them")


def test_forged_binary_capture_messages(ctx):
    """User code can send capture look-alikes with binary buffers too: a
    chunk whose bytes don't match what its end claims, one with more
    buffers than a message may carry, one with none."""
    user = "a-forge-bin"
    code = ("p = get_ipython().display_pub\n"
            "M = 'application/vnd.codexec.capture+json'\n"
            "def send(m, bufs=()):\n"
            "    p.session.send(p.pub_socket, 'display_data', {'data': {M: m}, 'metadata': {},\n"
            "                   'transient': {}}, parent=p.parent_header, ident=p.topic,\n"
            "                   buffers=list(bufs))\n"
            "send({'op': 'file', 'n': 7, 'path': 'lie.bin', 'size': 5})\n"
            "send({'op': 'chunk', 'n': 7}, [b'hello'])\n"
            "send({'op': 'end', 'n': 7, 'size': 5, 'sha256': '0' * 64})\n"
            "send({'op': 'file', 'n': 8, 'path': 'many.bin', 'size': 5})\n"
            "send({'op': 'chunk', 'n': 8}, [b'h', b'e', b'l', b'l', b'o'])\n"
            "import hashlib\n"
            "send({'op': 'end', 'n': 8, 'size': 5, 'sha256': hashlib.sha256(b'hello').hexdigest()})\n"
            "send({'op': 'file', 'n': 9, 'path': 'none.bin', 'size': 5})\n"
            "send({'op': 'chunk', 'n': 9})\n"
            "send({'op': 'file', 'n': 10, 'path': '../up.bin', 'size': 1}, [b'x'])\n"
            "open('real.txt', 'w').write('real')\n")
    r = run(ctx, user, "c1", code)
    eq(r["status"], "ok", f"{r!r}")
    eq([a["path"] for a in r["artifacts"]], ["real.txt"], "only the real file is an artifact")
    eq(sorted((s["path"], s["reason"]) for s in r.get("skipped", [])),
       [("../up.bin", "invalid_name"), ("lie.bin", "corrupt_transfer"),
        ("many.bin", "corrupt_transfer"), ("none.bin", "corrupt_transfer")],
       "forgeries are reported as what they are")


def test_inputs_round_trip(ctx):
    user = "a-inputs"
    r = run(ctx, user, "c1", "import os\nos.makedirs('a', exist_ok=True); os.makedirs('b', exist_ok=True)\n"
                             "open('a/seed.csv', 'w').write('x,y\\n1,2\\n')\n"
                             "open('b/seed.csv', 'wb').write(bytes(range(256)) * 5000)")
    ids = {a["path"]: a["artifact_id"] for a in r["artifacts"]}
    r = run(ctx, user, "c1", "import hashlib\n"
                             "print(open('inputs/seed.csv').read(), end='')\n"
                             "print(hashlib.sha256(open('inputs/seed-2.csv', 'rb').read()).hexdigest())",
            inputs=[ids["a/seed.csv"], ids["b/seed.csv"]])
    eq(r["status"], "ok", f"status {r.get('error')}")
    eq(r["inputs_loaded"], ["inputs/seed.csv", "inputs/seed-2.csv"], "staged paths, clash-free")
    eq(r["stdout_tail"], "x,y\n1,2\n" + hashlib.sha256(bytes(range(256)) * 5000).hexdigest() + "\n",
       "the bytes arrived whole (a multi-chunk input too)")
    eq(r["artifacts"], [], "inputs/ is never captured")
    missing = new_id()
    body = expect_error(ctx.post("/v1/runs", {"conversation_id": "c1", "code": "1",
                                              "inputs": [missing]}, key=ctx.key(user)),
                        404, "input_not_found")
    eq(body["error"]["message"], f"input artifact {missing} not found in this conversation",
       "the message names it")
    # another conversation of the same user, and another user: both foreign
    expect_error(ctx.post("/v1/runs", {"conversation_id": "c2", "code": "1",
                                       "inputs": [ids["a/seed.csv"]]}, key=ctx.key(user)),
                 404, "input_not_found")
    expect_error(ctx.post("/v1/runs", {"conversation_id": "c1", "code": "1",
                                       "inputs": [ids["a/seed.csv"]]}, key=ctx.key("a-thief")),
                 404, "input_not_found")
    eq(ctx.psql("SELECT count(*) FROM runs WHERE user_id = 'a-thief'"), "0", "nothing ran")


def test_timeout_captures_nothing_and_loses_nothing(ctx):
    user = "a-timeout"
    r = run(ctx, user, "c1", "import time\nopen('partial.txt', 'w').write('p')\ntime.sleep(30)",
            timeout=1)
    eq(r["error_name"], "TimeoutError", "timed out")
    eq(r["artifacts"], [], "a timed-out run captures nothing")
    r = run(ctx, user, "c1", "x = 1")
    eq([a["path"] for a in r["artifacts"]], ["partial.txt"], "the next run picks it up")


def test_upload_raw_and_multipart(ctx):
    user = "a-upload"
    key = ctx.key(user)
    data = bytes(range(256)) * 1000
    r = ctx.post("/v1/artifacts?conversation_id=c1&filename=..%2F..%2Fseed%0D%0A.bin", data, key=key,
                 headers={"Content-Type": "application/octet-stream"})
    eq(r.status, 201, f"raw upload {r!r}")
    a = r.json()
    eq(a["filename"], "seed.bin", "hostile name sanitised")
    eq(a["size"], len(data), "size")
    eq(a["sha256"], hashlib.sha256(data).hexdigest(), "sha256")
    eq(stored_bytes(ctx, user, a), data, "bytes stored")
    eq(ctx.get(f"/v1/artifacts/{a['artifact_id']}", key=key).json()["versions"][0]["produced_by"],
       {"tool": "upload", "action": "upload_artifact"}, "produced_by")
    # a browser form
    boundary = "----codexecFormBoundary7MA4YWxkTrZu0gW"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"conversation_id\"\r\n\r\nc1\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"r\u00e9sum\u00e9.csv\"\r\nContent-Type: text/csv\r\n\r\n").encode()
    content = b"a,b\r\n1,2\r\n" + b"--" + boundary[:10].encode() + b"\r\n"  # boundary-like bytes inside
    body += content + f"\r\n--{boundary}--\r\n".encode()
    r = ctx.post("/v1/artifacts", body, key=key,
                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    eq(r.status, 201, f"multipart upload {r!r}")
    m = r.json()
    eq(m["filename"], "r\u00e9sum\u00e9.csv", "non-ASCII name kept")
    eq(m["mime_type"], "text/csv", "MIME")
    eq(stored_bytes(ctx, user, m), content, "exact bytes, boundary-like content intact")
    # the uploaded file is an input for a run in that conversation
    rr = run(ctx, user, "c1", "print(open('inputs/r\u00e9sum\u00e9.csv', 'rb').read() == "
                              + repr(content) + ")", inputs=[m["artifact_id"]])
    eq(rr["stdout_tail"], "True\n", "input round trip")
    # hostile bodies
    bad = [
        (b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nabc", "x"),
        (b"no boundary at all", "x"),
        (b"--x\r\n" + b"A" * 20000, "x"),
    ]
    for b, bd in bad:
        expect_error(ctx.post("/v1/artifacts", b, key=key,
                              headers={"Content-Type": f"multipart/form-data; boundary={bd}"}),
                     400, "invalid_request")
    expect_error(ctx.post("/v1/artifacts?conversation_id=c1&filename=a%00b", b"x", key=key,
                          headers={"Content-Type": "application/octet-stream"}), 400)
    nul = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\0b\"\r\n\r\n"
           f"x\r\n--{boundary}--\r\n").encode()
    expect_error(ctx.post("/v1/artifacts", nul, key=key,
                          headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}),
                 400, "invalid_request")
    expect_error(ctx.post("/v1/artifacts?filename=a", b"x", key=key,
                          headers={"Content-Type": "application/octet-stream"}), 400)
    expect_error(ctx.post("/v1/artifacts?conversation_id=a%20b&filename=a", b"x", key=key,
                          headers={"Content-Type": "application/octet-stream"}), 400)
    expect_error(ctx.post("/v1/artifacts?conversation_id=c1&filename=a", b"x",
                          headers={"Content-Type": "application/octet-stream"}), 401)
    expect_error(ctx.post("/v1/artifacts?conversation_id=c1&filename=big", b"z" * (3 << 20), key=key,
                          headers={"Content-Type": "application/octet-stream"}), 413)


def test_crash_between_rename_and_commit_then_fsck(ctx):
    """The process dies after the bytes are in place and before COMMIT (a
    test hook stands in for the crash): no rows, an orphan file, and fsck
    --repair removes it."""
    import time
    st, user = ctx.st, "a-crash"
    run(ctx, user, "c1", "x = 1")
    os.environ["CODEXEC_TEST_CRASH_BEFORE_COMMIT"] = "1"
    try:
        st.kill_pidfile("codexec-fcgi")
        st.start_fcgi()
        r = ctx.post("/v1/runs", {"conversation_id": "c1", "code": "open('lost.txt', 'w').write('l')"},
                     key=ctx.key(user))
        eq(r.status, 502, "the worker died mid-request")
    finally:
        del os.environ["CODEXEC_TEST_CRASH_BEFORE_COMMIT"]
        for _ in range(50):
            if not st.pid("codexec-fcgi"):
                break
            time.sleep(0.1)
        st.kill_pidfile("codexec-fcgi")
        st.start_fcgi()
    eq(ctx.psql(f"SELECT count(*) FROM artifacts WHERE user_id = '{user}'"), "0", "nothing committed")
    orphans = [k for k in ctx.store_keys(f"artifacts/{user}/") if k.endswith("/v1/lost.txt")]
    eq(len(orphans), 1, "the renamed file is there without a row")
    r = ctx.admin("fsck", check=False)
    eq(r.returncode, 1, f"fsck finds a problem: {r.stdout}")
    check("orphan file artifacts/a-crash/" in r.stdout, "and names the orphan")
    r = ctx.admin("fsck", "--repair", check=False)
    eq(r.returncode, 0, f"repaired: {r.stdout}")
    eq(ctx.stored(orphans[0]), None, "the orphan is gone")
    eq(ctx.admin("fsck", check=False).returncode, 0, "fsck is clean")
    r = run(ctx, user, "c1", "open('kept.txt', 'w').write('k')")
    eq([a["path"] for a in r["artifacts"]], ["kept.txt"], "the conversation works again")
    # a row without its file, and a file whose bytes changed: reported, never "repaired"
    a = r["artifacts"][0]
    key = f"artifacts/{user}/{a['artifact_id']}/v1/kept.txt"
    ctx.store_put(key, b"K")
    r = ctx.admin("fsck", "--repair", check=False)
    eq(r.returncode, 1, "a mismatch remains")
    check(f"sha256 mismatch: artifact {a['artifact_id']} version 1" in r.stdout, r.stdout)
    ctx.store_remove(key)
    r = ctx.admin("fsck", check=False)
    check(f"missing file: artifact {a['artifact_id']} version 1" in r.stdout, r.stdout)
    eq(ctx.request("DELETE", f"/v1/artifacts/{a['artifact_id']}", key=ctx.key(user)).status, 204, "delete")
    eq(ctx.admin("fsck", check=False).returncode, 0, "clean again")
    r = ctx.admin("gc")
    check("removed" in r.stdout and "deleted artifact" in r.stdout, r.stdout)
    eq(ctx.psql(f"SELECT count(*) FROM artifacts WHERE user_id = '{user}' AND deleted_at IS NOT NULL"),
       "0", "gc dropped the tombstone")
    r = ctx.admin("sessions", "list", "--user", user)
    check(f"\t{user}\tc1\t" in r.stdout, "sessions list shows it")
    ctx.admin("sessions", "close", "--user", user, "--conversation", "c1")
    eq(ctx.psql(f"SELECT count(*) FROM sessions WHERE user_id = '{user}'"), "0", "sessions close")


def metric_value(text, line_re, default=None):
    m = re.search(rf"^{line_re} (\d+(?:\.\d+)?(?:e[+-]?\d+)?)$", text, re.M)
    if not m and default is not None:
        return default  # a labelled series appears with its first event
    check(m, f"/metrics has {line_re}")
    return float(m.group(1))


def test_metrics_families_after_a_run(ctx):
    """The families an operator alerts on (docs/operations.md, "Metrics") are on
    /metrics after a run that captured a file and a download of it, with
    values that moved by what happened."""
    user = "a-metrics"
    before = ctx.get("/metrics").body.decode()
    ok0 = metric_value(before, r'codexec_runs_total\{status="ok"\}', 0)
    cap0 = metric_value(before, "codexec_capture_bytes_total")
    dl0 = metric_value(before, "codexec_download_bytes_total")
    dur0 = metric_value(before, "codexec_run_duration_seconds_count")
    r = run(ctx, user, "c1", "open('m.bin', 'wb').write(b'x' * 5000)")
    a = r["artifacts"][0]
    got = ctx.get(a["download_url"], key=ctx.key(user))
    eq(len(got.body), 5000, "download")
    text = ctx.get("/metrics").body.decode()
    check(metric_value(text, r'codexec_runs_total\{status="ok"\}') >= ok0 + 1, "runs_total{ok} moved")
    check(metric_value(text, "codexec_run_duration_seconds_count") >= dur0 + 1, "run duration counted")
    check(metric_value(text, r'codexec_run_duration_seconds_bucket\{le="\+Inf"\}') >= dur0 + 1,
          "run duration histogram")
    check(metric_value(text, "codexec_capture_bytes_total") >= cap0 + 5000, "capture bytes moved")
    check(metric_value(text, "codexec_download_bytes_total") >= dl0 + 5000, "download bytes moved")
    check(metric_value(text, r'codexec_sessions\{gateway="[^"]+"\}') >= 1, "live sessions by gateway")
    check(metric_value(text, r'codexec_kernels\{gateway="[^"]+"\}') >= 1, "kernels by gateway")
    metric_value(text, r'codexec_kernel_pool_ready\{gateway="[^"]+"\}')
    metric_value(text, r'codexec_gateway_max_kernels\{gateway="[^"]+"\}')
    for family, kind in [("codexec_runs_total", "counter"),
                         ("codexec_run_duration_seconds", "histogram"),
                         ("codexec_session_evictions_total", "counter"),
                         ("codexec_refusals_total", "counter"),
                         ("codexec_database_errors_total", "counter"),
                         ("codexec_gateway_errors_total", "counter"),
                         ("codexec_sessions", "gauge"), ("codexec_kernels", "gauge")]:
        check(f"# TYPE {family} {kind}\n" in text, f"# TYPE {family} {kind}")
