//! Specialist agents as tools: each configured agent becomes a tool that sends its one argument
//! to the agent as a chat message and returns the agent's answer.
//!
//! A call sends a message envelope from `agent:<own name>` to `agent:<name>` on `chat:<cid>` and
//! `chat:<name>`, then waits on two topics at once for the answer: an `output` event on
//! `stream:<cid>` (its text, or the joined `token` events when the text is empty), or a reply
//! envelope on `chat:<cid>` sent by `agent:<name>`, whichever comes first. Both cursors are taken
//! before the message is sent, so a fast answer is not missed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use toolhost_bus::{Keys, Streams};
use toolhost_envelope::{
    Address, Annotations, ChatEnvelope, ChatKind, StreamEvent, StreamEventKind, new_message_id,
};

use crate::{Context, Tool, ToolError, ToolSpec};

/// How much longer than the agent's own timeout the registry lets a call run, so the tool's
/// clearer timeout error fires first.
const TIMEOUT_MARGIN: Duration = Duration::from_secs(2);
/// Longest single blocking read while waiting, so a finished call stops reading promptly.
const READ_BLOCK: Duration = Duration::from_secs(1);
/// Pause after a failed read before trying again.
const READ_RETRY: Duration = Duration::from_millis(200);
/// The optional argument that continues a conversation. It is also what `action-requests`
/// callers put in `data` to continue one, so the schema must admit it.
pub const CONVERSATION_ID: &str = "conversation_id";

/// One specialist agent, as configured. `parameter` must not be [`CONVERSATION_ID`].
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// The agent's name: the tool's name, `agent:<name>` and `chat:<name>`.
    pub name: String,
    /// What the agent does, for a model to read.
    pub description: String,
    /// The name of the one string argument.
    pub parameter: String,
    /// How long to wait for the agent's answer.
    pub timeout: Duration,
}

/// Asks a specialist agent over chat and returns its answer.
pub struct AgentTool {
    bus: Arc<dyn Streams>,
    keys: Keys,
    /// `agent:<AGENT_NAME>`.
    sender: String,
    settings: AgentSettings,
}

impl AgentTool {
    /// The tool for `settings`, speaking as `agent:<agent_name>`.
    pub fn new(bus: Arc<dyn Streams>, keys: Keys, agent_name: &str, settings: AgentSettings) -> AgentTool {
        AgentTool { bus, keys, sender: Address::agent_of(agent_name), settings }
    }

    /// Sends `text` and waits for the answer in `conversation_id`.
    async fn ask(&self, conversation_id: &str, text: &str, context: &Context) -> Result<String, ToolError> {
        let name = &self.settings.name;
        let stream = self.keys.conversation_stream(conversation_id);
        let chat = self.keys.chat(conversation_id);
        let failed =
            |what: &str, err: toolhost_bus::Error| ToolError::Failed(format!("cannot {what}: {err}"));
        let stream_cursor =
            self.bus.last_entry_id(&stream).await.map_err(|err| failed("read the stream", err))?;
        let chat_cursor = self.bus.last_entry_id(&chat).await.map_err(|err| failed("read the chat", err))?;
        let recipient = Address::agent_of(name);
        // The call's trace context rides in `metadata.traceparent` (and `metadata.tracestate`).
        let mut metadata = json!({});
        if let Some((traceparent, tracestate)) = context.trace_headers() {
            metadata["traceparent"] = json!(traceparent);
            if let Some(tracestate) = tracestate {
                metadata["tracestate"] = json!(tracestate);
            }
        }
        let envelope =
            ChatEnvelope::message(conversation_id, &self.sender, &recipient, text.to_owned(), metadata);
        // Serialising a struct of strings and JSON values cannot fail.
        let payload = serde_json::to_string(&envelope).unwrap_or_default();
        for topic in [chat.clone(), self.keys.chat(name)] {
            self.bus
                .publish(&topic, &envelope.id, &payload)
                .await
                .map_err(|err| failed("send the message", err))?;
        }
        tokio::select! {
            text = self.await_output(&stream, stream_cursor) => Ok(text),
            text = self.await_reply(&chat, chat_cursor, &recipient) => Ok(text),
            () = tokio::time::sleep(self.settings.timeout) => Err(ToolError::Timeout(format!(
                "agent '{name}' did not answer within {} s in conversation {conversation_id}",
                self.settings.timeout.as_secs_f64()
            ))),
            () = context.cancel.cancelled() => Err(ToolError::Failed(format!("the call to agent '{name}' was cancelled"))),
        }
    }

    /// The text of the first `output` event after `cursor` on the conversation stream.
    async fn await_output(&self, stream: &str, mut cursor: String) -> String {
        let mut tokens = BTreeMap::new();
        loop {
            for entry in self.read(stream, &cursor).await {
                cursor = entry.entry_id;
                let Some(event) = entry.payload.and_then(|p| serde_json::from_str::<StreamEvent>(&p).ok())
                else {
                    continue;
                };
                match event.kind {
                    StreamEventKind::Token { text, index } => {
                        tokens.insert(index, text);
                    }
                    StreamEventKind::Output { text, .. } if text.is_empty() => {
                        return tokens.into_values().collect();
                    }
                    StreamEventKind::Output { text, .. } => return text,
                    StreamEventKind::ToolStep { .. } => {}
                }
            }
        }
    }

    /// The content of the first message after `cursor` on the conversation's chat topic sent by
    /// `sender`.
    async fn await_reply(&self, chat: &str, mut cursor: String, sender: &str) -> String {
        loop {
            for entry in self.read(chat, &cursor).await {
                cursor = entry.entry_id;
                let Some(envelope) =
                    entry.payload.and_then(|p| serde_json::from_str::<ChatEnvelope>(&p).ok())
                else {
                    continue;
                };
                if envelope.sender == sender && envelope.kind == ChatKind::Message {
                    return envelope.content;
                }
            }
        }
    }

    /// One blocking read; an error is logged and read as "nothing yet" after a short pause, so
    /// a Redis hiccup costs time, not the call (the caller's timeout still applies).
    async fn read(&self, topic: &str, cursor: &str) -> Vec<toolhost_envelope::Entry> {
        match self.bus.read(topic, cursor, 100, Some(READ_BLOCK)).await {
            Ok(entries) => entries,
            Err(err) => {
                tracing::warn!(error = %err, topic, agent = %self.settings.name, "waiting for an agent: read failed");
                tokio::time::sleep(READ_RETRY).await;
                Vec::new()
            }
        }
    }
}

#[async_trait]
impl Tool for AgentTool {
    fn remote(&self) -> Option<crate::Remote> {
        Some(crate::Remote {
            system: "chat",
            target: self.settings.name.clone(),
            name: self.settings.name.clone(),
            transport: "tcp",
        })
    }

    fn spec(&self) -> ToolSpec {
        let settings = &self.settings;
        let mut spec = ToolSpec::new(
            &settings.name,
            &settings.description,
            json!({
                "type": "object",
                "properties": {
                    settings.parameter.as_str(): {"type": "string", "description": format!("What to send to the agent '{}'.", settings.name)},
                    CONVERSATION_ID: {"type": "string", "description": "Continue this conversation (from an earlier answer) instead of starting a new one."},
                },
                "required": [settings.parameter],
                "additionalProperties": false,
            }),
            json!({
                "type": "object",
                "properties": {"response": {"type": "string"}, "conversation_id": {"type": "string"}},
                "required": ["response", "conversation_id"],
                "additionalProperties": false,
            }),
        );
        spec.annotations = Annotations { read_only: false, idempotent: false, destructive: false };
        spec.timeout = settings.timeout + TIMEOUT_MARGIN;
        spec
    }

    async fn call(&self, arguments: Value, context: &Context) -> Result<Value, ToolError> {
        let text = arguments.get(&self.settings.parameter).and_then(Value::as_str).unwrap_or_default();
        let explicit = arguments.get(CONVERSATION_ID).and_then(Value::as_str);
        let conversation_id = [explicit, context.conversation_id.as_deref()]
            .into_iter()
            .flatten()
            .find(|id| !id.trim().is_empty())
            .map_or_else(new_message_id, str::to_owned);
        let response = self.ask(&conversation_id, text, context).await?;
        Ok(json!({"response": response, "conversation_id": conversation_id}))
    }
}

#[cfg(test)]
mod tests {
    use toolhost_bus::{MemoryBus, Streams};

    use super::*;
    use crate::Registry;

    fn tool(bus: &Arc<MemoryBus>, timeout_ms: u64) -> AgentTool {
        let settings = AgentSettings {
            name: "coder".into(),
            description: "Writes code.".into(),
            parameter: "task".into(),
            timeout: Duration::from_millis(timeout_ms),
        };
        AgentTool::new(bus.clone(), Keys::new(""), "ToolHost", settings)
    }

    /// Answers the next message on `chat:coder` with `answer(conversation_id)` events.
    async fn specialist(bus: Arc<MemoryBus>, answer: impl Fn(&str) -> Vec<(String, Value)> + Send + 'static) {
        let cursor = bus.last_entry_id("chat:coder").await.unwrap();
        tokio::spawn(async move {
            let entries = bus.read("chat:coder", &cursor, 1, Some(Duration::from_secs(5))).await.unwrap();
            let message: ChatEnvelope = serde_json::from_str(entries[0].payload.as_deref().unwrap()).unwrap();
            assert_eq!(message.sender, "agent:ToolHost");
            assert_eq!(message.recipient, "agent:coder");
            for (topic, payload) in answer(&message.conversation_id) {
                bus.publish(&topic, &new_message_id(), &payload.to_string()).await.unwrap();
            }
        });
    }

    async fn invoke(
        tool: AgentTool,
        arguments: Value,
        conversation: Option<&str>,
    ) -> Result<Value, (String, String)> {
        let mut registry = Registry::new();
        registry.register(Arc::new(tool)).unwrap();
        let context = Context { conversation_id: conversation.map(str::to_owned), ..Context::default() };
        registry
            .invoke("coder", arguments, &context, None)
            .await
            .map_err(|failure| (failure.code.as_str().to_owned(), failure.message))
    }

    #[tokio::test]
    async fn output_event_answers_with_tokens_as_fallback() {
        let bus = Arc::new(MemoryBus::new());
        specialist(bus.clone(), |cid| {
            let event = |kind| serde_json::to_value(StreamEvent::new(cid, kind)).unwrap();
            let stream = format!("stream:{cid}");
            vec![
                (stream.clone(), event(StreamEventKind::Token { text: "lo".into(), index: 1 })),
                (stream.clone(), event(StreamEventKind::Token { text: "hel".into(), index: 0 })),
                (stream, event(StreamEventKind::Output { text: String::new(), usage: None })),
            ]
        })
        .await;
        let res = invoke(tool(&bus, 2000), json!({"task": "greet"}), Some("conv-1")).await.unwrap();
        assert_eq!(res, json!({"response": "hello", "conversation_id": "conv-1"}));
        assert_eq!(bus.payloads("chat:conv-1").len(), 1);
    }

    #[tokio::test]
    async fn the_message_carries_the_calls_trace_context_in_its_metadata() {
        let bus = Arc::new(MemoryBus::new());
        specialist(bus.clone(), |cid| {
            let reply = ChatEnvelope::message(cid, "agent:coder", "agent:ToolHost", "done".into(), json!({}));
            vec![(format!("chat:{cid}"), serde_json::to_value(reply).unwrap())]
        })
        .await;
        let trace = toolhost_envelope::CallTrace::of(
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("vendor=x"),
            None,
            toolhost_envelope::CallTrace::parent_only,
        );
        let mut registry = Registry::new();
        registry.register(Arc::new(tool(&bus, 2000))).unwrap();
        let context = Context { trace: Some(trace.clone()), ..Context::default() };
        registry.invoke("coder", json!({"task": "greet"}), &context, None).await.unwrap();
        let sent: ChatEnvelope = serde_json::from_str(&bus.payloads("chat:coder")[0]).unwrap();
        assert_eq!(sent.metadata["traceparent"], trace.traceparent());
        assert_eq!(sent.metadata["tracestate"], "vendor=x");
        // Not the caller's span: the call's own.
        assert!(!trace.traceparent().contains("00f067aa0ba902b7"));
    }

    #[tokio::test]
    async fn reply_envelope_answers_in_a_fresh_conversation() {
        let bus = Arc::new(MemoryBus::new());
        specialist(bus.clone(), |cid| {
            let reply = ChatEnvelope::message(cid, "agent:coder", "agent:ToolHost", "done".into(), json!({}));
            vec![(format!("chat:{cid}"), serde_json::to_value(reply).unwrap())]
        })
        .await;
        let res = invoke(tool(&bus, 2000), json!({"task": "build"}), None).await.unwrap();
        assert_eq!(res["response"], "done");
        assert!(uuid::Uuid::parse_str(res["conversation_id"].as_str().unwrap()).is_ok());
        specialist(bus.clone(), |cid| {
            let reply =
                ChatEnvelope::message(cid, "agent:coder", "agent:ToolHost", "again".into(), json!({}));
            vec![(format!("chat:{cid}"), serde_json::to_value(reply).unwrap())]
        })
        .await;
        let arguments = json!({"task": "more", "conversation_id": "chosen"});
        let res = invoke(tool(&bus, 2000), arguments, Some("context")).await.unwrap();
        assert_eq!(res, json!({"response": "again", "conversation_id": "chosen"}));
    }

    #[tokio::test]
    async fn silence_times_out_with_the_tools_own_error() {
        let bus = Arc::new(MemoryBus::new());
        let (code, message) = invoke(tool(&bus, 100), json!({"task": "x"}), Some("c")).await.unwrap_err();
        assert_eq!(code, "timeout");
        assert_eq!(message, "agent 'coder' did not answer within 0.1 s in conversation c");
        let spec = tool(&bus, 100).spec();
        assert_eq!(spec.timeout, Duration::from_millis(2100));
        assert!(!spec.annotations.idempotent);
        assert_eq!(spec.argument_schema["required"], json!(["task"]));
    }
}
