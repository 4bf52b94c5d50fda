//! `cudatrace view` (no root needed): what is served on 127.0.0.1:9001, with which
//! headers, how often, and what is printed or handed to the browser. A real browser
//! opening the UI is checked by hand (headless Chromium is not installed in CI).

mod common;
mod traces;

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Mutex, MutexGuard, mpsc},
    time::{Duration, Instant},
};

use common::{CUDATRACE, root, scratch};

/// The tests share the port.
static PORT_LOCK: Mutex<()> = Mutex::new(());

fn port() -> MutexGuard<'static, ()> {
    PORT_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A response: status, headers (names lower-cased), body.
struct Response {
    status: u16,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

fn request(method: &str, path: &str, extra: &str) -> Response {
    request_to("127.0.0.1:9001", method, path, extra)
}

/// A request naming `host` in its `Host` header.
fn request_to(host: &str, method: &str, path: &str, extra: &str) -> Response {
    let mut stream = TcpStream::connect(("127.0.0.1", 9001)).expect("connecting to 9001");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: https://ui.perfetto.dev\r\n{extra}\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8(raw[..end].to_vec()).unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|line| line.split_once(": "))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.to_owned()))
        .collect();
    Response {
        status,
        headers,
        body: raw[end + 4..].to_vec(),
    }
}

/// A running `cudatrace view`: its stderr lines as they come, its stdout at the end.
struct Viewer {
    child: Child,
    stderr: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Viewer {
    fn start(args: &[&str], browser: Option<&str>) -> Viewer {
        let mut command = Command::new(CUDATRACE);
        command
            .arg("view")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("SUDO_UID");
        match browser {
            Some(browser) => command.env("BROWSER", browser),
            None => command.env_remove("BROWSER"),
        };
        let mut child = command.spawn().expect("running cudatrace view");
        let (sender, stderr) = mpsc::channel();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
        Viewer {
            child,
            stderr,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `text`.
    fn wait_for(&mut self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(line) = self.seen.iter().find(|line| line.contains(text)) {
                return line.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no {text:?} on stderr; saw {:?}", self.seen),
            }
        }
    }

    /// Waits for the process to end: its status and stdout.
    fn finish(mut self) -> (ExitStatus, String, Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "still running: {:?}", self.seen);
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stdout = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        self.seen.extend(self.stderr.try_iter());
        (status, stdout, self.seen)
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn interrupt(&self) {
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) },
            0
        );
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `cudatrace export --format perfetto` of `trace`: what view must serve.
fn perfetto_export(trace: &Path, out: &Path) -> Vec<u8> {
    let status = Command::new(CUDATRACE)
        .args(["export", "--format", "perfetto", "-o"])
        .arg(out)
        .arg(trace)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::read(out).unwrap()
}

#[test]
fn a_jsonl_trace_is_exported_and_served_once() {
    let _port = port();
    let dir = scratch("view-jsonl");
    let trace = write(&dir, "known.jsonl", traces::known().as_bytes());
    let expected = perfetto_export(&trace, &dir.join("expected.pftrace"));

    let mut viewer = Viewer::start(&[trace.to_str().unwrap(), "--no-browser"], None);
    let serving = viewer.wait_for("until the Perfetto UI has fetched it");
    // The export, in a private temporary folder.
    let exported = serving
        .split_whitespace()
        .nth(2)
        .map(PathBuf::from)
        .unwrap();
    assert_eq!(exported.file_name().unwrap(), "known.pftrace");
    assert!(exported.is_file(), "{serving}");
    viewer.wait_for("no browser started (--no-browser)");

    // The UI looking for a native trace processor finds none, and serving goes on.
    let status = request("POST", "/status", "Content-Length: 0\r\n");
    assert_eq!(status.status, 404);
    let preflight = request(
        "OPTIONS",
        "/known.pftrace",
        "Access-Control-Request-Method: GET\r\nAccess-Control-Request-Private-Network: true\r\n",
    );
    assert_eq!(preflight.status, 204);
    assert_eq!(
        preflight.headers["access-control-allow-private-network"],
        "true"
    );
    assert_eq!(request("GET", "/other.pftrace", "").status, 404);
    assert_eq!(
        request("GET", "/", "").status,
        404,
        "no UI without --offline"
    );
    let head = request("HEAD", "/known.pftrace", "");
    assert_eq!(head.status, 200);
    assert_eq!(head.headers["content-length"], expected.len().to_string());
    assert!(head.body.is_empty());
    assert!(viewer.running(), "HEAD does not count as the fetch");

    let got = request("GET", "/known.pftrace", "");
    assert_eq!(got.status, 200);
    assert_eq!(
        got.headers["access-control-allow-origin"],
        "https://ui.perfetto.dev"
    );
    assert_eq!(got.headers["content-type"], "application/octet-stream");
    assert_eq!(got.headers["content-length"], expected.len().to_string());
    assert!(got.body == expected, "the bytes of the export");

    let (status, stdout, stderr) = viewer.finish();
    assert_eq!(status.code(), Some(0), "{stderr:?}");
    assert_eq!(
        stdout,
        "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/known.pftrace\n"
    );
    assert!(
        stderr
            .iter()
            .any(|l| l.contains(&format!("fetched the trace ({} bytes)", expected.len()))),
        "{stderr:?}"
    );
    assert!(!exported.exists(), "the temporary export is removed");
    assert!(!exported.parent().unwrap().exists());
}

#[test]
fn an_export_is_served_as_it_is_and_the_browser_gets_the_url() {
    let _port = port();
    let dir = scratch("view-browser");
    let trace = write(&dir, "known.jsonl", traces::known().as_bytes());
    let export = dir.join("my trace.pftrace");
    let bytes = perfetto_export(&trace, &export);
    let got_url = dir.join("browser-got");
    let browser = write(
        &dir,
        "browser.sh",
        format!("#!/bin/sh\nprintf '%s' \"$*\" > '{}'\n", got_url.display()).as_bytes(),
    );
    std::fs::set_permissions(
        &browser,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();

    let mut viewer = Viewer::start(
        &[export.to_str().unwrap()],
        Some(&format!(
            "/nonexistent/browser:{} --new-tab %s",
            browser.display()
        )),
    );
    viewer.wait_for("until the Perfetto UI has fetched it");
    viewer.wait_for("browser.sh --new-tab %s");
    let url = "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/my_trace.pftrace";
    assert_eq!(
        std::fs::read_to_string(&got_url).unwrap(),
        format!("--new-tab {url}")
    );
    let got = request("GET", "/my_trace.pftrace", "");
    assert!(got.status == 200 && got.body == bytes);
    let (status, stdout, _) = viewer.finish();
    assert_eq!(status.code(), Some(0));
    assert_eq!(stdout, "", "a browser was started: nothing to open by hand");

    // BROWSER=none: the URL is printed, for the user to open.
    let mut viewer = Viewer::start(&[export.to_str().unwrap()], Some("none"));
    viewer.wait_for("no browser started (BROWSER=none)");
    assert_eq!(request("GET", "/my_trace.pftrace", "").status, 200);
    let (status, stdout, _) = viewer.finish();
    assert_eq!(status.code(), Some(0));
    assert_eq!(stdout, format!("{url}\n"));
}

#[test]
fn offline_serves_the_ui_and_the_trace_until_ctrl_c() {
    let _port = port();
    let dir = scratch("view-offline");
    let trace = write(&dir, "known.jsonl", traces::known().as_bytes());
    let expected = perfetto_export(&trace, &dir.join("expected.pftrace"));
    let ui = dir.join("ui");
    write(&ui, "index.html", b"<html>the UI</html>");
    write(&ui, "v52/engine.wasm", b"\0asm\x01\0\0\0");
    write(&dir, "secret.txt", b"not the UI's");

    let mut viewer = Viewer::start(
        &[
            trace.to_str().unwrap(),
            "--offline",
            ui.to_str().unwrap(),
            "--no-browser",
        ],
        None,
    );
    viewer.wait_for("until Ctrl-C");
    let index = request("GET", "/", "");
    assert_eq!(
        (index.status, index.body.as_slice()),
        (200, &b"<html>the UI</html>"[..])
    );
    assert_eq!(index.headers["content-type"], "text/html; charset=utf-8");
    let wasm = request("GET", "/v52/engine.wasm", "");
    assert_eq!(wasm.status, 200);
    assert_eq!(wasm.headers["content-type"], "application/wasm");
    for outside in [
        "/../secret.txt",
        "/v52/../../secret.txt",
        "/%2e%2e/secret.txt",
    ] {
        assert_eq!(request("GET", outside, "").status, 404, "{outside}");
    }
    assert_eq!(
        request("POST", "/status", "Content-Length: 0\r\n").status,
        404
    );
    let got = request("GET", "/known.pftrace?x=1", "");
    assert_eq!(got.status, 200);
    assert_eq!(
        got.headers["access-control-allow-origin"],
        "http://127.0.0.1:9001"
    );
    assert!(got.body == expected);
    std::thread::sleep(Duration::from_millis(300));
    assert!(viewer.running(), "the UI is served until Ctrl-C");
    assert_eq!(request("GET", "/known.pftrace", "").status, 200, "again");
    viewer.interrupt();
    let (status, stdout, stderr) = viewer.finish();
    assert_eq!(status.code(), Some(0), "{stderr:?}");
    assert_eq!(
        stdout,
        "http://127.0.0.1:9001/#!/?url=http://127.0.0.1:9001/known.pftrace\n"
    );

    // Stopped before the trace was fetched: 130, as `run` after Ctrl-C.
    let mut viewer = Viewer::start(&[trace.to_str().unwrap(), "--no-browser"], None);
    viewer.wait_for("until the Perfetto UI has fetched it");
    viewer.interrupt();
    let (status, _, stderr) = viewer.finish();
    assert_eq!(status.code(), Some(130), "{stderr:?}");
}

#[test]
fn errors_have_their_exit_codes() {
    let _port = port();
    let dir = scratch("view-errors");
    let trace = write(&dir, "known.jsonl", traces::known().as_bytes());
    let run = |args: &[&str]| {
        let output = Command::new(CUDATRACE)
            .arg("view")
            .args(args)
            .arg("--no-browser")
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let missing = dir.join("missing.jsonl");
    let (code, stderr) = run(&[missing.to_str().unwrap()]);
    assert_eq!(code, Some(74), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "cudatrace: error: cannot open the trace {}: No such file or directory (os error 2)\n",
            missing.display()
        )
    );
    let (code, stderr) = run(&[dir.to_str().unwrap()]);
    assert_eq!(code, Some(74), "{stderr}");
    assert_eq!(stderr, common::folder_refused(dir.display()));

    let (code, stderr) = run(&[trace.to_str().unwrap(), "--offline", dir.to_str().unwrap()]);
    assert_eq!(code, Some(74), "{stderr}");
    assert!(stderr.contains("no index.html there"), "{stderr}");

    let bad = write(
        &dir,
        "bad.jsonl",
        format!("{}\nnot json\n", traces::known().lines().next().unwrap()).as_bytes(),
    );
    let (code, stderr) = run(&[bad.to_str().unwrap()]);
    assert_eq!(code, Some(65), "{stderr}");
    assert!(stderr.contains("bad.jsonl:2"), "{stderr}");

    let taken = TcpListener::bind(("127.0.0.1", 9001)).expect("port 9001 free for the test");
    let (code, stderr) = run(&[trace.to_str().unwrap()]);
    assert_eq!(code, Some(75), "{stderr}");
    assert!(stderr.contains("127.0.0.1:9001 is in use"), "{stderr}");
    drop(taken);
}

#[test]
fn a_page_that_names_another_host_gets_nothing() {
    let _port = port();
    let dir = scratch("view-host");
    let trace = write(&dir, "known.jsonl", traces::known().as_bytes());
    let expected = perfetto_export(&trace, &dir.join("expected.pftrace"));
    let mut viewer = Viewer::start(&[trace.to_str().unwrap(), "--no-browser"], None);
    viewer.wait_for("until the Perfetto UI has fetched it");
    // A page on a name that resolves to 127.0.0.1 (DNS rebinding) sends its own name.
    for host in [
        "attacker.example:9001",
        "127.0.0.1.nip.io:9001",
        "127.0.0.1:80",
        "localhost",
    ] {
        for method in ["GET", "HEAD", "OPTIONS"] {
            let response = request_to(host, method, "/known.pftrace", "");
            assert_eq!(response.status, 403, "{method} with Host {host}");
            assert!(response.body.is_empty());
        }
    }
    let mut stream = TcpStream::connect(("127.0.0.1", 9001)).unwrap();
    write!(stream, "GET /known.pftrace HTTP/1.1\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    assert!(raw.starts_with(b"HTTP/1.1 403 "), "no Host at all");
    assert!(
        viewer.running(),
        "refused requests do not count as the fetch"
    );
    let got = request_to("LocalHost:9001", "GET", "/known.pftrace", "");
    assert!(got.status == 200 && got.body == expected);
    let (status, _, stderr) = viewer.finish();
    assert_eq!(status.code(), Some(0), "{stderr:?}");
}

#[test]
fn offline_serves_no_dotfile_and_nothing_its_links_lead_out_of() {
    let _port = port();
    let dir = scratch("view-offline-links");
    let trace = write(&dir, "known.jsonl", traces::known().as_bytes());
    let ui = dir.join("ui");
    write(&ui, "index.html", b"<html>the UI</html>");
    write(&ui, ".env", b"TOKEN=1");
    write(&ui, "v52/.git/config", b"[core]");
    write(&dir, "secret.txt", b"not the UI's");
    std::os::unix::fs::symlink("../secret.txt", ui.join("relative-out")).unwrap();
    std::os::unix::fs::symlink(dir.join("secret.txt"), ui.join("absolute-out")).unwrap();
    std::os::unix::fs::symlink("..", ui.join("up")).unwrap();
    std::os::unix::fs::symlink("index.html", ui.join("inside.html")).unwrap();
    let mut viewer = Viewer::start(
        &[
            trace.to_str().unwrap(),
            "--offline",
            ui.to_str().unwrap(),
            "--no-browser",
        ],
        None,
    );
    viewer.wait_for("until Ctrl-C");
    for refused in [
        "/.env",
        "/v52/.git/config",
        "/relative-out",
        "/absolute-out",
        "/up/secret.txt",
    ] {
        assert_eq!(request("GET", refused, "").status, 404, "{refused}");
    }
    let inside = request("GET", "/inside.html", "");
    assert_eq!(
        (inside.status, inside.body.as_slice()),
        (200, &b"<html>the UI</html>"[..]),
        "a link that stays inside the folder"
    );
    viewer.interrupt();
    let (status, _, stderr) = viewer.finish();
    assert_eq!(status.code(), Some(130), "{stderr:?}");
}

#[test]
fn a_trace_from_a_pipe_is_exported_and_served() {
    let _port = port();
    let dir = scratch("view-pipe");
    let trace = write(&dir, "known.jsonl", traces::known().as_bytes());
    let expected = perfetto_export(&trace, &dir.join("expected.pftrace"));
    let mut child = Command::new(CUDATRACE)
        .args(["view", "/dev/stdin", "--no-browser"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_remove("SUDO_UID")
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(traces::known().as_bytes()).unwrap();
    drop(stdin);
    let pipe = child.stderr.take().unwrap();
    let mut lines = BufReader::new(pipe).lines();
    let serving = lines
        .find(|line| line.as_ref().unwrap().contains("until the Perfetto UI"))
        .unwrap()
        .unwrap();
    assert!(serving.contains("/stdin.pftrace"), "{serving}");
    let got = request("GET", "/stdin.pftrace", "");
    assert!(
        got.status == 200 && got.body == expected,
        "the whole export"
    );
    assert!(child.wait().unwrap().success());
}

#[test]
fn under_sudo_the_trace_is_read_as_the_user_who_asked() {
    let Some(_guard) = root() else { return };
    let _port = port();
    let dir = scratch("view-sudo");
    let trace = write(&dir, "root-only.pftrace", b"not for everyone");
    std::fs::set_permissions(&trace, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let output = Command::new(CUDATRACE)
        .args(["view", "--no-browser"])
        .arg(&trace)
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .env("SUDO_USER", "nobody")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(74), "{stderr}");
    assert!(stderr.contains("cannot open the trace"), "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
}
