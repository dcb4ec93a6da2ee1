"""GET/HEAD /v1/artifacts/{id}/content and signed links (docs/api.md, "Downloads"), through
nginx, in the x-accel mode the stack runs and in direct mode."""

import base64
import hashlib
import os
import re
import signal
import time
import urllib.parse

import fcgi_client
from harness import check, eq, expect_error, new_id, wait_until
from test_runs import run


def set_delivery(ctx, mode):
    st = ctx.st
    st.conf_extra["delivery"] = mode
    st.write_config()
    st.kill_pidfile("codexec-fcgi")
    st.start_fcgi()


def produce(ctx, user, cid, files):
    code = "".join(f"open({name!r}, 'wb').write({data!r})\n" for name, data in files.items())
    r = run(ctx, user, cid, code)
    return {a["path"]: a for a in r["artifacts"]}


def check_mode(ctx, mode):
    user = f"d-{mode}"
    key = ctx.key(user)
    data = bytes(range(256)) * 40 + b"end"
    html = "r\u00e9sum\u00e9 \"q\".html"
    arts = produce(ctx, user, "c1", {"data.bin": data, html: b"<script>x</script>",
                                     "pic.svg": b"<svg xmlns='http://www.w3.org/2000/svg'><script>1</script></svg>"})
    a = arts["data.bin"]
    url = f"/v1/artifacts/{a['artifact_id']}/content"
    r = ctx.get(url, key=key)
    eq(r.status, 200, f"{mode}: 200")
    eq(r.body, data, f"{mode}: the exact bytes")
    eq(r.header("Content-Type"), a["mime_type"], f"{mode}: the stored MIME")
    eq(r.header("Content-Length"), str(len(data)), f"{mode}: length")
    eq(r.header("ETag"), f'"{hashlib.sha256(data).hexdigest()}"', f"{mode}: ETag is the sha256")
    eq(r.header("Accept-Ranges"), "bytes", f"{mode}: ranges")
    check(r.header("Last-Modified", ) and r.header("Last-Modified").endswith(" GMT"), "Last-Modified")
    eq(r.header("X-Content-Type-Options"), "nosniff", "nosniff")
    eq(r.header("Content-Security-Policy"), "sandbox; default-src 'none'", "CSP")
    eq(r.header("Cache-Control"), "private", "private")
    eq(r.header("Content-Disposition"),
       "attachment; filename=\"data.bin\"; filename*=UTF-8''data.bin", "disposition")
    eq(len([h for h, _ in r.headers if h.lower() == "etag"]), 1, "one ETag")
    # conditional and ranges
    r = ctx.get(url, key=key, headers={"If-None-Match": a["sha256"].join('""')})
    eq((r.status, r.body), (304, b""), f"{mode}: If-None-Match → 304")
    r = ctx.get(url, key=key, headers={"If-None-Match": '"other", W/"' + a["sha256"] + '"'})
    eq(r.status, 304, "a list with a weak match → 304")
    for rng, lo, hi in [("bytes=0-9", 0, 9), ("bytes=10-", 10, len(data) - 1),
                        ("bytes=-5", len(data) - 5, len(data) - 1),
                        ("bytes=100-99999999", 100, len(data) - 1)]:
        r = ctx.get(url, key=key, headers={"Range": rng})
        eq(r.status, 206, f"{mode}: {rng} → 206")
        eq(r.body, data[lo:hi + 1], f"{mode}: {rng} bytes")
        eq(r.header("Content-Range"), f"bytes {lo}-{hi}/{len(data)}", f"{mode}: {rng} Content-Range")
    r = ctx.get(url, key=key, headers={"Range": f"bytes={len(data) + 10}-"})
    eq(r.status, 416, f"{mode}: unsatisfiable → 416")
    r = ctx.get(url, key=key, headers={"Range": "bytes=0-1,5-6"})
    check(r.status in (200, 206) and (r.status == 200 and r.body == data or r.status == 206),
          f"{mode}: several ranges")
    if mode == "direct":
        eq((r.status, r.body), (200, data), "direct: several ranges → the whole body")
    for junk in ["bytes=abc", "items=0-1", "bytes=5-1", "bytes=--1", "bytes=" + "9" * 40 + "-"]:
        r = ctx.get(url, key=key, headers={"Range": junk})
        check(r.status in (200, 206, 416), f"{mode}: abusive Range {junk!r} handled ({r.status})")
        if r.status == 200:
            eq(r.body, data, "whole body")
    r = ctx.request("HEAD", url, key=key)
    eq((r.status, r.body), (200, b""), f"{mode}: HEAD has no body")
    eq(r.header("Content-Length"), str(len(data)), f"{mode}: HEAD length")
    # never inline
    for name in [html, "pic.svg"]:
        r = ctx.get(f"/v1/artifacts/{arts[name]['artifact_id']}/content", key=key)
        disp = r.header("Content-Disposition")
        check(disp.startswith("attachment;"), f"{name}: attachment")
        eq(r.header("Content-Security-Policy"), "sandbox; default-src 'none'", f"{name}: sandboxed")
        check("\r" not in disp and "\n" not in disp, "no line breaks")
    html_id = arts[html]["artifact_id"]
    disp = ctx.get(f"/v1/artifacts/{html_id}/content", key=key).header("Content-Disposition")
    eq(disp, "attachment; filename=\"r_sum_ q.html\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20q.html",
       "ASCII fallback and RFC 5987 name, quotes gone")
    # authorization: foreign, missing, malformed look the same
    other = ctx.key(f"{user}-other")
    bodies = set()
    for u, k in [(url, other), (f"/v1/artifacts/{new_id()}/content", key),
                 ("/v1/artifacts/nope/content", key)]:
        r = ctx.get(u, key=k)
        expect_error(r, 404, "not_found")
        bodies.add(r.body)
    eq(len(bodies), 1, "404s are indistinguishable")
    expect_error(ctx.get(url), 401, "unauthorized")
    forged = "cx_" + "A" * 43
    for u in (url, "/v1/artifacts/nope/content", url + "?version=abc"):
        expect_error(ctx.get(u, key=forged), 401, "unauthorized")
    expect_error(ctx.get(url + "?version=abc", key=key), 400)
    expect_error(ctx.get(url + "?version=9", key=key), 404)
    # the key is checked on every download: a second key of the owner's
    # works, then not once it is revoked
    def key_ids():
        return {l.split("\t")[0] for l in ctx.admin("key", "list", "--user", user).stdout.splitlines()[1:]}
    before = key_ids()
    second = ctx.st.create_key(user)
    eq(ctx.get(url, key=second).status, 200, "a second key of the owner")
    (new,) = key_ids() - before
    ctx.admin("key", "revoke", new)
    expect_error(ctx.get(url, key=second), 401, "unauthorized")


def test_x_accel(ctx):
    check_mode(ctx, "x-accel")


def test_direct(ctx):
    set_delivery(ctx, "direct")
    try:
        check_mode(ctx, "direct")
        # a larger file streams through FastCGI in chunks
        user = "d-big"
        r = run(ctx, user, "c1", "import os\nopen('big.bin', 'wb').write(os.urandom(20 << 20))", timeout=120)
        a = r["artifacts"][0]
        got = ctx.get(f"/v1/artifacts/{a['artifact_id']}/content", key=ctx.key(user), timeout=120)
        eq(len(got.body), 20 << 20, "20 MiB")
        eq(hashlib.sha256(got.body).hexdigest(), a["sha256"], "intact")
    finally:
        set_delivery(ctx, "x-accel")


def test_versions(ctx):
    user = "d-versions"
    key = ctx.key(user)
    produce(ctx, user, "c1", {"v.txt": b"one"})
    a = produce(ctx, user, "c1", {"v.txt": b"two"})["v.txt"]
    url = f"/v1/artifacts/{a['artifact_id']}/content"
    eq(ctx.get(url, key=key).body, b"two", "current version by default")
    eq(ctx.get(url + "?version=1", key=key).body, b"one", "version 1")
    eq(ctx.get(a["download_url"], key=key).body, b"two", "download_url works")


def set_edge(ctx, on):
    """nginx checking signed links itself (the stack's default), or not."""
    ctx.st.edge_links = on
    ctx.st.write_nginx()
    ctx.st.reload_nginx()


def edge_active(ctx):
    with open(os.path.join(ctx.st.var, "nginx", "nginx.conf")) as f:
        return "codexec-links.conf" in f.read()


def test_signed_links(ctx):
    """Through nginx as the stack runs it: with storage_dir, nginx checks
    the links itself and leaves what it does not accept to codexec."""
    signed_links(ctx, "d-links")


def test_signed_links_checked_by_codexec(ctx):
    """The same rules with every link checked by codexec (Apache, and nginx
    without the link module's location)."""
    set_edge(ctx, False)
    try:
        check(not edge_active(ctx), "nginx leaves links to codexec")
        signed_links(ctx, "d-links-cx")
    finally:
        set_edge(ctx, True)


def signed_links(ctx, user):
    key = ctx.st.create_key(user)
    ctx._keys[(user, False)] = key
    a = produce(ctx, user, "c1", {"l.txt": b"linked"})["l.txt"]
    produce(ctx, user, "c1", {"l.txt": b"linked v2"})
    r = ctx.post(f"/v1/artifacts/{a['artifact_id']}/links", {"version": 1, "expires_in": 600}, key=key)
    eq(r.status, 201, f"link made {r!r}")
    link = r.json()
    check(link["expires_at"].endswith("Z"), "expires_at")
    eq(link["version"], 1, "version")
    r = ctx.get(link["url"])
    eq((r.status, r.body), (200, b"linked"), "works without a key, bound to version 1")
    eq(r.header("Content-Disposition").split(";")[0], "attachment", "still an attachment")
    parts = urllib.parse.urlsplit(link["url"])
    q = dict(urllib.parse.parse_qsl(parts.query))

    def with_query(**changes):
        qq = dict(q, **changes)
        return parts.path + "?" + urllib.parse.urlencode(qq)

    sig = q["sig"]
    # the access log has the link's path, never its query: the signature
    # is a credential until the link expires (docs/web-servers.md)
    def access_log():
        with open(os.path.join(ctx.st.logdir, "nginx-access.log")) as f:
            return f.read()

    # (nginx writes the line once the answer is sent)
    log = wait_until(lambda: (lambda t: t if f"GET {parts.path} HTTP/1.1" in t else None)(
        access_log()), 10, "the download in nginx's access log")
    check(sig not in log and "sig=" not in log, "with no signature")
    tampered = sig[:-2] + ("AA" if sig[-2:] != "AA" else "BB")
    expect_error(ctx.get(with_query(sig=tampered)), 403, "forbidden")
    expect_error(ctx.get(with_query(version="2")), 403, "forbidden")
    expect_error(ctx.get(with_query(exp=str(int(q["exp"]) + 3600))), 403, "forbidden")
    expect_error(ctx.get(with_query(u="someone-else")), 403, "forbidden")
    other = produce(ctx, user, "c1", {"o.txt": b"other"})["o.txt"]
    moved = link["url"].replace(a["artifact_id"], other["artifact_id"])
    expect_error(ctx.get(moved), 403, "forbidden")
    expect_error(ctx.get(with_query(sig="!!!")), 403)
    # expiry
    r = ctx.post(f"/v1/artifacts/{a['artifact_id']}/links", {"expires_in": 1}, key=key)
    short = r.json()
    eq(short["version"], 2, "current version by default")
    time.sleep(2.2)
    expect_error(ctx.get(short["url"]), 410, "expired")
    # clamped to link_max_expiry, and bad input
    r = ctx.post(f"/v1/artifacts/{a['artifact_id']}/links", {"expires_in": 10 ** 9}, key=key)
    eq(r.status, 201, "long expiry clamped")
    expect_error(ctx.post(f"/v1/artifacts/{a['artifact_id']}/links", {"expires_in": "1"}, key=key), 400)
    expect_error(ctx.post(f"/v1/artifacts/{a['artifact_id']}/links", {"version": 0}, key=key), 400)
    expect_error(ctx.post(f"/v1/artifacts/{a['artifact_id']}/links", {"version": 7}, key=key), 404)
    expect_error(ctx.post(f"/v1/artifacts/{a['artifact_id']}/links", {}, key=ctx.key("d-thief")), 404)
    # revoking the key that made the link kills the link
    # (those still active: the suite's S3 pass finds the first pass's revoked)
    ids = [l.split("\t")[0] for l in ctx.admin("key", "list", "--user", user).stdout.splitlines()[1:]
           if l.split("\t")[-1] == "-"]
    for i in ids:
        ctx.admin("key", "revoke", i)
    expect_error(ctx.get(link["url"]), 403, "forbidden")


def all_stopped(pid):
    """Whether every thread of pid is stopped (a SIGSTOP is delivered as
    each returns from the kernel, after kill() has returned)."""
    def state(tid):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return "T"  # gone
    return all(state(t) in ("T", "t") for t in os.listdir(f"/proc/{pid}/task"))


def test_signed_links_at_the_edge(ctx):
    """nginx checks a signed link itself (the link module, nginx/module/) and serves
    the file: codexec-fcgi, stopped meanwhile, is never asked. Every header
    and rule of docs/api.md, "Downloads" holds; revoking the key kills its links within a
    second; whatever the script does not accept still gets codexec's
    answers. nginx holds a key for links only, never the server secret."""
    st = ctx.st
    if ctx.backend == "s3":
        # the store's objects are not files nginx can serve: links go to codexec
        check(not edge_active(ctx), "with storage = s3 the stack leaves links to codexec")
        signed_links(ctx, "d-edge-s3")
        return
    check(edge_active(ctx), "the stack's nginx checks links itself")
    with open(st.link_key_conf) as f:
        conf = f.read()
    with open(st.secret) as f:
        secret = f.read().strip()
    check(re.search(r'^set \$codexec_link_key "[0-9a-f]{64}";$', conf, re.M), "nginx's key line")
    check(secret not in conf, "nginx holds the link key, not the server secret")
    eq(os.stat(st.link_key_conf).st_mode & 0o077, 0, "the key file is its owner's alone")

    user = "d-edge \u00fc+&="  # a name a link must encode: nginx checks it as encoded
    key = st.create_key(user)
    ctx._keys[(user, False)] = key
    data = bytes(range(256)) * 40 + b"edge"
    html = "r\u00e9sum\u00e9 \"q\".html"
    arts = produce(ctx, user, "c1", {"e.bin": data, html: b"<script>x</script>"})
    a = arts["e.bin"]

    def link(aid, k=key, **body):
        r = ctx.post(f"/v1/artifacts/{aid}/links", dict({"expires_in": 600}, **body), key=k)
        eq(r.status, 201, f"link made {r!r}")
        return r.json()["url"]

    url, html_url = link(a["artifact_id"]), link(arts[html]["artifact_id"])
    pid = st.pid("codexec-fcgi")
    os.kill(pid, signal.SIGSTOP)
    try:
        r = ctx.get(url, timeout=10)
        eq((r.status, r.body), (200, data), "served with codexec-fcgi stopped")
        eq(r.header("Content-Type"), a["mime_type"], "the stored MIME")
        eq(r.header("Content-Length"), str(len(data)), "length")
        eq([v for h, v in r.headers if h.lower() == "etag"], [f'"{a["sha256"]}"'],
           "one ETag, the sha256")
        eq(r.header("Accept-Ranges"), "bytes", "ranges")
        eq(len([h for h, _ in r.headers if h.lower() == "last-modified"]), 1, "one Last-Modified")
        check(r.header("Last-Modified").endswith(" GMT"), "Last-Modified")
        eq(r.header("X-Content-Type-Options"), "nosniff", "nosniff")
        eq(r.header("Content-Security-Policy"), "sandbox; default-src 'none'", "CSP")
        eq(r.header("Cache-Control"), "private", "private")
        eq(r.header("Content-Disposition"),
           "attachment; filename=\"e.bin\"; filename*=UTF-8''e.bin", "disposition")
        r = ctx.get(html_url, timeout=10)
        eq(r.header("Content-Disposition"),
           "attachment; filename=\"r_sum_ q.html\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20q.html",
           "codexec's disposition for a hostile name, carried by the link")
        eq(r.header("Content-Security-Policy"), "sandbox; default-src 'none'", "html sandboxed")
        for inm in (f'"{a["sha256"]}"', f'"other", W/"{a["sha256"]}"', "*"):
            r = ctx.get(url, headers={"If-None-Match": inm}, timeout=10)
            eq((r.status, r.body), (304, b""), f"If-None-Match {inm} → 304")
            eq(r.header("ETag"), f'"{a["sha256"]}"', "304 with the ETag")
        eq(ctx.get(url, headers={"If-None-Match": '"other"'}, timeout=10).status, 200,
           "another ETag → 200")
        for rng, lo, hi in [("bytes=0-9", 0, 9), ("bytes=10-", 10, len(data) - 1),
                            ("bytes=-5", len(data) - 5, len(data) - 1)]:
            r = ctx.get(url, headers={"Range": rng}, timeout=10)
            eq((r.status, r.body), (206, data[lo:hi + 1]), f"{rng} → 206")
            eq(r.header("Content-Range"), f"bytes {lo}-{hi}/{len(data)}", f"{rng} Content-Range")
        eq(ctx.get(url, headers={"Range": f"bytes={len(data) + 10}-"}, timeout=10).status, 416,
           "unsatisfiable → 416")
        r = ctx.get(url, headers={"Range": "bytes=0-9", "If-Range": f'"{a["sha256"]}"'}, timeout=10)
        eq((r.status, r.body), (206, data[:10]), "If-Range with the ETag resumes → 206")
        r = ctx.get(url, headers={"Range": "bytes=0-9", "If-Range": '"other"'}, timeout=10)
        eq((r.status, r.body), (200, data), "If-Range with another ETag → the whole body")
        r = ctx.get(url, headers={"Range": "bytes=0-1,5-6"}, timeout=10)
        eq((r.status, r.body), (200, data), "several ranges → the whole body")
        r = ctx.request("HEAD", url, timeout=10)
        eq((r.status, r.body, r.header("Content-Length")), (200, b"", str(len(data))), "HEAD")
    finally:
        os.kill(pid, signal.SIGCONT)

    # what the script does not accept: codexec's answers, as without it
    parts = urllib.parse.urlsplit(url)
    q = dict(urllib.parse.parse_qsl(parts.query))

    def with_query(**changes):
        return parts.path + "?" + urllib.parse.urlencode(dict(q, **changes))

    sig = q["sig"]
    expect_error(ctx.get(with_query(sig=sig[:-2] + ("AA" if sig[-2:] != "AA" else "BB"))), 403,
                 "forbidden")
    expect_error(ctx.get(with_query(version="2")), 403, "forbidden")
    expect_error(ctx.get(with_query(u="someone-else")), 403, "forbidden")
    expect_error(ctx.get(with_query(exp=str(int(q["exp"]) + 3600))), 403, "forbidden")
    # another storage key (a path nginx would serve) in m: the MAC covers it
    meta = base64.urlsafe_b64decode(q["m"] + "=" * (-len(q["m"]) % 4)).decode().split("\n")
    for other in ("artifacts/d-victim/x/v1/secret.txt", "../secret", "/etc/passwd"):
        forged = base64.urlsafe_b64encode("\n".join([other] + meta[1:]).encode()).decode()
        expect_error(ctx.get(with_query(m=forged.rstrip("="))), 403, "forbidden")
    expect_error(ctx.get(with_query(m="")), 403, "forbidden")
    # nginx takes a parameter's first occurrence, whatever its case; codexec
    # the first of its exact name: both check the MAC over what they read
    eq(ctx.get(parts.path + "?" + parts.query + "&sig=" + sig).status, 200,
       "a repeated parameter, the same value")
    eq(ctx.get(parts.path + "?K=" + new_id() + "&" + parts.query).status, 200,
       "another k in capitals first: nginx's MAC fails, codexec's holds")
    expect_error(ctx.get(parts.path + "?k=" + new_id() + "&" + parts.query), 403, "forbidden")
    expect_error(ctx.get(parts.path + "?" + parts.query.replace("k=", "k=../../", 1)), 403,
                 "forbidden")
    r = ctx.post(f"/v1/artifacts/{a['artifact_id']}/links", {"expires_in": 1}, key=key)
    short = r.json()["url"]
    time.sleep(2.2)
    expect_error(ctx.get(short), 410, "expired")
    # a bearer key and no credentials still go to codexec
    eq(ctx.get(parts.path, key=key).body, data, "a key downloads through codexec")
    expect_error(ctx.get(parts.path), 401, "unauthorized")

    # deleting the artifact kills its links (the file is gone: codexec says 404)
    gone = produce(ctx, user, "c1", {"gone.txt": b"soon gone"})["gone.txt"]
    gone_url = link(gone["artifact_id"])
    eq(ctx.get(gone_url).body, b"soon gone", "before the delete")
    eq(ctx.request("DELETE", f"/v1/artifacts/{gone['artifact_id']}", key=key).status, 204, "deleted")
    expect_error(ctx.get(gone_url, headers={"If-None-Match": "*"}), 404, "not_found")
    r = ctx.get(gone_url)
    expect_error(r, 404, "not_found")
    eq([r.header(h) for h in ("Content-Disposition", "ETag")], [None, None],
       "codexec's 404 carries nothing of the file's headers")
    eq(r.header("Cache-Control"), "no-store", "codexec's own Cache-Control, alone")

    # the list must be kept for nginx to serve: without .listed, codexec
    listed = os.path.join(st.revoked, ".listed")
    check(os.path.exists(listed), "codexec keeps the list")
    # stopped first, every thread of it, then the list moved away: a sync
    # under way would make .listed again (found: once in CI, nginx served)
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: all_stopped(pid), 10, "codexec-fcgi stopped")
        os.rename(listed, listed + ".away")
        try:
            ctx.get(url, timeout=2)
            served = True
        except Exception:  # waiting for the stopped codexec-fcgi: not served by nginx
            served = False
        finally:
            os.rename(listed + ".away", listed)
    finally:
        os.kill(pid, signal.SIGCONT)
    check(not served, "a list nobody keeps: nginx serves no link")

    # revoking a key kills the links it made, at the edge
    def key_ids():
        return {l.split("\t")[0] for l in ctx.admin("key", "list", "--user", user).stdout.splitlines()[1:]}

    def new_key():
        before = key_ids()
        k = st.create_key(user)
        (kid,) = key_ids() - before
        u = link(a["artifact_id"], k=k)
        eq(ctx.get(u).status, 200, "a link of another key")
        return kid, u

    # the operator's command lists the key itself: at once, even with
    # codexec-fcgi stopped
    kid, url2 = new_key()
    os.kill(pid, signal.SIGSTOP)
    try:
        ctx.admin("key", "revoke", kid)
        check(os.path.exists(os.path.join(st.revoked, kid)), "listed by codexec-admin")
    finally:
        os.kill(pid, signal.SIGCONT)
    expect_error(ctx.get(url2), 403, "forbidden")
    # revoked elsewhere (another node's database client): codexec-fcgi hears
    # it from PostgreSQL and lists it within a second
    kid, url3 = new_key()
    ctx.psql(f"UPDATE api_keys SET revoked_at = now() WHERE id = '{kid}'")
    t0 = time.monotonic()
    while True:
        r = ctx.get(url3)
        took = time.monotonic() - t0
        if r.status != 200 or took > 5:
            break
        time.sleep(0.02)
    print(f"# the revoked key's link refused {took * 1000:.0f} ms after the revoke's COMMIT")
    expect_error(r, 403, "forbidden")
    check(took < 1.0, f"within a second ({took:.2f} s)")
    check(os.path.exists(os.path.join(st.revoked, kid)), "the key is in the revocation list")
    eq(ctx.get(url).status, 200, "the first key's link still works")


def test_link_module_hostile(ctx):
    """Links signed with nginx's own key but carrying what codexec never
    signs (a storage key out of storage_dir, header bytes, a malformed
    expiry, sha256 or key id) are refused by the link module, a second line
    behind the MAC, and go to codexec; garbage in every parameter never
    takes an nginx worker down."""
    import hmac
    import random
    st = ctx.st
    if ctx.backend == "s3":
        check(not edge_active(ctx), "with storage = s3 the stack leaves links to codexec")
        return
    with open(st.link_key_conf) as f:
        lkey = re.search(r'"([0-9a-f]{64})"', f.read()).group(1).encode()
    user = "d-edge-hostile"
    key = ctx.key(user)
    a = produce(ctx, user, "c1", {"h.txt": b"the real file"})["h.txt"]
    outside = os.path.join(st.var, "outside.txt")
    with open(outside, "w") as f:
        f.write("not for links")
    os.chmod(outside, 0o644)
    r = ctx.post(f"/v1/artifacts/{a['artifact_id']}/links", {"expires_in": 600}, key=key)
    eq(r.status, 201, f"link made {r!r}")
    parts = urllib.parse.urlsplit(r.json()["url"])
    q = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    meta = base64.urlsafe_b64decode(q["m"] + "=" * (-len(q["m"]) % 4)).decode().split("\n")
    b64 = lambda b: base64.urlsafe_b64encode(b).decode().rstrip("=")

    def forged(m=None, **changes):
        f = dict(q, **changes)
        if m is not None:
            f["m"] = b64("\n".join(m).encode())
        msg = "\n".join(["codexec-link-v2", f["u"], a["artifact_id"], f["version"], f["exp"], f["k"],
                         f["m"]])
        f["sig"] = b64(hmac.new(lkey, msg.encode(), hashlib.sha256).digest())
        return parts.path + "?" + "&".join(f"{n}={f[n]}" for n in ("version", "u", "k", "exp", "m", "sig"))

    pid = st.pid("codexec-fcgi")
    os.kill(pid, signal.SIGSTOP)
    try:
        r = ctx.get(forged(), timeout=10)
        eq((r.status, r.body), (200, b"the real file"), "a link signed here is served by nginx")
    finally:
        os.kill(pid, signal.SIGCONT)
    rel = os.path.relpath(outside, st.storage)
    hostile = [
        forged(m=[rel] + meta[1:]), forged(m=["/" + rel] + meta[1:]),
        forged(m=[meta[0] + "/../../" + rel] + meta[1:]), forged(m=["./" + meta[0]] + meta[1:]),
        forged(m=[meta[0].replace("/", "//", 1)] + meta[1:]), forged(m=[outside] + meta[1:]),
        forged(m=["%2e%2e/" + rel] + meta[1:]), forged(m=[meta[0] + "\x00x"] + meta[1:]),
        forged(m=[meta[0], "text/html\r\nSet-Cookie: x=1"] + meta[2:]),
        forged(m=meta[:3] + ["attachment\rSet-Cookie: x=1"]),
        forged(m=meta[:2] + ["z" * 64, meta[3]]), forged(m=meta[:2] + [meta[2][:63], meta[3]]),
        forged(m=meta + ["extra"]), forged(m=meta[:3]), forged(m=[meta[0], ""] + meta[2:]),
        forged(exp="1e12"), forged(exp="+99999999999"), forged(exp="9" * 30), forged(exp="-1"),
        forged(k="../../" + rel), forged(k=q["k"].upper()), forged(k="x" * 36),
    ]
    for url in hostile:
        r = ctx.get(url, timeout=30)
        check(b"not for links" not in r.body, f"nothing from outside storage_dir: {url}")
        check(r.header("Set-Cookie") is None, f"no header smuggled in: {url}")
        check(r.status != 200 or r.body == b"the real file", f"{url}: {r.status} {r.body[:80]!r}")
    # garbage: every parameter random bytes, sometimes long, in any order
    rng = random.Random(11)
    names = ["version", "u", "k", "exp", "m", "sig", "K", "M", "x"]
    for _ in range(300):
        ps = []
        for n in rng.sample(names, rng.randint(1, len(names))):
            v = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 8, 43, 64, 300, 3000])))
            ps.append(n + "=" + urllib.parse.quote(v, safe=rng.choice(["", "/=&%"])))
        try:
            ctx.get(parts.path + "?" + "&".join(ps), timeout=30)
        except OSError:
            pass  # (an answer nginx refused to read: not the point)
    with open(os.path.join(st.logdir, "nginx-error.log")) as f:
        log = f.read()
    check("exited on signal" not in log, "no nginx worker died")
    eq(ctx.get(forged()).body, b"the real file", "and links are still served")
    # an error of the module's names the request without its query: the
    # signature is a credential (the stored file, briefly, a directory)
    url = forged(exp=str(int(q["exp"]) - 1))
    sig = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))["sig"]
    stored = os.path.join(st.storage, meta[0])
    os.rename(stored, stored + ".away")
    os.mkdir(stored)
    try:
        ctx.get(url, timeout=30)
    finally:
        os.rmdir(stored)
        os.rename(stored + ".away", stored)

    def error_log():
        with open(os.path.join(st.logdir, "nginx-error.log")) as f:
            return f.read()

    log = wait_until(lambda: (lambda t: t if "not a regular file" in t else None)(error_log()), 10,
                     "the module's error in nginx's error log")
    line = [l for l in log.splitlines() if "not a regular file" in l][-1]
    check(f'request: "GET {parts.path}"' in line, f"the error names the request's path: {line}")
    check(sig not in log and "sig=" not in line, f"never the signature: {line}")
    eq(ctx.get(url).body, b"the real file", "the file back, the link served")


def test_download_cache_across_processes(ctx):
    """Downloads by key are answered from each process's cache
    (download_cache_entries), and a change made anywhere reaches every
    process within a second: a revoked key, a deleted artifact, a new
    version. Two codexec-fcgi besides the stack's, sharing its database."""
    import subprocess
    user = "d-cache"
    key = ctx.st.create_key(user)
    ctx._keys[(user, False)] = key
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    a = produce(ctx, user, "c1", {"c.txt": b"cached v1", "gone.txt": b"to delete"})
    url = f"/v1/artifacts/{a['c.txt']['artifact_id']}/content"
    gone = f"/v1/artifacts/{a['gone.txt']['artifact_id']}"
    procs = [ctx.spawn_fcgi(f"cache-{n}", {"delivery": "direct"}) for n in ("a", "b")]
    (sock_a, _), (sock_b, _) = procs

    def get(sock, uri, params=auth):
        status, _, body = fcgi_client.request(sock, "GET", uri, params=params)
        return status, body

    def hits(sock):
        status, _, body = fcgi_client.request(sock, "GET", "/metrics",
                                              params={"REMOTE_ADDR": "127.0.0.1"})
        eq(status, 200, "metrics")
        m = re.search(r"^codexec_download_cache_hits_total (\d+)$", body.decode(), re.M)
        return int(m.group(1))

    def within_a_second(sock, uri, want, what):
        """want: a status, or (status, body)."""
        t0 = time.monotonic()
        while True:
            got = get(sock, uri)
            took = time.monotonic() - t0
            if (got if isinstance(want, tuple) else got[0]) == want or took > 5:
                break
            time.sleep(0.02)
        print(f"# {what}: {got[0]} after {took * 1000:.0f} ms")
        eq(got if isinstance(want, tuple) else got[0], want, what)
        check(took < 1.0, f"{what} within a second ({took:.2f} s)")

    try:
        for sock in (sock_a, sock_b):
            wait_until(lambda: get(sock, url) == (200, b"cached v1"), 20, "the process serves")
        # the cache answers once the process hears the changes (its watcher
        # LISTENs), a moment after it serves: a download then is a hit
        def heard(sock):
            n = hits(sock)
            get(sock, url)  # kept, once the cache is live
            get(sock, url)  # ... and answered from it
            return hits(sock) > n
        for sock in (sock_a, sock_b):
            wait_until(lambda: heard(sock), 20, "the process's cache is live")
        before = hits(sock_b)
        for _ in range(5):
            eq(get(sock_b, url), (200, b"cached v1"), "the same download again")
        check(hits(sock_b) >= before + 5, "answered from the cache")
        # a new version, made by the stack's process: everyone serves it
        produce(ctx, user, "c1", {"c.txt": b"cached v2"})
        within_a_second(sock_b, url, (200, b"cached v2"), "the new version in b")
        within_a_second(sock_a, url, (200, b"cached v2"), "the new version in a")
        eq(get(sock_b, url + "?version=1")[1], b"cached v1", "version 1 as asked")
        # deleted through process a: process b answers 404
        eq(get(sock_b, gone + "/content"), (200, b"to delete"), "cached in b")
        status, _, _ = fcgi_client.request(sock_a, "DELETE", gone, params=auth)
        eq(status, 204, "deleted through a")
        within_a_second(sock_b, gone + "/content", 404, "the deleted artifact in b")
        # revoked by the operator's command: both refuse the key
        eq(get(sock_a, url)[0], 200, "cached in a")
        ids = [l.split("\t")[0] for l in ctx.admin("key", "list", "--user", user).stdout.splitlines()[1:]
               if l.split("\t")[-1] == "-"]
        for i in ids:
            ctx.admin("key", "revoke", i)
        within_a_second(sock_b, url, 401, "the revoked key in b")
        within_a_second(sock_a, url, 401, "the revoked key in a")
    finally:
        for _, proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def sparse_artifact(ctx, user, size):
    """A fixture: zeros at the derived key with its rows, as a run would
    have left them (a 1 GiB capture would take minutes here): a sparse
    file, or an object sent in parts by botocore."""
    st = ctx.st
    aid = new_id()
    key = f"artifacts/{user}/{aid}/v1/big.bin"
    h = hashlib.sha256()
    zeros = bytes(1 << 20)
    for _ in range(size >> 20):
        h.update(zeros)
    if ctx.backend == "s3":
        import stack
        s3, part = ctx.s3(), bytes(32 << 20)
        up = s3.create_multipart_upload(Bucket=stack.S3_BUCKET, Key=stack.S3_PREFIX + key)
        parts = [{"PartNumber": i + 1, "ETag": s3.upload_part(
            Bucket=stack.S3_BUCKET, Key=stack.S3_PREFIX + key, UploadId=up["UploadId"],
            PartNumber=i + 1, Body=part)["ETag"]} for i in range(size // len(part))]
        s3.complete_multipart_upload(Bucket=stack.S3_BUCKET, Key=stack.S3_PREFIX + key,
                                     UploadId=up["UploadId"], MultipartUpload={"Parts": parts})
    else:
        path = os.path.join(st.storage, key)
        os.makedirs(os.path.dirname(path))
        with open(path, "wb") as f:
            f.truncate(size)
        for d in [path, os.path.dirname(path), os.path.dirname(os.path.dirname(path)),
                  os.path.dirname(os.path.dirname(os.path.dirname(path)))]:
            st.chown(d)
    ctx.psql(f"INSERT INTO artifacts (id, user_id, conversation_id, path, kind, current_version)"
             f" VALUES ('{aid}', '{user}', 'c1', 'big.bin', 'file', 1);"
             f"INSERT INTO artifact_versions (artifact_id, version, filename, mime_type, size, sha256,"
             f" storage_key, produced_by) VALUES ('{aid}', 1, 'big.bin', 'application/octet-stream',"
             f" {size}, '{h.hexdigest()}', '{key}', '{{}}')")
    return aid, h.hexdigest()


def test_direct_1gib_in_bounded_memory_and_slow_clients(ctx):
    import socket
    import threading
    user = "d-huge"
    # (from the test object store: 256 MiB, its disk and the signature
    # check in front of it are slower than a sparse file)
    size = 1 << 30 if ctx.backend == "local" else 256 << 20
    aid, digest = sparse_artifact(ctx, user, size)
    set_delivery(ctx, "direct")
    try:
        pid = ctx.st.pid("codexec-fcgi")
        # (codexec-fcgi just started again: its first gateway probe, the
        # memory report's included, and its connections are made by now)
        ctx.get("/v1/health")
        time.sleep(3)
        before = rss_kib(pid)
        h = hashlib.sha256()
        n = 0
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", ctx.st.http_port, timeout=300)
        conn.request("GET", f"/v1/artifacts/{aid}/content",
                     headers={"Authorization": f"Bearer {ctx.key(user)}"})
        resp = conn.getresponse()
        eq(resp.status, 200, f"{size >> 20} MiB download")
        peak = before
        while True:
            chunk = resp.read(1 << 20)
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
            if n % (64 << 20) == 0:
                peak = max(peak, rss_kib(pid))
        conn.close()
        peak = max(peak, rss_kib(pid))
        eq(n, size, "every byte")
        eq(h.hexdigest(), digest, "intact")
        print(f"# codexec-fcgi RSS {before} KiB before, {peak} KiB peak during a {size >> 20} MiB"
              f" download ({ctx.backend})")
        check(peak - before < 8 * 1024, f"worker memory grew by {peak - before} KiB (< 8 MiB)")

        # A client that reads one byte a second holds no worker: nginx buffers.
        slow = socket.create_connection(("127.0.0.1", ctx.st.http_port))
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.sendall(f"GET /v1/artifacts/{aid}/content HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: Bearer {ctx.key(user)}\r\n\r\n".encode())
        slow.recv(1)
        small = produce(ctx, user, "c2", {"s.txt": b"small"})["s.txt"]
        results = []

        def fetch():
            r = ctx.get(f"/v1/artifacts/{small['artifact_id']}/content", key=ctx.key(user), timeout=30)
            results.append((r.status, r.body))

        threads = [threading.Thread(target=fetch) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        slow.recv(1)
        eq(results, [(200, b"small")] * 8, "other downloads went on while the slow client lingered")
        slow.close()
    finally:
        set_delivery(ctx, "x-accel")


def test_remote_user_is_trusted_only_when_configured(ctx):
    """REMOTE_USER from the web server names the user only with
    trust_remote_user = true; otherwise it is ignored, whatever it says."""
    st = ctx.st
    user = "d-remote"
    a = produce(ctx, user, "c1", {"r.txt": b"remote"})["r.txt"]
    uri = f"/v1/artifacts/{a['artifact_id']}/content"
    # the stack's own process does not trust it
    authed = {"AUTH_TYPE": "Basic"}  # what a web server that authenticated adds
    status, _, _ = fcgi_client.request(st.socket, "GET", uri, params={"REMOTE_USER": user, **authed})
    eq(status, 401, "REMOTE_USER ignored when not trusted")
    path, proc = ctx.spawn_fcgi("remote", {"delivery": "direct", "trust_remote_user": "true"})
    try:
        status, _, body = fcgi_client.request(path, "GET", uri, params={"REMOTE_USER": user, **authed})
        eq((status, body), (200, b"remote"), "the trusted user downloads")
        status, _, _ = fcgi_client.request(path, "GET", uri, params={"REMOTE_USER": user})
        eq(status, 401, "not without AUTH_TYPE: nginx fills REMOTE_USER from any Basic header")
        status, _, _ = fcgi_client.request(path, "GET", uri,
                                           params={"REMOTE_USER": "d-intruder", **authed})
        eq(status, 404, "another trusted user does not")
        status, _, _ = fcgi_client.request(path, "GET", uri,
                                           params={"REMOTE_USER": "bad\u0001name", **authed})
        eq(status, 401, "a REMOTE_USER with control characters is refused")
        status, _, body = fcgi_client.request(
            path, "GET", uri, params={"HTTP_AUTHORIZATION": f"Bearer {ctx.key(user)}"})
        eq((status, body), (200, b"remote"), "without REMOTE_USER, the key decides")
    finally:
        proc.send_signal(signal.SIGTERM)
        eq(proc.wait(timeout=20), 0, "clean exit on SIGTERM")
