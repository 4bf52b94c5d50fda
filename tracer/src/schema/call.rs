//! `"type":"call"`: one completed driver call, with its decoded arguments; the table of
//! its fields ([`call_fields`]), from which the rest follows.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    fields::{Hex, LineType, Tag, describe},
    footer::{EventLine, Footer},
};

/// The fields a call line may have beyond those every call line has, in the line's order
/// (the writer's key order is the format): the one description of each. From it follow
/// [`CallLine`]'s fields (here), the catalog's `Field` (a row's `= Variant`: an argument
/// the catalog reads with that variant sets the field), the decoder's setter
/// (`events/call/fields.rs`), the export's arguments (`export/call_args.rs`), and the test
/// below that docs/trace-format.md's tables name each field with its type. Each of them
/// passes the name of its own macro, which gets the rows. A field is `Option<T>` (left out
/// when `None`) or `Vec<T>` (left out when empty).
///
/// Adding a field is adding a row (and its line in docs/trace-format.md).
macro_rules! call_fields {
    ($then:ident) => {
        $then! {
            /// The result's name (`CUDA_ERROR_*`, `ncclResult_t`), where known.
            ret_name: Option<Cow<'static, str>>,
            /// Copy direction.
            kind: Option<Cow<'static, str>>,
            bytes: Option<u64> = Bytes,
            dptr: Option<Hex> = Dptr,
            src: Option<Hex> = Src,
            dst: Option<Hex> = Dst,
            src_context: Option<Hex> = SrcContext,
            dst_context: Option<Hex> = DstContext,
            grid: Option<[u32; 3]>,
            block: Option<[u32; 3]>,
            shared_mem: Option<u64> = SharedMem,
            stream: Option<Hex> = Stream,
            function: Option<Hex> = Function,
            kernel_handle: Option<Hex> = Kernel,
            /// Launches: the kernel's demangled name, or `unknown@0x...` (added by the analysis).
            kernel: Option<String>,
            /// Launches: the name as the program passed it, where it differs from `kernel`.
            kernel_mangled: Option<String>,
            symbol: Option<String>,
            path: Option<String>,
            library: Option<Hex> = Library,
            module: Option<Hex> = Module,
            image: Option<Hex> = Image,
            context: Option<Hex> = Context,
            device: Option<i32> = Device,
            event: Option<Hex> = Event,
            graph: Option<Hex> = Graph,
            pool: Option<Hex> = Pool,
            handle: Option<Hex> = Handle,
            host: Option<Hex> = Host,
            addr: Option<Hex> = Addr,
            flags: Option<u64> = Flags,
            offset: Option<u64> = Offset,
            alignment: Option<u64> = Alignment,
            pitch: Option<u64> = Pitch,
            width: Option<u64> = Width,
            height: Option<u64> = Height,
            depth: Option<u64>,
            value: Option<u64> = Value,
            count: Option<u64> = Count,
            version: Option<i32> = Version,
            /// `numLibraryOptions` of `cuLibraryLoad*`.
            library_option_count: Option<u64> = LibraryOptionCount,
            /// A stream's priority (`cuStreamCreateWithPriority`; lower is more urgent).
            priority: Option<i32> = Priority,
            /// The `CUgraph` a graph exec (`graph`) is instantiated or updated from.
            source_graph: Option<Hex> = SourceGraph,
            /// `cuGraphExecUpdate*`'s update result, `cuGraphInstantiateWithParams`'s result.
            graph_result: Option<u32> = GraphResult,
            /// A `CUipcMemHandle`'s bytes as hex, in memory order (see docs/trace-format.md
            /// for how many each function gives).
            ipc_handle: Option<String>,
            /// A `CUmemLocation`: its type (`device`, `host`, `host_numa`, ...) and id.
            location: Option<Cow<'static, str>>,
            location_id: Option<i32>,
            /// A `CUmem_advise` value and its name.
            advice: Option<u32>,
            advice_name: Option<Cow<'static, str>>,
            /// NCCL: the communicator (`ncclComm_t`) a call works on or created.
            comm: Option<Hex> = Comm,
            /// `ncclCommSplit`/`ncclCommShrink`: the communicator created.
            new_comm: Option<Hex> = NewComm,
            /// `ncclCommInitAll`: the communicators created, rank 0 first.
            comms: Vec<Hex>,
            /// `ncclCommInitRank*`: the first 32 bytes of the `ncclUniqueId`, as hex: the
            /// same on every rank of the communicator.
            unique_id: Option<String>,
            /// NCCL: the caller's rank and the communicator's number of ranks (from the
            /// call's arguments, or added by the analysis from the communicator's creation).
            rank: Option<i32> = Rank,
            nranks: Option<i32> = Nranks,
            /// NCCL: the communicator's name across processes, the same on every rank (the
            /// first 8 bytes of its unique id as hex; for a split child, its parent's,
            /// `/`, the split's number and `c` its color), added by the analysis.
            comm_id: Option<String>,
            /// NCCL collectives (not `ncclSend`/`ncclRecv`): the call's number among the
            /// successful collective calls on its communicator in its process, from 1 (the
            /// same collective has the same number on every rank), added by the analysis.
            comm_seq: Option<u64>,
            /// NCCL: the root rank (rooted collectives), the peer rank (send, receive).
            root: Option<i32> = Root,
            peer: Option<i32> = Peer,
            /// NCCL: the element type's name and size.
            datatype: Option<Cow<'static, str>>,
            datatype_size: Option<u64>,
            /// NCCL: the reduction op (`sum`, `prod`, `max`, `min`, `avg`, `premulsum`).
            op: Option<Cow<'static, str>>,
            /// `ncclCommSplit`'s color and key.
            color: Option<i32> = Color,
            key: Option<i32> = Key,
            /// NCCL: the group (`ncclGroupStart` ... `ncclGroupEnd`, outermost, numbered
            /// per process from 1) a collective was issued in, on it and on the
            /// `ncclGroupEnd` that ends it (added by the analysis).
            group: Option<u64>,
            /// Functions outside the catalog (`--functions`): the six register arguments
            /// as they were, undecoded.
            args: Vec<Hex>,
            /// Memory-changing calls: the process's live device bytes after the call
            /// (added by the analysis).
            live_bytes: Option<u64>,
            /// Reading user memory failed or a name was cut short; see
            /// docs/trace-format.md.
            warnings: Vec<Cow<'static, str>>,
        }
    };
}
pub(crate) use call_fields;

/// [`CallLine`] from the rows of [`call_fields`].
macro_rules! call_line {
    ($($(#[$doc:meta])* $field:ident: $wrapper:ident<$inner:ty> $(= $variant:ident)?,)*) => {
        /// One completed driver call of a traced process.
        ///
        /// Strings the decoder takes from tables are `Cow::Borrowed`; readers get them back
        /// owned.
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
        pub struct CallLine {
            #[serde(rename = "type")]
            pub tag: Tag<Self>,
            pub name: String,
            pub pid: u32,
            pub tid: u32,
            pub ts_ns: u64,
            /// Entry to return. Absent from calls probed at entry alone
            /// (`--launch-entry-only`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub dur_ns: Option<u64>,
            /// The result returned. Absent like `dur_ns`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub ret: Option<u32>,
            /// The id of the library file the call went into (its `library` line).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub lib: Option<u32>,
            $(
                $(#[$doc])*
                #[serde(default, skip_serializing_if = "Unset::is_unset")]
                pub $field: $wrapper<$inner>,
            )*
        }
    };
}
call_fields!(call_line);

/// What a call line leaves out: a field without a value, an empty list.
trait Unset {
    fn is_unset(&self) -> bool;
}

impl<T> Unset for Option<T> {
    fn is_unset(&self) -> bool {
        self.is_none()
    }
}

impl<T> Unset for Vec<T> {
    fn is_unset(&self) -> bool {
        self.is_empty()
    }
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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::CallLine;
    use crate::schema::testing::field_names;

    /// The type docs/trace-format.md gives each field of the table, from its Rust type.
    macro_rules! doc_types {
        ($($(#[$doc:meta])* $field:ident: $wrapper:ident<$inner:ty> $(= $variant:ident)?,)*) => {
            &[$((stringify!($field), doc_type(stringify!($wrapper<$inner>))),)*]
        };
    }

    fn doc_type(rust_type: &str) -> &'static [&'static str] {
        match rust_type.replace(' ', "").as_str() {
            "Option<Hex>" => &["hex"],
            "Option<u64>" | "Option<u32>" | "Option<i32>" => &["number"],
            "Option<Cow<'static,str>>" => &["string"],
            // Names, paths, and bytes written as hex.
            "Option<String>" => &["string", "hex bytes"],
            "Option<[u32;3]>" => &["`[x,y,z]`"],
            "Vec<Hex>" => &["hex array"],
            "Vec<Cow<'static,str>>" => &["strings"],
            other => panic!("no documented type for {other}"),
        }
    }

    /// The call-line tables of docs/trace-format.md (its "Call lines" section and the
    /// analysis's "Call fields"): each field named and the types given it.
    fn documented() -> BTreeMap<String, Vec<Option<String>>> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/trace-format.md");
        let text = std::fs::read_to_string(path).unwrap();
        let mut fields: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
        let mut in_section = false;
        let mut typed = false;
        for line in text.lines() {
            if line.starts_with('#') {
                in_section = line == "## Call lines" || line == "### Call fields";
                continue;
            }
            let Some(row) = line.strip_prefix('|').filter(|_| in_section) else {
                continue;
            };
            let cells: Vec<&str> = row.split(" | ").map(str::trim).collect();
            if cells[0] == "field" {
                typed = cells.get(1) == Some(&"type");
                continue;
            }
            if cells[0].starts_with("---") {
                continue;
            }
            let names: Vec<&str> = cells[0].split(", ").map(|n| n.trim_matches('`')).collect();
            let types: Vec<&str> = if typed {
                cells[1].split(", ").collect()
            } else {
                vec![]
            };
            for (index, name) in names.iter().enumerate() {
                let given = match types.len() {
                    0 => None,
                    1 => Some(types[0].to_owned()),
                    _ => Some(types.get(index).expect(line).to_string()),
                };
                fields.entry((*name).to_owned()).or_default().push(given);
            }
        }
        fields
    }

    /// A field added to the table and not to docs/trace-format.md, or documented with
    /// another type, fails here.
    #[test]
    fn the_format_doc_describes_every_call_field_with_its_type() {
        let documented = documented();
        let fields: BTreeSet<&str> = field_names::<CallLine>()
            .iter()
            .copied()
            .filter(|name| *name != "type")
            .collect();
        let named: BTreeSet<&str> = documented.keys().map(String::as_str).collect();
        let undocumented: Vec<&&str> = fields.difference(&named).collect();
        let unknown: Vec<&&str> = named.difference(&fields).collect();
        assert!(
            undocumented.is_empty(),
            "not in the doc's tables: {undocumented:?}"
        );
        assert!(
            unknown.is_empty(),
            "in the doc's tables, not call fields: {unknown:?}"
        );
        let types: &[(&str, &[&str])] = crate::schema::call_fields!(doc_types);
        for (field, accepted) in types {
            for given in documented[*field].iter().flatten() {
                assert!(accepted.contains(&given.as_str()), "{field}: {given}");
            }
        }
    }
}
