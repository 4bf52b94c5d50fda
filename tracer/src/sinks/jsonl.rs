//! The JSONL trace, `cudatrace run`'s sink: a header line, one line per event, a footer
//! line, each one of the schema's structs (`crate::schema`; docs/trace-format.md). The
//! writer keeps the footer's counts of what it wrote.

use std::io::{self, BufWriter, Write};

use serde::Serialize;

use crate::schema::{EventLine, Footer, GpuLine, Header, Line};

/// Writes trace lines and keeps the footer's counts.
pub struct TraceWriter {
    out: BufWriter<Box<dyn Write>>,
    pub footer: Footer,
}

impl TraceWriter {
    pub fn new(out: Box<dyn Write>) -> Self {
        Self {
            out: BufWriter::with_capacity(1 << 20, out),
            footer: Footer::default(),
        }
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
            GpuLine::Gap(line) => self.write(line),
        }
    }

    /// A line between the header and the footer, counted in the footer.
    pub fn write<L: EventLine>(&mut self, line: &L) -> io::Result<()> {
        line.count_in(&mut self.footer);
        self.put(line)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Writes the footer and flushes; the trace is complete after this.
    pub fn finish(mut self) -> io::Result<Footer> {
        let footer = std::mem::take(&mut self.footer);
        self.put(&footer)?;
        self.out.flush()?;
        Ok(footer)
    }
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
        let footer = writer.finish().unwrap();
        let text = String::from_utf8(buffer.0.borrow().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[..4], written);
        let events = serde_json::to_value(&footer.events).unwrap();
        assert_eq!(
            (&events["call"], &events["process"], &events["gpu_info"]),
            (&1.into(), &2.into(), &1.into())
        );
    }
}
