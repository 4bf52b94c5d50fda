//! `"type":"library"`: a library file cudatrace attached its probes to. One line per distinct
//! file (device and inode), written when it is attached: the files attached at start
//! follow the header, files found later (`dlopen` from a path no search knows, a second
//! copy of libcuda) come when a traced process opens them. Call lines name their file by
//! its `id` (`lib`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    AttachFailureInfo, ProbeInfo,
    fields::{LineType, Tag},
    footer::{EventLine, Footer},
};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LibraryLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    /// The library id: call lines' `lib`. 0 for the first file attached, then 1, 2, ...
    pub id: u32,
    /// The probe set: `libcuda`.
    pub set: String,
    /// The path the file was found by: the search's, `--lib`'s, or the one the process
    /// opened (in its own mount namespace, which may not be cudatrace's).
    pub path: String,
    /// The file's device and inode: what tells two copies apart.
    pub device: u64,
    pub inode: u64,
    /// The version in the file name, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// cudatrace's stand-in of the library, not the real one.
    pub standin: bool,
    /// Why it was attached: `search` (the default search), `explicit` (`--libcuda`,
    /// `--lib`), `mapped` (mapped by a `-p`/`--all` process at start) or `opened` (opened by a
    /// traced process while tracing).
    pub found: String,
    /// `opened`, `mapped`: the process that opened or mapped it first, and when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ts_ns: Option<u64>,
    /// Its probes: their `id`s are the attach cookies, `symbol`s what call lines name.
    pub probes: Vec<ProbeInfo>,
    /// Catalog functions the file does not export.
    #[serde(skip_deserializing)]
    pub missing_functions: Vec<String>,
    /// Exported names not attached because another name shares their address (NCCL's
    /// `pncclX` profiling aliases of `ncclX`): `[alias, the name attached]`, each once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<(String, String)>,
    /// Symbols that could not be attached in this file (the kernel refused them), as the
    /// header's `attach_failures`.
    #[serde(skip_serializing_if = "Vec::is_empty", skip_deserializing)]
    pub attach_failures: Vec<AttachFailureInfo>,
}

impl LineType for LibraryLine {
    const TYPE: &'static str = "library";
}

impl EventLine for LibraryLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.library += 1;
    }
}

impl LibraryLine {
    pub(super) fn read(value: &Value, bytes: &[u8]) -> Result<Self, String> {
        value
            .get("id")
            .and_then(Value::as_u64)
            .and_then(|id| u32::try_from(id).ok())
            .ok_or("library line: no valid \"id\"")?;
        serde_json::from_slice(bytes).map_err(|e| format!("library line: {e}"))
    }
}
