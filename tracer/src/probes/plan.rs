//! Plans: a probe set bound to one library file. Planning matches the set's catalog
//! against the file's exports (every listed symbol and its variants, each address once) and
//! numbers the probes. The numbers are the attach cookies and index the `SPECS` map, so they
//! are unique across all the plans of a run: a second library is one more plan.

use std::collections::{HashMap, HashSet};

use super::{
    library::{ExportedFn, Library, LibraryFile},
    probe_set::ProbeSet,
    stack_selection::StackSelection,
};
use crate::catalog::{FnSpec, GENERIC};
use tracer_common::{MAX_LIBRARIES, MAX_PROBES, SLOT_BITS, SLOT_MASK};

/// What to do when a catalog function is absent from the library or fails to attach (the
/// run applies it: `run/missing.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MissingProbes {
    /// Stop with an error.
    Error,
    /// Print one line naming them and go on.
    Warn,
    /// Go on silently (they are still listed in the trace header).
    Ignore,
}

/// Which exported functions to probe (`--functions`): the catalog's, every function of the
/// library, and any matching a glob. Catalog functions are decoded whichever way they are
/// chosen; the others are probed generically ([`GENERIC`]).
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionSelection {
    /// The catalog's functions.
    pub catalog: bool,
    /// Every exported API function of the library (`cu` and a capital, for libcuda).
    pub all: bool,
    /// Exported functions matching one of these (`*`, `?`, `[...]`).
    pub globs: Vec<glob::Pattern>,
    /// `--launch-entry-only`: the launches get the entry program alone.
    pub launch_entry_only: bool,
    /// `--stacks`: the calls whose entry sends the thread's Python stack.
    pub stacks: Option<StackSelection>,
}

impl Default for FunctionSelection {
    fn default() -> Self {
        FunctionSelection {
            catalog: true,
            all: false,
            globs: Vec::new(),
            launch_entry_only: false,
            stacks: None,
        }
    }
}

impl FunctionSelection {
    /// Parses `catalog`, `all`, globs, or a comma-separated mix of them.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut selection = FunctionSelection {
            catalog: false,
            all: false,
            globs: Vec::new(),
            launch_entry_only: false,
            stacks: None,
        };
        for item in text.split(',').map(str::trim) {
            match item {
                "" => return Err("an empty item (two commas, or a trailing comma)".into()),
                "catalog" => selection.catalog = true,
                "all" => {
                    selection.catalog = true;
                    selection.all = true;
                }
                glob => selection.globs.push(
                    glob::Pattern::new(glob).map_err(|e| format!("bad pattern {glob:?}: {e}"))?,
                ),
            }
        }
        Ok(selection)
    }

    /// Whether this selection probes more than the catalog.
    pub fn beyond_catalog(&self) -> bool {
        self.all || !self.globs.is_empty()
    }

    fn matches(&self, set: &ProbeSet, name: &str) -> bool {
        (self.all && (set.is_api_function)(name))
            || self.globs.iter().any(|glob| glob.matches(name))
    }
}

impl std::fmt::Display for FunctionSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut items: Vec<&str> = Vec::new();
        if self.all {
            items.push("all");
        } else if self.catalog {
            items.push("catalog");
        }
        items.extend(self.globs.iter().map(glob::Pattern::as_str));
        f.write_str(&items.join(","))
    }
}

/// One symbol to attach.
#[derive(Clone, Debug)]
pub struct PlannedProbe {
    /// The probe id, the attach cookie's low bits: its library's id above
    /// [`SLOT_BITS`], its symbol's slot in the `SPECS` map below (shared by every copy of
    /// the library). Unique across plans.
    pub id: u32,
    /// The id of its plan's library file (the trace's `lib`).
    pub library: u32,
    pub symbol: String,
    pub spec: &'static FnSpec,
    pub file_offset: u64,
    /// It gets the entry program alone, no return probe: a launch
    /// ([`FnSpec::is_entry_only_launch`]) under `--launch-entry-only`.
    pub entry_only: bool,
    /// `--stacks`: its entry sends the calling thread's Python stack first.
    pub stacks: bool,
}

impl PlannedProbe {
    /// Its attach cookie: the id, and what the entry program needs to know of it without a
    /// lookup (`tracer_common::cookie`). `per_process`: the link is one traced process's.
    pub fn cookie(&self, per_process: bool) -> u64 {
        let mut cookie = u64::from(self.id);
        if per_process {
            cookie |= tracer_common::cookie::PER_PROCESS;
        }
        if self.entry_only {
            cookie |= tracer_common::cookie::ENTRY_ONLY;
        }
        if self.spec.probe_spec().nargs as usize > tracer_common::REGISTER_ARGS {
            cookie |= tracer_common::cookie::STACK_ARGS;
        }
        if self.stacks {
            cookie |= tracer_common::cookie::STACKS;
        }
        cookie
    }

    /// The function it belongs to: the catalog's name, or its own outside the catalog.
    pub fn function(&self) -> &str {
        if self.spec.is_generic() {
            &self.symbol
        } else {
            self.spec.name()
        }
    }
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
    /// `--functions` patterns that match no exported function.
    pub unmatched_globs: Vec<String>,
}

impl Plan {
    /// Matches `set`'s catalog against `library`'s exports; `id` is the library's. With a
    /// `selection` beyond the catalog, the other exported functions it names follow,
    /// probed generically, in name order. The probes are numbered in order until
    /// [`Plans::add`] gives them their slots.
    pub fn new(
        set: &'static ProbeSet,
        library: &Library,
        id: u32,
        selection: &FunctionSelection,
    ) -> Self {
        let mut plan = Plan {
            id,
            set,
            library: library.file.clone(),
            probes: Vec::new(),
            missing: Vec::new(),
            aliases: Vec::new(),
            unmatched_globs: Vec::new(),
        };
        let mut by_offset: HashMap<u64, String> = HashMap::new();
        let mut planned: HashSet<String> = HashSet::new();
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
                    if selection.catalog || selection.matches(set, &name) {
                        planned.insert(name.clone());
                        plan.push(name, spec, export.file_offset, &mut by_offset);
                    }
                }
            }
            if !found && selection.catalog {
                plan.missing.push(spec.name());
            }
        }
        if selection.beyond_catalog() {
            let mut others: Vec<&ExportedFn> = library
                .functions
                .values()
                .filter(|export| {
                    !planned.contains(&export.name) && selection.matches(set, &export.name)
                })
                .collect();
            others.sort_by(|a, b| a.name.cmp(&b.name));
            for export in others {
                let name = export.name.clone();
                plan.push(name, &GENERIC, export.file_offset, &mut by_offset);
            }
        }
        plan.unmatched_globs = selection
            .globs
            .iter()
            .filter(|glob| !library.functions.keys().any(|name| glob.matches(name)))
            .map(|glob| glob.as_str().to_owned())
            .collect();
        for probe in &mut plan.probes {
            probe.entry_only = selection.launch_entry_only && probe.spec.is_entry_only_launch();
            probe.stacks = selection
                .stacks
                .as_ref()
                .is_some_and(|stacks| stacks.includes(probe.spec));
        }
        plan
    }

    /// Plans `name`, unless another name at the same address is planned already.
    fn push(
        &mut self,
        name: String,
        spec: &'static FnSpec,
        file_offset: u64,
        by_offset: &mut HashMap<u64, String>,
    ) {
        if let Some(first) = by_offset.get(&file_offset) {
            self.aliases.push((name, first.clone()));
            return;
        }
        by_offset.insert(file_offset, name.clone());
        self.probes.push(PlannedProbe {
            id: (self.id << SLOT_BITS) | self.probes.len() as u32,
            library: self.id,
            symbol: name,
            spec,
            file_offset,
            entry_only: false,
            stacks: false,
        });
    }
}

/// Every plan of a run, and the `SPECS` slots of their symbols.
#[derive(Clone, Debug, Default)]
pub struct Plans {
    plans: Vec<Plan>,
    /// The slot of each (probe set, symbol): every copy of a library shares its slots.
    slots: HashMap<(u32, String), u32>,
    /// Per plan, its probes by slot (index in `probes`).
    by_slot: Vec<HashMap<u32, usize>>,
}

/// Why a library could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(
        "the probe table is full: {MAX_PROBES} distinct functions are attached already, and \
         this library adds {0} more"
    )]
    TableFull(usize),
    #[error("{MAX_LIBRARIES} libraries are attached already")]
    TooManyLibraries,
}

impl Plans {
    /// Plans `set` on `library`, its probes in the slots of their symbols (new symbols in
    /// new slots). Nothing is planned when the slots or library ids run out.
    pub fn add(
        &mut self,
        set: &'static ProbeSet,
        library: &Library,
        selection: &FunctionSelection,
    ) -> Result<&Plan, PlanError> {
        let id = self.plans.len() as u32;
        if id >= MAX_LIBRARIES {
            return Err(PlanError::TooManyLibraries);
        }
        let mut plan = Plan::new(set, library, id, selection);
        let new: HashSet<&str> = plan
            .probes
            .iter()
            .map(|probe| probe.symbol.as_str())
            .filter(|symbol| !self.slots.contains_key(&(set.index(), symbol.to_string())))
            .collect();
        if self.slots.len() + new.len() > MAX_PROBES as usize {
            return Err(PlanError::TableFull(new.len()));
        }
        let mut by_slot = HashMap::new();
        for (index, probe) in plan.probes.iter_mut().enumerate() {
            let next = self.slots.len() as u32;
            let slot = *self
                .slots
                .entry((set.index(), probe.symbol.clone()))
                .or_insert(next);
            probe.id = (id << SLOT_BITS) | slot;
            by_slot.insert(slot, index);
        }
        self.plans.push(plan);
        self.by_slot.push(by_slot);
        Ok(self.plans.last().expect("just pushed"))
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

    /// Every planned probe, plan by plan.
    pub fn probes(&self) -> impl Iterator<Item = &PlannedProbe> {
        self.plans.iter().flat_map(|plan| &plan.probes)
    }

    pub fn probe_count(&self) -> usize {
        self.plans.iter().map(|plan| plan.probes.len()).sum()
    }

    /// The probe with attach cookie `id`: its library's plan, then its slot there.
    pub fn probe(&self, id: u32) -> Option<&PlannedProbe> {
        let library = (id >> SLOT_BITS) as usize;
        let index = *self.by_slot.get(library)?.get(&(id & SLOT_MASK))?;
        self.plans.get(library)?.probes.get(index)
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
        let plan = Plan::new(&LIBCUDA, &lib, 0, &FunctionSelection::default());
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
    fn cookies_carry_the_entry_only_bit_for_launches_under_the_flag_alone() {
        use tracer_common::cookie;
        let lib = library(&[
            ("cuMemAlloc_v2", 0x100),
            ("cuLaunchKernel", 0x200),
            ("cuLaunchKernelEx_ptsz", 0x300),
        ]);
        let plan = Plan::new(&LIBCUDA, &lib, 0, &FunctionSelection::default());
        let lean_selection = FunctionSelection {
            launch_entry_only: true,
            stacks: None,
            ..FunctionSelection::default()
        };
        let lean = Plan::new(&LIBCUDA, &lib, 0, &lean_selection);
        let cookies: Vec<(&str, u64, u64)> = plan
            .probes
            .iter()
            .zip(&lean.probes)
            .map(|(p, l)| (p.symbol.as_str(), p.cookie(true), l.cookie(false)))
            .collect();
        assert_eq!(
            cookies,
            [
                ("cuMemAlloc_v2", cookie::PER_PROCESS, 0),
                (
                    "cuLaunchKernel",
                    1 | cookie::PER_PROCESS | cookie::STACK_ARGS,
                    1 | cookie::STACK_ARGS | cookie::ENTRY_ONLY
                ),
                (
                    "cuLaunchKernelEx_ptsz",
                    2 | cookie::PER_PROCESS,
                    2 | cookie::ENTRY_ONLY
                ),
            ]
        );
        assert_eq!(
            plan.probes
                .iter()
                .zip(&lean.probes)
                .map(|(p, l)| (p.entry_only, l.entry_only))
                .collect::<Vec<_>>(),
            [(false, false), (false, true), (false, true)]
        );
    }

    #[test]
    fn ids_are_unique_across_plans_and_copies_share_their_slots() {
        let first = library(&[("cuInit", 0x10), ("cuMemAlloc_v2", 0x20)]);
        let second = library(&[("cuLaunchKernel", 0x30), ("cuInit", 0x40)]);
        let mut plans = Plans::default();
        let selection = FunctionSelection::default();
        plans.add(&LIBCUDA, &first, &selection).unwrap();
        plans.add(&LIBCUDA, &second, &selection).unwrap();
        let ids: Vec<(u32, &str)> = plans.probes().map(|p| (p.id, p.symbol.as_str())).collect();
        // The library's id above the slot; cuInit keeps its slot in the second library.
        let second_id = 1 << SLOT_BITS;
        assert_eq!(
            ids,
            [
                (0, "cuInit"),
                (1, "cuMemAlloc_v2"),
                (second_id, "cuInit"),
                (second_id | 2, "cuLaunchKernel")
            ]
        );
        assert_eq!(plans.probe(second_id | 2).unwrap().symbol, "cuLaunchKernel");
        assert_eq!(plans.probe(second_id).unwrap().library, 1);
        assert_eq!(plans.probe(0).unwrap().library, 0);
        assert_eq!(plans.probe(1).unwrap().symbol, "cuMemAlloc_v2");
        assert!(
            plans.probe(2).is_none(),
            "slot 2 is not the first library's"
        );
        assert!(plans.probe(second_id | 1).is_none());
        assert!(plans.probe(2 << SLOT_BITS).is_none());
        assert_eq!(plans.probe_count(), 4);
    }

    #[test]
    fn many_copies_of_a_library_fit_and_a_full_table_is_an_error() {
        let copy = library(&[("cuInit", 0x10), ("cuMemAlloc_v2", 0x20)]);
        let mut plans = Plans::default();
        let all = FunctionSelection::parse("all").unwrap();
        for _ in 0..1000 {
            plans.add(&LIBCUDA, &copy, &all).unwrap();
        }
        assert_eq!(plans.slots.len(), 2, "a thousand copies, two slots");
        // One library of more new functions than the table has room for.
        let names: Vec<(String, u64)> = (0..MAX_PROBES as u64)
            .map(|index| (format!("cuFake{index}"), 0x1000 + index * 16))
            .collect();
        let exports: Vec<(&str, u64)> = names.iter().map(|(n, o)| (n.as_str(), *o)).collect();
        let big = library(&exports);
        match plans.add(&LIBCUDA, &big, &all) {
            Err(PlanError::TableFull(new)) => assert_eq!(new, MAX_PROBES as usize),
            other => panic!("{other:?}"),
        }
        // Nothing of it was planned, and the next copy still fits.
        assert_eq!(plans.iter().count(), 1000);
        assert_eq!(plans.add(&LIBCUDA, &copy, &all).unwrap().id, 1000);
    }

    #[test]
    fn functions_beyond_the_catalog_are_probed_generically_after_it() {
        let lib = library(&[
            ("cuMemAlloc_v2", 0x100),
            ("cuCtxGetDevice", 0x200),
            ("cuCtxGetDevice_v2", 0x210),
            ("cuDeviceGetAttribute", 0x300),
            ("cuGetErrorString", 0x400),
            ("cuGetErrorName", 0x400),
            ("nvInternal", 0x500),
            ("cudbgApiInit", 0x600),
        ]);
        let plan = |text: &str| {
            let selection = FunctionSelection::parse(text).unwrap();
            let plan = Plan::new(&LIBCUDA, &lib, 0, &selection);
            let probes: Vec<(String, String)> = plan
                .probes
                .iter()
                .map(|p| (p.symbol.clone(), p.function().to_owned()))
                .collect();
            (probes, plan)
        };
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };

        let (probes, all) = plan("all");
        assert_eq!(
            probes,
            pairs(&[
                ("cuMemAlloc_v2", "cuMemAlloc_v2"),
                ("cuCtxGetDevice", "cuCtxGetDevice"),
                ("cuCtxGetDevice_v2", "cuCtxGetDevice_v2"),
                ("cuDeviceGetAttribute", "cuDeviceGetAttribute"),
                ("cuGetErrorName", "cuGetErrorName"),
            ])
        );
        assert!(all.probes[0].spec.name() == "cuMemAlloc_v2" && !all.probes[0].spec.is_generic());
        assert!(all.probes[1..].iter().all(|p| p.spec.is_generic()));
        // Same address: probed once.
        assert_eq!(
            all.aliases,
            [("cuGetErrorString".into(), "cuGetErrorName".into())]
        );
        assert_eq!(all.missing.len(), CATALOG.len() - 1);

        // Globs alone: only what they match, catalog functions still decoded.
        let (probes, globbed) = plan("cuCtxGet*,cuMemAlloc*,cuNothing*");
        assert_eq!(
            probes,
            pairs(&[
                ("cuMemAlloc_v2", "cuMemAlloc_v2"),
                ("cuCtxGetDevice", "cuCtxGetDevice"),
                ("cuCtxGetDevice_v2", "cuCtxGetDevice_v2"),
            ])
        );
        assert!(globbed.missing.is_empty(), "no catalog asked for");
        assert_eq!(globbed.unmatched_globs, ["cuNothing*"]);

        let (probes, _) = plan("catalog,cuDevice?etAttribute");
        assert_eq!(
            probes,
            pairs(&[
                ("cuMemAlloc_v2", "cuMemAlloc_v2"),
                ("cuDeviceGetAttribute", "cuDeviceGetAttribute"),
            ])
        );
        let (probes, _) = plan("catalog");
        assert_eq!(probes, pairs(&[("cuMemAlloc_v2", "cuMemAlloc_v2")]));
    }

    #[test]
    fn selections_parse_and_print_back() {
        for text in ["catalog", "all", "cuCtx*", "catalog,cuCtx*,cuDevice[GS]et*"] {
            assert_eq!(FunctionSelection::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(
            FunctionSelection::parse("catalog").unwrap(),
            FunctionSelection::default()
        );
        assert_eq!(
            FunctionSelection::parse("cuA,,cuB").unwrap_err(),
            "an empty item (two commas, or a trailing comma)"
        );
        assert!(
            FunctionSelection::parse("cu[")
                .unwrap_err()
                .starts_with("bad pattern \"cu[\": ")
        );
    }
}
