//! Whether a job's traces are of one run, checked before their collectives are matched:
//! a communicator's id is not proof (with `NCCL_COMM_ID` set, every run's communicator
//! has the same one). Two traces of one run overlap in time, and give each communicator
//! they share the same number of ranks, and where their headers have a launcher's job id
//! (`job_ids`: `SLURM_JOB_ID`, `TORCHELASTIC_RUN_ID`...) of the same variable, the same.

use std::collections::BTreeMap;

use super::collect::JobTrace;
use crate::format::format_ns;

/// How far apart two hosts' wall clocks may be (NTP agrees to milliseconds; the clock
/// fit on the collectives comes after the matching, so it cannot be used here).
pub const CLOCK_SLACK_NS: u64 = 1_000_000_000;

/// What the checks compare of a trace, taken once.
pub struct RunFacts<'t> {
    label: &'t str,
    /// On its wall clock: from its start to its last event.
    span: (i128, i128),
    /// Each communicator's number of ranks, as its calls give it.
    sizes: BTreeMap<&'t str, i32>,
    job_ids: &'t BTreeMap<String, String>,
}

impl<'t> RunFacts<'t> {
    pub fn of(trace: &'t JobTrace) -> RunFacts<'t> {
        let start = i128::from(trace.header.start_wall_ns);
        let end = trace
            .last_ts_ns
            .map_or(start, |ts| trace.header.wall_ns(ts).max(start));
        let mut sizes = BTreeMap::new();
        for call in &trace.collectives {
            if let Some(nranks) = call.nranks {
                sizes.entry(call.comm_id.as_str()).or_insert(nranks);
            }
        }
        RunFacts {
            label: &trace.label,
            span: (start, end),
            sizes,
            job_ids: &trace.header.job_ids,
        }
    }
}

/// Why two traces cannot be of one run (`None`: they can).
pub fn mismatch(a: &RunFacts, b: &RunFacts) -> Option<String> {
    for (name, a_id) in a.job_ids {
        if let Some(b_id) = b.job_ids.get(name)
            && a_id != b_id
        {
            return Some(format!(
                "their launcher's jobs differ ({name} {a_id} in {}, {b_id} in {})",
                a.label, b.label
            ));
        }
    }
    let ((a_start, a_end), (b_start, b_end)) = (a.span, b.span);
    let slack = i128::from(CLOCK_SLACK_NS);
    let apart = |first: &RunFacts, end: i128, second: &RunFacts, start: i128| {
        format!(
            "{} starts {} after {} ends (their wall clocks; one run's traces overlap in time)",
            second.label,
            format_ns(u64::try_from(start - end).unwrap_or(u64::MAX)),
            first.label
        )
    };
    if b_start > a_end + slack {
        return Some(apart(a, a_end, b, b_start));
    }
    if a_start > b_end + slack {
        return Some(apart(b, b_end, a, a_start));
    }
    a.sizes.iter().find_map(|(comm_id, a_size)| {
        let b_size = b.sizes.get(comm_id)?;
        (a_size != b_size).then(|| {
            format!(
                "communicator {comm_id} has {a_size} ranks in {} and {b_size} in {}",
                a.label, b.label
            )
        })
    })
}

/// The first two traces (in the order given) that cannot be of one run, and why.
pub fn first_mismatch(traces: &[JobTrace]) -> Option<String> {
    let facts: Vec<RunFacts> = traces.iter().map(RunFacts::of).collect();
    facts.iter().enumerate().find_map(|(index, a)| {
        facts[index + 1..].iter().find_map(|b| {
            mismatch(a, b)
                .map(|why| format!("{} and {} are not of one run: {why}", a.label, b.label))
        })
    })
}

/// Groups of traces that can each be one run, in the order given: each trace joins the
/// first group whose every trace agrees with it.
pub fn runs(traces: &[JobTrace]) -> Vec<Vec<usize>> {
    let facts: Vec<RunFacts> = traces.iter().map(RunFacts::of).collect();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (index, trace) in facts.iter().enumerate() {
        let home = groups.iter_mut().find(|group| {
            group
                .iter()
                .all(|&other| mismatch(&facts[other], trace).is_none())
        });
        match home {
            Some(group) => group.push(index),
            None => groups.push(vec![index]),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::ranks::collect::{CollectiveCall, JobHeader};

    fn trace(label: &str, start_s: u64, last_s: u64, nranks: i32) -> JobTrace {
        JobTrace {
            label: label.into(),
            header: JobHeader {
                start_wall_ns: start_s * 1_000_000_000,
                start_monotonic_ns: 0,
                ..JobHeader::default()
            },
            last_ts_ns: Some((last_s - start_s) * 1_000_000_000),
            collectives: vec![CollectiveCall {
                comm_id: "c0".into(),
                nranks: Some(nranks),
                ..CollectiveCall::default()
            }],
            ..JobTrace::default()
        }
    }

    #[test]
    fn traces_apart_in_time_or_size_are_different_runs() {
        let traces = [
            trace("a", 100, 110, 2),
            trace("b", 101, 111, 2),
            // 19 s after a ends.
            trace("c", 129, 140, 2),
            // At the same time, another size.
            trace("d", 100, 110, 4),
            // Within the slack of c's start.
            trace("e", 120, 128, 2),
        ];
        let facts: Vec<RunFacts> = traces.iter().map(RunFacts::of).collect();
        assert_eq!(mismatch(&facts[0], &facts[1]), None);
        assert_eq!(
            mismatch(&facts[2], &facts[0]).as_deref(),
            Some(
                "c starts 19.000 s after a ends (their wall clocks; one run's traces overlap \
                 in time)"
            )
        );
        assert_eq!(
            mismatch(&facts[0], &facts[3]).as_deref(),
            Some("communicator c0 has 2 ranks in a and 4 in d")
        );
        assert_eq!(runs(&traces), [vec![0, 1], vec![2, 4], vec![3]]);
        // One launcher's job id of each, where both have it.
        let [mut f, mut g] = [trace("f", 100, 110, 2), trace("g", 100, 110, 2)];
        f.header.job_ids.insert("SLURM_JOB_ID".into(), "41".into());
        assert_eq!(mismatch(&RunFacts::of(&f), &RunFacts::of(&g)), None);
        g.header.job_ids.insert("SLURM_JOB_ID".into(), "42".into());
        assert_eq!(
            first_mismatch(&[f, g]).as_deref(),
            Some(
                "f and g are not of one run: their launcher's jobs differ (SLURM_JOB_ID 41 in f, 42 in g)"
            )
        );
    }
}
