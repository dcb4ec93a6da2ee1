#!/usr/bin/python3
"""codexec benchmarks: figures side by side with the floor they run on,
measured in the same run on the same machine. Prints one table and writes
docs/performance.md. Not a test: nothing here passes or fails.

    packaging/quickstart bench        (or: tests/bench/bench.py --build build)
"""

import argparse
import http.client
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "packaging"))
import stack  # noqa: E402

rows = []
# The ratios of the table as docs/performance.md held it before this run
# (section, what) -> ratio: last round's figures, printed next to today's.
previous = {}


def read_previous(path):
    try:
        with open(path) as f:
            for line in f:
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if len(cells) == 6 and cells[4].endswith("×"):
                    previous[(cells[0], cells[1])] = float(cells[4][:-1])
    except (OSError, ValueError):
        pass


def row(section, what, value, baseline=None, unit="", note=""):
    ratio = f"{value / baseline:.2f}×" if baseline else ""
    if baseline and (section, what) in previous:
        note = f"{note}; last round {previous[(section, what)]:.2f}×".lstrip("; ")
    rows.append((section, what, value, baseline, unit, ratio, note))
    b = f"{baseline:.2f} {unit}" if baseline is not None else "-"
    print(f"{section:<12} {what:<48} {value:10.2f} {unit:<6} vs {b:<14} {ratio:>8}  {note}", flush=True)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Bench:
    def __init__(self, st, build):
        self.st = st
        self.build = build
        self.key = st.create_key("bench")
        self.local = threading.local()  # .conns: port -> kept-alive connection, per thread

    def req(self, method, path, body=None, key=True, port=None):
        """A request on this thread's kept-alive connection (as a client
        that makes many requests holds one), opened again when the server
        closed it."""
        h = {"Content-Type": "application/json"}
        if key:
            h["Authorization"] = f"Bearer {self.key}"
        data = json.dumps(body).encode() if body is not None else None
        if not hasattr(self.local, "conns"):
            self.local.conns = {}
        conns = self.local.conns
        for attempt in range(2):
            c = conns.get(port)
            if c is None:
                c = conns[port] = http.client.HTTPConnection(
                    "127.0.0.1", port or self.st.http_port, timeout=600)
            try:
                c.request(method, path, body=data, headers=h)
                r = c.getresponse()
                out = r.read()
            except (OSError, http.client.HTTPException):
                c.close()
                del conns[port]
                if attempt:
                    raise
                continue
            if r.will_close:
                c.close()
                del conns[port]
            return r.status, out

    def run(self, cid, code, **kw):
        body = {"conversation_id": cid, "code": code}
        body.update(kw)
        status, data = self.req("POST", "/v1/runs", body)
        if status != 200:
            raise RuntimeError(f"run failed: {status} {data[:200]!r}")
        return json.loads(data)

    def metric(self, name):
        _, text = self.req("GET", "/metrics", key=False)
        m = re.search(rf"^codexec_{name}_total (\d+)$", text.decode(), re.M)
        return int(m.group(1))

    def gateway(self, method, path, body=None):
        req = urllib.request.Request(self.st.gateway_url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"token {self.st.gateway_token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            t = r.read()
            return json.loads(t) if t else None

    def crun(self, cid, n, code="x=1", stamps=False):
        """n runs (or "Ss": as many as fit in S seconds) of code in
        conversation cid, one after another on one kept-alive connection,
        by tests/bench/runload: a client in C, as rawexec is for the raw
        executes, whose own CPU and time stay out of the run's (Python's
        http.client and json add 1-2 ms a run on this machine). Each run's
        ms, or (ms, its end in CLOCK_MONOTONIC seconds) with stamps."""
        p = self.crun_start(cid, n, code)
        out, err = p.communicate()
        if p.returncode:
            raise RuntimeError(f"runload failed in {cid}: {err.strip()[:200]}")
        out = [tuple(float(x) for x in line.split()) for line in out.splitlines()]
        return out if stamps else [ms for ms, _ in out]

    def crun_start(self, cid, n, code="x=1"):
        """runload started: its stdout the runs, its stderr the failed ones."""
        return subprocess.Popen([os.path.join(self.build, "tests", "bench", "runload"),
                                 str(self.st.http_port), self.key, cid, str(n), code],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def raw(self, kernel, n, mode):
        p = subprocess.run([os.path.join(self.build, "tests", "bench", "rawexec"), self.st.gateway_url,
                            self.st.gateway_token, kernel, str(n), mode],
                           stdout=subprocess.PIPE, text=True, check=True)
        return [float(x) for x in p.stdout.split()]

    def psql(self, sql):
        st = self.st
        return subprocess.run(["/usr/lib/postgresql/15/bin/psql", "-h", st.pg_run, "-p", str(st.pg_port),
                               "-U", "codexec", "-d", "codexec", "-tAc", sql],
                              stdout=subprocess.PIPE, text=True, check=True).stdout.strip()

    def pool_ready(self):
        return int(self.psql("SELECT count(*) FROM prestarted_kernels WHERE ready"))

    def settle(self):
        """Waits until the kernel pool is full again: a refill starts a kernel
        (a second of CPU) that would otherwise land in the next figures."""
        want = int(self.st.conf_extra.get("kernel_pool_size", 2))
        deadline = time.monotonic() + 120
        while self.pool_ready() < want and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)

    def rss(self):
        with open(f"/proc/{self.st.pid('codexec-fcgi')}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def run_overhead(b, n_runs):
    """Runs of x=1 against the tuned raw execute on a kernel of the same
    gateway, measured in alternating blocks of ten (this machine's speed
    drifts within a minute: a floor measured once, first, is no floor for
    runs measured a minute later). The runs by a client in C, as the raw
    executes (Bench.crun); the trivial run by Python's http.client too."""
    ws = "w-bench-raw"
    os.makedirs(os.path.join(b.st.workspaces, ws), exist_ok=True)
    b.st.chown_kernel(os.path.join(b.st.workspaces, ws))
    k = b.gateway("POST", "/api/kernels", {"name": "python3-sandbox", "path": ws})["id"]
    b.raw(k, 5, "tuned")
    plain = b.raw(k, n_runs, "plain")
    row("run", "raw execute x=1, plain client (median)", statistics.median(plain), None, "ms")
    tuned_all = []
    for files in (0, 10, 50, 500):
        cid = f"overhead-{files}"
        b.run(cid, f"import os\nfor i in range({files}):\n    open(f'f{{i:03d}}.bin', 'wb').write(os.urandom(65536))",
              timeout=300)
        b.run(cid, "x = 0")
        b.settle()
        trips0 = [b.metric(n) for n in ("gateway_round_trips", "gateway_rest_requests", "gateway_ws_connects")]
        lat, tuned, py = [], [], []
        for _ in range(max(1, n_runs // 10)):
            tuned += b.raw(k, 10, "tuned")
            lat += b.crun(cid, 10)
            for _ in range(10 if files == 0 else 0):
                t0 = time.perf_counter()
                b.run(cid, "x=1")
                py.append((time.perf_counter() - t0) * 1000)
        tuned_all += tuned
        trips = [b.metric(n) for n in ("gateway_round_trips", "gateway_rest_requests", "gateway_ws_connects")]
        per = [(a - c) / (len(lat) + len(py)) for a, c in zip(trips, trips0)]
        row("run", f"POST /v1/runs x=1, {files} files of 64 KiB (median)", statistics.median(lat),
            statistics.median(tuned), "ms",
            f"p95 {pct(lat, 95):.1f} ms; per run: {per[0]:.0f} round trip, {per[1]:.0f} REST, {per[2]:.0f} WS opens")
        if py:
            row("run", f"POST /v1/runs x=1, {files} files, Python's http.client (median)",
                statistics.median(py), statistics.median(tuned), "ms",
                "the same runs from a Python client: its own time is in each figure")
    row("run", "raw execute x=1, tuned client (median, all blocks)", statistics.median(tuned_all), None, "ms")
    b.gateway("DELETE", f"/api/kernels/{k}")


BIG_FILE = ("import os\nos.makedirs('tmp', exist_ok=True)\nb = os.urandom(1 << 20)\n"
            "with open({path!r}, 'wb') as f:\n    for _ in range(100):\n        f.write(b)\n")


def disk_floor(b):
    """100 MiB written and fsync'd where the artifacts go: what capture can't beat."""
    path = os.path.join(b.st.storage, "bench-floor.bin")
    block = os.urandom(1 << 20)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(100):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    secs = time.perf_counter() - t0
    os.unlink(path)
    return secs


def capture(b, section="capture"):
    """A run writing a new 100 MiB file (a random MiB, a hundred times:
    writing costs the kernel 30 ms, urandom would cost it 500) captured,
    against the same run writing into tmp/, which capture leaves alone;
    three of each, the median. The difference is the capture: scan, hash,
    transfer, store, fsync, commit. Its floor: the same bytes written and
    synced where artifacts go (the disk of this machine varies from one
    minute to the next, so it is measured in every round too)."""
    b.run("capture", "x = 0")
    b.settle()
    before = b.rss()
    peak = [before]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], b.rss())
            time.sleep(0.02)

    t = threading.Thread(target=watch)
    t.start()
    plain, captured, floor, r = [], [], [], None
    for i in range(3):
        floor.append(disk_floor(b))
        t0 = time.perf_counter()
        b.run("capture", BIG_FILE.format(path="tmp/big.bin"), timeout=300)
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r = b.run("capture", BIG_FILE.format(path=f"big-{i}.bin"), timeout=300)
        captured.append(time.perf_counter() - t0)
        if not r["artifacts"] or r["artifacts"][0]["size"] != 100 << 20:
            raise RuntimeError(f"capture bench: the file was not captured: {r.get('skipped')}")
    done.set()
    t.join()
    size = 100 << 20
    plain_s, captured_s = statistics.median(plain), statistics.median(captured)
    floor = statistics.median(floor)
    row(section, "100 MiB written to tmp/ (not captured)", plain_s, None, "s")
    row(section, "100 MiB produced file: run incl. capture", captured_s, plain_s, "s",
        f"{size / captured_s / 1e6:.0f} MB/s end to end")
    row(section, "100 MiB capture alone (the difference)", captured_s - plain_s, floor, "s",
        f"{size / (captured_s - plain_s) / 1e6:.0f} MB/s; disk floor (write + fsync) "
        f"{size / floor / 1e6:.0f} MB/s")
    row(section, "codexec-fcgi RSS growth during them", (peak[0] - before) / 1024, None, "MiB")
    return r["artifacts"][0]


def files_api(b, n_runs):
    """The file API: 100 MiB written with PUT and read back with GET,
    through nginx, codexec-fcgi, the gateway and the kernel, against the
    disk floor (the same bytes written and synced where artifacts go),
    three of each, the median. Then output: "full" and results on a run:
    a run printing 16 KiB with output "full" against the same run with
    the tail, and a run displaying 16 KiB of HTML (inline in results)
    against one printing it, alternating."""
    cid, size = "bench-files", 100 << 20
    data = os.urandom(1 << 20) * 100
    b.run(cid, "x = 0")
    b.settle()
    port = b.st.http_port
    h = {"Authorization": f"Bearer {b.key}", "Content-Type": "application/octet-stream"}
    before, peak = b.rss(), [b.rss()]
    writes, reads, floors = [], [], []
    for i in range(3):
        floors.append(disk_floor(b))
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        t0 = time.perf_counter()
        c.request("PUT", f"/v1/conversations/{cid}/files/big.bin", body=data, headers=h)
        r = c.getresponse()
        r.read()
        writes.append(time.perf_counter() - t0)
        c.close()
        if r.status != 201:
            raise RuntimeError(f"files bench: PUT answered {r.status}")
        peak[0] = max(peak[0], b.rss())
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        t0 = time.perf_counter()
        c.request("GET", f"/v1/conversations/{cid}/files/big.bin", headers=h)
        r = c.getresponse()
        got = 0
        while True:
            chunk = r.read(1 << 20)
            if not chunk:
                break
            got += len(chunk)
        reads.append(time.perf_counter() - t0)
        c.close()
        if got != size:
            raise RuntimeError(f"files bench: GET read {got} bytes")
        peak[0] = max(peak[0], b.rss())
    floor = statistics.median(floors)
    w, rd = statistics.median(writes), statistics.median(reads)
    row("files", "PUT 100 MiB file (time against the disk floor)", w, floor, "s",
        f"{size / w / 1e6:.0f} MB/s = {floor / w:.2f}× the floor's {size / floor / 1e6:.0f} MB/s")
    row("files", "GET 100 MiB file (time against the disk floor)", rd, floor, "s",
        f"{size / rd / 1e6:.0f} MB/s = {floor / rd:.2f}× the floor's")
    row("files", "codexec-fcgi RSS growth during them", (peak[0] - before) / 1024, None, "MiB")
    b.run(cid, "import os; os.remove('big.bin')")
    pairs = {"tail": [], "full": [], "print": [], "html": []}
    printed = "print('x' * 16384)"
    shown = "from IPython.display import HTML, display\ndisplay(HTML('x' * 16384))"
    b.run(cid, shown)
    for _ in range(max(1, n_runs // 10)):
        for _ in range(10):
            for what, code, kw in (("tail", printed, {}), ("full", printed, {"output": "full"}),
                                   ("print", printed, {}), ("html", shown, {})):
                t0 = time.perf_counter()
                b.run(cid, code, **kw)
                pairs[what].append((time.perf_counter() - t0) * 1000)
    med = {k: statistics.median(v) for k, v in pairs.items()}
    row("files", 'run printing 16 KiB, output "full" (median)', med["full"], med["tail"], "ms",
        "against the same run with the tail only")
    row("files", "run displaying 16 KiB HTML, in results (median)", med["html"], med["print"], "ms",
        "against the same bytes printed")


def downloads(b, big):
    # the same bytes served statically by the same nginx
    src = os.path.join(b.st.storage, "artifacts", "bench", big["artifact_id"], f"v{big['version']}",
                       big["filename"])
    static = os.path.join(b.st.var, "static")
    os.makedirs(static, exist_ok=True)
    shutil.copyfile(src, os.path.join(static, "big.bin"))
    with open(os.path.join(static, "small.bin"), "wb") as f:
        f.write(os.urandom(4096))
    for p in (static, os.path.join(static, "big.bin"), os.path.join(static, "small.bin")):
        b.st.chown(p)
        os.chmod(p, 0o755 if os.path.isdir(p) else 0o644)

    def get_secs(path, key):
        """One download by curl (a C client: Python's would be the bottleneck)."""
        args = ["curl", "-s", "-o", "/dev/null", "-w", "%{time_total}"]
        if key:
            args += ["-H", f"Authorization: Bearer {b.key}"]
        out = subprocess.run(args + [f"http://127.0.0.1:{b.st.http_port}{path}"], stdout=subprocess.PIPE,
                             text=True, check=True).stdout
        return float(out)

    def interleaved(path, n=11):
        """Static and codexec downloads taken in turns, so that drift in the
        machine's speed lands on both; medians of each."""
        st_t, cx_t = [], []
        for _ in range(n):
            st_t.append(get_secs("/_bench_static/big.bin", False))
            cx_t.append(get_secs(path, True))
        return statistics.median(st_t), statistics.median(cx_t)

    url = f"/v1/artifacts/{big['artifact_id']}/content"
    interleaved(url, 2)  # page cache and connections warm
    st_t, xa_t = interleaved(url)
    row("download", "100 MiB, nginx static file", 100 / st_t, None, "MiB/s", "curl, median of 11")
    row("download", "100 MiB, x-accel", 100 / xa_t, 100 / st_t, "MiB/s",
        "ratio to static taken in turns (≥ 0.9 wanted)")
    set_delivery(b, "direct")
    try:
        interleaved(url, 2)
        st_t, d_t = interleaved(url)
        row("download", "100 MiB, direct", 100 / d_t, 100 / st_t, "MiB/s",
            f"ratio to static taken in turns, {100 / st_t:.0f} MiB/s then (≥ 0.5 wanted)")
    finally:
        set_delivery(b, "x-accel")
    small = b.run("small", "open('s.bin', 'wb').write(__import__('os').urandom(4096))")["artifacts"][0]

    def wrk(path, headers):
        args = ["wrk", "-t2", "-c16", "-d5s"] + sum((["-H", h] for h in headers), []) + \
               [f"http://127.0.0.1:{b.st.http_port}{path}"]
        out = subprocess.run(args, stdout=subprocess.PIPE, text=True).stdout
        m = re.search(r"Requests/sec:\s+([\d.]+)", out)
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        return float(m.group(1)) if m else 0.0, int(non2xx.group(1)) if non2xx else 0

    s_rps, _ = wrk("/_bench_static/small.bin", [])
    row("download", "4 KiB, nginx static (wrk, 16 connections)", s_rps, None, "req/s")
    a_rps, bad = wrk(f"/v1/artifacts/{small['artifact_id']}/content", [f"Authorization: Bearer {b.key}"])
    row("download", "4 KiB artifact, x-accel (wrk, 16 connections)", a_rps, s_rps, "req/s",
        f"ratio to static (≥ 0.25 wanted: the FastCGI ceiling is about 0.3); {bad} non-2xx")
    # The browser's way in: a signed link, checked by nginx itself (the
    # link module, the stack's default) and, for comparison, by codexec
    # (the module's location taken away: what Apache and edge-less nginx do).
    status, data = b.req("POST", f"/v1/artifacts/{small['artifact_id']}/links", {"expires_in": 3600})
    if status != 201:
        raise RuntimeError(f"link failed: {status} {data[:200]!r}")
    link = json.loads(data)["url"]
    l_rps, bad = wrk(link, [])
    row("download", "4 KiB, signed link checked by nginx (wrk, 16 connections)", l_rps, s_rps,
        "req/s", f"ratio to static (≥ 0.8 wanted); {bad} non-2xx")
    b.st.edge_links = False
    b.st.write_nginx()
    b.st.reload_nginx()
    try:
        c_rps, bad = wrk(link, [])
        row("download", "4 KiB, signed link checked by codexec (wrk, 16 connections)", c_rps,
            s_rps, "req/s", f"ratio to static; {bad} non-2xx")
    finally:
        b.st.edge_links = True
        b.st.write_nginx()
        b.st.reload_nginx()
    # The ceiling of anything answered through FastCGI here: a 404 from the
    # router, without authentication, database or file.
    n_rps, _ = wrk("/v1/no-such-route", [])
    row("download", "FastCGI ceiling: a 404 without any work (wrk, 16 connections)", n_rps, s_rps,
        "req/s", "ratio to static: what no download through FastCGI can beat")


def s3(b, n=11):
    """storage = s3 on the stack's test object store (s3rver behind its
    SigV4 check): capture throughput to it, and a 100 MiB download in
    x-accel and direct modes next to nginx proxying the same object from
    the store with a presigned URL (botocore's), taken in turns."""
    b.st.use_s3()
    try:
        big = capture(b, "s3")
        import botocore.config
        import botocore.session
        with open(b.st.s3_keys) as f:
            key_id, secret = f.read().split()
        client = botocore.session.get_session().create_client(
            "s3", endpoint_url=f"http://127.0.0.1:{b.st.s3_port}", region_name=stack.S3_REGION,
            aws_access_key_id=key_id, aws_secret_access_key=secret,
            config=botocore.config.Config(signature_version="s3v4",
                                          s3={"addressing_style": "path"}))
        obj = f"{stack.S3_PREFIX}artifacts/bench/{big['artifact_id']}/v{big['version']}/{big['filename']}"
        presigned = client.generate_presigned_url(
            "get_object", Params={"Bucket": stack.S3_BUCKET, "Key": obj}, ExpiresIn=3600)
        baseline = "/_bench_s3" + presigned.split(str(b.st.s3_port), 1)[1]

        def get_secs(path, key):
            args = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{time_total}"]
            if key:
                args += ["-H", f"Authorization: Bearer {b.key}"]
            out = subprocess.run(args + [f"http://127.0.0.1:{b.st.http_port}{path}"],
                                 stdout=subprocess.PIPE, text=True, check=True).stdout.split()
            if out[0] != "200":
                raise RuntimeError(f"{path}: {out[0]}")
            return float(out[1])

        def interleaved(path, k):
            base, cx = [], []
            for _ in range(k):
                base.append(get_secs(baseline, False))
                cx.append(get_secs(path, True))
            return statistics.median(base), statistics.median(cx)

        url = f"/v1/artifacts/{big['artifact_id']}/content"
        interleaved(url, 1)
        base_t, xa_t = interleaved(url, n)
        row("s3", "100 MiB, nginx proxying the object from the store (presigned)", 100 / base_t,
            None, "MiB/s", f"curl, median of {n}")
        row("s3", "100 MiB, x-accel from the store", 100 / xa_t, 100 / base_t, "MiB/s",
            "ratio to nginx proxying it, taken in turns")
        set_delivery(b, "direct")
        interleaved(url, 1)
        base_t, d_t = interleaved(url, n)
        row("s3", "100 MiB, direct from the store", 100 / d_t, 100 / base_t, "MiB/s",
            "ratio to nginx proxying it, taken in turns")
    finally:
        b.st.conf_extra["delivery"] = "x-accel"
        b.st.use_s3(False)


def set_delivery(b, mode):
    b.st.conf_extra["delivery"] = mode
    b.st.write_config()
    b.st.kill_pidfile("codexec-fcgi")
    b.st.start_fcgi()


def concurrency(b, seconds):
    """n conversations running at once, after as many seconds untimed: the
    first runs on n run threads and workers open their PostgreSQL
    connections and prepare their statements (tens of ms of the server's
    CPU each, once in a process's life), which is no run's throughput.
    Runs and raw executes are counted alike: those that end in a window of
    `seconds` that every client's first and last seconds are outside of
    (64 clients start and stop over a moment: counted over their whole
    time, the rate would mix in fewer clients at once). Both by clients in
    C, one process a conversation (runload, rawexec): on two cores a
    client's CPU is taken from what it measures, and 64 Python threads
    took ~0.5 ms of CPU a run more than rawexec, and a GIL."""
    margin = 1.5
    for n in (1, 4, 16, 64):
        for i in range(n):
            b.run(f"conc-{n}-{i}", "x = 0", timeout=300)
        b.settle()
        rss = [b.rss()]
        for timed in (False, True):
            procs = [b.crun_start(f"conc-{n}-{i}", f"{seconds + 2 * margin:g}s") for i in range(n)]
            start = time.monotonic()
            done = threading.Event()

            def sample():
                while not done.wait(0.5):
                    rss.append(b.rss())

            sampler = threading.Thread(target=sample)
            sampler.start()
            outs = [p.communicate() for p in procs]
            done.set()
            sampler.join()
        # failed runs (runload says how many), or a client that could not go on
        errors = sum(int(m.group(1)) for _, err in outs
                     for m in [re.search(r"(\d+) failed runs", err)] if m)
        errors += sum(1 for p, (_, err) in zip(procs, outs) if p.returncode and "failed runs" not in err)
        lat = [ms for out, _ in outs for ms, t in (map(float, line.split()) for line in out.splitlines())
               if start + margin <= t < start + margin + seconds]
        # the floor: tuned raw clients executing on the same kernels at once
        kernels = b.psql(f"SELECT kernel_id FROM sessions WHERE conversation_id LIKE 'conc-{n}-%'").split()
        env = dict(os.environ, STAMPS="1")
        procs = [subprocess.Popen([os.path.join(b.build, "tests", "bench", "rawexec"), b.st.gateway_url,
                                   b.st.gateway_token, k, f"{seconds + 2 * margin:g}s", "tuned"],
                                  stdout=subprocess.PIPE, text=True, env=env) for k in kernels]
        start = time.monotonic()
        raw = []
        for p in procs:
            for line in p.communicate()[0].splitlines():
                ms, t = (float(x) for x in line.split())
                if start + margin <= t < start + margin + seconds:
                    raw.append(ms)
        raw_rate = len(raw) / seconds
        row("concurrency", f"{n} conversations at once: raw executes/s", raw_rate, None, "exec/s",
            f"p99 {pct(raw, 99) if raw else 0:.1f} ms; tuned raw clients on the same kernels")
        row("concurrency", f"{n} conversations at once: runs/s", len(lat) / seconds, raw_rate, "runs/s",
            f"p99 {pct(lat, 99) if lat else 0:.1f} ms; {errors} errors; RSS {max(rss) / 1024:.0f} MiB")


def first_and_next(b, cid):
    """A conversation's first run and the next one right after, in ms (by
    the C client, as every run the cold rows compare)."""
    times = b.crun(cid, 2)
    if len(times) != 2:
        raise RuntimeError(f"runs failed in {cid}")
    return times


def cold_start(b, n):
    """With the pool emptied and off (what every first run paid before the
    pool), then with a kernel ready in the pool: the pool full and quiet
    (the issue's "pool ready"), against the same conversation's next run
    and against a warm conversation's run after the same quiet (a run
    after a second idle costs more than one right after another: caches,
    the kernel's and the server's threads asleep); then with the previous
    conversation's claim just before (its refill under way or due)."""
    size = b.st.conf_extra.get("kernel_pool_size")
    for pooled in (False, True):
        b.st.conf_extra["kernel_pool_size"] = "2" if pooled else "0"
        b.st.write_config()
        b.st.kill_pidfile("codexec-fcgi")
        if not pooled:
            subprocess.run([b.st.admin, "--config", b.st.conf, "pool", "drain"], check=True,
                           stdout=subprocess.DEVNULL)
        b.st.start_fcgi()
        cold, warm, idle = [], [], []
        if pooled:
            b.run("cold-idle", "x=1")
        for i in range(n):
            if pooled:
                b.settle()
                idle += b.crun("cold-idle", 1)
                time.sleep(1)
            first, after = first_and_next(b, f"cold-{int(pooled)}-{i}")
            cold.append(first)
            warm.append(after)
        if not pooled:
            row("cold start", "first run of a new conversation, no kernel pool (median)",
                statistics.median(cold), statistics.median(warm), "ms",
                "ratio to a warm run (before the pool)")
            continue
        row("cold start", "first run of a new conversation, a kernel ready in the pool (median)",
            statistics.median(cold), statistics.median(warm), "ms",
            f"ratio to the same conversation's next run (goal ≤ 1.2); "
            f"{statistics.median(cold) / statistics.median(idle):.2f}× a warm conversation's run "
            f"after the same second idle ({statistics.median(idle):.1f} ms)")
        cold, warm = [], []
        for i in range(n):
            deadline = time.monotonic() + 120
            while b.pool_ready() < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            first, after = first_and_next(b, f"cold-burst-{i}")
            cold.append(first)
            warm.append(after)
        row("cold start", "first run of a new conversation, a kernel ready, another claimed just "
            "before (median)", statistics.median(cold), statistics.median(warm), "ms",
            "ratio to the same conversation's next run; the refill under way or due")
    b.req("DELETE", "/v1/conversations/cold-idle/session")
    if size is None:
        b.st.conf_extra.pop("kernel_pool_size")
    else:
        b.st.conf_extra["kernel_pool_size"] = size


def languages(b, n_runs, n_cold):
    """Per language of the stack (JavaScript, R): a trivial run against a
    tuned raw execute on a kernel of the same kernelspec (the front kernel
    and its inner kernel both), in alternating blocks of ten; then the first
    run of a new conversation with a kernel ready in that language's pool,
    against the same conversation's next run."""
    for lang in b.st.languages:
        name = stack.LANGUAGE_KERNELS[lang]
        ws = f"w-bench-raw-{lang}"
        os.makedirs(os.path.join(b.st.workspaces, ws), exist_ok=True)
        b.st.chown_kernel(os.path.join(b.st.workspaces, ws))
        k = b.gateway("POST", "/api/kernels", {"name": name, "path": ws})["id"]
        b.raw(k, 5, "tuned")
        cid = f"bench-lang-{lang}"
        for _ in range(3):
            b.run(cid, "x=1", language=lang)
        lat, tuned = [], []
        for _ in range(max(1, n_runs // 10)):
            tuned += b.raw(k, 10, "tuned")
            for _ in range(10):
                t0 = time.perf_counter()
                b.run(cid, "x=1", language=lang)
                lat.append((time.perf_counter() - t0) * 1000)
        b.gateway("DELETE", f"/api/kernels/{k}")
        row("languages", f"{lang}: POST /v1/runs x=1 (median)", statistics.median(lat),
            statistics.median(tuned), "ms",
            f"ratio to a tuned raw execute on {name} (≤ 1.5 wanted); p95 {pct(lat, 95):.1f} ms")
        b.st.conf_extra[f"kernel_pool_size_{lang}"] = "1"
        b.st.write_config()
        b.st.kill_pidfile("codexec-fcgi")
        b.st.start_fcgi()
        cold, warm = [], []
        ready = lambda: int(b.psql("SELECT count(*) FROM prestarted_kernels WHERE ready"
                                   f" AND kernel_name = '{name}'"))
        for i in range(n_cold):
            deadline = time.monotonic() + 120
            while ready() < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)
            c = f"bench-lang-cold-{lang}-{i}"
            t0 = time.perf_counter()
            b.run(c, "x=1", language=lang)
            cold.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            b.run(c, "x=1", language=lang)
            warm.append((time.perf_counter() - t0) * 1000)
        row("languages", f"{lang}: first run of a new conversation, a kernel ready in the pool "
            "(median)", statistics.median(cold), statistics.median(warm), "ms", "ratio to a warm run")
        b.st.conf_extra.pop(f"kernel_pool_size_{lang}")
        b.st.write_config()
        b.st.kill_pidfile("codexec-fcgi")
        subprocess.run([b.st.admin, "--config", b.st.conf, "pool", "drain"], check=True,
                       stdout=subprocess.DEVNULL)
        b.st.start_fcgi()
        b.settle()


def cold_imports(b, n):
    """A new conversation's first run that imports pandas and matplotlib,
    on a pooled kernel warmed without and with kernel_preload; the baseline
    is the same run again in the same conversation (modules imported)."""
    saved = dict(b.st.conf_extra)
    code = "import pandas, matplotlib.pyplot as plt\nx = 1"
    for preload in ("", "numpy, pandas, matplotlib.pyplot"):
        b.st.conf_extra.update(kernel_pool_size="2", kernel_preload=preload)
        b.st.write_config()
        b.st.kill_pidfile("codexec-fcgi")
        subprocess.run([b.st.admin, "--config", b.st.conf, "pool", "drain"], check=True,
                       stdout=subprocess.DEVNULL)
        b.st.start_fcgi()
        cold, warm = [], []
        for i in range(n):
            b.settle()  # both pooled kernels warm: a refill's imports are CPU work
            cid = f"imports-{int(bool(preload))}-{i}"
            t0 = time.perf_counter()
            b.run(cid, code, timeout=120)
            cold.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            b.run(cid, code)
            warm.append((time.perf_counter() - t0) * 1000)
        what = f"kernel_preload = {preload}" if preload else "no kernel_preload"
        row("cold start", f"first run importing pandas + matplotlib, pooled, {what} (median)",
            statistics.median(cold), statistics.median(warm), "ms", "ratio to the same run warm")
    b.st.conf_extra.clear()
    b.st.conf_extra.update(saved)
    b.st.write_config()
    b.st.kill_pidfile("codexec-fcgi")
    b.st.start_fcgi()


# What this round's limits (issue 22: run threads, the run-end reaping
# from outside the kernel, costed JSON, the gateway's guards) cost: today's
# ratio to the floor against last round's, from the document this run
# replaces. The floor is measured in each run, so the ratios compare across
# runs where the milliseconds would not; but the floor goes through
# codexec's Jupyter server configuration too, and where that changes (as
# in issue 22, which made the server itself cheaper) the ratio moves
# although codexec did not. tests/bench/against.py measures both
# revisions in the same session, the figures next to the ratios.
LIMITS = [("run", "POST /v1/runs x=1, 0 files of 64 KiB (median)", "trivial run"),
          ("run", "POST /v1/runs x=1, 500 files of 64 KiB (median)", "run with 500 files"),
          ("concurrency", "64 conversations at once: runs/s", "64-conversation throughput")]


def against_last_round():
    now = {(s, w): v / bl for s, w, v, bl, *_ in rows if bl}
    for section, what, name in LIMITS:
        if (section, what) in now and (section, what) in previous:
            row("limits", f"{name}: ratio today vs last round", now[(section, what)],
                previous[(section, what)], "×",
                "throughput: above 0.95× is within 5 %" if section == "concurrency"
                else "latency: below 1.05× is within 5 %")


def describe_machine():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) // (1024 * 1024)
        with open("/etc/debian_version") as f:
            deb = f.read().strip()
    except (OSError, ValueError):
        mem, deb = 0, "?"
    return (f"{platform.machine()}, {os.cpu_count()} cores ({model or 'unknown CPU'}), {mem} GiB, "
            f"Debian {deb}, Linux {platform.release()}; {time.strftime('%Y-%m-%d', time.gmtime())}")


def write_doc(path, machine):
    lines = ["# Performance", "",
             "Written by `packaging/quickstart bench` (tests/bench/bench.py). Every figure is",
             "measured in the same run, on the same machine, next to its floor. The floors:",
             "`tests/bench/rawexec` executes `x=1` on the same gateway and kernelspec with",
             "nothing around it, once with a tuned client (TCP_QUICKACK re-armed after every",
             "read, as codexec's own) and once with a plain one (delayed ACKs on); nginx",
             "serving the same bytes as a static file; and a warm run for the cold start.",
             "The run, cold start and concurrency rows' runs are made by `tests/bench/runload`,",
             "a client in C as the floor's is (the trivial run by Python's http.client too).",
             "Medians unless said otherwise.",
             "", f"Machine: {machine}", "",
             "| section | what | value | baseline | ratio | note |", "|---|---|---|---|---|---|"]
    for s, w, v, bl, u, r, note in rows:
        lines.append(f"| {s} | {w} | {v:.2f} {u} | {'' if bl is None else f'{bl:.2f} {u}'} | {r} | {note} |")
    # The hand-written part (what was changed, before and after, what the
    # profiles showed) follows the marker and is kept across runs.
    kept = ""
    try:
        with open(path) as f:
            old = f.read()
        if NOTES_MARKER in old:
            kept = old[old.index(NOTES_MARKER):]
    except OSError:
        pass
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n\n" + (kept or NOTES_MARKER + "\n"))


NOTES_MARKER = "<!-- everything below is kept when the benchmark rewrites this file -->"


def mem_available_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def capacity(b, ceiling, minutes):
    """The largest number of live conversations one machine holds with every
    run answering 200: new conversations (a kernel each) one after another,
    every 25th step a run in each earlier one too, until a run fails, memory
    runs low (1.5 GiB available), the ceiling or the time budget. The
    budget is lifted for it (max_kernels = ceiling)."""
    saved = dict(b.st.conf_extra)
    b.st.conf_extra.update(max_kernels=str(ceiling + 10), max_sessions_per_user=str(ceiling + 10),
                           kernel_pool_size="0",
                           default_ttl="3600")
    b.st.write_config()
    b.st.kill_pidfile("codexec-fcgi")
    b.st.start_fcgi()
    start_mem, t_end = mem_available_mib(), time.monotonic() + minutes * 60
    live, limit = [], "the ceiling of this measurement"
    while len(live) < ceiling:
        if time.monotonic() > t_end:
            limit = f"the time budget ({minutes} min)"
            break
        if mem_available_mib() < 1536:
            limit = "memory (less than 1.5 GiB available)"
            break
        cid = f"cap-{len(live)}"
        status, body = b.req("POST", "/v1/runs", {"conversation_id": cid, "code": "x = 1"})
        if status != 200:
            limit = f"a new conversation answered {status}: {body[:120]!r}"
            break
        live.append(cid)
        if len(live) % 25 == 0:
            bad = [c for c in live if b.req("POST", "/v1/runs", {"conversation_id": c,
                                                                  "code": "x"})[0] != 200]
            if bad:
                limit = f"{len(bad)} earlier conversation(s) stopped answering 200"
                break
    used = start_mem - mem_available_mib()
    row("capacity", "live conversations held, every run 200", len(live), None, "convs",
        f"stopped by {limit}; {used / max(len(live), 1):.0f} MiB each")
    for c in live:
        b.req("DELETE", f"/v1/conversations/{c}/session")
    b.st.conf_extra.clear()
    b.st.conf_extra.update(saved)
    b.st.write_config()
    b.st.kill_pidfile("codexec-fcgi")
    b.st.start_fcgi()


def pss_by_role(user):
    """The PSS (MiB) of the gateway's processes, by role: kernels (pid 1 of
    their namespaces: forked from the template), the template, launchers
    (and the keeper), bwrap'd kernels, the Jupyter server."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
            with open(f"/proc/{pid}/smaps_rollup") as f:
                pss = int(re.search(r"^Pss:\s+(\d+)", f.read(), re.M).group(1)) / 1024
        except (OSError, AttributeError):
            continue
        if not re.search(rf"^Uid:\s+{user}\b", status, re.M):
            continue
        name = re.search(r"^Name:\s+(.*)$", status, re.M).group(1)
        nspid = re.search(r"^NSpid:\s+(.*)$", status, re.M).group(1).split()
        if len(nspid) > 1 and nspid[-1] == "1" and name.startswith("python"):
            role = "kernels"
        elif name.startswith("codexec-kernel"):
            role = "launchers"
        elif name.startswith("python") and b" --fds " in cmd:
            role = "template"
        elif b"jupyter_server" in cmd or b"supervise.py" in cmd:
            role = "jupyter server"
        else:
            role = "other (bwrap, bwrap'd kernels)"
        out[role] = out.get(role, 0) + pss
    return out


def density(b, target, minutes):
    """Idle conversations one machine holds, with kernel_preload = numpy,
    pandas, matplotlib.pyplot (each kernel forked from the template that
    imported them): new conversations one after another (x = i), until the
    target, memory runs low (2 GiB available) or the time budget; then each
    runs again and must print its own x (its state intact). Memory per
    idle conversation: what MemAvailable fell by, over their number (every
    process and kernel structure of theirs, the gateway's included)."""
    saved = dict(b.st.conf_extra)
    b.st.conf_extra.update(max_kernels=str(target + 10), max_sessions_per_user=str(target + 10),
                           kernel_pool_size="2", default_ttl="7200", max_ttl="7200")
    b.st.write_config()
    b.st.kill_pidfile("codexec-fcgi")
    b.st.start_fcgi()
    b.settle()
    uid = pwd_uid(b.st.kernel_user)
    before_pss = pss_by_role(uid)
    start_mem, t_end = mem_available_mib(), time.monotonic() + minutes * 60
    live, limit, firsts = [], "the target of this measurement", []
    lock = threading.Lock()

    def create(i):
        t0 = time.monotonic()
        status, body = b.req("POST", "/v1/runs", {"conversation_id": f"idle-{i}", "code": f"x = {i}"})
        return status, body, time.monotonic() - t0

    while len(live) < target:
        if time.monotonic() > t_end:
            limit = f"the time budget ({minutes} min)"
            break
        if mem_available_mib() < 2048:
            limit = "memory (less than 2 GiB available)"
            break
        batch = list(range(len(live), min(target, len(live) + 2)))
        results = {}
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, create(i)))
                   for i in batch]
        [t.start() for t in threads]
        [t.join() for t in threads]
        bad = [(i, r) for i, r in sorted(results.items()) if r[0] != 200]
        with lock:
            live += [i for i in batch if results[i][0] == 200]
            firsts += [results[i][2] for i in batch if results[i][0] == 200]
        if bad:
            limit = f"a new conversation answered {bad[0][1][0]}: {bad[0][1][1][:120]!r}"
            break
    time.sleep(10)  # the last ones idle, the pool refilled
    used = start_mem - mem_available_mib()
    after_pss = pss_by_role(uid)
    intact, warm = 0, []
    for i in live:
        t0 = time.monotonic()
        status, body = b.req("POST", "/v1/runs", {"conversation_id": f"idle-{i}", "code": "print(x)"})
        warm.append(time.monotonic() - t0)
        if status == 200 and json.loads(body).get("stdout_tail", "").strip() == str(i):
            intact += 1
    n = max(len(live), 1)
    row("density", "idle conversations held, each answering a run afterwards, state intact",
        intact, None, "convs",
        f"kernel_preload = numpy, pandas, matplotlib.pyplot; stopped by {limit}; "
        f"goal ≥ 1000; last round: a few hundred")
    row("density", "memory per idle conversation (MemAvailable's fall / conversations)", used / n,
        None, "MiB", "goal ≤ 16; last round ~133 MiB RSS, 58 MiB private a kernel")
    roles = ", ".join(f"{k} {(after_pss.get(k, 0) - before_pss.get(k, 0)) / n:.1f}"
                      for k in sorted(set(after_pss) | set(before_pss)))
    row("density", "PSS per conversation, by process", sum(after_pss.values()) / n - sum(
        before_pss.values()) / n, None, "MiB", roles)
    if firsts and warm:
        row("density", "first run of a new conversation, pool of 2 emptied (median)",
            statistics.median(firsts) * 1000, statistics.median(warm) * 1000, "ms",
            "ratio to the same conversations' next run")
    for i in live:
        b.req("DELETE", f"/v1/conversations/idle-{i}/session")
    b.st.conf_extra.clear()
    b.st.conf_extra.update(saved)
    b.st.write_config()
    b.st.kill_pidfile("codexec-fcgi")
    b.st.start_fcgi()


def pwd_uid(user):
    import pwd
    return pwd.getpwnam(user).pw_uid


def stream_run(b, cid, code):
    """A streaming run: (time to the head, to the first event, to the first
    stdout event, to the end), ms."""
    c = http.client.HTTPConnection("127.0.0.1", b.st.http_port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/runs", body=json.dumps({"conversation_id": cid, "code": code}).encode(),
              headers={"Content-Type": "application/json", "Accept": "text/event-stream",
                       "Authorization": f"Bearer {b.key}"})
    r = c.getresponse()
    head = (time.perf_counter() - t0) * 1000
    first = out = None
    result = False
    while True:
        line = r.readline()
        if not line:
            break
        t = (time.perf_counter() - t0) * 1000
        if line.startswith(b"event: "):
            first = first if first is not None else t
            if line.startswith(b"event: stdout") and out is None:
                out = t
            result = result or line.startswith(b"event: result")
    end = (time.perf_counter() - t0) * 1000
    c.close()
    if r.status != 200 or not result:
        raise RuntimeError(f"stream failed: {r.status}")
    return head, first, out, end


def streaming(b, n_runs):
    """Streaming against the plain answer, taken in turns in one warm
    conversation: the overhead on a trivial run and the time to the first
    byte (target: within 10 % of the non-streaming run)."""
    cid = "stream-bench"
    b.run(cid, "x = 0")
    b.settle()
    plain, stream, head, first = [], [], [], []
    for _ in range(n_runs):
        t0 = time.perf_counter()
        b.run(cid, "x=1")
        plain.append((time.perf_counter() - t0) * 1000)
        h, f, _, e = stream_run(b, cid, "x=1")
        head.append(h)
        first.append(f)
        stream.append(e)
    pm = statistics.median(plain)
    row("stream", "POST /v1/runs x=1, streamed to its result (median)", statistics.median(stream), pm,
        "ms", "ratio to the same run answered whole, taken in turns (≤ 1.10 wanted)")
    row("stream", "  time to the response head (median)", statistics.median(head), pm, "ms",
        "ratio to the whole answer's time")
    row("stream", "  time to the first event (median)", statistics.median(first), pm, "ms",
        "ratio to the whole answer's time")
    outs, plains = [], []
    code = "import time\nprint('a', flush=True)\ntime.sleep(0.3)"
    for _ in range(max(3, n_runs // 5)):
        t0 = time.perf_counter()
        b.run(cid, code)
        plains.append((time.perf_counter() - t0) * 1000)
        outs.append(stream_run(b, cid, code)[2])
    row("stream", "  print, then 0.3 s of work: first stdout event (median)", statistics.median(outs),
        statistics.median(plains), "ms", "ratio to waiting for the whole answer")


def other_stacks():
    """Processes of another bench's or test's stack (one left by a run that
    was killed): their kernels take CPU from every figure."""
    found = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if re.search(r"/tmp/cx-(bench|test)-", cmd):
            found.append(int(d))
    return found


def mcp_overhead(b, n_runs):
    """An MCP tools/call run_code of x=1 (JSON-RPC over POST /mcp on a
    kept-alive connection, as an agent host's SDK client holds one) against
    POST /v1/runs of the same code in the same conversation, taken in
    turns."""
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "Authorization": f"Bearer {b.key}"}
    c = http.client.HTTPConnection("127.0.0.1", b.st.http_port, timeout=600)

    def post(body, sid=None):
        hh = dict(h, **({"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"} if sid else {}))
        c.request("POST", "/mcp", body=json.dumps(body), headers=hh)
        r = c.getresponse()
        data = r.read()
        if r.status not in (200, 202):
            raise RuntimeError(f"mcp bench: {r.status} {data[:200]!r}")
        return r, data

    r, _ = post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                 "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                            "clientInfo": {"name": "bench", "version": "1"}}})
    sid = r.getheader("Mcp-Session-Id")
    post({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    cid = f"mcp-{sid}"
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "run_code", "arguments": {"code": "x=1"}}}
    post(call, sid)
    b.run(cid, "x=1")
    mcp, api = [], []
    for i in range(n_runs):
        t0 = time.perf_counter()
        _, data = post(dict(call, id=i + 2), sid)
        mcp.append((time.perf_counter() - t0) * 1000)
        if json.loads(data)["result"]["isError"]:
            raise RuntimeError(f"mcp bench: {data[:300]!r}")
        t0 = time.perf_counter()
        b.run(cid, "x=1")
        api.append((time.perf_counter() - t0) * 1000)
    c.close()
    row("mcp", "MCP tools/call run_code x=1 (median)", statistics.median(mcp),
        statistics.median(api), "ms", "against POST /v1/runs of x=1, same conversation")


def dropins(b, n_runs):
    """What an operator gives up with DocsGPT's drop-in: its code_executor
    lists and reads the whole workspace before and after every run through
    the backend (DocsGPT's own SandboxManager over CodexecSandbox here),
    where codexec's own API captures in the run itself. A run of x=1 with
    0 and 50 files of 64 KiB in the workspace, the median of each, taken
    in turns."""
    sys.path.insert(0, os.path.join(REPO, "tests", "peers", "docsgpt"))
    sys.path.insert(0, os.path.join(REPO, "integrations", "docsgpt"))
    from application.sandbox.manager import SandboxManager
    from codexec_sandbox import CodexecSandbox
    import hashlib
    m = SandboxManager(CodexecSandbox(f"http://127.0.0.1:{b.st.http_port}", b.key), max_ttl=600)

    def docsgpt_run(sid):
        # DocsGPT's code_executor: signatures before, exec, new or changed files after
        before = {p: hashlib.sha256(m.get_file(sid, p)).hexdigest() for p in m.list_files(sid)}
        r = m.exec(sid, "x = 1")
        after = {p: hashlib.sha256(m.get_file(sid, p)).hexdigest() for p in m.list_files(sid)}
        if r.status != "ok" or len(after) != len(before):
            raise RuntimeError(f"drop-in bench: {r}")

    for files in (0, 50):
        sid = f"dropin-{files}"
        m.open(sid)
        m.exec(sid, f"import os\nfor i in range({files}):\n    open(f'f{{i:03d}}.bin', 'wb').write(os.urandom(65536))")
        cid = f"native-{files}"
        b.run(cid, f"import os\nfor i in range({files}):\n    open(f'f{{i:03d}}.bin', 'wb').write(os.urandom(65536))")
        drop, native = [], []
        for _ in range(max(3, n_runs // 3)):
            t0 = time.perf_counter()
            docsgpt_run(sid)
            drop.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            b.run(cid, "x = 1")
            native.append((time.perf_counter() - t0) * 1000)
        m.close(sid)
        row("dropins", f"DocsGPT manager + CodexecSandbox, {files} files (median)",
            statistics.median(drop), statistics.median(native), "ms",
            "against POST /v1/runs (capture in the run) with the same files")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--smoke", action="store_true", help="each measurement once, briefly")
    ap.add_argument("--doc", default=os.path.join(REPO, "docs", "performance.md"))
    ap.add_argument("--keep", action="store_true", help="keep the stack's directory (logs)")
    ap.add_argument("--idle", type=int, default=1000, help="the density section's conversations")
    ap.add_argument("--cold", type=int, default=8,
                    help="new conversations a cold-start row times (a first run's ratio close "
                         "to 1 wants more than the default)")
    ap.add_argument("--only", action="append",
                    choices=["run", "stream", "cold", "capture", "download", "files", "s3",
                             "concurrency", "capacity", "density", "mcp", "dropins", "languages"],
                    help="run only these sections (the document is then not written)")
    a = ap.parse_args()
    others = other_stacks()
    if others:
        print(f"# warning: {len(others)} processes of another stack are running (e.g. pid "
              f"{others[0]}): the figures compete with them", flush=True)
    read_previous(a.doc)
    if a.smoke:
        a.runs, a.seconds = 3, 1
    var = tempfile.mkdtemp(prefix="cx-bench-")
    static = os.path.join(var, "static")
    s3_port = stack.free_port()
    st = stack.Stack(var, http_port=stack.free_port(), gateway_port=stack.free_port(),
                     build=a.build, workers=80, s3_port=s3_port,
                     conf_extra={"workers": "80", "max_sessions_per_user": "200",
                                 # one key runs all 64 conversations here
                                 "max_concurrent_runs_per_user": "80",
                                 "user_quota_bytes": "50G", "user_quota_artifacts": "100000",
                                 "user_quota_versions": "1000000"},
                     nginx_extra=f"        location /_bench_static/ {{ alias {static}/; }}\n"
                                 f"        location /_bench_s3/ {{ proxy_pass http://127.0.0.1:{s3_port}/; }}")
    try:
        st.up()
        st.start_s3()
        b = Bench(st, os.path.abspath(a.build))
        b.settle()
        want = lambda s: not a.only or s in a.only
        if want("run"):
            run_overhead(b, a.runs)
        if want("stream"):
            streaming(b, a.runs)
        if want("cold"):
            cold_start(b, 3 if a.smoke else a.cold)
            cold_imports(b, 3 if a.smoke else a.cold)
        if want("capture") or want("download"):
            big = capture(b)
        if want("download"):
            downloads(b, big)
        if want("files"):
            files_api(b, a.runs)
        if want("mcp"):
            mcp_overhead(b, a.runs)
        if want("dropins"):
            dropins(b, a.runs)
        if want("languages"):
            languages(b, a.runs, 3 if a.smoke else 8)
        if want("s3"):
            s3(b, 3 if a.smoke else 11)
        if want("concurrency"):
            concurrency(b, a.seconds)
        if want("capacity"):
            capacity(b, 20 if a.smoke else 400, 2 if a.smoke else 20)
        if want("density"):
            density(b, 20 if a.smoke else a.idle, 2 if a.smoke else 30)
        against_last_round()
        machine = describe_machine()
        if not a.smoke and not a.only:
            write_doc(a.doc, machine)
            print(f"# written to {a.doc}")
    finally:
        st.down()
        if a.keep:
            print(f"# stack directory kept: {var}")
        else:
            shutil.rmtree(var, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
