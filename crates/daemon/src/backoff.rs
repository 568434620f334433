//! Capped, jittered exponential backoff for loops that wait out a Redis outage, on `backon`.
//!
//! docs/RELIABILITY.md promises waits whose steps double from 50 ms to 2 s, each wait between
//! half and all of its step. backon's jitter adds a random part of up to the whole delay (a
//! delay `d` becomes `d` to `2d`), so its steps are set to half the promised ones (25 ms up to
//! 1 s): each wait falls between half and all of the promised step.
//!
//! What is left here is the loops' side: a wait that ends early when the loop's token fires
//! (backon's own retry loop, `Retryable`, stops only by dropping the attempt in flight, which for
//! a ledger commit would leave unknown whether it was written), and a reset after a success.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use tokio_util::sync::CancellationToken;

/// The first step.
const MIN: Duration = Duration::from_millis(50);
/// The longest step.
const MAX: Duration = Duration::from_secs(2);

/// Backoff state of one loop.
#[derive(Debug)]
pub struct Backoff {
    delays: ExponentialBackoff,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new()
    }
}

impl Backoff {
    /// Starts at the shortest wait.
    pub fn new() -> Backoff {
        // Half steps, because the jitter adds up to a whole one (see the module's comment).
        let delays = ExponentialBuilder::default()
            .with_min_delay(MIN / 2)
            .with_max_delay(MAX / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build();
        Backoff { delays }
    }

    /// Back to the shortest wait, after a success.
    pub fn reset(&mut self) {
        *self = Backoff::new();
    }

    /// Sleeps for the next wait, then doubles its step up to the cap; jittered, so replicas that
    /// failed together do not retry together. Returns `false` if `cancel` fired first.
    pub async fn wait(&mut self, cancel: &CancellationToken) -> bool {
        let delay = self.next_delay();
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            () = cancel.cancelled() => false,
        }
    }

    /// The next wait.
    fn next_delay(&mut self) -> Duration {
        // Never `None`: the backoff has no maximum number of attempts.
        self.delays.next().unwrap_or(MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_between_half_and_all_of_each_step_up_to_the_cap_and_reset() {
        let mut backoff = Backoff::new();
        let mut step = MIN;
        for _ in 0..12 {
            let delay = backoff.next_delay();
            assert!(delay >= step / 2 && delay <= step, "{delay:?} for {step:?}");
            step = (step * 2).min(MAX);
        }
        assert_eq!(step, MAX);
        backoff.reset();
        assert!(backoff.next_delay() <= MIN);
    }

    #[test]
    fn two_loops_do_not_wait_alike() {
        let waits = || {
            let mut backoff = Backoff::new();
            (0..8).map(|_| backoff.next_delay()).collect::<Vec<_>>()
        };
        assert_ne!(waits(), waits());
    }

    #[tokio::test]
    async fn a_cancelled_wait_returns_at_once() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert!(!Backoff::new().wait(&cancel).await);
    }
}
