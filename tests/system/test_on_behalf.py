"""Acting for end users (SPEC §10.4): one service key, its platform's users
apart from each other, each with the limits of a user of its own."""

from harness import check, eq, expect_error, new_id


def service_key(ctx, user="svc-obo"):
    if (user, "obo") not in ctx._keys:
        ctx._keys[(user, "obo")] = ctx.admin("key", "create", "--user", user,
                                             "--on-behalf").stdout.strip()
    return ctx._keys[(user, "obo")]


def as_(ctx, end_user, method, path, body=None, **kw):
    h = dict(kw.pop("headers", {}) or {})
    h["On-Behalf-Of"] = end_user
    return ctx.request(method, path, body=body, key=service_key(ctx), headers=h, **kw)


def test_end_users_are_apart(ctx):
    cid = "obo-" + new_id()
    r = as_(ctx, "alice@example.org", "POST", "/v1/runs",
            {"conversation_id": cid, "code": "x = 'alice'\nopen('a.txt', 'w').write(x)"})
    eq(r.status, 200, f"alice's run {r!r}")
    art = r.json()["artifacts"][0]
    r = as_(ctx, "bob", "POST", "/v1/runs", {"conversation_id": cid, "code": "print(globals().get('x'))"})
    eq(r.json()["stdout_tail"], "None\n", "bob's conversation of the same id is another")
    eq(r.json()["session"]["created"], True, "his own session")
    # alice's things are 404 to bob and to the service key itself
    for who in ("bob", None):
        hdr = {"On-Behalf-Of": who} if who else {}
        key = service_key(ctx)
        expect_error(ctx.request("GET", f"/v1/artifacts/{art['artifact_id']}", key=key, headers=hdr),
                     404, "not_found")
        expect_error(ctx.request("GET", f"/v1/artifacts/{art['artifact_id']}/content", key=key,
                                 headers=hdr), 404)
        expect_error(ctx.request("GET", f"/v1/conversations/{cid}/files/a.txt", key=key, headers=hdr),
                     404, "not_found")
    ok = as_(ctx, "alice@example.org", "GET", f"/v1/artifacts/{art['artifact_id']}/content")
    eq((ok.status, ok.body), (200, b"alice"), "alice downloads hers")
    eq(as_(ctx, "alice@example.org", "GET", f"/v1/conversations/{cid}/files/a.txt").body, b"alice",
       "and reads her file")
    # a link made for alice works without any key, and stays hers
    link = as_(ctx, "alice@example.org", "POST", f"/v1/artifacts/{art['artifact_id']}/links", {})
    eq(link.status, 201, f"link {link!r}")
    got = ctx.get(link.json()["url"])
    eq((got.status, got.body), (200, b"alice"), "the signed link")
    listed = as_(ctx, "bob", "GET", "/v1/conversations").json()["conversations"]
    eq([c["conversation_id"] for c in listed], [cid], "bob lists his own session only")


def test_limits_are_per_end_user(ctx):
    """max_sessions_per_user (4 in the suite) counts each end user alone."""
    for i in range(4):
        r = as_(ctx, "carol", "POST", f"/v1/conversations/obo-c{i}/session", {})
        eq(r.status, 201, f"carol's session {i}")
    r = as_(ctx, "dave", "POST", "/v1/conversations/obo-d0/session", {})
    eq(r.status, 201, "dave is not held to carol's sessions")
    eq(ctx.psql("SELECT count(*) FROM sessions WHERE user_id = 'svc-obo:carol'"), "4",
       "carol's sessions are svc-obo:carol's")


def test_refusals(ctx):
    cid = "obo-" + new_id()
    plain = ctx.key("u-not-obo")
    expect_error(ctx.request("POST", "/v1/runs", {"conversation_id": cid, "code": "1"}, key=plain,
                             headers={"On-Behalf-Of": "alice"}), 403, "forbidden")
    expect_error(ctx.request("GET", "/v1/conversations", key=plain,
                             headers={"On-Behalf-Of": "alice"}), 403, "forbidden")
    for bad in ("", "a b", "x" * 129, "é", "a/b", "a\tb"):
        r = as_(ctx, bad, "GET", "/v1/conversations")
        if bad == "":
            # an empty header is no header to some clients and servers
            check(r.status in (200, 400), f"empty: {r!r}")
            continue
        expect_error(r, 400, "invalid_request")
    r = ctx.request("GET", "/v1/conversations", key=service_key(ctx))
    eq(r.status, 200, "the service key without the header is its own user")
    expect_error(ctx.request("GET", "/v1/conversations", headers={"On-Behalf-Of": "alice"}), 401,
                 "unauthorized")
    # "svc:a" acting for "b" would be "svc" acting for "a:b"
    r = ctx.admin("key", "create", "--user", "svc:a", "--on-behalf", check=False)
    check(r.returncode == 2 and "':'" in r.stderr and not r.stdout.strip(),
          f"an on-behalf key for a user with ':' refused: {r.returncode} {r.stderr!r}")
