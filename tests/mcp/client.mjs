// The official MCP TypeScript SDK's client, over its Streamable HTTP
// transport, driving codexec's /mcp as an agent host would. Run by
// tests/system/test_mcp.py:
//
//   node client.mjs SCENARIO URL KEY
//
// Prints one JSON object: what each step saw (the test holds it to what
// it should be). A step that throws is recorded as {"error": "..."}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [scenario, url, key, extra] = process.argv.slice(2);
const out = {};

function transport(opts = {}) {
  return new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${key}`, ...(opts.headers || {}) } },
    ...(opts.sessionId ? { sessionId: opts.sessionId } : {}),
  });
}

async function connect(opts) {
  const client = new Client({ name: "codexec-tests", version: "1.0.0" });
  const t = transport(opts);
  await client.connect(t);
  return [client, t];
}

async function step(name, fn) {
  try {
    out[name] = await fn();
  } catch (e) {
    out[name] = { error: String(e && e.message ? e.message : e), code: e && e.code };
  }
}

const run = (client, code, more = {}, opts) =>
  client.callTool({ name: "run_code", arguments: { code, ...more } }, undefined, opts);

async function flow() {
  const [c, t] = await connect();
  out.session_id = t.sessionId;
  out.protocol_version = t.protocolVersion;
  out.server = c.getServerVersion();
  out.capabilities = c.getServerCapabilities();
  await step("ping", () => c.ping());
  await step("tools", async () => (await c.listTools()).tools.map((x) => x.name));
  await step("text", () => run(c, "x = 6 * 7\nprint(x)"));
  await step("state", () => run(c, "print(x + 1)"));
  await step("error", () => run(c, "1 / 0"));
  await step("image", () =>
    run(c, 'import matplotlib\nmatplotlib.use("Agg")\nimport matplotlib.pyplot as plt\n' +
      "plt.plot([1, 4, 9])\nplt.show()"));
  await step("artifact", () => run(c, 'open("report.csv", "w").write("a,b\\n1,2\\n")'));
  await step("write", () =>
    c.callTool({ name: "write_file", arguments: { path: "data/in.txt", content: "hello from mcp" } }));
  await step("read", () => c.callTool({ name: "read_file", arguments: { path: "data/in.txt" } }));
  await step("write_bin", () =>
    c.callTool({ name: "write_file",
      arguments: { path: "bin.dat", content_base64: Buffer.from([0, 1, 2, 255]).toString("base64") } }));
  await step("read_bin", () => c.callTool({ name: "read_file", arguments: { path: "bin.dat" } }));
  await step("list", () => c.callTool({ name: "list_files", arguments: { recursive: true } }));
  await step("code_sees", () => run(c, 'print(open("/mnt/data/data/in.txt").read())'));
  await step("bad_path", () => c.callTool({ name: "read_file", arguments: { path: "../etc/passwd" } }));
  await step("no_tool", () => c.callTool({ name: "rm_rf", arguments: {} }));
  await step("resources", () => c.listResources());
  const link = (out.artifact.content || []).find((b) => b.type === "resource_link");
  await step("resource_read", () => c.readResource({ uri: link ? link.uri : "codexec://artifacts/none" }));
  await step("resource_missing", () =>
    c.readResource({ uri: "codexec://artifacts/00000000-0000-0000-0000-000000000000" }));
  await step("artifacts", () => c.callTool({ name: "list_artifacts", arguments: {} }));
  const art = ((out.artifacts.structuredContent || {}).artifacts || [])[0];
  await step("download_link", () =>
    c.callTool({ name: "get_download_link", arguments: { artifact_id: art ? art.artifact_id : "x" } }));
  // progress: notifications/progress on the call's event stream, before its end
  await step("progress", async () => {
    const events = [];
    const t0 = Date.now();
    const r = await run(c, 'import time\nfor i in range(3):\n    print("tick", i, flush=True)\n    time.sleep(1)',
      {}, { onprogress: (p) => events.push({ ms: Date.now() - t0, ...p }), resetTimeoutOnProgress: true });
    return { events, end_ms: Date.now() - t0, text: r.content[0].text };
  });
  // cancellation: the SDK aborts and sends notifications/cancelled
  await step("cancel", async () => {
    const ac = new AbortController();
    const t0 = Date.now();
    setTimeout(() => ac.abort("the user stopped it"), 1500);
    try {
      await run(c, "import time\ntime.sleep(60)\nprint('not cancelled')", {}, { signal: ac.signal });
      return { rejected: false, ms: Date.now() - t0 };
    } catch (e) {
      return { rejected: true, ms: Date.now() - t0, message: String(e.message || e) };
    }
  });
  // the next call, as a client that honours Retry-After: the cancelled run
  // may hold the user's last run slot for a moment (a 429 too_many_runs)
  await step("after_cancel", async () => {
    const t0 = Date.now();
    for (let i = 0; ; i++) {
      try {
        const r = await run(c, 'print("after")');
        return { ms: Date.now() - t0, result: r, refused: i };
      } catch (e) {
        const code = (e.data && e.data.code) || "";
        // a JSON-RPC error (its data codexec's code), never a broken transport
        if (i >= 10 || code !== "too_many_runs") throw e;
        await new Promise((ok) => setTimeout(ok, 1000));
      }
    }
  });
  await step("reset", () => c.callTool({ name: "reset_session", arguments: {} }));
  await step("after_reset", () => run(c, "print('x' in dir())"));
  await step("terminate", async () => {
    await t.terminateSession();
    return { session_id: t.sessionId === undefined ? null : t.sessionId };
  });
  await step("after_delete", async () => {
    const [c2] = await connect({ sessionId: out.session_id });
    return await c2.listTools();
  });
  await c.close();
}

// An MCP session, as another key would try to use it (extra: its id).
async function foreign() {
  await step("use", async () => {
    const [c] = await connect({ sessionId: extra });
    return await c.listTools();
  });
}

// A session's id for the test to attack with raw HTTP.
async function open() {
  const [c, t] = await connect();
  out.session_id = t.sessionId;
  await step("text", () => run(c, "print('open')"));
  await c.close();
}

// run_code in JavaScript and R (extra: a conversation id prefix).
async function languages() {
  const [c] = await connect();
  await step("js", () => run(c, "const y = 6 * 7;\nconsole.log(y);", { language: "javascript", conversation_id: `${extra}-js` }));
  await step("js_state", () => run(c, "y + 1", { language: "javascript", conversation_id: `${extra}-js` }));
  await step("r", () => run(c, 'cat(6 * 7, "\\n")', { language: "r", conversation_id: `${extra}-r` }));
  await step("r_plot", () => run(c, "plot(1:3)", { language: "r", conversation_id: `${extra}-r` }));
  await step("r_error", () => run(c, 'stop("nope")', { language: "r", conversation_id: `${extra}-r` }));
  await step("mismatch", () => run(c, "print(1)", { conversation_id: `${extra}-r` }));
  await c.close();
}

const scenarios = { flow, foreign, open, languages };
try {
  await scenarios[scenario]();
} catch (e) {
  out.fatal = String(e && e.stack ? e.stack : e);
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
