//! `chat_send`: posts a chat message to a conversation or to another agent (contract section 5).
//!
//! The rules are checked here rather than in the argument schema, so that a caller gets the
//! contract's exact sentences (`recipient must be ...`, `content must be non-empty`, ...) and
//! not a schema validator's wording.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use toolhost_bus::{Keys, Streams};
use toolhost_envelope::{Address, Annotations, ChatEnvelope};

use crate::{Context, Tool, ToolError, ToolSpec};

/// The error for a recipient that is neither `chat:<id>` nor `agent:<Name>`.
pub const BAD_RECIPIENT: &str = "recipient must be 'chat:{conversation_id}' or 'agent:{Name}'";
/// The error for blank content.
pub const EMPTY_CONTENT: &str = "content must be non-empty";
/// The error for an agent recipient when no conversation is known.
pub const NO_CONVERSATION: &str = "conversation_id not available for agent recipient";

/// Sends chat messages as `agent:<agent name>`.
pub struct ChatSend {
    bus: Arc<dyn Streams>,
    keys: Keys,
    /// `agent:<AGENT_NAME>`.
    sender: String,
    /// The configured fallback conversation for agent recipients; `None` when unset.
    default_conversation: Option<String>,
}

/// Where a message goes, once the rules have been applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The conversation the message belongs to.
    pub conversation_id: String,
    /// The agent's name for an `agent:<Name>` recipient.
    pub agent: Option<String>,
}

impl ChatSend {
    /// The tool, speaking as `agent:<agent_name>` (`agent:unknown` when the name is empty) and
    /// falling back to `default_conversation` (empty: none) for agent recipients.
    pub fn new(bus: Arc<dyn Streams>, keys: Keys, agent_name: &str, default_conversation: &str) -> ChatSend {
        let name = if agent_name.is_empty() { "unknown" } else { agent_name };
        ChatSend {
            bus,
            keys,
            sender: Address::agent_of(name),
            default_conversation: (!default_conversation.is_empty()).then(|| default_conversation.to_owned()),
        }
    }
}

/// Applies contract section 5 to the arguments: where the message goes, or the exact sentence
/// saying why it cannot be sent. The conversation of an agent recipient is, in order, the
/// `explicit` argument, the invocation's `context` conversation, then `default`.
///
/// # Errors
/// [`BAD_RECIPIENT`], [`EMPTY_CONTENT`] or [`NO_CONVERSATION`], as [`ToolError::InvalidArguments`].
pub fn route(
    recipient: &str,
    content: &str,
    explicit: Option<&str>,
    context: Option<&str>,
    default: Option<&str>,
) -> Result<Route, ToolError> {
    let invalid = |message: &str| ToolError::InvalidArguments(message.to_owned());
    let Some(address) = Address::parse(recipient) else { return Err(invalid(BAD_RECIPIENT)) };
    if content.trim().is_empty() {
        return Err(invalid(EMPTY_CONTENT));
    }
    let agent = match address {
        Address::Chat(conversation_id) => {
            return Ok(Route { conversation_id: conversation_id.to_owned(), agent: None });
        }
        Address::Agent(agent) => agent,
    };
    let conversation_id = [explicit, context, default]
        .into_iter()
        .flatten()
        .find(|candidate| !candidate.trim().is_empty())
        .ok_or_else(|| invalid(NO_CONVERSATION))?;
    Ok(Route { conversation_id: conversation_id.to_owned(), agent: Some(agent.to_owned()) })
}

#[async_trait]
impl Tool for ChatSend {
    fn spec(&self) -> ToolSpec {
        let mut spec = ToolSpec::new(
            "chat_send",
            "Send a chat message to a conversation ('chat:<conversation_id>') or to another agent \
             ('agent:<Name>'). Messages to an agent belong to a conversation: the one named by \
             conversation_id, else the one this call runs in, else the host's default.",
            json!({
                "type": "object",
                "properties": {
                    "recipient": {"type": "string", "description": "'chat:<conversation_id>' or 'agent:<Name>'."},
                    "content": {"type": "string", "description": "The message text."},
                    "conversation_id": {"type": "string", "description": "The conversation, for an agent recipient."},
                },
                "required": ["recipient", "content"],
                "additionalProperties": false,
            }),
            json!({
                "type": "object",
                "properties": {
                    "ok": {"const": true},
                    "envelope_id": {"type": "string"},
                    "published_to": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                },
                "required": ["ok", "envelope_id", "published_to"],
                "additionalProperties": false,
            }),
        );
        spec.annotations = Annotations { read_only: false, idempotent: false, destructive: false };
        spec.timeout = std::time::Duration::from_secs(10);
        spec
    }

    async fn call(&self, arguments: Value, context: &Context) -> Result<Value, ToolError> {
        let text = |key: &str| arguments.get(key).and_then(Value::as_str);
        let content = text("content").unwrap_or_default();
        let route = route(
            text("recipient").unwrap_or_default(),
            content,
            text("conversation_id"),
            context.conversation_id.as_deref(),
            self.default_conversation.as_deref(),
        )?;
        let recipient = text("recipient").unwrap_or_default();
        let envelope = ChatEnvelope::message(
            &route.conversation_id,
            &self.sender,
            recipient,
            content.to_owned(),
            json!({}),
        );
        let mut topics = vec![self.keys.chat(&route.conversation_id)];
        if let Some(agent) = &route.agent {
            topics.push(self.keys.chat(agent));
        }
        // Serialising a struct of strings and JSON values cannot fail.
        let payload = serde_json::to_string(&envelope).unwrap_or_default();
        for topic in &topics {
            self.bus
                .publish(topic, &envelope.id, &payload)
                .await
                .map_err(|err| ToolError::Failed(format!("cannot publish to {topic}: {err}")))?;
        }
        Ok(json!({"ok": true, "envelope_id": envelope.id, "published_to": topics}))
    }
}

#[cfg(test)]
mod tests {
    use toolhost_bus::MemoryBus;

    use super::*;
    use crate::Registry;

    fn check(
        recipient: &str,
        content: &str,
        explicit: Option<&str>,
        context: Option<&str>,
    ) -> Result<Route, String> {
        route(recipient, content, explicit, context, None).map_err(|err| err.to_string())
    }

    #[test]
    fn validation_messages_are_the_contracts() {
        for recipient in ["conv1", "chat:", "agent:", "agent:  ", "user:bob", ""] {
            assert_eq!(check(recipient, "hi", Some("c"), None), Err(BAD_RECIPIENT.to_owned()), "{recipient}");
        }
        assert_eq!(BAD_RECIPIENT, "recipient must be 'chat:{conversation_id}' or 'agent:{Name}'");
        assert_eq!(check("chat:c1", "  \n", None, None), Err("content must be non-empty".to_owned()));
        assert_eq!(
            check("agent:Dev", "hi", None, None),
            Err("conversation_id not available for agent recipient".to_owned())
        );
        assert_eq!(check("agent:Dev", "hi", Some(""), None), Err(NO_CONVERSATION.to_owned()));
    }

    #[test]
    fn conversation_precedence() {
        let route_of =
            |explicit, context, default| route("agent:Dev", "hi", explicit, context, default).unwrap();
        assert_eq!(route_of(Some("a"), Some("b"), Some("c")).conversation_id, "a");
        assert_eq!(route_of(None, Some("b"), Some("c")).conversation_id, "b");
        assert_eq!(route_of(None, None, Some("c")).conversation_id, "c");
        assert_eq!(route_of(None, None, Some("c")).agent.as_deref(), Some("Dev"));
        // A chat recipient names its conversation; the argument cannot override it.
        let chat = route("chat:conv2", "hi", Some("a"), Some("b"), None).unwrap();
        assert_eq!(chat, Route { conversation_id: "conv2".into(), agent: None });
    }

    async fn invoke(tool: ChatSend, arguments: Value, conversation: Option<&str>) -> Result<Value, String> {
        let mut registry = Registry::new();
        registry.register(Arc::new(tool)).unwrap();
        let context = Context { conversation_id: conversation.map(str::to_owned), ..Context::default() };
        registry.invoke("chat_send", arguments, &context, None).await.map_err(|failure| {
            assert_eq!(failure.code, toolhost_envelope::ErrorCode::InvalidArguments);
            failure.message
        })
    }

    #[tokio::test]
    async fn sends_through_the_bus() {
        let bus = Arc::new(MemoryBus::new());
        let tool = || ChatSend::new(bus.clone(), Keys::new(""), "ToolHost", "fallback");
        let res = invoke(tool(), json!({"recipient": "agent:Dev", "content": "hello"}), Some("conv2")).await;
        let res = res.unwrap();
        assert_eq!(res["ok"], true);
        assert_eq!(res["published_to"], json!(["chat:conv2", "chat:Dev"]));
        let sent: ChatEnvelope = serde_json::from_str(&bus.payloads("chat:Dev")[0]).unwrap();
        assert_eq!(sent.id, res["envelope_id"]);
        assert_eq!(sent.sender, "agent:ToolHost");
        assert_eq!(sent.recipient, "agent:Dev");
        assert_eq!(sent.conversation_id, "conv2");
        assert_eq!(sent.metadata, json!({}));
        assert_eq!(bus.payloads("chat:conv2"), bus.payloads("chat:Dev"));

        let res = invoke(tool(), json!({"recipient": "agent:Dev", "content": "x"}), None).await.unwrap();
        assert_eq!(res["published_to"], json!(["chat:fallback", "chat:Dev"]));
        let res = invoke(tool(), json!({"recipient": "chat:c9", "content": "x"}), None).await.unwrap();
        assert_eq!(res["published_to"], json!(["chat:c9"]));

        let bare = ChatSend::new(bus.clone(), Keys::new("p:"), "", "");
        let err = invoke(bare, json!({"recipient": "agent:Dev", "content": "x"}), None).await;
        assert_eq!(err, Err(NO_CONVERSATION.to_owned()));
        let err = invoke(tool(), json!({"recipient": "Dev", "content": ""}), None).await;
        assert_eq!(err, Err(BAD_RECIPIENT.to_owned()));
        let err = invoke(tool(), json!({"recipient": "chat:c", "content": " "}), None).await;
        assert_eq!(err, Err(EMPTY_CONTENT.to_owned()));
    }

    #[tokio::test]
    async fn unset_agent_name_speaks_as_unknown_and_keys_carry_the_prefix() {
        let bus = Arc::new(MemoryBus::new());
        let tool = ChatSend::new(bus.clone(), Keys::new("p:"), "", "");
        let res = invoke(tool, json!({"recipient": "chat:c1", "content": "x"}), None).await.unwrap();
        assert_eq!(res["published_to"], json!(["p:chat:c1"]));
        let sent: ChatEnvelope = serde_json::from_str(&bus.payloads("p:chat:c1")[0]).unwrap();
        assert_eq!(sent.sender, "agent:unknown");
    }
}
