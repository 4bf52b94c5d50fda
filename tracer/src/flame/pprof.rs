//! The profile in pprof's format: the messages of google/pprof's `proto/profile.proto`
//! that `flame` writes (field numbers as there; proto3, so repeated numbers are packed),
//! encoded by prost and gzipped, as `pprof` reads it.
//!
//! One sample per stack, leaf first, with every weight as a value (`sample_type`; the
//! chosen one is `default_sample_type`); one location per frame (function and line), one
//! function per Python function (qualified name, file, first line). Calls and kernels
//! without a stack are one sample at a location of their own, `(no stack)`; a stack cut at
//! the frame budget has `(cut at the frame budget)` as its outermost frame.
//!
//! A function's `system_name` is its qualname exactly; its `name` is that too, but for a
//! name Go's `pprof` would take for a demangled C++ one ([`shown_name`]).

use std::{borrow::Cow, collections::HashMap, io::Write, path::Path};

use flate2::{Compression, write::GzEncoder};
use prost::Message;

use super::{CUT, Weight};
use crate::analysis::stacks::{
    StackFigures, StackProfile,
    rows::{NO_FRAME, NO_STACK},
};

#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Index 0 is "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// The `sample_type` shown by default: its `type`'s string index.
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// The name pprof shows for the function `qualname` of `file`: the qualname, but where Go's
/// `pprof` would take it for a demangled C++ name and strip its `<...>` by default (a `<`,
/// `>`, `[`, `]` or `::` and no `.<`: Python's `<module>`, `<lambda>`, `<genexpr>`,
/// `<listcomp>`, left empty), the file's name and a dot before it: `run.py.<module>`. The
/// `.<` keeps it whole in every `-symbolize` mode but `force`; the file tells apart the
/// `<module>` frames of two files, which `pprof -top` would add up as one function.
fn shown_name<'a>(qualname: &'a str, file: &str) -> Cow<'a, str> {
    let looks_like_cpp = qualname.contains(['<', '>', '[', ']']) || qualname.contains("::");
    let file_name = Path::new(file).file_name().and_then(|name| name.to_str());
    match file_name {
        Some(file_name) if looks_like_cpp && !qualname.contains(".<") => {
            Cow::Owned(format!("{file_name}.{qualname}"))
        }
        _ => Cow::Borrowed(qualname),
    }
}

/// Builds a profile, each string, function and location once.
#[derive(Default)]
struct Builder {
    profile: Profile,
    strings: HashMap<String, i64>,
    /// (qualname, file, first line) → function id.
    functions: HashMap<(i64, i64, i64), u64>,
    /// (function id, line) → location id.
    locations: HashMap<(u64, i64), u64>,
}

impl Builder {
    fn string(&mut self, text: &str) -> i64 {
        if let Some(index) = self.strings.get(text) {
            return *index;
        }
        let index = self.profile.string_table.len() as i64;
        self.profile.string_table.push(text.to_owned());
        self.strings.insert(text.to_owned(), index);
        index
    }

    fn location(&mut self, qualname: &str, file: &str, first_line: u32, line: Option<u32>) -> u64 {
        let key = (
            self.string(qualname),
            self.string(file),
            i64::from(first_line),
        );
        let next = self.functions.len() as u64 + 1;
        let function_id = *self.functions.entry(key).or_insert(next);
        if function_id == next {
            let name = self.string(&shown_name(qualname, file));
            self.profile.function.push(Function {
                id: function_id,
                name,
                system_name: key.0,
                filename: key.1,
                start_line: key.2,
            });
        }
        let line = line.map_or(0, i64::from);
        let next = self.locations.len() as u64 + 1;
        let location_id = *self.locations.entry((function_id, line)).or_insert(next);
        if location_id == next {
            self.profile.location.push(Location {
                id: location_id,
                line: vec![Line { function_id, line }],
            });
        }
        location_id
    }

    fn sample(&mut self, location_id: Vec<u64>, figures: &StackFigures) {
        let value: Vec<i64> = Weight::ALL
            .iter()
            .map(|weight| i64::try_from(weight.of(figures)).unwrap_or(i64::MAX))
            .collect();
        if value.iter().any(|v| *v != 0) {
            self.profile.sample.push(Sample { location_id, value });
        }
    }
}

/// The profile of `stacks`, shown by `weight` first.
pub fn profile(stacks: &StackProfile, weight: Weight) -> Profile {
    let mut builder = Builder::default();
    builder.string("");
    for each in Weight::ALL {
        let (kind, unit) = each.type_and_unit();
        let value_type = ValueType {
            r#type: builder.string(kind),
            unit: builder.string(unit),
        };
        builder.profile.sample_type.push(value_type);
    }
    builder.profile.default_sample_type = builder.string(weight.type_and_unit().0);
    let comment = builder.string("cudatrace flame: Python stacks of CUDA driver calls");
    builder.profile.comment.push(comment);
    if stacks.every > 1 {
        // A sampled trace's stacks weigh estimates: said where pprof shows it.
        let sampled = builder.string(&format!(
            "sampled: a call's stack read at random, 1 in {every} (--stack-every); each stack \
             weighs {every} times its sampled calls' figures, an estimate",
            every = stacks.every
        ));
        builder.profile.comment.push(sampled);
    }
    let table = &stacks.table;
    for (stack, figures) in table.stacks().iter().zip(&stacks.per_stack) {
        let mut locations: Vec<u64> = stack
            .frames
            .iter()
            .map(|frame| {
                let function = table.function_of(*frame);
                builder.location(
                    &function.qualname,
                    &function.file,
                    function.first_line,
                    table.frame(*frame).line,
                )
            })
            .collect();
        if locations.is_empty() {
            locations.push(builder.location(NO_FRAME, "", 0, None));
        }
        if stack.cut {
            locations.push(builder.location(CUT, "", 0, None));
        }
        builder.sample(locations, figures);
    }
    let no_stack = vec![builder.location(NO_STACK, "", 0, None)];
    builder.sample(no_stack, &stacks.no_stack);
    builder.profile
}

/// The profile encoded and gzipped, as `pprof` reads it.
pub fn encode(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let mut gzip = GzEncoder::new(Vec::new(), Compression::default());
    gzip.write_all(&profile.encode_to_vec())?;
    gzip.finish()
}
