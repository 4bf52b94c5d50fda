//! `--power`: the event loop's end of the NVML sampler (`power::sampler`), a second source
//! beside the ring buffer. Its lines go through the same pipeline (enrich, then the sinks).

use std::io;

use tokio::sync::mpsc::Receiver;

use super::pipeline::Pipeline;
use crate::{
    power::sampler::{Batch, STOP_TIMEOUT, Sampler},
    schema::PowerFooter,
};

pub struct PowerFeed {
    pub sampler: Sampler,
    pub receiver: Receiver<Batch>,
}

impl PowerFeed {
    /// Stops the sampler (it takes one last sample), writes what it still sends, and
    /// returns its figures. A sampler that does not stop in time is left behind, and the
    /// figures say so.
    pub async fn finish(mut self, pipeline: &mut Pipeline<'_>) -> io::Result<PowerFooter> {
        self.sampler.request_stop();
        let drained = tokio::time::timeout(STOP_TIMEOUT, async {
            while let Some(batch) = self.receiver.recv().await {
                pipeline.power(&batch)?;
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
