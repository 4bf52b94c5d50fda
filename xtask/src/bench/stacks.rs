//! Part 5, stacks (issue 23): what `--stacks` adds to a call. A Python loop
//! (`/usr/bin/python3.11`, Debian's) calls the stand-in's `cuCtxSynchronize` through
//! ctypes from a shallow and a deep stack, under `cudatrace run` and `cudatrace run
//! --stacks`, rounds interleaved; every run with `CUDATRACE_BPF_STATS=1`, whose call-entry
//! program time includes the stack programs it tail-calls. Per call: wall time and program
//! time; per frame walked: the deep stack's added program time less the shallow one's,
//! over the frames between them (the footer's `frames_walked`). `--stacks` runs twice: as
//! it runs (the count of code objects freed stands for their identities) and with each
//! frame's identity read (`CUDATRACE_STACKS_IDENT_PER_FRAME`, as on a kernel without
//! uprobe_multi), side by side.

use std::{fs, path::Path};

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

use super::{
    cudatrace::{cudatrace_run, footer_json},
    env::Env,
    stats::Stats,
};

/// The interpreter the loop runs on.
pub const PYTHON: &str = "/usr/bin/python3.11";
/// Frames of Python below the call: the loop's function, its recursion, `<module>`.
pub const DEPTHS: [u32; 3] = [4, 32, 36];
/// Calls per run.
pub const CALLS: u64 = 50_000;

/// The loop: `DEPTH - 2` recursive frames, then `CALLS` calls; prints µs per call.
const LOOP: &str = r#"import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
calls, depth = int(sys.argv[2]), int(sys.argv[3])
call = lib.cuCtxSynchronize
def nested(level):
    if level > 0:
        return nested(level - 1)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return time.perf_counter() - start
print(nested(depth - 2) / calls * 1e6)
"#;

/// `stacks` in results.json.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StacksResults {
    pub python: String,
    pub calls: u64,
    pub depths: Vec<DepthResults>,
    /// Program time per frame walked: (deep - shallow) added time over their frames.
    pub program_ns_per_frame: Option<f64>,
}

/// One stack depth, with and without stacks.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DepthResults {
    pub depth: u32,
    /// Frames the probes read per call (entry frames included), from the footer.
    pub frames_per_call: f64,
    /// Reads of the process's memory the probes made per call (the footer's
    /// `memory_reads`; none in results from before it was counted).
    #[serde(default)]
    pub reads_per_call: Option<f64>,
    /// Bytes those reads asked for, per call (the footer's `memory_read_bytes`; none in
    /// results from before it was counted).
    #[serde(default)]
    pub read_bytes_per_call: Option<f64>,
    pub run_us: Stats,
    pub stacks_us: Stats,
    /// The call-entry program's ns per call.
    pub run_program_ns: Stats,
    pub stacks_program_ns: Stats,
    /// `--stacks` with each frame's identity read (no count of code objects freed).
    #[serde(default)]
    pub ident_us: Option<Stats>,
    #[serde(default)]
    pub ident_program_ns: Option<Stats>,
}

/// The three ways a round runs the loop.
#[derive(Clone, Copy, PartialEq)]
enum Way {
    Run,
    Stacks,
    IdentPerFrame,
}

pub fn run(env: &Env, rounds: usize) -> Result<StacksResults> {
    ensure!(
        Path::new(PYTHON).exists(),
        "{PYTHON} is needed for the stacks part"
    );
    let script = env.out.join("stacks_loop.py");
    fs::write(&script, LOOP)?;
    let mut depths = Vec::new();
    for depth in DEPTHS {
        // Wall and program time of each way.
        let mut figures: [[Vec<f64>; 2]; 3] = Default::default();
        let mut walk = Walked::default();
        for round in 0..rounds {
            // The order rotates from round to round.
            let ways = [Way::Run, Way::Stacks, Way::IdentPerFrame];
            for turn in 0..ways.len() {
                let way = ways[(round + turn) % ways.len()];
                let (wall, program, walked) = one_run(env, &script, depth, way)?;
                let at = way as usize;
                figures[at][0].push(wall);
                figures[at][1].push(program);
                if way == Way::Stacks {
                    walk = walked;
                }
            }
        }
        depths.push(DepthResults {
            depth,
            frames_per_call: walk.frames,
            reads_per_call: walk.reads,
            read_bytes_per_call: walk.bytes,
            run_us: Stats::of(&figures[0][0]),
            stacks_us: Stats::of(&figures[1][0]),
            run_program_ns: Stats::of(&figures[0][1]),
            stacks_program_ns: Stats::of(&figures[1][1]),
            ident_us: Some(Stats::of(&figures[2][0])),
            ident_program_ns: Some(Stats::of(&figures[2][1])),
        });
    }
    let added = |d: &DepthResults| Some(d.stacks_program_ns.median? - d.run_program_ns.median?);
    let deepest = depths.len() - 1;
    let program_ns_per_frame = match (added(&depths[0]), added(&depths[deepest])) {
        (Some(shallow), Some(deep))
            if depths[deepest].frames_per_call > depths[0].frames_per_call =>
        {
            Some((deep - shallow) / (depths[deepest].frames_per_call - depths[0].frames_per_call))
        }
        _ => None,
    };
    Ok(StacksResults {
        python: PYTHON.into(),
        calls: CALLS,
        depths,
        program_ns_per_frame,
    })
}

/// What a stacked run's walks did, per call (the footer's `stacks`).
#[derive(Default)]
struct Walked {
    frames: f64,
    reads: Option<f64>,
    bytes: Option<f64>,
}

/// One traced run: µs per call, the call-entry program's ns per call, and what its walks
/// did per call.
fn one_run(env: &Env, script: &Path, depth: u32, way: Way) -> Result<(f64, f64, Walked)> {
    let trace = env.out.join("stacks.jsonl");
    let stacked = way != Way::Run;
    let flags: &[&str] = if stacked { &["--stacks"] } else { &[] };
    let command = [
        PYTHON.to_owned(),
        script.display().to_string(),
        env.libcuda.display().to_string(),
        CALLS.to_string(),
        depth.to_string(),
    ];
    let mut cmd = cudatrace_run(env, &trace, flags, &command);
    cmd.env("CUDATRACE_BPF_STATS", "1");
    if way == Way::IdentPerFrame {
        cmd.env("CUDATRACE_STACKS_IDENT_PER_FRAME", "1");
    }
    let output = cmd.output().context("running cudatrace")?;
    ensure!(output.status.success(), "cudatrace run failed: {output:?}");
    let wall: f64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .context("the loop's µs per call")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let program = stderr
        .lines()
        .find(|line| line.contains("bpf-stats call_enter "))
        .and_then(|line| line.rsplit("ns_per_run=").next()?.trim().parse().ok())
        .context("no bpf-stats line for call_enter")?;
    let walked = if stacked {
        let footer = footer_json(&trace)?;
        let stacks = &footer["stacks"];
        let calls = stacks["calls"].as_f64().unwrap_or(0.0);
        ensure!(
            calls >= CALLS as f64,
            "only {calls} of the loop's calls have a stack"
        );
        let per_call = |name: &str| stacks[name].as_f64().map(|n| n / calls);
        Walked {
            frames: per_call("frames_walked").unwrap_or(0.0),
            reads: per_call("memory_reads"),
            bytes: per_call("memory_read_bytes"),
        }
    } else {
        Walked::default()
    };
    let _ = fs::remove_file(&trace);
    Ok((wall, program, walked))
}
