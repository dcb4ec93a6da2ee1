// The TypeScript client (clients/typescript, built to dist/) against a live
// codexec: run by tests/system/test_clients.py as
// `node flow.mjs URL KEY SVC_KEY`. Prints one JSON object of what each step
// saw; the test holds it to what it should be.
import { Codexec, CodexecError } from "../../clients/typescript/dist/index.js";

const [url, key, svc, slotsArg] = process.argv.slice(2);
const slots = Number(slotsArg);
const out = {};
const cx = new Codexec({ url, apiKey: key });
const cid = "ts-client-" + Math.random().toString(16).slice(2, 10);

async function step(name, fn) {
  try {
    out[name] = await fn();
  } catch (e) {
    if (!(e instanceof CodexecError)) throw e;
    out[name] = { error: { code: e.code, status: e.status, message: e.message, retryAfter: e.retryAfter } };
  }
}

const collect = async (it) => {
  const evs = [];
  for await (const ev of it) evs.push([ev.event, ev.data]);
  return evs;
};

await step("run", () => cx.run({ code: "x = 6 * 7\nprint(x)", conversationId: cid }));
// the other languages: a session opened in R, a JavaScript main() with arguments
await step("languages", async () => [
  (await cx.sessions.create(cid + "-lang-r", { language: "r" })).language,
  (await cx.run({ code: 'x <- 6 * 7\ncat(x, "\\n")', conversationId: cid + "-lang-r", language: "r" })).stdout_tail,
  (await cx.run({ code: "const main = async (a) => a.n * 2;", conversationId: cid + "-lang-js", language: "javascript", arguments: { n: 21 } })).result,
]);
// RAGFlow's shape: main(**arguments), the arguments as data
await step("arguments", () => cx.run({ code: "def main(a, b, c):\n    return [a, b, c]", conversationId: cid, arguments: { a: null, b: true, c: false } }));
// DocsGPT's: a kernel the code killed comes back empty, the files stay
await step("reset", async () => {
  await cx.files.write(cid, "keep.txt", "kept");
  const died = await cx.run({ code: "import os\nos._exit(1)", conversationId: cid });
  const after = await cx.run({ code: "print('x' in dir(), open('keep.txt').read())", conversationId: cid });
  return [null, died, after];
});
await step("stream", () => collect(cx.stream({ code: "import time\nfor i in range(2):\n    print(i, flush=True)\n    time.sleep(0.3)", conversationId: cid })));
await step("detached", async () => {
  const a = await cx.run({ code: "import time\ntime.sleep(1)\nprint('late')", conversationId: cid, wait: false });
  const record = await cx.wait(a.run_id, { timeoutMs: 60000 });
  const events = (await collect(cx.events(a.run_id))).map((e) => e[0]);
  return { accepted: a, record, events };
});
await step("cancel", async () => {
  const a = await cx.run({ code: "import time\ntime.sleep(30)", conversationId: cid, wait: false });
  await new Promise((r) => setTimeout(r, 500));
  const c = await cx.cancel(a.run_id);
  return { cancel: c, record: await cx.wait(a.run_id, { timeoutMs: 30000 }) };
});
await step("write", () => cx.files.write(cid, "data/in.csv", "a,b\n1,2\n"));
await step("write_bytes", () => cx.files.write(cid, "big.bin", new Uint8Array(3 << 20).fill(122)));
await step("read", async () => new TextDecoder().decode(await cx.files.read(cid, "data/in.csv")));
await step("list", async () => (await cx.files.list(cid, "", { recursive: true })).map((f) => f.path).sort());
await step("code_sees", async () => (await cx.run({ code: "print(open('/mnt/data/data/in.csv').read(), len(open('big.bin','rb').read()))", conversationId: cid })).stdout_tail);
await step("delete", () => cx.files.delete(cid, "data", { recursive: true }));
await step("after_delete", async () => (await cx.files.list(cid, "", { recursive: true })).map((f) => f.path).sort());
await step("missing", () => cx.files.read(cid, "nope.txt"));
await step("bad_cid", () => cx.run({ code: "1", conversationId: "no spaces allowed" }));
await step("chart", () => cx.run({ code: "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.savefig('chart.png')", conversationId: cid }));
await step("artifacts", async () => (await cx.artifacts.list(cid)).map((a) => a.path));
await step("downloads", async () => {
  const art = (await cx.artifacts.list(cid)).find((a) => a.path === "chart.png");
  const data = await cx.artifacts.download(art.artifact_id);
  const link = await cx.artifacts.link(art.artifact_id, { expiresIn: 60 });
  const linked = new Uint8Array(await (await fetch(link.url)).arrayBuffer()); // a browser: no key
  return { png: data[0] === 0x89 && data[1] === 0x50, link_url: link.url, link_same: Buffer.compare(Buffer.from(linked), Buffer.from(data)) === 0 };
});
await step("session_create", () => cx.sessions.create(cid + "-s", { ttl: 120 }));
await step("session_get", () => cx.sessions.get(cid + "-s"));
await step("sessions", async () => (await cx.sessions.list()).map((s) => s.conversation_id));
await step("session_close", () => cx.sessions.close(cid + "-s"));
await step("session_gone", () => cx.sessions.get(cid + "-s"));
await step("ttl", async () => {
  await cx.sessions.create(cid + "-t", { ttl: 1 });
  const deadline = Date.now() + 30000;
  while (Date.now() < deadline) {
    try {
      await cx.sessions.get(cid + "-t");
    } catch (e) {
      return { expired: e.status };
    }
    await new Promise((r) => setTimeout(r, 500));
  }
  return { expired: null };
});
await step("retry", async () => {
  const busy = [];
  for (let i = 0; i < slots; i++) busy.push(await cx.run({ code: "import time\ntime.sleep(30)", conversationId: `${cid}-busy`, wait: false }));
  let refused = null;
  try {
    await new Codexec({ url, apiKey: key, retries: 0 }).run({ code: "1", conversationId: cid + "-r0" });
  } catch (e) {
    refused = { code: e.code, status: e.status, retryAfter: e.retryAfter };
  }
  const t0 = Date.now();
  for (const b of busy) await cx.cancel(b.run_id).catch(() => undefined); // the slots freed
  const r = await new Codexec({ url, apiKey: key, retries: 15 }).run({ code: "print('through')", conversationId: cid + "-r" });
  for (const b of busy) await cx.wait(b.run_id, { timeoutMs: 60000 });
  return { refused, stdout: r.stdout_tail, waited: (Date.now() - t0) / 1000 };
});
const alice = new Codexec({ url, apiKey: svc, onBehalfOf: "alice" });
await step("on_behalf", async () => (await alice.run({ code: "open('secret.txt', 'w').write('a'); print('alice')", conversationId: "shared" })).stdout_tail);
await step("alice_reads", async () => new TextDecoder().decode(await alice.files.read("shared", "secret.txt")));
await step("bob_cannot", () => new Codexec({ url, apiKey: svc, onBehalfOf: "bob" }).files.read("shared", "secret.txt"));
process.stdout.write(JSON.stringify(out) + "\n");
