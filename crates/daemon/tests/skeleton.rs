//! Issue 2's promise end to end: the real binary against a real redis-server.

use std::time::Duration;

use serde_json::json;

use crate::support::{Daemon, RedisServer, answers_to, pending, request, settled, wait_for, xadd};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_answered_once_and_bad_input_is_dead_lettered() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[]);
    let mut connection = redis.connection().await;

    let mut echo = request("echo.requested", "r-1", json!({"message": "hello"}));
    echo["response_event"] = json!("my.echo.done");
    echo["trace_id"] = json!("t-1");
    xadd(&mut connection, "action-requests", &echo.to_string()).await;
    let invoke =
        request("tool.invoke", "r-2", json!({"tool": "echo", "arguments": {"message": "via invoke"}}));
    xadd(&mut connection, "action-requests", &invoke.to_string()).await;
    let mut custom = request("echo.requested", "r-3", json!({"message": "elsewhere"}));
    custom["response_topic"] = json!("results:mine");
    xadd(&mut connection, "action-requests", &custom.to_string()).await;
    xadd(&mut connection, "action-requests", "not json").await;
    xadd(&mut connection, "action-requests", "[1,2,3]").await;
    let unknown = request("nope.requested", "r-4", json!({}));
    xadd(&mut connection, "action-requests", &unknown.to_string()).await;
    let after = request("echo.requested", "r-5", json!({"message": "still serving"}));
    xadd(&mut connection, "action-requests", &after.to_string()).await;

    let results = wait_for(&mut connection, "action-results", 4, WAIT).await;
    assert_eq!(results.len(), 4, "{results:#?}");
    let first = answers_to(&results, "r-1");
    assert_eq!(first.len(), 1);
    let first = first[0];
    assert_eq!(first["type"], "my.echo.done");
    assert_eq!(first["topic"], "action-results");
    assert_eq!(first["source"], "toolhost:toolhost");
    assert_eq!(first["specversion"], "1.0");
    assert_eq!(first["correlation_id"], "c-r-1");
    assert_eq!(first["tenant_id"], "acme");
    assert_eq!(first["user_id"], "u-7");
    assert_eq!(first["session_id"], "s-1");
    assert_eq!(first["trace_id"], "t-1");
    assert_eq!(first["data"], json!({"request_id": "r-1", "success": true, "result": {"message": "hello"}}));
    assert!(uuid::Uuid::parse_str(first["id"].as_str().unwrap()).is_ok());

    let second = answers_to(&results, "r-2");
    assert_eq!(second.len(), 1);
    assert_eq!(second[0]["type"], "tool.invoke.completed");
    assert_eq!(second[0]["data"]["result"], json!({"message": "via invoke"}));

    let unknown = answers_to(&results, "r-4")[0];
    assert_eq!(unknown["data"]["success"], false);
    assert_eq!(unknown["data"]["error_code"], "unknown_tool");
    assert_eq!(answers_to(&results, "r-5")[0]["data"]["result"], json!({"message": "still serving"}));

    let custom = wait_for(&mut connection, "results:mine", 1, WAIT).await;
    assert_eq!(custom.len(), 1);
    assert_eq!(custom[0]["topic"], "results:mine");
    assert_eq!(custom[0]["data"]["result"], json!({"message": "elsewhere"}));

    let dead = wait_for(&mut connection, "dlq:toolhost", 2, WAIT).await;
    assert_eq!(dead.len(), 2, "{dead:#?}");
    // Entries are handled concurrently, so dead letters may land in either order.
    let letter = |payload: &str| dead.iter().find(|letter| letter["payload"] == payload).unwrap();
    assert!(letter("not json")["error"].as_str().unwrap().contains("not JSON"));
    assert!(letter("[1,2,3]")["error"].as_str().unwrap().contains("not a JSON object"));

    // Every entry handled and acked, so every answer there will be is there: exactly one each.
    settled(&mut connection, "action-requests", "toolhost").await;
    assert_eq!(wait_for(&mut connection, "action-results", 5, Duration::ZERO).await.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_payloads_are_dead_lettered_and_serving_goes_on() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[("TOOLHOST__STREAMS__MAX_PAYLOAD_BYTES", "1024")]);
    let mut connection = redis.connection().await;
    let big = request("echo.requested", "big", json!({"message": "x".repeat(4096)}));
    xadd(&mut connection, "action-requests", &big.to_string()).await;
    let small = request("echo.requested", "small", json!({"message": "ok"}));
    xadd(&mut connection, "action-requests", &small.to_string()).await;
    let results = wait_for(&mut connection, "action-results", 1, WAIT).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["data"]["request_id"], "small");
    let dead = wait_for(&mut connection, "dlq:toolhost", 1, WAIT).await;
    assert!(dead[0]["error"].as_str().unwrap().contains("exceeds the limit of 1024 bytes"), "{dead:?}");
    assert_eq!(pending(&mut connection, "action-requests", "toolhost").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_zero_and_removes_the_heartbeat() {
    let redis = RedisServer::start();
    let mut daemon = Daemon::start(&redis, &[]);
    let mut connection = redis.connection().await;
    let mut registry: Vec<String> =
        redis::cmd("HKEYS").arg("toolhost:registry:toolhost").query_async(&mut connection).await.unwrap();
    registry.sort();
    assert_eq!(registry, ["chat_send", "echo", "terminal_run"]);
    let beats: Vec<String> =
        redis::cmd("KEYS").arg("toolhost:heartbeat:toolhost:*").query_async(&mut connection).await.unwrap();
    assert_eq!(beats.len(), 1);
    assert_eq!(daemon.terminate(Duration::from_secs(15)), Some(0));
    let beats: Vec<String> =
        redis::cmd("KEYS").arg("toolhost:heartbeat:toolhost:*").query_async(&mut connection).await.unwrap();
    assert!(beats.is_empty());
    let exists: u8 =
        redis::cmd("EXISTS").arg("toolhost:registry:toolhost").query_async(&mut connection).await.unwrap();
    assert_eq!(exists, 0);
}
