//! The readers' fast path in front of [`schema::parse`]: the lines that come as often as
//! launches (calls, `--gpu` work), exactly as the writer writes them, go through the
//! compact reader (`compact/`), a call into the box of a call read before; anything else,
//! and any line the compact reader hands back, is read by `schema::parse`, which gives the
//! same lines and words the errors.

use super::compact;
use crate::schema::{
    self, CallLine, GpuCopyLine, GpuKernelLine, GpuLine, GpuMemsetLine, Line, LineType,
    call::FAST_PREFIX, gpu::FAST_PREFIXES,
};

/// Boxes of calls read before and no longer wanted, for [`parse_reusing`]: the boxes
/// themselves are what is reused, moved in and out of [`Line::Call`].
pub type SpareCalls = Vec<Box<CallLine>>;

/// As [`schema::parse`], a call going into one of `spare_calls` (boxes of calls read
/// before, no longer wanted) where there is one: a call is over a kilobyte, and allocating
/// that takes the allocator's slow path.
pub fn parse_reusing(bytes: &[u8], spare_calls: &mut SpareCalls) -> Result<Line, String> {
    // The tracer writes `type` first: call lines (nearly all of them) parse in one pass,
    // by the compact reader where the line is as the writer writes it.
    if bytes.starts_with(FAST_PREFIX) {
        // Into a spare box where there is one: no kilobyte built and then moved.
        if let Some(mut spare) = spare_calls.pop() {
            if compact::from_bytes_in_place(bytes, &mut *spare) {
                return Ok(Line::Call(spare));
            }
            spare_calls.push(spare);
        } else if let Some(call) = compact::from_bytes::<CallLine>(bytes) {
            return Ok(Line::Call(Box::new(call)));
        }
    } else if let Some(work) = gpu_work(bytes) {
        return Ok(Line::Gpu(Box::new(work)));
    }
    schema::parse(bytes)
}

/// A kernel, copy or memset line (as many as launches) read by the compact reader, as
/// calls are.
fn gpu_work(bytes: &[u8]) -> Option<GpuLine> {
    let (_, kind) = FAST_PREFIXES
        .into_iter()
        .find(|(prefix, _)| bytes.starts_with(prefix))?;
    match kind {
        GpuKernelLine::TYPE => compact::from_bytes(bytes).map(GpuLine::Kernel),
        GpuCopyLine::TYPE => compact::from_bytes(bytes).map(GpuLine::Copy),
        GpuMemsetLine::TYPE => compact::from_bytes(bytes).map(GpuLine::Memset),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_traces;

    /// Every line of the test traces, and each cut short: the fast path gives what
    /// `schema::parse` gives, with a spare box (holding another call) and without.
    #[test]
    fn the_fast_path_reads_what_schema_parse_reads() {
        let traces = [
            test_traces::known(),
            test_traces::inference(2),
            test_traces::power(),
            test_traces::gpu(),
            test_traces::gpu_power(),
        ];
        let mut fast = 0;
        for line in traces.iter().flat_map(|trace| trace.lines()) {
            for bytes in [line.as_bytes(), &line.as_bytes()[..line.len() / 2]] {
                let plain = schema::parse(bytes);
                assert_eq!(parse_reusing(bytes, &mut SpareCalls::new()), plain);
                let other = CallLine {
                    name: "cuOther".into(),
                    kernel: Some("k".into()),
                    ..CallLine::default()
                };
                let mut spare = vec![Box::new(other)];
                assert_eq!(parse_reusing(bytes, &mut spare), plain);
                fast += usize::from(spare.is_empty());
            }
        }
        assert!(fast > 20, "{fast} calls read into the spare box");
    }
}
