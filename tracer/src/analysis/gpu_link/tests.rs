use super::*;
use crate::schema::{GpuKernelLine, GpuLink};

fn kernel(pid: u32, correlation_id: u32, ts_ns: u64) -> GpuLine {
    GpuLine::Kernel(GpuKernelLine {
        pid,
        ts_ns,
        dur_ns: 10,
        kernel: "k".into(),
        link: GpuLink {
            correlation_id,
            ..GpuLink::default()
        },
        ..GpuKernelLine::default()
    })
}

fn api(tid: u32, correlation_id: u32, start_ns: u64, end_ns: u64) -> ApiRecord {
    api_of(307, tid, correlation_id, start_ns, end_ns)
}

/// CUPTI's record of a call to function `cbid`.
fn api_of(cbid: u32, tid: u32, correlation_id: u32, start_ns: u64, end_ns: u64) -> ApiRecord {
    ApiRecord {
        pid: 1,
        tid,
        correlation_id,
        start_ns,
        end_ns,
        cbid,
        result: 0,
    }
}

fn link(line: &GpuLine) -> (Option<(u32, u64)>, Option<i64>, Option<&str>) {
    let GpuLine::Kernel(k) = line else { panic!() };
    (k.link.call(), k.link.queued_ns, k.link.unlinked.as_deref())
}

#[test]
fn work_links_to_the_innermost_call_around_its_api_record_in_either_order() {
    let mut linker = GpuLinker::default();
    let mut out = Vec::new();
    // Thread 1: an outer call 100..400 around an inner one 150..250 (the inner returns,
    // and so arrives, first); thread 2: 120..300.
    linker.call(1, 1, 150, Some(100), "cuLaunchKernel");
    linker.call(1, 1, 100, Some(300), "cuLaunchKernel");
    linker.call(1, 2, 120, Some(180), "cuLaunchKernel");
    linker.api(api(1, 5, 160, 240), 0, &mut out);
    assert!(out.is_empty());
    linker.work(kernel(1, 5, 1240), 0, &mut out);
    assert_eq!(link(&out[0]), (Some((1, 150)), Some(1000), None));
    // The work first, then its API record.
    linker.work(kernel(1, 6, 500), 0, &mut out);
    assert_eq!(out.len(), 1);
    linker.api(api(1, 6, 110, 390), 0, &mut out);
    assert_eq!(link(&out[1]), (Some((1, 100)), Some(110), None));
    // Another thread's call; graph kernels share their call.
    linker.api(api(2, 7, 130, 290), 0, &mut out);
    linker.work(kernel(1, 7, 280), 0, &mut out);
    linker.work(kernel(1, 7, 300), 0, &mut out);
    assert_eq!(link(&out[2]), (Some((2, 120)), Some(-10), None));
    assert_eq!(link(&out[3]).0, Some((2, 120)));
    // An API record no call encloses.
    linker.api(api(2, 8, 50, 60), 0, &mut out);
    linker.work(kernel(1, 8, 70), 0, &mut out);
    assert_eq!(link(&out[4]), (None, Some(10), Some("no_call")));
    assert_eq!(linker.counts.linked, 4);
    assert_eq!(linker.counts.unlinked.no_call, 1);
    assert_eq!(linker.counts.api_records, 4);
}

#[test]
fn waiting_work_is_written_unlinked_never_dropped() {
    let mut linker = GpuLinker::default();
    let mut out = Vec::new();
    linker.work(kernel(1, 1, 10), 1_000, &mut out);
    linker.work(kernel(1, 2, 20), 2_000_000_000, &mut out);
    linker.work(kernel(2, 3, 30), 5, &mut out);
    // Without API records since, waiting work stays (its record may be late)...
    linker.expire(PENDING_NS + 1_500, &mut out);
    assert!(out.is_empty());
    // ...until API records of its process come after it, or it waited too long.
    linker.api(api(1, 9, 1, 2), 3_000, &mut out);
    linker.expire(PENDING_NS + 1_500, &mut out);
    assert_eq!(out.len(), 1);
    linker.expire(PENDING_MAX_NS + 10, &mut out);
    let first: Vec<_> = out.iter().map(|l| (l.pid(), link(l).2)).collect();
    assert_eq!(
        first,
        [(1, Some("no_api_record")), (2, Some("no_api_record"))]
    );
    linker.end_process(1, &mut out);
    assert_eq!(out.len(), 3);
    assert_eq!(linker.counts.unlinked.no_api_record, 3);
    linker.work(kernel(1, 4, 40), 0, &mut out);
    linker.finish(&mut out);
    assert_eq!(out.len(), 4);
    // Beyond the waiting limit, the oldest go first.
    let mut linker = GpuLinker::default();
    let mut out = Vec::new();
    for id in 0..=PENDING_MAX as u32 {
        linker.work(kernel(1, id, u64::from(id)), u64::from(id), &mut out);
    }
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].work().unwrap().ts_ns, 0);
}

#[test]
fn a_call_without_its_return_lasts_until_the_threads_next_call() {
    let mut linker = GpuLinker::default();
    let mut out = Vec::new();
    // Thread 1: entry-only launches at 100 and 300, a copy 500..600 and a last launch
    // at 700; thread 2: an entry-only launch at 200.
    linker.call(1, 1, 100, None, "cuLaunchKernel");
    linker.call(1, 2, 200, None, "cuLaunchKernel");
    linker.call(1, 1, 300, None, "cuLaunchKernel");
    linker.call(1, 1, 500, Some(100), "cuMemcpyHtoD");
    linker.call(1, 1, 700, None, "cuLaunchKernel");
    for (id, tid, start, end) in [
        (1, 1, 110, 290),
        (2, 2, 210, 10_000),
        (3, 1, 310, 490),
        (4, 1, 510, 590),
        (5, 1, 710, 10_000),
        // Past the launch at 300 but not before the copy began: no call encloses it.
        (6, 1, 320, 520),
        // Between the copy's end and the next launch: the copy is over.
        (7, 1, 650, 660),
    ] {
        linker.api(api(tid, id, start, end), 0, &mut out);
        linker.work(kernel(1, id, 20_000), 0, &mut out);
    }
    let calls: Vec<_> = out.iter().map(|line| link(line).0).collect();
    assert_eq!(
        calls,
        [
            Some((1, 100)),
            Some((2, 200)),
            Some((1, 300)),
            Some((1, 500)),
            Some((1, 700)),
            None,
            None
        ]
    );
    assert_eq!(
        (linker.counts.linked, linker.counts.unlinked.no_call),
        (5, 2)
    );
}

#[test]
fn a_call_without_its_return_encloses_only_its_own_functions_api_records() {
    let mut linker = GpuLinker::default();
    let mut out = Vec::new();
    // Entry-only: cuLaunchKernel at 100 (probed as its _ptsz form), cuGraphLaunch at
    // 400; with its return seen: cuLaunchKernel 700..800.
    linker.call(1, 1, 100, None, "cuLaunchKernel");
    linker.call(1, 1, 400, None, "cuGraphLaunch");
    linker.call(1, 1, 700, Some(100), "cuLaunchKernel");
    for (id, cbid, start, end) in [
        // cuLaunchKernel_ptsz (442) and cuLaunchKernel (307) inside the launch at 100.
        (1, 442, 110, 190),
        (2, 307, 210, 290),
        // cuLaunch (115), cuLaunchGrid (116): functions cudatrace does not probe, made
        // while the launch at 100 is taken to last.
        (3, 115, 300, 310),
        (4, 116, 320, 330),
        // cuGraphLaunch_ptsz (515) in the graph launch; a kernel launch there is not.
        (5, 515, 410, 420),
        (6, 307, 430, 440),
        // A call whose return was seen encloses what lies inside it, whatever its id.
        (7, 115, 710, 720),
    ] {
        linker.api(api_of(cbid, 1, id, start, end), 0, &mut out);
        linker.work(kernel(1, id, 20_000), 0, &mut out);
    }
    let calls: Vec<_> = out.iter().map(|line| link(line).0).collect();
    assert_eq!(
        calls,
        [
            Some((1, 100)),
            Some((1, 100)),
            None,
            None,
            Some((1, 400)),
            None,
            Some((1, 700))
        ]
    );
    assert_eq!(
        (linker.counts.linked, linker.counts.unlinked.no_call),
        (4, 3)
    );
}

#[test]
fn calls_beyond_the_window_are_told_apart() {
    let mut linker = GpuLinker::default();
    let mut out = Vec::new();
    for i in 0..=CALL_WINDOW as u64 {
        linker.call(1, 1, i * 10, Some(5), "cuLaunchKernel");
    }
    linker.api(api(1, 1, 1, 2), 0, &mut out);
    linker.work(kernel(1, 1, 100), 0, &mut out);
    assert_eq!(link(&out[0]).2, Some("beyond_window"));
    linker.api(api(1, 2, 11, 12), 0, &mut out);
    linker.work(kernel(1, 2, 100), 0, &mut out);
    assert_eq!(link(&out[1]).0, Some((1, 10)));
    assert_eq!(linker.counts.unlinked.beyond_window, 1);
}

fn launch_line(tid: u32, ts_ns: u64, fill: impl FnOnce(&mut CallLine)) -> CallLine {
    let mut call = CallLine {
        name: "cuLaunchKernel".into(),
        pid: 1,
        tid,
        ts_ns,
        ..CallLine::default()
    };
    fill(&mut call);
    call
}

fn session() -> Session {
    Session {
        pid: 1,
        library_pid: 1,
        callback: 0xcb,
        multi_subscriber: false,
    }
}

#[test]
fn launch_lines_wait_for_cuptis_record_of_them_and_get_its_result() {
    let mut linker = GpuLinker {
        hold_launches: true,
        ..GpuLinker::default()
    };
    let mut out = Vec::new();
    // Before recording started: nothing to wait for.
    assert_eq!(
        linker.call_arrived(&launch_line(1, 50, |_| {})),
        (false, None)
    );
    linker.started(session(), 60);
    // Entry-only launches wait; a copy (its return seen) does not.
    for ts in [100, 200, 300] {
        assert_eq!(
            linker.call_arrived(&launch_line(1, ts, |_| {})),
            (true, None)
        );
    }
    let copy = launch_line(1, 400, |c| {
        c.name = "cuMemcpyHtoD_v2".into();
        c.dur_ns = Some(50);
        c.ret = Some(0);
    });
    assert_eq!(linker.call_arrived(&copy), (false, None));
    // CUPTI's record of the launch at 200 (failed): its result and end; the one at 100,
    // before it on the thread, has no record coming.
    let mut failed = api(1, 7, 210, 260);
    failed.result = 400;
    linker.api(failed, 0, &mut out);
    assert_eq!(
        linker.holds.drain(..).collect::<Vec<_>>(),
        [
            HoldChange {
                pid: 1,
                tid: 1,
                ts_ns: 200,
                result: Some((400, 260))
            },
            HoldChange {
                pid: 1,
                tid: 1,
                ts_ns: 100,
                result: None
            },
        ]
    );
    // Another client takes CUPTI: the one still waiting keeps waiting (its record may
    // still come), until HOLD_MAX_NS.
    let register = CallLine {
        name: "cuptiActivityRegisterCallbacks".into(),
        pid: 1,
        tid: 9,
        ts_ns: 350,
        dur_ns: Some(5),
        ret: Some(0),
        callback: Some(crate::schema::Hex(0xbad)),
        ..CallLine::default()
    };
    assert_eq!(
        linker.call_arrived(&register),
        (false, Some(ClientChange::Taken { ts_ns: 350, tid: 9 }))
    );
    assert!(linker.holds.is_empty());
    linker.expire(299 + HOLD_MAX_NS, &mut out);
    assert!(linker.holds.is_empty());
    linker.expire(300 + HOLD_MAX_NS, &mut out);
    assert_eq!(
        linker.holds.drain(..).map(|h| h.ts_ns).collect::<Vec<_>>(),
        [300]
    );
    // While held, launches do not wait.
    assert_eq!(
        linker.call_arrived(&launch_line(1, 500, |_| {})),
        (false, None)
    );
    assert_eq!(linker.counts.gaps, 1);
}

#[test]
fn every_call_is_counted_once_with_its_fate_and_names_kept_from_the_launch() {
    let mut linker = GpuLinker::default();
    let mut out = Vec::new();
    linker.started(session(), 1);
    for (ts, fill) in [(100, None), (200, Some(7u64)), (300, None), (400, None)] {
        let call = launch_line(1, ts, |c| {
            c.dur_ns = Some(50);
            c.ret = Some(0);
            c.kernel = Some("stale_name_is_not_this".into());
            c.captured = fill;
        });
        linker.call_arrived(&call);
        linker.call_written(&call);
    }
    linker.api(api(1, 1, 110, 140), 0, &mut out);
    linker.api(api(1, 2, 210, 240), 0, &mut out);
    linker.work(kernel(1, 1, 1_000), 0, &mut out);
    // The launch's name is kept, CUPTI's goes to cupti_kernel.
    let mut line = out.pop().unwrap();
    assert_eq!(
        linker.line_written(&mut line, Vec::new, false),
        NodeLink::Done(None)
    );
    let GpuLine::Kernel(kernel) = &line else {
        panic!()
    };
    assert_eq!(
        (kernel.kernel.as_str(), kernel.cupti_kernel.as_deref()),
        ("stale_name_is_not_this", Some("k"))
    );
    assert_eq!(linker.counts.name_mismatches, 1);
    linker.end_process(1, &mut out);
    assert!(linker.finish_process(1).is_empty());
    assert_eq!(
        linker.counts.issuing,
        crate::schema::IssuingCalls {
            calls: 4,
            with_work: 1,
            captured: 1,
            not_flushed: 2,
            ..Default::default()
        }
    );
    assert_eq!(linker.unrecorded(), [0, 0, 2, 0, 0]);
}
