//! What a running call tells its caller before its answer: the non-final entries on its response
//! topic, `<answer type>.progress`, `<answer type>.log` and `<answer type>.input_required`
//! (docs/CONTRACTS.md, "Progress entries", "Log entries" and "Input from the caller").
//!
//! The fleet client hands them to a call's waiter as [`CallEvent`]s; the MCP door relays them to
//! its client (progress and logging notifications, `elicitation/create`, `sampling/createMessage`,
//! or the 2026-07-28 `InputRequiredResult`), and answers an input with
//! [`super::FleetClient::answer_input`].

use serde_json::Value;

use super::Progress;

/// The event type suffix of a log entry.
pub(crate) const LOG_SUFFIX: &str = ".log";
/// The event type suffix of an input-required entry.
pub(crate) const INPUT_REQUIRED_SUFFIX: &str = ".input_required";
/// The event type of an input's answer.
pub(crate) const INPUT_ANSWER: &str = "tool.input.completed";

/// One non-final entry of a running call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CallEvent {
    /// A progress report.
    Progress(Progress),
    /// A log message of the tool (a hosted MCP server's `notifications/message`).
    Log(LogMessage),
    /// The tool asks its caller for input; the call waits for [`super::FleetClient::answer_input`]
    /// with this `input_id`, or declines at its deadline.
    InputRequired {
        /// Names this question among the call's questions (a UUID v4).
        input_id: String,
        /// What is asked.
        kind: InputKind,
        /// The server's request as MCP gave it: `{"method", "params"}`.
        request: Value,
        /// The entry id of the question on the call's answer stream (empty until the fleet
        /// client's reader fills it), where a reader that resumes the call starts after it.
        at: String,
    },
}

/// A log message of a running call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogMessage {
    /// The syslog level MCP names (`debug` ... `emergency`).
    pub level: String,
    /// The logger's name, when the tool gave one.
    pub logger: Option<String>,
    /// What it logged: any JSON.
    pub data: Value,
}

/// What a tool asks its caller for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InputKind {
    /// An MCP `elicitation/create`: the user fills in a form (or follows a URL).
    Elicitation,
    /// An MCP `sampling/createMessage`: the caller's model writes a message.
    Sampling,
}

impl InputKind {
    /// The wire name, `elicitation` or `sampling`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            InputKind::Elicitation => "elicitation",
            InputKind::Sampling => "sampling",
        }
    }

    fn parse(name: &str) -> Option<InputKind> {
        match name {
            "elicitation" => Some(InputKind::Elicitation),
            "sampling" => Some(InputKind::Sampling),
            _ => None,
        }
    }
}

/// What the host did with an input's answer (`tool.input.completed`'s `result.state`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InputState {
    /// The call was waiting for this input and has it now.
    Accepted,
    /// No call waits for this input (never asked, answered already, or past its deadline).
    Unknown,
    /// The host refused the answer (it breaks the requested schema): its error code and message.
    Refused(String),
    /// The host did not answer in time.
    NoAnswer,
}

impl CallEvent {
    /// The event of a non-final entry of type `event_type` with `data`; `None` for an answer or
    /// an entry that is not one of these.
    pub(crate) fn from_entry(event_type: &str, data: &Value) -> Option<CallEvent> {
        if data.get("success").is_some() {
            return None;
        }
        if event_type.ends_with(".progress") {
            return Progress::from_data(data).map(CallEvent::Progress);
        }
        if event_type.ends_with(LOG_SUFFIX) {
            return Some(CallEvent::Log(LogMessage {
                level: data.get("level")?.as_str()?.to_owned(),
                logger: data.get("logger").and_then(Value::as_str).map(str::to_owned),
                data: data.get("data").cloned().unwrap_or(Value::Null),
            }));
        }
        if event_type.ends_with(INPUT_REQUIRED_SUFFIX) {
            return Some(CallEvent::InputRequired {
                input_id: data.get("input_id")?.as_str()?.to_owned(),
                kind: InputKind::parse(data.get("kind")?.as_str()?)?,
                request: data.get("request")?.clone(),
                at: String::new(),
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn non_final_entries_are_told_apart() {
        assert_eq!(
            CallEvent::from_entry(
                "tool.invoke.completed.progress",
                &json!({"request_id": "r", "progress": 1})
            ),
            Some(CallEvent::Progress(Progress { progress: 1.0, total: None, message: None }))
        );
        assert_eq!(
            CallEvent::from_entry(
                "tool.invoke.completed.log",
                &json!({"request_id": "r", "level": "info", "logger": "db", "data": {"rows": 3}})
            ),
            Some(CallEvent::Log(LogMessage {
                level: "info".to_owned(),
                logger: Some("db".to_owned()),
                data: json!({"rows": 3})
            }))
        );
        let request = json!({"method": "elicitation/create", "params": {"message": "name?"}});
        assert_eq!(
            CallEvent::from_entry(
                "tool.invoke.completed.input_required",
                &json!({"request_id": "r", "input_id": "i-1", "kind": "elicitation", "request": request})
            ),
            Some(CallEvent::InputRequired {
                input_id: "i-1".to_owned(),
                kind: InputKind::Elicitation,
                request: request.clone(),
                at: String::new()
            })
        );
        // An unknown kind, a log without a level and an answer are not events.
        let odd = json!({"request_id": "r", "input_id": "i", "kind": "roots", "request": request});
        assert_eq!(CallEvent::from_entry("x.input_required", &odd), None);
        assert_eq!(CallEvent::from_entry("x.log", &json!({"request_id": "r", "data": 1})), None);
        assert_eq!(CallEvent::from_entry("x.log", &json!({"request_id": "r", "success": true})), None);
    }
}
