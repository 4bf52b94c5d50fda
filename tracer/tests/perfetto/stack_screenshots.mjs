#!/usr/bin/env node
// Opens a `--stacks` trace's Perfetto export in the Perfetto UI (a local copy, served from
// 127.0.0.1) in headless Chromium and takes a screenshot of each thread's flame graphs: its
// calls' ("THREAD Callstacks TID") and, with `--gpu`, its GPU time's ("GPU time of tid T ...").
//
//   node stack_screenshots.mjs --ui WEB_DIST --playwright DIR [--chromium PATH] --out DIR EXPORT
//
// As screenshots.mjs (stack_screenshots.sh does the setup). Writes OUT/NAME-calls.png and
// OUT/NAME-gpu-time.png: the area of the thread's callstacks track selected over the whole
// trace, "Perf Sample Flamegraph" open below. Prints what the UI's trace processor loaded
// (perf samples, frames, callsites). Exits 1 if the UI shows an error or has no samples.

import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { createRequire } from 'node:module';

function usage(message) {
  if (message) process.stderr.write(`stack_screenshots: ${message}\n`);
  process.stderr.write(
    'usage: node stack_screenshots.mjs --ui WEB_DIST --playwright DIR [--chromium PATH] --out DIR EXPORT\n');
  process.exit(2);
}

const options = { chromium: '/usr/bin/chromium' };
for (let i = 2; i < process.argv.length; i++) {
  const arg = process.argv[i];
  const value = () => process.argv[++i] ?? usage(`${arg} needs a value`);
  if (arg === '--ui') options.ui = path.resolve(value());
  else if (arg === '--playwright') options.playwright = path.resolve(value());
  else if (arg === '--chromium') options.chromium = value();
  else if (arg === '--out') options.out = path.resolve(value());
  else if (arg.startsWith('-')) usage(`unknown flag ${arg}`);
  else options.export = path.resolve(arg);
}
if (!options.ui || !options.playwright || !options.out || !options.export) usage();
const { chromium } = createRequire(path.join(options.playwright, 'node_modules/'))('playwright-core');
fs.mkdirSync(options.out, { recursive: true });

const TYPES = {
  '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.json': 'application/json',
  '.wasm': 'application/wasm', '.woff2': 'font/woff2', '.png': 'image/png',
};
const tracePath = `/trace/${path.basename(options.export)}`;
const server = http.createServer((request, response) => {
  const { pathname } = new URL(request.url, 'http://localhost');
  let file = pathname === tracePath ? options.export : null;
  if (!file) {
    const relative = pathname === '/' ? 'index.html' : decodeURIComponent(pathname).slice(1);
    file = path.join(options.ui, relative);
    if (!file.startsWith(options.ui + path.sep)) file = null;
  }
  if (!file || !fs.existsSync(file) || !fs.statSync(file).isFile()) {
    response.writeHead(404).end();
    return;
  }
  response.writeHead(200, { 'content-type': TYPES[path.extname(file)] ?? 'application/octet-stream' });
  fs.createReadStream(file).pipe(response);
});
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const origin = `http://127.0.0.1:${server.address().port}`;

const browser = await chromium.launch({
  executablePath: options.chromium,
  headless: true,
  args: [
    '--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run',
  ],
});

async function query(page, sql) {
  return page.evaluate(async (sql) => {
    const result = await window.app.trace.engine.query(sql);
    const columns = result.columns();
    const rows = [];
    for (const it = result.iter({}); it.valid(); it.next()) {
      const row = {};
      for (const c of columns) {
        const v = it.get(c);
        row[c] = typeof v === 'bigint' ? Number(v) : v;
      }
      rows.push(row);
    }
    return rows;
  }, sql);
}

let failed = false;
const name = path.basename(options.export).replace(/\./g, '-');
const page = await browser.newPage({ viewport: { width: 1400, height: 1060 } });
const errors = [];
page.on('pageerror', (e) => errors.push(e.message));
await page.goto(`${origin}/#!/?url=${origin}${tracePath}`);
await page.waitForFunction(
  () => window.app?.trace?.engine !== undefined && !window.app.isLoadingTrace,
  undefined, { timeout: 120_000 });
await page.evaluate(() => {
  if (window.app.sidebar.visible) window.app.sidebar.toggleVisibility();
  for (const node of window.app.trace.workspace.flatTracks) node.expand();
});
const [loaded] = await query(page,
  'select (select count(*) from perf_sample) perf_samples, ' +
  '(select count(*) from stack_profile_frame) frames, ' +
  '(select count(*) from stack_profile_callsite) callsites');
process.stdout.write(`${JSON.stringify({ export: options.export, ui: loaded })}\n`);
if (!loaded.perf_samples) failed = true;

// Threads with samples: the calls' (real tids) first, then the GPU time's (tid >= 2^30).
const threads = await query(page,
  'select distinct t.utid, t.upid, t.tid, t.name from perf_sample s join thread t using (utid) ' +
  'order by t.tid >= 1073741824, t.tid limit 4');
const pick = (gpu) => threads.find((t) => (t.tid >= 1073741824) === gpu);
for (const [label, thread] of [['calls', pick(false)], ['gpu-time', pick(true)]]) {
  if (!thread) continue;
  const uri = `/process_${thread.upid}/thread_${thread.utid}_perf_samples_profile`;
  await page.evaluate((uri) => {
    const trace = window.app.trace;
    trace.selection.selectArea({ start: trace.traceInfo.start, end: trace.traceInfo.end, trackUris: [uri] });
    const node = trace.workspace.getTrackByUri(uri);
    node?.reveal?.();
  }, uri);
  await page.waitForTimeout(1500);
  const tab = page.getByText('Perf Sample Flamegraph', { exact: true }).first();
  if (await tab.count()) await tab.click();
  await page.waitForTimeout(1000);
  // A deep flame graph (more than 12 frames) gets the lower two thirds: drag the
  // panel's top edge up.
  const [{ depth }] = await query(page, 'select max(depth) depth from stack_profile_callsite');
  const panel = await page.getByText('Current Selection', { exact: true }).first().boundingBox();
  if (panel && panel.y > 420 && depth >= 12) {
    await page.mouse.move(panel.x + 400, panel.y + panel.height / 2);
    await page.mouse.down();
    await page.mouse.move(panel.x + 400, 400, { steps: 8 });
    await page.mouse.up();
  }
  await page.waitForTimeout(1000);
  await page.mouse.move(5, 5);
  await page.screenshot({ path: path.join(options.out, `${name}-${label}.png`) });
  process.stdout.write(`${JSON.stringify({ shot: `${name}-${label}.png`, thread })}\n`);
}

const dialogs = await page.locator('.pf-modal-dialog, #app_load_failure:visible').count();
if (errors.length || dialogs) {
  process.stderr.write(`stack_screenshots: the UI reported errors: ${errors.join('; ')}\n`);
  failed = true;
}
await browser.close();
server.close();
process.exit(failed ? 1 : 0);
