//! Golden samples of what other programs see: the answers and dead letters for a fixed set of
//! requests and chat messages, the metric names, and the fields of the log lines. A refactoring
//! that changes any of them fails here; a deliberate change is re-recorded with
//! `TOOLHOST_BLESS=1 cargo test -p toolhost --test tests golden` and reviewed in the diff.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};

use crate::support::{Daemon, RedisServer, http_addr, payloads, pending, request, wait_http, xadd};

const WAIT: Duration = Duration::from_secs(15);

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `actual` with the recorded file, or records it under `TOOLHOST_BLESS=1`.
fn check(name: &str, actual: &Value) {
    let path = golden_dir().join(name);
    let text = format!("{}\n", serde_json::to_string_pretty(actual).unwrap());
    if std::env::var_os("TOOLHOST_BLESS").is_some() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("{}: {err}; record it with TOOLHOST_BLESS=1", path.display()));
    assert_eq!(text, expected, "{name} changed; if on purpose, re-record with TOOLHOST_BLESS=1");
}

/// Replaces what differs between runs (ids, times, durations, entry ids, consumer names) by
/// placeholders, keeping the shape and every stable value.
fn normalise(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, value)| {
                    let stable = match key.as_str() {
                        "id" | "time" | "created_at" | "dead_lettered_at" | "entry_id"
                        | "request_entry_id" | "envelope_id" => {
                            json!(format!("<{key}>"))
                        }
                        "duration_ms" | "mean_ms" | "p50_ms" | "p99_ms" => json!("<ms>"),
                        "traceparent" => json!(traceparent_shape(value.as_str().unwrap_or_default())),
                        _ => normalise(value),
                    };
                    (key.clone(), stable)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalise).collect()),
        Value::String(text) if uuid::Uuid::parse_str(text).is_ok() => json!("<uuid>"),
        other => other.clone(),
    }
}

/// The trace id a golden request gives in its `traceparent`.
const GOLDEN_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// A `traceparent` with its random parts replaced: the span id always (each call opens its
/// own), the trace id unless it is the one the request gave.
fn traceparent_shape(traceparent: &str) -> String {
    let parts: Vec<&str> = traceparent.split('-').collect();
    match parts.as_slice() {
        [version, trace, span, flags] if span.len() == 16 => {
            let trace = if *trace == GOLDEN_TRACE { (*trace).to_owned() } else { "<new trace>".to_owned() };
            format!("{version}-{trace}-<span>-{flags}")
        }
        _ => format!("<not a traceparent: {traceparent}>"),
    }
}

async fn settle(
    connection: &mut MultiplexedConnection,
    stream: &str,
    answers: &str,
    count: usize,
) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let found = payloads(connection, answers).await;
        if found.len() >= count && pending(connection, stream, "toolhost").await == 0 {
            return found;
        }
        assert!(Instant::now() < deadline, "{answers} holds {} of {count}: {found:#?}", found.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sorts answers by request id (and, for equal ids, by their text), since concurrently handled
/// requests may be answered in any order.
fn sorted(mut answers: Vec<Value>) -> Vec<Value> {
    answers.sort_by_key(|answer| (answer["data"]["request_id"].to_string(), answer.to_string()));
    answers
}

/// `envelope` with a trace context and an opaque `trace_id` beside it.
fn traced(mut envelope: Value, traceparent: &str) -> Value {
    envelope["traceparent"] = json!(traceparent);
    envelope["tracestate"] = json!("vendor=golden");
    envelope["trace_id"] = json!("caller-trace-1");
    envelope
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_output_metric_names_and_log_fields_match_the_recorded_samples() {
    let redis = RedisServer::start();
    let daemon = Daemon::start(
        &redis,
        &[("TERMINAL_ALLOWED_COMMANDS", "echo"), ("TERMINAL_SANDBOX_CWD", "/tmp"), ("AGENT_NAME", "Golden")],
    );
    let mut connection = redis.connection().await;
    let requests = [
        request("echo.requested", "g-echo", json!({"message": "hello"})),
        request("tool.invoke", "g-invoke", json!({"tool": "echo", "arguments": {"message": "hi"}})),
        request("echo.requested", "g-invalid", json!({"message": 5})),
        request("nope.requested", "g-unknown", json!({})),
        request("terminal_run.requested", "g-terminal", json!({"command": "echo golden"})),
        request("terminal_run.requested", "g-refused", json!({"command": "cat /etc/passwd"})),
        request("tools.discover", "g-discover", json!({"format": "openai"})),
        request("tools.discover", "g-toolbox", json!({"format": "toolbox"})),
        traced(
            request("echo.requested", "g-traced", json!({"message": "traced"})),
            &format!("00-{GOLDEN_TRACE}-00f067aa0ba902b7-01"),
        ),
        traced(
            request("echo.requested", "g-bad-trace", json!({"message": "garbage"})),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ),
    ];
    for envelope in &requests {
        xadd(&mut connection, "action-requests", &envelope.to_string()).await;
    }
    xadd(&mut connection, "action-requests", "not json").await;
    let answers = settle(&mut connection, "action-requests", "action-results", requests.len()).await;
    let dead_letters = payloads(&mut connection, "dlq:toolhost").await;

    let chat = json!({
        "id": uuid::Uuid::new_v4().to_string(), "conversation_id": "conv-golden", "sender": "agent:Planner",
        "recipient": "agent:Golden", "type": "message", "created_at": "2026-11-22T10:00:00Z",
        "content": "{\"tool\": \"echo\", \"arguments\": {\"message\": \"by chat\"}}", "metadata": {},
    });
    xadd(&mut connection, "chat:Golden", &chat.to_string()).await;
    let replies = settle(&mut connection, "chat:Golden", "chat:conv-golden", 1).await;
    let to_sender = payloads(&mut connection, "chat:Planner").await;
    let progress = payloads(&mut connection, "stream:conv-golden").await;

    check(
        "wire.json",
        &json!({
            "answers": normalise(&Value::Array(sorted(answers))),
            "dead_letters": normalise(&Value::Array(dead_letters)),
            "chat_replies": normalise(&Value::Array(replies)),
            "chat_replies_to_sender": normalise(&Value::Array(to_sender)),
            "chat_progress": normalise(&Value::Array(progress)),
        }),
    );

    // The group gauges appear with the probe's first look at the groups after they exist, up to
    // 500 ms after start; a fast run gets here before that.
    let (_, metrics) =
        wait_http(http_addr(&daemon.log()), "/metrics", WAIT, |_, body| body.contains("toolhost_group_lag"));
    let names: BTreeSet<&str> = metrics
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();
    check("metric_names.json", &json!(names));

    let mut fields: BTreeSet<String> = BTreeSet::new();
    for line in daemon.log().lines().filter_map(|line| serde_json::from_str::<Value>(line).ok()) {
        let message = line["message"].as_str().unwrap_or_default().to_owned();
        if let Value::Object(map) = &line {
            for key in map.keys() {
                fields.insert(format!("{message}: {key}"));
            }
        }
    }
    let fields: Vec<String> = fields
        .into_iter()
        .filter(|field| {
            field.starts_with("invocation:")
                || field.starts_with("chat message:")
                || field.starts_with("ready:")
        })
        .collect();
    check("log_fields.json", &json!(fields));
}
