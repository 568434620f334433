//! Issue 12's promises about what the read path meets: entries whose fields are not UTF-8 never
//! wedge a batch (item 1), oversized entries are dead-lettered as head, size and digest without
//! being held whole (item 3), and Redis running out of memory only delays answers (item 4).
//!
//! Real redis-server processes; the daemon tests run the built `toolhost` binary.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use base64::Engine as _;
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};
use toolhost_bus::{
    CallKeys, CallStart, Committed, EntryRef, Finish, Groups, Ledger, Published, RedisBus, RedisOptions,
    Streams,
};
use toolhost_envelope::{DEFECT_HEAD_BYTES, DefectKind};

use crate::support::{
    Daemon, RedisServer, answers_to, call_r1, deliver_one, payloads, request, settled, settled_within, xadd,
};

const REQUESTS: &str = "action-requests";
const RESULTS: &str = "action-results";
const GROUP: &str = "toolhost";
const WAIT: Duration = Duration::from_secs(20);

/// XADDs an entry whose fields are raw bytes, as any client can write them.
async fn xadd_raw(connection: &mut MultiplexedConnection, stream: &str, id: &[u8], payload: &[u8]) -> String {
    redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("id")
        .arg(id)
        .arg("payload")
        .arg(payload)
        .query_async(connection)
        .await
        .unwrap()
}

/// A request payload that is JSON but for one byte that is not UTF-8.
fn not_utf8_payload(n: usize) -> Vec<u8> {
    let mut raw = br#"{"type":"echo.requested","data":{"message":""#.to_vec();
    raw.extend_from_slice(&[0xff, 0xfe, b'0' + (n % 10) as u8]);
    raw.extend_from_slice(br#""}}"#);
    raw
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn sha1(bytes: &[u8]) -> String {
    sha1_smol::Sha1::from(bytes).digest().to_string()
}

/// The dead letters of `stream` once it holds `count`.
async fn letters(connection: &mut MultiplexedConnection, stream: &str, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let found = payloads(connection, stream).await;
        if found.len() >= count {
            return found;
        }
        assert!(Instant::now() < deadline, "{stream} holds {} of {count} letters: {found:#?}", found.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_that_are_not_utf8_are_dead_lettered_raw_and_every_valid_request_of_their_batch_is_answered()
{
    let redis = RedisServer::start();
    let daemon = Daemon::start(&redis, &[]);
    let mut connection = redis.connection().await;
    // Stopped while the entries are added, so they are read in batches, bad ones among good ones.
    daemon.signal(libc::SIGSTOP);
    let mut valid = Vec::new();
    let mut bad_payloads = Vec::new();
    for n in 0..40 {
        if n % 5 == 2 {
            let raw = not_utf8_payload(n);
            xadd_raw(&mut connection, REQUESTS, format!("m-bad-{n}").as_bytes(), &raw).await;
            bad_payloads.push(raw);
        } else {
            let request_id = format!("r-{n}");
            let envelope = request("echo.requested", &request_id, json!({"message": request_id}));
            xadd(&mut connection, REQUESTS, &envelope.to_string()).await;
            valid.push(request_id);
        }
    }
    // An `id` field that is not UTF-8, with a readable payload.
    let good_payload = request("echo.requested", "r-bad-id", json!({"message": "x"})).to_string();
    xadd_raw(&mut connection, REQUESTS, b"m-\xc3\x28", good_payload.as_bytes()).await;
    daemon.signal(libc::SIGCONT);

    settled(&mut connection, REQUESTS, GROUP).await;
    let results = payloads(&mut connection, RESULTS).await;
    for request_id in &valid {
        let found = answers_to(&results, request_id);
        assert_eq!(found.len(), 1, "{request_id}: {results:#?}");
        assert_eq!(found[0]["data"]["success"], true, "{request_id}: {:#?}", found[0]);
    }
    let letters = letters(&mut connection, "dlq:toolhost", bad_payloads.len() + 1).await;
    assert_eq!(letters.len(), bad_payloads.len() + 1, "{letters:#?}");
    for raw in &bad_payloads {
        let letter = letters
            .iter()
            .find(|letter| letter["defect"]["head_base64"] == base64(raw))
            .unwrap_or_else(|| panic!("no letter keeps {raw:?}: {letters:#?}"));
        assert_eq!(letter["payload"], Value::Null, "{letter:#}");
        assert_eq!(letter["defect"]["field"], "payload");
        assert_eq!(letter["defect"]["problem"], "not_utf8");
        assert_eq!(letter["defect"]["size"], raw.len());
        assert_eq!(letter["defect"]["sha1"], sha1(raw));
        assert!(letter["error"].as_str().unwrap().contains("not UTF-8"), "{letter:#}");
    }
    let bad_id = letters.iter().find(|letter| letter["defect"]["field"] == "id").unwrap();
    assert_eq!(bad_id["defect"]["head_base64"], base64(b"m-\xc3\x28"));
    assert_eq!(bad_id["payload"], good_payload, "a readable payload is kept as text: {bad_id:#}");
    assert_eq!(answers_to(&results, "r-bad-id").len(), 0);
}

fn chat_call(conversation_id: &str, message: &str) -> Value {
    json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "conversation_id": conversation_id,
        "sender": "agent:Planner",
        "recipient": "agent:ToolHost",
        "type": "message",
        "content": json!({"tool": "echo", "arguments": {"message": message}}).to_string(),
        "metadata": {},
        "created_at": chrono::Utc::now().to_rfc3339(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_entries_that_are_not_utf8_are_dead_lettered_raw_and_every_valid_message_is_answered() {
    let redis = RedisServer::start();
    let daemon = Daemon::start(&redis, &[]);
    let mut connection = redis.connection().await;
    daemon.signal(libc::SIGSTOP);
    let mut valid = HashSet::new();
    let mut bad_payloads = Vec::new();
    for n in 0..24 {
        if n % 4 == 1 {
            let mut raw = chat_call(&format!("conv-{n}"), "bad").to_string().into_bytes();
            // A byte that is not UTF-8 inside the content string.
            let at = raw.len() - 3;
            raw.insert(at, 0xc0);
            xadd_raw(&mut connection, "chat:ToolHost", format!("m-{n}").as_bytes(), &raw).await;
            bad_payloads.push(raw);
        } else {
            let message = chat_call(&format!("conv-{n}"), &format!("hello {n}"));
            valid.insert(message["id"].as_str().unwrap().to_owned());
            xadd(&mut connection, "chat:ToolHost", &message.to_string()).await;
        }
    }
    daemon.signal(libc::SIGCONT);

    settled(&mut connection, "chat:ToolHost", GROUP).await;
    let replies = payloads(&mut connection, "chat:Planner").await;
    let answered: HashSet<String> = replies
        .iter()
        .filter(|reply| reply["metadata"]["success"] == true)
        .filter_map(|reply| reply["metadata"]["in_reply_to"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(answered, valid, "{replies:#?}");
    assert_eq!(replies.len(), valid.len(), "one reply each: {replies:#?}");
    let letters = letters(&mut connection, "dlq:ToolHost", bad_payloads.len()).await;
    assert_eq!(letters.len(), bad_payloads.len(), "{letters:#?}");
    for raw in &bad_payloads {
        let letter = letters
            .iter()
            .find(|letter| letter["envelope"]["defect"]["head_base64"] == base64(raw))
            .unwrap_or_else(|| panic!("no letter keeps {raw:?}: {letters:#?}"));
        let keys: Vec<&str> = letter.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["agent", "conversation_id", "envelope", "error", "event"], "{letter:#}");
        assert_eq!(letter["event"], "dead_letter");
        assert_eq!(letter["envelope"]["defect"]["problem"], "not_utf8");
        assert_eq!(letter["envelope"]["defect"]["sha1"], sha1(raw));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_entry_is_dead_lettered_as_head_size_and_digest_and_the_request_after_it_is_answered() {
    let redis = RedisServer::start();
    // The default limit, 1 MiB.
    let daemon = Daemon::start(&redis, &[]);
    let mut connection = redis.connection().await;
    let big = |fill: u8| {
        let mut payload = br#"{"type":"echo.requested","data":{"message":""#.to_vec();
        payload.resize(3 * 1024 * 1024, fill);
        payload.extend_from_slice(br#""}}"#);
        payload
    };
    // One arrives while the daemon waits in its blocking read, one (stopped) is read by a batch.
    let first = big(b'a');
    xadd_raw(&mut connection, REQUESTS, b"m-big-1", &first).await;
    xadd(
        &mut connection,
        REQUESTS,
        &request("echo.requested", "r-after-1", json!({"message": "1"})).to_string(),
    )
    .await;
    daemon.signal(libc::SIGSTOP);
    let second = big(b'b');
    xadd_raw(&mut connection, REQUESTS, b"m-big-2", &second).await;
    xadd(
        &mut connection,
        REQUESTS,
        &request("echo.requested", "r-after-2", json!({"message": "2"})).to_string(),
    )
    .await;
    daemon.signal(libc::SIGCONT);

    settled(&mut connection, REQUESTS, GROUP).await;
    let results = payloads(&mut connection, RESULTS).await;
    for request_id in ["r-after-1", "r-after-2"] {
        let found = answers_to(&results, request_id);
        assert_eq!(found.len(), 1, "{request_id}: {results:#?}");
        assert_eq!(found[0]["data"]["success"], true);
    }
    let letters = letters(&mut connection, "dlq:toolhost", 2).await;
    assert_eq!(letters.len(), 2);
    for raw in [&first, &second] {
        let letter =
            letters.iter().find(|letter| letter["defect"]["sha1"] == sha1(raw)).unwrap_or_else(|| {
                panic!(
                    "no letter with the digest of the whole payload: {:?}",
                    letters.iter().map(|l| &l["defect"]).collect::<Vec<_>>()
                )
            });
        assert_eq!(letter["payload"], Value::Null);
        assert_eq!(letter["defect"]["problem"], "too_large");
        assert_eq!(letter["defect"]["size"], raw.len());
        assert_eq!(letter["defect"]["head_bytes"], DEFECT_HEAD_BYTES);
        assert_eq!(letter["defect"]["head_base64"], base64(&raw[..DEFECT_HEAD_BYTES]));
        assert_eq!(letter["defect"]["truncated"], true);
        assert!(letter["error"].as_str().unwrap().contains("exceeds the limit"), "{}", letter["error"]);
    }
    // A letter is the 64 KiB head in base64 plus a few hundred bytes, not the 3 MiB payload.
    let sizes: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg("dlq:toolhost")
        .arg("-")
        .arg("+")
        .query_async(&mut connection)
        .await
        .unwrap();
    for (_, fields) in sizes {
        let payload = &fields.iter().find(|(name, _)| name == "payload").unwrap().1;
        assert!(payload.len() < DEFECT_HEAD_BYTES * 4 / 3 + 2048, "letter of {} bytes", payload.len());
    }
}

fn bus(redis: &RedisServer, max_field_bytes: usize) -> RedisBus {
    bus_reading(redis, max_field_bytes, false)
}

/// A bus whose group reads go through the read script (`script_reads`), as on TLS, Sentinel
/// and Cluster, or through its own connection that cuts values as they arrive.
fn bus_reading(redis: &RedisServer, max_field_bytes: usize, script_reads: bool) -> RedisBus {
    let mut options = RedisOptions::new(redis.url());
    options.max_field_bytes = max_field_bytes;
    options.script_reads = script_reads;
    RedisBus::new(options).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_reads_and_reclaims_decode_each_entry_on_its_own_and_cut_values_over_the_limit() {
    for script_reads in [false, true] {
        reads_cut_values_over_the_limit(script_reads).await;
    }
}

async fn reads_cut_values_over_the_limit(script_reads: bool) {
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let bus = bus_reading(&redis, 1024, script_reads);
    bus.ensure_group(REQUESTS, GROUP).await.unwrap();
    let large = vec![b'z'; 200_000];
    xadd_raw(&mut connection, REQUESTS, b"m-good", b"{}").await;
    xadd_raw(&mut connection, REQUESTS, b"m-raw", b"\xff{}").await;
    xadd_raw(&mut connection, REQUESTS, b"m-large", &large).await;
    xadd_raw(&mut connection, REQUESTS, b"m-good-2", b"{}").await;
    let check = |entries: &[toolhost_envelope::Entry]| {
        let ids: Vec<&str> = entries.iter().map(|entry| entry.id.as_str()).collect();
        assert_eq!(ids, ["m-good", "m-raw", "m-large", "m-good-2"]);
        assert_eq!((entries[0].payload.as_deref(), &entries[0].defect), (Some("{}"), &None));
        let raw = entries[1].defect.as_ref().unwrap();
        assert_eq!((raw.kind, raw.head.as_slice(), raw.size), (DefectKind::NotUtf8, b"\xff{}".as_slice(), 3));
        let cut = entries[2].defect.as_ref().unwrap();
        assert_eq!((cut.kind, cut.head.len(), cut.size), (DefectKind::TooLarge, DEFECT_HEAD_BYTES, 200_000));
        assert_eq!(cut.sha1, sha1(&large));
        assert_eq!(entries[2].payload, None);
        assert_eq!(entries[3].payload.as_deref(), Some("{}"));
    };
    let read = bus.read_group(REQUESTS, GROUP, "c1", 10, Duration::from_millis(10)).await.unwrap();
    check(&read);
    let reclaimed = bus.reclaim(REQUESTS, GROUP, "c2", Duration::ZERO, "0-0", 10).await.unwrap();
    assert!(reclaimed.entries.iter().all(|entry| entry.deliveries == 2));
    check(&reclaimed.entries);

    // An entry that arrives during a blocking read is read alone, and cut on this side.
    let waiting = tokio::spawn({
        let bus = bus;
        async move { bus.read_group(REQUESTS, GROUP, "c1", 10, Duration::from_secs(10)).await }
    });
    let deadline = Instant::now() + WAIT;
    while blocked_clients(&mut connection).await == 0 {
        assert!(Instant::now() < deadline, "the read never blocked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    xadd_raw(&mut connection, REQUESTS, b"m-late", &large).await;
    let late = waiting.await.unwrap().unwrap();
    assert_eq!(late.len(), 1);
    let cut = late[0].defect.as_ref().unwrap();
    assert_eq!((cut.kind, cut.head.len(), cut.size), (DefectKind::TooLarge, DEFECT_HEAD_BYTES, 200_000));
    assert_eq!(cut.sha1, sha1(&large));
}

async fn blocked_clients(connection: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO").arg("clients").query_async(connection).await.unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("blocked_clients:"))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

async fn set_maxmemory(connection: &mut MultiplexedConnection, bytes: u64) {
    let () =
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(bytes).query_async(connection).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_inside_ledger_scripts_is_retryable_and_renewal_and_reads_go_on() {
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let bus = bus(&redis, 1024 * 1024);
    let entry_id = deliver_one(&bus, REQUESTS, GROUP).await;
    let call = call_r1(Duration::from_secs(30));
    assert_eq!(bus.begin_call(&call, "c1/1", &entry_id).await.unwrap(), CallStart::Fresh);
    let entry = EntryRef { topic: REQUESTS, group: GROUP, entry_id: &entry_id };
    let finish = Finish {
        entry,
        call: Some(call),
        answer: Some(Published { topic: RESULTS, id: "answer-1", payload: "{}" }),
        answer_copy: None,
        dead_letter: None,
        final_answer: true,
        tracked: true,
        kept: None,
        replay: false,
    };

    // Below what is in use, with the default noeviction: every write that may grow memory fails.
    set_maxmemory(&mut connection, 1).await;
    assert!(bus.renew_call(&call, "c1/1", &entry, "c1", true).await.unwrap(), "the lease was renewed");
    let other =
        CallKeys { answered: "toolhost:toolhost:answered:r-2", call: "toolhost:toolhost:call:r-2", ..call };
    let begun = bus.begin_call(&other, "c1/2", &entry_id).await.unwrap_err();
    assert!(begun.is_retryable(), "{begun}");
    assert!(begun.to_string().contains("OOM"), "{begun}");
    let finished = bus.finish(&finish).await.unwrap_err();
    assert!(finished.is_retryable(), "{finished}");
    // Reads go on, so a daemon keeps its consumers alive and answers as soon as writes pass.
    assert!(bus.read_group(REQUESTS, GROUP, "c1", 10, Duration::from_millis(10)).await.unwrap().is_empty());
    let reclaimed = bus.reclaim(REQUESTS, GROUP, "c2", Duration::from_secs(60), "0-0", 10).await.unwrap();
    assert!(reclaimed.entries.is_empty());

    set_maxmemory(&mut connection, 0).await;
    assert_eq!(bus.finish(&finish).await.unwrap(), Committed::Published);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_queued_through_an_out_of_memory_spell_are_all_answered_success_and_none_dead_lettered() {
    let redis = RedisServer::start();
    // A lease far longer than the spell: nothing may wait for a reclaim to be answered.
    let daemon = Daemon::start(
        &redis,
        &[("TOOLHOST__DISPATCH__CLAIM_IDLE_MS", "20000"), ("TERMINAL_ALLOWED_COMMANDS", "echo")],
    );
    let mut connection = redis.connection().await;
    daemon.signal(libc::SIGSTOP);
    let mut ids = Vec::new();
    for n in 0..20 {
        let request_id = format!("oom-{n}");
        // echo skips the call record (only the final commit writes); terminal_run records its start.
        let envelope = if n % 4 == 0 {
            request("terminal_run.requested", &request_id, json!({"command": format!("echo {n}")}))
        } else {
            request("echo.requested", &request_id, json!({"message": request_id}))
        };
        xadd(&mut connection, REQUESTS, &envelope.to_string()).await;
        ids.push(request_id);
    }
    set_maxmemory(&mut connection, 1).await;
    daemon.signal(libc::SIGCONT);
    // The daemon hits the limit and retries...
    daemon.wait_for_log("OOM", WAIT);
    // ...for a few seconds more, well inside the lease, so the retries span many backoff steps.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        payloads(&mut connection, RESULTS).await.is_empty(),
        "nothing can be answered while Redis refuses writes"
    );
    let lifted = Instant::now();
    set_maxmemory(&mut connection, 0).await;

    settled_within(&mut connection, REQUESTS, GROUP, Duration::from_secs(10)).await;
    let results = payloads(&mut connection, RESULTS).await;
    for request_id in &ids {
        let found = answers_to(&results, request_id);
        assert_eq!(found.len(), 1, "{request_id}: {results:#?}");
        assert_eq!(found[0]["data"]["success"], true, "{request_id}: {:#?}", found[0]);
    }
    assert!(
        lifted.elapsed() < Duration::from_secs(10),
        "answered {:?} after the limit was lifted",
        lifted.elapsed()
    );
    assert!(payloads(&mut connection, "dlq:toolhost").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_policy_that_may_drop_answered_marks_is_warned_about_at_start() {
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut connection)
        .await
        .unwrap();
    let daemon = Daemon::start(&redis, &[]);
    daemon.wait_for_log("\"maxmemory_policy\":\"allkeys-lru\"", WAIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_reads_on_their_own_connection_log_in_as_the_urls_user_and_read_its_database() {
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "reader", "on", ">reader-pw", "~*", "&*", "+@all"][..])
        .query_async(&mut connection)
        .await
        .unwrap();
    let mut options = RedisOptions::new(format!("redis://reader:reader-pw@127.0.0.1:{}/3", redis.port()));
    options.max_field_bytes = 1024;
    let bus = RedisBus::new(options).unwrap();
    bus.ensure_group(REQUESTS, GROUP).await.unwrap();
    // Nothing yet: the blocking read waits its time and comes back empty.
    assert!(bus.read_group(REQUESTS, GROUP, "c1", 10, Duration::from_millis(20)).await.unwrap().is_empty());
    bus.publish(REQUESTS, "m-1", "{}").await.unwrap();
    let read = bus.read_group(REQUESTS, GROUP, "c1", 10, Duration::from_millis(20)).await.unwrap();
    assert_eq!(read.iter().map(|entry| entry.id.as_str()).collect::<Vec<_>>(), ["m-1"]);
    // The stream is in database 3 only, and the reads went there as the URL's user.
    let () = redis::cmd("SELECT").arg(3).query_async(&mut connection).await.unwrap();
    let pending: redis::Value =
        redis::cmd("XPENDING").arg(REQUESTS).arg(GROUP).query_async(&mut connection).await.unwrap();
    assert!(
        matches!(&pending, redis::Value::Array(parts) if parts.first() == Some(&redis::Value::Int(1))),
        "{pending:?}"
    );
    let () = redis::cmd("SELECT").arg(0).query_async(&mut connection).await.unwrap();
    let exists: u8 = redis::cmd("EXISTS").arg(REQUESTS).query_async(&mut connection).await.unwrap();
    assert_eq!(exists, 0);
    let clients: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut connection).await.unwrap();
    assert!(
        clients.lines().any(|line| line.contains("user=reader") && line.contains("cmd=xreadgroup")),
        "{clients}"
    );

    // A wrong password fails the read as Redis said it, and nothing panics.
    let wrong = RedisBus::new(RedisOptions::new(format!("redis://reader:nope@127.0.0.1:{}/3", redis.port())))
        .unwrap();
    let err = wrong.read_group(REQUESTS, GROUP, "c2", 10, Duration::from_millis(20)).await.unwrap_err();
    assert!(err.to_string().contains("WRONGPASS"), "{err}");
}
