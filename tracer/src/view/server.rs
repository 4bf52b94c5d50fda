//! The HTTP side of `cudatrace view`: one trace file, and with `--offline` the UI's own
//! files, served on loopback until the trace has been fetched once (or until Ctrl-C).
//!
//! HTTP/1.1 with one request per connection (`Connection: close`), GET, HEAD and OPTIONS:
//! what a browser needs to load a page and fetch a file, and no more. The UI probes this
//! port for a native trace processor (`POST /status`, then a WebSocket at `/websocket`):
//! those get a 404, and the UI goes on with its built-in WebAssembly one.

use std::{
    io::{self, Read},
    path::{Component, Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    signal::unix::{Signal, SignalKind, signal},
    sync::Notify,
};

/// What is served.
pub struct Site {
    /// `/NAME` in URLs.
    pub trace_name: String,
    pub trace_file: PathBuf,
    /// `--offline`: the UI's folder, served at `/`.
    pub ui_dir: Option<PathBuf>,
    /// The page allowed to fetch the trace (`Access-Control-Allow-Origin`).
    pub allow_origin: String,
}

/// How serving ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The trace was sent whole (and, without `--offline`, serving stopped there).
    Served,
    /// Stopped by a signal (SIGINT 2, SIGTERM 15); whether the trace had been sent.
    Signalled { signal: i32, served: bool },
}

/// A request head larger than this is refused.
const MAX_HEAD_BYTES: usize = 16 << 10;
/// A connection that sends no complete request head in this time is dropped.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

struct Shared {
    site: Site,
    served: AtomicBool,
    served_now: Notify,
}

/// SIGINT and SIGTERM, caught from the start (the export, the browser) to the end.
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    /// Within a tokio runtime's context.
    pub fn catch() -> io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }
}

/// Serves `site` on `listener` until the trace was sent once (`until_served`) or a signal.
pub async fn serve(
    listener: TcpListener,
    site: Site,
    until_served: bool,
    signals: Signals,
) -> io::Result<Outcome> {
    let shared = Arc::new(Shared {
        site,
        served: AtomicBool::new(false),
        served_now: Notify::new(),
    });
    let Signals {
        interrupt: mut sigint,
        terminate: mut sigterm,
    } = signals;
    loop {
        let served = shared.served_now.notified();
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = accepted?;
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    // A client that goes away is its own business.
                    let _ = handle(stream, &shared).await;
                });
            }
            () = served, if until_served => return Ok(Outcome::Served),
            _ = sigint.recv() => {
                return Ok(Outcome::Signalled { signal: 2, served: shared.served.load(Ordering::SeqCst) });
            }
            _ = sigterm.recv() => {
                return Ok(Outcome::Signalled { signal: 15, served: shared.served.load(Ordering::SeqCst) });
            }
        }
    }
}

/// One request on one connection.
async fn handle(mut stream: TcpStream, shared: &Shared) -> io::Result<()> {
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(Some(head))) => head,
        Ok(Ok(None)) => return respond(&mut stream, shared, 400, "Bad Request", &[]).await,
        Ok(Err(e)) => return Err(e),
        Err(_) => return Ok(()),
    };
    let mut words = head.lines().next().unwrap_or("").split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split(['?', '#']).next().unwrap_or("");
    let site = &shared.site;
    match method {
        // A preflight: Chrome asks before a public page (the UI) reads from loopback.
        "OPTIONS" => {
            let headers = [
                ("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS"),
                ("Access-Control-Allow-Headers", "*"),
                ("Access-Control-Allow-Private-Network", "true"),
                ("Access-Control-Max-Age", "600"),
            ];
            respond(&mut stream, shared, 204, "No Content", &headers).await
        }
        "GET" | "HEAD" => {
            let body = method == "GET";
            if path.strip_prefix('/') == Some(site.trace_name.as_str()) {
                let sent = send_file(&mut stream, shared, &site.trace_file, body).await?;
                if sent && body {
                    shared.served.store(true, Ordering::SeqCst);
                    shared.served_now.notify_one();
                }
                return Ok(());
            }
            match site.ui_dir.as_deref().and_then(|dir| ui_file(dir, path)) {
                Some(file) => send_file(&mut stream, shared, &file, body)
                    .await
                    .map(|_| ()),
                None => respond(&mut stream, shared, 404, "Not Found", &[]).await,
            }
        }
        // `POST /status` (the UI looking for a trace processor) and anything else.
        _ => respond(&mut stream, shared, 404, "Not Found", &[]).await,
    }
}

/// The request line and headers, up to the blank line; `None` if malformed or too long.
async fn read_head(stream: &mut TcpStream) -> io::Result<Option<String>> {
    let mut head = Vec::new();
    let mut chunk = [0u8; 2048];
    loop {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&chunk[..read]);
        if let Some(end) = memchr::memmem::find(&head, b"\r\n\r\n") {
            head.truncate(end);
            return Ok(String::from_utf8(head).ok());
        }
        if head.len() > MAX_HEAD_BYTES {
            return Ok(None);
        }
    }
}

/// A file of the UI's folder for `path`, if it names one: plain names only, no `..`.
fn ui_file(dir: &Path, path: &str) -> Option<PathBuf> {
    let relative = match path.strip_prefix('/')? {
        "" => "index.html",
        rest => rest,
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-+@~/".contains(c);
    if !relative.chars().all(allowed) {
        return None;
    }
    let relative = Path::new(relative);
    if !relative
        .components()
        .all(|part| matches!(part, Component::Normal(_)))
    {
        return None;
    }
    let file = dir.join(relative);
    file.is_file().then_some(file)
}

fn content_type(file: &Path) -> &'static str {
    match file.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        // Browsers compile WebAssembly while it downloads only with this type.
        "wasm" => "application/wasm",
        "json" | "map" => "application/json",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "ttf" => "font/ttf",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// A response with no body.
async fn respond(
    stream: &mut TcpStream,
    shared: &Shared,
    status: u16,
    reason: &str,
    extra: &[(&str, &str)],
) -> io::Result<()> {
    let mut head = status_head(shared, status, reason, extra);
    head.push_str("Content-Length: 0\r\n\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.shutdown().await
}

fn status_head(shared: &Shared, status: u16, reason: &str, extra: &[(&str, &str)]) -> String {
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\nServer: cudatrace\r\nConnection: close\r\n\
         Cache-Control: no-cache\r\nAccess-Control-Allow-Origin: {}\r\n",
        shared.site.allow_origin
    );
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head
}

/// Sends `file` (or only its headers, for HEAD); whether it was sent whole.
async fn send_file(
    stream: &mut TcpStream,
    shared: &Shared,
    file: &Path,
    body: bool,
) -> io::Result<bool> {
    let Ok(mut opened) = std::fs::File::open(file) else {
        respond(stream, shared, 404, "Not Found", &[]).await?;
        return Ok(false);
    };
    let length = opened.metadata()?.len();
    let mut head = status_head(shared, 200, "OK", &[("Content-Type", content_type(file))]);
    head.push_str(&format!("Content-Length: {length}\r\n\r\n"));
    stream.write_all(head.as_bytes()).await?;
    let mut sent: u64 = 0;
    if body {
        // Local files: a blocking read of a block at a time keeps the loop responsive.
        let mut block = vec![0u8; 256 << 10];
        loop {
            let read = opened.read(&mut block)?;
            if read == 0 {
                break;
            }
            stream.write_all(&block[..read]).await?;
            sent += read as u64;
        }
    }
    stream.shutdown().await?;
    Ok(!body || sent == length)
}
