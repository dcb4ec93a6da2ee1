# codexec run epilogue: evaluated after the user's cell as the run's one
# user expression, so it costs no execute of its own. Embedded into
# libcodexec at build time; executed once per kernel process into a
# private namespace, and the function kept in sys (see lib/runend.c,
# lib/runexec.c, docs/internals/capture.md).
#
# epilogue(token, capture) returns an object whose repr (the expression's
# text/plain, formatted straight from it: answer_formatting) is the JSON
# {"known": bool, "done": <capture's done record> or null}: "known" when
# this kernel process has run an epilogue with this token (its kernel id)
# before; a kernel that says otherwise was started or restarted since. Or
# {"need": true}, having done nothing, when the capture helper is neither
# kept nor in the request: codexec sends its source only to a kernel it
# just started (and the pool's warm-up), and again, in a second request,
# when a kernel says it needs it.
import os
import sys
import time

WALL = 0x40000000  # <linux/wait.h> __WALL


def reap():
    """Every process of the sandbox but its init (pid 1) and the kernel ends
    with the run, so a fork bomb, a runaway child or a writer that outlives
    its cell holds nothing (pids, memory, CPU, files being written) past the
    run. The kernel's own children are reaped, within 2 s (killing hundreds
    on a loaded machine takes more than 200 ms, and an unreaped child stays
    a zombie of the kernel's, holding a pid, until the next run). Only
    inside codexec's sandbox (its launcher's CODEXEC_SANDBOX, and the kernel
    a child of the sandbox's own pid 1, or that pid 1 itself: a kernel
    forked from the template, launcher/template.py, whose orphans are its
    children then): a kernel started without the sandbox shares the host's
    processes. A front kernel's inner kernel (the JavaScript or R kernel it
    runs, launcher/front.py) is spared, as the launcher spares it."""
    me, mine = os.getpid(), []
    if os.environ.get("CODEXEC_SANDBOX") != "1" or (os.getppid() != 1 and me != 1):
        return
    if me == 1:
        # The pid namespace's init: every other process in it descends from
        # this one, so without a child (most runs) there is none to end,
        # and /proc need not be read (a fifth of a millisecond a run).
        # __WALL: a child whose exit signal is not SIGCHLD (a raw clone)
        # counts too.
        try:
            os.waitpid(-1, os.WNOHANG | WALL)
        except ChildProcessError:
            return
    spare = {1, me}
    inner = getattr(getattr(sys.modules.get("__codexec_inner__"), "proc", None), "pid", None)
    if isinstance(inner, int):
        spare.add(inner)
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) not in spare:
            try:
                with open(f"/proc/{d}/stat") as f:
                    child = f.read().rsplit(")", 1)[1].split()[1] == str(me)
                os.kill(int(d), 9)
                if child:
                    mine.append(int(d))
            except (OSError, IndexError):
                pass
    end = time.monotonic() + 2
    while mine and time.monotonic() < end:
        for p in list(mine):
            try:
                if os.waitpid(p, os.WNOHANG)[0]:
                    mine.remove(p)
            except ChildProcessError:
                mine.remove(p)
        time.sleep(0.002)


def helper():
    """The capture helper's code, kept in sys next to the restart token and
    keyed by its source's sha256, else compiled from the source in the
    request's metadata and kept; None when neither is there (the request
    came without the source: codexec sends it again with it)."""
    from IPython import get_ipython
    m = get_ipython().kernel.get_parent("shell")["metadata"]["codexec_capture"]
    c = getattr(sys, "_codexec_capture", None)
    if (type(c) is tuple and len(c) == 2 and c[0] == m["sha256"]
            and type(c[1]) is type(reap.__code__)):
        return c[1]
    if "src" not in m:
        return None
    c = (m["sha256"], compile(m["src"], "<codexec-capture>", "exec"))
    sys._codexec_capture = c
    return c[1]


def capture(code):
    """The helper run in a private namespace: its done record's JSON."""
    from IPython import get_ipython
    ns = {"__name__": "__codexec__", "get_ipython": get_ipython}
    exec(code, ns)
    return repr(ns["done"])


class Answer:
    """IPython formats the expression's value as text/plain with repr()."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def answer_formatting(ip):
    """An Answer's formatting straight to its text/plain, as IPython's
    formatters would make it: they try a dozen formats (HTML, PNG, LaTeX,
    ...) on each user expression's value, a quarter of a millisecond a run.
    Installed on the shell by the epilogue's first call (the expression
    that call answers is formatted as before); any other value is
    IPython's to format. Another version's epilogue (two codexecs sharing
    a kernel during an upgrade) puts its own in place of this one, each
    over IPython's own formatting, never over the other's: no chain grows
    as they take turns."""
    slow = getattr(ip._format_user_obj, "codexec_slow", ip._format_user_obj)

    def fast(obj):
        if type(obj) is Answer:
            return {"status": "ok", "data": {"text/plain": obj.text}, "metadata": {}}
        return slow(obj)

    fast.codexec_answer, fast.codexec_slow = Answer, slow
    ip._format_user_obj = fast


def epilogue(token, want_capture):
    from IPython import get_ipython
    ip = get_ipython()
    if ip is not None and getattr(ip.__dict__.get("_format_user_obj"), "codexec_answer", None) is not Answer:
        try:
            answer_formatting(ip)
        except Exception:
            pass  # formatted by IPython, as before
    code = None
    if want_capture:
        try:
            code = helper()
        except Exception:
            code = False  # the capture fails (the next run rescans); the rest goes on
        if code is None:
            return Answer('{"need": true}')  # nothing was done
    known = getattr(sys, "_codexec_kernel", None) == token
    if not known:
        sys._codexec_kernel = token
    try:
        reap()
    except Exception:
        pass
    done = "null"
    if code:
        try:
            done = capture(code)
        except Exception:
            pass  # the next run rescans
    return Answer('{"known": %s, "done": %s}' % ("true" if known else "false", done))
