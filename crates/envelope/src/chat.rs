//! Chat wire types of contract section 4: message envelopes on `chat:<name>`, progress events on
//! `stream:<conversation_id>`, and dead letters on `dlq:<agent>`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{new_message_id, now_rfc3339};

/// A chat message between agents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatEnvelope {
    /// Message id (UUID).
    pub id: String,
    /// The conversation this message belongs to.
    pub conversation_id: String,
    /// `agent:<Name>` of the writer.
    pub sender: String,
    /// `chat:<conversation_id>` or `agent:<Name>`.
    pub recipient: String,
    /// `message` or `control`.
    #[serde(rename = "type")]
    pub kind: ChatKind,
    /// The text.
    pub content: String,
    /// Free-form structure; tool calls ride here as `metadata.tool_call`.
    #[serde(default)]
    pub metadata: Value,
    /// RFC 3339 UTC creation time.
    pub created_at: String,
}

impl ChatEnvelope {
    /// A new `message` envelope with a fresh id and the current time.
    pub fn message(
        conversation_id: &str,
        sender: &str,
        recipient: &str,
        content: String,
        metadata: Value,
    ) -> ChatEnvelope {
        ChatEnvelope {
            id: new_message_id(),
            conversation_id: conversation_id.to_owned(),
            sender: sender.to_owned(),
            recipient: recipient.to_owned(),
            kind: ChatKind::Message,
            content,
            metadata,
            created_at: now_rfc3339(),
        }
    }
}

/// The two kinds of chat envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatKind {
    /// Something to read and maybe act on.
    Message,
    /// Steering between agents; toolhost ignores these.
    Control,
}

/// A progress event on `stream:<conversation_id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamEvent {
    /// Event id (UUID).
    pub id: String,
    /// The conversation it reports on.
    pub conversation_id: String,
    /// RFC 3339 UTC creation time.
    pub created_at: String,
    /// What happened.
    #[serde(flatten)]
    pub kind: StreamEventKind,
}

impl StreamEvent {
    /// A new event with a fresh id and the current time.
    pub fn new(conversation_id: &str, kind: StreamEventKind) -> StreamEvent {
        StreamEvent {
            id: new_message_id(),
            conversation_id: conversation_id.to_owned(),
            created_at: now_rfc3339(),
            kind,
        }
    }
}

/// The `event` field of a [`StreamEvent`] and what goes with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum StreamEventKind {
    /// A tool call started, succeeded or failed.
    ToolStep {
        /// The tool's name.
        name: String,
        /// The arguments it was called with.
        args: Value,
        /// Where the step is.
        status: StepStatus,
        /// A short text of the result, on success.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result_summary: Option<String>,
        /// The error sentence, on failure.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// How long the call took, when it has ended.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
        /// Ties the start, success and error events of one call.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call_id: Option<String>,
    },
    /// A finished answer.
    Output {
        /// The answer's text.
        text: String,
        /// Token usage, when the writer knows it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Value>,
    },
    /// One streamed piece of an answer.
    Token {
        /// The piece.
        text: String,
        /// Its position.
        index: u64,
    },
}

/// The `status` of a `tool_step` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// The call is about to run.
    Start,
    /// The call succeeded.
    Success,
    /// The call failed.
    Error,
}

/// What goes to `dlq:<agent>` when a chat envelope cannot be handled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetterEvent {
    /// Always `dead_letter`.
    pub event: String,
    /// The agent whose inbox it came from.
    pub agent: String,
    /// The conversation, when it could be read.
    pub conversation_id: Option<String>,
    /// The envelope as received (parsed JSON, or the raw text as a string).
    pub envelope: Value,
    /// Why it was dead-lettered.
    pub error: String,
}

impl DeadLetterEvent {
    /// A dead letter for `agent`.
    pub fn new(
        agent: &str,
        conversation_id: Option<String>,
        envelope: Value,
        error: String,
    ) -> DeadLetterEvent {
        DeadLetterEvent {
            event: "dead_letter".to_owned(),
            agent: agent.to_owned(),
            conversation_id,
            envelope,
            error,
        }
    }
}

/// A chat address: `chat:<conversation_id>` or `agent:<Name>`, each with a suffix that is not
/// blank. The one place the two prefixes are parsed and written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Address<'a> {
    /// `chat:<conversation_id>`: a conversation.
    Chat(&'a str),
    /// `agent:<Name>`: an agent, whose inbox is `chat:<Name>`.
    Agent(&'a str),
}

impl<'a> Address<'a> {
    /// Parses an address; `None` for another prefix or a blank suffix.
    pub fn parse(text: &'a str) -> Option<Address<'a>> {
        let suffix = |prefix: &str| text.strip_prefix(prefix).filter(|rest| !rest.trim().is_empty());
        suffix(CHAT_PREFIX).map(Address::Chat).or_else(|| suffix(AGENT_PREFIX).map(Address::Agent))
    }

    /// The agent's name, for an agent address.
    pub fn agent(self) -> Option<&'a str> {
        match self {
            Address::Agent(name) => Some(name),
            Address::Chat(_) => None,
        }
    }

    /// `agent:<name>`.
    pub fn agent_of(name: &str) -> String {
        format!("{AGENT_PREFIX}{name}")
    }

    /// `chat:<conversation_id>`.
    pub fn chat_of(conversation_id: &str) -> String {
        format!("{CHAT_PREFIX}{conversation_id}")
    }
}

/// The prefix of a conversation address (and of chat topics).
pub const CHAT_PREFIX: &str = "chat:";
/// The prefix of an agent address.
pub const AGENT_PREFIX: &str = "agent:";

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn chat_envelope_round_trips_contract_json() {
        let literal = json!({"id": "0b3c", "conversation_id": "conv1", "sender": "agent:Planner",
            "recipient": "agent:ToolHost", "type": "message", "content": "text",
            "metadata": {}, "created_at": "2026-11-22T10:00:00Z"});
        let envelope: ChatEnvelope = serde_json::from_value(literal.clone()).unwrap();
        assert_eq!(envelope.kind, ChatKind::Message);
        assert_eq!(serde_json::to_value(&envelope).unwrap(), literal);
    }

    #[test]
    fn stream_events_match_contract_fields() {
        let step = StreamEvent {
            id: "e1".into(),
            conversation_id: "conv1".into(),
            created_at: "2026-11-22T10:00:00Z".into(),
            kind: StreamEventKind::ToolStep {
                name: "echo".into(),
                args: json!({"message": "hi"}),
                status: StepStatus::Success,
                result_summary: Some("{\"message\":\"hi\"}".into()),
                error: None,
                duration_ms: Some(3),
                tool_call_id: Some("call-1".into()),
            },
        };
        assert_eq!(
            serde_json::to_value(&step).unwrap(),
            json!({"id": "e1", "conversation_id": "conv1", "created_at": "2026-11-22T10:00:00Z",
                   "event": "tool_step", "name": "echo", "args": {"message": "hi"}, "status": "success",
                   "result_summary": "{\"message\":\"hi\"}", "duration_ms": 3, "tool_call_id": "call-1"})
        );
        let output: StreamEvent = serde_json::from_value(json!({"id": "e2", "conversation_id": "c",
            "created_at": "t", "event": "output", "text": "done"}))
        .unwrap();
        assert_eq!(output.kind, StreamEventKind::Output { text: "done".into(), usage: None });
        let token: StreamEvent = serde_json::from_value(json!({"id": "e3", "conversation_id": "c",
            "created_at": "t", "event": "token", "text": "he", "index": 0}))
        .unwrap();
        assert_eq!(token.kind, StreamEventKind::Token { text: "he".into(), index: 0 });
    }

    #[test]
    fn dead_letter_matches_contract_fields() {
        let letter = DeadLetterEvent::new("ToolHost", None, json!("not json"), "payload is not JSON".into());
        assert_eq!(
            serde_json::to_value(&letter).unwrap(),
            json!({"event": "dead_letter", "agent": "ToolHost", "conversation_id": null,
                   "envelope": "not json", "error": "payload is not JSON"})
        );
    }

    #[test]
    fn addresses_need_a_known_prefix_and_a_suffix() {
        assert_eq!(Address::parse("chat:conv1"), Some(Address::Chat("conv1")));
        assert_eq!(Address::parse("agent:DevAgent"), Some(Address::Agent("DevAgent")));
        assert_eq!(Address::parse("agent:DevAgent").and_then(Address::agent), Some("DevAgent"));
        for bad in ["conv1", "chat:", "agent:", "agent:  ", "user:bob", ""] {
            assert_eq!(Address::parse(bad), None, "{bad}");
        }
        assert_eq!(Address::agent_of("X"), "agent:X");
        assert_eq!(Address::chat_of("c"), "chat:c");
    }
}
