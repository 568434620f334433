//! The envelopes of CONTRACTS.md §2 that the harness sends and the reference worker answers.
//!
//! Both sides serialize through borrowing structs rather than `serde_json::Value`, so a
//! 500 KiB message is copied once into the output buffer and never cloned on the way.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The stream that carries tool requests.
pub const REQUESTS_STREAM: &str = "action-requests";
/// The stream that carries tool results when a request names no `response_topic`.
pub const RESULTS_STREAM: &str = "action-results";
/// The consumer group toolhost reads with (its default toolbox id).
pub const DEFAULT_GROUP: &str = "toolhost";
/// The `MAXLEN ~` every publisher in the benchmark trims its stream with.
pub const DEFAULT_MAXLEN: usize = 100_000;

/// What one benchmark request asks a target to do.
#[derive(Clone, Debug)]
pub enum RequestKind {
    /// `echo.requested` with a message of the given text.
    Echo {
        /// The `data.message` sent and expected back.
        message: String,
    },
    /// `echo.requested` like [`RequestKind::Echo`], signed with a key (a `sig` field, see
    /// docs/CONTRACTS.md "Signed requests") and naming a tenant.
    SignedEcho {
        /// The `data.message` sent and expected back.
        message: String,
        /// The key id.
        key_id: String,
        /// The key's secret.
        secret: String,
        /// The envelope's `tenant_id`.
        tenant: String,
    },
    /// `terminal_run.requested` running `echo hi`.
    TerminalRun,
    /// `tools.discover` in the native format.
    Discover,
    /// `synthetic_0000.requested` with a valid 20-field argument object.
    Synthetic {
        /// The argument object, see [`synthetic_arguments`].
        arguments: Map<String, Value>,
    },
}

impl RequestKind {
    /// An echo request whose message is `size` bytes long.
    pub fn echo(size: usize) -> Self {
        RequestKind::Echo { message: "x".repeat(size) }
    }

    /// A request for the first synthetic tool with a valid argument object.
    pub fn synthetic() -> Self {
        RequestKind::Synthetic { arguments: synthetic_arguments() }
    }

    /// The envelope `type` of this request.
    pub fn event_type(&self) -> &'static str {
        match self {
            RequestKind::Echo { .. } | RequestKind::SignedEcho { .. } => "echo.requested",
            RequestKind::TerminalRun => "terminal_run.requested",
            RequestKind::Discover => "tools.discover",
            RequestKind::Synthetic { .. } => "synthetic_0000.requested",
        }
    }

    /// The size of the variable part of the request: the echo message, else 0.
    pub fn payload_bytes(&self) -> usize {
        match self {
            RequestKind::Echo { message } | RequestKind::SignedEcho { message, .. } => message.len(),
            _ => 0,
        }
    }
}

/// A serialized request: the entry's `id` field and its `payload` field.
#[derive(Debug)]
pub struct Request {
    /// The event id, also written as the entry's `id` field.
    pub id: String,
    /// The `data.request_id` the answer is matched by.
    pub request_id: String,
    /// The compact JSON envelope.
    pub payload: String,
    /// The `sig` field, for a signed request.
    pub sig: Option<String>,
}

/// `v1=<key id>:<hex HMAC-SHA256(secret, payload)>`.
fn sign(key_id: &str, secret: &str, payload: &str) -> String {
    use hmac::Mac as _;
    use std::fmt::Write as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(payload.as_bytes());
    let mut sig = format!("v1={key_id}:");
    for byte in mac.finalize().into_bytes() {
        let _ = write!(sig, "{byte:02x}");
    }
    sig
}

/// Builds a request envelope of the given kind with fresh ids.
///
/// # Errors
///
/// Only if serde_json fails to write a string, which it does not do for these types.
pub fn request(kind: &RequestKind) -> serde_json::Result<Request> {
    request_to(kind, &|_| None)
}

/// [`request`] answered on the topic `topic_for` names for its request id (the default results
/// topic for `None`).
///
/// # Errors
///
/// Only if serde_json fails to write a string, which it does not do for these types.
pub fn request_to(
    kind: &RequestKind,
    topic_for: &dyn Fn(&str) -> Option<String>,
) -> serde_json::Result<Request> {
    let id = uuid::Uuid::new_v4().to_string();
    let request_id = uuid::Uuid::new_v4().to_string();
    let topic = topic_for(&request_id);
    let response_topic = topic.as_deref();
    let data = match kind {
        RequestKind::Echo { message } | RequestKind::SignedEcho { message, .. } => {
            RequestData::Echo { request_id: &request_id, message }
        }
        RequestKind::TerminalRun => RequestData::Command { request_id: &request_id, command: "echo hi" },
        RequestKind::Discover => RequestData::Bare { request_id: &request_id },
        RequestKind::Synthetic { arguments } => RequestData::Arguments { request_id: &request_id, arguments },
    };
    let envelope = OutgoingRequest {
        id: &id,
        source: "bench:loadgen",
        specversion: "1.0",
        event_type: kind.event_type(),
        topic: REQUESTS_STREAM,
        time: now_rfc3339(),
        correlation_id: &request_id,
        response_topic,
        tenant_id: match kind {
            RequestKind::SignedEcho { tenant, .. } => Some(tenant),
            _ => None,
        },
        data,
    };
    let payload = serde_json::to_string(&envelope)?;
    let sig = match kind {
        RequestKind::SignedEcho { key_id, secret, .. } => Some(sign(key_id, secret, &payload)),
        _ => None,
    };
    Ok(Request { id, request_id, payload, sig })
}

/// The message of the independent generator's requests.
pub const INDEPENDENT_MESSAGE: &str = "ping";

/// A request of the independent generator's shape (issue 27): one fresh UUID serves as the
/// event id, `data.request_id` and `correlation_id`; `source` is `loadgen`, `time` is RFC 3339
/// with microseconds, the message is `ping` and `response_topic` names `action-results`.
///
/// # Errors
///
/// Only if serde_json fails to write a string, which it does not do for these types.
pub fn independent_request() -> serde_json::Result<Request> {
    let id = uuid::Uuid::new_v4().to_string();
    let envelope = OutgoingRequest {
        id: &id,
        source: "loadgen",
        specversion: "1.0",
        event_type: "echo.requested",
        topic: REQUESTS_STREAM,
        time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        correlation_id: &id,
        response_topic: Some(RESULTS_STREAM),
        tenant_id: None,
        data: RequestData::Echo { request_id: &id, message: INDEPENDENT_MESSAGE },
    };
    let payload = serde_json::to_string(&envelope)?;
    Ok(Request { request_id: id.clone(), id, payload, sig: None })
}

/// The valid 20-field argument object for `synthetic_0000`, matching the schema the daemon
/// registers with `--synthetic-tools`: f00-f05 strings, f06-f09 integers, f10-f12 booleans,
/// f13 an enum, f14 a number, f15 a string array, f16 `{k, v}`, f17 a date-time, f18 a
/// pattern-checked identifier and the optional f19.
pub fn synthetic_arguments() -> Map<String, Value> {
    let arguments = json!({
        "f00": "alpha", "f01": "bravo", "f02": "charlie delta", "f03": "echo foxtrot golf",
        "f04": "hotel", "f05": "india juliett kilo lima",
        "f06": 0, "f07": 42, "f08": 123_456, "f09": 1_000_000,
        "f10": true, "f11": false, "f12": true,
        "f13": "medium",
        "f14": 3.25,
        "f15": ["a", "bb", "ccc"],
        "f16": {"k": "key", "v": 7},
        "f17": "2026-11-22T10:00:00Z",
        "f18": "snake_case_42",
        "f19": "optional"
    });
    match arguments {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// Summary of an answer, the few fields the load generator looks at.
#[derive(Debug, Deserialize)]
pub struct AnswerSummary {
    /// The answer's `data`.
    #[serde(default)]
    pub data: AnswerSummaryData,
}

/// The `data` part of [`AnswerSummary`].
#[derive(Debug, Default, Deserialize)]
pub struct AnswerSummaryData {
    /// Matches the request's `data.request_id`.
    #[serde(default)]
    pub request_id: Option<String>,
    /// Whether the tool succeeded.
    #[serde(default)]
    pub success: Option<bool>,
    /// The error code of a failed answer.
    #[serde(default)]
    pub error_code: Option<String>,
    /// The error sentence of a failed answer.
    #[serde(default)]
    pub error: Option<String>,
}

/// An answer the reference worker publishes: where, its entry id and its payload.
#[derive(Debug)]
pub struct Answer {
    /// The stream to publish to (`response_topic`, else `action-results`).
    pub topic: String,
    /// The result event id, also written as the entry's `id` field.
    pub id: String,
    /// The compact JSON result envelope.
    pub payload: String,
    /// The request's `data.request_id`, `None` when it had none (then the answer carries a
    /// fresh one and the request cannot be recognised again).
    pub request_id: Option<String>,
}

/// Builds the answer toolhost gives to `echo.requested`, as the reference worker does for
/// every request: `result: {"message": data.message}`, or `invalid_arguments` without one.
///
/// # Errors
///
/// When `payload` is not a JSON object; the caller treats that as a dead letter.
pub fn echo_answer(payload: &[u8], toolbox_id: &str) -> serde_json::Result<Answer> {
    let request: IncomingRequest<'_> = serde_json::from_slice(payload)?;
    let id = uuid::Uuid::new_v4().to_string();
    let given_request_id = request.data.request_id.as_deref().map(str::to_owned);
    let request_id = match request.data.request_id {
        Some(request_id) => request_id,
        None => Cow::Owned(uuid::Uuid::new_v4().to_string()),
    };
    let event_type = match (&request.response_event, &request.event_type) {
        (Some(response_event), _) => response_event.to_string(),
        (None, Some(event_type)) => format!("{event_type}.completed"),
        (None, None) => "unknown.completed".to_owned(),
    };
    let topic = request.response_topic.as_deref().unwrap_or(RESULTS_STREAM).to_owned();
    let data = match &request.data.message {
        Some(message) => AnswerData {
            request_id: &request_id,
            success: true,
            result: Some(EchoResult { message }),
            error: None,
            error_code: None,
        },
        None => AnswerData {
            request_id: &request_id,
            success: false,
            result: None,
            error: Some("the argument 'message' is required"),
            error_code: Some("invalid_arguments"),
        },
    };
    let source = format!("toolhost:{toolbox_id}");
    let answer = OutgoingAnswer {
        id: &id,
        source: &source,
        specversion: "1.0",
        event_type: &event_type,
        topic: &topic,
        time: now_rfc3339(),
        correlation_id: request.correlation_id.as_deref().or(request.data.correlation_id.as_deref()),
        tenant_id: request.tenant_id.as_deref(),
        user_id: request.user_id.as_deref(),
        session_id: request.session_id.as_deref(),
        trace_id: request.trace_id.as_deref(),
        data,
    };
    let payload = serde_json::to_string(&answer)?;
    Ok(Answer { topic, id, payload, request_id: given_request_id })
}

/// Now in RFC 3339 with millisecond precision and a `Z`.
fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[derive(Serialize)]
struct OutgoingRequest<'a> {
    id: &'a str,
    source: &'a str,
    specversion: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    topic: &'a str,
    time: String,
    correlation_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_topic: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant_id: Option<&'a str>,
    data: RequestData<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum RequestData<'a> {
    Echo {
        request_id: &'a str,
        message: &'a str,
    },
    Command {
        request_id: &'a str,
        command: &'a str,
    },
    Bare {
        request_id: &'a str,
    },
    Arguments {
        request_id: &'a str,
        #[serde(flatten)]
        arguments: &'a Map<String, Value>,
    },
}

/// The fields of a request the reference worker reads; strings borrow from the payload
/// unless they contain escapes.
#[derive(Deserialize)]
struct IncomingRequest<'a> {
    #[serde(rename = "type", alias = "event_type", borrow, default)]
    event_type: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    correlation_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    response_event: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    response_topic: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tenant_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    user_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    session_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    trace_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    data: IncomingData<'a>,
}

#[derive(Default, Deserialize)]
struct IncomingData<'a> {
    #[serde(borrow, default)]
    request_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    correlation_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
}

#[derive(Serialize)]
struct OutgoingAnswer<'a> {
    id: &'a str,
    source: &'a str,
    specversion: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    topic: &'a str,
    time: String,
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
    data: AnswerData<'a>,
}

#[derive(Serialize)]
struct AnswerData<'a> {
    request_id: &'a str,
    success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<EchoResult<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_code: Option<&'a str>,
}

#[derive(Serialize)]
struct EchoResult<'a> {
    message: &'a str,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A failed unwrap is a failed test, which is what we want.
mod tests {
    use super::*;

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn echo_request_round_trips_through_the_reference_answer() {
        let request = request(&RequestKind::echo(10)).unwrap();
        let sent = parse(&request.payload);
        assert_eq!(sent["type"], "echo.requested");
        assert_eq!(sent["data"]["message"], "xxxxxxxxxx");
        assert_eq!(sent["data"]["request_id"], request.request_id.as_str());

        let answer = echo_answer(request.payload.as_bytes(), "toolhost").unwrap();
        assert_eq!(answer.topic, RESULTS_STREAM);
        let got = parse(&answer.payload);
        assert_eq!(got["source"], "toolhost:toolhost");
        assert_eq!(got["specversion"], "1.0");
        assert_eq!(got["type"], "echo.requested.completed");
        assert_eq!(got["topic"], RESULTS_STREAM);
        assert_eq!(got["correlation_id"], request.request_id.as_str());
        assert_eq!(got["id"], answer.id.as_str());
        assert_eq!(got["data"]["request_id"], request.request_id.as_str());
        assert_eq!(answer.request_id.as_deref(), Some(request.request_id.as_str()));
        assert_eq!(got["data"]["success"], true);
        assert_eq!(got["data"]["result"]["message"], "xxxxxxxxxx");
        assert!(got.get("tenant_id").is_none());
    }

    #[test]
    fn answer_honours_response_fields_and_copies_context() {
        let payload = r#"{"event_type":"echo.requested","response_event":"my.done",
            "response_topic":"replies","tenant_id":"acme","user_id":"u-7","session_id":"s-1",
            "trace_id":"t-1","data":{"message":"a\"b","correlation_id":"c-9"}}"#;
        let answer = echo_answer(payload.as_bytes(), "box").unwrap();
        assert_eq!(answer.topic, "replies");
        let got = parse(&answer.payload);
        assert_eq!(got["type"], "my.done");
        assert_eq!(got["topic"], "replies");
        assert_eq!(got["correlation_id"], "c-9");
        assert_eq!(got["tenant_id"], "acme");
        assert_eq!(got["user_id"], "u-7");
        assert_eq!(got["session_id"], "s-1");
        assert_eq!(got["trace_id"], "t-1");
        assert_eq!(got["data"]["result"]["message"], "a\"b");
        assert_eq!(got["data"]["request_id"].as_str().unwrap().len(), 36);
        assert_eq!(answer.request_id, None, "a fresh request id is no request's own");
    }

    #[test]
    fn missing_message_is_an_invalid_arguments_answer() {
        let answer = echo_answer(br#"{"type":"echo.requested","data":{"request_id":"r-1"}}"#, "t").unwrap();
        let got = parse(&answer.payload);
        assert_eq!(got["data"]["success"], false);
        assert_eq!(got["data"]["error_code"], "invalid_arguments");
        assert_eq!(got["data"]["request_id"], "r-1");
    }

    #[test]
    fn non_object_payload_is_an_error() {
        assert!(echo_answer(b"[1,2]", "t").is_err());
        assert!(echo_answer(b"not json", "t").is_err());
    }

    #[test]
    fn synthetic_request_carries_all_twenty_fields() {
        let request = request(&RequestKind::synthetic()).unwrap();
        let sent = parse(&request.payload);
        assert_eq!(sent["type"], "synthetic_0000.requested");
        for field_idx in 0..20 {
            assert!(sent["data"].get(format!("f{field_idx:02}")).is_some(), "f{field_idx:02}");
        }
        assert_eq!(sent["data"]["request_id"], request.request_id.as_str());
    }

    #[test]
    fn independent_request_has_the_issue_shape_with_one_uuid() {
        let request = independent_request().unwrap();
        let sent = parse(&request.payload);
        let keys: Vec<&str> = sent.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys.iter().copied().collect::<std::collections::BTreeSet<_>>(),
            [
                "correlation_id",
                "data",
                "id",
                "response_topic",
                "source",
                "specversion",
                "time",
                "topic",
                "type"
            ]
            .into_iter()
            .collect()
        );
        assert_eq!(sent["source"], "loadgen");
        assert_eq!(sent["type"], "echo.requested");
        assert_eq!(sent["topic"], REQUESTS_STREAM);
        assert_eq!(sent["response_topic"], RESULTS_STREAM);
        assert_eq!(sent["data"]["message"], "ping");
        assert_eq!(request.id.len(), 36);
        for id in [&sent["id"], &sent["correlation_id"], &sent["data"]["request_id"]] {
            assert_eq!(id, request.id.as_str());
        }
        assert_eq!(request.request_id, request.id);
        // Microseconds: six digits between the seconds and the Z.
        let time = sent["time"].as_str().unwrap();
        let fraction = time.rsplit_once('.').unwrap().1;
        assert_eq!(fraction.len(), 7, "{time}");
        assert!(fraction.ends_with('Z'));
        assert!(chrono::DateTime::parse_from_rfc3339(time).is_ok());
    }
}
