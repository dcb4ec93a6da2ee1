"""A conversation's files (SPEC §10.1): PUT, GET, HEAD, DELETE and the
listing of /v1/conversations/{cid}/files, through nginx against the real
stack, with the hostile paths a tenant's code or a caller can make."""

import hashlib
import http.client
import json
import os
import time
import urllib.parse

from harness import check, eq, expect_error, new_id, wait_until
from test_runs import run
from test_tenants import RssWatch


def files_url(cid, path=""):
    return f"/v1/conversations/{cid}/files" + (f"/{path}" if path else "")


def put(ctx, user, cid, path, data, status=201, headers=None):
    r = ctx.request("PUT", files_url(cid, path), body=data, key=ctx.key(user),
                    headers=dict(headers or {}, **{"Content-Type": "application/octet-stream"}),
                    timeout=300)
    eq(r.status, status, f"PUT {path}: {r!r}")
    return r


def get(ctx, user, cid, path, status=200, method="GET", headers=None):
    r = ctx.request(method, files_url(cid, path), key=ctx.key(user), headers=headers,
                    timeout=300)
    eq(r.status, status, f"{method} {path}: {r!r}")
    return r


def listing(ctx, user, cid, query="", status=200):
    r = ctx.get(files_url(cid) + query, key=ctx.key(user), timeout=120)
    eq(r.status, status, f"list {query}: {r!r}")
    return r.json()


def test_write_read_head_etag(ctx):
    cid = "files-" + new_id()
    data = b"a,b\n1,2\n"
    r = put(ctx, "u-files", cid, "data/in.csv", data)
    body = r.json()
    eq(body, {"path": "data/in.csv", "size": len(data),
              "sha256": hashlib.sha256(data).hexdigest()}, "PUT answer")
    g = get(ctx, "u-files", cid, "data/in.csv")
    eq(g.body, data, "the bytes back")
    eq(g.header("ETag"), f'"{hashlib.sha256(data).hexdigest()}"', "ETag")
    eq(g.header("Content-Type").split(";")[0], "text/csv", "libmagic's type, refined by .csv")
    eq(g.header("Content-Length"), str(len(data)), "length")
    h = get(ctx, "u-files", cid, "data/in.csv", method="HEAD")
    eq(h.body, b"", "HEAD has no body")
    eq(h.header("ETag"), g.header("ETag"), "HEAD's ETag")
    eq(h.header("Content-Length"), str(len(data)), "HEAD's length")
    get(ctx, "u-files", cid, "data/in.csv", status=304,
        headers={"If-None-Match": g.header("ETag")})
    # an empty file, and one overwritten
    put(ctx, "u-files", cid, "empty", b"")
    eq(get(ctx, "u-files", cid, "empty").body, b"", "empty file")
    put(ctx, "u-files", cid, "data/in.csv", b"x,y\n")
    eq(get(ctx, "u-files", cid, "data/in.csv").body, b"x,y\n", "overwritten")


def test_files_are_the_codes_and_not_captured(ctx):
    """The kernel sees the file at /workspace and /mnt/data; the capture
    does not take it as the code's, but takes what the code changes."""
    cid = "files-" + new_id()
    put(ctx, "u-files", cid, "in.txt", b"hello")
    r = run(ctx, "u-files", cid,
            "print(open('in.txt').read(), open('/mnt/data/in.txt').read())\n"
            "open('/mnt/data/out.txt', 'w').write('made')")
    eq(r["status"], "ok", f"run {r}")
    eq(r["stdout_tail"], "hello hello\n", "both paths")
    eq([a["filename"] for a in r["artifacts"]], ["out.txt"], "only the code's file captured")
    eq(get(ctx, "u-files", cid, "out.txt").body, b"made", "the code's file read back")
    r = run(ctx, "u-files", cid, "open('in.txt', 'a').write(' world')")
    eq([a["filename"] for a in r["artifacts"]], ["in.txt"], "a change the code makes is captured")
    # written again through the API: an input again
    put(ctx, "u-files", cid, "in.txt", b"again")
    r = run(ctx, "u-files", cid, "1")
    eq(r["artifacts"], [], "rewritten input not captured")


def test_list_and_delete(ctx):
    cid = "files-" + new_id()
    for p in ("a.txt", "d/b.txt", "d/e/c.txt"):
        put(ctx, "u-files", cid, p, p.encode())
    top = listing(ctx, "u-files", cid)
    eq([(f["path"], f["type"]) for f in top["files"]], [("a.txt", "file"), ("d", "dir")], "top")
    eq(top["truncated"], False, "not truncated")
    f = top["files"][0]
    eq(f["size"], 5, "size")
    check(f["mtime"].endswith("Z"), f"mtime is UTC: {f}")
    rec = listing(ctx, "u-files", cid, "?recursive=true")
    eq([f["path"] for f in rec["files"]], ["a.txt", "d", "d/b.txt", "d/e", "d/e/c.txt"],
       "recursive")
    sub = listing(ctx, "u-files", cid, "?path=d")
    eq([f["path"] for f in sub["files"]], ["d/b.txt", "d/e"], "a directory's")
    expect_error(ctx.get(files_url(cid) + "?path=nope", key=ctx.key("u-files")), 404,
                 "not_found")
    expect_error(ctx.get(files_url(cid) + "?path=a.txt", key=ctx.key("u-files")), 409,
                 "not_a_file")
    expect_error(ctx.request("DELETE", files_url(cid, "d"), key=ctx.key("u-files")), 409,
                 "not_a_file")
    eq(ctx.request("DELETE", files_url(cid, "a.txt"), key=ctx.key("u-files")).status, 204,
       "delete a file")
    get(ctx, "u-files", cid, "a.txt", status=404)
    eq(ctx.request("DELETE", files_url(cid, "d") + "?recursive=true",
                   key=ctx.key("u-files")).status, 204, "delete a tree")
    eq(listing(ctx, "u-files", cid)["files"], [], "nothing left")
    expect_error(ctx.request("DELETE", files_url(cid, "a.txt"), key=ctx.key("u-files")), 404,
                 "not_found")


def test_no_session_and_other_users(ctx):
    cid = "files-" + new_id()
    expect_error(ctx.get(files_url(cid, "x"), key=ctx.key("u-files")), 404, "not_found")
    expect_error(ctx.get(files_url(cid), key=ctx.key("u-files")), 404, "not_found")
    put(ctx, "u-files", cid, "secret.txt", b"mine")
    # the same conversation id is another conversation for another user
    expect_error(ctx.get(files_url(cid, "secret.txt"), key=ctx.key("u-files-other")), 404,
                 "not_found")
    expect_error(ctx.get(files_url(cid), key=ctx.key("u-files-other")), 404, "not_found")
    expect_error(ctx.request("DELETE", files_url(cid, "secret.txt"),
                             key=ctx.key("u-files-other")), 404, "not_found")
    expect_error(ctx.get(files_url(cid, "secret.txt")), 401, "unauthorized")
    eq(get(ctx, "u-files", cid, "secret.txt").body, b"mine", "still there")
    expect_error(ctx.get(files_url("bad$cid", "x"), key=ctx.key("u-files")), 400,
                 "invalid_request")


def test_hostile_paths(ctx):
    cid = "files-" + new_id()
    put(ctx, "u-files", cid, "ok.txt", b"ok")
    bad = ["../x", "%2e%2e/x", "a/%2E%2E/x", "a/../x", "./x", "a/./x", "a//x", "a/", "%2fetc",
           "x%00y", "x%0ay", "x%7f", "%", "x%zz", "%ff%fe", ("y" * 256), "/".join(["z" * 200] * 21),
           ".codexec-up-1234"]
    for p in bad:
        for method in ("GET", "PUT", "DELETE"):
            r = ctx.request(method, files_url(cid, p), body=b"x" if method == "PUT" else None,
                            key=ctx.key("u-files"))
            if r.status == 400 and not r.header("X-Request-Id"):
                continue  # nginx refused it before codexec (a path above the root)
            expect_error(r, 400, "invalid_path")
    # absolute: the path after files/ begins with "/"
    expect_error(ctx.get(f"/v1/conversations/{cid}/files//etc/passwd", key=ctx.key("u-files")),
                 400, "invalid_path")
    for q in ("?path=..", "?path=%2e%2e", "?path=/etc", "?path=a//b", "?path=x%00"):
        expect_error(ctx.get(files_url(cid) + q, key=ctx.key("u-files")), 400, "invalid_path")
    # segments of 255 and a path of 4096 bytes are fine
    long_path = "/".join(["p" * 255] * 16)[:4096].rstrip("/")
    put(ctx, "u-files", cid, long_path, b"deep")
    eq(get(ctx, "u-files", cid, long_path).body, b"deep", "a 4096-byte path")
    # ... also when every byte of it is percent-encoded in the request line
    # (12 KiB: over nginx's and Apache's default 8 KiB lines)
    put(ctx, "u-files", cid, wide_path(), b"wide")
    eq(get(ctx, "u-files", cid, wide_path()).body, b"wide", "a 4079-byte path of é, encoded")


def wide_path():
    """A path of 4079 bytes, all but its slashes two-byte characters,
    percent-encoded: 12 KiB in the request line."""
    seg = urllib.parse.quote("é" * 127)
    return "/".join([seg] * 16)


def test_links_and_fifos_the_code_planted(ctx):
    """Nothing follows a link the tenant made: not the API, not the host."""
    cid = "files-" + new_id()
    r = run(ctx, "u-files", cid,
            "import os\n"
            "os.symlink('/etc/passwd', 'link')\n"
            "os.symlink('/etc', 'ldir')\n"
            "os.makedirs('real', exist_ok=True)\n"
            "os.symlink('real', 'rlink')\n"
            "os.mkfifo('fifo')\n"
            "print('planted')")
    eq(r["stdout_tail"], "planted\n", f"planted {r}")
    for p in ("link", "ldir/passwd", "rlink/x", "fifo", "real"):
        expect_error(ctx.get(files_url(cid, p), key=ctx.key("u-files")), 409, "not_a_file")
    for p in ("link", "ldir/x", "rlink/x", "fifo", "fifo/x"):
        expect_error(ctx.request("PUT", files_url(cid, p), body=b"over", key=ctx.key("u-files")),
                     409, "not_a_file")
    expect_error(ctx.get(files_url(cid) + "?path=rlink", key=ctx.key("u-files")), 409,
                 "not_a_file")
    # nothing was written through the links
    r = run(ctx, "u-files", cid,
            "import os\nprint(os.listdir('real'), os.path.islink('link'), os.readlink('link'))")
    eq(r["stdout_tail"], "[] True /etc/passwd\n", f"links untouched {r}")
    names = [f["path"] for f in listing(ctx, "u-files", cid)["files"]]
    eq(names, ["real"], "the listing shows regular files and directories only")
    # deleting a link removes the link, never its target
    eq(ctx.request("DELETE", files_url(cid, "ldir"), key=ctx.key("u-files")).status, 204,
       "delete a link")
    r = run(ctx, "u-files", cid, "import os\nprint(os.path.lexists('ldir'), os.path.exists('/etc/passwd'))")
    eq(r["stdout_tail"], "False True\n", "the link went, its target stayed")


def test_listing_is_capped(ctx):
    cid = "files-" + new_id()
    r = run(ctx, "u-files", cid,
            "import os\nos.makedirs('many')\n"
            "for i in range(10001):\n    open(f'many/f{i:05}', 'w').close()\n"
            "print(len(os.listdir('many')))", outputs=["none-of-these"])
    eq(r["stdout_tail"], "10001\n", f"made {r}")
    got = listing(ctx, "u-files", cid, "?path=many")
    eq(len(got["files"]), 10000, "at most 10000 entries")
    eq(got["truncated"], True, "truncated")
    got = listing(ctx, "u-files", cid, "?recursive=true")
    eq(len(got["files"]), 10000, "recursive too")
    eq(got["truncated"], True, "recursive truncated")


def test_too_large_and_bad_bodies(ctx):
    cid = "files-" + new_id()
    put(ctx, "u-files", cid, "seed", b"s")
    # announced over max_artifact_bytes: refused before any byte is read
    conn = http.client.HTTPConnection("127.0.0.1", ctx.st.http_port, timeout=60)
    try:
        conn.putrequest("PUT", files_url(cid, "big"))
        conn.putheader("Authorization", f"Bearer {ctx.key('u-files')}")
        conn.putheader("Content-Length", str(1 << 40))
        conn.endheaders()
        conn.send(b"x" * 65536)
        r = conn.getresponse()
        eq(r.status, 413, "over max_artifact_bytes")
        eq(json.loads(r.read())["error"]["code"], "payload_too_large", "code")
    finally:
        conn.close()
    get(ctx, "u-files", cid, "big", status=404)
    # more than the workspace holds: the kernel's ENOSPC, said as 413, nothing left behind
    r = put(ctx, "u-files", cid, "huge", b"\0" * (540 << 20), status=413)
    eq(r.json()["error"]["code"], "payload_too_large", "workspace full")
    names = [f["path"] for f in listing(ctx, "u-files", cid)["files"]]
    eq(names, ["seed"], "no partial file, no temporary file")
    r = run(ctx, "u-files", cid, "import os\nprint(sorted(os.listdir('.')))")
    eq(r["stdout_tail"], "['seed']\n", "nothing hidden left either")


def test_large_file_memory_bounded(ctx):
    """A 500 MiB file written and read back: codexec-fcgi's memory grows by
    less than 16 MiB (the data moves a chunk at a time)."""
    cid = "files-" + new_id()
    size = 500 << 20
    block = hashlib.sha256(b"seed").digest() * (1 << 15)  # 1 MiB, not compressible to zero
    want = hashlib.sha256()
    for _ in range(size // len(block)):
        want.update(block)
    pid = lambda: ctx.st.pid("codexec-fcgi")  # noqa: E731
    with RssWatch(pid) as w:
        conn = http.client.HTTPConnection("127.0.0.1", ctx.st.http_port, timeout=600)
        try:
            conn.putrequest("PUT", files_url(cid, "big.bin"))
            conn.putheader("Authorization", f"Bearer {ctx.key('u-files-big')}")
            conn.putheader("Content-Length", str(size))
            conn.endheaders()
            t0 = time.monotonic()
            for _ in range(size // len(block)):
                conn.send(block)
            r = conn.getresponse()
            body = r.read()
            eq(r.status, 201, f"PUT 500 MiB: {body[:200]}")
            wrote = time.monotonic() - t0
        finally:
            conn.close()
        eq(json.loads(body)["sha256"], want.hexdigest(), "the server's SHA-256")
        run(ctx, "u-files-big", cid, "keep = 42")
        conn = http.client.HTTPConnection("127.0.0.1", ctx.st.http_port, timeout=600)
        try:
            t0 = time.monotonic()
            conn.request("GET", files_url(cid, "big.bin"),
                         headers={"Authorization": f"Bearer {ctx.key('u-files-big')}"})
            r = conn.getresponse()
            eq(r.status, 200, "GET 500 MiB")
            got, n = hashlib.sha256(), 0
            while True:
                b = r.read(1 << 20)
                if not b:
                    break
                got.update(b)
                n += len(b)
            read = time.monotonic() - t0
        finally:
            conn.close()
    eq(n, size, "every byte back")
    eq(got.hexdigest(), want.hexdigest(), "the same bytes")
    eq(r.getheader("ETag"), f'"{want.hexdigest()}"', "ETag of the big file")
    print(f"# 500 MiB: write {size / wrote / 2**20:.0f} MiB/s, read {size / read / 2**20:.0f} MiB/s,"
          f" codexec-fcgi RSS growth {w.growth_mib():.1f} MiB")
    if ctx.flavour != "sanitizers":  # (ASan keeps freed blocks in quarantine: RSS says nothing)
        check(w.growth_mib() < 16, f"codexec-fcgi's RSS grew {w.growth_mib():.1f} MiB")
    # What was in flight when the read ended is no kernel talking on its
    # own: the reaper (once a second) hears it out and leaves the kernel be.
    time.sleep(3)
    r = run(ctx, "u-files-big", cid, "print(keep)")
    eq((r["stdout_tail"], r["session"]["reset"]), ("42\n", False),
       "the kernel's state after the read")
    eq(ctx.request("DELETE", files_url(cid, "big.bin"), key=ctx.key("u-files-big")).status, 204,
       "deleted")


def keeper_mounts(ctx):
    """The workspaces the gateway's keeper holds (launcher/keeper.h): its
    mount table's workspace mounts. The keeper is the launcher process
    that is not a child of the gateway."""
    gw = ctx.st.gateway_pid()
    n = None
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if b"codexec-kernel-launcher" not in cmd or ppid == gw:
                continue
            with open(f"/proc/{d}/mountinfo") as f:
                n = (n or 0) + sum(1 for line in f if " codexec-workspace " in line)
        except OSError:
            continue
    return n


def test_files_outlive_a_kernel_restart(ctx):
    """The workspace is the session's: a kernel that dies (its memory is
    lost, the run says session.reset) comes back to the same files, and the
    capture's record with them (nothing is captured again)."""
    cid = "files-" + new_id()
    put(ctx, "u-files", cid, "in.txt", b"input")
    r = run(ctx, "u-files", cid, "x = 1\nopen('out.txt', 'w').write('output')")
    eq([a["filename"] for a in r["artifacts"]], ["out.txt"], "captured")
    r = run(ctx, "u-files", cid, "import os\nos._exit(1)")
    eq((r["status"], r.get("error_name"), r["session"]["reset"]), ("error", "KernelDied", True),
       f"the kernel died, its state lost: {r}")
    r = run(ctx, "u-files", cid,
            "print(open('in.txt').read(), open('/mnt/data/out.txt').read(), 'x' in globals())")
    eq(r["stdout_tail"], "input output False\n", "the files are not")
    eq(r["artifacts"], [], "and nothing captured again")
    eq(get(ctx, "u-files", cid, "in.txt").body, b"input", "the API sees them too")


def test_a_closed_sessions_workspace_goes(ctx):
    cid = "files-" + new_id()
    put(ctx, "u-files", cid, "gone.txt", b"soon")
    before = keeper_mounts(ctx)
    check(before, f"the keeper holds workspaces: {before}")
    eq(ctx.request("DELETE", f"/v1/conversations/{cid}/session", key=ctx.key("u-files")).status,
       204, "closed")
    wait_until(lambda: keeper_mounts(ctx) < before, timeout=30,
               what="the keeper to unmount the closed session's workspace")
    put(ctx, "u-files", cid, "new.txt", b"fresh")
    eq([f["path"] for f in listing(ctx, "u-files", cid)["files"]], ["new.txt"],
       "a new session starts empty")
