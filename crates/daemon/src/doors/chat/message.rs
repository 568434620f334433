//! What a chat entry is: a tool call, plain text, something to ignore, or something to
//! dead-letter. Pure functions over the entry, so every rule is unit-tested without Redis.

use serde_json::{Map, Value};
use toolhost_envelope::{ChatEnvelope, ChatKind, Entry, new_message_id};

/// What the inbox should do with one entry.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// Cannot be handled: dead-letter it.
    Malformed(Malformed),
    /// Ack without answering; the reason is for the log.
    Ignored(Box<ChatEnvelope>, &'static str),
    /// Answer it.
    Message(Box<ChatEnvelope>, Work),
}

/// A malformed entry, as much of it as could be read.
#[derive(Debug)]
pub(crate) struct Malformed {
    /// The parsed payload, or the raw text as a string (`null` when there was none).
    pub envelope: Value,
    /// The conversation, when it could be read.
    pub conversation_id: Option<String>,
    /// Why it cannot be handled.
    pub error: String,
}

/// What answering a message takes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Work {
    /// Run a tool.
    Call(ToolCall),
    /// A tool call in the wrong shape; the sentence says what is wrong.
    BadCall(String),
    /// Not a tool call: answer with help.
    Text,
}

/// One tool call carried by a message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCall {
    /// `metadata.tool_call.id`, else a new UUID.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments (a JSON string is parsed, a missing value is `{}`).
    pub arguments: Value,
}

/// Reads an entry of `chat:<agent>`; `own_sender` is `agent:<AGENT_NAME>`.
pub(crate) fn classify(entry: &Entry, max_payload_bytes: usize, own_sender: &str) -> Incoming {
    let malformed = |envelope: Value, conversation_id: Option<String>, error: String| {
        Incoming::Malformed(Malformed { envelope, conversation_id, error })
    };
    // A field that is not UTF-8 or over the limit: the letter's `envelope` is `{"defect": ...}`,
    // its first 64 KiB (base64), size and SHA-1, never the whole value.
    if let Some(defect) = entry.unreadable(max_payload_bytes) {
        let error = defect.describe(max_payload_bytes);
        return malformed(serde_json::json!({ "defect": defect.to_json() }), None, error);
    }
    let Some(payload) = entry.payload.as_deref() else {
        return malformed(Value::Null, None, "entry has no payload field".to_owned());
    };
    let value: Value = match serde_json::from_str(payload) {
        Ok(value) => value,
        Err(err) => {
            return malformed(Value::String(payload.to_owned()), None, format!("payload is not JSON: {err}"));
        }
    };
    let conversation_id = value
        .get("conversation_id")
        .and_then(Value::as_str)
        .filter(|id| !id.trim().is_empty())
        .map(str::to_owned);
    if !value.is_object() {
        return malformed(value, None, "payload is not a JSON object".to_owned());
    }
    let mut envelope = match serde_json::from_value::<ChatEnvelope>(value.clone()) {
        Ok(envelope) => envelope,
        Err(err) => return malformed(value, conversation_id, format!("malformed chat envelope: {err}")),
    };
    if envelope.conversation_id.trim().is_empty() {
        return malformed(value, None, "malformed chat envelope: conversation_id is empty".to_owned());
    }
    if envelope.id.is_empty() {
        envelope.id.clone_from(&entry.id);
    }
    let envelope = Box::new(envelope);
    if envelope.sender == own_sender {
        return Incoming::Ignored(envelope, "own message");
    }
    if envelope.kind == ChatKind::Control {
        return Incoming::Ignored(envelope, "control message");
    }
    // A reply (ours or another host's) is not answered unless it carries an explicit call, so two
    // hosts that answer each other's messages cannot loop.
    if envelope.metadata.get("in_reply_to").is_some() && envelope.metadata.get("tool_call").is_none() {
        return Incoming::Ignored(envelope, "reply");
    }
    let work = work(&envelope);
    Incoming::Message(envelope, work)
}

/// Finds the tool call in a message: `metadata.tool_call` first, then `content` as
/// `{"tool": name, "arguments": {...}}`.
fn work(envelope: &ChatEnvelope) -> Work {
    if let Some(call) = envelope.metadata.get("tool_call") {
        let Some(name) = call.get("name").and_then(Value::as_str).filter(|name| !name.is_empty()) else {
            return Work::BadCall("metadata.tool_call needs a name, the tool's name".to_owned());
        };
        let id = call.get("id").and_then(Value::as_str).filter(|id| !id.is_empty());
        return tool_call(id, name, call.get("arguments"), "metadata.tool_call.arguments");
    }
    let Ok(Value::Object(content)) = serde_json::from_str::<Value>(envelope.content.trim()) else {
        return Work::Text;
    };
    match content.get("tool") {
        None => Work::Text,
        Some(Value::String(name)) if !name.is_empty() => {
            tool_call(None, name, content.get("arguments"), "the arguments in content")
        }
        Some(_) => Work::BadCall("the tool in content must be the tool's name, a string".to_owned()),
    }
}

fn tool_call(id: Option<&str>, name: &str, arguments: Option<&Value>, place: &str) -> Work {
    let arguments = match arguments {
        None | Some(Value::Null) => Value::Object(Map::new()),
        // Some callers pass the model's arguments string through unparsed.
        Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
            Ok(arguments) => arguments,
            Err(err) => return Work::BadCall(format!("{place} is a string but not JSON: {err}")),
        },
        Some(arguments) => arguments.clone(),
    };
    let id = id.map_or_else(new_message_id, str::to_owned);
    Work::Call(ToolCall { id, name: name.to_owned(), arguments })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const OWN: &str = "agent:ToolHost";

    fn entry(payload: &str) -> Entry {
        Entry::from_fields("1700000000000-0", [("id", "m-1".to_owned()), ("payload", payload.to_owned())])
    }

    fn message(content: &str, metadata: Value) -> String {
        json!({"id": "e-1", "conversation_id": "conv1", "sender": "agent:Planner", "recipient": "agent:ToolHost",
               "type": "message", "content": content, "metadata": metadata, "created_at": "2026-11-22T10:00:00Z"})
        .to_string()
    }

    fn check(payload: &str) -> Incoming {
        classify(&entry(payload), 4096, OWN)
    }

    fn work_of(payload: &str) -> Work {
        match check(payload) {
            Incoming::Message(_, work) => work,
            other => panic!("not a message: {other:?}"),
        }
    }

    #[test]
    fn both_call_forms_are_recognised() {
        let call = work_of(&message(
            "",
            json!({"tool_call": {"name": "echo", "arguments": {"message": "hi"}, "id": "c1"}}),
        ));
        assert_eq!(
            call,
            Work::Call(ToolCall {
                id: "c1".into(),
                name: "echo".into(),
                arguments: json!({"message": "hi"})
            })
        );
        let Work::Call(call) =
            work_of(&message(r#"{"tool": "echo", "arguments": {"message": "hi"}}"#, json!({})))
        else {
            panic!("content form not recognised");
        };
        assert_eq!((call.name.as_str(), &call.arguments), ("echo", &json!({"message": "hi"})));
        assert!(uuid::Uuid::parse_str(&call.id).is_ok());
        let Work::Call(call) =
            work_of(&message("", json!({"tool_call": {"name": "echo", "arguments": "{\"a\":1}"}})))
        else {
            panic!("string arguments not parsed");
        };
        assert_eq!(call.arguments, json!({"a": 1}));
    }

    #[test]
    fn text_and_bad_calls() {
        assert_eq!(work_of(&message("hello there", json!({}))), Work::Text);
        assert_eq!(work_of(&message(r#"{"question": 1}"#, json!({}))), Work::Text);
        assert!(matches!(work_of(&message("", json!({"tool_call": {"arguments": {}}}))), Work::BadCall(_)));
        assert!(matches!(work_of(&message(r#"{"tool": 5}"#, json!({}))), Work::BadCall(_)));
        assert!(matches!(
            work_of(&message("", json!({"tool_call": {"name": "x", "arguments": "{"}}))),
            Work::BadCall(_)
        ));
    }

    #[test]
    fn own_control_and_reply_messages_are_ignored() {
        let own = message("hi", json!({})).replace("agent:Planner", OWN);
        assert!(matches!(check(&own), Incoming::Ignored(_, "own message")));
        let control = message("stop", json!({})).replace("\"message\"", "\"control\"");
        assert!(matches!(check(&control), Incoming::Ignored(_, "control message")));
        assert!(matches!(check(&message("{}", json!({"in_reply_to": "x"}))), Incoming::Ignored(_, "reply")));
        let explicit = message("", json!({"in_reply_to": "x", "tool_call": {"name": "echo"}}));
        assert!(matches!(check(&explicit), Incoming::Message(_, Work::Call(_))));
    }

    #[test]
    fn malformed_entries_keep_what_could_be_read() {
        let Incoming::Malformed(bad) = check("not json") else { panic!("admitted") };
        assert_eq!(bad.envelope, json!("not json"));
        assert!(bad.error.contains("not JSON"), "{}", bad.error);
        let Incoming::Malformed(bad) = check("[1]") else { panic!("admitted") };
        assert_eq!(bad.error, "payload is not a JSON object");
        let Incoming::Malformed(bad) = check(r#"{"conversation_id": "c7", "content": "x"}"#) else {
            panic!("admitted")
        };
        assert_eq!(bad.conversation_id.as_deref(), Some("c7"));
        assert!(bad.error.starts_with("malformed chat envelope: missing field"), "{}", bad.error);
        let blank = message("x", json!({})).replace("conv1", " ");
        assert!(matches!(check(&blank), Incoming::Malformed(_)));
        let big = message(&"x".repeat(5000), json!({}));
        assert!(matches!(check(&big), Incoming::Malformed(bad) if bad.error.contains("exceeds")));
    }
}
