//! The chat inbox: reads `chat:<AGENT_NAME>` through the toolbox's consumer group and answers
//! each message, so agents can call tools by chatting with toolhost.
//!
//! A message carrying a tool call (`metadata.tool_call`, or `content` as
//! `{"tool", "arguments"}`) runs the tool through [`Registry::invoke`], reports `tool_step` and
//! `output` events on `stream:<conversation_id>`, and is answered with a reply envelope on
//! `chat:<conversation_id>` (and `chat:<X>` when the sender was `agent:<X>`). Any other message
//! gets a short help reply. Control messages, replies and the daemon's own messages are acked
//! unanswered; malformed entries go to `dlq:<AGENT_NAME>`.
//!
//! The no-loss rules are the dispatcher's: the reply, the answered mark and the ack are committed
//! together by one [`toolhost_bus::Bus::finish`] (through [`crate::ledger`]), under the ledger id
//! `chat:<envelope id>`, so a redelivered message is never answered twice. Progress events are
//! published before that commit and may repeat after a crash.

mod message;
mod reply;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use toolhost_bus::{Bus, CallKeys, CallStart, Committed, EntryRef, Keys, Published};
use toolhost_envelope::{
    Address, ChatEnvelope, DeadLetterEvent, Entry, ErrorCode, StepStatus, StreamEvent, StreamEventKind,
    new_message_id,
};
use toolhost_tools::{Context, Failure, Registry};
use tracing::{debug, info, warn};

use self::message::{Incoming, Malformed, ToolCall, Work, classify};
use crate::group::{EntryHandler, Slot};
use crate::ledger;
use crate::services::Services;
use crate::shutdown::Shutdown;
use crate::stats::Stats;
use crate::telemetry::Telemetry;

/// What the inbox needs to know, resolved from configuration.
#[derive(Debug, Clone)]
pub struct InboxSettings {
    /// The name toolhost speaks as: reads `chat:<agent_name>`, writes as `agent:<agent_name>`.
    pub agent_name: String,
    /// The consumer group and ledger namespace (the toolbox id).
    pub toolbox_id: String,
    /// This replica's consumer name.
    pub consumer: String,
    /// Larger payloads are dead-lettered.
    pub max_payload_bytes: usize,
    /// Lease of a call; idle time after which pending entries are reclaimed.
    pub claim_idle: Duration,
    /// Deliveries after which an entry is dead-lettered.
    pub max_deliveries: u64,
    /// How long answered message ids are remembered.
    pub answered_retention: Duration,
}

/// Answers the messages of one agent inbox.
pub struct Inbox {
    bus: Arc<dyn Bus>,
    registry: Arc<Registry>,
    keys: Keys,
    settings: InboxSettings,
    /// Full key of `chat:<agent_name>`.
    topic: String,
    /// Full key of `dlq:<agent_name>`.
    dead_letters: String,
    /// `agent:<agent_name>`.
    sender: String,
    stats: Arc<Stats>,
    telemetry: Telemetry,
    shutdown: Shutdown,
}

/// How a handled entry ended, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Success,
    Error(ErrorCode),
    Help,
    Ignored,
    DeadLetter,
    Duplicate,
    LeftPending,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Error(code) => code.as_str(),
            Outcome::Help => "help",
            Outcome::Ignored => "ignored",
            Outcome::DeadLetter => "dead_letter",
            Outcome::Duplicate => "duplicate",
            Outcome::LeftPending => "left_pending",
        }
    }

    /// The outcome of committing an answer whose own outcome is `self`.
    fn committed(self, committed: Option<Committed>) -> Outcome {
        match committed {
            Some(Committed::Published) => self,
            Some(Committed::NotPublished) => Outcome::Duplicate,
            Some(_) | None => Outcome::LeftPending,
        }
    }
}

/// The ledger's request id of a chat message, kept apart from action-request ids.
fn ledger_id(message_id: &str) -> String {
    format!("chat:{message_id}")
}

impl EntryHandler for Inbox {
    async fn handle(&self, entry: Entry, _slot: Slot) {
        self.handle_entry(&entry).await;
    }
}

impl Inbox {
    /// The inbox of `settings.agent_name`.
    pub fn new(services: Services, settings: InboxSettings) -> Inbox {
        let Services { bus, registry, limits: _, keys, stats, telemetry, shutdown } = services;
        Inbox {
            topic: keys.chat(&settings.agent_name),
            dead_letters: keys.dead_letters(&settings.agent_name),
            sender: Address::agent_of(&settings.agent_name),
            bus,
            registry,
            keys,
            settings,
            stats,
            telemetry,
            shutdown,
        }
    }

    /// The full key of the inbox stream.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Handles one entry to its end and logs the outcome.
    async fn handle_entry(&self, entry: &Entry) {
        let started = Instant::now();
        if entry.deliveries > 1 {
            self.telemetry.redelivered();
        }
        let (outcome, envelope, tool) = match classify(entry, self.settings.max_payload_bytes, &self.sender) {
            Incoming::Malformed(malformed) => (self.dead_letter(entry, malformed).await, None, None),
            Incoming::Ignored(envelope, reason) => {
                let acked = self.commit(entry, None, None, None).await;
                debug!(entry_id = %entry.entry_id, reason, "chat message ignored");
                let acked = acked.map(|_| Committed::Published);
                (Outcome::Ignored.committed(acked), Some(envelope), None)
            }
            Incoming::Message(envelope, work) => {
                // Names no tool has share one label, so callers cannot grow the metric series.
                let tool = match &work {
                    Work::Call(call) if self.registry.contains(&call.name) => Some(call.name.clone()),
                    Work::Call(_) => Some("_unknown".to_owned()),
                    _ => None,
                };
                (self.answer(entry, &envelope, work).await, Some(envelope), tool)
            }
        };
        let duration = started.elapsed();
        let tool_label = tool.as_deref().unwrap_or("-");
        self.telemetry.invocation(tool_label, outcome.label(), duration);
        info!(
            envelope_id = envelope.as_ref().map_or("-", |e| e.id.as_str()),
            conversation_id = envelope.as_ref().map_or("-", |e| e.conversation_id.as_str()),
            sender = envelope.as_ref().map_or("-", |e| e.sender.as_str()),
            tool = tool_label,
            outcome = outcome.label(),
            duration_ms = duration.as_secs_f64() * 1000.0,
            entry_id = %entry.entry_id,
            deliveries = entry.deliveries,
            "chat message"
        );
    }

    /// Answers a message (unless the ledger says it was) and commits the reply.
    async fn answer(&self, entry: &Entry, envelope: &ChatEnvelope, work: Work) -> Outcome {
        let request_id = ledger_id(&envelope.id);
        let answered_key = self.keys.answered(&self.settings.toolbox_id, &request_id);
        let call_key = self.keys.call(&self.settings.toolbox_id, &request_id);
        let call_keys = CallKeys {
            answered: &answered_key,
            call: &call_key,
            lease: self.settings.claim_idle,
            retention: self.settings.answered_retention,
        };
        let owner = ledger::owner(&self.settings.consumer, &entry.entry_id);
        let forced = self.shutdown.forced();
        let begun = ledger::begin(&*self.bus, &call_keys, &owner, &entry.entry_id, &request_id, forced).await;
        // The poison check comes after the ledger, so a copy of a message whose call is alive
        // elsewhere is left to it rather than dead-lettered.
        let poisoned = entry.deliveries > self.settings.max_deliveries;
        let rerun = match begun {
            None => return Outcome::LeftPending,
            Some(CallStart::Fresh | CallStart::StartedBefore) if poisoned => {
                return self.poison(entry, envelope, call_keys).await;
            }
            Some(CallStart::Fresh) => true,
            Some(CallStart::StartedBefore) => match &work {
                Work::Call(call) => self.registry.annotations(&call.name).is_some_and(|a| a.idempotent),
                // Help and error replies have no effects to repeat.
                _ => true,
            },
            // The owner is alive and will ack this very entry.
            Some(CallStart::Busy { entry_id }) if entry_id == entry.entry_id => return Outcome::LeftPending,
            Some(CallStart::Answered | CallStart::Busy { .. }) => {
                let acked = self.commit(entry, None, None, None).await.map(|_| Committed::Published);
                return Outcome::Duplicate.committed(acked);
            }
            Some(_) => return Outcome::LeftPending,
        };
        let (reply, outcome) = match work {
            Work::Call(call) => {
                match self.run_call(entry, envelope, &call, &call_keys, &owner, rerun).await {
                    Some(done) => done,
                    // Shutdown was forced: the entry stays pending with a lapsing lease, and a
                    // replica takes it over.
                    None => return Outcome::LeftPending,
                }
            }
            Work::BadCall(error) => (
                reply::bad_call_reply(&self.sender, envelope, &error),
                Outcome::Error(ErrorCode::InvalidRequest),
            ),
            Work::Text => {
                (reply::help_reply(&self.sender, envelope, &self.registry.enabled_names()), Outcome::Help)
            }
        };
        match self.commit(entry, Some(call_keys), Some(&reply), None).await {
            // A conversation or inbox key of another type can never take the reply: dead-letter
            // the message rather than let it loop through redeliveries.
            Some(Committed::WrongType) => {
                let malformed = Malformed {
                    envelope: serde_json::to_value(envelope).unwrap_or(Value::Null),
                    conversation_id: Some(envelope.conversation_id.clone()),
                    error: "the reply's chat topic holds a key that is not a stream".to_owned(),
                };
                self.dead_letter_with(entry, malformed, Some(call_keys)).await
            }
            committed => outcome.committed(committed),
        }
    }

    /// Runs one tool call (or answers `interrupted` when it must not run again), reporting its
    /// steps and output on the conversation stream. Returns the reply, or `None` when shutdown
    /// was forced while the tool ran.
    async fn run_call(
        &self,
        entry: &Entry,
        envelope: &ChatEnvelope,
        call: &ToolCall,
        call_keys: &CallKeys<'_>,
        owner: &str,
        run: bool,
    ) -> Option<(ChatEnvelope, Outcome)> {
        let conversation = &envelope.conversation_id;
        let step = |status, result_summary, error, duration_ms| StreamEventKind::ToolStep {
            name: call.name.clone(),
            args: call.arguments.clone(),
            status,
            result_summary,
            error,
            duration_ms,
            tool_call_id: Some(call.id.clone()),
        };
        let started = Instant::now();
        let res = if run {
            self.progress(conversation, step(StepStatus::Start, None, None, None)).await;
            self.invoke(entry, envelope, call, call_keys, owner).await?
        } else {
            Err(ledger::interrupted(&call.name))
        };
        let duration = started.elapsed();
        let duration_ms = Some(duration.as_millis() as u64);
        let text = reply::result_text(&res);
        let end = match &res {
            Ok(_) => step(StepStatus::Success, Some(reply::summary(&text)), None, duration_ms),
            Err(failure) => step(StepStatus::Error, None, Some(failure.message.clone()), duration_ms),
        };
        self.progress(conversation, end).await;
        self.progress(conversation, StreamEventKind::Output { text, usage: None }).await;
        let code = res.as_ref().err().map(|failure| failure.code);
        self.stats.record(&call.name, code.map(ErrorCode::as_str), duration);
        let reply = reply::call_reply(&self.sender, envelope, call, &res);
        Some((reply, code.map_or(Outcome::Success, Outcome::Error)))
    }

    /// Runs the tool, renewing the lease while it runs; a forced shutdown cancels it and returns
    /// `None`, answering nothing.
    async fn invoke(
        &self,
        entry: &Entry,
        envelope: &ChatEnvelope,
        call: &ToolCall,
        call_keys: &CallKeys<'_>,
        owner: &str,
    ) -> Option<Result<Value, Failure>> {
        let context = Context {
            request_id: envelope.id.clone(),
            correlation_id: Some(call.id.clone()),
            conversation_id: Some(envelope.conversation_id.clone()),
            cancel: self.shutdown.forced().child_token(),
        };
        let request_id = ledger_id(&envelope.id);
        let group = &self.settings.toolbox_id;
        let entry_ref = EntryRef { topic: &self.topic, group, entry_id: &entry.entry_id };
        let consumer = &self.settings.consumer;
        let period = self.settings.claim_idle / 3;
        let renew = ledger::renew(&*self.bus, call_keys, owner, &entry_ref, consumer, &request_id, period);
        let forced = self.shutdown.forced().clone();
        let _in_flight = self.telemetry.in_flight_guard();
        tokio::select! {
            res = self.registry.invoke(&call.name, call.arguments.clone(), &context, None) => Some(res),
            () = renew => Some(Err(Failure::new(ErrorCode::Internal, "lease renewal stopped"))),
            () = forced.cancelled() => {
                context.cancel.cancel();
                warn!(envelope_id = %envelope.id, tool = %call.name, "grace period over; call abandoned, left to a replica");
                None
            }
        }
    }

    /// Publishes a progress event to `stream:<conversation_id>`. Progress is best effort: a
    /// failure is logged and the call goes on, since the reply is what must not be lost.
    async fn progress(&self, conversation_id: &str, kind: StreamEventKind) {
        let event = StreamEvent::new(conversation_id, kind);
        let topic = self.keys.conversation_stream(conversation_id);
        // Serialising a struct of strings and JSON values cannot fail.
        let payload = serde_json::to_string(&event).unwrap_or_default();
        if let Err(err) = self.bus.publish(&topic, &event.id, &payload).await {
            warn!(error = %err, topic = %topic, "cannot publish a progress event");
        }
    }

    /// A message delivered too often: dead-letter it, clearing its call record, and ack it.
    async fn poison(&self, entry: &Entry, envelope: &ChatEnvelope, call_keys: CallKeys<'_>) -> Outcome {
        let malformed = Malformed {
            envelope: serde_json::to_value(envelope).unwrap_or(Value::Null),
            conversation_id: Some(envelope.conversation_id.clone()),
            error: format!(
                "delivered {} times without completing (limit {})",
                entry.deliveries, self.settings.max_deliveries
            ),
        };
        self.dead_letter_with(entry, malformed, Some(call_keys)).await
    }

    /// Dead-letters an entry to `dlq:<agent_name>`, acking it.
    async fn dead_letter(&self, entry: &Entry, malformed: Malformed) -> Outcome {
        self.dead_letter_with(entry, malformed, None).await
    }

    /// Dead-letters an entry, acking it and deleting the call record of `call`, if any.
    async fn dead_letter_with(
        &self,
        entry: &Entry,
        malformed: Malformed,
        call: Option<CallKeys<'_>>,
    ) -> Outcome {
        warn!(entry_id = %entry.entry_id, reason = %malformed.error, "dead-lettering chat entry");
        let Malformed { envelope, conversation_id, error } = malformed;
        let letter = DeadLetterEvent::new(&self.settings.agent_name, conversation_id, envelope, error);
        // Serialising a struct of strings and JSON values cannot fail.
        let payload = serde_json::to_string(&letter).unwrap_or_default();
        let letter_id = new_message_id();
        let dead = Published { topic: &self.dead_letters, id: &letter_id, payload: &payload };
        self.telemetry.dead_lettered();
        let committed = self.commit(entry, call, None, Some(dead)).await.map(|_| Committed::Published);
        Outcome::DeadLetter.committed(committed)
    }

    /// Commits the end of an entry: the reply (to the conversation, and to the agent's inbox for
    /// an agent recipient), the dead letter, the answered mark and the ack.
    async fn commit(
        &self,
        entry: &Entry,
        call: Option<CallKeys<'_>>,
        reply: Option<&ChatEnvelope>,
        dead_letter: Option<Published<'_>>,
    ) -> Option<Committed> {
        let conversation_topic = reply.map(|reply| self.keys.chat(&reply.conversation_id));
        let agent_topic = reply
            .and_then(|reply| Address::parse(&reply.recipient).and_then(Address::agent))
            .map(|agent| self.keys.chat(agent))
            .filter(|topic| Some(topic) != conversation_topic.as_ref());
        // Serialising a struct of strings and JSON values cannot fail.
        let payload = reply.map(|reply| serde_json::to_string(reply).unwrap_or_default()).unwrap_or_default();
        let answer = reply.zip(conversation_topic.as_deref()).map(|(reply, topic)| Published {
            topic,
            id: &reply.id,
            payload: &payload,
        });
        let finish = toolhost_bus::Finish {
            entry: EntryRef {
                topic: &self.topic,
                group: &self.settings.toolbox_id,
                entry_id: &entry.entry_id,
            },
            call,
            answer,
            answer_copy: agent_topic.as_deref(),
            dead_letter,
            // A chat reply ends its message for good.
            final_answer: true,
        };
        ledger::finish(&*self.bus, &finish, self.shutdown.forced(), &self.telemetry).await
    }
}
