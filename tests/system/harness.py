"""Helpers for the system tests: HTTP through nginx, keys, assertions."""

import http.client
import json
import os
import re
import subprocess
import time
import uuid

import openapi_check
import stack


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<{self.status} {self.body[:300]!r}>"


class Context:
    def __init__(self, st, build, flavour):
        import fcgi_client
        fcgi_client.WEB_KEY = st.web_key()  # what the stack's nginx sends
        self.st = st
        self.build = build
        self.flavour = flavour
        self._keys = {}
        self.backend = "local"  # or "s3": codexec stores in the stack's test object store
        self._s3 = None

    # --- the artifact storage, whichever backend codexec uses ---------------
    def s3(self):
        """A botocore S3 client on the test store (the reference client)."""
        if self._s3 is None:
            import botocore.config
            import botocore.session
            with open(self.st.s3_keys) as f:
                key_id, secret = f.read().split()
            self._s3 = botocore.session.get_session().create_client(
                "s3", endpoint_url=f"http://127.0.0.1:{self.st.s3_port}", region_name=stack.S3_REGION,
                aws_access_key_id=key_id, aws_secret_access_key=secret,
                config=botocore.config.Config(s3={"addressing_style": "path"},
                                              retries={"max_attempts": 1}))
        return self._s3

    def stored(self, key):
        """The bytes stored under key, or None."""
        if self.backend == "s3":
            try:
                r = self.s3().get_object(Bucket=stack.S3_BUCKET, Key=stack.S3_PREFIX + key)
            except self.s3().exceptions.NoSuchKey:
                return None
            return r["Body"].read()
        try:
            with open(os.path.join(self.st.storage, key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def store_keys(self, under):
        """Every stored key that starts with under (relative to the root or
        the prefix), sorted."""
        if self.backend == "s3":
            keys = []
            pages = self.s3().get_paginator("list_objects_v2").paginate(
                Bucket=stack.S3_BUCKET, Prefix=stack.S3_PREFIX + under)
            for page in pages:
                keys += [o["Key"][len(stack.S3_PREFIX):] for o in page.get("Contents", [])]
            return sorted(keys)
        found = []
        for dp, _, fs in os.walk(self.st.storage):
            for f in fs:
                k = os.path.relpath(os.path.join(dp, f), self.st.storage)
                if k.startswith(under):
                    found.append(k)
        return sorted(found)

    def store_remove(self, key):
        if self.backend == "s3":
            self.s3().delete_object(Bucket=stack.S3_BUCKET, Key=stack.S3_PREFIX + key)
        else:
            os.unlink(os.path.join(self.st.storage, key))

    def store_put(self, key, data):
        """Bytes under key, behind codexec's back (as root, for local)."""
        if self.backend == "s3":
            self.s3().put_object(Bucket=stack.S3_BUCKET, Key=stack.S3_PREFIX + key, Body=data)
            return
        path = os.path.join(self.st.storage, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        for d in [path] + [os.path.join(self.st.storage, *key.split("/")[:i])
                           for i in range(1, key.count("/") + 1)]:
            self.st.chown(d)

    # --- HTTP ---------------------------------------------------------------
    def request(self, method, path, body=None, headers=None, key=None, timeout=120, port=None):
        h = dict(headers or {})
        if key:
            h["Authorization"] = f"Bearer {key}"
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        elif isinstance(body, str):
            body = body.encode()
        port = port or getattr(self, "port_override", None) or self.st.http_port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            resp = Response(r.status, r.getheaders(), r.read())
        finally:
            conn.close()
        if resp.header("X-Request-Id"):  # codexec's answer, not nginx's own
            openapi_check.SPEC.check(method, path, resp.status,
                                     {k.lower(): v for k, v in resp.headers}, resp.body)
        return resp

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body=body, **kw)

    # --- keys and the database ----------------------------------------------
    def key(self, user, approval=False):
        if (user, approval) not in self._keys:
            self._keys[(user, approval)] = self.st.create_key(user, approval=approval)
        return self._keys[(user, approval)]

    def admin(self, *args, check=True):
        return self.st.run([self.st.admin, "--config", self.st.conf, *args], check=check)

    def psql(self, sql):
        r = self.st.run(["/usr/lib/postgresql/15/bin/psql", "-h", self.st.pg_run, "-p",
                         str(self.st.pg_port), "-U", "codexec", "-d", "codexec", "-v",
                         "ON_ERROR_STOP=1", "-tAc", sql])
        return r.stdout.strip()

    def spawn_fcgi(self, name, settings=None, workers=2, wrap=()):
        """Another codexec-fcgi with this stack's configuration, but listening
        on its own socket and with `settings` (key -> value) changed; its
        stderr goes to log/codexec-<name>.log. Returns (socket path, process);
        the caller stops it. wrap: a command prefix (prlimit, say)."""
        st = self.st
        sock = os.path.join(st.rundir, f"{name}.sock")
        conf = os.path.join(st.var, f"{name}.conf")
        # (a few workers would allow one user a run at a time: the tests of
        # that limit set it themselves)
        settings = dict({"max_concurrent_runs_per_user": "64"}, **(settings or {}),
                        listen=f"unix:{sock}")
        with open(st.conf) as f, open(conf, "w") as out:
            out.writelines(l for l in f if l.split("=")[0].strip() not in settings)
            out.writelines(f"{k} = {v}\n" for k, v in settings.items())
        os.chmod(conf, 0o640)  # it holds the gateway's token, as codexec.conf does
        st.chown(conf)
        proc = subprocess.Popen(list(wrap) + st.as_user() + [os.path.join(st.bin, "codexec-fcgi"), "--config",
                                                conf, "--workers", str(workers)],
                                stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(st.logdir, f"codexec-{name}.log"), "ab"))
        wait_until(lambda: os.path.exists(sock), 20, f"the socket of codexec-fcgi {name}")
        return sock, proc

    def spawn_gateway(self, name):
        """A second Jupyter server like the stack's (same kernelspecs, token
        and users) on a free port. Returns (URL, process); the caller stops
        it (proc.terminate())."""
        st = self.st
        port = stack.free_port()
        proc = st.spawn_jupyter(name, port)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: st.gateway_ok(url) or proc.poll() is not None, 90, f"Jupyter server {name}")
        if proc.poll() is not None:
            raise AssertionError(f"Jupyter server {name} exited; see log/{name}.log")
        return url, proc

    def test_kernelspec(self, settings):
        """The stack's second kernelspec (stack.TEST_KERNEL_NAME) with its own
        sandbox.conf: the stack's settings with `settings` changed. Returns
        the kernelspec's name; the next kernel started with it uses them."""
        st = self.st
        conf = os.path.join(st.var, "sandbox-test.conf")
        with open(st.sandbox_conf) as f:
            lines = [l for l in f if l.split("=")[0].strip() not in settings]
        with open(conf, "w") as f:
            f.writelines(lines)
            f.writelines(f"{k} = {v}\n" for k, v in settings.items())
        os.chmod(conf, 0o644)
        with open(os.path.join(st.kernelspecs_dir, "kernels", stack.KERNEL_NAME, "kernel.json")) as f:
            spec = json.load(f)
        spec["argv"][spec["argv"].index("--config") + 1] = conf
        d = os.path.join(st.kernelspecs_dir, "kernels", stack.TEST_KERNEL_NAME)
        os.makedirs(d, exist_ok=True)
        os.chmod(d, 0o755)
        with open(os.path.join(d, "kernel.json"), "w") as f:
            json.dump(spec, f)
        os.chmod(os.path.join(d, "kernel.json"), 0o644)
        return stack.TEST_KERNEL_NAME

    def log_text(self):
        out = []
        for name in sorted(os.listdir(self.st.logdir)):
            if name.startswith("codexec"):
                with open(os.path.join(self.st.logdir, name), errors="replace") as f:
                    out.append(f.read())
        return "\n".join(out)


def eq(got, want, what=""):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_error(r, status, code=None):
    eq(r.status, status, f"status of {r!r}")
    body = r.json()
    check(isinstance(body.get("error"), dict), f"error object in {r!r}")
    check(isinstance(body["error"].get("message"), str) and body["error"]["message"],
          f"error.message in {r!r}")
    if code:
        eq(body["error"].get("code"), code, "error.code")
    return body


def new_id():
    return str(uuid.uuid4())


def metric(ctx, name):
    """A codexec_<name>_total counter of the stack's codexec-fcgi."""
    text = ctx.get("/metrics").body.decode()
    return int(re.search(rf"^codexec_{name}_total (\d+)$", text, re.M).group(1))


def wait_until(fn, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
