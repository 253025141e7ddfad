// Opens stormglass' built-in page in headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core), waits until it has drawn the report, saves a screenshot, and prints what
// it drew and every console error, failed request or page error as JSON. Driven by
// tests/demo.rs.
// Usage: node page.mjs URL SCREENSHOT.png
import { chromium } from "playwright-core";

const [url, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  chromiumSandbox: false,
  // Without these, Chromium keeps reaching for Google's hosts and stalls on a closed network.
  args: ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
const errors = [];
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("console", (m) => { if (m.type() === "error") errors.push(`console: ${m.text()}`); });
  page.on("pageerror", (e) => errors.push(`page: ${e}`));
  page.on("requestfailed", (r) => errors.push(`request failed: ${r.url()}`));
  await page.goto(url);
  await page.waitForSelector("body[data-loaded=true]", { timeout: 30000 });
  const services = await page.$$eval("svg .node", (ns) => ns.map((n) => n.dataset.service));
  const edges = await page.$$eval("svg path.edge", (es) =>
    es.map((e) => ({ caller: e.dataset.caller, callee: e.dataset.callee, stroke: e.getAttribute("stroke") })));
  const alerts = await page.$$eval("#alerts tbody tr", (rs) => rs.length);
  const listing = await page.$eval("#listing", (l) => l.textContent);
  const trace_links = await page.$$eval("#findings tbody a", (as) => as.map((a) => a.href));
  const advice = await page.$$eval("#advice tbody tr", (rs) =>
    rs.map((r) => ({ edge: r.cells[0].textContent, attempts: r.cells[3].textContent })));
  const advice_layers = await page.$$eval("#advice-layers tbody tr", (rs) => rs.length);
  // The what-if control: the first service failing always.
  const failed = await page.$eval("#whatif select", (s) => s.value);
  await page.fill("#whatif input[name=p]", "1");
  await page.click("#whatif button");
  await page.waitForSelector("#whatif-layers tbody tr", { timeout: 10000 });
  const whatif = await page.$$eval("#whatif-layers tbody tr", (rs) =>
    rs.map((r) => ({ service: r.cells[0].textContent, amplification: parseFloat(r.cells[1].textContent) })));
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify({ errors, services, edges, alerts, listing, trace_links, failed, whatif, advice, advice_layers }));
} finally {
  await browser.close();
}
