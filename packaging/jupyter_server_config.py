# codexec's Jupyter server (codexec-gateway.service, and the quickstart's):
# the settings and guards that keep one tenant's kernel from taking the
# server every tenant shares (docs/reliability.md, "The gateway").
#
# Everything a kernel sends is written by tenant code: the kernel process
# owns its ZeroMQ sockets and can send any frame. The server must neither
# keep what no client reads, nor build a huge object from a small message,
# nor queue without bound for a client that reads slowly.
import json

import zmq

# ZeroMQ's default of 1023 sockets per context (a few per kernel and per
# channels connection) would make sockets, not memory, the ceiling on
# kernels (about 175). See README.md, "Capacity".
zmq.Context.instance().set(zmq.MAX_SOCKETS, 65536)

c = get_config()  # noqa: F821 (the config loader's)

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
# Messages waiting in ZeroMQ for the server to read them, per socket; only
# reached while a client is paused (below): then the kernel waits, and its
# own (bounded) memory holds the rest.
RCVHWM = 64
# JSON the server would build objects from: a frame whose objects would
# cost more than this (counted in its bytes, strings included, so never
# less than it builds: a list or dict about 112 bytes, an element 56, a
# string 56 with its quotes) is read as empty. 16 MiB of "[]," would be
# 600 MB of Python objects; this is 64 MiB for an instant.
MAX_COST = 64 * 1024 * 1024
# What the server holds for one client that reads slowly: past the high
# mark it stops reading that client's kernel sockets, below the low one it
# reads again.
PENDING_HIGH = 64 * 1024 * 1024
PENDING_LOW = 16 * 1024 * 1024

REFUSED = {"msg_id": "", "msg_type": "codexec_refused", "username": "", "session": "",
           "date": "", "version": "5.3"}


def guarded_unpack(s):
    """Session.unpack: JSON, unless the frame is too large or too deep to
    build (then an empty header-shaped dict, which every reader of a part
    copes with: the message is dropped or passed on empty)."""
    if isinstance(s, (bytes, bytearray, memoryview)):
        s = bytes(s).decode("utf8", "replace")
    if len(s) > MAX_FRAME or (len(s) > 65536 and cost(s) > MAX_COST):
        return dict(REFUSED)
    return json.loads(s)


def cost(s):
    return (112 * (s.count("[") + s.count("{")) + 56 * (s.count(",") + s.count(":"))
            + 28 * s.count('"'))


def parent_msg_id(session, msg_list):
    """The parent's msg_id of a message from the kernel, or None."""
    try:
        _, fed = session.feed_identities(msg_list)
        return guarded_unpack(fed[2]).get("msg_id")
    except Exception:
        return None


REAP_SEQ = [0]


async def end_run_processes(handler):
    """A run's end: codexec-kernel-launcher ends every process of the
    kernel's sandbox but the kernel (SIGUSR1), from outside it, and says it
    is done by removing this request's file (each request a name of its
    own: a late answer to one never releases another). Only for kernels of
    codexec's launcher; at most two seconds."""
    import asyncio
    import os
    import signal

    kernel = handler.kernel_manager.get_kernel(handler.kernel_id)
    spec = getattr(kernel, "kernel_spec", None)
    # the launcher is this server's child: until it is reaped here its pid
    # can't name another process, so the signal never hits a stranger
    proc = getattr(getattr(kernel, "provisioner", None), "process", None)
    if not spec or not spec.argv or not spec.argv[0].endswith("codexec-kernel-launcher"):
        return
    if proc is None or proc.poll() is not None:
        return
    where, name = os.path.split(kernel.connection_file)
    REAP_SEQ[0] += 1
    ack = os.path.join(where, f".{name.removesuffix('.json')}.reap.{REAP_SEQ[0]}")
    os.close(os.open(ack, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    try:
        proc.send_signal(signal.SIGUSR1)
    except OSError:
        os.unlink(ack)
        return
    loop = asyncio.get_running_loop()
    start = loop.time()
    # usually gone within a fraction of a millisecond: look often at first,
    # then seldom
    while os.path.lexists(ack) and loop.time() < start + 2:
        await asyncio.sleep(0.0002 if loop.time() < start + 0.005 else 0.005)
    if os.path.lexists(ack):
        handler.log.warning("kernel %s: its launcher did not end the run's processes in 2 s",
                            handler.kernel_id)
        os.unlink(ack)


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
        for name, stream in getattr(self, "channels", {}).items():
            if stream is None or stream.closed():
                continue
            if paused:
                stream.stop_on_recv()
            elif not (name == "shell" and getattr(self, "_cx_holding", False)):
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

    # The run's end: codexec marks the request that ends a run
    # (metadata codexec_reap); its execute_reply leaves for the client only
    # once the launcher has ended the sandbox's other processes, so the run
    # is over, for codexec, only when they are gone. Meanwhile the shell
    # channel is not read (its later messages wait in ZeroMQ, in order).
    from jupyter_server.services.kernels.handlers import ZMQChannelsHandler as channels

    base_on_message = channels.on_message
    base_reply = channels._on_zmq_reply

    def on_message(self, ws_msg):
        if isinstance(ws_msg, str) and '"codexec_reap"' in ws_msg:
            try:
                m = json.loads(ws_msg)
                if (m["metadata"].get("codexec_reap") is True
                        and m["header"]["msg_type"] == "execute_request"):
                    ids = self.__dict__.setdefault("_cx_reap", [])
                    if len(ids) >= 16:  # replies that never came (a restart)
                        ids.pop(0)
                    ids.append(m["header"]["msg_id"])
            except Exception:
                pass
        return base_on_message(self, ws_msg)

    async def reply_after_reap(self, stream, msg_list):
        try:
            await end_run_processes(self)
        except Exception:
            self.log.exception("kernel %s: ending the run's processes failed", self.kernel_id)
        self._cx_holding = False
        if self.ws_connection is None or stream.closed():
            return
        base_reply(self, stream, msg_list)
        if not getattr(self, "_cx_paused", False):
            stream.on_recv_stream(self._on_zmq_reply)

    def on_reply(self, stream, msg_list):
        ids = getattr(self, "_cx_reap", None)
        if ids and getattr(stream, "channel", None) == "shell":
            parent = parent_msg_id(self.session, msg_list)
            if parent in ids:
                ids.remove(parent)
                self._cx_holding = True
                stream.stop_on_recv()
                import asyncio
                asyncio.ensure_future(reply_after_reap(self, stream, msg_list))
                return None
        return base_reply(self, stream, msg_list)

    channels.on_message = on_message
    channels._on_zmq_reply = on_reply


install()
