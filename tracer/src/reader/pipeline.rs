//! Reading and parsing on worker threads: one thread cuts the file into blocks of whole
//! lines, workers parse the blocks in turn, and the reader takes their lines back in order.

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
    /// Lines, and whether the last ended with a newline (all but perhaps the file's last).
    Lines(Vec<Prepared<X>>, bool),
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
    /// The block's last line ended with a newline.
    last_ended: bool,
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
            last_ended: true,
            ended: false,
            reading: Some(reading),
        }
    }
}

impl<X> Pipeline<X> {
    /// Moves to the next line: `Ok(())` if it is well-formed (see
    /// [`current`](Pipeline::current)), else why not, and whether it ended with a newline;
    /// `None` at the end.
    pub fn advance(&mut self) -> io::Result<Option<(Result<(), String>, bool)>> {
        loop {
            let next = self.position.map_or(0, |position| position + 1);
            let last = next + 1 == self.current.len();
            if let Some(parsed) = self.current.get_mut(next) {
                self.position = Some(next);
                let parsed = match parsed {
                    Ok(_) => Ok(()),
                    Err(message) => Err(std::mem::take(message)),
                };
                return Ok(Some((parsed, !last || self.last_ended)));
            }
            if self.ended {
                return Ok(None);
            }
            // A worker gone (the lines no longer wanted) frees nothing more.
            let used = std::mem::take(&mut self.current);
            let _ = self.used[self.worker].send(used);
            self.position = None;
            match self.batches[self.next_worker].recv() {
                Ok(Batch::Lines(lines, last_ended)) => {
                    self.current = lines;
                    self.last_ended = last_ended;
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
                // The file's last line, without its newline.
                let last_ended = start == bytes.len();
                if !last_ended {
                    lines.push(line(&bytes[start..]));
                }
                Batch::Lines(lines, last_ended)
            }
            Block::TooLong => Batch::Lines(vec![Err(too_long_message())], true),
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
