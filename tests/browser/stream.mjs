// Reads a streaming run in Debian's Chromium (headless) with fetch(), using
// the reader docs/api.md documents. Input: one JSON argument {base, key,
// reader, code, cid}. Output: one JSON line {events: [[ms, name, data]...]}.
import { launchChromium } from './launch.mjs';

const cfg = JSON.parse(process.argv[2]);
const browser = await launchChromium();
const out = {};
try {
  const page = await browser.newPage();
  await page.goto(cfg.base + '/v1/health'); // the API's origin: fetch() is same-origin
  out.events = await page.evaluate(`(async () => {
    ${cfg.reader}
    const events = [];
    await runStreaming(${JSON.stringify(cfg.code)}, ${JSON.stringify(cfg.cid)},
                       ${JSON.stringify(cfg.key)},
                       (name, data) => events.push([performance.now(), name, data]));
    return events;
  })()`);
} catch (e) {
  out.error = String(e && e.stack || e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
