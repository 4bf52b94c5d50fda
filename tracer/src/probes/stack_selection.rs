//! `--stacks[=WHICH]`: which calls get a Python stack, by what they do (the catalog's
//! roles), not by name. A plan marks the probes it includes; their entry programs send the
//! stack, and `stacks/` decodes what they send.

use crate::catalog::{FnSpec, Role};

/// A family of calls `--stacks` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackFamily {
    /// Kernel and graph launches.
    Launch,
    /// Device, host pinned and physical memory allocated, mapped, reserved or freed, and
    /// IPC memory opened or closed.
    Alloc,
    Copy,
    Memset,
    /// Calls that wait for the device.
    Sync,
    /// Module and library loads.
    Module,
    /// NCCL collectives and point-to-point calls.
    Collective,
}

impl StackFamily {
    pub const ALL: [StackFamily; 7] = [
        StackFamily::Launch,
        StackFamily::Alloc,
        StackFamily::Copy,
        StackFamily::Memset,
        StackFamily::Sync,
        StackFamily::Module,
        StackFamily::Collective,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StackFamily::Launch => "launch",
            StackFamily::Alloc => "alloc",
            StackFamily::Copy => "copy",
            StackFamily::Memset => "memset",
            StackFamily::Sync => "sync",
            StackFamily::Module => "module",
            StackFamily::Collective => "collective",
        }
    }

    /// The family of a function doing `role`, if `--stacks` has one for it.
    pub fn of(role: Role) -> Option<StackFamily> {
        Some(match role {
            Role::Launch | Role::GraphLaunch => StackFamily::Launch,
            Role::DeviceAlloc
            | Role::DeviceFree
            | Role::HostAlloc
            | Role::HostFree
            | Role::PhysicalCreate
            | Role::PhysicalRelease
            | Role::Map
            | Role::Unmap
            | Role::AddressReserve
            | Role::AddressFree
            | Role::IpcOpen
            | Role::IpcClose => StackFamily::Alloc,
            Role::Copy => StackFamily::Copy,
            Role::Memset => StackFamily::Memset,
            Role::Sync(_) => StackFamily::Sync,
            Role::ModuleLoad => StackFamily::Module,
            Role::Collective => StackFamily::Collective,
            Role::Setup
            | Role::Teardown
            | Role::GetFunction
            | Role::GetKernel
            | Role::KernelGetFunction
            | Role::CaptureBegin
            | Role::CaptureEnd
            | Role::Cupti
            | Role::Other => return None,
        })
    }
}

/// The calls that get stacks: some families (a bit per [`StackFamily`], in
/// [`StackFamily::ALL`]'s order), or every probed call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackSelection {
    Families(u8),
    /// `all`: every probed function, queries and functions outside the catalog included.
    All,
}

impl Default for StackSelection {
    /// Every family: allocations and frees, copies, memsets, synchronisation, module loads,
    /// NCCL collectives and launches.
    fn default() -> Self {
        StackSelection::Families((1 << StackFamily::ALL.len()) - 1)
    }
}

impl StackFamily {
    fn bit(self) -> u8 {
        1 << StackFamily::ALL
            .iter()
            .position(|f| *f == self)
            .unwrap_or(0)
    }
}

impl StackSelection {
    /// Parses `--stacks`'s value: `default`, `all`, or families separated by commas.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "default" {
            return Ok(StackSelection::default());
        }
        if text == "all" {
            return Ok(StackSelection::All);
        }
        let mut families = 0;
        for item in text.split(',').map(str::trim) {
            if item == "all" || item == "default" {
                return Err(format!(
                    "`{item}` stands alone: give --stacks={item}, or families separated by \
                     commas without it (any of {})",
                    StackFamily::ALL.map(StackFamily::as_str).join(", ")
                ));
            }
            let family = StackFamily::ALL
                .into_iter()
                .find(|family| family.as_str() == item)
                .ok_or_else(|| {
                    format!(
                        "{item:?} is not a family: `all`, or any of {}",
                        StackFamily::ALL.map(StackFamily::as_str).join(", ")
                    )
                })?;
            families |= family.bit();
        }
        Ok(StackSelection::Families(families))
    }

    /// Whether calls of `spec` get stacks.
    pub fn includes(&self, spec: &FnSpec) -> bool {
        match self {
            StackSelection::All => true,
            StackSelection::Families(families) => {
                StackFamily::of(spec.role).is_some_and(|family| families & family.bit() != 0)
            }
        }
    }

    /// The header's `families`.
    pub fn names(&self) -> Vec<String> {
        match self {
            StackSelection::All => vec!["all".into()],
            StackSelection::Families(families) => StackFamily::ALL
                .iter()
                .filter(|family| families & family.bit() != 0)
                .map(|family| family.as_str().to_owned())
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::CATALOG;

    fn named(name: &str) -> &'static FnSpec {
        CATALOG.iter().find(|spec| spec.name() == name).unwrap()
    }

    #[test]
    fn families_are_parsed_and_named() {
        assert_eq!(
            StackSelection::parse("alloc,launch,alloc").map(|s| s.names()),
            Ok(vec!["launch".to_owned(), "alloc".to_owned()])
        );
        assert_eq!(StackSelection::parse("all"), Ok(StackSelection::All));
        assert_eq!(
            StackSelection::parse("default").unwrap().names(),
            [
                "launch",
                "alloc",
                "copy",
                "memset",
                "sync",
                "module",
                "collective"
            ]
        );
        assert_eq!(
            StackSelection::parse("launch,kernels"),
            Err(
                "\"kernels\" is not a family: `all`, or any of launch, alloc, copy, memset, \
                 sync, module, collective"
                    .into()
            )
        );
    }

    #[test]
    fn all_and_default_stand_alone() {
        for (text, word) in [("all,launch", "all"), ("launch,default", "default")] {
            assert_eq!(
                StackSelection::parse(text),
                Err(format!(
                    "`{word}` stands alone: give --stacks={word}, or families separated by \
                     commas without it (any of launch, alloc, copy, memset, sync, module, \
                     collective)"
                ))
            );
        }
    }

    #[test]
    fn the_default_takes_the_calls_the_issue_names_and_not_queries() {
        let default = StackSelection::default();
        for name in [
            "cuLaunchKernel",
            "cuLaunchKernelEx",
            "cuGraphLaunch",
            "cuMemAlloc_v2",
            "cuMemFree_v2",
            "cuMemCreate",
            "cuMemMap",
            "cuMemcpyHtoD_v2",
            "cuMemcpyHtoDAsync_v2",
            "cuMemsetD8_v2",
            "cuStreamSynchronize",
            "cuCtxSynchronize",
            "cuModuleLoadData",
            "cuLibraryLoadData",
        ] {
            assert!(default.includes(named(name)), "{name}");
        }
        for name in [
            "cuInit",
            "cuCtxSetCurrent",
            "cuModuleGetFunction",
            "cuStreamCreate",
        ] {
            assert!(!default.includes(named(name)), "{name}");
        }
        let launches = StackSelection::parse("launch").unwrap();
        assert!(launches.includes(named("cuLaunchKernel")));
        assert!(!launches.includes(named("cuMemAlloc_v2")));
        assert!(StackSelection::All.includes(named("cuInit")));
    }
}
