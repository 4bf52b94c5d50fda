//! Plans: a probe set bound to one library file. Planning matches the set's catalog
//! against the file's exports (every listed symbol and its variants, each address once) and
//! numbers the probes. The numbers are the attach cookies and index the `SPECS` map, so they
//! are unique across all the plans of a run: a second library is one more plan.

use std::collections::HashMap;

use super::{
    library::{Library, LibraryFile},
    probe_set::ProbeSet,
};
use crate::{
    catalog::FnSpec,
    exit::{ExitCode, Failure},
};

/// What to do when a catalog function is absent from the library or fails to attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MissingProbes {
    /// Stop with an error.
    Error,
    /// Print one line naming them and go on.
    Warn,
    /// Go on silently (they are still listed in the trace header).
    Ignore,
}

impl MissingProbes {
    /// Applies the policy to `names`, functions that are `why` (`not exported by libcuda`,
    /// `failed to attach`).
    pub fn apply(self, why: &str, names: &[&str]) -> Result<(), Failure> {
        match self {
            MissingProbes::Ignore => Ok(()),
            MissingProbes::Warn => {
                eprintln!(
                    "cudatrace: {} functions {why}: {}",
                    names.len(),
                    names.join(", ")
                );
                Ok(())
            }
            MissingProbes::Error => Err(Failure::new(
                ExitCode::ProbesMissing,
                anyhow::anyhow!(
                    "{} functions {why}: {} (--missing-probes warn to go on without them)",
                    names.len(),
                    names.join(", ")
                ),
            )),
        }
    }
}

/// One symbol to attach.
#[derive(Clone, Debug)]
pub struct PlannedProbe {
    /// The attach cookie, and the index in the `SPECS` map: unique across plans.
    pub id: u32,
    /// The id of its plan's library file (the trace's `lib`).
    pub library: u32,
    pub symbol: String,
    pub spec: &'static FnSpec,
    pub file_offset: u64,
}

/// One probe set bound to one library file.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The library id: the plan's place among the run's plans, 0 first.
    pub id: u32,
    pub set: &'static ProbeSet,
    pub library: LibraryFile,
    /// In id order.
    pub probes: Vec<PlannedProbe>,
    /// Catalog functions none of whose symbols the library exports.
    pub missing: Vec<&'static str>,
    /// Exported names skipped because another name shares their address.
    pub aliases: Vec<(String, String)>,
}

impl Plan {
    /// Matches `set`'s catalog against `library`'s exports, numbering the probes from
    /// `first_id`; `id` is the library's.
    pub fn new(set: &'static ProbeSet, library: &Library, id: u32, first_id: u32) -> Self {
        let mut plan = Plan {
            id,
            set,
            library: library.file.clone(),
            probes: Vec::new(),
            missing: Vec::new(),
            aliases: Vec::new(),
        };
        let mut by_offset: HashMap<u64, String> = HashMap::new();
        for spec in set.catalog {
            let mut found = false;
            for symbol in spec.symbols {
                let variants = std::iter::once(symbol.to_string()).chain(
                    set.variants
                        .iter()
                        .map(|suffix| format!("{symbol}{suffix}")),
                );
                for name in variants {
                    let Some(export) = library.functions.get(&name) else {
                        continue;
                    };
                    found = true;
                    if let Some(first) = by_offset.get(&export.file_offset) {
                        plan.aliases.push((name, first.clone()));
                        continue;
                    }
                    by_offset.insert(export.file_offset, name.clone());
                    plan.probes.push(PlannedProbe {
                        id: first_id + plan.probes.len() as u32,
                        library: id,
                        symbol: name,
                        spec,
                        file_offset: export.file_offset,
                    });
                }
            }
            if !found {
                plan.missing.push(spec.name());
            }
        }
        plan
    }
}

/// Every plan of a run; probe ids follow one another across them.
#[derive(Clone, Debug, Default)]
pub struct Plans {
    plans: Vec<Plan>,
}

impl Plans {
    /// Plans `set` on `library`, its ids after those already planned.
    pub fn add(&mut self, set: &'static ProbeSet, library: &Library) -> &Plan {
        let plan = Plan::new(
            set,
            library,
            self.plans.len() as u32,
            self.probe_count() as u32,
        );
        self.plans.push(plan);
        self.plans.last().expect("just pushed")
    }

    /// The plan of the library with this id.
    pub fn get(&self, id: u32) -> Option<&Plan> {
        self.plans.get(id as usize)
    }

    /// The plan of the file with this device and inode.
    pub fn of_file(&self, device: u64, inode: u64) -> Option<&Plan> {
        self.plans
            .iter()
            .find(|plan| plan.library.device == device && plan.library.inode == inode)
    }

    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Plan> {
        self.plans.iter()
    }

    /// The plan of `set`, if it was planned.
    pub fn of(&self, set: &ProbeSet) -> Option<&Plan> {
        self.plans.iter().find(|plan| std::ptr::eq(plan.set, set))
    }

    /// Every planned probe, in id order.
    pub fn probes(&self) -> impl Iterator<Item = &PlannedProbe> {
        self.plans.iter().flat_map(|plan| &plan.probes)
    }

    pub fn probe_count(&self) -> usize {
        self.plans.iter().map(|plan| plan.probes.len()).sum()
    }

    /// The probe with attach cookie `id`.
    pub fn probe(&self, id: u32) -> Option<&PlannedProbe> {
        let mut first = 0;
        for plan in &self.plans {
            let index = (id as usize).checked_sub(first)?;
            if let Some(probe) = plan.probes.get(index) {
                return Some(probe);
            }
            first += plan.probes.len();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        catalog::CATALOG,
        probes::{library::ExportedFn, probe_set::LIBCUDA},
    };

    fn library(exports: &[(&str, u64)]) -> Library {
        let functions = exports
            .iter()
            .map(|(name, offset)| {
                (
                    name.to_string(),
                    ExportedFn {
                        name: name.to_string(),
                        file_offset: *offset,
                    },
                )
            })
            .collect();
        Library {
            file: LibraryFile {
                path: "/x".into(),
                ..LibraryFile::default()
            },
            functions,
        }
    }

    #[test]
    fn plan_attaches_variants_once_per_address_and_lists_missing() {
        let lib = library(&[
            ("cuMemAlloc_v2", 0x100),
            ("cuLaunchKernel", 0x200),
            ("cuLaunchKernel_ptsz", 0x210),
            ("cuMemcpyHtoD_v2", 0x300),
            ("cuMemcpyHtoD_v2_ptds", 0x300),
            ("cuSomethingElse", 0x400),
        ]);
        let plan = Plan::new(&LIBCUDA, &lib, 0, 0);
        let names: Vec<&str> = plan.probes.iter().map(|p| p.symbol.as_str()).collect();
        assert_eq!(
            names,
            [
                "cuMemAlloc_v2",
                "cuMemcpyHtoD_v2",
                "cuLaunchKernel",
                "cuLaunchKernel_ptsz"
            ]
        );
        assert_eq!(
            plan.probes.iter().map(|p| p.id).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert_eq!(
            plan.aliases,
            [("cuMemcpyHtoD_v2_ptds".into(), "cuMemcpyHtoD_v2".into())]
        );
        assert!(plan.missing.contains(&"cuInit"));
        assert!(!plan.missing.contains(&"cuMemAlloc_v2"));
        assert_eq!(plan.missing.len(), CATALOG.len() - 3);
    }

    #[test]
    fn ids_are_unique_across_plans() {
        let first = library(&[("cuInit", 0x10), ("cuMemAlloc_v2", 0x20)]);
        let second = library(&[("cuLaunchKernel", 0x30)]);
        let mut plans = Plans::default();
        plans.add(&LIBCUDA, &first);
        plans.add(&LIBCUDA, &second);
        let ids: Vec<(u32, &str)> = plans.probes().map(|p| (p.id, p.symbol.as_str())).collect();
        assert_eq!(
            ids,
            [(0, "cuInit"), (1, "cuMemAlloc_v2"), (2, "cuLaunchKernel")]
        );
        assert_eq!(plans.probe(2).unwrap().symbol, "cuLaunchKernel");
        assert_eq!(
            (
                plans.probe(1).unwrap().library,
                plans.probe(2).unwrap().library
            ),
            (0, 1)
        );
        assert_eq!(plans.probe(1).unwrap().symbol, "cuMemAlloc_v2");
        assert!(plans.probe(3).is_none());
        assert_eq!(plans.probe_count(), 3);
    }
}
