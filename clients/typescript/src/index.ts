// codexec's TypeScript client: ESM, no runtime dependencies, fetch (Node >= 18
// and browsers). The types of the API's bodies are generated from
// docs/openapi.yaml (src/openapi.ts, `npm run generate`).
import type { components } from "./openapi.js";

type Schemas = components["schemas"];
export type RunRequest = Schemas["RunRequest"];
export type RunResult = Schemas["RunResult"];
export type RunRecord = Schemas["RunRecord"];
export type RunAccepted = Schemas["RunAccepted"];
export type RunPending = Schemas["RunPending"];
export type Session = Schemas["Session"];
export type SessionInfo = Schemas["SessionInfo"];
export type FileWritten = Schemas["FileWritten"];
export type FileList = Schemas["FileList"];
export type FileEntry = FileList["files"][number];
export type ArtifactEntry = Schemas["ArtifactEntry"];
export type ArtifactSummary = Schemas["ArtifactSummary"];
export type Link = Schemas["Link"];

/** The fields of a run besides its code and conversation. */
export type RunFields = Omit<RunRequest, "code" | "conversation_id">;
export type RunOptions = RunFields & {
  code: string;
  conversationId: string;
  /** Idempotency-Key: a retry within 24 hours is answered the first's answer */
  idempotencyKey?: string;
  signal?: AbortSignal;
};
/** A run's event: run, status, stdout, stderr, display, and last result. */
export interface RunEvent {
  event: string;
  data: any;
  id?: string;
}

export interface CodexecOptions {
  url: string;
  apiKey: string;
  /** The end user a service key (made with --on-behalf) acts for. */
  onBehalfOf?: string;
  /** Times a 429 or 503 refusal with Retry-After is retried (default 3). */
  retries?: number;
  /** The fetch to use (default globalThis.fetch). */
  fetch?: typeof fetch;
}

const MAX_RETRY_WAIT_S = 30;

/** A request codexec (or the way to it) refused or failed. */
export class CodexecError extends Error {
  readonly code: string;
  readonly status: number;
  readonly retryAfter: number | null;
  constructor(message: string, code: string, status: number, retryAfter: number | null = null) {
    super(message);
    this.name = "CodexecError";
    this.code = code;
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

async function errorOf(res: Response): Promise<CodexecError> {
  const ra = res.headers.get("Retry-After");
  const retryAfter = ra !== null && ra !== "" && !Number.isNaN(Number(ra)) ? Number(ra) : null;
  const text = await res.text().catch(() => "");
  try {
    const e = JSON.parse(text).error;
    return new CodexecError(String(e.message ?? `HTTP ${res.status}`), String(e.code ?? ""), res.status, retryAfter);
  } catch {
    return new CodexecError(text.slice(0, 200) || `HTTP ${res.status}`, "", res.status, retryAfter);
  }
}

/** A path's segments percent-encoded; "." and ".." refused here, as fetch's
 * URL parser would resolve them (and leave the conversation's files). */
const quote = (path: string): string =>
  path
    .split("/")
    .map((seg) => {
      if (seg === "." || seg === "..") throw new CodexecError(`invalid path: a ${seg} segment`, "invalid_path", 0);
      return encodeURIComponent(seg);
    })
    .join("/");
/** A conversation id (or another id) as one path segment. */
const segment = (id: string): string => {
  if (id === "." || id === "..") throw new CodexecError(`invalid id: ${id}`, "invalid_request", 0);
  return encodeURIComponent(id);
};
// Refusals that mean nothing was done: a request may be sent again after
// them whatever it is; after any other 429 or 503 only a repeatable one is.
const NOTHING_DONE = new Set(["too_many_runs", "capacity_exhausted", "quota_exceeded"]);
const sleep = (s: number): Promise<void> => new Promise((r) => setTimeout(r, s * 1000));

/** Server-Sent Events of a response body, as they arrive. */
async function* sse(body: ReadableStream<Uint8Array>): AsyncGenerator<RunEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let event = "message";
  let data: string[] = [];
  let id: string | undefined;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (line === "") {
          if (data.length) {
            const text = data.join("\n");
            let parsed: unknown = text;
            try {
              parsed = JSON.parse(text);
            } catch {
              /* not JSON: the text */
            }
            yield { event, data: parsed, ...(id !== undefined ? { id } : {}) };
          }
          event = "message";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const at = line.indexOf(":");
        const field = at < 0 ? line : line.slice(0, at);
        const v = at < 0 ? "" : line.slice(at + 1).replace(/^ /, "");
        if (field === "event") event = v;
        else if (field === "data") data.push(v);
        else if (field === "id") id = v;
      }
    }
  } finally {
    // stopped early (a break): the rest is not wanted, the connection freed
    await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

export class Codexec {
  readonly url: string;
  readonly files: Files;
  readonly artifacts: Artifacts;
  readonly sessions: Sessions;
  private readonly apiKey: string;
  private readonly onBehalfOf: string | undefined;
  private readonly retries: number;
  private readonly fetchFn: typeof fetch;

  constructor(opts: CodexecOptions) {
    if (!/^https?:\/\/[^/]/.test(opts.url)) throw new TypeError("url must be http(s)://host[:port][/prefix]");
    this.url = opts.url.replace(/\/+$/, "");
    this.apiKey = opts.apiKey;
    this.onBehalfOf = opts.onBehalfOf;
    this.retries = opts.retries ?? 3;
    this.fetchFn = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this.files = new Files(this);
    this.artifacts = new Artifacts(this);
    this.sessions = new Sessions(this);
  }

  /** @internal A request; its response when 2xx or 304, else CodexecError. */
  async request(
    method: string,
    path: string,
    init: { body?: BodyInit | null; headers?: Record<string, string>; query?: Record<string, string | number | boolean | undefined>; signal?: AbortSignal } = {},
  ): Promise<Response> {
    const headers: Record<string, string> = { Authorization: `Bearer ${this.apiKey}`, ...(init.headers ?? {}) };
    if (this.onBehalfOf) headers["On-Behalf-Of"] = this.onBehalfOf;
    const q = Object.entries(init.query ?? {}).filter(([, v]) => v !== undefined && v !== false);
    const target = this.url + path + (q.length ? "?" + new URLSearchParams(q.map(([k, v]) => [k, String(v)])).toString() : "");
    const replayable = init.body === undefined || init.body === null || typeof init.body === "string" || init.body instanceof Uint8Array || init.body instanceof ArrayBuffer || (typeof Blob !== "undefined" && init.body instanceof Blob);
    const repeatable = method !== "POST" || "Idempotency-Key" in headers;
    for (let attempt = 0; ; attempt++) {
      let res: Response;
      try {
        res = await this.fetchFn(target, { method, headers, body: init.body ?? null, signal: init.signal ?? null, ...(replayable ? {} : { duplex: "half" }) } as RequestInit);
      } catch (e) {
        if ((e as Error).name === "AbortError") throw e;
        throw new CodexecError(`${method} ${path}: ${(e as Error).message}`, "connection_failed", 0);
      }
      if ((res.status >= 200 && res.status < 300) || res.status === 304) return res;
      const err = await errorOf(res);
      const retryable =
        (res.status === 429 || res.status === 503) &&
        err.retryAfter !== null &&
        err.retryAfter >= 0 &&
        err.retryAfter <= MAX_RETRY_WAIT_S &&
        (repeatable || NOTHING_DONE.has(err.code));
      if (!retryable || !replayable || attempt >= this.retries) throw err;
      await sleep(err.retryAfter as number);
    }
  }

  /** @internal A JSON request and its JSON answer (undefined for none). */
  async call<T>(method: string, path: string, body?: unknown, extra: { headers?: Record<string, string>; query?: Record<string, string | number | boolean | undefined>; signal?: AbortSignal } = {}): Promise<T> {
    const headers = { ...(extra.headers ?? {}) };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await this.request(method, path, { ...extra, headers, body: body === undefined ? null : JSON.stringify(body) });
    const text = await res.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }

  private runBody(o: RunOptions): string {
    const { code, conversationId, idempotencyKey: _k, signal: _s, ...fields } = o;
    return JSON.stringify({ ...fields, conversation_id: conversationId, code });
  }

  /** Runs code in the conversation: its answer (output, error, artifacts,
   * result); with wait: false, {run_id, status: "running"} at once. */
  async run(o: RunOptions): Promise<RunResult | RunAccepted | RunPending> {
    const headers: Record<string, string> = { "Content-Type": "application/json" };
    if (o.idempotencyKey) headers["Idempotency-Key"] = o.idempotencyKey;
    const res = await this.request("POST", "/v1/runs", { body: this.runBody(o), headers, ...(o.signal ? { signal: o.signal } : {}) });
    return (await res.json()) as RunResult | RunAccepted | RunPending;
  }

  /** Runs code and yields its events as they happen, the last "result"
   * (the run's answer). */
  async *stream(o: RunOptions): AsyncGenerator<RunEvent> {
    const res = await this.request("POST", "/v1/runs", {
      body: this.runBody(o),
      headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
      ...(o.signal ? { signal: o.signal } : {}),
    });
    yield* this.eventsOf(res);
  }

  private async *eventsOf(res: Response): AsyncGenerator<RunEvent> {
    if (!(res.headers.get("Content-Type") ?? "").startsWith("text/event-stream") || !res.body) {
      yield { event: "result", data: await res.json() };
      return;
    }
    let last: string | undefined;
    for await (const ev of sse(res.body)) {
      last = ev.id ?? last;
      if (ev.event === "result" && ev.data && typeof ev.data === "object" && "error" in ev.data && !("run_id" in ev.data)) {
        const e = (ev.data as { error: { code?: string; message?: string } }).error;
        throw new CodexecError(String(e.message ?? ""), String(e.code ?? ""), 0);
      }
      yield ev;
      if (ev.event === "result") return;
    }
    // cut before its result: events(runId, lastEventId) resumes
    throw new CodexecError(`the stream ended before its result (last event id ${last ?? "none"})`, "stream_ended", 0);
  }

  /** The run's record; once it ended, with its answer. */
  getRun(runId: string): Promise<RunRecord> {
    return this.call<RunRecord>("GET", `/v1/runs/${segment(runId)}`);
  }

  /** A detached or streamed run's events from its start (or after
   * lastEventId), live while it runs, ending with "result". */
  async *events(runId: string, lastEventId?: number): AsyncGenerator<RunEvent> {
    const headers: Record<string, string> = { Accept: "text/event-stream" };
    if (lastEventId !== undefined) headers["Last-Event-ID"] = String(lastEventId);
    yield* this.eventsOf(await this.request("GET", `/v1/runs/${segment(runId)}/events`, { headers }));
  }

  /** Waits for a run (started with wait: false) to end: its record. */
  async wait(runId: string, opts: { timeoutMs?: number; pollMs?: number } = {}): Promise<RunRecord> {
    const deadline = opts.timeoutMs === undefined ? Infinity : Date.now() + opts.timeoutMs;
    for (;;) {
      const rec = await this.getRun(runId);
      if (rec.status !== "running" && rec.status !== "pending_approval") return rec;
      if (Date.now() >= deadline) throw new CodexecError(`run ${runId} still runs`, "timeout", 0);
      await new Promise((r) => setTimeout(r, opts.pollMs ?? 500));
    }
  }

  /** Cancels a running run (it ends error_name "Cancelled"). */
  cancel(runId: string): Promise<{ run_id: string; status: string }> {
    return this.call("POST", `/v1/runs/${segment(runId)}/cancel`);
  }

  health(): Promise<Schemas["Health"]> {
    return this.call("GET", "/v1/health");
  }
}

type Bytes = Uint8Array | ArrayBuffer | Blob | string | ReadableStream<Uint8Array>;

/** A conversation's live workspace, by path. */
export class Files {
  constructor(private readonly c: Codexec) {}
  private url(cid: string, path = ""): string {
    return `/v1/conversations/${segment(cid)}/files` + (path ? `/${quote(path)}` : "");
  }
  async write(conversationId: string, path: string, data: Bytes, opts: { idempotencyKey?: string } = {}): Promise<FileWritten> {
    const headers: Record<string, string> = { "Content-Type": "application/octet-stream" };
    if (opts.idempotencyKey) headers["Idempotency-Key"] = opts.idempotencyKey;
    const res = await this.c.request("PUT", this.url(conversationId, path), { body: data as BodyInit, headers });
    return (await res.json()) as FileWritten;
  }
  async read(conversationId: string, path: string): Promise<Uint8Array> {
    const res = await this.c.request("GET", this.url(conversationId, path));
    return new Uint8Array(await res.arrayBuffer());
  }
  async list(conversationId: string, path = "", opts: { recursive?: boolean } = {}): Promise<FileEntry[]> {
    const out = await this.c.call<FileList>("GET", this.url(conversationId), undefined, { query: { path: path || undefined, recursive: opts.recursive || undefined } });
    return out.files;
  }
  async delete(conversationId: string, path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.c.call("DELETE", this.url(conversationId, path), undefined, { query: { recursive: opts.recursive || undefined } });
  }
}

/** Versioned artifacts: what runs captured and what was uploaded. */
export class Artifacts {
  constructor(private readonly c: Codexec) {}
  async list(conversationId: string): Promise<ArtifactSummary[]> {
    const out = await this.c.call<{ artifacts: ArtifactSummary[] }>("GET", "/v1/artifacts", undefined, { query: { conversation_id: conversationId } });
    return out.artifacts;
  }
  get(artifactId: string): Promise<Record<string, unknown>> {
    return this.c.call("GET", `/v1/artifacts/${segment(artifactId)}`);
  }
  async upload(conversationId: string, filename: string, data: Bytes): Promise<ArtifactEntry> {
    const res = await this.c.request("POST", "/v1/artifacts", { body: data as BodyInit, headers: { "Content-Type": "application/octet-stream" }, query: { conversation_id: conversationId, filename } });
    return (await res.json()) as ArtifactEntry;
  }
  /** The artifact's bytes (the current version, or version). */
  async download(artifactId: string, version?: number): Promise<Uint8Array> {
    const res = await this.c.request("GET", `/v1/artifacts/${segment(artifactId)}/content`, { query: { version } });
    return new Uint8Array(await res.arrayBuffer());
  }
  /** The artifact's bytes as a stream (large files). */
  async downloadStream(artifactId: string, version?: number): Promise<ReadableStream<Uint8Array>> {
    const res = await this.c.request("GET", `/v1/artifacts/${segment(artifactId)}/content`, { query: { version } });
    if (!res.body) throw new CodexecError("no body", "internal_error", res.status);
    return res.body;
  }
  /** A signed link a browser opens without the key (url absolute). */
  async link(artifactId: string, opts: { version?: number; expiresIn?: number } = {}): Promise<Link> {
    const body: Record<string, number> = {};
    if (opts.version !== undefined) body.version = opts.version;
    if (opts.expiresIn !== undefined) body.expires_in = opts.expiresIn;
    const out = await this.c.call<Link>("POST", `/v1/artifacts/${segment(artifactId)}/links`, body);
    return out.url.startsWith("/") ? { ...out, url: this.c.url + out.url } : out;
  }
  async delete(artifactId: string): Promise<void> {
    await this.c.call("DELETE", `/v1/artifacts/${segment(artifactId)}`);
  }
}

/** A conversation's sandbox session: its kernel, started ahead of a run. */
export class Sessions {
  constructor(private readonly c: Codexec) {}
  create(conversationId: string, fields: { ttl?: number; language?: "python" | "javascript" | "r" } = {}): Promise<SessionInfo> {
    return this.c.call("POST", `/v1/conversations/${segment(conversationId)}/session`, fields);
  }
  get(conversationId: string): Promise<SessionInfo> {
    return this.c.call("GET", `/v1/conversations/${segment(conversationId)}/session`);
  }
  async list(): Promise<SessionInfo[]> {
    return (await this.c.call<{ conversations: SessionInfo[] }>("GET", "/v1/conversations")).conversations;
  }
  async close(conversationId: string): Promise<void> {
    await this.c.call("DELETE", `/v1/conversations/${segment(conversationId)}/session`);
  }
}
