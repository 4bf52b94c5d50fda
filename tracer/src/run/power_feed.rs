//! `--power`: the event loop's end of the NVML sampler (`power::sampler`), a second source
//! beside the ring buffer. Its lines go through the same pipeline (enrich, then the sinks);
//! once it ends, its figures are the footer's.

use std::io;

use tokio::sync::mpsc::Receiver;

use crate::{
    power::sampler::{Batch, STOP_TIMEOUT, Sampler},
    schema::{PowerFooter, PowerLine},
};

/// The sampler while it samples; its figures once it ended.
pub enum PowerFeed {
    Sampling {
        sampler: Sampler,
        receiver: Receiver<Batch>,
    },
    Ended(PowerFooter),
}

impl PowerFeed {
    pub fn is_sampling(&self) -> bool {
        matches!(self, PowerFeed::Sampling { .. })
    }

    /// The sampler's next batch; `None` once it ended on its own. Never ready once ended.
    pub async fn next(&mut self) -> Option<Batch> {
        match self {
            PowerFeed::Sampling { receiver, .. } => receiver.recv().await,
            PowerFeed::Ended(_) => std::future::pending().await,
        }
    }

    /// The sampler ended on its own: its figures say why.
    pub fn ended(self) -> Self {
        match self {
            PowerFeed::Sampling { sampler, .. } => PowerFeed::Ended(sampler.join()),
            ended => ended,
        }
    }

    /// Stops the sampler (it takes one last sample), gives what it still sends to `write`,
    /// and keeps its figures. A sampler that does not stop in time is left behind, and the
    /// figures say so.
    pub async fn finish(
        self,
        mut write: impl FnMut(&[PowerLine]) -> io::Result<()>,
    ) -> io::Result<Self> {
        let (sampler, mut receiver) = match self {
            PowerFeed::Sampling { sampler, receiver } => (sampler, receiver),
            ended => return Ok(ended),
        };
        sampler.request_stop();
        let drained = tokio::time::timeout(STOP_TIMEOUT, async {
            while let Some(batch) = receiver.recv().await {
                write(&batch)?;
            }
            io::Result::Ok(())
        })
        .await;
        let footer = match drained {
            Ok(result) => {
                result?;
                sampler.join()
            }
            Err(_) => PowerFooter {
                error: Some(format!(
                    "the NVML sampler did not stop within {} s: its last samples are missing",
                    STOP_TIMEOUT.as_secs()
                )),
                ..PowerFooter::default()
            },
        };
        Ok(PowerFeed::Ended(footer))
    }

    /// The footer's figures: the sampler's, once it ended.
    pub fn figures(self) -> Option<PowerFooter> {
        match self {
            PowerFeed::Sampling { .. } => None,
            PowerFeed::Ended(footer) => Some(footer),
        }
    }
}
