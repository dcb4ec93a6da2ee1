#!/usr/bin/python3
"""The signature check in front of the test object store.

    sigcheck.py LISTEN_PORT UPSTREAM_PORT REGION KEYFILE   (KEYFILE holds "ID SECRET")

s3rver (tests/s3/server.js) does not check SigV4 signatures, so every
request reaches it through this proxy, which checks them the way S3 does,
with botocore (Debian's python3-botocore) as the reference signer:

- an Authorization header (AWS4-HMAC-SHA256): botocore's S3SigV4Auth
  computes the signature over the signed headers, and the payload hash the
  client declared in x-amz-content-sha256 must be the body's sha256;
- a presigned URL (X-Amz-Algorithm in the query): botocore's
  S3SigV4QueryAuth over the query without X-Amz-Signature, and the URL must
  not have expired;
- anything else is anonymous and refused (a private bucket).

The path is canonicalised as S3 does (decoded, then each byte but the
unreserved ones and '/' percent-encoded), so a proxy in between that escapes
differently (nginx) does not change what is signed. Refusals answer S3's
XML errors (403 SignatureDoesNotMatch, AccessDenied; 400
XAmzContentSHA256Mismatch) and are counted in the log, one line each, which
the tests read.
"""

import datetime
import hashlib
import hmac
import http.client
import http.server
import socketserver
import sys
import urllib.parse

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

BODY_MAX = 64 << 20  # a part or a single PUT: codexec sends at most s3_part_size


def canonical_path(raw):
    return urllib.parse.quote(urllib.parse.unquote_to_bytes(raw), safe="/~")


def canonical_query(pairs):
    """S3's canonical query: each name and value decoded, then encoded
    (all but the unreserved characters), sorted."""
    enc = []
    for p in pairs:
        k, _, v = p.partition("=")
        enc.append((urllib.parse.quote(urllib.parse.unquote_to_bytes(k), safe="-_.~"),
                    urllib.parse.quote(urllib.parse.unquote_to_bytes(v), safe="-_.~")))
    return "&".join(f"{k}={v}" for k, v in sorted(enc))


def amz_time(stamp):
    return datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(
        tzinfo=datetime.timezone.utc)


class Check:
    def __init__(self, key_id, secret, region):
        self.key_id, self.region = key_id, region
        self.creds = Credentials(key_id, secret)

    def header_auth(self, method, host, path, query, headers, body):
        auth = headers.get("authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            return "AccessDenied", "only AWS4-HMAC-SHA256 is accepted"
        fields = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 "):].split(","))
        cred = fields.get("Credential", "").split("/")
        if len(cred) != 5 or cred[0] != self.key_id or cred[2] != self.region or cred[3] != "s3":
            return "InvalidAccessKeyId", "unknown key or scope"
        stamp = headers.get("x-amz-date", "")
        try:
            when = amz_time(stamp)
        except ValueError:
            return "AccessDenied", "no x-amz-date"
        if abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()) > 900:
            return "RequestTimeTooSkewed", "x-amz-date is off by more than 15 minutes"
        if cred[1] != stamp[:8]:
            return "SignatureDoesNotMatch", "the scope's date is not x-amz-date's"
        declared = headers.get("x-amz-content-sha256")
        if declared is None:
            return "InvalidRequest", "x-amz-content-sha256 is required"
        if declared != "UNSIGNED-PAYLOAD" and declared != hashlib.sha256(body).hexdigest():
            return "XAmzContentSHA256Mismatch", "the body is not what was signed"
        signed = fields.get("SignedHeaders", "").split(";")
        if not {"host", "x-amz-date", "x-amz-content-sha256"} <= set(signed):
            return "SignatureDoesNotMatch", "host, x-amz-date and x-amz-content-sha256 must be signed"
        unsigned = [h for h in headers if h.startswith("x-amz-") and h not in signed]
        if unsigned:
            return "AccessDenied", f"x-amz-* headers must be signed: {unsigned}"
        hdrs = {}
        for name in signed:
            if name not in headers:
                return "SignatureDoesNotMatch", f"signed header {name} is missing"
            hdrs[name] = headers[name]
        cq = canonical_query([p for p in query.split("&") if p])
        url = f"http://{host}{canonical_path(path)}" + (f"?{cq}" if cq else "")
        req = AWSRequest(method=method, url=url, headers=hdrs)
        req.context["timestamp"] = stamp
        signer = S3SigV4Auth(self.creds, "s3", self.region)
        sts = signer.string_to_sign(req, signer.canonical_request(req))
        want = signer.signature(sts, req)
        if not hmac.compare_digest(want, fields.get("Signature", "")):
            return "SignatureDoesNotMatch", "the signature is not botocore's"
        return None

    def query_auth(self, method, host, path, query, headers):
        pairs = [p for p in query.split("&") if p]
        got = [p.split("=", 1)[1] for p in pairs if p.startswith("X-Amz-Signature=")]
        rest = [p for p in pairs if not p.startswith("X-Amz-Signature=")]
        q = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        cred = q.get("X-Amz-Credential", "").split("/")
        if len(cred) != 5 or cred[0] != self.key_id or cred[2] != self.region or cred[3] != "s3" \
                or cred[4] != "aws4_request" or cred[1] != q.get("X-Amz-Date", "")[:8]:
            return "InvalidAccessKeyId", "unknown key or scope"
        if q.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256":
            return "AccessDenied", "only AWS4-HMAC-SHA256 is accepted"
        if q.get("X-Amz-SignedHeaders") != "host" or len(got) != 1:
            return "AccessDenied", "only host may be signed, one signature"
        try:
            when = amz_time(q.get("X-Amz-Date", ""))
            expires = int(q.get("X-Amz-Expires", ""))
        except ValueError:
            return "AccessDenied", "bad X-Amz-Date or X-Amz-Expires"
        if not 1 <= expires <= 604800:
            return "AccessDenied", "X-Amz-Expires out of range"
        now = datetime.datetime.now(datetime.timezone.utc)
        if now > when + datetime.timedelta(seconds=expires):
            return "AccessDenied", "Request has expired"
        if when > now + datetime.timedelta(minutes=15):
            return "AccessDenied", "X-Amz-Date is in the future"
        url = f"http://{host}{canonical_path(path)}?" + canonical_query(rest)
        req = AWSRequest(method=method, url=url, headers={"host": host})
        req.context["timestamp"] = q["X-Amz-Date"]
        signer = S3SigV4QueryAuth(self.creds, "s3", self.region, expires=expires)
        sts = signer.string_to_sign(req, signer.canonical_request(req))
        want = signer.signature(sts, req)
        if not hmac.compare_digest(want, got[0]):
            return "SignatureDoesNotMatch", "the presigned URL's signature is not botocore's"
        return None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    check = None
    upstream = None

    def log_message(self, fmt, *args):
        pass

    def refuse(self, status, code, why):
        sys.stderr.write(f"sigcheck: refused {self.command} {code}: {why}\n")
        sys.stderr.flush()
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{why}</Message></Error>").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        path, _, query = self.path.partition("?")
        headers = {}  # repeated headers joined, as S3 reads them
        for k, v in self.headers.items():
            k = k.lower()
            headers[k] = f"{headers[k]},{v}" if k in headers else v
        n = int(headers.get("content-length", "0") or "0")
        if n > BODY_MAX or "transfer-encoding" in headers:
            self.refuse(400, "InvalidRequest", "bodies are sent whole, at most 64 MiB")
            self.close_connection = True
            return
        body = self.rfile.read(n) if n else b""
        host = headers.get("host", "")
        if "authorization" in headers and "X-Amz-Algorithm=" in query:
            bad = ("InvalidArgument", "one auth mechanism only")
        elif "authorization" in headers:
            bad = self.check.header_auth(self.command, host, path, query, headers, body)
        elif "X-Amz-Algorithm=" in query:
            bad = self.check.query_auth(self.command, host, path, query, headers)
        else:
            bad = ("AccessDenied", "anonymous access is refused")
        if bad:
            status = 400 if bad[0] in ("XAmzContentSHA256Mismatch", "InvalidRequest",
                                       "InvalidArgument") else 403
            self.refuse(status, *bad)
            return
        self.forward(body)

    def forward(self, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=300)
        # s3rver answers the path-style URL whatever Host says
        hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
        try:
            conn.request(self.command, self.path, body=body if body else None, headers=hdrs)
            r = conn.getresponse()
            self.send_response(r.status)
            length = r.getheader("Content-Length")
            for k, v in r.getheaders():
                if k.lower() not in ("connection", "transfer-encoding", "keep-alive"):
                    self.send_header(k, v)
            if length is None and self.command != "HEAD" and r.status not in (204, 304):
                data = r.read()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.end_headers()
            if self.command == "HEAD":
                return
            while True:
                chunk = r.read(1 << 16)
                if not chunk:
                    break
                self.wfile.write(chunk)
        finally:
            conn.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_any


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def main():
    port, upstream, region = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    with open(sys.argv[4]) as f:
        key_id, secret = f.read().split()
    Handler.check = Check(key_id, secret, region)
    Handler.upstream = upstream
    srv = Server(("127.0.0.1", port), Handler)
    sys.stderr.write(f"sigcheck on 127.0.0.1:{port} in front of 127.0.0.1:{upstream}\n")
    sys.stderr.flush()
    srv.serve_forever()


if __name__ == "__main__":
    main()
