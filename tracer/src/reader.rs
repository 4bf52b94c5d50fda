//! Reading a trace file line by line, for `summary`, `export` and `plot`: one line in
//! memory at a time, each parsed by [`schema::parse`]. A malformed line is an error naming
//! the file and the line, or, with `--skip-bad-lines`, counted and passed over.

use std::io::{self, BufRead};

use crate::schema::{self, Line};

/// Longer lines are malformed (a footer listing 1000 leaks per process is far shorter).
pub const MAX_LINE_BYTES: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading {file}: {source}")]
    Io { file: String, source: io::Error },
    #[error("{file}:{line}: {message} (--skip-bad-lines reads past malformed lines)")]
    BadLine {
        file: String,
        line: u64,
        message: String,
    },
}

/// The lines of a trace, one at a time.
pub struct TraceLines<R> {
    reader: R,
    file: String,
    buf: Vec<u8>,
    skip_bad_lines: bool,
    /// Lines read so far.
    pub lines: u64,
    /// Malformed lines passed over (with `skip_bad_lines`).
    pub skipped_lines: u64,
    /// The first few of them: (line number, message).
    pub first_skipped: Vec<(u64, String)>,
}

impl<R: BufRead> TraceLines<R> {
    pub fn new(reader: R, file: &str, skip_bad_lines: bool) -> Self {
        TraceLines {
            reader,
            file: file.to_owned(),
            buf: Vec::new(),
            skip_bad_lines,
            lines: 0,
            skipped_lines: 0,
            first_skipped: Vec::new(),
        }
    }

    /// The next line, `None` at the end. A malformed line is an error naming the file and
    /// line, unless `skip_bad_lines`.
    pub fn next_line(&mut self) -> Result<Option<Line>, ReadError> {
        loop {
            // Nearly every line lies whole in the reader's buffer: parsed where it is.
            let in_buffer = match self.reader.fill_buf() {
                Ok(available) => memchr::memchr(b'\n', available).map(|end| {
                    let line = available[..end]
                        .strip_suffix(b"\r")
                        .unwrap_or(&available[..end]);
                    (schema::parse(line), end + 1)
                }),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(ReadError::Io {
                        file: self.file.clone(),
                        source,
                    });
                }
            };
            let parsed = match in_buffer {
                Some((parsed, used)) => {
                    self.reader.consume(used);
                    self.lines += 1;
                    parsed
                }
                None => {
                    let kept = read_line(&mut self.reader, &mut self.buf, MAX_LINE_BYTES).map_err(
                        |source| ReadError::Io {
                            file: self.file.clone(),
                            source,
                        },
                    )?;
                    let Some(kept) = kept else { return Ok(None) };
                    self.lines += 1;
                    if kept {
                        schema::parse(&self.buf)
                    } else {
                        Err(format!("line longer than {} MiB", MAX_LINE_BYTES >> 20))
                    }
                }
            };
            match parsed {
                Ok(line) => return Ok(Some(line)),
                Err(message) if self.skip_bad_lines => {
                    self.skipped_lines += 1;
                    if self.first_skipped.len() < 5 {
                        self.first_skipped.push((self.lines, message));
                    }
                }
                Err(message) => {
                    return Err(ReadError::BadLine {
                        file: self.file.clone(),
                        line: self.lines,
                        message,
                    });
                }
            }
        }
    }
}

/// Reads one line into `buf` (newline and a trailing CR removed). `Ok(None)` at the end;
/// `Ok(Some(false))` for a line over `max` bytes, which is consumed but not kept.
pub fn read_line(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<Option<bool>> {
    buf.clear();
    let mut read_any = false;
    let mut too_long = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            break;
        }
        read_any = true;
        let (chunk, done) = match memchr::memchr(b'\n', available) {
            Some(at) => (&available[..at], Some(at + 1)),
            None => (available, None),
        };
        if !too_long {
            if buf.len() + chunk.len() > max {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = done.unwrap_or(available.len());
        reader.consume(used);
        if done.is_some() {
            break;
        }
    }
    if !read_any {
        return Ok(None);
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Some(!too_long))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::families::Families;

    fn lines(text: &str, skip: bool) -> Result<Vec<Line>, ReadError> {
        let mut reader = TraceLines::new(text.as_bytes(), "t.jsonl", skip);
        let mut out = Vec::new();
        while let Some(line) = reader.next_line()? {
            out.push(line);
        }
        Ok(out)
    }

    #[test]
    fn every_line_type_is_read_with_its_fields() {
        let text = r#"{"type":"header","start_monotonic_ns":1000,"command":["./app","-x"],"pids":[7],"probes":[{"id":0,"symbol":"cuInit","function":"cuInit","family":"init"}]}
{"type":"process","event":"fork","pid":7,"tid":7,"ts_ns":1500,"child_pid":8,"comm":"app"}
{"type":"call","name":"cuInit","pid":7,"tid":7,"ts_ns":2000,"dur_ns":10,"ret":0}
{"type":"lost","ts_ns":2500,"reason":"ring_full","count":3,"total":3}
{"type":"driver","hook":"ioctl","pid":7,"tid":9,"ts_ns":3000,"dur_ns":40,"ret":0,"escape":42,"escape_name":"NV_ESC_RM_ALLOC","rm_class":"0x80"}
{"type":"gpu_sample","ts_ns":4000}
{"type":"footer"}
"#;
        let read = lines(text, false).unwrap();
        assert_eq!(read.len(), 7);
        let Line::Header(header) = &read[0] else {
            panic!("{:?}", read[0])
        };
        assert_eq!(header.start_monotonic_ns, Some(1000));
        assert_eq!(header.command, ["./app", "-x"]);
        assert_eq!(Families::from_header(header).of("cuInit"), Some("init"));
        let Line::Process(fork) = &read[1] else {
            panic!()
        };
        assert_eq!(
            (fork.event.as_str(), fork.child_pid, fork.comm.as_deref()),
            ("fork", Some(8), Some("app"))
        );
        assert!(matches!(&read[2], Line::Call(call) if call.ts_ns == 2000));
        assert!(
            matches!(&read[3], Line::Lost(lost) if lost.count == 3 && lost.reason == "ring_full")
        );
        let Line::Driver(driver) = &read[4] else {
            panic!()
        };
        assert_eq!(
            (driver.pid, driver.tid, driver.ts_ns, driver.dur_ns),
            (7, 9, 3000, 40)
        );
        assert_eq!(driver.what(), "NV_ESC_RM_ALLOC");
        assert_eq!(driver.details()["rm_class"], "0x80");
        assert!(!driver.details().contains_key("ts_ns"));
        assert!(matches!(read[5], Line::Unknown));
        assert!(matches!(read[6], Line::Footer(_)));
    }

    #[test]
    fn bad_lines_fail_or_are_counted() {
        let text = "{\"type\":\"call\",\"name\":1}\nnot json\n{\"type\":\"footer\"}\n";
        let error = lines(text, false).err().unwrap().to_string();
        assert!(error.starts_with("t.jsonl:1: "), "{error}");
        let mut reader = TraceLines::new(text.as_bytes(), "t.jsonl", true);
        assert!(matches!(reader.next_line().unwrap(), Some(Line::Footer(_))));
        assert_eq!(reader.skipped_lines, 2);
        assert_eq!(reader.first_skipped[1].0, 2);
    }

    #[test]
    fn overlong_lines_are_malformed_not_kept() {
        let mut reader: &[u8] = b"abcdef\nxy\r\nlast";
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut reader, &mut buf, 4).unwrap(), Some(false));
        assert_eq!(read_line(&mut reader, &mut buf, 4).unwrap(), Some(true));
        assert_eq!(buf, b"xy");
        assert_eq!(read_line(&mut reader, &mut buf, 4).unwrap(), Some(true));
        assert_eq!(buf, b"last");
        assert_eq!(read_line(&mut reader, &mut buf, 4).unwrap(), None);
    }
}
