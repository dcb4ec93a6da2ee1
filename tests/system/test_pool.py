"""The pool of pre-started kernels (kernel_pool_size): filled in the
background, shared by several codexec processes through PostgreSQL, never
handing one kernel to two conversations, never keeping anything of a
previous owner."""

import json
import signal
import threading

import fcgi_client
from harness import check, eq, metric, new_id, wait_until
from test_runs import gateway, run, session_kernel

# What a kernel shows its first run: the names it holds, its history, its
# working directory. A pooled kernel must show exactly what a cold one does
# (its rehearsals, stored cells, taken out of its history: lib/prestart.c).
PROBE = ("import os\n"
         "print(sorted(globals()), get_ipython().execution_count,"
         " len(get_ipython().history_manager.input_hist_raw), In, Out, _i, _ii, _iii,"
         " sorted(os.listdir('.')))\n")
cold_probe = {}


def pool_rows(ctx):
    """The pooled kernels ready to be claimed (one still warming has a row
    too: it is named from its start)."""
    out = ctx.psql("SELECT id || ' ' || kernel_id FROM prestarted_kernels WHERE ready"
                   " ORDER BY created_at")
    return [tuple(line.split()) for line in out.splitlines() if line.strip()]


def set_pool(ctx, n):
    st = ctx.st
    st.conf_extra["kernel_pool_size"] = str(n)
    st.write_config()
    st.kill_pidfile("codexec-fcgi")
    st.start_fcgi()


def wait_full(ctx, n=2):
    return wait_until(lambda: len(pool_rows(ctx)) == n and pool_rows(ctx), 90,
                      f"{n} pooled kernels")


def test_a_cold_kernel_for_reference(ctx):
    """Before the pool is on: what a kernel started for the run looks like."""
    eq(pool_rows(ctx), [], "no pool while kernel_pool_size is 0")
    r = run(ctx, "pool-ref", new_id(), PROBE)
    eq(r["session"]["created"], True, "a new session")
    cold_probe["stdout"] = r["stdout_tail"]
    eq(pool_rows(ctx), [], "a cold start does not fill a pool")


def test_pool_fills_and_hands_out_fresh_kernels(ctx):
    set_pool(ctx, 2)
    rows = wait_full(ctx)
    pooled = {k for _, k in rows}
    cid = new_id()
    trips = metric(ctx, "gateway_round_trips")
    r = run(ctx, "pool-a", cid, PROBE)
    eq((r["status"], r["session"]["created"], r["session"]["reset"]), ("ok", True, False),
       f"a run on a pooled kernel {r!r}")
    eq(metric(ctx, "gateway_round_trips") - trips, 1,
       "one round trip: no source sent, none asked for (the template's or the warm cell's)")
    kid = session_kernel(ctx, "pool-a", cid)
    check(kid in pooled, f"the session's kernel {kid} came from the pool {pooled}")
    check(kid not in {k for _, k in pool_rows(ctx)}, "a claimed kernel leaves the pool")
    sid = ctx.psql(f"SELECT id FROM sessions WHERE kernel_id = '{kid}'")
    eq(sid, [i for i, k in rows if k == kid][0], "the session took the pooled kernel's id")
    eq(r["stdout_tail"], cold_probe.get("stdout"),
       "a pooled kernel looks exactly like a cold one on its first run")
    # the pool refills in the background, with new kernels
    rows2 = wait_full(ctx)
    check(kid not in {k for _, k in rows2}, "a used kernel never returns to the pool")
    status, _ = gateway(ctx, "GET", f"/api/kernels/{rows2[-1][1]}")
    eq(status, 200, "the refilled kernel is running")


def test_nothing_of_a_previous_owner_reaches_the_next(ctx):
    cid = new_id()
    r = run(ctx, "pool-owner", cid, "secret = 'owner-data'\nopen('secret.txt', 'w').write(secret)\n")
    eq(r["status"], "ok", f"{r!r}")
    old = session_kernel(ctx, "pool-owner", cid)
    eq(ctx.request("DELETE", f"/v1/conversations/{cid}/session",
                   key=ctx.key("pool-owner")).status, 204, "session closed")
    wait_full(ctx)
    check(old not in {k for _, k in pool_rows(ctx)}, "a closed session's kernel is not pooled")
    r = run(ctx, "pool-next", new_id(),
            "import os\nprint('secret' in globals(), os.listdir('.'))\nopen('mine.txt', 'w').write('m')\n")
    eq(r["stdout_tail"], "False []\n", "the next owner sees no name and no file of the last one")
    eq([a["path"] for a in r["artifacts"]], ["mine.txt"], "the first run of a pooled kernel captures")


def test_two_processes_share_the_pool_without_sharing_kernels(ctx):
    sock, proc = ctx.spawn_fcgi("pool2", workers=8)
    try:
        wait_full(ctx)
        # two users: the test stack's per-user cap is 4 sessions
        users = {c: f"pool-many-{i % 2}" for i, c in enumerate(new_id() for _ in range(8))}
        cids = list(users)
        results, most = {}, [0]
        done = threading.Event()

        def watch():
            while not done.is_set():
                most[0] = max(most[0], len(pool_rows(ctx)))

        def via_nginx(cid):
            results[cid] = ctx.post("/v1/runs", {"conversation_id": cid, "code": "print(1)"},
                                    key=ctx.key(users[cid]), timeout=180).status

        def via_second(cid):
            body = json.dumps({"conversation_id": cid, "code": "print(1)"}).encode()
            status, _, _ = fcgi_client.request(sock, "POST", "/v1/runs", body,
                                               {"HTTP_AUTHORIZATION": f"Bearer {ctx.key(users[cid])}"})
            results[cid] = status

        w = threading.Thread(target=watch)
        w.start()
        threads = [threading.Thread(target=via_nginx if i % 4 < 2 else via_second, args=(c,))
                   for i, c in enumerate(cids)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_full(ctx)
        done.set()
        w.join()
        eq(sorted(results.values()), [200] * 8, "every new conversation ran")
        kernels = [session_kernel(ctx, users[c], c) for c in cids]
        eq(len(set(kernels)), 8, f"eight conversations, eight kernels: {kernels}")
        check(most[0] <= 2, f"the pool never holds more than kernel_pool_size: saw {most[0]}")
        check(not set(kernels) & {k for _, k in pool_rows(ctx)},
              "no kernel in use is in the pool")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_vanished_pooled_kernels_are_dropped(ctx):
    rows = wait_full(ctx)
    for _, kid in rows:
        status, _ = gateway(ctx, "DELETE", f"/api/kernels/{kid}")
        eq(status, 204, "kernel deleted behind codexec's back")
    # a claim may get a dead kernel: the run replaces it and says nothing was lost
    r = run(ctx, "pool-vanish", new_id(), "print(2)")
    eq((r["status"], r["stdout_tail"], r["session"]["created"], r["session"]["reset"]),
       ("ok", "2\n", True, False), f"a run after the pooled kernels vanished {r!r}")
    dead = {k for _, k in rows}

    def live_pool():
        now = pool_rows(ctx)
        return len(now) == 2 and not dead & {k for _, k in now} and all(
            gateway(ctx, "GET", f"/api/kernels/{k}")[0] == 200 for _, k in now)
    wait_until(live_pool, 90, "the pool to drop dead kernels and refill")


def test_drain(ctx):
    set_pool(ctx, 0)
    rows = pool_rows(ctx)
    eq(len(rows), 2, "kernels stay pooled while no process refills")
    out = ctx.admin("pool", "drain").stdout
    eq(out.strip(), "deleted 2 pooled kernel(s)", "pool drain")
    eq(pool_rows(ctx), [], "the pool is empty")
    for _, kid in rows:
        eq(gateway(ctx, "GET", f"/api/kernels/{kid}")[0], 404, "a drained kernel is deleted")
