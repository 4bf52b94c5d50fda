//! Reading a trace file line by line, for `summary`, `export` and `plot`: one line in
//! memory at a time, each parsed by [`schema::parse`]. A malformed line is an error naming
//! the file and the line, or, with `--skip-bad-lines`, counted and passed over.

use std::{
    fs::File,
    io::{self, BufRead},
};

use crate::schema::{self, Line, SpareCalls};

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
                    parsed.map(|parsed| parsed.map(|prepared| *current = Some(prepared)))
                }),
                Source::Workers(pipeline) => pipeline.advance(),
            };
            let next = next.map_err(|source| ReadError::Io {
                file: self.file.clone(),
                source,
            })?;
            let Some(next) = next else {
                return Ok(None);
            };
            self.lines += 1;
            match next {
                Ok(()) => break,
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
        Ok(match &mut self.source {
            Source::Here { current, .. } => current.as_mut().map(|(line, x)| (line, x)),
            Source::Workers(pipeline) => pipeline.current(),
        })
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
        }
    }
}

/// Parses a line, without its newline and a trailing CR, and prepares it; a call goes
/// into one of `spare_calls` if there is one ([`schema::parse_reusing`]).
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
    schema::parse_reusing(line, spare_calls).map(|parsed| {
        let prepared = prepare(line, &parsed);
        (parsed, prepared)
    })
}

fn too_long<X>() -> Prepared<X> {
    Err(too_long_message())
}

fn too_long_message() -> String {
    format!("line longer than {} MiB", MAX_LINE_BYTES >> 20)
}

/// The next line of `reader`, parsed and prepared; `None` at the end.
fn read_here<X>(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    prepare: Prepare<X>,
) -> io::Result<Option<Prepared<X>>> {
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
            return Ok(Some(parsed));
        }
        return Ok(
            read_line(reader, buf, MAX_LINE_BYTES)?.map(|kept| match kept {
                true => parse_prepared(buf, prepare, &mut Vec::new()),
                false => too_long(),
            }),
        );
    }
}

/// Reading and parsing on worker threads: one thread cuts the file into blocks of whole
/// lines, workers parse the blocks in turn, and the reader takes their lines back in order.
mod pipeline {
    use std::{
        fs::File,
        io::{self, Read},
        sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel},
        thread,
    };

    use super::{
        Line, MAX_LINE_BYTES, Prepare, Prepared, SpareCalls, parse_line, too_long, too_long_message,
    };

    /// Bytes read for a block; it is cut after its last newline.
    const BLOCK_BYTES: usize = 256 << 10;
    /// Most parser threads (the callers do little per line besides).
    const MAX_WORKERS: usize = 4;
    /// Boxes of calls a worker keeps for reuse: about a block's lines.
    const MAX_SPARE_CALLS: usize = 1024;

    enum Block {
        /// Whole lines, each ending with a newline but perhaps the file's last.
        Lines(Vec<u8>),
        /// A line over [`MAX_LINE_BYTES`], skipped.
        TooLong,
        Failed(io::Error),
    }

    enum Batch<X> {
        Lines(Vec<Prepared<X>>),
        Failed(io::Error),
        /// The file ended: sent by the worker whose turn came after the last block.
        End,
    }

    pub struct Pipeline<X> {
        /// Each worker's parsed blocks; block `n` comes from worker `n % workers`.
        batches: Vec<Receiver<Batch<X>>>,
        /// Blocks of lines used up, back to the worker that parsed them: their memory is
        /// freed (and reused) there.
        used: Vec<Sender<Vec<Prepared<X>>>>,
        next_worker: usize,
        /// The block being read, from `worker`, and the line lent.
        current: Vec<Prepared<X>>,
        worker: usize,
        position: Option<usize>,
        ended: bool,
        /// The thread cutting the file into blocks, joined at the end.
        reading: Option<thread::JoinHandle<()>>,
    }

    impl<X: Send + 'static> Pipeline<X> {
        pub fn start(file: File, prepare: Prepare<X>) -> Pipeline<X> {
            let workers = thread::available_parallelism()
                .map_or(1, usize::from)
                .clamp(1, MAX_WORKERS);
            let mut blocks = Vec::with_capacity(workers);
            let mut batches = Vec::with_capacity(workers);
            let mut used = Vec::with_capacity(workers);
            for _ in 0..workers {
                let (block_sender, block_receiver) = sync_channel::<Block>(1);
                let (batch_sender, batch_receiver) = sync_channel::<Batch<X>>(1);
                let (used_sender, used_receiver) = channel::<Vec<Prepared<X>>>();
                thread::spawn(move || {
                    parse_blocks(&block_receiver, &batch_sender, &used_receiver, prepare);
                });
                blocks.push(block_sender);
                batches.push(batch_receiver);
                used.push(used_sender);
            }
            let reading = thread::spawn(move || cut_blocks(file, &blocks));
            Pipeline {
                batches,
                used,
                next_worker: 0,
                current: Vec::new(),
                worker: 0,
                position: None,
                ended: false,
                reading: Some(reading),
            }
        }
    }

    impl<X> Pipeline<X> {
        /// Moves to the next line: `Ok(())` if it is well-formed (see
        /// [`current`](Pipeline::current)), else why not; `None` at the end.
        pub fn advance(&mut self) -> io::Result<Option<Result<(), String>>> {
            loop {
                let next = self.position.map_or(0, |position| position + 1);
                if let Some(parsed) = self.current.get_mut(next) {
                    self.position = Some(next);
                    return Ok(Some(match parsed {
                        Ok(_) => Ok(()),
                        Err(message) => Err(std::mem::take(message)),
                    }));
                }
                if self.ended {
                    return Ok(None);
                }
                // A worker gone (the lines no longer wanted) frees nothing more.
                let used = std::mem::take(&mut self.current);
                let _ = self.used[self.worker].send(used);
                self.position = None;
                match self.batches[self.next_worker].recv() {
                    Ok(Batch::Lines(lines)) => {
                        self.current = lines;
                        self.worker = self.next_worker;
                        self.next_worker = (self.next_worker + 1) % self.batches.len();
                    }
                    Ok(Batch::Failed(error)) => {
                        self.ended = true;
                        return Err(error);
                    }
                    Ok(Batch::End) => {
                        self.ended = true;
                        // It has returned (its blocks are all taken), unless it panicked.
                        if self
                            .reading
                            .take()
                            .is_some_and(|reading| reading.join().is_err())
                        {
                            return Err(io::Error::other("the reading thread stopped"));
                        }
                    }
                    // A worker gone without saying the file ended (it panicked): the lines
                    // after its last block would be missing.
                    Err(_) => {
                        self.ended = true;
                        return Err(io::Error::other("a reader thread stopped before the end"));
                    }
                }
            }
        }

        /// The line [`advance`](Pipeline::advance) moved to, if well-formed.
        pub fn current(&mut self) -> Option<(&mut Line, &mut X)> {
            match self.current.get_mut(self.position?) {
                Some(Ok((line, prepared))) => Some((line, prepared)),
                _ => None,
            }
        }
    }

    /// A worker: parses the blocks it is given until there are no more, or the lines are
    /// no longer wanted.
    fn parse_blocks<X>(
        blocks: &Receiver<Block>,
        batches: &SyncSender<Batch<X>>,
        used: &Receiver<Vec<Prepared<X>>>,
        prepare: Prepare<X>,
    ) {
        let mut spare = Vec::new();
        let mut spare_calls = SpareCalls::new();
        for block in blocks {
            // Lines used up are dropped here, where they were allocated; their calls'
            // boxes are kept for the next lines (a block's worth at most).
            while let Ok(mut lines) = used.try_recv() {
                for line in lines.drain(..) {
                    if let (Ok((Line::Call(call), _)), true) =
                        (line, spare_calls.len() < MAX_SPARE_CALLS)
                    {
                        spare_calls.push(call);
                    }
                }
                spare = lines;
            }
            let batch = match block {
                Block::Lines(bytes) => {
                    let mut lines = std::mem::take(&mut spare);
                    let mut start = 0;
                    let mut line = |line: &[u8]| match line.len() > MAX_LINE_BYTES {
                        true => too_long(),
                        false => parse_line(line, prepare, &mut spare_calls),
                    };
                    for end in memchr::memchr_iter(b'\n', &bytes) {
                        lines.push(line(&bytes[start..end]));
                        start = end + 1;
                    }
                    if start < bytes.len() {
                        lines.push(line(&bytes[start..]));
                    }
                    Batch::Lines(lines)
                }
                Block::TooLong => Batch::Lines(vec![Err(too_long_message())]),
                Block::Failed(error) => Batch::Failed(error),
            };
            if batches.send(batch).is_err() {
                return;
            }
        }
        // No more blocks: the file ended (or the lines are no longer wanted).
        let _ = batches.send(Batch::End);
    }

    /// The reading thread: blocks of whole lines to the workers in turn.
    fn cut_blocks(mut file: File, workers: &[SyncSender<Block>]) {
        let mut turn = 0;
        let mut send = |block: Block| -> bool {
            let sent = workers[turn].send(block).is_ok();
            turn = (turn + 1) % workers.len();
            sent
        };
        // The start of a line that the last block did not finish.
        let mut carry: Vec<u8> = Vec::new();
        loop {
            let mut block = std::mem::take(&mut carry);
            let ended = match fill(&mut file, &mut block, BLOCK_BYTES) {
                Ok(ended) => ended,
                Err(error) => {
                    send(Block::Failed(error));
                    return;
                }
            };
            match memchr::memrchr(b'\n', &block) {
                Some(last) if !ended => carry = block.split_off(last + 1),
                // A line longer than a block: read on until it ends.
                None if !ended => {
                    carry = block;
                    if carry.len() > MAX_LINE_BYTES {
                        match skip_line(&mut file, &mut carry) {
                            Ok(()) => {}
                            Err(error) => {
                                send(Block::Failed(error));
                                return;
                            }
                        }
                        if !send(Block::TooLong) {
                            return;
                        }
                    }
                    continue;
                }
                _ => {}
            }
            if !block.is_empty() && !send(Block::Lines(block)) {
                return;
            }
            if ended {
                return;
            }
        }
    }

    /// Reads until `block` holds `want` more bytes or the file ends (`true`).
    fn fill(file: &mut File, block: &mut Vec<u8>, want: usize) -> io::Result<bool> {
        let start = block.len();
        block.reserve(want);
        let read = file.by_ref().take(want as u64).read_to_end(block)?;
        debug_assert_eq!(block.len(), start + read);
        Ok(read < want)
    }

    /// Reads past the rest of an over-long line; `carry` becomes what follows it.
    fn skip_line(file: &mut File, carry: &mut Vec<u8>) -> io::Result<()> {
        carry.clear();
        loop {
            let ended = fill(file, carry, BLOCK_BYTES)?;
            if let Some(end) = memchr::memchr(b'\n', carry) {
                carry.drain(..=end);
                return Ok(());
            }
            carry.clear();
            if ended {
                return Ok(());
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
            out.push(std::mem::replace(line, Line::Unknown));
        }
        Ok(out)
    }

    /// Everything a reader gives: each line (as text), then how it ended, and the counts.
    fn outcome<R: BufRead>(mut reader: TraceLines<R>) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            match reader.next_line() {
                Ok(Some(line)) => seen.push(format!("{line:?}")),
                Ok(None) => {
                    seen.push("end".into());
                    break;
                }
                Err(e) => {
                    seen.push(e.to_string());
                    break;
                }
            }
        }
        seen.push(format!(
            "{} lines, {} skipped, first {:?}",
            reader.lines, reader.skipped_lines, reader.first_skipped
        ));
        seen
    }

    /// A file with `text`, removed when dropped.
    struct TempTrace(std::path::PathBuf);

    impl TempTrace {
        fn new(name: &str, text: &[u8]) -> TempTrace {
            let path = std::env::temp_dir().join(format!(
                "cudatrace-reader-{}-{name}.jsonl",
                std::process::id()
            ));
            std::fs::write(&path, text).unwrap();
            TempTrace(path)
        }

        fn open(&self, skip: bool) -> TraceLines<io::Empty> {
            TraceLines::from_file(File::open(&self.0).unwrap(), "t.jsonl", skip)
        }
    }

    impl Drop for TempTrace {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Several blocks of lines, with CRLF, empty and malformed lines among them and no
    /// newline at the end: the workers give what this thread gives, in order.
    #[test]
    fn the_workers_read_what_this_thread_reads() {
        let mut text = String::new();
        for index in 0..6000u64 {
            match index % 997 {
                13 => text.push_str("not json\n"),
                14 => text.push('\n'),
                15 => text.push_str("{\"type\":\"footer\"}\r\n"),
                _ => text.push_str(&format!(
                    "{{\"type\":\"call\",\"name\":\"cuInit\",\"pid\":1,\"tid\":1,\"ts_ns\":{index},\"dur_ns\":1,\"ret\":0,\"kernel\":\"{}\"}}\n",
                    "k".repeat(index as usize % 200)
                )),
            }
        }
        text.push_str("{\"type\":\"footer\"}");
        assert!(text.len() > 3 * (256 << 10), "several blocks");
        let file = TempTrace::new("blocks", text.as_bytes());
        for skip in [false, true] {
            let here = outcome(TraceLines::new(text.as_bytes(), "t.jsonl", skip));
            let workers = outcome(file.open(skip));
            assert_eq!(here.len(), workers.len(), "skip {skip}");
            assert!(here == workers, "skip {skip}");
        }
        let all = outcome(file.open(true));
        assert_eq!(all.len(), 6000 - 2 * 7 + 1 + 2);
        assert_eq!(
            all.last().unwrap(),
            "6001 lines, 14 skipped, first [(14, \"expected ident at column 2\"), \
             (15, \"EOF while parsing a value at column 0\"), \
             (1011, \"expected ident at column 2\"), \
             (1012, \"EOF while parsing a value at column 0\"), \
             (2008, \"expected ident at column 2\")]"
        );
    }

    #[test]
    fn the_workers_skip_overlong_lines_and_report_missing_files() {
        let mut text = vec![b'x'; MAX_LINE_BYTES + 1];
        text.extend_from_slice(b"\n{\"type\":\"footer\"}\n");
        let file = TempTrace::new("long", &text);
        let here = outcome(TraceLines::new(&text[..], "t.jsonl", true));
        let workers = outcome(file.open(true));
        assert_eq!(here, workers);
        assert_eq!(
            workers,
            [
                "Footer(FooterFigures { lost_total: None, exit_code: None })",
                "end",
                "2 lines, 1 skipped, first [(1, \"line longer than 64 MiB\")]"
            ]
        );
        assert_eq!(
            outcome(file.open(false))[0],
            "t.jsonl:1: line longer than 64 MiB (--skip-bad-lines reads past malformed lines)"
        );
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
