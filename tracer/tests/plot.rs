//! `cudatrace plot` on hand-written traces (no root needed): it draws empty, one-call and
//! large traces, and the figures in the picture are those `cudatrace summary` prints.

mod common;
mod traces;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use common::{CUDATRACE, scratch, stderr};
use resvg::usvg;
use serde_json::Value;

fn write(name: &str, text: &str) -> PathBuf {
    let path = scratch(&format!("plot-{name}")).join("trace.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

fn cudatrace(args: &[&str], trace: &Path) -> Output {
    Command::new(CUDATRACE)
        .args(args)
        .arg(trace)
        .output()
        .expect("running cudatrace")
}

/// Plots `trace` to TRACE.svg, checks the SVG parses, and returns the text of its
/// `<text>` elements.
fn plot(trace: &Path) -> Vec<String> {
    let output = cudatrace(&["plot"], trace);
    assert!(output.status.success(), "{}", stderr(&output));
    let svg = std::fs::read_to_string(trace.with_extension("svg")).unwrap();
    usvg::Tree::from_str(&svg, &usvg::Options::default()).expect("well-formed SVG");
    let texts = svg_texts(&svg);
    assert!(!texts.is_empty());
    texts
}

/// `<text>` contents, unescaped (usvg checked the document is well-formed).
fn svg_texts(svg: &str) -> Vec<String> {
    let mut found = Vec::new();
    for piece in svg.split("<text ").skip(1) {
        let content = &piece[piece.find('>').unwrap() + 1..piece.find("</text>").unwrap()];
        found.push(
            content
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&"),
        );
    }
    found
}

#[test]
fn empty_and_one_call_traces_are_drawn() {
    let empty = write("empty", &traces::with_header(""));
    let texts = plot(&empty);
    assert!(texts.contains(&"0 calls (0 errors) in 0 processes over 0 ns · 0 kernel launches of 0 kernels · 0 lost events".to_owned()), "{texts:#?}");
    assert!(texts.contains(&"no device memory allocated".to_owned()));

    let one = write(
        "one",
        &traces::with_header(
            "{\"type\":\"call\",\"name\":\"cuMemAlloc_v2\",\"pid\":42,\"tid\":42,\"ts_ns\":5000,\"dur_ns\":100,\"ret\":0,\"bytes\":1024,\"dptr\":\"0x10\"}\n",
        ),
    );
    let texts = plot(&one);
    assert!(
        texts.contains(&"pid 42: peak 1.00 KiB at +0 ns, final 1.00 KiB".to_owned()),
        "{texts:#?}"
    );
}

/// The fixed-width columns of a stage row of `cudatrace summary`'s text.
fn stage_row(line: &str) -> Vec<String> {
    let chars: Vec<char> = line.chars().collect();
    let cell = |from: usize, to: usize| {
        chars[from..to.min(chars.len())]
            .iter()
            .collect::<String>()
            .trim()
            .to_owned()
    };
    vec![
        cell(2, 20),
        cell(21, 32),
        cell(33, 44),
        cell(45, 52),
        cell(53, 61),
    ]
}

#[test]
fn a_large_trace_shows_the_summary_figures() {
    let iterations = 50_000;
    let trace = write(
        "large",
        &traces::with_header(&traces::inference(iterations)),
    );
    let texts = plot(&trace);

    let summary = cudatrace(&["summary"], &trace);
    assert!(summary.status.success());
    let summary = String::from_utf8(summary.stdout).unwrap();
    let json = cudatrace(&["summary", "--json"], &trace);
    let json: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["calls"], traces::inference_calls(iterations));

    // "pid 42: peak 113.00 MiB at +705.0 µs, final 0 B; 4 allocations, ..."
    let memory = summary
        .lines()
        .find(|l| l.trim_start().starts_with("pid 42: peak"))
        .unwrap();
    let memory = memory.trim().split(';').next().unwrap();
    assert!(
        texts.iter().any(|t| t == memory),
        "{memory:?} not in {texts:#?}"
    );

    for kernel in json["kernels"].as_array().unwrap() {
        assert_eq!(kernel["launches"], iterations);
        assert!(texts.contains(&kernel["kernel"].as_str().unwrap().to_owned()));
    }
    assert_eq!(
        texts
            .iter()
            .filter(|t| **t == format!("×{iterations}"))
            .count(),
        3
    );
    assert!(texts.contains(&format!(
        "Top kernels: {} launches of 3 kernels",
        3 * iterations
    )));

    // The stage table is the summary's, cell by cell.
    let table = texts.iter().position(|t| t == "Stages of pid 42").unwrap();
    let rows: Vec<Vec<String>> = summary
        .lines()
        .skip_while(|l| !l.starts_with("Stages, pid 42"))
        .skip(2)
        .take(6)
        .map(stage_row)
        .collect();
    assert_eq!(rows[3][0], "inference");
    assert_eq!(rows[3][4], (3 * iterations).to_string());
    for row in rows {
        let at = table + texts[table..].iter().position(|t| *t == row[0]).unwrap();
        assert_eq!(texts[at..at + 5], row[..], "stage {}", row[0]);
    }
}

#[test]
fn png_output_and_errors() {
    let trace = write("png", &traces::with_header(&traces::inference(5)));
    let png = trace.with_extension("png");
    let output = Command::new(CUDATRACE)
        .arg("plot")
        .arg(&trace)
        .arg("-o")
        .arg(&png)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 2800);

    let missing = trace.with_extension("none");
    let output = cudatrace(&["plot"], &missing);
    assert_eq!(output.status.code(), Some(74), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        format!(
            "cudatrace: error: cannot open the trace {}: No such file or directory (os error 2)\n",
            missing.display()
        )
    );
    let folder = trace.parent().unwrap();
    let svg = trace.with_file_name("folder.svg");
    let output = cudatrace(&["plot", "-o", svg.to_str().unwrap()], folder);
    assert_eq!(output.status.code(), Some(74), "{}", stderr(&output));
    assert_eq!(stderr(&output), common::folder_refused(folder.display()));
    let bad = write(
        "bad",
        "{\"type\":\"header\",\"format\":\"cudatrace\",\"version\":4}\nnot json\n",
    );
    let output = cudatrace(&["plot"], &bad);
    assert_eq!(output.status.code(), Some(65));
    assert!(
        stderr(&output).contains("trace.jsonl:2: "),
        "{}",
        stderr(&output)
    );
}

/// `cudatrace ARGS` reading `text` from a pipe (`/dev/stdin`).
fn from_pipe(args: &[&str], text: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(CUDATRACE)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let text = text.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
    let output = child.wait_with_output().unwrap();
    // A reader that stopped early closes the pipe: not this test's failure.
    let _ = writer.join().unwrap();
    output
}

#[test]
fn a_trace_from_a_pipe_or_fifo_is_read_whole_twice() {
    // A --gpu trace: the summary reads it twice too.
    let inference = format!("{}\n{}", traces::INFERENCE_HEADER, traces::inference(20));
    for (name, text) in [("inference", inference), ("gpu", traces::gpu())] {
        let file = write(&format!("pipe-{name}"), &text);
        let dir = file.parent().unwrap();
        let from_file = plot(&file);
        let svg = dir.join("from-pipe.svg");
        let output = from_pipe(&["plot", "/dev/stdin", "-o", svg.to_str().unwrap()], &text);
        assert!(output.status.success(), "{}", stderr(&output));
        let from_pipe_texts = svg_texts(&std::fs::read_to_string(&svg).unwrap());
        // The same picture, but for the trace's name in its title.
        let label = file.to_str().unwrap();
        let renamed: Vec<String> = from_pipe_texts
            .iter()
            .map(|t| t.replace("/dev/stdin", label))
            .collect();
        assert_eq!(renamed, from_file, "{name}");

        let summary = |output: Output| {
            assert!(output.status.success(), "{}", stderr(&output));
            let json: Value = serde_json::from_slice(&output.stdout).unwrap();
            let mut json = json;
            json["trace"]["file"] = Value::Null;
            json
        };
        assert_eq!(
            summary(from_pipe(&["summary", "--json", "/dev/stdin"], &text)),
            summary(cudatrace(&["summary", "--json"], &file)),
            "{name}"
        );

        // A FIFO, written once.
        let fifo = dir.join("fifo");
        let c_fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
        let writer = {
            let (fifo, text) = (fifo.clone(), text.clone());
            std::thread::spawn(move || std::fs::write(fifo, text).unwrap())
        };
        let output = cudatrace(&["plot", "-o", svg.to_str().unwrap()], &fifo);
        writer.join().unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        let from_fifo: Vec<String> = svg_texts(&std::fs::read_to_string(&svg).unwrap())
            .iter()
            .map(|t| t.replace(fifo.to_str().unwrap(), label))
            .collect();
        assert_eq!(from_fifo, from_file, "{name}");
    }
    // No file to write beside: -o is needed, said at once.
    let output = from_pipe(&["plot", "/dev/stdin"], &traces::known());
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("pass -o FILE"),
        "{}",
        stderr(&output)
    );
}
