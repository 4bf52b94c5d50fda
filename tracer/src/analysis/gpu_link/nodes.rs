//! Graph work to the captured call that made its node (docs/gpu.md, "Stream capture and
//! graphs").
//!
//! A stream capture turns the launches, copies and memsets made on the stream into the
//! nodes of a graph, in the order they were made; `cuStreamEndCapture` gives the graph,
//! `cuGraphInstantiate*` makes an executable graph of it, `cuGraphLaunch` runs that. CUPTI's
//! records of a graph launch's work carry the node's id. Where CUPTI cannot tell us which
//! node came from which call (its resource callbacks need a subscriber of our own, which a
//! single-subscriber CUPTI must leave to the program's profiler), the capture order does:
//! the nodes of one kind (kernel, copy, memset), by increasing id, are the captured calls of
//! that kind in the order they were made. Each kernel node is checked against its call by
//! name; where the names disagree, nodes are matched by name, in order.

use std::{collections::HashMap, sync::Arc};

use crate::{
    analysis::{Role, classify},
    schema::{CallLine, GpuLine},
};

/// A node's kind, as CUPTI's records tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeKind {
    Kernel,
    Copy,
    Memset,
}

impl NodeKind {
    pub fn of(line: &GpuLine) -> Option<NodeKind> {
        match line {
            GpuLine::Kernel(_) => Some(NodeKind::Kernel),
            GpuLine::Copy(_) => Some(NodeKind::Copy),
            GpuLine::Memset(_) => Some(NodeKind::Memset),
            _ => None,
        }
    }
}

/// A call captured into a graph: its line, and a launch's kernel.
#[derive(Clone, Debug)]
struct Captured {
    tid: u32,
    ts_ns: u64,
    kind: NodeKind,
    kernel: Option<Arc<str>>,
}

/// A node of a launched graph, as one of its records shows it.
#[derive(Clone, Debug)]
pub struct Node {
    pub id: u64,
    pub kind: NodeKind,
    /// A kernel's name as CUPTI gave it.
    pub kernel: Option<String>,
}

impl Node {
    /// The node a graph's work line ran in.
    pub fn of(line: &GpuLine) -> Option<Node> {
        let work = line.work()?;
        Some(Node {
            id: work.link.graph_node_id?,
            kind: NodeKind::of(line)?,
            kernel: match line {
                GpuLine::Kernel(kernel) => Some(kernel.kernel.clone()),
                _ => None,
            },
        })
    }
}

/// What [`Graphs::link`] could do.
#[derive(Debug, PartialEq, Eq)]
pub enum NodeLink {
    /// The captured call's line, `(tid, ts_ns)`, or none.
    Done(Option<(u32, u64)>),
    /// Not every node of the launch has come yet.
    Wait,
}

/// One process's captures and graphs.
#[derive(Default)]
pub struct Graphs {
    captures: HashMap<u64, Vec<Captured>>,
    /// `CUgraph` -> the capture that made it.
    capture_of_graph: HashMap<u64, u64>,
    /// Executable graph -> the `CUgraph` it was instantiated (or last updated) from.
    source_of_exec: HashMap<u64, u64>,
    /// Executable graph -> node id -> the captured call.
    nodes: HashMap<u64, HashMap<u64, (u32, u64)>>,
}

/// A launch's kernel name as the program passed it.
pub fn launch_kernel(call: &CallLine) -> Option<Arc<str>> {
    let name = call.kernel_mangled.as_deref().or(call.kernel.as_deref())?;
    (!name.starts_with("unknown@")).then(|| name.into())
}

impl Graphs {
    /// A call line as it is written (its `captured` and `capture` numbers given).
    pub fn call(&mut self, call: &CallLine) {
        let (role, _) = classify(&call.name);
        if let Some(capture) = call.captured {
            let kind = match role {
                Role::Launch => NodeKind::Kernel,
                Role::Copy => NodeKind::Copy,
                Role::Memset => NodeKind::Memset,
                _ => return,
            };
            self.captures.entry(capture).or_default().push(Captured {
                tid: call.tid,
                ts_ns: call.ts_ns,
                kind,
                kernel: launch_kernel(call),
            });
            return;
        }
        if !call.ok() {
            return;
        }
        match (role, call.capture, call.graph, call.source_graph) {
            (Role::CaptureEnd, Some(capture), Some(graph), _) => {
                self.capture_of_graph.insert(graph.0, capture);
            }
            (_, _, Some(exec), Some(graph))
                if call.name.starts_with("cuGraphInstantiate")
                    || call.name.starts_with("cuGraphExecUpdate") =>
            {
                self.source_of_exec.insert(exec.0, graph.0);
                self.nodes.remove(&exec.0);
            }
            _ => {}
        }
    }

    /// The captured call that made the node `node` of a launch of `exec`; `replay` gives
    /// every node of that launch seen so far (this one included; asked only while the
    /// graph's nodes are not known yet), `force` maps with what there is.
    pub fn link(
        &mut self,
        exec: u64,
        node: u64,
        replay: impl FnOnce() -> Vec<Node>,
        force: bool,
    ) -> NodeLink {
        if let Some(nodes) = self.nodes.get(&exec) {
            return NodeLink::Done(nodes.get(&node).copied());
        }
        let Some(captured) = self
            .source_of_exec
            .get(&exec)
            .and_then(|graph| self.capture_of_graph.get(graph))
            .and_then(|capture| self.captures.get(capture))
        else {
            return NodeLink::Done(None);
        };
        let replay = replay();
        let complete = [NodeKind::Kernel, NodeKind::Copy, NodeKind::Memset]
            .iter()
            .all(|kind| {
                let made = captured.iter().filter(|c| c.kind == *kind).count();
                replay.iter().filter(|n| n.kind == *kind).count() >= made
            });
        if !complete && !force {
            return NodeLink::Wait;
        }
        let nodes = map_nodes(captured, &replay);
        let found = nodes.get(&node).copied();
        self.nodes.insert(exec, nodes);
        NodeLink::Done(found)
    }
}

/// Each kind's nodes by increasing id against its captured calls in order; kernels checked
/// by name, and matched by name (in order) where any disagrees.
fn map_nodes(captured: &[Captured], replay: &[Node]) -> HashMap<u64, (u32, u64)> {
    let mut map = HashMap::new();
    for kind in [NodeKind::Kernel, NodeKind::Copy, NodeKind::Memset] {
        let calls: Vec<&Captured> = captured.iter().filter(|c| c.kind == kind).collect();
        let mut nodes: Vec<&Node> = replay.iter().filter(|n| n.kind == kind).collect();
        nodes.sort_by_key(|n| n.id);
        nodes.dedup_by_key(|n| n.id);
        let agree = nodes.len() == calls.len()
            && nodes.iter().zip(&calls).all(|(node, call)| {
                kind != NodeKind::Kernel || node.kernel.as_deref() == call.kernel.as_deref()
            });
        if agree {
            for (node, call) in nodes.iter().zip(&calls) {
                map.insert(node.id, (call.tid, call.ts_ns));
            }
            continue;
        }
        let mut taken = vec![false; calls.len()];
        for node in nodes {
            let found = calls.iter().enumerate().position(|(index, call)| {
                !taken[index]
                    && (kind != NodeKind::Kernel
                        || (node.kernel.is_some()
                            && node.kernel.as_deref() == call.kernel.as_deref()))
            });
            if let Some(index) = found {
                taken[index] = true;
                map.insert(node.id, (calls[index].tid, calls[index].ts_ns));
            }
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Hex;

    fn line(name: &str, ts_ns: u64, fill: impl FnOnce(&mut CallLine)) -> CallLine {
        let mut call = CallLine {
            name: name.into(),
            pid: 1,
            tid: 7,
            ts_ns,
            ret: Some(0),
            ..CallLine::default()
        };
        fill(&mut call);
        call
    }

    fn node(id: u64, kind: NodeKind, kernel: Option<&str>) -> Node {
        Node {
            id,
            kind,
            kernel: kernel.map(str::to_owned),
        }
    }

    /// Capture 1 of stream 0x50: launches of a, b, a memset, then c; graph 0x60, exec 0x70.
    fn captured() -> Graphs {
        let mut graphs = Graphs::default();
        for (ts, name, kernel) in [
            (10, "cuLaunchKernel", Some("a")),
            (20, "cuLaunchKernel", Some("b")),
            (30, "cuMemsetD32Async", None),
            (40, "cuLaunchKernelEx", Some("c")),
        ] {
            graphs.call(&line(name, ts, |c| {
                c.captured = Some(1);
                c.kernel = kernel.map(str::to_owned);
            }));
        }
        graphs.call(&line("cuStreamEndCapture", 50, |c| {
            c.capture = Some(1);
            c.graph = Some(Hex(0x60));
        }));
        graphs.call(&line("cuGraphInstantiateWithFlags", 60, |c| {
            c.graph = Some(Hex(0x70));
            c.source_graph = Some(Hex(0x60));
        }));
        graphs
    }

    #[test]
    fn nodes_follow_the_capture_order_once_the_launch_is_complete() {
        let mut graphs = captured();
        let first = [node(104, NodeKind::Kernel, Some("a"))];
        assert_eq!(
            graphs.link(0x70, 104, || first.to_vec(), false),
            NodeLink::Wait
        );
        let replay = [
            node(106, NodeKind::Kernel, Some("c")),
            node(104, NodeKind::Kernel, Some("a")),
            node(107, NodeKind::Memset, None),
            node(105, NodeKind::Kernel, Some("b")),
        ];
        assert_eq!(
            graphs.link(0x70, 105, || replay.to_vec(), false),
            NodeLink::Done(Some((7, 20)))
        );
        // Later launches use the mapping.
        assert_eq!(
            graphs.link(0x70, 106, Vec::new, false),
            NodeLink::Done(Some((7, 40)))
        );
        assert_eq!(
            graphs.link(0x70, 107, Vec::new, false),
            NodeLink::Done(Some((7, 30)))
        );
        assert_eq!(
            graphs.link(0x70, 999, Vec::new, false),
            NodeLink::Done(None)
        );
        // An exec nothing is known of.
        assert_eq!(graphs.link(0x71, 1, Vec::new, false), NodeLink::Done(None));
    }

    #[test]
    fn where_names_disagree_nodes_are_matched_by_name() {
        let mut graphs = captured();
        // Ids not in capture order: b's node has the smallest id.
        let replay = [
            node(5, NodeKind::Kernel, Some("b")),
            node(6, NodeKind::Kernel, Some("a")),
            node(7, NodeKind::Kernel, Some("c")),
            node(8, NodeKind::Memset, None),
        ];
        assert_eq!(
            graphs.link(0x70, 6, || replay.to_vec(), false),
            NodeLink::Done(Some((7, 10)))
        );
        assert_eq!(
            graphs.link(0x70, 5, Vec::new, false),
            NodeLink::Done(Some((7, 20)))
        );
        // Forced with a part of the launch: what can be matched is.
        let mut graphs = captured();
        let part = [node(9, NodeKind::Kernel, Some("c"))];
        assert_eq!(
            graphs.link(0x70, 9, || part.to_vec(), true),
            NodeLink::Done(Some((7, 40)))
        );
    }
}
