//! `--power`: the event loop's end of the NVML sampler (`power::sampler`), a second source
//! beside the ring buffer. Its lines go through the same pipeline (enrich, then the sinks).

use std::io;

use tokio::sync::mpsc::Receiver;

use crate::{
    power::sampler::{Batch, STOP_TIMEOUT, Sampler},
    schema::{PowerFooter, PowerLine},
};

pub struct PowerFeed {
    pub sampler: Sampler,
    pub receiver: Receiver<Batch>,
}

impl PowerFeed {
    /// Stops the sampler (it takes one last sample), gives what it still sends to `write`,
    /// and returns its figures. A sampler that does not stop in time is left behind, and
    /// the figures say so.
    pub async fn finish(
        mut self,
        mut write: impl FnMut(&[PowerLine]) -> io::Result<()>,
    ) -> io::Result<PowerFooter> {
        self.sampler.request_stop();
        let drained = tokio::time::timeout(STOP_TIMEOUT, async {
            while let Some(batch) = self.receiver.recv().await {
                write(&batch)?;
            }
            io::Result::Ok(())
        })
        .await;
        match drained {
            Ok(result) => {
                result?;
                Ok(self.sampler.join())
            }
            Err(_) => Ok(PowerFooter {
                error: Some(format!(
                    "the NVML sampler did not stop within {} s: its last samples are missing",
                    STOP_TIMEOUT.as_secs()
                )),
                ..PowerFooter::default()
            }),
        }
    }
}
