//! The README's table of kernels, made from what a run found: each guest's `cudatrace
//! doctor --json` and the suites it passed (`vm-test`), and the host's doctor after its
//! suites passed (`cargo xtask test`). Each run records what it found under
//! `target/vm/support/`; `cargo xtask kernel-table` writes the table into the README between
//! its markers, and `cargo xtask test` (CI) fails where the README's table is not the one
//! its own run makes, so the table says what CI ran.
//!
//! The arm64 guests are not in CI (docs/vm-test.md says why): their records are kept in
//! the repository instead (`docs/kernel-support/`, written by `vm-test --arch arm64`), with
//! the day they ran, and their rows say they come from that command, not from CI.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// The lines of the README the table goes between.
pub const BEGIN: &str =
    "<!-- kernel-table: made by `cargo xtask kernel-table` from CI's run; do not edit -->";
pub const END: &str = "<!-- kernel-table end -->";

/// The guest prints its doctor's JSON on one results line after this.
pub const DOCTOR_MARK: &str = "vm-test: doctor ";

/// The stacks suite's test that compares every interpreter's stacks with CPython's, and
/// the interpreters it runs (tracer/tests/stacks.rs, `pythons()`).
const EVERY_STACK: &str = "every_stack_is_the_one_cpython_gives_on_each_interpreter";
const STACKS_PYTHONS: &str = "Debian 3.11, pyenv 3.11.7, Debian 3.13, 3.14";
/// The interpreters of the arm64 guests' stacks suite: the guest root's own 3.11 and the
/// arm64 Debian root's 3.13 and 3.14 (pyenv's are x86-64 programs).
const ARM64_STACKS_PYTHONS: &str = "Debian 3.11, 3.13, 3.14";

/// What one machine (a guest, or the host) was found to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// `5.10`, `6.1`, `6.12`, or the host's major.minor.
    pub kernel: String,
    pub arch: String,
    /// `host` or `guest`.
    pub place: String,
    /// Doctor's checks: name, whether it passed.
    pub doctor: BTreeMap<String, bool>,
    /// Suites and the tests of each that passed; `None`: every suite (the host).
    pub suites: Option<Vec<(String, u64)>>,
    /// Whether [`EVERY_STACK`] passed there.
    pub every_stack: bool,
    /// Tests that failed there.
    #[serde(default)]
    pub failed: u64,
    /// Records kept in the repository (not made by CI): the command and the day it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran: Option<String>,
    /// Records kept in the repository: the interpreters their stacks suite ran (a record
    /// without it ran Debian's 3.11 alone, as the arm64 guests did before 2026-11-28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pythons: Option<String>,
}

fn dir(root: &Path) -> PathBuf {
    root.join("target/vm/support")
}

/// Where the records of runs CI does not make are kept, in the repository.
fn kept_dir(root: &Path) -> PathBuf {
    root.join("docs/kernel-support")
}

/// Keeps `record` for the table, replacing the one of the same machine: under target/ for
/// CI's runs, in the repository (with the day) for the arm64 guests.
pub fn keep(root: &Path, record: &Record) -> Result<()> {
    let mut record = record.clone();
    let dir = if record.arch == "aarch64" {
        record.ran = Some(format!("`vm-test --arch arm64`, {}", today()?));
        record.pythons = Some(ARM64_STACKS_PYTHONS.into());
        kept_dir(root)
    } else {
        dir(root)
    };
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!(
        "{}-{}-{}.json",
        record.place, record.arch, record.kernel
    ));
    let mut text = serde_json::to_vec_pretty(&record)?;
    text.push(b'\n');
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// Today's date (UTC), as `date -u +%F` gives it.
fn today() -> Result<String> {
    let output = std::process::Command::new("date")
        .args(["-u", "+%F"])
        .output()
        .context("running date")?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The records kept: the host first, then CI's guests, then those kept in the repository,
/// by kernel, newest first.
fn records(root: &Path) -> Result<Vec<Record>> {
    let mut records = Vec::new();
    let dir = dir(root);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(_) => bail!(
            "no run recorded in {}: run `cargo xtask test` (or vm-test) first",
            dir.display()
        ),
    };
    let kept = fs::read_dir(kept_dir(root)).into_iter().flatten();
    for entry in entries.chain(kept) {
        let path = entry?.path();
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        records.push(
            serde_json::from_str::<Record>(&text)
                .with_context(|| format!("{} is not a record", path.display()))?,
        );
    }
    records.sort_by_key(|r| {
        let version: Vec<u32> = r.kernel.split('.').filter_map(|p| p.parse().ok()).collect();
        (
            r.place != "host",
            r.ran.is_some(),
            r.arch.clone(),
            std::cmp::Reverse(version),
        )
    });
    Ok(records)
}

/// A guest's record from its results: the doctor line and each suite's passed tests.
pub fn guest_record(kernel: &str, arch: &str, results: &str) -> Record {
    let doctor = results
        .lines()
        .find_map(|line| line.strip_prefix(DOCTOR_MARK))
        .map(doctor_checks)
        .unwrap_or_default();
    let summary = super::boot::Summary::of(results);
    let suites = summary.suites;
    let every_stack = results
        .lines()
        .any(|line| line.starts_with(&format!("test {EVERY_STACK} ... ok")));
    Record {
        kernel: kernel.to_owned(),
        arch: arch.to_owned(),
        place: "guest".to_owned(),
        doctor,
        suites: Some(suites),
        every_stack,
        failed: summary.failed,
        ran: None,
        pythons: None,
    }
}

/// Doctor's `--json` as check name to pass.
pub fn doctor_checks(json: &str) -> BTreeMap<String, bool> {
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap_or_default();
    value["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|check| Some((check["name"].as_str()?.to_owned(), check["ok"].as_bool()?)))
        .collect()
}

/// The table's markdown.
pub fn render(records: &[Record]) -> String {
    let mut out = String::from(
        "| kernel | arch | `run` | probes told apart by | `uprobe_multi` | `--kernel` | \
         `--stacks` | suites passed there (tests) |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in records {
        let ok = |name: &str| r.doctor.get(name).copied().unwrap_or(false);
        let yes = |b: bool| if b { "yes" } else { "no" };
        let kernel = match (r.place.as_str(), &r.ran) {
            ("host", _) => format!("{} (host)", r.kernel),
            (_, None) => format!("{} (QEMU guest)", r.kernel),
            (_, Some(ran)) => format!("{} (QEMU guest; not in CI: {ran})", r.kernel),
        };
        let kernel_hooks = match (ok("kprobes"), ok("func_ip")) {
            (true, true) => "kprobes and tracepoints",
            (true, false) => "tracepoints (kprobes refused: no `bpf_get_func_ip`)",
            _ => "syscall tracepoints (no kprobes)",
        };
        let told = if ok("attach_cookie") {
            "attach cookie"
        } else {
            "the address it fired at"
        };
        let stacks_passed = r
            .suites
            .iter()
            .flatten()
            .find(|(name, _)| name == "stacks")
            .map_or(0, |(_, passed)| *passed);
        // On arm64 the suite's interpreters are the guest root's own and the arm64 Debian
        // root's (pyenv's are x86-64 programs), as its record says.
        let pythons = match (&r.pythons, r.arch.as_str()) {
            (Some(pythons), _) => pythons.as_str(),
            (None, "aarch64") => "Debian 3.11",
            (None, _) => STACKS_PYTHONS,
        };
        let stacks = if r.every_stack || r.suites.is_none() {
            format!("exact on {pythons}")
        } else if stacks_passed > 0 {
            // Per-symbol links' test compares Debian 3.11's stacks with CPython's.
            format!("exact on Debian 3.11 (stacks: {stacks_passed} passed)")
        } else {
            "not run".to_owned()
        };
        let mut suites = match &r.suites {
            None => "every suite".to_owned(),
            Some(suites) => suites
                .iter()
                .map(|(name, passed)| format!("{name} {passed}"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        if r.failed > 0 {
            suites.push_str(&format!("; **{} failed**", r.failed));
        }
        out.push_str(&format!(
            "| {kernel} | {} | {} | {told} | {} | {kernel_hooks} | {stacks} | {suites} |\n",
            r.arch,
            yes(ok("uprobes")),
            yes(ok("uprobe_multi")),
        ));
    }
    out
}

/// The README with `table` between the markers.
fn with_table(readme: &str, table: &str) -> Result<String> {
    let (Some(begin), Some(end)) = (readme.find(BEGIN), readme.find(END)) else {
        bail!("the README has no kernel table markers ({BEGIN} ... {END})");
    };
    Ok(format!(
        "{}{BEGIN}\n{table}{}",
        &readme[..begin],
        &readme[end..]
    ))
}

/// `cargo xtask kernel-table`: writes the table of the recorded runs into the README.
pub fn write(root: &Path) -> Result<()> {
    let path = root.join("README.md");
    let readme = fs::read_to_string(&path)?;
    let table = render(&records(root)?);
    fs::write(&path, with_table(&readme, &table)?)?;
    eprintln!("xtask: kernel-table: README.md's table:\n{table}");
    Ok(())
}

/// CI: fails where the README's table is not the one the recorded runs make.
pub fn check(root: &Path) -> Result<()> {
    let readme = fs::read_to_string(root.join("README.md"))?;
    let table = render(&records(root)?);
    if with_table(&readme, &table)? != readme {
        bail!(
            "README.md's kernel table is not what this run found; it found:\n{table}\n\
             run `cargo xtask kernel-table` and commit README.md"
        );
    }
    eprintln!("xtask: README.md's kernel table is what this run found");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESULTS: &str = "vm-test: guest 5.10.0-32-cloud-amd64 up after 1.2 s, 2 cpus\n\
        vm-test: doctor {\"checks\":[{\"name\":\"uprobes\",\"ok\":true},\
        {\"name\":\"attach_cookie\",\"ok\":false},{\"name\":\"kprobes\",\"ok\":true},\
        {\"name\":\"func_ip\",\"ok\":false}],\"ready\":true}\n\
        vm-test: === selftest\ntest a ... ok <1.0s>\n\
        test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n\
        vm-test: === selftest took 3 s\nvm-test: === stacks\n\
        test every_stack_is_the_one_cpython_gives_on_each_interpreter ... ok <9.0s>\n\
        test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 13 filtered out\n\
        vm-test: === stacks took 30 s\n";

    #[test]
    fn a_guests_results_give_its_record_and_row() {
        let record = guest_record("5.10", "x86_64", RESULTS);
        assert_eq!(
            record.suites,
            Some(vec![("selftest".into(), 1), ("stacks".into(), 2)])
        );
        assert!(record.every_stack);
        assert_eq!(record.doctor.get("attach_cookie"), Some(&false));
        assert_eq!(
            render(&[record]).lines().nth(2).unwrap(),
            "| 5.10 (QEMU guest) | x86_64 | yes | the address it fired at | no | \
             tracepoints (kprobes refused: no `bpf_get_func_ip`) | exact on Debian 3.11, \
             pyenv 3.11.7, Debian 3.13, 3.14 | selftest 1, stacks 2 |"
        );
    }

    #[test]
    fn a_record_kept_in_the_repository_says_where_it_ran_and_what_failed() {
        let mut record = guest_record("6.12", "aarch64", RESULTS);
        record.ran = Some("`vm-test --arch arm64`, 2026-11-27".into());
        record.failed = 1;
        let row = render(&[record]).lines().nth(2).unwrap().to_owned();
        assert!(
            row.starts_with(
                "| 6.12 (QEMU guest; not in CI: `vm-test --arch arm64`, 2026-11-27) | aarch64 |"
            ),
            "{row}"
        );
        assert!(
            row.ends_with("| exact on Debian 3.11 | selftest 1, stacks 2; **1 failed** |"),
            "{row}"
        );
    }

    /// An arm64 record kept since the guests trace the arm64 Debian root's 3.13 and 3.14
    /// says so; one kept before (no `pythons`) still says Debian 3.11 alone.
    #[test]
    fn a_kept_record_names_the_interpreters_its_stacks_suite_ran() {
        let mut record = guest_record("6.12", "aarch64", RESULTS);
        record.ran = Some("`vm-test --arch arm64`, 2026-11-28".into());
        record.pythons = Some(ARM64_STACKS_PYTHONS.into());
        let row = render(&[record]).lines().nth(2).unwrap().to_owned();
        assert!(
            row.ends_with("| exact on Debian 3.11, 3.13, 3.14 | selftest 1, stacks 2 |"),
            "{row}"
        );
        let text = serde_json::to_string(&guest_record("6.1", "aarch64", RESULTS)).unwrap();
        assert!(!text.contains("pythons"), "{text}");
        let old: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(old.pythons, None);
    }

    #[test]
    fn the_table_goes_between_the_markers_and_nowhere_else() {
        let readme = format!("# x\n\n{BEGIN}\nold\n{END}\nafter\n");
        assert_eq!(
            with_table(&readme, "| t |\n").unwrap(),
            format!("# x\n\n{BEGIN}\n| t |\n{END}\nafter\n")
        );
        assert!(with_table("no markers", "").is_err());
    }
}
