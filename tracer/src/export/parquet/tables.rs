//! Every table: those other than `calls` declared here, each once (its file's name and its
//! columns in order, with their kinds: `columns.rs`), and [`Tables`], the set an export
//! writes, listed once (`every_table!`). docs/trace-format.md describes each column; a test
//! checks that it names every one with its type.

use std::fs::File;

use parquet::errors::ParquetError;

use super::{
    calls::Calls,
    link::Link,
    table::{Table, TableDef, table},
    writer::{Encoder, Running},
};

table! {
    /// `gpu_kernel` lines: each kernel that ran on a GPU (`--gpu`). Like `gpu_copies` and
    /// `gpu_memsets`, it ends with the link to the issuing call (`link.rs`).
    kernels "kernels" {
        pid: I32,
        device: I32,
        context: I64,
        stream: I64,
        ts_ns: I64,
        dur_ns: I64,
        kernel: Str,
        kernel_mangled: Opt<Str>,
        grid: Dim3,
        block: Dim3,
        static_shared_mem: I64,
        dynamic_shared_mem: I64,
        registers_per_thread: I32,
        link: Link,
    }
}

table! {
    /// `gpu_copy` lines: each copy that ran on a GPU (`--gpu`).
    gpu_copies "gpu_copies" {
        pid: I32,
        device: I32,
        context: I64,
        stream: I64,
        ts_ns: I64,
        dur_ns: I64,
        kind: Str,
        bytes: I64,
        src_kind: Str,
        dst_kind: Str,
        is_async: Bool,
        link: Link,
    }
}

table! {
    /// `gpu_memset` lines: each memset that ran on a GPU (`--gpu`).
    gpu_memsets "gpu_memsets" {
        pid: I32,
        device: I32,
        context: I64,
        stream: I64,
        ts_ns: I64,
        dur_ns: I64,
        bytes: I64,
        value: I64,
        memory: Str,
        is_async: Bool,
        link: Link,
    }
}

table! {
    /// `gpu_gap` lines (`--gpu`): while another CUPTI client of a process held GPU
    /// recording, from `from_ns` to `to_ns` (absent: to the process's end), the launches,
    /// copies and memsets made then (`calls`), and those whose work the other client's
    /// buffers gave back (`handed_over`).
    gpu_gaps "gpu_gaps" {
        pid: I32,
        tid: I32,
        from_ns: I64,
        to_ns: Opt<I64>,
        calls: I64,
        handed_over: I64,
    }
}

table! {
    /// Copy calls (the `calls` rows of copy functions), with what a copy has.
    copies "copies" {
        pid: I32,
        tid: I32,
        ts_ns: I64,
        dur_ns: Opt<I64>,
        name: Str,
        ok: Bool,
        ret: Opt<I64>,
        ret_name: Opt<Str>,
        kind: Str,
        bytes: Opt<I64>,
        src: Opt<I64>,
        dst: Opt<I64>,
        stream: Opt<I64>,
        device: Opt<I32>,
        count: Opt<I64>,
    }
}

table! {
    /// Memset calls (the `calls` rows of memset functions), with what a memset has.
    memsets "memsets" {
        pid: I32,
        tid: I32,
        ts_ns: I64,
        dur_ns: Opt<I64>,
        name: Str,
        ok: Bool,
        ret: Opt<I64>,
        ret_name: Opt<Str>,
        dptr: Opt<I64>,
        bytes: Opt<I64>,
        value: Opt<I64>,
        stream: Opt<I64>,
        device: Opt<I32>,
    }
}

table! {
    /// NCCL collective calls, one per collective the program asked for (`collectives.rs`).
    collectives "collectives" {
        pid: I32,
        tid: I32,
        ts_ns: I64,
        dur_ns: Opt<I64>,
        name: Str,
        op: Str,
        inner_name: Opt<Str>,
        ok: Bool,
        ret: Opt<I64>,
        ret_name: Opt<Str>,
        comm: Opt<I64>,
        comm_id: Str,
        unique_id: Opt<Text>,
        comm_rank: Opt<I32>,
        comm_nranks: Opt<I32>,
        comm_seq: Opt<I64>,
        group: Opt<I64>,
        count: Opt<I64>,
        datatype: Opt<Str>,
        bytes: Opt<I64>,
        reduction: Opt<Str>,
        root: Opt<I32>,
        peer: Opt<I32>,
        stream: Opt<I64>,
        gpu_kernels: Opt<I64>,
        gpu_start_ns: Opt<I64>,
        gpu_end_ns: Opt<I64>,
        gpu_ns: Opt<I64>,
        wall_offset_ns: Opt<I64>,
    }
}

table! {
    /// `power` lines: NVML samples (`--power`).
    power "power" {
        device: I32,
        gpu_name: Opt<Str>,
        uuid: Opt<Str>,
        seq: I64,
        ts_ns: I64,
        read_ns: I64,
        power_mw: Opt<I64>,
        power_instant_mw: Opt<I64>,
        energy_mj: Opt<I64>,
        sm_clock_mhz: Opt<I32>,
        mem_clock_mhz: Opt<I32>,
        gpu_util_pct: Opt<I32>,
        mem_util_pct: Opt<I32>,
        temperature_c: Opt<I32>,
        memory_used_bytes: Opt<I64>,
        errors: Opt<Words>,
    }
}

table! {
    /// `process` lines: fork, exec and exit of traced processes.
    processes "processes" {
        event: Str,
        pid: I32,
        tid: I32,
        ts_ns: I64,
        child_pid: Opt<I32>,
        comm: Opt<Str>,
        filename: Opt<Text>,
    }
}

table! {
    /// `library` lines: each library file probed.
    libraries "libraries" {
        id: I64,
        set: Str,
        path: Text,
        file_device: I64,
        inode: I64,
        version: Opt<Str>,
        standin: Bool,
        found: Str,
        pid: Opt<I32>,
        ts_ns: Opt<I64>,
        probes: I64,
    }
}

table! {
    /// `stack` lines (`--stacks`): each Python stack, one row per frame, innermost (`frame`
    /// 0) first; a call's `stack` column names its `stack`.
    stacks "stacks" {
        stack: I64,
        frame: I32,
        file: Str,
        qualname: Str,
        line: Opt<I32>,
        first_line: I32,
        cut: Bool,
    }
}

table! {
    /// One row per trace: its header and footer.
    traces "traces" {
        file: Text,
        format_version: I32,
        cudatrace_version: Opt<Str>,
        mode: Opt<Str>,
        command: Opt<Words>,
        pids: Opt<Numbers>,
        start_wall: Opt<Text>,
        start_wall_ns: Opt<I64>,
        start_monotonic_ns: Opt<I64>,
        wall_offset_ns: Opt<I64>,
        gpu: Bool,
        power: Bool,
        complete: Bool,
        exit_code: Opt<I32>,
        lost: Opt<I64>,
        lines: I64,
        skipped_lines: I64,
    }
}

/// [`Tables`], [`TABLE_NAMES`] and the opening and closing of every table, from one list.
macro_rules! every_table {
    ($($table:ident: $def:ty,)*) => {
        /// Every table, and the thread that encodes them into their files.
        pub struct Tables {
            $(pub $table: Table<$def>,)*
            encoder: Running,
        }

        /// The tables' file names, in the order [`Tables::open`] takes their files.
        pub const TABLE_NAMES: &[&str] = &[$(<$def as TableDef>::NAME,)*];

        impl Tables {
            /// Every table's writer on its file (`files` in [`TABLE_NAMES`]' order), and
            /// the encoder thread started.
            pub fn open(files: Vec<File>) -> Result<Tables, ParquetError> {
                let encoder = Encoder::new();
                let mut files = files.into_iter();
                let mut writers = Vec::with_capacity(TABLES);
                $(
                    let file = files.next().expect("a file per table");
                    let ($table, writer) = Table::<$def>::new(file, encoder.sink(writers.len()))?;
                    writers.push(writer);
                )*
                Ok(Tables {
                    $($table,)*
                    encoder: encoder.start(writers),
                })
            }

            /// Writes what is left and every file's footer; the rows of each table.
            pub fn close(self) -> Result<[u64; TABLES], ParquetError> {
                let rows = [$(self.$table.close(),)*];
                // Every sink is gone: the encoder closes the files and ends.
                self.encoder.finish()?;
                let mut written = [0; TABLES];
                for (count, rows) in written.iter_mut().zip(rows) {
                    *count = rows?;
                }
                Ok(written)
            }
        }

        /// Each table's name and columns, in [`TABLE_NAMES`]' order.
        #[cfg(test)]
        pub fn schemas() -> Vec<(&'static str, arrow_schema::SchemaRef)> {
            vec![$((<$def as TableDef>::NAME, super::table::schema::<$def>()),)*]
        }
    };
}

every_table! {
    calls: Calls,
    kernels: kernels::Def,
    gpu_copies: gpu_copies::Def,
    gpu_memsets: gpu_memsets::Def,
    gpu_gaps: gpu_gaps::Def,
    copies: copies::Def,
    memsets: memsets::Def,
    collectives: collectives::Def,
    power: power::Def,
    processes: processes::Def,
    libraries: libraries::Def,
    stacks: stacks::Def,
    traces: traces::Def,
}

/// How many tables an export writes.
pub const TABLES: usize = TABLE_NAMES.len();
