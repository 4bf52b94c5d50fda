//! Other CUPTI clients of a process, from the libcupti calls the probes saw (docs/gpu.md,
//! "Beside another CUPTI client").
//!
//! Where CUPTI allows one client at a time, a client that registers buffer callbacks other
//! than the injection library's (`cuptiActivityRegisterCallbacks`; Kineto does it when
//! torch.profiler starts) takes every record from then on. It lets go when, after
//! disabling kernel activity (`cuptiActivityDisable(CONCURRENT_KERNEL)`, Kineto's stop),
//! its forced flush returns (`cuptiActivityFlushAll(FORCED)`: its last buffers are its
//! own), or when it detaches CUPTI (`cuptiFinalize`). Until then the library must stay
//! out of CUPTI's way; then it may take CUPTI back. With a subscriber of its own
//! (multi-subscriber CUPTI) the library never yields.

use crate::{
    catalog::cupti::{FLUSH_FORCED, activity_kind},
    events::gpu::Session,
    schema::CallLine,
};

/// What the library must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientChange {
    /// Another client took the activity API at `ts_ns` (its call, by thread `tid`).
    Taken { ts_ns: u64, tid: u32 },
    /// It let go at `ts_ns`.
    Released { ts_ns: u64 },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Holder {
    #[default]
    Library,
    Other {
        /// It disabled kernel activity since it took over.
        kernels_off: bool,
    },
}

/// One process's CUPTI clients.
#[derive(Default)]
pub struct Clients {
    session: Option<Session>,
    holder: Holder,
}

impl Clients {
    /// Recording started; a client that took CUPTI before (before `cuInit`) keeps it,
    /// unless the library has a subscriber of its own.
    pub fn started(&mut self, session: Session, ts_ns: u64) -> Option<ClientChange> {
        self.session = Some(session);
        if session.multi_subscriber && self.holder != Holder::Library {
            self.holder = Holder::Library;
            return Some(ClientChange::Released { ts_ns });
        }
        None
    }

    /// A libcupti call of the process, as it returned.
    pub fn call(&mut self, call: &CallLine) -> Option<ClientChange> {
        if self.session.is_some_and(|s| s.multi_subscriber) || !call.ok() {
            return None;
        }
        let returned = call.end_ns().unwrap_or(call.ts_ns);
        match (call.name.as_str(), self.holder) {
            ("cuptiActivityRegisterCallbacks", Holder::Library) => {
                let ours = self
                    .session
                    .is_some_and(|s| call.callback.is_some_and(|cb| cb.0 == s.callback));
                (!ours).then(|| {
                    self.holder = Holder::Other { kernels_off: false };
                    ClientChange::Taken {
                        ts_ns: call.ts_ns,
                        tid: call.tid,
                    }
                })
            }
            ("cuptiActivityDisable", Holder::Other { .. })
                if call.activity_kind == Some(activity_kind::CONCURRENT_KERNEL) =>
            {
                self.holder = Holder::Other { kernels_off: true };
                None
            }
            ("cuptiActivityEnable", Holder::Other { .. })
                if call.activity_kind == Some(activity_kind::CONCURRENT_KERNEL) =>
            {
                self.holder = Holder::Other { kernels_off: false };
                None
            }
            ("cuptiActivityFlushAll", Holder::Other { kernels_off: true })
                if call.flags.is_some_and(|f| f & FLUSH_FORCED != 0) =>
            {
                self.holder = Holder::Library;
                Some(ClientChange::Released { ts_ns: returned })
            }
            ("cuptiFinalize", Holder::Other { .. }) => {
                self.holder = Holder::Library;
                Some(ClientChange::Released { ts_ns: returned })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Hex;

    fn cupti(name: &str, ts_ns: u64, fill: impl FnOnce(&mut CallLine)) -> CallLine {
        let mut call = CallLine {
            name: name.into(),
            pid: 1,
            tid: 2,
            ts_ns,
            dur_ns: Some(10),
            ret: Some(0),
            ..CallLine::default()
        };
        fill(&mut call);
        call
    }

    fn session(multi_subscriber: bool) -> Session {
        Session {
            pid: 1,
            library_pid: 1,
            callback: 0xabc,
            multi_subscriber,
        }
    }

    #[test]
    fn kinetos_start_and_stop_take_and_release() {
        let mut clients = Clients::default();
        assert_eq!(clients.started(session(false), 5), None);
        let register = |callback| {
            cupti("cuptiActivityRegisterCallbacks", 100, |c| {
                c.callback = Some(Hex(callback))
            })
        };
        // The library's own registration is not a takeover.
        assert_eq!(clients.call(&register(0xabc)), None);
        assert_eq!(
            clients.call(&register(0xdef)),
            Some(ClientChange::Taken { ts_ns: 100, tid: 2 })
        );
        let kind = |name, kind| cupti(name, 200, |c| c.activity_kind = Some(kind));
        let flush = |flags| cupti("cuptiActivityFlushAll", 300, |c| c.flags = Some(flags));
        // Flushes while recording (toggling, warm-up) do not release it.
        assert_eq!(clients.call(&flush(1)), None);
        assert_eq!(clients.call(&kind("cuptiActivityDisable", 1)), None);
        assert_eq!(clients.call(&flush(1)), None, "kernels still on");
        assert_eq!(clients.call(&kind("cuptiActivityDisable", 10)), None);
        assert_eq!(clients.call(&flush(0)), None, "not forced");
        assert_eq!(
            clients.call(&flush(1)),
            Some(ClientChange::Released { ts_ns: 310 })
        );
        // A failed registration takes nothing; finalize releases.
        let mut failed = register(0xdef);
        failed.ret = Some(39);
        assert_eq!(clients.call(&failed), None);
        assert!(clients.call(&register(0xdef)).is_some());
        assert_eq!(
            clients.call(&cupti("cuptiFinalize", 400, |_| {})),
            Some(ClientChange::Released { ts_ns: 410 })
        );
    }

    #[test]
    fn a_client_before_cuinit_holds_until_multi_subscriber_recording_starts() {
        let mut clients = Clients::default();
        let early = cupti("cuptiActivityRegisterCallbacks", 10, |c| {
            c.callback = Some(Hex(0x1))
        });
        assert_eq!(
            clients.call(&early),
            Some(ClientChange::Taken { ts_ns: 10, tid: 2 })
        );
        assert_eq!(
            clients.started(session(true), 50),
            Some(ClientChange::Released { ts_ns: 50 })
        );
        // With a subscriber of its own, nothing is followed.
        assert_eq!(clients.call(&early), None);
    }
}
