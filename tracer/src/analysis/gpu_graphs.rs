//! `--gpu`: CUDA graphs as the GPU ran them. Work lines of a graph (`graph_id`) that share
//! a correlation id come from one graph launch (a replay); per graph: its replays, the
//! kernels, copies and memsets each ran, and their GPU time per replay.
//!
//! A replay is counted when a graph's correlation id changes: the lines of one launch come
//! together (one CUPTI buffer), so memory stays one entry per graph.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::schema::GpuLine;

#[derive(Default)]
struct Graph {
    replays: u64,
    last_correlation: Option<u32>,
    kernels: u64,
    copies: u64,
    memsets: u64,
    gpu_ns: u64,
    linked_to_capture: u64,
}

/// Per `(pid, graph_id)`, fed every work line.
#[derive(Default)]
pub struct GraphAccumulator {
    graphs: BTreeMap<(u32, u32), Graph>,
}

impl GraphAccumulator {
    pub fn observe(&mut self, line: &GpuLine) {
        let Some(work) = line.work() else { return };
        let Some(graph_id) = work.link.graph_id else {
            return;
        };
        let graph = self.graphs.entry((work.pid, graph_id)).or_default();
        if graph.last_correlation != Some(work.link.correlation_id) {
            graph.replays += 1;
            graph.last_correlation = Some(work.link.correlation_id);
        }
        match line {
            GpuLine::Kernel(_) => graph.kernels += 1,
            GpuLine::Copy(_) => graph.copies += 1,
            _ => graph.memsets += 1,
        }
        graph.gpu_ns = graph.gpu_ns.saturating_add(work.dur_ns);
        graph.linked_to_capture += u64::from(work.link.capture_call_tid.is_some());
    }

    /// Graphs by GPU time, the most first.
    pub fn finish(self) -> Vec<GraphTime> {
        let mut graphs: Vec<GraphTime> = self
            .graphs
            .into_iter()
            .map(|((pid, graph_id), g)| {
                let per_replay = |n: u64| n as f64 / g.replays.max(1) as f64;
                GraphTime {
                    pid,
                    graph_id,
                    replays: g.replays,
                    kernels: g.kernels,
                    copies: g.copies,
                    memsets: g.memsets,
                    kernels_per_replay: per_replay(g.kernels),
                    gpu_ns: g.gpu_ns,
                    gpu_ns_per_replay: g.gpu_ns / g.replays.max(1),
                    linked_to_capture: g.linked_to_capture,
                }
            })
            .collect();
        graphs.sort_by(|a, b| {
            b.gpu_ns
                .cmp(&a.gpu_ns)
                .then((a.pid, a.graph_id).cmp(&(b.pid, b.graph_id)))
        });
        graphs
    }
}

/// One graph's figures (`summary --json`'s `gpu.graphs`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GraphTime {
    pub pid: u32,
    /// CUPTI's graph id.
    pub graph_id: u32,
    /// Its launches that ran work (distinct correlation ids).
    pub replays: u64,
    pub kernels: u64,
    pub copies: u64,
    pub memsets: u64,
    pub kernels_per_replay: f64,
    /// GPU time of its work, summed (work that overlaps counts twice).
    pub gpu_ns: u64,
    pub gpu_ns_per_replay: u64,
    /// Work lines linked to the captured call that made their node.
    pub linked_to_capture: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{GpuKernelLine, GpuLink, GpuMemsetLine};

    fn kernel(correlation_id: u32, graph: Option<u32>, dur_ns: u64, captured: bool) -> GpuLine {
        GpuLine::Kernel(GpuKernelLine {
            pid: 1,
            dur_ns,
            link: GpuLink {
                correlation_id,
                graph_id: graph,
                capture_call_tid: captured.then_some(1),
                ..GpuLink::default()
            },
            ..GpuKernelLine::default()
        })
    }

    #[test]
    fn replays_kernels_and_time_per_graph() {
        let mut graphs = GraphAccumulator::default();
        for (correlation, dur) in [(5, 10), (5, 20), (9, 10), (9, 20), (12, 11), (12, 21)] {
            graphs.observe(&kernel(correlation, Some(3), dur, correlation != 12));
        }
        graphs.observe(&GpuLine::Memset(GpuMemsetLine {
            pid: 1,
            dur_ns: 7,
            link: GpuLink {
                correlation_id: 12,
                graph_id: Some(3),
                ..GpuLink::default()
            },
            ..GpuMemsetLine::default()
        }));
        // Not in a graph: not counted.
        graphs.observe(&kernel(13, None, 100, false));
        assert_eq!(
            graphs.finish(),
            [GraphTime {
                pid: 1,
                graph_id: 3,
                replays: 3,
                kernels: 6,
                copies: 0,
                memsets: 1,
                kernels_per_replay: 2.0,
                gpu_ns: 99,
                gpu_ns_per_replay: 33,
                linked_to_capture: 4,
            }]
        );
    }
}
