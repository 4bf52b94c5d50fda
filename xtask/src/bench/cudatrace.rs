//! `cudatrace run` against the stand-in, and what its trace's footer says about calls.

use std::{
    ffi::OsStr,
    fs::File,
    io::{Read, Seek, SeekFrom},
    path::Path,
    process::Command,
};

use anyhow::{Context, Result, ensure};
use serde::Deserialize;

use super::env::Env;

/// `cudatrace run` of a command against the stand-in, trace into `trace`.
pub fn cudatrace_run(
    env: &Env,
    trace: &Path,
    extra: &[&str],
    command: &[impl AsRef<OsStr>],
) -> Command {
    let mut cmd = Command::new(&env.cudatrace);
    cmd.args(["run", "-q", "--missing-probes", "ignore", "-o"])
        .arg(trace)
        .arg("--libcuda")
        .arg(&env.libcuda)
        .args(extra)
        .arg("--");
    cmd.args(command);
    cmd
}

/// A trace's last line (its footer), as JSON.
pub fn footer_json(trace: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(trace)?;
    Ok(serde_json::from_str(
        text.lines().last().unwrap_or_default(),
    )?)
}

/// What the bench reads of a trace's footer line (docs/trace-format.md has all of it).
#[derive(Deserialize, Debug, Clone, PartialEq)]
pub struct Footer {
    pub events: FooterEvents,
    pub lost: FooterLost,
    /// Calls that entered a probed function: `events.call + lost.calls` when all returned.
    pub entries_seen: u64,
}

#[derive(Deserialize, Debug, Clone, PartialEq)]
pub struct FooterEvents {
    /// Call lines written.
    pub call: u64,
}

#[derive(Deserialize, Debug, Clone, PartialEq)]
pub struct FooterLost {
    /// Call events dropped in the kernel.
    pub calls: u64,
}

/// The footer's `type`, read first so that a trace without one says so.
#[derive(Deserialize)]
struct LineType {
    #[serde(rename = "type")]
    kind: Option<String>,
}

impl Footer {
    /// The footer: the trace's last non-empty line.
    pub fn read(trace: &Path) -> Result<Self> {
        let mut file = File::open(trace).with_context(|| format!("opening {}", trace.display()))?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(1 << 20)))?;
        let mut tail = String::new();
        file.read_to_string(&mut tail)?;
        let line = tail
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .context("empty trace")?;
        Self::parse(line).with_context(|| format!("reading the footer of {}", trace.display()))
    }

    fn parse(line: &str) -> Result<Self> {
        let kind: LineType = serde_json::from_str(line).context("parsing the last line")?;
        ensure!(
            kind.kind.as_deref() == Some("footer"),
            "the last line is no footer"
        );
        Ok(serde_json::from_str(line)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/trace-format.md's footer example, with losses.
    const FOOTER: &str = r#"{"type":"footer","end_wall":"2026-11-20T15:04:06.100Z","duration_ns":812345678,"events":{"call":28,"process":2,"lost":1},"calls_by_name":{"cuInit":1},"lost":{"ring_full":3,"too_deep":0,"frames_full":0,"process_ring_full":0,"calls":3,"total":3},"entries_seen":31,"unmatched_returns":0,"undecodable":0,"exit_code":0}"#;

    #[test]
    fn the_footer_gives_calls_lost_calls_and_entries() {
        let footer = Footer::parse(FOOTER).unwrap();
        assert_eq!(footer.events.call, 28);
        assert_eq!(footer.lost.calls, 3);
        assert_eq!(footer.entries_seen, 31);
    }

    #[test]
    fn a_last_line_that_is_no_footer_is_an_error() {
        let call = r#"{"type":"call","name":"cuInit","ts_ns":1}"#;
        assert_eq!(
            format!("{:#}", Footer::parse(call).unwrap_err()),
            "the last line is no footer"
        );
        let error = Footer::parse(r#"{"type":"footer","events":{"call":1}}"#).unwrap_err();
        assert!(
            format!("{error:#}").contains("missing field `lost`"),
            "{error:#}"
        );
    }
}
