//! The driver functions whose CUPTI API records are enabled: the table lives in
//! `tracer_common::cbids`, which cudatrace reads too (linking GPU work to calls).

pub use tracer_common::cbids::LINKED_DRIVER_FUNCTIONS;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn function_name(cbid: u32) -> Option<&'static str> {
        LINKED_DRIVER_FUNCTIONS
            .iter()
            .find(|(_, id)| *id == cbid)
            .map(|(name, _)| *name)
    }

    #[test]
    fn every_function_and_id_is_listed_once() {
        let names: HashSet<_> = LINKED_DRIVER_FUNCTIONS.iter().map(|(n, _)| n).collect();
        let ids: HashSet<_> = LINKED_DRIVER_FUNCTIONS.iter().map(|(_, i)| i).collect();
        assert_eq!(names.len(), LINKED_DRIVER_FUNCTIONS.len());
        assert_eq!(ids.len(), LINKED_DRIVER_FUNCTIONS.len());
        assert_eq!(LINKED_DRIVER_FUNCTIONS.len(), 117);
    }

    #[test]
    fn the_forms_pytorch_uses_are_there() {
        // cuGetProcAddress_v2 hands out these exported forms (measured on driver 580.159.04).
        for (name, cbid) in [
            ("cuLaunchKernel", 307),
            ("cuLaunchKernel_ptsz", 442),
            ("cuLaunchKernelEx", 652),
            ("cuLaunchKernelEx_ptsz", 653),
            ("cuMemcpyHtoDAsync_v2", 277),
            ("cuMemcpyHtoDAsync_v2_ptsz", 421),
            ("cuMemcpyDtoHAsync_v2", 279),
            ("cuMemsetD32Async", 220),
            ("cuGraphLaunch", 514),
        ] {
            assert_eq!(function_name(cbid), Some(name));
        }
        assert_eq!(function_name(1), None, "cuInit is not linked");
    }
}
