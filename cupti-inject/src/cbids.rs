//! The driver functions whose CUPTI API records are enabled: every function that issues a
//! kernel, a copy or a memset, in all its versioned and per-thread-stream forms. Their API
//! records carry the correlation id of the GPU work they issued, which is what links a GPU
//! record to the traced call. Values are `CUpti_driver_api_trace_cbid` from CUPTI 13's
//! `cupti_driver_cbid.h` (stable across CUPTI versions; new functions get new ids).
//!
//! Only these are enabled (`cuptiActivityEnableDriverApi`), not the DRIVER activity kind,
//! which would record every driver call (55,016 in a GPT-2 run, 90% of them queries).

/// `(function, cbid)`.
pub const LINKED_DRIVER_FUNCTIONS: &[(&str, u32)] = &[
    // Launches.
    ("cuLaunch", 115),
    ("cuLaunchGrid", 116),
    ("cuLaunchGridAsync", 117),
    ("cuLaunchKernel", 307),
    ("cuLaunchKernel_ptsz", 442),
    ("cuLaunchCooperativeKernel", 477),
    ("cuLaunchCooperativeKernel_ptsz", 478),
    ("cuLaunchCooperativeKernelMultiDevice", 480),
    ("cuGraphLaunch", 514),
    ("cuGraphLaunch_ptsz", 515),
    ("cuLaunchKernelEx", 652),
    ("cuLaunchKernelEx_ptsz", 653),
    // Copies.
    ("cuMemcpyHtoD", 43),
    ("cuMemcpyDtoH", 45),
    ("cuMemcpyDtoD", 47),
    ("cuMemcpyDtoA", 49),
    ("cuMemcpyAtoD", 51),
    ("cuMemcpyHtoA", 53),
    ("cuMemcpyAtoH", 54),
    ("cuMemcpyAtoA", 55),
    ("cuMemcpy2D", 56),
    ("cuMemcpy2DUnaligned", 57),
    ("cuMemcpy3D", 58),
    ("cuMemcpyHtoDAsync", 60),
    ("cuMemcpyDtoHAsync", 62),
    ("cuMemcpyDtoDAsync", 64),
    ("cuMemcpyHtoAAsync", 66),
    ("cuMemcpyAtoHAsync", 67),
    ("cuMemcpy2DAsync", 68),
    ("cuMemcpy3DAsync", 69),
    ("cuMemcpy_v2", 248),
    ("cuMemcpyHtoD_v2", 276),
    ("cuMemcpyHtoDAsync_v2", 277),
    ("cuMemcpyDtoH_v2", 278),
    ("cuMemcpyDtoHAsync_v2", 279),
    ("cuMemcpyDtoD_v2", 280),
    ("cuMemcpyDtoDAsync_v2", 281),
    ("cuMemcpyAtoH_v2", 282),
    ("cuMemcpyAtoHAsync_v2", 283),
    ("cuMemcpyAtoD_v2", 284),
    ("cuMemcpyDtoA_v2", 285),
    ("cuMemcpyAtoA_v2", 286),
    ("cuMemcpy2D_v2", 287),
    ("cuMemcpy2DUnaligned_v2", 288),
    ("cuMemcpy2DAsync_v2", 289),
    ("cuMemcpy3D_v2", 290),
    ("cuMemcpy3DAsync_v2", 291),
    ("cuMemcpyHtoA_v2", 292),
    ("cuMemcpyHtoAAsync_v2", 293),
    ("cuMemcpy", 305),
    ("cuMemcpyAsync", 306),
    ("cuMemcpyPeer", 318),
    ("cuMemcpyPeerAsync", 319),
    ("cuMemcpy3DPeer", 320),
    ("cuMemcpy3DPeerAsync", 321),
    ("cuMemcpyHtoD_v2_ptds", 397),
    ("cuMemcpyDtoH_v2_ptds", 398),
    ("cuMemcpyDtoD_v2_ptds", 399),
    ("cuMemcpyDtoA_v2_ptds", 400),
    ("cuMemcpyAtoD_v2_ptds", 401),
    ("cuMemcpyHtoA_v2_ptds", 402),
    ("cuMemcpyAtoH_v2_ptds", 403),
    ("cuMemcpyAtoA_v2_ptds", 404),
    ("cuMemcpy2D_v2_ptds", 405),
    ("cuMemcpy2DUnaligned_v2_ptds", 406),
    ("cuMemcpy3D_v2_ptds", 407),
    ("cuMemcpy_ptds", 408),
    ("cuMemcpyPeer_ptds", 409),
    ("cuMemcpy3DPeer_ptds", 410),
    ("cuMemcpyAsync_ptsz", 418),
    ("cuMemcpyHtoAAsync_v2_ptsz", 419),
    ("cuMemcpyAtoHAsync_v2_ptsz", 420),
    ("cuMemcpyHtoDAsync_v2_ptsz", 421),
    ("cuMemcpyDtoHAsync_v2_ptsz", 422),
    ("cuMemcpyDtoDAsync_v2_ptsz", 423),
    ("cuMemcpy2DAsync_v2_ptsz", 424),
    ("cuMemcpy3DAsync_v2_ptsz", 425),
    ("cuMemcpyPeerAsync_ptsz", 426),
    ("cuMemcpy3DPeerAsync_ptsz", 427),
    ("cuMemcpyBatchAsync", 776),
    ("cuMemcpyBatchAsync_ptsz", 777),
    ("cuMemcpy3DBatchAsync", 778),
    ("cuMemcpy3DBatchAsync_ptsz", 779),
    ("cuMemcpyBatchAsync_v2", 796),
    ("cuMemcpyBatchAsync_v2_ptsz", 797),
    ("cuMemcpy3DBatchAsync_v2", 798),
    ("cuMemcpy3DBatchAsync_v2_ptsz", 799),
    // Memsets.
    ("cuMemsetD8", 71),
    ("cuMemsetD16", 73),
    ("cuMemsetD32", 75),
    ("cuMemsetD2D8", 77),
    ("cuMemsetD2D16", 79),
    ("cuMemsetD2D32", 81),
    ("cuMemsetD8Async", 216),
    ("cuMemsetD16Async", 218),
    ("cuMemsetD32Async", 220),
    ("cuMemsetD2D8Async", 222),
    ("cuMemsetD2D16Async", 224),
    ("cuMemsetD2D32Async", 226),
    ("cuMemsetD8_v2", 249),
    ("cuMemsetD16_v2", 250),
    ("cuMemsetD32_v2", 251),
    ("cuMemsetD2D8_v2", 252),
    ("cuMemsetD2D16_v2", 253),
    ("cuMemsetD2D32_v2", 254),
    ("cuMemsetD8_v2_ptds", 411),
    ("cuMemsetD16_v2_ptds", 412),
    ("cuMemsetD32_v2_ptds", 413),
    ("cuMemsetD2D8_v2_ptds", 414),
    ("cuMemsetD2D16_v2_ptds", 415),
    ("cuMemsetD2D32_v2_ptds", 416),
    ("cuMemsetD8Async_ptsz", 428),
    ("cuMemsetD16Async_ptsz", 429),
    ("cuMemsetD32Async_ptsz", 430),
    ("cuMemsetD2D8Async_ptsz", 431),
    ("cuMemsetD2D16Async_ptsz", 432),
    ("cuMemsetD2D32Async_ptsz", 433),
];

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
