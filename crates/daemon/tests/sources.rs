//! Issue 15: `[[commands]]` and `[[http_tools]]` through the real daemon and a real Redis,
//! called like built-ins: argv filling, stdin, JSON output, exit codes with stderr, dash
//! refusal, process-group kills; HTTP results, failures, size caps, redirects, an endpoint
//! that goes down and comes back, timeouts; discovery in OpenAI format.

use std::os::unix::fs::PermissionsExt as _;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::support::{Daemon, RedisServer, ask, free_port, processes, temp_dir};

/// Calls `tool` with `arguments` and returns the answer's `data`.
async fn call(redis: &RedisServer, tool: &str, id: &str, arguments: Value) -> Value {
    ask(redis, &[(&format!("{tool}.requested"), id, arguments)]).await.remove(id).unwrap()
}

/// The `tools.discover` listing in `format`.
async fn discover(redis: &RedisServer, format: &str) -> Vec<Value> {
    let mut answers = ask(redis, &[("tools.discover", format, json!({"format": format}))]).await;
    result(&answers.remove(format).unwrap())["tools"].as_array().unwrap().clone()
}

fn result(answer: &Value) -> &Value {
    assert_eq!(answer["success"], true, "{answer}");
    &answer["result"]
}

fn failure<'a>(answer: &'a Value, code: &str) -> &'a str {
    assert_eq!(answer["success"], false, "{answer}");
    assert_eq!(answer["error_code"], code, "{answer}");
    answer["error"].as_str().unwrap()
}

/// Starts a daemon with `config` as its configuration file.
fn daemon(redis: &RedisServer, dir: &std::path::Path, config: &str, env: &[(&str, &str)]) -> Daemon {
    let path = dir.join("toolhost.toml");
    std::fs::write(&path, config).unwrap();
    Daemon::start_args(redis, env, &["--config", path.to_str().unwrap()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_tools_fill_argv_feed_stdin_and_fail_with_stderr() {
    let dir = temp_dir("commands");
    // Commands of a root daemon run as nobody, who must be able to enter the directory.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("words.txt"), "one two three\n").unwrap();
    std::fs::set_permissions(dir.join("words.txt"), std::fs::Permissions::from_mode(0o644)).unwrap();
    // MCP CallToolResults for `output = "mcp"`: an image between texts, bad base64, an error.
    for (name, text) in [
        (
            "shot.json",
            r#"{"content": [{"type": "text", "text": "a dot"}, {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}]}"#,
        ),
        ("bad.json", r#"{"content": [{"type": "image", "data": "not base64!", "mimeType": "image/png"}]}"#),
        ("err.json", r#"{"content": [{"type": "text", "text": "no camera"}], "isError": true}"#),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
        std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    std::fs::write(
        dir.join("wc.json"),
        r#"{"type": "object", "properties": {"file": {"type": "string"}},
        "required": ["file"], "additionalProperties": false}"#,
    )
    .unwrap();
    let config = format!(
        r#"
[[commands]]
name = "word_count"
description = "Count the words in a file."
argv = ["wc", "-w", "{{file}}"]
cwd = "{dir}"
argument_schema_file = "wc.json"
annotations = {{ read_only = true, idempotent = true }}

[[commands]]
name = "count_bytes"
description = "Count the bytes of a text."
argv = ["wc", "-c"]
stdin = "{{text}}"
argument_schema = {{ type = "object", properties = {{ text = {{ type = "string" }} }}, required = ["text"] }}

[[commands]]
name = "describe"
description = "Describe a count and words as JSON."
argv = ["printf", '{{{{"n": %s, "words": ["%s"]}}}}', "{{n}}", "{{words}}"]
output = "json"
argument_schema = {{ type = "object", properties = {{ n = {{ type = "integer" }}, words = {{ type = "array", items = {{ type = "string" }} }} }}, required = ["n"] }}
output_schema = {{ type = "object", properties = {{ n = {{ type = "integer" }}, words = {{ type = "array", items = {{ minLength = 1 }} }} }}, required = ["n", "words"] }}

[[commands]]
name = "snapshot"
description = "Answer a CallToolResult from a file."
argv = ["cat", "{{file}}"]
cwd = "{dir}"
output = "mcp"
argument_schema = {{ type = "object", properties = {{ file = {{ type = "string" }} }}, required = ["file"] }}

[[commands]]
name = "failing"
description = "Fail with a message."
argv = ["sh", "-c", 'echo partial; echo "bad input: $1" >&2; exit 3', "sh", "{{what}}"]

[[commands]]
name = "slow"
description = "Never finish."
argv = ["sh", "-c", "sleep 30.9 & sleep 30.9"]
timeout_ms = 300
"#,
        dir = dir.display()
    );
    let redis = RedisServer::start();
    let _daemon = daemon(&redis, &dir, &config, &[]);

    let counted = call(&redis, "word_count", "wc", json!({"file": "words.txt"})).await;
    assert_eq!(result(&counted), "3 words.txt\n");
    // A value that would become an option is refused before anything runs.
    let hostile = call(&redis, "word_count", "hostile", json!({"file": "--files0-from=/etc/passwd"})).await;
    let message = failure(&hostile, "invalid_arguments");
    assert_eq!(message, "argument 'file' may not start with '-': the program would read it as an option");
    // The schema still rules first.
    let extra = call(&redis, "word_count", "extra", json!({"file": "words.txt", "more": 1})).await;
    failure(&extra, "invalid_arguments");

    let bytes = call(&redis, "count_bytes", "stdin", json!({"text": "hello"})).await;
    assert_eq!(result(&bytes), "5\n");

    let described = call(&redis, "describe", "json", json!({"n": 3, "words": ["a b"]})).await;
    assert_eq!(result(&described), &json!({"n": 3, "words": ["a b"]}));
    // Absent, the array fills no element, so printf prints "" for its `%s`; the output schema
    // refuses that, as it would any tool's output.
    let without = call(&redis, "describe", "json-absent", json!({"n": 4})).await;
    let details = &without["details"]["errors"][0];
    failure(&without, "invalid_output");
    assert_eq!(
        (details["pointer"].as_str(), details["rule"].as_str()),
        (Some("/words/0"), Some("minLength"))
    );
    // Two words make printf repeat its format: not JSON.
    let broken = call(&redis, "describe", "json-broken", json!({"n": 5, "words": ["x", "y"]})).await;
    assert!(failure(&broken, "tool_failed").starts_with("printf printed no JSON: "), "{broken}");

    // output = "mcp": the texts as the result, the blocks beside it; bad blocks and isError fail.
    let shot = call(&redis, "snapshot", "mcp", json!({"file": "shot.json"})).await;
    assert_eq!(result(&shot), "a dot");
    assert_eq!(shot["content"][1], json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}));
    let bad = call(&redis, "snapshot", "mcp-bad", json!({"file": "bad.json"})).await;
    let message = failure(&bad, "invalid_output");
    assert!(message.contains("content block 0: its `data` is not base64"), "{message}");
    assert!(bad["details"]["content_error"].as_str().unwrap().starts_with("content block 0"), "{bad}");
    let refused = call(&redis, "snapshot", "mcp-error", json!({"file": "err.json"})).await;
    assert_eq!(failure(&refused, "tool_failed"), "no camera");

    let failed = call(&redis, "failing", "failing", json!({"what": "xyz"})).await;
    assert_eq!(failure(&failed, "tool_failed"), "sh exited with code 3; stderr:\nbad input: xyz");

    let started = Instant::now();
    let slow = call(&redis, "slow", "slow", json!({})).await;
    let message = failure(&slow, "timeout");
    assert!(message.contains("did not finish within 300 ms; its process group was killed"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes(&["sleep", "30.9"]).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(processes(&["sleep", "30.9"]), Vec::<u32>::new(), "the background sleep outlived the call");

    // Discovery lists them like built-ins, in OpenAI format with strict-ready parameters.
    let tools = discover(&redis, "openai").await;
    let function = |name: &str| {
        tools
            .iter()
            .find(|tool| tool["function"]["name"] == name)
            .unwrap_or_else(|| panic!("no {name}: {tools:?}"))["function"]
            .clone()
    };
    let word_count = function("word_count");
    assert_eq!(word_count["description"], "Count the words in a file.");
    assert_eq!(word_count["strict"], true);
    assert_eq!(word_count["parameters"]["required"], json!(["file"]));
    assert_eq!(function("count_bytes")["parameters"]["properties"]["text"]["type"], "string");
    let native = discover(&redis, "native").await;
    let word_count = native.iter().find(|tool| tool["name"] == "word_count").unwrap();
    assert_eq!(
        word_count["annotations"],
        json!({"read_only": true, "idempotent": true, "destructive": false})
    );
    let failing = native.iter().find(|tool| tool["name"] == "failing").unwrap();
    assert_eq!(failing["annotations"], json!({"read_only": false, "idempotent": false, "destructive": true}));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The test service: JSON, text, 404, an endless body, a redirect and a request that never
/// gets an answer.
fn service() -> Router {
    async fn order(
        Path(id): Path<String>,
        RawQuery(query): RawQuery,
        headers: HeaderMap,
        body: String,
    ) -> impl IntoResponse {
        let authorization =
            headers.get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()).unwrap_or_default();
        axum::Json(json!({
            "id": id,
            "query": query,
            "body": serde_json::from_str::<Value>(&body).unwrap_or(Value::Null),
            "authorized": authorization == "Bearer tok-5e1d",
            "echoed": authorization,
        }))
    }
    async fn endless() -> impl IntoResponse {
        let chunk = Bytes::from(vec![b'x'; 8192]);
        let stream = futures::stream::repeat_with(move || Ok::<_, std::convert::Infallible>(chunk.clone()));
        ([(header::CONTENT_TYPE, "text/plain")], Body::from_stream(stream))
    }
    Router::new()
        .route("/orders/{id}", post(order))
        .route("/text", get(|| async { ([(header::CONTENT_TYPE, "text/plain")], "plain words") }))
        .route(
            "/pixel",
            get(|| async { ([(header::CONTENT_TYPE, "image/png")], b"\x89PNG\r\n\x1a\n".to_vec()) }),
        )
        .route("/missing", get(|| async { (StatusCode::NOT_FOUND, "no such\n  order 42") }))
        .route("/endless", get(endless))
        .route("/moved", get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/text")]) }))
        .route("/never", get(std::future::pending::<String>))
}

/// Serves [`service`] on `port` until the test ends.
async fn serve(port: u16) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move { axum::serve(listener, service()).await });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tools_answer_results_and_failures_like_built_ins() {
    let up = free_port();
    let down = free_port();
    serve(up).await;
    let dir = temp_dir("http-tools");
    let config = format!(
        r#"
[[http_tools]]
name = "lookup_order"
description = "Look an order up."
method = "POST"
url = "http://127.0.0.1:{up}/orders/{{order_id}}?lang={{lang}}"
headers = {{ Authorization = "Bearer ${{ORDERS_TOKEN}}" }}
argument_schema = {{ type = "object", properties = {{ order_id = {{ type = "string" }}, lang = {{ type = "string" }}, note = {{ type = "string" }} }}, required = ["order_id"] }}
output_schema = {{ type = "object", required = ["id", "authorized"] }}

[[http_tools]]
name = "fetch"
description = "Fetch a page of the test service."
method = "GET"
url = "http://127.0.0.1:{up}/{{path}}"
argument_schema = {{ type = "object", properties = {{ path = {{ type = "string" }} }}, required = ["path"] }}
max_response_bytes = 65536
timeout_ms = 300

[[http_tools]]
name = "flaky"
description = "Fetch from a service that starts late."
method = "GET"
url = "http://127.0.0.1:{down}/text"
"#
    );
    let redis = RedisServer::start();
    let _daemon = daemon(&redis, &dir, &config, &[("ORDERS_TOKEN", "tok-5e1d")]);

    let order =
        call(&redis, "lookup_order", "order", json!({"order_id": "A/7 b", "lang": "en&x", "note": "fast"}))
            .await;
    let order = result(&order);
    assert_eq!(order["id"], "A/7 b", "{order}");
    assert_eq!(order["query"], "lang=en%26x");
    assert_eq!(order["body"], json!({"note": "fast"}));
    assert_eq!(order["authorized"], true);
    // The service echoed the token: the answer hides it.
    assert_eq!(order["echoed"], "Bearer [REDACTED]");

    let text = call(&redis, "fetch", "text", json!({"path": "text"})).await;
    assert_eq!(result(&text), "plain words");
    assert_eq!(text.get("content"), None, "a text answer has no content blocks");
    // An image body is an image block, with a sentence for readers of `result`.
    let pixel = call(&redis, "fetch", "pixel", json!({"path": "pixel"})).await;
    assert_eq!(result(&pixel), "an image (image/png, 8 bytes), in the answer's content");
    assert_eq!(pixel["content"], json!([{"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}]));
    let missing = call(&redis, "fetch", "missing", json!({"path": "missing"})).await;
    assert_eq!(failure(&missing, "tool_failed"), "the service answered HTTP 404 Not Found: no such order 42");
    let endless = call(&redis, "fetch", "endless", json!({"path": "endless"})).await;
    assert_eq!(
        failure(&endless, "tool_failed"),
        "the response body is larger than max_response_bytes (65536)"
    );
    let moved = call(&redis, "fetch", "moved", json!({"path": "moved"})).await;
    assert_eq!(failure(&moved, "tool_failed"), "the service answered HTTP 302 Found");
    let never = call(&redis, "fetch", "never", json!({"path": "never"})).await;
    assert_eq!(failure(&never, "timeout"), "the HTTP request did not finish within 300 ms");
    // A placeholder cannot climb out of its path segment.
    let climb = call(&redis, "fetch", "climb", json!({"path": ".."})).await;
    failure(&climb, "invalid_arguments");

    let refused = call(&redis, "flaky", "down", json!({})).await;
    let message = failure(&refused, "tool_failed");
    assert!(message.starts_with("the HTTP request failed: ") && message.contains("onnect"), "{message}");
    assert!(!message.contains("127.0.0.1"), "{message}");
    serve(down).await;
    let back = call(&redis, "flaky", "up", json!({})).await;
    assert_eq!(result(&back), "plain words");

    let tools = discover(&redis, "openai").await;
    let lookup = tools.iter().find(|tool| tool["function"]["name"] == "lookup_order").unwrap();
    assert_eq!(lookup["function"]["description"], "Look an order up.");
    assert_eq!(lookup["function"]["parameters"]["properties"]["order_id"]["type"], "string");

    // check-config shows the tools with the header masked.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .args(["check-config", "--config", dir.join("toolhost.toml").to_str().unwrap()])
        .env_clear()
        .env("ORDERS_TOKEN", "tok-5e1d")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        printed.contains("name = \"lookup_order\"") && printed.contains("Authorization = \"***\""),
        "{printed}"
    );
    assert!(!printed.contains("tok-5e1d"), "{printed}");
    let _ = std::fs::remove_dir_all(&dir);
}
