//! Names of CUDA enum values passed by value: `CUmemLocationType`, `CUmem_advise`.

use std::borrow::Cow;

/// `CUmemLocationType` names.
pub(super) fn location_name(location_type: u32) -> Cow<'static, str> {
    Cow::Borrowed(match location_type {
        0 => "none",
        1 => "device",
        2 => "host",
        3 => "host_numa",
        4 => "host_numa_current",
        other => return Cow::Owned(format!("type_{other}")),
    })
}

/// `CUmem_advise` names.
pub(super) fn advice_name(advice: u32) -> Option<&'static str> {
    Some(match advice {
        1 => "CU_MEM_ADVISE_SET_READ_MOSTLY",
        2 => "CU_MEM_ADVISE_UNSET_READ_MOSTLY",
        3 => "CU_MEM_ADVISE_SET_PREFERRED_LOCATION",
        4 => "CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION",
        5 => "CU_MEM_ADVISE_SET_ACCESSED_BY",
        6 => "CU_MEM_ADVISE_UNSET_ACCESSED_BY",
        _ => return None,
    })
}
