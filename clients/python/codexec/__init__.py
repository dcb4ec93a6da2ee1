"""codexec's Python client (the standard library only, Python >= 3.9).

    import codexec
    cx = codexec.Client("http://127.0.0.1:8080", "cx_...")
    answer = cx.run("print(6 * 7)", "demo")
    for event, data in cx.stream("import time\\nfor i in range(3): print(i); time.sleep(1)", "demo"):
        print(event, data)
    cx.files.write("demo", "data/in.csv", b"a,b\\n1,2\\n")
    cx.artifacts.download(answer["artifacts"][0]["artifact_id"], to="out.png")

Every failure raises codexec.Error with .code (codexec's error code, as
"conversation_busy"), .status (HTTP), .message and .retry_after (seconds,
or None). Refusals that say when to come back (429 and 503 with
Retry-After: too_many_runs, capacity_exhausted, a busy server) are retried
up to `retries` times before they are raised.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.parse
from typing import IO, Any, Dict, Iterator, List, Optional, Tuple, Union

__all__ = ["Client", "Error"]
__version__ = "0.1.0"

Json = Dict[str, Any]
Data = Union[bytes, str, IO[bytes]]

# Retry-After waits longer than this are not waited for: the error is raised.
_MAX_RETRY_WAIT = 30.0


class Error(Exception):
    """A request codexec (or the way to it) refused or failed."""

    def __init__(self, message: str, code: str = "", status: int = 0,
                 retry_after: Optional[float] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"codexec.Error({self.message!r}, code={self.code!r}, status={self.status})"


def _retry_after(value: Optional[str]) -> Optional[float]:
    try:
        v = float(value) if value is not None else None
    except ValueError:
        return None
    return v if v is not None and 0 <= v < float("inf") else None


# Refusals that mean nothing was done: a request may be sent again after
# them whatever it is. Any other 429 or 503 (a database that failed, say)
# may come after a part of the work; only requests that can be repeated
# are sent again after those.
_NOTHING_DONE = ("too_many_runs", "capacity_exhausted", "quota_exceeded")


def _error_of(status: int, headers: http.client.HTTPMessage, body: bytes) -> Error:
    code, message = "", f"HTTP {status}"
    try:
        e = json.loads(body)["error"]
        code, message = str(e.get("code", "")), str(e.get("message", message))
    except (ValueError, KeyError, TypeError, AttributeError):
        if body:
            message = body[:200].decode("utf-8", "replace")
    return Error(message, code, status, _retry_after(headers.get("Retry-After")))


def _quote(path: str) -> str:
    return urllib.parse.quote(path, safe="/")


def _close(resp: http.client.HTTPResponse) -> None:
    resp.close()
    conn = getattr(resp, "_codexec_conn", None)
    if conn is not None:
        conn.close()


class _Sse:
    """Server-Sent Events from a response, as (event, data, id)."""

    def __init__(self, resp: http.client.HTTPResponse) -> None:
        self.resp = resp

    def __iter__(self) -> Iterator[Tuple[str, Any, Optional[str]]]:
        event, data, eid = "message", [], None
        while True:
            line = self.resp.readline()
            if not line:
                return
            line = line.decode("utf-8").rstrip("\r\n")
            if not line:
                if data:
                    text = "\n".join(data)
                    try:
                        value = json.loads(text)
                    except ValueError:
                        value = text
                    yield event, value, eid
                event, data = "message", []
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
            elif field == "id":
                eid = value


class Client:
    """A client of one codexec server, with one API key.

    on_behalf_of: the end user a service key (made with --on-behalf) acts
    for; everything then belongs to that user (sessions, files, artifacts,
    quotas)."""

    def __init__(self, url: str, api_key: str, on_behalf_of: Optional[str] = None,
                 timeout: float = 330.0, retries: int = 3) -> None:
        u = urllib.parse.urlsplit(url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("url must be http(s)://host[:port][/prefix]")
        self.url = url.rstrip("/")
        self._scheme, self._host, self._port, self._prefix = u.scheme, u.hostname, u.port, u.path
        self.api_key = api_key
        self.on_behalf_of = on_behalf_of
        self.timeout = timeout
        self.retries = retries
        self.files = Files(self)
        self.artifacts = Artifacts(self)
        self.sessions = Sessions(self)

    # --- transport -----------------------------------------------------------
    def _connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout if timeout is not None else self.timeout)

    def _open(self, method: str, path: str, body: Optional[Data] = None,
              headers: Optional[Dict[str, str]] = None, query: Optional[Dict[str, Any]] = None,
              timeout: Optional[float] = None) -> http.client.HTTPResponse:
        """Sends a request; the response, its status 2xx or 304 (the caller
        reads it). Refusals with Retry-After are retried."""
        h = {"Authorization": f"Bearer {self.api_key}", "User-Agent": f"codexec-python/{__version__}"}
        if self.on_behalf_of:
            h["On-Behalf-Of"] = self.on_behalf_of
        h.update(headers or {})
        q = {k: ("true" if v is True else "false" if v is False else v)
             for k, v in (query or {}).items() if v is not None}
        target = self._prefix + path + ("?" + urllib.parse.urlencode(q) if q else "")
        try:
            start = body.tell() if hasattr(body, "seek") and hasattr(body, "tell") else None
        except (OSError, ValueError):
            start = None  # a pipe: sent once
        repeatable = method in ("GET", "HEAD", "PUT", "DELETE") or "Idempotency-Key" in h
        for attempt in range(self.retries + 1):
            conn = self._connection(timeout)
            try:
                if isinstance(body, str):
                    body = body.encode()
                conn.request(method, target, body=body, headers=h)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise Error(f"{method} {path}: {e}", "connection_failed") from e
            if 200 <= resp.status < 300 or resp.status == 304:
                resp._codexec_conn = conn  # type: ignore[attr-defined]  (closed with it)
                return resp
            err = _error_of(resp.status, resp.headers, resp.read())
            conn.close()
            retryable = (resp.status in (429, 503) and err.retry_after is not None
                         and (repeatable or err.code in _NOTHING_DONE))
            rewindable = body is None or isinstance(body, bytes) or start is not None
            if (not retryable or not rewindable or attempt == self.retries
                    or err.retry_after > _MAX_RETRY_WAIT):
                raise err
            time.sleep(err.retry_after)
            if start is not None:
                body.seek(start)  # type: ignore[union-attr]
        raise AssertionError("unreachable")

    def _call(self, method: str, path: str, json_body: Optional[Json] = None, **kw: Any) -> Any:
        headers = kw.pop("headers", {}) or {}
        body = None
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        resp = self._open(method, path, body, headers, **kw)
        try:
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise Error(f"{method} {path}: {e}", "connection_failed") from e
        finally:
            _close(resp)
        return json.loads(data) if data else None

    # --- runs ----------------------------------------------------------------
    def run(self, code: str, conversation_id: str, idempotency_key: Optional[str] = None,
            **fields: Any) -> Json:
        """Runs code in the conversation and answers the run (its output,
        error, artifacts, result). With wait=False it answers at once
        {"run_id", "status": "running"}: follow it with wait()."""
        body = dict(fields, conversation_id=conversation_id, code=code)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/v1/runs", body, headers=headers)

    def stream(self, code: str, conversation_id: str, **fields: Any) -> Iterator[Tuple[str, Any]]:
        """Runs code and yields its events as they happen: ("run", {run_id}),
        ("status", ...), ("stdout", {"text"}), ("stderr", ...),
        ("display", ...), and last ("result", the run's answer)."""
        body = json.dumps(dict(fields, conversation_id=conversation_id, code=code)).encode()
        resp = self._open("POST", "/v1/runs", body, {"Content-Type": "application/json",
                                                     "Accept": "text/event-stream"})
        yield from self._events_of(resp)

    def _events_of(self, resp: http.client.HTTPResponse) -> Iterator[Tuple[str, Any]]:
        try:
            if not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                yield "result", json.loads(resp.read())  # answered whole (before it began)
                return
            last = None
            for event, data, eid in _Sse(resp):
                last = eid or last
                if event == "result" and isinstance(data, dict) and "error" in data \
                        and "run_id" not in data:
                    e = data["error"]
                    raise Error(e.get("message", ""), e.get("code", ""), 0)
                yield event, data
                if event == "result":
                    return
            # cut before its result: events(run_id, last_event_id) resumes
            raise Error(f"the stream ended before its result (last event id {last})",
                        "stream_ended", 0)
        except (OSError, http.client.HTTPException) as e:
            raise Error(f"the stream failed: {e}", "stream_ended", 0) from e
        finally:
            _close(resp)

    def get_run(self, run_id: str) -> Json:
        """The run's record; once it ended, with its answer."""
        return self._call("GET", f"/v1/runs/{_quote(run_id)}")

    def events(self, run_id: str, last_event_id: Optional[int] = None) -> Iterator[Tuple[str, Any]]:
        """A detached or streamed run's events from its start (or after
        last_event_id), live while it runs, ending with ("result", record)."""
        h = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            h["Last-Event-ID"] = str(last_event_id)
        yield from self._events_of(self._open("GET", f"/v1/runs/{_quote(run_id)}/events", None, h))

    def wait(self, run_id: str, timeout: Optional[float] = None, poll: float = 0.5) -> Json:
        """Waits for a run (started with wait=False) to end; its record with
        its answer. Error(code="timeout") when timeout seconds pass."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            rec = self.get_run(run_id)
            if rec.get("status") not in ("running", "pending_approval"):
                return rec
            if deadline is not None and time.monotonic() >= deadline:
                raise Error(f"run {run_id} still runs", "timeout", 0)
            time.sleep(poll)

    def cancel(self, run_id: str) -> Json:
        """Cancels a running run (it ends error_name "Cancelled")."""
        return self._call("POST", f"/v1/runs/{_quote(run_id)}/cancel")

    def health(self) -> Json:
        return self._call("GET", "/v1/health")


class Files:
    """A conversation's live workspace, by path."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def _url(self, conversation_id: str, path: str = "") -> str:
        u = f"/v1/conversations/{_quote(conversation_id)}/files"
        return u + "/" + _quote(path) if path else u

    def write(self, conversation_id: str, path: str, data: Data,
              idempotency_key: Optional[str] = None) -> Json:
        """Writes data (bytes, text or a binary file, streamed) to path;
        {"path", "size", "sha256"}."""
        h = {"Content-Type": "application/octet-stream"}
        if idempotency_key:
            h["Idempotency-Key"] = idempotency_key
        if not isinstance(data, (bytes, str)):
            try:
                pos = data.tell()
                data.seek(0, os.SEEK_END)
                h["Content-Length"] = str(data.tell() - pos)
                data.seek(pos)
            except (OSError, ValueError, AttributeError):
                data = data.read()  # a pipe: its length must be known first
        resp = self._c._open("PUT", self._url(conversation_id, path), data, h)
        try:
            return json.loads(resp.read())
        finally:
            _close(resp)

    def read(self, conversation_id: str, path: str) -> bytes:
        resp = self._c._open("GET", self._url(conversation_id, path))
        try:
            return resp.read()
        finally:
            _close(resp)

    def list(self, conversation_id: str, path: str = "", recursive: bool = False) -> List[Json]:
        """The entries under path: [{"path", "type", "size", "mtime"}]."""
        out = self._c._call("GET", self._url(conversation_id),
                            query={"path": path or None, "recursive": recursive or None})
        return out["files"]

    def delete(self, conversation_id: str, path: str, recursive: bool = False) -> None:
        self._c._call("DELETE", self._url(conversation_id, path),
                      query={"recursive": recursive or None})


class Artifacts:
    """Versioned artifacts: what runs captured and what was uploaded."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self, conversation_id: str) -> List[Json]:
        return self._c._call("GET", "/v1/artifacts", query={"conversation_id": conversation_id})["artifacts"]

    def get(self, artifact_id: str) -> Json:
        return self._c._call("GET", f"/v1/artifacts/{_quote(artifact_id)}")

    def upload(self, conversation_id: str, filename: str, data: Data) -> Json:
        """Uploads data as the artifact filename of the conversation."""
        resp = self._c._open("POST", "/v1/artifacts", data, {"Content-Type": "application/octet-stream"},
                             query={"conversation_id": conversation_id, "filename": filename})
        try:
            return json.loads(resp.read())
        finally:
            _close(resp)

    def download(self, artifact_id: str, version: Optional[int] = None,
                 to: Union[None, str, IO[bytes]] = None) -> Union[bytes, int]:
        """The artifact's bytes (the current version, or version); with
        to (a path or a binary file) they are streamed there and their
        count answered."""
        resp = self._c._open("GET", f"/v1/artifacts/{_quote(artifact_id)}/content",
                             query={"version": version})
        try:
            if to is None:
                return resp.read()
            f = open(to, "wb") if isinstance(to, str) else to
            n = 0
            try:
                while True:
                    chunk = resp.read(1 << 20)
                    if not chunk:
                        return n
                    f.write(chunk)
                    n += len(chunk)
            finally:
                if isinstance(to, str):
                    f.close()
        finally:
            _close(resp)

    def link(self, artifact_id: str, version: Optional[int] = None,
             expires_in: Optional[int] = None) -> Json:
        """A signed link a browser opens without the key:
        {"url" (absolute), "expires_at", "version"}."""
        body = {k: v for k, v in (("version", version), ("expires_in", expires_in)) if v is not None}
        out = self._c._call("POST", f"/v1/artifacts/{_quote(artifact_id)}/links", body)
        if out.get("url", "").startswith("/"):
            out["url"] = self._c.url + out["url"]
        return out

    def delete(self, artifact_id: str) -> None:
        self._c._call("DELETE", f"/v1/artifacts/{_quote(artifact_id)}")


class Sessions:
    """A conversation's sandbox session: its kernel, started ahead of a run."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, conversation_id: str, **fields: Any) -> Json:
        """Starts the session (answered once its kernel is ready) or extends
        it; fields: ttl, language."""
        return self._c._call("POST", f"/v1/conversations/{_quote(conversation_id)}/session", fields)

    def get(self, conversation_id: str) -> Json:
        return self._c._call("GET", f"/v1/conversations/{_quote(conversation_id)}/session")

    def list(self) -> List[Json]:
        return self._c._call("GET", "/v1/conversations")["conversations"]

    def close(self, conversation_id: str) -> None:
        self._c._call("DELETE", f"/v1/conversations/{_quote(conversation_id)}/session")
