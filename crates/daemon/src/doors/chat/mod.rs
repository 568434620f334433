//! The chat door: reads `chat:<AGENT_NAME>` through the toolbox's consumer group and answers
//! each message, so agents can call tools by chatting with toolhost.
//!
//! A message carrying a tool call (`metadata.tool_call`, or `content` as
//! `{"tool", "arguments"}`) runs the tool, reports `tool_step` and `output` events on
//! `stream:<conversation_id>`, and is answered with a reply envelope on
//! `chat:<conversation_id>` (and `chat:<X>` when the sender was `agent:<X>`). Any other message
//! gets a short help reply. Control messages, replies and the daemon's own messages are acked
//! unanswered; malformed entries go to `dlq:<AGENT_NAME>`.
//!
//! The no-loss rules are the call lifecycle's ([`crate::call`]), under the ledger id
//! `chat:<envelope id>`, so a redelivered message is never answered twice. Progress events are
//! published before the commit and may repeat after a crash.

mod message;
mod reply;
mod settings;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use toolhost_bus::{Keys, Streams};
use toolhost_envelope::{
    Address, CallTrace, ChatEnvelope, DeadLetterEvent, Entry, StepStatus, StreamEvent, StreamEventKind,
    new_message_id,
};
use toolhost_tools::{Failure, Output, Registry};
use tracing::{info, warn};

use self::message::{Incoming, Malformed, ToolCall, classify};
pub(crate) use self::settings::Settings;
use crate::call::{
    Admission, Admitted, Answer, CallIds, Decision, Door, DoorTraits, Event, Letter, Lifecycle, Outcome,
    Permits, Refused, Reply, UNKNOWN_TOOL_LABEL, Work,
};
use crate::doors::context::StreamContext;
use crate::fleet::{Fleet, Route, route};
use crate::group::GroupReader;
use crate::telemetry::Sampling;

/// Starts the chat door: its reader of the agent inbox `chat:<agent_name>`, in the toolbox's
/// consumer group.
pub(crate) fn start(settings: Settings, cx: &StreamContext) -> Arc<GroupReader<Lifecycle<Inbox>>> {
    let services = &cx.services;
    let topic = services.keys.chat(&settings.agent_name);
    let ledger = Address::chat_of(&settings.agent_name);
    let door = Inbox::new(
        services.bus.clone(),
        services.keys.clone(),
        services.fleet.clone(),
        &cx.consumer,
        settings,
        services.telemetry.sampling(),
    );
    cx.reader(door, &ledger, topic)
}

/// The chat door of one agent inbox.
pub struct Inbox {
    bus: Arc<dyn Streams>,
    keys: Keys,
    settings: Settings,
    /// Full key of `dlq:<agent_name>`.
    dead_letters: String,
    /// `agent:<agent_name>`.
    sender: String,
    /// What the other replicas host, for calls this one cannot serve.
    fleet: Arc<Fleet>,
    /// This replica's consumer name.
    consumer: String,
    /// How new traces are sampled (the `sampled` flag of a call's context).
    sampling: Sampling,
}

/// An admitted chat message: the envelope and what answering it takes.
pub struct Message {
    envelope: Box<ChatEnvelope>,
    /// `None` for messages that are acked unanswered.
    work: Option<message::Work>,
    /// The trace the call runs under: from `metadata.traceparent` (and `metadata.tracestate`),
    /// else a new one.
    trace: CallTrace,
}

impl Message {
    fn new(envelope: Box<ChatEnvelope>, work: Option<message::Work>, sampling: Sampling) -> Message {
        let metadata = |key: &str| envelope.metadata.get(key).and_then(Value::as_str);
        let trace =
            CallTrace::of(metadata("traceparent"), metadata("tracestate"), None, |trace_id, parent| {
                sampling.sampled(trace_id, parent)
            });
        Message { envelope, work, trace }
    }
}

impl Inbox {
    /// The inbox of `settings.agent_name`.
    pub(crate) fn new(
        bus: Arc<dyn Streams>,
        keys: Keys,
        fleet: Arc<Fleet>,
        consumer: &str,
        settings: Settings,
        sampling: Sampling,
    ) -> Inbox {
        Inbox {
            fleet,
            sampling,
            consumer: consumer.to_owned(),
            dead_letters: keys.dead_letters(&settings.agent_name),
            sender: Address::agent_of(&settings.agent_name),
            bus,
            keys,
            settings,
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

    /// A `tool_step` event of `call`.
    fn step(
        call: &ToolCall,
        status: StepStatus,
        res: Option<(&Result<Output, Failure>, Duration)>,
    ) -> StreamEventKind {
        let (result_summary, error, duration_ms) = match res {
            None => (None, None, None),
            Some((Ok(value), duration)) => {
                (Some(reply::summary(&value.result.to_string())), None, Some(duration.as_millis() as u64))
            }
            Some((Err(failure), duration)) => {
                (None, Some(failure.message.clone()), Some(duration.as_millis() as u64))
            }
        };
        StreamEventKind::ToolStep {
            name: call.name.clone(),
            args: call.arguments.clone(),
            status,
            result_summary,
            error,
            duration_ms,
            tool_call_id: Some(call.id.clone()),
        }
    }

    /// The tool call of a message, if it carries one.
    fn call(message: &Message) -> Option<&ToolCall> {
        match &message.work {
            Some(message::Work::Call(call)) => Some(call),
            _ => None,
        }
    }

    /// The dead letter of a chat entry, in the contract's `dlq:<agent>` shape.
    fn dead_letter(&self, malformed: Malformed) -> Letter {
        let Malformed { envelope, conversation_id, error } = malformed;
        let letter = DeadLetterEvent::new(&self.settings.agent_name, conversation_id, envelope, error);
        // Serialising a struct of strings and JSON values cannot fail.
        let payload = serde_json::to_string(&letter).unwrap_or_default();
        Letter { topic: self.dead_letters.clone(), id: new_message_id(), payload }
    }
}

/// The ledger's request id of a chat message, kept apart from action-request ids.
fn ledger_id(message_id: &str) -> String {
    Address::chat_of(message_id)
}

impl Door for Inbox {
    type Request = Message;

    /// Progress events are seen by the conversation, so a copy of an answered message must not
    /// run again, even for a read-only tool.
    const TRAITS: DoorTraits =
        DoorTraits { name: "chat", relays_progress: false, keeps_answers: false, tracks_every_call: true };

    fn admit(&self, entry: &Entry, registry: &Registry) -> Admission<Message> {
        match classify(entry, self.settings.max_payload_bytes, &self.sender) {
            Incoming::Malformed(malformed) => {
                let reason = malformed.error.clone();
                Admission::DeadLetter(self.dead_letter(malformed), reason)
            }
            Incoming::Ignored(envelope, reason) => {
                Admission::Ignore(admitted(Message::new(envelope, None, self.sampling), registry), reason)
            }
            Incoming::Message(envelope, work) => {
                Admission::Request(admitted(Message::new(envelope, Some(work), self.sampling), registry))
            }
        }
    }

    /// Dead-lettered: every answer of the inbox goes to a conversation the payload names.
    fn refusal(&self, entry: &Entry, message: &Message, failure: Failure) -> Refused {
        Refused::DeadLetter(self.letter(entry, message, &format!("refused: {}", failure.message)))
    }

    fn work(&self, message: &Message, registry: &Registry, permits: Permits<'_>) -> Decision {
        let work = match &message.work {
            Some(message::Work::Call(call)) => {
                let tool = Work::Tool { name: call.name.clone(), arguments: call.arguments.clone() };
                if registry.is_enabled(&call.name) {
                    return tool.into();
                }
                // Every toolbox with this agent name reads the inbox: the one hosting the tool
                // answers; the call is answered here only when no live replica hosts it, by a
                // view of the fleet read after the message came.
                match route(&self.fleet, &call.name, &self.settings.toolbox_id, &self.consumer) {
                    Route::Here => return Decision::Unhosted(tool),
                    Route::OtherToolbox => Work::AckOnly,
                    Route::Sibling(consumer) => Work::HandOver(consumer),
                }
            }
            Some(message::Work::BadCall(error)) => Work::Answer(
                Err(Failure::new(toolhost_envelope::ErrorCode::InvalidRequest, error.clone())),
                Reply::Result,
            ),
            Some(message::Work::Text) => {
                let tools: Vec<Value> = registry
                    .enabled_names()
                    .into_iter()
                    .filter(|tool| permits.allows(tool))
                    .map(Value::from)
                    .collect();
                Work::Answer(Ok(Value::Array(tools).into()), Reply::Help)
            }
            None => Work::AckOnly,
        };
        work.into()
    }

    fn answer(&self, message: &Message, result: &Result<Output, Failure>) -> Answer {
        let envelope = &message.envelope;
        let reply = match (&message.work, result) {
            (Some(message::Work::Call(call)), _) => reply::call_reply(&self.sender, envelope, call, result),
            (Some(message::Work::Text), Ok(Output { result: Value::Array(tools), .. })) => {
                let names: Vec<&str> = tools.iter().filter_map(Value::as_str).collect();
                reply::help_reply(&self.sender, envelope, &names)
            }
            (_, Err(failure)) => reply::bad_call_reply(&self.sender, envelope, &failure.message),
            (_, Ok(_)) => reply::help_reply(&self.sender, envelope, &[]),
        };
        // The reply carries the call's trace context, as a result envelope does.
        let mut reply = reply;
        if let Value::Object(metadata) = &mut reply.metadata {
            metadata.insert("traceparent".to_owned(), Value::String(message.trace.traceparent()));
            if let Some(tracestate) = &message.trace.tracestate {
                metadata.insert("tracestate".to_owned(), Value::String(tracestate.clone()));
            }
        }
        let topic = self.keys.chat(&reply.conversation_id);
        let copy = Address::parse(&reply.recipient)
            .and_then(Address::agent)
            .map(|agent| self.keys.chat(agent))
            .filter(|copy| *copy != topic);
        // Serialising a struct of strings and JSON values cannot fail.
        let payload = serde_json::to_string(&reply).unwrap_or_default();
        Answer { topic, copy, id: reply.id, payload, kept: None }
    }

    /// A chat reply has nowhere else to go.
    fn fallback(&self, _message: &Message, _reason: &str) -> Option<Answer> {
        None
    }

    fn letter(&self, _entry: &Entry, message: &Message, reason: &str) -> Letter {
        self.dead_letter(Malformed {
            envelope: serde_json::to_value(&*message.envelope).unwrap_or(Value::Null),
            conversation_id: Some(message.envelope.conversation_id.clone()),
            error: reason.to_owned(),
        })
    }

    /// A tool's start and end are `tool_step` and `output` events of the conversation; the end
    /// of a message is logged.
    async fn observe(&self, event: Event<'_, Message>) {
        match event {
            Event::Started { request: message } => {
                if let Some(call) = Inbox::call(message) {
                    let step = Inbox::step(call, StepStatus::Start, None);
                    self.progress(&message.envelope.conversation_id, step).await;
                }
            }
            Event::Finished { request: message, result, duration } => {
                self.finished(message, result, duration).await;
            }
            Event::Ended { entry, request, tool, outcome, duration } => {
                self.log(entry, request, tool, outcome, duration);
            }
        }
    }
}

impl Inbox {
    /// Logs the end of an entry's handling.
    fn log(
        &self,
        entry: &Entry,
        message: Option<&Message>,
        tool: &str,
        outcome: Outcome,
        duration: Duration,
    ) {
        let envelope = message.map(|message| &message.envelope);
        let trace = message.map(|message| &message.trace);
        info!(
            envelope_id = envelope.map_or("-", |e| e.id.as_str()),
            trace_id = trace.map(CallTrace::trace_id_hex),
            span_id = trace.map(CallTrace::span_id_hex),
            conversation_id = envelope.map_or("-", |e| e.conversation_id.as_str()),
            sender = envelope.map_or("-", |e| e.sender.as_str()),
            tool,
            outcome = outcome.label(),
            duration_ms = duration.as_secs_f64() * 1000.0,
            entry_id = %entry.entry_id,
            deliveries = entry.deliveries,
            "chat message"
        );
    }

    /// The `tool_step` and `output` events of a call that ran, or was answered without running.
    async fn finished(&self, message: &Message, result: &Result<Output, Failure>, duration: Duration) {
        let Some(call) = Inbox::call(message) else { return };
        let conversation = &message.envelope.conversation_id;
        let status = if result.is_ok() { StepStatus::Success } else { StepStatus::Error };
        self.progress(conversation, Inbox::step(call, status, Some((result, duration)))).await;
        let text = reply::result_text(result);
        self.progress(conversation, StreamEventKind::Output { text, usage: None }).await;
    }
}

/// An admitted message, with what the lifecycle reads of every request: a chat envelope names
/// no tenant, its `created_at` is its time and its sender its source, and it has no deadline.
/// Names no tool has share one label, so callers cannot grow the metric series.
fn admitted(message: Message, registry: &Registry) -> Admitted<Message> {
    let envelope = &message.envelope;
    let call = Inbox::call(&message);
    Admitted {
        ledger_id: ledger_id(&envelope.id),
        tenant: None,
        time: Some(envelope.created_at.clone()),
        source: Some(envelope.sender.clone()),
        deadline: None,
        ids: CallIds {
            request_id: envelope.id.clone(),
            correlation_id: call.map(|call| call.id.clone()),
            conversation_id: Some(envelope.conversation_id.clone()),
            trace: message.trace.clone(),
        },
        tool_label: call.map(|call| {
            if registry.contains(&call.name) { call.name.clone() } else { UNKNOWN_TOOL_LABEL.to_owned() }
        }),
        // The inbox is one stream, never sharded.
        former_ledger: None,
        request: message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_ledger_ids_are_kept_apart_from_request_ids() {
        assert_eq!(ledger_id("7f9c"), "chat:7f9c");
    }
}
