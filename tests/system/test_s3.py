"""storage = s3 (issue 16): what only an object store has. Runs in the
suite's S3 pass only (tests/run.py), codexec storing in the stack's test
object store: s3rver behind a SigV4 check done with botocore
(tests/s3/sigcheck.py), so every request codexec makes is checked against
the reference signer."""

import datetime
import hashlib
import http.client
import os
import re
import signal
import time
import urllib.parse

import stack
from harness import check, eq, expect_error, new_id, wait_until
from test_downloads import produce, rss_kib, set_delivery
from test_runs import run


def sigcheck_refusals(ctx):
    with open(os.path.join(ctx.st.logdir, "s3-sigcheck.log"), errors="replace") as f:
        return [line for line in f if line.startswith("sigcheck: refused")]


def storage_metric(ctx, family, op):
    text = ctx.get("/metrics").body.decode()
    m = re.search(rf'^codexec_{family}_total{{op="{op}"}} (\d+)$', text, re.M)
    return int(m.group(1)) if m else 0


def test_objects_under_the_prefix_and_every_request_signed(ctx):
    user = "s3-keys"
    before = len(sigcheck_refusals(ctx))
    a = produce(ctx, user, "c1", {"hello.txt": b"hello store"})["hello.txt"]
    key = f"artifacts/{user}/{a['artifact_id']}/v1/hello.txt"
    eq(ctx.stored(key), b"hello store", "the object at the derived key, under s3_prefix")
    eq(ctx.store_keys(".staging/"), [], "no staging object left once committed")
    eq(len(sigcheck_refusals(ctx)), before, "botocore agreed with every signature codexec sent")
    check(storage_metric(ctx, "storage_requests", "put") > 0 and
          storage_metric(ctx, "storage_requests", "copy") > 0, "storage requests are counted")
    r = ctx.get("/v1/health")
    eq((r.status, r.json()["checks"]["storage"]), (200, "ok"), "health writes to the bucket")


def test_big_capture_in_parts_in_bounded_memory(ctx):
    """A 40 MiB file goes up as a multipart upload (s3_part_size 8 MiB),
    never whole in memory; its bytes and sha256 are intact."""
    user = "s3-big"
    pid = ctx.st.pid("codexec-fcgi")
    run(ctx, user, "c1", "x = 1")
    before = rss_kib(pid)
    r = run(ctx, user, "c1", "import os\nopen('big.bin', 'wb').write(os.urandom(40 << 20))",
            timeout=120)
    after = rss_kib(pid)
    a = r["artifacts"][0]
    eq(a["size"], 40 << 20, "its size")
    data = ctx.stored(f"artifacts/{user}/{a['artifact_id']}/v1/big.bin")
    eq(hashlib.sha256(data).hexdigest(), a["sha256"], "the stored object is what was captured")
    print(f"# codexec-fcgi RSS {before} KiB before, {after} KiB after a 40 MiB capture to S3")
    if ctx.flavour != "sanitizers":  # (ASan keeps freed blocks in quarantine: RSS says nothing)
        check(after - before < 32 * 1024, f"the worker grew by {after - before} KiB (< 32 MiB)")
    r = ctx.get(f"/v1/artifacts/{a['artifact_id']}/content", key=ctx.key(user),
                headers={"Range": "bytes=20971520-20971535"})
    eq((r.status, r.body), (206, data[20 << 20:(20 << 20) + 16]), "a range of it, from the store")


def test_redirect_to_a_presigned_url_botocore_agrees_with(ctx):
    """delivery = redirect: a 302 to a presigned URL that botocore, given
    the same inputs, signs the same; the store serves it with the type and
    disposition; tampered or for another object, the store refuses it."""
    user = "s3-redirect"
    a = produce(ctx, user, "c1", {"r\u00e9sum\u00e9 (1).txt": b"signed bytes"})
    a = next(iter(a.values()))
    set_delivery(ctx, "redirect")
    try:
        r = ctx.get(f"/v1/artifacts/{a['artifact_id']}/content", key=ctx.key(user))
        eq(r.status, 302, "a redirect")
        eq(r.header("Cache-Control"), "no-store", "never cached: the URL is a bearer token")
        url = r.header("Location")
        u = urllib.parse.urlsplit(url)
        eq(f"{u.scheme}://{u.netloc}", f"http://127.0.0.1:{ctx.st.s3_port}", "to the store")
        q = dict(urllib.parse.parse_qsl(u.query, keep_blank_values=True))
        eq(int(q["X-Amz-Expires"]), 60, "s3_url_expiry")
        # botocore signs the same request: same path, time, expiry, overrides
        from botocore.auth import S3SigV4QueryAuth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials
        with open(ctx.st.s3_keys) as f:
            key_id, secret = f.read().split()
        overrides = {k: v for k, v in q.items() if k.startswith("response-")}
        req = AWSRequest(method="GET", url=f"{u.scheme}://{u.netloc}{u.path}", params=overrides)
        signer = S3SigV4QueryAuth(Credentials(key_id, secret), "s3", stack.S3_REGION,
                                  expires=int(q["X-Amz-Expires"]))
        stamp = datetime.datetime.strptime(q["X-Amz-Date"], "%Y%m%dT%H%M%SZ")

        class Frozen(datetime.datetime):
            @classmethod
            def utcnow(cls):
                return stamp
        import types
        import botocore.auth
        saved = botocore.auth.datetime  # botocore.auth's own name for the module
        botocore.auth.datetime = types.SimpleNamespace(datetime=Frozen)
        try:
            signer.add_auth(req)
        finally:
            botocore.auth.datetime = saved
        theirs = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(req.url).query))
        eq(q["X-Amz-Signature"], theirs["X-Amz-Signature"], "botocore computes the same signature")
        eq(q["X-Amz-Credential"], theirs["X-Amz-Credential"], "and the same scope")
        # the store serves it
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("GET", f"{u.path}?{u.query}")
        resp = conn.getresponse()
        body = resp.read()
        eq((resp.status, body), (200, b"signed bytes"), "the store serves the presigned URL")
        eq(resp.getheader("Content-Type"), a["mime_type"], "with the stored type")
        check("attachment;" in (resp.getheader("Content-Disposition") or ""), "as an attachment")
        conn.request("GET", f"{u.path}?{u.query}".replace(q["X-Amz-Signature"], "0" * 64))
        resp = conn.getresponse()
        resp.read()
        eq(resp.status, 403, "a tampered URL is refused by the store")
        other = u.path.replace(a["artifact_id"], new_id())
        conn.request("GET", f"{other}?{u.query}")
        resp = conn.getresponse()
        resp.read()
        eq(resp.status, 403, "another object with the same signature is refused")
        conn.close()
        expect_error(ctx.get(f"/v1/artifacts/{a['artifact_id']}/content", key=ctx.key("s3-other")),
                     404, "not_found")
    finally:
        set_delivery(ctx, "x-accel")


def test_x_accel_from_the_store(ctx):
    """x-accel with storage = s3: nginx fetches from the store with a
    presigned URL after codexec's check; headers are codexec's, ranges work,
    the client's key never reaches the store."""
    user = "s3-xaccel"
    data = bytes(range(256)) * 64
    a = produce(ctx, user, "c1", {"x.bin": data})["x.bin"]
    url = f"/v1/artifacts/{a['artifact_id']}/content"
    before = len(sigcheck_refusals(ctx))
    r = ctx.get(url, key=ctx.key(user))
    eq((r.status, r.body), (200, data), "the bytes, through nginx")
    eq([v for h, v in r.headers if h.lower() == "etag"], [f'"{a["sha256"]}"'], "codexec's ETag, once")
    eq(r.header("Content-Type"), a["mime_type"], "codexec's type")
    eq(r.header("Cache-Control"), "private", "private")
    eq(r.header("Content-Security-Policy"), "sandbox; default-src 'none'", "CSP")
    eq(r.header("X-Content-Type-Options"), "nosniff", "nosniff")
    eq(len([h for h, _ in r.headers if h.lower() == "accept-ranges"]), 1, "one Accept-Ranges")
    check(not any(h.lower().startswith("x-amz-") for h, _ in r.headers), "no store headers")
    r = ctx.get(url, key=ctx.key(user), headers={"Range": "bytes=100-199"})
    eq((r.status, r.body, r.header("Content-Range")), (206, data[100:200], f"bytes 100-199/{len(data)}"),
       "a range, passed to the store")
    r = ctx.request("HEAD", url, key=ctx.key(user))
    eq((r.status, r.header("Content-Length")), (200, str(len(data))), "HEAD")
    eq(len(sigcheck_refusals(ctx)), before, "no request the store refused")


def test_two_processes_with_separate_disks_share_the_store(ctx):
    user = "s3-nodes"
    a = produce(ctx, user, "c1", {"shared.txt": b"from node a"})["shared.txt"]
    other = os.path.join(ctx.st.var, "node-b-storage")
    os.makedirs(other, exist_ok=True)
    ctx.st.chown(other)
    sock, proc = ctx.spawn_fcgi("s3-node-b", {"storage_dir": other, "delivery": "direct"})
    try:
        import fcgi_client
        status, _, body = fcgi_client.request(
            sock, "GET", f"/v1/artifacts/{a['artifact_id']}/content",
            params={"HTTP_AUTHORIZATION": f"Bearer {ctx.key(user)}"})
        eq((status, body), (200, b"from node a"), "node b serves node a's artifact")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_store_down_during_capture_and_download(ctx):
    """The store stopped: a run answers cleanly with the file skipped as
    storage_error and nothing committed; a direct download answers 503;
    health says storage failed; all is well once it is back."""
    st, user = ctx.st, "s3-down"
    a = produce(ctx, user, "c1", {"kept.txt": b"kept"})["kept.txt"]
    st.kill_pidfile("s3-sigcheck")
    try:
        r = run(ctx, user, "c1", "open('lost.txt', 'w').write('lost')")
        eq(r["status"], "ok", "the run itself is fine")
        eq([(s["path"], s["reason"]) for s in r.get("skipped", [])], [("lost.txt", "storage_error")],
           "the file is reported, not lost silently")
        eq(ctx.psql(f"SELECT count(*) FROM artifacts WHERE user_id = '{user}' AND path = 'lost.txt'"),
           "0", "nothing committed")
        r = ctx.get(f"/v1/artifacts/{a['artifact_id']}/content", key=ctx.key(user))
        expect_error(r, 503, "unavailable")  # x-accel: nginx's answer, JSON too
        check(b"<Error>" not in r.body and r.header("Content-Disposition") is None,
              f"no store document, no attachment: {r!r}")
        set_delivery(ctx, "direct")
        r = ctx.get(f"/v1/artifacts/{a['artifact_id']}/content", key=ctx.key(user))
        expect_error(r, 503, "unavailable")
        eq(r.header("Content-Disposition"), None, "an error is not saved as the file")
        wait_until(lambda: ctx.get("/v1/health").status == 503, 10, "health notices")
        check(ctx.get("/v1/health").json()["checks"]["storage"] != "ok", "storage named")
    finally:
        st.start_s3()
        set_delivery(ctx, "x-accel")
    r = run(ctx, user, "c1", "open('lost.txt', 'w').write('found')")
    eq([x["path"] for x in r["artifacts"]], ["lost.txt"], "captured once the store is back")
    eq(ctx.get(f"/v1/artifacts/{a['artifact_id']}/content", key=ctx.key(user)).body, b"kept", "served")


def s3rver_path(ctx, key):
    """Where s3rver keeps an object (to age it: an hour can't be waited)."""
    parts = (stack.S3_PREFIX + key).split("/")
    return os.path.join(ctx.st.s3_data, stack.S3_BUCKET, *parts[:-1], f"{parts[-1]}._S3rver_object")


def age(path, seconds=7200):
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_fsck_ends_what_a_killed_upload_left(ctx):
    """codexec-fcgi SIGKILLed while a capture's multipart upload is under
    way: the upload stays in the store; fsck --repair finds and aborts it
    (once it is older than a day: its date is moved back), as does the
    reaper's sweep, which also removes a stale staging object by itself."""
    st, user = ctx.st, "s3-killed"
    s3 = ctx.s3()
    run(ctx, user, "c1", "x = 1")
    ctx.store_put(".staging/w-stale", b"left by a crash")
    age(s3rver_path(ctx, ".staging/w-stale"))
    import threading
    t = threading.Thread(target=lambda: ctx.post(
        "/v1/runs", {"conversation_id": "c1",
                     "code": "import os\nopen('huge.bin', 'wb').write(os.urandom(60 << 20))"},
        key=ctx.key(user), timeout=180))
    t.start()
    uploads_dir = os.path.join(st.s3_data, stack.S3_BUCKET, "._S3rver_uploads")

    def uploading():
        ups = s3.list_multipart_uploads(Bucket=stack.S3_BUCKET, Prefix=stack.S3_PREFIX).get("Uploads", [])
        return ups and any(n.isdigit() for u in ups
                           for n in os.listdir(os.path.join(uploads_dir, u["UploadId"])))
    try:
        wait_until(uploading, 120, "a multipart upload with a part in the store")
        os.kill(st.pid("codexec-fcgi"), signal.SIGKILL)
    finally:
        t.join(timeout=180)
        st.kill_pidfile("codexec-fcgi")
        st.start_fcgi()
    ups = s3.list_multipart_uploads(Bucket=stack.S3_BUCKET, Prefix=stack.S3_PREFIX).get("Uploads", [])
    eq(len(ups), 1, "the killed upload is left in the store")
    # the reaper removes a crash's staged writes by itself, after their grace
    wait_until(lambda: ctx.stored(".staging/w-stale") is None, 30,
               "the stale staging object removed by the reaper")
    r = ctx.admin("fsck", check=False)
    check(ups[0]["Key"][len(stack.S3_PREFIX):] not in r.stdout, "a young upload is a write in progress")
    eq(len(s3.list_multipart_uploads(Bucket=stack.S3_BUCKET, Prefix=stack.S3_PREFIX).get(
        "Uploads", [])), 1, "... and left alone")
    age(os.path.join(uploads_dir, ups[0]["UploadId"], "key"), 2 * 86400)  # uploads: a day
    # then the reaper's sweep, or fsck --repair, whichever comes first, ends it
    r = ctx.admin("fsck", "--repair", check=False)
    wait_until(lambda: s3.list_multipart_uploads(Bucket=stack.S3_BUCKET, Prefix=stack.S3_PREFIX)
               .get("Uploads", []) == [], 30, "the old upload aborted")
    eq(ctx.stored(".staging/w-stale"), None, "the stale staging object removed")
    eq(ctx.admin("fsck", check=False).returncode, 0, f"fsck is clean: {r.stdout}")


def local_version(ctx, user, name, data, sha=None):
    """A version as storage = local left it: a file under storage_dir and
    its rows."""
    aid = new_id()
    key = f"artifacts/{user}/{aid}/v1/{name}"
    path = os.path.join(ctx.st.storage, key)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(data)
    for i in range(4):
        ctx.st.chown(path)
        path = os.path.dirname(path)
    ctx.psql(f"INSERT INTO artifacts (id, user_id, conversation_id, path, kind, current_version)"
             f" VALUES ('{aid}', '{user}', 'c1', '{name}', 'file', 1);"
             f"INSERT INTO artifact_versions (artifact_id, version, filename, mime_type, size, sha256,"
             f" storage_key, produced_by) VALUES ('{aid}', 1, '{name}', 'text/plain', {len(data)},"
             f" '{sha or hashlib.sha256(data).hexdigest()}', '{key}', '{{}}')")
    return aid, key


def test_storage_migrate_from_local(ctx):
    """codexec-admin storage migrate copies storage_dir's versions into the
    store, checking each against its row; run again, it copies nothing
    more; a file whose bytes changed is reported, not copied."""
    user = "s3-migrate"
    aid, key = local_version(ctx, user, "old.txt", b"from the disk")
    bad, bad_key = local_version(ctx, user, "bad.txt", b"changed", sha="0" * 64)
    r = ctx.admin("storage", "migrate", check=False)
    eq(r.returncode, 1, f"one problem: {r.stdout}")
    check("sha256 mismatch: artifact " + bad in r.stdout, r.stdout)
    check(re.search(r"^[1-9][0-9]* version\(s\) copied", r.stdout, re.M), r.stdout)
    eq(ctx.stored(key), b"from the disk", "the version is in the store")
    eq(ctx.stored(bad_key), None, "the changed one is not")
    eq(ctx.get(f"/v1/artifacts/{aid}/content", key=ctx.key(user)).body, b"from the disk",
       "and codexec serves it from there")
    ctx.psql(f"DELETE FROM artifacts WHERE id = '{bad}'")
    r = ctx.admin("storage", "migrate", check=False)
    eq((r.returncode, r.stdout.strip().splitlines()[-1]), (0, "0 version(s) copied, 0 problem(s)"),
       "run again: nothing left to copy")


def test_fsck_pages_through_a_large_listing(ctx):
    """More objects than one ListObjectsV2 page (1000): fsck sees every
    one (here 1100 orphans planted behind codexec's back) and --repair
    removes them all."""
    import concurrent.futures
    user = "s3-pages"
    keys = [f"artifacts/{user}/{new_id()}/v1/o{i}.txt" for i in range(1100)]
    ctx.s3()  # (made once, then shared by the threads)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: ctx.store_put(k, b"o"), keys))
    eq(len(ctx.store_keys(f"artifacts/{user}/")), 1100, "planted (botocore pages through them too)")
    r = ctx.admin("fsck", check=False)
    eq(len([l for l in r.stdout.splitlines() if l.startswith(f"orphan file artifacts/{user}/")]),
       1100, "every orphan reported, across pages")
    r = ctx.admin("fsck", "--repair", check=False)
    eq(r.returncode, 0, r.stdout[-500:])
    eq(ctx.store_keys(f"artifacts/{user}/"), [], "all removed")
