//! The floor: the kernel's bare tracefs `p:` and `r:` uprobe events, in a tracefs instance of
//! their own, and the checks that the bench leaves tracefs as it found it.

use std::{
    fs::{self, OpenOptions},
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

/// The tracefs probe group, and the tracefs instance whose buffer takes its events.
pub const GROUP: &str = "cudatrace_bench";

/// The file offset of an exported function: where a uprobe on it attaches.
pub fn file_offset(lib: &Path, symbol: &str) -> Result<u64> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    let data = fs::read(lib).with_context(|| format!("reading {}", lib.display()))?;
    let elf = object::File::parse(&*data).with_context(|| format!("parsing {}", lib.display()))?;
    let address = elf
        .dynamic_symbols()
        .find(|s| s.name() == Ok(symbol) && !s.is_undefined())
        .with_context(|| format!("{} does not export {symbol}", lib.display()))?
        .address();
    elf.segments()
        .find(|seg| address >= seg.address() && address < seg.address() + seg.size())
        .map(|seg| address - seg.address() + seg.file_range().0)
        .with_context(|| format!("{symbol} at {address:#x} is in no segment"))
}

/// The tracefs mount that has uprobe_events.
pub fn tracefs_dir() -> Result<PathBuf> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .map(PathBuf::from)
        .find(|d| d.join("uprobe_events").exists())
        .context("no tracefs with uprobe_events (mount -t tracefs nodev /sys/kernel/tracing)")
}

fn append(path: &Path, line: &str) -> Result<()> {
    OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .with_context(|| format!("writing {:?} to {}", line.trim_end(), path.display()))
}

/// A `p:` uprobe event on one function, and an `r:` one unless asked not to, enabled in a
/// tracefs instance of their own (so the global trace buffer is left alone). Dropping it
/// disables and removes them.
pub struct TracefsProbes {
    dir: PathBuf,
    instance: PathBuf,
    events: Vec<&'static str>,
    enabled: bool,
}

impl TracefsProbes {
    /// `returns`: the `r:` event too.
    pub fn attach(dir: &Path, lib: &Path, offset: u64, returns: bool) -> Result<Self> {
        let path = lib.display().to_string();
        ensure!(
            !path.contains(char::is_whitespace),
            "tracefs cannot take a library path with spaces: {path}"
        );
        let mut probes = TracefsProbes {
            dir: dir.to_owned(),
            instance: dir.join("instances").join(GROUP),
            events: Vec::new(),
            enabled: false,
        };
        let kinds: &[(&str, &'static str)] = if returns {
            &[("p", "entry"), ("r", "ret")]
        } else {
            &[("p", "entry")]
        };
        for &(kind, name) in kinds {
            append(
                &dir.join("uprobe_events"),
                &format!("{kind}:{GROUP}/{name} {path}:0x{offset:x}\n"),
            )?;
            probes.events.push(name);
        }
        fs::create_dir(&probes.instance)
            .with_context(|| format!("creating {}", probes.instance.display()))?;
        fs::write(
            probes.instance.join("events").join(GROUP).join("enable"),
            "1",
        )
        .context("enabling the tracefs uprobes")?;
        probes.enabled = true;
        Ok(probes)
    }

    /// Events recorded per call: one per probe.
    pub fn events_per_call(&self) -> u64 {
        self.events.len() as u64
    }

    /// Records the instance's buffer took (kept + overwritten), over all CPUs.
    pub fn recorded(&self) -> Result<u64> {
        let mut total = 0;
        for entry in fs::read_dir(self.instance.join("per_cpu"))? {
            let stats = fs::read_to_string(entry?.path().join("stats"))?;
            for line in stats.lines() {
                if let Some(n) = line
                    .strip_prefix("entries: ")
                    .or_else(|| line.strip_prefix("overrun: "))
                {
                    total += n.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
        Ok(total)
    }

    pub fn detach(mut self) -> Result<()> {
        self.cleanup()
    }

    fn cleanup(&mut self) -> Result<()> {
        let mut first_error = None;
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        };
        if self.enabled {
            note(
                fs::write(self.instance.join("events").join(GROUP).join("enable"), "0")
                    .context("disabling the tracefs uprobes"),
            );
            self.enabled = false;
        }
        if self.instance.exists() {
            note(
                fs::remove_dir(&self.instance)
                    .with_context(|| format!("removing {}", self.instance.display())),
            );
        }
        for name in std::mem::take(&mut self.events) {
            note(append(
                &self.dir.join("uprobe_events"),
                &format!("-:{GROUP}/{name}\n"),
            ));
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for TracefsProbes {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            eprintln!("xtask: bench: cleaning up tracefs: {e:#}");
        }
    }
}

/// Removes what an interrupted earlier bench may have left.
pub fn remove_stale_probes(dir: &Path) -> Result<()> {
    let instance = dir.join("instances").join(GROUP);
    let events = ["entry", "ret"]
        .into_iter()
        .filter(|name| {
            fs::read_to_string(dir.join("uprobe_events"))
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains(&format!(":{GROUP}/{name} ")))
        })
        .collect::<Vec<_>>();
    if !instance.exists() && events.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: bench: removing tracefs probes left by an earlier run");
    TracefsProbes {
        dir: dir.to_owned(),
        enabled: instance.join("events").join(GROUP).exists(),
        instance,
        events,
    }
    .detach()
}

/// What tracefs holds after the bench: nothing of ours, and whose uprobes are left.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TracefsAfter {
    pub uprobe_events_empty: bool,
    /// The bench's own uprobe_events lines still there (an error).
    pub ours_left: Vec<String>,
    /// Anyone else's uprobe_events lines.
    pub others: Vec<String>,
    pub instance_left: bool,
}

impl TracefsAfter {
    pub fn read(dir: &Path) -> Result<Self> {
        let text = fs::read_to_string(dir.join("uprobe_events"))?;
        let (ours_left, others): (Vec<String>, Vec<String>) = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .partition(|l| l.contains(&format!(":{GROUP}/")));
        Ok(TracefsAfter {
            uprobe_events_empty: ours_left.is_empty() && others.is_empty(),
            ours_left,
            others,
            instance_left: dir.join("instances").join(GROUP).exists(),
        })
    }
}
