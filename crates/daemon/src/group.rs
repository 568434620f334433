//! A consumer-group reader that hands each delivered entry to a handler in its own task: the
//! read loop, the reclaim loop and the bookkeeping around them, without knowing what the entries
//! mean.
//!
//! Every door's call lifecycle (`call::Lifecycle`) runs on it. Slots are taken
//! before a read or a claim, which asks Redis for no more entries than slots held, so a
//! delivered entry never waits for a slot; an entry already being handled in this process is
//! never started twice; every loop backs off with jitter while Redis is unavailable and never
//! exits on an error; a vanished group is created again from the start of the stream; consumers
//! of replicas that died without removing themselves are pruned; and every task is tracked by
//! [`Shutdown::tasks`].

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;
use toolhost_bus::{Error as BusError, Groups};
use toolhost_envelope::Entry;
use tracing::{debug, error, info, warn};

use crate::backoff::Backoff;
use crate::outage::redis_warn;
use crate::shutdown::Shutdown;
use crate::telemetry::Telemetry;

/// Handles one delivered entry to its end: committed (answered, dead-lettered, acked) or left
/// pending for a reclaim.
pub(crate) trait EntryHandler: Send + Sync + 'static {
    /// Handles `entry`, holding `slot` (one of the reader's in-flight slots) until it ends or
    /// gives the slot back; errors are logged and answered inside, never returned.
    fn handle(&self, entry: Entry, slot: Slot) -> impl Future<Output = ()> + Send;
}

/// One of a reader's in-flight slots, held by the handling of one entry.
///
/// A handling that must wait for something other than the host's capacity (a tool's own
/// concurrency limit) gives its slot back with [`Slot::release`], so the reader can take other
/// work meanwhile.
///
/// Releasing takes `&self`, so a call's parts that run side by side (its queue wait, its
/// questions to the caller) can each give it back; the first release counts.
#[derive(Debug)]
pub(crate) struct Slot {
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Slot {
    /// Gives the slot back to the reader now rather than when the handling ends.
    pub(crate) fn release(&self) {
        self.permit.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    }
}

/// How every stream door's group is read (`[dispatch]`, the toolbox id and its heartbeats),
/// whatever the stream.
#[derive(Debug, Clone)]
pub(crate) struct Reading {
    /// The consumer group: the toolbox id.
    pub group: String,
    /// Most entries per read.
    pub read_batch: usize,
    /// The longest the reader waits for the calls of a read of [`HOLD_FROM`] entries or more to
    /// end before it reads again; zero reads again at once.
    pub read_hold: Duration,
    /// How long a read blocks.
    pub block: Duration,
    /// The lease of a call; idle time after which pending entries are reclaimed.
    pub claim_idle: Duration,
    /// Deliveries after which an entry is dead-lettered.
    pub max_deliveries: u64,
    /// How long final answers are remembered.
    pub answered_retention: Duration,
    /// The largest answer payload kept with its answered mark for retries (doors that keep
    /// answers); 0 keeps none.
    pub kept_answer_max_bytes: usize,
    /// A replica's heartbeat key without its consumer name: consumers without a heartbeat that
    /// hold nothing are pruned.
    pub heartbeat_prefix: String,
}

impl Reading {
    /// The settings of the reader of stream `topic` (full key), whose ledger is `ledger` (its
    /// bare name), as consumer `consumer`.
    pub(crate) fn stream(&self, topic: String, ledger: &str, consumer: &str) -> StreamSettings {
        StreamSettings {
            topic,
            ledger: ledger.to_owned(),
            consumer: consumer.to_owned(),
            reading: self.clone(),
        }
    }
}

/// Where and how a door's stream is read, and how its entries are handled: the same for every
/// door but the stream. The [`Reading`] fields read through it (`settings.claim_idle`).
#[derive(Debug, Clone)]
pub(crate) struct StreamSettings {
    /// Full key of the stream.
    pub topic: String,
    /// The ledger's namespace: the stream's bare name, shared by every toolbox reading it.
    pub ledger: String,
    /// This replica's consumer name.
    pub consumer: String,
    /// How the group is read.
    pub reading: Reading,
}

impl std::ops::Deref for StreamSettings {
    type Target = Reading;

    fn deref(&self) -> &Reading {
        &self.reading
    }
}

/// Reads one stream through a consumer group and runs a handler per entry.
pub(crate) struct GroupReader<H> {
    bus: Arc<dyn Groups>,
    settings: StreamSettings,
    handler: Arc<H>,
    /// Free slots for entries being handled, shared with the readers of the other doors.
    in_flight: Arc<Semaphore>,
    /// Entry ids being handled by this process, so a reclaim never starts a second copy.
    active: Mutex<HashSet<String>>,
    shutdown: Shutdown,
    telemetry: Telemetry,
}

impl<H: EntryHandler> GroupReader<H> {
    /// A reader whose entries each hold one slot of `budget` while they are handled. Readers of
    /// different streams share one budget, the process's `max_in_flight`.
    pub fn new(
        bus: Arc<dyn Groups>,
        settings: StreamSettings,
        handler: Arc<H>,
        budget: Arc<Semaphore>,
        shutdown: Shutdown,
        telemetry: Telemetry,
    ) -> GroupReader<H> {
        GroupReader {
            bus,
            settings,
            handler,
            in_flight: budget,
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
    ///
    /// # Errors
    /// A TLS failure that no retry mends ([`toolhost_bus::Error::Tls`]: a certificate not
    /// trusted or refused), at once: start-up stops there rather than retry forever.
    pub async fn ensure_group(&self) -> Result<bool, toolhost_bus::Error> {
        let mut backoff = Backoff::new();
        loop {
            match self.bus.ensure_group(&self.settings.topic, &self.settings.group).await {
                Ok(()) => return Ok(true),
                Err(err @ toolhost_bus::Error::Tls(_)) => return Err(err),
                Err(err) => {
                    redis_warn!(&err, error = %err, stream = %self.settings.topic, "cannot create consumer group; retrying");
                    if !backoff.wait(self.shutdown.stopping()).await {
                        return Ok(false);
                    }
                }
            }
        }
    }

    /// Reads new entries until shutdown, handling each in its own task.
    ///
    /// Slots are taken before the read and the read asks for no more entries than slots are
    /// held, so a delivered entry never waits for a slot: its idle clock starts only when its
    /// handling can start, and shutdown never waits on an undelivered slot.
    ///
    /// After a read of [`HOLD_FROM`] entries or more it waits until their calls have ended, or
    /// for `read_hold` (1 ms with `[dispatch] batch_under_load`), before it reads again, as the
    /// exactly-once floor does: reading at once under load takes the entries a few at a time,
    /// and every read and every answer script call costs Redis, the daemon and the callers a
    /// wake-up.
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
            let mut permits = vec![first];
            self.take_free_permits(&mut permits);
            // Not cancelled on shutdown: the read returns within `block`, and what it delivered
            // is then handled rather than left pending.
            let settings = &self.settings;
            let read = self.bus.read_group(
                &settings.topic,
                &settings.group,
                &settings.consumer,
                permits.len(),
                settings.block,
            );
            match read.await {
                Ok(entries) => {
                    backoff.reset();
                    self.telemetry.set_redis_up(true);
                    if entries.len() < HOLD_FROM || settings.read_hold.is_zero() {
                        self.spawn_all(entries, permits, None);
                        continue;
                    }
                    // The read's calls, tracked until each has ended.
                    let round = TaskTracker::new();
                    self.spawn_all(entries, permits, Some(&round));
                    round.close();
                    // Under load, read again once this read's calls have ended (or the hold is
                    // over): the entries that came meanwhile then make one read and one answer
                    // batch, where reading at once takes them a few at a time.
                    tokio::select! {
                        () = round.wait() => {}
                        () = tokio::time::sleep(settings.read_hold) => {}
                        () = stopping.cancelled() => {}
                    }
                }
                Err(err) => {
                    drop(permits);
                    self.telemetry.set_redis_up(false);
                    if matches!(err, BusError::NoGroup(_)) {
                        // Entries callers added since Redis lost the group are new to it, so it
                        // starts from the beginning; anything answered before is in the ledger.
                        warn!(error = %err, stream = %settings.topic, "consumer group vanished (Redis lost its data?); creating it again");
                        let _ = self.bus.ensure_group_at(&settings.topic, &settings.group, "0").await;
                    } else {
                        redis_warn!(&err, error = %err, stream = %settings.topic, "reading the stream failed; backing off");
                    }
                    if !backoff.wait(&stopping).await {
                        return;
                    }
                }
            }
        }
    }

    /// Adds free in-flight slots to `permits`, without waiting, up to one read batch.
    fn take_free_permits(&self, permits: &mut Vec<OwnedSemaphorePermit>) {
        while permits.len() < self.settings.read_batch {
            match self.in_flight.clone().try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_no_permit) => break,
            }
        }
    }

    /// Spawns a task per entry, each with one of `permits`; the permits left over are freed.
    /// Each task is tracked by `round` until it ends.
    fn spawn_all(
        self: &Arc<Self>,
        entries: Vec<Entry>,
        mut permits: Vec<OwnedSemaphorePermit>,
        round: Option<&TaskTracker>,
    ) {
        for entry in entries {
            // Reads and claims ask for at most as many entries as permits are held.
            let Some(permit) = permits.pop() else {
                error!(entry_id = %entry.entry_id, "more entries delivered than asked for; left pending");
                continue;
            };
            self.spawn(entry, permit, round.map(TaskTracker::token));
        }
    }

    fn spawn(
        self: &Arc<Self>,
        entry: Entry,
        permit: OwnedSemaphorePermit,
        in_round: Option<TaskTrackerToken>,
    ) {
        let Some(active) = Active::enter(self, &entry.entry_id) else {
            debug!(entry_id = %entry.entry_id, "entry is already being handled here");
            return;
        };
        let handler = Arc::clone(&self.handler);
        // The handling's future is a few KiB; boxed at once, the spawn and the task tracker move
        // a pointer instead of copying it again at every layer.
        self.shutdown.tasks().spawn(Box::pin(async move {
            handler.handle(entry, Slot { permit: Mutex::new(Some(permit)) }).await;
            drop(active);
            drop(in_round);
        }));
    }

    /// Periodically claims entries idle past the lease (left by crashed or stalled consumers)
    /// and removes the consumers of replicas that died without removing themselves.
    pub async fn run_reclaimer(self: Arc<Self>) {
        let period = (self.settings.claim_idle / 2).clamp(Duration::from_millis(50), Duration::from_secs(10));
        let stopping = self.shutdown.stopping().clone();
        let mut backoff = Backoff::new();
        loop {
            match self.reclaim_once().await {
                Ok(()) => {
                    backoff.reset();
                    self.prune_dead_consumers().await;
                    tokio::select! {
                        () = tokio::time::sleep(period) => {}
                        () = stopping.cancelled() => return,
                    }
                }
                Err(err) => {
                    redis_warn!(&err, error = %err, stream = %self.settings.topic, "reclaiming idle entries failed; backing off");
                    if !backoff.wait(&stopping).await {
                        return;
                    }
                }
            }
        }
    }

    /// One full XAUTOCLAIM scan of the group, claiming no more entries than it holds slots.
    ///
    /// It waits for its first slot rather than giving up when none is free: a reader blocked on
    /// an idle stream can hold every free slot, and the semaphore is fair, so the reclaimer gets
    /// its turn when that read returns instead of starving.
    async fn reclaim_once(self: &Arc<Self>) -> Result<(), BusError> {
        let settings = &self.settings;
        let stopping = self.shutdown.stopping();
        let mut start = "0-0".to_owned();
        loop {
            let first = tokio::select! {
                permit = self.in_flight.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_closed) => return Ok(()),
                },
                () = stopping.cancelled() => return Ok(()),
            };
            let mut permits = vec![first];
            self.take_free_permits(&mut permits);
            let reclaimed = self
                .bus
                .reclaim(
                    &settings.topic,
                    &settings.group,
                    &settings.consumer,
                    settings.claim_idle,
                    &start,
                    permits.len(),
                )
                .await?;
            if !reclaimed.deleted.is_empty() {
                error!(
                    stream = %settings.topic,
                    entries = %reclaimed.deleted.join(","),
                    "pending entries were deleted from the stream (trimmed?) before they were handled; \
                     they cannot be answered"
                );
            }
            for _ in &reclaimed.entries {
                self.telemetry.reclaimed();
            }
            self.spawn_all(reclaimed.entries, permits, None);
            if reclaimed.next_start == "0-0" {
                return Ok(());
            }
            start = reclaimed.next_start;
        }
    }

    /// Removes consumers that hold nothing, have had nothing delivered for ten leases (and ten
    /// blocking reads) and have no heartbeat: replicas killed before they could remove themselves.
    async fn prune_dead_consumers(&self) {
        let settings = &self.settings;
        let min_idle = (settings.claim_idle * 10).max(settings.block * 10);
        let (topic, group, consumer) = (&settings.topic, &settings.group, &settings.consumer);
        let pruned =
            self.bus.prune_consumers(topic, group, consumer, min_idle, &settings.heartbeat_prefix).await;
        match pruned {
            Ok(names) if !names.is_empty() => info!(
                stream = %settings.topic,
                consumers = %names.join(","),
                "removed consumers of replicas that stopped without removing themselves"
            ),
            Ok(_) => {}
            Err(err) => debug!(error = %err, stream = %settings.topic, "cannot prune idle consumers"),
        }
    }
}

/// The fewest entries a read must bring for the reader to wait for their calls before it reads
/// again: a lone entry means a caller is waiting on an idle toolbox, and the next read goes out at
/// once.
const HOLD_FROM: usize = 2;

/// Marks an entry as being handled by this process until dropped (also when its task panics).
struct Active<H> {
    reader: Arc<GroupReader<H>>,
    entry_id: String,
}

impl<H> Active<H> {
    /// `None` when the entry is being handled here already.
    fn enter(reader: &Arc<GroupReader<H>>, entry_id: &str) -> Option<Active<H>> {
        let mut active = reader.active.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        active
            .insert(entry_id.to_owned())
            .then(|| Active { reader: Arc::clone(reader), entry_id: entry_id.to_owned() })
    }
}

impl<H> Drop for Active<H> {
    fn drop(&mut self) {
        self.reader.active.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&self.entry_id);
    }
}
