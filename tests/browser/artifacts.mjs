// Drives Debian's Chromium (headless) through codexec's download surface.
// Input: one JSON argument {base, key, link, page}. Output: one JSON line.
import { launchChromium } from './launch.mjs';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';

const cfg = JSON.parse(process.argv[2]);
const browser = await launchChromium();
const out = {};
const sha = (p) => createHash('sha256').update(readFileSync(p)).digest('hex');

try {
  // 1. A signed link in a chat answer: clicked without any header.
  const plain = await browser.newContext({ acceptDownloads: true });
  const p1 = await plain.newPage();
  await p1.goto(cfg.base + '/v1/health');
  await p1.setContent(`<a id="l" href="${cfg.link}">report</a>`);
  const [d1] = await Promise.all([p1.waitForEvent('download'), p1.click('#l')]);
  out.link = { name: d1.suggestedFilename(), sha256: sha(await d1.path()) };

  // 2. The artifacts page, authenticated like an API client.
  const authed = await browser.newContext({
    acceptDownloads: true,
    extraHTTPHeaders: { Authorization: 'Bearer ' + cfg.key },
  });
  const p2 = await authed.newPage();
  const resp = await p2.goto(cfg.page);
  out.page_status = resp.status();
  out.page_csp = resp.headers()['content-security-policy'];
  await p2.waitForLoadState('networkidle');
  out.image = await p2.$eval('img.preview', (i) => ({ w: i.naturalWidth, h: i.naturalHeight }));
  out.title = await p2.title();
  const shot = await p2.locator('img.preview').screenshot();
  // Decode the screenshot with the browser itself, on a page without CSP.
  const p3 = await plain.newPage();
  out.pixel = await p3.evaluate(async (b64) => {
    const img = new Image();
    img.src = 'data:image/png;base64,' + b64;
    await img.decode();
    const c = document.createElement('canvas');
    c.width = img.width; c.height = img.height;
    const g = c.getContext('2d');
    g.drawImage(img, 0, 0);
    const d = g.getImageData(Math.floor(img.width / 2), Math.floor(img.height / 2), 1, 1).data;
    return [d[0], d[1], d[2]];
  }, shot.toString('base64'));
  // 3. The page's download links download.
  const links = await p2.$$eval('a[download]', (as) => as.map((a) => a.textContent));
  out.links = links;
  const [d2] = await Promise.all([p2.waitForEvent('download'), p2.click('a[download] >> nth=0')]);
  out.page_download = { name: d2.suggestedFilename(), sha256: sha(await d2.path()) };
  // 4. An HTML artifact opened by navigation never renders.
  if (cfg.html) {
    const p4 = await plain.newPage();
    let rendered = false;
    p4.on('dialog', async (d) => { rendered = true; await d.dismiss(); });
    const dl = p4.waitForEvent('download', { timeout: 10000 }).then(() => true, () => false);
    await p4.goto(cfg.html).catch(() => {});
    out.html_downloaded = await dl;
    out.html_rendered = rendered;
  }
} catch (e) {
  out.error = String(e && e.stack || e);
}
await browser.close();
console.log(JSON.stringify(out));
