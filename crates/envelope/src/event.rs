//! Event envelopes of contract section 2: tool requests on `action-requests` and their results.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The `specversion` toolhost writes.
pub const SPEC_VERSION: &str = "1.0";

/// Keys of a request's `data` that steer the call and are not tool arguments.
pub const RESERVED_DATA_KEYS: &[&str] =
    &["request_id", "correlation_id", "response_event", "response_topic", "deadline", "timeout_ms"];

/// A CloudEvents-like envelope, used for both requests and results.
///
/// Unknown fields are ignored on read, never an error: callers add their own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventEnvelope {
    /// Event id, a UUID chosen by the writer.
    pub id: String,
    /// Who sent it, e.g. `agent:planner` or `toolhost:<toolbox_id>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Always `1.0` when toolhost writes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub specversion: Option<String>,
    /// The event name; selects the tool on requests. `event_type` is accepted as an alias.
    #[serde(rename = "type", alias = "event_type")]
    pub event_type: String,
    /// The topic the envelope was published to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// RFC 3339 time of writing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// The event's body: arguments on requests, [`ResultData`] on results.
    pub data: Value,
    /// Caller-chosen id tying a request to its result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// The `type` the caller wants on the result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_event: Option<String>,
    /// The topic the result goes to (default `action-results`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_topic: Option<String>,
    /// Copied from request to result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// Copied from request to result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// Copied from request to result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Copied from request to result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// W3C trace context of the request's caller; on a result, the context of the call that
    /// produced it (see [`crate::CallTrace`]). A value that is not a string reads as absent.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient_string")]
    pub traceparent: Option<String>,
    /// W3C `tracestate` beside `traceparent`. A value that is not a string reads as absent.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient_string")]
    pub tracestate: Option<String>,
}

/// A string, or `None` for any other JSON value: trace context must never fail a request.
fn lenient_string<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(deserializer)? {
        Value::String(text) => Some(text),
        _ => None,
    })
}

impl EventEnvelope {
    /// A string field of `data`, if `data` is an object holding a string there.
    pub fn data_str(&self, key: &str) -> Option<&str> {
        self.data.get(key).and_then(Value::as_str)
    }

    /// The request id: see [`request_id`].
    ///
    /// # Errors
    /// `data.request_id` is present but not a non-empty string.
    pub fn request_id(&self, message_id: &str) -> Result<String, BadRequestId> {
        request_id(&self.data, &self.id, message_id)
    }

    /// The correlation id: the envelope's, else `data.correlation_id`.
    pub fn effective_correlation_id(&self) -> Option<&str> {
        self.correlation_id.as_deref().or_else(|| self.data_str("correlation_id"))
    }

    /// The result topic the caller asked for: the envelope's, else `data.response_topic`.
    pub fn requested_response_topic(&self) -> Option<&str> {
        self.response_topic.as_deref().or_else(|| self.data_str("response_topic"))
    }

    /// The result type: `response_event` (envelope, else `data`), else `<type>.completed`.
    pub fn result_type(&self) -> String {
        match self.response_event.as_deref().or_else(|| self.data_str("response_event")) {
            Some(name) if !name.is_empty() => name.to_owned(),
            _ => format!("{}.completed", self.event_type),
        }
    }

    /// Builds the result envelope for this request: ids, type, topic and the copied fields.
    pub fn result(&self, source: &str, topic: &str, data: &ResultData) -> EventEnvelope {
        let (_, payload) = self.result_json(source, topic, data);
        // The payload was serialised from this very shape one line above.
        serde_json::from_str(&payload).unwrap_or_default()
    }

    /// The result envelope for this request as its message id and compact JSON payload, written
    /// in one pass without building an intermediate JSON value (the hot path of every answer).
    pub fn result_json(&self, source: &str, topic: &str, data: &ResultData) -> (String, String) {
        self.envelope_json(source, topic, &self.result_type(), data)
    }

    /// [`EventEnvelope::result_json`], with the JSON text of `data` as well (what the ledger keeps
    /// for a retry of the request), serialised once and copied into the envelope.
    pub fn result_json_with_data(
        &self,
        source: &str,
        topic: &str,
        data: &ResultData,
    ) -> (String, String, String) {
        // Serialising a plain data struct cannot fail, and its output is valid JSON, so it is
        // taken as it is (`RawValue::from_string` would parse it again to check: about 1,700
        // instructions of every call).
        match serde_json::value::to_raw_value(data) {
            Ok(raw) => {
                let (id, payload) = self.envelope_json(source, topic, &self.result_type(), &*raw);
                let text: Box<str> = raw.into();
                (id, payload, text.into())
            }
            Err(_) => {
                let (id, payload) = self.result_json(source, topic, data);
                (id, payload, String::new())
            }
        }
    }

    /// The type of this request's progress entries: its result type followed by `.progress`.
    pub fn progress_type(&self) -> String {
        format!("{}.progress", self.result_type())
    }

    /// A progress entry of this request (never an answer: `data` holds no `success`), as its
    /// message id and compact JSON payload, with the answer's copied fields.
    pub fn progress_json(&self, source: &str, topic: &str, data: &Value) -> (String, String) {
        self.envelope_json(source, topic, &self.progress_type(), data)
    }

    /// A log entry of this request, `<answer type>.log` (never an answer: `data` holds no
    /// `success`), as its message id and compact JSON payload, with the answer's copied fields.
    pub fn log_json(&self, source: &str, topic: &str, data: &Value) -> (String, String) {
        self.envelope_json(source, topic, &format!("{}.log", self.result_type()), data)
    }

    /// An input-required entry of this request, `<answer type>.input_required` (never an answer:
    /// `data` holds no `success`), as its message id and compact JSON payload, with the answer's
    /// copied fields.
    pub fn input_required_json(&self, source: &str, topic: &str, data: &Value) -> (String, String) {
        self.envelope_json(source, topic, &format!("{}.input_required", self.result_type()), data)
    }

    fn envelope_json<D: Serialize + ?Sized>(
        &self,
        source: &str,
        topic: &str,
        event_type: &str,
        data: &D,
    ) -> (String, String) {
        let id = new_message_id();
        let view = ResultView {
            id: &id,
            source,
            specversion: SPEC_VERSION,
            event_type,
            topic,
            time: &now_rfc3339(),
            data,
            correlation_id: self.effective_correlation_id(),
            tenant_id: self.tenant_id.as_deref(),
            user_id: self.user_id.as_deref(),
            session_id: self.session_id.as_deref(),
            trace_id: self.trace_id.as_deref(),
            traceparent: self.traceparent.as_deref(),
            tracestate: self.tracestate.as_deref(),
        };
        // Serialising strings and a plain data struct cannot fail.
        let payload = serde_json::to_string(&view).unwrap_or_default();
        (id, payload)
    }
}

/// A result envelope borrowed from its parts, serialised with [`EventEnvelope`]'s field names.
#[derive(Serialize)]
struct ResultView<'a, D: ?Sized> {
    id: &'a str,
    source: &'a str,
    specversion: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    topic: &'a str,
    time: &'a str,
    data: &'a D,
    #[serde(skip_serializing_if = "Option::is_none")]
    correlation_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracestate: Option<&'a str>,
}

/// What a result envelope's `data` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultData {
    /// The request's `data.request_id`, or the id toolhost gave it.
    pub request_id: String,
    /// Whether the tool ran and its output passed validation.
    pub success: bool,
    /// The tool's output, on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// On success, the tool's MCP content blocks, where it gave more than one text block
    /// (docs/CONTRACTS.md, "Content blocks"); `result` is the same answer without them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<Value>>,
    /// One readable sentence, on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The machine-readable failure kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
    /// Extra structure for the caller (or its model) to act on, e.g. validation failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

impl ResultData {
    /// A successful result.
    pub fn ok(request_id: impl Into<String>, result: Value) -> ResultData {
        ResultData {
            request_id: request_id.into(),
            success: true,
            result: Some(result),
            content: None,
            error: None,
            error_code: None,
            details: None,
        }
    }

    /// A failed result with its code and sentence.
    pub fn err(request_id: impl Into<String>, code: ErrorCode, error: impl Into<String>) -> ResultData {
        ResultData {
            request_id: request_id.into(),
            success: false,
            result: None,
            content: None,
            error: Some(error.into()),
            error_code: Some(code),
            details: None,
        }
    }

    /// Adds content blocks to a successful result.
    pub fn with_content(mut self, content: Option<Vec<Value>>) -> ResultData {
        self.content = content;
        self
    }

    /// Adds `details` to a result.
    pub fn with_details(mut self, details: Value) -> ResultData {
        self.details = Some(details);
        self
    }
}

/// The failure kinds of contract section 2, plus `interrupted` (see docs/CONTRACTS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// The envelope is malformed.
    InvalidRequest,
    /// No tool consumes this event.
    UnknownTool,
    /// The tool exists but configuration disabled it.
    ToolDisabled,
    /// The arguments break the tool's argument schema.
    InvalidArguments,
    /// Policy refused the call.
    Forbidden,
    /// The tool overran its timeout and was cancelled.
    Timeout,
    /// The tool failed or panicked.
    ToolFailed,
    /// The tool's output broke its output schema.
    InvalidOutput,
    /// The request's deadline passed before it could run.
    Expired,
    /// The host is shedding load.
    Overloaded,
    /// The call was cancelled.
    Cancelled,
    /// A fault of the host itself.
    Internal,
    /// The host stopped during a non-idempotent call, which was not repeated.
    Interrupted,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 13] = [
        ErrorCode::InvalidRequest,
        ErrorCode::UnknownTool,
        ErrorCode::ToolDisabled,
        ErrorCode::InvalidArguments,
        ErrorCode::Forbidden,
        ErrorCode::Timeout,
        ErrorCode::ToolFailed,
        ErrorCode::InvalidOutput,
        ErrorCode::Expired,
        ErrorCode::Overloaded,
        ErrorCode::Cancelled,
        ErrorCode::Internal,
        ErrorCode::Interrupted,
    ];

    /// The wire name, e.g. `invalid_arguments`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::UnknownTool => "unknown_tool",
            ErrorCode::ToolDisabled => "tool_disabled",
            ErrorCode::InvalidArguments => "invalid_arguments",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::Timeout => "timeout",
            ErrorCode::ToolFailed => "tool_failed",
            ErrorCode::InvalidOutput => "invalid_output",
            ErrorCode::Expired => "expired",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Internal => "internal",
            ErrorCode::Interrupted => "interrupted",
        }
    }
}

impl ErrorCode {
    /// Whether an answer with this code ends its request id for good.
    ///
    /// Final answers are remembered for the retention window: a request re-sent with the same
    /// id is not run again. The others are refusals given before the tool started (the request
    /// could not run, yet), so a caller that retries with the same request id, as it should, is
    /// answered again. `internal` is not final either: it names a fault of the host, not of the
    /// request.
    pub fn is_final(self) -> bool {
        match self {
            ErrorCode::Timeout
            | ErrorCode::ToolFailed
            | ErrorCode::InvalidOutput
            | ErrorCode::Cancelled
            | ErrorCode::Interrupted => true,
            ErrorCode::InvalidRequest
            | ErrorCode::UnknownTool
            | ErrorCode::ToolDisabled
            | ErrorCode::InvalidArguments
            | ErrorCode::Forbidden
            | ErrorCode::Expired
            | ErrorCode::Overloaded
            | ErrorCode::Internal => false,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The id a request is known by, in the ledger and in its answer: `data.request_id`, else (when
/// absent or `null`) the envelope's `id`, else the stream entry's message id.
///
/// A `data.request_id` that is present must be a non-empty string: an empty one would be
/// remembered as answered for the whole retention window, and a number would have to be
/// replaced by an id the caller never sent.
///
/// # Errors
/// [`BadRequestId`], holding the id as the caller wrote it, to answer with.
pub fn request_id(data: &Value, envelope_id: &str, message_id: &str) -> Result<String, BadRequestId> {
    let fallback = || if envelope_id.is_empty() { message_id } else { envelope_id }.to_owned();
    match data.get("request_id") {
        None | Some(Value::Null) => Ok(fallback()),
        Some(Value::String(id)) if !id.is_empty() => Ok(id.clone()),
        Some(Value::String(_)) => {
            Err(BadRequestId { as_sent: String::new(), reason: "data.request_id must not be empty" })
        }
        Some(other) => {
            Err(BadRequestId { as_sent: other.to_string(), reason: "data.request_id must be a string" })
        }
    }
}

/// A `data.request_id` that breaks the rule of [`request_id`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct BadRequestId {
    /// The id as the caller wrote it (a number's JSON text), for the answer's `request_id`.
    pub as_sent: String,
    /// Why it is refused.
    pub reason: &'static str,
}

/// A fresh UUID v4 as a string, for message and event ids.
pub fn new_message_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The current UTC time as RFC 3339 with milliseconds and a `Z`.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const REQUEST: &str = r#"{
      "id": "7f9c0a52-1111-4222-8333-944455556666",
      "source": "agent:planner",
      "specversion": "1.0",
      "type": "calculate.requested",
      "topic": "action-requests",
      "time": "2026-11-22T10:00:00Z",
      "data": { "request_id": "r-1", "expression": "2 + 2" },
      "correlation_id": "c-1",
      "response_event": "my.calc.done",
      "response_topic": "action-results",
      "tenant_id": "acme", "user_id": "u-7",
      "session_id": "s-1", "trace_id": "t-9",
      "unknown_extra": {"kept": "or ignored"}
    }"#;

    #[test]
    fn request_from_contract_parses() {
        let request: EventEnvelope = serde_json::from_str(REQUEST).unwrap();
        assert_eq!(request.event_type, "calculate.requested");
        assert_eq!(request.data_str("request_id"), Some("r-1"));
        assert_eq!(request.effective_correlation_id(), Some("c-1"));
        assert_eq!(request.result_type(), "my.calc.done");
        assert_eq!(request.tenant_id.as_deref(), Some("acme"));
        assert_eq!(request.trace_id.as_deref(), Some("t-9"));
    }

    #[test]
    fn trace_context_that_is_not_a_string_reads_as_absent_and_a_string_is_copied() {
        let request: EventEnvelope = serde_json::from_str(
            r#"{"id":"x","type":"echo.requested","data":{},"traceparent":17,"tracestate":{"a":1}}"#,
        )
        .unwrap();
        assert_eq!((request.traceparent, request.tracestate), (None, None));
        let request: EventEnvelope = serde_json::from_str(
            r#"{"id":"x","type":"echo.requested","data":{},"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"a=1"}"#,
        )
        .unwrap();
        let (_, payload) =
            request.result_json("toolhost:tb", "action-results", &ResultData::ok("x", json!(1)));
        let answer: Value = serde_json::from_str(&payload).unwrap();
        assert_eq!(answer["traceparent"], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(answer["tracestate"], "a=1");
    }

    #[test]
    fn event_type_is_an_alias_of_type() {
        let request: EventEnvelope =
            serde_json::from_str(r#"{"id":"x","event_type":"echo.requested","data":{}}"#).unwrap();
        assert_eq!(request.event_type, "echo.requested");
        assert_eq!(request.result_type(), "echo.requested.completed");
    }

    #[test]
    fn result_matches_contract_shape() {
        let request: EventEnvelope = serde_json::from_str(REQUEST).unwrap();
        let result =
            request.result("toolhost:tb", "action-results", &ResultData::ok("r-1", json!({"result": 4})));
        let mut value = serde_json::to_value(&result).unwrap();
        let object = value.as_object_mut().unwrap();
        assert!(uuid::Uuid::parse_str(object.remove("id").unwrap().as_str().unwrap()).is_ok());
        assert!(object.remove("time").unwrap().as_str().unwrap().ends_with('Z'));
        assert_eq!(
            value,
            json!({
                "source": "toolhost:tb", "specversion": "1.0", "type": "my.calc.done",
                "topic": "action-results", "correlation_id": "c-1", "tenant_id": "acme",
                "user_id": "u-7", "session_id": "s-1", "trace_id": "t-9",
                "data": {"request_id": "r-1", "success": true, "result": {"result": 4}}
            })
        );
        let back: EventEnvelope = serde_json::from_value(serde_json::to_value(&result).unwrap()).unwrap();
        assert_eq!(back, result);
    }

    #[test]
    fn failure_data_matches_contract_shape() {
        let data = ResultData::err("r-1", ErrorCode::InvalidArguments, "message must be a string")
            .with_details(json!([{"pointer": "/message"}]));
        assert_eq!(
            serde_json::to_value(&data).unwrap(),
            json!({"request_id": "r-1", "success": false, "error": "message must be a string",
                   "error_code": "invalid_arguments", "details": [{"pointer": "/message"}]})
        );
        let back: ResultData = serde_json::from_value(serde_json::to_value(&data).unwrap()).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn error_codes_serialise_as_their_names() {
        for code in ErrorCode::ALL {
            assert_eq!(serde_json::to_value(code).unwrap(), json!(code.as_str()));
        }
    }

    #[test]
    fn correlation_id_falls_back_to_data() {
        let request: EventEnvelope = serde_json::from_str(
            r#"{"type":"echo.requested","data":{"correlation_id":"c-2","response_event":"x.done"}}"#,
        )
        .unwrap();
        assert_eq!(request.effective_correlation_id(), Some("c-2"));
        assert_eq!(request.result_type(), "x.done");
    }

    #[test]
    fn request_ids_fall_back_and_must_be_non_empty_strings() {
        let check = |data: Value, envelope_id: &str| request_id(&data, envelope_id, "m-1");
        assert_eq!(check(json!({"request_id": "r-1"}), "e-1"), Ok("r-1".to_owned()));
        assert_eq!(check(json!({"request_id": null}), "e-1"), Ok("e-1".to_owned()));
        assert_eq!(check(json!({}), ""), Ok("m-1".to_owned()));
        assert_eq!(check(Value::Null, ""), Ok("m-1".to_owned()));
        let empty = check(json!({"request_id": ""}), "e-1").unwrap_err();
        assert_eq!((empty.as_sent.as_str(), empty.reason), ("", "data.request_id must not be empty"));
        let number = check(json!({"request_id": 42}), "e-1").unwrap_err();
        assert_eq!((number.as_sent.as_str(), number.reason), ("42", "data.request_id must be a string"));
    }
}
