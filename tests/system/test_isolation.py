"""A tenant's code can't touch the server, another tenant or the machine.

Each test reproduces an attack through the real HTTP surface (or as the
gateway's own user, for what an escape would reach) and shows it refused,
while another tenant's runs in the same seconds succeed."""

import json
import os
import subprocess
import threading
import time

from harness import check, eq, expect_error, new_id
from test_runs import run


class Bystander:
    """Another tenant running trivial code in a loop while an attack runs."""

    def __init__(self, ctx, name):
        self.ctx, self.user, self.cid = ctx, f"bystander-{name}", new_id()
        self.results, self.stop = [], threading.Event()
        run(ctx, self.user, self.cid, "x = 0")  # its kernel is up before the attack
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        i = 0
        while not self.stop.is_set():
            i += 1
            t0 = time.monotonic()
            r = self.ctx.post("/v1/runs", {"conversation_id": self.cid, "code": f"x += 1\nprint({i})"},
                              key=self.ctx.key(self.user), timeout=120)
            ok = r.status == 200 and r.json().get("stdout_tail") == f"{i}\n"
            self.results.append((ok, time.monotonic() - t0, r.status))
            time.sleep(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=180)
        if exc[0] is None:
            bad = [r for r in self.results if not r[0]]
            check(len(self.results) >= 2, f"the other tenant ran during the attack: {self.results}")
            eq(bad, [], "every run of the other tenant succeeded")
        return False


def attack(ctx, user, code, **kw):
    return run(ctx, user, new_id(), code, timeout=kw.pop("timeout", 60), **kw)


def next_run_works(ctx, user, cid):
    r = run(ctx, user, cid, "print('again')")
    eq((r["status"], r["stdout_tail"]), ("ok", "again\n"), f"the session works again: {r!r}")
    return r


# --- the launcher never writes through a path the kernel could change -----

PLANT = r'''
import json, os, ipykernel
cf = ipykernel.get_connection_file()
r = {"inside": cf}
def attempt(name, fn):
    try:
        fn()
        r[name] = "done"
    except OSError as e:
        r[name] = type(e).__name__
attempt("replace_connection_file", lambda: (os.unlink(cf), os.symlink(VICTIM, cf)))
attempt("plant_in_private_dir", lambda: os.symlink(VICTIM, os.path.join(os.path.dirname(cf), "x")))
attempt("replace_socket", lambda: os.rename(os.path.join(os.path.dirname(cf), os.listdir(os.path.dirname(cf))[0]), "/tmp/s"))
print(json.dumps(r))
'''


def test_symlink_then_die_writes_nothing(ctx):
    """The kernel plants a symlink where the launcher used to copy the
    connection file, then dies; the restart's launcher must not write
    through it (finding 1)."""
    st = ctx.st
    victim = os.path.join(st.jdir, "home", "victim.txt")  # the gateway's user's own file
    with open(victim, "w") as f:
        f.write("untouched\n")
    st.chown_kernel(victim)
    before = os.stat(victim)
    user, cid = "iso-plant", new_id()
    r = run(ctx, user, cid, f"VICTIM = {victim!r}\n" + PLANT)
    eq(r["status"], "ok", f"{r!r}")
    p = json.loads(r["stdout_tail"].strip().splitlines()[-1])
    for what in ("replace_connection_file", "plant_in_private_dir", "replace_socket"):
        check(p[what] != "done", f"{what} must fail inside the sandbox: {p}")
    r = run(ctx, user, cid, "import os\nos._exit(1)")
    eq((r.get("error_name"), r["session"]["reset"]), ("KernelDied", True),
       f"the kernel died, its state lost: {r!r}")
    next_run_works(ctx, user, cid)
    with open(victim) as f:
        eq(f.read(), "untouched\n", "the victim file is unchanged")
    eq(os.stat(victim).st_mtime_ns, before.st_mtime_ns, "not even rewritten")
    runtime = os.path.join(st.jdir, "runtime")
    for name in os.listdir(runtime):
        path = os.path.join(runtime, name)
        if os.path.islink(path):
            target = os.readlink(path)
            check(not target.startswith("/") and target.startswith("sbx-"),
                  f"endpoint {name} points into a private directory: {target}")


# --- the server's files are out of reach -------------------------------------

def test_workspace_modules_do_not_shadow_the_kernels(ctx):
    """The workspace is the tenant's: a json.py (or any module the kernel
    imports at its start) planted there is not what the next kernel process
    imports (python -P); the tenant's own modules still import, after the
    standard library, as in Jupyter."""
    user, cid = "iso-shadow", new_id()
    plant = ("import os\nfor m in ('json', 'signal', 'zmq', 'traitlets', 'mymod'):\n"
             "    open(m + '.py', 'w').write('open(\"/workspace/imported-' + m + '\", \"w\")\\n'"
             " + ('VALUE = 7\\n' if m == 'mymod' else 'raise SystemExit(\"shadowed\")\\n'))\n"
             "os._exit(1)")
    run(ctx, user, cid, "x = 1")
    r = run(ctx, user, cid, plant)
    eq((r["status"], r.get("error_name"), r["session"]["reset"]), ("error", "KernelDied", True),
       f"the kernel ended {r!r}")
    r = run(ctx, user, cid, "import os, json, mymod\nprint(json.__file__.startswith('/usr/lib'),"
                            " mymod.VALUE, sorted(f for f in os.listdir('.') if f.startswith('imported-')))")
    eq(r["status"], "ok", f"a new kernel process started, the workspace's modules planted {r!r}")
    eq(r["stdout_tail"], "True 7 ['imported-mymod']\n",
       "the standard library's json, the tenant's own module, nothing planted imported at start")


def test_codexec_files_are_out_of_reach(ctx):
    st = ctx.st
    paths = [st.conf, st.secret, st.storage, st.pg_data, os.path.join(st.pg_run, ".s.PGSQL.5432"),
             os.path.join(st.logdir, "codexec.log"), "/etc/shadow"]
    code = ("import json, os\nr = {}\nfor p in %r:\n"
            "    try:\n        r[p] = 'read: ' + (str(os.listdir(p)) if os.path.isdir(p) else open(p).read(64))\n"
            "    except OSError as e:\n        r[p] = type(e).__name__\n"
            "print(json.dumps(r))" % (paths,))
    r = run(ctx, "iso-secrets", new_id(), code)
    got = json.loads(r["stdout_tail"].strip().splitlines()[-1])
    for p in paths:
        check(not got[p].startswith("read"), f"the kernel read {p}: {got[p][:80]}")
    if os.geteuid() != 0:
        return  # one user for everything: nothing to separate
    # An escape lands as the gateway's user: it can read none of it either.
    probe = ("import json, os, socket, sys\nr = {}\nfor p in sys.argv[1:]:\n"
             "    try:\n        r[p] = 'read: ' + (str(os.listdir(p)) if os.path.isdir(p) else open(p, 'rb').read(16).hex())\n"
             "    except OSError as e:\n        r[p] = type(e).__name__\n"
             "try:\n    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[5]); r['pg'] = 'connected'\n"
             "except OSError as e:\n    r['pg'] = type(e).__name__\n"
             "print(json.dumps(r))")
    # every configuration holding the gateway's token or the database's
    # address (the tests' own copies too)
    confs = [os.path.join(st.var, f) for f in sorted(os.listdir(st.var))
             if f.endswith(".conf") and not f.startswith("sandbox")]
    out = st.run(["/usr/bin/python3", "-c", probe] + paths + confs, user=st.kernel_user).stdout
    got = json.loads(out)
    for p in paths[:4] + [paths[5]] + confs:
        check(not got[p].startswith("read"), f"the gateway's user read {p}")
    check(got["pg"] != "connected", "the gateway's user cannot reach PostgreSQL's socket")
    # and the other way round: the gateway's home is its own
    r = st.run(["/usr/bin/ls", os.path.join(st.jdir, "home")], check=False)
    check(r.returncode != 0, "codexec's own user cannot read the gateway's files either")


# --- memory, disk, processes, CPU ---------------------------------------------

def test_tmpfs_fill_is_a_clean_error(ctx):
    with Bystander(ctx, "tmpfs"):
        r = attack(ctx, "iso-tmpfs", "chunk = b'x' * (16 << 20)\ni = 0\nwhile True:\n"
                                     "    open(f'/tmp/f{i}', 'wb').write(chunk)\n    i += 1")
    eq(r["status"], "error", f"{r!r}")
    check("No space left" in r["error"] or r["error_name"] in ("OSError", "MemoryError"),
          f"a full /tmp: {r['error']}")
    r = attack(ctx, "iso-tmpfs", "import os\nfd = os.open('/dev/shm/x', os.O_CREAT | os.O_WRONLY)\n"
                                 "os.posix_fallocate(fd, 0, 8 << 30)")
    eq(r["status"], "error", f"/dev/shm is sized too: {r!r}")


def test_workspace_fallocate_fill_is_a_clean_error(ctx):
    """posix_fallocate in a loop: the workspace is a sized tmpfs; nothing
    reaches the host's disk."""
    st = ctx.st
    free_before = os.statvfs(st.var).f_bavail * os.statvfs(st.var).f_frsize
    user, cid = "iso-disk", new_id()
    with Bystander(ctx, "disk"):
        r = run(ctx, user, cid, "import os\nfor i in range(12):\n"
                                "    fd = os.open(f'big{i}', os.O_CREAT | os.O_WRONLY)\n"
                                "    os.posix_fallocate(fd, 0, 1 << 30)\n    os.close(fd)",
                capture_artifacts=False, timeout=120)
    eq(r["status"], "error", f"{r!r}")
    check("No space left" in r["error"], f"ENOSPC: {r['error']}")
    free_after = os.statvfs(st.var).f_bavail * os.statvfs(st.var).f_frsize
    check(free_before - free_after < 256 << 20,
          f"the host disk did not fill: {(free_before - free_after) >> 20} MiB used")
    next_run_works(ctx, user, cid)
    eq(ctx.request("DELETE", f"/v1/conversations/{cid}/session", key=ctx.key(user)).status, 204,
       "closed")


def test_allocation_loop_is_contained(ctx):
    user, cid = "iso-mem", new_id()
    with Bystander(ctx, "mem"):
        r = run(ctx, user, cid, "a = []\nwhile True:\n    a.append(b'x' * (32 << 20))", timeout=120)
    eq(r["status"], "error", f"{r!r}")
    check(r["error_name"] in ("MemoryError", "KernelDied"), f"a memory error or a killed kernel: {r!r}")
    r = next_run_works(ctx, user, cid)


def test_fork_bomb_is_contained(ctx):
    user, cid = "iso-fork", new_id()
    with Bystander(ctx, "fork"):
        r = run(ctx, user, cid, "import os, time\nwhile True:\n    if os.fork() == 0:\n"
                                "        time.sleep(600)\n        os._exit(0)", timeout=60)
        eq(r["status"], "error", f"{r!r}")
        check(r["error_name"] in ("BlockingIOError", "OSError", "KernelDied"),
              f"the process limit stopped it: {r!r}")
        # what the run left behind ended with it: the next run can fork
        # (a child killed with the run may be a zombie for a moment, until
        # the sandbox's init reaps it: counted until gone, 5 s at most)
        r = run(ctx, user, cid, "import subprocess\nprint(subprocess.run(['true']).returncode)\n"
                                "import os, time\nfor _ in range(50):\n"
                                "    n = len([p for p in os.listdir('/proc') if p.isdigit()])\n"
                                "    if n <= 3:\n        break\n    time.sleep(0.1)\nprint(n)")
        eq(r["status"], "ok", f"{r!r}")
        lines = r["stdout_tail"].split()
        eq(lines[0], "0", "a process starts again")
        check(int(lines[1]) <= 3, f"no leftover processes: {lines[1]}")


def test_cpu_hog_leaves_the_machine_to_others(ctx):
    """A kernel spinning every core it can: bounded to its CPU share, the
    other tenant's runs go on (the timeout ends the hog)."""
    user = "iso-cpu"
    code = ("import threading\ndef spin():\n    while True:\n        pass\n"
            "for _ in range(8):\n    threading.Thread(target=spin, daemon=True).start()\n"
            "import multiprocessing as mp\nps = [mp.Process(target=spin) for _ in range(4)]\n"
            "[p.start() for p in ps]\nspin()")
    with Bystander(ctx, "cpu") as b:
        r = attack(ctx, user, code, timeout=6)
    eq(r["error_name"], "TimeoutError", f"{r!r}")
    slow = max(t for _, t, _ in b.results)
    print(f"# the other tenant's slowest run during the CPU hog: {slow * 1000:.0f} ms")


# --- the kernel can't leave the sandbox ---------------------------------------

ESCAPES = r'''
import ctypes, errno, json, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
r = {}
def sysret(name, *args):
    ctypes.set_errno(0)
    rc = getattr(libc, name)(*args)
    return "ok" if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def raw(nr, *args):
    ctypes.set_errno(0)
    rc = libc.syscall(nr, *args)
    return "ok" if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
r["unshare_cmd"] = subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode
r["unshare_user"] = sysret("unshare", 0x10000000)
r["unshare_mount"] = sysret("unshare", 0x00020000)
r["ptrace_traceme"] = sysret("ptrace", 0, 0, 0, 0)
r["mount"] = sysret("mount", b"none", b"/tmp", b"tmpfs", 0, None)
r["bpf"] = raw(321, 0, 0, 0)
r["perf_event_open"] = raw(298, 0, 0, -1, -1, 0)
r["keyctl"] = raw(250, 0, 0, 0, 0, 0)
r["userfaultfd"] = raw(323, 0)
r["io_uring_setup"] = raw(425, 1, 0)
r["inotify_init1"] = raw(294, 0)  # instances counted per user, up to the host's
r["setns"] = raw(308, 0, 0)
r["clone_newuser"] = raw(56, 0x10000000 | 17, 0, 0, 0, 0)
import socket
try:
    socket.socket(40, socket.SOCK_STREAM)  # AF_VSOCK: the host of a virtual machine
    r["vsock"] = "ok"
except OSError as e:
    r["vsock"] = errno.errorcode.get(e.errno, str(e.errno))
r["caps"] = open("/proc/self/status").read().split("CapEff:")[1].split()[0]
r["no_new_privs"] = open("/proc/self/status").read().split("NoNewPrivs:")[1].split()[0]
print(json.dumps(r))
'''


def test_namespaces_ptrace_and_kernel_interfaces_are_refused(ctx):
    r = run(ctx, "iso-escape", new_id(), ESCAPES)
    eq(r["status"], "ok", f"{r!r}")
    got = json.loads(r["stdout_tail"].strip().splitlines()[-1])
    check(got.pop("unshare_cmd") != 0, "unshare -U fails")
    eq(got.pop("caps"), "0000000000000000", "no capabilities")
    eq(got.pop("no_new_privs"), "1", "no new privileges")
    eq(got.pop("vsock"), "EAFNOSUPPORT", "vsock sockets refused")
    for name, v in got.items():
        eq(v, "EPERM", f"{name} refused")


SURFACE = r'''
import json, os, stat
r = {}
def attempt(fn):
    try:
        return "ok:" + str(fn())[:100]
    except OSError as e:
        return type(e).__name__
r["write_root"] = attempt(lambda: open("/big", "wb").write(b"x"))
r["write_dev"] = attempt(lambda: open("/dev/big", "wb").write(b"x"))
r["etc"] = sorted(os.listdir("/etc"))
import sys
# ipykernel keeps the fd it was started with (it echoes fd-level output there)
orig = getattr(sys.stdout, "_original_stdstream_copy", None)
mode = os.fstat(orig if orig is not None else 1).st_mode
r["stdout"] = stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)
os.write(1, b"LEAK_MARKER_5511\n")
os.write(2, b"LEAK_MARKER_5511\n")
print(json.dumps(r))
'''


def test_nothing_outside_the_sizes_and_no_host_files(ctx):
    """The sandbox's root and /dev are read-only (only the sized tmpfs take
    writes), /etc holds what Python needs and nothing of other services',
    and the kernel's own stdout is not the server's log."""
    r = run(ctx, "iso-surface", new_id(), SURFACE)
    eq(r["status"], "ok", f"{r!r}")
    # fd-level writes reach the output through ipykernel's capture thread,
    # at any point of it: after the JSON line, or between the JSON and the
    # newline print() writes separately
    line = [l for l in r["stdout_tail"].splitlines() if l.startswith("{")][-1]
    got, _ = json.JSONDecoder().raw_decode(line)
    check(not got["write_root"].startswith("ok"), f"the root is read-only: {got['write_root']}")
    check(not got["write_dev"].startswith("ok"), f"/dev is read-only: {got['write_dev']}")
    for private in ("shadow", "nginx", "postgresql", "codexec", "ssh", "apache2", "sudoers"):
        check(private not in got["etc"], f"/etc/{private} is not in the sandbox: {got['etc']}")
    check("passwd" in got["etc"] and "ld.so.cache" in got["etc"], f"what libc needs: {got['etc']}")
    check(got["stdout"], "the kernel's stdout is a pipe (or /dev/null), not the server's log file")
    time.sleep(0.5)
    with open(os.path.join(ctx.st.logdir, "jupyter.log"), errors="replace") as f:
        check("LEAK_MARKER_5511" not in f.read(), "a kernel's output never reaches the server's log")


# --- approvals, trust, content types ------------------------------------------

def test_a_gated_key_cannot_approve_its_own_runs(ctx):
    user = "iso-gated"
    gated = ctx.key(user, approval=True)
    r = ctx.post("/v1/runs", {"conversation_id": "c1", "code": "print('approved?')"}, key=gated)
    eq(r.status, 202, f"waits for approval {r!r}")
    rid = r.json()["run_id"]
    for action in ("approve", "reject"):
        body = expect_error(ctx.post(f"/v1/runs/{rid}/{action}", key=gated), 403, "forbidden")
        check("approval" in body["error"]["message"], f"the message says why: {body}")
    # unknown runs too: a gated key learns nothing by trying
    expect_error(ctx.post(f"/v1/runs/{new_id()}/approve", key=gated), 403, "forbidden")
    eq(ctx.get(f"/v1/runs/{rid}", key=gated).json()["status"], "pending_approval", "still pending")
    # the same user's key without the gate decides
    r = ctx.post(f"/v1/runs/{rid}/approve", key=ctx.key(user))
    eq((r.status, r.json().get("stdout_tail")), (200, "approved?\n"), f"approved {r!r}")


def test_json_endpoints_need_a_json_content_type(ctx):
    key = ctx.key("iso-ctype")
    body = json.dumps({"conversation_id": "c1", "code": "print(1)"}).encode()
    for ctype in (None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                  "application/jsonx", ""):
        h = {} if ctype is None else {"Content-Type": ctype}
        r = ctx.request("POST", "/v1/runs", body=body, headers=h, key=key)
        expect_error(r, 415, "unsupported_media_type")
    eq(ctx.psql("SELECT count(*) FROM runs WHERE user_id = 'iso-ctype'"), "0", "nothing ran")
    r = ctx.request("POST", "/v1/runs", body=body, key=key,
                    headers={"Content-Type": "Application/JSON; charset=utf-8"})
    eq(r.status, 200, f"with parameters and any case {r!r}")
    aid = ctx.post("/v1/artifacts?conversation_id=c1&filename=a.txt", b"a", key=key,
                   headers={"Content-Type": "application/octet-stream"}).json()["artifact_id"]
    expect_error(ctx.request("POST", f"/v1/artifacts/{aid}/links", key=key), 415,
                 "unsupported_media_type")
    expect_error(ctx.request("POST", f"/v1/artifacts/{aid}/links", body=b"{}", key=key,
                             headers={"Content-Type": "text/plain"}), 415, "unsupported_media_type")
    eq(ctx.post(f"/v1/artifacts/{aid}/links", {}, key=key).status, 201, "links with JSON")


def restart_fcgi(ctx, **settings):
    st = ctx.st
    for k, v in settings.items():
        if v is None:
            st.conf_extra.pop(k, None)
        else:
            st.conf_extra[k] = v
    st.write_config()
    st.kill_pidfile("codexec-fcgi")
    st.start_fcgi()


def test_a_basic_header_never_makes_a_user(ctx):
    """With trust_remote_user on, the shipped nginx config passes no
    REMOTE_USER, and codexec counts one only with AUTH_TYPE beside it."""
    import fcgi_client
    st = ctx.st
    key = ctx.key("iso-victim")
    run(ctx, "iso-victim", "c1", "open('secret.txt', 'w').write('victim data')")
    aid = ctx.get("/v1/artifacts?conversation_id=c1", key=key).json()["artifacts"][0]["artifact_id"]
    restart_fcgi(ctx, trust_remote_user="true")
    try:
        basic = {"Authorization": "Basic aXNvLXZpY3RpbTp4"}  # iso-victim:x
        expect_error(ctx.get("/v1/artifacts?conversation_id=c1", headers=basic), 401, "unauthorized")
        expect_error(ctx.get(f"/v1/artifacts/{aid}/content", headers=basic), 401, "unauthorized")
        expect_error(ctx.post("/v1/runs", {"conversation_id": "c1", "code": "1"}, headers=basic),
                     401, "unauthorized")
        # Debian's stock fastcgi_params would pass $remote_user: without
        # AUTH_TYPE it still names nobody
        uri = "/v1/artifacts?conversation_id=c1"
        status, _, _ = fcgi_client.request(st.socket, "GET", uri, params={"REMOTE_USER": "iso-victim"})
        eq(status, 401, "REMOTE_USER without AUTH_TYPE")
        # a web server that authenticated says so
        status, _, body = fcgi_client.request(st.socket, "GET", uri,
                                              params={"REMOTE_USER": "iso-victim", "AUTH_TYPE": "Basic"})
        eq(status, 200, f"REMOTE_USER with AUTH_TYPE {body[:200]!r}")
        # ... but not from another site's page, for anything that changes state
        for hdrs in ({"HTTP_SEC_FETCH_SITE": "cross-site"},
                     {"HTTP_ORIGIN": "https://evil.example", "HTTP_HOST": "codexec.example"}):
            status, _, _ = fcgi_client.request(
                st.socket, "DELETE", f"/v1/artifacts/{aid}",
                params=dict({"REMOTE_USER": "iso-victim", "AUTH_TYPE": "Basic"}, **hdrs))
            eq(status, 403, f"a cross-site DELETE with the web server's authentication {hdrs}")
        eq(ctx.get(f"/v1/artifacts/{aid}", key=key).status, 200, "nothing was deleted")
        # REMOTE_USER twice (a config that includes fastcgi_params and sets it again)
        status, _, _ = fcgi_client.request(st.socket, "GET", uri, params=[
            ("REMOTE_USER", "iso-victim"), ("REMOTE_USER", "iso-other"), ("AUTH_TYPE", "Basic")])
        eq(status, 401, "an ambiguous REMOTE_USER names nobody")
    finally:
        restart_fcgi(ctx, trust_remote_user=None)


def test_nginx_auth_basic_example_from_the_readme(ctx):
    """The auth_basic example of docs/web-servers.md: nginx checks the password and passes
    REMOTE_USER with AUTH_TYPE; codexec serves that user."""
    st = ctx.st
    import stack
    sock, proc = ctx.spawn_fcgi("authed", {"trust_remote_user": "true"})
    ndir = os.path.join(st.var, "nginx-auth")
    os.makedirs(os.path.join(ndir, "snippets"), exist_ok=True)
    pw = subprocess.run(["openssl", "passwd", "-apr1", "s3cret"], stdout=subprocess.PIPE, text=True,
                        check=True).stdout.strip()
    with open(os.path.join(ndir, "htpasswd"), "w") as f:
        f.write(f"iso-webuser:{pw}\n")
    with open(os.path.join(stack.REPO, "nginx", "codexec-fastcgi.conf")) as f:
        # the web server's key where the package puts it (/etc/codexec): here, the stack's
        params = f.read().replace("/etc/codexec/nginx-web-key*.conf",
                                  os.path.join(st.var, "nginx", "web-key*.conf"))
    with open(os.path.join(ndir, "snippets", "codexec-fastcgi.conf"), "w") as f:
        f.write(params)
    port = stack.free_port()
    st.make_log("nginx-auth-error.log")
    with open(os.path.join(ndir, "nginx.conf"), "w") as f:
        f.write(f"""daemon off; worker_processes 1; pid {ndir}/nginx.pid;
error_log {st.logdir}/nginx-auth-error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {ndir}/body; fastcgi_temp_path {ndir}/fastcgi;
    proxy_temp_path {ndir}/proxy; uwsgi_temp_path {ndir}/uwsgi; scgi_temp_path {ndir}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location /v1/ {{
            auth_basic "codexec";
            auth_basic_user_file {ndir}/htpasswd;
            include snippets/codexec-fastcgi.conf;
            fastcgi_param REMOTE_USER $remote_user;
            fastcgi_param AUTH_TYPE Basic;
            fastcgi_pass unix:{sock};
        }}
    }}
}}
""")
    subprocess.run(["chown", "-R", st.user, ndir], check=False)
    nginx = subprocess.Popen(st.as_user() + ["/usr/sbin/nginx", "-p", ndir, "-c",
                                             os.path.join(ndir, "nginx.conf")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not stack.port_open(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        good = {"Authorization": "Basic aXNvLXdlYnVzZXI6czNjcmV0"}  # iso-webuser:s3cret
        bad = {"Authorization": "Basic aXNvLXdlYnVzZXI6d3Jvbmc="}  # iso-webuser:wrong
        r = ctx.post("/v1/runs", {"conversation_id": "c1", "code": "print('as the web user')"},
                     headers=good, port=port)
        eq((r.status, r.json().get("stdout_tail")), (200, "as the web user\n"), f"{r!r}")
        eq(ctx.psql("SELECT count(*) FROM runs WHERE user_id = 'iso-webuser'"), "1",
           "the run belongs to the authenticated user")
        eq(ctx.post("/v1/runs", {"conversation_id": "c1", "code": "1"}, headers=bad,
                    port=port).status, 401, "a wrong password stops at nginx")
        eq(ctx.get("/v1/artifacts?conversation_id=c1", port=port).status, 401, "no credentials")
    finally:
        nginx.terminate()
        proc.terminate()
        nginx.wait(timeout=20)
        proc.wait(timeout=20)
