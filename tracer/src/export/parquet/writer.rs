//! The Parquet encoding (dictionaries, levels, compression) on a thread of its own: the
//! export's thread builds the rows' arrays while this one encodes the batches before, on
//! a core the trace's parsers leave free.

use std::{
    fs::File,
    sync::{
        Arc, OnceLock,
        mpsc::{Receiver, SyncSender, sync_channel},
    },
    thread::JoinHandle,
};

use arrow_array::RecordBatch;
use parquet::{arrow::ArrowWriter, errors::ParquetError};

/// Batches waiting to be encoded, at most (about 2 MB each for `calls`).
const IN_FLIGHT: usize = 2;

/// Where a table's batches go: the encoder thread, to the table's writer.
pub struct Sink {
    index: usize,
    sender: SyncSender<(usize, RecordBatch)>,
    failure: Arc<OnceLock<String>>,
}

impl Sink {
    pub fn write(&self, batch: RecordBatch) -> Result<(), ParquetError> {
        self.sender
            .send((self.index, batch))
            .map_err(|_| self.failed())
    }

    /// Why the encoder stopped.
    fn failed(&self) -> ParquetError {
        let why = self.failure.get().map_or("it stopped", String::as_str);
        ParquetError::General(format!("the Parquet writer failed: {why}"))
    }
}

/// The encoder thread and its channel, before the writers are handed to it.
pub struct Encoder {
    sender: SyncSender<(usize, RecordBatch)>,
    receiver: Receiver<(usize, RecordBatch)>,
    failure: Arc<OnceLock<String>>,
}

impl Encoder {
    pub fn new() -> Self {
        let (sender, receiver) = sync_channel(IN_FLIGHT);
        Encoder {
            sender,
            receiver,
            failure: Arc::default(),
        }
    }

    /// The sink of the table whose writer will be `writers[index]`.
    pub fn sink(&self, index: usize) -> Sink {
        Sink {
            index,
            sender: self.sender.clone(),
            failure: self.failure.clone(),
        }
    }

    /// Starts encoding into `writers`; the thread ends once every sink is dropped, with
    /// every file closed (its footer written).
    pub fn start(self, writers: Vec<ArrowWriter<File>>) -> Running {
        let Encoder {
            sender,
            receiver,
            failure,
        } = self;
        drop(sender);
        let thread = std::thread::Builder::new()
            .name("parquet".into())
            .spawn(move || {
                let result = encode(receiver, writers);
                if let Err(e) = &result {
                    let _ = failure.set(e.to_string());
                }
                result
            })
            .expect("starting the Parquet writer's thread");
        Running { thread }
    }
}

fn encode(
    receiver: Receiver<(usize, RecordBatch)>,
    mut writers: Vec<ArrowWriter<File>>,
) -> Result<(), ParquetError> {
    for (index, batch) in receiver {
        writers[index].write(&batch)?;
    }
    for writer in writers {
        writer.close()?;
    }
    Ok(())
}

/// The encoder thread at work.
pub struct Running {
    thread: JoinHandle<Result<(), ParquetError>>,
}

impl Running {
    /// Waits for the files to be written (every sink dropped first).
    pub fn finish(self) -> Result<(), ParquetError> {
        self.thread
            .join()
            .unwrap_or_else(|_| Err(ParquetError::General("the Parquet writer panicked".into())))
    }
}
