//! The full and the short summary of a scripted trace.

use super::*;
use crate::{
    analysis::{summarise::TraceInfo, testing::Script},
    schema::Hex,
};

#[test]
fn text_output_names_everything() {
    let mut script = Script::new(5);
    script
        .plain("cuInit")
        .alloc(0x7f00_0000_0000, 262144)
        .copy("cuMemcpyHtoD_v2", "HtoD", 262144)
        .call("cuModuleGetFunction", |r| {
            r.function = Some(Hex(0x10));
            r.symbol = Some("_Z10vector_addPKfS0_Pfi".into());
        })
        .launch(0x10);
    let report = script.report();
    let info = TraceInfo {
        file: "t.jsonl".into(),
        complete: true,
        ..TraceInfo::default()
    };
    let text = render_text(&info, &report);
    for needle in [
        "Trace t.jsonl (complete)",
        "5 calls (0 errors) in 1 process",
        "vector_add(float const*, float const*, float*, int)",
        "grid 1x1x1 block 32x1x1 ×1",
        "HtoD       1 call   256.00 KiB  (262144 B)",
        "pid 5: peak 256.00 KiB at +1.0 µs, final 256.00 KiB",
        "262144 B device 0x7f0000000000 from cuMemAlloc_v2 at +1.0 µs",
        "input preparation",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
    let short = render_short(&report);
    assert_eq!(short.lines().count(), 5, "{short}");
    assert!(short.contains(
        "cudatrace: 1 launch of 1 kernel: vector_add(float const*, float const*, float*, int) ×1 (100%)"
    ));
    assert!(short.contains("peak 256.00 KiB, final 256.00 KiB, 1 leak (256.00 KiB)"));
}
