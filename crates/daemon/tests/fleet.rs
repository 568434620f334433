//! Issue 16's fleet: two toolboxes with overlapping and disjoint tools on one requests stream
//! answer every request exactly once, also while one of them is down and after it comes back;
//! a request for a tool nobody hosts is answered once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{
    Daemon, RedisServer, http_addr, http_get, payloads, request, settled_within, temp_dir, xadd,
};

const WAIT: Duration = Duration::from_secs(30);

/// Starts toolbox `id` with `disabled` tools off, a shared command tool, and short heartbeats
/// and leases, so the fleet view and takeovers follow within a second or two.
fn toolbox(redis: &RedisServer, id: &str, disabled: &str) -> Daemon {
    let dir = temp_dir(&format!("fleet-{id}"));
    let path = dir.join("toolhost.toml");
    std::fs::write(
        &path,
        format!(
            "[daemon]\ntoolbox_id = \"{id}\"\nheartbeat_ms = 200\n\n[dispatch]\nclaim_idle_ms = 1000\n\n\
             [tools]\ndisabled = [{disabled}]\n\n\
             [[commands]]\nname = \"shared\"\ndescription = \"Says shared.\"\nargv = [\"echo\", \"shared\"]\n\
             annotations = {{ read_only = true, idempotent = true }}\n"
        ),
    )
    .unwrap();
    Daemon::start_args(redis, &[("TERMINAL_ALLOWED_COMMANDS", "echo")], &["--config", path.to_str().unwrap()])
}

/// Waits until `daemon`'s fleet view lists exactly `toolboxes` as live.
fn wait_for_fleet(daemon: &Daemon, toolboxes: &[&str]) {
    let addr = http_addr(&daemon.log());
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, body) = http_get(addr, "/status");
        let status: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let live: Vec<&str> = status["fleet"]["toolboxes"]
            .as_object()
            .map(|live| live.keys().map(String::as_str).collect())
            .unwrap_or_default();
        if live == toolboxes {
            return;
        }
        assert!(Instant::now() < deadline, "fleet never became {toolboxes:?}: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every answer on `action-results`, by request id.
async fn answers(redis: &RedisServer) -> BTreeMap<String, Vec<Value>> {
    let mut by_id: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for answer in payloads(&mut redis.connection().await, "action-results").await {
        let id = answer["data"]["request_id"].as_str().unwrap_or_default().to_owned();
        by_id.entry(id).or_default().push(answer["data"].clone());
    }
    by_id
}

async fn settle(redis: &RedisServer, groups: &[&str]) {
    let mut connection = redis.connection().await;
    for group in groups {
        settled_within(&mut connection, "action-requests", group, WAIT).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolboxes_sharing_a_stream_answer_every_request_once_also_across_a_restart() {
    let redis = RedisServer::start();
    let a = toolbox(&redis, "a", "\"terminal_run\"");
    let mut b = toolbox(&redis, "b", "\"echo\"");
    wait_for_fleet(&a, &["a", "b"]);
    wait_for_fleet(&b, &["a", "b"]);
    let mut connection = redis.connection().await;
    let mut expected: BTreeMap<String, &str> = BTreeMap::new();
    for index in 0..8 {
        let only_a = request("echo.requested", &format!("echo-{index}"), json!({"message": "a"}));
        let only_b =
            request("terminal_run.requested", &format!("term-{index}"), json!({"command": "echo b"}));
        let both = request("shared.requested", &format!("shared-{index}"), json!({}));
        let nobody = request("nope.requested", &format!("nope-{index}"), json!({}));
        let invoked = request("tool.invoke", &format!("ghost-{index}"), json!({"tool": "ghost"}));
        for (envelope, outcome) in [
            (only_a, "success"),
            (only_b, "success"),
            (both, "success"),
            (nobody, "unknown_tool"),
            (invoked, "unknown_tool"),
        ] {
            expected.insert(envelope["data"]["request_id"].as_str().unwrap().to_owned(), outcome);
            xadd(&mut connection, "action-requests", &envelope.to_string()).await;
        }
    }
    settle(&redis, &["a", "b"]).await;
    let found = answers(&redis).await;
    for (id, outcome) in &expected {
        let all = found.get(id).cloned().unwrap_or_default();
        assert_eq!(all.len(), 1, "{id} answered {} times: {all:?}", all.len());
        let code = all[0]["error_code"].as_str().unwrap_or("success");
        assert_eq!(code, *outcome, "{id}: {all:?}");
    }

    // B goes down: its tool is answered `tool_disabled` by A, once; when B is back it does not
    // answer that entry again, and serves its tool again.
    b.kill9();
    wait_for_fleet(&a, &["a"]);
    let down = request("terminal_run.requested", "term-down", json!({"command": "echo b"}));
    xadd(&mut connection, "action-requests", &down.to_string()).await;
    settle(&redis, &["a"]).await;
    let b = toolbox(&redis, "b", "\"echo\"");
    wait_for_fleet(&a, &["a", "b"]);
    let up = request("terminal_run.requested", "term-up", json!({"command": "echo b"}));
    xadd(&mut connection, "action-requests", &up.to_string()).await;
    settle(&redis, &["a", "b"]).await;
    let found = answers(&redis).await;
    assert_eq!(found["term-down"].len(), 1, "{:?}", found["term-down"]);
    assert_eq!(found["term-down"][0]["error_code"], "tool_disabled");
    assert_eq!(found["term-up"].len(), 1, "{:?}", found["term-up"]);
    assert_eq!(found["term-up"][0]["success"], true, "{:?}\n{}", found["term-up"], b.log());
    assert_eq!(found.values().map(Vec::len).sum::<usize>(), expected.len() + 2, "no other answer");
}

/// The fleet is found through the set of heartbeat keys, never by walking the keyspace: with a
/// day of answered marks retained, a `SCAN` per heartbeat would visit every one of them. A
/// replica that dies without withdrawing is dropped from the set by the next reader; one taken
/// for dead while alive lists itself again and rewrites its registry; one that stops cleanly
/// takes itself off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_is_read_from_its_set_without_scanning_and_dead_replicas_leave_it() {
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    // Keys a SCAN would have to walk past.
    for batch in 0..20 {
        let mut pipe = redis::pipe();
        for index in 0..500 {
            pipe.set(format!("toolhost:ledger:action-requests:answered:{batch}-{index}"), "x").ignore();
        }
        let () = pipe.query_async(&mut connection).await.unwrap();
    }
    let mut db = toolbox(&redis, "db", "");
    let mut web = toolbox(&redis, "web", "");
    wait_for_fleet(&db, &["db", "web"]);
    wait_for_fleet(&web, &["db", "web"]);
    let () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut connection).await.unwrap();
    // Ten heartbeats of each replica.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut connection).await.unwrap();
    assert!(stats.contains("cmdstat_smembers"), "{stats}");
    assert!(!stats.contains("cmdstat_scan"), "the fleet view walks the keyspace: {stats}");
    assert!(!stats.contains("cmdstat_keys"), "{stats}");

    let members = |connection: &mut redis::aio::MultiplexedConnection| {
        let mut connection = connection.clone();
        async move {
            let members: Vec<String> =
                redis::cmd("SMEMBERS").arg("toolhost:fleet").query_async(&mut connection).await.unwrap();
            members
                .into_iter()
                .map(|key| key.split(':').nth(2).unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let mut found = members(&mut connection).await;
    found.sort();
    assert_eq!(found, ["db", "web"]);

    // Taken for dead by a reader that saw its heartbeat missing (paused past it), with its
    // registry removed by a sibling's withdrawal meanwhile: the next beat lists it again and
    // writes the registry back.
    let web_key: String = {
        let members: Vec<String> =
            redis::cmd("SMEMBERS").arg("toolhost:fleet").query_async(&mut connection).await.unwrap();
        members.into_iter().find(|key| key.starts_with("toolhost:heartbeat:web:")).unwrap()
    };
    let _: u64 =
        redis::cmd("SREM").arg("toolhost:fleet").arg(&web_key).query_async(&mut connection).await.unwrap();
    let _: u64 = redis::cmd("DEL").arg("toolhost:registry:web").query_async(&mut connection).await.unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let back: (bool, bool) = redis::pipe()
            .sismember("toolhost:fleet", &web_key)
            .exists("toolhost:registry:web")
            .query_async(&mut connection)
            .await
            .unwrap();
        if back == (true, true) {
            break;
        }
        assert!(Instant::now() < deadline, "web was not listed again with its registry: {back:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Killed: its heartbeat expires and the survivor drops it from the set and the fleet.
    web.kill9();
    wait_for_fleet(&db, &["db"]);
    let deadline = Instant::now() + WAIT;
    while members(&mut connection).await != ["db"] {
        assert!(Instant::now() < deadline, "the dead replica stayed in the fleet set");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Stopped cleanly: it takes itself off, with its registry.
    assert_eq!(db.terminate(WAIT), Some(0));
    assert!(members(&mut connection).await.is_empty());
    let registry: bool =
        redis::cmd("EXISTS").arg("toolhost:registry:db").query_async(&mut connection).await.unwrap();
    assert!(!registry, "the last replica of db left its registry behind");
}
