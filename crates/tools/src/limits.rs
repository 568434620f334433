//! Per-tool concurrency limits and wait queues, kept apart from the registry and keyed by tool
//! name, so that replacing the registry never resets a limit or lets a tool run at twice it.
//!
//! A call of a limited tool either starts at once ([`Admit::Run`]), waits in the tool's bounded
//! queue ([`Admit::Wait`]), or is refused because the queue is full ([`Admit::Full`]). The caller
//! decides what a waiting call gives up while it waits (the daemon frees its global slot) and how
//! long it may wait (its deadline): waiting is a plain future, cancelled by dropping it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many calls may wait for a limited tool when its settings do not say.
pub const DEFAULT_MAX_QUEUE: usize = 64;

/// The limit of one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSettings {
    /// Calls running at once.
    pub max_concurrent: usize,
    /// Calls waiting for a free run slot; more are refused.
    pub max_queue: usize,
}

/// The limits of every limited tool, by name. Tools without one run unlimited.
#[derive(Debug, Default)]
pub struct ToolLimits {
    /// Replaced entry by entry by [`ToolLimits::update`]; read under a short lock per call.
    by_name: RwLock<HashMap<String, Arc<Limit>>>,
}

#[derive(Debug)]
struct Limit {
    /// `max_concurrent` and `max_queue`, changed in place by an update.
    max_concurrent: AtomicUsize,
    max_queue: AtomicUsize,
    running: Arc<Semaphore>,
    /// Run slots still to take away after a lowered limit: they were in use then, and are
    /// forgotten as the calls holding them end.
    debt: AtomicUsize,
    /// Calls holding a queue slot: waiting, or running after having waited.
    queued: AtomicUsize,
}

/// What [`ToolLimits::admit`] decided for one call.
#[derive(Debug)]
pub enum Admit {
    /// Run now, holding this until the call ends.
    Run(Running),
    /// Wait for a run slot with [`Waiting::ready`].
    Wait(Waiting),
    /// The tool's queue is full: refuse the call.
    Full(Full),
}

/// A running call's hold on its tool's limit; dropping it frees the slot.
#[derive(Debug)]
pub struct Running {
    permit: Option<(OwnedSemaphorePermit, Arc<Limit>)>,
    /// A call that waited keeps its queue slot until it ends: it gave up its global slot to wait,
    /// so the queue slot is what still counts it against the memory bound.
    _queued: Option<QueueSlot>,
}

/// A call waiting in its tool's queue.
#[derive(Debug)]
pub struct Waiting {
    running: Arc<Semaphore>,
    slot: QueueSlot,
}

/// A refused call: the tool's queue was full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    /// The tool's limit.
    pub settings: LimitSettings,
}

/// One taken place in a tool's queue, given back on drop.
#[derive(Debug)]
struct QueueSlot(Arc<Limit>);

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ToolLimits {
    /// Limits for the named tools; a `max_concurrent` of 0 counts as 1.
    pub fn new(limits: impl IntoIterator<Item = (String, LimitSettings)>) -> ToolLimits {
        let tool_limits = ToolLimits::default();
        tool_limits.update(limits);
        tool_limits
    }

    /// Makes `limits` the limits (after a reload). A tool whose limit changes keeps its semaphore
    /// and queue, resized: calls running or waiting are not forgotten, so a tool never runs at
    /// its old and new limit added up. A lowered limit takes the free slots at once and the rest
    /// as running calls end. Tools no longer named run unlimited.
    pub fn update(&self, limits: impl IntoIterator<Item = (String, LimitSettings)>) {
        let mut by_name = self.by_name.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut next = HashMap::new();
        for (name, settings) in limits {
            let max_concurrent = settings.max_concurrent.max(1);
            let limit = match by_name.remove(&name) {
                Some(limit) => {
                    let old = limit.max_concurrent.swap(max_concurrent, Ordering::AcqRel);
                    if max_concurrent > old {
                        // Pay the debt of an earlier lowering first.
                        let mut raise = max_concurrent - old;
                        let paid = limit
                            .debt
                            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |debt| {
                                Some(debt.saturating_sub(raise))
                            })
                            .unwrap_or(0)
                            .min(raise);
                        raise -= paid;
                        limit.running.add_permits(raise);
                    } else if max_concurrent < old {
                        let lower = old - max_concurrent;
                        let forgotten = limit.running.forget_permits(lower);
                        limit.debt.fetch_add(lower - forgotten, Ordering::AcqRel);
                    }
                    limit.max_queue.store(settings.max_queue, Ordering::Release);
                    limit
                }
                None => Arc::new(Limit {
                    max_concurrent: AtomicUsize::new(max_concurrent),
                    max_queue: AtomicUsize::new(settings.max_queue),
                    running: Arc::new(Semaphore::new(max_concurrent)),
                    debt: AtomicUsize::new(0),
                    queued: AtomicUsize::new(0),
                }),
            };
            next.insert(name, limit);
        }
        *by_name = next;
    }

    fn limit(&self, tool: &str) -> Option<Arc<Limit>> {
        self.by_name.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(tool).cloned()
    }

    /// The limit of `tool`, if it has one.
    pub fn settings(&self, tool: &str) -> Option<LimitSettings> {
        self.limit(tool).map(|limit| limit.settings())
    }

    /// Calls of `tool` waiting or running after a wait.
    pub fn queued(&self, tool: &str) -> usize {
        self.limit(tool).map_or(0, |limit| limit.queued.load(Ordering::Acquire))
    }

    /// Decides, without waiting, whether a call of `tool` runs now, waits or is refused.
    pub fn admit(&self, tool: &str) -> Admit {
        let Some(limit) = self.limit(tool) else {
            return Admit::Run(Running { permit: None, _queued: None });
        };
        // A permit is only free when nobody waits for it (tokio hands released permits to
        // waiters first), so a newcomer never overtakes the queue.
        if let Ok(permit) = limit.running.clone().try_acquire_owned() {
            return Admit::Run(Running { permit: Some((permit, limit)), _queued: None });
        }
        let max_queue = limit.max_queue.load(Ordering::Acquire);
        let taken = limit.queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
            (queued < max_queue).then_some(queued + 1)
        });
        match taken {
            Ok(_) => Admit::Wait(Waiting { running: limit.running.clone(), slot: QueueSlot(limit) }),
            Err(_) => Admit::Full(Full { settings: limit.settings() }),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some((permit, limit)) = self.permit.take() else { return };
        let owed = limit.debt.fetch_update(Ordering::AcqRel, Ordering::Acquire, |debt| debt.checked_sub(1));
        if owed.is_ok() {
            // The limit was lowered while this call ran: its slot goes away with it.
            permit.forget();
        }
    }
}

impl Limit {
    fn settings(&self) -> LimitSettings {
        LimitSettings {
            max_concurrent: self.max_concurrent.load(Ordering::Acquire),
            max_queue: self.max_queue.load(Ordering::Acquire),
        }
    }
}

impl Waiting {
    /// Waits for a run slot, in arrival order.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future gives the queue slot back and takes no run slot.
    pub async fn ready(self) -> Running {
        // The semaphore is owned by the limit and never closed, so acquiring only waits.
        let permit = self.running.acquire_owned().await.ok();
        let limit = self.slot.0.clone();
        Running { permit: permit.map(|permit| (permit, limit)), _queued: Some(self.slot) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits(max_concurrent: usize, max_queue: usize) -> ToolLimits {
        ToolLimits::new([("slow".to_owned(), LimitSettings { max_concurrent, max_queue })])
    }

    #[tokio::test]
    async fn calls_past_the_limit_wait_in_order_and_past_the_queue_are_refused() {
        let limits = limits(1, 2);
        let Admit::Run(first) = limits.admit("slow") else { panic!("the first call runs") };
        let Admit::Wait(second) = limits.admit("slow") else { panic!("the second call waits") };
        let Admit::Wait(third) = limits.admit("slow") else { panic!("the third call waits") };
        assert!(matches!(limits.admit("slow"), Admit::Full(Full { settings }) if settings.max_queue == 2));
        assert_eq!(limits.queued("slow"), 2);
        // Unlimited tools always run.
        assert!(matches!(limits.admit("echo"), Admit::Run(_)));

        let third = tokio::spawn(third.ready());
        tokio::task::yield_now().await;
        let second = tokio::spawn(second.ready());
        drop(first);
        // The first waiter gets the freed slot; the other still waits.
        let running_third = tokio::time::timeout(Duration::from_secs(5), third).await.unwrap().unwrap();
        assert!(!second.is_finished());
        drop(running_third);
        let running_second = tokio::time::timeout(Duration::from_secs(5), second).await.unwrap().unwrap();
        // A call that waited holds its queue slot until it ends.
        assert_eq!(limits.queued("slow"), 1);
        drop(running_second);
        assert_eq!(limits.queued("slow"), 0);
    }

    #[tokio::test]
    async fn a_wait_given_up_frees_its_queue_slot_and_takes_no_run_slot() {
        let limits = limits(1, 1);
        let Admit::Run(first) = limits.admit("slow") else { panic!("the first call runs") };
        let Admit::Wait(waiting) = limits.admit("slow") else { panic!("the second call waits") };
        let gave_up = tokio::time::timeout(Duration::from_millis(10), waiting.ready()).await;
        assert!(gave_up.is_err());
        assert_eq!(limits.queued("slow"), 0);
        drop(first);
        assert!(matches!(limits.admit("slow"), Admit::Run(_)));
    }

    #[tokio::test]
    async fn an_update_resizes_a_limit_in_place_without_forgetting_running_calls() {
        let limits = limits(1, 4);
        let Admit::Run(first) = limits.admit("slow") else { panic!("the first call runs") };
        // Raised to two: one more runs beside the call already running, not two more.
        limits.update([("slow".to_owned(), LimitSettings { max_concurrent: 2, max_queue: 4 })]);
        let Admit::Run(second) = limits.admit("slow") else { panic!("the raised limit has room") };
        assert!(matches!(limits.admit("slow"), Admit::Wait(_)));
        // Lowered back to one while two run: nobody new runs until both have ended.
        limits.update([("slow".to_owned(), LimitSettings { max_concurrent: 1, max_queue: 4 })]);
        drop(first);
        assert!(matches!(limits.admit("slow"), Admit::Wait(_)));
        drop(second);
        assert!(matches!(limits.admit("slow"), Admit::Run(_)));
        // A tool no longer named runs unlimited.
        limits.update([]);
        assert_eq!(limits.settings("slow"), None);
    }
}
