//! The frame budget's edge (`--stack-depth`): a stack is `cut` only where a frame the walk
//! would keep lies beyond the budget. The frames after the last one kept may be only the
//! interpreter's own entry frames (3.12+: the outermost frame of a thread, or a call from
//! C), which the walk skips: such a stack is whole.

use tracer_common::stacks::{FRAME_READ, NO_FIELD, PyProcess, stack_counter};

use super::{Scratch, bump, read::read_user};

/// Frames looked at beyond the budget: entry frames do not follow one another (each
/// precedes a Python frame or ends the stack), so two are enough; more are a safe margin.
const LOOK_AHEAD: usize = 4;

/// Whether a frame the walk would keep is at `frame` or after it, through entry frames.
/// Where that cannot be told (a read failed, or more entry frames than looked at), the stack
/// is taken as cut: a stack is never said whole unless it is.
#[inline(always)]
pub fn kept_frame_beyond(scratch: &mut Scratch, py: &PyProcess, frame: u64) -> bool {
    let mut frame = frame;
    let mut read = 0u64;
    let mut beyond = true;
    for _ in 0..LOOK_AHEAD {
        if frame == 0 {
            beyond = false;
            break;
        }
        let buf = &mut scratch.buf;
        if !read_user(
            buf.0.as_mut_ptr(),
            FRAME_READ as u32,
            frame + u64::from(py.frame_read),
        ) {
            break;
        }
        read += 1;
        let base = py.frame_read;
        if py.frame_owner == NO_FIELD
            || u32::from(buf.u8_at(py.frame_owner.wrapping_sub(base))) < py.owner_skip_from
        {
            break;
        }
        frame = buf.u64_at(py.frame_previous.wrapping_sub(base));
    }
    bump(stack_counter::FRAMES, read);
    beyond
}
