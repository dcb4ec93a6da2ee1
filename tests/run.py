#!/usr/bin/python3
"""Runs codexec's whole suite against one build: unit tests (make check, TAP)
and system tests (tests/system/test_*.py) against a stack of real services
started on free ports in a temporary directory.

Prints TAP-style lines and ends with "<flavour>: N passed, N failed".
"""

import argparse
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "packaging"))
sys.path.insert(0, os.path.join(HERE, "system"))
sys.path.insert(0, HERE)

import stack  # noqa: E402


class Results:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.failures = []

    def record(self, ok, name, detail=""):
        n = self.passed + self.failed + 1
        if ok:
            self.passed += 1
            print(f"ok {n} - {name}", flush=True)
        else:
            self.failed += 1
            self.failures.append(name)
            print(f"not ok {n} - {name}", flush=True)
            for line in detail.rstrip().splitlines():
                print(f"#   {line}", flush=True)


def run_unit(res, build, st, flavour):
    env = dict(os.environ,
               CODEXEC_TEST_PG=f"host={st.pg_run} port={st.pg_port} user=codexec dbname=postgres",
               CODEXEC_TEST_GATEWAY_URL=st.gateway_url, CODEXEC_TEST_GATEWAY_TOKEN=st.gateway_token,
               CODEXEC_TEST_GATEWAY_DIRECT_URL=st.gateway_direct_url)
    if flavour == "sanitizers":
        env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0"
        env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    for trs in glob.glob(os.path.join(build, "tests", "**", "*.trs"), recursive=True):
        os.unlink(trs)
    p = subprocess.run(["make", "-C", build, "-j2", "check"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    trs_files = sorted(glob.glob(os.path.join(build, "tests", "**", "*.trs"), recursive=True))
    if not trs_files:
        res.record(False, "unit: make check ran", p.stdout[-4000:])
        return
    for trs in trs_files:
        name = os.path.relpath(trs, build)[:-4]
        with open(trs) as f:
            results = re.findall(r"^:test-result: (\S+)", f.read(), re.M)
        log = trs[:-4] + ".log"
        bad = [r for r in results if r not in ("PASS", "SKIP", "XFAIL")]
        detail = ""
        if bad:
            with open(log, errors="replace") as f:
                detail = "\n".join(l for l in f.read().splitlines()
                                   if l.startswith(("not ok", "#", "Bail", "==", "ERROR"))
                                   or "runtime error" in l)[-4000:]
        # One line per program, counting each of its test points.
        res.passed += sum(1 for r in results if r in ("PASS", "XFAIL"))
        if bad:
            res.record(False, f"unit: {name} ({len(bad)} of {len(results)} failed)", detail)
        else:
            print(f"# unit: {name}: {len(results)} passed", flush=True)


def load_modules(only):
    mods = []
    for path in sorted(glob.glob(os.path.join(HERE, "system", "test_*.py"))):
        name = os.path.basename(path)[:-3]
        if only and not any(o in name for o in only):
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mods.append(mod)
    return mods


def delete_kernels(st):
    """Every kernel on the stack's gateway (nothing of codexec's runs)."""
    import urllib.error
    import urllib.request
    auth = {"Authorization": f"token {st.gateway_token}"}
    with urllib.request.urlopen(urllib.request.Request(st.gateway_url + "/api/kernels", headers=auth),
                                timeout=60) as r:
        kernels = json.loads(r.read())
    for k in kernels:
        req = urllib.request.Request(f"{st.gateway_url}/api/kernels/{k['id']}", method="DELETE",
                                     headers=auth)
        try:
            urllib.request.urlopen(req, timeout=60).close()
        except urllib.error.HTTPError:
            pass  # gone meanwhile


# Run again with storage = s3 (test_s3 runs only then).
S3_MODULES = ["test_artifacts", "test_downloads", "test_s3"]


def run_system(res, st, ctx, only, pattern, label=""):
    for mod in load_modules(only):
        if mod.__name__ == "test_s3" and not label:
            continue
        tests = [(n, getattr(mod, n)) for n in dir(mod) if n.startswith("test_")
                 and callable(getattr(mod, n)) and getattr(mod, n).__module__ == mod.__name__]
        tests.sort(key=lambda t: t[1].__code__.co_firstlineno)
        for name, fn in tests:
            if pattern and pattern not in name:
                continue
            full = f"{label}{mod.__name__}.{name}"
            t0 = time.monotonic()
            marks = log_marks(st.logdir)
            try:
                fn(ctx)
                res.record(True, f"{full} ({time.monotonic() - t0:.1f}s)")
            except Exception as e:  # a failed assertion or a broken service
                detail = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]
                res.record(False, full, detail + logs_since(st.logdir, marks))


# What codexec's processes and the gateway logged during a failed test (they
# log no user content): CI's output is all a failure leaves behind.
LOGS_ON_FAILURE = ("codexec.log", "jupyter.log")


def log_marks(logdir):
    marks = {}
    for name in LOGS_ON_FAILURE:
        try:
            marks[name] = os.path.getsize(os.path.join(logdir, name))
        except OSError:
            marks[name] = 0
    return marks


def logs_since(logdir, marks, lines=40):
    out = []
    for name, at in marks.items():
        try:
            with open(os.path.join(logdir, name), "rb") as f:
                f.seek(at)
                text = f.read(4 << 20).decode(errors="replace").splitlines()
        except OSError:
            continue
        if text:
            out.append(f"\n--- {name}, its last {min(lines, len(text))} of {len(text)} lines"
                       " during the test:\n" + "\n".join(t[:300] for t in text[-lines:]))
    return "".join(out)


def run_faultinject(res, build, st, budget):
    """The unit tests again, each allocation failing in turn (tests/faultinject.py)."""
    import faultinject
    env = dict(os.environ,
               CODEXEC_TEST_PG=f"host={st.pg_run} port={st.pg_port} user=codexec dbname=postgres",
               CODEXEC_TEST_GATEWAY_URL=st.gateway_url, CODEXEC_TEST_GATEWAY_TOKEN=st.gateway_token,
               CODEXEC_TEST_GATEWAY_DIRECT_URL=st.gateway_direct_url,
               ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    for prog in faultinject.programs(build):
        t0 = time.monotonic()
        tried, count, problems = faultinject.inject(prog, env, budget)
        name = f"faultinject: {os.path.relpath(prog, build)}: {tried} of {count} allocations failed in turn"
        res.record(not problems, f"{name} ({time.monotonic() - t0:.0f}s)", "\n".join(problems)[-4000:])


def sanitizer_reports(logdir):
    found = []
    for path in glob.glob(os.path.join(logdir, "codexec*")):
        with open(path, errors="replace") as f:
            text = f.read()
        for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
            if marker in text:
                i = text.index(marker)
                found.append(f"{os.path.basename(path)}: {text[max(0, i - 200):i + 1500]}")
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--flavour", default="werror")
    ap.add_argument("--only", action="append", help="system test modules to run (substring)")
    ap.add_argument("-k", dest="pattern", help="system test names containing this")
    ap.add_argument("--no-unit", action="store_true")
    ap.add_argument("--faultinject-budget", type=float, default=15,
                    help="seconds of fault injection per unit test (sanitizers flavour)")
    ap.add_argument("--keep", action="store_true", help="keep the stack's directory")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    res = Results()
    # on the disk, not in /tmp: a tmpfs on some hosts (2.4 GiB in
    # verify-fresh's container), which the suite's stores and logs outgrow
    var = tempfile.mkdtemp(prefix="cx-test-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    conf_extra = {
        "max_body_bytes": "2M",
        "max_code_bytes": "1M",
        "max_run_body_bytes": "1536K",
        "workers": "24",
        "log_level": os.environ.get("CODEXEC_TEST_LOG_LEVEL", "info"),
        "busy_wait": "3",
        "max_sessions_per_user": "4",
        "reaper_interval": "1",
        "interrupt_grace": "2",
        "max_output_bytes": "1M",
        # test_files writes and reads a 500 MiB file (the workspace is 512M)
        "max_artifact_bytes": "600M",
        "user_quota_artifacts": "100",
        "kernel_pool_size": "0",  # test_pool turns it on
        # The suite's sessions live default_ttl (10 minutes) and outnumber
        # the default budget of 128 by the time the pool and run tests come
        # (the soak alone makes 64; test_hostile adds 20 rows whose kernels
        # can't be deleted): a budget the suite does not meet, so that no
        # test depends on which ran before it. The budget's own tests run
        # processes of their own with small ones (test_capacity).
        "max_kernels": "1024",
        # the RAGFlow calls' limit: a cold kernel importing matplotlib fits
        # in it on a loaded machine; the timeout test waits it out
        "ragflow_timeout": "15",
    }
    st = stack.Stack(var, http_port=stack.free_port(), gateway_port=stack.free_port(),
                     gateway_proxy_port=stack.free_port(),  # the suite runs through it
                     s3_port=stack.free_port(),  # the test object store: the S3 pass
                     build=build, fast_pg=True, conf_extra=conf_extra,
                     ragflow_port=stack.free_port(),  # codexec-ragflow.conf's listener
                     nginx_body="8m", test_kernel=True,
                     # smaller than the defaults, so the limits are reached quickly
                     sandbox_extra={"memory": "1G", "max_workspace_bytes": "512M",
                                    "tmp_bytes": "128M", "shm_bytes": "32M", "pids": "128"})
    if a.flavour == "sanitizers":
        os.environ["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:log_path=" + os.path.join(
            var, "log", "codexec-asan")
        os.environ["UBSAN_OPTIONS"] = "print_stacktrace=1:log_path=" + os.path.join(
            var, "log", "codexec-ubsan")
    print(f"# {a.flavour}: stack in {var}", flush=True)
    try:
        st.init()
        st.start_pg()
        st.start_jupyter()
        st.start_gateway_proxy()
        st.start_s3()
        if not a.no_unit:
            run_unit(res, build, st, a.flavour)
            if a.flavour == "sanitizers":
                run_faultinject(res, build, st, a.faultinject_budget)
        st.start_fcgi()
        st.start_nginx()
        import harness
        import openapi_check
        ctx = harness.Context(st, build, a.flavour)
        run_system(res, st, ctx, a.only, a.pattern)
        # The artifact and download suites once more, codexec storing in the
        # test object store (storage = s3), and the store's own tests.
        s3_only = [m for m in S3_MODULES if not a.only or any(o in m for o in a.only)]
        if s3_only:
            # A clean slate: the suites use the same users and conversations
            # again (their sessions and artifacts from the first pass would
            # change what a run captures); the old kernels are orphans the
            # reaper deletes.
            st.kill_pidfile("codexec-fcgi")
            ctx.psql("DELETE FROM artifacts; DELETE FROM sessions; DELETE FROM prestarted_kernels")
            # ... and their kernels now, not after kernel_orphan_grace: each
            # sandboxed kernel's launcher holds an inotify instance, and the
            # kernel user has fs.inotify.max_user_instances of them (128)
            delete_kernels(st)
            st.use_s3()
            ctx.backend = "s3"
            run_system(res, st, ctx, s3_only, a.pattern, label="s3: ")
        spec = openapi_check.SPEC
        # a selection of tests may send nothing through nginx; the whole
        # suite must have answers to check
        selected = bool(a.only or a.pattern)
        res.record(not spec.problems and (spec.checked > 0 or selected),
                   f"the {spec.checked} answers checked match docs/openapi.yaml",
                   "\n".join(sorted(set(spec.problems)))[-4000:])
    except Exception as e:
        res.record(False, "the test stack starts", "".join(
            traceback.format_exception(type(e), e, e.__traceback__))[-3000:])
    finally:
        try:
            st.down()
        except Exception as e:
            res.record(False, "the test stack stops", repr(e))
        left = st.leftovers()
        res.record(not left, "no process of the stack is left behind", repr(left))
        if a.flavour == "sanitizers":
            reports = sanitizer_reports(st.logdir)
            res.record(not reports, "no sanitizer reports from codexec-fcgi", "\n".join(reports))
        if res.failed:
            for f in sorted(glob.glob(os.path.join(st.logdir, "*.log"))):
                with open(f, errors="replace") as fh:
                    tail = fh.read()[-1500:]
                print(f"# --- tail of {os.path.basename(f)} ---")
                for line in tail.splitlines():
                    print(f"# {line}")
        if not a.keep and not res.failed:
            shutil.rmtree(var, ignore_errors=True)
        elif res.failed:
            print(f"# stack directory kept: {var}")
    print(f"{a.flavour}: {res.passed} passed, {res.failed} failed", flush=True)
    return 0 if res.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
