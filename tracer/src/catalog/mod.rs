//! The probe catalog: every libcuda function cudatrace knows, the exported symbols that
//! implement it, how to read its arguments (x86-64 SysV order) and what its calls do for
//! the analysis (its role). `spec.rs` has the description's types, `role.rs` the roles,
//! `libcuda.rs` libcuda's table (its tests in `libcuda/tests.rs`), `nccl.rs` libnccl's
//! (with NCCL's result names), `cupti.rs` libcupti's (the activity API's clients),
//! `cuda_result.rs` the names of libcuda's results.
//!
//! Attaching (`probes::probe_set::LIBCUDA`), the eBPF-side `ProbeSpec`s, decoding and the
//! analysis's roles all come from this table; adding a function is adding a row.

pub mod cuda_result;
pub mod cupti;
mod libcuda;
pub mod nccl;
mod role;
mod spec;

pub use cupti::CUPTI_CATALOG;
#[cfg(test)]
pub use libcuda::lookup;
pub use libcuda::{CATALOG, STREAM_VARIANTS, is_per_thread_variant};
pub use nccl::NCCL_CATALOG;
pub use role::{Role, SyncOn};
#[cfg(test)]
pub use spec::ENTRY_ONLY_LAUNCHES;
pub use spec::{
    Arg, BATCH_SIZES_READ, CopyKind, Family, Field, FnSpec, GENERIC, IPC_HANDLE_BY_VALUE_READ,
    IPC_HANDLE_LEN, StrField, UNIQUE_ID_READ,
};
