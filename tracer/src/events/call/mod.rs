//! Decoding a call event: its arguments named through the probe catalog, into a
//! [`CallLine`].
//!
//! | file | |
//! |---|---|
//! | `mod.rs` | [`decode_call_of`]: each catalog argument into its field |
//! | `fields.rs` | a catalog `Field` set on the line as its type takes it (from the schema's table) |
//! | `structs.rs` | structs the call points to: memcpy 2D/3D, launch config, instantiate params |
//! | `enums.rs` | names of CUDA enum values passed by value |

mod enums;
mod fields;
mod structs;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use tracer_common::{CallEvent, STACK_ARGS, flags};

use super::raw::c_string;
#[cfg(test)]
use crate::catalog::cuda_result;
use crate::{
    catalog::{
        Arg, BATCH_SIZES_READ, FnSpec, IPC_HANDLE_BY_VALUE_READ, IPC_HANDLE_LEN, StrField,
        UNIQUE_ID_READ, nccl,
    },
    schema::{CallLine, Hex},
};

use self::{
    enums::{advice_name, location_name},
    structs::{
        batch_bytes, decode_instantiate_params, decode_launch_config, decode_memcpy, hex_bytes,
    },
};

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
            Arg::Num(field) => record.set(field, word),
            // The ABI leaves the bits above a narrow argument undefined: never read them.
            Arg::U32(field) => record.set(field, word & 0xffff_ffff),
            Arg::U16(field) => record.set(field, word & 0xffff),
            Arg::U8(field) => record.set(field, word & 0xff),
            Arg::Int(field) => record.set(field, u64::from(word as u32 as i32 as u32)),
            Arg::Ptr(field) => record.set(field, word),
            Arg::Ptr32(field) => record.set(field, word & 0xffff_ffff),
            Arg::OutPtr(field) => record.set(field, out()),
            Arg::OutPtr32(field) => record.set(field, out() & 0xffff_ffff),
            Arg::OutNum(field) => record.set(field, out()),
            Arg::OutInt(field) => record.set(field, out() & 0xffff_ffff),
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
            Arg::IpcHandleByRef => {
                if data.len() == IPC_HANDLE_BY_VALUE_READ as usize {
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
