#!/usr/bin/env node
// Opens cudatrace exports in the Perfetto UI (a local copy, served from 127.0.0.1) in headless
// Chromium and takes screenshots of what a user sees: the whole run with its device-memory
// counter, a kernel launch selected with its arguments and its arrow to the synchronisation,
// the synchronisation with the launches that arrive at it.
//
//   node screenshots.mjs --ui WEB_DIST --playwright DIR [--chromium PATH] --out DIR EXPORT...
//
// WEB_DIST is the UI fetch_ui.py unpacks; DIR holds node_modules/playwright-core (npm install
// --prefix DIR playwright-core@1.65.1); EXPORT is a `cudatrace export` file (.json or
// .pftrace) of a trace with launches synchronised by cuStreamSynchronize (the stand-in demo).
// screenshots.sh does all of that. Writes OUT/NAME-{timeline,launch,sync}.png and prints,
// per export, what the UI's own trace processor loaded (slices, flows, counter values).
// Exits 1 if the UI shows an error or loads nothing.

import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { createRequire } from 'node:module';

function usage(message) {
  if (message) process.stderr.write(`screenshots: ${message}\n`);
  process.stderr.write(
    'usage: node screenshots.mjs --ui WEB_DIST --playwright DIR [--chromium PATH] --out DIR EXPORT...\n');
  process.exit(2);
}

const options = { chromium: '/usr/bin/chromium', exports: [] };
for (let i = 2; i < process.argv.length; i++) {
  const arg = process.argv[i];
  const value = () => process.argv[++i] ?? usage(`${arg} needs a value`);
  if (arg === '--ui') options.ui = path.resolve(value());
  else if (arg === '--playwright') options.playwright = path.resolve(value());
  else if (arg === '--chromium') options.chromium = value();
  else if (arg === '--out') options.out = path.resolve(value());
  else if (arg.startsWith('-')) usage(`unknown flag ${arg}`);
  else options.exports.push(path.resolve(arg));
}
if (!options.ui || !options.playwright || !options.out || options.exports.length === 0) usage();
const { chromium } = createRequire(path.join(options.playwright, 'node_modules/'))('playwright-core');
fs.mkdirSync(options.out, { recursive: true });

// The UI and the exports from one local origin: the UI's content security policy allows
// fetching from its own origin (and http://127.0.0.1:*), so `#!/?url=` can name the export.
const TYPES = {
  '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.json': 'application/json',
  '.wasm': 'application/wasm', '.woff2': 'font/woff2', '.png': 'image/png',
};
const served = new Map(options.exports.map((file) => [`/trace/${path.basename(file)}`, file]));
const server = http.createServer((request, response) => {
  const { pathname } = new URL(request.url, 'http://localhost');
  let file = served.get(pathname);
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

// A fresh profile each run (Playwright's own temporary user data dir), nothing from the network.
const browser = await chromium.launch({
  executablePath: options.chromium,
  headless: true,
  args: [
    '--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run',
  ],
});

// Runs SQL in the UI's own trace processor; rows as objects (bigints as numbers).
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

// Moves the details panel's top edge to `y` (it opens a few hundred pixels tall).
async function panelTop(page, y) {
  const tab = await page.getByText('Current Selection', { exact: true }).first().boundingBox();
  if (!tab) return;
  await page.mouse.move(tab.x + 400, tab.y + tab.height / 2);
  await page.mouse.down();
  await page.mouse.move(tab.x + 400, y, { steps: 8 });
  await page.mouse.up();
}

let failed = false;
for (const file of options.exports) {
  const name = path.basename(file).replace(/\./g, '-');
  const page = await browser.newPage({ viewport: { width: 1400, height: 1060 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(`${origin}/#!/?url=${origin}/trace/${path.basename(file)}`);
  try {
    await page.waitForFunction(
      () => window.app?.trace?.engine !== undefined && !window.app.isLoadingTrace,
      undefined, { timeout: 120_000 });
  } catch (e) {
    await page.screenshot({ path: path.join(options.out, `${name}-failed.png`) });
    process.stderr.write(`screenshots: ${file} did not load: ${e.message}\n${errors.join('\n')}\n`);
    failed = true;
    await page.close();
    continue;
  }
  // No sidebar; every process group open (the UI folds them when there are several).
  await page.evaluate(() => {
    if (window.app.sidebar.visible) window.app.sidebar.toggleVisibility();
    for (const node of window.app.trace.workspace.flatTracks) node.expand();
  });
  const [loaded] = await query(page,
    'select (select count(*) from slice) slices, (select count(*) from flow) flows, ' +
    '(select count(*) from counter) counter_values, (select count(*) from thread_track) thread_tracks');
  process.stdout.write(`${JSON.stringify({ export: file, ui: loaded })}\n`);
  if (!loaded.slices) failed = true;

  // 1. The whole run, the pointer on the device-memory counter at its peak.
  await page.waitForTimeout(500);
  const memory = await page.getByText(/^device memory/).first().boundingBox();
  const [peak] = await query(page,
    'select c.ts, (select min(ts) from slice) t0, (select max(ts + dur) from slice) t1 from counter c ' +
    'order by c.value desc, c.ts limit 1');
  if (memory) {
    const timeline = await page.locator('canvas').first().boundingBox();
    const left = 255; // the track names' column, left of the time axis
    const span = await page.evaluate(() => {
      const w = window.app.trace.timeline.visibleWindow;
      return [Number(w.start.integral), Number(w.end.integral)];
    });
    const x = timeline.x + left + ((peak.ts - span[0]) / (span[1] - span[0])) * (timeline.width - left);
    await page.mouse.move(x + 4, memory.y + memory.height / 2);
  }
  await page.waitForTimeout(500);
  // Down to just below the last track: the rest is empty.
  const bottom = await page.evaluate(() => Math.max(
    ...[...document.querySelectorAll('.pf-track__shell')].map((e) => e.getBoundingClientRect().bottom)));
  const clip = { x: 0, y: 0, width: 1400, height: Math.min(1060, Math.ceil(bottom + 24)) };
  await page.screenshot({ path: path.join(options.out, `${name}-timeline.png`), clip });

  // 2. The last batch and the clean-up: a launch selected (its arguments, its arrow to the
  //    synchronisation), the device memory falling as buffers are freed.
  const syncs = await query(page,
    "select id, ts, dur from slice where name = 'cuStreamSynchronize' and " +
    "id in (select slice_in from flow) order by ts");
  if (syncs.length === 0) {
    process.stderr.write(`screenshots: ${file}: no synchronisation with flows\n`);
    failed = true;
    await page.close();
    continue;
  }
  const sync = syncs[syncs.length - 1];
  const launches = await query(page,
    `select s.id, s.ts, s.dur from flow f join slice s on f.slice_out = s.id ` +
    `where f.slice_in = ${sync.id} order by s.ts`);
  const [end] = await query(page, 'select max(ts + dur) t from slice');
  const launch = launches[Math.min(1, launches.length - 1)];
  await page.evaluate(([start, stop, id]) => {
    window.app.trace.timeline.setViewportTime(BigInt(start), BigInt(stop));
    window.app.trace.selection.selectSqlEvent('slice', id, { switchToCurrentSelectionTab: true });
  }, [launches[0].ts - 20_000, end.t + 20_000, launch.id]);
  await page.waitForTimeout(1000);
  await panelTop(page, 330);
  await page.waitForTimeout(700);
  await page.mouse.move(5, 5);
  await page.screenshot({ path: path.join(options.out, `${name}-launch.png`) });

  // 3. The synchronisation: the launches that arrive at it (preceding flows).
  await page.evaluate((id) => {
    window.app.trace.selection.selectSqlEvent('slice', id, { switchToCurrentSelectionTab: true });
  }, sync.id);
  await page.waitForTimeout(1000);
  await page.screenshot({ path: path.join(options.out, `${name}-sync.png`) });

  const dialogs = await page.locator('.pf-modal-dialog, #app_load_failure:visible').count();
  if (errors.length || dialogs) {
    process.stderr.write(`screenshots: ${file}: the UI reported errors: ${errors.join('; ')}\n`);
    failed = true;
  }
  await page.close();
}

await browser.close();
server.close();
process.exit(failed ? 1 : 0);
