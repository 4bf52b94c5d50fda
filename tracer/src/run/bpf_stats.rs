//! `CUDATRACE_BPF_STATS=1` (hidden, for the benchmarks): the kernel's run time and run
//! count of each of this run's eBPF programs, printed on stderr when tracing ends, so that
//! cudatrace's cost per call splits into the uprobe trap and its own programs' time.
//!
//! The statistics are turned on for the run with `BPF_ENABLE_STATS` (as
//! `kernel.bpf_stats_enabled=1` does, and back off when the run ends); they cost every
//! program run on the host two clock reads, so benchmarks time them as a condition of
//! their own. Each program's figures come from `/proc/self/fdinfo` of the program fds this
//! process holds (the copies loaded for uprobe_multi included), its name from the kernel's
//! program info.

use std::{collections::BTreeMap, fs, os::fd::OwnedFd, sync::OnceLock};

/// The environment variable that asks for the statistics.
pub const ENV: &str = "CUDATRACE_BPF_STATS";

/// Holds statistics on for as long as the process lives.
static ENABLED: OnceLock<Option<OwnedFd>> = OnceLock::new();

/// Whether the run was asked for statistics.
pub fn requested() -> bool {
    std::env::var_os(ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Turns the kernel's program statistics on when requested; a failure is said, not fatal.
pub fn enable() {
    if !requested() {
        return;
    }
    ENABLED.get_or_init(|| match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => Some(fd),
        Err(e) => {
            eprintln!("cudatrace: bpf-stats: cannot enable program statistics: {e}");
            None
        }
    });
}

/// One program's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramStats {
    pub id: u32,
    pub run_cnt: u64,
    pub run_time_ns: u64,
}

/// Parses a program fd's fdinfo; `None` for any other fd.
pub fn parse_fdinfo(text: &str) -> Option<ProgramStats> {
    let mut fields = BTreeMap::new();
    for line in text.lines() {
        let (key, value) = line.split_once(':')?;
        fields.insert(key.trim(), value.trim());
    }
    let number = |key: &str| fields.get(key)?.parse::<u64>().ok();
    Some(ProgramStats {
        id: u32::try_from(number("prog_id")?).ok()?,
        run_cnt: number("run_cnt")?,
        run_time_ns: number("run_time_ns")?,
    })
}

/// This process's programs by id (a program held through two fds counts once).
fn own_programs() -> BTreeMap<u32, ProgramStats> {
    let mut programs = BTreeMap::new();
    let Ok(fds) = fs::read_dir("/proc/self/fd") else {
        return programs;
    };
    for fd in fds.flatten() {
        let Ok(target) = fs::read_link(fd.path()) else {
            continue;
        };
        if target.as_os_str() != "anon_inode:bpf-prog" {
            continue;
        }
        let info = format!("/proc/self/fdinfo/{}", fd.file_name().to_string_lossy());
        if let Some(stats) = fs::read_to_string(info)
            .ok()
            .as_deref()
            .and_then(parse_fdinfo)
        {
            programs.insert(stats.id, stats);
        }
    }
    programs
}

/// The line printed for one program.
pub fn line(name: &str, stats: &ProgramStats) -> String {
    let per_run = if stats.run_cnt == 0 {
        0.0
    } else {
        stats.run_time_ns as f64 / stats.run_cnt as f64
    };
    format!(
        "cudatrace: bpf-stats {name} id={} run_cnt={} run_time_ns={} ns_per_run={per_run:.1}",
        stats.id, stats.run_cnt, stats.run_time_ns
    )
}

/// Prints every program's figures, when requested. Called before the probes are detached.
pub fn report() {
    if !requested() {
        return;
    }
    let programs = own_programs();
    let mut names = BTreeMap::new();
    for info in aya::programs::loaded_programs().flatten() {
        if programs.contains_key(&info.id()) {
            names.insert(info.id(), info.name_as_str().unwrap_or("?").to_owned());
        }
    }
    for (id, stats) in &programs {
        let name = names.get(id).map_or("?", String::as_str);
        eprintln!("{}", line(name, stats));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_fdinfo_gives_id_count_and_time() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1063\nprog_type:\t2\n\
                    prog_jited:\t1\nprog_tag:\t3b185187f1855c4c\nmemlock:\t4096\n\
                    prog_id:\t312\nrun_time_ns:\t123456\nrun_cnt:\t2000\n\
                    recursion_misses:\t0\nverified_insns:\t551\n";
        let stats = parse_fdinfo(text).unwrap();
        assert_eq!(
            stats,
            ProgramStats {
                id: 312,
                run_cnt: 2000,
                run_time_ns: 123456
            }
        );
        assert_eq!(
            line("call_enter", &stats),
            "cudatrace: bpf-stats call_enter id=312 run_cnt=2000 run_time_ns=123456 ns_per_run=61.7"
        );
        // A map's fdinfo has no program id.
        assert_eq!(parse_fdinfo("pos:\t0\nmap_type:\t2\nmap_id:\t7\n"), None);
    }
}
