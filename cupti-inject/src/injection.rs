//! The library's one owner: everything it keeps between CUPTI's calls into it, in one
//! [`Injection`] (lib.rs's `INJECTION`: CUPTI's and libc's callbacks carry no data of
//! ours). Each concern is a field: the outbox (the sender), the CUPTI session, the buffers,
//! the control slot, flushing. Starting, the flush thread and the exit flush are its
//! phases.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use tracer_common::{client, gpu_stage};

use crate::buffers::Buffers;
use crate::chain;
use crate::control::{Change, Control};
use crate::cupti::FLUSH_FORCED;
use crate::env;
use crate::flush::{self, Flush};
use crate::outbox::{Failure, Outbox, Uprobe, client_record};
use crate::sender::Sender;
use crate::session::{Mode, Session};

pub struct Injection {
    /// `InitializeInjection` ran: it starts the library once per process.
    started: AtomicBool,
    /// Started late (`cudatrace_attach`), not by libcuda at `cuInit`.
    late: AtomicBool,
    /// A late start records now: its flush thread runs until cudatrace's window ends.
    attached: AtomicBool,
    /// The exit handler was registered (once per process).
    exit_handler: AtomicBool,
    outbox: Outbox,
    /// CUPTI, once loaded and set up.
    session: OnceLock<Session>,
    buffers: Buffers,
    control: Control,
    flush: Flush,
}

impl Injection {
    pub const fn new() -> Self {
        Injection {
            started: AtomicBool::new(false),
            late: AtomicBool::new(false),
            attached: AtomicBool::new(false),
            exit_handler: AtomicBool::new(false),
            outbox: Outbox::new(),
            session: OnceLock::new(),
            buffers: Buffers::new(),
            control: Control::new(),
            flush: Flush::new(),
        }
    }

    pub fn buffers(&self) -> &Buffers {
        &self.buffers
    }

    pub fn control(&self) -> &Control {
        &self.control
    }

    /// Starts the library, the first time only. A failure is reported to cudatrace, never
    /// allowed to break the program.
    pub fn initialize(&'static self) {
        if !self.started.swap(true, Ordering::SeqCst)
            && catch_unwind(AssertUnwindSafe(|| self.start())).is_err()
        {
            eprintln!("cudatrace-inject: internal error: GPU activity is not recorded");
        }
    }

    /// A late start (`cudatrace run -p PID --gpu`): the program runs already, CUDA may be
    /// in use. Sets CUPTI up the first time, takes it again at a later attach, and starts
    /// the flush thread, which stops recording when cudatrace's window ends
    /// ([`Injection::detach`]). Returns 0, or 1 when a library started by libcuda records
    /// already, 2 while an earlier attach still records.
    pub fn attach(&'static self, given: &str) -> i32 {
        if self.started.load(Ordering::SeqCst) && !self.late.load(Ordering::SeqCst) {
            return 1;
        }
        if self.attached.swap(true, Ordering::SeqCst) {
            return 2;
        }
        env::set_given(given);
        let first = !self.started.swap(true, Ordering::SeqCst);
        self.late.store(true, Ordering::SeqCst);
        if first {
            self.outbox.open(sender());
        } else if let Some(sender) = self.outbox.lock().as_mut() {
            // This attach's cudatrace has seen none of the names the last one was sent.
            sender.forget_names();
        }
        // CUPTI is set up on a thread of the library's own, which then flushes: the
        // program's thread that called here goes back to its work at once.
        let spawned = std::thread::Builder::new()
            .name("cudatrace-flush".into())
            .spawn(move || {
                let recorded = catch_unwind(AssertUnwindSafe(|| {
                    if let Err(failure) = self.attach_cupti() {
                        self.outbox.report(failure);
                        self.outbox.send_client(client::DETACHED);
                        self.outbox.flush();
                    }
                }));
                if recorded.is_err() {
                    eprintln!("cudatrace-inject: internal error: GPU activity is not recorded");
                }
                self.attached.store(false, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            self.attached.store(false, Ordering::SeqCst);
            self.outbox.report(Failure::plain(
                gpu_stage::FLUSH,
                true,
                format!("cannot start the library's thread ({e}): GPU activity is not recorded"),
            ));
            self.outbox.send_client(client::DETACHED);
            self.outbox.flush();
        }
        0
    }

    /// CUPTI for a late start, on the library's thread: loaded and announced (INFO) the
    /// first time, announced again at a later one; taken unless another client holds it
    /// (an ATTACHED record says from when it records); then this thread flushes until the
    /// window ends.
    fn attach_cupti(&'static self) -> Result<(), Failure> {
        if let Err(failure) = self.control.open() {
            self.outbox.report(failure);
        }
        let session = match self.session.get() {
            Some(session) => {
                session.announce_again(&self.outbox);
                session
            }
            None => {
                let session = Session::open(&self.outbox, true)?;
                self.session.get_or_init(|| session)
            }
        };
        if self.control.start_yielded() {
            self.outbox.send_client(client::YIELDED);
        } else if session.other_client_subscribed() {
            self.control.start_held();
            self.outbox.send_client(client::HELD_AT_ATTACH);
        } else {
            session.take_late(&self.outbox)?;
            self.outbox.send_client(client::ATTACHED);
        }
        self.outbox.flush();
        if !self.exit_handler.swap(true, Ordering::SeqCst) {
            // SAFETY: a plain function, run once at normal exit.
            unsafe { libc::atexit(crate::at_exit) };
        }
        self.flush_periodically(session);
        Ok(())
    }

    /// The end of a late start's window: the last records out (incomplete ones included),
    /// every kind and driver function off, this library's subscriber gone where it has one,
    /// a CLIENT DETACHED record; the flush thread then ends. Nothing of the library runs in
    /// the program after it; a later attach takes CUPTI again.
    ///
    /// The DETACHED record is stamped just before anything is turned off: a call that begins
    /// from then on may find CUPTI off, and cudatrace counts it `not_recorded` by that
    /// time (stamped after the last flush, such a call fell between the two and was
    /// counted by no reason).
    fn detach(&self, session: &Session) {
        let detached = if !self.control.yielded() && !self.control.held_by_other() {
            self.flush
                .flush(FLUSH_FORCED, session, &self.buffers, &self.outbox);
            let detached = client_record(client::DETACHED);
            session.stop(&self.outbox);
            send_calls(&self.outbox);
            self.flush
                .flush(FLUSH_FORCED, session, &self.buffers, &self.outbox);
            detached
        } else {
            self.buffers.read_completed(session, &self.outbox);
            client_record(client::DETACHED)
        };
        if let Some(sender) = self.outbox.lock().as_mut() {
            sender.push(detached);
            sender.flush();
        }
    }

    /// Opens the outbox, sets up CUPTI, starts a chained injection library.
    fn start(&'static self) {
        self.outbox.open(sender());
        if let Err(failure) = self.start_cupti() {
            self.outbox.report(failure);
        }
        if let Err(failure) = chain::start() {
            self.outbox.report(failure);
        }
        self.outbox.flush();
    }

    /// Loads CUPTI, takes it (unless another client holds it), starts flushing; an error
    /// stops GPU recording in this process.
    fn start_cupti(&'static self) -> Result<(), Failure> {
        let session = Session::open(&self.outbox, false)?;
        let session = self.session.get_or_init(|| session);
        // With a subscriber of its own the library never yields.
        if matches!(session.mode, Mode::Single)
            && let Err(failure) = self.control.open()
        {
            self.outbox.report(failure);
        }
        // Another client that took CUPTI before cuInit keeps it: taken when it lets go.
        if self.control.start_yielded() {
            self.outbox.send_client(client::YIELDED);
        } else {
            session
                .take_first(&self.outbox)
                .map_err(|failure| match failure.stage {
                    gpu_stage::RESUME => Failure {
                        stage: gpu_stage::REGISTER_CALLBACKS,
                        ..failure
                    },
                    _ => failure,
                })?;
        }
        self.start_flushing(session);
        Ok(())
    }

    /// Registers the exit flush and starts the flush thread.
    fn start_flushing(&'static self, session: &'static Session) {
        if !self.exit_handler.swap(true, Ordering::SeqCst) {
            // SAFETY: a plain function, run once at normal exit.
            unsafe { libc::atexit(crate::at_exit) };
        }
        if let Err(e) = std::thread::Builder::new()
            .name("cudatrace-flush".into())
            .spawn(move || self.flush_periodically(session))
        {
            self.outbox.report(Failure::plain(
                gpu_stage::FLUSH,
                false,
                format!(
                    "cannot start the flush thread ({e}): records arrive in full buffers and at exit"
                ),
            ));
        }
    }

    /// Asks CUPTI for completed buffers every period until exit, except while another
    /// client holds the activity API; wakes early when cudatrace changes the control slot.
    fn flush_periodically(&self, session: &Session) {
        let period = flush::period();
        let late = self.late.load(Ordering::SeqCst);
        loop {
            self.control.wait(period);
            let Some(_running) = self.flush.running() else {
                return;
            };
            if late && (self.control.detach_asked() || !tracer_alive()) {
                self.detach(session);
                return;
            }
            self.follow_control(session);
            // Before the buffers: a kernel's API record is there when it comes.
            send_calls(&self.outbox);
            if !self.control.yielded() {
                self.flush.flush(0, session, &self.buffers, &self.outbox);
            } else {
                // Buffers of ours another client's flush handed back.
                self.buffers.read_completed(session, &self.outbox);
            }
        }
    }

    /// At normal exit: stop the periodic flush, then force out every buffer, incomplete
    /// records included, so a short program loses nothing. Registered after libcupti was
    /// loaded, so it runs before libcupti's own teardown. Not while another client holds
    /// the activity API: the buffers are its own then.
    pub fn at_exit(&self) {
        let Some(session) = self.session.get() else {
            return;
        };
        if session.pid != std::process::id() {
            // A forked child: CUPTI is not set up here, and the lock may be held forever.
            return;
        }
        if self.late.load(Ordering::SeqCst) && !self.attached.load(Ordering::SeqCst) {
            // A late start whose window ended: nothing of ours is recording.
            return;
        }
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let _stopped = self.flush.stop();
            self.follow_control(session);
            send_calls(&self.outbox);
            if !self.control.yielded() && !self.control.held_by_other() {
                self.flush
                    .flush(FLUSH_FORCED, session, &self.buffers, &self.outbox);
            } else {
                self.buffers.read_completed(session, &self.outbox);
                self.outbox.flush();
            }
        }));
    }

    /// Acts on cudatrace's control slot: says when the library yielded, takes CUPTI back
    /// when the other client let go (for good, if that fails).
    fn follow_control(&self, session: &Session) {
        match self.control.follow() {
            Change::None => {}
            Change::Taken => self.outbox.send_client(client::YIELDED),
            Change::LetGo => match session.resume(&self.outbox) {
                Ok(()) => self.control.resumed(true),
                Err(failure) => {
                    self.control.resumed(false);
                    self.outbox.report(failure);
                }
            },
        }
    }
}

/// Sends the API records made by the driver callbacks (`calls.rs`), or writes them to the
/// debug file only (`detail` 1000) where [`env::LATE_CALLS`] is `debug`.
fn send_calls(outbox: &Outbox) {
    let records = crate::calls::drain();
    if records.is_empty() {
        return;
    }
    let debug = env::var(env::LATE_CALLS).is_some_and(|v| v == "debug");
    env::verbose(format_args!(
        "calls: {} driver callback records{}",
        records.len(),
        if debug { " (debug only)" } else { "" }
    ));
    if let Some(sender) = outbox.lock().as_mut() {
        for mut record in records {
            if debug {
                record.detail = 1000;
                sender.debug_only(&record);
            } else {
                sender.push(record);
            }
        }
    }
}

/// Whether the cudatrace that started this late start still runs ([`env::TRACER`]: its pid
/// and start time, so a reused pid is not taken for it). Unknown: yes.
fn tracer_alive() -> bool {
    let Some(given) = env::var(env::TRACER) else {
        return true;
    };
    let given = given.to_string_lossy();
    let Some((pid, start)) = given.split_once(':') else {
        return true;
    };
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The fields after the command's name, which is in parentheses and may hold spaces:
        // the state (a zombie is gone too), then, 19 further, the start time.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            !matches!(fields.first(), Some(&"Z") | Some(&"X")) && fields.get(19) == Some(&start)
        }),
        Err(_) => false,
    }
}

/// The debug file ([`env::DEBUG_FILE`]), where named and opened.
fn debug_file() -> Option<File> {
    let path = env::path(env::DEBUG_FILE)?;
    open_append(&path)
        .map_err(|e| {
            eprintln!(
                "cudatrace-inject: cannot open {}: {e}",
                path.to_string_lossy()
            )
        })
        .ok()
}

fn open_append(path: &OsStr) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// The sender of the records to cudatrace's uprobe.
fn sender() -> Sender<Uprobe> {
    let sender = Sender::new(Uprobe, debug_file());
    if env::var(env::UNMARKED).is_some_and(|v| v == "1") {
        sender.unmarked()
    } else {
        sender
    }
}
