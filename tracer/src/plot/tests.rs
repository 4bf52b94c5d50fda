//! The picture renders for empty, tiny and large traces, and its text is the summary's.

use std::path::PathBuf;

use resvg::usvg;

use super::*;
use crate::format::{format_bytes, format_ns};

use crate::test_traces as traces;

use traces::{inference as inference_trace, inference_calls};

fn write_trace(name: &str, body: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cudatrace-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, traces::with_header(body)).unwrap();
    path
}

/// The text of every `<text>` element, unescaped.
fn texts(svg: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = svg;
    while let Some(start) = rest.find("<text ") {
        let after = &rest[start..];
        let open_end = after.find('>').unwrap() + 1;
        let close = after.find("</text>").unwrap();
        let text = &after[open_end..close];
        found.push(
            text.replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&"),
        );
        rest = &after[close..];
    }
    found
}

/// Renders, checks the SVG parses, and returns it with the summary it drew.
fn rendered(name: &str, body: &str) -> Rendered {
    let path = write_trace(name, body);
    let rendered = render(&path, name, 1400, false).unwrap();
    let _ = std::fs::remove_file(&path);
    usvg::Tree::from_str(&rendered.svg, &usvg::Options::default()).expect("well-formed SVG");
    rendered
}

fn assert_has(texts: &[String], needle: &str) {
    assert!(
        texts.iter().any(|t| t.contains(needle)),
        "{needle:?} is in none of the texts:\n{texts:#?}"
    );
}

#[test]
fn an_empty_trace_draws_its_frame() {
    let plot = rendered("empty.jsonl", "");
    let texts = texts(&plot.svg);
    assert_has(&texts, "cudatrace timeline: python3 infer.py");
    assert_has(&texts, "0 calls (0 errors) in 0 processes over 0 ns");
    assert_has(&texts, "no device memory allocated");
    assert_has(&texts, "none: the trace has no calls");
    assert_has(&texts, "no kernel launches");
    assert_eq!(
        texts.iter().filter(|t| *t == "0 calls").count(),
        9,
        "every lane"
    );
}

#[test]
fn a_one_call_trace_draws_it() {
    let plot = rendered(
        "one.jsonl",
        "{\"type\":\"call\",\"name\":\"cuInit\",\"pid\":42,\"tid\":42,\"ts_ns\":5000,\"dur_ns\":100,\"ret\":0}\n",
    );
    let texts = texts(&plot.svg);
    assert_has(&texts, "1 call (0 errors) in 1 process over 100 ns");
    assert_eq!(
        texts.iter().filter(|t| *t == "1 call").count(),
        1,
        "the init lane"
    );
    assert_has(&texts, "Stages of pid 42");
    // The call fills its lane: the only column it covers is the last.
    assert!(
        plot.svg
            .contains(&format!(r#"fill="{}""#, theme::family_color("init")))
    );
}

#[test]
fn a_large_trace_shows_the_summary_figures() {
    let iterations = 50_000; // 200,022 calls
    let plot = rendered("large.jsonl", &inference_trace(iterations));
    let report = &plot.report;
    assert_eq!(report.summary.calls, inference_calls(iterations));
    let texts = texts(&plot.svg);

    let memory = &report.memory[0];
    assert_eq!(memory.peak_device_bytes, (112 << 20) + (1 << 20));
    assert_has(
        &texts,
        &format!(
            "pid 42: peak {} at +{}, final {}",
            format_bytes(memory.peak_device_bytes),
            format_ns(memory.peak_ts_ns - report.summary.first_ts_ns),
            format_bytes(memory.final_device_bytes)
        ),
    );
    assert_has(
        &texts,
        &format!(
            "device memory peak {}",
            format_bytes(memory.peak_device_bytes)
        ),
    );
    assert_has(
        &texts,
        &format!(
            "{} calls (0 errors) in 1 process over {}",
            report.summary.calls,
            format_ns(report.summary.span_ns)
        ),
    );
    assert_has(
        &texts,
        &format!("Top kernels: {} launches of 3 kernels", 3 * iterations),
    );
    for kernel in &report.summary.kernels {
        assert_eq!(kernel.launches, iterations);
        assert!(texts.contains(&format!("×{}", kernel.launches)));
        assert!(texts.contains(&kernel.kernel), "{}", kernel.kernel);
    }
    let table = texts
        .iter()
        .position(|t| t.starts_with("Stages of pid 42"))
        .unwrap();
    for stage in &report.stages[0].stages {
        let row = table
            + texts[table..]
                .iter()
                .position(|t| t == stage.name)
                .expect(stage.name);
        assert_eq!(
            texts[row + 1],
            format!(
                "+{}",
                format_ns(stage.start_ns - report.summary.first_ts_ns)
            )
        );
        assert_eq!(texts[row + 2], format_ns(stage.duration_ns));
        assert_eq!(texts[row + 3], stage.calls.to_string());
        assert_eq!(texts[row + 4], stage.launches.to_string());
    }
    let inference = &report.stages[0].stages[3];
    assert_eq!(
        (inference.name, inference.launches),
        ("inference", 3 * iterations)
    );
    for function in report.summary.functions.iter().take(theme::TOP_FUNCTIONS) {
        let row = texts.iter().position(|t| *t == function.name).unwrap();
        assert_eq!(texts[row + 1], function.count.to_string());
        assert_eq!(texts[row + 2], format_ns(function.total_ns));
    }
    assert!(
        texts.contains(&format!("{} calls", 3 * iterations)),
        "the launch lane"
    );
    // Binned, not one element per call.
    assert!(plot.svg.len() < 2 << 20, "{} bytes", plot.svg.len());
}

#[test]
fn png_output_has_the_picture_size() {
    let plot = rendered("png.jsonl", &inference_trace(10));
    let png = png::rasterise(&plot.svg).unwrap();
    assert_eq!(&png.data[..8], b"\x89PNG\r\n\x1a\n");
    let width = u32::from_be_bytes(png.data[16..20].try_into().unwrap());
    assert_eq!(width, 2800, "twice the SVG's width");
}

#[test]
fn a_power_trace_draws_each_gpus_power_under_the_stages() {
    let dir = std::env::temp_dir().join(format!("cudatrace-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("power.jsonl");
    std::fs::write(&path, traces::power()).unwrap();
    let picture = render(&path, "power.jsonl", 1400, false).unwrap();
    let _ = std::fs::remove_file(&path);
    usvg::Tree::from_str(&picture.svg, &usvg::Options::default()).expect("well-formed SVG");
    let shown = texts(&picture.svg);
    assert_has(&shown, "GPU power");
    assert_has(&shown, "GPU energy 0.70 J (mean 350.0 W)");
    assert_has(
        &shown,
        "GPU 0: mean 100.0 W, peak 100.0 W, 0.20 J (counter)",
    );
    assert_has(
        &shown,
        "GPU 1: mean 250.0 W, peak 250.0 W, 0.50 J (integrated power)",
    );
    // The W axis reaches the highest sample (250 W) in round steps.
    assert_has(&shown, "300 W");
    // Two curves: one stroked path per GPU, a point per column with a sample inside the
    // calls' span (samples at 100 µs steps from ts 1000; calls from 10 µs to the end).
    let curves: Vec<&str> = picture
        .svg
        .lines()
        .filter(|l| l.contains(r#"fill="none""#))
        .collect();
    assert_eq!(curves.len(), 2, "{curves:?}");
    let summary = &picture.report.summary;
    let inside = (0..traces::POWER_SAMPLES)
        .map(|k| 1000 + k * 100_000)
        .filter(|ts| *ts >= summary.first_ts_ns && *ts <= summary.first_ts_ns + summary.span_ns)
        .count();
    for curve in curves {
        assert_eq!(curve.matches(['M', 'L']).count(), inside, "{curve}");
    }
    // Without --power, no panel.
    let plain = rendered("plain.jsonl", &inference_trace(2));
    assert!(!texts(&plain.svg).iter().any(|t| t == "GPU power"));
}
