// Open an `otel-titan report` HTML file in headless Chromium, offline, and say what rendered.
// Usage: node report_page.js FILE.html CHROMIUM [SCREENSHOT.png]
// Prints one JSON object: console errors, page errors, every request other than the file itself (all
// aborted: the report must need none), per figure the number of drawn plot elements, and the time from
// navigation to the last figure drawn, and what a reader sees (text, marks, axes, traces; see below). Used by tests/analysis/report/test_write.py, which kills the browser tree.
'use strict';
const puppeteer = require('puppeteer-core');
const {pathToFileURL} = require('url');

async function main() {
  const [file, chromium, screenshot] = process.argv.slice(2);
  const url = pathToFileURL(file).href;
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--window-size=1400,900'],
    defaultViewport: {width: 1400, height: 900},
  });
  const result = {console_errors: [], page_errors: [], requests: [], figures: [], load_ms: null};
  try {
    const page = await browser.newPage();
    page.on('console', (msg) => { if (msg.type() === 'error') result.console_errors.push(msg.text()); });
    page.on('pageerror', (error) => result.page_errors.push(String(error)));
    await page.setRequestInterception(true);
    page.on('request', (request) => {
      const target = request.url();
      // The file itself, and what the page builds in memory (Plotly draws a heatmap as a data: image) are not network requests.
      if (target === url || target.startsWith('data:') || target.startsWith('blob:')) { request.continue(); return; }
      result.requests.push(target.slice(0, 200));
      request.abort();
    });
    const started = Date.now();
    await page.goto(url, {waitUntil: 'load', timeout: 60000});
    await page.waitForFunction(() => {
      const divs = Array.from(document.querySelectorAll('div.plotly-graph-div'));
      return divs.length > 0 && divs.every((d) => d._fullLayout && d.querySelector('.main-svg'));
    }, {timeout: 60000, polling: 50});
    result.load_ms = Date.now() - started;
    result.figures = await page.evaluate(() => Array.from(document.querySelectorAll('div.plotly-graph-div')).map((d) => ({
      id: d.id,
      traces: d._fullData ? d._fullData.length : 0,
      // Drawn marks: heatmap images, boxes, lines/points, bars (each is inside a .trace group of its layer).
      drawn: d.querySelectorAll('.heatmaplayer image, .boxlayer .trace path, .scatterlayer .trace path, .scatterlayer .point, .barlayer .point path').length,
      title: (d.querySelector('.gtitle') || {}).textContent || '',
      // A heatmap's matrix as drawn (rows x columns), to check the binning.
      rows: d._fullData && d._fullData[0] && d._fullData[0].type === 'heatmap' ? d._fullData[0].z.length : null,
      cols: d._fullData && d._fullData[0] && d._fullData[0].type === 'heatmap' ? d._fullData[0].z[0].length : null,
      zmax: d._fullData && d._fullData[0] && d._fullData[0].type === 'heatmap'
        ? Math.max(...Array.from(d._fullData[0].z, (row) => Math.max(...Array.from(row).filter((v) => v === v)))) : null,
      width: d.getBoundingClientRect().width,
      height: d.getBoundingClientRect().height,
    })));
    result.sections = await page.evaluate(() => Array.from(document.querySelectorAll('h2')).map((h) => h.textContent));
    // What a reader sees, for the checks of tests/analysis/report/test_write.py: the page's text and every text the figures
    // draw (axis labels, marks), the ranks the page marks as named, whether anything injected ran, sideways scrolling,
    // and per figure its axes (type, range, tick labels as drawn) and traces (type, colours, points drawn).
    Object.assign(result, await page.evaluate(() => ({
      title: document.title,
      pwned: typeof window.pwned === 'undefined' ? null : String(window.pwned),
      text: document.body.innerText,
      svg_text: Array.from(document.querySelectorAll('svg text')).map((t) => t.textContent).join('\n'),
      named_ranks: Array.from(document.querySelectorAll('.named-rank')).map((e) => [e.dataset.source, Number(e.dataset.rank)]),
      scroll_width: document.documentElement.scrollWidth,
      client_width: document.documentElement.clientWidth,
      table_headers: Array.from(document.querySelectorAll('th')).map((th) => th.textContent),
      axes: Object.fromEntries(Array.from(document.querySelectorAll('div.plotly-graph-div')).map((d) => [d.id, {
        x: {type: d._fullLayout.xaxis.type, range: d._fullLayout.xaxis.range, ticks: Array.from(d.querySelectorAll('.xtick text')).map((t) => t.textContent)},
        y: {type: d._fullLayout.yaxis.type, range: d._fullLayout.yaxis.range, ticks: Array.from(d.querySelectorAll('.ytick text')).map((t) => t.textContent)},
        traces: d._fullData.map((t) => ({type: t.type, name: t.name, mode: t.mode || null, boxpoints: t.boxpoints || null,
          color: t.marker && typeof t.marker.color === 'string' ? t.marker.color : null,
          line_color: t.line && typeof t.line.color === 'string' ? t.line.color : null,
          points: t.y ? t.y.length : 0, text: Array.isArray(t.text) ? t.text : null})),
        box_points_drawn: d.querySelectorAll('.boxlayer .trace .point').length,
      }])),
    })));
    if (screenshot) {
      await page.setViewport({width: 1400, height: 900});
      await page.screenshot({path: screenshot, fullPage: true});
    }
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(result) + '\n');
}

main().catch((error) => { process.stderr.write(String(error && error.stack || error) + '\n'); process.exit(1); });
