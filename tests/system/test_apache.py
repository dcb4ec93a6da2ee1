"""codexec behind real Apache httpd (mod_proxy_fcgi + mod_xsendfile), with
delivery = x-sendfile: packaging/apache/codexec.conf as operators use it."""

import os
import shutil
import signal
import subprocess

import stack
from harness import check, eq, wait_until
import test_downloads
import test_files
import test_mcp
import test_detached
import test_stream

MODULES = "/usr/lib/apache2/modules"


def start_apache(ctx):
    st = ctx.st
    port = stack.free_port()
    sock = os.path.join(st.rundir, "codexec-apache.sock")
    conf = os.path.join(st.var, "codexec-xsendfile.conf")
    with open(st.conf) as f:
        text = "".join(l for l in f if not l.startswith(("listen ", "delivery ")))
    with open(conf, "w") as f:
        f.write(text + f"listen = unix:{sock}\ndelivery = x-sendfile\n")
    os.chmod(conf, 0o640)
    st.chown(conf)
    fcgi = subprocess.Popen(st.as_user() + [os.path.join(st.bin, "codexec-fcgi"), "--config", conf,
                                            "--workers", "4"],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(st.logdir, "codexec-apache-fcgi.log"), "ab"),
                            env=dict(os.environ))
    adir = os.path.join(st.var, "apache")
    os.makedirs(adir, exist_ok=True)
    st.chown(adir)
    # Apache runs as the stack's user, which may not be able to enter the
    # checkout (a clone inside a mktemp -d directory): it reads a copy.
    site = os.path.join(adir, "codexec.conf")
    shutil.copyfile(os.path.join(stack.REPO, "packaging", "apache", "codexec.conf"), site)
    os.chmod(site, 0o644)
    # the web server's key, as the package writes it (root's there; Apache
    # runs as the stack's user here)
    web_key = os.path.join(adir, "web-key.conf")
    st.write_file(web_key, st.run([st.admin, "--config", st.conf, "web-server-key", "--apache"],
                                  user="root").stdout, 0o600)
    st.make_log("apache-error.log")
    st.make_log("apache-access.log")
    httpd = os.path.join(adir, "httpd.conf")
    mods = ["mpm_event", "authz_core", "env", "proxy", "proxy_fcgi", "xsendfile"]
    with open(httpd, "w") as f:
        f.write("".join(f"LoadModule {m}_module {MODULES}/mod_{m}.so\n" for m in mods))
        f.write(f"""ServerName localhost
Listen 127.0.0.1:{port}
PidFile {adir}/httpd.pid
DefaultRuntimeDir {adir}
Mutex file:{adir} default
ErrorLog {st.logdir}/apache-error.log
CustomLog {st.logdir}/apache-access.log codexec
LogLevel warn
Define CODEXEC_SOCKET {sock}
Define CODEXEC_STORAGE {st.storage}
Define CODEXEC_WEB_KEY {web_key}
Include {site}
""")
    wait_until(lambda: os.path.exists(sock), 20, "the second codexec-fcgi")
    proc = subprocess.Popen(st.as_user() + ["/usr/sbin/apache2", "-f", httpd, "-DFOREGROUND"],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(st.logdir, "apache.log"), "ab"),
                            env={"PATH": "/usr/bin:/bin", "APACHE_RUN_DIR": adir, "LANG": "C"})
    wait_until(lambda: stack.port_open(port), 20, "Apache")
    return port, fcgi, proc


def test_downloads_through_apache_with_x_sendfile(ctx):
    port, fcgi, httpd = start_apache(ctx)
    try:
        ctx.port_override = port
        r = ctx.get("/v1/health")
        eq(r.status, 200, f"health through Apache {r!r}")
        test_downloads.check_mode(ctx, "x-sendfile")
        # a signed link through Apache
        user = "d-x-sendfile"
        a = test_downloads.produce(ctx, user, "c2", {"s.txt": b"via apache"})["s.txt"]
        link = ctx.post(f"/v1/artifacts/{a['artifact_id']}/links", {}, key=ctx.key(user)).json()
        r = ctx.get(link["url"])
        eq((r.status, r.body), (200, b"via apache"), "signed link through Apache")
        # codexec.conf's LogFormat: the path, never the link's signature
        path, _, query = link["url"].partition("?")

        def access_log():
            with open(os.path.join(ctx.st.logdir, "apache-access.log")) as f:
                return f.read()

        # (Apache writes the line once the answer is sent)
        log = wait_until(lambda: (lambda t: t if f"GET {path} HTTP/1.1" in t else None)(
            access_log()), 10, "the link's download in Apache's access log")
        check(query and query not in log and "sig=" not in log,
              "Apache's access log has the link's path, not its signature")
        check(r.header("X-Sendfile") is None, "the X-Sendfile header never reaches the client")
    finally:
        ctx.port_override = None
        httpd.send_signal(signal.SIGTERM)
        fcgi.send_signal(signal.SIGTERM)
        httpd.wait(timeout=20)
        fcgi.wait(timeout=20)


def test_streaming_run_through_apache(ctx):
    """packaging/apache/codexec.conf's flushpackets=on: a streaming run's
    events pass through Apache as they are written."""
    port, fcgi, httpd = start_apache(ctx)
    try:
        ta, tb = test_stream.timed_a_then_b(ctx, port=port)
        print(f"# through Apache: a after {ta * 1000:.0f} ms, b after {tb * 1000:.0f} ms")
    finally:
        httpd.send_signal(signal.SIGTERM)
        fcgi.send_signal(signal.SIGTERM)
        httpd.wait(timeout=20)
        fcgi.wait(timeout=20)


def test_run_events_through_apache(ctx):
    """A detached run's GET /v1/runs/{id}/events passes through Apache as
    it is written, as a streaming run's answer does."""
    port, fcgi, httpd = start_apache(ctx)
    try:
        first, end = test_detached.live_events(ctx, port=port)
        print(f"# through Apache: first output after {first * 1000:.0f} ms, result after "
              f"{end * 1000:.0f} ms")
    finally:
        httpd.send_signal(signal.SIGTERM)
        fcgi.send_signal(signal.SIGTERM)
        httpd.wait(timeout=20)
        fcgi.wait(timeout=20)


def test_files_through_apache(ctx):
    """A conversation's files through Apache: a body streamed in and out,
    and a 4079-byte path percent-encoded to 12 KiB (LimitRequestLine)."""
    port, fcgi, httpd = start_apache(ctx)
    try:
        cid, key = "apache-files", ctx.key("u-apache-files")
        data = os.urandom(5 << 20)
        for path in ("data/in.bin", test_files.wide_path()):
            r = ctx.request("PUT", test_files.files_url(cid, path), body=data, key=key, port=port,
                            headers={"Content-Type": "application/octet-stream"}, timeout=300)
            eq(r.status, 201, f"PUT through Apache: {r!r}")
            r = ctx.request("GET", test_files.files_url(cid, path), key=key, port=port, timeout=300)
            eq(r.status, 200, f"GET through Apache: {r!r}")
            check(r.body == data, "the bytes read back through Apache are the bytes written")
    finally:
        httpd.send_signal(signal.SIGTERM)
        fcgi.send_signal(signal.SIGTERM)
        httpd.wait(timeout=20)
        fcgi.wait(timeout=20)


def test_mcp_through_apache(ctx):
    """The MCP SDK's client through Apache: the same flow as through nginx,
    progress notifications arriving before the run ends included."""
    port, fcgi, httpd = start_apache(ctx)
    try:
        user = "u-mcp-apache"
        o = test_mcp.sdk(ctx, "flow", ctx.key(user), port=port)
        sid = test_mcp.check_flow(ctx, o, user)
        test_mcp.check_live(ctx, o, user, sid)
    finally:
        httpd.send_signal(signal.SIGTERM)
        fcgi.send_signal(signal.SIGTERM)
        httpd.wait(timeout=20)
        fcgi.wait(timeout=20)


def test_slow_request_bodies_hold_a_share_of_the_threads(ctx):
    """Apache passes a request body to codexec as it arrives (nginx buffers
    it first): uploads whose bodies come slowly hold request threads. One
    user's hold at most a quarter of them (here 1 of 4) and all users' half:
    codexec refuses the user's others at once (Apache tells their clients
    once they have sent their bodies), and health checks and another user's
    upload are answered meanwhile. Without the limit four slow uploads held
    all four threads, and a health check got no answer."""
    import socket
    port, fcgi, httpd = start_apache(ctx)
    socks = []
    try:
        key = ctx.key("u-apache-slow")
        body = b"s" * 100000
        before = ctx.log_text().count("POST artifacts_upload 503")
        for i in range(4):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall((f"POST /v1/artifacts?conversation_id=slow&filename=f{i}.bin HTTP/1.1\r\n"
                       f"Host: localhost\r\nAuthorization: Bearer {key}\r\n"
                       f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
                       "\r\n").encode() + body[:10])
            socks.append(s)
        wait_until(lambda: ctx.log_text().count("POST artifacts_upload 503") - before == 3, 30,
                   "codexec refusing three of the four slow uploads before their bodies")
        r = ctx.request("GET", "/v1/health", port=port, timeout=30)
        eq(r.status, 200, "a health check is answered while a slow body holds a thread")
        r = ctx.request("POST", "/v1/artifacts?conversation_id=fast&filename=x.txt", body=b"quick",
                        key=ctx.key("u-apache-fast"), port=port, timeout=30,
                        headers={"Content-Type": "application/octet-stream"})
        eq(r.status, 201, f"another user's upload is answered: {r!r}")
        heads = []
        for s in socks:
            s.settimeout(60)
            try:
                s.sendall(body[10:])
            except OSError:
                pass  # (Apache may stop reading a refused one)
            heads.append(s.recv(65536).split(b"\r\n", 1)[0])
        eq(sorted(heads), [b"HTTP/1.1 201 Created"] + [b"HTTP/1.1 503 Service Unavailable"] * 3,
           "the one upload with a thread stored once whole, the others refused")
    finally:
        for s in socks:
            s.close()
        httpd.send_signal(signal.SIGTERM)
        fcgi.send_signal(signal.SIGTERM)
        httpd.wait(timeout=20)
        fcgi.wait(timeout=20)
