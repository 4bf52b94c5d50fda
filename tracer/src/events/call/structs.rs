//! Structs a call passes by pointer, read from the bytes the probe copied: CUDA_MEMCPY2D/3D,
//! CUlaunchConfig, CUDA_GRAPH_INSTANTIATE_PARAMS, copy-batch sizes; byte handles as hex.

use std::borrow::Cow;

use crate::{
    catalog::{BATCH_SIZES_READ, CopyKind},
    schema::{CallLine, Hex},
};

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
pub(super) fn decode_memcpy(record: &mut CallLine, data: &[u8], three_d: bool) -> Option<()> {
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
pub(super) fn decode_launch_config(record: &mut CallLine, data: &[u8]) -> Option<()> {
    let dim = |i: usize| u32_at(data, i * 4);
    record.grid = Some([dim(0)?, dim(1)?, dim(2)?]);
    record.block = Some([dim(3)?, dim(4)?, dim(5)?]);
    record.shared_mem = Some(u64::from(dim(6)?));
    record.stream = Some(Hex(u64_at(data, 32)?));
    Some(())
}

/// CUDA_GRAPH_INSTANTIATE_PARAMS: flags at 0, hUploadStream at 8, result_out at 24.
pub(super) fn decode_instantiate_params(record: &mut CallLine, data: &[u8]) -> Option<()> {
    record.flags = Some(u64_at(data, 0)?);
    record.stream = Some(Hex(u64_at(data, 8)?));
    record.graph_result = Some(u32_at(data, 24)?);
    Some(())
}

/// The sizes of a copy batch, added up; `None` when some were not read.
pub(super) fn batch_bytes(data: &[u8], count: u64) -> Option<u64> {
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
pub(super) fn hex_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
