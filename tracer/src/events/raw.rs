//! Ring-buffer records as the kernel wrote them: bytes to a [`RawEvent`]. Pure and total:
//! any bytes give an event or an error, never a panic.

use std::mem::size_of;

use tracer_common::{
    AttachEvent, CallDataEvent, CallEvent, CallStringEvent, DATA_LEN, DriverEvent, EventHeader,
    GPU_BATCH_MAX, GPU_TEXT_LEN, GpuBatchEvent, GpuEvent, GpuRecord, GpuTextEvent, ProcEvent,
    TEXT_LEN, kind,
    stacks::{CODE_DATA_LEN, CallStackEvent, CodeHead, MAX_STACK_FRAMES, RawPyFrame, StackEvent},
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {len} bytes is shorter than its {need}-byte {what}")]
    Short {
        what: &'static str,
        len: usize,
        need: usize,
    },
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
}

/// A record as the kernel wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawEvent {
    /// A call; `data` holds the bytes its probe captured (a string without its NUL, a
    /// struct), if it captures any.
    Call {
        call: CallEvent,
        data: Option<Vec<u8>>,
        /// `--stacks`: the record of the call's stack when it came in the call's own
        /// record ([`kind::CALL_STACK`]): a known stack, no frames.
        stack: Option<StackEvent>,
    },
    Proc(ProcEvent),
    Driver(DriverEvent),
    /// A GPU record from the injection library (`--gpu`), with its text if it has one.
    Gpu(RawGpu),
    /// GPU records without text that came in one entry, in order; each is a [`RawGpu`]
    /// with this header and no text. `missing`: records its count names that the entry
    /// was too short to hold (never seen; the loader counts each as undecodable).
    GpuBatch {
        header: EventHeader,
        records: Vec<GpuRecord>,
        missing: u32,
    },
    /// For the attach layer, not the trace: a library opened, a fork, an exec.
    Attach(Box<AttachEvent>),
    /// `--stacks`: a call's Python stack, with its frames when it is new.
    Stack {
        event: StackEvent,
        frames: Vec<RawPyFrame>,
    },
    /// `--stacks`: a code object, and the bytes of its names and line table.
    Code {
        head: CodeHead,
        data: Vec<u8>,
    },
}

/// A GPU record as the `gpu_records` uprobe wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawGpu {
    /// `pid` is the process the record came from; `tid` the thread that delivered it.
    pub header: EventHeader,
    pub record: GpuRecord,
    /// `record.text_len` bytes of text (kernel name, message, libcupti path).
    pub text: Option<Vec<u8>>,
}

fn read<T: Copy>(bytes: &[u8], what: &'static str) -> Result<T, DecodeError> {
    let need = size_of::<T>();
    if bytes.len() < need {
        return Err(DecodeError::Short {
            what,
            len: bytes.len(),
            need,
        });
    }
    // SAFETY: length checked; T is a repr(C) plain-data type valid for any bit pattern.
    Ok(unsafe { bytes.as_ptr().cast::<T>().read_unaligned() })
}

/// Whether records of `kind` are calls (with or without captured memory).
pub fn is_call_kind(kind: u32) -> bool {
    matches!(
        kind,
        kind::CALL | kind::CALL_DATA | kind::CALL_STRING | kind::CALL_STACK
    )
}

/// Decodes one ring-buffer record. Never panics, whatever the input.
pub fn decode(bytes: &[u8]) -> Result<RawEvent, DecodeError> {
    let header: EventHeader = read(bytes, "header")?;
    match header.kind {
        kind::CALL => Ok(RawEvent::Call {
            call: read(bytes, "call event")?,
            data: None,
            stack: None,
        }),
        kind::CALL_STACK => {
            let event: CallStackEvent = read(bytes, "call stack event")?;
            Ok(RawEvent::Call {
                call: CallEvent {
                    header: EventHeader {
                        kind: kind::CALL,
                        ..event.call.header
                    },
                    ..event.call
                },
                data: None,
                stack: Some(event.stack_event()),
            })
        }
        kind::CALL_DATA => {
            let event: CallDataEvent = read(bytes, "call data event")?;
            let len = (event.data_len as usize).min(DATA_LEN);
            Ok(RawEvent::Call {
                call: event.call,
                data: Some(event.data[..len].to_vec()),
                stack: None,
            })
        }
        kind::CALL_STRING => {
            let event: CallStringEvent = read(bytes, "call string event")?;
            let len = (event.data_len as usize).min(TEXT_LEN);
            Ok(RawEvent::Call {
                call: event.call,
                data: Some(event.data[..len].to_vec()),
                stack: None,
            })
        }
        kind::PROC => Ok(RawEvent::Proc(read(bytes, "process event")?)),
        kind::DRIVER => Ok(RawEvent::Driver(read(bytes, "driver event")?)),
        kind::GPU => {
            let event: GpuEvent = read(bytes, "GPU event")?;
            Ok(RawEvent::Gpu(RawGpu {
                header: event.header,
                record: event.record,
                text: None,
            }))
        }
        kind::GPU_TEXT => {
            let event: GpuTextEvent = read(bytes, "GPU text event")?;
            let len = (event.record.text_len as usize).min(GPU_TEXT_LEN);
            Ok(RawEvent::Gpu(RawGpu {
                header: event.header,
                record: event.record,
                text: Some(event.text[..len].to_vec()),
            }))
        }
        kind::GPU_BATCH => {
            let header: EventHeader = read(bytes, "GPU batch header")?;
            let start = std::mem::offset_of!(GpuBatchEvent, records);
            let count: u32 = read(&bytes[size_of::<EventHeader>()..], "GPU batch count")?;
            // A count beyond the batch's room is held to it.
            let count = (count as usize).min(GPU_BATCH_MAX);
            let records: Vec<GpuRecord> = (0..count)
                .map_while(|i| {
                    let at = bytes.get(start + i * size_of::<GpuRecord>()..)?;
                    read(at, "GPU batch record").ok()
                })
                .collect();
            let missing = (count - records.len()) as u32;
            Ok(RawEvent::GpuBatch {
                header,
                records,
                missing,
            })
        }
        kind::ATTACH => Ok(RawEvent::Attach(Box::new(read(bytes, "attach event")?))),
        kind::STACK => {
            let event: StackEvent = read(bytes, "stack event")?;
            let count = (event.nframes as usize).min(MAX_STACK_FRAMES);
            let rest = &bytes[size_of::<StackEvent>()..];
            let frames = (0..count)
                .map(|i| {
                    read(
                        rest.get(i * size_of::<RawPyFrame>()..).unwrap_or(&[]),
                        "frame",
                    )
                })
                .collect::<Result<Vec<RawPyFrame>, _>>()?;
            Ok(RawEvent::Stack { event, frames })
        }
        kind::CODE => {
            let head: CodeHead = read(bytes, "code event")?;
            let len = (head.filename_len as usize)
                .saturating_add(head.qualname_len as usize)
                .saturating_add(head.linetable_len as usize)
                .min(CODE_DATA_LEN);
            let data = bytes.get(size_of::<CodeHead>()..size_of::<CodeHead>() + len);
            let data = data.ok_or(DecodeError::Short {
                what: "code event's data",
                len: bytes.len(),
                need: size_of::<CodeHead>() + len,
            })?;
            Ok(RawEvent::Code {
                head,
                data: data.to_vec(),
            })
        }
        other => Err(DecodeError::UnknownKind(other)),
    }
}

/// The text of a NUL-terminated byte buffer, lossily decoded.
pub fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::{
        flags,
        stacks::{StackRef, stack_flags, stack_status},
    };

    fn as_bytes<T: Copy>(value: &T) -> Vec<u8> {
        // SAFETY: T is plain data; viewing it as bytes is sound.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    #[test]
    fn a_gpu_batch_gives_its_records_in_order() {
        let mut event = GpuBatchEvent {
            header: EventHeader {
                kind: kind::GPU_BATCH,
                flags: 0,
                ts_ns: 7,
                pid: 42,
                tid: 43,
            },
            count: 3,
            _pad: 0,
            records: [GpuRecord::default(); GPU_BATCH_MAX],
        };
        for (i, record) in event.records.iter_mut().enumerate() {
            record.correlation_id = 100 + i as u32;
        }
        let Ok(RawEvent::GpuBatch {
            header,
            records,
            missing: 0,
        }) = decode(&as_bytes(&event))
        else {
            panic!("not a whole GPU batch")
        };
        assert_eq!((header.pid, header.tid, header.ts_ns), (42, 43, 7));
        let ids: Vec<u32> = records.iter().map(|r| r.correlation_id).collect();
        assert_eq!(ids, vec![100, 101, 102]);
        // A count beyond the batch's room is held to it.
        event.count = 1000;
        let Ok(RawEvent::GpuBatch {
            records,
            missing: 0,
            ..
        }) = decode(&as_bytes(&event))
        else {
            panic!("not a whole GPU batch")
        };
        assert_eq!(records.len(), GPU_BATCH_MAX);
        // An entry cut short in its 3rd record: the first 2 come, the other 30 are missing.
        let bytes = as_bytes(&event);
        let cut = std::mem::offset_of!(GpuBatchEvent, records) + 2 * size_of::<GpuRecord>() + 5;
        let Ok(RawEvent::GpuBatch {
            records, missing, ..
        }) = decode(&bytes[..cut])
        else {
            panic!("not a GPU batch")
        };
        let ids: Vec<u32> = records.iter().map(|r| r.correlation_id).collect();
        assert_eq!((ids, missing), (vec![100, 101], 30));
        // Without its count, it is no batch.
        assert!(decode(&bytes[..size_of::<EventHeader>() + 2]).is_err());
    }

    /// A call record with every field set to a value of its own.
    fn call_of(kind: u32, flags: u32) -> CallEvent {
        CallEvent {
            header: EventHeader {
                kind,
                flags,
                ts_ns: 5,
                pid: 7,
                tid: 8,
            },
            probe_id: 3,
            ret: 1,
            dur_ns: 99,
            args: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            outs: [11, 12],
        }
    }

    #[test]
    fn call_round_trips() {
        let call = call_of(kind::CALL, 0);
        assert_eq!(
            decode(&as_bytes(&call)),
            Ok(RawEvent::Call {
                call,
                data: None,
                stack: None
            })
        );
    }

    /// A call with its known stack in one record is the stack's record, as the probes
    /// would have sent it, and the call as a plain call record.
    #[test]
    fn a_call_with_its_known_stack_is_the_stack_record_and_the_call() {
        let call = call_of(kind::CALL_STACK, flags::NO_RETURN);
        let event = CallStackEvent {
            call,
            stack: StackRef {
                generation: 41,
                hash: [42, 43],
                flags: stack_flags::KNOWN | stack_flags::CUT,
                _pad: 0,
            },
        };
        let Ok(RawEvent::Call {
            call: decoded,
            data: None,
            stack: Some(stack),
        }) = decode(&as_bytes(&event))
        else {
            panic!("not a call with its stack");
        };
        assert_eq!(
            decoded,
            CallEvent {
                header: EventHeader {
                    kind: kind::CALL,
                    ..call.header
                },
                ..call
            }
        );
        assert_eq!(
            stack,
            StackEvent {
                header: EventHeader {
                    kind: kind::STACK,
                    flags: 0,
                    ts_ns: 5,
                    pid: 7,
                    tid: 8,
                },
                generation: 41,
                hash: [42, 43],
                status: stack_status::OK,
                flags: stack_flags::KNOWN | stack_flags::CUT,
                nframes: 0,
                probe_id: 3,
            }
        );
        assert!(is_call_kind(kind::CALL_STACK));
        // Cut short, it is no call.
        assert!(decode(&as_bytes(&event)[..size_of::<CallEvent>() + 8]).is_err());
    }

    #[test]
    fn data_is_cut_to_its_length() {
        let mut event = CallDataEvent {
            call: CallEvent::default(),
            data_len: 4,
            _pad: 0,
            data: [0xaa; DATA_LEN],
        };
        event.call.header.kind = kind::CALL_DATA;
        let Ok(RawEvent::Call {
            data: Some(data), ..
        }) = decode(&as_bytes(&event))
        else {
            panic!("not a call with data");
        };
        assert_eq!(data, vec![0xaa; 4]);
        event.data_len = 100_000;
        let Ok(RawEvent::Call {
            data: Some(data), ..
        }) = decode(&as_bytes(&event))
        else {
            panic!("not a call with data");
        };
        assert_eq!(data.len(), DATA_LEN);
    }

    #[test]
    fn gpu_records_keep_their_text_cut_to_its_length() {
        let mut event = GpuTextEvent {
            header: EventHeader {
                kind: kind::GPU_TEXT,
                pid: 7,
                ..EventHeader::default()
            },
            record: GpuRecord {
                what: 5,
                name_id: 1,
                text_len: 3,
                ..GpuRecord::default()
            },
            text: [b'x'; GPU_TEXT_LEN],
        };
        let Ok(RawEvent::Gpu(gpu)) = decode(&as_bytes(&event)) else {
            panic!("not a GPU record")
        };
        assert_eq!(gpu.text.as_deref(), Some(&b"xxx"[..]));
        assert_eq!((gpu.header.pid, gpu.record.name_id), (7, 1));
        event.record.text_len = 100_000;
        let Ok(RawEvent::Gpu(gpu)) = decode(&as_bytes(&event)) else {
            panic!("not a GPU record")
        };
        assert_eq!(gpu.text.unwrap().len(), GPU_TEXT_LEN);
        let plain = GpuEvent {
            header: EventHeader {
                kind: kind::GPU,
                ..EventHeader::default()
            },
            record: GpuRecord::default(),
        };
        let Ok(RawEvent::Gpu(gpu)) = decode(&as_bytes(&plain)) else {
            panic!("not a GPU record")
        };
        assert_eq!(gpu.text, None);
        assert!(decode(&as_bytes(&plain)[..100]).is_err());
    }

    #[test]
    fn attach_events_are_kind_8_for_the_attach_layer() {
        let mut event = AttachEvent {
            header: EventHeader {
                kind: 8,
                flags: tracer_common::attach_flags::STOPPED,
                pid: 42,
                tid: 43,
                ..EventHeader::default()
            },
            what: tracer_common::attach_event::LIBRARY_OPENED,
            fd: 5,
            parent: 0,
            set: 0,
            path_len: 12,
            _pad: 0,
            path: [0; tracer_common::PATH_LEN],
        };
        event.path[..12].copy_from_slice(b"libcuda.so.1");
        assert_eq!(
            decode(&as_bytes(&event)),
            Ok(RawEvent::Attach(Box::new(event)))
        );
        assert_eq!(
            decode(&as_bytes(&event)[..100]),
            Err(DecodeError::Short {
                what: "attach event",
                len: 100,
                need: 304
            })
        );
    }

    #[test]
    fn strings_come_whole_up_to_the_text_limit() {
        let mut event = CallStringEvent {
            call: CallEvent::default(),
            data_len: TEXT_LEN as u32,
            _pad: 0,
            data: [b'x'; tracer_common::STRING_BUF_LEN],
        };
        event.call.header.kind = kind::CALL_STRING;
        let Ok(RawEvent::Call {
            data: Some(data), ..
        }) = decode(&as_bytes(&event))
        else {
            panic!("not a call with a string");
        };
        assert_eq!(data, vec![b'x'; 4096]);
        // A length past the limit (never written by the kernel) is held to it.
        event.data_len = 5000;
        let Ok(RawEvent::Call {
            data: Some(data), ..
        }) = decode(&as_bytes(&event))
        else {
            panic!("not a call with a string");
        };
        assert_eq!(data.len(), TEXT_LEN);
        // A record cut short is an error, not a panic.
        let bytes = as_bytes(&event);
        assert_eq!(
            decode(&bytes[..200]),
            Err(DecodeError::Short {
                what: "call string event",
                len: 200,
                need: 136 + 8 + 4104
            })
        );
    }

    #[test]
    fn short_and_unknown_records_are_errors() {
        assert_eq!(
            decode(&[1, 0, 0, 0]),
            Err(DecodeError::Short {
                what: "header",
                len: 4,
                need: 24
            })
        );
        let mut header = as_bytes(&EventHeader {
            kind: kind::CALL,
            ..Default::default()
        });
        assert_eq!(
            decode(&header),
            Err(DecodeError::Short {
                what: "call event",
                len: 24,
                need: 136
            })
        );
        header[0] = 77;
        assert_eq!(decode(&header), Err(DecodeError::UnknownKind(77)));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A cheap deterministic fuzz: every length and kind byte, pseudo-random payloads,
        // and the lengths around the two text-carrying records.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let call_string = size_of::<CallStringEvent>();
        let gpu_text = size_of::<GpuTextEvent>();
        for len in (0..600)
            .chain(call_string - 1..=call_string + 1)
            .chain(gpu_text - 1..=gpu_text + 1)
        {
            let mut bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            if len >= 4 {
                bytes[0] = (len % 9) as u8;
                bytes[1..4].fill(0);
            }
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn c_strings_stop_at_nul() {
        assert_eq!(c_string(b"abc\0def"), "abc");
        assert_eq!(c_string(b"abc"), "abc");
    }
}
