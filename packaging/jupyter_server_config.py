# codexec's Jupyter server (codexec-gateway.service, and the quickstart's):
# the settings and guards that keep one tenant's kernel from taking the
# server every tenant shares (docs/reliability.md, "The gateway").
#
# Everything a kernel sends is written by tenant code: the kernel process
# owns its ZeroMQ sockets and can send any frame. The server must neither
# keep what no client reads, nor build a huge object from a small message,
# nor queue without bound for a client that reads slowly.
import ctypes
import json
import resource

import zmq

# ZeroMQ's default of 1023 sockets per context (a few per kernel and per
# channels connection) would make sockets, not memory, the ceiling on
# kernels (about 170: measured). See docs/configuration.md, "Capacity".
# Every context the server makes: the kernel manager's is its own, not
# Context.instance().
_context_init = zmq.Context.__init__


def _context_with_sockets(self, *args, **kwargs):
    _context_init(self, *args, **kwargs)
    self.set(zmq.MAX_SOCKETS, 65536)


zmq.Context.__init__ = _context_with_sockets
zmq.Context.instance().set(zmq.MAX_SOCKETS, 65536)

c = get_config()  # noqa: F821 (the config loader's)

# Not readable or writable through /proc by another process of the
# gateway's user (a kernel template is one: docs/internals/sandbox.md): the
# token, the kernels' keys. prctl(PR_SET_DUMPABLE, 0).
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)

# A kernel holds about five of the server's descriptors (its sockets and
# the launcher's pipes): the default 4096 would make descriptors the
# ceiling at about 800 kernels. As many as the hard limit allows (the
# package's unit: LimitNOFILE=65536).
_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
c.ServerApp.min_open_files_limit = 65536 if _nofile == resource.RLIM_INFINITY else min(65536,
                                                                                        _nofile)

# A kernel nobody is connected to: its messages are dropped, never kept in
# a list that grows for as long as it talks (jupyter_server's default keeps
# them all for a client that may reconnect; codexec never replays them).
c.MappingKernelManager.buffer_offline_messages = False

# A finite rate: past it the server drops a kernel's output (and says so
# on stderr) until the rate falls. No run needs more: codexec keeps
# max_output_bytes (8 MiB) of a run's output and interrupts it past that;
# the window resets at every idle. Captured files travel as display_data,
# counted as messages (1 MiB each), not as stream bytes.
c.ServerApp.limit_rate = True
c.ServerApp.iopub_data_rate_limit = 16 * 1024 * 1024  # stream bytes/s, over the window
c.ServerApp.iopub_msg_rate_limit = 10000  # messages/s, over the window
c.ServerApp.rate_limit_window = 3

# One frame from a kernel: larger ones end that connection (ZeroMQ
# reconnects it); codexec itself skips any message over 16 MiB.
MAX_FRAME = 24 * 1024 * 1024
# Messages waiting in ZeroMQ for the server to read them, per socket:
# reached while a client is paused (below), and while the server's one
# loop falls behind kernels that send large messages as fast as their
# relays let them (8 kernels sending 4 MiB JSON frames held 16 of them on
# each of their two iopub sockets: +1 GiB on a 2-core machine). Then the
# kernel waits, and its own (bounded) memory holds the rest. ZeroMQ counts
# messages, not bytes: this bounds a socket at 4 of the relay's largest.
RCVHWM = 4
# JSON the server would build objects from: a frame whose objects would
# cost more than this (counted in its bytes, strings included, so never
# less than it builds: a list or dict about 112 bytes, an element 56, a
# string 56 with its quotes) is read as empty. 16 MiB of "[]," would be
# 600 MB of Python objects; this is 64 MiB for an instant.
MAX_COST = 64 * 1024 * 1024
# What the server holds for one client that reads slowly: past the high
# mark it stops reading that client's kernel sockets, below the low one it
# reads again.
PENDING_HIGH = 32 * 1024 * 1024
PENDING_LOW = 8 * 1024 * 1024

REFUSED = {"msg_id": "", "msg_type": "codexec_refused", "username": "", "session": "",
           "date": "", "version": "5.3"}


def guarded_unpack(s):
    """Session.unpack: JSON, unless the frame is too large or too deep to
    build (then an empty header-shaped dict, which every reader of a part
    copes with: the message is dropped or passed on empty). Counted on the
    bytes, before any copy: a kernel sending large frames as fast as its
    relay lets it must not outrun the server's loop (while it falls behind,
    each kernel socket holds RCVHWM of them)."""
    if isinstance(s, (bytearray, memoryview)):
        s = bytes(s)
    if len(s) > MAX_FRAME or (len(s) > 65536 and cost(s) > MAX_COST):
        return dict(REFUSED)
    if isinstance(s, bytes):
        s = s.decode("utf8", "replace")
    return json.loads(s)


def cost(s):
    """What the frame's objects would cost, from its bytes (or text)."""
    b = s if isinstance(s, bytes) else s.encode("utf8", "replace")
    return (112 * (b.count(b"[") + b.count(b"{")) + 56 * (b.count(b",") + b.count(b":"))
            + 28 * b.count(b'"'))


def install():
    import sys
    import types

    import jupyter_client.connect
    from jupyter_server.base import zmqhandlers

    # Session.deserialize parses every ISO-8601 string of a header into a
    # datetime (55 us apiece: a header of dates holds the loop for
    # seconds); nothing here needs them as more than the text they are.
    import jupyter_client.session
    jupyter_client.session.extract_dates = lambda obj: obj

    # Session's unpacker is named by module path: give it one.
    mod = types.ModuleType("codexec_gateway_guard")
    mod.unpack = guarded_unpack
    sys.modules[mod.__name__] = mod
    c.Session.unpacker = "codexec_gateway_guard.unpack"

    create = jupyter_client.connect.ConnectionFileMixin._create_connected_socket

    def create_connected_socket(self, channel, identity=None):
        sock = create(self, channel, identity=identity)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
        sock.setsockopt(zmq.RCVHWM, RCVHWM)
        return sock

    jupyter_client.connect.ConnectionFileMixin._create_connected_socket = create_connected_socket

    handler = zmqhandlers.ZMQStreamHandler

    def pause(self, paused):
        for stream in getattr(self, "channels", {}).values():
            if stream is None or stream.closed():
                continue
            if paused:
                stream.stop_on_recv()
            else:
                stream.on_recv_stream(self._on_zmq_reply)

    def write_message(self, message, binary=False):
        fut = base_write(self, message, binary=binary)
        n = len(message) if isinstance(message, (bytes, str)) else 0
        self._cx_pending = getattr(self, "_cx_pending", 0) + n
        if self._cx_pending > PENDING_HIGH and not getattr(self, "_cx_paused", False):
            self._cx_paused = True
            pause(self, True)

        def written(f):
            self._cx_pending -= n
            if getattr(self, "_cx_paused", False) and self._cx_pending < PENDING_LOW:
                self._cx_paused = False
                if self.ws_connection is not None:
                    pause(self, False)
            # a write that failed because the client went away is no news
            # (unretrieved, each would be a traceback in the log)
            if not f.cancelled():
                f.exception()

        fut.add_done_callback(written)
        return fut

    base_write = handler.write_message
    handler.write_message = write_message


install()


# GET /api/codexec/memory: what codexec admits new kernels by (docs/
# configuration.md, "Capacity"): the memory the kernels use now, as their
# parent cgroup counts it (processes and tmpfs pages, every kernel's own:
# the template's shared pages are the server's), that cgroup's limit, and
# the host's available memory. Read from outside every sandbox, so no
# kernel can say less than it holds. Any other gateway lacks the endpoint:
# codexec then counts kernels (max_kernels). Read at most once a second.
class MemoryReport:
    def __init__(self):
        self.at, self.cached, self.parent = 0.0, None, False

    @staticmethod
    def sandbox_cgroup(ksm):
        """sandbox.conf's cgroup, from the first sandboxed kernelspec's
        --config."""
        for name in sorted(ksm.find_kernel_specs()):
            argv = ksm.get_kernel_spec(name).argv
            if "--config" in argv[:-1] and "codexec-kernel-launcher" in argv[0]:
                path = argv[argv.index("--config") + 1]
                with open(path) as f:
                    for line in f:
                        key, sep, value = line.partition("=")
                        if sep and key.strip() == "cgroup":
                            return value.strip()
        return ""

    @staticmethod
    def parent_dir(cgroup):
        """The kernels' parent in the memory controller's hierarchy (v1) or
        the unified one (v2); None without cgroups."""
        if not cgroup:
            return None
        v2 = None
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                sep = fields.index("-")
                fstype, opts = fields[sep + 1], fields[sep + 3].split(",")
                if fstype == "cgroup" and "memory" in opts:
                    return (fields[4] + "/" + cgroup, False)
                if fstype == "cgroup2" and v2 is None:
                    v2 = fields[4]
        return (v2 + "/" + cgroup, True) if v2 else None

    @staticmethod
    def read_number(path):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def kernels_memory(self, ids):
        """What this server's kernels hold: their cgroups (k-kernel-<id>-*,
        the launcher's names) and what the parent holds of its own (a
        workspace's pages once the kernel that wrote them was restarted);
        their cgroups alone (an average kernel); the parent's limit. A
        parent another server's kernels share too (the test stacks) counts
        only ours."""
        import os

        d, v2 = self.parent
        usage = "memory.current" if v2 else "memory.usage_in_bytes"
        total = self.read_number(os.path.join(d, usage))
        limit = self.read_number(os.path.join(d, "memory.max" if v2 else "memory.limit_in_bytes"))
        if total is None:
            return None, None, limit
        mine = {"k-kernel-" + i for i in ids}
        ours = children = 0
        with os.scandir(d) as it:
            for e in it:
                if not e.name.startswith("k-") or not e.is_dir(follow_symlinks=False):
                    continue
                n = self.read_number(os.path.join(e.path, usage)) or 0
                children += n
                if e.name[:-7] in mine:  # less "-XXXXXX"
                    ours += n
        return ours + max(0, total - children), ours, limit

    def get(self, handler):
        import time

        now = time.monotonic()
        if self.cached is not None and now - self.at < 1.0:
            return self.cached
        if self.parent is False:
            try:
                self.parent = self.parent_dir(self.sandbox_cgroup(handler.kernel_spec_manager))
            except (OSError, ValueError, KeyError):
                self.parent = None
        meminfo = {}
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                meminfo[k] = int(v.split()[0]) * 1024
        ids = handler.kernel_manager.list_kernel_ids()
        used = own = limit = None
        if self.parent:
            used, own, limit = self.kernels_memory(ids)
            if limit is not None and limit >= meminfo.get("MemTotal", 0):
                limit = None  # unlimited
        self.cached = {"kernels": len(ids),
                       "kernels_bytes": used, "kernels_own_bytes": own,
                       "kernels_limit_bytes": limit,
                       "available_bytes": meminfo.get("MemAvailable"),
                       "total_bytes": meminfo.get("MemTotal")}
        self.at = now
        return self.cached


def memory_handlers():
    import json as _json
    import sys

    from jupyter_server.base.handlers import APIHandler
    from tornado import web

    report = MemoryReport()

    class MemoryHandler(APIHandler):
        @web.authenticated
        def get(self):
            self.set_header("Content-Type", "application/json")
            self.finish(_json.dumps(report.get(self)))

    sys.modules["codexec_gateway_guard"].default_handlers = [
        (r"/api/codexec/memory", MemoryHandler)]
    c.ServerApp.extra_services = ["codexec_gateway_guard"]


memory_handlers()


# cgroup v2 under systemd (codexec-gateway.service, Delegate=yes): the
# unit's cgroup is the server's to divide, but a cgroup that holds a
# process can give its children no controller. So the server moves itself
# into a leaf of its own, server/, and the unit's cgroup passes memory,
# pids and cpu down to kernels/, below which codexec-kernel-launcher makes
# each kernel's cgroup (sandbox.conf: cgroup =
# system.slice/codexec-gateway.service/kernels). Anywhere else (cgroup v1,
# the quickstart, a cgroup not ours) nothing is done here: the unit asks
# for it (CODEXEC_GATEWAY_CGROUP=divide). The launcher
# then finds the parent it was given, or refuses to start kernels with a
# message saying why.
CGROUP_CONTROLLERS = ("memory", "pids", "cpu")


def divide_delegated_cgroup():
    import os
    import sys

    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    if os.environ.get("CODEXEC_GATEWAY_CGROUP") != "divide" or len(lines) != 1 or \
            not lines[0].startswith("0::/"):
        return  # not codexec-gateway.service, or not on a unified hierarchy
    unit = "/sys/fs/cgroup" + lines[0][3:]
    try:
        with open(os.path.join(unit, "cgroup.controllers")) as f:
            have = f.read().split()
        if not all(c in have for c in CGROUP_CONTROLLERS) or not os.access(unit, os.W_OK):
            return  # not delegated to us: nothing to divide
        for leaf in ("server", "kernels"):
            os.makedirs(os.path.join(unit, leaf), exist_ok=True)
        with open(os.path.join(unit, "server", "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        enable = " ".join("+" + c for c in CGROUP_CONTROLLERS)
        for d in (unit, os.path.join(unit, "kernels")):
            with open(os.path.join(d, "cgroup.subtree_control"), "w") as f:
                f.write(enable)
        # All kernels together stay below the unit's own limit (MemoryMax=),
        # so memory they run out of is reclaimed and killed among them,
        # never from the server (an attacker's review: tmpfs pages count in
        # no process's OOM score, and the server could be the one killed).
        with open(os.path.join(unit, "memory.max")) as f:
            unit_max = f.read().strip()
        if unit_max != "max":
            total = int(unit_max)
            with open(os.path.join(unit, "kernels", "memory.max"), "w") as f:
                f.write(str(max(total - max(512 << 20, total // 10), total // 2)))
        with open(os.path.join(unit, "kernels", "cgroup.max.descendants"), "w") as f:
            f.write("4096")  # a cgroup per kernel: max_kernels is far below
    except OSError as e:
        print(f"codexec: the delegated cgroup {unit} could not be divided ({e}); "
              "kernels with a cgroup in sandbox.conf will not start", file=sys.stderr)


divide_delegated_cgroup()
