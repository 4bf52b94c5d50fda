//! Each process's rank in the job, known before the first row is written: its rank on
//! the largest communicator it made with `ncclCommInitRank*` (the first such, where it
//! made several: the world communicator a launcher's job makes), read in a pass over
//! the trace ahead of the export. The pass looks only at lines that open as the writer
//! writes a communicator's creation, and is skipped when the footer counts none.

use std::{
    collections::HashMap,
    fs::File,
    io::{self, Read, Seek, SeekFrom},
};

use memchr::memmem;

use crate::schema::{self, Line};

/// What the writer writes at the start of a communicator's creation.
const NEEDLE: &[u8] = br#""type":"call","name":"ncclCommInitRank"#;
/// The functions that make a rank's communicator.
const INIT: [&str; 3] = [
    "ncclCommInitRank",
    "ncclCommInitRankConfig",
    "ncclCommInitRankScalable",
];
/// `ncclInProgress`: a nonblocking communicator is being made; its rank is known.
const IN_PROGRESS: u32 = 7;
/// The end of the trace read for its footer.
const TAIL_BYTES: u64 = 1 << 20;
/// Read at once.
const CHUNK: usize = 4 << 20;

/// Each pid's rank, where the trace says.
#[derive(Debug, Default, PartialEq)]
pub struct Ranks {
    /// pid → (nranks, rank) of its largest communicator.
    ranks: HashMap<u32, (i32, i32)>,
}

impl Ranks {
    pub fn of(&self, pid: u32) -> Option<i32> {
        self.ranks.get(&pid).map(|(_, rank)| *rank)
    }

    /// Learns from a call: a communicator made with its rank.
    pub fn learn(&mut self, call: &schema::CallLine) {
        let made = call.ok() || call.ret == Some(IN_PROGRESS);
        let (Some(rank), Some(nranks)) = (call.rank, call.nranks) else {
            return;
        };
        if !made || !INIT.contains(&call.name.as_str()) {
            return;
        }
        let known = self.ranks.entry(call.pid).or_insert((nranks, rank));
        if nranks > known.0 {
            *known = (nranks, rank);
        }
    }

    /// Reads `file` (from its start) for the communicators its processes made.
    pub fn read(file: &mut File) -> io::Result<Ranks> {
        let mut ranks = Ranks::default();
        if !may_make_communicators(file)? {
            return Ok(ranks);
        }
        file.rewind()?;
        let finder = memmem::Finder::new(NEEDLE);
        let mut buffer = vec![0u8; CHUNK];
        // Bytes of a line not ended at the end of the last read.
        let mut kept = 0;
        loop {
            if kept == buffer.len() {
                // A line longer than the buffer: no creation is that long.
                kept = 0;
            }
            let read = file.read(&mut buffer[kept..])?;
            let filled = kept + read;
            let whole = match memchr::memrchr(b'\n', &buffer[..filled]) {
                Some(last) if read > 0 => last + 1,
                _ => filled,
            };
            for at in finder.find_iter(&buffer[..whole]) {
                let start = memchr::memrchr(b'\n', &buffer[..at]).map_or(0, |nl| nl + 1);
                let end = memchr::memchr(b'\n', &buffer[at..whole]).map_or(whole, |nl| at + nl);
                if let Ok(Line::Call(call)) = schema::parse(&buffer[start..end]) {
                    ranks.learn(&call);
                }
            }
            if read == 0 {
                return Ok(ranks);
            }
            buffer.copy_within(whole..filled, 0);
            kept = filled - whole;
        }
    }
}

/// Whether the trace may hold a communicator's creation: not when its footer counts
/// none (a trace without a footer may).
fn may_make_communicators(file: &mut File) -> io::Result<bool> {
    let length = file.seek(SeekFrom::End(0))?;
    let start = length.saturating_sub(TAIL_BYTES);
    file.seek(SeekFrom::Start(start))?;
    let mut tail = Vec::new();
    file.take(TAIL_BYTES).read_to_end(&mut tail)?;
    let text = tail.strip_suffix(b"\n").unwrap_or(&tail);
    let last = memchr::memrchr(b'\n', text).map_or(text, |nl| &text[nl + 1..]);
    let Ok(footer) = serde_json::from_slice::<serde_json::Value>(last) else {
        return Ok(true);
    };
    if footer.get("type").and_then(|t| t.as_str()) != Some("footer") {
        return Ok(true);
    }
    let Some(calls) = footer.get("calls_by_name").and_then(|c| c.as_object()) else {
        return Ok(true);
    };
    Ok(calls
        .keys()
        .any(|name| name.starts_with("ncclCommInitRank")))
}

#[cfg(test)]
mod tests {
    use std::{
        io::Write,
        sync::atomic::{AtomicUsize, Ordering},
    };

    use super::*;

    fn file_of(text: &str) -> File {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "cudatrace-ranks-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::File::create(&path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let file = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }

    fn init(pid: u32, name: &str, rank: i32, nranks: i32, ret: u32) -> String {
        format!(
            r#"{{"type":"call","name":"{name}","pid":{pid},"tid":{pid},"ts_ns":1,"dur_ns":1,"ret":{ret},"comm":"0x10","rank":{rank},"nranks":{nranks}}}"#
        )
    }

    #[test]
    fn each_process_gets_its_rank_on_its_largest_communicator() {
        let lines = [
            r#"{"type":"header","pids":[1]}"#.to_owned(),
            init(1, "ncclCommInitRank", 0, 2, 0),
            init(1, "ncclCommInitRankConfig", 3, 8, 0),
            init(1, "ncclCommInitRank", 1, 8, 0),
            init(2, "ncclCommInitRank", 5, 8, 7),
            init(3, "ncclCommInitRank", 2, 8, 1),
            init(4, "ncclCommCount", 2, 8, 0),
            r#"{"type":"footer","calls_by_name":{"ncclCommInitRank":4}}"#.to_owned(),
        ];
        let ranks = Ranks::read(&mut file_of(&(lines.join("\n") + "\n"))).unwrap();
        assert_eq!(
            [1, 2, 3, 4].map(|pid| ranks.of(pid)),
            [Some(3), Some(5), None, None]
        );
        // A footer that counts no creation: not read at all.
        let without = [
            lines[0].clone(),
            lines[1].clone(),
            r#"{"type":"footer","calls_by_name":{"cuInit":1}}"#.to_owned(),
        ];
        let ranks = Ranks::read(&mut file_of(&without.join("\n"))).unwrap();
        assert_eq!(ranks, Ranks::default());
        // No footer: read.
        let cut = [lines[0].clone(), lines[1].clone()];
        let ranks = Ranks::read(&mut file_of(&cut.join("\n"))).unwrap();
        assert_eq!(ranks.of(1), Some(0));
    }
}
