# codexec front kernel: the kernel of a JavaScript or R session.
#
# codexec-kernel-launcher runs it inside the sandbox, in place of ipykernel,
# for a kernelspec started with --language javascript or --language r:
#
#   python3 -P -c <this source> --inner <deno|R> --path <binary> -f <conn> ...
#
# It is an ipykernel (so everything codexec does through a kernel stays in
# Python: the run's epilogue, capture, the file API, staging, the pool's
# warm-up, message interrupts, readiness), and it runs the session's own
# language in a second Jupyter kernel, its child in the same sandbox: Deno's
# built-in kernel or IRkernel, over TCP on the sandbox's own loopback (a
# network namespace with nothing else in it). Embedded into the launcher at
# build time; see docs/internals/languages.md.
#
# Which execute_request is whose: codexec marks its own Python cells with
# content["codexec"] = "own", and the call of main() with "call"; every
# other request (the tenant's cell, a raw client's) is code of the inner
# language, forwarded, its output relayed onto this kernel's channels under
# the request's own parent. User expressions (the epilogue) are evaluated
# here, in Python, after an inner cell that succeeded, as ipykernel does.
#
# The inner kernel is this process's child from before the connection file
# is written, so the launcher, which ends every other process of the
# sandbox at a run's end, knows it and spares it (launcher/main.c). When it
# dies (the tenant's quit(), a crash), this kernel ends too, and the server
# restarts the pair: the run then says session.reset, as for Python.
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

INNER_CONN = "/tmp/.codexec-inner.json"
ARGS_PREFIX = "/tmp/.codexec-args"
RESULT_MIME = "application/vnd.codexec.result+json"
RESULT_TEXT = "application/vnd.codexec.result-text"  # main()'s value as JSON text
READY_TIMEOUT = 90.0
FENCE_TIMEOUT = 2.0  # seconds a cell's end waits for Deno's late output
RELAYED = ("stream", "display_data", "update_display_data", "execute_result", "error",
           "clear_output")

# Run once in the inner kernel before this kernel serves anything: what
# codexec's runs rely on, in the language's own terms.
R_INIT = r"""
options(jupyter.plot_mimetypes = c("text/plain", "image/png"), warn = 1)
local({
  # IRkernel shows a cell's visible value as display_data; Jupyter's
  # protocol (and codexec's result) says execute_result
  for (f in rev(sys.frames())) {
    ex <- get0(".self", envir = parent.env(f), inherits = FALSE)
    if (!is.null(ex) && methods::is(ex, "Executor")) break
    ex <- NULL
  }
  if (is.null(ex)) stop("IRkernel's executor was not found")
  ns <- asNamespace("IRkernel")
  handle_value <- function(obj, visible) {
    ns$set_last_value(obj)
    if (!visible) return(invisible())
    mb <- ns$prepare_mimebundle_kernel(obj, ex$handle_display_error)
    if (is.null(mb$data)) return(invisible())
    ex$send_response("execute_result", ex$current_request, "iopub",
                     c(mb, list(execution_count = ex$execution_count)))
  }
  env <- as.environment(ex)
  if (bindingIsLocked("handle_value", env)) unlockBinding("handle_value", env)
  assign("handle_value", handle_value, envir = env)
})
"""

# main(**arguments) in R: the arguments are data (a JSON file this kernel
# wrote), main is called with them named, and its value leaves as JSON
# text that keeps every digit (jsonlite rounds to 15).
R_CALL = r"""
local({
  enc <- function(x) {
    if (is.null(x)) return("null")
    if (is.factor(x)) x <- as.character(x)
    if (is.data.frame(x) || is.matrix(x) || inherits(x, c("Date", "POSIXt")))
      return(as.character(jsonlite::toJSON(x, digits = NA, na = "null", null = "null",
                                           auto_unbox = TRUE)))
    if (is.list(x)) {
      n <- names(x)
      parts <- vapply(x, enc, "")
      if (!is.null(n) && length(x) > 0 && all(nzchar(n)))
        return(paste0("{", paste0(vapply(n, function(k) as.character(
          jsonlite::toJSON(k, auto_unbox = TRUE)), ""), ":", parts, collapse = ","), "}"))
      return(paste0("[", paste0(parts, collapse = ","), "]"))
    }
    one <- function(v) {
      if (is.na(v)) return("null")
      if (is.logical(v)) return(if (v) "true" else "false")
      if (is.integer(v)) return(as.character(v))
      if (is.numeric(v)) return(if (is.finite(v)) sprintf("%.17g", v) else "null")
      if (is.character(v)) return(as.character(jsonlite::toJSON(v, auto_unbox = TRUE)))
      if (is.complex(v)) return(as.character(jsonlite::toJSON(format(v), auto_unbox = TRUE)))
      stop("main() returned a value that has no JSON form")
    }
    if (is.atomic(x) && length(x) == 1) return(one(x))
    if (is.atomic(x)) return(paste0("[", paste0(vapply(as.list(x), one, ""), collapse = ","), "]"))
    stop("main() returned a value that has no JSON form")
  }
  if (!exists("main", envir = globalenv(), mode = "function", inherits = FALSE))
    stop("with arguments, the code must define a function main()")
  args <- jsonlite::fromJSON("%ARGS%", simplifyVector = FALSE)
  value <- do.call(get("main", envir = globalenv()), args)
  IRdisplay::publish_mimebundle(setNames(list(enc(value)), "%MIME%"))
  invisible(NULL)
})
"""

# Deno: Node's names for code written for Node (RAGFlow's runner, say):
# require() of Node's built-in modules, module.exports.
JS_INIT = r"""
{
  if (Deno.cwd() !== "/workspace") {
    try { Deno.chdir("/workspace"); } catch { /* (outside codexec's sandbox) */ }
  }
  const { createRequire } = await import("node:module");
  globalThis.require = createRequire("file:///workspace/");
  globalThis.module = { exports: {} };
  globalThis.exports = globalThis.module.exports;
}
"""

# main(arguments) in JavaScript: one object, the call awaited when main
# returns a promise.
JS_CALL = r"""
{
  const __f = typeof main === "function" ? main : globalThis.module?.exports?.main;
  if (typeof __f !== "function")
    throw new Error("with arguments, the code must define a function main()");
  const __a = JSON.parse(Deno.readTextFileSync("%ARGS%"));
  const __v = await __f(__a);
  Deno.jupyter.display({ "%MIME%": JSON.stringify(__v === undefined ? null : __v) },
                       { raw: true });
}
"""


def _arg(name, default=None):
    if name in sys.argv:
        i = sys.argv.index(name)
        value = sys.argv[i + 1]
        del sys.argv[i:i + 2]
        return value
    return default


class Inner:
    """The inner kernel: its process and a client of its own (shell,
    control, iopub), with the HMAC key of its connection file."""

    def __init__(self, language, path):
        import zmq
        from jupyter_client.connect import write_connection_file
        from jupyter_client.session import Session

        self.language = language
        key = uuid.uuid4().hex
        try:
            os.unlink(INNER_CONN)
        except FileNotFoundError:
            pass
        fname, info = write_connection_file(INNER_CONN, ip="127.0.0.1", transport="tcp",
                                            key=key.encode(), kernel_name=language)
        # Nothing of the workspace (the tenant's, kept across restarts) is
        # read at start: R skips ./.Rprofile, ./.Renviron and ./.RData;
        # Deno starts in this sandbox's fresh /tmp, so no deno.json or
        # package.json planted in the workspace configures it (its set-up
        # then moves it to /workspace)
        if language == "r":
            argv = [path, "--slave", "--no-save", "--no-restore", "--no-init-file",
                    "--no-environ", "-e", "IRkernel::main()", "--args", fname]
            cwd = None
        else:
            argv = [path, "jupyter", "--kernel", "--conn", fname]
            cwd = "/tmp"
        env = dict(os.environ)
        env.update({"DENO_DIR": "/tmp/.deno", "DENO_NO_UPDATE_CHECK": "1",
                    "DENO_NO_PROMPT": "1", "NO_COLOR": "1", "R_HISTFILE": "/dev/null"})
        # a process group of its own (an interrupt of this kernel's own
        # Python never reaches it; R's is sent to its pid), its end tied to
        # this kernel's
        # its own stdout and stderr (what a process it starts writes to
        # them: R's system(), Deno.Command's "inherit") are pipes, relayed
        # as the running cell's output; what came while none ran is dropped
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, close_fds=True, cwd=cwd,
                                     start_new_session=True,
                                     preexec_fn=lambda: __import__("ctypes").CDLL(
                                         None).prctl(1, signal.SIGKILL))
        self.pipes = {self.proc.stdout.fileno(): "stdout", self.proc.stderr.fileno(): "stderr"}
        for fd in self.pipes:
            os.set_blocking(fd, False)
        self.session = Session(key=key.encode(), username="codexec-front")
        self.ctx = zmq.Context()

        def sock(kind, port):
            s = self.ctx.socket(kind)
            s.setsockopt(zmq.LINGER, 0)
            s.connect("tcp://127.0.0.1:%d" % port)
            return s

        self.shell = sock(zmq.DEALER, info["shell_port"])
        self.control = sock(zmq.DEALER, info["control_port"])
        self.iopub = sock(zmq.SUB, info["iopub_port"])
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.poller = zmq.Poller()
        self.poller.register(self.shell, zmq.POLLIN)
        self.poller.register(self.iopub, zmq.POLLIN)
        for fd in self.pipes:
            self.poller.register(fd, zmq.POLLIN)
        self.busy = None  # the msg_id of the inner request in flight
        self.lock = threading.Lock()  # the control socket: interrupts

    def pump(self, fd, relay):
        """What the pipe fd holds now (1 MiB at most a call: a writer that
        never pauses holds nothing up), written to this kernel's stream of
        the same name (relay) or dropped."""
        for _ in range(16):
            try:
                data = os.read(fd, 65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self.poller.unregister(fd)
                del self.pipes[fd]
                return
            if relay:
                out = getattr(sys, self.pipes[fd])
                try:
                    out.write(data.decode("utf-8", "replace"))
                    out.flush()
                except (OSError, ValueError):
                    pass

    def recv(self, sock):
        """The next message on sock, or None for one that is not a
        well-formed, signed message (the inner kernel runs the tenant's
        code: what it sends is read as hostile)."""
        frames = sock.recv_multipart(copy=True)
        try:
            idents, msg = self.session.feed_identities(frames)
            m = self.session.deserialize(msg, content=True, copy=True)
        except Exception:
            return None
        if not isinstance(m.get("content"), dict) or not isinstance(m.get("parent_header"), dict):
            return None
        return m

    def ready(self, deadline):
        """Waits until the inner kernel answers kernel_info on its shell and
        its iopub is heard (a SUB socket drops what comes before it joins)."""
        replied = heard = False
        sent = 0.0
        while not (replied and heard):
            now = time.monotonic()
            if now > deadline or self.proc.poll() is not None:
                return False
            if now - sent > 0.5 and not replied:
                self.session.send(self.shell, "kernel_info_request", {})
                sent = now
            if not heard and replied and now - sent > 0.5:
                self.session.send(self.shell, "kernel_info_request", {})
                sent = now
            for s, _ in self.poller.poll(100):
                if s in self.pipes:
                    self.pump(s, False)
                    continue
                m = self.recv(s)
                if m is None:
                    continue
                if s is self.shell and m["msg_type"] == "kernel_info_reply":
                    replied = True
                    self.info = m["content"]
                elif s is self.iopub:
                    heard = True
        return True

    def execute(self, code, silent, on_message, deadline=None):
        """Runs code in the inner kernel; on_message(type, content,
        buffers) hears its output; answers the execute_reply's content.
        Deno sends some of a cell's output (its value, console.log) after
        the cell's idle status: a kernel_info request follows the cell
        there, and the cell ends when that request's idle status arrives
        (everything the cell sent comes before it)."""
        msg = self.session.msg("execute_request", {
            "code": code, "silent": silent, "store_history": not silent,
            "user_expressions": {}, "allow_stdin": False, "stop_on_error": False})
        mid = msg["header"]["msg_id"]
        reply = fence = None
        idle = fenced = False
        fence_by = None
        for fd in list(self.pipes):
            self.pump(fd, False)  # an earlier cell's stragglers
        self.busy = mid
        try:
            self.session.send(self.shell, msg)
            while reply is None or not idle or not fenced:
                if reply is not None and idle and fence is None:
                    if self.language != "javascript":
                        break
                    fence = self.session.msg("kernel_info_request", {})
                    self.session.send(self.shell, fence)
                    fence_by = time.monotonic() + FENCE_TIMEOUT
                if fence_by is not None and time.monotonic() > fence_by:
                    break  # (the kernel is busy past its cell: it ended anyway)
                if self.proc.poll() is not None:
                    raise RuntimeError("the %s kernel ended" % self.language)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError("the %s kernel did not answer" % self.language)
                for s, _ in self.poller.poll(1000):
                    if s in self.pipes:
                        self.pump(s, True)
                        continue
                    m = self.recv(s)
                    if m is None:
                        continue
                    parent = m["parent_header"].get("msg_id")
                    t = m["msg_type"]
                    if fence is not None and parent == fence["header"]["msg_id"]:
                        fenced |= t == "status" and m["content"].get("execution_state") == "idle"
                        continue
                    if parent != mid:
                        continue
                    if s is self.shell and t == "execute_reply":
                        reply = m["content"]
                    elif t == "status" and m["content"].get("execution_state") == "idle":
                        idle = True
                    elif t in RELAYED:
                        on_message(t, m["content"], m.get("buffers") or [])
            # what its processes wrote just before the cell ended
            for fd in list(self.pipes):
                self.pump(fd, True)
        finally:
            self.busy = None
        return reply

    def interrupt(self):
        """R is interrupted by SIGINT; Deno by a message on its control
        channel (SIGINT would end it)."""
        if self.language == "r":
            try:
                os.kill(self.proc.pid, signal.SIGINT)
            except OSError:
                pass
            return
        with self.lock:
            self.session.send(self.control, "interrupt_request", {})


def write_arguments(args):
    """main()'s arguments as a JSON file of a fresh random name in /tmp
    (never a path that existed: /tmp is the tenant's too)."""
    path = "%s-%s.json" % (ARGS_PREFIX, uuid.uuid4().hex)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(args, f)
    return path


def watch(inner):
    """The inner kernel's end is this kernel's: the server restarts both."""
    inner.proc.wait()
    os._exit(70)


def main():
    language = _arg("--inner")
    path = _arg("--path")
    if language not in ("r", "javascript") or not path:
        print("codexec front kernel: --inner r|javascript --path BINARY are required",
              file=sys.stderr)
        sys.exit(2)
    # The inner kernel starts while ipykernel is imported; both before the
    # connection file is written (the launcher's readiness, then its seal).
    inner = Inner(language, path)
    from ipykernel.ipkernel import IPythonKernel
    from ipykernel.kernelapp import IPKernelApp

    if not inner.ready(time.monotonic() + READY_TIMEOUT):
        print("codexec front kernel: the %s kernel did not start" % language, file=sys.stderr)
        inner.proc.kill()
        sys.exit(1)
    init = R_INIT if language == "r" else JS_INIT
    reply = inner.execute(init, True, lambda *a: None, time.monotonic() + READY_TIMEOUT)
    if not reply or reply.get("status") != "ok":
        print("codexec front kernel: the %s kernel's set-up failed" % language, file=sys.stderr)
    threading.Thread(target=watch, args=(inner,), daemon=True).start()
    sys.modules["__codexec_inner__"] = inner

    class FrontKernel(IPythonKernel):
        implementation = "codexec-front"
        implementation_version = "1"
        banner = "codexec: %s" % language

        @property
        def language_info(self):
            return inner.info.get("language_info", {"name": language})

        async def execute_request(self, stream, ident, parent):
            content = parent.get("content") or {}
            self._codexec_role = content.get("codexec")
            return await super().execute_request(stream, ident, parent)

        def _send_interupt_children(self):
            if inner.busy is not None:
                inner.interrupt()
            else:  # this process alone (ipykernel's own would signal its group)
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                except OSError:
                    pass

        def _relay(self, t, content, buffers):
            if t == "execute_result":
                content = dict(content)
                content["execution_count"] = self.execution_count
            self.session.send(self.iopub_socket, t, content, self.get_parent("shell"),
                              ident=self._topic(t), buffers=buffers or None)

        def _call_relay(self, t, content, buffers):
            data = content.get("data") if isinstance(content, dict) else None
            if t == "execute_result":
                return  # (the value of the call's own code)
            if t == "display_data" and isinstance(data, dict) and RESULT_TEXT in data:
                try:
                    value = json.loads(data[RESULT_TEXT])
                except (TypeError, ValueError):
                    value = None
                self._relay("display_data", {"data": {RESULT_MIME: {"value": value}},
                                             "metadata": {}}, [])
                return
            self._relay(t, content, buffers)

        def _forward(self, code, silent, relay):
            try:
                reply = inner.execute(code, silent, relay)
            except (RuntimeError, TimeoutError) as e:
                reply = {"status": "error", "ename": "KernelDied", "evalue": str(e),
                         "traceback": []}
            except Exception as e:  # (a hostile answer must not leave the request unanswered)
                reply = {"status": "error", "ename": "FrontKernelError",
                         "evalue": type(e).__name__, "traceback": []}
            ok = bool(reply) and reply.get("status") == "ok"
            if not ok:
                reply = dict(reply or {})
                if reply.get("status") == "abort":  # IRkernel's word for an interrupted cell
                    reply.setdefault("ename", "KeyboardInterrupt")
                    reply.setdefault("evalue", "interrupted")
                reply["status"] = "error"
                for k, v in (("ename", "Error"), ("evalue", ""), ("traceback", [])):
                    reply.setdefault(k, v)
            self.shell.last_execution_succeeded = ok
            return ok, reply

        async def do_execute(self, code, silent, store_history=True, user_expressions=None,
                             allow_stdin=False, *, cell_id=None):
            role, self._codexec_role = getattr(self, "_codexec_role", None), None
            if role == "own":
                return await super().do_execute(code, silent, store_history, user_expressions,
                                                allow_stdin, cell_id=cell_id)
            if role == "call":
                meta = self.get_parent("shell").get("metadata") or {}
                if not self.shell.last_execution_succeeded:
                    ok, reply = True, {"status": "ok"}
                else:
                    path = write_arguments(meta.get("codexec_arguments") or {})
                    call = (R_CALL if language == "r" else JS_CALL)
                    call = call.replace("%ARGS%", path).replace("%MIME%", RESULT_TEXT)
                    try:
                        ok, reply = self._forward(call, False, self._call_relay)
                    finally:
                        try:
                            os.unlink(path)
                        except OSError:
                            pass
            elif code.strip() == "":
                ok, reply = True, {"status": "ok"}
                self.shell.last_execution_succeeded = True
            else:
                ok, reply = self._forward(code, silent, self._relay)
            count = self.shell.execution_count
            if store_history and not silent:
                self.shell.execution_count += 1  # (IPython counts only its own cells)
            out = {"status": reply["status"], "execution_count": count, "payload": []}
            if ok:
                out["user_expressions"] = self.shell.user_expressions(user_expressions or {})
            else:
                out["user_expressions"] = {}
                out.update(ename=str(reply.get("ename")), evalue=str(reply.get("evalue")),
                           traceback=[str(x) for x in reply.get("traceback") or []])
            return out

    IPKernelApp.launch_instance(kernel_class=FrontKernel)


if __name__ == "__main__":
    main()
