"""codexec as a RAGFlow sandbox provider (docs/integrations.md).

`CodexecProvider` implements RAGFlow's `SandboxProvider`
(agent/sandbox/providers/base.py) over codexec's own API: each instance is
a codexec conversation, `ragflow-<instance id>`, whose kernel keeps its
state across the instance's calls; `main(**arguments)` runs after the code
(the arguments travel as JSON data, never pasted into source); the files
the code writes under `artifacts/` come back within RAGFlow's limits; and
`metadata` holds what RAGFlow's code_exec tool reads (`artifacts`,
`result_present`, `result_value`, `result_type`, `status`).

Install: copy this file to agent/sandbox/providers/codexec.py in RAGFlow
and register the class where RAGFlow lists its providers (the lines are in
docs/integrations.md). It needs nothing but the standard library.
"""

import base64
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any, Dict, List, Optional, Tuple

try:  # inside RAGFlow
    from .base import ExecutionResult, SandboxInstance, SandboxProvider
except ImportError:  # beside it (tests, a path of one's own)
    from agent.sandbox.providers.base import ExecutionResult, SandboxInstance, SandboxProvider

# RAGFlow's own limits on what a run returns (its executor manager's).
ARTIFACT_MAX_FILES = 10
ARTIFACT_MAX_BYTES = 10 * 1024 * 1024
ARTIFACT_ALL_BYTES = 32 * 1024 * 1024  # what one result carries in all
ARTIFACT_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
                  ".svg": "image/svg+xml", ".pdf": "application/pdf", ".csv": "text/csv",
                  ".json": "application/json", ".html": "text/html"}
KEY_RE = re.compile(r"^cx_[A-Za-z0-9_-]{43}$")


class CodexecError(RuntimeError):
    """codexec refused a request (its error code and HTTP status)."""

    def __init__(self, message: str, code: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class CodexecProvider(SandboxProvider):
    """RAGFlow sandbox provider backed by a codexec server."""

    def __init__(self) -> None:
        self.endpoint = ""
        self.api_key = ""
        self.on_behalf_of: Optional[str] = None
        self.timeout = 30
        self._initialized = False
        self._languages: Dict[str, str] = {}

    # --- HTTP -------------------------------------------------------------
    def _request(self, method: str, path: str, body: Any = None, timeout: Optional[float] = None,
                 raw: bool = False) -> Any:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        if self.on_behalf_of:
            headers["On-Behalf-Of"] = self.on_behalf_of
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.endpoint + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout + 30) as r:
                out = r.read()
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                err = json.loads(text)["error"]
                raise CodexecError(err.get("message", ""), err.get("code", ""), e.code) from None
            except (ValueError, KeyError, TypeError):
                raise CodexecError(f"HTTP {e.code}", "", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            raise CodexecError(f"codexec is unreachable: {e}", "connection_failed") from None
        if raw:
            return out
        return json.loads(out) if out else None

    # --- SandboxProvider ----------------------------------------------------
    def initialize(self, config: Dict[str, Any]) -> bool:
        ok, _ = self.validate_config(config)
        if not ok:
            return False
        self.endpoint = str(config["endpoint"]).rstrip("/")
        self.api_key = str(config["api_key"])
        self.on_behalf_of = config.get("on_behalf_of") or None
        self.timeout = int(config.get("timeout", 30))
        # the key must work, not only the server answer
        try:
            self._request("GET", "/v1/conversations", timeout=10)
        except CodexecError:
            return False
        self._offered = self._server_languages()
        self._initialized = True
        return True

    def _server_languages(self) -> List[str]:
        """What the server runs (its health says), in RAGFlow's names."""
        try:
            health = self._request("GET", "/v1/health", timeout=10) or {}
        except CodexecError:  # (unhealthy: it answers 503) Python at least
            health = {}
        names = {"python": ["python"], "javascript": ["nodejs", "javascript"], "r": ["r"]}
        langs = health.get("languages") if isinstance(health, dict) else None
        if not isinstance(langs, list):
            langs = ["python"]
        return [n for lang in ("python", "javascript", "r") if lang in langs for n in names[lang]]

    def _conversation(self, instance_id: str) -> str:
        if not re.match(r"^[A-Za-z0-9._:-]{1,120}$", instance_id or ""):
            raise RuntimeError(f"not an instance of this provider: {instance_id!r}")
        return f"ragflow-{instance_id}"

    def create_instance(self, template: str = "python") -> SandboxInstance:
        if not self._initialized:
            raise RuntimeError("Provider not initialized. Call initialize() first.")
        language = self._language(template)
        instance_id = uuid.uuid4().hex
        cid = self._conversation(instance_id)
        try:  # its kernel, started now: the first run does not wait for it
            self._request("POST", f"/v1/conversations/{cid}/session", {"language": language},
                          timeout=150)
        except CodexecError as e:
            raise RuntimeError(f"codexec: {e} ({e.code})") from None
        self._languages[instance_id] = language
        return SandboxInstance(instance_id=instance_id, provider="codexec", status="running",
                               metadata={"language": language, "conversation_id": cid,
                                         "endpoint": self.endpoint})

    def execute_code(self, instance_id: str, code: str, language: str, timeout: int = 10,
                     arguments: Optional[Dict[str, Any]] = None) -> ExecutionResult:
        if not self._initialized:
            raise RuntimeError("Provider not initialized. Call initialize() first.")
        cid = self._conversation(instance_id)
        body = {"conversation_id": cid, "code": code, "language": self._language(language),
                "timeout": max(1, int(timeout or self.timeout)), "output": "full",
                "arguments": arguments if isinstance(arguments, dict) else {}}
        t0 = time.time()
        try:
            run = self._request("POST", "/v1/runs", body, timeout=body["timeout"] + 60)
        except CodexecError as e:
            if e.code in ("invalid_request",):
                raise RuntimeError(f"codexec refused the run: {e}") from None
            return ExecutionResult(stdout="", stderr=str(e), exit_code=-1,
                                   execution_time=time.time() - t0,
                                   metadata={"status": "runtime_error", "detail": e.code,
                                             "instance_id": instance_id, "artifacts": [],
                                             "result_present": False, "result_value": None,
                                             "result_type": None})
        return self._result(instance_id, run, time.time() - t0)

    def destroy_instance(self, instance_id: str) -> bool:
        self._languages.pop(instance_id, None)
        try:
            self._request("DELETE", f"/v1/conversations/{self._conversation(instance_id)}/session")
        except CodexecError as e:
            return e.status == 404  # gone already
        except RuntimeError:
            return False
        return True

    def health_check(self) -> bool:
        try:
            return (self._request("GET", "/v1/health", timeout=5) or {}).get("status") == "ok"
        except CodexecError:
            return False

    def get_supported_languages(self) -> List[str]:
        return list(getattr(self, "_offered", None) or ["python"])

    @staticmethod
    def get_config_schema() -> Dict[str, Dict]:
        return {
            "endpoint": {"type": "string", "required": True, "label": "codexec URL",
                         "placeholder": "https://codexec.example.com",
                         "description": "Where codexec's API answers (its nginx or Apache).",
                         "scope": "runtime", "readonly": False},
            "api_key": {"type": "string", "required": True, "secret": True, "label": "API key",
                        "placeholder": "cx_...",
                        "description": "A codexec API key (codexec-admin key create).",
                        "scope": "runtime", "readonly": False},
            "on_behalf_of": {"type": "string", "required": False, "label": "On behalf of",
                             "default": "",
                             "description": "With a key made with --on-behalf: the end user the "
                                            "runs belong to (their own quotas and artifacts).",
                             "scope": "runtime", "readonly": False},
            "timeout": {"type": "integer", "required": False, "label": "Run timeout (seconds)",
                        "default": 30, "min": 1, "max": 3600,
                        "description": "The longest a run may take when the caller names no "
                                       "timeout; codexec clamps it to its max_timeout.",
                        "scope": "runtime", "readonly": False},
        }

    def validate_config(self, config: Dict[str, Any]) -> Tuple[bool, Optional[str]]:
        endpoint = config.get("endpoint") or ""
        if not isinstance(endpoint, str) or not re.match(r"^https?://[^/\s]+(/\S*)?$", endpoint):
            return False, "endpoint must be an http:// or https:// URL"
        key = config.get("api_key") or ""
        if not isinstance(key, str) or not KEY_RE.match(key):
            return False, "api_key must be a codexec API key (cx_ and 43 characters)"
        obo = config.get("on_behalf_of") or ""
        if obo and (not isinstance(obo, str) or not re.match(r"^[A-Za-z0-9._:@-]{1,128}$", obo)):
            return False, "on_behalf_of: 1 to 128 of A-Z a-z 0-9 . _ : @ -"
        timeout = config.get("timeout", 30)
        if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= 3600:
            return False, "timeout must be an integer between 1 and 3600 seconds"
        return True, None

    # --- codexec's answer in RAGFlow's words -------------------------------
    @staticmethod
    def _language(name: str) -> str:
        lang = (name or "python").lower()
        if lang in ("python", "python3"):
            return "python"
        if lang in ("javascript", "nodejs", "node"):
            return "javascript"
        if lang == "r":
            return "r"
        raise RuntimeError(f"unsupported language: {name!r}")

    def _artifacts(self, run: Dict[str, Any]) -> List[Dict[str, Any]]:
        """The run's captured files directly under artifacts/, of RAGFlow's
        types and sizes, as RAGFlow's executor returns them."""
        out, left = [], ARTIFACT_ALL_BYTES
        for a in sorted(run.get("artifacts") or [], key=lambda a: a.get("path", "")):
            path = a.get("path", "")
            name = path[len("artifacts/"):] if path.startswith("artifacts/") else ""
            if not name or "/" in name or name.startswith("."):
                continue
            if len(out) >= ARTIFACT_MAX_FILES:
                break
            ext = name[name.rfind("."):].lower() if "." in name else ""
            size = int(a.get("size") or 0)
            if ext not in ARTIFACT_TYPES or size <= 0 or size > ARTIFACT_MAX_BYTES or size > left:
                continue
            try:
                data = self._request("GET", a["download_url"], raw=True)
            except (CodexecError, KeyError):
                continue  # gone meanwhile: left out, the run's result stands
            left -= len(data)
            out.append({"name": name, "mime_type": ARTIFACT_TYPES[ext], "size": len(data),
                        "content_b64": base64.b64encode(data).decode()})
        return out

    def _result(self, instance_id: str, run: Dict[str, Any], elapsed: float) -> ExecutionResult:
        name = run.get("error_name") or ""
        ok = run.get("status") == "ok"
        meta: Dict[str, Any] = {"instance_id": instance_id, "time_used_ms": run.get("execution_ms"),
                                "memory_used_kb": None, "detail": None, "artifacts": [],
                                "result_present": False, "result_value": None, "result_type": None,
                                "run_id": run.get("run_id"),
                                "session_reset": (run.get("session") or {}).get("reset", False)}
        if ok:
            meta.update(status="success", artifacts=self._artifacts(run),
                        result_present=bool(run.get("result_present")),
                        result_value=run.get("result") if run.get("result_present") else None,
                        result_type="json" if run.get("result_present") else None)
            return ExecutionResult(stdout=run.get("stdout", run.get("stdout_tail", "")),
                                   stderr=run.get("stderr", run.get("stderr_tail", "")) or "",
                                   exit_code=0, execution_time=elapsed, metadata=meta)
        err = run.get("stderr", run.get("stderr_tail", "")) or ""
        err += ("" if not err or err.endswith("\n") else "\n") + (run.get("traceback") or run.get("error") or "")
        if name == "TimeoutError":
            status, code, err, detail = "resource_limit_exceeded", -124, "Execution timeout", "time"
        elif name in ("MemoryError", "KernelDied"):
            status, code, detail = "resource_limit_exceeded", -137, "memory"
        elif name == "OutputLimitExceeded":
            status, code, detail = "resource_limit_exceeded", 1, "output"
        elif name in ("Cancelled", "Abandoned", "OutputLost", "InputStagingFailed"):
            status, code, detail = "runtime_error", -1, name
        else:
            status, code, detail = "program_error", 1, None
        meta.update(status=status, detail=detail)
        # as RAGFlow's executor: no stdout of a failed run (its tool reads
        # any stdout as success)
        return ExecutionResult(stdout="", stderr=err, exit_code=code, execution_time=elapsed,
                               metadata=meta)
