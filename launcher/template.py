# codexec's kernel template (docs/internals/sandbox.md, "Kernels forked
# from a template"). Embedded into codexec-kernel-launcher at build time and
# run by it, in a sandbox of its own, as
#
#   python3 -P -c <this> --fds LISTEN,SERVER,KEEPER,READY --preload M,M -- ARGS
#
# once per Jupyter server and sandbox settings. It imports the kernel's
# modules (ipykernel, IPython, the preload: numpy, pandas, matplotlib) and
# builds the kernel application up to its sockets, once; then, for each
# launcher that asks, it forks a kernel. Each kernel shares the template's
# pages copy-on-write: an idle kernel costs the pages it has written, not a
# whole Python process with the data stack.
#
# No tenant code ever runs in the template: what it holds when it forks is
# the same for every kernel (and reseeded where it must differ: random
# number generators, the session's id). The launcher holds everything else:
#
#   launcher -> template   "F" + the kernel's settings, with its output pipe
#                          and the seccomp filter (SCM_RIGHTS)
#   template: fork -> C    C: a user namespace of its own, uid 65534 mapped
#   C -> launcher          "U" with C's credentials (SCM_CREDENTIALS): the
#                          launcher moves C into the kernel's cgroup
#   launcher -> C          "G"
#   C                      the other namespaces (mount, pid, network, IPC,
#                          UTS, cgroup); fork -> K, pid 1 of its own pid
#                          namespace
#   C -> launcher          "K" with a pidfd of K; C ends
#   launcher               builds K's root from outside (launcher/template.c):
#                          the system read-only, its workspace, its /tmp,
#                          /dev and /proc, pivot_root; brings up loopback
#   launcher -> K          "S"
#   K                      its stdio, rlimits, no capabilities, no new
#                          privileges, the seccomp filter; the kernel
#
# Any failure is "E" + why, then the end of that process (never a kernel
# half set up). Everything here is the launcher's own code: a request is
# parsed strictly all the same.
import ctypes
import gc
import importlib
import os
import resource
import select
import signal
import socket
import struct
import sys
import uuid

libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_CHILD_SUBREAPER = 36
SYS_capset = 126
SYS_pidfd_open = 434
REQUEST_MAX = 8192
BPF_MAX = 4096 * 8  # BPF_MAXINSNS instructions of 8 bytes
SANDBOX_UID = 65534


class Failed(Exception):
    pass


def check(rc, what):
    if rc < 0:
        err = ctypes.get_errno()
        raise Failed(f"{what}: {os.strerror(err)}")
    return rc


def prctl(option, arg2=0, arg3=0, what="prctl"):
    return check(libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3),
                            ctypes.c_ulong(0), ctypes.c_ulong(0)), what)


def say(text):
    try:
        os.write(2, f"codexec-kernel-template: {text}\n".encode())
    except OSError:
        pass


# --- the request ------------------------------------------------------------

class Request:
    """The launcher's "F": key=value fields, NUL-separated, every one
    required and checked."""
    NUMBERS = ("address_space", "data", "processes", "file_size", "open_files")

    def __init__(self, data, fds):
        if len(fds) != 2:
            raise Failed("a request with the wrong descriptors")
        self.out_fd, self.seccomp_fd = fds
        fields = data.split(b"\0")
        if fields[0] != b"F1" or fields[-1] != b"":
            raise Failed("a malformed request")
        kv = {}
        for f in fields[1:-1]:
            k, sep, v = f.partition(b"=")
            if not sep or k in kv:
                raise Failed("a malformed request")
            kv[k.decode("ascii")] = v
        if set(kv) != {"connection_file", *self.NUMBERS}:
            raise Failed("a request with the wrong fields")
        conn = kv["connection_file"].decode("utf-8")
        if not conn.startswith("/") or "\0" in conn or len(conn) > 1024:
            raise Failed("a malformed connection file path")
        self.connection_file = conn
        for k in self.NUMBERS:
            v = kv[k]
            if not v.isdigit() or len(v) > 19:
                raise Failed(f"a malformed {k}")
            setattr(self, k, int(v))
        if self.data not in (0, 1) or not 16 <= self.processes <= 1 << 20 \
                or not 64 <= self.open_files <= 1 << 20:
            raise Failed("a request out of bounds")


# --- the kernel application --------------------------------------------------

class Kernel:
    """ipykernel's application, built in the template up to its sockets
    ("deep": config, the kernel object and its shell, the start-up code), so
    that a kernel runs only what is its own: its sockets, threads and
    streams. Any other ipykernel than 6.x is started whole in each kernel
    ("plain"), sharing only the imports."""

    def __init__(self, argv):
        self.argv = argv
        import ipykernel
        from ipykernel.kernelapp import IPKernelApp
        self.deep = ipykernel.version_info[0] == 6
        if not self.deep:
            return
        # the debugger (debugpy) is never offered (kernelspec: debugger
        # false); without it no debug socket's stream is made
        import ipykernel.ipkernel
        ipykernel.ipkernel._is_debugpy_available = False
        app = self.app = IPKernelApp.instance()
        app._init_asyncio_patch()
        super(IPKernelApp, app).initialize(argv)
        if app.subapp is not None:
            raise Failed("the kernel's arguments started a subcommand")
        app.init_pdb()
        app.init_blackhole()
        app.init_poller()
        app.kernel = app.kernel_class.instance(
            parent=app, session=app.session, control_stream=None, debugpy_stream=None,
            debug_shell_socket=None, shell_stream=None, control_thread=None, iopub_thread=None,
            iopub_socket=None, stdin_socket=None, log=app.log, profile_dir=app.profile_dir,
            user_ns=app.user_ns)
        app.init_path()
        app.init_shell()
        app.init_gui_pylab()
        app.init_extensions()
        app.init_code()

    def start(self, connection_file):
        """In the kernel, once sandboxed. Never returns."""
        if not self.deep:
            from ipykernel.kernelapp import IPKernelApp
            IPKernelApp.launch_instance(argv=self.argv + ["-f", connection_file])
            os._exit(0)
        app, kernel = self.app, self.app.kernel
        from pathlib import Path
        from zmq.eventloop.zmqstream import ZMQStream
        # what IPython took of the template's working directory: the
        # kernel's is its workspace (capture scans starting_dir)
        kernel.shell.starting_dir = os.getcwd()
        kernel.shell.history_manager.dir_hist[:] = [Path.cwd()]
        # the profile's directories, in this kernel's fresh /tmp
        os.makedirs(app.profile_dir.location, exist_ok=True)
        app.profile_dir.check_dirs()
        app.connection_file = connection_file
        app.load_connection_file(connection_file)
        app.session.pid = os.getpid()  # its messages are this process's
        app.session.session = str(uuid.uuid4())
        app.init_sockets()
        app.init_heartbeat()
        app.write_connection_file()
        app.init_io()
        app.init_signal()
        kernel.shell_stream = ZMQStream(app.shell_socket)
        kernel.control_stream = ZMQStream(app.control_socket, app.control_thread.io_loop)
        kernel.debugpy_stream = ZMQStream(app.debugpy_socket, app.control_thread.io_loop)
        app.control_thread.start()
        kernel.control_thread = app.control_thread
        kernel.iopub_thread = app.iopub_thread
        kernel.iopub_socket = app.iopub_socket
        kernel.stdin_socket = app.stdin_socket
        kernel.debug_shell_socket = app.debug_shell_socket
        kernel.shell.displayhook.pub_socket = app.iopub_socket
        kernel.shell.display_pub.pub_socket = app.iopub_socket
        kernel.record_ports({name + "_port": port for name, port in app._ports.items()})
        app.displayhook.get_execution_count = lambda: kernel.execution_count
        kernel.shell.events.register("pre_execute", reap_orphans)
        sys.stdout.flush()
        sys.stderr.flush()
        # what the start freed of the template's heap pages it copied goes
        # back (the pages it still shares stay shared)
        libc.malloc_trim(0)
        app.start()
        os._exit(0)


def preload(modules):
    """Imported here, shared by every kernel (codexec's kernel_preload
    imports them again in a pooled kernel: a lookup)."""
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 (a module of the image; say which)
            say(f"preload: {m} failed to import: {type(e).__name__}")


# --- the kernel's side: C, then K --------------------------------------------

def write_proc(name, text):
    fd = os.open(f"/proc/self/{name}", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def expect(conn, word):
    got = conn.recv(16)
    if got != word:
        raise Failed(f"the launcher said {got[:1]!r}, not {word!r}")


def drop_capabilities():
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        prctl(PR_CAPBSET_DROP, cap, what="dropping the bounding set")
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, what="clearing ambient capabilities")
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two of {effective, permitted, inheritable}, all empty
    check(libc.syscall(SYS_capset, header, data), "capset")


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def seccomp(fd):
    """The launcher's filter (libseccomp's BPF, as bwrap --seccomp loads
    it), on top of the template's own."""
    prog = os.pread(fd, BPF_MAX + 1, 0)
    if not prog or len(prog) % 8 or len(prog) > BPF_MAX:
        raise Failed("a malformed seccomp filter")
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = SockFprog(len(prog) // 8, ctypes.addressof(buf))
    prctl(PR_SET_NO_NEW_PRIVS, 1, what="no new privileges")
    check(libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                     ctypes.byref(fprog), ctypes.c_ulong(0), ctypes.c_ulong(0)), "seccomp")


def reseed():
    """What the fork copied and must differ between kernels: Python's
    random (os.fork reseeded it already), numpy's legacy global generator
    (seeded once, at its import) and multiprocessing's authentication key
    (made at its import)."""
    import random
    random.seed()
    r = sys.modules.get("numpy.random")
    if r is not None:
        r.seed()
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        mp.current_process().authkey = os.urandom(32)


def reap_orphans(*_):
    """pid 1 of its namespace, the kernel inherits every orphan of the
    sandbox: the run's end (the launcher, the epilogue) ends them, and
    what it ended after the epilogue's own reaping is reaped before the
    next cell runs, not left holding the sandbox's pids. Every process but
    the kernel ended with the run: no status a later cell waits for is
    taken."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def own_user_namespace():
    """K's user namespace of its own, nested in the one that owns K's other
    namespaces (as bwrap's --disable-userns nests one): capabilities K
    could ever hold again would hold no power over its mounts (the sealed
    runtime directory, its read-only root), its network or its
    namespaces' limits. C makes it after those, before K is forked and
    its pidfd sent: the launcher, once it has the pidfd, sets the owner's
    max_user_namespaces to 0 (a K that made its own after that would
    find none left)."""
    check(libc.unshare(CLONE_NEWUSER), "a user namespace of the kernel's own")
    write_proc("setgroups", "deny")
    write_proc("uid_map", f"{SANDBOX_UID} {SANDBOX_UID} 1\n")
    write_proc("gid_map", f"{SANDBOX_UID} {SANDBOX_UID} 1\n")


def become_kernel(conn, req, kernel):
    """K: pid 1 of its namespaces, waiting for its root. Never returns."""
    expect(conn, b"S")
    # Nothing of the workspace (the tenant's, kept across restarts) may be
    # imported while the kernel starts: the template's start-up code put
    # it ('') last on sys.path, for the tenant's cells; it comes back once
    # the kernel is sandboxed (Kernel.start).
    while "" in sys.path:
        sys.path.remove("")
    sys.path_importer_cache.pop("", None)
    os.setsid()
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(req.out_fd, 1)
    os.dup2(req.out_fd, 2)
    os.chdir("/workspace")
    limits = [(resource.RLIMIT_DATA if req.data else resource.RLIMIT_AS, req.address_space),
              (resource.RLIMIT_NPROC, req.processes), (resource.RLIMIT_FSIZE, req.file_size),
              (resource.RLIMIT_NOFILE, req.open_files),
              # no core file (a piped core_pattern: docs/sandbox.md, "Host settings")
              (resource.RLIMIT_CORE, 0)]
    for which, value in limits:
        resource.setrlimit(which, (value, value))
    reseed()
    seccomp_fd = req.seccomp_fd
    conn.detach()
    drop_capabilities()
    # nothing of the template's or the launcher's stays open: 0, 1 and 2
    keep = os.dup(seccomp_fd)
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 20)
    seccomp(keep)
    os.close(keep)
    sys.path.append("")  # the workspace's own modules, after every installed one
    kernel.start(req.connection_file)


def read_request(conn):
    """The launcher's "F", read by C: the template never holds one (another
    tenant's kernel id would be in every later kernel's copy of its
    heap)."""
    conn.settimeout(10)
    data, fds, flags, _ = socket.recv_fds(conn, REQUEST_MAX, 2)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise Failed("a request too long")
    try:
        return Request(data, fds)
    except Failed:
        for fd in fds:
            os.close(fd)
        raise


def child(listener, conn, kernel):
    """C, the template's child. Never returns."""
    try:
        listener.detach()
        for fd in TEMPLATE_FDS:
            os.close(fd)
        req = read_request(conn)
        conn.settimeout(60)
        check(libc.unshare(CLONE_NEWUSER), "a user namespace")
        write_proc("setgroups", "deny")
        write_proc("uid_map", f"{SANDBOX_UID} {SANDBOX_UID} 1\n")
        write_proc("gid_map", f"{SANDBOX_UID} {SANDBOX_UID} 1\n")
        # with a pidfd of C: the launcher moves C's pid into the cgroup
        # only while that pid is still C
        me = check(libc.syscall(SYS_pidfd_open, os.getpid(), 0), "pidfd_open")
        creds = struct.pack("3i", os.getpid(), os.getuid(), os.getgid())
        conn.sendmsg([b"U"], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds),
                              (socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", me))])
        os.close(me)
        expect(conn, b"G")  # in the kernel's cgroup by now
        check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
                           | CLONE_NEWUTS | CLONE_NEWCGROUP), "the kernel's namespaces")
        own_user_namespace()
        pid = os.fork()
        if pid == 0:
            become_kernel(conn, req, kernel)
        pidfd = check(libc.syscall(SYS_pidfd_open, pid, 0), "pidfd_open")
        socket.send_fds(conn, [b"K"], [pidfd])
        os._exit(0)
    except BaseException as e:  # noqa: BLE001 (said to the launcher, then the end)
        try:
            conn.send(b"E" + str(e).encode("utf-8", "replace")[:512])
        except OSError:  # K, past "S": its stderr is the launcher's log
            say(f"the kernel did not start: {type(e).__name__}: {str(e)[:512]}")
        os._exit(1)


# --- the template -------------------------------------------------------------

TEMPLATE_FDS = []


def serve_one(listener, kernel):
    """A launcher's connection: a child of its own (C) reads its request,
    so nothing of it ever reaches the template's memory."""
    try:
        conn, _ = listener.accept()
    except (BlockingIOError, InterruptedError):
        return
    try:
        if os.fork() == 0:
            child(listener, conn, kernel)
    except OSError as e:
        try:
            conn.send(b"E" + str(e).encode("utf-8", "replace")[:512])
        except OSError:
            pass
    finally:
        conn.close()


def reap():
    """The kernels are orphans of their C: the template reaps them."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(listener, ends, kernel):
    poller = select.poll()
    poller.register(listener.fileno(), select.POLLIN)
    for fd in ends:
        poller.register(fd, select.POLLIN)
    while True:
        for fd, _ in poller.poll(1000):
            if fd in ends:  # the Jupyter server or the keeper ended
                return
            serve_one(listener, kernel)
        reap()


def precompile(sources):
    """codexec's own Python (lib/codexec.h cx_kernel_source), kept where
    every run looks for it first, exactly as a kernel keeps it the first
    time a request carries it (lib/runend.c, capture.c, files.c): compiled
    once here, not in each kernel (2-3 MiB of each kernel's pages, and
    milliseconds of its first run). A version codexec no longer sends is
    only compiled again."""
    import hashlib

    def version(src):
        return hashlib.sha256(os.fsencode(src)).hexdigest()

    if "epilogue" in sources:
        d = {"__name__": "__codexec__"}
        exec(sources["epilogue"], d)
        setattr(sys, "_codexec_epi_" + version(sources["epilogue"])[:16], d["epilogue"])
    if "capture" in sources:
        sys._codexec_capture = (version(sources["capture"]),
                                compile(sources["capture"], "<codexec-capture>", "exec"))
    if "files" in sources:
        d = {"__name__": "__codexec__"}
        exec(sources["files"], d)
        sys._codexec_files, sys._codexec_files_v = d["run"], version(sources["files"])


def shared_writable():
    """Writable shared mappings (a module's MAP_SHARED file or memory, SysV
    shared memory): a fork shares them live, not copied."""
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 1 and fields[1][1] == "w" and fields[1][3] == "s":
                found.append(fields[5] if len(fields) > 5 else "[anonymous]")
    return found


def parse_args(argv):
    fds, modules, sources = None, [], {}
    while argv and argv[0] != "--":
        if argv[0] == "--fds" and len(argv) > 1:
            fds = [int(x) for x in argv[1].split(",")]
        elif argv[0] == "--preload" and len(argv) > 1:
            modules = [m for m in argv[1].split(",") if m]
        elif argv[0] in ("--epilogue", "--capture", "--files") and len(argv) > 1:
            sources[argv[0][2:]] = argv[1]
        else:
            raise Failed(f"unknown argument {argv[0]!r}")
        argv = argv[2:]
    if not fds or len(fds) != 4 or not argv:
        raise Failed("usage: --fds LISTEN,SERVER,KEEPER,READY [--preload M,M] "
                     "[--epilogue|--capture|--files SOURCE] -- ARGS")
    return fds, modules, sources, argv[1:]


READY = []


def main():
    (listen_fd, server_fd, keeper_fd, ready_fd), modules, sources, argv = parse_args(sys.argv[1:])
    READY.append(ready_fd)
    TEMPLATE_FDS.extend([server_fd, keeper_fd])
    # every kernel's: nothing blocked (an interrupt is a SIGINT)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    prctl(PR_SET_CHILD_SUBREAPER, 1, what="subreaper")
    kernel = Kernel(argv)
    preload(modules)
    precompile(sources)
    listener = socket.socket(fileno=listen_fd)
    listener.setblocking(False)
    # what every kernel shares, never scanned again by the collector (a
    # collection would write to every page of it, in every kernel)
    gc.collect()
    gc.freeze()
    if len(os.listdir("/proc/self/task")) != 1:
        raise Failed("the template has threads: it can't fork kernels")
    shared = shared_writable()
    if shared:
        raise Failed(f"the template has writable shared mappings (every kernel would write "
                     f"them): {', '.join(shared[:4])}")
    os.write(ready_fd, b"0")
    os.close(READY.pop())
    serve(listener, (server_fd, keeper_fd), kernel)


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # noqa: BLE001 (the launcher that started it reads why)
        why = str(e) if isinstance(e, Failed) else f"{type(e).__name__}: {e}"
        say(why)
        if READY:
            try:
                os.write(READY[0], b"1" + why.encode("utf-8", "replace")[:200])
            except OSError:
                pass
        sys.exit(1)
