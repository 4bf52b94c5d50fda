//! The API family of each called symbol (`init`, `context`, `memory`, `virtual_memory`,
//! `copy`, `memset`, `launch`, `sync`, `module`): the export's categories and the plot's
//! lanes.

use std::sync::{Arc, OnceLock};

use foldhash::HashMap;

use crate::{
    catalog::{CATALOG, NCCL_CATALOG, STREAM_VARIANTS},
    schema::{Header, LibraryLine, ProbeInfo},
};

/// Families in the order the plot's lanes show them.
pub const FAMILIES: [&str; 9] = [
    "init",
    "context",
    "memory",
    "virtual_memory",
    "copy",
    "memset",
    "launch",
    "sync",
    "module",
];

/// The header's probe list first, the catalog for traces whose header lacks a name.
#[derive(Clone, Debug, Default)]
pub struct Families {
    from_header: HashMap<String, Arc<str>>,
}

fn catalog_families() -> &'static HashMap<&'static str, &'static str> {
    static FAMILIES_BY_SYMBOL: OnceLock<HashMap<&'static str, &'static str>> = OnceLock::new();
    FAMILIES_BY_SYMBOL.get_or_init(|| {
        CATALOG
            .iter()
            .chain(NCCL_CATALOG)
            .flat_map(|spec| {
                spec.symbols
                    .iter()
                    .map(move |symbol| (*symbol, spec.family.as_str()))
            })
            .collect()
    })
}

impl Families {
    pub fn from_header(header: &Header) -> Self {
        Families {
            from_header: header
                .probes
                .iter()
                .map(|probe| (probe.symbol.clone(), Arc::from(probe.family.as_str())))
                .collect(),
        }
    }

    /// Adds the probes of a library attached after the header.
    pub fn add_library(&mut self, library: &LibraryLine) {
        self.add(&library.probes);
    }

    fn add(&mut self, probes: &[ProbeInfo]) {
        for probe in probes {
            self.from_header
                .entry(probe.symbol.clone())
                .or_insert_with(|| Arc::from(probe.family.as_str()));
        }
    }

    /// The family of a call's `name`, `None` for a function neither knows.
    pub fn of<'a>(&'a self, name: &str) -> Option<&'a str> {
        if let Some(family) = self.from_header.get(name) {
            return Some(family);
        }
        let base = STREAM_VARIANTS
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        catalog_families().get(base).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_fall_back_to_the_catalog() {
        let families = Families::default();
        assert_eq!(families.of("cuLaunchKernel_ptsz"), Some("launch"));
        assert_eq!(families.of("cuMemcpyHtoDAsync_v2"), Some("copy"));
        assert_eq!(families.of("cuMemCreate"), Some("virtual_memory"));
        assert_eq!(families.of("cuSomethingNew"), None);
    }
}
