//! Reading a trace file line by line, for `summary`, `export` and `plot`: one line in
//! memory at a time, each parsed to the schema's [`Line`] as
//! [`schema::parse`](crate::schema::parse) parses it, only faster. A malformed line is an
//! error naming the file and the line, or, with `--skip-bad-lines`, counted and passed over.
//! The one exception is the cut: in a trace without its footer, a last line with no
//! newline that does not parse is where the tracer was killed; reading ends before it,
//! and [`TraceLines::cut`] says so.
//!
//! | file | |
//! |---|---|
//! | `mod.rs` | [`TraceLines`]: the lines in order, read on this thread or from the workers |
//! | `pipeline.rs` | a file cut into blocks of lines, parsed on worker threads |
//! | `parse.rs` | the fast path: calls and GPU work by the compact reader, a call into a reused box |
//! | `compact/` | the compact reader: a serde `Deserializer` for lines exactly as the writer writes them (`mod.rs`), over an SSE2 scan of their quotes (`scan.rs`) |

use std::{
    fs::File,
    io::{self, BufRead},
};

pub mod compact;
mod parse;
mod pipeline;

use crate::schema::Line;
use parse::{SpareCalls, parse_reusing};

/// Longer lines are malformed (a footer listing 1000 leaks per process is far shorter).
pub const MAX_LINE_BYTES: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    // `error`, not `source`: the message holds it, and `{:#}` would print it twice.
    #[error("cannot open the trace {file}: {error}")]
    Open { file: String, error: io::Error },
    #[error("cannot read the trace {file}: {error}")]
    Io { file: String, error: io::Error },
    #[error("{file}:{line}: {message} (--skip-bad-lines reads past malformed lines)")]
    BadLine {
        file: String,
        line: u64,
        message: String,
    },
}

impl ReadError {
    /// For `map_err`: the trace `file` cannot be opened.
    pub fn opening(file: &str) -> impl Fn(io::Error) -> ReadError + Copy + '_ {
        move |error| ReadError::Open {
            file: file.to_owned(),
            error,
        }
    }

    /// For `map_err`: reading the trace `file` failed.
    pub fn reading(file: &str) -> impl Fn(io::Error) -> ReadError + Copy + '_ {
        move |error| ReadError::Io {
            file: file.to_owned(),
            error,
        }
    }
}

/// Work done for each well-formed line where it is parsed (on the worker threads for a
/// file), given its bytes and what was parsed; the result is kept beside the line (the
/// export: whether its strings need escaping).
pub type Prepare<X> = fn(&[u8], &Line) -> X;

/// The lines of a trace, one at a time, each with what [`Prepare`] made of it (`X`).
pub struct TraceLines<R, X = ()> {
    source: Source<R, X>,
    prepare: Prepare<X>,
    file: String,
    skip_bad_lines: bool,
    /// Lines read so far.
    pub lines: u64,
    /// Malformed lines passed over (with `skip_bad_lines`).
    pub skipped_lines: u64,
    /// The first few of them: (line number, message).
    pub first_skipped: Vec<(u64, String)>,
    /// The cut: the last line, partial, of a trace without footer (its number).
    pub cut: Option<u64>,
    footer_seen: bool,
}

enum Source<R, X> {
    /// Read and parsed on this thread.
    Here {
        reader: R,
        buf: Vec<u8>,
        current: Option<(Line, X)>,
    },
    /// Read and parsed on worker threads (a file).
    Workers(pipeline::Pipeline<X>),
}

/// A line parsed and prepared.
type Prepared<X> = Result<(Line, X), String>;

fn no_preparation(_: &[u8], _: &Line) {}

impl<R: BufRead> TraceLines<R> {
    #[cfg_attr(not(test), expect(dead_code, reason = "files are read by from_file"))]
    pub fn new(reader: R, file: &str, skip_bad_lines: bool) -> Self {
        TraceLines::prepared(reader, file, skip_bad_lines, no_preparation)
    }
}

impl<R: BufRead, X> TraceLines<R, X> {
    /// As [`new`](TraceLines::new), each line also given to `prepare`.
    pub fn prepared(reader: R, file: &str, skip_bad_lines: bool, prepare: Prepare<X>) -> Self {
        TraceLines {
            source: Source::Here {
                reader,
                buf: Vec::new(),
                current: None,
            },
            prepare,
            file: file.to_owned(),
            skip_bad_lines,
            lines: 0,
            skipped_lines: 0,
            first_skipped: Vec::new(),
            cut: None,
            footer_seen: false,
        }
    }

    /// The file's name as errors give it.
    pub fn label(&self) -> &str {
        &self.file
    }

    /// The next line, `None` at the end. A malformed line is an error naming the file and
    /// line, unless `skip_bad_lines`. The line is lent: take what is to be kept (it is
    /// dropped with its block of lines, on the thread that parsed it).
    pub fn next_line(&mut self) -> Result<Option<&mut Line>, ReadError> {
        Ok(self.next_prepared()?.map(|(line, _)| line))
    }

    /// As [`next_line`](TraceLines::next_line), with what `prepare` made of the line.
    pub fn next_prepared(&mut self) -> Result<Option<(&mut Line, &mut X)>, ReadError> {
        let prepare = self.prepare;
        loop {
            // Whether the next line is there and well-formed; the line itself is lent below.
            let next = match &mut self.source {
                Source::Here {
                    reader,
                    buf,
                    current,
                } => read_here(reader, buf, prepare).map(|parsed| {
                    parsed.map(|(parsed, ended)| {
                        (parsed.map(|prepared| *current = Some(prepared)), ended)
                    })
                }),
                Source::Workers(pipeline) => pipeline.advance(),
            };
            let next = next.map_err(ReadError::reading(&self.file))?;
            let Some((next, ended)) = next else {
                return Ok(None);
            };
            self.lines += 1;
            match next {
                Ok(()) => break,
                // Killed mid-line: the end of what the trace has, not a malformed line.
                Err(_) if !ended && !self.footer_seen => {
                    self.cut = Some(self.lines);
                    self.lines -= 1;
                    return Ok(None);
                }
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
        let current = match &mut self.source {
            Source::Here { current, .. } => current.as_mut().map(|(line, x)| (line, x)),
            Source::Workers(pipeline) => pipeline.current(),
        };
        if let Some((Line::Footer(_), _)) = &current {
            self.footer_seen = true;
        }
        Ok(current)
    }

    /// The line a killed tracer cut, as a warning: `None` when the trace ends whole.
    pub fn cut_warning(&self) -> Option<String> {
        self.cut.map(|line| cut_warning(&self.file, line))
    }
}

impl TraceLines<io::Empty> {
    /// A trace file read and parsed on worker threads while the caller uses the lines:
    /// the same lines, errors and line numbers as [`TraceLines::new`], in order, faster
    /// where there is more than one core. Memory holds a few blocks of lines.
    pub fn from_file(file: File, label: &str, skip_bad_lines: bool) -> Self {
        TraceLines::from_file_prepared(file, label, skip_bad_lines, no_preparation)
    }
}

impl<X: Send + 'static> TraceLines<io::Empty, X> {
    /// As [`from_file`](TraceLines::from_file), each line also given to `prepare` on the
    /// worker that parsed it.
    pub fn from_file_prepared(
        file: File,
        label: &str,
        skip_bad_lines: bool,
        prepare: Prepare<X>,
    ) -> Self {
        TraceLines {
            source: Source::Workers(pipeline::Pipeline::start(file, prepare)),
            prepare,
            file: label.to_owned(),
            skip_bad_lines,
            lines: 0,
            skipped_lines: 0,
            first_skipped: Vec::new(),
            cut: None,
            footer_seen: false,
        }
    }
}

/// Parses a line, without its newline and a trailing CR, and prepares it; a call goes
/// into one of `spare_calls` if there is one ([`parse_reusing`]).
fn parse_line<X>(line: &[u8], prepare: Prepare<X>, spare_calls: &mut SpareCalls) -> Prepared<X> {
    parse_prepared(
        line.strip_suffix(b"\r").unwrap_or(line),
        prepare,
        spare_calls,
    )
}

/// Parses a line as it is, and prepares it.
fn parse_prepared<X>(
    line: &[u8],
    prepare: Prepare<X>,
    spare_calls: &mut SpareCalls,
) -> Prepared<X> {
    parse_reusing(line, spare_calls).map(|parsed| {
        let prepared = prepare(line, &parsed);
        (parsed, prepared)
    })
}

/// The warning for a trace cut at `line` (see [`TraceLines::cut`]).
pub fn cut_warning(file: &str, line: u64) -> String {
    format!(
        "{file}:{line}: the trace was cut in this line (its tracer was killed?): read up to \
         the line before"
    )
}

fn too_long<X>() -> Prepared<X> {
    Err(too_long_message())
}

fn too_long_message() -> String {
    format!("line longer than {} MiB", MAX_LINE_BYTES >> 20)
}

/// The next line of `reader`, parsed and prepared, and whether it ended with a newline;
/// `None` at the end.
fn read_here<X>(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    prepare: Prepare<X>,
) -> io::Result<Option<(Prepared<X>, bool)>> {
    loop {
        // Nearly every line lies whole in the reader's buffer: parsed where it is.
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if let Some(end) = memchr::memchr(b'\n', available) {
            // A reader with a large buffer (a slice) may hold an over-long line whole.
            let parsed = match end > MAX_LINE_BYTES {
                true => too_long(),
                false => parse_line(&available[..end], prepare, &mut Vec::new()),
            };
            reader.consume(end + 1);
            return Ok(Some((parsed, true)));
        }
        return Ok(
            read_line_ended(reader, buf, MAX_LINE_BYTES)?.map(|(kept, ended)| match kept {
                true => (parse_prepared(buf, prepare, &mut Vec::new()), ended),
                false => (too_long(), ended),
            }),
        );
    }
}

/// Reads one line into `buf` (newline and a trailing CR removed). `Ok(None)` at the end;
/// `Ok(Some(false))` for a line over `max` bytes, which is consumed but not kept.
#[cfg(test)]
pub fn read_line(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<Option<bool>> {
    Ok(read_line_ended(reader, buf, max)?.map(|(kept, _)| kept))
}

/// As [`read_line`], and whether the line ended with a newline (not the file's end).
fn read_line_ended(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<Option<(bool, bool)>> {
    buf.clear();
    let mut ended = false;
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
            ended = true;
            break;
        }
    }
    if !read_any {
        return Ok(None);
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Some((!too_long, ended)))
}

#[cfg(test)]
mod tests;
