//! Per-tool concurrency limits and wait queues, kept apart from the registry and keyed by tool
//! name, so that replacing the registry never resets a limit or lets a tool run at twice it.
//!
//! A call of a limited tool either starts at once ([`Admit::Run`]), waits in the tool's bounded
//! queue ([`Admit::Wait`]), or is refused because the queue is full ([`Admit::Full`]). The caller
//! decides what a waiting call gives up while it waits (the daemon frees its global slot) and how
//! long it may wait (its deadline): waiting is a plain future, cancelled by dropping it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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
    by_name: HashMap<String, Arc<Limit>>,
}

#[derive(Debug)]
struct Limit {
    settings: LimitSettings,
    running: Arc<Semaphore>,
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
    _permit: Option<OwnedSemaphorePermit>,
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
        let by_name = limits
            .into_iter()
            .map(|(name, settings)| {
                let max_concurrent = settings.max_concurrent.max(1);
                let limit = Limit {
                    settings: LimitSettings { max_concurrent, ..settings },
                    running: Arc::new(Semaphore::new(max_concurrent)),
                    queued: AtomicUsize::new(0),
                };
                (name, Arc::new(limit))
            })
            .collect();
        ToolLimits { by_name }
    }

    /// The limit of `tool`, if it has one.
    pub fn settings(&self, tool: &str) -> Option<LimitSettings> {
        self.by_name.get(tool).map(|limit| limit.settings)
    }

    /// Calls of `tool` waiting or running after a wait.
    pub fn queued(&self, tool: &str) -> usize {
        self.by_name.get(tool).map_or(0, |limit| limit.queued.load(Ordering::Acquire))
    }

    /// Decides, without waiting, whether a call of `tool` runs now, waits or is refused.
    pub fn admit(&self, tool: &str) -> Admit {
        let Some(limit) = self.by_name.get(tool) else {
            return Admit::Run(Running { _permit: None, _queued: None });
        };
        // A permit is only free when nobody waits for it (tokio hands released permits to
        // waiters first), so a newcomer never overtakes the queue.
        if let Ok(permit) = limit.running.clone().try_acquire_owned() {
            return Admit::Run(Running { _permit: Some(permit), _queued: None });
        }
        let max_queue = limit.settings.max_queue;
        let taken = limit.queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
            (queued < max_queue).then_some(queued + 1)
        });
        match taken {
            Ok(_) => Admit::Wait(Waiting { running: limit.running.clone(), slot: QueueSlot(limit.clone()) }),
            Err(_) => Admit::Full(Full { settings: limit.settings }),
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
        Running { _permit: permit, _queued: Some(self.slot) }
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
}
