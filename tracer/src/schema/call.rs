//! `"type":"call"`: one completed driver call, with its decoded arguments.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    fields::{Hex, LineType, Tag, describe},
    footer::{EventLine, Footer},
};

/// One completed driver call of a traced process.
///
/// Strings the decoder takes from tables are `Cow::Borrowed`; readers get them back owned.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CallLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    pub name: String,
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    /// Entry to return. Absent from calls probed at entry alone (`--launch-entry-only`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dur_ns: Option<u64>,
    /// The result returned. Absent like `dur_ns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ret: Option<u32>,
    /// The id of the library file the call went into (its `library` line).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lib: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ret_name: Option<Cow<'static, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<Cow<'static, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dptr: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub src: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub src_context: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst_context: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grid: Option<[u32; 3]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block: Option<[u32; 3]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_mem: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_handle: Option<Hex>,
    /// Launches: the kernel's demangled name, or `unknown@0x...` (added by the analysis).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// Launches: the name as the program passed it, where it differs from `kernel`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_mangled: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub library: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handle: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flags: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alignment: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pitch: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub height: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub depth: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<i32>,
    /// `numLibraryOptions` of `cuLibraryLoad*`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub library_option_count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// The `CUgraph` a graph exec (`graph`) is instantiated or updated from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_graph: Option<Hex>,
    /// `cuGraphExecUpdate*`'s update result, `cuGraphInstantiateWithParams`'s result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_result: Option<u32>,
    /// A `CUipcMemHandle`'s bytes as hex, in memory order (see docs/trace-format.md for
    /// how many each function gives).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipc_handle: Option<String>,
    /// A `CUmemLocation`: its type (`device`, `host`, `host_numa`, ...) and id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<Cow<'static, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location_id: Option<i32>,
    /// A `CUmem_advise` value and its name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice_name: Option<Cow<'static, str>>,
    /// NCCL: the communicator (`ncclComm_t`) a call works on or created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<Hex>,
    /// `ncclCommSplit`/`ncclCommShrink`: the communicator created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_comm: Option<Hex>,
    /// `ncclCommInitAll`: the communicators created, rank 0 first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub comms: Vec<Hex>,
    /// `ncclCommInitRank*`: the first 32 bytes of the `ncclUniqueId`, as hex: the same on
    /// every rank of the communicator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unique_id: Option<String>,
    /// NCCL: the caller's rank and the communicator's number of ranks (from the call's
    /// arguments, or added by the analysis from the communicator's creation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nranks: Option<i32>,
    /// NCCL: the root rank (rooted collectives), the peer rank (send, receive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<i32>,
    /// NCCL: the element type's name and size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub datatype: Option<Cow<'static, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub datatype_size: Option<u64>,
    /// NCCL: the reduction op (`sum`, `prod`, `max`, `min`, `avg`, `premulsum`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<Cow<'static, str>>,
    /// `ncclCommSplit`'s color and key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub color: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<i32>,
    /// NCCL: the group (`ncclGroupStart` ... `ncclGroupEnd`, outermost, numbered per
    /// process from 1) a collective was issued in, on it and on the `ncclGroupEnd` that
    /// ends it (added by the analysis).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<u64>,
    /// Functions outside the catalog (`--functions`): the six register arguments as they
    /// were, undecoded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<Hex>,
    /// Memory-changing calls: the process's live device bytes after the call (added by
    /// the analysis).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_bytes: Option<u64>,
    /// Reading user memory failed or a name was cut short; see docs/trace-format.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Cow<'static, str>>,
}

impl CallLine {
    /// Whether the call did not fail: it returned 0, or it was probed at entry alone and
    /// its result is unknown (counted as a success, as `--launch-entry-only` says).
    pub fn ok(&self) -> bool {
        self.ret.is_none_or(|ret| ret == 0)
    }

    /// Entry to return, 0 for a call probed at entry alone: for sums and spans, where an
    /// unknown duration adds nothing.
    pub fn dur_or_zero(&self) -> u64 {
        self.dur_ns.unwrap_or(0)
    }

    /// When the call returned, if its return was seen.
    pub fn end_ns(&self) -> Option<u64> {
        self.dur_ns.map(|dur| self.ts_ns.saturating_add(dur))
    }
}

impl LineType for CallLine {
    const TYPE: &'static str = "call";
}

impl EventLine for CallLine {
    /// Calls are counted by name too.
    fn count_in(&self, footer: &mut Footer) {
        footer.events.call += 1;
        match footer.calls_by_name.get_mut(&self.name) {
            Some(count) => *count += 1,
            None => {
                footer.calls_by_name.insert(self.name.clone(), 1);
            }
        }
    }
}

/// The line's opening when the tracer wrote it: the type first. Nearly all lines are calls,
/// and these parse in one pass, without an intermediate [`Value`].
pub const FAST_PREFIX: &[u8] = br#"{"type":"call","#;

impl CallLine {
    /// A line that opens with [`FAST_PREFIX`].
    pub(super) fn read_fast(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| describe(&e))
    }

    /// A call line with its keys in another order.
    pub(super) fn read_value(value: Value) -> Result<Self, String> {
        serde_json::from_value(value).map_err(|e| format!("call line: {}", describe(&e)))
    }
}
