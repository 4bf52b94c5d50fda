//! The JSONL trace, `cudatrace run`'s sink: a header line, one line per event, a footer
//! line, each one of the schema's structs (`crate::schema`; docs/trace-format.md). The
//! writer keeps the footer's counts of what it wrote.
//!
//! A write that fails (a full disk, a closed pipe) stops the writing, never the run: the
//! writer keeps the first error ([`TraceWriter::failed`]), counts what it could not write,
//! and at the end cuts the file back to its last whole line, recounts what is there and
//! writes the footer after it, in room kept for it from the start (a range allocated far
//! past the end of the file, given back then).

use std::{
    fs::File,
    io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write},
    os::fd::AsRawFd,
};

use serde::Serialize;

use crate::schema::{self, EventLine, Footer, GpuLine, Header, Line};

/// Room kept for the footer, and where: far past any trace's end, so the trace's own
/// writes never use it.
const FOOTER_ROOM: libc::off_t = 64 << 10;
const FOOTER_ROOM_AT: libc::off_t = 1 << 40;

/// Writes trace lines and keeps the footer's counts.
pub struct TraceWriter {
    out: BufWriter<Box<dyn Write>>,
    pub footer: Footer,
    /// The trace file (not stdout), to recover from a failed write.
    file: Option<File>,
    /// Room was kept for the footer in `file`.
    room_kept: bool,
    /// The first write that failed: nothing more is written after it.
    failed: Option<io::Error>,
    /// Lines given to the writer after it failed.
    unwritten: u64,
}

/// What the end of the trace gave: its footer, and the write that failed, if one did.
pub struct Written {
    pub footer: Footer,
    pub failed: Option<io::Error>,
}

impl TraceWriter {
    pub fn new(out: Box<dyn Write>) -> Self {
        Self {
            out: BufWriter::with_capacity(1 << 20, out),
            footer: Footer::default(),
            file: None,
            room_kept: false,
            failed: None,
            unwritten: 0,
        }
    }

    /// A writer of the trace file `file`, with room kept for its footer where the file
    /// system allows it (a write that fails for lack of room can still be followed by a
    /// footer).
    pub fn for_file(file: File) -> Self {
        // Read and write: recovering reads the file's end back (opened again, as the same
        // file: the trace itself may have been opened write-only).
        let kept = File::options()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .ok();
        let mut writer = TraceWriter::new(Box::new(file));
        if let Some(kept) = kept {
            // SAFETY: fallocate(2) on a descriptor we own; KEEP_SIZE: the file's size
            // stays what it is.
            writer.room_kept = unsafe {
                libc::fallocate(
                    kept.as_raw_fd(),
                    libc::FALLOC_FL_KEEP_SIZE,
                    FOOTER_ROOM_AT,
                    FOOTER_ROOM,
                )
            } == 0;
            writer.file = Some(kept);
        }
        writer
    }

    fn put<T: Serialize>(&mut self, value: &T) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        self.out.write_all(b"\n")
    }

    pub fn header(&mut self, header: &Header) -> io::Result<()> {
        self.put(header)?;
        // The header reaches the disk before the command starts.
        self.out.flush()
    }

    /// A line of the trace: the header, or a line counted in the footer.
    pub fn line(&mut self, line: &Line) -> io::Result<()> {
        match line {
            Line::Header(header) => self.header(header),
            Line::Call(line) => self.write(&**line),
            Line::Process(line) => self.write(line),
            Line::Lost(line) => self.write(line),
            Line::Driver(line) => self.write(&**line),
            Line::Power(line) => self.write(&**line),
            Line::Gpu(line) => self.gpu(line),
            Line::Library(line) => self.write(&**line),
            // The footer is written from the writer's own counts (`finish`); a line of an
            // unknown type is only ever read.
            Line::Footer(_) | Line::Unknown => Ok(()),
        }
    }

    /// A `--gpu` line.
    pub fn gpu(&mut self, line: &GpuLine) -> io::Result<()> {
        match line {
            GpuLine::Kernel(line) => self.write(line),
            GpuLine::Copy(line) => self.write(line),
            GpuLine::Memset(line) => self.write(line),
            GpuLine::Info(line) => self.write(line),
            GpuLine::Error(line) => self.write(line),
        }
    }

    /// A line between the header and the footer, counted in the footer. A failed write
    /// is kept ([`Self::failed`]), not returned: the run goes on without writing.
    pub fn write<L: EventLine>(&mut self, line: &L) -> io::Result<()> {
        if self.failed.is_some() {
            self.unwritten += 1;
            return Ok(());
        }
        line.count_in(&mut self.footer);
        if let Err(error) = self.put(line) {
            self.failed = Some(error);
        }
        Ok(())
    }

    /// The first write that failed.
    pub fn failed(&self) -> Option<&io::Error> {
        self.failed.as_ref()
    }

    pub fn flush(&mut self) -> io::Result<()> {
        if self.failed.is_none()
            && let Err(error) = self.out.flush()
        {
            self.failed = Some(error);
        }
        Ok(())
    }

    /// Writes the footer and flushes; the trace is complete after this. After a failed
    /// write, the file is cut back to its last whole line and the footer, recounted from
    /// the file and with `lost.unwritten` and an `error`, goes after it.
    pub fn finish(mut self) -> io::Result<Written> {
        if self.failed.is_none() {
            let footer = std::mem::take(&mut self.footer);
            self.put(&footer)?;
            self.out.flush()?;
            self.give_room_back();
            return Ok(Written {
                footer,
                failed: None,
            });
        }
        let failed = self.failed.take().expect("checked");
        // What is still buffered never reached the file.
        let (_, _) =
            std::mem::replace(&mut self.out, BufWriter::new(Box::new(io::sink()))).into_parts();
        self.give_room_back();
        let Some(mut file) = self.file.take() else {
            return Err(failed);
        };
        let produced = self.footer.events.total() + self.unwritten;
        cut_to_last_line(&mut file)?;
        let mut footer = std::mem::take(&mut self.footer);
        recount(&mut file, &mut footer)?;
        let unwritten = produced.saturating_sub(footer.events.total());
        footer.lost.unwritten = Some(unwritten);
        footer.lost.total += unwritten;
        footer.error.get_or_insert_with(|| {
            format!(
                "writing the trace failed ({failed}): recording stopped there; {unwritten} \
                 lines are missing"
            )
        });
        file.seek(SeekFrom::End(0))?;
        let mut line = serde_json::to_vec(&footer)?;
        line.push(b'\n');
        file.write_all(&line)?;
        Ok(Written {
            footer,
            failed: Some(failed),
        })
    }

    /// The footer's room, given back to the file system.
    fn give_room_back(&mut self) {
        if let (true, Some(file)) = (self.room_kept, &self.file) {
            // SAFETY: fallocate(2) on a descriptor we own: the range goes back to the
            // file system, the file's size stays.
            unsafe {
                libc::fallocate(
                    file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    FOOTER_ROOM_AT,
                    FOOTER_ROOM,
                )
            };
            self.room_kept = false;
        }
    }
}

/// Cuts `file` after its last newline: a line half written is no line.
fn cut_to_last_line(file: &mut File) -> io::Result<()> {
    let length = file.seek(SeekFrom::End(0))?;
    let mut end = length;
    let mut block = vec![0u8; 64 << 10];
    while end > 0 {
        let start = end.saturating_sub(block.len() as u64);
        let chunk = &mut block[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        if let Some(newline) = memchr::memrchr(b'\n', chunk) {
            return file.set_len(start + newline as u64 + 1);
        }
        end = start;
    }
    file.set_len(0)
}

/// The footer's counts of what `file` holds (its header not counted), as the writer would
/// have counted it.
fn recount(file: &mut File, footer: &mut Footer) -> io::Result<()> {
    footer.events = Default::default();
    footer.calls_by_name.clear();
    file.seek(SeekFrom::Start(0))?;
    let mut counter = TraceWriter::new(Box::new(io::sink()));
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    while reader.read_until(b'\n', &mut line)? > 0 {
        let bytes = line.strip_suffix(b"\n").unwrap_or(&line);
        if let Ok(parsed) = schema::parse(bytes)
            && !matches!(parsed, Line::Header(_))
        {
            counter.line(&parsed)?;
        }
        line.clear();
    }
    footer.events = counter.footer.events;
    footer.calls_by_name = counter.footer.calls_by_name;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{CallLine, LostLine};
    use std::{cell::RefCell, rc::Rc};

    #[derive(Clone, Default)]
    struct Shared(Rc<RefCell<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn footer_counts_what_was_written() {
        let buffer = Shared::default();
        let mut writer = TraceWriter::new(Box::new(buffer.clone()));
        let record = CallLine {
            name: "cuInit".into(),
            ..Default::default()
        };
        writer.write(&record).unwrap();
        writer.write(&record).unwrap();
        writer
            .write(&LostLine {
                ts_ns: 1,
                reason: "ring_full".into(),
                count: 3,
                total: 3,
                ..LostLine::default()
            })
            .unwrap();
        writer.footer.lost.total = 3;
        writer.finish().unwrap();
        let text = String::from_utf8(buffer.0.borrow().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        let footer = &lines[3];
        assert_eq!(footer["type"], "footer");
        assert_eq!(footer["events"]["call"], 2);
        assert_eq!(footer["events"]["lost"], 1);
        assert_eq!(footer["calls_by_name"]["cuInit"], 2);
        assert_eq!(footer["lost"]["total"], 3);
    }

    /// Each line a reader reads back is written as it is read, and counted.
    #[test]
    fn lines_are_written_as_they_are_read_back() {
        let written = [
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":2,"dur_ns":3,"ret":0}"#,
            r#"{"type":"process","event":"exec","pid":1,"tid":1,"ts_ns":4,"filename":"/a"}"#,
            r#"{"type":"process","event":"vfork","pid":1,"tid":1,"ts_ns":5}"#,
            r#"{"type":"gpu_info","pid":1,"ts_ns":6,"cupti_version":130000,"libcupti":"/c","clock":"monotonic"}"#,
        ];
        let buffer = Shared::default();
        let mut writer = TraceWriter::new(Box::new(buffer.clone()));
        for text in written {
            writer
                .line(&crate::schema::parse(text.as_bytes()).unwrap())
                .unwrap();
        }
        let footer = writer.finish().unwrap().footer;
        let text = String::from_utf8(buffer.0.borrow().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[..4], written);
        let events = serde_json::to_value(&footer.events).unwrap();
        assert_eq!(
            (&events["call"], &events["process"], &events["gpu_info"]),
            (&1.into(), &2.into(), &1.into())
        );
    }

    /// A file that takes `room` bytes, then fails as a full disk does.
    struct FullAfter(File, usize);
    impl Write for FullAfter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.1 == 0 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let n = buf.len().min(self.1);
            self.1 -= n;
            self.0.write(&buf[..n])
        }
        fn flush(&mut self) -> io::Result<()> {
            self.0.flush()
        }
    }

    #[test]
    fn a_failed_write_leaves_whole_lines_and_a_footer_counting_them() {
        let path = std::env::temp_dir().join(format!("cudatrace-full-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        let kept = File::options().read(true).write(true).open(&path).unwrap();
        let mut writer = TraceWriter::new(Box::new(FullAfter(file, 300)));
        writer.file = Some(kept);
        let call = |name: &str| CallLine {
            name: name.into(),
            ..Default::default()
        };
        // About 60 bytes a line: the fifth is cut, the rest never written.
        for index in 0..10 {
            writer.write(&call(&format!("cuCall{index}"))).unwrap();
            writer.flush().unwrap();
        }
        assert_eq!(
            writer.failed().map(io::Error::raw_os_error),
            Some(Some(libc::ENOSPC))
        );
        let written = writer.finish().unwrap();
        assert_eq!(written.failed.unwrap().raw_os_error(), Some(libc::ENOSPC));
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let calls = lines.len() as u64 - 1;
        assert!(
            lines
                .iter()
                .all(|line| serde_json::from_str::<serde_json::Value>(line).is_ok())
        );
        assert!(lines.last().unwrap().starts_with(r#"{"type":"footer""#));
        assert_eq!(written.footer.events.call, calls);
        assert_eq!(written.footer.lost.unwritten, Some(10 - calls));
        assert_eq!(written.footer.calls_by_name.len() as u64, calls);
        assert!(
            written
                .footer
                .error
                .unwrap()
                .contains(&format!("{} lines are missing", 10 - calls))
        );
    }
}
