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

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tracer_common::{GpuRecord, client, gpu_flags, gpu_record, gpu_stage};

use crate::clock::monotonic_ns;
use crate::cupti::{
    CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, CUPTI_SUCCESS, CUptiResult, Cupti, LoadError,
    MULTI_SUBSCRIBER_VERSION, PerSubscriber, SUBSCRIBER_PARAMS_SIZE, Subscriber, SubscriberParams,
    THREAD_ID_TYPE_SYSTEM, activity_kind,
};
use crate::env::{self, verbose};
use crate::outbox::{Failure, Outbox, Uprobe, client_record, report};
use crate::sender::Sender;
use crate::{
    buffer_completed, buffer_completed_v2, buffer_requested, buffer_requested_v2, cbids, timestamp,
};

/// The activity kinds enabled, in order; all or none.
pub const ACTIVITY_KINDS: [(u32, &str); 3] = [
    (activity_kind::CONCURRENT_KERNEL, "kernel"),
    (activity_kind::MEMCPY, "memcpy"),
    (activity_kind::MEMSET, "memset"),
];

/// Callback ids below this are switched off, one by one, when the library takes CUPTI back
/// (CUDA 13's driver ids end near 800).
const DRIVER_CBID_LIMIT: u32 = 1024;

/// Pairs read for one CLOCK record: the tightest is kept.
const CLOCK_PAIR_TRIES: usize = 4;

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
    /// CUPTI's API version (the INFO record's `detail`).
    version: u32,
    /// The library enabled the DRIVER kind (a late start's way, or taking CUPTI back):
    /// a late start's end disables it again.
    driver_kind: AtomicBool,
    /// The RUNTIME kind is on (a late start's diagnostics, [`env::LATE_RUNTIME`]).
    runtime_kind: AtomicBool,
    /// The callback API's subscriber of a late start that makes the API records itself
    /// (`calls.rs`), as an address; 0 when none.
    calls: Mutex<usize>,
    /// The records' clock, for the driver callbacks (their `userdata`).
    calls_clock: crate::calls::Clock,
}

// SAFETY: the subscriber handle is CUPTI's, valid from any thread.
unsafe impl Send for Session {}
// SAFETY: as above; the session is never changed after it is set, but for an atomic.
unsafe impl Sync for Session {}

impl Session {
    /// Loads and sets up CUPTI, and says so (an INFO record); an error stops GPU recording
    /// in this process. The activity API is not taken yet ([`Session::take`]).
    /// `late`: a late start (`cudatrace run -p PID --gpu`), where another client may hold
    /// CUPTI already.
    pub fn open(outbox: &Outbox, late: bool) -> Result<Session, Failure> {
        let cupti = load()?;
        let mut version = 0;
        // SAFETY: CUPTI writes one u32.
        unsafe { (cupti.get_version)(&mut version) };
        system_thread_ids(&cupti, outbox);
        let mode = match subscribe_beside_others(&cupti, version) {
            Some(subscriber) => Mode::Multi(subscriber),
            None => Mode::Single,
        };
        // The timestamp callback is process-wide: with other subscribers it would change
        // their clock too, so then clock pairs only; so too where a late start finds
        // another client (torch.profiler) holding CUPTI: its records keep their clock.
        let held = late && matches!(mode, Mode::Single) && another_subscriber(&cupti);
        let no_callback = env::var(env::TIMESTAMP_CALLBACK).is_some_and(|v| v == "0");
        let callback = matches!(mode, Mode::Single)
            && !held
            && !no_callback
            && register_timestamp_callback(&cupti, outbox);
        let clock_flags = if callback { 0 } else { gpu_flags::CUPTI_CLOCK };
        let calls_clock = crate::calls::Clock {
            flags: clock_flags,
            cupti_timestamp: cupti.get_timestamp,
        };
        let session = Session {
            cupti,
            clock_flags,
            pid: std::process::id(),
            mode,
            version,
            driver_kind: AtomicBool::new(false),
            runtime_kind: AtomicBool::new(false),
            calls: Mutex::new(0),
            calls_clock,
        };
        session.announce(version, callback, outbox);
        Ok(session)
    }

    /// The INFO record: CUPTI's version and path, how it is held, the request callback's
    /// address; a clock pair where records come on CUPTI's clock.
    fn announce(&self, version: u32, callback: bool, outbox: &Outbox) {
        let mut guard = outbox.lock();
        let Some(sender) = guard.as_mut() else {
            return;
        };
        let mut flags = if callback {
            gpu_flags::TIMESTAMP_CALLBACK
        } else {
            0
        };
        if matches!(self.mode, Mode::Multi(_)) {
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
        sender.push_text(info, &self.cupti.path);
        if !callback {
            self.send_clock_pair(sender);
        }
        // Out before the registration that follows: cudatrace tells this library's
        // cuptiActivityRegisterCallbacks from another client's by the INFO's address.
        sender.flush();
    }

    /// A later late start in the same process (`cudatrace run -p PID --gpu` again): the
    /// clock again (another client may have replaced it), then the INFO record for the new
    /// run.
    pub fn announce_again(&self, outbox: &Outbox) {
        let callback = self.clock_flags == 0 && register_timestamp_callback(&self.cupti, outbox);
        self.announce(self.version, callback, outbox);
    }

    /// A late start's window ended: every activity kind and driver function this library
    /// enabled is off again, so CUPTI records nothing more for it.
    pub fn stop(&self, outbox: &Outbox) {
        let mut refused = Vec::new();
        for (kind, what) in ACTIVITY_KINDS {
            let rc = self.enable(kind, false);
            if rc != CUPTI_SUCCESS {
                refused.push(format!("{what}: {}", self.cupti.result_string(rc)));
            }
        }
        if self.runtime_kind.swap(false, Ordering::SeqCst) {
            let rc = self.enable(activity_kind::RUNTIME, false);
            if rc != CUPTI_SUCCESS {
                refused.push(format!("runtime: {}", self.cupti.result_string(rc)));
            }
        }
        if let Some(off) = self.unsubscribe_calls()
            && off > 0
        {
            refused.push(format!("{off} driver callbacks"));
        }
        if self.driver_kind.swap(false, Ordering::SeqCst) {
            let rc = self.enable(activity_kind::DRIVER, false);
            if rc != CUPTI_SUCCESS {
                refused.push(format!("driver: {}", self.cupti.result_string(rc)));
            }
        }
        let switch: Option<Box<dyn Fn(u32) -> CUptiResult>> = match self.per_subscriber() {
            Some((subscriber, api)) => {
                let function = api.enable_driver_api;
                // SAFETY: a plain setting of this subscriber.
                Some(Box::new(move |cbid| unsafe {
                    function(subscriber, cbid, 0)
                }))
            }
            // SAFETY: a plain setting.
            None => self
                .cupti
                .enable_driver_api
                .map(|function| Box::new(move |cbid| unsafe { function(cbid, 0) }) as Box<_>),
        };
        if let Some(switch) = switch {
            let off = cbids::LINKED_DRIVER_FUNCTIONS
                .iter()
                .filter(|&&(_, cbid)| switch(cbid) != CUPTI_SUCCESS)
                .count();
            if off > 0 {
                refused.push(format!("{off} driver functions"));
            }
        }
        if !refused.is_empty() {
            outbox.report(Failure::plain(
                gpu_stage::DETACH,
                false,
                format!(
                    "CUPTI refused to stop recording ({}): it may go on recording for no one",
                    refused.join(", ")
                ),
            ));
        }
    }

    /// A late start, one client at a time: whether another client of the program holds a
    /// CUPTI subscriber now (torch.profiler's Kineto, Nsight): the library's own
    /// `cuptiSubscribe` is refused then. A subscriber it gets is given back at once.
    pub fn other_client_subscribed(&self) -> bool {
        matches!(self.mode, Mode::Single) && another_subscriber(&self.cupti)
    }

    /// The per-subscriber functions and this library's subscriber, where it has one.
    pub fn per_subscriber(&self) -> Option<(Subscriber, &PerSubscriber)> {
        match (&self.mode, self.cupti.per_subscriber.as_ref()) {
            (Mode::Multi(subscriber), Some(api)) => Some((*subscriber, api)),
            _ => None,
        }
    }

    /// Registers the buffer callbacks and enables the activity kinds and driver API
    /// records: at start, and when another client let go (`again`: it may have replaced
    /// the callbacks and the clock, and disabled the kinds). Failing is fatal, as stage
    /// [`gpu_stage::RESUME`] (start says its own stage).
    pub fn take(&self, again: bool, outbox: &Outbox) -> Result<(), Failure> {
        self.register_callbacks(again)?;
        self.enable_activity()?;
        if again {
            self.only_our_driver_api();
        }
        self.enable_driver_api(outbox);
        Ok(())
    }

    /// The start at `cuInit` takes CUPTI: [`Session::take`], unless [`env::CALLS`] asks
    /// for the callbacks' API records or none (for measuring CUPTI's cost).
    pub fn take_first(&'static self, outbox: &Outbox) -> Result<(), Failure> {
        let calls = env::var(env::CALLS).map(|way| way.to_string_lossy().into_owned());
        match calls.as_deref() {
            Some("callbacks") => {
                self.register_callbacks(false)?;
                if let Err(why) = self.subscribe_calls() {
                    verbose(format_args!("start: driver callbacks: {why}"));
                    self.enable_driver_api(outbox);
                }
                self.enable_activity().inspect_err(|_| self.stop_calls())
            }
            Some("none") => {
                self.register_callbacks(false)?;
                self.enable_activity()
            }
            _ => self.take(false, outbox),
        }
    }

    /// A late start takes CUPTI (`cudatrace run -p PID --gpu`): the activity kinds, and the
    /// driver calls' API records from CUPTI's callbacks (`calls.rs`, the default): CUPTI's
    /// own DRIVER records, set up in a running PyTorch process (CUPTI 13.0, driver 580),
    /// came for about one launch in seven (runs S and T). With [`env::LATE_CALLS`] `off`
    /// (or where the callbacks cannot be had), the DRIVER records as [`env::DRIVER_API`]
    /// says: per-function switches alone, which work from `cuInit`, gave none at all late;
    /// CUPTI's documentation has the DRIVER kind override the switches set before it, and
    /// for a set of functions enable the kind, then switch the others off (its default).
    pub fn take_late(&'static self, outbox: &Outbox) -> Result<(), Failure> {
        let calls = env::var(env::LATE_CALLS).map(|way| way.to_string_lossy().into_owned());
        if env::var(env::LATE_RUNTIME).is_some_and(|v| v == "1") {
            let rc = self.enable(activity_kind::RUNTIME, true);
            verbose(format_args!("attach: cuptiActivityEnable(RUNTIME) {rc}"));
            self.runtime_kind
                .store(rc == CUPTI_SUCCESS, Ordering::SeqCst);
        }
        // The calls' records are switched on before the work's: a call that returns in
        // between has a record and no work (counted as before the window), never work
        // without a record.
        if !matches!(calls.as_deref(), Some("off") | Some("debug")) {
            self.register_callbacks(false)?;
            if let Err(why) = self.subscribe_calls() {
                verbose(format_args!("attach: driver callbacks: {why}"));
                self.only_our_driver_api();
                self.enable_driver_api(outbox);
            }
            return self.enable_activity().inspect_err(|_| self.stop_calls());
        }
        if calls.as_deref() == Some("debug")
            && let Err(why) = self.subscribe_calls()
        {
            verbose(format_args!("attach: driver callbacks: {why}"));
        }
        let way = env::var(env::DRIVER_API).map(|way| way.to_string_lossy().into_owned());
        match way.as_deref() {
            Some("functions") => self.take(false, outbox),
            Some("all") => {
                self.register_callbacks(false)?;
                let rc = self.enable(activity_kind::DRIVER, true);
                verbose(format_args!("attach: cuptiActivityEnable(DRIVER) {rc}"));
                if rc == CUPTI_SUCCESS {
                    self.driver_kind.store(true, Ordering::SeqCst);
                } else {
                    self.enable_driver_api(outbox);
                }
                self.enable_activity().inspect_err(|_| self.stop_calls())
            }
            _ => {
                self.register_callbacks(false)?;
                self.only_our_driver_api();
                self.enable_driver_api(outbox);
                self.enable_activity().inspect_err(|_| self.stop_calls())
            }
        }
    }

    /// Subscribes [`crate::calls::on_driver_call`] to the driver functions that issue GPU
    /// work ([`cbids::LINKED_DRIVER_FUNCTIONS`]).
    fn subscribe_calls(&'static self) -> Result<(), String> {
        let (Some(subscribe), Some(enable)) = (self.cupti.subscribe, self.cupti.enable_callback)
        else {
            return Err("no cuptiSubscribe or cuptiEnableCallback".into());
        };
        let mut handle: Subscriber = std::ptr::null_mut();
        let user = &self.calls_clock as *const crate::calls::Clock as *mut c_void;
        // SAFETY: a plain function valid for the life of the process; the session's clock too.
        let rc = unsafe {
            subscribe(
                &mut handle,
                crate::calls::on_driver_call as *const c_void,
                user,
            )
        };
        if rc != CUPTI_SUCCESS {
            return Err(format!("cuptiSubscribe: {}", self.cupti.result_string(rc)));
        }
        *self.calls.lock().unwrap_or_else(|e| e.into_inner()) = handle as usize;
        let refused = cbids::LINKED_DRIVER_FUNCTIONS
            .iter()
            // SAFETY: a plain setting of this subscriber.
            .filter(|&&(_, cbid)| unsafe {
                enable(1, handle, crate::calls::DOMAIN_DRIVER_API, cbid)
            } != CUPTI_SUCCESS)
            .count();
        verbose(format_args!(
            "attach: driver callbacks on, {refused} refused"
        ));
        Ok(())
    }

    /// After a failed start: the callbacks and the driver calls' records off again.
    fn stop_calls(&self) {
        self.unsubscribe_calls();
        if self.driver_kind.swap(false, Ordering::SeqCst) {
            self.enable(activity_kind::DRIVER, false);
        }
    }

    /// Switches the driver callbacks off and unsubscribes; how many switches CUPTI
    /// refused, `None` where there was no subscriber.
    fn unsubscribe_calls(&self) -> Option<usize> {
        let handle = std::mem::take(&mut *self.calls.lock().unwrap_or_else(|e| e.into_inner()));
        if handle == 0 {
            return None;
        }
        let handle = handle as Subscriber;
        let mut refused = 0;
        if let Some(enable) = self.cupti.enable_callback {
            for &(_, cbid) in cbids::LINKED_DRIVER_FUNCTIONS {
                // SAFETY: a plain setting of this subscriber.
                if unsafe { enable(0, handle, crate::calls::DOMAIN_DRIVER_API, cbid) }
                    != CUPTI_SUCCESS
                {
                    refused += 1;
                }
            }
        }
        if let Some(unsubscribe) = self.cupti.unsubscribe {
            // SAFETY: the handle CUPTI gave.
            if unsafe { unsubscribe(handle) } != CUPTI_SUCCESS {
                refused += 1;
            }
        }
        Some(refused)
    }

    /// Takes CUPTI back after another client let go: the clock first (the other client may
    /// have registered its own), then [`Session::take`]; a CLIENT record says when.
    pub fn resume(&self, outbox: &Outbox) -> Result<(), Failure> {
        if self.clock_flags == 0 {
            register_timestamp_callback(&self.cupti, outbox);
        }
        self.take(true, outbox)?;
        verbose(format_args!("resume: done"));
        if let Some(sender) = outbox.lock().as_mut() {
            if self.clock_flags != 0 {
                self.send_clock_pair(sender);
            }
            sender.push(client_record(client::RESUMED));
            sender.flush();
        }
        Ok(())
    }

    fn register_callbacks(&self, again: bool) -> Result<(), Failure> {
        let cupti = &self.cupti;
        let rc = match (&self.mode, cupti.per_subscriber.as_ref()) {
            // SAFETY: both callbacks are plain functions, valid for the life of the process.
            (Mode::Single, _) => unsafe {
                (cupti.register_callbacks)(buffer_requested, buffer_completed)
            },
            // SAFETY: as above, for this subscriber.
            (Mode::Multi(subscriber), Some(api)) => unsafe {
                (api.register_callbacks)(*subscriber, buffer_requested_v2, buffer_completed_v2)
            },
            (Mode::Multi(_), None) => CUPTI_SUCCESS,
        };
        if again {
            verbose(format_args!("resume: cuptiActivityRegisterCallbacks {rc}"));
        }
        if rc == CUPTI_SUCCESS {
            return Ok(());
        }
        Err(Failure {
            stage: gpu_stage::RESUME,
            result: rc,
            detail: 0,
            fatal: true,
            message: format!(
                "cuptiActivityRegisterCallbacks failed: {}: GPU activity is not recorded",
                cupti.result_string(rc)
            ),
        })
    }

    /// Enables [`ACTIVITY_KINDS`], all or none.
    fn enable_activity(&self) -> Result<(), Failure> {
        for (index, (kind, what)) in ACTIVITY_KINDS.iter().enumerate() {
            let rc = self.enable(*kind, true);
            if rc == CUPTI_SUCCESS {
                continue;
            }
            for (enabled, _) in &ACTIVITY_KINDS[..index] {
                self.enable(*enabled, false);
            }
            return Err(Failure {
                stage: gpu_stage::ENABLE_ACTIVITY,
                result: rc,
                detail: *kind,
                fatal: true,
                message: format!(
                    "CUPTI refused to record {what} activity: {}{}: GPU activity is not recorded",
                    self.cupti.result_string(rc),
                    remedy(rc)
                ),
            });
        }
        Ok(())
    }

    /// After another client: the DRIVER kind overrides the per-function switches set
    /// before it (CUPTI's documentation), and once that client disabled it, switching
    /// functions on alone recorded nothing (run J1, CUPTI 13.0). So, as CUPTI's
    /// documentation says for recording a set of functions: the DRIVER kind on, then every
    /// other function off. On CUPTI 13.0 after torch.profiler this records nothing either
    /// (run J2), nor did any other way tried (run L): docs/gpu.md.
    fn only_our_driver_api(&self) {
        let (Mode::Single, Some(switch)) = (&self.mode, self.cupti.enable_driver_api) else {
            return;
        };
        let rc = self.enable(activity_kind::DRIVER, true);
        verbose(format_args!("resume: cuptiActivityEnable(DRIVER) {rc}"));
        if rc != CUPTI_SUCCESS {
            return;
        }
        self.driver_kind.store(true, Ordering::SeqCst);
        let ours: HashSet<u32> = cbids::LINKED_DRIVER_FUNCTIONS
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

    /// Enables the API records of the driver calls that issue GPU work.
    fn enable_driver_api(&self, outbox: &Outbox) {
        let cupti = &self.cupti;
        let enable: Box<dyn Fn(u32) -> CUptiResult> = match self.per_subscriber() {
            Some((subscriber, api)) => {
                let function = api.enable_driver_api;
                // SAFETY: a plain setting of this subscriber.
                Box::new(move |cbid| unsafe { function(subscriber, cbid, 1) })
            }
            None => match cupti.enable_driver_api {
                // SAFETY: a plain setting.
                Some(function) => Box::new(move |cbid| unsafe { function(cbid, 1) }),
                None => {
                    outbox.report(Failure::plain(
                        gpu_stage::MISSING_FUNCTION,
                        false,
                        format!(
                            "{} has no cuptiActivityEnableDriverApi: GPU records cannot be linked to their calls",
                            cupti.path
                        ),
                    ));
                    return;
                }
            },
        };
        let refused: Vec<(&str, u32, CUptiResult)> = cbids::LINKED_DRIVER_FUNCTIONS
            .iter()
            .map(|&(function, cbid)| (function, cbid, enable(cbid)))
            .filter(|&(_, _, rc)| rc != CUPTI_SUCCESS)
            .collect();
        let Some(&(_, first_cbid, first_rc)) = refused.first() else {
            return;
        };
        let names: Vec<&str> = refused.iter().map(|(name, _, _)| *name).collect();
        outbox.report(Failure {
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

    fn enable(&self, kind: u32, on: bool) -> CUptiResult {
        let cupti = &self.cupti;
        // SAFETY: plain settings.
        unsafe {
            match (self.per_subscriber(), on) {
                (Some((subscriber, api)), true) => {
                    (api.enable)(subscriber, kind, std::ptr::null_mut::<c_void>())
                }
                (Some((subscriber, api)), false) => {
                    (api.disable)(subscriber, kind, std::ptr::null_mut::<c_void>())
                }
                (None, true) => (cupti.enable)(kind),
                (None, false) => (cupti.disable)(kind),
            }
        }
    }

    /// Queues a CLOCK record: CUPTI's timestamp and CLOCK_MONOTONIC (the midpoint of two
    /// reads around it), the tightest of [`CLOCK_PAIR_TRIES`] reads. A midpoint is off by
    /// up to half the time between its two reads, and one read can be slow (the first
    /// touches pages for the first time; the thread can be preempted): 16 µs off at
    /// `cuInit` under QEMU's TCG, enough to put a call's CUPTI record before the call.
    pub fn send_clock_pair(&self, sender: &mut Sender<Uprobe>) {
        let cupti = &self.cupti;
        let mut tightest: Option<(u64, u64, u64)> = None;
        for _ in 0..CLOCK_PAIR_TRIES {
            let mut cupti_ns = 0;
            let before = monotonic_ns();
            // SAFETY: reads the clock only.
            let rc = unsafe { (cupti.get_timestamp)(&mut cupti_ns) };
            let after = monotonic_ns();
            if rc != CUPTI_SUCCESS {
                report(
                    sender,
                    Failure {
                        stage: gpu_stage::TIMESTAMP,
                        result: rc,
                        detail: 0,
                        fatal: false,
                        message: format!("cuptiGetTimestamp failed: {}", cupti.result_string(rc)),
                    },
                );
                return;
            }
            let gap = after.saturating_sub(before);
            if tightest.is_none_or(|(best, _, _)| gap < best) {
                tightest = Some((gap, cupti_ns, before + gap / 2));
            }
        }
        if let Some((_, cupti_ns, monotonic)) = tightest {
            sender.push(GpuRecord {
                what: gpu_record::CLOCK,
                start: cupti_ns,
                end: monotonic,
                ..GpuRecord::default()
            });
        }
    }
}

/// Loads libcupti ([`env::CUPTI`], or the loader's search).
fn load() -> Result<Cupti, Failure> {
    let path = env::path(env::CUPTI).map(|p| p.to_string_lossy().into_owned());
    Cupti::load(path.as_deref()).map_err(|error| match error {
        LoadError::NotLoadable(why) => Failure::plain(
            gpu_stage::LOAD_CUPTI,
            true,
            format!("cannot load libcupti ({why}): GPU activity is not recorded"),
        ),
        LoadError::MissingFunction { path, function } => Failure::plain(
            gpu_stage::MISSING_FUNCTION,
            true,
            format!("{path} has no {function}: GPU activity is not recorded"),
        ),
    })
}

/// Asks for the system's thread ids (`gettid()`, as in the trace) in records.
fn system_thread_ids(cupti: &Cupti, outbox: &Outbox) {
    // SAFETY: a plain setting.
    let rc = unsafe { (cupti.set_thread_id_type)(THREAD_ID_TYPE_SYSTEM) };
    if rc != CUPTI_SUCCESS {
        outbox.report(Failure {
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
fn register_timestamp_callback(cupti: &Cupti, outbox: &Outbox) -> bool {
    let Some(register) = cupti.register_timestamp_callback else {
        return false;
    };
    // SAFETY: the callback is a plain function, valid for the life of the process.
    match unsafe { register(timestamp) } {
        CUPTI_SUCCESS => true,
        rc => {
            outbox.report(Failure {
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

/// Whether another client holds CUPTI's one subscriber: the library's own `cuptiSubscribe`
/// is refused then. A subscriber it gets is given back at once.
fn another_subscriber(cupti: &Cupti) -> bool {
    let (Some(subscribe), Some(unsubscribe)) = (cupti.subscribe, cupti.unsubscribe) else {
        return false;
    };
    let mut handle: Subscriber = std::ptr::null_mut();
    // SAFETY: CUPTI writes the handle; no callback function.
    let rc = unsafe { subscribe(&mut handle, std::ptr::null(), std::ptr::null_mut()) };
    if rc == CUPTI_SUCCESS {
        // SAFETY: the handle CUPTI just gave.
        unsafe { unsubscribe(handle) };
    }
    rc == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
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
