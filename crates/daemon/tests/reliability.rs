//! Issue 6's promise under fault injection: every request is answered exactly once while daemons
//! are killed, paused and stopped, Redis restarts or stalls, and entries are delivered twice.
//!
//! Real redis-server and real `toolhost` processes. Slow calls are `terminal_run` with `sleep`
//! (not idempotent: a call whose holder died is answered `interrupted`, never run twice); fast
//! ones are `echo` (idempotent: run again). The tests take one lock, so their timing does not
//! depend on each other's load; leases are short (`CLAIM_IDLE_MS=1000`) so takeovers are quick.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use toolhost_bus::{
    CallKeys, CallStart, Committed, EntryRef, Finish, Groups, Ledger, Published, RedisBus, RedisOptions,
    Streams,
};

use crate::support::{
    Daemon, RedisServer, answer, call_r1, deliver_one, payloads, pending, request, settled, wait_for, xadd,
};

const REQUESTS: &str = "action-requests";
const RESULTS: &str = "action-results";
const GROUP: &str = "toolhost";
const DEAD_LETTERS: &str = "dlq:toolhost";
const WAIT: Duration = Duration::from_secs(20);

/// One fault-injection test at a time: each starts several processes on two shared cores.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// Short leases, `sleep` allowed, enough terminal slots for the slow calls.
const FAST: &[(&str, &str)] = &[
    ("TOOLHOST__DISPATCH__CLAIM_IDLE_MS", "1000"),
    ("TOOLHOST__DISPATCH__BLOCK_MS", "500"),
    ("TERMINAL_ALLOWED_COMMANDS", "sleep"),
    ("TERMINAL_MAX_CONCURRENT", "16"),
];

fn env(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    FAST.iter().chain(extra).copied().collect()
}

fn echo(request_id: &str) -> Value {
    request("echo.requested", request_id, json!({"message": request_id}))
}

fn sleep(request_id: &str, seconds: u32) -> Value {
    request("terminal_run.requested", request_id, json!({"command": format!("sleep {seconds}")}))
}

async fn send(connection: &mut MultiplexedConnection, payload: &Value) -> String {
    xadd(connection, REQUESTS, &payload.to_string()).await
}

/// Adds `payloads` to the requests stream in one transaction: Redis wakes a blocked group read
/// once for all of them, so one read delivers them together.
async fn send_together(connection: &mut MultiplexedConnection, payloads: &[Value]) {
    let mut transaction = redis::pipe();
    transaction.atomic();
    for payload in payloads {
        transaction
            .cmd("XADD")
            .arg(REQUESTS)
            .arg("*")
            .arg("id")
            .arg(uuid::Uuid::new_v4().to_string())
            .arg("payload")
            .arg(payload.to_string())
            .ignore();
    }
    let _: () = transaction.query_async(connection).await.unwrap();
}

/// Answers on `action-results`, counted per request id.
async fn answer_counts(connection: &mut MultiplexedConnection) -> BTreeMap<String, Vec<Value>> {
    let mut answers: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut start = "-".to_owned();
    loop {
        let page: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(RESULTS)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            // Small pages: a large reply can outlast the client's response timeout on a busy host.
            .arg(1_000)
            .query_async(connection)
            .await
            .unwrap();
        let Some((last, _)) = page.last() else { return answers };
        start = format!("({last}");
        for (_, fields) in page {
            let payload = fields.into_iter().find(|(name, _)| name == "payload").unwrap().1;
            let answer: Value = serde_json::from_str(&payload).unwrap();
            let request_id = answer["data"]["request_id"].as_str().unwrap().to_owned();
            answers.entry(request_id).or_default().push(answer);
        }
    }
}

/// Waits until every id in `ids` is answered and every request entry is handled and acked (so
/// no late duplicate can still come), then asserts each was answered exactly once and nothing
/// else was. Returns the answers.
async fn assert_answered_once(
    connection: &mut MultiplexedConnection,
    ids: &[String],
    daemons: &[&Daemon],
) -> BTreeMap<String, Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let answers = answer_counts(connection).await;
        if ids.iter().all(|id| answers.contains_key(id)) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    crate::support::settled_within(connection, REQUESTS, GROUP, WAIT).await;
    let answers = answer_counts(connection).await;
    let missing: Vec<&String> = ids.iter().filter(|id| !answers.contains_key(*id)).collect();
    let doubled: Vec<(&String, usize)> =
        answers.iter().filter(|(_, all)| all.len() > 1).map(|(id, all)| (id, all.len())).collect();
    let expected: HashSet<&String> = ids.iter().collect();
    let strangers: Vec<&String> = answers.keys().filter(|id| !expected.contains(id)).collect();
    if !missing.is_empty() || !doubled.is_empty() || !strangers.is_empty() {
        for daemon in daemons {
            eprintln!("---- daemon log ----\n{}", daemon.log());
        }
        panic!(
            "missing answers: {missing:?}; answered more than once: {doubled:?}; unexpected: {strangers:?}"
        );
    }
    answers.into_iter().map(|(id, mut all)| (id, all.remove(0))).collect()
}

fn ids(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|index| format!("{prefix}-{index}")).collect()
}

async fn count_keys(connection: &mut MultiplexedConnection, pattern: &str) -> usize {
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query_async(connection).await.unwrap();
    keys.len()
}

/// Waits until `count` calls have been begun (their call records exist).
async fn wait_for_calls(connection: &mut MultiplexedConnection, count: usize) {
    let deadline = Instant::now() + WAIT;
    while count_keys(connection, "toolhost:ledger:*:call:*").await < count {
        assert!(Instant::now() < deadline, "calls did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `invocation` log lines of a daemon, as (request id, outcome).
fn outcomes(daemon: &Daemon) -> Vec<(String, String)> {
    daemon
        .log()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["message"] == "invocation")
        .map(|line| {
            (
                line["request_id"].as_str().unwrap_or("").to_owned(),
                line["outcome"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn outcomes_of(daemons: &[&Daemon], request_id: &str) -> Vec<String> {
    let mut found: Vec<String> = daemons
        .iter()
        .flat_map(|daemon| outcomes(daemon))
        .filter(|(id, _)| id == request_id)
        .map(|(_, outcome)| outcome)
        .collect();
    found.sort();
    found
}

/// Waits until one of `daemons` logged `outcome` for `request_id`.
async fn wait_for_outcome(daemons: &[&Daemon], request_id: &str, outcome: &str) {
    let deadline = Instant::now() + WAIT;
    while !outcomes_of(daemons, request_id).iter().any(|found| found == outcome) {
        assert!(
            Instant::now() < deadline,
            "no {outcome} for {request_id}: {:?}",
            outcomes_of(daemons, request_id)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn consumer_name(daemon: &Daemon) -> String {
    daemon
        .log()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["message"] == "ready")
        .and_then(|line| line["consumer"].as_str().map(str::to_owned))
        .unwrap()
}

async fn consumers(connection: &mut MultiplexedConnection) -> Vec<String> {
    let reply: Vec<Vec<redis::Value>> =
        redis::cmd("XINFO").arg("CONSUMERS").arg(REQUESTS).arg(GROUP).query_async(connection).await.unwrap();
    reply
        .into_iter()
        .filter_map(|fields| redis::from_redis_value::<String>(fields.get(1)?.clone()).ok())
        .collect()
}

/// Waits until no entry is pending and no call record is left, for at most a few seconds: an
/// entry acked without an answer (a duplicate) may still be on its way when the last answer is
/// read. Fails naming what is left.
async fn assert_settled(connection: &mut MultiplexedConnection) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = pending(connection, REQUESTS, GROUP).await;
        let records: Vec<String> =
            redis::cmd("KEYS").arg("toolhost:ledger:*:call:*").query_async(&mut *connection).await.unwrap();
        if left == 0 && records.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            let details: redis::Value = redis::cmd("XPENDING")
                .arg(REQUESTS)
                .arg(GROUP)
                .arg("-")
                .arg("+")
                .arg(10)
                .query_async(&mut *connection)
                .await
                .unwrap();
            let mut record_fields = Vec::new();
            for record in &records {
                let fields: Vec<(String, String)> =
                    redis::cmd("HGETALL").arg(record).query_async(&mut *connection).await.unwrap();
                record_fields.push((record.clone(), fields));
            }
            panic!(
                "not settled: {left} entries left pending ({details:?}), call records left behind: {record_fields:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn error_code(answer: &Value) -> &str {
    answer["data"]["error_code"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_with_calls_in_flight_a_replica_answers_each_once() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut first = Daemon::start(&redis, &env(&[]));
    let mut connection = redis.connection().await;
    let fast = ids("fast", 10);
    for id in &fast {
        send(&mut connection, &echo(id)).await;
    }
    crate::support::wait_for(&mut connection, RESULTS, fast.len(), WAIT).await;
    let slow = ids("slow", 4);
    for id in &slow {
        send(&mut connection, &sleep(id, 3)).await;
    }
    wait_for_calls(&mut connection, slow.len()).await;
    first.kill9();
    let late = ids("late", 5);
    for id in &late {
        send(&mut connection, &echo(id)).await;
    }
    let second = Daemon::start(&redis, &env(&[]));
    let all: Vec<String> = [slow.clone(), fast, late].concat();
    let answers = assert_answered_once(&mut connection, &all, &[&first, &second]).await;
    for id in &slow {
        // Started by the killed daemon: not repeated, since terminal_run is not idempotent.
        assert_eq!(error_code(&answers[id]), "interrupted", "{}", answers[id]);
    }
    assert_settled(&mut connection).await;
}

/// A chat message to toolhost's inbox carrying one tool call.
fn chat_call(conversation_id: &str, tool: &str, arguments: Value) -> Value {
    json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "conversation_id": conversation_id,
        "sender": "user:alice",
        "recipient": "agent:ToolHost",
        "type": "message",
        "content": "",
        "metadata": {"tool_call": {"name": tool, "arguments": arguments, "id": uuid::Uuid::new_v4().to_string()}},
        "created_at": chrono::Utc::now().to_rfc3339(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_inbox_kill9_with_calls_in_flight_a_replica_replies_to_each_once() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut first = Daemon::start(&redis, &env(&[]));
    let mut connection = redis.connection().await;
    let fast = chat_call("conv-r", "echo", json!({"message": "hi"}));
    xadd(&mut connection, "chat:ToolHost", &fast.to_string()).await;
    crate::support::wait_for(&mut connection, "chat:conv-r", 1, WAIT).await;
    let slow: Vec<Value> =
        (0..2).map(|_| chat_call("conv-r", "terminal_run", json!({"command": "sleep 3"}))).collect();
    for message in &slow {
        xadd(&mut connection, "chat:ToolHost", &message.to_string()).await;
    }
    wait_for_calls(&mut connection, slow.len()).await;
    first.kill9();
    let second = Daemon::start(&redis, &env(&[]));
    crate::support::wait_for(&mut connection, "chat:conv-r", 3, WAIT).await;
    crate::support::settled_within(&mut connection, "chat:ToolHost", GROUP, WAIT).await;
    let replies = crate::support::payloads(&mut connection, "chat:conv-r").await;
    let replied_to: Vec<&str> =
        replies.iter().filter_map(|reply| reply["metadata"]["in_reply_to"].as_str()).collect();
    assert_eq!(replies.len(), 3, "{replies:#?}\n{}\n{}", first.log(), second.log());
    for message in &slow {
        let id = message["id"].as_str().unwrap();
        assert_eq!(replied_to.iter().filter(|reply| **reply == id).count(), 1, "{replies:#?}");
        let reply = replies.iter().find(|reply| reply["metadata"]["in_reply_to"] == id).unwrap();
        assert_eq!(reply["metadata"]["error_code"], "interrupted", "{reply}");
    }
    assert_eq!(pending(&mut connection, "chat:ToolHost", GROUP).await, 0);
    assert_eq!(count_keys(&mut connection, "toolhost:ledger:*:call:*").await, 0);
}

/// Creates the daemon's group before any daemon runs, as a crashed holder would have found it.
async fn create_group(connection: &mut MultiplexedConnection) {
    let _: redis::Value = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(REQUESTS)
        .arg(GROUP)
        .arg("$")
        .arg("MKSTREAM")
        .query_async(connection)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_call_is_run_again_only_if_idempotent() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    create_group(&mut connection).await;
    // A holder that read two requests, began both calls and died: its entries stay pending and
    // its call records keep a lease that has lapsed.
    for (request_id, payload) in [("idem-1", echo("idem-1")), ("nonidem-1", sleep("nonidem-1", 1))] {
        let entry_id = send(&mut connection, &payload).await;
        let _: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg("crashed")
            .arg("COUNT")
            .arg(1)
            .arg("STREAMS")
            .arg(REQUESTS)
            .arg(">")
            .query_async(&mut connection)
            .await
            .unwrap();
        let _: redis::Value = redis::cmd("HSET")
            .arg(format!("toolhost:ledger:action-requests:call:{request_id}"))
            .arg("owner")
            .arg(format!("crashed/{entry_id}"))
            .arg("lease_until")
            .arg(0)
            .arg("entry")
            .arg(&entry_id)
            .query_async(&mut connection)
            .await
            .unwrap();
    }
    // Fewer slots than a read batch: the reader, blocked on the idle stream, holds them all, and
    // the reclaimer must still get its turn.
    let daemon = Daemon::start(&redis, &env(&[("TOOLHOST__DISPATCH__MAX_IN_FLIGHT", "2")]));
    let all = ["idem-1".to_owned(), "nonidem-1".to_owned()];
    let answers = assert_answered_once(&mut connection, &all, &[&daemon]).await;
    assert_eq!(answers["idem-1"]["data"]["result"], json!({"message": "idem-1"}));
    assert_eq!(error_code(&answers["nonidem-1"]), "interrupted");
    assert_settled(&mut connection).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_with_aof_mid_stream_every_request_is_answered_once() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start_with(true);
    let first = Daemon::start(&redis, &env(&[]));
    let second = Daemon::start(&redis, &env(&[]));
    let mut connection = redis.connection().await;
    let before = ids("before", 150);
    let slow = ids("slow", 3);
    for id in &slow {
        send(&mut connection, &sleep(id, 1)).await;
    }
    for id in &before {
        send(&mut connection, &echo(id)).await;
    }
    redis.kill();
    // The fault itself: Redis stays down this long while the daemons retry. No condition to
    // await; the point is that time passes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    redis.restart();
    let mut connection = redis.connection().await;
    let after = ids("after", 150);
    for id in &after {
        send(&mut connection, &echo(id)).await;
    }
    let all: Vec<String> = [before, slow, after].concat();
    assert_answered_once(&mut connection, &all, &[&first, &second]).await;
    assert_settled(&mut connection).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_without_its_data_the_group_is_recreated_and_nothing_is_lost() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let daemon = Daemon::start(&redis, &env(&[]));
    // Held still so the requests below reach the new, empty Redis before the daemon does.
    daemon.signal(libc::SIGSTOP);
    redis.restart();
    let mut connection = redis.connection().await;
    let all = ids("after-loss", 5);
    for id in &all {
        send(&mut connection, &echo(id)).await;
    }
    daemon.signal(libc::SIGCONT);
    assert_answered_once(&mut connection, &all, &[&daemon]).await;
    assert_settled(&mut connection).await;
    assert!(daemon.log().contains("consumer group vanished"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stalled_mid_stream_nothing_is_lost_or_answered_twice() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let stall = env(&[("TOOLHOST__REDIS__RESPONSE_TIMEOUT_MS", "300")]);
    let first = Daemon::start(&redis, &stall);
    let second = Daemon::start(&redis, &stall);
    let mut connection = redis.connection().await;
    let before = ids("before", 200);
    for id in &before {
        send(&mut connection, &echo(id)).await;
    }
    // Commands time out on the client but run when the server wakes up: replies are lost after
    // their effects, and the retries must notice.
    redis.pause();
    // The fault itself: the server stays stalled past the clients' response timeout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    redis.resume();
    let after = ids("after", 100);
    for id in &after {
        send(&mut connection, &echo(id)).await;
    }
    let all: Vec<String> = [before, after].concat();
    assert_answered_once(&mut connection, &all, &[&first, &second]).await;
    assert_settled(&mut connection).await;
    // The stall is reported once, as an outage, rather than by every retrying loop.
    for daemon in [&first, &second] {
        assert!(daemon.log().contains("redis does not answer"), "{}", daemon.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_paused_past_its_lease_still_answers_once() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let paused = Daemon::start(&redis, &env(&[]));
    let mut connection = redis.connection().await;
    send(&mut connection, &sleep("paused-1", 2)).await;
    wait_for_calls(&mut connection, 1).await;
    paused.signal(libc::SIGSTOP);
    let replica = Daemon::start(&redis, &env(&[]));
    let all = ["paused-1".to_owned()];
    wait_for_outcome(&[&replica], "paused-1", "interrupted").await;
    paused.signal(libc::SIGCONT);
    // Its call ends after the replica answered: the answered mark keeps its answer out.
    wait_for_outcome(&[&paused], "paused-1", "duplicate").await;
    let answers = assert_answered_once(&mut connection, &all, &[&paused, &replica]).await;
    assert_eq!(error_code(&answers["paused-1"]), "interrupted");
    assert_settled(&mut connection).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_twice_runs_once_and_a_retry_after_its_answer_gets_the_original_answer() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let first = Daemon::start(&redis, &env(&[]));
    let second = Daemon::start(&redis, &env(&[]));
    let mut connection = redis.connection().await;
    // The same request twice while it runs (either replica may take either copy): the copy is
    // acked, and the call's one answer is on the topic both named.
    let payload = sleep("twice-1", 1);
    send(&mut connection, &payload).await;
    send(&mut connection, &payload).await;
    let all = ["twice-1".to_owned()];
    let answers = assert_answered_once(&mut connection, &all, &[&first, &second]).await;
    let original = answers["twice-1"].clone();
    assert_eq!(original["data"]["success"], true, "{original}");
    // A caller that lost that answer sends the request again, to a private topic of its own: it
    // gets the original answer there (the same data, in an envelope of its own), without a run.
    let mut retry = payload.clone();
    retry["id"] = json!(uuid::Uuid::new_v4().to_string());
    retry["response_topic"] = json!("results:retrier");
    retry["correlation_id"] = json!("retry-correlation");
    send(&mut connection, &retry).await;
    let replayed = wait_for_answer_on(&mut connection, "results:retrier", "twice-1").await;
    assert_eq!(replayed["data"], original["data"], "{replayed}");
    assert_eq!(replayed["topic"], "results:retrier");
    assert_eq!(replayed["correlation_id"], "retry-correlation");
    assert_ne!(replayed["id"], original["id"]);
    assert_settled(&mut connection).await;
    wait_for_outcome(&[&first, &second], "twice-1", "replayed").await;
    assert_eq!(outcomes_of(&[&first, &second], "twice-1"), ["duplicate", "replayed", "success"]);
    // Still one answer on the original topic, and the command ran once.
    assert_answered_once(&mut connection, &all, &[&first, &second]).await;
    assert_eq!(answers_on(&mut connection, "results:retrier").await.len(), 1);
}

/// The entries on `topic`, as JSON payloads.
async fn answers_on(connection: &mut MultiplexedConnection, topic: &str) -> Vec<Value> {
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg(topic).arg("-").arg("+").query_async(connection).await.unwrap();
    entries
        .into_iter()
        .filter_map(|(_, fields)| fields.into_iter().find(|(name, _)| name == "payload"))
        .map(|(_, payload)| serde_json::from_str(&payload).unwrap())
        .collect()
}

/// Waits for the answer to `request_id` on `topic`.
async fn wait_for_answer_on(connection: &mut MultiplexedConnection, topic: &str, request_id: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let found = answers_on(connection, topic).await;
        if let Some(answer) = found.into_iter().find(|answer| answer["data"]["request_id"] == request_id) {
            return answer;
        }
        assert!(Instant::now() < deadline, "no answer to {request_id} on {topic}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_kept_answers_off_a_retry_after_the_answer_is_acked_unanswered() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let daemon = Daemon::start(&redis, &env(&[("TOOLHOST__DISPATCH__KEPT_ANSWER_MAX_BYTES", "0")]));
    let mut connection = redis.connection().await;
    let all = ["unkept-1".to_owned()];
    send(&mut connection, &echo("unkept-1")).await;
    assert_answered_once(&mut connection, &all, &[&daemon]).await;
    let mark: String = redis::cmd("GET")
        .arg("toolhost:ledger:action-requests:answered:unkept-1")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(!mark.contains('\n'), "the mark holds the answer's id alone: {mark}");
    let mut retry = echo("unkept-1");
    retry["id"] = json!(uuid::Uuid::new_v4().to_string());
    send(&mut connection, &retry).await;
    assert_settled(&mut connection).await;
    wait_for_outcome(&[&daemon], "unkept-1", "duplicate").await;
    assert_answered_once(&mut connection, &all, &[&daemon]).await;
    assert_eq!(outcomes_of(&[&daemon], "unkept-1"), ["duplicate", "success"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_redelivered_while_it_runs_is_answered_once() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    // One delivery allowed: a poison check before the ledger would dead-letter the live call.
    let settings = env(&[("TOOLHOST__DISPATCH__MAX_DELIVERIES", "1")]);
    let holder = Daemon::start(&redis, &settings);
    let mut connection = redis.connection().await;
    let entry_id = send(&mut connection, &sleep("again-1", 2)).await;
    wait_for_calls(&mut connection, 1).await;
    let replica = Daemon::start(&redis, &settings);
    // Make the entry look abandoned until the replica's reclaimer takes it; the holder's lease
    // renewals keep taking it back.
    let deadline = Instant::now() + WAIT;
    while outcomes_of(&[&replica], "again-1").is_empty() {
        assert!(Instant::now() < deadline, "the replica never took the entry");
        let _: redis::Value = redis::cmd("XCLAIM")
            .arg(REQUESTS)
            .arg(GROUP)
            .arg("ghost")
            .arg(0)
            .arg(&entry_id)
            .arg("IDLE")
            .arg(60_000)
            .arg("JUSTID")
            .query_async(&mut connection)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The holder's lease is live: the replica leaves the entry to it (not poison, not a rerun).
    assert_eq!(outcomes_of(&[&replica], "again-1"), ["left_pending"]);
    let all = ["again-1".to_owned()];
    let answers = assert_answered_once(&mut connection, &all, &[&holder, &replica]).await;
    assert_eq!(answers["again-1"]["data"]["success"], true, "{}", answers["again-1"]);
    assert_eq!(outcomes_of(&[&holder], "again-1"), ["success"]);
    let dead: u64 = redis::cmd("XLEN").arg(DEAD_LETTERS).query_async(&mut connection).await.unwrap();
    assert_eq!(dead, 0);
    assert_settled(&mut connection).await;
}

/// Sets Redis's `maxmemory`: 1 byte refuses every write that may grow memory (the default
/// policy evicts nothing), 0 lifts the limit.
async fn set_maxmemory(connection: &mut MultiplexedConnection, bytes: u64) {
    let () =
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(bytes).query_async(connection).await.unwrap();
}

/// A holder keeps its call's lease from the ledger step until the answer is committed, not only
/// while the tool runs: here the run ends while Redis refuses writes (out of memory), and the
/// commit waits out the spell, several leases long. The lease never lapses meanwhile (a replica
/// would take the live holder's call for a dead one's, and answer this non-idempotent call
/// `interrupted` while the holder's result was thrown away), the entry is not reclaimed, and the
/// call is answered once, with its result, by the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_commit_waits_keeps_its_lease_and_answers_once() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let lease = Duration::from_millis(2000);
    let settings = [
        ("TOOLHOST__DISPATCH__CLAIM_IDLE_MS", "2000"),
        ("TOOLHOST__DISPATCH__BLOCK_MS", "500"),
        ("TERMINAL_ALLOWED_COMMANDS", "sleep"),
    ];
    let holder = Daemon::start(&redis, &settings);
    let mut connection = redis.connection().await;
    send(&mut connection, &sleep("committing-1", 1)).await;
    wait_for_calls(&mut connection, 1).await;
    // Only now a replica, so the holder took the entry; its reclaimer looks every second.
    let replica = Daemon::start(&redis, &settings);
    let records: Vec<String> =
        redis::cmd("KEYS").arg("toolhost:ledger:*:call:*").query_async(&mut connection).await.unwrap();
    let record = records.into_iter().next().expect("the call record");
    // Writes refused while the call runs: its answer cannot be committed until they pass again.
    set_maxmemory(&mut connection, 1).await;
    let spell = Instant::now();
    let mut deliveries = 0;
    while spell.elapsed() < lease * 3 {
        let (lease_until, (seconds, micros)): (Option<u64>, (u64, u64)) = redis::pipe()
            .cmd("HGET")
            .arg(&record)
            .arg("lease_until")
            .cmd("TIME")
            .query_async(&mut connection)
            .await
            .unwrap();
        let now = seconds * 1000 + micros / 1000;
        let lease_until = lease_until.expect("the call record stays while its answer waits");
        // begin_call's rule: a lease with less than a third left has lapsed.
        let lapsed_at = lease_until - lease.as_millis() as u64 / 3;
        assert!(
            lapsed_at > now,
            "the lease lapsed {} ms ago while its holder waited to commit",
            now - lapsed_at
        );
        deliveries = deliveries.max(most_deliveries(&mut connection).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        payloads(&mut connection, RESULTS).await.is_empty(),
        "nothing can be answered while Redis refuses writes"
    );
    set_maxmemory(&mut connection, 0).await;
    let all = ["committing-1".to_owned()];
    let answers = assert_answered_once(&mut connection, &all, &[&holder, &replica]).await;
    assert_eq!(answers["committing-1"]["data"]["success"], true, "{}", answers["committing-1"]);
    assert_eq!(deliveries, 1, "the entry was reclaimed from its live holder");
    assert_eq!(outcomes_of(&[&holder, &replica], "committing-1"), ["success"]);
    assert_settled(&mut connection).await;
}

/// A replica with a read-only, idempotent `[[commands]]` tool `slow` that runs `sleep 3`.
fn slow_tool_replica(redis: &RedisServer, name: &str) -> Daemon {
    let dir = crate::support::temp_dir(&format!("untracked-{name}"));
    let path = dir.join("toolhost.toml");
    std::fs::write(
        &path,
        "[[commands]]\nname = \"slow\"\ndescription = \"Sleeps.\"\nargv = [\"sleep\", \"3\"]\n\
         annotations = { read_only = true, idempotent = true }\n",
    )
    .unwrap();
    Daemon::start_args(redis, &env(&[]), &["--config", path.to_str().unwrap()])
}

/// The highest delivery count among `stream`'s pending entries (0 when none is pending).
async fn most_deliveries(connection: &mut MultiplexedConnection) -> u64 {
    let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(REQUESTS)
        .arg(GROUP)
        .arg("-")
        .arg("+")
        .arg(100)
        .query_async(connection)
        .await
        .unwrap();
    pending.iter().map(|(_, _, _, deliveries)| *deliveries).max().unwrap_or(0)
}

/// A read-only, idempotent tool runs without a call record, yet its entry's idle time is still
/// reset while it runs: a call three times longer than the lease is not reclaimed and rerun by
/// a replica, is delivered once, answered once with its result, and no lease is reported lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untracked_call_longer_than_the_lease_is_not_reclaimed() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let first = slow_tool_replica(&redis, "first");
    let second = slow_tool_replica(&redis, "second");
    let mut connection = redis.connection().await;
    send(&mut connection, &request("slow.requested", "slow-1", json!({}))).await;
    // Watch the delivery count while the call runs, until it is answered.
    let deadline = Instant::now() + WAIT;
    let mut deliveries = 0;
    while !answer_counts(&mut connection).await.contains_key("slow-1") {
        assert!(Instant::now() < deadline, "slow-1 was never answered");
        deliveries = deliveries.max(most_deliveries(&mut connection).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all = ["slow-1".to_owned()];
    let answers = assert_answered_once(&mut connection, &all, &[&first, &second]).await;
    assert_eq!(answers["slow-1"]["data"]["success"], true, "{}", answers["slow-1"]);
    assert_eq!(deliveries, 1, "the entry was reclaimed while it ran");
    assert_eq!(outcomes_of(&[&first, &second], "slow-1"), ["success"], "run once, by one replica");
    for daemon in [&first, &second] {
        assert!(!daemon.log().contains("lost the lease"), "{}", daemon.log());
    }
    let dead: u64 = redis::cmd("XLEN").arg(DEAD_LETTERS).query_async(&mut connection).await.unwrap();
    assert_eq!(dead, 0);
    assert_settled(&mut connection).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_entry_is_dead_lettered_after_max_deliveries_and_the_stream_flows_on() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    create_group(&mut connection).await;
    let poison = echo("poison-1");
    let entry_id = send(&mut connection, &poison).await;
    // Three consumers take the entry in turn and crash without acking.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("crashed-1")
        .arg("STREAMS")
        .arg(REQUESTS)
        .arg(">")
        .query_async(&mut connection)
        .await
        .unwrap();
    for consumer in ["crashed-2", "crashed-3"] {
        let _: redis::Value = redis::cmd("XCLAIM")
            .arg(REQUESTS)
            .arg(GROUP)
            .arg(consumer)
            .arg(0)
            .arg(&entry_id)
            .query_async(&mut connection)
            .await
            .unwrap();
    }
    let daemon = Daemon::start(&redis, &env(&[("TOOLHOST__DISPATCH__MAX_DELIVERIES", "3")]));
    send(&mut connection, &echo("after-1")).await;
    let all = ["poison-1".to_owned(), "after-1".to_owned()];
    let answers = assert_answered_once(&mut connection, &all, &[&daemon]).await;
    assert_eq!(error_code(&answers["poison-1"]), "internal");
    assert_eq!(answers["after-1"]["data"]["success"], true);
    let dead = crate::support::payloads(&mut connection, DEAD_LETTERS).await;
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert_eq!(dead[0]["request_entry_id"], entry_id.as_str());
    assert_eq!(dead[0]["deliveries"], 4);
    assert_eq!(dead[0]["payload"], poison.to_string());
    assert!(dead[0]["error"].as_str().unwrap().contains("delivered 4 times"), "{}", dead[0]);
    assert_settled(&mut connection).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_loses_nothing_and_exits_within_the_grace() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let grace = Duration::from_millis(3000);
    let settings = env(&[("TOOLHOST__DISPATCH__SHUTDOWN_GRACE_MS", "3000")]);
    let mut stopping = Daemon::start(&redis, &settings);
    let staying = Daemon::start(&redis, &settings);
    let stopping_consumer = consumer_name(&stopping);
    let mut connection = redis.connection().await;
    let slow = ids("slow", 4);
    for id in &slow {
        send(&mut connection, &sleep(id, 1)).await;
    }
    let before = ids("before", 300);
    for id in &before {
        send(&mut connection, &echo(id)).await;
    }
    let started = Instant::now();
    let code = stopping.terminate(grace + Duration::from_secs(5));
    let took = started.elapsed();
    assert_eq!(code, Some(0), "{}", stopping.log());
    assert!(took < grace + Duration::from_secs(2), "took {took:?}");
    let after = ids("after", 100);
    for id in &after {
        send(&mut connection, &echo(id)).await;
    }
    let all: Vec<String> = [slow, before, after].concat();
    let answers = assert_answered_once(&mut connection, &all, &[&stopping, &staying]).await;
    assert!(answers.values().all(|answer| answer["data"]["success"] == true));
    assert_settled(&mut connection).await;
    // It finished everything it held, so it removed its consumer on the way out.
    assert!(!consumers(&mut connection).await.contains(&stopping_consumer));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_grace_leaves_the_call_to_a_replica() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let settings = env(&[("TOOLHOST__DISPATCH__SHUTDOWN_GRACE_MS", "500")]);
    let mut stopping = Daemon::start(&redis, &settings);
    let mut connection = redis.connection().await;
    send(&mut connection, &sleep("long-1", 4)).await;
    wait_for_calls(&mut connection, 1).await;
    let replica = Daemon::start(&redis, &settings);
    let started = Instant::now();
    assert_eq!(stopping.terminate(Duration::from_secs(10)), Some(0));
    assert!(
        started.elapsed() < Duration::from_millis(500) + Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let all = ["long-1".to_owned()];
    let answers = assert_answered_once(&mut connection, &all, &[&stopping, &replica]).await;
    // Not `cancelled` by the stopping daemon: the replica found it started and not finished.
    assert_eq!(error_code(&answers["long-1"]), "interrupted");
    assert_eq!(outcomes_of(&[&stopping], "long-1"), ["left_pending"]);
    assert_settled(&mut connection).await;
}

/// The renewal of a call without a record resets its entry's idle time and writes nothing, as
/// long as the entry is pending to the renewing consumer; one taken over by another consumer is
/// left to it. A tracked renewal without a record still reports the lease lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untracked_renewal_resets_the_idle_time_of_its_own_entry_only() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let bus = RedisBus::new(RedisOptions::new(redis.url())).unwrap();
    let entry_id = deliver_one(&bus, REQUESTS, GROUP).await;
    let call = call_r1(Duration::from_secs(1));
    let entry = EntryRef { topic: REQUESTS, group: GROUP, entry_id: &entry_id };
    // (entry id, consumer, idle ms, deliveries) of the one pending entry.
    async fn holder(connection: &mut MultiplexedConnection) -> (String, String, u64, u64) {
        let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(REQUESTS)
            .arg(GROUP)
            .arg("-")
            .arg("+")
            .arg(10)
            .query_async(connection)
            .await
            .unwrap();
        pending.into_iter().next().unwrap()
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(holder(&mut connection).await.2 >= 300);
    assert!(!bus.renew_call(&call, "c1/1", &entry, "c1", true).await.unwrap(), "no record, no lease");
    assert!(bus.renew_call(&call, "c1/1", &entry, "c1", false).await.unwrap());
    let (_, consumer, idle, deliveries) = holder(&mut connection).await;
    assert_eq!((consumer.as_str(), deliveries), ("c1", 1));
    assert!(idle < 300, "idle {idle} ms after renewal");
    let records: u64 = redis::cmd("EXISTS").arg(call.call).query_async(&mut connection).await.unwrap();
    assert_eq!(records, 0, "an untracked renewal writes no call record");
    // Another consumer took the entry over: it stays with it.
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg(REQUESTS)
        .arg(GROUP)
        .arg("c2")
        .arg(0)
        .arg(&entry_id)
        .arg("JUSTID")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(!bus.renew_call(&call, "c1/1", &entry, "c1", false).await.unwrap());
    assert_eq!(holder(&mut connection).await.1, "c2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_steps_are_safe_to_repeat_against_redis() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let bus = RedisBus::new(RedisOptions::new(redis.url())).unwrap();
    let entry_id = deliver_one(&bus, REQUESTS, GROUP).await;
    let call = call_r1(Duration::from_secs(1));
    // A begin whose reply was lost is retried by the same owner: still fresh, not "started".
    for _ in 0..2 {
        assert_eq!(bus.begin_call(&call, "c1/1", &entry_id).await.unwrap(), CallStart::Fresh);
    }
    assert_eq!(
        bus.begin_call(&call, "c2/1", &entry_id).await.unwrap(),
        CallStart::Busy { entry_id: entry_id.clone() }
    );
    let entry = EntryRef { topic: REQUESTS, group: GROUP, entry_id: &entry_id };
    let finish = Finish {
        entry,
        call: Some(call),
        answer: Some(Published { topic: RESULTS, id: "answer-1", payload: "{}" }),
        answer_copy: None,
        dead_letter: Some(Published { topic: DEAD_LETTERS, id: "letter-1", payload: "{}" }),
        final_answer: true,
        tracked: true,
        kept: None,
        replay: false,
    };
    // The first run's reply is lost; the retry changes nothing and reports the same outcome.
    assert_eq!(bus.finish(&finish).await.unwrap(), Committed::Published);
    assert_eq!(bus.finish(&finish).await.unwrap(), Committed::Published);
    let other =
        Finish { answer: Some(Published { topic: RESULTS, id: "answer-2", payload: "{}" }), ..finish };
    assert_eq!(bus.finish(&other).await.unwrap(), Committed::NotPublished);
    let lengths: (u64, u64) = redis::pipe()
        .cmd("XLEN")
        .arg(RESULTS)
        .cmd("XLEN")
        .arg(DEAD_LETTERS)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(lengths, (1, 1));

    // A pending entry trimmed away before anyone handled it leaves the group on reclaim.
    let trimmed = bus.publish(REQUESTS, "m-2", "{}").await.unwrap();
    bus.read_group(REQUESTS, GROUP, "dead", 10, Duration::from_millis(10)).await.unwrap();
    let _: u64 = redis::cmd("XDEL").arg(REQUESTS).arg(&trimmed).query_async(&mut connection).await.unwrap();
    let reclaimed = bus.reclaim(REQUESTS, GROUP, "c1", Duration::ZERO, "0-0", 10).await.unwrap();
    assert!(reclaimed.entries.is_empty());
    assert_eq!(reclaimed.deleted, [trimmed]);
    assert_eq!(pending(&mut connection, REQUESTS, GROUP).await, 0);
    // ...and consumers that hold nothing and have no heartbeat are pruned, except the caller's.
    let _: () = redis::cmd("SET").arg("beat:alive").arg("{}").query_async(&mut connection).await.unwrap();
    bus.publish(REQUESTS, "m-alive", "{}").await.unwrap();
    let delivered = bus.read_group(REQUESTS, GROUP, "alive", 10, Duration::from_millis(10)).await.unwrap();
    bus.ack(REQUESTS, GROUP, &[delivered[0].entry_id.clone()]).await.unwrap();
    let pruned = bus.prune_consumers(REQUESTS, GROUP, "c1", Duration::ZERO, "beat:").await.unwrap();
    assert_eq!(pruned, ["dead"]);
    assert_eq!(consumers(&mut connection).await, ["alive", "c1"]);

    // With the group gone (Redis lost it), an unanswered request is still answered.
    let late = bus.publish(REQUESTS, "m-3", "{}").await.unwrap();
    let _: redis::Value = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(REQUESTS)
        .arg(GROUP)
        .query_async(&mut connection)
        .await
        .unwrap();
    let call =
        CallKeys { answered: "toolhost:toolhost:answered:r-3", call: "toolhost:toolhost:call:r-3", ..call };
    let finish = Finish {
        entry: EntryRef { topic: REQUESTS, group: GROUP, entry_id: &late },
        call: Some(call),
        answer: Some(Published { topic: RESULTS, id: "answer-3", payload: "{}" }),
        answer_copy: None,
        dead_letter: None,
        final_answer: true,
        tracked: true,
        kept: None,
        replay: false,
    };
    assert_eq!(bus.finish(&finish).await.unwrap(), Committed::Published);
    // Re-created from the start, the group delivers what callers added meanwhile.
    bus.ensure_group_at(REQUESTS, GROUP, "0").await.unwrap();
    let entries = bus.read_group(REQUESTS, GROUP, "c1", 10, Duration::from_millis(10)).await.unwrap();
    assert_eq!(entries.iter().map(|entry| entry.id.as_str()).collect::<Vec<_>>(), ["m-1", "m-alive", "m-3"]);
}

/// The calls of one read are answered by one script call. Redis wakes the daemon's blocked read
/// once for a transaction of 40 requests, so one read delivers them all; the batcher then lets
/// every call that is ready queue its answer before the batch goes out. (Before, the runtime ran
/// the batching task as soon as the first answer woke it, and a read of n became a script call
/// of one answer and another of n - 1.) Counted from Redis's own log of every command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answers_of_one_read_go_out_in_one_script_call() {
    let _serial = SERIAL.lock().await;
    one_read_one_script_call(true).await;
    // Switched off, the same read is answered once too, in whatever batches.
    one_read_one_script_call(false).await;
}

async fn one_read_one_script_call(batch_under_load: bool) {
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let setting = if batch_under_load { "true" } else { "false" };
    let _daemon = Daemon::start(&redis, &env(&[("TOOLHOST__DISPATCH__BATCH_UNDER_LOAD", setting)]));
    // One call first, so the answer script is loaded (its first EVALSHA meets NOSCRIPT and is
    // sent again after a SCRIPT LOAD).
    send(&mut connection, &echo("one-read-warm-up")).await;
    wait_for(&mut connection, RESULTS, 1, WAIT).await;
    for (name, value) in [("slowlog-log-slower-than", "0"), ("slowlog-max-len", "100000")] {
        let _: () =
            redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query_async(&mut connection).await.unwrap();
    }
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query_async(&mut connection).await.unwrap();
    let requests: Vec<Value> = (0..40).map(|index| echo(&format!("one-read-{index}"))).collect();
    send_together(&mut connection, &requests).await;
    let answers = wait_for(&mut connection, RESULTS, 41, WAIT).await;
    assert_eq!(answers.len(), 41, "{answers:?}");
    settled(&mut connection, REQUESTS, GROUP).await;
    // Each logged command is [id, time, duration, arguments, client, name]; an answer script
    // call is `EVALSHA <sha> <number of keys> <requests stream> <three keys per answer> ...`.
    let log: Vec<redis::Value> =
        redis::cmd("SLOWLOG").arg("GET").arg(-1).query_async(&mut connection).await.unwrap();
    let text = |value: &redis::Value| redis::from_redis_value::<String>(value.clone()).unwrap_or_default();
    let mut batches = Vec::new();
    let mut reads = 0;
    for entry in &log {
        let redis::Value::Array(fields) = entry else { continue };
        let Some(redis::Value::Array(arguments)) = fields.get(3) else { continue };
        let command = arguments.first().map(text).unwrap_or_default().to_ascii_uppercase();
        if command == "XREADGROUP" {
            reads += 1;
        }
        if command == "EVALSHA" && arguments.get(3).map(text).as_deref() == Some(REQUESTS) {
            let keys: usize = arguments.get(2).map(text).and_then(|keys| keys.parse().ok()).unwrap_or(0);
            batches.push((keys - 1) / 3);
        }
    }
    if batch_under_load {
        assert_eq!(batches, vec![40], "answers per script call, after {reads} reads");
    } else {
        assert_eq!(batches.iter().sum::<usize>(), 40, "answers per script call: {batches:?}");
    }
}

/// A slow call in a read holds up the next read for the hold (1 ms) at most, not for the call:
/// a read of a 40-second call and an echo, then another echo, answered long before the slow call
/// ends. (A hold that waited for every call of its read would leave the second echo unread for
/// the whole 40 seconds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_holds_up_the_next_read_no_longer_than_the_hold() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let _daemon = Daemon::start(&redis, &env(&[("TERMINAL_TIMEOUT_SECONDS", "60")]));
    send_together(&mut connection, &[sleep("slow-read-sleep", 40), echo("slow-read-echo")]).await;
    let started = Instant::now();
    answer(&mut connection, RESULTS, "slow-read-echo").await;
    send(&mut connection, &echo("slow-read-after")).await;
    let after = answer(&mut connection, RESULTS, "slow-read-after").await;
    assert_eq!(after["data"]["success"], true, "{after}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the next read waited for the slow call: {:?}",
        started.elapsed()
    );
    let slow: Vec<Value> = payloads(&mut connection, RESULTS)
        .await
        .into_iter()
        .filter(|payload| payload["data"]["request_id"] == "slow-read-sleep")
        .collect();
    assert!(slow.is_empty(), "the slow call must still be running: {slow:?}");
}

/// The common end of a call (a final answer, nothing else) takes the lean path: finishes that
/// meet are committed together with one `XACK`, each answer once; a lost reply's retry reports
/// the same outcome; an entry another toolbox refused, an answer topic of another type, one
/// Redis refuses to add to, or an answered mark of another type, writes nothing for that entry
/// and fails no other; a call record is deleted only by a finish whose call wrote one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn final_answers_finished_together_are_each_published_once_and_acked() {
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let bus = RedisBus::new(RedisOptions::new(redis.url())).unwrap();
    bus.ensure_group(REQUESTS, GROUP).await.unwrap();
    for index in 0..40 {
        bus.publish(REQUESTS, &format!("m-{index}"), "{}").await.unwrap();
    }
    let entries = bus.read_group(REQUESTS, GROUP, "c1", 100, Duration::from_millis(10)).await.unwrap();
    assert_eq!(entries.len(), 40);
    let names: Vec<(String, String, String, String)> = (0..40)
        .map(|index| {
            (
                format!("ledger:answered:r-{index}"),
                format!("ledger:call:r-{index}"),
                format!("ledger:entry:{}", entries[index].entry_id),
                format!("answer-{index}"),
            )
        })
        .collect();
    // An earlier call record of r-0 and r-1; only r-1's finish says its call wrote one.
    for (_, record, _, _) in &names[..2] {
        let _: () = redis::cmd("SET").arg(record).arg("x").query_async(&mut connection).await.unwrap();
    }
    // Another toolbox refused the entry of r-2; r-3 names a topic that is not a stream.
    let _: () = redis::cmd("SET").arg(&names[2].2).arg("refusal").query_async(&mut connection).await.unwrap();
    let _: () = redis::cmd("SET").arg("not-a-stream").arg("x").query_async(&mut connection).await.unwrap();
    // r-6 names a stream that takes no more entries: it holds the largest possible id.
    let _: String = redis::cmd("XADD")
        .arg("exhausted")
        .arg("18446744073709551615-18446744073709551615")
        .arg("x")
        .arg("y")
        .query_async(&mut connection)
        .await
        .unwrap();
    // r-7's answered mark is a key of another type (written by something other than toolhost):
    // its SET stops the whole script call, which the bus then runs again item by item.
    let _: () = redis::cmd("RPUSH").arg(&names[7].0).arg("x").query_async(&mut connection).await.unwrap();
    let finish_of = |index: usize| {
        let (answered, call, entry, id) = &names[index];
        Finish {
            entry: EntryRef { topic: REQUESTS, group: GROUP, entry_id: &entries[index].entry_id },
            call: Some(CallKeys {
                answered,
                call,
                entry,
                lease: Duration::from_secs(1),
                retention: Duration::from_secs(60),
            }),
            answer: Some(Published {
                topic: match index {
                    3 => "not-a-stream",
                    6 => "exhausted",
                    _ => RESULTS,
                },
                id,
                payload: "{}",
            }),
            answer_copy: None,
            dead_letter: None,
            final_answer: true,
            tracked: index == 1,
            kept: None,
            replay: false,
        }
    };
    let finishes: Vec<Finish<'_>> = (0..40).map(finish_of).collect();
    let outcomes = futures::future::join_all(finishes.iter().map(|finish| bus.finish(finish))).await;
    assert!(outcomes[6].is_err(), "{:?}", outcomes[6]);
    assert!(
        matches!(&outcomes[7], Err(toolhost_bus::Error::Refused(cause)) if cause.code() == Some("WRONGTYPE")),
        "{:?}",
        outcomes[7]
    );
    let outcomes: Vec<Committed> =
        outcomes.into_iter().map(|outcome| outcome.unwrap_or(Committed::NotPublished)).collect();
    assert_eq!(outcomes[2], Committed::NotPublished);
    assert_eq!(outcomes[3], Committed::WrongType);
    assert!(
        outcomes
            .iter()
            .enumerate()
            .all(|(index, outcome)| [2, 3, 6, 7].contains(&index) || *outcome == Committed::Published),
        "{outcomes:?}"
    );
    // Every answer once, every entry acked but r-3's, r-6's and r-7's.
    let published: u64 = redis::cmd("XLEN").arg(RESULTS).query_async(&mut connection).await.unwrap();
    assert_eq!(published, 36);
    assert_eq!(pending(&mut connection, REQUESTS, GROUP).await, 3);
    let kind: String = redis::cmd("TYPE").arg(&names[7].0).query_async(&mut connection).await.unwrap();
    assert_eq!(kind, "list", "the mark of another type is left as it was");
    let marks: Vec<Option<String>> = redis::cmd("MGET")
        .arg(&names[2].0)
        .arg(&names[3].0)
        .arg(&names[6].0)
        .arg(&names[4].0)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(marks, [None, None, None, Some("answer-4".to_owned())]);
    let records: (bool, bool) =
        redis::pipe().exists(&names[0].1).exists(&names[1].1).query_async(&mut connection).await.unwrap();
    assert_eq!(records, (true, false), "only a finish whose call wrote a record deletes it");
    // A retry after a lost reply reports the same; another answer for an answered request is not published.
    assert_eq!(bus.finish(&finishes[5]).await.unwrap(), Committed::Published);
    let other =
        Finish { answer: Some(Published { topic: RESULTS, id: "answer-x", payload: "{}" }), ..finish_of(5) };
    assert_eq!(bus.finish(&other).await.unwrap(), Committed::NotPublished);
    let published: u64 = redis::cmd("XLEN").arg(RESULTS).query_async(&mut connection).await.unwrap();
    assert_eq!(published, 36);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_entry_moves_to_the_named_consumer_undelivered() {
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let bus = RedisBus::new(RedisOptions::new(redis.url())).unwrap();
    bus.ensure_group(REQUESTS, GROUP).await.unwrap();
    let entry_id = bus.publish(REQUESTS, "m-1", "{}").await.unwrap();
    bus.read_group(REQUESTS, GROUP, "lacks-the-tool", 10, Duration::from_millis(10)).await.unwrap();
    bus.hand_over(REQUESTS, GROUP, "hosts-the-tool", &entry_id).await.unwrap();
    // XPENDING's detail: [[entry id, consumer, idle ms, deliveries]].
    let detail: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(REQUESTS)
        .arg(GROUP)
        .arg("-")
        .arg("+")
        .arg(10)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(detail.len(), 1, "{detail:?}");
    assert_eq!((detail[0].0.as_str(), detail[0].1.as_str()), (entry_id.as_str(), "hosts-the-tool"));
    assert_eq!(detail[0].3, 1, "a hand-over is not a delivery: {detail:?}");
    // The new owner's reclaimer takes it up once idle, like any pending entry.
    let reclaimed = bus.reclaim(REQUESTS, GROUP, "hosts-the-tool", Duration::ZERO, "0-0", 10).await.unwrap();
    assert_eq!(
        reclaimed.entries.iter().map(|entry| entry.entry_id.as_str()).collect::<Vec<_>>(),
        [entry_id.as_str()]
    );
}

/// Requests in the soak; 100,000 by hand (see docs/RELIABILITY.md), fewer in CI.
fn soak_requests() -> usize {
    std::env::var("TOOLHOST_SOAK_REQUESTS").ok().and_then(|text| text.parse().ok()).unwrap_or(30_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_two_replicas_one_killed_and_restarted_every_few_seconds() {
    let _serial = SERIAL.lock().await;
    let total = soak_requests();
    let redis = RedisServer::start();
    let maxlen = (total * 2 + 1000).to_string();
    // Results must not be trimmed before they are counted; one log line per call is noise here.
    // Heartbeats expire 3 s after a kill, so dead consumers are pruned during the run.
    let mut settings: Vec<(&str, &str)> = env(&[
        ("RUST_LOG", "info,toolhost::doors::requests=warn"),
        ("TOOLHOST__DAEMON__HEARTBEAT_MS", "1000"),
    ]);
    settings.push(("TOOLHOST__STREAMS__MAXLEN", &maxlen));
    let steady = Daemon::start(&redis, &settings);
    let mut victim = Daemon::start(&redis, &settings);
    let mut connection = redis.connection().await;
    let started = Instant::now();
    let mut rss = vec![(Duration::ZERO, steady.rss_kib())];
    let mut last_sample = Instant::now();
    let mut last_kill = Instant::now();
    let mut kills = 0;
    let mut held_at_kills = 0;
    let mut sent = 0;
    let mut progress = (0, Instant::now());
    // Keep the backlog bounded, so memory reflects steady state rather than a queue.
    let window = 2_000;
    while sent < total || answered(&mut connection).await < total {
        let done = answered(&mut connection).await;
        if sent < total && sent - done.min(sent) < window {
            let batch = 200.min(total - sent);
            let mut pipe = redis::pipe();
            for index in sent..sent + batch {
                let payload = echo(&format!("soak-{index}")).to_string();
                pipe.cmd("XADD").arg(REQUESTS).arg("*").arg("id").arg(uuid::Uuid::new_v4().to_string());
                pipe.arg("payload").arg(payload).ignore();
            }
            let () = pipe.query_async(&mut connection).await.unwrap();
            sent += batch;
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if last_kill.elapsed() > Duration::from_secs(3) {
            let held: Vec<redis::Value> = redis::cmd("XPENDING")
                .arg(REQUESTS)
                .arg(GROUP)
                .arg("-")
                .arg("+")
                .arg(10_000)
                .arg(consumer_name(&victim))
                .query_async(&mut connection)
                .await
                .unwrap();
            held_at_kills += held.len();
            victim.kill9();
            victim = Daemon::start(&redis, &settings);
            kills += 1;
            last_kill = Instant::now();
        }
        if last_sample.elapsed() >= Duration::from_secs(1) {
            rss.push((started.elapsed(), steady.rss_kib()));
            last_sample = Instant::now();
        }
        if done > progress.0 {
            progress = (done, Instant::now());
        }
        assert!(
            progress.1.elapsed() < Duration::from_secs(30),
            "soak stalled at {sent} sent, {done} answered"
        );
    }
    let elapsed = started.elapsed();
    rss.push((elapsed, steady.rss_kib()));
    // Anything in flight at the last kill is reclaimed within a lease or two.
    crate::support::settled_within(&mut connection, REQUESTS, GROUP, Duration::from_secs(60)).await;
    let answers = answer_counts(&mut connection).await;
    let doubled = answers.values().filter(|all| all.len() > 1).count();
    let missing = (0..total).filter(|index| !answers.contains_key(&format!("soak-{index}"))).count();
    let pending_left = pending(&mut connection, REQUESTS, GROUP).await;
    let group_consumers = consumers(&mut connection).await.len();
    eprintln!(
        "soak: {total} requests in {elapsed:?} ({:.0}/s), {kills} kills of the victim replica holding {held_at_kills} entries in all",
        total as f64 / elapsed.as_secs_f64()
    );
    eprintln!(
        "soak: {} answered, {doubled} answered twice, {missing} missing, {pending_left} pending, {group_consumers} consumers in the group",
        answers.len()
    );
    eprintln!("soak: steady replica RSS over time (s, KiB):");
    for (at, kib) in &rss {
        eprintln!("soak:   {:>6.1} {kib:>8}", at.as_secs_f64());
    }
    assert_eq!(missing, 0);
    assert_eq!(doubled, 0);
    assert_eq!(answers.len(), total);
    assert_eq!(pending_left, 0);
    assert_settled(&mut connection).await;
    assert!(answers.values().all(|all| all[0]["data"]["success"] == true));
    // Memory is flat: after warm-up, the peak in the last third is close to the first third's.
    let warm: Vec<u64> =
        rss.iter().filter(|(at, _)| *at >= Duration::from_secs(2)).map(|(_, kib)| *kib).collect();
    if warm.len() >= 6 {
        let third = warm.len() / 3;
        let early = warm[..third].iter().max().copied().unwrap_or(0);
        let late = warm[warm.len() - third..].iter().max().copied().unwrap_or(0);
        assert!(late <= early + early / 4 + 4096, "RSS grew from {early} KiB to {late} KiB: {rss:?}");
    }
}

async fn answered(connection: &mut MultiplexedConnection) -> usize {
    let length: usize = redis::cmd("XLEN").arg(RESULTS).query_async(connection).await.unwrap();
    length
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_ledger_steps_share_batches_and_keep_their_own_replies() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let bus = RedisBus::new(RedisOptions::new(redis.url())).unwrap();
    bus.ensure_group(REQUESTS, GROUP).await.unwrap();
    let n_calls = 200;
    let mut entry_ids = Vec::new();
    for call_idx in 0..n_calls {
        entry_ids.push(bus.publish(REQUESTS, &format!("m-{call_idx}"), "{}").await.unwrap());
    }
    bus.read_group(REQUESTS, GROUP, "c1", n_calls, Duration::from_millis(10)).await.unwrap();
    let keys: Vec<(String, String)> = (0..n_calls)
        .map(|call_idx| {
            (
                format!("toolhost:toolhost:answered:b-{call_idx}"),
                format!("toolhost:toolhost:call:b-{call_idx}"),
            )
        })
        .collect();
    let entries: Vec<String> =
        (0..n_calls).map(|call_idx| format!("toolhost:toolhost:entry:b-{call_idx}")).collect();
    let call = |call_idx: usize| CallKeys {
        answered: &keys[call_idx].0,
        call: &keys[call_idx].1,
        entry: &entries[call_idx],
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(60),
    };
    // Every other request was answered before: its begin must say so, the others' must not.
    for call_idx in (0..n_calls).step_by(2) {
        let _: () = redis::cmd("SET")
            .arg(&keys[call_idx].0)
            .arg("earlier")
            .query_async(&mut connection)
            .await
            .unwrap();
    }
    let begins = futures::future::join_all((0..n_calls).map(|call_idx| {
        let keys = call(call_idx);
        let entry_id = entry_ids[call_idx].clone();
        let bus = &bus;
        async move { bus.begin_call(&keys, &format!("c1/{call_idx}"), &entry_id).await.unwrap() }
    }))
    .await;
    for (call_idx, start) in begins.iter().enumerate() {
        let expected = if call_idx % 2 == 0 { CallStart::Answered } else { CallStart::Fresh };
        assert_eq!(*start, expected, "call {call_idx}");
    }
    // Finish them all at once; one item names a stream key that holds a string, so its XADD
    // cannot succeed. That item alone must say so, having written nothing.
    let ids: Vec<String> = (0..n_calls).map(|call_idx| format!("answer-{call_idx}")).collect();
    let _: () = redis::cmd("SET").arg("not-a-stream").arg("x").query_async(&mut connection).await.unwrap();
    let finishes = futures::future::join_all((0..n_calls).map(|call_idx| {
        let topic = if call_idx == 1 { "not-a-stream" } else { RESULTS };
        let finish = Finish {
            entry: EntryRef { topic: REQUESTS, group: GROUP, entry_id: &entry_ids[call_idx] },
            call: Some(call(call_idx)),
            answer: Some(Published { topic, id: &ids[call_idx], payload: "{}" }),
            answer_copy: None,
            dead_letter: None,
            final_answer: true,
            tracked: true,
            kept: None,
            replay: false,
        };
        let bus = &bus;
        async move { bus.finish(&finish).await }
    }))
    .await;
    for (call_idx, res) in finishes.iter().enumerate() {
        match call_idx {
            // A topic that is not a stream is reported, for that item alone, with nothing written.
            1 => assert_eq!(res.as_ref().unwrap(), &Committed::WrongType, "the broken item"),
            _ if call_idx % 2 == 0 => {
                assert_eq!(
                    res.as_ref().unwrap(),
                    &Committed::NotPublished,
                    "call {call_idx} was answered before"
                )
            }
            _ => assert_eq!(
                res.as_ref().unwrap(),
                &Committed::Published,
                "call {call_idx} publishes its answer"
            ),
        }
    }
    let published: u64 = redis::cmd("XLEN").arg(RESULTS).query_async(&mut connection).await.unwrap();
    assert_eq!(published, (n_calls / 2 - 1) as u64);
}

/// The ledger's kept answers: a final answer kept with its mark answers later entries of the same
/// request (a retry), once each, and never the entry it answered, however often that entry's
/// finish runs again; both finish scripts find it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_answer_answers_each_retry_once_and_never_its_own_entry_again() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let bus = RedisBus::new(RedisOptions::new(redis.url())).unwrap();
    bus.ensure_group(REQUESTS, GROUP).await.unwrap();
    let mut entries = Vec::new();
    for id in ["m-1", "m-2", "m-3"] {
        entries.push(bus.publish(REQUESTS, id, "{}").await.unwrap());
    }
    bus.read_group(REQUESTS, GROUP, "c1", 10, Duration::from_millis(10)).await.unwrap();
    let marks: Vec<String> = entries.iter().map(|entry| format!("toolhost:entry:{entry}")).collect();
    let keys = |index: usize| CallKeys {
        answered: "toolhost:answered:r-1",
        call: "toolhost:call:r-1",
        entry: &marks[index],
        lease: Duration::from_secs(1),
        retention: Duration::from_secs(60),
    };
    let finish = |index: usize, id: &'static str, copy: Option<&'static str>, replay: bool| Finish {
        entry: EntryRef { topic: REQUESTS, group: GROUP, entry_id: &entries[index] },
        call: Some(keys(index)),
        answer: Some(Published {
            topic: RESULTS,
            id,
            payload: r#"{"data":{"request_id":"r-1","success":true}}"#,
        }),
        answer_copy: copy,
        dead_letter: None,
        final_answer: !replay,
        tracked: true,
        kept: (!replay).then_some(r#"{"request_id":"r-1","success":true}"#),
        replay,
    };
    // The first entry's answer, kept; its finish run again is still its own.
    assert_eq!(bus.finish(&finish(0, "a-1", None, false)).await.unwrap(), Committed::Published);
    assert_eq!(bus.finish(&finish(0, "a-1", None, false)).await.unwrap(), Committed::Published);
    // Another holder of the same entry (a reclaim, or another toolbox's group) finds it answered.
    assert_eq!(bus.finish(&finish(0, "a-9", None, false)).await.unwrap(), Committed::NotPublished);
    assert_eq!(bus.begin_call(&keys(0), "c1/again", &entries[0]).await.unwrap(), CallStart::Answered);
    // A retry, through either script, is handed the kept answer with nothing written.
    let kept = |reply| match reply {
        CallStart::AnsweredKept(kept) => kept,
        other => panic!("not kept: {other:?}"),
    };
    let found = kept(bus.begin_call(&keys(1), "c1/retry", &entries[1]).await.unwrap());
    assert_eq!((found.id.as_str(), found.entry_id.as_str()), ("a-1", entries[0].as_str()));
    assert_eq!(found.data, r#"{"request_id":"r-1","success":true}"#);
    for copy in [None, Some("results:copy")] {
        match bus.finish(&finish(1, "a-2", copy, false)).await.unwrap() {
            Committed::Kept(found) => assert_eq!(found.id, "a-1"),
            other => panic!("not kept: {other:?}"),
        }
    }
    // The replay is published once for its entry, a second replayer of it (another toolbox)
    // publishes nothing, and the request's mark still holds the original.
    assert_eq!(bus.finish(&finish(1, "r-2", None, true)).await.unwrap(), Committed::Published);
    assert_eq!(bus.finish(&finish(1, "r-2", None, true)).await.unwrap(), Committed::Published);
    assert_eq!(bus.finish(&finish(1, "r-9", None, true)).await.unwrap(), Committed::NotPublished);
    let found = kept(bus.begin_call(&keys(2), "c1/third", &entries[2]).await.unwrap());
    assert_eq!(found.id, "a-1");
    let published: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg(RESULTS).arg("-").arg("+").query_async(&mut connection).await.unwrap();
    let ids: Vec<&str> = published.iter().map(|(_, fields)| fields[0].1.as_str()).collect();
    assert_eq!(ids, ["a-1", "r-2"]);
    let pending: (u64, redis::Value, redis::Value, redis::Value) =
        redis::cmd("XPENDING").arg(REQUESTS).arg(GROUP).query_async(&mut connection).await.unwrap();
    assert_eq!(pending.0, 1, "the third entry is left, the others are acked");
}
