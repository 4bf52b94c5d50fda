//! The JSONL trace, `cudatrace run`'s sink: a header line, one line per event, a footer
//! line, each one of the schema's structs (`crate::schema`; docs/trace-format.md). The
//! writer keeps the footer's counts of what it wrote.

use std::io::{self, BufWriter, Write};

use serde::Serialize;

use crate::{
    events::Event,
    schema::{EventLine, Footer, GpuLine, Header},
};

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

    fn line<T: Serialize>(&mut self, value: &T) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        self.out.write_all(b"\n")
    }

    pub fn header(&mut self, header: &Header) -> io::Result<()> {
        self.line(header)?;
        // The header reaches the disk before the command starts.
        self.out.flush()
    }

    /// A decoded event, as its line.
    pub fn event(&mut self, event: &Event) -> io::Result<()> {
        match event {
            Event::Call(line) => self.write(line),
            Event::Process(line) => self.write(line),
            Event::Driver(line) => self.write(line),
            // The enrich stage turns GPU records into `GpuLine`s (see `gpu`).
            Event::Gpu(_) => Ok(()),
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

    /// A line between the header and the footer, counted in the footer.
    pub fn write<L: EventLine>(&mut self, line: &L) -> io::Result<()> {
        line.count_in(&mut self.footer);
        self.line(line)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Writes the footer and flushes; the trace is complete after this.
    pub fn finish(mut self) -> io::Result<Footer> {
        let footer = std::mem::take(&mut self.footer);
        self.line(&footer)?;
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
}
