//! `--gpu`'s output queue, between the decoder and the writer: lines go out in the order
//! they came, but a launch's line (probed at entry alone) waits for CUPTI's record of the
//! call, which gives its result and duration, and a graph's work line may wait for the
//! rest of its graph launch (to find the captured call of its node). Everything behind a
//! waiting line waits with it, so the trace's order is the ring's, as without `--gpu`.
//! A line waits [`HOLD_MAX_NS`](crate::analysis::gpu_link::HOLD_MAX_NS) at most; the queue
//! holds [`QUEUE_MAX`] lines at most (the oldest waiting line goes as it is beyond).

use std::collections::{HashMap, VecDeque};

use crate::{
    catalog::cuda_result,
    schema::{GpuLine, Line},
};

/// Lines queued at most (about 2 s of the fastest launch loop measured, with its GPU lines).
pub const QUEUE_MAX: usize = 1 << 19;

pub enum Item {
    Line(Line),
    Gpu(Box<GpuLine>),
}

struct Entry {
    item: Item,
    /// A launch line waiting for CUPTI's record of it.
    held: bool,
}

/// The queue; entries are numbered in order.
#[derive(Default)]
pub struct OutputQueue {
    entries: VecDeque<Entry>,
    /// The number of the front entry.
    first: u64,
    /// Held lines by `(pid, tid, ts_ns)`: their numbers.
    held: HashMap<(u32, u32, u64), u64>,
}

impl OutputQueue {
    pub fn push(&mut self, item: Item) {
        self.entries.push_back(Entry { item, held: false });
    }

    /// A launch line that waits for [`Self::release`].
    pub fn push_held(&mut self, line: Line) {
        if let Line::Call(call) = &line {
            let number = self.first + self.entries.len() as u64;
            self.held.insert((call.pid, call.tid, call.ts_ns), number);
        }
        self.entries.push_back(Entry {
            item: Item::Line(line),
            held: true,
        });
    }

    /// Lets a held launch line go, with CUPTI's `(result, end_ns)` where it came.
    pub fn release(&mut self, pid: u32, tid: u32, ts_ns: u64, result: Option<(u32, u64)>) {
        let Some(number) = self.held.remove(&(pid, tid, ts_ns)) else {
            return;
        };
        let Some(entry) = self.entries.get_mut((number - self.first) as usize) else {
            return;
        };
        entry.held = false;
        if let (Item::Line(Line::Call(call)), Some((result, end_ns))) = (&mut entry.item, result) {
            call.ret = Some(result);
            call.dur_ns = Some(end_ns.saturating_sub(call.ts_ns));
            if result != 0 {
                call.ret_name = cuda_result::name(result).map(Into::into);
            }
        }
    }

    /// The front item, if it may go.
    pub fn pop_ready(&mut self, force: bool) -> Option<Item> {
        let front = self.entries.front()?;
        if front.held && !force && self.entries.len() <= QUEUE_MAX {
            return None;
        }
        let entry = self.entries.pop_front()?;
        if entry.held
            && let Item::Line(Line::Call(call)) = &entry.item
        {
            self.held.remove(&(call.pid, call.tid, call.ts_ns));
        }
        self.first += 1;
        Some(entry.item)
    }

    /// Puts back an item taken by [`Self::pop_ready`] that cannot go yet.
    pub fn put_back(&mut self, item: Item) {
        self.first -= 1;
        self.entries.push_front(Entry { item, held: false });
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The GPU lines queued.
    pub fn gpu_lines(&self) -> impl Iterator<Item = &GpuLine> {
        self.entries.iter().filter_map(|entry| match &entry.item {
            Item::Gpu(line) => Some(&**line),
            Item::Line(_) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{CallLine, LostLine};

    fn call(ts_ns: u64) -> Line {
        Line::Call(Box::new(CallLine {
            name: "cuLaunchKernel".into(),
            pid: 1,
            tid: 2,
            ts_ns,
            ..CallLine::default()
        }))
    }

    fn ts(item: Item) -> u64 {
        match item {
            Item::Line(Line::Call(call)) => call.ts_ns,
            Item::Line(Line::Lost(lost)) => lost.ts_ns,
            _ => 0,
        }
    }

    #[test]
    fn lines_go_in_order_and_a_held_one_holds_the_rest() {
        let mut queue = OutputQueue::default();
        queue.push(Item::Line(call(1)));
        queue.push_held(call(2));
        queue.push_held(call(3));
        queue.push(Item::Line(Line::Lost(LostLine {
            ts_ns: 4,
            ..LostLine::default()
        })));
        assert_eq!(queue.pop_ready(false).map(ts), Some(1));
        assert!(queue.pop_ready(false).is_none());
        // The second held line goes first: the first still holds it.
        queue.release(1, 2, 3, None);
        assert!(queue.pop_ready(false).is_none());
        queue.release(1, 2, 2, Some((0, 52)));
        let Some(Item::Line(Line::Call(first))) = queue.pop_ready(false) else {
            panic!()
        };
        assert_eq!((first.ret, first.dur_ns), (Some(0), Some(50)));
        let Some(Item::Line(Line::Call(second))) = queue.pop_ready(false) else {
            panic!()
        };
        assert_eq!((second.ret, second.dur_ns), (None, None));
        assert_eq!(queue.pop_ready(false).map(ts), Some(4));
        assert_eq!(queue.len(), 0);
        // Forced: a held line goes as it is.
        queue.push_held(call(9));
        assert_eq!(queue.pop_ready(true).map(ts), Some(9));
        queue.release(1, 2, 9, Some((0, 10)));
        assert_eq!(queue.len(), 0);
    }
}
