#!/usr/bin/env node
// Perfetto's trace processor (the WebAssembly build the Perfetto UI runs) under Node: loads a
// trace the way the UI does and answers SQL queries, so tests check cudatrace's exports with
// the viewer's own parser.
//
//   node trace_processor.mjs --engine DIR TRACE [SQL...]      (Node.js 18 or newer)
//
// DIR holds the UI's engine_bundle.js and trace_processor.wasm (fetch_ui.py puts them there).
// Prints one JSON object on stdout:
//   {"trace", "bytes", "wasm", "queries": [{"sql", "columns", "rows"}], "stats_problems": [...]}
// Exit codes: 0 loaded, every query answered, no error or data-loss statistic;
//             1 the trace processor rejected the trace (parse error, incomplete file);
//             2 usage, or the engine could not start;
//             3 loaded, but `stats` has error or data-loss entries (listed in stats_problems);
//             4 a query failed.
//
// How it runs: engine_bundle.js is the UI's web worker. It is run here in a `vm` context that
// looks like a worker (self, WorkerGlobalScope, a synchronous XMLHttpRequest that reads the
// wasm from DIR). The worker's first message is a MessagePort; the bytes sent on that port
// are Perfetto's TraceProcessorRpcStream (protos/perfetto/trace_processor/trace_processor.proto),
// and the replies come back on it synchronously.

import { webcrypto } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import vm from 'node:vm';

const EXIT = { ok: 0, rejected: 1, usage: 2, stats: 3, query: 4 };

// TraceProcessorRpc fields and methods (trace_processor.proto).
const RPC = {
  seq: 1,
  fatalError: 5,
  request: 2,
  response: 3,
  invalidRequest: 4,
  appendTraceData: 101,
  queryArgs: 103,
  appendResult: 201,
  queryResult: 203,
  finalizeDataResult: 212,
};
const METHOD = { append: 1, finalize: 2, query: 3 };
// QueryResult.CellsBatch.CellType
const CELL = { null: 1, varint: 2, float64: 3, string: 4, blob: 5 };
// Trace bytes per TPM_APPEND_TRACE_DATA request (the UI sends the file in pieces too).
const APPEND_CHUNK = 16 << 20;

function fail(code, message) {
  process.stderr.write(`trace_processor: ${message}\n`);
  process.exit(code);
}

// ---- protobuf wire format: just what the RPC needs ----

class Writer {
  constructor() {
    this.parts = [];
  }
  varint(value) {
    let v = BigInt(value);
    const bytes = [];
    do {
      let byte = Number(v & 0x7fn);
      v >>= 7n;
      if (v !== 0n) byte |= 0x80;
      bytes.push(byte);
    } while (v !== 0n);
    this.parts.push(Uint8Array.from(bytes));
    return this;
  }
  tag(field, wireType) {
    return this.varint((field << 3) | wireType);
  }
  uint(field, value) {
    return this.tag(field, 0).varint(value);
  }
  bytes(field, data) {
    this.tag(field, 2).varint(data.length);
    this.parts.push(data);
    return this;
  }
  string(field, text) {
    return this.bytes(field, new TextEncoder().encode(text));
  }
  finish() {
    return Buffer.concat(this.parts);
  }
}

class Reader {
  constructor(buf) {
    this.buf = buf;
    this.pos = 0;
  }
  done() {
    return this.pos >= this.buf.length;
  }
  // Returns a BigInt: int64 cells may need all 64 bits (negative values use 10 bytes).
  varint() {
    let result = 0n;
    let shift = 0n;
    for (;;) {
      if (this.pos >= this.buf.length) throw new Error('truncated varint');
      const byte = this.buf[this.pos++];
      result |= BigInt(byte & 0x7f) << shift;
      if ((byte & 0x80) === 0) return result;
      shift += 7n;
    }
  }
  small() {
    return Number(this.varint());
  }
  slice() {
    const len = this.small();
    const out = this.buf.subarray(this.pos, this.pos + len);
    if (out.length !== len) throw new Error('truncated field');
    this.pos += len;
    return out;
  }
  // Iterates [field, wireType] pairs; the caller reads or skips each value.
  *fields() {
    while (!this.done()) {
      const key = this.small();
      yield [key >>> 3, key & 7];
    }
  }
  skip(wireType) {
    switch (wireType) {
      case 0: this.varint(); break;
      case 1: this.pos += 8; break;
      case 2: this.slice(); break;
      case 5: this.pos += 4; break;
      default: throw new Error(`unsupported wire type ${wireType}`);
    }
  }
}

const utf8 = new TextDecoder();

// int64 → a JSON number where exact, else a decimal string.
function int64(big) {
  const signed = BigInt.asIntN(64, big);
  const n = Number(signed);
  return Number.isSafeInteger(n) ? n : signed.toString();
}

// ---- the engine, as a web worker in a vm context ----

function startEngine(engineDir) {
  const bundle = path.join(engineDir, 'engine_bundle.js');
  if (!fs.existsSync(bundle)) fail(EXIT.usage, `${bundle} not found (run fetch_ui.py)`);
  const wasmRequested = [];

  // Synchronous GET of a file beside the bundle: how emscripten loads the wasm in a worker.
  class XMLHttpRequest {
    open(method, url) {
      this.method = method;
      this.url = url;
    }
    send() {
      const name = path.basename(new URL(this.url, 'file:///').pathname);
      const file = path.join(engineDir, name);
      wasmRequested.push(name);
      try {
        const data = fs.readFileSync(file);
        this.status = 200;
        this.response = data.buffer.slice(data.byteOffset, data.byteOffset + data.length);
      } catch (e) {
        this.status = 404;
        this.response = null;
        throw new Error(`engine asked for ${name}, not readable: ${e.message}`);
      }
    }
    getResponseHeader() {
      return null;
    }
  }

  const stderrLines = [];
  const sandbox = {
    WorkerGlobalScope: function WorkerGlobalScope() {},
    location: { href: `file://${engineDir}/engine_bundle.js` },
    XMLHttpRequest,
    console: {
      log: (...a) => stderrLines.push(a.join(' ')),
      warn: (...a) => stderrLines.push(a.join(' ')),
      error: (...a) => stderrLines.push(a.join(' ')),
      info: () => {},
      debug: () => {},
    },
    TextDecoder,
    TextEncoder,
    URL,
    crypto: webcrypto, // a global only from Node 19 on
    performance: globalThis.performance,
    setTimeout,
    clearTimeout,
    setInterval,
    clearInterval,
    queueMicrotask,
  };
  sandbox.self = sandbox;
  const context = vm.createContext(sandbox);

  // The context's own WebAssembly (not this realm's): emscripten tells errors apart with
  // `instanceof TypeError`, which must be the context's TypeError.
  const contextWebAssembly = vm.runInContext('WebAssembly', context);
  // The bridge sets up its request buffer (trace_processor_rpc_init) a few ticks after the
  // module loads; a request sent before that would be copied to address 0. Watching that
  // export is how the harness knows the engine is ready.
  const ready = { done: false };
  const watched = Object.create(contextWebAssembly);
  watched.Instance = function Instance(module, imports) {
    const instance = new contextWebAssembly.Instance(module, imports);
    const init = instance.exports.trace_processor_rpc_init;
    if (typeof init !== 'function') return instance;
    const exports = { ...instance.exports };
    exports.trace_processor_rpc_init = (...a) => {
      const result = init(...a);
      ready.done = true;
      return result;
    };
    return { exports };
  };
  sandbox.WebAssembly = watched;
  vm.runInContext(fs.readFileSync(bundle, 'utf8'), context, { filename: bundle });
  if (typeof sandbox.onmessage !== 'function') {
    fail(EXIT.usage, 'engine_bundle.js did not install a worker message handler');
  }
  // The bridge checks `instanceof Uint8Array` with its own realm's class.
  const ContextUint8Array = vm.runInContext('Uint8Array', context);
  return { sandbox, ContextUint8Array, wasmRequested, stderrLines, ready };
}

class TraceProcessor {
  constructor(engine) {
    this.engine = engine;
    this.seq = 0;
    this.rx = Buffer.alloc(0);
    this.replies = [];
    this.port = {
      onmessage: null,
      postMessage: (data) => this.receive(Buffer.from(data)),
    };
    engine.sandbox.onmessage({ data: this.port });
  }

  // Reassembles TraceProcessorRpcStream framing: (tag 1, length) + TraceProcessorRpc.
  receive(chunk) {
    this.rx = this.rx.length ? Buffer.concat([this.rx, chunk]) : chunk;
    for (;;) {
      const r = new Reader(this.rx);
      try {
        const key = r.small();
        if (key !== ((1 << 3) | 2)) throw new Error(`RPC framing: unexpected key ${key}`);
        const msg = r.slice();
        this.replies.push(Buffer.from(msg));
        this.rx = this.rx.subarray(r.pos);
        if (this.rx.length === 0) return;
      } catch (e) {
        if (/truncated/.test(e.message)) return; // wait for the rest
        throw e;
      }
    }
  }

  // Sends one request; returns the decoded replies it produced (the engine answers
  // synchronously, a query possibly in several messages).
  call(method, build) {
    const w = new Writer().uint(RPC.seq, this.seq++).uint(RPC.request, method);
    if (build) build(w);
    const body = w.finish();
    const framed = new Writer().bytes(1, body).finish();
    this.replies = [];
    this.port.onmessage({ data: new this.engine.ContextUint8Array(framed) });
    return this.replies.map(decodeRpc);
  }

  append(data) {
    for (const reply of this.call(METHOD.append, (w) => w.bytes(RPC.appendTraceData, data))) {
      checkReply(reply, METHOD.append);
      if (reply.error) return reply.error;
    }
    return null;
  }

  finalize() {
    for (const reply of this.call(METHOD.finalize)) {
      checkReply(reply, METHOD.finalize);
      if (reply.error) return reply.error;
    }
    return null;
  }

  query(sql) {
    const replies = this.call(METHOD.query, (w) =>
      w.bytes(RPC.queryArgs, new Writer().string(1, sql).finish()));
    const result = { sql, columns: [], rows: [], error: null };
    const cells = [];
    for (const reply of replies) {
      checkReply(reply, METHOD.query);
      const q = reply.query;
      if (!q) continue;
      if (q.columns.length) result.columns = q.columns;
      if (q.error) result.error = q.error;
      cells.push(...q.cells);
    }
    const width = result.columns.length;
    for (let i = 0; width > 0 && i < cells.length; i += width) {
      result.rows.push(cells.slice(i, i + width));
    }
    return result;
  }
}

function checkReply(reply, method) {
  if (reply.fatalError) throw new Error(`trace processor: ${reply.fatalError}`);
  if (reply.invalidRequest !== undefined) {
    throw new Error(`trace processor does not know request ${reply.invalidRequest}`);
  }
  if (reply.response !== method) {
    throw new Error(`reply to request ${method} has response type ${reply.response}`);
  }
}

function decodeRpc(buf) {
  const out = {};
  const r = new Reader(buf);
  for (const [field, wire] of r.fields()) {
    switch (field) {
      case RPC.seq: out.seq = r.small(); break;
      case RPC.fatalError: out.fatalError = utf8.decode(r.slice()); break;
      case RPC.response: out.response = r.small(); break;
      case RPC.invalidRequest: out.invalidRequest = r.small(); break;
      case RPC.appendResult: // AppendTraceDataResult: error = 2
      case RPC.finalizeDataResult: { // FinalizeDataResult: error = 1
        const errorField = field === RPC.appendResult ? 2 : 1;
        const sub = new Reader(r.slice());
        for (const [f, w] of sub.fields()) {
          if (f === errorField) out.error = utf8.decode(sub.slice());
          else sub.skip(w);
        }
        break;
      }
      case RPC.queryResult: out.query = decodeQueryResult(r.slice()); break;
      default: r.skip(wire);
    }
  }
  return out;
}

// QueryResult: column_names = 1, error = 2, batch = 3 (CellsBatch).
function decodeQueryResult(buf) {
  const out = { columns: [], error: null, cells: [] };
  const r = new Reader(buf);
  for (const [field, wire] of r.fields()) {
    if (field === 1) out.columns.push(utf8.decode(r.slice()));
    else if (field === 2) out.error = utf8.decode(r.slice()) || null;
    else if (field === 3) out.cells.push(...decodeBatch(r.slice()));
    else r.skip(wire);
  }
  return out;
}

// CellsBatch: cells = 1 (packed CellType), varint_cells = 2 (packed int64),
// float64_cells = 3 (packed double), blob_cells = 4, string_cells = 5 (NUL-separated).
function decodeBatch(buf) {
  const types = [];
  const varints = [];
  const doubles = [];
  const blobs = [];
  let strings = [];
  const packed = (r, wire, each) => {
    if (wire !== 2) return each(r);
    const sub = new Reader(r.slice());
    while (!sub.done()) each(sub);
  };
  const r = new Reader(buf);
  for (const [field, wire] of r.fields()) {
    switch (field) {
      case 1: packed(r, wire, (s) => types.push(s.small())); break;
      case 2: packed(r, wire, (s) => varints.push(int64(s.varint()))); break;
      case 3: {
        const bytes = r.slice();
        const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
        for (let i = 0; i + 8 <= bytes.length; i += 8) doubles.push(view.getFloat64(i, true));
        break;
      }
      case 4: blobs.push(Buffer.from(r.slice()).toString('base64')); break;
      case 5: {
        const text = utf8.decode(r.slice());
        strings = text.split('\0');
        break;
      }
      default: r.skip(wire);
    }
  }
  const next = { varint: 0, float64: 0, string: 0, blob: 0 };
  return types.map((type) => {
    switch (type) {
      case CELL.null: return null;
      case CELL.varint: return varints[next.varint++];
      case CELL.float64: return doubles[next.float64++];
      case CELL.string: return strings[next.string++];
      case CELL.blob: return blobs[next.blob++];
      default: throw new Error(`unknown cell type ${type}`);
    }
  });
}

// Statistics the trace processor keeps about what it could not import.
const STATS_PROBLEMS_SQL =
  "select name, idx, severity, source, value from stats " +
  "where severity in ('error', 'data_loss') and value > 0 order by name, idx";

// A protobuf Trace is a sequence of `packet` fields (1, length-delimited). The trace
// processor silently drops a last packet cut short, so the harness checks the framing
// itself: returns where the file stops making sense, or null.
function protobufFramingError(trace) {
  if (trace.length === 0 || trace[0] !== 0x0a) return null; // not an uncompressed Trace
  // Plain-number varints: field keys and lengths here are far below 2^53.
  let pos = 0;
  const varint = () => {
    let value = 0;
    let scale = 1;
    for (;;) {
      if (pos >= trace.length) throw new Error('truncated varint');
      const byte = trace[pos++];
      value += (byte & 0x7f) * scale;
      if ((byte & 0x80) === 0) return value;
      scale *= 128;
    }
  };
  let packets = 0;
  try {
    while (pos < trace.length) {
      const key = varint();
      switch (key % 8) {
        case 0: varint(); break;
        case 1: pos += 8; break;
        case 2: {
          const length = varint(); // (not `pos += varint()`: that reads pos first)
          pos += length;
          break;
        }
        case 5: pos += 4; break;
        default: throw new Error(`wire type ${key % 8}`);
      }
      if (pos > trace.length) throw new Error('truncated field');
      if (Math.floor(key / 8) === 1) packets++;
    }
  } catch (e) {
    return `protobuf trace ends inside a field after ${packets} packets (${e.message})`;
  }
  return null;
}

async function waitReady(engine) {
  for (let i = 0; i < 1000 && !engine.ready.done; i++) {
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  // One more turn: the bridge stores the buffer address when the init call returns.
  await new Promise((resolve) => setTimeout(resolve, 0));
  if (!engine.ready.done) {
    fail(EXIT.usage, `the engine did not initialise: ${engine.stderrLines.slice(-5).join(' | ')}`);
  }
}

async function main() {
  const args = process.argv.slice(2);
  let engineDir = null;
  const rest = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--engine') engineDir = args[++i];
    else if (args[i] === '-h' || args[i] === '--help') {
      process.stdout.write('usage: node trace_processor.mjs --engine DIR TRACE [SQL...]\n');
      process.exit(EXIT.ok);
    } else rest.push(args[i]);
  }
  if (!engineDir || rest.length < 1) {
    fail(EXIT.usage, 'usage: node trace_processor.mjs --engine DIR TRACE [SQL...]');
  }
  const [tracePath, ...queries] = rest;
  let trace;
  try {
    trace = fs.readFileSync(tracePath);
  } catch (e) {
    fail(EXIT.usage, `cannot read ${tracePath}: ${e.message}`);
  }

  const framing = protobufFramingError(trace);
  if (framing) {
    process.stdout.write(JSON.stringify({ trace: tracePath, bytes: trace.length, error: framing }) + '\n');
    fail(EXIT.rejected, `${tracePath} rejected: ${framing}`);
  }

  const engine = startEngine(path.resolve(engineDir));
  let tp;
  try {
    tp = new TraceProcessor(engine);
    await waitReady(engine);
  } catch (e) {
    fail(EXIT.usage, `the engine did not start: ${e.message}`);
  }
  const out = { trace: tracePath, bytes: trace.length, wasm: null, queries: [], stats_problems: [] };
  const report = (code, message) => {
    out.wasm = engine.wasmRequested[0] ?? null;
    process.stdout.write(JSON.stringify(out) + '\n');
    if (message) process.stderr.write(`trace_processor: ${message}\n`);
    process.exit(code);
  };

  try {
    for (let offset = 0; offset < trace.length; offset += APPEND_CHUNK) {
      const error = tp.append(trace.subarray(offset, offset + APPEND_CHUNK));
      if (error) {
        out.error = error;
        report(EXIT.rejected, `${tracePath} rejected: ${error}`);
      }
    }
    const error = tp.finalize();
    if (error) {
      out.error = error;
      report(EXIT.rejected, `${tracePath} rejected: ${error}`);
    }
  } catch (e) {
    out.error = String(e.message ?? e);
    report(EXIT.rejected, `${tracePath}: ${out.error}`);
  }

  let failedQuery = null;
  for (const sql of queries) {
    const result = tp.query(sql);
    out.queries.push(result);
    if (result.error && !failedQuery) failedQuery = result;
  }
  const stats = tp.query(STATS_PROBLEMS_SQL);
  if (stats.error) report(EXIT.query, `the stats query failed: ${stats.error}`);
  out.stats_problems = stats.rows.map(([name, idx, severity, source, value]) =>
    ({ name, idx, severity, source, value }));

  if (failedQuery) report(EXIT.query, `query failed: ${failedQuery.error}\n  ${failedQuery.sql}`);
  if (out.stats_problems.length) {
    const list = out.stats_problems
      .map((s) => `${s.name}${s.idx === null ? '' : `[${s.idx}]`} = ${s.value} (${s.severity})`)
      .join(', ');
    report(EXIT.stats, `${tracePath} loaded with error statistics: ${list}`);
  }
  report(EXIT.ok, null);
}

await main();
