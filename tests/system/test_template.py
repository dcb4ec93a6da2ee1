"""Python kernels forked from the kernel template (launcher/template.py,
docs/internals/sandbox.md): each is pid 1 of its namespaces with the data
stack already loaded, what must differ between kernels differs, most of
its memory is the template's (shared), the template's death takes no
kernel with it, and a launcher killed takes its kernel with it (the
keeper's guard). The sandbox's own properties, for kernels made this way,
are test_sandbox's and test_isolation's (the stack's kernels are
template kernels)."""

import json
import os
import pwd
import re
import signal
import time

from harness import check, eq, wait_until
from test_runs import run

PROBE = r'''
import os, sys, json, random, multiprocessing
import numpy
print(json.dumps({"pid": os.getpid(), "numpy": "pandas" in sys.modules,
                  "random": random.random(), "np": float(numpy.random.random()),
                  "authkey": multiprocessing.current_process().authkey.hex(),
                  "cwd": os.getcwd()}))
'''


def status_of(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read()
    except OSError:
        return ""


def field(status, name):
    m = re.search(rf"^{name}:\s+(.*)$", status, re.M)
    return m.group(1).split() if m else []


def kernel_user_processes(ctx):
    uid = str(pwd.getpwnam(ctx.st.kernel_user).pw_uid)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        st = status_of(pid)
        if st and field(st, "Uid")[:1] == [uid]:
            yield int(pid), st


def template_kernels(ctx):
    """pid -> status of the processes that are pid 1 of a pid namespace
    below ours and python: kernels forked from a template."""
    return {pid: st for pid, st in kernel_user_processes(ctx)
            if len(field(st, "NSpid")) == 2 and field(st, "NSpid")[-1] == "1"
            and field(st, "Name")[:1] == ["python3"]}


def templates(ctx):
    out = []
    for pid, st in kernel_user_processes(ctx):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if b"--fds" in cmd and len(field(st, "NSpid")) == 1:
            out.append(pid)
    return out


def smaps(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        text = f.read()
    return {k: int(v) for k, v in re.findall(r"^(\w+):\s+(\d+) kB", text, re.M)}


def in_cgroup_of(pid, kernel_ids):
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            text = f.read()
    except OSError:
        return False
    return any(k and f"kernel-{k}" in text for k in kernel_ids)


def kernel_of(ctx, user, cid):
    return ctx.psql(f"SELECT kernel_id FROM sessions WHERE user_id = '{user}' "
                    f"AND conversation_id = '{cid}'").strip()


def test_kernels_are_forks_of_the_template(ctx):
    a = json.loads(run(ctx, "tpl-a", "c", PROBE)["stdout_tail"])
    b = json.loads(run(ctx, "tpl-b", "c", PROBE)["stdout_tail"])
    eq((a["pid"], b["pid"]), (1, 1), "each pid 1 of its pid namespace")
    check(a["numpy"] and b["numpy"], "the data stack loaded before the first run")
    eq((a["cwd"], b["cwd"]), ("/workspace", "/workspace"), "in their workspaces")
    check(a["random"] != b["random"], f"Python's random differs between kernels: {a}, {b}")
    check(a["np"] != b["np"], f"numpy's global generator differs between kernels: {a}, {b}")
    check(a["authkey"] != b["authkey"], "multiprocessing's authkey differs between kernels")
    tpl = templates(ctx)
    check(tpl, "a template runs")
    # these two conversations' kernels (the suite's others did work of
    # their own): by their cgroups, named after the kernels
    ids = [kernel_of(ctx, u, "c") for u in ("tpl-a", "tpl-b")]
    kernels = {pid: st for pid, st in template_kernels(ctx).items() if in_cgroup_of(pid, ids)}
    eq(len(kernels), 2, f"the two kernels forked from the template: {sorted(kernels)}")
    for pid, st in kernels.items():
        eq(field(st, "PPid")[0] in {str(t) for t in tpl}, True,
           f"kernel {pid}'s parent is the template (its subreaper)")
        m = smaps(pid)
        check(m["Private_Dirty"] < 40 * 1024 and m["Rss"] > 80 * 1024,
              f"kernel {pid} shares the template's pages: {m['Private_Dirty']} KiB of "
              f"{m['Rss']} KiB its own")
    print(f"# kernels' own memory: {sorted(smaps(p)['Private_Dirty'] // 1024 for p in kernels)} MiB")


def test_the_template_ends_and_no_kernel_with_it(ctx):
    run(ctx, "tpl-live", "c", "x = 41")
    before = templates(ctx)
    check(before, "a template runs")
    for pid in before:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not set(before) & set(templates(ctx)), 10, "the template gone")
    r = run(ctx, "tpl-live", "c", "print(x + 1)")
    eq((r["stdout_tail"], r["session"]["reset"]), ("42\n", False),
       "a conversation's kernel outlives the template")
    r = run(ctx, "tpl-new", "c", "import os\nprint(os.getpid())")
    eq(r["stdout_tail"], "1\n", "a new conversation's kernel comes from a new template")
    check(set(templates(ctx)) - set(before), "a template started again")


def test_a_killed_launcher_takes_its_kernel(ctx):
    """Jupyter kills a launcher that does not end in time: its kernel, not
    its child, ends with it (the keeper holds the kernel's pidfd and ends
    it when the launcher's connection does), and the conversation's next
    run says so."""
    run(ctx, "tpl-guard", "c", "x = 1")
    kid = kernel_of(ctx, "tpl-guard", "c")
    lpid = launcher_of(kid)
    check(lpid, f"the launcher of kernel {kid}")
    kernels = set(template_kernels(ctx))
    os.kill(lpid, signal.SIGKILL)
    wait_until(lambda: kernels - set(template_kernels(ctx)), 10,
               "a template kernel ended with its launcher")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = ctx.post("/v1/runs", {"conversation_id": "c", "code": "print('x' in globals())"},
                     key=ctx.key("tpl-guard"))
        if r.status == 200 and r.json().get("stdout_tail"):
            break
        time.sleep(1)  # the server restarts the kernel meanwhile
    eq((r.status, r.json()["stdout_tail"]), (200, "False\n"), f"a new kernel: {r!r}")


def launcher_of(kid):
    """The launcher of kernel kid, the Jupyter server's child (after a
    restart an earlier launch's keeper may still be about, under the same
    command line)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if not (cmd[0].endswith(b"codexec-kernel-launcher") and
                    any(c.endswith(f"kernel-{kid}.json".encode()) for c in cmd)):
                continue
            ppid = int(field(status_of(pid), "PPid")[0])
            with open(f"/proc/{ppid}/cmdline", "rb") as f:
                parent = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if b"jupyter" in parent:
            return int(pid)
    return None


def test_a_run_sent_to_a_killed_kernel_runs_once_in_the_new_one(ctx):
    """Found: a kernel killed between runs (its launcher here, which takes
    the kernel with it), the next run sent before the server noticed: the
    request waited in the server's ZeroMQ queue and ran in the new process
    while the run answered KernelDied, so a caller that retried ran it
    twice. The run now asks, behind its request on the same channel,
    whether the new process took it: the code runs once, in the new
    kernel, and the answer is its own, saying reset; also when the code
    runs past the 15 s the new process has to answer the question (its
    answer comes after the cell's)."""
    user = "tpl-queued"
    run(ctx, user, "c", "x = 1")
    for i, pause in enumerate((0, 17)):
        lpid = launcher_of(kernel_of(ctx, user, "c"))
        check(lpid, "the kernel's launcher")
        os.kill(lpid, signal.SIGKILL)
        time.sleep(0.2)  # its sockets closed; the server's restarter looks every 3 s
        code = (f"import time\ntime.sleep({pause})\nprint('x' in globals())\n"
                f"open('once-{i}.txt', 'a').write('1')\nx = 1")
        r = ctx.post("/v1/runs", {"conversation_id": "c", "code": code, "timeout": 60},
                     key=ctx.key(user), timeout=120)
        body = r.json()
        eq((r.status, body["session"]["reset"]), (200, True), f"an answer that says reset: {body}")
        # The new process may take the request before the server's output
        # channel has joined it (the server's sockets connect again each on
        # its own timer): what it printed is then lost, and said so.
        check(body.get("status") == "ok" and body.get("stdout_tail") == "False\n" or
              body.get("error_name") == "OutputLost",
              f"the run's own answer, in a new kernel: {body}")
        r = run(ctx, user, "c", f"print(open('once-{i}.txt').read())")
        eq(r["stdout_tail"], "1\n", "the code ran once")
