//! Setting a catalog [`Field`] of a [`CallLine`] from an argument's 64-bit value: pointers
//! and handles as hex, sizes, counts and ints as numbers.

use crate::{
    catalog::Field,
    schema::{CallLine, Hex},
};

impl CallLine {
    pub(super) fn set_hex(&mut self, field: Field, number: u64) {
        let value = Some(Hex(number));
        match field {
            Field::Dptr => self.dptr = value,
            Field::Src => self.src = value,
            Field::Dst => self.dst = value,
            Field::SrcContext => self.src_context = value,
            Field::DstContext => self.dst_context = value,
            Field::Stream => self.stream = value,
            Field::Function => self.function = value,
            Field::Kernel => self.kernel_handle = value,
            Field::Library => self.library = value,
            Field::SourceGraph => self.source_graph = value,
            Field::Module => self.module = value,
            Field::Context => self.context = value,
            Field::Event => self.event = value,
            Field::Graph => self.graph = value,
            Field::Pool => self.pool = value,
            Field::Handle => self.handle = value,
            Field::Addr => self.addr = value,
            Field::Image => self.image = value,
            Field::Host => self.host = value,
            Field::Comm => self.comm = value,
            Field::NewComm => self.new_comm = value,
            other => self.set_num(other, number),
        }
    }

    pub(super) fn set_num(&mut self, field: Field, number: u64) {
        let value = Some(number);
        match field {
            Field::Bytes => self.bytes = value,
            Field::SharedMem => self.shared_mem = value,
            Field::Flags => self.flags = value,
            Field::Offset => self.offset = value,
            Field::Alignment => self.alignment = value,
            Field::Pitch => self.pitch = value,
            Field::Width => self.width = value,
            Field::Height => self.height = value,
            Field::Value => self.value = value,
            Field::Count => self.count = value,
            Field::Device => self.device = value.map(|v| v as i32),
            Field::Version => self.version = value.map(|v| v as i32),
            Field::Priority => self.priority = value.map(|v| v as i32),
            Field::LibraryOptionCount => self.library_option_count = value,
            Field::GraphResult => self.graph_result = value.map(|v| v as u32),
            Field::Rank => self.rank = value.map(|v| v as i32),
            Field::Nranks => self.nranks = value.map(|v| v as i32),
            Field::Root => self.root = value.map(|v| v as i32),
            Field::Peer => self.peer = value.map(|v| v as i32),
            Field::Color => self.color = value.map(|v| v as i32),
            Field::Key => self.key = value.map(|v| v as i32),
            other => self.set_hex(other, number),
        }
    }
}
