//! bpftrace doing the pairing cudatrace does, as a condition beside the floor.

use std::{
    fs::{self, File},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use super::{
    bench_loop::FUNCTION,
    process::{Background, check_interrupted, tail},
};

/// bpftrace in the background with its uprobe and uretprobe on [`FUNCTION`] attached.
pub struct Bpftrace {
    background: Background,
    /// Its stdout and stderr: `ready`, then the histogram when it stops.
    log: PathBuf,
}

impl Bpftrace {
    /// Starts bpftrace on `libcuda` and waits until every probe is attached.
    pub fn attach(libcuda: &Path, log: PathBuf) -> Result<Self> {
        let lib = libcuda.display();
        // The same pairing cudatrace does (entry time per thread, duration at return), kept
        // as a histogram; BEGIN runs once every probe is attached.
        let script = format!(
            "BEGIN {{ printf(\"ready\\n\"); }} \
             uprobe:{lib}:{FUNCTION} {{ @s[tid] = nsecs; }} \
             uretprobe:{lib}:{FUNCTION} /@s[tid]/ {{ @d = hist(nsecs - @s[tid]); delete(@s[tid]); }} \
             END {{ clear(@s); }}"
        );
        let file = File::create(&log)?;
        let child = Command::new("bpftrace")
            .arg("-e")
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("starting bpftrace")?;
        let mut background = Background::new(child, "bpftrace");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            check_interrupted()?;
            let text = fs::read_to_string(&log).unwrap_or_default();
            if text.lines().any(|l| l == "ready") {
                break;
            }
            if let Some(status) = background.try_wait()? {
                bail!("bpftrace exited ({status}) before attaching:\n{text}");
            }
            ensure!(
                Instant::now() < deadline,
                "bpftrace did not attach in 120 s:\n{text}"
            );
            thread::sleep(Duration::from_millis(50));
        }
        Ok(Bpftrace { background, log })
    }

    /// Stops bpftrace (SIGINT: it prints the histogram) and returns what it printed.
    pub fn stop(mut self) -> Result<String> {
        self.background.stop()?;
        Ok(fs::read_to_string(&self.log)?)
    }
}

/// Checks that bpftrace's histogram holds every call made; the calls it holds.
pub fn check_histogram(log: &str, calls: u64) -> Result<u64> {
    let recorded = histogram_total(log);
    ensure!(
        recorded == calls,
        "bpftrace's histogram holds {recorded} calls of {calls}:\n{}",
        tail(log, 2000)
    );
    Ok(recorded)
}

/// Sums the counts of a bpftrace histogram (`[8K, 16K)   297165 |@@@@|`).
fn histogram_total(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with('['))
        .filter_map(|l| {
            let close = l.find([')', ']'])?;
            l[close + 1..]
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpftrace_histogram_counts_are_summed() {
        let text = "Attaching 4 probes...\nready\n\n\n@d: \n\
                    [0]                    2 |@        |\n\
                    [8K, 16K)         297165 |@@@@@@@@@@|\n\
                    [16K, 32K)          2478 |         |\n\n";
        assert_eq!(histogram_total(text), 2 + 297165 + 2478);
    }
}
