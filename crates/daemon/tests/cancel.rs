//! `tool.cancel`: a running call is stopped (its command's process group killed) and answered
//! `cancelled` once, the cancel itself answered `cancelling`, `answered` or `unknown`; the
//! cancel reaches the call when another replica reads it, for calls with and without a call
//! record, and while the call waits in its tool's queue.

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};

use crate::support::{
    Daemon, RedisServer, http_addr, http_get, payloads, processes, request, settled_within, temp_dir, xadd,
};

const WAIT: Duration = Duration::from_secs(30);

/// Two command tools that sleep `seconds` twice (one sleep in the background, so the kill must
/// reach the whole group): `slow` (tracked by the ledger) and `slow_ro` (read-only and
/// idempotent, so run without a call record).
const SLOW_TOOLS: &str = r#"
[[commands]]
name = "slow"
description = "Sleeps, with a second sleep in the background."
argv = ["sh", "-c", "sleep $0 & sleep $0", "{seconds}"]
argument_schema = { type = "object", properties = { seconds = { type = "string" } }, required = ["seconds"] }
timeout_ms = 120000

[[commands]]
name = "slow_ro"
description = "Sleeps, with a second sleep in the background; changes nothing."
argv = ["sh", "-c", "sleep $0 & sleep $0", "{seconds}"]
argument_schema = { type = "object", properties = { seconds = { type = "string" } }, required = ["seconds"] }
annotations = { read_only = true, idempotent = true }
timeout_ms = 120000
"#;

/// A daemon with the slow tools and `extra` configuration before them.
fn daemon(redis: &RedisServer, name: &str, extra: &str) -> Daemon {
    let dir = temp_dir(&format!("cancel-{name}"));
    let path = dir.join("toolhost.toml");
    std::fs::write(&path, format!("{extra}\n{SLOW_TOOLS}")).unwrap();
    Daemon::start_args(redis, &[], &["--config", path.to_str().unwrap()])
}

/// Sends a call of `tool` sleeping `seconds`.
async fn call(connection: &mut MultiplexedConnection, tool: &str, request_id: &str, seconds: &str) {
    let call = request(&format!("{tool}.requested"), request_id, json!({"seconds": seconds}));
    xadd(connection, "action-requests", &call.to_string()).await;
}

/// Sends `tool.cancel` for `request_id`.
async fn cancel(connection: &mut MultiplexedConnection, request_id: &str) {
    xadd(connection, "action-requests", &request("tool.cancel", request_id, json!({})).to_string()).await;
}

/// The entries of `action-results` of type `event_type` for `request_id`.
async fn answers(connection: &mut MultiplexedConnection, request_id: &str, event_type: &str) -> Vec<Value> {
    payloads(connection, "action-results")
        .await
        .into_iter()
        .filter(|answer| answer["data"]["request_id"] == request_id && answer["type"] == event_type)
        .collect()
}

/// Waits for the first entry of `action-results` of type `event_type` for `request_id`.
async fn answer(connection: &mut MultiplexedConnection, request_id: &str, event_type: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(found) = answers(connection, request_id, event_type).await.into_iter().next() {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "no {event_type} for {request_id}: {:#?}",
            payloads(connection, "action-results").await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The state a cancel of `request_id` was answered with (waiting for the answer).
async fn cancel_state(connection: &mut MultiplexedConnection, request_id: &str) -> String {
    let found = answer(connection, request_id, "tool.cancel.completed").await;
    assert_eq!(found["data"]["success"], true, "{found}");
    assert_eq!(found["data"]["result"]["request_id"], request_id, "{found}");
    found["data"]["result"]["state"].as_str().unwrap_or_default().to_owned()
}

/// Waits until `sleep <seconds>` runs (`true`) or no longer runs (`false`).
async fn wait_sleeping(seconds: &str, running: bool) {
    let deadline = Instant::now() + WAIT;
    while processes(&["sleep", seconds]).is_empty() == running {
        assert!(
            Instant::now() < deadline,
            "sleep {seconds} never {}",
            if running { "started" } else { "ended" }
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn settle(connection: &mut MultiplexedConnection) {
    settled_within(connection, "action-requests", "toolhost", WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_command_is_killed_and_answered_cancelled_once_and_later_cancels_change_nothing() {
    let redis = RedisServer::start();
    let _daemon = daemon(&redis, "command", "");
    let mut connection = redis.connection().await;

    call(&mut connection, "slow", "c-1", "61.1").await;
    wait_sleeping("61.1", true).await;
    cancel(&mut connection, "c-1").await;
    assert_eq!(cancel_state(&mut connection, "c-1").await, "cancelling");
    let cancelled = answer(&mut connection, "c-1", "slow.requested.completed").await;
    assert_eq!(cancelled["data"]["error_code"], "cancelled", "{cancelled}");
    // The whole group is gone, the background sleep included.
    wait_sleeping("61.1", false).await;

    // Once answered, a cancel finds the answer; an id nobody sent is unknown.
    cancel(&mut connection, "c-1").await;
    cancel(&mut connection, "never-sent").await;
    settle(&mut connection).await;
    assert_eq!(answers(&mut connection, "c-1", "slow.requested.completed").await.len(), 1);
    let states: Vec<Value> = answers(&mut connection, "c-1", "tool.cancel.completed")
        .await
        .iter()
        .map(|found| found["data"]["result"]["state"].clone())
        .collect();
    assert_eq!(states, [json!("cancelling"), json!("answered")]);
    assert_eq!(cancel_state(&mut connection, "never-sent").await, "unknown");
    assert_eq!(answers(&mut connection, "never-sent", "tool.cancel.completed").await.len(), 1);
    // `cancelled` is final: the same call sent again is not run again; it is answered with the
    // original answer.
    call(&mut connection, "slow", "c-1", "61.1").await;
    settle(&mut connection).await;
    let again = answers(&mut connection, "c-1", "slow.requested.completed").await;
    assert_eq!(again.len(), 2, "{again:?}");
    assert_eq!(again[1]["data"], again[0]["data"], "{again:?}");
    assert!(processes(&["sleep", "61.1"]).is_empty(), "the command ran again");

    // A cancel without the id of a call is refused.
    let bare = json!({"id": uuid::Uuid::new_v4().to_string(), "type": "tool.cancel", "data": {}});
    xadd(&mut connection, "action-requests", &bare.to_string()).await;
    settle(&mut connection).await;
    let refused: Vec<Value> = payloads(&mut connection, "action-results")
        .await
        .into_iter()
        .filter(|found| found["type"] == "tool.cancel.completed" && found["data"]["success"] == false)
        .collect();
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0]["data"]["error_code"], "invalid_request", "{refused:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_in_its_tools_queue_is_cancelled_without_running() {
    let redis = RedisServer::start();
    let _daemon = daemon(&redis, "queue", "[tools.limits.\"slow\"]\nmax_concurrent = 1\nmax_queue = 1\n");
    let mut connection = redis.connection().await;

    call(&mut connection, "slow", "q-1", "62.1").await;
    wait_sleeping("62.1", true).await;
    // One of these two waits in the queue, the other finds it full.
    call(&mut connection, "slow", "q-2", "62.2").await;
    call(&mut connection, "slow", "q-3", "62.3").await;
    let deadline = Instant::now() + WAIT;
    let queued = loop {
        let two = answers(&mut connection, "q-2", "slow.requested.completed").await;
        let three = answers(&mut connection, "q-3", "slow.requested.completed").await;
        match (two.first(), three.first()) {
            (Some(refused), None) if refused["data"]["error_code"] == "overloaded" => break ("q-3", "62.3"),
            (None, Some(refused)) if refused["data"]["error_code"] == "overloaded" => break ("q-2", "62.2"),
            _ => assert!(Instant::now() < deadline, "neither was refused: {two:?} {three:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    cancel(&mut connection, queued.0).await;
    assert_eq!(cancel_state(&mut connection, queued.0).await, "cancelling");
    let cancelled = answer(&mut connection, queued.0, "slow.requested.completed").await;
    assert_eq!(cancelled["data"]["error_code"], "cancelled", "{cancelled}");
    // The queued call never ran: the only run slot is still taken by q-1.
    assert!(!processes(&["sleep", "62.1"]).is_empty(), "q-1 must still run");
    assert!(processes(&["sleep", queued.1]).is_empty());
    assert!(answers(&mut connection, "q-1", "slow.requested.completed").await.is_empty());

    cancel(&mut connection, "q-1").await;
    let cancelled = answer(&mut connection, "q-1", "slow.requested.completed").await;
    assert_eq!(cancelled["data"]["error_code"], "cancelled", "{cancelled}");
    settle(&mut connection).await;
    assert_eq!(answers(&mut connection, queued.0, "slow.requested.completed").await.len(), 1);
    assert!(processes(&["sleep", queued.1]).is_empty(), "the cancelled call ran after all");
}

/// Waits until `daemon`'s fleet view lists `replicas` replicas of the toolbox `toolhost`.
fn wait_for_replicas(daemon: &Daemon, replicas: usize) {
    let addr = http_addr(&daemon.log());
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, body) = http_get(addr, "/status");
        let status: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let live = status["fleet"]["toolboxes"]["toolhost"].as_array().map_or(0, Vec::len);
        if live == replicas {
            return;
        }
        assert!(Instant::now() < deadline, "the fleet never had {replicas} replicas: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_read_by_another_replica_reaches_the_call_with_or_without_a_call_record() {
    let redis = RedisServer::start();
    let fast_beats = "[daemon]\nheartbeat_ms = 200\n";
    // Three slots: the inbox's reader holds one and the two calls the others, so this replica
    // reads nothing more while they run, and the cancels can only reach it forwarded.
    let running = daemon(&redis, "owner", &format!("{fast_beats}\n[dispatch]\nmax_in_flight = 3\n"));
    let mut connection = redis.connection().await;
    call(&mut connection, "slow", "tracked", "63.1").await;
    call(&mut connection, "slow_ro", "untracked", "63.2").await;
    wait_sleeping("63.1", true).await;
    wait_sleeping("63.2", true).await;

    let other = daemon(&redis, "other", fast_beats);
    wait_for_replicas(&running, 2);
    wait_for_replicas(&other, 2);
    cancel(&mut connection, "tracked").await;
    cancel(&mut connection, "untracked").await;
    assert_eq!(cancel_state(&mut connection, "tracked").await, "cancelling");
    // No call record: only the replica running it could say so.
    assert_eq!(cancel_state(&mut connection, "untracked").await, "cancelling");
    for (request_id, tool, seconds) in [("tracked", "slow", "63.1"), ("untracked", "slow_ro", "63.2")] {
        let cancelled = answer(&mut connection, request_id, &format!("{tool}.requested.completed")).await;
        assert_eq!(cancelled["data"]["error_code"], "cancelled", "{cancelled}");
        wait_sleeping(seconds, false).await;
    }
    settle(&mut connection).await;
    for (request_id, tool) in [("tracked", "slow"), ("untracked", "slow_ro")] {
        assert_eq!(
            answers(&mut connection, request_id, &format!("{tool}.requested.completed")).await.len(),
            1
        );
        assert_eq!(answers(&mut connection, request_id, "tool.cancel.completed").await.len(), 1);
    }
    // The other replica read both cancels; the one running the calls read none.
    let handled = |log: &str| log.lines().filter(|line| line.contains("\"tool\":\"tool.cancel\"")).count();
    assert_eq!(handled(&other.log()), 2, "{}", other.log());
    assert_eq!(handled(&running.log()), 0, "{}", running.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_in_toolhost_call_cancels_the_call_and_prints_its_cancelled_answer() {
    let redis = RedisServer::start();
    let _daemon = daemon(&redis, "client", "");
    let mut client = std::process::Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .args(["call", "slow", "--args", r#"{"seconds": "65.1"}"#, "--timeout", "60s"])
        .env_clear()
        .env("REDIS_URL", redis.url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_sleeping("65.1", true).await;
    crate::support::signal(client.id() as i32, libc::SIGINT);
    let deadline = Instant::now() + WAIT;
    while client.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "toolhost call did not end after Ctrl-C");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let output = client.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    let printed: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(printed["error_code"], "cancelled", "{stdout}");
    assert!(stderr.contains("interrupted; cancelling call"), "{stderr}");
    wait_sleeping("65.1", false).await;
}
