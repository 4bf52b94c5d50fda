//! The probes while tracing, on the run's side. One owner holds what attaching needs of the
//! loaded object: its programs (lent to the attach layer, `probes::discovery`, to attach;
//! at the end handed to the thread that detaches them), the traced set and the stopped
//! processes. The attach layer says what it did as data (`Attached`); here it becomes
//! `library` lines, `--missing-probes` warnings and the other stderr reports.

use std::{collections::HashSet, thread::JoinHandle};

use anyhow::Result;
use aya::Ebpf;
use tracer_common::{AttachEvent, attach_flags};

use super::{header, missing};
use crate::{
    probes::{
        attach::{AttachFailure, AttachOutcome, Attacher, MAX_REFUSED_LINKS, Scope},
        discovery::{Attached, Discovery, Found, FoundLibrary},
        maps::TracedSet,
        plan::{MissingProbes, Plan, Plans},
        stops::Stops,
    },
    schema::{AttachInfo, LibraryLine, StopFigures},
};

/// The probes while tracing.
pub struct Attaching {
    /// The object's programs, until [`Attaching::end`] hands them to the thread that
    /// detaches them.
    bpf: Option<Ebpf>,
    discovery: Discovery,
    traced: TracedSet,
    stops: Stops,
    /// `--missing-probes`, for the libraries found while tracing (it warns at most).
    policy: MissingProbes,
    /// Missing-function lists already reported, so that each copy does not repeat them.
    reported_missing: HashSet<Vec<&'static str>>,
    /// Symbols that failed to attach, per library id.
    pub failures: Vec<(u32, AttachFailure)>,
    /// Some traced process opened or mapped a probe-set library.
    loaded_any: bool,
    /// How long the processes were stopped for attaching.
    stop_figures: StopFigures,
    finished: bool,
}

/// What attaching did while tracing, for the footer and the closing report.
pub struct AttachFigures {
    /// How long the processes were stopped for attaching.
    pub stops: StopFigures,
    /// Some traced process opened or mapped a probe-set library.
    pub loaded_any: bool,
}

/// A library a process could not be given its probes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotAttached {
    pub library: String,
    pub pid: u32,
    pub error: String,
}

impl Attaching {
    /// From here on every way out (errors included) continues what the probes stopped.
    pub fn new(
        bpf: Ebpf,
        discovery: Discovery,
        traced: TracedSet,
        stops: Stops,
        policy: MissingProbes,
    ) -> Self {
        Attaching {
            bpf: Some(bpf),
            discovery,
            traced,
            stops,
            policy,
            reported_missing: HashSet::new(),
            failures: Vec::new(),
            loaded_any: false,
            stop_figures: StopFigures::default(),
            finished: false,
        }
    }

    /// The object, lent to attach (the process tracking, discovery, `--kernel`'s hooks).
    pub fn bpf(&mut self) -> &mut Ebpf {
        self.bpf
            .as_mut()
            .expect("the object is kept until tracing ends")
    }

    pub fn plans(&self) -> &Plans {
        &self.discovery.plans
    }

    pub fn attacher(&self) -> &Attacher {
        self.discovery.attacher()
    }

    /// The header's `attach` object, as things stand.
    pub fn attach_info(&self) -> AttachInfo {
        let attacher = self.attacher();
        AttachInfo {
            scope: match attacher.scope() {
                Scope::PerProcess => "process",
                Scope::Host => "host",
            }
            .into(),
            mechanism: attacher.mechanism().into(),
            fallback_reason: attacher.fallback_reason.clone(),
            refused: attacher.refused_reason.clone(),
        }
    }

    /// Lets the eBPF side stop processes.
    pub fn allow_stops(&mut self) -> Result<()> {
        self.stops.allow()
    }

    /// Marks a process as traced (the command, or a `-p` target).
    pub fn trace_pid(&mut self, pid: u32) -> Result<()> {
        self.traced.add(pid)
    }

    /// Plans the libraries `found`, then attaches them: without attach cookies, the
    /// mappings of processes `pids` are recorded in between (see [`Discovery::add_all`]).
    /// Returns their ids and the lines of the files new here.
    pub fn add_all(
        &mut self,
        found: Vec<FoundLibrary>,
        pids: &[u32],
    ) -> Result<(Vec<u32>, Vec<LibraryLine>)> {
        let mut attached = Vec::new();
        let bpf = self
            .bpf
            .as_mut()
            .expect("the object is kept until tracing ends");
        let result = self.discovery.add_all(bpf, found, pids, &mut attached);
        let lines = self.report(attached);
        Ok((result?, lines))
    }

    /// Plans the libraries process `pid` maps and, when `link`, gives it its probes on
    /// each (see [`Discovery::add_mapped`]). Returns the lines of the files new here.
    pub fn add_mapped(&mut self, pid: u32, link: bool) -> Result<Vec<LibraryLine>> {
        let mut attached = Vec::new();
        let bpf = self
            .bpf
            .as_mut()
            .expect("the object is kept until tracing ends");
        let result = self.discovery.add_mapped(bpf, pid, link, &mut attached);
        let lines = self.report(attached);
        result.map(|()| lines)
    }

    /// Whether process `pid` maps a library planned here (a probed one).
    pub fn maps_probed_library(&self, pid: u32) -> bool {
        self.discovery.maps_planned_file(pid)
    }

    /// Gives `pid` its own probes on library `id` (per-process scope).
    pub fn link(&mut self, id: u32, pid: u32) -> Result<()> {
        let mut attached = Vec::new();
        let result = self.discovery.link(id, pid, &mut attached);
        self.report(attached);
        result.map(|_| ())
    }

    /// Acts on an attach event from the ring; returns the `library` lines of files
    /// attached for the first time, and the library a process could not be given its
    /// probes on (a loss: its calls are missing). A process it stopped goes on.
    pub fn handle(&mut self, event: &AttachEvent) -> (Vec<LibraryLine>, Option<NotAttached>) {
        let pid = event.header.pid;
        if event.header.flags & attach_flags::STOP_FAILED != 0 {
            self.stop_figures.failed += 1;
        }
        let mut lines = Vec::new();
        let mut not_attached = None;
        // Once tracing ends (the object is gone), events only continue processes.
        if let Some(bpf) = &mut self.bpf {
            let handled = self.discovery.handle(bpf, event);
            // A file planned before the error keeps its line: calls may name it.
            lines = self.report(handled.attached);
            if let Some(error) = handled.error {
                let library = handled
                    .library
                    .map_or_else(|| "a library".to_owned(), |path| path.display().to_string());
                eprintln!(
                    "cudatrace: WARNING: pid {pid}: {library} not attached, its calls are \
                     missing: {error:#}"
                );
                not_attached = Some(NotAttached {
                    library,
                    pid,
                    error: format!("{error:#}"),
                });
            }
        }
        if event.header.flags & attach_flags::STOPPED != 0
            && let Some(continued) = self.stops.continue_process(pid, event.header.ts_ns)
        {
            let figures = &mut self.stop_figures;
            figures.count += 1;
            figures.total_ns += continued.stopped_ns;
            figures.max_ns = figures.max_ns.max(continued.stopped_ns);
        }
        (lines, not_attached)
    }

    /// A traced process exited: its links go.
    pub fn process_exited(&mut self, pid: u32) {
        self.discovery.process_exited(pid);
    }

    /// Tracing ends: recording stops, nothing more is stopped and every process still
    /// stopped goes on; the links and the object go to a thread that detaches them, while
    /// the caller drains the ring (stop events still in it continue their processes).
    /// Joining the thread means all is detached.
    pub fn end(&mut self) -> Result<JoinHandle<()>> {
        self.traced.stop_tracing()?;
        self.end_stops();
        self.finished = true;
        let bpf = self
            .bpf
            .take()
            .expect("the object is kept until tracing ends");
        Ok(self.discovery.detach_on_thread(bpf))
    }

    /// Continues every process still stopped (after the last events were handled) and
    /// detaches everything: what [`Attaching::end`] left, and the programs.
    pub fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.end_stops();
        if let Some(bpf) = &mut self.bpf {
            self.discovery.detach_all(bpf);
        }
    }

    /// Finishes (see [`Attaching::finish`]) and returns what attaching did.
    pub fn close(mut self) -> AttachFigures {
        self.finish();
        AttachFigures {
            stops: std::mem::take(&mut self.stop_figures),
            loaded_any: self.loaded_any,
        }
    }

    fn end_stops(&mut self) {
        if let Err(error) = self.stops.end() {
            eprintln!("cudatrace: {error:#}");
        }
    }

    /// Says what the attach layer did, and returns the `library` lines of the files it
    /// planned.
    fn report(&mut self, attached: Vec<Attached>) -> Vec<LibraryLine> {
        let mut lines = Vec::new();
        for item in attached {
            match item {
                Attached::Library(new) => {
                    let plan = self.discovery.plans.get(new.id).expect("just planned");
                    let found_later = matches!(new.found, Found::Mapped | Found::Opened);
                    warn_missing(&mut self.reported_missing, self.policy, plan, found_later);
                    say_outcome(&new.outcome, plan);
                    self.failures.extend(
                        new.outcome
                            .failures
                            .iter()
                            .map(|failure| (new.id, failure.clone())),
                    );
                    lines.push(header::library_line(plan, &new));
                }
                Attached::Loaded => self.loaded_any = true,
                Attached::Linked {
                    pid,
                    library,
                    outcome,
                } => {
                    let plan = self.discovery.plans.get(library).expect("planned");
                    say_outcome(&outcome, plan);
                    if let Some(first) = outcome.failures.first() {
                        let names: Vec<&str> =
                            outcome.failures.iter().map(|f| f.symbol.as_str()).collect();
                        eprintln!(
                            "cudatrace: pid {pid}: {} functions of {} not attached: {} ({})",
                            names.len(),
                            plan.library.path.display(),
                            names.join(", "),
                            first.error
                        );
                    }
                }
            }
        }
        lines
    }
}

/// `--missing-probes` for a library planned while tracing. The policy was applied to the
/// libraries given or searched for before tracing; one found later cannot stop the run, so
/// `error` only warns for it, once per list (`reported`: the lists seen).
fn warn_missing(
    reported: &mut HashSet<Vec<&'static str>>,
    policy: MissingProbes,
    plan: &Plan,
    found_later: bool,
) {
    let first_time = reported.insert(plan.missing.clone());
    if !found_later || policy == MissingProbes::Ignore {
        return;
    }
    if !plan.missing.is_empty() && first_time {
        let why = format!("functions not exported by {}", plan.library.path.display());
        missing::warn(&why, &plan.missing);
    }
    if !plan.unmatched_globs.is_empty() {
        let what = format!(
            "patterns of --functions match no export of {}",
            plan.library.path.display()
        );
        let globs: Vec<&str> = plan.unmatched_globs.iter().map(String::as_str).collect();
        missing::warn(&what, &globs);
    }
}

impl Drop for Attaching {
    /// Every way out (an error, a panic) continues what was stopped and detaches.
    fn drop(&mut self) {
        self.finish();
    }
}

/// What an attach call met that the user should hear of: the run's first refused
/// uprobe_multi link, functions left unchecked.
fn say_outcome(outcome: &AttachOutcome, plan: &Plan) {
    if let Some(reason) = &outcome.first_refusal {
        eprintln!(
            "cudatrace: uprobe_multi attach failed (attached the other functions with smaller \
             uprobe_multi links): {reason}"
        );
    }
    if outcome.unchecked > 0 {
        eprintln!(
            "cudatrace: {}: {} functions left unchecked after {MAX_REFUSED_LINKS} refused \
             uprobe_multi links",
            plan.library.path.display(),
            outcome.unchecked
        );
    }
}
