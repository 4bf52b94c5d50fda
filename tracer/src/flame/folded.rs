//! Folded stacks, as Brendan Gregg's `stackcollapse` scripts write them and
//! `flamegraph.pl`, inferno and speedscope read them: one line per stack with a weight,
//! `outer;...;inner WEIGHT`, each frame `QUALNAME (FILE:LINE)`. Stacks that weigh nothing
//! are left out; calls without a stack are `(no stack)`, a stack cut at the frame budget
//! starts with `(cut at the frame budget)`.

use std::fmt::Write as _;

use super::{CUT, Weight};
use crate::analysis::stacks::{
    StackProfile,
    rows::{NO_FRAME, NO_STACK},
};

/// A frame's name, without the separators of the format (`;` between frames, the space
/// before the weight is the last one on the line, and lines).
fn push_frame(line: &mut String, name: &str) {
    line.extend(name.chars().map(|c| match c {
        ';' => ',',
        '\n' | '\r' => ' ',
        c => c,
    }));
}

pub fn folded(stacks: &StackProfile, weight: Weight) -> String {
    let table = &stacks.table;
    let mut out = String::new();
    for (stack, figures) in table.stacks().iter().zip(&stacks.per_stack) {
        let value = weight.of(figures);
        if value == 0 {
            continue;
        }
        let mut frames: Vec<String> = Vec::with_capacity(stack.frames.len() + 1);
        if stack.cut {
            frames.push(CUT.to_owned());
        }
        for frame in stack.frames.iter().rev() {
            let function = table.function_of(*frame);
            let name = function.frame_text(table.frame(*frame).line);
            frames.push(name);
        }
        if stack.frames.is_empty() {
            frames.push(NO_FRAME.to_owned());
        }
        for (index, frame) in frames.iter().enumerate() {
            if index > 0 {
                out.push(';');
            }
            push_frame(&mut out, frame);
        }
        let _ = writeln!(out, " {value}");
    }
    let value = weight.of(&stacks.no_stack);
    if value > 0 {
        let _ = writeln!(out, "{NO_STACK} {value}");
    }
    out
}
