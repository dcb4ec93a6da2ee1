"""codexec as a DocsGPT sandbox backend (docs/integrations.md).

`CodexecSandbox` implements DocsGPT's `CodeSandbox`
(application/sandbox/base.py) over codexec's conversations API: a DocsGPT
session is a codexec conversation (same id), its kernel stateful and
sandboxed, its workspace reached by path (put_file, get_file, list_files,
remove_path), and `exec` fills `ExecResult` whole: the whole stdout and
stderr, the error's name, value and traceback, `results` and
`display_data` (the display bundles, images as base64 again), `plots`,
`truncated`, and `runtime_invalidated` when the kernel's state was lost
(`session.reset`). A session codexec no longer has raises
`SandboxGoneError` from the file operations.

One service key may act for each DocsGPT user: `on_behalf_of` is a user id
or a function of the session id that returns one (a key made with
`codexec-admin key create --user docsgpt --on-behalf`); each session keeps
the user it was opened for, also for its close and the reaper's.

Register it in DocsGPT's `application/sandbox/sandbox_creator.py`:

    from application.sandbox.codexec_sandbox import CodexecSandbox
    SandboxCreator.backends["codexec"] = lambda: CodexecSandbox(
        settings.CODEXEC_URL, settings.CODEXEC_API_KEY)

and set SANDBOX_BACKEND=codexec. The standard library only.
"""

import base64
import collections
import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Dict, List, Optional, Union

try:  # inside DocsGPT
    from application.sandbox.base import (CodeSandbox, DisplayData, ExecResult, Plot,
                                          SandboxGoneError)
except ImportError:  # pragma: no cover - beside it, under another name
    from .base import CodeSandbox, DisplayData, ExecResult, Plot, SandboxGoneError  # type: ignore

OnBehalfOf = Union[None, str, Callable[[str], Optional[str]]]
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/svg+xml")


class CodexecError(IOError):
    """codexec refused a request (its error code and HTTP status)."""

    def __init__(self, message: str, code: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class CodexecSandbox(CodeSandbox):
    """DocsGPT's CodeSandbox on a codexec server."""

    def __init__(self, url: str, api_key: str, on_behalf_of: OnBehalfOf = None,
                 default_timeout: float = 60.0, ttl: Optional[int] = None,
                 http_timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.on_behalf_of = on_behalf_of
        self.default_timeout = default_timeout
        self.ttl = ttl
        self.http_timeout = http_timeout
        # the user each session was opened for, and its handle (a new one at
        # every open), the most recent ones: 10000 sessions
        self._users: "collections.OrderedDict[str, Optional[str]]" = collections.OrderedDict()
        self._handles: Dict[str, str] = {}
        self._lock = threading.Lock()

    # --- HTTP -------------------------------------------------------------
    def _user(self, session_id: str, opening: bool = False) -> Optional[str]:
        with self._lock:
            if not opening and session_id in self._users:
                self._users.move_to_end(session_id)
                return self._users[session_id]
        user = self.on_behalf_of(session_id) if callable(self.on_behalf_of) else self.on_behalf_of
        with self._lock:
            self._users[session_id] = user
            self._users.move_to_end(session_id)
            while len(self._users) > 10000:
                old, _ = self._users.popitem(last=False)
                self._handles.pop(old, None)
        return user

    def _request(self, method: str, path: str, session_id: str, body: Optional[bytes] = None,
                 content_type: Optional[str] = None, timeout: Optional[float] = None,
                 query: Optional[dict] = None) -> bytes:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        user = self._user(session_id)
        if user:
            headers["On-Behalf-Of"] = user
        if content_type:
            headers["Content-Type"] = content_type
        if query:
            path += "?" + urllib.parse.urlencode(query)
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.http_timeout) as r:
                return r.read()
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                err = json.loads(text)["error"]
                raise CodexecError(err.get("message", ""), err.get("code", ""), e.code) from None
            except (ValueError, KeyError, TypeError):
                raise CodexecError(f"HTTP {e.code}", "", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            raise CodexecError(f"codexec is unreachable: {e}", "connection_failed") from None

    def _json(self, method: str, path: str, session_id: str, body: Optional[dict] = None,
              **kw) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        out = self._request(method, path, session_id, data,
                            "application/json" if data is not None else None, **kw)
        return json.loads(out) if out else {}

    @staticmethod
    def _conv(session_id: str) -> str:
        return urllib.parse.quote(session_id, safe="")

    def _files(self, session_id: str, path: str = "") -> str:
        base = f"/v1/conversations/{self._conv(session_id)}/files"
        return base + ("/" + urllib.parse.quote(path, safe="/") if path else "")

    # --- the lifecycle -----------------------------------------------------
    def open(self, session_id: str) -> str:
        """The conversation's session, started (its kernel ready) or kept."""
        self._user(session_id, opening=True)
        body = {"ttl": int(self.ttl)} if self.ttl else {}
        self._json("POST", f"/v1/conversations/{self._conv(session_id)}/session", session_id,
                   body, timeout=max(self.http_timeout, 150))
        handle = f"{session_id}#{os.urandom(6).hex()}"
        with self._lock:
            self._handles[session_id] = handle
        return handle

    def attach(self, session_id: str) -> str:
        """The session if it lives, else a new one (a cold kernel)."""
        with self._lock:
            handle = self._handles.get(session_id)
        if handle and self._alive(session_id):
            return handle
        return self.open(session_id)

    def close(self, session_id: str) -> None:
        """Ends the session (kernel and workspace); best-effort."""
        try:
            self._request("DELETE", f"/v1/conversations/{self._conv(session_id)}/session",
                          session_id)
        except CodexecError as e:
            if e.status not in (404, 409):
                raise
        finally:
            with self._lock:
                self._users.pop(session_id, None)
                self._handles.pop(session_id, None)

    def close_handle(self, session_id: str, handle_id: str) -> None:
        """Closes the session only if handle_id is still its handle (a
        close the manager deferred never ends a session opened since)."""
        with self._lock:
            current = self._handles.get(session_id)
        if current is None or current == handle_id:
            self.close(session_id)

    # --- exec ---------------------------------------------------------------
    def exec(self, session_id: str, code: str, timeout: Optional[float] = None) -> ExecResult:
        body = {"conversation_id": session_id, "code": code, "output": "full",
                "timeout": max(1, int(round(timeout or self.default_timeout)))}
        if self.ttl:
            body["ttl"] = int(self.ttl)
        try:
            run = self._json("POST", "/v1/runs", session_id, body, timeout=body["timeout"] + 60)
        except CodexecError as e:
            return ExecResult(status="error", exit_code=-1, error_name=e.code or "CodexecError",
                              error_value=str(e))
        return self._result(session_id, run)

    def _image(self, session_id: str, ref: dict) -> Optional[str]:
        """A displayed image's bytes (codexec keeps it as an artifact), base64."""
        try:
            data = self._request("GET", f"/v1/artifacts/{urllib.parse.quote(ref['artifact_id'])}"
                                 f"/content", session_id, query={"version": ref["version"]})
        except (CodexecError, KeyError, TypeError):
            return None
        return base64.b64encode(data).decode()

    def _bundle(self, session_id: str, data: dict, plots: List[Plot]) -> DisplayData:
        out = {}
        for mime, value in data.items():
            if isinstance(value, dict) and "artifact_id" in value:
                value = self._image(session_id, value)
                if value is None:
                    continue
            elif isinstance(value, dict) and value.get("truncated"):
                continue
            out[mime] = value
            if mime in IMAGE_TYPES:
                plots.append(Plot(format=mime.split("/", 1)[1], content_base64=value))
        return DisplayData(data=out)

    def _result(self, session_id: str, run: dict) -> ExecResult:
        ok = run.get("status") == "ok"
        session = run.get("session") or {}
        # the kernel's state was lost: restarted (reset), or the session
        # had ended and this run made a new one
        lost = bool(session.get("reset")) or bool(session.get("created"))
        r = ExecResult(status="ok" if ok else "error",
                       stdout=run.get("stdout", run.get("stdout_tail", "")),
                       stderr=run.get("stderr", run.get("stderr_tail", "")) or "",
                       exit_code=0 if ok else 1, truncated=bool(run.get("truncated")),
                       runtime_invalidated=lost)
        if not ok:
            name = run.get("error_name") or "Error"
            value = run.get("error") or ""
            if value.startswith(name + ": "):
                value = value[len(name) + 2:]
            r.error_name, r.error_value = name, value
            r.traceback = (run.get("traceback") or "").splitlines()
            if name == "TimeoutError" and "timeout" not in value.lower():
                r.error_value = value or "execution timed out"
        for b in run.get("results") or []:
            bundle = self._bundle(session_id, b.get("data") or {}, r.plots)
            (r.results if b.get("type") == "execute_result" else r.display_data).append(bundle)
        return r

    # --- the workspace ------------------------------------------------------
    def _file_op(self, session_id: str, fn):
        try:
            return fn()
        except CodexecError as e:
            if e.status == 404 and e.code == "not_found" and not self._alive(session_id):
                raise SandboxGoneError(f"the session {session_id!r} is gone") from None
            if e.status == 404:
                raise FileNotFoundError(str(e)) from None
            raise

    def _alive(self, session_id: str) -> bool:
        try:
            self._request("GET", f"/v1/conversations/{self._conv(session_id)}/session", session_id)
            return True
        except CodexecError as e:
            return e.status != 404

    def put_file(self, session_id: str, dest_path: str, data: bytes) -> None:
        # a write makes a session where there is none: one that ended since
        # it was opened must be told, not silently made anew and empty
        with self._lock:
            opened = session_id in self._handles
        if opened and not self._alive(session_id):
            raise SandboxGoneError(f"the session {session_id!r} is gone")
        self._file_op(session_id, lambda: self._request(
            "PUT", self._files(session_id, dest_path), session_id, bytes(data),
            "application/octet-stream", timeout=max(self.http_timeout, 300)))

    def get_file(self, session_id: str, path: str) -> bytes:
        return self._file_op(session_id, lambda: self._request(
            "GET", self._files(session_id, path), session_id, timeout=max(self.http_timeout, 300)))

    def list_files(self, session_id: str) -> List[str]:
        def listing():
            out = json.loads(self._request("GET", self._files(session_id), session_id,
                                           query={"recursive": "true"}))
            return [f["path"] for f in out.get("files", []) if f.get("type") == "file"]
        return self._file_op(session_id, listing)

    def remove_path(self, session_id: str, path: str) -> None:
        """Removes a file or a directory tree of the workspace; never raises."""
        try:
            self._request("DELETE", self._files(session_id, path), session_id,
                          query={"recursive": "true"})
        except (CodexecError, ValueError):
            pass
