//! The registry as the daemon holds it: an immutable [`Registry`] snapshot that a reload swaps
//! whole, atomically.
//!
//! A call takes one snapshot when it starts and keeps it to its end, so a call that started
//! before a reload finishes on the tools it started with, and no call ever sees half of a new
//! registry. What must survive a swap (concurrency limits and queues, statistics) is kept outside
//! the snapshot, keyed by tool name.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::Registry;

/// The current registry, swappable while calls run.
pub struct SharedRegistry {
    current: ArcSwap<Registry>,
}

impl SharedRegistry {
    /// Holds `registry` as the current snapshot.
    pub fn new(registry: Registry) -> SharedRegistry {
        SharedRegistry { current: ArcSwap::from_pointee(registry) }
    }

    /// The current snapshot, to use for one whole call.
    pub fn snapshot(&self) -> Arc<Registry> {
        self.current.load_full()
    }

    /// Makes `registry` the current snapshot; calls already holding the old one keep it.
    /// Returns the old snapshot.
    pub fn replace(&self, registry: Registry) -> Arc<Registry> {
        self.current.swap(Arc::new(registry))
    }
}

impl std::fmt::Debug for SharedRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegistry").field("tools", &self.snapshot().names()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builtin::Echo;

    #[test]
    fn a_held_snapshot_outlives_the_swap_that_replaces_it() {
        let mut first = Registry::new();
        first.register(Arc::new(Echo)).unwrap();
        let shared = SharedRegistry::new(first);
        let held = shared.snapshot();
        let old = shared.replace(Registry::new());
        assert_eq!(held.names(), ["echo"]);
        assert_eq!(old.names(), ["echo"]);
        assert!(shared.snapshot().names().is_empty());
    }
}
