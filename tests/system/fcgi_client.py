"""A minimal FastCGI client (the responder role), enough to talk to
codexec-fcgi without a web server: for tests of its socket handling."""

import socket
import struct

BEGIN_REQUEST, ABORT_REQUEST, END_REQUEST, PARAMS, STDIN, STDOUT, STDERR = 1, 2, 3, 4, 5, 6, 7


def _record(rtype, req_id, content):
    out = b""
    for i in range(0, max(len(content), 1), 65535):
        chunk = content[i:i + 65535]
        pad = (8 - len(chunk) % 8) % 8
        out += struct.pack(">BBHHBx", 1, rtype, req_id, len(chunk), pad) + chunk + b"\0" * pad
        if not content:
            break
    return out


def _nv(name, value):
    def ln(n):
        return struct.pack(">B", n) if n < 128 else struct.pack(">I", n | 0x80000000)
    name, value = name.encode(), value.encode()
    return ln(len(name)) + ln(len(value)) + name + value


# The web server's key (web_server_key): what the stack's nginx sends,
# and so what a request from this client carries unless vouched=False (a
# process that reaches the socket but is not the web server). Set by the
# harness.
WEB_KEY = None


class Request:
    """Opens a connection and sends the head of a request; the body can then
    be sent in pieces with send_body() and finished with finish()."""

    def __init__(self, address, method, uri, params=None, body_length=0, keep_conn=False,
                 vouched=True):
        if isinstance(address, str):
            self.sock = socket.socket(socket.AF_UNIX)
        else:
            self.sock = socket.socket(socket.AF_INET)
        self.sock.settimeout(60)
        self.sock.connect(address)
        p = {"REQUEST_METHOD": method, "REQUEST_URI": uri, "CONTENT_LENGTH": str(body_length),
             "QUERY_STRING": uri.split("?", 1)[1] if "?" in uri else "",
             "CONTENT_TYPE": "application/json", "SERVER_PROTOCOL": "HTTP/1.1"}
        if vouched and WEB_KEY:
            p["CODEXEC_WEB_KEY"] = WEB_KEY
        # params: a dict, or a list of pairs (a name may then repeat)
        pairs = list(params.items()) if isinstance(params, dict) else list(params or [])
        p = [(k, v) for k, v in p.items() if k not in {n for n, _ in pairs}] + pairs
        # flags bit 0: FCGI_KEEP_CONN, what nginx sends with fastcgi_keep_conn on
        self.sock.sendall(_record(BEGIN_REQUEST, 1, struct.pack(">HB5x", 1, 1 if keep_conn else 0)))
        self.sock.sendall(_record(PARAMS, 1, b"".join(_nv(k, v) for k, v in p)))
        self.sock.sendall(_record(PARAMS, 1, b""))

    def send_body(self, data):
        if data:
            self.sock.sendall(_record(STDIN, 1, data))

    def finish(self, close=True):
        self.sock.sendall(_record(STDIN, 1, b""))
        out = b""
        buf = b""
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 8:
                _, rtype, _, clen, pad = struct.unpack(">BBHHBx", buf[:8])
                if len(buf) < 8 + clen + pad:
                    break
                content = buf[8:8 + clen]
                buf = buf[8 + clen + pad:]
                if rtype == STDOUT:
                    out += content
                elif rtype == END_REQUEST:
                    if close:
                        self.sock.close()
                    return parse(out)
        self.sock.close()
        return parse(out) if out else None


def parse(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    headers = {}
    status = 200
    for line in head.decode("latin-1").split("\r\n"):
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
        if k.lower() == "status":
            status = int(v.split()[0])
    return status, headers, body


def request(address, method, uri, body=b"", params=None, vouched=True):
    r = Request(address, method, uri, params, len(body), vouched=vouched)
    r.send_body(body)
    return r.finish()
