//! `-o`'s patterns, so that one command line names a different trace on every node and
//! rank: `%h` the host name, `%r` the rank the launcher gave this process, `%p`
//! cudatrace's own pid, `%t` when cudatrace started (UTC), `%%` a `%`.

use std::{
    ffi::OsString,
    os::unix::ffi::{OsStrExt, OsStringExt},
    path::{Path, PathBuf},
    time::SystemTime,
};

/// The launchers' rank variables, in the order they are looked at: torchrun's (and
/// PyTorch's `env://`), Slurm's `srun`, Open MPI's `mpirun`, MPICH's and Intel MPI's.
pub const RANK_VARIABLES: [&str; 4] = ["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"];

/// What the patterns stand for in this run.
pub struct NameContext {
    pub host: String,
    /// The first of [`RANK_VARIABLES`] set: its name and value (UTF-8 or not).
    pub rank: Option<(&'static str, OsString)>,
    pub pid: u32,
    pub start: SystemTime,
}

impl NameContext {
    /// This process's: the host name, the rank from its environment, its pid, now.
    pub fn current() -> Self {
        NameContext {
            host: super::header::host_name(),
            rank: RANK_VARIABLES
                .iter()
                .find_map(|name| Some((*name, std::env::var_os(name)?))),
            pid: std::process::id(),
            start: SystemTime::now(),
        }
    }
}

/// `pattern` with its `%` sequences replaced; a path without `%` comes back as it is.
pub fn expand(pattern: &Path, context: &NameContext) -> Result<PathBuf, String> {
    let bytes = pattern.as_os_str().as_bytes();
    if !bytes.contains(&b'%') {
        return Ok(pattern.to_owned());
    }
    let mut out = Vec::with_capacity(bytes.len() + 32);
    let mut rest = bytes.iter();
    while let Some(byte) = rest.next() {
        if *byte != b'%' {
            out.push(*byte);
            continue;
        }
        match rest.next() {
            Some(b'%') => out.push(b'%'),
            Some(b'h') => out.extend(safe_host(&context.host).bytes()),
            Some(b'p') => out.extend(context.pid.to_string().bytes()),
            Some(b't') => out.extend(utc_stamp(context.start).bytes()),
            Some(b'r') => out.extend(rank(context)?.bytes()),
            Some(other) => {
                return Err(format!(
                    "-o {}: %{} is not a pattern (%h host, %r rank, %p pid, %t start time, \
                     %% a %)",
                    pattern.display(),
                    char::from(*other)
                ));
            }
            None => {
                return Err(format!(
                    "-o {}: a lone % at the end (write %% for a %)",
                    pattern.display()
                ));
            }
        }
    }
    Ok(PathBuf::from(OsString::from_vec(out)))
}

/// `%h`: the host name as one path component: no `/`, and never `.`, `..` or empty
/// (their dots become `_`), so it cannot climb out of the folder it names.
fn safe_host(host: &str) -> String {
    if host.chars().all(|c| c == '.') {
        return "_".repeat(host.len().max(1));
    }
    host.replace('/', "_")
}

/// `%r`: the launcher's rank, a number; an error naming the variables when none is set.
fn rank(context: &NameContext) -> Result<String, String> {
    match &context.rank {
        Some((name, value)) => match value.to_str() {
            Some(rank) if !rank.is_empty() && rank.bytes().all(|b| b.is_ascii_digit()) => {
                Ok(rank.to_owned())
            }
            Some(other) => Err(format!("-o uses %r but {name} is {other:?}, not a rank")),
            None => Err(format!(
                "-o uses %r but {name} is not UTF-8 ({value:?}), not a rank"
            )),
        },
        None => Err(format!(
            "-o uses %r but none of {} is set: launchers set them for the processes they \
             start (torchrun sets RANK for its workers, not for the node agent: name a node's \
             trace with %h, or run cudatrace under srun/mpirun)",
            RANK_VARIABLES.join(", ")
        )),
    }
}

/// `20261126T120501Z`: sortable, no `:` (which some file systems and `scp` mind).
fn utc_stamp(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time)
        .to_string()
        .replace(['-', ':'], "")
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn context(rank: Option<(&'static str, &str)>) -> NameContext {
        NameContext {
            host: "gpu-7".into(),
            rank: rank.map(|(name, value)| (name, value.into())),
            pid: 4242,
            start: UNIX_EPOCH + Duration::from_secs(1_795_265_558),
        }
    }

    #[test]
    fn patterns_name_the_host_rank_pid_and_start() {
        let expanded = expand(
            Path::new("traces/%h-%r-%p-%t-100%%.jsonl"),
            &context(Some(("SLURM_PROCID", "3"))),
        );
        assert_eq!(
            expanded,
            Ok(PathBuf::from(
                "traces/gpu-7-3-4242-20261121T125238Z-100%.jsonl"
            ))
        );
        assert_eq!(
            expand(Path::new("plain.jsonl"), &context(None)),
            Ok(PathBuf::from("plain.jsonl"))
        );
    }

    #[test]
    fn a_rank_that_is_not_there_or_not_a_number_and_unknown_patterns_are_errors() {
        let missing = expand(Path::new("%r.jsonl"), &context(None)).unwrap_err();
        assert!(missing.contains("none of RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK"));
        let bad = expand(Path::new("%r.jsonl"), &context(Some(("RANK", "a/b")))).unwrap_err();
        assert_eq!(bad, r#"-o uses %r but RANK is "a/b", not a rank"#);
        let unknown = expand(Path::new("%x.jsonl"), &context(None)).unwrap_err();
        assert!(unknown.starts_with("-o %x.jsonl: %x is not a pattern"));
        assert!(expand(Path::new("t%"), &context(None)).is_err());
    }

    #[test]
    fn a_rank_that_is_not_utf8_is_named_not_taken_for_unset() {
        let context = NameContext {
            rank: Some(("RANK", OsString::from_vec(vec![b'1', 0xff]))),
            ..context(None)
        };
        assert_eq!(
            expand(Path::new("%r.jsonl"), &context).unwrap_err(),
            r#"-o uses %r but RANK is not UTF-8 ("1\xFF"), not a rank"#
        );
    }

    #[test]
    fn a_host_named_dot_or_dot_dot_stays_one_folder_down() {
        for (host, expanded) in [
            ("..", "traces/__/t.jsonl"),
            (".", "traces/_/t.jsonl"),
            ("", "traces/_/t.jsonl"),
            ("a/../b", "traces/a_.._b/t.jsonl"),
            ("node..1", "traces/node..1/t.jsonl"),
        ] {
            let context = NameContext {
                host: host.into(),
                ..context(None)
            };
            assert_eq!(
                expand(Path::new("traces/%h/t.jsonl"), &context),
                Ok(PathBuf::from(expanded)),
                "{host:?}"
            );
        }
    }

    #[test]
    fn ranks_come_from_the_first_launcher_variable_set() {
        assert_eq!(RANK_VARIABLES[0], "RANK");
        assert_eq!(
            expand(Path::new("r%r"), &context(Some(("PMI_RANK", "12")))),
            Ok(PathBuf::from("r12"))
        );
    }
}
