//! Each call's [`Role`] by its symbol: the catalog rows' role column, looked up by name.

use std::sync::OnceLock;

use foldhash::{HashMap, HashMapExt};

pub use crate::catalog::Role;
use crate::catalog::{CATALOG, CUPTI_CATALOG, NCCL_CATALOG, STREAM_VARIANTS};

/// Every catalog symbol and its `_ptsz`/`_ptds` forms, with the function's role.
fn roles() -> &'static HashMap<&'static str, Role> {
    static ROLES: OnceLock<HashMap<&'static str, Role>> = OnceLock::new();
    ROLES.get_or_init(|| {
        let mut roles = HashMap::new();
        for spec in CATALOG.iter().chain(NCCL_CATALOG).chain(CUPTI_CATALOG) {
            let role = spec.role;
            for symbol in spec.symbols {
                roles.insert(*symbol, role);
                for suffix in STREAM_VARIANTS {
                    // Built once per process: a few hundred short names.
                    let variant: &'static str = Box::leak(format!("{symbol}{suffix}").into());
                    roles.insert(variant, role);
                }
            }
        }
        roles
    })
}

/// The role of a call line's `name`, and the name as a `'static` string (unknown
/// names, from a newer trace, are [`Role::Other`]).
pub fn classify(name: &str) -> (Role, Option<&'static str>) {
    match roles().get_key_value(name) {
        Some((symbol, role)) => (*role, Some(*symbol)),
        None => (Role::Other, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalog_function_has_a_deliberate_role() {
        let other: Vec<&str> = CATALOG
            .iter()
            .map(|spec| spec.name())
            .filter(|name| classify(name).0 == Role::Other)
            .collect();
        assert_eq!(
            other,
            [
                "cuMemSetAccess",
                "cuIpcGetMemHandle",
                "cuMemPrefetchAsync_v2",
                "cuMemPrefetchAsync",
                "cuMemAdvise_v2",
                "cuMemAdvise",
                "cuGraphInstantiateWithFlags",
                "cuGraphInstantiateWithParams",
                "cuGraphInstantiate_v2",
                "cuGraphExecUpdate_v2",
                "cuGraphExecUpdate",
                "cuEventRecord",
                "cuEventRecordWithFlags",
                "cuStreamWaitEvent",
                "cuStreamCreate",
                "cuStreamCreateWithPriority",
                "cuStreamQuery",
                "cuEventCreate",
                "cuEventQuery",
                "cuEventDestroy_v2",
            ]
        );
    }

    #[test]
    fn stream_variants_and_aliases_share_the_role() {
        assert_eq!(
            classify("cuMemcpyHtoD_v2_ptds"),
            (Role::Copy, Some("cuMemcpyHtoD_v2_ptds"))
        );
        assert_eq!(classify("cuLaunchKernel_ptsz").0, Role::Launch);
        assert_eq!(classify("cuLaunchKernelEx").0, Role::Launch);
        assert_eq!(classify("cuLaunchCooperativeKernel").0, Role::Launch);
        assert_eq!(classify("cuMemAllocHost").0, Role::HostAlloc);
        assert_eq!(classify("cuDevicePrimaryCtxRelease_v2").0, Role::Teardown);
        assert_eq!(classify("cuCtxCreate_v4").0, Role::Setup);
        assert_eq!(classify("cuMemAllocAsync_ptsz").0, Role::DeviceAlloc);
        assert_eq!(classify("cuSomethingNew"), (Role::Other, None));
        assert_eq!(classify("cuIpcOpenMemHandle").0, Role::IpcOpen);
        assert_eq!(classify("cuGraphInstantiateWithParams_ptsz").0, Role::Other);
        assert_eq!(classify("cuMemcpyBatchAsync_v2_ptsz").0, Role::Copy);
    }
}
