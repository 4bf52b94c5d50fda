//! The HTTP side of `cudatrace view`: one trace file, and with `--offline` the UI's own
//! files, served on loopback until the trace has been fetched once (or until Ctrl-C).
//!
//! HTTP/1.1 with one request per connection (`Connection: close`), GET, HEAD and OPTIONS:
//! what a browser needs to load a page and fetch a file, and no more. The UI probes this
//! port for a native trace processor (`POST /status`, then a WebSocket at `/websocket`):
//! those get a 404, and the UI goes on with its built-in WebAssembly one.

use std::{
    ffi::CString,
    fs::File,
    io::{self, Read},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
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
    /// `--offline`: the UI's folder, served at `/`, opened once (`O_PATH`): files are
    /// looked up beneath it.
    pub ui_dir: Option<OwnedFd>,
    /// The one `Host` a request may name (`127.0.0.1:PORT`, or `localhost:PORT`).
    pub port: u16,
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
    // A page on another name that resolves to 127.0.0.1 (DNS rebinding) must not read
    // the trace: only requests for this host and port are answered.
    if !host_allowed(&head, site.port) {
        return respond(&mut stream, shared, 403, "Forbidden", &[]).await;
    }
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
                let Ok(file) = File::open(&site.trace_file) else {
                    return respond(&mut stream, shared, 404, "Not Found", &[]).await;
                };
                let sent = send_file(&mut stream, shared, file, &site.trace_file, body).await?;
                if sent && body {
                    shared.served.store(true, Ordering::SeqCst);
                    shared.served_now.notify_one();
                }
                return Ok(());
            }
            match site.ui_dir.as_ref().and_then(|dir| ui_file(dir, path)) {
                Some((file, name)) => send_file(&mut stream, shared, file, &name, body)
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

/// Whether the request's `Host` is `127.0.0.1:PORT` or `localhost:PORT` (any case).
fn host_allowed(head: &str, port: u16) -> bool {
    let host = head.lines().skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("host")
            .then(|| value.trim())
    });
    let Some(host) = host else { return false };
    let Some((name, given_port)) = host.rsplit_once(':') else {
        return false;
    };
    given_port == port.to_string()
        && (name == "127.0.0.1" || name.eq_ignore_ascii_case("localhost"))
}

/// A file of the UI's folder for `path`, opened, with its name: plain names only, no
/// `..`, no dotfile, and nothing the folder's links lead out of (`openat2` with
/// `RESOLVE_BENEATH`).
fn ui_file(dir: &OwnedFd, path: &str) -> Option<(File, PathBuf)> {
    let relative = match path.strip_prefix('/')? {
        "" => "index.html",
        rest => rest,
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-+@~/".contains(c);
    if !relative.chars().all(allowed) {
        return None;
    }
    let relative = Path::new(relative);
    let plain = |part: Component| match part {
        Component::Normal(name) => !name.as_encoded_bytes().starts_with(b"."),
        _ => false,
    };
    if !relative.components().all(plain) {
        return None;
    }
    let file = open_beneath(dir, relative).ok()?;
    file.metadata()
        .is_ok_and(|m| m.is_file())
        .then(|| (file, relative.to_owned()))
}

/// openat2(2) of `relative` beneath `dir`, read-only: the kernel refuses any resolution
/// (`..`, an absolute link, a link out) that would leave `dir`.
fn open_beneath(dir: &OwnedFd, relative: &Path) -> io::Result<File> {
    use std::os::unix::ffi::OsStrExt;
    let name = CString::new(relative.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: open_how is plain integers; zero is "nothing asked".
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2(2) with a valid directory fd, a NUL-terminated name and `how`'s size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this function owns.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
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

/// Sends the open file `opened`, named `name` (or only its headers, for HEAD); whether
/// it was sent whole.
async fn send_file(
    stream: &mut TcpStream,
    shared: &Shared,
    mut opened: File,
    name: &Path,
    body: bool,
) -> io::Result<bool> {
    let length = opened.metadata()?.len();
    let mut head = status_head(shared, 200, "OK", &[("Content-Type", content_type(name))]);
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
