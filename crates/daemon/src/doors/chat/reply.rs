//! The envelopes and events the inbox writes: replies to the sender, help for plain text, and
//! the short result text of `tool_step` events.

use serde_json::{Value, json};
use toolhost_envelope::{Address, ChatEnvelope};
use toolhost_tools::{Failure, Output};

use super::message::ToolCall;

/// Longest `result_summary` of a `tool_step` event, in characters.
pub(crate) const SUMMARY_CHARS: usize = 160;
/// Most tools a help reply names, so a toolbox of hundreds does not answer with a wall of text.
pub(crate) const HELP_TOOLS: usize = 40;

/// Who a reply goes to: `agent:<X>` when the sender was `agent:<X>` (with `X` for its topic),
/// else the conversation.
pub(crate) fn reply_recipient(incoming: &ChatEnvelope) -> (String, Option<String>) {
    match Address::parse(&incoming.sender).and_then(Address::agent) {
        Some(agent) => (incoming.sender.clone(), Some(agent.to_owned())),
        None => (Address::chat_of(&incoming.conversation_id), None),
    }
}

/// The reply to a tool call: the result as compact JSON, or the error sentence.
pub(crate) fn call_reply(
    own: &str,
    incoming: &ChatEnvelope,
    call: &ToolCall,
    res: &Result<Output, Failure>,
) -> ChatEnvelope {
    let mut metadata = json!({
        "in_reply_to": incoming.id,
        "tool_call_id": call.id,
        "tool": call.name,
        "success": res.is_ok(),
    });
    match res {
        Ok(value) => metadata["result"] = value.result.clone(),
        Err(failure) => {
            metadata["error"] = json!(failure.message);
            metadata["error_code"] = json!(failure.code.as_str());
            if let Some(details) = &failure.details {
                metadata["details"] = details.clone();
            }
        }
    }
    reply(own, incoming, result_text(res), metadata)
}

/// The reply to a call in the wrong shape.
pub(crate) fn bad_call_reply(own: &str, incoming: &ChatEnvelope, error: &str) -> ChatEnvelope {
    let metadata = json!({"in_reply_to": incoming.id, "success": false, "error": error, "error_code": "invalid_request"});
    reply(own, incoming, error.to_owned(), metadata)
}

/// The reply to a message that is not a tool call: what this agent does and how to call it,
/// naming at most [`HELP_TOOLS`] tools.
pub(crate) fn help_reply(own: &str, incoming: &ChatEnvelope, tools: &[&str]) -> ChatEnvelope {
    let name = Address::parse(own).and_then(Address::agent).unwrap_or(own);
    let shown = &tools[..tools.len().min(HELP_TOOLS)];
    let more = match tools.len() - shown.len() {
        0 => String::new(),
        hidden => format!(" and {hidden} more (send tools.discover to action-requests for all)"),
    };
    let content = format!(
        "I am {name}, a tool host: I run tools, I do not chat. To call a tool, send a message whose content \
         is {{\"tool\": \"<name>\", \"arguments\": {{...}}}}, or whose metadata.tool_call is \
         {{\"name\": \"<name>\", \"arguments\": {{...}}, \"id\": \"<call id>\"}}. Tools: {}{more}.",
        shown.join(", ")
    );
    reply(own, incoming, content, json!({"in_reply_to": incoming.id, "tools": shown}))
}

fn reply(own: &str, incoming: &ChatEnvelope, content: String, metadata: Value) -> ChatEnvelope {
    let (recipient, _) = reply_recipient(incoming);
    ChatEnvelope::message(&incoming.conversation_id, own, &recipient, content, metadata)
}

/// A call's result as text: compact JSON, or the error sentence.
pub(crate) fn result_text(res: &Result<Output, Failure>) -> String {
    match res {
        Ok(value) => value.result.to_string(),
        Err(failure) => failure.message.clone(),
    }
}

/// `text` cut to [`SUMMARY_CHARS`] characters, ending in `…` when cut.
pub(crate) fn summary(text: &str) -> String {
    if text.chars().count() <= SUMMARY_CHARS {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(SUMMARY_CHARS - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use toolhost_envelope::ErrorCode;

    use super::*;

    fn incoming(sender: &str) -> ChatEnvelope {
        ChatEnvelope::message("conv1", sender, "agent:ToolHost", "hi".into(), json!({}))
    }

    #[test]
    fn replies_go_back_to_agents_or_the_conversation() {
        assert_eq!(
            reply_recipient(&incoming("agent:Planner")),
            ("agent:Planner".into(), Some("Planner".into()))
        );
        assert_eq!(reply_recipient(&incoming("user:bob")), ("chat:conv1".into(), None));
        assert_eq!(reply_recipient(&incoming("agent:")), ("chat:conv1".into(), None));
    }

    #[test]
    fn call_replies_carry_result_or_error() {
        let call = ToolCall { id: "c1".into(), name: "echo".into(), arguments: json!({}) };
        let from = incoming("agent:Planner");
        let ok = call_reply("agent:ToolHost", &from, &call, &Ok(json!({"message": "hi"}).into()));
        assert_eq!(ok.content, r#"{"message":"hi"}"#);
        assert_eq!((ok.sender.as_str(), ok.recipient.as_str()), ("agent:ToolHost", "agent:Planner"));
        assert_eq!(
            ok.metadata,
            json!({"in_reply_to": from.id, "tool_call_id": "c1", "tool": "echo", "success": true, "result": {"message": "hi"}})
        );
        let failed =
            call_reply("agent:ToolHost", &from, &call, &Err(Failure::new(ErrorCode::UnknownTool, "no tool")));
        assert_eq!(failed.content, "no tool");
        assert_eq!(failed.metadata["error_code"], "unknown_tool");
        assert_eq!(failed.metadata["success"], false);
        assert!(failed.metadata.get("result").is_none());
    }

    #[test]
    fn help_names_the_call_forms_and_some_tools() {
        let help = help_reply("agent:ToolHost", &incoming("agent:Planner"), &["echo", "chat_send"]);
        assert!(help.content.starts_with("I am ToolHost, a tool host"), "{}", help.content);
        assert!(help.content.ends_with("Tools: echo, chat_send."), "{}", help.content);
        assert_eq!(help.recipient, "agent:Planner");
        let names: Vec<String> = (0..50).map(|index| format!("t{index}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let help = help_reply("agent:ToolHost", &incoming("agent:Planner"), &names);
        assert!(help.content.contains("t39 and 10 more"), "{}", help.content);
        assert_eq!(help.metadata["tools"].as_array().unwrap().len(), HELP_TOOLS);
    }

    #[test]
    fn summaries_are_capped() {
        assert_eq!(summary("short"), "short");
        let long = summary(&"é".repeat(400));
        assert_eq!(long.chars().count(), SUMMARY_CHARS);
        assert!(long.ends_with('…'));
    }
}
