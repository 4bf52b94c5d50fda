//! CUPTI activity records to [`GpuRecord`]s: pure functions, field by field.

use std::ffi::c_char;
use std::ptr::addr_of;

use tracer_common::{GpuRecord, gpu_flags, gpu_record};

use crate::cupti::{
    ActivityApi, ActivityKernel10, ActivityMemcpy6, ActivityMemset4, FLAG_ASYNC, activity_kind,
};

/// A converted record; a kernel still needs its name turned into a name id.
#[derive(Debug, PartialEq, Eq)]
pub enum Converted {
    Record(GpuRecord),
    Kernel {
        record: GpuRecord,
        name: *const c_char,
    },
    /// A kind this library did not enable: skipped.
    Other(u32),
}

/// Reads one field of a record that may be unaligned.
macro_rules! field {
    ($record:expr, $field:ident) => {
        addr_of!((*$record).$field).read_unaligned()
    };
}

/// Converts the record at `activity`. `clock_flags` is [`gpu_flags::CUPTI_CLOCK`] when
/// CUPTI stamps records with its own clock, else 0.
///
/// # Safety
/// `activity` points at a complete CUPTI activity record, as `cuptiActivityGetNextRecord`
/// returns them.
pub unsafe fn convert(activity: *const u8, clock_flags: u32) -> Converted {
    // SAFETY: every record starts with its kind; the caller guarantees the rest.
    unsafe {
        let kind = activity.cast::<u32>().read_unaligned();
        match kind {
            activity_kind::CONCURRENT_KERNEL => {
                let (record, name) = kernel(activity.cast(), clock_flags);
                Converted::Kernel { record, name }
            }
            activity_kind::MEMCPY => Converted::Record(memcpy(activity.cast(), clock_flags)),
            activity_kind::MEMSET => Converted::Record(memset(activity.cast(), clock_flags)),
            activity_kind::DRIVER => Converted::Record(api(activity.cast(), clock_flags)),
            other => Converted::Other(other),
        }
    }
}

fn timing_flags(start: u64, end: u64, clock_flags: u32) -> u32 {
    if start == 0 && end == 0 {
        clock_flags | gpu_flags::NO_TIMESTAMPS
    } else {
        clock_flags
    }
}

/// Grid, block and shared-memory sizes are `int32_t` in CUPTI and never negative.
fn unsigned(value: i32) -> u32 {
    value.max(0) as u32
}

unsafe fn kernel(k: *const ActivityKernel10, clock_flags: u32) -> (GpuRecord, *const c_char) {
    // SAFETY: fields within CUPTI 12's Kernel9 prefix of a kernel record.
    unsafe {
        let start = field!(k, start);
        let end = field!(k, end);
        let record = GpuRecord {
            what: gpu_record::KERNEL,
            flags: timing_flags(start, end, clock_flags),
            start,
            end,
            correlation_id: field!(k, correlation_id),
            device_id: field!(k, device_id),
            context_id: field!(k, context_id),
            stream_id: field!(k, stream_id),
            grid: [
                unsigned(field!(k, grid_x)),
                unsigned(field!(k, grid_y)),
                unsigned(field!(k, grid_z)),
            ],
            block: [
                unsigned(field!(k, block_x)),
                unsigned(field!(k, block_y)),
                unsigned(field!(k, block_z)),
            ],
            static_shared_mem: unsigned(field!(k, static_shared_memory)),
            dynamic_shared_mem: unsigned(field!(k, dynamic_shared_memory)),
            registers_per_thread: u32::from(field!(k, registers_per_thread)),
            graph_id: field!(k, graph_id),
            graph_node_id: field!(k, graph_node_id),
            ..GpuRecord::default()
        };
        (record, field!(k, name))
    }
}

unsafe fn memcpy(m: *const ActivityMemcpy6, clock_flags: u32) -> GpuRecord {
    // SAFETY: fields within CUPTI 12's Memcpy5 prefix of a memcpy record; copyCount is
    // Memcpy6's own and is not read.
    unsafe {
        let start = field!(m, start);
        let end = field!(m, end);
        let mut flags = timing_flags(start, end, clock_flags);
        if u32::from(field!(m, flags)) & FLAG_ASYNC != 0 {
            flags |= gpu_flags::ASYNC;
        }
        GpuRecord {
            what: gpu_record::MEMCPY,
            flags,
            start,
            end,
            correlation_id: field!(m, correlation_id),
            device_id: field!(m, device_id),
            context_id: field!(m, context_id),
            stream_id: field!(m, stream_id),
            bytes: field!(m, bytes),
            copy_kind: u32::from(field!(m, copy_kind)),
            src_kind: u32::from(field!(m, src_kind)),
            dst_kind: u32::from(field!(m, dst_kind)),
            graph_id: field!(m, graph_id),
            graph_node_id: field!(m, graph_node_id),
            copy_count: 1,
            ..GpuRecord::default()
        }
    }
}

unsafe fn memset(m: *const ActivityMemset4, clock_flags: u32) -> GpuRecord {
    // SAFETY: Memset4 is the memset record of CUPTI 12 and 13.
    unsafe {
        let start = field!(m, start);
        let end = field!(m, end);
        let mut flags = timing_flags(start, end, clock_flags);
        if u32::from(field!(m, flags)) & FLAG_ASYNC != 0 {
            flags |= gpu_flags::ASYNC;
        }
        GpuRecord {
            what: gpu_record::MEMSET,
            flags,
            start,
            end,
            correlation_id: field!(m, correlation_id),
            device_id: field!(m, device_id),
            context_id: field!(m, context_id),
            stream_id: field!(m, stream_id),
            bytes: field!(m, bytes),
            src_kind: u32::from(field!(m, memory_kind)),
            memset_value: field!(m, value),
            graph_id: field!(m, graph_id),
            graph_node_id: field!(m, graph_node_id),
            ..GpuRecord::default()
        }
    }
}

/// An API record (DRIVER or RUNTIME kind) as a [`GpuRecord`].
///
/// # Safety
/// `a` points at a complete `CUpti_ActivityAPI`.
pub unsafe fn api_record(a: *const u8, clock_flags: u32) -> GpuRecord {
    // SAFETY: the caller's promise.
    unsafe { api(a.cast(), clock_flags) }
}

unsafe fn api(a: *const ActivityApi, clock_flags: u32) -> GpuRecord {
    // SAFETY: the API record has been the same since CUPTI 4.
    unsafe {
        let start = field!(a, start);
        let end = field!(a, end);
        GpuRecord {
            what: gpu_record::API,
            flags: timing_flags(start, end, clock_flags),
            start,
            end,
            correlation_id: field!(a, correlation_id),
            cbid: field!(a, cbid),
            result: field!(a, return_value),
            pid: field!(a, process_id),
            tid: field!(a, thread_id),
            ..GpuRecord::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::MaybeUninit;

    /// A zeroed record of type T, as CUPTI would lay it out.
    fn zeroed<T>() -> T {
        unsafe { MaybeUninit::<T>::zeroed().assume_init() }
    }

    fn bytes_of<T>(record: &T) -> *const u8 {
        (record as *const T).cast()
    }

    #[test]
    fn a_kernel_keeps_every_field() {
        let name = c"_Z10vector_addPKfS0_Pfi";
        let mut k: ActivityKernel10 = zeroed();
        k.kind = activity_kind::CONCURRENT_KERNEL;
        k.registers_per_thread = 40;
        k.start = 1_000_500;
        k.end = 1_008_692;
        k.device_id = 3;
        k.context_id = 1;
        k.stream_id = 4112;
        (k.grid_x, k.grid_y, k.grid_z) = (4096, 2, 1);
        (k.block_x, k.block_y, k.block_z) = (256, 1, 3);
        k.static_shared_memory = 512;
        k.dynamic_shared_memory = 1024;
        k.correlation_id = 17;
        k.name = name.as_ptr();
        k.graph_id = 9;
        k.graph_node_id = 1 << 40;
        k.local_memory_total_v2 = u64::MAX; // CUPTI 13 only: never read
        let converted = unsafe { convert(bytes_of(&k), 0) };
        let expected = GpuRecord {
            what: gpu_record::KERNEL,
            flags: 0,
            start: 1_000_500,
            end: 1_008_692,
            correlation_id: 17,
            device_id: 3,
            context_id: 1,
            stream_id: 4112,
            grid: [4096, 2, 1],
            block: [256, 1, 3],
            static_shared_mem: 512,
            dynamic_shared_mem: 1024,
            registers_per_thread: 40,
            graph_id: 9,
            graph_node_id: 1 << 40,
            ..GpuRecord::default()
        };
        assert_eq!(
            converted,
            Converted::Kernel {
                record: expected,
                name: name.as_ptr()
            }
        );
    }

    #[test]
    fn copies_and_memsets_keep_kind_bytes_and_flags() {
        let mut m: ActivityMemcpy6 = zeroed();
        m.kind = activity_kind::MEMCPY;
        m.copy_kind = 2; // DtoH
        m.src_kind = 3; // device
        m.dst_kind = 1; // pageable
        m.flags = FLAG_ASYNC as u8;
        m.bytes = 65536;
        m.start = 10;
        m.end = 65546;
        m.device_id = 0;
        m.context_id = 1;
        m.stream_id = 7;
        m.correlation_id = 5;
        m.graph_node_id = 12;
        m.copy_count = 99; // Memcpy6 only: never read
        let Converted::Record(copy) = (unsafe { convert(bytes_of(&m), gpu_flags::CUPTI_CLOCK) })
        else {
            panic!("not a record")
        };
        assert_eq!(
            copy,
            GpuRecord {
                what: gpu_record::MEMCPY,
                flags: gpu_flags::CUPTI_CLOCK | gpu_flags::ASYNC,
                start: 10,
                end: 65546,
                correlation_id: 5,
                context_id: 1,
                stream_id: 7,
                bytes: 65536,
                copy_kind: 2,
                src_kind: 3,
                dst_kind: 1,
                graph_node_id: 12,
                copy_count: 1,
                ..GpuRecord::default()
            }
        );

        let mut s: ActivityMemset4 = zeroed();
        s.kind = activity_kind::MEMSET;
        s.value = 0xab;
        s.bytes = 777;
        s.correlation_id = 6;
        s.memory_kind = 3;
        s.stream_id = 7;
        let Converted::Record(memset) = (unsafe { convert(bytes_of(&s), 0) }) else {
            panic!("not a record")
        };
        assert_eq!(
            memset,
            GpuRecord {
                what: gpu_record::MEMSET,
                flags: gpu_flags::NO_TIMESTAMPS,
                correlation_id: 6,
                stream_id: 7,
                bytes: 777,
                src_kind: 3,
                memset_value: 0xab,
                ..GpuRecord::default()
            }
        );
    }

    #[test]
    fn api_records_keep_the_call_and_its_thread() {
        let mut a: ActivityApi = zeroed();
        a.kind = activity_kind::DRIVER;
        a.cbid = 307;
        a.start = 100;
        a.end = 250;
        a.process_id = 4242;
        a.thread_id = 4243;
        a.correlation_id = 17;
        a.return_value = 0;
        let Converted::Record(api) = (unsafe { convert(bytes_of(&a), 0) }) else {
            panic!("not a record")
        };
        assert_eq!(
            api,
            GpuRecord {
                what: gpu_record::API,
                start: 100,
                end: 250,
                correlation_id: 17,
                cbid: 307,
                pid: 4242,
                tid: 4243,
                ..GpuRecord::default()
            }
        );
    }

    #[test]
    fn other_kinds_are_skipped_and_negative_sizes_clamp() {
        let other = 47u32;
        assert_eq!(
            unsafe { convert(bytes_of(&other), 0) },
            Converted::Other(47)
        );
        assert_eq!(unsigned(-1), 0);
        assert_eq!(unsigned(i32::MAX), i32::MAX as u32);
    }
}
