//! The stacks trace of the tests as a profile: folded text exactly, and the pprof profile
//! read back (here with its own messages; `tests/flame.rs` reads it with a third party's
//! reader): each line's flat value is the summary's row, for every weight.

use std::{collections::BTreeMap, io::Read};

use flate2::read::GzDecoder;
use prost::Message;

use super::{Weight, folded::folded, pprof};
use crate::{
    analysis::{
        stacks::{StackProfile, rows::NO_STACK},
        summarise::summarise,
    },
    reader::TraceLines,
    test_traces::{python_names, stacks},
};

fn profile_of(text: &str) -> StackProfile {
    summarise(|| Ok(TraceLines::new(text.as_bytes(), "stacks.jsonl", false)))
        .unwrap()
        .report
        .stacks
        .unwrap()
}

#[test]
fn folded_text_has_one_line_per_stack_outer_first() {
    let stacks = profile_of(&stacks());
    let module = "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py";
    let call =
        format!("Module._wrapped_call_impl ({module}:1773);Module._call_impl ({module}:1784)");
    let block = |line: u32| {
        format!(
            "<module> (/w/run.py:5);{call};Net.forward (/w/model.py:22);{call};Block.forward (/w/model.py:{line})"
        )
    };
    let expected = [
        format!(
            "{};{call};Linear.forward (/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py:125) 30000",
            block(12)
        ),
        format!("{};Scale.forward (/w/model.py:33) 5000", block(13)),
        format!("{} 7000", block(14)),
        "(cut at the frame budget);Thread.run (/usr/lib/python3.12/threading.py:1012) 3000"
            .to_owned(),
        format!("{NO_STACK} 5000"),
    ];
    assert_eq!(folded(&stacks, Weight::Gpu), expected.join("\n") + "\n");
    let by_calls = folded(&stacks, Weight::Calls);
    assert!(
        by_calls.starts_with("<module> (/w/run.py:3) 4\n"),
        "{by_calls}"
    );
    assert!(by_calls.ends_with("\n(no stack) 3\n"), "{by_calls}");
}

/// Flat values by `FILE:LINE` (`(no stack)` alone), per sample type, from the profile.
fn flat_by_line(bytes: &[u8]) -> BTreeMap<(String, String), i64> {
    let mut raw = Vec::new();
    GzDecoder::new(bytes).read_to_end(&mut raw).unwrap();
    let profile = pprof::Profile::decode(raw.as_slice()).unwrap();
    let string = |index: i64| profile.string_table[index as usize].clone();
    let mut flat = BTreeMap::new();
    for sample in &profile.sample {
        let leaf = profile
            .location
            .iter()
            .find(|l| l.id == sample.location_id[0])
            .unwrap();
        let line = &leaf.line[0];
        let function = &profile.function[line.function_id as usize - 1];
        let name = match string(function.filename) {
            file if file.is_empty() => string(function.name),
            file => format!("{file}:{}", line.line),
        };
        for (kind, value) in profile.sample_type.iter().zip(&sample.value) {
            *flat.entry((string(kind.r#type), name.clone())).or_default() += value;
        }
    }
    flat
}

#[test]
fn the_pprof_profile_has_the_summarys_figures_per_line() {
    let stacks = profile_of(&stacks());
    let bytes = pprof::encode(&pprof::profile(&stacks, Weight::Time)).unwrap();
    let flat = flat_by_line(&bytes);
    let summary = stacks.summary();
    let mut expected = BTreeMap::new();
    for row in &summary.lines {
        for weight in Weight::ALL {
            let value = weight.of(&row.figures) as i64;
            if value != 0 {
                expected.insert(
                    (weight.type_and_unit().0.to_owned(), row.name.clone()),
                    value,
                );
            }
        }
    }
    let flat: BTreeMap<_, _> = flat.into_iter().filter(|(_, v)| *v != 0).collect();
    assert_eq!(flat, expected);
    assert_eq!(flat[&("gpu".to_owned(), NO_STACK.to_owned())], 5_000);
    let mut raw = Vec::new();
    GzDecoder::new(bytes.as_slice())
        .read_to_end(&mut raw)
        .unwrap();
    let profile = pprof::Profile::decode(raw.as_slice()).unwrap();
    let default = &profile.string_table[profile.default_sample_type as usize];
    assert_eq!(default, "time");
}

#[test]
fn pythons_own_names_get_their_files_name_and_keep_the_qualname_as_system_name() {
    let stacks = profile_of(&python_names());
    let profile = pprof::profile(&stacks, Weight::Time);
    let string = |index: i64| profile.string_table[index as usize].as_str();
    let mut names: Vec<(&str, &str, &str)> = profile
        .function
        .iter()
        .map(|f| (string(f.name), string(f.system_name), string(f.filename)))
        .collect();
    names.sort();
    let aot = "/venv/lib/python3.12/site-packages/torch/_functorch/aot_autograd.py";
    assert_eq!(
        names,
        [
            ("(no stack)", "(no stack)", ""),
            ("Trainer.fit", "Trainer.fit", "/w/train.py"),
            (
                "Trainer.fit.<locals>.<lambda>",
                "Trainer.fit.<locals>.<lambda>",
                "/w/train.py"
            ),
            (
                "aot_module_simplified.<locals>.forward",
                "aot_module_simplified.<locals>.forward",
                aot
            ),
            ("data.py.<genexpr>", "<genexpr>", "/w/data.py"),
            ("data.py.<module>", "<module>", "/w/data.py"),
            ("run.py.<dictcomp>", "<dictcomp>", "/w/run.py"),
            ("run.py.<lambda>", "<lambda>", "/w/run.py"),
            ("run.py.<listcomp>", "<listcomp>", "/w/run.py"),
            ("run.py.<module>", "<module>", "/w/run.py"),
        ]
    );
}
