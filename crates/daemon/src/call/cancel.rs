//! Cancelling running calls: the calls this replica runs, and `tool.cancel` routed to whichever
//! replica of the fleet runs the call.
//!
//! Every call a replica runs (tracked by the ledger or not) is registered here under its ledger
//! id with a cancellation token, from before its ledger step until its answer is committed. A
//! `tool.cancel` is read by one replica of every toolbox reading the requests stream, not
//! necessarily the one running the call, so the replica that reads it:
//!
//! 1. cancels the call itself when it runs it;
//! 2. else forwards the cancel to every other live replica of every toolbox (the fleet, from
//!    the heartbeats), on each one's control stream (`toolhost:control:<toolbox_id>:<consumer>`,
//!    plain stream commands, so the same on one server, Sentinel and a Cluster), and waits up
//!    to [`FORWARD_WAIT`] for their replies: each says whether it ran the call and cancelled it;
//! 3. else asks the ledger: an answered mark means `answered`, a call record means the call is
//!    running somewhere (`cancelling`), nothing means `unknown`.
//!
//! Read-only, idempotent calls have no call record, which is why step 2 asks the replicas
//! rather than the ledger. Every toolbox's reader does the same and so reaches the same state;
//! the door answers the cancel once across them all (the entry's refusal mark).
//!
//! The control loop ([`Calls::run`]) reads this replica's control stream: it cancels the calls
//! forwarded to it and answers the replica that forwarded them, and hands the replies to its own
//! forwards to the waiting cancels. A `tool.input` travels the same way (`call/input.rs`). The
//! stream is deleted when the replica stops.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolhost_bus::{Bus, Error, Keys};
use toolhost_envelope::new_message_id;
use tracing::{debug, warn};

use super::input::Inputs;
use crate::backoff::Backoff;
use crate::fleet::Fleet;
use crate::outage::redis_warn;

/// How long a forwarded cancel waits for the other replicas' replies; a replica that has not
/// replied by then (stalled, or just died) counts as not running the call.
pub(crate) const FORWARD_WAIT: Duration = Duration::from_secs(2);
/// How long one blocking read of the control stream waits.
const CONTROL_BLOCK: Duration = Duration::from_secs(2);

/// What a `tool.cancel` found, the `state` of its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelState {
    /// The call was running (or waiting for a slot) and was told to stop.
    Cancelling,
    /// The call has its final answer; nothing changed.
    Answered,
    /// No running call and no answer with that id is known; nothing changed.
    Unknown,
}

impl CancelState {
    /// The wire name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CancelState::Cancelling => "cancelling",
            CancelState::Answered => "answered",
            CancelState::Unknown => "unknown",
        }
    }
}

/// The calls this replica runs, and the routing of cancels between replicas.
pub(crate) struct Calls {
    bus: Arc<dyn Bus>,
    keys: Keys,
    fleet: Arc<Fleet>,
    /// This replica's consumer name.
    consumer: String,
    /// Full key of this replica's control stream.
    control: String,
    /// The calls running here.
    running: Running,
    /// The questions of calls running here that wait for their caller's input.
    inputs: Arc<Inputs>,
    /// Forwarded cancels and inputs waiting for replies, by nonce.
    waiting: Mutex<HashMap<String, mpsc::UnboundedSender<Value>>>,
}

/// The calls running here by ledger (the bare name of the stream they came from) and ledger id,
/// so a cancel stops only calls of its own requests stream. A request id may run twice at once
/// (a re-sent copy of an untracked call), so each registration has its own number.
#[derive(Default)]
struct Running {
    calls: Mutex<HashMap<CallKey, Vec<(u64, CancellationToken)>>>,
    next: AtomicU64,
}

impl Running {
    fn register(&self, ledger: &str, ledger_id: &str) -> (CancellationToken, Registration<'_>) {
        let token = CancellationToken::new();
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let key = (ledger.to_owned(), ledger_id.to_owned());
        lock(&self.calls).entry(key.clone()).or_default().push((number, token.clone()));
        (token, Registration { running: self, key, number })
    }

    /// Cancels the calls of `ledger_id` in `ledger`; whether there were any.
    fn cancel(&self, ledger: &str, ledger_id: &str) -> bool {
        let calls = lock(&self.calls);
        let Some(tokens) = calls.get(&(ledger.to_owned(), ledger_id.to_owned())) else { return false };
        for (_, token) in tokens {
            token.cancel();
        }
        !tokens.is_empty()
    }
}

/// A running call: its ledger (the stream's bare name) and ledger id.
type CallKey = (String, String);

/// A running call's place in [`Calls`]; dropping it removes the call.
pub(crate) struct Registration<'a> {
    running: &'a Running,
    key: CallKey,
    number: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut running = lock(&self.running.calls);
        if let Some(tokens) = running.get_mut(&self.key) {
            tokens.retain(|(number, _)| *number != self.number);
            if tokens.is_empty() {
                running.remove(&self.key);
            }
        }
    }
}

impl Calls {
    /// The calls of the replica `consumer` of `toolbox_id`.
    pub(crate) fn new(
        bus: Arc<dyn Bus>,
        keys: Keys,
        fleet: Arc<Fleet>,
        toolbox_id: &str,
        consumer: &str,
    ) -> Calls {
        Calls {
            control: keys.control(toolbox_id, consumer),
            bus,
            keys,
            fleet,
            consumer: consumer.to_owned(),
            running: Running::default(),
            inputs: Arc::default(),
            waiting: Mutex::default(),
        }
    }

    /// Registers a call of the stream `ledger` (its bare name) about to start under
    /// `ledger_id`: the token fires when a `tool.cancel` names it, until the registration is
    /// dropped.
    pub(crate) fn register(&self, ledger: &str, ledger_id: &str) -> (CancellationToken, Registration<'_>) {
        self.running.register(ledger, ledger_id)
    }

    /// Cancels the call `request_id` of the requests stream `ledger` (its bare name), wherever
    /// in the fleet it runs, and says what was found. Redis failures are retried until `forced`
    /// fires; `None` then.
    pub(crate) async fn cancel(
        &self,
        ledger: &str,
        request_id: &str,
        forced: &CancellationToken,
    ) -> Option<CancelState> {
        if self.running.cancel(ledger, request_id) {
            return Some(CancelState::Cancelling);
        }
        if self.forward(ledger, request_id).await {
            return Some(CancelState::Cancelling);
        }
        let mut backoff = Backoff::new();
        loop {
            match self.ledger_state(ledger, request_id).await {
                Ok(state) => return Some(state),
                Err(err) if err.is_retryable() => {
                    redis_warn!(&err, error = %err, request_id, "cannot read the ledger for a cancel; retrying");
                    if !backoff.wait(forced).await {
                        return None;
                    }
                }
                Err(err) => {
                    warn!(error = %err, request_id, "cannot read the ledger for a cancel");
                    return None;
                }
            }
        }
    }

    /// What the ledger knows of a call no live replica says it runs.
    async fn ledger_state(&self, ledger: &str, request_id: &str) -> Result<CancelState, Error> {
        let answered = self.keys.answered(ledger, request_id);
        // On a cluster the key is the request's claim (a hash, or a string in ledger format 3);
        // on one server the mark, a string. Neither counts when it holds only ledger format 2's
        // note of refused entries.
        let is_answered = if self.keys.is_cluster() {
            toolhost_bus::read_claim(self.bus.as_ref(), &answered)
                .await?
                .is_some_and(|claim| claim.topic.is_some() || claim.state.is_some() || claim.answer.is_some())
        } else {
            let marks = self.bus.values(&[answered]).await?;
            marks.first().and_then(Option::as_deref).is_some_and(toolhost_bus::is_answer_mark)
        };
        if is_answered {
            return Ok(CancelState::Answered);
        }
        // A record without a live replica running the call: its holder is between its ledger
        // step and its run, or in another toolbox that reads the same cancel and stops it.
        let record = self.bus.hash_fields(&self.keys.call(ledger, request_id)).await?;
        Ok(if record.is_empty() { CancelState::Unknown } else { CancelState::Cancelling })
    }

    /// The questions of calls running here that wait for their caller's input.
    pub(crate) fn inputs(&self) -> &Arc<Inputs> {
        &self.inputs
    }

    /// Forwards a cancel to every other live replica and waits for their replies; whether one
    /// of them ran the call. A replica that cannot be reached counts as not running it.
    async fn forward(&self, ledger: &str, request_id: &str) -> bool {
        let message = json!({"kind": "cancel", "ledger": ledger, "request_id": request_id});
        let found = |reply: &Value| reply.get("running").and_then(Value::as_bool) == Some(true);
        self.forward_until(message, found).await.is_some()
    }

    /// Sends `message` (a JSON object; `reply_to` and `nonce` are added) to every other live
    /// replica's control stream and waits up to [`FORWARD_WAIT`] for the first reply `found`
    /// takes; `None` when no replica gave one. A replica that cannot be reached gives none.
    pub(super) async fn forward_until(
        &self,
        mut message: Value,
        found: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let replicas = self.fleet.replicas(&self.consumer);
        if replicas.is_empty() {
            return None;
        }
        let nonce = new_message_id();
        let (sender, mut replies) = mpsc::unbounded_channel();
        lock(&self.waiting).insert(nonce.clone(), sender);
        let _waiting = Waiting { calls: self, nonce: &nonce };
        message["reply_to"] = json!(self.control);
        message["nonce"] = json!(nonce);
        let message = message.to_string();
        let mut asked = 0;
        for replica in &replicas {
            let control = self.keys.control(&replica.toolbox_id, &replica.consumer);
            match self.bus.publish(&control, &new_message_id(), &message).await {
                Ok(_) => asked += 1,
                Err(err) => debug!(error = %err, consumer = %replica.consumer, "cannot forward a cancel"),
            }
        }
        let wait = async {
            for _ in 0..asked {
                match replies.recv().await {
                    Some(reply) if found(&reply) => return Some(reply),
                    Some(_) => {}
                    None => return None,
                }
            }
            None
        };
        tokio::time::timeout(FORWARD_WAIT, wait).await.ok().flatten()
    }

    /// Reads this replica's control stream until `stopping` fires, then deletes it.
    pub(crate) async fn run(self: Arc<Self>, stopping: CancellationToken) {
        let mut cursor = "0-0".to_owned();
        let mut backoff = Backoff::new();
        loop {
            let read = tokio::select! {
                () = stopping.cancelled() => break,
                read = self.bus.read(&self.control, &cursor, 100, Some(CONTROL_BLOCK)) => read,
            };
            let entries = match read {
                Ok(entries) => {
                    backoff.reset();
                    entries
                }
                Err(err) => {
                    redis_warn!(&err, error = %err, "cannot read the control stream; retrying");
                    if !backoff.wait(&stopping).await {
                        break;
                    }
                    continue;
                }
            };
            for entry in entries {
                cursor.clone_from(&entry.entry_id);
                let Some(message) =
                    entry.payload.and_then(|payload| serde_json::from_str::<Value>(&payload).ok())
                else {
                    continue;
                };
                self.handle(&message).await;
            }
        }
        if let Err(err) = self.bus.delete(std::slice::from_ref(&self.control)).await {
            debug!(error = %err, "cannot delete the control stream");
        }
    }

    /// Handles one control message: a forwarded cancel or input, or a reply to one of ours.
    async fn handle(&self, message: &Value) {
        let text = |key: &str| message.get(key).and_then(Value::as_str);
        let mut reply = match (text("kind"), text("nonce")) {
            (Some("cancel"), Some(_)) => {
                let (Some(ledger), Some(request_id)) = (text("ledger"), text("request_id")) else { return };
                let running = self.running.cancel(ledger, request_id);
                if running {
                    debug!(request_id, "call cancelled at another replica's request");
                }
                json!({"running": running})
            }
            (Some("input"), Some(_)) => match self.inputs.answer_forwarded(message) {
                Some(reply) => reply,
                None => return,
            },
            (Some("reply"), Some(nonce)) => {
                if let Some(sender) = lock(&self.waiting).get(nonce) {
                    let _ = sender.send(message.clone());
                }
                return;
            }
            _ => return,
        };
        let Some(reply_to) = text("reply_to") else { return };
        reply["kind"] = json!("reply");
        reply["nonce"] = message["nonce"].clone();
        if let Err(err) = self.bus.publish(reply_to, &new_message_id(), &reply.to_string()).await {
            debug!(error = %err, "cannot reply to a forwarded control message");
        }
    }
}

/// A forward's place among the waiting ones; removed when the forward ends.
struct Waiting<'a> {
    calls: &'a Calls,
    nonce: &'a str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.calls.waiting).remove(self.nonce);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_call_is_cancelled_until_its_registration_is_dropped() {
        let running = Running::default();
        let (first, registration) = running.register("action-requests", "r-1");
        let (second, copy) = running.register("action-requests", "r-1");
        let (elsewhere, kept) = running.register("other-requests", "r-1");
        assert!(!running.cancel("action-requests", "other"));
        assert!(running.cancel("action-requests", "r-1"));
        assert!(first.is_cancelled() && second.is_cancelled());
        // A call of another requests stream with the same id is not this cancel's.
        assert!(!elsewhere.is_cancelled());
        drop(registration);
        assert!(running.cancel("action-requests", "r-1"), "the copy still runs");
        drop(copy);
        assert!(!running.cancel("action-requests", "r-1"));
        drop(kept);
        assert!(lock(&running.calls).is_empty());
    }
}
