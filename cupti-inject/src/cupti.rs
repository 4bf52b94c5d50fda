//! The part of CUPTI this library uses, declared here so building needs no CUDA headers.
//!
//! Layouts follow CUPTI 13's `cupti_activity.h` (`CUpti_ActivityKernel10`,
//! `CUpti_ActivityMemcpy6`, `CUpti_ActivityMemset4`, `CUpti_ActivityAPI`); the offsets are
//! asserted below. Records are read field by field, never whole, and only fields that sit at
//! the same offsets in CUPTI 12's `Kernel9` and `Memcpy5` are read, so a record from either
//! version is never read past its end.

use std::ffi::{CStr, c_char, c_void};
use std::mem::{offset_of, size_of};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

pub type CUptiResult = u32;
pub type CUcontext = *mut c_void;

pub const CUPTI_SUCCESS: CUptiResult = 0;
pub const CUPTI_ERROR_MAX_LIMIT_REACHED: CUptiResult = 12;
/// `CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`: another client subscribed already.
pub const CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: CUptiResult = 39;

/// `CUPTI_API_VERSION` of CUDA 13.3, the first whose `cuptiSubscribe_v2` can let several
/// clients subscribe (with driver r610 or newer).
pub const MULTI_SUBSCRIBER_VERSION: u32 = 130300;

/// `CUpti_ActivityKind` values used here.
pub mod activity_kind {
    pub const MEMCPY: u32 = 1;
    pub const MEMSET: u32 = 2;
    pub const RUNTIME: u32 = 5;
    pub const DRIVER: u32 = 4;
    pub const CONCURRENT_KERNEL: u32 = 10;
}

/// `CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM`: thread ids are `gettid()`, as in the trace.
pub const THREAD_ID_TYPE_SYSTEM: u32 = 1;
/// `CUPTI_ACTIVITY_FLAG_FLUSH_FORCED`: also hand over buffers with incomplete records.
pub const FLUSH_FORCED: u32 = 1;
/// `CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC` and `CUPTI_ACTIVITY_FLAG_MEMSET_ASYNC`.
pub const FLAG_ASYNC: u32 = 1;

/// `CUpti_Activity`: the kind every record starts with.
#[repr(C)]
pub struct Activity {
    pub kind: u32,
}

/// `CUpti_ActivityKernel10`.
#[repr(C)]
pub struct ActivityKernel10 {
    pub kind: u32,
    pub cache_config: u8,
    pub shared_memory_config: u8,
    pub registers_per_thread: u16,
    pub partitioned_global_cache_requested: u32,
    pub partitioned_global_cache_executed: u32,
    pub start: u64,
    pub end: u64,
    pub completed: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub grid_x: i32,
    pub grid_y: i32,
    pub grid_z: i32,
    pub block_x: i32,
    pub block_y: i32,
    pub block_z: i32,
    pub static_shared_memory: i32,
    pub dynamic_shared_memory: i32,
    pub local_memory_per_thread: u32,
    pub local_memory_total: u32,
    pub correlation_id: u32,
    pub grid_id: i64,
    pub name: *const c_char,
    pub reserved0: *mut c_void,
    pub queued: u64,
    pub submitted: u64,
    pub launch_type: u8,
    pub is_shared_memory_carveout_requested: u8,
    pub shared_memory_carveout_requested: u8,
    pub padding: u8,
    pub shared_memory_executed: u32,
    pub graph_node_id: u64,
    pub shmem_limit_config: u32,
    pub graph_id: u32,
    pub access_policy_window: *mut c_void,
    pub channel_id: u32,
    pub channel_type: u32,
    pub cluster_x: u32,
    pub cluster_y: u32,
    pub cluster_z: u32,
    pub cluster_scheduling_policy: u32,
    pub local_memory_total_v2: u64,
    pub max_potential_cluster_size: u32,
    pub max_active_clusters: u32,
    pub is_device_launched: u8,
    pub padding3: [u8; 7],
}
const _: () = {
    assert!(size_of::<ActivityKernel10>() == 216);
    assert!(offset_of!(ActivityKernel10, registers_per_thread) == 6);
    assert!(offset_of!(ActivityKernel10, start) == 16);
    assert!(offset_of!(ActivityKernel10, end) == 24);
    assert!(offset_of!(ActivityKernel10, device_id) == 40);
    assert!(offset_of!(ActivityKernel10, context_id) == 44);
    assert!(offset_of!(ActivityKernel10, stream_id) == 48);
    assert!(offset_of!(ActivityKernel10, grid_x) == 52);
    assert!(offset_of!(ActivityKernel10, block_z) == 72);
    assert!(offset_of!(ActivityKernel10, static_shared_memory) == 76);
    assert!(offset_of!(ActivityKernel10, dynamic_shared_memory) == 80);
    assert!(offset_of!(ActivityKernel10, correlation_id) == 92);
    assert!(offset_of!(ActivityKernel10, name) == 104);
    assert!(offset_of!(ActivityKernel10, launch_type) == 136);
    assert!(offset_of!(ActivityKernel10, graph_node_id) == 144);
    assert!(offset_of!(ActivityKernel10, graph_id) == 156);
    assert!(offset_of!(ActivityKernel10, channel_id) == 168);
    assert!(offset_of!(ActivityKernel10, local_memory_total_v2) == 192);
    assert!(offset_of!(ActivityKernel10, is_device_launched) == 208);
};

/// `CUpti_ActivityMemcpy6`.
#[repr(C)]
pub struct ActivityMemcpy6 {
    pub kind: u32,
    pub copy_kind: u8,
    pub src_kind: u8,
    pub dst_kind: u8,
    pub flags: u8,
    pub bytes: u64,
    pub start: u64,
    pub end: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub runtime_correlation_id: u32,
    pub pad: u32,
    pub reserved0: *mut c_void,
    pub graph_node_id: u64,
    pub graph_id: u32,
    pub channel_id: u32,
    pub channel_type: u32,
    pub is_device_launched: u8,
    pub pad2: [u8; 3],
    pub copy_count: u64,
}
const _: () = {
    assert!(size_of::<ActivityMemcpy6>() == 96);
    assert!(offset_of!(ActivityMemcpy6, copy_kind) == 4);
    assert!(offset_of!(ActivityMemcpy6, flags) == 7);
    assert!(offset_of!(ActivityMemcpy6, bytes) == 8);
    assert!(offset_of!(ActivityMemcpy6, start) == 16);
    assert!(offset_of!(ActivityMemcpy6, device_id) == 32);
    assert!(offset_of!(ActivityMemcpy6, correlation_id) == 44);
    assert!(offset_of!(ActivityMemcpy6, graph_node_id) == 64);
    assert!(offset_of!(ActivityMemcpy6, graph_id) == 72);
    assert!(offset_of!(ActivityMemcpy6, is_device_launched) == 84);
    assert!(offset_of!(ActivityMemcpy6, copy_count) == 88);
};

/// `CUpti_ActivityMemset4`.
#[repr(C)]
pub struct ActivityMemset4 {
    pub kind: u32,
    pub value: u32,
    pub bytes: u64,
    pub start: u64,
    pub end: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub flags: u16,
    pub memory_kind: u16,
    pub pad: u32,
    pub reserved0: *mut c_void,
    pub graph_node_id: u64,
    pub graph_id: u32,
    pub channel_id: u32,
    pub channel_type: u32,
    pub is_device_launched: u8,
    pub pad2: [u8; 3],
}
const _: () = {
    assert!(size_of::<ActivityMemset4>() == 88);
    assert!(offset_of!(ActivityMemset4, value) == 4);
    assert!(offset_of!(ActivityMemset4, bytes) == 8);
    assert!(offset_of!(ActivityMemset4, correlation_id) == 44);
    assert!(offset_of!(ActivityMemset4, flags) == 48);
    assert!(offset_of!(ActivityMemset4, memory_kind) == 50);
    assert!(offset_of!(ActivityMemset4, graph_node_id) == 64);
    assert!(offset_of!(ActivityMemset4, graph_id) == 72);
};

/// `CUpti_ActivityAPI` (kind DRIVER).
#[repr(C)]
pub struct ActivityApi {
    pub kind: u32,
    pub cbid: u32,
    pub start: u64,
    pub end: u64,
    pub process_id: u32,
    pub thread_id: u32,
    pub correlation_id: u32,
    pub return_value: u32,
}
const _: () = {
    assert!(size_of::<ActivityApi>() == 40);
    assert!(offset_of!(ActivityApi, start) == 8);
    assert!(offset_of!(ActivityApi, process_id) == 24);
    assert!(offset_of!(ActivityApi, correlation_id) == 32);
    assert!(offset_of!(ActivityApi, return_value) == 36);
};

pub type BufferRequested = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
pub type BufferCompleted = unsafe extern "C" fn(CUcontext, u32, *mut u8, usize, usize);
pub type TimestampCallback = unsafe extern "C" fn() -> u64;
/// The per-subscriber forms (CUPTI 13.2+): the last argument is CUPTI's
/// `CUpti_BufferCallbackRequestInfo` / `CUpti_BufferCallbackCompleteInfo`, not read here
/// (it matters only with user-defined record layouts, which this library does not ask for).
pub type BufferRequestedV2 =
    unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize, *mut c_void);
pub type BufferCompletedV2 = unsafe extern "C" fn(*mut u8, usize, usize, *mut c_void);
pub type Subscriber = *mut c_void;

/// `CUpti_SubscriberParams` (CUPTI 13.2+), the last argument of `cuptiSubscribe_v2`.
#[repr(C)]
pub struct SubscriberParams {
    pub struct_size: usize,
    pub subscriber_name: *const c_char,
    pub old_subscriber_name: *mut c_char,
    pub old_subscriber_size: usize,
    pub allow_multiple_subscribers: u8,
}
/// CUPTI's `CUpti_SubscriberParams_STRUCT_SIZE`: up to the end of its last field.
pub const SUBSCRIBER_PARAMS_SIZE: usize =
    offset_of!(SubscriberParams, allow_multiple_subscribers) + 1;
const _: () = assert!(SUBSCRIBER_PARAMS_SIZE == 33);

/// The per-subscriber activity API (CUPTI 13.3 with driver r610+ lets several clients use
/// it at once). All or nothing: a libcupti lacking one of them is used the single-client way.
pub struct PerSubscriber {
    pub subscribe: unsafe extern "C" fn(
        *mut Subscriber,
        *const c_void,
        *mut c_void,
        *mut SubscriberParams,
    ) -> CUptiResult,
    pub register_callbacks:
        unsafe extern "C" fn(Subscriber, BufferRequestedV2, BufferCompletedV2) -> CUptiResult,
    pub enable: unsafe extern "C" fn(Subscriber, u32, *mut c_void) -> CUptiResult,
    pub disable: unsafe extern "C" fn(Subscriber, u32, *mut c_void) -> CUptiResult,
    pub enable_driver_api: unsafe extern "C" fn(Subscriber, u32, u8) -> CUptiResult,
    pub get_next_record:
        unsafe extern "C" fn(Subscriber, *mut u8, usize, *mut *mut Activity) -> CUptiResult,
    pub get_num_dropped_records:
        unsafe extern "C" fn(Subscriber, CUcontext, u32, *mut usize) -> CUptiResult,
}

/// The CUPTI functions, resolved once from the loaded library.
pub struct Cupti {
    pub path: String,
    pub get_version: unsafe extern "C" fn(*mut u32) -> CUptiResult,
    pub get_result_string: unsafe extern "C" fn(CUptiResult, *mut *const c_char) -> CUptiResult,
    pub get_timestamp: unsafe extern "C" fn(*mut u64) -> CUptiResult,
    pub set_thread_id_type: unsafe extern "C" fn(u32) -> CUptiResult,
    pub register_callbacks: unsafe extern "C" fn(BufferRequested, BufferCompleted) -> CUptiResult,
    pub enable: unsafe extern "C" fn(u32) -> CUptiResult,
    pub disable: unsafe extern "C" fn(u32) -> CUptiResult,
    pub flush_all: unsafe extern "C" fn(u32) -> CUptiResult,
    pub get_next_record: unsafe extern "C" fn(*mut u8, usize, *mut *mut Activity) -> CUptiResult,
    pub get_num_dropped_records: unsafe extern "C" fn(CUcontext, u32, *mut usize) -> CUptiResult,
    /// CUPTI 12.x before `cuptiActivityRegisterTimestampCallback`: clock pairs instead.
    pub register_timestamp_callback: Option<unsafe extern "C" fn(TimestampCallback) -> CUptiResult>,
    /// Absent from old CUPTI: then GPU records cannot be linked to their calls.
    pub enable_driver_api: Option<unsafe extern "C" fn(u32, u8) -> CUptiResult>,
    /// CUPTI 13.2+'s per-subscriber functions, where every one is exported.
    pub per_subscriber: Option<PerSubscriber>,
    /// The callback API's `cuptiSubscribe` and `cuptiUnsubscribe`: a late start asks
    /// whether another client subscribed (one subscriber at a time before CUPTI 13.3).
    pub subscribe:
        Option<unsafe extern "C" fn(*mut Subscriber, *const c_void, *mut c_void) -> CUptiResult>,
    pub unsubscribe: Option<unsafe extern "C" fn(Subscriber) -> CUptiResult>,
    /// The callback API's `cuptiEnableCallback(enable, subscriber, domain, cbid)`.
    pub enable_callback: Option<unsafe extern "C" fn(u32, Subscriber, u32, u32) -> CUptiResult>,
    /// Kept loaded for the life of the process: CUPTI calls back into us from its threads.
    _library: Library,
}

/// Why libcupti could not be used.
#[derive(Debug)]
pub enum LoadError {
    /// No candidate could be loaded; the loader's message for each.
    NotLoadable(String),
    /// Loaded from `path`, but a function this library needs is missing.
    MissingFunction { path: String, function: String },
}

/// Names tried when `CUDATRACE_CUPTI` is unset, through the loader's own search.
pub const DEFAULT_NAMES: &[&str] = &["libcupti.so.13", "libcupti.so"];

impl Cupti {
    /// Loads libcupti from `path`, or the loader's search for [`DEFAULT_NAMES`].
    pub fn load(path: Option<&str>) -> Result<Cupti, LoadError> {
        let candidates: Vec<&str> = match path {
            Some(path) => vec![path],
            None => DEFAULT_NAMES.to_vec(),
        };
        let mut failures = Vec::new();
        for candidate in candidates {
            // SAFETY: loading libcupti runs its initialisers, which expect nothing from us.
            match unsafe { Library::open(Some(candidate), RTLD_NOW | RTLD_LOCAL) } {
                Ok(library) => return Self::resolve(library, candidate),
                Err(error) => failures.push(format!("{candidate}: {error}")),
            }
        }
        Err(LoadError::NotLoadable(failures.join("; ")))
    }

    fn resolve(library: Library, loaded_as: &str) -> Result<Cupti, LoadError> {
        let path = loaded_path(&library).unwrap_or_else(|| loaded_as.to_owned());
        macro_rules! required {
            ($name:literal) => {
                // SAFETY: the type is the function's C signature from CUPTI's headers.
                *unsafe { library.get(concat!($name, "\0").as_bytes()) }.map_err(|_| {
                    LoadError::MissingFunction {
                        path: path.clone(),
                        function: $name.to_owned(),
                    }
                })?
            };
        }
        macro_rules! optional {
            ($name:literal) => {
                // SAFETY: as above.
                unsafe { library.get(concat!($name, "\0").as_bytes()) }
                    .ok()
                    .map(|symbol| *symbol)
            };
        }
        let per_subscriber = (|| {
            Some(PerSubscriber {
                subscribe: optional!("cuptiSubscribe_v2")?,
                register_callbacks: optional!("cuptiActivityRegisterCallbacks_v2")?,
                enable: optional!("cuptiActivityEnable_v2")?,
                disable: optional!("cuptiActivityDisable_v2")?,
                enable_driver_api: optional!("cuptiActivityEnableDriverApi_v2")?,
                get_next_record: optional!("cuptiActivityGetNextRecord_v2")?,
                get_num_dropped_records: optional!("cuptiActivityGetNumDroppedRecords_v2")?,
            })
        })();
        Ok(Cupti {
            get_version: required!("cuptiGetVersion"),
            get_result_string: required!("cuptiGetResultString"),
            get_timestamp: required!("cuptiGetTimestamp"),
            set_thread_id_type: required!("cuptiSetThreadIdType"),
            register_callbacks: required!("cuptiActivityRegisterCallbacks"),
            enable: required!("cuptiActivityEnable"),
            disable: required!("cuptiActivityDisable"),
            flush_all: required!("cuptiActivityFlushAll"),
            get_next_record: required!("cuptiActivityGetNextRecord"),
            get_num_dropped_records: required!("cuptiActivityGetNumDroppedRecords"),
            register_timestamp_callback: optional!("cuptiActivityRegisterTimestampCallback"),
            enable_driver_api: optional!("cuptiActivityEnableDriverApi"),
            per_subscriber,
            subscribe: optional!("cuptiSubscribe"),
            unsubscribe: optional!("cuptiUnsubscribe"),
            enable_callback: optional!("cuptiEnableCallback"),
            path,
            _library: library,
        })
    }

    /// CUPTI's name for a result code, e.g. `CUPTI_ERROR_INSUFFICIENT_PRIVILEGES`.
    pub fn result_string(&self, result: CUptiResult) -> String {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: CUPTI writes a pointer to a static string.
        let rc = unsafe { (self.get_result_string)(result, &mut text) };
        if rc != CUPTI_SUCCESS || text.is_null() {
            return format!("CUPTI error {result}");
        }
        // SAFETY: a NUL-terminated static string from CUPTI.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The file the loader actually mapped for `library` (resolves a bare soname).
fn loaded_path(library: &Library) -> Option<String> {
    // SAFETY: any exported function of the library serves as an address inside it.
    let symbol: libloading::os::unix::Symbol<unsafe extern "C" fn()> =
        unsafe { library.get(b"cuptiGetVersion\0") }.ok()?;
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables.
    let found = unsafe { libc::dladdr(symbol.into_raw() as *const c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated path owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(name.to_string_lossy().into_owned())
}
