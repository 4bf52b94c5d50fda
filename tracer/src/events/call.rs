//! Decoding a call event: its arguments named through the probe catalog, into a
//! [`CallLine`].

use std::borrow::Cow;

use tracer_common::{CallEvent, STACK_ARGS, flags};

#[cfg(test)]
use super::cuda_result;
use super::raw::c_string;
use crate::{
    catalog::{
        Arg, BATCH_SIZES_READ, CopyKind, Field, FnSpec, IPC_HANDLE_LEN, StrField, UNIQUE_ID_READ,
        nccl,
    },
    schema::{CallLine, Hex},
};

impl CallLine {
    fn set_hex(&mut self, field: Field, number: u64) {
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

    fn set_num(&mut self, field: Field, number: u64) {
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

fn u32_at(data: &[u8], offset: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        data.get(offset..offset + 4)?.try_into().ok()?,
    ))
}

fn u64_at(data: &[u8], offset: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        data.get(offset..offset + 8)?.try_into().ok()?,
    ))
}

/// `CUmemorytype` values.
const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;
const MEMORYTYPE_ARRAY: u32 = 3;

/// Byte offsets of one side (src or dst) of CUDA_MEMCPY2D/3D.
struct CopySide {
    memory_type: usize,
    host: usize,
    device: usize,
    array: usize,
}

fn copy_side(data: &[u8], side: &CopySide) -> Option<(u32, u64)> {
    let memory_type = u32_at(data, side.memory_type)?;
    let address = match memory_type {
        MEMORYTYPE_HOST => u64_at(data, side.host)?,
        MEMORYTYPE_ARRAY => u64_at(data, side.array)?,
        _ => u64_at(data, side.device)?,
    };
    Some((memory_type, address))
}

fn copy_kind(src_type: u32, dst_type: u32) -> CopyKind {
    let on_device = |t| t == MEMORYTYPE_DEVICE || t == MEMORYTYPE_ARRAY;
    match (src_type, dst_type) {
        (MEMORYTYPE_HOST, MEMORYTYPE_HOST) => CopyKind::HtoH,
        (MEMORYTYPE_HOST, d) if on_device(d) => CopyKind::HtoD,
        (s, MEMORYTYPE_HOST) if on_device(s) => CopyKind::DtoH,
        (s, d) if on_device(s) && on_device(d) => CopyKind::DtoD,
        _ => CopyKind::Default,
    }
}

/// CUDA_MEMCPY2D (128 bytes) and CUDA_MEMCPY3D (200 bytes), cuda.h layouts.
fn decode_memcpy(record: &mut CallLine, data: &[u8], three_d: bool) -> Option<()> {
    let (src, dst, width, height, depth) = if three_d {
        (
            CopySide {
                memory_type: 32,
                host: 40,
                device: 48,
                array: 56,
            },
            CopySide {
                memory_type: 120,
                host: 128,
                device: 136,
                array: 144,
            },
            176,
            184,
            Some(192),
        )
    } else {
        (
            CopySide {
                memory_type: 16,
                host: 24,
                device: 32,
                array: 40,
            },
            CopySide {
                memory_type: 72,
                host: 80,
                device: 88,
                array: 96,
            },
            112,
            120,
            None,
        )
    };
    let (src_type, src_addr) = copy_side(data, &src)?;
    let (dst_type, dst_addr) = copy_side(data, &dst)?;
    let width = u64_at(data, width)?;
    let height = u64_at(data, height)?;
    let depth = match depth {
        Some(offset) => Some(u64_at(data, offset)?),
        None => None,
    };
    record.src = Some(Hex(src_addr));
    record.dst = Some(Hex(dst_addr));
    record.kind = Some(Cow::Borrowed(copy_kind(src_type, dst_type).as_str()));
    record.width = Some(width);
    record.height = Some(height);
    record.depth = depth;
    record.bytes = Some(
        width
            .saturating_mul(height)
            .saturating_mul(depth.unwrap_or(1)),
    );
    Some(())
}

/// CUlaunchConfig: six u32 dimensions, sharedMemBytes at 24, hStream at 32.
fn decode_launch_config(record: &mut CallLine, data: &[u8]) -> Option<()> {
    let dim = |i: usize| u32_at(data, i * 4);
    record.grid = Some([dim(0)?, dim(1)?, dim(2)?]);
    record.block = Some([dim(3)?, dim(4)?, dim(5)?]);
    record.shared_mem = Some(u64::from(dim(6)?));
    record.stream = Some(Hex(u64_at(data, 32)?));
    Some(())
}

/// CUDA_GRAPH_INSTANTIATE_PARAMS: flags at 0, hUploadStream at 8, result_out at 24.
fn decode_instantiate_params(record: &mut CallLine, data: &[u8]) -> Option<()> {
    record.flags = Some(u64_at(data, 0)?);
    record.stream = Some(Hex(u64_at(data, 8)?));
    record.graph_result = Some(u32_at(data, 24)?);
    Some(())
}

/// The sizes of a copy batch, added up; `None` when some were not read.
fn batch_bytes(data: &[u8], count: u64) -> Option<u64> {
    if count > BATCH_SIZES_READ || data.len() < count as usize * 8 {
        return None;
    }
    Some(
        data.chunks_exact(8)
            .take(count as usize)
            .map(|word| u64::from_le_bytes(word.try_into().unwrap_or_default()))
            .fold(0u64, u64::saturating_add),
    )
}

/// Bytes as lower-case hex, in memory order.
fn hex_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `CUmemLocationType` names.
fn location_name(location_type: u32) -> Cow<'static, str> {
    Cow::Borrowed(match location_type {
        0 => "none",
        1 => "device",
        2 => "host",
        3 => "host_numa",
        4 => "host_numa_current",
        other => return Cow::Owned(format!("type_{other}")),
    })
}

/// `CUmem_advise` names.
fn advice_name(advice: u32) -> Option<&'static str> {
    Some(match advice {
        1 => "CU_MEM_ADVISE_SET_READ_MOSTLY",
        2 => "CU_MEM_ADVISE_UNSET_READ_MOSTLY",
        3 => "CU_MEM_ADVISE_SET_PREFERRED_LOCATION",
        4 => "CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION",
        5 => "CU_MEM_ADVISE_SET_ACCESSED_BY",
        6 => "CU_MEM_ADVISE_UNSET_ACCESSED_BY",
        _ => return None,
    })
}

/// Names a libcuda call's arguments through its catalog entry.
#[cfg(test)]
pub fn decode_call(call: &CallEvent, data: Option<&[u8]>, symbol: &str, spec: &FnSpec) -> CallLine {
    decode_call_of(call, data, symbol, spec, cuda_result::name)
}

/// Names a call's arguments through its catalog entry; `result_name` names its return
/// codes (the probe set's: `CUresult`, `ncclResult_t`).
pub fn decode_call_of(
    call: &CallEvent,
    data: Option<&[u8]>,
    symbol: &str,
    spec: &FnSpec,
    result_name: fn(u32) -> Option<&'static str>,
) -> CallLine {
    // An entry-only probe saw no return: no result, no duration.
    let returned = call.header.flags & flags::NO_RETURN == 0;
    let mut record = CallLine {
        name: symbol.to_owned(),
        pid: call.header.pid,
        tid: call.header.tid,
        ts_ns: call.header.ts_ns,
        dur_ns: returned.then_some(call.dur_ns),
        ret: returned.then_some(call.ret),
        ret_name: result_name(call.ret)
            .filter(|_| returned)
            .map(Cow::Borrowed),
        kind: spec.copy.map(|kind| Cow::Borrowed(kind.as_str())),
        ..CallLine::default()
    };
    let data = data.unwrap_or(&[]);
    let mut grid = [0u32; 3];
    let mut block = [0u32; 3];
    let (mut has_grid, mut has_block) = (false, false);
    for (index, arg) in spec.args.iter().enumerate() {
        let word = call.args.get(index).copied().unwrap_or(0);
        let out = || {
            spec.out_slot(index)
                .map(|slot| call.outs[slot])
                .unwrap_or(0)
        };
        match *arg {
            Arg::Num(field) => record.set_num(field, word),
            // The ABI leaves the bits above a narrow argument undefined: never read them.
            Arg::U32(field) => record.set_num(field, word & 0xffff_ffff),
            Arg::U16(field) => record.set_num(field, word & 0xffff),
            Arg::U8(field) => record.set_num(field, word & 0xff),
            Arg::Int(field) => record.set_num(field, u64::from(word as u32 as i32 as u32)),
            Arg::Ptr(field) => record.set_hex(field, word),
            Arg::Ptr32(field) => record.set_hex(field, word & 0xffff_ffff),
            Arg::OutPtr(field) => record.set_hex(field, out()),
            Arg::OutPtr32(field) => record.set_hex(field, out() & 0xffff_ffff),
            Arg::OutNum(field) => record.set_num(field, out()),
            Arg::OutInt(field) => record.set_num(field, out() & 0xffff_ffff),
            Arg::Str(field) => {
                let text = c_string(data);
                match field {
                    StrField::Symbol => record.symbol = Some(text),
                    StrField::Path => record.path = Some(text),
                }
            }
            Arg::Grid(axis) => {
                grid[usize::from(axis)] = word as u32;
                has_grid = true;
            }
            Arg::Block(axis) => {
                block[usize::from(axis)] = word as u32;
                has_block = true;
            }
            Arg::MemsetCount(width) => {
                record.count = Some(word);
                record.bytes = Some(word.saturating_mul(u64::from(width)));
            }
            Arg::LaunchConfig => {
                if decode_launch_config(&mut record, data).is_none() {
                    record.warnings.push(Cow::Borrowed("launch_config_unread"));
                }
            }
            Arg::Memcpy2D | Arg::Memcpy3D => {
                if decode_memcpy(&mut record, data, *arg == Arg::Memcpy3D).is_none() {
                    record.warnings.push(Cow::Borrowed("memcpy_struct_unread"));
                }
            }
            Arg::IpcHandleOut => {
                if data.len() == IPC_HANDLE_LEN as usize {
                    record.ipc_handle = Some(hex_bytes(data));
                } else {
                    record.warnings.push(Cow::Borrowed("ipc_handle_unread"));
                }
            }
            Arg::IpcHandleOnStack => {
                let words = call.args.get(index..index + STACK_ARGS).unwrap_or(&[]);
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                record.ipc_handle = Some(hex_bytes(&bytes));
            }
            Arg::Location => {
                record.location = Some(location_name(word as u32));
                record.location_id = Some((word >> 32) as u32 as i32);
            }
            Arg::Advice => {
                let advice = word as u32;
                record.advice = Some(advice);
                record.advice_name = advice_name(advice).map(Cow::Borrowed);
            }
            Arg::BatchSizes(count_index) => {
                let count = call
                    .args
                    .get(usize::from(count_index))
                    .copied()
                    .unwrap_or(0);
                match batch_bytes(data, count) {
                    Some(bytes) => record.bytes = Some(bytes),
                    None if count > BATCH_SIZES_READ => {
                        record.warnings.push(Cow::Borrowed("batch_sizes_cut"));
                    }
                    None => record.warnings.push(Cow::Borrowed("batch_sizes_unread")),
                }
            }
            Arg::GraphInstantiateParams => {
                if decode_instantiate_params(&mut record, data).is_none() {
                    record
                        .warnings
                        .push(Cow::Borrowed("instantiate_params_unread"));
                }
            }
            Arg::Datatype => match nccl::datatype(word as u32) {
                Some((name, size)) => {
                    record.datatype = Some(Cow::Borrowed(name));
                    record.datatype_size = Some(size);
                }
                None => record.datatype = Some(Cow::Owned(format!("type_{}", word as u32))),
            },
            Arg::RedOp => record.op = Some(Cow::Borrowed(nccl::red_op(word as u32))),
            Arg::UniqueIdOnStack => {
                let words = call.args.get(index..index + STACK_ARGS).unwrap_or(&[]);
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                record.unique_id = Some(hex_bytes(&bytes));
            }
            Arg::UniqueIdRef => {
                if data.len() == UNIQUE_ID_READ as usize {
                    record.unique_id = Some(hex_bytes(data));
                } else {
                    record.warnings.push(Cow::Borrowed("unique_id_unread"));
                }
            }
            Arg::CommArrayOut(count_index) => {
                let count = call
                    .args
                    .get(usize::from(count_index))
                    .map_or(0, |word| u64::from(*word as u32));
                let read = (data.len() / 8) as u64;
                if count > read {
                    record
                        .warnings
                        .push(Cow::Borrowed(if count > BATCH_SIZES_READ {
                            "comms_cut"
                        } else {
                            "comms_unread"
                        }));
                }
                record.comms = data
                    .chunks_exact(8)
                    .take(count as usize)
                    .map(|word| Hex(u64::from_le_bytes(word.try_into().unwrap_or_default())))
                    .collect();
            }
            Arg::Raw => record.args.push(Hex(word)),
            Arg::Skip => {}
        }
    }
    if let (Some(count), Some(size)) = (record.count, record.datatype_size)
        && record.bytes.is_none()
    {
        record.bytes = Some(count.saturating_mul(size));
    }
    if has_grid {
        record.grid = Some(grid);
    }
    if has_block {
        record.block = Some(block);
    }
    let flag_bits = call.header.flags;
    if flag_bits & flags::ENTRY_READ_FAILED != 0 {
        record.warnings.push(Cow::Borrowed("entry_read_failed"));
    }
    if flag_bits & flags::OUT_READ_FAILED != 0 {
        record.warnings.push(Cow::Borrowed("out_read_failed"));
    }
    if flag_bits & flags::DATA_TRUNCATED != 0 {
        record.warnings.push(Cow::Borrowed("string_truncated"));
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::lookup;
    use tracer_common::EventHeader;

    fn call(args: &[u64], outs: [u64; 2], ret: u32) -> CallEvent {
        let mut words = [0u64; 10];
        words[..args.len()].copy_from_slice(args);
        CallEvent {
            header: EventHeader {
                kind: 1,
                flags: 0,
                ts_ns: 1000,
                pid: 10,
                tid: 11,
            },
            probe_id: 0,
            ret,
            dur_ns: 250,
            args: words,
            outs,
        }
    }

    fn json(record: &CallLine) -> String {
        serde_json::to_string(record).unwrap()
    }

    #[test]
    fn mem_alloc_reports_bytes_and_the_returned_pointer() {
        let spec = lookup("cuMemAlloc_v2").unwrap();
        let record = decode_call(
            &call(&[0x7ffd_0000, 4096], [0x7f00_0010_0000, 0], 0),
            None,
            "cuMemAlloc_v2",
            spec,
        );
        assert_eq!(
            json(&record),
            r#"{"type":"call","name":"cuMemAlloc_v2","pid":10,"tid":11,"ts_ns":1000,"dur_ns":250,"ret":0,"bytes":4096,"dptr":"0x7f0000100000"}"#
        );
    }

    #[test]
    fn errors_carry_their_name() {
        let spec = lookup("cuMemAlloc_v2").unwrap();
        let record = decode_call(
            &call(&[0x7ffd_0000, 0], [0, 0], 1),
            None,
            "cuMemAlloc_v2",
            spec,
        );
        assert_eq!(record.ret_name.as_deref(), Some("CUDA_ERROR_INVALID_VALUE"));
    }

    #[test]
    fn launch_kernel_reads_all_eleven_arguments() {
        let spec = lookup("cuLaunchKernel").unwrap();
        let record = decode_call(
            &call(
                &[0x1030, 4096, 2, 1, 256, 1, 3, 1024, 0x1010, 0x7ffe],
                [0, 0],
                0,
            ),
            None,
            "cuLaunchKernel",
            spec,
        );
        assert_eq!(record.function, Some(Hex(0x1030)));
        assert_eq!(record.grid, Some([4096, 2, 1]));
        assert_eq!(record.block, Some([256, 1, 3]));
        assert_eq!(record.shared_mem, Some(1024));
        assert_eq!(record.stream, Some(Hex(0x1010)));
    }

    #[test]
    fn a_call_seen_at_entry_alone_has_no_result_nor_duration() {
        let spec = lookup("cuLaunchKernel").unwrap();
        // The entry program leaves 0 in `ret` and `dur_ns`; a stray value must not show.
        let mut event = call(
            &[0x1030, 64, 1, 1, 128, 1, 1, 0, 0x1010, 0x7ffe],
            [0, 0],
            400,
        );
        event.header.flags = flags::NO_RETURN;
        let record = decode_call(&event, None, "cuLaunchKernel", spec);
        assert_eq!(
            json(&record),
            r#"{"type":"call","name":"cuLaunchKernel","pid":10,"tid":11,"ts_ns":1000,"grid":[64,1,1],"block":[128,1,1],"shared_mem":0,"stream":"0x1010","function":"0x1030"}"#
        );
        event.header.flags = 0;
        let returned = decode_call(&event, None, "cuLaunchKernel", spec);
        assert_eq!(
            (returned.ret, returned.dur_ns, returned.ret_name.as_deref()),
            (Some(400), Some(250), Some("CUDA_ERROR_INVALID_HANDLE"))
        );
    }

    #[test]
    fn launch_kernel_ex_reads_its_config() {
        let spec = lookup("cuLaunchKernelEx").unwrap();
        let mut config = Vec::new();
        for value in [128u32, 64, 2, 32, 8, 4, 2048, 0] {
            config.extend_from_slice(&value.to_le_bytes());
        }
        config.extend_from_slice(&0x1010u64.to_le_bytes());
        config.extend_from_slice(&[0; 16]);
        let record = decode_call(
            &call(&[0x7ffc, 0x1030], [0, 0], 0),
            Some(&config),
            "cuLaunchKernelEx",
            spec,
        );
        assert_eq!(record.grid, Some([128, 64, 2]));
        assert_eq!(record.block, Some([32, 8, 4]));
        assert_eq!(record.shared_mem, Some(2048));
        assert_eq!(record.stream, Some(Hex(0x1010)));
        assert_eq!(record.function, Some(Hex(0x1030)));
        assert!(record.warnings.is_empty());
        let short = decode_call(
            &call(&[0, 0x1030], [0, 0], 0),
            Some(&[1, 2]),
            "cuLaunchKernelEx",
            spec,
        );
        assert_eq!(short.warnings, vec!["launch_config_unread"]);
    }

    #[test]
    fn memcpy2d_gives_direction_and_bytes() {
        let spec = lookup("cuMemcpy2D_v2").unwrap();
        let mut data = vec![0u8; 128];
        data[16..20].copy_from_slice(&1u32.to_le_bytes()); // src host
        data[24..32].copy_from_slice(&0x5555u64.to_le_bytes());
        data[72..76].copy_from_slice(&2u32.to_le_bytes()); // dst device
        data[88..96].copy_from_slice(&0x7f00_0010_0000u64.to_le_bytes());
        data[112..120].copy_from_slice(&256u64.to_le_bytes());
        data[120..128].copy_from_slice(&16u64.to_le_bytes());
        let record = decode_call(
            &call(&[0x7ffc], [0, 0], 0),
            Some(&data),
            "cuMemcpy2D_v2",
            spec,
        );
        assert_eq!(record.kind.as_deref(), Some("HtoD"));
        assert_eq!(record.src, Some(Hex(0x5555)));
        assert_eq!(record.dst, Some(Hex(0x7f00_0010_0000)));
        assert_eq!(record.bytes, Some(4096));
    }

    #[test]
    fn memset_bytes_scale_with_element_width() {
        let spec = lookup("cuMemsetD32_v2").unwrap();
        let record = decode_call(
            &call(&[0x7f00, 7, 100], [0, 0], 0),
            None,
            "cuMemsetD32_v2",
            spec,
        );
        assert_eq!(
            (record.count, record.bytes, record.value),
            (Some(100), Some(400), Some(7))
        );
    }

    #[test]
    fn names_and_truncation_are_reported() {
        let spec = lookup("cuModuleGetFunction").unwrap();
        let mut event = call(&[0x7ffc, 0x1020, 0x4000], [0x1030, 0], 0);
        event.header.flags = flags::DATA_TRUNCATED;
        let record = decode_call(&event, Some(b"_Z3foov\0"), "cuModuleGetFunction", spec);
        assert_eq!(record.symbol.as_deref(), Some("_Z3foov"));
        assert_eq!(record.function, Some(Hex(0x1030)));
        assert_eq!(record.module, Some(Hex(0x1020)));
        assert_eq!(record.warnings, vec!["string_truncated"]);
    }

    const DIRTY: u64 = 0xdead_beef_0000_0000;

    #[test]
    fn narrow_arguments_ignore_the_upper_bits_of_their_slot() {
        let spec = lookup("cuLaunchKernel").unwrap();
        let words = [
            0x1030,
            DIRTY | 4096,
            DIRTY | 2,
            DIRTY | 1,
            DIRTY | 256,
            DIRTY | 1,
            DIRTY | 3,
            DIRTY | 1024,
            0x1010,
            0x7ffe,
        ];
        let record = decode_call(&call(&words, [0, 0], 0), None, "cuLaunchKernel", spec);
        assert_eq!(
            (record.grid, record.block, record.shared_mem),
            (Some([4096, 2, 1]), Some([256, 1, 3]), Some(1024))
        );
        let spec = lookup("cuLibraryLoadData").unwrap();
        let words = [0x7ffc, 0x5000, 0, 0, DIRTY | 3, 0, 0, DIRTY | 2];
        let record = decode_call(
            &call(&words, [0x1040, 0], 0),
            None,
            "cuLibraryLoadData",
            spec,
        );
        assert_eq!(
            (record.count, record.library_option_count, record.flags),
            (Some(3), Some(2), None)
        );
        let spec = lookup("cuMemsetD8_v2").unwrap();
        let words = [0x7f00, 0xdead_beef_cafe_baab, 16];
        let record = decode_call(&call(&words, [0, 0], 0), None, "cuMemsetD8_v2", spec);
        assert_eq!(record.value, Some(0xab));
        let spec = lookup("cuStreamCreateWithPriority").unwrap();
        let words = [0x7ffc, DIRTY | 1, DIRTY | u64::from(-3i32 as u32)];
        let record = decode_call(&call(&words, [0x1000, 0], 0), None, "x", spec);
        assert_eq!((record.flags, record.priority), (Some(1), Some(-3)));
    }

    #[test]
    fn ipc_locations_batches_and_graphs_are_decoded() {
        // The handle passed by value sits in the stack words (args 6..10).
        let spec = lookup("cuIpcOpenMemHandle_v2").unwrap();
        let words = [
            0x7ffc,
            1,
            0,
            0,
            0,
            0,
            0x0807_0605_0403_0201,
            0x1817_1615_1413_1211,
            0,
            u64::MAX,
        ];
        let record = decode_call(&call(&words, [0x7e00_0000_0000, 0], 0), None, "x", spec);
        assert_eq!(
            record.ipc_handle.as_deref(),
            Some("01020304050607081112131415161718".to_owned() + &"00".repeat(8) + &"ff".repeat(8))
                .as_deref()
        );
        assert_eq!(
            (record.dptr, record.flags),
            (Some(Hex(0x7e00_0000_0000)), Some(1))
        );

        let spec = lookup("cuIpcGetMemHandle").unwrap();
        let record = decode_call(
            &call(&[0x7ffc, 0x7f00], [0, 0], 0),
            Some(&[0xab; 64]),
            "x",
            spec,
        );
        assert_eq!(record.ipc_handle, Some("ab".repeat(64)));
        let short = decode_call(&call(&[0x7ffc, 0x7f00], [0, 0], 0), Some(&[]), "x", spec);
        assert_eq!(short.warnings, ["ipc_handle_unread"]);

        // CUmemLocation {type 3, id 7} in one register.
        let spec = lookup("cuMemAdvise_v2").unwrap();
        let words = [0x7f00, 4096, DIRTY_ADVICE | 3, (7 << 32) | 3];
        let record = decode_call(&call(&words, [0, 0], 0), None, "x", spec);
        assert_eq!(
            (
                record.advice,
                record.advice_name.as_deref(),
                record.location.as_deref(),
                record.location_id
            ),
            (
                Some(3),
                Some("CU_MEM_ADVISE_SET_PREFERRED_LOCATION"),
                Some("host_numa"),
                Some(7)
            )
        );

        let spec = lookup("cuMemcpyBatchAsync_v2").unwrap();
        let sizes: Vec<u8> = [4096u64, 512, 100]
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect();
        let words = [0x1, 0x2, 0x3, 3, 0, 0, 0, 0x1010];
        let record = decode_call(&call(&words, [0, 0], 0), Some(&sizes), "x", spec);
        assert_eq!(
            (
                record.bytes,
                record.count,
                record.stream,
                record.kind.as_deref()
            ),
            (Some(4708), Some(3), Some(Hex(0x1010)), Some("Default"))
        );
        let words = [0x1, 0x2, 0x3, 40, 0, 0, 0, 0x1010];
        let record = decode_call(&call(&words, [0, 0], 0), Some(&[0; 256]), "x", spec);
        assert_eq!(record.bytes, None);
        assert_eq!(record.warnings, ["batch_sizes_cut"]);

        let spec = lookup("cuGraphExecUpdate_v2").unwrap();
        let record = decode_call(
            &call(&[0x1020, 0x5000, 0x7ffc], [1, 0], 910),
            None,
            "x",
            spec,
        );
        assert_eq!(
            (record.graph, record.source_graph, record.graph_result),
            (Some(Hex(0x1020)), Some(Hex(0x5000)), Some(1))
        );
    }

    const DIRTY_ADVICE: u64 = 0xffff_ffff_0000_0000;

    #[test]
    fn functions_outside_the_catalog_keep_their_raw_registers() {
        let words = [1, 2, 3, 0xdead_beef_0000_0004, 5, 6, 7, 8];
        let record = decode_call(
            &call(&words, [0, 0], 0),
            None,
            "cuCtxGetDevice",
            &crate::catalog::GENERIC,
        );
        assert_eq!(
            json(&record),
            r#"{"type":"call","name":"cuCtxGetDevice","pid":10,"tid":11,"ts_ns":1000,"dur_ns":250,"ret":0,"args":["0x1","0x2","0x3","0xdeadbeef00000004","0x5","0x6"]}"#
        );
    }

    #[test]
    fn hex_round_trips_through_json() {
        let text = serde_json::to_string(&Hex(0xdead_beef)).unwrap();
        assert_eq!(text, r#""0xdeadbeef""#);
        assert_eq!(
            serde_json::from_str::<Hex>(&text).unwrap(),
            Hex(0xdead_beef)
        );
    }
}
