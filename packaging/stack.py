#!/usr/bin/python3
"""codexec stack: PostgreSQL, a Jupyter server with the sandboxed kernelspec,
codexec-fcgi and nginx, all living in one directory.

`packaging/quickstart` drives it on var/ with 127.0.0.1:8080; the system
tests drive it on a temporary directory with free ports, so both start the
stack the same way. Every step is idempotent: `up` on a running stack
changes nothing, and `up` after a crash starts only what is missing.

Runs with Debian's /usr/bin/python3 and the standard library only.
"""

import argparse
import filecmp
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request

PG_BIN = "/usr/lib/postgresql/15/bin"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_NAME = "python3-sandbox"
TEST_KERNEL_NAME = "python3-sandbox-test"  # a kernelspec the system tests write
# The JavaScript and R kernelspecs (packaging/kernels/), offered when their
# runtimes are installed: Deno (from npm, packaging/deno/) and R's
# IRkernel (Debian's r-cran-irkernel).
LANGUAGE_KERNELS = {"javascript": "javascript-sandbox", "r": "r-sandbox"}
DENO_PREFIX = "/usr/local/lib/codexec-deno"  # packaging/quickstart installs Deno here
DENO = os.path.join(DENO_PREFIX, "deno")
R_BIN = "/usr/bin/R"


def language_available(lang):
    """Whether this machine has the runtime of lang's kernel."""
    if lang == "javascript":
        return os.access(DENO, os.X_OK)
    return os.access(R_BIN, os.X_OK) and os.path.isdir("/usr/lib/R/site-library/IRkernel")
# Started as root, every service runs as its own system user: codexec-fcgi
# and nginx as codexec (storage, secret, configuration), PostgreSQL as
# codexec-db, the Jupyter server and its kernels as codexec-kernel, which
# can read nothing of the other two.
RUN_USER = "codexec"
# What every kernel imports before its first run (kernel-image.list has them)
PRELOAD = "numpy, pandas, matplotlib.pyplot"
KERNEL_USER = "codexec-kernel"
DB_USER = "codexec-db"
# The test object store (tests/s3: s3rver behind a SigV4 check), when a
# stack has one: its own user, its own disk.
S3_USER = "codexec-s3"
S3_BUCKET = "codexec"
S3_REGION = "us-east-1"
S3_PREFIX = "cx/"


def log(msg):
    print(f"stack: {msg}", file=sys.stderr, flush=True)


class StackError(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port, host="127.0.0.1"):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


# The programs and their folders in the build tree.
PROGRAMS = [("fcgi", "codexec-fcgi"), ("admin", "codexec-admin"),
            ("launcher", "codexec-kernel-launcher")]


class Stack:
    def __init__(self, var, http_port=8080, gateway_port=None, build=None,
                 workers=8, conf_extra=None, fast_pg=False, nginx_body="64m", nginx_extra="",
                 test_kernel=False, sandbox_extra=None, gateway_proxy_port=None, s3_port=None,
                 edge_links=True, gateway_memory=None, ragflow_port=None):
        self.var = os.path.abspath(var)
        self.http_port = http_port
        self.gateway_port = gateway_port
        # With a port: codexec reaches the gateway through an nginx that
        # serves only what Kernel Gateway and Enterprise Gateway offer
        # (/api/kernels, /api/kernelspecs, the channels WebSocket).
        self.gateway_proxy_port = gateway_proxy_port
        # With a port: a test object store there (start_s3), which
        # use_s3() points codexec at.
        self.s3_port = s3_port
        # the build tree: each program in its folder (fcgi/, admin/,
        # launcher/; a build of a revision before them has all three in fcgi/)
        self.build = os.path.abspath(build or os.path.join(REPO, "build"))
        self.workers = workers
        self.conf_extra = conf_extra or {}
        self.sandbox_extra = sandbox_extra or {}
        self.fast_pg = fast_pg
        self.nginx_body = nginx_body
        self.nginx_extra = nginx_extra  # more server-block lines (benchmarks)
        self.edge_links = edge_links  # nginx checks signed links itself
        self.gateway_memory = gateway_memory  # bytes; None: setup_cgroups decides
        # With a port: nginx/codexec-ragflow.conf's listener there, with the
        # key set_ragflow_key() gives it
        self.ragflow_port = ragflow_port
        # the link module, built next to codexec-fcgi (nginx/module/), and
        # where nginx loads it from: var/bin, as the programs (the build may
        # sit in a directory only its owner can enter)
        self.link_module_built = os.path.join(self.build, "nginx",
                                              "ngx_http_codexec_link_module.so")
        self.languages = [l for l in sorted(LANGUAGE_KERNELS) if language_available(l)]
        self.kernelspecs = ([KERNEL_NAME] + [LANGUAGE_KERNELS[l] for l in self.languages] +
                            ([TEST_KERNEL_NAME] if test_kernel else []))
        p = lambda *a: os.path.join(self.var, *a)
        self.pg_data, self.pg_run = p("pg", "data"), p("pg", "run")
        self.storage, self.workspaces = p("storage"), p("workspaces")
        self.jdir = p("jupyter")
        self.kernelspecs_dir = p("kernelspecs")  # JUPYTER_PATH: kernels/<name>/kernel.json
        self.token_file = p("gateway-token")
        self.kernel_cache = p("kernel-cache")
        self.logdir, self.rundir, self.bin = p("log"), p("run"), p("bin")
        self.link_module = p("bin", "ngx_http_codexec_link_module.so")
        self.piddir = p("pids")
        self.conf, self.secret = p("codexec.conf"), p("secret")
        self.sandbox_conf = p("sandbox.conf")
        self.s3_dir, self.s3_data, self.s3_app = p("s3"), p("s3", "data"), p("s3", "app")
        self.s3_keys, self.s3_credentials = p("s3", "keys"), p("s3-credentials")
        self.socket = p("run", "codexec.sock")
        self.revoked = p("revoked")  # revoked_keys_dir: nginx reads it
        self.link_key_conf = p("nginx", "link-key.conf")
        self.ports_file = p("ports.json")
        if os.geteuid() == 0:
            self.user, self.kernel_user, self.db_user = RUN_USER, KERNEL_USER, DB_USER
        else:
            self.user = self.kernel_user = self.db_user = pwd.getpwuid(os.geteuid()).pw_name
        # The kernels' parent cgroup, one per stack directory.
        self.cgroup = "codexec-" + hashlib.sha256(self.var.encode()).hexdigest()[:12]

    # --- helpers ------------------------------------------------------------
    @property
    def pg_port(self):
        return 5432

    @property
    def conninfo(self):
        return f"host={self.pg_run} port={self.pg_port} dbname=codexec user=codexec"

    @property
    def gateway_url(self):
        """The URL codexec (and the tests) use: the proxy's, when there is one."""
        return f"http://127.0.0.1:{self.gateway_proxy_port or self.gateway_port}"

    @property
    def gateway_direct_url(self):
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def url(self):
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def admin(self):
        return os.path.join(self.bin, "codexec-admin")

    def as_user(self, user=None):
        user = user or self.user
        if os.geteuid() != 0 or user == "root":
            return []
        return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]

    def run(self, argv, check=True, user=None, **kw):
        r = subprocess.run(self.as_user(user) + argv, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, **kw)
        if check and r.returncode != 0:
            raise StackError(f"{os.path.basename(argv[0])} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
        return r

    def spawn(self, name, argv, env=None, cwd=None, user=None, cgroup=None):
        logf = os.fdopen(self.open_nofollow(os.path.join(self.logdir, f"{name}.log"),
                                            os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640), "ab")
        if cgroup:  # moved there as root, before it drops to its user
            argv = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup] + \
                self.as_user(user) + argv
        else:
            argv = self.as_user(user) + argv
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=logf, env=env, cwd=cwd, start_new_session=True)
        logf.close()
        self.write_file(os.path.join(self.piddir, f"{name}.pid"), f"{proc.pid}\n", 0o644, "root")
        return proc

    def pid(self, name):
        try:
            with open(os.path.join(self.piddir, f"{name}.pid")) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def wait_for(self, what, fn, timeout=60, proc=None):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if fn():
                return
            if proc is not None and proc.poll() is not None:
                raise StackError(f"{what} exited with {proc.returncode}; see {self.logdir}")
            time.sleep(0.1)
        raise StackError(f"{what} did not come up within {timeout}s; see {self.logdir}")

    def chown(self, path, user=None, group=None):
        """Never through a symlink: as root, following one that a service's
        user planted would hand any file on the machine to it."""
        if os.geteuid() == 0:
            pw = pwd.getpwnam(user or self.user)
            gid = pwd.getpwnam(group).pw_gid if group else pw.pw_gid
            os.chown(path, pw.pw_uid, gid, follow_symlinks=False)

    @staticmethod
    def open_nofollow(path, flags, mode=0o600):
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)

    def chown_kernel(self, path):
        """Gives path to the user the Jupyter server and its kernels run as."""
        self.chown(path, self.kernel_user)

    def ensure_user(self):
        if os.geteuid() != 0:
            return
        for user in (self.user, self.kernel_user, self.db_user) + ((S3_USER,) if self.s3_port else ()):
            try:
                pwd.getpwnam(user)
            except KeyError:
                log(f"creating system user {user}")
                subprocess.run(["useradd", "--system", "--user-group", "--home-dir", "/nonexistent",
                                "--no-create-home", "--shell", "/usr/sbin/nologin", user],
                               check=True)

    def ensure_traversable(self, path):
        """The stack's users must reach var/: grant search (x, not read) on
        ancestors that deny it, and say so."""
        if os.geteuid() != 0:
            return
        d = os.path.dirname(path)
        while d and d != "/":
            st = os.stat(d)
            if not st.st_mode & stat.S_IXOTH:
                log(f"granting search permission (o+x) on {d} so the stack's users can reach {path}")
                os.chmod(d, st.st_mode | stat.S_IXOTH)
            d = os.path.dirname(d)

    def write_file(self, path, text, mode=0o640, owner=None):
        old = None
        try:
            with os.fdopen(self.open_nofollow(path, os.O_RDONLY), "r") as f:
                old = f.read()
        except OSError:
            pass
        if old != text:
            tmp = path + ".tmp"
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            fd = self.open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "w") as f:
                f.write(text)
                os.fchmod(f.fileno(), mode)
                if os.geteuid() == 0:
                    pw = pwd.getpwnam(owner or self.user)
                    os.fchown(f.fileno(), pw.pw_uid, pw.pw_gid)
            os.replace(tmp, path)

    def copy_exec(self, src, name):
        dst = os.path.join(self.bin, name)
        if not os.path.exists(src):
            raise StackError(f"{src} is missing: build first")
        if os.path.exists(dst) and filecmp.cmp(src, dst, shallow=False):
            return
        tmp = dst + ".tmp"
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dst)

    # --- init ---------------------------------------------------------------
    def make_dirs(self):
        """Each directory with its owner and mode: what belongs to one
        service is closed to the others, and every directory a service may
        write sits in one only root writes, so nothing the stack does as
        root can be steered by a symlink a service planted."""
        j = lambda *a: os.path.join(self.jdir, *a)
        layout = [  # path, owner, group, mode
            (self.var, "root", None, 0o755),
            (os.path.join(self.var, "pg"), "root", None, 0o755),
            (self.pg_data, self.db_user, None, 0o700),
            (self.pg_run, self.db_user, self.user, 0o750),  # codexec connects, nobody else
            (self.storage, self.user, None, 0o700),
            (self.logdir, "root", None, 0o755),
            (self.rundir, self.user, None, 0o755),  # codexec-fcgi's socket
            (self.revoked, self.user, None, 0o755),  # codexec writes, nginx reads
            (self.piddir, "root", None, 0o755),
            (os.path.join(self.var, "nginx"), "root", None, 0o755),
            (os.path.join(self.var, "nginx", "tmp"), self.user, None, 0o700),
            (self.bin, "root", None, 0o755),
            (self.kernel_cache, "root", None, 0o755),
            (self.kernelspecs_dir, "root", None, 0o755),  # not even the gateway changes them
            (os.path.join(self.kernelspecs_dir, "kernels"), "root", None, 0o755),
        ] + [
            (os.path.join(self.kernelspecs_dir, "kernels", k), "root", None, 0o755)
            for k in [KERNEL_NAME] + [LANGUAGE_KERNELS[l] for l in self.languages]
        ] + [
            (self.jdir, "root", None, 0o755),
            (j("home"), self.kernel_user, None, 0o700),
            (j("runtime"), self.kernel_user, None, 0o700),
            (j("data"), self.kernel_user, None, 0o700),
            (j("config"), self.kernel_user, None, 0o700),
            (self.workspaces, self.kernel_user, None, 0o700),
        ]
        if self.s3_port:
            layout += [(self.s3_dir, "root", None, 0o755),
                       (self.s3_data, self.s3_user, None, 0o700)]
        for path, owner, group, mode in layout:
            if os.path.islink(path):
                raise StackError(f"{path} is a symlink: refusing to use it")
            os.makedirs(path, exist_ok=True)
            if os.geteuid() == 0:
                if os.stat(path).st_uid != pwd.getpwnam(owner).pw_uid and path in (
                        self.pg_data, self.workspaces):
                    # a var/ from before the users were split: hand it over whole
                    log(f"giving {path} to {owner}")
                    subprocess.run(["chown", "-R", "-P", f"{owner}:{owner}", path], check=True)
                self.chown(path, owner, group)
            os.chmod(path, mode)
        # Log files the services open themselves, in a directory only root
        # writes: made here, each its service's.
        for name, owner in (("postgresql.log", self.db_user), ("codexec.log", self.user),
                            ("nginx-error.log", self.user), ("nginx-access.log", self.user)):
            self.make_log(name, owner)

    def make_log(self, name, owner=None):
        """var/log/<name>, for a service to append to as owner."""
        path = os.path.join(self.logdir, name)
        os.close(self.open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640))
        self.chown(path, owner)
        return path

    # what every kernel, the Jupyter server and its launchers count
    # together as the gateway's one user, or the host as a whole: the
    # package's file, read here as its postinst reads it (only raised)
    HOST_LIMITS = os.path.join(REPO, "packaging", "sysctl", "30-codexec.conf")

    def raise_host_limits(self):
        """Host-wide counts a tenant's kernel draws on (docs/sandbox.md,
        "Host settings"), raised as the package's sysctl.d file raises
        them, when started as root."""
        if os.geteuid() != 0:
            return
        with open(self.HOST_LIMITS) as f:
            wanted = re.findall(r"^([a-z][a-z0-9_.-]*) *= *([0-9]+)$", f.read(), re.M)
        for key, least in wanted:
            path = "/proc/sys/" + key.replace(".", "/")
            try:
                with open(path) as f:
                    if int(f.read()) >= int(least):
                        continue
                with open(path, "w") as f:
                    f.write(f"{least}\n")
                log(f"raised {key} to {least}")
            except (OSError, ValueError) as e:
                log(f"could not raise {key} ({e}): docs/sandbox.md, \"Host settings\"")

    def init(self):
        self.ensure_user()
        self.raise_host_limits()
        os.makedirs(self.var, exist_ok=True)
        self.ensure_traversable(self.var)
        self.make_dirs()
        self.load_ports()
        for folder, prog in PROGRAMS:
            built = os.path.join(self.build, folder, prog)
            if not os.path.exists(built):
                built = os.path.join(self.build, "fcgi", prog)
            self.copy_exec(built, prog)
        self.copy_exec(os.path.join(REPO, "packaging", "supervise.py"), "supervise.py")
        if os.path.exists(self.link_module_built):
            self.copy_exec(self.link_module_built, os.path.basename(self.link_module))
        self.init_secret_files()
        self.init_s3()
        self.build_kernel_cache()
        self.setup_cgroups()
        self.write_sandbox_conf()
        self.write_kernelspec()
        self.write_config()
        self.write_nginx()
        self.init_pg()

    def load_ports(self):
        try:
            with open(self.ports_file) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            saved = {}
        if self.gateway_port is None:
            self.gateway_port = saved.get("gateway") or 18888
        self.write_file(self.ports_file, json.dumps({"http": self.http_port,
                                                     "gateway": self.gateway_port}) + "\n", 0o644)

    def init_secret_files(self):
        """The gateway's token, root's: the server gets it in its
        environment, codexec in its configuration."""
        if not os.path.exists(self.token_file):
            self.write_file(self.token_file, secrets.token_hex(24) + "\n", 0o600, "root")
        with os.fdopen(self.open_nofollow(self.token_file, os.O_RDONLY), "r") as f:
            self.gateway_token = f.read().strip()

    @property
    def s3_user(self):
        return S3_USER if os.geteuid() == 0 else self.user

    def init_s3(self):
        """The test store's key pair (its user reads it) and codexec's
        credentials file for it (codexec reads it), and the store's code,
        copied where its user can read it."""
        if not self.s3_port:
            return
        if not os.path.exists(self.s3_keys):
            self.write_file(self.s3_keys, f"CX{secrets.token_hex(8).upper()} {secrets.token_urlsafe(30)}\n",
                            0o400, self.s3_user)
        with os.fdopen(self.open_nofollow(self.s3_keys, os.O_RDONLY), "r") as f:
            key_id, secret = f.read().split()
        self.write_file(self.s3_credentials,
                        f"access_key_id = {key_id}\nsecret_access_key = {secret}\n", 0o600)
        src = os.path.join(REPO, "tests", "s3")
        if not os.path.isdir(os.path.join(src, "node_modules")):
            raise StackError("tests/s3/node_modules is missing: run npm ci in tests/s3 "
                             "(packaging/quickstart test does)")
        stamp = os.path.join(self.s3_app, "package-lock.json")
        if not os.path.exists(stamp) or not filecmp.cmp(stamp, os.path.join(src, "package-lock.json"),
                                                        shallow=False):
            shutil.rmtree(self.s3_app, ignore_errors=True)
            shutil.copytree(src, self.s3_app, symlinks=True)
        for f in ("server.js", "sigcheck.py"):
            shutil.copyfile(os.path.join(src, f), os.path.join(self.s3_app, f))

    def s3_settings(self):
        """codexec.conf's keys for the test store."""
        return {"storage": "s3", "s3_endpoint": f"http://127.0.0.1:{self.s3_port}",
                "s3_region": S3_REGION, "s3_bucket": S3_BUCKET, "s3_prefix": S3_PREFIX,
                "s3_credentials_file": self.s3_credentials, "x_accel_prefix": "/_codexec_s3/"}

    def use_s3(self, on=True):
        """codexec on the test store (or back on storage_dir), restarted."""
        for k in self.s3_settings():
            self.conf_extra.pop(k, None)
        if on:
            self.conf_extra.update(self.s3_settings())
        self.write_config()
        self.kill_pidfile("codexec-fcgi")
        self.start_fcgi()
        self.write_nginx()  # signed links at the edge only with storage_dir
        self.reload_nginx()

    def s3_ok(self):
        return port_open(self.s3_port) and port_open(self.s3_upstream_port)

    def start_s3(self):
        if not self.s3_port:
            return
        if self.pid("s3rver") and self.pid("s3-sigcheck") and getattr(self, "s3_upstream_port", 0) \
                and self.s3_ok():
            return
        self.kill_pidfile("s3-sigcheck")
        self.kill_pidfile("s3rver")
        self.s3_upstream_port = free_port()
        log(f"starting the test object store (s3rver) on 127.0.0.1:{self.s3_port}")
        # (s3rver's continuation tokens are DES, which OpenSSL 3 keeps in
        # its legacy provider)
        srv = self.spawn("s3rver", ["/usr/bin/node", "--openssl-legacy-provider",
                                    os.path.join(self.s3_app, "server.js"),
                                    str(self.s3_upstream_port), self.s3_data, S3_BUCKET,
                                    self.s3_keys], user=self.s3_user, cwd=self.s3_app)
        self.wait_for("s3rver", lambda: port_open(self.s3_upstream_port), 30, srv)
        chk = self.spawn("s3-sigcheck", ["/usr/bin/python3", os.path.join(self.s3_app, "sigcheck.py"),
                                         str(self.s3_port), str(self.s3_upstream_port), S3_REGION,
                                         self.s3_keys], user=self.s3_user)
        self.wait_for("the store's signature check", lambda: port_open(self.s3_port), 30, chk)

    def build_kernel_cache(self):
        """matplotlib's font list, built once here and bound read-only into
        every kernel (sandbox.conf's cache_dir): otherwise each
        kernel start would rebuild it (seconds) in its private /tmp. Rebuilt
        when matplotlib or the fonts are newer than it."""
        mpl = os.path.join(self.kernel_cache, "matplotlib")
        os.makedirs(mpl, mode=0o755, exist_ok=True)
        os.chmod(self.kernel_cache, 0o755)
        os.chmod(mpl, 0o755)
        built = [os.path.join(mpl, f) for f in os.listdir(mpl) if f.startswith("fontlist-")]
        sources = ["/usr/share/fonts", "/usr/lib/python3/dist-packages/matplotlib",
                   "/usr/share/matplotlib/mpl-data/fonts"]
        newest = max((os.stat(d).st_mtime for d in sources if os.path.exists(d)), default=0)
        if built and all(os.stat(f).st_mtime >= newest for f in built):
            return
        if not os.path.exists("/usr/lib/python3/dist-packages/matplotlib"):
            return  # no matplotlib in the kernel image: nothing to cache
        log("building matplotlib's font cache for the kernels")
        for f in built:
            os.unlink(f)
        r = subprocess.run(["/usr/bin/python3", "-c", "import matplotlib.font_manager"],
                           env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8",
                                "MPLCONFIGDIR": mpl}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise StackError(f"building matplotlib's font cache failed: {r.stdout[-2000:]}")
        for f in os.listdir(mpl):
            os.chmod(os.path.join(mpl, f), 0o644)

    # --- the sandbox --------------------------------------------------------
    CONTROLLERS = ("memory", "pids", "cpu")

    def cgroup_layout(self):
        """("v1", {controller: hierarchy}) when memory, pids and cpu are
        mounted as cgroup v1; ("v2", {controller: mount}) when the cgroup2
        mount offers all three; (None, {}) otherwise."""
        v1, v2 = {}, None
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, sup = left.split(), right.split()
                if len(sup) >= 3 and sup[0] == "cgroup":
                    for c in self.CONTROLLERS:
                        if c in sup[2].split(","):
                            v1[c] = fields[4]
                elif sup and sup[0] == "cgroup2":
                    v2 = fields[4]
        if set(v1) == set(self.CONTROLLERS):
            return "v1", v1
        try:
            with open(os.path.join(v2 or "/nonexistent", "cgroup.controllers")) as f:
                offered = f.read().split()
        except OSError:
            offered = []
        if v2 and all(c in offered for c in self.CONTROLLERS):
            return "v2", {c: v2 for c in self.CONTROLLERS}
        return None, {}

    def cgroup_parents(self):
        """The kernels' parent cgroup in each hierarchy (one for v2)."""
        _, mounts = self.cgroup_layout()
        return sorted({os.path.join(m, self.cgroup) for m in mounts.values()})

    @staticmethod
    def write_cgroup(d, name, value):
        if os.path.exists(os.path.join(d, name)):
            with open(os.path.join(d, name), "w") as f:
                f.write(value)

    def setup_cgroups(self):
        """As root: the kernels' parent cgroup, in which the Jupyter server's
        user may create children (one per kernel, made by the launcher) but
        whose own limits, on all kernels together, it cannot change. With
        cgroup v2 the parent is delegated (its cgroup.procs, threads and
        subtree_control given to that user) and the server itself runs in
        its child "server", so that moving a kernel stays inside the
        delegated subtree. Where cgroups can't be made (not root, read-only
        in a container, controllers missing) kernels run without them, and
        this says so."""
        self.cgroups_ok, self.cgroup_server = False, None
        if os.geteuid() != 0:
            log("not root: kernels run without cgroup limits")
            return
        kind, mounts = self.cgroup_layout()
        if not kind:
            log("no cgroup memory, pids and cpu controllers: kernels run without cgroup limits")
            return
        with open("/proc/meminfo") as f:
            total = int(f.readline().split()[1]) * 1024
        limits = {"memory.limit_in_bytes": str(total * 3 // 4),  # all kernels together
                  "memory.max": str(total * 3 // 4), "pids.max": "16384"}
        # The Jupyter server's own bound (its kernels have theirs): an eighth
        # of the machine, within [512 MiB, 4 GiB]. At it the kernel's OOM
        # killer ends the server, and supervise.py starts it again.
        self.gateway_memory = self.gateway_memory or min(max(total // 8, 512 << 20), 4 << 30)
        try:
            for d in self.cgroup_parents():
                if kind == "v2":
                    root = os.path.dirname(d)
                    self.write_cgroup(root, "cgroup.subtree_control", "+memory +pids +cpu")
                os.makedirs(d, exist_ok=True)
                self.chown(d, self.kernel_user)
                for name, value in limits.items():
                    self.write_cgroup(d, name, value)
                if kind == "v2":
                    server = os.path.join(d, "server")
                    os.makedirs(server, exist_ok=True)
                    for name in ("cgroup.procs", "cgroup.threads", "cgroup.subtree_control"):
                        self.chown(os.path.join(d, name), self.kernel_user)
                    self.chown(server, self.kernel_user)
                    self.write_cgroup(d, "cgroup.subtree_control", "+memory +pids +cpu")
                    # (its limit files stay root's)
                    self.write_cgroup(server, "memory.max", str(self.gateway_memory))
                    self.write_cgroup(server, "memory.swap.max", "0")
                    self.cgroup_server = server
            if kind == "v1":
                # a sibling of the kernels' parent, root's: the server's
                # user can't move out of it or change its limit
                server = os.path.join(mounts["memory"], self.cgroup + "-gateway")
                os.makedirs(server, exist_ok=True)
                self.write_cgroup(server, "memory.limit_in_bytes", str(self.gateway_memory))
                self.cgroup_server = server
        except OSError as e:
            log(f"cannot set up the kernels' cgroups ({e}): kernels run without cgroup limits")
            return
        self.cgroups_ok = True

    def teardown_cgroups(self):
        if os.geteuid() != 0:
            return
        kind, mounts = self.cgroup_layout()
        if kind == "v1":
            try:
                os.rmdir(os.path.join(mounts["memory"], self.cgroup + "-gateway"))
            except OSError:
                pass
        for d in self.cgroup_parents():
            if not os.path.isdir(d):
                continue
            for child in os.listdir(d):
                p = os.path.join(d, child)
                if os.path.isdir(p):
                    try:
                        os.rmdir(p)
                    except OSError:
                        pass
            try:
                os.rmdir(d)
            except OSError as e:
                log(f"could not remove cgroup {d}: {e}")

    def write_sandbox_conf(self):
        lines = {
            "cache_dir": self.kernel_cache,
            "cgroup": self.cgroup if self.cgroups_ok else "",
            "deno": DENO,
            # Python kernels forked from one that imported these already
            # (codexec.conf's kernel_preload): an idle one costs a few MiB
            "template": "true",
            "template_preload": PRELOAD,
        }
        lines.update(self.sandbox_extra)
        text = ("# Written by packaging/stack.py: the limits of every kernel, read by\n"
                "# codexec-kernel-launcher (see docs/sandbox.md).\n")
        text += "".join(f"{k} = {v}\n" for k, v in lines.items())
        self.write_file(self.sandbox_conf, text, 0o644, "root")

    def write_kernelspec(self):
        for name in [KERNEL_NAME] + [LANGUAGE_KERNELS[l] for l in self.languages]:
            with open(os.path.join(REPO, "packaging", "kernels", name, "kernel.json.in")) as f:
                spec = f.read().replace("@LAUNCHER@",
                                        os.path.join(self.bin, "codexec-kernel-launcher"))
                spec = spec.replace("@SANDBOX_CONF@", self.sandbox_conf)
            self.write_file(os.path.join(self.kernelspecs_dir, "kernels", name, "kernel.json"),
                            spec, 0o644, "root")

    def write_config(self):
        lines = {
            "listen": f"unix:{self.socket}",
            "socket_mode": "0660",
            "workers": str(self.workers),
            "log_file": os.path.join(self.logdir, "codexec.log"),
            "database": self.conninfo,
            "gateway_url": self.gateway_url,
            "gateway_token": self.gateway_token,
            "kernel_name": KERNEL_NAME,
            **{f"kernel_name_{l}": LANGUAGE_KERNELS[l] for l in self.languages},
            "storage_dir": self.storage,
            "secret_file": self.secret,
            "delivery": "x-accel",
            "x_accel_prefix": "/_codexec_storage/",
            "revoked_keys_dir": self.revoked,
            # FastCGI params count only with nginx's key (web-key.conf)
            "web_server_key": "true",
            # a new conversation's first run finds a kernel already started
            "kernel_pool_size": "2",
            # ... with the data stack already imported (see kernel-image.list)
            "kernel_preload": PRELOAD,
        }
        lines.update(self.conf_extra)
        text = "# Written by packaging/stack.py; see docs/configuration.md for every key.\n"
        text += "".join(f"{k} = {v}\n" for k, v in lines.items())
        self.write_file(self.conf, text, 0o640)

    def write_nginx(self):
        ndir = os.path.join(self.var, "nginx")
        for name in ("codexec-locations.conf", "codexec-storage.conf", "codexec-storage-s3.conf",
                     "codexec-links.conf", "codexec-log.conf"):
            with open(os.path.join(REPO, "nginx", name)) as f:
                self.write_file(os.path.join(ndir, name),
                                f.read().replace("client_max_body_size 64m;",
                                                 f"client_max_body_size {self.nginx_body};"), 0o644)
        # Signed links checked by nginx itself (docs/api.md, "Signed links at the
        # edge"), with storage_dir only: the store's objects are not files.
        # Without the module (a build without nginx's source), links go to
        # codexec, as with Apache.
        have_module = os.path.exists(self.link_module)
        edge = self.edge_links and self.conf_extra.get("storage", "local") != "s3" and have_module
        # (the module loaded even when links go to codexec)
        edge_module = f"load_module {self.link_module};\n" if have_module else ""
        edge_server = "" if not edge else f"""
        location ~ ^/v1/artifacts/[^/]+/content$ {{
            include {self.link_key_conf};
            codexec_link_revoked {self.revoked};
            codexec_link_storage {self.storage};
            include {ndir}/codexec-links.conf;
        }}
"""
        s3_location = "" if not self.s3_port else f"""
        location /_codexec_s3/ {{
            internal;
            include {ndir}/codexec-storage-s3.conf;
            proxy_pass http://127.0.0.1:{self.s3_port}$codexec_s3_path;
        }}
"""
        # The snippet includes snippets/codexec-fastcgi.conf relative to the
        # config directory, as it would under /etc/nginx.
        os.makedirs(os.path.join(ndir, "snippets"), exist_ok=True)
        with open(os.path.join(REPO, "nginx", "codexec-fastcgi.conf")) as f:
            self.write_file(os.path.join(ndir, "snippets", "codexec-fastcgi.conf"),
                            f.read().replace("/etc/codexec/nginx-web-key*.conf",
                                             os.path.join(ndir, "web-key*.conf")), 0o644)
        with open(os.path.join(REPO, "nginx", "codexec-pass.conf")) as f:
            self.write_file(os.path.join(ndir, "snippets", "codexec-pass.conf"), f.read(), 0o644)
        tmp = os.path.join(ndir, "tmp")
        conf = f"""# Written by packaging/stack.py.
{edge_module}daemon off;
worker_processes 2;
pid {self.rundir}/nginx-master.pid;
error_log {self.logdir}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    include {ndir}/codexec-log.conf;  # no query strings: no link's signature
    access_log {self.logdir}/nginx-access.log codexec;
    client_body_temp_path {tmp}/body;
    fastcgi_temp_path {tmp}/fastcgi;
    proxy_temp_path {tmp}/proxy;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    sendfile on;
    tcp_nopush on;
    server_tokens off;
    upstream codexec_fcgi {{
        server unix:{self.socket};
    }}

    server {{
        listen 127.0.0.1:{self.http_port};
        server_name localhost;
        large_client_header_buffers 4 16k;
{edge_server}        include {ndir}/codexec-locations.conf;

        location /_codexec_storage/ {{
            internal;
            alias {self.storage}/;
            include {ndir}/codexec-storage.conf;
        }}
{s3_location}{self.nginx_extra}
    }}
{self.ragflow_server(ndir)}}}
"""
        self.write_file(os.path.join(ndir, "nginx.conf"), conf, 0o644)

    def init_pg(self):
        if os.path.exists(os.path.join(self.pg_data, "PG_VERSION")):
            return
        log("initialising the PostgreSQL cluster")
        self.run([f"{PG_BIN}/initdb", "-D", self.pg_data, "-U", "codexec", "--auth=trust",
                  "-E", "UTF8", "--locale=C.UTF-8"], user=self.db_user)
        extra = ("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                 if self.fast_pg else "")
        with os.fdopen(self.open_nofollow(os.path.join(self.pg_data, "postgresql.conf"),
                                          os.O_WRONLY | os.O_APPEND), "a") as f:
            f.write(f"\n# codexec stack\nlisten_addresses = ''\n"
                    f"unix_socket_directories = '{self.pg_run}'\nport = {self.pg_port}\n"
                    f"max_connections = 200\n{extra}")

    # --- services -----------------------------------------------------------
    def pg_running(self):
        r = self.run([f"{PG_BIN}/pg_ctl", "-D", self.pg_data, "status"], check=False,
                     user=self.db_user)
        return r.returncode == 0

    def start_pg(self):
        if not self.pg_running():
            log("starting PostgreSQL")
            # A crash can leave a stale pid file behind; pg_ctl copes with it.
            self.run([f"{PG_BIN}/pg_ctl", "-D", self.pg_data, "-l",
                      os.path.join(self.logdir, "postgresql.log"), "-w", "-t", "60", "start"],
                     user=self.db_user)
        r = self.run([f"{PG_BIN}/psql", "-h", self.pg_run, "-p", str(self.pg_port), "-U",
                      "codexec", "-d", "postgres", "-tAc",
                      "SELECT 1 FROM pg_database WHERE datname = 'codexec'"])
        if r.stdout.strip() != "1":
            self.run([f"{PG_BIN}/createdb", "-h", self.pg_run, "-p", str(self.pg_port), "-U",
                      "codexec", "codexec"])

    def gateway_pid(self, name="jupyter"):
        """The Jupyter server's pid (supervise.py's child), or None."""
        sup = self.pid(name)
        try:
            with open(f"/proc/{sup}/task/{sup}/children") as f:
                kids = [int(p) for p in f.read().split()]
        except (OSError, ValueError, TypeError):
            return None
        return kids[0] if kids and pid_alive(kids[0]) else None

    def gateway_ok(self, url=None):
        req = urllib.request.Request((url or self.gateway_direct_url) + "/api/kernelspecs",
                                     headers={"Authorization": f"token {self.gateway_token}"})
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def start_jupyter(self):
        if self.pid("jupyter") and self.gateway_ok():
            return
        self.kill_pidfile("jupyter")
        if port_open(self.gateway_port):
            raise StackError(f"port {self.gateway_port} is taken by another program")
        log(f"starting the Jupyter server on 127.0.0.1:{self.gateway_port}")
        proc = self.spawn_jupyter("jupyter", self.gateway_port)
        self.wait_for("the Jupyter server", self.gateway_ok, 90, proc)

    def spawn_jupyter(self, name, port):
        """A Jupyter server with the stack's kernelspecs, token and users on
        port; its pid file and log are named name."""
        jdir = self.jdir if name == "jupyter" else os.path.join(self.var, name)
        # A kernel's sockets are "<runtime>/kernel-<uuid>-ipc-<n>": a socket
        # address holds 107 bytes, so the path must leave 50 of them.
        runtime = os.path.join(jdir, "runtime")
        if len(os.fsencode(runtime)) > 107 - 50:
            raise StackError(f"the checkout's path is too long for the kernels' sockets: {runtime}"
                             f" is {len(os.fsencode(runtime))} bytes, at most 57 fit; clone into a"
                             " shorter path")
        if jdir != self.jdir:  # another server: its own runtime and home
            for path, owner, mode in ((jdir, "root", 0o755), (os.path.join(jdir, "home"), self.kernel_user, 0o700),
                                      (os.path.join(jdir, "runtime"), self.kernel_user, 0o700),
                                      (os.path.join(jdir, "config"), self.kernel_user, 0o700),
                                      (os.path.join(jdir, "data"), self.kernel_user, 0o700)):
                if os.path.islink(path):
                    raise StackError(f"{path} is a symlink: refusing to use it")
                os.makedirs(path, exist_ok=True)
                self.chown(path, owner)
                os.chmod(path, mode)
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": os.path.join(jdir, "home"),
            "JUPYTER_PATH": self.kernelspecs_dir,
            "JUPYTER_RUNTIME_DIR": os.path.join(jdir, "runtime"),
            "JUPYTER_CONFIG_DIR": os.path.join(jdir, "config"),
            "JUPYTER_DATA_DIR": os.path.join(jdir, "data"),
            "JUPYTER_TOKEN": self.gateway_token,  # not in argv, where ps shows it
            # As the package's unit (codexec-gateway.service): captured
            # files' 1 MiB buffers are not returned and faulted in again.
            "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4194304:glibc.malloc.trim_threshold=33554432",
        }
        # The package's (packaging/jupyter_server_config.py: what keeps one
        # tenant's kernel from taking the server), root's, outside the
        # server's own tree.
        server_conf = os.path.join(self.var, "jupyter_server_config.py")
        with open(os.path.join(REPO, "packaging", "jupyter_server_config.py")) as f:
            self.write_file(server_conf, f.read(), 0o644, "root")
        # supervise.py starts it again when it dies (at its memory bound, say)
        return self.spawn(name, [
            "/usr/bin/python3", os.path.join(self.bin, "supervise.py"),
            "/usr/bin/python3", "-m", "jupyter_server", f"--config={server_conf}",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0", "--ServerApp.open_browser=False",
            # no terminals: the gateway's token must not be a shell outside
            # the sandbox
            "--ServerApp.terminals_enabled=False",
            f"--ServerApp.root_dir={self.workspaces}",
            "--KernelManager.transport=ipc",
            # The last resort against leaked kernels (codexec's reconciler
            # is the first): idle four hours, far beyond max_ttl.
            "--MappingKernelManager.cull_idle_timeout=14400",
            "--MappingKernelManager.cull_interval=600",
            f"--MappingKernelManager.default_kernel_name={KERNEL_NAME}",
        ] + [f"--KernelSpecManager.allowed_kernelspecs={k}" for k in self.kernelspecs],
            env=env, cwd=self.workspaces, user=self.kernel_user,
            cgroup=getattr(self, "cgroup_server", None))

    def start_gateway_proxy(self):
        """nginx in front of the Jupyter server, serving only the Kernel
        Gateway surface: everything else is 404."""
        if not self.gateway_proxy_port:
            return
        if self.pid("gateway-proxy") and self.gateway_ok(self.gateway_url):
            return
        self.kill_pidfile("gateway-proxy")
        gdir = os.path.join(self.var, "gateway-proxy")
        for path, owner, mode in ((gdir, "root", 0o755), (os.path.join(gdir, "tmp"), self.user, 0o700)):
            if os.path.islink(path):
                raise StackError(f"{path} is a symlink: refusing to use it")
            os.makedirs(path, exist_ok=True)
            self.chown(path, owner)
            os.chmod(path, mode)
        for name in ("gateway-proxy-error.log", "gateway-proxy-access.log"):
            self.make_log(name, self.user)
        up = f"http://127.0.0.1:{self.gateway_port}"
        proxied = f"""proxy_pass {up};
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host 127.0.0.1:{self.gateway_port};
            proxy_buffering off;
            proxy_buffer_size 256k;  # the WebSocket's buffer each way
            proxy_buffers 4 256k;
            proxy_busy_buffers_size 256k;
            proxy_read_timeout 86400s;"""
        conf = f"""# Written by packaging/stack.py: the Kernel Gateway surface only.
daemon off;
worker_processes 1;
pid {self.rundir}/gateway-proxy.pid;
error_log {self.logdir}/gateway-proxy-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log {self.logdir}/gateway-proxy-access.log;
    client_body_temp_path {gdir}/tmp/body;
    proxy_temp_path {gdir}/tmp/proxy;
    fastcgi_temp_path {gdir}/tmp/fastcgi;
    uwsgi_temp_path {gdir}/tmp/uwsgi;
    scgi_temp_path {gdir}/tmp/scgi;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
    server {{
        listen 127.0.0.1:{self.gateway_proxy_port};
        location ~ ^/api/kernels(/|$) {{
            {proxied}
        }}
        location ~ ^/api/kernelspecs(/|$) {{
            {proxied}
        }}
        location / {{ return 404; }}
    }}
}}
"""
        self.write_file(os.path.join(gdir, "nginx.conf"), conf, 0o644)
        log(f"starting the gateway proxy on 127.0.0.1:{self.gateway_proxy_port}")
        proc = self.spawn("gateway-proxy", ["/usr/sbin/nginx", "-p", gdir, "-c",
                                            os.path.join(gdir, "nginx.conf"), "-e",
                                            os.path.join(self.logdir, "gateway-proxy-error.log")])
        self.wait_for("the gateway proxy", lambda: self.gateway_ok(self.gateway_url), 30, proc)

    def fcgi_ok(self):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(self.socket)
            return True
        except OSError:
            return False

    def start_fcgi(self):
        self.run([self.admin, "--config", self.conf, "migrate"])
        if self.pid("codexec-fcgi") and self.fcgi_ok():
            return
        self.kill_pidfile("codexec-fcgi")
        if not os.path.exists(self.secret):
            # as root (var/ is root's), then codexec's alone
            self.run([self.admin, "--config", self.conf, "secret", "init"], user="root")
            self.chown(self.secret, self.user)
            os.chmod(self.secret, 0o600)
        log("starting codexec-fcgi")
        env = dict(os.environ)
        proc = self.spawn("codexec-fcgi", [os.path.join(self.bin, "codexec-fcgi"), "--config",
                                           self.conf], env=env)
        self.wait_for("codexec-fcgi", self.fcgi_ok, 30, proc)

    def nginx_ok(self):
        try:
            with urllib.request.urlopen(self.url + "/v1/health", timeout=5) as r:
                return r.status in (200, 503)
        except urllib.error.HTTPError as e:
            return e.code in (200, 503)
        except OSError:
            return False

    def web_key(self):
        """The web server's key (web_server_key), as nginx sends it."""
        r = self.run([self.admin, "--config", self.conf, "web-server-key"], user="root")
        return r.stdout.split('"')[1]

    def write_web_key(self):
        """nginx's proof of its FastCGI params, for nginx alone (root's on a
        real host; nginx runs as codexec's user here)."""
        r = self.run([self.admin, "--config", self.conf, "web-server-key"], user="root")
        self.write_file(os.path.join(self.var, "nginx", "web-key.conf"), r.stdout, 0o600)

    def write_link_key(self):
        """The key nginx checks signed links with (derived for links only,
        never the server secret), for nginx alone: it runs as codexec's
        user here, as root reading its configuration on a real host."""
        r = self.run([self.admin, "--config", self.conf, "nginx-link-key"], user="root")
        self.write_file(self.link_key_conf, r.stdout, 0o600)
        self.write_web_key()

    def ragflow_server(self, ndir):
        """nginx/codexec-ragflow.conf's server block, on ragflow_port, its
        key from the file set_ragflow_key writes (none yet: a glob that
        matches nothing, and codexec answers 401)."""
        if not self.ragflow_port:
            return ""
        with open(os.path.join(REPO, "nginx", "codexec-ragflow.conf")) as f:
            text = f.read()
        if "listen 8081;" not in text or "/etc/codexec/nginx-ragflow-key.conf" not in text:
            raise StackError("nginx/codexec-ragflow.conf changed: its listen or key line moved")
        return (text.replace("listen 8081;", f"listen 127.0.0.1:{self.ragflow_port};")
                .replace("/etc/codexec/nginx-ragflow-key.conf", os.path.join(ndir, "ragflow-key*.conf"))
                .replace("include snippets/", f"include {ndir}/snippets/"))

    def set_ragflow_key(self, key):
        """The key the RAGFlow listener adds to what it passes (nginx reloaded)."""
        if not key or not re.match(r"^cx_[A-Za-z0-9_-]{43}$", key):
            raise StackError("the RAGFlow listener's key is not an API key")
        ndir = os.path.join(self.var, "nginx")
        self.write_file(os.path.join(ndir, "ragflow-key.conf"),
                        f'fastcgi_param HTTP_AUTHORIZATION "Bearer {key}";\n', 0o600)
        self.reload_nginx()
        # the listener answers with the key once the reload took (a port
        # another program holds would leave nginx on its old configuration)
        url = f"http://127.0.0.1:{self.ragflow_port}/compat/ragflow/healthz"
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise StackError(f"the RAGFlow listener on 127.0.0.1:{self.ragflow_port} does not "
                                 "answer with its key (is the port another program's?)")
            time.sleep(0.2)

    def reload_nginx(self):
        """nginx with a configuration written again (write_nginx)."""
        pid = self.pid("nginx")
        if not pid:
            return
        self.write_link_key()
        os.kill(pid, signal.SIGHUP)
        time.sleep(0.5)  # new workers take over; old ones finish their requests

    def start_nginx(self):
        if self.pid("nginx") and self.nginx_ok():
            return
        self.kill_pidfile("nginx")
        for port, what in ((self.http_port, "the API"), (self.ragflow_port, "the RAGFlow listener")):
            if port and port_open(port):
                raise StackError(f"port {port} ({what}) is taken by another program")
        log(f"starting nginx on 127.0.0.1:{self.http_port}")
        self.write_link_key()
        ndir = os.path.join(self.var, "nginx")
        proc = self.spawn("nginx", ["/usr/sbin/nginx", "-p", ndir, "-c",
                                    os.path.join(ndir, "nginx.conf"), "-e",
                                    os.path.join(self.logdir, "nginx-error.log")])
        self.wait_for("nginx", self.nginx_ok, 30, proc)

    def up(self):
        self.init()
        self.start_pg()
        self.start_jupyter()
        self.start_fcgi()
        self.start_nginx()

    # --- keys ---------------------------------------------------------------
    def create_key(self, user, label=None, approval=False):
        argv = [self.admin, "--config", self.conf, "key", "create", "--user", user]
        if label:
            argv += ["--label", label]
        if approval:
            argv += ["--require-approval"]
        return self.run(argv).stdout.strip()

    # --- stop ---------------------------------------------------------------
    def kill_pidfile(self, name, sig=signal.SIGTERM, timeout=20):
        pid = self.pid(name)
        path = os.path.join(self.piddir, f"{name}.pid")
        if pid:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
        if os.path.exists(path):
            os.unlink(path)

    def leftovers(self):
        """Processes whose command line names this stack's directory."""
        found = []
        me = os.getpid()
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == me:
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if self.var + "/" in cmd and pid_alive(int(d)):
                found.append((int(d), cmd.strip()))
        return found

    def down(self):
        self.kill_pidfile("nginx", signal.SIGQUIT)
        self.kill_pidfile("codexec-fcgi")
        self.kill_pidfile("gateway-proxy", signal.SIGQUIT)
        self.kill_pidfile("jupyter")
        self.kill_pidfile("s3-sigcheck")
        self.kill_pidfile("s3rver")
        if os.path.exists(os.path.join(self.pg_data, "PG_VERSION")) and self.pg_running():
            self.run([f"{PG_BIN}/pg_ctl", "-D", self.pg_data, "-m", "fast", "-w", "stop"],
                     check=False, user=self.db_user)
        # pg_ctl -w returns once the pid file is gone, a moment before the
        # postmaster has exited: let stragglers finish, then kill what stays.
        self.wait_leftovers(10)
        for pid, _ in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.wait_leftovers(5)
        self.teardown_cgroups()

    def wait_leftovers(self, timeout):
        deadline = time.monotonic() + timeout
        while self.leftovers() and time.monotonic() < deadline:
            time.sleep(0.1)

    def status(self):
        self.load_ports_readonly()
        return {
            "postgresql": os.path.exists(os.path.join(self.pg_data, "PG_VERSION")) and self.pg_running(),
            "jupyter": bool(self.pid("jupyter")),
            "codexec-fcgi": bool(self.pid("codexec-fcgi")),
            "nginx": bool(self.pid("nginx")),
        }

    def load_ports_readonly(self):
        try:
            with open(self.ports_file) as f:
                saved = json.load(f)
            self.gateway_port = self.gateway_port or saved.get("gateway")
        except (OSError, ValueError):
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["up", "down", "status", "key", "ragflow-key"])
    ap.add_argument("--var", default=os.path.join(REPO, "var"))
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--gateway-port", type=int)
    ap.add_argument("--build", help="the build tree (default: build/)")
    ap.add_argument("--user", help="for `key`: the user the key is for")
    ap.add_argument("--ragflow-port", type=int, help="the listener for RAGFlow (codexec-ragflow.conf)")
    a = ap.parse_args()
    st = Stack(a.var, http_port=a.port, gateway_port=a.gateway_port, build=a.build,
               ragflow_port=a.ragflow_port)
    try:
        if a.command == "up":
            st.up()
        elif a.command == "down":
            st.down()
            left = st.leftovers()
            if left:
                raise StackError(f"processes left behind: {left}")
        elif a.command == "status":
            s = st.status()
            for k, v in s.items():
                print(f"{k:14} {'running' if v else 'stopped'}")
            return 0 if all(s.values()) else 3
        elif a.command == "key":
            st.init_secret_files()
            print(st.create_key(a.user or "demo"))
        elif a.command == "ragflow-key":
            st.set_ragflow_key(os.environ.get("CODEXEC_RAGFLOW_KEY"))  # (not on a command line)
    except StackError as e:
        log(str(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
