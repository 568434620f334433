//! Admission: from a raw stream entry to a request the dispatcher can answer, or a dead letter.

use std::time::Duration;

use serde_json::{Map, Value};
use toolhost_bus::{ResponseTopics, TopicRefusal};
use toolhost_envelope::{CallTrace, Entry, EventEnvelope, RESERVED_DATA_KEYS};

use crate::telemetry::Sampling;

/// What the dispatcher should do with an entry.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Nothing tells where to answer: dead-letter it with this reason.
    DeadLetter(String),
    /// Answerable.
    Request(Box<Request>),
}

/// A request that can be answered.
#[derive(Debug)]
pub(crate) struct Request {
    /// The envelope as sent.
    pub envelope: EventEnvelope,
    /// `data.request_id`, else the envelope's `id`, else the entry's message id; stable across
    /// redeliveries, so the ledger can recognise them.
    pub request_id: String,
    /// Whether the request id is the stream entry's own id (the writer gave no id at all): such
    /// a request is at home on whichever shard it was added to.
    pub id_is_entry_id: bool,
    /// Whether the entry was delivered before (to this group's consumers): a holder may still
    /// be running it.
    pub redelivered: bool,
    /// What was asked for.
    pub target: Target,
    /// The bare topic the answer goes to: the caller's `response_topic` when allowed, else the
    /// default results topic (where a refused topic is answered `forbidden`).
    pub response_topic: String,
    /// When the request stops being worth running, as time since the UNIX epoch.
    pub deadline: Option<Duration>,
    /// The trace the call runs under. The envelope's `traceparent` and `tracestate` were
    /// replaced by this call's context, so every answer carries it.
    pub trace: CallTrace,
}

/// What a request asks for.
#[derive(Debug)]
pub(crate) enum Target {
    /// Call a tool with these arguments.
    Tool { name: String, arguments: Value },
    /// No tool consumes the event.
    Unknown(String),
    /// `tools.discover`.
    Discover,
    /// `tools.stats`.
    Stats,
    /// `tool.cancel`: stop the call `call_id`. `cancel_id` is the cancel's own id (its
    /// envelope's `id`, else the entry's message id), which the ledger remembers it by.
    Cancel { call_id: String, cancel_id: String },
    /// `tool.input`: answer the question `input_id` of the call `call_id` with `response`.
    /// `answer_id` is the request's own id, which the ledger remembers it by.
    Input { call_id: String, input_id: String, response: Value, answer_id: String },
    /// A catalog request (`resources.read`, `prompts.get`, ...): MCP's params.
    Catalog { ask: crate::call::catalog::CatalogAsk, params: Value },
    /// The envelope can be answered but not run; the sentence says why.
    Invalid(String),
    /// The caller asked for something it may not have (a reserved or unlisted response topic);
    /// the sentence says what.
    Forbidden(String),
}

/// The generic invocation event: `data.tool` and `data.arguments`.
pub(crate) const TOOL_INVOKE: &str = "tool.invoke";
/// Discovery.
pub(crate) const TOOLS_DISCOVER: &str = "tools.discover";
/// Statistics.
pub(crate) const TOOLS_STATS: &str = "tools.stats";
/// Cancelling a running call.
pub(crate) const TOOL_CANCEL: &str = "tool.cancel";
/// Answering a running call's question.
pub(crate) const TOOL_INPUT: &str = "tool.input";

/// Decodes an entry; `resolve` maps an event type to the tool consuming it, `topics` says which
/// response topics a caller may name.
pub(crate) fn admit(
    entry: &Entry,
    max_payload_bytes: usize,
    topics: &ResponseTopics,
    resolve: impl Fn(&str) -> Option<String>,
    sampling: Sampling,
) -> Admission {
    // A field that is not UTF-8 or over the limit: dead-lettered with its raw head, never parsed.
    if let Some(defect) = entry.unreadable(max_payload_bytes) {
        return Admission::DeadLetter(defect.describe(max_payload_bytes));
    }
    let Some(payload) = entry.payload.as_deref() else {
        return Admission::DeadLetter("entry has no payload field".to_owned());
    };
    // Parse straight into the envelope; only a payload that fails is parsed again to say why.
    // (serde also reads a struct from a JSON array, so only objects take the direct path.)
    let direct =
        payload.trim_start().starts_with('{').then(|| serde_json::from_str::<EventEnvelope>(payload));
    let (envelope, problem) = match direct {
        Some(Ok(envelope)) => (envelope, None),
        _ => match serde_json::from_str::<Value>(payload) {
            // Valid JSON this parser cannot hold (a number out of range, nesting past its
            // limit): answerable when the fields that say where to answer can still be read.
            Err(err) => match header_envelope(payload) {
                Some(envelope) => (envelope, Some(format!("payload cannot be read: {err}"))),
                None => return Admission::DeadLetter(format!("payload is not JSON: {err}")),
            },
            Ok(value) if !value.is_object() => {
                return Admission::DeadLetter("payload is not a JSON object".to_owned());
            }
            Ok(value) => {
                let err = serde_json::from_value::<EventEnvelope>(value.clone()).err();
                let reason = err.map_or_else(
                    || "malformed envelope".to_owned(),
                    |err| format!("malformed envelope: {err}"),
                );
                (lenient_envelope(&value), Some(reason))
            }
        },
    };
    let has_response_event = envelope
        .response_event
        .as_deref()
        .or_else(|| envelope.data_str("response_event"))
        .is_some_and(|name| !name.is_empty());
    if envelope.event_type.is_empty() && !has_response_event {
        return Admission::DeadLetter("envelope has no type and no response_event to answer with".to_owned());
    }
    let (request_id, id_problem) = match envelope.request_id(&entry.id) {
        Ok(request_id) => (request_id, None),
        Err(bad) => (bad.as_sent, Some(bad.reason.to_owned())),
    };
    let (response_topic, topic_problem) = match envelope.requested_response_topic() {
        None => (topics.default_topic().to_owned(), None),
        Some(topic) => match topics.check(topic) {
            Ok(()) => (topic.to_owned(), None),
            Err(refusal) => (topics.default_topic().to_owned(), Some(refusal)),
        },
    };
    let target = match (problem.or(id_problem), topic_problem) {
        (Some(problem), _) => Target::Invalid(problem),
        (None, Some(TopicRefusal::Empty)) => Target::Invalid(TopicRefusal::Empty.to_string()),
        (None, Some(refusal)) => Target::Forbidden(refusal.to_string()),
        (None, None) => match target(&envelope, resolve) {
            Target::Cancel { call_id, cancel_id } if cancel_id.is_empty() => {
                Target::Cancel { call_id, cancel_id: entry.id.clone() }
            }
            Target::Input { call_id, input_id, response, answer_id } if answer_id.is_empty() => {
                Target::Input { call_id, input_id, response, answer_id: entry.id.clone() }
            }
            target => target,
        },
    };
    let deadline = deadline(&envelope, entry);
    let id_is_entry_id = request_id == entry.entry_id;
    let mut envelope = envelope;
    let trace = CallTrace::of(
        envelope.traceparent.as_deref(),
        envelope.tracestate.as_deref(),
        envelope.trace_id.as_deref(),
        |trace_id, parent| sampling.sampled(trace_id, parent),
    );
    envelope.traceparent = Some(trace.traceparent());
    envelope.tracestate.clone_from(&trace.tracestate);
    let redelivered = entry.deliveries > 1;
    Admission::Request(Box::new(Request {
        envelope,
        request_id,
        id_is_entry_id,
        redelivered,
        target,
        response_topic,
        deadline,
        trace,
    }))
}

/// The fields that say where and how to answer, read from a payload whose other values this
/// parser cannot hold (skipped values are scanned, not converted, so no number is out of range
/// and no depth limit applies to them). `None` when even these cannot be read.
fn header_envelope(payload: &str) -> Option<EventEnvelope> {
    // Missing `Option` fields read as `None`.
    #[derive(serde::Deserialize)]
    struct Header {
        id: Option<String>,
        #[serde(rename = "type", alias = "event_type")]
        event_type: Option<String>,
        correlation_id: Option<String>,
        response_event: Option<String>,
        response_topic: Option<String>,
        tenant_id: Option<String>,
        user_id: Option<String>,
        session_id: Option<String>,
        trace_id: Option<String>,
        traceparent: Option<Value>,
        tracestate: Option<Value>,
        data: Option<HeaderData>,
    }
    #[derive(serde::Deserialize)]
    struct HeaderData {
        request_id: Option<String>,
        correlation_id: Option<String>,
        response_event: Option<String>,
        response_topic: Option<String>,
    }
    let header: Header = serde_json::from_str(payload).ok()?;
    let mut data = Map::new();
    if let Some(fields) = header.data {
        for (key, value) in [
            ("request_id", fields.request_id),
            ("correlation_id", fields.correlation_id),
            ("response_event", fields.response_event),
            ("response_topic", fields.response_topic),
        ] {
            if let Some(value) = value {
                data.insert(key.to_owned(), Value::String(value));
            }
        }
    }
    Some(EventEnvelope {
        id: header.id.unwrap_or_default(),
        event_type: header.event_type.unwrap_or_default(),
        data: Value::Object(data),
        correlation_id: header.correlation_id,
        response_event: header.response_event,
        response_topic: header.response_topic,
        tenant_id: header.tenant_id,
        user_id: header.user_id,
        session_id: header.session_id,
        trace_id: header.trace_id,
        traceparent: header.traceparent.and_then(|value| value.as_str().map(str::to_owned)),
        tracestate: header.tracestate.and_then(|value| value.as_str().map(str::to_owned)),
        ..EventEnvelope::default()
    })
}

fn target(envelope: &EventEnvelope, resolve: impl Fn(&str) -> Option<String>) -> Target {
    let empty = Map::new();
    let data = match &envelope.data {
        Value::Object(data) => data,
        Value::Null => &empty,
        _ => return Target::Invalid("data must be a JSON object".to_owned()),
    };
    match envelope.event_type.as_str() {
        "" => Target::Invalid("envelope has no type".to_owned()),
        kind if let Some(catalog) = super::catalog::target(kind, data) => catalog,
        TOOLS_DISCOVER => Target::Discover,
        TOOLS_STATS => Target::Stats,
        TOOL_CANCEL => match data.get("request_id") {
            Some(Value::String(call_id)) if !call_id.is_empty() => {
                Target::Cancel { call_id: call_id.clone(), cancel_id: envelope.id.clone() }
            }
            _ => {
                Target::Invalid("tool.cancel needs data.request_id, the id of the call to cancel".to_owned())
            }
        },
        TOOL_INPUT => input_target(envelope, data),
        TOOL_INVOKE => {
            let Some(name) = data.get("tool").and_then(Value::as_str) else {
                return Target::Invalid("tool.invoke needs data.tool, the tool's name".to_owned());
            };
            let arguments = match data.get("arguments") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                // Some callers pass the model's arguments string through unparsed.
                Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
                    Ok(arguments) => arguments,
                    Err(err) => {
                        return Target::Invalid(format!("data.arguments is a string but not JSON: {err}"));
                    }
                },
                Some(arguments) => arguments.clone(),
            };
            Target::Tool { name: name.to_owned(), arguments }
        }
        event => match resolve(event) {
            Some(name) => {
                let arguments: Map<String, Value> = data
                    .iter()
                    .filter(|(key, _)| !RESERVED_DATA_KEYS.contains(&key.as_str()))
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect();
                Target::Tool { name, arguments: Value::Object(arguments) }
            }
            None => Target::Unknown(event.to_owned()),
        },
    }
}

/// A `tool.input`: `data.request_id` (the call's), `data.input_id` and `data.response`.
fn input_target(envelope: &EventEnvelope, data: &Map<String, Value>) -> Target {
    let text = |key: &str| data.get(key).and_then(Value::as_str).filter(|text| !text.is_empty());
    let (Some(call_id), Some(input_id)) = (text("request_id"), text("input_id")) else {
        return Target::Invalid(
            "tool.input needs data.request_id (the call's id) and data.input_id (the question's id), \
             both non-empty strings"
                .to_owned(),
        );
    };
    let Some(response) = data.get("response").filter(|response| response.is_object()) else {
        return Target::Invalid(
            "tool.input needs data.response, a JSON object: an MCP ElicitResult or CreateMessageResult"
                .to_owned(),
        );
    };
    Target::Input {
        call_id: call_id.to_owned(),
        input_id: input_id.to_owned(),
        response: response.clone(),
        answer_id: envelope.id.clone(),
    }
}

/// Pulls what it can out of an object that is not a well-typed envelope, to answer it.
fn lenient_envelope(value: &Value) -> EventEnvelope {
    let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
    EventEnvelope {
        id: text("id").unwrap_or_default(),
        event_type: text("type").or_else(|| text("event_type")).unwrap_or_default(),
        data: value.get("data").filter(|data| data.is_object()).cloned().unwrap_or(Value::Null),
        correlation_id: text("correlation_id"),
        response_event: text("response_event"),
        response_topic: text("response_topic"),
        tenant_id: text("tenant_id"),
        user_id: text("user_id"),
        session_id: text("session_id"),
        trace_id: text("trace_id"),
        traceparent: text("traceparent"),
        tracestate: text("tracestate"),
        ..EventEnvelope::default()
    }
}

/// `data.deadline` (RFC 3339) or `data.timeout_ms` counted from the envelope's `time` (else the
/// entry's own timestamp); the earlier of the two when both are given.
fn deadline(envelope: &EventEnvelope, entry: &Entry) -> Option<Duration> {
    let absolute = envelope
        .data_str("deadline")
        .and_then(|text| chrono::DateTime::parse_from_rfc3339(text).ok())
        .and_then(|at| u64::try_from(at.timestamp_millis()).ok())
        .map(Duration::from_millis);
    let relative = envelope.data.get("timeout_ms").and_then(Value::as_u64).and_then(|timeout| {
        let sent = envelope
            .time
            .as_deref()
            .and_then(|text| chrono::DateTime::parse_from_rfc3339(text).ok())
            .and_then(|at| u64::try_from(at.timestamp_millis()).ok())
            .or_else(|| entry_millis(&entry.entry_id))?;
        Some(Duration::from_millis(sent.saturating_add(timeout)))
    });
    match (absolute, relative) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The millisecond timestamp in a stream entry id.
pub(crate) fn entry_millis(entry_id: &str) -> Option<u64> {
    entry_id.split('-').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn entry(payload: &str) -> Entry {
        Entry::from_fields("1700000000000-0", [("id", "m-1".to_owned()), ("payload", payload.to_owned())])
    }

    fn check(payload: &str) -> Admission {
        let patterns = ["action-results".to_owned(), "results:*".to_owned()];
        let topics = ResponseTopics::new(&patterns, "action-results", "action-requests").unwrap();
        admit(
            &entry(payload),
            1024,
            &topics,
            |event| (event == "echo.requested").then(|| "echo".to_owned()),
            Sampling::OFF,
        )
    }

    fn request(payload: &str) -> Request {
        match check(payload) {
            Admission::Request(request) => *request,
            Admission::DeadLetter(reason) => panic!("dead-lettered: {reason}"),
        }
    }

    #[test]
    fn bad_payloads_are_dead_lettered() {
        for (payload, reason) in [
            ("not json", "not JSON"),
            ("[1,2,3]", "not a JSON object"),
            ("{\"data\": {}}", "no type"),
            (
                &format!("{{\"type\":\"echo.requested\",\"data\":{{\"message\":\"{}\"}}}}", "x".repeat(2000)),
                "exceeds",
            ),
        ] {
            match check(payload) {
                Admission::DeadLetter(text) => assert!(text.contains(reason), "{text}"),
                Admission::Request(request) => panic!("admitted {request:?}"),
            }
        }
    }

    #[test]
    fn an_input_names_the_call_and_the_question_and_needs_a_response_object() {
        let input = request(
            r#"{"id":"e-7","type":"tool.input","data":{"request_id":"call-1","input_id":"i-1","response":{"action":"decline"}}}"#,
        );
        assert_eq!(input.request_id, "call-1");
        assert!(matches!(&input.target,
            Target::Input { call_id, input_id, answer_id, response }
                if call_id == "call-1" && input_id == "i-1" && answer_id == "e-7" && response["action"] == "decline"));
        for data in [
            r#"{"request_id":"call-1","response":{}}"#,
            r#"{"request_id":"call-1","input_id":"","response":{}}"#,
            r#"{"request_id":"call-1","input_id":"i-1"}"#,
            r#"{"request_id":"call-1","input_id":"i-1","response":"yes"}"#,
        ] {
            let input = request(&format!(r#"{{"id":"e-7","type":"tool.input","data":{data}}}"#));
            assert!(
                matches!(&input.target, Target::Invalid(reason) if reason.starts_with("tool.input needs")),
                "{data}: {:?}",
                input.target
            );
        }
    }

    #[test]
    fn a_cancel_names_the_call_and_is_remembered_by_its_own_id() {
        let cancel = request(r#"{"id":"e-9","type":"tool.cancel","data":{"request_id":"call-1"}}"#);
        assert_eq!(cancel.request_id, "call-1");
        assert!(
            matches!(&cancel.target, Target::Cancel { call_id, cancel_id } if call_id == "call-1" && cancel_id == "e-9")
        );
        // Without an envelope id, the entry's message id.
        let cancel = request(r#"{"type":"tool.cancel","data":{"request_id":"call-1"}}"#);
        assert!(matches!(&cancel.target, Target::Cancel { cancel_id, .. } if cancel_id == "m-1"));
        // Without the call's id it is refused (an empty id, by the rule for every request id).
        for (data, why) in
            [(r#"{}"#, "tool.cancel needs data.request_id"), (r#"{"request_id":""}"#, "must not be empty")]
        {
            let cancel = request(&format!(r#"{{"id":"e-9","type":"tool.cancel","data":{data}}}"#));
            assert!(
                matches!(&cancel.target, Target::Invalid(reason) if reason.contains(why)),
                "{data}: {:?}",
                cancel.target
            );
        }
    }

    #[test]
    fn tool_events_strip_reserved_keys() {
        let request = request(
            r#"{"id":"e-1","type":"echo.requested","data":{"request_id":"r-1","message":"hi","deadline":"2099-01-01T00:00:00Z","response_topic":"results:x"}}"#,
        );
        assert_eq!(request.request_id, "r-1");
        assert!(
            matches!(&request.target, Target::Tool { name, arguments } if name == "echo" && *arguments == json!({"message": "hi"}))
        );
        assert!(request.deadline.is_some());
    }

    #[test]
    fn tool_invoke_names_the_tool() {
        let request = request(
            r#"{"id":"e-1","type":"tool.invoke","data":{"tool":"echo","arguments":"{\"message\":\"hi\"}"}}"#,
        );
        assert_eq!(request.request_id, "e-1");
        assert!(
            matches!(&request.target, Target::Tool { name, arguments } if name == "echo" && *arguments == json!({"message": "hi"}))
        );
        let request = request_of(r#"{"type":"tool.invoke","data":{}}"#);
        assert!(matches!(request.target, Target::Invalid(_)));
        assert_eq!(request.request_id, "m-1");
    }

    fn request_of(payload: &str) -> Request {
        request(payload)
    }

    #[test]
    fn unknown_events_and_malformed_envelopes_are_answerable() {
        assert!(matches!(request(r#"{"type":"nope.requested"}"#).target, Target::Unknown(_)));
        let request =
            request(r#"{"type":"echo.requested","correlation_id":5,"response_topic":"results:mine"}"#);
        assert!(matches!(request.target, Target::Invalid(_)));
        assert_eq!(request.response_topic, "results:mine");
    }

    #[test]
    fn response_topics_outside_the_allow_list_are_forbidden_and_answered_on_the_default() {
        for (topic, forbidden) in [
            ("results:mine", false),
            ("action-results", false),
            ("other-tenant-results", true),
            ("chat:ToolHost", true),
            ("dlq:toolhost", true),
            ("toolhost:toolhost:answered:r-1", true),
            ("action-requests", true),
        ] {
            let request = request(&format!(r#"{{"type":"echo.requested","response_topic":"{topic}"}}"#));
            if forbidden {
                assert!(
                    matches!(&request.target, Target::Forbidden(text) if text.contains(topic)),
                    "{topic}"
                );
                assert_eq!(request.response_topic, "action-results", "{topic}");
            } else {
                assert!(matches!(request.target, Target::Tool { .. }), "{topic}");
                assert_eq!(request.response_topic, topic);
            }
        }
        // The same rule holds for data.response_topic, and "" is an invalid request.
        let in_data = request(r#"{"type":"echo.requested","data":{"response_topic":"chat:x"}}"#);
        assert!(matches!(in_data.target, Target::Forbidden(_)));
        let empty = request(r#"{"type":"echo.requested","response_topic":""}"#);
        assert!(matches!(&empty.target, Target::Invalid(text) if text.contains("empty")));
    }

    #[test]
    fn request_ids_must_be_non_empty_strings() {
        let empty = request(r#"{"id":"e-1","type":"echo.requested","data":{"request_id":""}}"#);
        assert!(matches!(&empty.target, Target::Invalid(text) if text.contains("must not be empty")));
        assert_eq!(empty.request_id, "");
        let number = request(r#"{"id":"e-1","type":"echo.requested","data":{"request_id":42}}"#);
        assert!(matches!(&number.target, Target::Invalid(text) if text.contains("must be a string")));
        assert_eq!(number.request_id, "42");
        let null = request(r#"{"id":"e-1","type":"echo.requested","data":{"request_id":null}}"#);
        assert_eq!(null.request_id, "e-1");
        assert!(matches!(null.target, Target::Tool { .. }));
    }

    #[test]
    fn numbers_out_of_range_and_deep_nesting_are_answered_when_the_header_reads() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        for value in ["1e400", &"9".repeat(400), &deep] {
            let payload = format!(
                r#"{{"id":"e-1","type":"echo.requested","data":{{"request_id":"r-9","message":{value}}},"response_topic":"results:me"}}"#
            );
            let request = request(&payload);
            assert!(
                matches!(&request.target, Target::Invalid(text) if text.contains("cannot be read")),
                "{value}"
            );
            assert_eq!(request.request_id, "r-9");
            assert_eq!(request.response_topic, "results:me");
        }
        // Without a type or response_event there is nowhere to answer.
        assert!(matches!(check(r#"{"data":{"x":1e400}}"#), Admission::DeadLetter(_)));
    }

    #[test]
    fn timeout_ms_counts_from_the_envelope_time() {
        let request =
            request(r#"{"type":"echo.requested","time":"2026-11-22T10:00:00Z","data":{"timeout_ms":1000}}"#);
        let expected =
            chrono::DateTime::parse_from_rfc3339("2026-11-22T10:00:01Z").unwrap().timestamp_millis();
        assert_eq!(request.deadline, Some(Duration::from_millis(expected as u64)));
    }
}
