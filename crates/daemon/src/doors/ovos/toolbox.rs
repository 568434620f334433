//! toolhost as a `ToolBox` on the bus: discovery and calls, answered as
//! `ovos_plugin_manager.templates.agent_tools.ToolBox` answers them.
//!
//! - `ovos.persona.tools.discover` gets one `ovos.persona.tools.discover.response` with
//!   `{"tools": [{"name", "description", "argument_schema", "output_schema", "toolbox_id"}],
//!   "toolbox_id"}`: the fleet tools the door exposes.
//! - `ovos.persona.tools.<toolbox_id>.call`, and `ovos.persona.tools.call` whose
//!   `data.toolbox_id` is this toolbox, get exactly one `<type>.response` with
//!   `{"toolbox_id", "name", "result"}` or `{"toolbox_id", "name", "error"}`. A static-topic call
//!   for another toolbox, or for none, gets nothing.
//!
//! A call is checked in the reference's order (the tool, then the type of `kwargs`) and becomes
//! one request through the fleet client, answered by whichever toolbox hosts the tool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry::trace::SpanKind;
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;
use toolhost_envelope::{ErrorCode, ResultData, ToolDescription, TraceContext};
use tracing::info;

use crate::fleet_client::{CallFailure, FleetClient, Request};
use crate::ovos_bus::link::Link;
use crate::ovos_bus::message::{BusMessage, python_str, python_type};
use crate::ovos_bus::{DISCOVER, HOSTED_PREFIX, STATIC_CALL};
use crate::telemetry::{DoorSpan, Telemetry};

/// `messaging.system` of the door's spans: no convention names the OVOS messagebus yet.
const OVOS_MESSAGING_SYSTEM: &str = "ovos_messagebus";

/// The door as one `ToolBox`.
pub(crate) struct ToolBox {
    pub fleet: FleetClient,
    pub link: Arc<Link>,
    pub toolbox_id: String,
    /// `ovos.persona.tools.<toolbox_id>.call`.
    pub call_topic: String,
    /// Globs of the fleet tools exposed.
    pub tools: Vec<glob::Pattern>,
    /// The longest a call may run.
    pub call_timeout: Duration,
    /// The requests' `tenant_id`.
    pub tenant: Option<String>,
    /// Calls waiting for answers.
    pub permits: Arc<Semaphore>,
    pub max_concurrent_calls: usize,
    /// Makes the door's span of each call.
    pub telemetry: Telemetry,
}

/// What a call asks for, once checked: the tool and its arguments, or the reference's error.
#[derive(Debug, PartialEq)]
pub(crate) enum Checked {
    Call { tool: ToolDescription, kwargs: Map<String, Value> },
    Refused(String),
}

impl ToolBox {
    /// Whether the door exposes `name`.
    fn exposes(&self, name: &str) -> bool {
        !name.starts_with(HOSTED_PREFIX) && self.tools.iter().any(|pattern| pattern.matches(name))
    }

    /// Handles one message of the bus; anything but discovery and this toolbox's calls is left.
    pub(crate) fn on_message(self: &Arc<Self>, message: BusMessage) {
        let msg_type = message.msg_type.as_str();
        if msg_type == DISCOVER {
            self.link.send(&message.response(self.discovery()));
        } else if msg_type == self.call_topic
            || (msg_type == STATIC_CALL
                && message.data.get("toolbox_id").and_then(Value::as_str) == Some(self.toolbox_id.as_str()))
        {
            self.call(message);
        }
    }

    /// The discovery response's data.
    pub(crate) fn discovery(&self) -> Map<String, Value> {
        let fleet = self.fleet.tools();
        let tools: Vec<Value> = fleet
            .iter()
            .filter(|tool| self.exposes(&tool.name))
            .map(|tool| {
                json!({
                    "name": tool.name,
                    "description": tool.description,
                    "argument_schema": tool.argument_schema,
                    "output_schema": tool.output_schema,
                    "toolbox_id": self.toolbox_id,
                })
            })
            .collect();
        let mut data = Map::new();
        data.insert("tools".to_owned(), Value::Array(tools));
        data.insert("toolbox_id".to_owned(), json!(self.toolbox_id));
        data
    }

    /// An unsolicited discovery response, sent when the bus connects and when the fleet's tools
    /// change, so personas that discovered before learn the tools.
    pub(crate) fn announce(&self) {
        let mut context = Map::new();
        context.insert("source".to_owned(), json!(self.toolbox_id));
        let announcement = BusMessage::new(format!("{DISCOVER}.response"), self.discovery(), context);
        self.link.send(&announcement);
    }

    /// Checks a call's `name` and `kwargs` as `ToolBox.handle_call` and `call_tool` do.
    pub(crate) fn check(&self, data: &Map<String, Value>) -> Checked {
        let id = &self.toolbox_id;
        let name = data.get("name").cloned().unwrap_or_else(|| json!(""));
        let name = match name {
            Value::String(name) => name,
            // `name not in self.tools` hashes the name first.
            Value::Array(_) | Value::Object(_) => {
                return Checked::Refused(format!("TypeError: unhashable type: '{}'", python_type(&name)));
            }
            scalar => return Checked::Refused(unknown_tool(&python_str(&scalar), id)),
        };
        let tool = if self.exposes(&name) { self.fleet.tools().get(&name).cloned() } else { None };
        let Some(tool) = tool else { return Checked::Refused(unknown_tool(&name, id)) };
        match data.get("kwargs") {
            None => Checked::Call { tool, kwargs: Map::new() },
            Some(Value::Object(kwargs)) => Checked::Call { tool, kwargs: kwargs.clone() },
            Some(other) => Checked::Refused(format!(
                "RuntimeError: Tool '{name}' called with unexpected type arguments: {}. \
                 Must be Dict[str, Any] or ToolArguments.",
                python_type(other)
            )),
        }
    }

    /// Answers one call, exactly once.
    fn call(self: &Arc<Self>, message: BusMessage) {
        let name_field = message.data.get("name").cloned().unwrap_or_else(|| json!(""));
        let caller = TraceContext::read(
            message.context.get("traceparent").and_then(Value::as_str),
            message.context.get("tracestate").and_then(Value::as_str),
        );
        let span = self.span(&message, caller.as_ref());
        let (tool, kwargs) = match self.check(&message.data) {
            Checked::Call { tool, kwargs } => (tool, kwargs),
            Checked::Refused(error) => {
                info!(door = "ovos", tool = %truncated(&name_field), outcome = "refused", error = %truncated(&json!(error)), "OVOS bus call refused");
                if let Some(span) = &span {
                    span.fail("invalid_request", &error);
                }
                self.reply(&message, name_field, Err(error));
                return;
            }
        };
        if let Some(span) = &span {
            span.set(KeyValue::new("gen_ai.tool.name", tool.name.clone()));
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            let error = format!(
                "RuntimeError: overloaded: the OVOS door has {} calls in flight; retry later",
                self.max_concurrent_calls
            );
            info!(door = "ovos", tool = %tool.name, outcome = "overloaded", "OVOS bus call refused");
            if let Some(span) = &span {
                span.fail("overloaded", &error);
            }
            self.reply(&message, name_field, Err(error));
            return;
        };
        let request_id = format!("ovos-{}", uuid::Uuid::new_v4().simple());
        if let Some(span) = &span {
            span.set(KeyValue::new("toolhost.request_id", request_id.clone()));
        }
        let request = Request {
            tool: tool.name.clone(),
            arguments: Value::Object(kwargs),
            request_id,
            timeout: Duration::from_millis(tool.timeout_ms.max(1)).min(self.call_timeout),
            response_topic: None,
            tenant: self.tenant.clone(),
            via: None,
            trace: span.as_ref().map(DoorSpan::passed_on).or(caller),
        };
        let door = self.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let answer = door.fleet.call(&request, None).await;
            drop(permit);
            let (outcome, reply) = match answer {
                Ok(result) => (
                    result.error_code.map_or("ok", ErrorCode::as_str),
                    answer_of(&result, &request.tool, &door.toolbox_id),
                ),
                Err(failure) => ("no_answer", Err(failure_text(&request.tool, &failure))),
            };
            info!(
                door = "ovos",
                request_id = %request.request_id,
                tool = %request.tool,
                tenant_id = request.tenant.as_deref().unwrap_or("-"),
                outcome,
                duration_ms = started.elapsed().as_millis() as u64,
                "OVOS bus call answered"
            );
            if let (Some(span), Err(error)) = (&span, &reply)
                && outcome != "ok"
            {
                span.fail(outcome, error);
            }
            door.reply(&message, name_field, reply);
            drop(span);
        });
    }

    /// The door's CONSUMER span `process <message type>` of a call, by the messaging
    /// conventions (`messaging.system` `ovos_messagebus`, the message type as the destination):
    /// a child of the message's context, linked to it; `None` when the call is not sampled or
    /// nothing is exported.
    fn span(&self, message: &BusMessage, caller: Option<&TraceContext>) -> Option<DoorSpan> {
        let attributes = vec![
            KeyValue::new("messaging.system", OVOS_MESSAGING_SYSTEM),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.destination.name", message.msg_type.clone()),
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("toolhost.door", "ovos"),
        ];
        let name = format!("process {}", message.msg_type);
        self.telemetry.door_span(caller, name, SpanKind::Consumer, attributes).map(DoorSpan::linked)
    }

    /// Sends the one response of a call.
    fn reply(&self, message: &BusMessage, name: Value, answer: Result<Value, String>) {
        let mut data = Map::new();
        data.insert("toolbox_id".to_owned(), json!(self.toolbox_id));
        data.insert("name".to_owned(), name);
        match answer {
            Ok(result) => data.insert("result".to_owned(), result),
            Err(error) => data.insert("error".to_owned(), json!(error)),
        };
        self.link.send(&message.response(data));
    }
}

/// `ValueError: Unknown tool '<name>' for ToolBox '<id>'.`
fn unknown_tool(name: &str, toolbox_id: &str) -> String {
    format!("ValueError: Unknown tool '{name}' for ToolBox '{toolbox_id}'.")
}

/// A value for a log line: at most 80 characters.
fn truncated(value: &Value) -> String {
    let text = match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let mut short: String = text.chars().take(80).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    short
}

/// The result, or the error string, of a host's answer.
pub(crate) fn answer_of(result: &ResultData, tool: &str, toolbox_id: &str) -> Result<Value, String> {
    if result.success {
        return Ok(result.result.clone().unwrap_or(Value::Null));
    }
    let sentence = result.error.as_deref().unwrap_or("the call failed");
    let details = result.details.as_ref();
    Err(match result.error_code {
        Some(ErrorCode::InvalidArguments) => {
            let mut text =
                format!("ValueError: Tool input validation failed for '{tool}' in ToolBox '{toolbox_id}'");
            let errors = details.and_then(|details| details.get("errors")).and_then(Value::as_array);
            let pointers: Vec<String> = errors
                .into_iter()
                .flatten()
                .map(|error| {
                    let pointer =
                        error.get("pointer").and_then(Value::as_str).filter(|p| !p.is_empty()).unwrap_or("/");
                    let rule = error.get("rule").and_then(Value::as_str).unwrap_or("?");
                    match error.get("message").and_then(Value::as_str).filter(|m| !m.is_empty()) {
                        Some(message) => format!("{message} (rule {rule})"),
                        None => format!("at {pointer} (rule {rule})"),
                    }
                })
                .collect();
            if pointers.is_empty() {
                text.push_str(&format!(": {sentence}"));
            } else {
                text.push_str(&format!(": {}", pointers.join("; ")));
            }
            text
        }
        Some(ErrorCode::UnknownTool) => unknown_tool(tool, toolbox_id),
        code => {
            let code = code.map_or("internal", ErrorCode::as_str);
            let mut text = format!("RuntimeError: {code}: {sentence}");
            if let Some(retry) =
                details.and_then(|details| details.get("retry_after_ms")).and_then(Value::as_u64)
            {
                text.push_str(&format!(" (retry after {retry} ms)"));
            }
            text
        }
    })
}

/// The error string when no answer came.
fn failure_text(tool: &str, failure: &CallFailure) -> String {
    match failure {
        CallFailure::NoAnswer(waited) => format!(
            "RuntimeError: timeout: no toolbox answered the call of '{tool}' within {} ms",
            waited.as_millis()
        ),
        CallFailure::Bus(err) => format!("RuntimeError: internal: cannot publish the request: {err}"),
        CallFailure::Closed => "RuntimeError: internal: the OVOS door is shutting down".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(data: Value) -> ResultData {
        serde_json::from_value(data).unwrap()
    }

    #[test]
    fn answers_become_the_references_result_and_error_strings() {
        let ok = answer(json!({"request_id": "r", "success": true, "result": {"a": 1}}));
        assert_eq!(answer_of(&ok, "t", "th"), Ok(json!({"a": 1})));
        let invalid = answer(
            json!({"request_id": "r", "success": false, "error": "bad", "error_code": "invalid_arguments",
            "details": {"errors": [{"pointer": "/message", "rule": "type", "message": "argument '/message': 5 is not of type \"string\""},
                                   {"pointer": "", "rule": "required"}]}}),
        );
        assert_eq!(
            answer_of(&invalid, "echo", "th"),
            Err("ValueError: Tool input validation failed for 'echo' in ToolBox 'th': argument '/message': \
                 5 is not of type \"string\" (rule type); at / (rule required)"
                .to_owned())
        );
        let unknown =
            answer(json!({"request_id": "r", "success": false, "error": "no", "error_code": "unknown_tool"}));
        assert_eq!(
            answer_of(&unknown, "gone", "th"),
            Err("ValueError: Unknown tool 'gone' for ToolBox 'th'.".to_owned())
        );
        let overloaded = answer(json!({"request_id": "r", "success": false, "error": "the queue is full",
            "error_code": "overloaded", "details": {"retry_after_ms": 250}}));
        assert_eq!(
            answer_of(&overloaded, "t", "th"),
            Err("RuntimeError: overloaded: the queue is full (retry after 250 ms)".to_owned())
        );
        let timeout = answer(
            json!({"request_id": "r", "success": false, "error": "ran past 100 ms", "error_code": "timeout"}),
        );
        assert_eq!(answer_of(&timeout, "t", "th"), Err("RuntimeError: timeout: ran past 100 ms".to_owned()));
        assert_eq!(
            failure_text("t", &CallFailure::NoAnswer(Duration::from_millis(1500))),
            "RuntimeError: timeout: no toolbox answered the call of 't' within 1500 ms"
        );
    }
}
