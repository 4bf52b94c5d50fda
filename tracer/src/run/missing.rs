//! `--missing-probes`: what a run does about catalog functions a library does not export
//! or that failed to attach, and `--functions` patterns that match nothing.

use crate::{
    exit::{ExitCode, Failure},
    probes::plan::MissingProbes,
};

/// Applies `policy` to `names`, which are `what` (`functions not exported by libcuda`,
/// `functions failed to attach`, `patterns of --functions match no libcuda export`).
pub fn apply(policy: MissingProbes, what: &str, names: &[&str]) -> Result<(), Failure> {
    match policy {
        MissingProbes::Ignore => Ok(()),
        MissingProbes::Warn => {
            warn(what, names);
            Ok(())
        }
        MissingProbes::Error => Err(Failure::new(
            ExitCode::ProbesMissing,
            anyhow::anyhow!(
                "{} {what}: {} (--missing-probes warn to go on without them)",
                names.len(),
                names.join(", ")
            ),
        )),
    }
}

/// One line naming `names`, which are `what`.
pub fn warn(what: &str, names: &[&str]) {
    eprintln!("cudatrace: {} {what}: {}", names.len(), names.join(", "));
}
