//! One shutdown signal for every task, and a grace period for in-flight calls.
//!
//! `stop` tells loops to stop reading; `force` (after the grace period) tells in-flight calls to
//! give up and leave their entries pending for a replica. Tasks are tracked so the supervisor can
//! wait for them.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The shutdown state shared by the daemon's tasks.
#[derive(Clone, Default)]
pub struct Shutdown {
    stop: CancellationToken,
    force: CancellationToken,
    tasks: TaskTracker,
}

impl Shutdown {
    /// A fresh, untriggered shutdown.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// Cancelled when loops must stop taking new work.
    pub fn stopping(&self) -> &CancellationToken {
        &self.stop
    }

    /// Cancelled when the grace period is over and in-flight work must be abandoned.
    pub fn forced(&self) -> &CancellationToken {
        &self.force
    }

    /// Tracks spawned work the supervisor waits for.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Stops taking work, waits up to `grace` for tracked tasks, then forces the rest and waits
    /// briefly for them to leave. Returns whether everything finished within the grace period.
    pub async fn drain(&self, grace: Duration) -> bool {
        self.stop.cancel();
        self.tasks.close();
        let finished = tokio::time::timeout(grace, self.tasks.wait()).await.is_ok();
        if !finished {
            self.force.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(2), self.tasks.wait()).await;
        }
        finished
    }
}
