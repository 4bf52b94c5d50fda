//! Loading CUPTI and taking its activity API: at start, and again after another client of
//! the program let go of it (`control.rs`).
//!
//! Two ways, chosen at start:
//! - **multi-subscriber** (CUPTI 13.3 with driver r610+): `cuptiSubscribe_v2` with
//!   `allowMultipleSubscribers`, then the per-subscriber (`_v2`) functions. The program's
//!   own profiler keeps its own subscriber; both get every record. No timestamp callback
//!   (it is process-wide): times come on CUPTI's clock with clock pairs;
//! - **single subscriber** (older CUPTI or driver, our 580): the process-wide functions, as
//!   before; another client that registers its callbacks takes every record from then on,
//!   and the library yields until it lets go.

use std::ffi::c_void;

use tracer_common::{GpuRecord, gpu_flags, gpu_record, gpu_stage};

use crate::buffers::{
    buffer_completed, buffer_completed_v2, buffer_requested, buffer_requested_v2,
};
use crate::cupti::{
    CUPTI_SUCCESS, CUptiResult, Cupti, LoadError, MULTI_SUBSCRIBER_VERSION, SUBSCRIBER_PARAMS_SIZE,
    Subscriber, SubscriberParams, THREAD_ID_TYPE_SYSTEM, activity_kind,
};
use crate::flush::{monotonic_ns, send_clock_pair};
use crate::{ENV_CUPTI, ENV_VERBOSE, Failure, cbids, control, flush, report_now, sender};

/// The activity kinds enabled, in order; all or none.
pub const ACTIVITY_KINDS: [(u32, &str); 3] = [
    (activity_kind::CONCURRENT_KERNEL, "kernel"),
    (activity_kind::MEMCPY, "memcpy"),
    (activity_kind::MEMSET, "memset"),
];

/// How the library holds CUPTI's activity API.
pub enum Mode {
    /// The process-wide functions: one client at a time.
    Single,
    /// A subscriber of its own among others.
    Multi(Subscriber),
}

/// CUPTI, once loaded and set up.
pub struct Session {
    pub cupti: Cupti,
    /// [`gpu_flags::CUPTI_CLOCK`] when records are on CUPTI's clock, else 0.
    pub clock_flags: u32,
    /// The process that started the session: a forked child must not touch CUPTI.
    pub pid: u32,
    pub mode: Mode,
}

// SAFETY: the subscriber handle is CUPTI's, valid from any thread.
unsafe impl Send for Session {}
// SAFETY: as above; the session is never changed after it is set.
unsafe impl Sync for Session {}

static SESSION: std::sync::OnceLock<Session> = std::sync::OnceLock::new();

pub fn session() -> Option<&'static Session> {
    SESSION.get()
}

/// Loads and sets up CUPTI; an error stops GPU recording in this process.
pub fn start_cupti() -> Result<(), Failure> {
    let path = std::env::var(ENV_CUPTI).ok().filter(|p| !p.is_empty());
    let cupti = Cupti::load(path.as_deref()).map_err(|error| match error {
        LoadError::NotLoadable(why) => Failure {
            stage: gpu_stage::LOAD_CUPTI,
            result: 0,
            detail: 0,
            fatal: true,
            message: format!("cannot load libcupti ({why}): GPU activity is not recorded"),
        },
        LoadError::MissingFunction { path, function } => Failure {
            stage: gpu_stage::MISSING_FUNCTION,
            result: 0,
            detail: 0,
            fatal: true,
            message: format!("{path} has no {function}: GPU activity is not recorded"),
        },
    })?;

    let mut version = 0;
    // SAFETY: CUPTI writes one u32.
    unsafe { (cupti.get_version)(&mut version) };
    // SAFETY: a plain setting.
    let rc = unsafe { (cupti.set_thread_id_type)(THREAD_ID_TYPE_SYSTEM) };
    if rc != CUPTI_SUCCESS {
        report_now(Failure {
            stage: gpu_stage::THREAD_ID_TYPE,
            result: rc,
            detail: THREAD_ID_TYPE_SYSTEM,
            fatal: false,
            message: format!(
                "cuptiSetThreadIdType(SYSTEM) failed: {}: GPU records cannot be linked to calls by thread",
                cupti.result_string(rc)
            ),
        });
    }
    let mode = match subscribe_beside_others(&cupti, version) {
        Some(subscriber) => Mode::Multi(subscriber),
        None => Mode::Single,
    };
    // The timestamp callback is process-wide: with other subscribers it would change their
    // clock too, so then clock pairs only.
    let callback = matches!(mode, Mode::Single) && register_timestamp_callback(&cupti);
    let clock_flags = if callback { 0 } else { gpu_flags::CUPTI_CLOCK };
    if let Some(sender) = sender().as_mut() {
        let mut flags = if callback {
            gpu_flags::TIMESTAMP_CALLBACK
        } else {
            0
        };
        if matches!(mode, Mode::Multi(_)) {
            flags |= gpu_flags::MULTI_SUBSCRIBER;
        }
        let info = GpuRecord {
            what: gpu_record::INFO,
            flags,
            detail: version,
            start: buffer_requested as *const () as usize as u64,
            pid: std::process::id(),
            ..GpuRecord::default()
        };
        sender.push_text(info, &cupti.path);
        if !callback {
            send_clock_pair(&cupti, sender);
        }
        // Out before the registration below: cudatrace tells this library's
        // cuptiActivityRegisterCallbacks from another client's by the INFO's address.
        sender.flush();
    }
    let session = SESSION.get_or_init(|| Session {
        cupti,
        clock_flags,
        pid: std::process::id(),
        mode,
    });
    control::open();
    // Another client that took CUPTI before cuInit keeps it: taken when it lets go.
    if !control::start_yielded() {
        take(session, false).map_err(|failure| match failure.stage {
            gpu_stage::RESUME => Failure {
                stage: gpu_stage::REGISTER_CALLBACKS,
                ..failure
            },
            _ => failure,
        })?;
    }
    flush::start();
    Ok(())
}

/// A subscriber of the library's own beside the program's, where CUPTI allows several;
/// `None` otherwise (and then nothing is left subscribed: a later `cuptiSubscribe` of the
/// program's profiler must succeed as without cudatrace).
fn subscribe_beside_others(cupti: &Cupti, version: u32) -> Option<Subscriber> {
    let api = cupti.per_subscriber.as_ref()?;
    if version < MULTI_SUBSCRIBER_VERSION {
        return None;
    }
    let mut params = SubscriberParams {
        struct_size: SUBSCRIBER_PARAMS_SIZE,
        subscriber_name: c"cudatrace".as_ptr(),
        old_subscriber_name: std::ptr::null_mut(),
        old_subscriber_size: 0,
        allow_multiple_subscribers: 1,
    };
    let mut subscriber: Subscriber = std::ptr::null_mut();
    // SAFETY: CUPTI writes the handle; no callback function (activity only).
    let rc = unsafe {
        (api.subscribe)(
            &mut subscriber,
            std::ptr::null(),
            std::ptr::null_mut(),
            &mut params,
        )
    };
    (rc == CUPTI_SUCCESS && !subscriber.is_null()).then_some(subscriber)
}

/// Registers CLOCK_MONOTONIC as CUPTI's clock, where CUPTI has the function.
fn register_timestamp_callback(cupti: &Cupti) -> bool {
    let Some(register) = cupti.register_timestamp_callback else {
        return false;
    };
    // SAFETY: the callback is a plain function, valid for the life of the process.
    match unsafe { register(control::timestamp) } {
        CUPTI_SUCCESS => true,
        rc => {
            report_now(Failure {
                stage: gpu_stage::TIMESTAMP_CALLBACK,
                result: rc,
                detail: 0,
                fatal: false,
                message: format!(
                    "cuptiActivityRegisterTimestampCallback failed: {}: timestamps are converted with clock pairs",
                    cupti.result_string(rc)
                ),
            });
            false
        }
    }
}

/// Callback ids below this are set, one by one, when the library takes CUPTI back
/// (CUDA 13's driver ids end near 800).
const DRIVER_CBID_LIMIT: u32 = 1024;

/// Registers the buffer callbacks and enables the activity kinds and driver API records:
/// at start, and when another client let go (`again`: it may have replaced the callbacks
/// and the clock, and disabled the kinds). Failing is fatal, as stage
/// [`gpu_stage::RESUME`] (start says its own stage).
pub fn take(session: &Session, again: bool) -> Result<(), Failure> {
    let cupti = &session.cupti;
    let rc = match session.mode {
        // SAFETY: both callbacks are plain functions, valid for the life of the process.
        Mode::Single => unsafe { (cupti.register_callbacks)(buffer_requested, buffer_completed) },
        Mode::Multi(subscriber) => match cupti.per_subscriber.as_ref() {
            // SAFETY: as above, for this subscriber.
            Some(api) => unsafe {
                (api.register_callbacks)(subscriber, buffer_requested_v2, buffer_completed_v2)
            },
            None => CUPTI_SUCCESS,
        },
    };
    if again {
        verbose(format_args!("resume: cuptiActivityRegisterCallbacks {rc}"));
    }
    if rc != CUPTI_SUCCESS {
        return Err(Failure {
            stage: gpu_stage::RESUME,
            result: rc,
            detail: 0,
            fatal: true,
            message: format!(
                "cuptiActivityRegisterCallbacks failed: {}: GPU activity is not recorded",
                cupti.result_string(rc)
            ),
        });
    }
    for (index, (kind, what)) in ACTIVITY_KINDS.iter().enumerate() {
        let rc = enable(session, *kind, true);
        if rc != CUPTI_SUCCESS {
            for (enabled, _) in &ACTIVITY_KINDS[..index] {
                enable(session, *enabled, false);
            }
            return Err(Failure {
                stage: gpu_stage::ENABLE_ACTIVITY,
                result: rc,
                detail: *kind,
                fatal: true,
                message: format!(
                    "CUPTI refused to record {what} activity: {}{}: GPU activity is not recorded",
                    cupti.result_string(rc),
                    remedy(rc)
                ),
            });
        }
    }
    if again {
        only_our_driver_api(session);
    }
    enable_driver_api(session);
    Ok(())
}

/// A line on stderr where [`ENV_VERBOSE`] is `1`.
pub fn verbose(what: std::fmt::Arguments) {
    if std::env::var_os(ENV_VERBOSE).is_some_and(|v| v == "1") {
        eprintln!("cudatrace-inject: +{} ns: {what}", flush::monotonic_ns());
    }
}

/// After another client: the DRIVER kind overrides the per-function switches set before
/// it (CUPTI's documentation), and once that client disabled it, switching functions on
/// alone recorded nothing (run J1, CUPTI 13.0). So, as CUPTI's documentation says for
/// recording a set of functions: the DRIVER kind on, then every other function off. On
/// CUPTI 13.0 after torch.profiler this records nothing either (run J2), nor did any other
/// way tried (run L): docs/gpu.md.
fn only_our_driver_api(session: &Session) {
    let (Mode::Single, Some(switch)) = (&session.mode, session.cupti.enable_driver_api) else {
        return;
    };
    let rc = enable(session, activity_kind::DRIVER, true);
    verbose(format_args!("resume: cuptiActivityEnable(DRIVER) {rc}"));
    if rc != CUPTI_SUCCESS {
        return;
    }
    let ours: std::collections::HashSet<u32> = cbids::LINKED_DRIVER_FUNCTIONS
        .iter()
        .map(|&(_, cbid)| cbid)
        .collect();
    let mut refused = 0;
    for cbid in (1..DRIVER_CBID_LIMIT).filter(|cbid| !ours.contains(cbid)) {
        // SAFETY: a plain setting; ids past CUPTI's last are refused, which is fine.
        if unsafe { switch(cbid, 0) } != CUPTI_SUCCESS {
            refused += 1;
        }
    }
    verbose(format_args!(
        "resume: other functions off, {refused} refused"
    ));
}

/// Takes CUPTI back after another client let go: the clock first (the other client may
/// have registered its own), then [`take`]; a CLIENT record says when.
pub fn resume(session: &Session) -> Result<(), Failure> {
    if session.clock_flags == 0 {
        register_timestamp_callback(&session.cupti);
    }
    take(session, true)?;
    verbose(format_args!("resume: done"));
    if let Some(sender) = sender().as_mut() {
        if session.clock_flags != 0 {
            send_clock_pair(&session.cupti, sender);
        }
        sender.push(GpuRecord {
            what: gpu_record::CLIENT,
            detail: tracer_common::client::RESUMED,
            start: monotonic_ns(),
            ..GpuRecord::default()
        });
        sender.flush();
    }
    Ok(())
}

fn enable(session: &Session, kind: u32, on: bool) -> CUptiResult {
    let cupti = &session.cupti;
    // SAFETY: plain settings.
    unsafe {
        match (&session.mode, cupti.per_subscriber.as_ref(), on) {
            (Mode::Multi(subscriber), Some(api), true) => {
                (api.enable)(*subscriber, kind, std::ptr::null_mut::<c_void>())
            }
            (Mode::Multi(subscriber), Some(api), false) => {
                (api.disable)(*subscriber, kind, std::ptr::null_mut::<c_void>())
            }
            (_, _, true) => (cupti.enable)(kind),
            (_, _, false) => (cupti.disable)(kind),
        }
    }
}

/// What a user can do about a CUPTI refusal, if anything.
fn remedy(rc: CUptiResult) -> &'static str {
    match rc {
        35 => {
            " (GPU profiling is restricted to admin users: run as root, or load the nvidia \
             module with NVreg_RestrictProfilingToAdminUsers=0)"
        }
        39 => " (another CUPTI client, such as Nsight Systems or torch.profiler, is active)",
        _ => "",
    }
}

/// Enables the API records of the driver calls that issue GPU work.
fn enable_driver_api(session: &Session) {
    let cupti = &session.cupti;
    let enable: Box<dyn Fn(u32) -> CUptiResult> = match (&session.mode, &cupti.per_subscriber) {
        (Mode::Multi(subscriber), Some(api)) => {
            let (subscriber, function) = (*subscriber, api.enable_driver_api);
            // SAFETY: a plain setting of this subscriber.
            Box::new(move |cbid| unsafe { function(subscriber, cbid, 1) })
        }
        _ => match cupti.enable_driver_api {
            // SAFETY: a plain setting.
            Some(function) => Box::new(move |cbid| unsafe { function(cbid, 1) }),
            None => {
                report_now(Failure {
                    stage: gpu_stage::MISSING_FUNCTION,
                    result: 0,
                    detail: 0,
                    fatal: false,
                    message: format!(
                        "{} has no cuptiActivityEnableDriverApi: GPU records cannot be linked to their calls",
                        cupti.path
                    ),
                });
                return;
            }
        },
    };
    let mut refused = Vec::new();
    let mut first_rc = CUPTI_SUCCESS;
    for &(function, cbid) in cbids::LINKED_DRIVER_FUNCTIONS {
        let rc = enable(cbid);
        if rc != CUPTI_SUCCESS {
            if refused.is_empty() {
                first_rc = rc;
            }
            refused.push((function, cbid));
        }
    }
    if let Some(&(_, first_cbid)) = refused.first() {
        let names: Vec<&str> = refused.iter().map(|(name, _)| *name).collect();
        report_now(Failure {
            stage: gpu_stage::ENABLE_DRIVER_API,
            result: first_rc,
            detail: first_cbid,
            fatal: false,
            message: format!(
                "cuptiActivityEnableDriverApi failed for {} of {} functions ({}): {}: their GPU records cannot be linked to their calls",
                refused.len(),
                cbids::LINKED_DRIVER_FUNCTIONS.len(),
                names.join(", "),
                cupti.result_string(first_rc)
            ),
        });
    }
}
