//! Ring-buffer records as the kernel wrote them: bytes to a [`RawEvent`]. Pure and total:
//! any bytes give an event or an error, never a panic.

use std::mem::size_of;

use tracer_common::{
    AttachEvent, CallDataEvent, CallEvent, DATA_LEN, DriverEvent, EventHeader, ProcEvent, kind,
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
    /// A call; `data` holds the bytes captured at entry, if the probe captures any.
    Call {
        call: CallEvent,
        data: Option<Vec<u8>>,
    },
    Proc(ProcEvent),
    Driver(DriverEvent),
    /// For the attach layer, not the trace: a library opened, a fork, an exec.
    Attach(Box<AttachEvent>),
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

/// Decodes one ring-buffer record. Never panics, whatever the input.
pub fn decode(bytes: &[u8]) -> Result<RawEvent, DecodeError> {
    let header: EventHeader = read(bytes, "header")?;
    match header.kind {
        kind::CALL => Ok(RawEvent::Call {
            call: read(bytes, "call event")?,
            data: None,
        }),
        kind::CALL_DATA => {
            let event: CallDataEvent = read(bytes, "call data event")?;
            let len = (event.data_len as usize).min(DATA_LEN);
            Ok(RawEvent::Call {
                call: event.call,
                data: Some(event.data[..len].to_vec()),
            })
        }
        kind::PROC => Ok(RawEvent::Proc(read(bytes, "process event")?)),
        kind::DRIVER => Ok(RawEvent::Driver(read(bytes, "driver event")?)),
        kind::ATTACH => Ok(RawEvent::Attach(Box::new(read(bytes, "attach event")?))),
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

    fn as_bytes<T: Copy>(value: &T) -> Vec<u8> {
        // SAFETY: T is plain data; viewing it as bytes is sound.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    #[test]
    fn call_round_trips() {
        let call = CallEvent {
            header: EventHeader {
                kind: kind::CALL,
                flags: 0,
                ts_ns: 5,
                pid: 7,
                tid: 8,
            },
            probe_id: 3,
            ret: 1,
            dur_ns: 99,
            args: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            outs: [11, 12],
        };
        assert_eq!(
            decode(&as_bytes(&call)),
            Ok(RawEvent::Call { call, data: None })
        );
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
        // A cheap deterministic fuzz: every length and kind byte, pseudo-random payloads.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for len in 0..600 {
            let mut bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            if len >= 4 {
                bytes[0] = (len % 5) as u8;
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
