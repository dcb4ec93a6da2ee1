"""Capacity and scale-out: kernel budgets, several gateways, several
codexec processes, crashes that leave nothing behind, and a soak.

Each test that needs a gateway or a codexec-fcgi of its own starts real
ones (a second Jupyter server, processes with their own config) next to
the suite's stack, and talks FastCGI to them directly or through an nginx
of its own."""

import json
import os
import random
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import fcgi_client
import stack
from harness import check, eq, new_id, wait_until


def jupyter_kernels(ctx, url):
    """The gateway's kernels. (A Jupyter server under load can answer one
    listing with a 500, a kernel going away while it walks them: asked
    again, up to three times.)"""
    req = urllib.request.Request(url + "/api/kernels",
                                 headers={"Authorization": f"token {ctx.st.gateway_token}"})
    for attempt in range(3):
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code < 500 or attempt == 2:
                raise
            time.sleep(0.5)


def start_kernel(ctx, url):
    """A kernel started on the gateway directly (no row names it): its id."""
    req = urllib.request.Request(url + "/api/kernels", method="POST",
                                 data=json.dumps({"name": stack.KERNEL_NAME}).encode(),
                                 headers={"Authorization": f"token {ctx.st.gateway_token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["id"]


def fcgi_run(sock, key, cid, code, timeout=60):
    body = json.dumps({"conversation_id": cid, "code": code, "timeout": timeout}).encode()
    status, headers, out = fcgi_client.request(sock, "POST", "/v1/runs", body,
                                               {"HTTP_AUTHORIZATION": f"Bearer {key}"})
    try:
        out = json.loads(out)
    except ValueError:
        pass
    return status, headers, out


def fcgi_kernels_bytes(sock, url):
    """The kernels' memory on a gateway as a codexec-fcgi's last probe
    has it (its /metrics, from the loopback address)."""
    status, _, body = fcgi_client.request(sock, "GET", "/metrics", params={"REMOTE_ADDR": "127.0.0.1"})
    eq(status, 200, f"/metrics: {body[:120]!r}")
    m = re.search(rf'^codexec_gateway_memory_bytes\{{gateway="{re.escape(url)}",of="kernels"\}} (\d+)$',
                  body.decode(), re.M)
    return int(m.group(1)) if m else -1


def session_gateway(ctx, user, cid):
    return ctx.psql(f"SELECT gateway_url FROM sessions WHERE user_id = '{user}'"
                    f" AND conversation_id = '{cid}'")


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def test_two_gateways_one_stopped(ctx):
    """Two gateways; one stops under load. New conversations land on the
    other, existing ones continue there with session.reset, and no request
    fails but those in flight at the moment of the stop."""
    st = ctx.st
    url_b, gw_b = ctx.spawn_gateway("jupyter-b")
    # B has far more room than A, so the conversations start on B: A (the
    # suite's gateway) here takes 100 kernels more than it holds; B's room
    # is its memory's (hundreds: a gateway that measured no kernel yet
    # counts 64 MiB each). Both are this host's: by memory alone, A's
    # measured kernels (13 MiB) would leave it more.
    held = int(ctx.psql("SELECT (SELECT count(*) FROM sessions WHERE kernel_id IS NOT NULL)"
                        " + (SELECT count(*) FROM prestarted_kernels)"))
    sock, proc = ctx.spawn_fcgi("two-gw", {"gateway": f"{url_b} token={st.gateway_token} max_kernels=5000",
                                           "max_kernels": str(held + 100)},
                                workers=8)
    keys = {i: ctx.key(f"tg-{i}") for i in range(6)}
    failures, stop_at = [], []
    try:
        for i in range(6):
            status, _, r = fcgi_run(sock, keys[i], "c", f"x = {i}")
            eq(status, 200, f"conversation {i}: {r}")
            eq(session_gateway(ctx, f"tg-{i}", "c"), url_b, f"conversation {i} is on B")
        done = threading.Event()

        def load():
            n = 0
            while not done.is_set():
                n += 1
                t0 = time.monotonic()
                status, _, r = fcgi_run(sock, keys[n % 6], f"load-{n}", "1 + 1")
                if status != 200:
                    failures.append((t0, time.monotonic(), status, r))
        threads = [threading.Thread(target=load) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(2)
        stop_at.append(time.monotonic())
        stop(gw_b)
        stop_at.append(time.monotonic())
        time.sleep(4)
        done.set()
        for t in threads:
            t.join(timeout=120)
        late = [f for f in failures if f[0] > stop_at[1]]
        eq(late, [], "no request that started after the stop failed")
        for i in range(6):
            status, _, r = fcgi_run(sock, keys[i], "c", "print('moved')")
            eq(status, 200, f"conversation {i} after the stop: {r}")
            eq((r["stdout_tail"], r["session"]["reset"]), ("moved\n", True),
               f"conversation {i} continues on A and says its state is gone")
            eq(session_gateway(ctx, f"tg-{i}", "c"), st.gateway_url, f"conversation {i} is on A")
        status, _, r = fcgi_run(sock, keys[0], new_id(), "print('new')")
        eq((status, r.get("stdout_tail")), (200, "new\n"), "a new conversation works, on A")
        status, _, h = fcgi_client.request(sock, "GET", "/v1/health",  # an operator's look
                                           params={"REMOTE_ADDR": "127.0.0.1"})
        h = json.loads(h)
        eq((status, h["checks"]["gateway"]), (200, "ok"), "healthy: one gateway is enough")
        check(h["checks"]["gateways"][url_b].startswith("failed"), f"and B is named: {h}")
    finally:
        stop(proc)
        stop(gw_b)
        ctx.psql("DELETE FROM sessions WHERE user_id LIKE 'tg-%'")


def test_kernel_budget(ctx):
    """A budget of 5 kernels and 15 conversations: every run answers 200,
    the least recently used idle sessions give way, the gateway never holds
    more than 5; with all 5 busy, a new conversation gets 503
    capacity_exhausted and Retry-After, never 502."""
    url_c, gw_c = ctx.spawn_gateway("jupyter-c")
    sock, proc = ctx.spawn_fcgi("budget", {"gateway_url": url_c, "max_kernels": "5",
                                           "kernel_pool_size": "0"}, workers=12)
    try:
        keys = [ctx.key(f"bud-{i}") for i in range(15)]
        most = 0
        for i in range(15):
            status, _, r = fcgi_run(sock, keys[i], "c", f"print({i})")
            eq((status, r.get("stdout_tail")), (200, f"{i}\n"), f"conversation {i}: {r}")
            most = max(most, len(jupyter_kernels(ctx, url_c)))
        check(most <= 5, f"never more than 5 kernels on the gateway: {most}")
        status, _, r = fcgi_run(sock, keys[0], "c", "print('back')")
        eq((status, r["session"]["reset"]), (200, True), "an evicted conversation comes back reset")
        # all five busy: the five conversations that hold the kernels now
        # (10 gave way to 0), so no run waits on an eviction or a start
        busy = []
        # (15 s: under ASan on a busy machine the five starts can spread
        # over several seconds, and all five must be seen busy at once)
        ths = [threading.Thread(target=lambda k=k: busy.append(
            fcgi_run(sock, k, "c", "import time\ntime.sleep(15)")[0]))
            for k in keys[11:15] + keys[:1]]
        for t in ths:
            t.start()
        # Busy as codexec sees it: the five conversations' locks are held
        # (a locked session is never evicted). The Jupyter server's own
        # execution_state is not asked: it once stayed "idle" for all five
        # through their whole 15 s (the runs' log says they ran), and the
        # test failed on what it is not about.
        users = ",".join(f"'bud-{i}'" for i in (11, 12, 13, 14, 0))
        locked_sql = ("SELECT count(*) FROM pg_locks l,"
                      " (SELECT hashtextextended(u || E'\\n' || 'c', 0) AS k"
                      f" FROM unnest(ARRAY[{users}]) u) x WHERE l.locktype = 'advisory'"
                      " AND l.granted AND l.objsubid = 1"
                      " AND ((l.classid::bigint << 32) | l.objid::bigint) = x.k")
        deadline = time.monotonic() + 60
        locked = 0
        while time.monotonic() < deadline:
            locked = int(ctx.psql(locked_sql) or 0)
            if locked == 5:
                break
            time.sleep(0.1)
        eq(locked, 5, "the five conversations are in their runs (their locks held)")
        status, headers, r = fcgi_run(sock, ctx.key("bud-new"), "c", "1")
        eq(status, 503, f"all busy: {r}")
        eq(r["error"]["code"], "capacity_exhausted", "capacity_exhausted")
        check(headers.get("retry-after"), "with Retry-After")
        for t in ths:
            t.join(timeout=120)
        eq(sorted(busy), [200] * 5, "the busy ones finished")
        status, _, r = fcgi_run(sock, ctx.key("bud-new"), "c", "print('in')")
        eq((status, r.get("stdout_tail")), (200, "in\n"), "once one is idle, a new one gets in")
    finally:
        stop(proc)
        stop(gw_c)
        ctx.psql("DELETE FROM sessions WHERE user_id LIKE 'bud-%'")


def gateway_memory(ctx, url, token=True):
    """GET /api/codexec/memory of a gateway with codexec's configuration."""
    h = {"Authorization": f"token {ctx.st.gateway_token}"} if token else {}
    req = urllib.request.Request(url + "/api/codexec/memory", headers=h)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_memory_budget(ctx):
    """Admission by the gateway's measured memory, not a count (issue 29):
    the gateway reports what its kernels hold (their cgroups, read from
    outside the sandboxes); with max_kernel_memory at three and a half
    kernels' worth, new conversations get in while it lasts and then the
    least recently used idle ones give way, the gateway never holding more
    than three; and two kernels, one holding most of the budget in an
    array, both busy, leave no room for a third: 503 capacity_exhausted
    with Retry-After, max_kernels playing no part."""
    url_c, gw_c = ctx.spawn_gateway("jupyter-mem")
    procs = []
    try:
        with_token = gateway_memory(ctx, url_c)
        try:
            gateway_memory(ctx, url_c, token=False)
            check(False, "the report answered without the gateway's token")
        except urllib.error.HTTPError as e:
            check(e.code in (401, 403), f"without the token: {e.code}")
        eq(with_token["kernels"], 0, f"a new gateway's report: {with_token}")
        check(with_token["available_bytes"] > 0 and with_token["total_bytes"] > 0,
              f"the host's memory: {with_token}")
        # the suite runs as root with cgroups (tests/run.py): kernels are measured
        check(isinstance(with_token["kernels_bytes"], int),
              f"the kernels' memory is measured (cgroups): {with_token}")
        # three kernels, measured, for the budget's unit (three: the
        # first kernel of a gateway may hold pages the later ones share)
        sock, proc = ctx.spawn_fcgi("mem-probe", {"gateway_url": url_c, "kernel_pool_size": "0"})
        procs.append(proc)
        for c in ("a", "b", "c"):
            status, _, r = fcgi_run(sock, ctx.key(f"mem-0{c}"), "c", "x = 1")
            eq(status, 200, f"a first conversation: {r}")
        wait_until(lambda: gateway_memory(ctx, url_c)["kernels"] == 3, 30, "three kernels reported")
        time.sleep(1.5)  # (the report is read at most once a second)
        m = gateway_memory(ctx, url_c)
        one = m["kernels_own_bytes"] // 3
        check(one > 1 << 20, f"a kernel is measured: {one} bytes")
        print(f"# one idle kernel: {one / 2**20:.1f} MiB as its cgroup counts it")
        base = m["kernels_bytes"] - 3 * one
        stop(proc)
        procs.clear()
        # room for three and a half: the three probes' kernels (their
        # sessions stay), each new conversation then evicting one
        budget = m["kernels_bytes"] + one // 2
        sock, proc = ctx.spawn_fcgi("mem", {"gateway_url": url_c, "kernel_pool_size": "0",
                                            "max_kernels": "0",
                                            "max_kernel_memory": str(budget)}, workers=12)
        procs.append(proc)
        keys = [ctx.key(f"mem-{i}") for i in range(7)]
        most = 0
        for i in range(1, 7):
            time.sleep(3)  # each new kernel measured before the next (the probe, every 2 s)
            status, _, r = fcgi_run(sock, keys[i], "c", f"print({i})")
            eq((status, r.get("stdout_tail")), (200, f"{i}\n"), f"conversation {i}: {r}")
            most = max(most, len(jupyter_kernels(ctx, url_c)))
        check(most <= 3, f"never more than 3 kernels within the memory budget: {most}")
        # (the last one measured, settled: a kernel admitted within the
        # probe's interval counts at what it held then)
        time.sleep(3)
        status, _, r = fcgi_run(sock, keys[1], "c", "print('back')")
        eq((status, r["session"]["reset"]), (200, True), "an evicted conversation comes back reset")
        # Memory, not kernels: one kernel holds most of the budget and both
        # live conversations are busy; a third finds no room.
        hold = max(budget - base - 2 * one, 8 << 20)
        busy = []
        ths = [threading.Thread(target=lambda: busy.append(fcgi_run(
                   sock, keys[1], "c", f"x = bytearray({hold})\nx[::4096] = b'1' * len(x[::4096])\n"
                                       "import time\ntime.sleep(20)")[0])),
               threading.Thread(target=lambda: busy.append(fcgi_run(
                   sock, keys[6], "c", "import time\ntime.sleep(20)")[0]))]
        for t in ths:
            t.start()
        # the array is measured: the kernels hold more than the budget, on
        # the gateway and in codexec-fcgi's last probe (every 2 s; a fixed
        # wait was once too short in CI, and a threshold of base + hold was
        # met before the array was made)
        wait_until(lambda: gateway_memory(ctx, url_c)["kernels_bytes"] > budget, 30,
                   "the array is measured")
        wait_until(lambda: fcgi_kernels_bytes(sock, url_c) > budget, 30,
                   "codexec-fcgi measured the array")
        kernels = len(jupyter_kernels(ctx, url_c))
        status, headers, r = fcgi_run(sock, ctx.key("mem-new"), "c", "1")
        eq(status, 503, f"no memory left for a third kernel ({kernels} on the gateway): {r}")
        eq(r["error"]["code"], "capacity_exhausted", "capacity_exhausted")
        check(headers.get("retry-after"), "with Retry-After")
        check(kernels <= 3, f"with {kernels} kernels: a count of 128 would have let it in")
        for t in ths:
            t.join(timeout=120)
        eq(sorted(busy), [200, 200], "the busy ones finished")
        status, _, r = fcgi_run(sock, ctx.key("mem-new"), "c", "print('in')")
        eq((status, r.get("stdout_tail")), (200, "in\n"), "once one is idle, a new one gets in")
    finally:
        for p in procs:
            stop(p)
        stop(gw_c)
        ctx.psql("DELETE FROM sessions WHERE user_id LIKE 'mem-%'")


def test_sigkill_leaves_no_kernel(ctx):
    """codexec-fcgi killed (SIGKILL) at 50 random points while it starts
    sessions and fills its kernel pool: once the grace period has passed,
    no kernel on the gateway is one that no session or pool row names."""
    url_d, gw_d = ctx.spawn_gateway("jupyter-d")
    settings = {"gateway_url": url_d, "kernel_pool_size": "2", "kernel_orphan_grace": "3",
                "reaper_interval": "1"}
    keys = [ctx.key(f"kill-{i}") for i in range(4)]
    rng = random.Random(7)
    def unnamed():
        ids = {k["id"] for k in jupyter_kernels(ctx, url_d)}
        rows = set(ctx.psql(
            f"SELECT kernel_id FROM sessions WHERE gateway_url = '{url_d}' AND kernel_id <> ''"
            f" UNION SELECT kernel_id FROM prestarted_kernels WHERE gateway_url = '{url_d}'"
        ).split())
        return ids - rows
    try:
        # 50 kills at least, more until one has left a kernel behind (where
        # the kills land is chance, and slower builds land them elsewhere)
        for round_ in range(150):
            sock, proc = ctx.spawn_fcgi("killed", settings, workers=4)
            ths = [threading.Thread(target=lambda k=k: _quiet(fcgi_run, sock, k, new_id(), "1"))
                   for k in keys[:3]]
            for t in ths:
                t.start()
            time.sleep(rng.uniform(0, 1.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            for t in ths:
                t.join(timeout=120)
            if round_ >= 49 and round_ % 10 == 9 and unnamed():
                break
        # a start the last kill interrupted may still be under way at the
        # gateway, and a deletion it sent may still be shutting a kernel
        # down (seconds, on a loaded machine): the set is taken once it has
        # held still for three seconds, and only what is still there after
        left, deadline, still = unnamed(), time.monotonic() + 60, 0
        while time.monotonic() < deadline and still < 3:
            time.sleep(1)
            now = unnamed()
            still = still + 1 if now == left else 0
            left = now
        left &= unnamed()
        print(f"# after {round_ + 1} kills: {len(left)} kernel(s) on the gateway that no row names")
        if not left:
            # where the kills land is chance (under ASan none may fall between
            # the gateway's start and the row): the state such a kill leaves,
            # made directly, so the cleanup below always has a case
            left = {start_kernel(ctx, url_d)}
            print("# none: one kernel started on the gateway directly, as a kill there leaves it")
        check(left, "kernels that no row names (the case to clean up)")
        sock, proc = ctx.spawn_fcgi("killed", settings, workers=4)
        try:
            wait_until(lambda: not unnamed(), 90, "every kernel on the gateway named by a row")
        finally:
            stop(proc)
    finally:
        stop(gw_d)
        ctx.psql(f"DELETE FROM sessions WHERE gateway_url = '{url_d}'")
        ctx.psql(f"DELETE FROM prestarted_kernels WHERE gateway_url = '{url_d}'")


def _quiet(fn, *args):
    try:
        fn(*args)
    except Exception:  # the process was killed under it: that is the point
        pass


def two_node_nginx(ctx, socks):
    """An nginx whose upstream is the given codexec-fcgi sockets; its URL."""
    st = ctx.st
    ndir = os.path.join(st.var, "nginx")
    port = stack.free_port()
    conf = os.path.join(ndir, "nginx-two.conf")  # its includes are relative to it
    servers = "".join(f"        server unix:{s} max_fails=1 fail_timeout=30s;\n" for s in socks)
    with open(os.path.join(ndir, "nginx.conf")) as f:
        text = f.read()
    text = text.replace(f"        server unix:{st.socket};\n", servers)
    text = text.replace(f"listen 127.0.0.1:{st.http_port};", f"listen 127.0.0.1:{port};")
    if st.ragflow_port:  # (the stack's RAGFlow listener: not this one's)
        text = text.replace(f"listen 127.0.0.1:{st.ragflow_port};",
                            f"listen 127.0.0.1:{stack.free_port()};")
    text = text.replace(f"pid {st.rundir}/nginx-master.pid;", f"pid {st.rundir}/nginx-two.pid;")
    with open(conf, "w") as f:
        f.write(text)
    os.chmod(conf, 0o644)
    proc = st.spawn("nginx-two", ["/usr/sbin/nginx", "-p", ndir, "-c", conf, "-e",
                                  os.path.join(st.logdir, "nginx-error.log")])
    wait_until(lambda: stack.port_open(port), 30, "the two-node nginx")
    return port, proc


def test_two_nodes_one_killed(ctx):
    """Two codexec-fcgi behind one nginx upstream; one is killed under
    load: the other serves every conversation, with its state (nothing a
    process holds is needed by another)."""
    sock_a, proc_a = ctx.spawn_fcgi("node-a", workers=6)
    sock_b, proc_b = ctx.spawn_fcgi("node-b", workers=6)
    port, nginx = two_node_nginx(ctx, [sock_a, sock_b])
    users = [f"node-{i}" for i in range(6)]
    try:
        for i, u in enumerate(users):
            r = ctx.post("/v1/runs", {"conversation_id": "c", "code": f"x = {i}"}, key=ctx.key(u),
                         port=port)
            eq(r.status, 200, f"{u}: {r!r}")
        done, late, killed_at = threading.Event(), [], []

        def load(u):
            while not done.is_set():
                t0 = time.monotonic()
                r = ctx.post("/v1/runs", {"conversation_id": "c", "code": "x"}, key=ctx.key(u),
                             port=port, timeout=120)
                if r.status != 200 and killed_at and t0 > killed_at[0] + 0.5:
                    late.append((u, r.status, r.body[:200]))
        ths = [threading.Thread(target=load, args=(u,)) for u in users[:4]]
        for t in ths:
            t.start()
        time.sleep(2)
        proc_a.send_signal(signal.SIGKILL)
        killed_at.append(time.monotonic())
        time.sleep(4)
        done.set()
        for t in ths:
            t.join(timeout=120)
        eq(late, [], "after the kill, every request is served by the other node")
        for i, u in enumerate(users):
            r = ctx.post("/v1/runs", {"conversation_id": "c", "code": "print(x)"}, key=ctx.key(u),
                         port=port)
            eq((r.status, r.json().get("stdout_tail")), (200, f"{i}\n"),
               f"{u}'s conversation, state and all")
    finally:
        stop(nginx)
        stop(proc_a)
        stop(proc_b)


def jupyter_fds(ctx):
    return len(os.listdir(f"/proc/{ctx.st.pid('jupyter')}/fd"))


def test_soak_one_connection_per_kernel(ctx):
    """64 clients (16 users x 4 conversations: the suite's session cap is 4)
    run, upload and download for five minutes (two under the sanitizers):
    every kernel has at most one channels connection from codexec-fcgi, and
    the Jupyter server's descriptors stay flat."""
    seconds = 300 if ctx.flavour == "werror" else 120
    users = [f"soak-{u}" for u in range(16)]
    errors, counts, samples = [], {"ops": 0}, []
    done = threading.Event()

    def client(u, c):
        key, cid, n = ctx.key(u), f"c{c}", 0
        while not done.is_set():
            n += 1
            if n % 5 == 0:
                r = ctx.request("POST", f"/v1/artifacts?conversation_id={cid}&filename=f{n % 3}.txt",
                                body=f"{u}{c}{n}".encode(), headers={"Content-Type": "text/plain"},
                                key=key)
                if r.status == 201:
                    r = ctx.get(f"/v1/artifacts/{r.json()['artifact_id']}/content", key=key)
            else:
                r = ctx.post("/v1/runs", {"conversation_id": cid, "code": f"n = {n}\nprint(n)"},
                             key=key, timeout=120)
            counts["ops"] += 1
            if r.status not in (200, 201):
                errors.append((u, cid, r.status, r.body[:200]))

    ths = [threading.Thread(target=client, args=(u, c)) for u in users for c in range(4)]
    for t in ths:
        t.start()
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < seconds:
            time.sleep(min(15, seconds / 8))
            kernels = jupyter_kernels(ctx, ctx.st.gateway_direct_url)
            samples.append((time.monotonic() - t0, jupyter_fds(ctx),
                            max((k.get("connections", 0) for k in kernels), default=0)))
    finally:
        # (a failure here must not leave 64 clients loading the next tests)
        done.set()
        for t in ths:
            t.join(timeout=300)
    print(f"# soak: {counts['ops']} operations in {seconds}s; (s, server fds, max connections"
          f" per kernel): {samples}")
    eq(errors[:5], [], "no errors")
    check(all(s[2] <= 1 for s in samples), f"at most one connection per kernel: {samples}")
    # the first half creates the 64 sessions (a kernel start each); then no
    # growth (sessions of earlier tests expiring may take some away)
    settled = [s[1] for s in samples[len(samples) // 2:]]
    check(max(settled) - settled[0] <= 40,
          f"the server's descriptors do not grow once the sessions exist: {samples}")
