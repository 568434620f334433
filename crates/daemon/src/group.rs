//! A consumer-group reader that hands each delivered entry to a handler in its own task: the
//! read loop, the reclaim loop and the bookkeeping around them, without knowing what the entries
//! mean.
//!
//! The chat inbox runs on it. It follows the dispatcher's loops (`dispatch::Dispatcher`):
//! reads ask Redis only for as many entries as there are free in-flight slots, an entry already
//! being handled in this process is never started twice, a vanished group is created again, and
//! every task is tracked by [`Shutdown::tasks`].

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use toolhost_bus::{Bus, Error as BusError};
use toolhost_envelope::Entry;
use tracing::{debug, warn};

use crate::backoff::Backoff;
use crate::shutdown::Shutdown;
use crate::telemetry::Telemetry;

/// Handles one delivered entry to its end: committed (answered, dead-lettered, acked) or left
/// pending for a reclaim.
pub(crate) trait EntryHandler: Send + Sync + 'static {
    /// Handles `entry`; errors are logged and answered inside, never returned.
    fn handle(&self, entry: Entry) -> impl Future<Output = ()> + Send;
}

/// Where and how a [`GroupReader`] reads.
#[derive(Debug, Clone)]
pub(crate) struct GroupSettings {
    /// Full key of the stream.
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// This replica's consumer name.
    pub consumer: String,
    /// Most entries per read.
    pub read_batch: usize,
    /// How long a read blocks.
    pub block: Duration,
    /// Idle time after which pending entries are reclaimed.
    pub claim_idle: Duration,
}

/// Reads one stream through a consumer group and runs a handler per entry.
pub(crate) struct GroupReader<H> {
    bus: Arc<dyn Bus>,
    settings: GroupSettings,
    handler: Arc<H>,
    /// Free slots for entries being handled.
    in_flight: Arc<Semaphore>,
    /// Entry ids being handled by this process, so a reclaim never starts a second copy.
    active: Mutex<HashSet<String>>,
    shutdown: Shutdown,
    telemetry: Telemetry,
}

impl<H: EntryHandler> GroupReader<H> {
    /// A reader handling at most `max_in_flight` entries at once.
    pub fn new(
        bus: Arc<dyn Bus>,
        settings: GroupSettings,
        handler: Arc<H>,
        max_in_flight: usize,
        shutdown: Shutdown,
        telemetry: Telemetry,
    ) -> GroupReader<H> {
        GroupReader {
            bus,
            settings,
            handler,
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
            active: Mutex::new(HashSet::new()),
            shutdown,
            telemetry,
        }
    }

    /// The full key of the stream read.
    pub fn topic(&self) -> &str {
        &self.settings.topic
    }

    /// Creates the consumer group, retrying while Redis is unavailable or until shutdown.
    /// Returns `false` when shutdown came first.
    pub async fn ensure_group(&self) -> bool {
        let mut backoff = Backoff::new();
        loop {
            match self.bus.ensure_group(&self.settings.topic, &self.settings.group).await {
                Ok(()) => return true,
                Err(err) => {
                    warn!(error = %err, stream = %self.settings.topic, "cannot create consumer group; retrying");
                    if !backoff.wait(self.shutdown.stopping()).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Reads new entries until shutdown, handling each in its own task.
    pub async fn run_reader(self: Arc<Self>) {
        let mut backoff = Backoff::new();
        let stopping = self.shutdown.stopping().clone();
        while !stopping.is_cancelled() {
            let first = tokio::select! {
                permit = self.in_flight.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_closed) => return,
                },
                () = stopping.cancelled() => return,
            };
            let count = (self.in_flight.available_permits() + 1).min(self.settings.read_batch);
            // Not cancelled on shutdown: the read returns within `block`, and what it delivered
            // is then handled rather than left pending.
            let settings = &self.settings;
            let read = self.bus.read_group(
                &settings.topic,
                &settings.group,
                &settings.consumer,
                count,
                settings.block,
            );
            match read.await {
                Ok(entries) => {
                    backoff.reset();
                    self.spawn_all(entries, first).await;
                }
                Err(err) => {
                    drop(first);
                    self.telemetry.set_redis_up(false);
                    if matches!(err, BusError::NoGroup(_)) {
                        warn!(error = %err, stream = %settings.topic, "consumer group vanished; creating it again");
                        let _ = self.bus.ensure_group(&settings.topic, &settings.group).await;
                    } else {
                        warn!(error = %err, stream = %settings.topic, "reading the stream failed; backing off");
                    }
                    if !backoff.wait(&stopping).await {
                        return;
                    }
                }
            }
        }
    }

    async fn spawn_all(self: &Arc<Self>, entries: Vec<Entry>, first: OwnedSemaphorePermit) {
        let mut first = Some(first);
        for entry in entries {
            let permit = match first.take() {
                Some(permit) => permit,
                None => match self.in_flight.clone().acquire_owned().await {
                    Ok(permit) => permit,
                    Err(_closed) => return,
                },
            };
            self.spawn(entry, permit);
        }
    }

    fn spawn(self: &Arc<Self>, entry: Entry, permit: OwnedSemaphorePermit) {
        {
            let mut active = self.active.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if !active.insert(entry.entry_id.clone()) {
                debug!(entry_id = %entry.entry_id, "entry is already being handled here");
                return;
            }
        }
        let reader = Arc::clone(self);
        self.shutdown.tasks().spawn(async move {
            let entry_id = entry.entry_id.clone();
            reader.handler.handle(entry).await;
            reader.active.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&entry_id);
            drop(permit);
        });
    }

    /// Periodically claims entries idle past the lease (left by crashed or stalled consumers).
    pub async fn run_reclaimer(self: Arc<Self>) {
        let period = (self.settings.claim_idle / 2).clamp(Duration::from_millis(50), Duration::from_secs(10));
        let stopping = self.shutdown.stopping().clone();
        loop {
            if let Err(err) = self.reclaim_once().await {
                warn!(error = %err, stream = %self.settings.topic, "reclaiming idle entries failed");
            }
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                () = stopping.cancelled() => return,
            }
        }
    }

    /// One full XAUTOCLAIM scan of the group.
    async fn reclaim_once(self: &Arc<Self>) -> Result<(), BusError> {
        let settings = &self.settings;
        let mut start = "0-0".to_owned();
        loop {
            if self.shutdown.stopping().is_cancelled() {
                return Ok(());
            }
            let free = self.in_flight.available_permits().min(settings.read_batch);
            if free == 0 {
                return Ok(());
            }
            let reclaimed = self
                .bus
                .reclaim(
                    &settings.topic,
                    &settings.group,
                    &settings.consumer,
                    settings.claim_idle,
                    &start,
                    free,
                )
                .await?;
            for entry in reclaimed.entries {
                self.telemetry.reclaimed();
                let Ok(permit) = self.in_flight.clone().acquire_owned().await else { return Ok(()) };
                self.spawn(entry, permit);
            }
            if reclaimed.next_start == "0-0" {
                return Ok(());
            }
            start = reclaimed.next_start;
        }
    }
}
