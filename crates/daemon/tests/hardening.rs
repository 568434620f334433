//! Issue 12's promises against hostile callers: response topics stay inside the allow list,
//! per-tool queues never block other tools and refuse when full, refusals never eat a retry,
//! caller-chosen names never grow state, and odd request ids and numbers are answered.

use std::process::Command;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};

use crate::support::{
    Daemon, RedisServer, answer, answers_to, http_addr, http_get, payloads, request, settled, temp_dir, xadd,
};

const WAIT: Duration = Duration::from_secs(15);

async fn xlen(connection: &mut MultiplexedConnection, stream: &str) -> u64 {
    redis::cmd("XLEN").arg(stream).query_async(connection).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_topics_outside_the_allow_list_are_refused_on_the_default_topic_and_a_retry_is_answered() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[]);
    let mut connection = redis.connection().await;

    let mut allowed = request("echo.requested", "r-allowed", json!({"message": "mine"}));
    allowed["response_topic"] = json!("results:me");
    xadd(&mut connection, "action-requests", &allowed.to_string()).await;
    let refused = [
        ("r-chat", "chat:ToolHost", "forbidden"),
        ("r-dlq", "dlq:toolhost", "forbidden"),
        ("r-ledger", "toolhost:toolhost:answered:victim", "forbidden"),
        ("r-requests", "action-requests", "forbidden"),
        ("r-tenant", "other-tenant-results", "forbidden"),
        ("r-empty", "", "invalid_request"),
    ];
    for (request_id, topic, _) in refused {
        let mut envelope = request("echo.requested", request_id, json!({"message": "x"}));
        envelope["response_topic"] = json!(topic);
        xadd(&mut connection, "action-requests", &envelope.to_string()).await;
    }
    let mine = answer(&mut connection, "results:me", "r-allowed").await;
    assert_eq!(mine["data"]["result"], json!({"message": "mine"}));
    for (request_id, topic, code) in refused {
        let refusal = answer(&mut connection, "action-results", request_id).await;
        assert_eq!(refusal["data"]["error_code"], code, "{topic}: {refusal}");
        assert_eq!(refusal["topic"], "action-results");
    }
    settled(&mut connection, "action-requests", "toolhost").await;
    // Nothing reached the reserved keys.
    assert_eq!(xlen(&mut connection, "chat:ToolHost").await, 0);
    assert_eq!(xlen(&mut connection, "dlq:toolhost").await, 0);
    let planted: i64 = redis::cmd("EXISTS")
        .arg("toolhost:toolhost:answered:victim")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(planted, 0);

    // A refusal sets no answered mark: the same request id with an allowed topic is answered.
    let mut retry = request("echo.requested", "r-tenant", json!({"message": "again"}));
    retry["response_topic"] = json!("results:tenant");
    xadd(&mut connection, "action-requests", &retry.to_string()).await;
    let retried = answer(&mut connection, "results:tenant", "r-tenant").await;
    assert_eq!(retried["data"]["success"], true, "{retried}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_topic_of_another_type_is_answered_internal_once_and_dead_lettered() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[]);
    let mut connection = redis.connection().await;
    let _: () =
        redis::cmd("SET").arg("results:broken").arg("a string").query_async(&mut connection).await.unwrap();

    let mut broken = request("echo.requested", "r-broken", json!({"message": "lost?"}));
    broken["response_topic"] = json!("results:broken");
    xadd(&mut connection, "action-requests", &broken.to_string()).await;
    let after = request("echo.requested", "r-after", json!({"message": "still serving"}));
    xadd(&mut connection, "action-requests", &after.to_string()).await;

    let internal = answer(&mut connection, "action-results", "r-broken").await;
    assert_eq!(internal["data"]["error_code"], "internal", "{internal}");
    let served = answer(&mut connection, "action-results", "r-after").await;
    assert_eq!(served["data"]["success"], true);
    settled(&mut connection, "action-requests", "toolhost").await;
    let results = payloads(&mut connection, "action-results").await;
    assert_eq!(answers_to(&results, "r-broken").len(), 1, "{results:#?}");
    let letters = payloads(&mut connection, "dlq:toolhost").await;
    assert_eq!(letters.len(), 1, "{letters:#?}");
    assert!(letters[0]["error"].as_str().unwrap().contains("results:broken"), "{letters:#?}");
    let kind: String = redis::cmd("TYPE").arg("results:broken").query_async(&mut connection).await.unwrap();
    assert_eq!(kind, "string");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tool_queue_answers_overloaded_without_holding_up_other_tools_and_waits_end_at_the_deadline() {
    let redis = RedisServer::start();
    let dir = temp_dir("limits");
    let config = dir.join("limits.toml");
    std::fs::write(
        &config,
        "[dispatch]\nmax_in_flight = 4\n\n[tools.limits.\"terminal_run\"]\nmax_concurrent = 2\nmax_queue = 3\n",
    )
    .unwrap();
    let daemon = Daemon::start_args(
        &redis,
        &[("TERMINAL_ALLOWED_COMMANDS", "sleep"), ("TERMINAL_TIMEOUT_SECONDS", "30")],
        &["--config", config.to_str().unwrap()],
    );
    let mut connection = redis.connection().await;
    let sleep = |request_id: &str, data: Value| request("terminal_run.requested", request_id, data);

    // Two run, two wait: with the old queue, these four held every global slot.
    for call_idx in 0..4 {
        let call = sleep(&format!("r-sleep-{call_idx}"), json!({"command": "sleep 3"}));
        xadd(&mut connection, "action-requests", &call.to_string()).await;
    }
    let echo = request("echo.requested", "r-echo", json!({"message": "not behind the queue"}));
    xadd(&mut connection, "action-requests", &echo.to_string()).await;
    assert_eq!(answer(&mut connection, "action-results", "r-echo").await["data"]["success"], true);
    let results = payloads(&mut connection, "action-results").await;
    assert!(
        (0..4).all(|call_idx| answers_to(&results, &format!("r-sleep-{call_idx}")).is_empty()),
        "echo must be answered while the sleeps still run: {results:#?}"
    );

    // A waiting call whose deadline passes is answered `expired`, not run late.
    let hurried = sleep("r-hurried", json!({"command": "sleep 3", "timeout_ms": 300}));
    xadd(&mut connection, "action-requests", &hurried.to_string()).await;
    let expired = answer(&mut connection, "action-results", "r-hurried").await;
    assert_eq!(expired["data"]["error_code"], "expired", "{expired}");

    // The queue holds three: one more waits, the next is refused with a hint.
    for request_id in ["r-last-a", "r-last-b"] {
        let call = sleep(request_id, json!({"command": "sleep 1"}));
        xadd(&mut connection, "action-requests", &call.to_string()).await;
    }
    let deadline = Instant::now() + WAIT;
    let overloaded = loop {
        let results = payloads(&mut connection, "action-results").await;
        let refused: Vec<Value> = ["r-last-a", "r-last-b"]
            .iter()
            .flat_map(|id| answers_to(&results, id))
            .filter(|answer| answer["data"]["error_code"] == "overloaded")
            .cloned()
            .collect();
        if !refused.is_empty() {
            break refused;
        }
        assert!(Instant::now() < deadline, "no overloaded answer: {results:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(overloaded.len(), 1, "{overloaded:#?}");
    let refused_id = overloaded[0]["data"]["request_id"].as_str().unwrap().to_owned();
    assert!(overloaded[0]["data"]["details"]["retry_after_ms"].as_u64().unwrap() >= 100, "{overloaded:#?}");

    // Everything admitted runs; the refused call, retried with the same id, is answered too.
    settled(&mut connection, "action-requests", "toolhost").await;
    let retry = sleep(&refused_id, json!({"command": "sleep 0"}));
    xadd(&mut connection, "action-requests", &retry.to_string()).await;
    settled(&mut connection, "action-requests", "toolhost").await;
    let results = payloads(&mut connection, "action-results").await;
    for call_idx in 0..4 {
        let answers = answers_to(&results, &format!("r-sleep-{call_idx}"));
        assert_eq!(answers.len(), 1, "{results:#?}");
        assert_eq!(answers[0]["data"]["success"], true, "{answers:#?}");
    }
    let retried = answers_to(&results, &refused_id);
    assert_eq!(retried.len(), 2, "the refusal and the retry's answer: {retried:#?}");
    assert_eq!(retried[1]["data"]["success"], true, "{retried:#?}");
    assert!(daemon.log().contains("\"outcome\":\"overloaded\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_names_no_tool_has_never_become_stats_rows_or_metric_series() {
    let redis = RedisServer::start();
    let daemon = Daemon::start(&redis, &[]);
    let mut connection = redis.connection().await;

    // An answered request id re-sent with a made-up tool is answered with its kept answer (the
    // `replayed` path, which runs nothing); a made-up tool
    // by event type or by tool.invoke takes the unknown-tool path.
    xadd(
        &mut connection,
        "action-requests",
        &request("echo.requested", "r-1", json!({"message": "hi"})).to_string(),
    )
    .await;
    answer(&mut connection, "action-results", "r-1").await;
    for call_idx in 0..10 {
        let name = format!("made-up-{call_idx}-{}", uuid::Uuid::new_v4().simple());
        let invoke = request("tool.invoke", "r-1", json!({"tool": name, "arguments": {}}));
        xadd(&mut connection, "action-requests", &invoke.to_string()).await;
        let invoke = request("tool.invoke", &format!("r-unknown-{call_idx}"), json!({"tool": name}));
        xadd(&mut connection, "action-requests", &invoke.to_string()).await;
        let by_event = request(&format!("{name}.requested"), &format!("r-event-{call_idx}"), json!({}));
        xadd(&mut connection, "action-requests", &by_event.to_string()).await;
    }
    settled(&mut connection, "action-requests", "toolhost").await;
    xadd(&mut connection, "action-requests", &request("tools.stats", "r-stats", json!({})).to_string()).await;
    let stats = answer(&mut connection, "action-results", "r-stats").await;
    let rows: Vec<&String> = stats["data"]["result"]["tools"].as_object().unwrap().keys().collect();
    assert!(rows.iter().all(|name| !name.starts_with("made-up")), "{rows:?}");
    assert!(rows.iter().any(|name| *name == "_unknown"), "{rows:?}");
    let (status, metrics) = http_get(http_addr(&daemon.log()), "/metrics");
    assert_eq!(status, 200);
    assert!(!metrics.contains("made-up"), "{metrics}");
    assert!(metrics.contains(r#"tool="_unknown",outcome="replayed""#), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_and_numeric_request_ids_and_unreadable_numbers_are_answered_invalid_request() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[]);
    let mut connection = redis.connection().await;

    // Twice: an empty id must not be remembered as answered.
    for _ in 0..2 {
        let empty = request("echo.requested", "", json!({"message": "x"}));
        xadd(&mut connection, "action-requests", &empty.to_string()).await;
    }
    let mut numeric = request("echo.requested", "unused", json!({"message": "x"}));
    numeric["data"]["request_id"] = json!(42);
    xadd(&mut connection, "action-requests", &numeric.to_string()).await;
    let header = r#"{"id":"e-1","type":"echo.requested","response_event":"mine.done","data":{"request_id":"REQ","message":VALUE}}"#;
    let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
    let huge = "9".repeat(400);
    for (request_id, value) in [("r-1e400", "1e400"), ("r-digits", huge.as_str()), ("r-deep", deep.as_str())]
    {
        let payload = header.replace("REQ", request_id).replace("VALUE", value);
        xadd(&mut connection, "action-requests", &payload).await;
    }
    settled(&mut connection, "action-requests", "toolhost").await;
    let results = payloads(&mut connection, "action-results").await;
    let empties = answers_to(&results, "");
    assert_eq!(empties.len(), 2, "{results:#?}");
    assert!(empties.iter().all(|answer| answer["data"]["error_code"] == "invalid_request"));
    let numbers = answers_to(&results, "42");
    assert_eq!(numbers.len(), 1, "{results:#?}");
    assert_eq!(numbers[0]["data"]["error_code"], "invalid_request");
    for request_id in ["r-1e400", "r-digits", "r-deep"] {
        let answers = answers_to(&results, request_id);
        assert_eq!(answers.len(), 1, "{request_id}: {results:#?}");
        assert_eq!(answers[0]["data"]["error_code"], "invalid_request");
        assert_eq!(answers[0]["type"], "mine.done");
    }
    assert_eq!(xlen(&mut connection, "dlq:toolhost").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_caller_finds_its_answer_under_a_key_prefix() {
    let redis = RedisServer::start();
    let prefix = [("TOOLHOST__REDIS__KEY_PREFIX", "prod:")];
    let _daemon = Daemon::start(&redis, &prefix);
    let output = Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .args(["call", "echo", "--args", r#"{"message":"prefixed"}"#, "--timeout", "10s"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("REDIS_URL", redis.url())
        .envs(prefix)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("prefixed"), "{stdout}");
    // The answer came on the caller's private stream under the prefix, which it deleted when
    // done; nothing was written under a doubled prefix.
    let mut connection = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut connection).await.unwrap();
    assert!(keys.iter().all(|key| key.starts_with("prod:") && !key.starts_with("prod:prod:")), "{keys:?}");
    assert!(
        !keys.iter().any(|key| key.starts_with("prod:results:")),
        "the private stream is deleted: {keys:?}"
    );
}
