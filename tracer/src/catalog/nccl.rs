//! The libnccl catalog: the NCCL functions cudatrace probes, and how to read their
//! arguments. Adding a function is adding a row.
//!
//! Signatures follow nccl.h (NCCL 2.28), in x86-64 SysV order. NCCL exports every API
//! function twice, `ncclX` and its profiling alias `pncclX`, at one address: each row lists
//! both, the plan attaches the first it finds and lists the other as an alias. Every
//! `int` and enum parameter is read with `Int`, never `Num` (the upper half of a 32-bit
//! argument's slot is undefined). `ncclCommInitRank*` take the 128-byte `ncclUniqueId` by
//! value: it goes on the stack and takes no register, so `rank` arrives in the third
//! register.
//!
//! What `count` means follows NCCL: elements per rank for all-reduce, broadcast, reduce,
//! send and receive; for all-gather the elements each rank sends (`sendcount`, the result
//! is `nranks` times that), for reduce-scatter the elements each rank receives
//! (`recvcount`), for all-to-all, gather and scatter the elements exchanged with each rank.
//! `bytes` is always `count` times the element size; the summary's bus bandwidth scales
//! it as nccl-tests do (docs/nccl.md).

use super::spec::{
    Arg::{self, *},
    Family,
    Field::*,
    FnSpec, by_abi,
};

const fn f(symbols: &'static [&'static str], family: Family, args: &'static [Arg]) -> FnSpec {
    FnSpec {
        symbols,
        family,
        args,
        copy: None,
        role: family.role(),
    }
}

const fn collective(symbols: &'static [&'static str], args: &'static [Arg]) -> FnSpec {
    f(symbols, Family::Collective, args)
}

const fn communicator(symbols: &'static [&'static str], args: &'static [Arg]) -> FnSpec {
    f(symbols, Family::Communicator, args)
}

/// `ncclCommInitRank(comm*, nranks, ncclUniqueId id, rank, ...)`'s arguments, by ABI: the
/// 128-byte id by value goes on the stack and takes no register on x86-64; arm64 passes a
/// pointer to a copy in its register.
const INIT_RANK_ARGS: &[Arg] = by_abi(
    &[
        OutPtr(Comm),
        Int(Nranks),
        Int(Rank),
        Skip,
        Skip,
        Skip,
        UniqueIdOnStack,
    ],
    INIT_RANK_AAPCS64,
);
const INIT_RANK_AAPCS64: &[Arg] = &[OutPtr(Comm), Int(Nranks), UniqueIdRef, Int(Rank)];

pub static NCCL_CATALOG: &[FnSpec] = &[
    // ncclCommInitRank(comm*, nranks, ncclUniqueId id, rank): id on the stack (x86-64),
    // a pointer to a copy in the third register (arm64).
    communicator(&["ncclCommInitRank", "pncclCommInitRank"], INIT_RANK_ARGS),
    // ncclCommInitRankConfig(comm*, nranks, ncclUniqueId id, rank, config*).
    communicator(
        &["ncclCommInitRankConfig", "pncclCommInitRankConfig"],
        INIT_RANK_ARGS,
    ),
    // ncclCommInitRankScalable(comm*, nranks, myrank, nId, ncclUniqueId *ids, config*).
    communicator(
        &["ncclCommInitRankScalable", "pncclCommInitRankScalable"],
        &[
            OutPtr(Comm),
            Int(Nranks),
            Int(Rank),
            Skip,
            UniqueIdRef,
            Skip,
        ],
    ),
    // ncclCommInitAll(comm *comms, ndev, const int *devlist): comms[i] is rank i of ndev.
    communicator(
        &["ncclCommInitAll", "pncclCommInitAll"],
        &[CommArrayOut(1), Int(Nranks), Skip],
    ),
    // ncclCommSplit(comm, color, key, comm *newcomm, config*).
    communicator(
        &["ncclCommSplit", "pncclCommSplit"],
        &[Ptr(Comm), Int(Color), Int(Key), OutPtr(NewComm), Skip],
    ),
    // ncclCommShrink(comm, int *exclude, excludeCount, comm *newcomm, config*, flags).
    communicator(
        &["ncclCommShrink", "pncclCommShrink"],
        &[
            Ptr(Comm),
            Skip,
            Int(Count),
            OutPtr(NewComm),
            Skip,
            Int(Flags),
        ],
    ),
    communicator(&["ncclCommFinalize", "pncclCommFinalize"], &[Ptr(Comm)]),
    communicator(&["ncclCommDestroy", "pncclCommDestroy"], &[Ptr(Comm)]),
    communicator(&["ncclCommAbort", "pncclCommAbort"], &[Ptr(Comm)]),
    communicator(
        &["ncclCommCount", "pncclCommCount"],
        &[Ptr(Comm), OutInt(Nranks)],
    ),
    communicator(
        &["ncclCommUserRank", "pncclCommUserRank"],
        &[Ptr(Comm), OutInt(Rank)],
    ),
    communicator(
        &["ncclCommCuDevice", "pncclCommCuDevice"],
        &[Ptr(Comm), OutInt(Device)],
    ),
    communicator(&["ncclGetVersion", "pncclGetVersion"], &[OutInt(Version)]),
    f(
        &["ncclMemAlloc", "pncclMemAlloc"],
        Family::Memory,
        &[OutPtr(Dptr), Num(Bytes)],
    ),
    f(
        &["ncclMemFree", "pncclMemFree"],
        Family::Memory,
        &[Ptr(Dptr)],
    ),
    // ncclAllReduce(send, recv, count, datatype, op, comm, stream): stream on the stack.
    collective(
        &["ncclAllReduce", "pncclAllReduce"],
        &[
            Ptr(Src),
            Ptr(Dst),
            Num(Count),
            Datatype,
            RedOp,
            Ptr(Comm),
            Ptr(Stream),
        ],
    ),
    // ncclBroadcast(send, recv, count, datatype, root, comm, stream).
    collective(
        &["ncclBroadcast", "pncclBroadcast"],
        &[
            Ptr(Src),
            Ptr(Dst),
            Num(Count),
            Datatype,
            Int(Root),
            Ptr(Comm),
            Ptr(Stream),
        ],
    ),
    // ncclBcast(buff, count, datatype, root, comm, stream): in place.
    collective(
        &["ncclBcast", "pncclBcast"],
        &[
            Ptr(Dst),
            Num(Count),
            Datatype,
            Int(Root),
            Ptr(Comm),
            Ptr(Stream),
        ],
    ),
    // ncclReduce(send, recv, count, datatype, op, root, comm, stream).
    collective(
        &["ncclReduce", "pncclReduce"],
        &[
            Ptr(Src),
            Ptr(Dst),
            Num(Count),
            Datatype,
            RedOp,
            Int(Root),
            Ptr(Comm),
            Ptr(Stream),
        ],
    ),
    // ncclAllGather(send, recv, sendcount, datatype, comm, stream).
    collective(
        &["ncclAllGather", "pncclAllGather"],
        &[
            Ptr(Src),
            Ptr(Dst),
            Num(Count),
            Datatype,
            Ptr(Comm),
            Ptr(Stream),
        ],
    ),
    // ncclReduceScatter(send, recv, recvcount, datatype, op, comm, stream).
    collective(
        &["ncclReduceScatter", "pncclReduceScatter"],
        &[
            Ptr(Src),
            Ptr(Dst),
            Num(Count),
            Datatype,
            RedOp,
            Ptr(Comm),
            Ptr(Stream),
        ],
    ),
    // ncclAlltoAll(send, recv, count, datatype, comm, stream).
    collective(
        &["ncclAlltoAll", "pncclAlltoAll"],
        &[
            Ptr(Src),
            Ptr(Dst),
            Num(Count),
            Datatype,
            Ptr(Comm),
            Ptr(Stream),
        ],
    ),
    // ncclGather(send, recv, count, datatype, root, comm, stream).
    collective(
        &["ncclGather", "pncclGather"],
        &[
            Ptr(Src),
            Ptr(Dst),
            Num(Count),
            Datatype,
            Int(Root),
            Ptr(Comm),
            Ptr(Stream),
        ],
    ),
    // ncclScatter(send, recv, count, datatype, root, comm, stream).
    collective(
        &["ncclScatter", "pncclScatter"],
        &[
            Ptr(Src),
            Ptr(Dst),
            Num(Count),
            Datatype,
            Int(Root),
            Ptr(Comm),
            Ptr(Stream),
        ],
    ),
    // ncclSend(send, count, datatype, peer, comm, stream).
    collective(
        &["ncclSend", "pncclSend"],
        &[
            Ptr(Src),
            Num(Count),
            Datatype,
            Int(Peer),
            Ptr(Comm),
            Ptr(Stream),
        ],
    ),
    // ncclRecv(recv, count, datatype, peer, comm, stream).
    collective(
        &["ncclRecv", "pncclRecv"],
        &[
            Ptr(Dst),
            Num(Count),
            Datatype,
            Int(Peer),
            Ptr(Comm),
            Ptr(Stream),
        ],
    ),
    f(&["ncclGroupStart", "pncclGroupStart"], Family::Group, &[]),
    f(&["ncclGroupEnd", "pncclGroupEnd"], Family::Group, &[]),
];

/// `ncclDataType_t`: its name and element size in bytes.
pub fn datatype(value: u32) -> Option<(&'static str, u64)> {
    Some(match value {
        0 => ("int8", 1),
        1 => ("uint8", 1),
        2 => ("int32", 4),
        3 => ("uint32", 4),
        4 => ("int64", 8),
        5 => ("uint64", 8),
        6 => ("float16", 2),
        7 => ("float32", 4),
        8 => ("float64", 8),
        9 => ("bfloat16", 2),
        10 => ("float8e4m3", 1),
        11 => ("float8e5m2", 1),
        _ => return None,
    })
}

/// `ncclRedOp_t`: the built-in ops by name; values from `ncclNumOps` (5) up are the ops
/// `ncclRedOpCreatePreMulSum` creates.
pub fn red_op(value: u32) -> &'static str {
    match value {
        0 => "sum",
        1 => "prod",
        2 => "max",
        3 => "min",
        4 => "avg",
        _ => "premulsum",
    }
}

/// `ncclResult_t` names.
pub fn result_name(value: u32) -> Option<&'static str> {
    Some(match value {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => return None,
    })
}

/// The catalog entry of an NCCL symbol (either name of a pair).
pub fn lookup(symbol: &str) -> Option<&'static FnSpec> {
    // Readers ask for every call of a trace, nearly all libcuda's: those are not searched.
    if !(symbol.starts_with("nccl") || symbol.starts_with("pnccl")) {
        return None;
    }
    NCCL_CATALOG
        .iter()
        .find(|spec| spec.symbols.contains(&symbol))
}

/// The collective a call line's function name is, without its `p` alias prefix:
/// `ncclAllReduce` and `pncclAllReduce` give `AllReduce`; `None` for other functions.
pub fn collective_op(name: &str) -> Option<&'static str> {
    let spec = lookup(name)?;
    (spec.family == Family::Collective).then(|| {
        spec.name()
            .strip_prefix("nccl")
            .expect("NCCL catalog names start with nccl")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::{ProbeSpec, capture};

    /// arm64 passes the 128-byte id as a pointer to a copy in the third register: read as
    /// a `ncclUniqueId *` is, and the rank moves to the fourth.
    #[test]
    fn init_rank_reads_its_id_through_a_pointer_on_arm64() {
        let arm64 = communicator(&["ncclCommInitRank"], INIT_RANK_AAPCS64).probe_spec();
        assert_eq!(
            (
                arm64.nargs,
                arm64.capture,
                arm64.capture_arg,
                arm64.capture_len
            ),
            (4, capture::STRUCT, 2, 32)
        );
        let x86 = lookup("ncclCommInitRank").unwrap();
        if cfg!(target_arch = "aarch64") {
            assert!(std::ptr::eq(x86.args, INIT_RANK_AAPCS64));
        } else {
            assert_eq!((x86.args[2], x86.args[6]), (Int(Rank), UniqueIdOnStack));
        }
    }

    #[test]
    fn every_function_pairs_its_alias() {
        // The kernel limits: probe_set.rs checks every set's catalog.
        for spec in NCCL_CATALOG {
            assert_eq!(spec.symbols.len(), 2, "{}", spec.name());
            assert!(spec.symbols[0].starts_with("nccl"), "{}", spec.name());
            assert_eq!(spec.symbols[1], format!("p{}", spec.symbols[0]));
        }
    }

    #[test]
    fn stack_arguments_are_read_where_the_abi_puts_them() {
        // The stream of ncclAllReduce is its seventh argument: the first stack word.
        let all_reduce = lookup("ncclAllReduce").unwrap();
        assert_eq!(all_reduce.probe_spec().nargs, 7);
        assert_eq!(all_reduce.args[6], Ptr(Stream));
        // ncclReduce: comm and stream are the seventh and eighth.
        let reduce = lookup("pncclReduce").unwrap();
        assert_eq!(reduce.probe_spec().nargs, 8);
        assert_eq!((reduce.args[6], reduce.args[7]), (Ptr(Comm), Ptr(Stream)));
        // ncclCommInitRank: comm out through rdi, nranks rsi, rank rdx, the id on the stack.
        let init = lookup("ncclCommInitRank").unwrap().probe_spec();
        assert_eq!(
            init,
            ProbeSpec {
                nargs: 7,
                out_args: [1, 0],
                ..ProbeSpec::default()
            }
        );
        let all = lookup("ncclCommInitAll").unwrap().probe_spec();
        assert_eq!(
            (all.capture, all.capture_arg, all.capture_count_arg),
            (capture::STRUCT, 0, 2)
        );
        let scalable = lookup("ncclCommInitRankScalable").unwrap().probe_spec();
        assert_eq!(
            (scalable.capture, scalable.capture_arg, scalable.capture_len),
            (capture::STRUCT, 4, 32)
        );
    }

    #[test]
    fn datatypes_ops_and_results_have_nccl_names() {
        assert_eq!(datatype(7), Some(("float32", 4)));
        assert_eq!(datatype(9), Some(("bfloat16", 2)));
        assert_eq!(datatype(12), None);
        assert_eq!(
            (red_op(0), red_op(4), red_op(5)),
            ("sum", "avg", "premulsum")
        );
        assert_eq!(result_name(7), Some("ncclInProgress"));
        assert_eq!(collective_op("pncclAllGather"), Some("AllGather"));
        assert_eq!(collective_op("ncclGroupEnd"), None);
        assert_eq!(collective_op("cuInit"), None);
    }
}
