//! Capped, jittered exponential backoff for loops that wait out a Redis outage.

use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;

/// First wait.
const MIN: Duration = Duration::from_millis(50);
/// Longest wait.
const MAX: Duration = Duration::from_secs(2);

/// Backoff state of one loop.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new()
    }
}

impl Backoff {
    /// Starts at the shortest wait.
    pub fn new() -> Backoff {
        Backoff { next: MIN }
    }

    /// Back to the shortest wait, after a success.
    pub fn reset(&mut self) {
        self.next = MIN;
    }

    /// Sleeps for the current wait with full jitter, then doubles it up to the cap. Returns
    /// `false` if `cancel` fired first.
    pub async fn wait(&mut self, cancel: &CancellationToken) -> bool {
        let jittered = rand::rng().random_range(self.next / 2..=self.next);
        self.next = (self.next * 2).min(MAX);
        tokio::select! {
            () = tokio::time::sleep(jittered) => true,
            () = cancel.cancelled() => false,
        }
    }
}
