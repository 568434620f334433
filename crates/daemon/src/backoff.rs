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

    /// Sleeps for the current wait less a random part of up to half, then doubles it up to the
    /// cap, so replicas that failed together do not retry together. Returns
    /// `false` if `cancel` fired first.
    pub async fn wait(&mut self, cancel: &CancellationToken) -> bool {
        let delay = self.next_delay();
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            () = cancel.cancelled() => false,
        }
    }

    /// The next wait, jittered, and the step to the one after.
    fn next_delay(&mut self) -> Duration {
        let jittered = rand::rng().random_range(self.next / 2..=self.next);
        self.next = (self.next * 2).min(MAX);
        jittered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_with_jitter_up_to_the_cap_and_reset() {
        let mut backoff = Backoff::new();
        let mut expected = MIN;
        for _ in 0..12 {
            let delay = backoff.next_delay();
            assert!(delay >= expected / 2 && delay <= expected, "{delay:?} for {expected:?}");
            expected = (expected * 2).min(MAX);
        }
        assert_eq!(expected, MAX);
        backoff.reset();
        assert!(backoff.next_delay() <= MIN);
    }

    #[tokio::test]
    async fn a_cancelled_wait_returns_at_once() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert!(!Backoff::new().wait(&cancel).await);
    }
}
