//! toolhost on a Redis Cluster (issue 16, part 2): the same contract as on one server. Requests
//! are answered exactly once with response topics spread over the slots, across a replica
//! killed mid-run, for duplicates naming another response topic, and across a coordinated
//! failover of the shard holding the requests stream; the chat inbox, discovery, the client
//! subcommands (`dlq replay` too, and the console's Replay) and `tool.cancel` (forwarded between replicas, answered from the
//! claims) work there too.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use redis::cluster::ClusterConnection;
use serde_json::{Value, json};
use toolhost_e2e::cluster::{RedisCluster, payloads};
use toolhost_e2e::{RedisProcess, Toolhost, toolhost_bin};

const REQUESTS: &str = "action-requests";
const GROUP: &str = "toolhost";
/// Response topics callers name (allowed by the default `results:*` pattern).
const TOPICS: usize = 8;
const WAIT: Duration = Duration::from_secs(90);

fn topic(index: usize) -> String {
    format!("results:{index}")
}

/// The daemon's environment on `cluster`: REDIS_URL as compose and Kubernetes set it (it only
/// lends its scheme and credentials here), the nodes, short leases, `sleep` allowed.
fn env_with_prefix(cluster: &RedisCluster, prefix: &str) -> Vec<(String, String)> {
    vec![
        ("TOOLHOST__REDIS__KEY_PREFIX".to_owned(), prefix.to_owned()),
        ("REDIS_URL".to_owned(), cluster.nodes()[0].url()),
        ("TOOLHOST__REDIS__CLUSTER_NODES".to_owned(), cluster.nodes_env()),
        ("TOOLHOST__DISPATCH__CLAIM_IDLE_MS".to_owned(), "1500".to_owned()),
        ("TOOLHOST__DISPATCH__BLOCK_MS".to_owned(), "500".to_owned()),
        ("TERMINAL_ALLOWED_COMMANDS".to_owned(), "sleep".to_owned()),
        ("TERMINAL_MAX_CONCURRENT".to_owned(), "64".to_owned()),
    ]
}

/// [`env_with_prefix`] with the ledger written in `format` (`[dispatch] ledger_format`; 1, the
/// default, writes a cluster's claims as hashes, 3 as strings).
fn env_in_format(cluster: &RedisCluster, prefix: &str, format: u8) -> Vec<(String, String)> {
    let mut env = env_with_prefix(cluster, prefix);
    env.push(("TOOLHOST__DISPATCH__LEDGER_FORMAT".to_owned(), format.to_string()));
    env
}

fn start(cluster: &RedisCluster) -> Toolhost {
    start_with_prefix(cluster, "")
}

fn start_in_format(cluster: &RedisCluster, prefix: &str, format: u8) -> Toolhost {
    let env = env_in_format(cluster, prefix, format);
    let pairs: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    Toolhost::start(&pairs)
}

/// The Redis type of the claim at `key` (`hash` in ledger formats 1 and 2, `string` in format 3,
/// `none`) and what it holds, read as its type is.
fn claim_at(connection: &mut ClusterConnection, key: &str) -> (String, toolhost_bus::Claim) {
    let shape: String = redis::cmd("TYPE").arg(key).query(connection).unwrap();
    let claim = if shape == "string" {
        let value: String = redis::cmd("GET").arg(key).query(connection).unwrap();
        toolhost_bus::Claim::from_value(&value).unwrap_or_else(|| panic!("not a claim at {key}: {value:?}"))
    } else {
        let fields: Vec<(String, String)> = redis::cmd("HGETALL").arg(key).query(connection).unwrap();
        toolhost_bus::Claim::from_fields(fields).unwrap_or_default()
    };
    (shape, claim)
}

fn start_with_prefix(cluster: &RedisCluster, prefix: &str) -> Toolhost {
    let env = env_with_prefix(cluster, prefix);
    let pairs: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    Toolhost::start(&pairs)
}

/// A request envelope (contract section 2) answered on `response_topic`, whose correlation id
/// is its own envelope id: each entry's answer can be told from its copies'.
fn request(event_type: &str, request_id: &str, data: Value, response_topic: &str) -> Value {
    let mut data = data;
    data["request_id"] = Value::String(request_id.to_owned());
    let id = uuid::Uuid::new_v4().to_string();
    json!({
        "id": id,
        "source": "agent:planner",
        "specversion": "1.0",
        "type": event_type,
        "topic": REQUESTS,
        "data": data,
        "correlation_id": id,
        "response_topic": response_topic,
    })
}

fn xadd(connection: &mut ClusterConnection, stream: &str, payload: &Value) -> String {
    redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("id")
        .arg(uuid::Uuid::new_v4().to_string())
        .arg("payload")
        .arg(payload.to_string())
        .query(connection)
        .expect("XADD")
}

/// Answers per request id over every response topic (under `prefix`), each with the bare topic
/// it was found on.
fn answers(connection: &mut ClusterConnection, prefix: &str) -> BTreeMap<String, Vec<(String, Value)>> {
    let mut all: BTreeMap<String, Vec<(String, Value)>> = BTreeMap::new();
    for index in 0..TOPICS {
        for answer in payloads(connection, &format!("{prefix}{}", topic(index))) {
            let id = answer["data"]["request_id"].as_str().unwrap_or_default().to_owned();
            all.entry(id).or_default().push((topic(index), answer));
        }
    }
    all
}

/// Pending entries and lag of the group on the requests stream (under `prefix`).
fn backlog(connection: &mut ClusterConnection, prefix: &str) -> (u64, Option<u64>) {
    let requests = format!("{prefix}{REQUESTS}");
    let summary: redis::Value =
        redis::cmd("XPENDING").arg(&requests).arg(GROUP).query(connection).expect("XPENDING");
    let pending = match summary {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(count)) => *count as u64,
            _ => 0,
        },
        _ => 0,
    };
    let groups: Vec<redis::Value> =
        redis::cmd("XINFO").arg("GROUPS").arg(&requests).query(connection).expect("XINFO");
    let lag = groups.into_iter().find_map(|group| {
        let redis::Value::Array(fields) = group else { return None };
        let text = |value: &redis::Value| match value {
            redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            redis::Value::SimpleString(text) => text.clone(),
            _ => String::new(),
        };
        let ours = fields.chunks(2).any(|pair| text(&pair[0]) == "name" && text(&pair[1]) == GROUP);
        let lag = fields.chunks(2).find(|pair| text(&pair[0]) == "lag").and_then(|pair| match pair[1] {
            redis::Value::Int(lag) => u64::try_from(lag).ok(),
            _ => None,
        });
        if ours { lag } else { None }
    });
    (pending, lag)
}

/// Waits until every id in `ids` has an answer and every request entry is delivered and acked
/// (so no late duplicate can still come), then asserts each id was answered exactly once, on a
/// topic one of its requests named: a copy sent after the answer may get the original answer
/// again (the same `data`, on its own topic), but no entry is answered twice and no id gets two
/// different answers. Returns each id's answer (the first found, by topic).
fn assert_answered_once(
    connection: &mut ClusterConnection,
    ids: &BTreeMap<String, BTreeSet<String>>,
    daemons: &[&Toolhost],
) -> BTreeMap<String, (String, Value)> {
    assert_answered_once_under(connection, "", ids, daemons)
}

/// [`assert_answered_once`] with every key under `prefix`.
fn assert_answered_once_under(
    connection: &mut ClusterConnection,
    prefix: &str,
    ids: &BTreeMap<String, BTreeSet<String>>,
    daemons: &[&Toolhost],
) -> BTreeMap<String, (String, Value)> {
    let deadline = Instant::now() + WAIT;
    loop {
        let found = answers(connection, prefix);
        let (pending, lag) = backlog(connection, prefix);
        if ids.keys().all(|id| found.contains_key(id)) && pending == 0 && lag == Some(0) {
            break;
        }
        if Instant::now() > deadline {
            for daemon in daemons {
                eprintln!("---- toolhost log ----\n{}", daemon.log());
            }
            let missing: Vec<&String> = ids.keys().filter(|id| !found.contains_key(*id)).collect();
            panic!("not settled: pending {pending}, lag {lag:?}, missing answers {missing:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let found = answers(connection, prefix);
    let doubled: Vec<(&String, Vec<&String>)> = found
        .iter()
        .filter(|(_, all)| {
            let datas: BTreeSet<String> = all.iter().map(|(_, answer)| answer["data"].to_string()).collect();
            let entries: BTreeSet<&str> =
                all.iter().map(|(_, answer)| answer["correlation_id"].as_str().unwrap_or_default()).collect();
            datas.len() > 1 || entries.len() < all.len()
        })
        .map(|(id, all)| (id, all.iter().map(|(topic, _)| topic).collect()))
        .collect();
    let strangers: Vec<&String> = found.keys().filter(|id| !ids.contains_key(*id)).collect();
    let misplaced: Vec<(&String, &String)> = found
        .iter()
        .filter_map(|(id, all)| all.first().map(|(topic, _)| (id, topic)))
        .filter(|(id, topic)| ids.get(*id).is_some_and(|named| !named.contains(*topic)))
        .collect();
    if !doubled.is_empty() || !strangers.is_empty() || !misplaced.is_empty() {
        for daemon in daemons {
            eprintln!("---- toolhost log ----\n{}", daemon.log());
        }
        panic!(
            "answered more than once: {doubled:?}; unexpected: {strangers:?}; on a topic not named: {misplaced:?}"
        );
    }
    found.into_iter().map(|(id, mut all)| (id, all.remove(0))).collect()
}

/// No script or command met keys of several slots (`CROSSSLOT`), touched a key another node
/// serves from a script, or was refused for good while committing.
fn assert_no_slot_errors(toolhost: &Toolhost) {
    let log = toolhost.log();
    for needle in [
        "CROSSSLOT",
        "non local key",
        "different cluster slots",
        "cannot commit answer; leaving",
        "cannot record call start\"",
    ] {
        assert!(!log.contains(needle), "{needle}:\n{log}");
    }
}

/// The requests of a run: `count` ids over the topics, every fifth a one-second `sleep` (not
/// idempotent), the rest `echo` (read-only, idempotent: no call record).
fn originals(prefix: &str, count: usize) -> Vec<(String, Value, String)> {
    (0..count)
        .map(|index| {
            let id = format!("{prefix}-{index}");
            let to = topic(index % TOPICS);
            let payload = if index.is_multiple_of(5) {
                request("terminal_run.requested", &id, json!({"command": "sleep 1"}), &to)
            } else {
                request("echo.requested", &id, json!({"message": id}), &to)
            };
            (id, payload, to)
        })
        .collect()
}

/// Re-sent copies of some requests: same request id, same tool, half naming another response
/// topic and half the same one.
fn duplicates(originals: &[(String, Value, String)]) -> Vec<(String, Value, String)> {
    originals
        .iter()
        .enumerate()
        .filter(|(index, _)| index % 6 == 1 || index % 10 == 0)
        .map(|(index, (id, payload, to))| {
            let other = if index % 2 == 0 { topic((index + 3) % TOPICS) } else { to.clone() };
            let mut copy = payload.clone();
            let entry = uuid::Uuid::new_v4().to_string();
            copy["id"] = Value::String(entry.clone());
            copy["correlation_id"] = Value::String(entry);
            copy["response_topic"] = Value::String(other.clone());
            (id.clone(), copy, other)
        })
        .collect()
}

fn named_topics(requests: &[&[(String, Value, String)]]) -> BTreeMap<String, BTreeSet<String>> {
    let mut named: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for list in requests {
        for (id, _, to) in *list {
            named.entry(id.clone()).or_default().insert(to.clone());
        }
    }
    named
}

fn assert_topics_spread(cluster: &RedisCluster) {
    let slots: BTreeSet<u16> = (0..TOPICS).map(|index| cluster.slot(&topic(index))).collect();
    let masters: BTreeSet<u16> = slots.iter().map(|slot| cluster.master_of(*slot).port()).collect();
    assert_eq!(slots.len(), TOPICS, "the response topics should hash to distinct slots");
    assert!(masters.len() >= 2, "the response topics should live on several masters: {masters:?}");
    assert_ne!(cluster.slot(REQUESTS), cluster.slot(&topic(0)));
}

#[test]
fn two_replicas_answer_every_request_once_across_a_kill_and_duplicates_naming_other_topics() {
    let cluster = RedisCluster::start(3, 0);
    assert_topics_spread(&cluster);
    let mut first = start(&cluster);
    let second = start(&cluster);
    let mut connection = cluster.connection();

    let originals = originals("k", 300);
    let duplicates = duplicates(&originals);
    let (early, late) = originals.split_at(150);
    for (_, payload, _) in early {
        xadd(&mut connection, REQUESTS, payload);
    }
    // Let the first replica take sleeps and echoes, then kill it mid-run.
    std::thread::sleep(Duration::from_millis(400));
    first.kill9();
    for (_, payload, _) in late.iter().chain(&duplicates) {
        xadd(&mut connection, REQUESTS, payload);
    }

    let named = named_topics(&[&originals, &duplicates]);
    let answered = assert_answered_once(&mut connection, &named, &[&second]);
    assert_eq!(answered.len(), 300);
    let mut interrupted = 0;
    for (id, (_, answer)) in &answered {
        let data = &answer["data"];
        let index: usize = id.trim_start_matches("k-").parse().unwrap();
        if index.is_multiple_of(5) {
            // A sleep whose holder was killed is answered `interrupted`, never run twice.
            if data["success"] == false {
                assert_eq!(data["error_code"], "interrupted", "{answer}");
                interrupted += 1;
            }
        } else {
            assert_eq!(data["success"], true, "{answer}");
            assert_eq!(data["result"]["message"], id.as_str(), "{answer}");
        }
    }
    eprintln!("{} duplicates sent, {interrupted} sleeps answered interrupted", duplicates.len());
    assert_no_slot_errors(&second);
}

#[test]
fn a_duplicate_naming_another_topic_is_acked_unanswered_and_late_copies_get_the_original_answer() {
    duplicates_and_late_copies_are_answered_once(1);
}

/// The same in ledger format 3 (a claim is a string): on the three-step finish (`prod:`) and the
/// one-script answer (`{th}:`).
#[test]
fn a_duplicate_naming_another_topic_is_acked_unanswered_and_late_copies_get_the_original_answer_in_ledger_format_3()
 {
    duplicates_and_late_copies_are_answered_once(3);
}

fn duplicates_and_late_copies_are_answered_once(format: u8) {
    let cluster = RedisCluster::start(3, 0);
    // A plain prefix (keys spread over the shards, ledger keys tagged into their slots) and a
    // prefix that is a hash tag (every key in one slot).
    for prefix in ["prod:", "{th}:"] {
        let toolhost = start_in_format(&cluster, prefix, format);
        let mut connection = cluster.connection();
        let requests = format!("{prefix}{REQUESTS}");
        // A slow, non-idempotent call and a copy naming another topic while it runs.
        let slow = |to: &str| request("terminal_run.requested", "d-1", json!({"command": "sleep 1"}), to);
        xadd(&mut connection, &requests, &slow(&topic(1)));
        std::thread::sleep(Duration::from_millis(300));
        xadd(&mut connection, &requests, &slow(&topic(2)));
        // An idempotent call.
        xadd(
            &mut connection,
            &requests,
            &request("echo.requested", "d-2", json!({"message": "x"}), &topic(3)),
        );
        let named = named_topics(&[&[
            ("d-1".to_owned(), Value::Null, topic(1)),
            ("d-2".to_owned(), Value::Null, topic(3)),
        ]]);
        let answered = assert_answered_once_under(&mut connection, prefix, &named, &[&toolhost]);
        assert_eq!(answered["d-1"].0, topic(1));
        assert_eq!(answered["d-1"].1["data"]["success"], true);
        let original = answered["d-1"].1["data"].clone();
        // Late copies of the answered echo, naming other topics and the same one, and of the
        // non-idempotent call: each gets the original answer on its own topic, and nothing runs
        // again with an effect.
        for to in [topic(4), topic(3), topic(5)] {
            xadd(
                &mut connection,
                &requests,
                &request("echo.requested", "d-2", json!({"message": "again"}), &to),
            );
        }
        xadd(&mut connection, &requests, &slow(&topic(6)));
        let named = named_topics(&[&[
            ("d-1".to_owned(), Value::Null, topic(1)),
            ("d-1".to_owned(), Value::Null, topic(6)),
            ("d-2".to_owned(), Value::Null, topic(3)),
            ("d-2".to_owned(), Value::Null, topic(4)),
            ("d-2".to_owned(), Value::Null, topic(5)),
        ]]);
        let answered = assert_answered_once_under(&mut connection, prefix, &named, &[&toolhost]);
        assert_eq!(answered["d-2"].1["data"]["result"]["message"], "x");
        let all = answers(&mut connection, prefix);
        let on: BTreeSet<&str> = all["d-2"].iter().map(|(topic, _)| topic.as_str()).collect();
        assert_eq!(all["d-2"].len(), 4, "the original and three kept answers: {:?}", all["d-2"]);
        assert_eq!(on, [topic(3), topic(4), topic(5)].iter().map(String::as_str).collect());
        assert_eq!(all["d-1"].len(), 2, "{:?}", all["d-1"]);
        assert!(
            all["d-1"].iter().any(|(topic, answer)| *topic == self::topic(6) && answer["data"] == original)
        );
        let log = toolhost.log();
        assert_eq!(log.matches("\"outcome\":\"replayed\"").count(), 4, "{log}");
        // The copy sent while the call ran is acked unanswered.
        assert!(log.matches("\"outcome\":\"duplicate\"").count() >= 1, "{log}");
        let shape = if format == 3 { "string" } else { "hash" };
        assert_ledger_placement(&cluster, prefix, &requests, &format!("{prefix}{}", topic(3)), shape);
        assert_no_slot_errors(&toolhost);
    }
}

/// The HTML of the console at `port`'s page `path`.
fn console_page(port: u16, path: &str) -> String {
    let (status, page) = toolhost_e2e::mcp_http::raw(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(status, 200, "{path}: {page}");
    page
}

/// The console's address from its log line.
fn console_port(toolhost: &Toolhost) -> u16 {
    toolhost
        .log()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["message"] == "console listening")
        .and_then(|line| line["address"].as_str()?.rsplit_once(':')?.1.parse().ok())
        .unwrap_or_else(|| panic!("no `console listening` line with an address:\n{}", toolhost.log()))
}

/// The Python client on a cluster, with the daemon's settings names (`cluster_nodes` from the
/// same environment, or as a keyword argument): a call, one whose request must reach a replica
/// (`replica_acks`), discovery of the fleet's tools, and a sharded stream (`shards=`).
#[test]
fn the_python_client_calls_on_a_cluster_with_the_daemons_settings_names() {
    let cluster = RedisCluster::start(3, 1);
    let mut env = env_with_prefix(&cluster, "");
    env.push(("TOOLHOST__STREAMS__SHARDS".to_owned(), "6".to_owned()));
    let pairs: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let toolhost = Toolhost::start(&pairs);
    let client_env =
        [("REDIS_URL", cluster.nodes()[0].url()), ("TOOLHOST__REDIS__CLUSTER_NODES", cluster.nodes_env())];
    let script = r#"
import toolhost
with toolhost.Client(shards=6) as client:
    print(client.call("echo", {"message": "on the cluster"}, timeout=20))
    print(client.call("echo", {"message": "replicated"}, timeout=20, replica_acks=1))
    print(sorted(tool["name"] for tool in client.tools()))
"#;
    let (code, stdout, stderr) = toolhost_e2e::python_client(script, &client_env);
    assert_eq!(code, 0, "{stdout}\n{stderr}\n{}", toolhost.log());
    assert!(stdout.contains("on the cluster") && stdout.contains("replicated"), "{stdout}\n{stderr}");
    assert!(stdout.contains("'echo'"), "{stdout}");
    let script = format!(
        r#"
import toolhost
with toolhost.Client("{}", cluster_nodes="{}", shards=6) as client:
    print(client.call("echo", {{"message": "by keyword"}}, timeout=20))
"#,
        cluster.nodes()[0].url(),
        cluster.nodes_env()
    );
    let (code, stdout, stderr) = toolhost_e2e::python_client(&script, &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("by keyword"), "{stdout}\n{stderr}");
    // Every request went to its home shard: nothing was moved.
    assert!(!toolhost.log().contains("\"outcome\":\"moved\""), "{}", toolhost.log());
}

/// Cluster parity with one server: a caller that lost its answer and sends the request again
/// (a new entry, the same request id) gets the original answer on its own topic, the tool not
/// run again; and the console's call page shows the answer, read from the request's claim.
#[test]
fn a_retry_gets_its_original_answer_and_the_console_shows_it_on_a_cluster() {
    a_retry_gets_its_original_answer_and_the_console_shows_it(1);
}

/// The same in ledger format 3: the kept answer and the console's read of it come from a claim
/// that is a string.
#[test]
fn a_retry_gets_its_original_answer_and_the_console_shows_it_on_a_cluster_in_ledger_format_3() {
    a_retry_gets_its_original_answer_and_the_console_shows_it(3);
}

fn a_retry_gets_its_original_answer_and_the_console_shows_it(format: u8) {
    let cluster = RedisCluster::start(3, 0);
    let mut env = env_in_format(&cluster, "", format);
    env.push(("TOOLHOST__CONSOLE__LISTEN".to_owned(), "127.0.0.1:0".to_owned()));
    let pairs: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let toolhost = Toolhost::start(&pairs);
    let mut connection = cluster.connection();
    // A non-idempotent call (a retry must not run it again) and an idempotent one.
    let slow = |to: &str| request("terminal_run.requested", "kr-1", json!({"command": "sleep 1"}), to);
    let echo = |message: &str, to: &str| request("echo.requested", "kr-2", json!({"message": message}), to);
    xadd(&mut connection, REQUESTS, &slow(&topic(1)));
    xadd(&mut connection, REQUESTS, &echo("kept", &topic(2)));
    let named = named_topics(&[&[
        ("kr-1".to_owned(), Value::Null, topic(1)),
        ("kr-2".to_owned(), Value::Null, topic(2)),
    ]]);
    let first = assert_answered_once(&mut connection, &named, &[&toolhost]);
    assert_eq!(first["kr-1"].1["data"]["success"], true, "{:?}", first["kr-1"]);

    // The retries, each on a topic of its own, and one on the original's topic.
    let retries = [slow(&topic(5)), echo("changed", &topic(6)), echo("changed", &topic(2))];
    for retry in &retries {
        xadd(&mut connection, REQUESTS, retry);
    }
    let named = named_topics(&[&[
        ("kr-1".to_owned(), Value::Null, topic(1)),
        ("kr-1".to_owned(), Value::Null, topic(5)),
        ("kr-2".to_owned(), Value::Null, topic(2)),
        ("kr-2".to_owned(), Value::Null, topic(6)),
    ]]);
    assert_answered_once(&mut connection, &named, &[&toolhost]);
    let all = answers(&mut connection, "");
    for retry in &retries {
        let id = retry["data"]["request_id"].as_str().unwrap();
        let to = retry["response_topic"].as_str().unwrap();
        let original = &first[id].1;
        let replayed = all[id]
            .iter()
            .find(|(_, answer)| answer["correlation_id"] == retry["correlation_id"])
            .unwrap_or_else(|| panic!("no answer to the retry {retry}: {:?}", all[id]));
        assert_eq!(replayed.0, to, "on the retry's own topic");
        assert_eq!(replayed.1["data"], original["data"], "the original answer's data");
        assert_ne!(replayed.1["id"], original["id"], "a message of its own");
    }
    assert_eq!(all["kr-2"][0].1["data"]["result"]["message"], "kept");
    let log = toolhost.log();
    assert_eq!(log.matches("\"outcome\":\"replayed\"").count(), 3, "{log}");
    // The sleep ran once: one call of it logged as run.
    assert_eq!(log.matches("\"message\":\"sleep 1\"").count(), 0, "no argument logged");
    assert_no_slot_errors(&toolhost);

    // The call page of the first echo shows the answer the ledger kept, from the claim.
    let calls: Vec<(String, std::collections::HashMap<String, String>)> =
        redis::cmd("XRANGE").arg("calls:toolhost").arg("-").arg("+").query(&mut connection).unwrap();
    let (log_id, _) = calls
        .iter()
        .find(|(_, fields)| {
            fields.get("id").map(String::as_str) == Some("kr-2")
                && fields.get("payload").is_some_and(|payload| payload.contains("\"outcome\":\"success\""))
        })
        .unwrap_or_else(|| panic!("the call is logged: {calls:?}"));
    let page = console_page(console_port(&toolhost), &format!("/calls/toolhost/{log_id}"));
    let answer = page
        .split_once("<pre id=\"call-answer\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .map(|(answer, _)| answer)
        .unwrap_or_else(|| panic!("no answer on the page:\n{page}"));
    let original_id = first["kr-2"].1["id"].as_str().unwrap();
    assert!(answer.contains(original_id), "the original answer's message id: {answer}");
    assert!(answer.contains("kept") && !answer.contains("no answered mark"), "{answer}");
}

/// Every ledger key of `d-2` lives where CONTRACTS.md says: the claim, the call record and the
/// refusal copies in the requests stream's slot, the answered mark in its response topic's. The
/// claim is of Redis type `shape` (`hash` before ledger format 3, `string` in it).
fn assert_ledger_placement(
    cluster: &RedisCluster,
    prefix: &str,
    requests: &str,
    answer_topic: &str,
    shape: &str,
) {
    let mut keys: Vec<String> = Vec::new();
    for node in cluster.nodes() {
        let mut connection = node.connection();
        let found: Vec<String> =
            redis::cmd("KEYS").arg(format!("{prefix}*toolhost:ledger:*d-2")).query(&mut connection).unwrap();
        keys.extend(found);
    }
    keys.sort();
    keys.dedup();
    let claims: Vec<&String> = keys
        .iter()
        .filter(|key| {
            key.ends_with("toolhost:ledger:action-requests:answered:d-2") && !key.contains("answer:toolhost")
        })
        .collect();
    let marks: Vec<&String> = keys
        .iter()
        .filter(|key| key.contains("answer:toolhost:ledger:action-requests:answered:d-2"))
        .collect();
    // An answer on a topic in the requests stream's slot (every key is, under the prefix
    // `{th}:`) is the one-script answer, whose claim is the answered mark: no mark beside it.
    let one_script = cluster.slot(answer_topic) == cluster.slot(requests);
    assert_eq!((claims.len(), marks.len()), (1, usize::from(!one_script)), "{keys:?}");
    assert!(claims[0].starts_with(prefix), "{keys:?}");
    assert_eq!(cluster.slot(claims[0]), cluster.slot(requests), "{}", claims[0]);
    let mut connection = cluster.connection();
    let (found, claim) = claim_at(&mut connection, claims[0]);
    assert_eq!(found, shape, "{claim:?}");
    assert!(claim.is_answered(), "{claim:?}");
    assert_eq!(claim.topic.as_deref(), Some(answer_topic), "{claim:?}");
    assert!(claim.answer.as_ref().is_some_and(|answer| !answer.is_empty()), "{claim:?}");
    if let Some(mark_key) = marks.first() {
        assert!(mark_key.starts_with(prefix), "{keys:?}");
        assert_eq!(cluster.slot(mark_key), cluster.slot(answer_topic), "{mark_key}");
        let mark: String = redis::cmd("GET").arg(mark_key).query(&mut connection).unwrap();
        assert_eq!(claim.answer, Some(mark));
    }
}

/// The bus's key commands span the cluster: a scan visits every primary, and reads and deletes
/// of keys in many slots are split by slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bus_scans_every_primary_and_reads_and_deletes_keys_of_every_slot() {
    use toolhost_bus::{Directory, RedisBus, RedisOptions, Server, Topology};
    let cluster = RedisCluster::start(3, 0);
    let mut options = RedisOptions::new(cluster.nodes()[0].url());
    options.topology = Topology::Cluster { nodes: cluster.addresses() };
    let bus = RedisBus::new(options).unwrap();
    let keys: Vec<String> = (0..200).map(|index| format!("scan-test:{index}")).collect();
    for key in &keys {
        bus.set_expiring(key, key, Duration::from_secs(60)).await.unwrap();
    }
    let masters: BTreeSet<u16> = keys.iter().map(|key| cluster.master_of(cluster.slot(key)).port()).collect();
    assert_eq!(masters.len(), 3);
    let mut found = bus.keys_matching("scan-test:*").await.unwrap();
    found.sort();
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(found, expected);
    let values = bus.values(&keys).await.unwrap();
    assert!(values.iter().zip(&keys).all(|(value, key)| value.as_deref() == Some(key.as_str())));
    bus.delete(&keys).await.unwrap();
    assert!(bus.keys_matching("scan-test:*").await.unwrap().is_empty());
    bus.ping().await.unwrap();
}

/// The ledger keys of `request_id` (any role) on every node.
fn ledger_keys(cluster: &RedisCluster, request_id: &str) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for node in cluster.nodes() {
        let found: Vec<String> = redis::cmd("KEYS")
            .arg(format!("*toolhost:ledger:*:{request_id}"))
            .query(&mut node.connection())
            .unwrap();
        keys.extend(found);
    }
    keys.sort();
    keys.dedup();
    keys
}

/// The hash tag a key starts with, braces included.
fn tag_of(key: &str) -> &str {
    &key[..=key.find('}').expect("a tagged key")]
}

#[test]
fn states_left_by_a_crash_between_ledger_steps_are_resolved_with_one_answer() {
    let cluster = RedisCluster::start(3, 0);
    let mut toolhost = start(&cluster);
    let mut connection = cluster.connection();
    let echo = |id: &str, to: &str| request("echo.requested", id, json!({"message": id}), to);
    // Learn the tags of the requests stream's slot and of topic 3's from a request answered there.
    xadd(&mut connection, REQUESTS, &echo("seed", &topic(3)));
    let named = named_topics(&[&[("seed".to_owned(), Value::Null, topic(3))]]);
    assert_answered_once(&mut connection, &named, &[&toolhost]);
    let keys = ledger_keys(&cluster, "seed");
    let claim = keys.iter().find(|key| !key.contains("}answer:")).expect("a claim");
    let mark = keys.iter().find(|key| key.contains("}answer:")).expect("an answered mark");
    let (stream_tag, topic_tag) = (tag_of(claim).to_owned(), tag_of(mark).to_owned());
    let claim_of = |id: &str| format!("{stream_tag}toolhost:ledger:{REQUESTS}:answered:{id}");

    // 1. A holder took the claim for topic 3 and died before publishing: a copy naming topic 4
    // is acked unanswered; the request on the claimed topic is answered there.
    let () = redis::cmd("HSET")
        .arg(claim_of("c-1"))
        .arg("topic")
        .arg(topic(3))
        .arg("state")
        .arg("claimed")
        .query(&mut connection)
        .unwrap();
    xadd(&mut connection, REQUESTS, &echo("c-1", &topic(4)));
    xadd(&mut connection, REQUESTS, &echo("c-1", &topic(3)));
    let named = named_topics(&[&[
        ("seed".to_owned(), Value::Null, topic(3)),
        ("c-1".to_owned(), Value::Null, topic(3)),
    ]]);
    let answered = assert_answered_once(&mut connection, &named, &[&toolhost]);
    assert_eq!(answered["c-1"].0, topic(3));

    // 2. A holder published its answer on topic 3 (answer and mark) and died before settling:
    // its entry is still pending with it, and a copy naming topic 5 comes in.
    toolhost.kill9();
    let answer_id = uuid::Uuid::new_v4().to_string();
    let answer = json!({"id": answer_id, "type": "echo.completed", "data": {"request_id": "c-2", "success": true, "result": {"message": "first"}}});
    let () = redis::cmd("XADD")
        .arg(topic(3))
        .arg("*")
        .arg("id")
        .arg(&answer_id)
        .arg("payload")
        .arg(answer.to_string())
        .query(&mut connection)
        .map(|_: String| ())
        .unwrap();
    let () = redis::cmd("SET")
        .arg(format!("{topic_tag}answer:toolhost:ledger:{REQUESTS}:answered:c-2"))
        .arg(&answer_id)
        .query(&mut connection)
        .unwrap();
    let () = redis::cmd("HSET")
        .arg(claim_of("c-2"))
        .arg("topic")
        .arg(topic(3))
        .arg("state")
        .arg("claimed")
        .query(&mut connection)
        .unwrap();
    xadd(&mut connection, REQUESTS, &echo("c-2", &topic(3)));
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("dead-holder")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(REQUESTS)
        .arg(">")
        .query(&mut connection)
        .unwrap();
    xadd(&mut connection, REQUESTS, &echo("c-2", &topic(5)));
    let toolhost = start(&cluster);
    let named = named_topics(&[&[
        ("seed".to_owned(), Value::Null, topic(3)),
        ("c-1".to_owned(), Value::Null, topic(3)),
        ("c-2".to_owned(), Value::Null, topic(3)),
    ]]);
    // The reclaimed entry is finished: nothing published again, the claim settled, the entry acked.
    let answered = assert_answered_once(&mut connection, &named, &[&toolhost]);
    assert_eq!(answered["c-2"].1["id"], answer_id.as_str());
    let (_, claim) = claim_at(&mut connection, &claim_of("c-2"));
    assert!(claim.is_answered(), "{claim:?}");

    // The dead holder's consumer, holding nothing and without a heartbeat, is pruned once idle
    // for ten leases (its heartbeat is looked up in another slot); the live replica's stays.
    let consumers = |connection: &mut ClusterConnection| -> Vec<String> {
        let reply: redis::streams::StreamInfoConsumersReply =
            redis::cmd("XINFO").arg("CONSUMERS").arg(REQUESTS).arg(GROUP).query(connection).unwrap();
        reply.consumers.into_iter().map(|consumer| consumer.name).collect()
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    while consumers(&mut connection).iter().any(|name| name == "dead-holder") {
        assert!(Instant::now() < deadline, "dead-holder was not pruned: {:?}", consumers(&mut connection));
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = toolhost.log();
    let live = log
        .split("\"consumer\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the ready line names the consumer");
    assert!(
        consumers(&mut connection).iter().any(|name| name == live),
        "{live}: {:?}",
        consumers(&mut connection)
    );
    assert_no_slot_errors(&toolhost);
}

/// Runs the toolhost binary as a client against `cluster`.
fn client(cluster: &RedisCluster, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(toolhost_bin())
        .args(args)
        .env_clear()
        .env("REDIS_URL", cluster.nodes()[0].url())
        .env("TOOLHOST__REDIS__CLUSTER_NODES", cluster.nodes_env())
        .output()
        .expect("run toolhost");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn wait_for(connection: &mut ClusterConnection, stream: &str, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let found = payloads(connection, stream);
        if found.len() >= count || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn chat_inbox_discovery_dead_letters_and_the_client_subcommands_work_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let toolhost = start(&cluster);
    let mut connection = cluster.connection();

    // Chat: a tool call by metadata from agent:Planner in conv1. The reply goes to the sender's
    // inbox and (a copy) to the conversation; progress events go to stream:conv1. All three
    // topics and the inbox live in different slots here.
    let slots: BTreeSet<u16> = ["chat:ToolHost", "chat:Planner", "chat:conv1", "stream:conv1"]
        .iter()
        .map(|key| cluster.slot(key))
        .collect();
    assert!(slots.len() >= 3, "{slots:?}");
    let message = json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "conversation_id": "conv1",
        "sender": "agent:Planner",
        "recipient": "agent:ToolHost",
        "type": "message",
        "content": "please echo",
        "metadata": {"tool_call": {"name": "echo", "arguments": {"message": "hi"}, "id": "call-1"}},
        "created_at": "2026-01-01T00:00:00Z",
    });
    xadd(&mut connection, "chat:ToolHost", &message);
    let events = wait_for(&mut connection, "stream:conv1", 3);
    let kinds: Vec<&str> = events.iter().map(|event| event["event"].as_str().unwrap_or_default()).collect();
    assert_eq!(kinds, ["tool_step", "tool_step", "output"], "{events:#?}");
    assert_eq!(events[2]["text"], r#"{"message":"hi"}"#);
    let replies = wait_for(&mut connection, "chat:Planner", 1);
    assert_eq!(replies.len(), 1, "{replies:#?}");
    assert_eq!(replies[0]["conversation_id"], "conv1");
    // The copy is the same message.
    assert_eq!(payloads(&mut connection, "chat:conv1"), replies);

    // The same chat message delivered again (same id) is not answered twice.
    xadd(&mut connection, "chat:ToolHost", &message);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pending: redis::Value =
            redis::cmd("XPENDING").arg("chat:ToolHost").arg(GROUP).query(&mut connection).expect("XPENDING");
        let lag_zero = matches!(&pending, redis::Value::Array(items) if matches!(items.first(), Some(redis::Value::Int(0))));
        if lag_zero && payloads(&mut connection, "chat:ToolHost").len() == 2 {
            std::thread::sleep(Duration::from_millis(500));
            break;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(payloads(&mut connection, "chat:Planner").len(), 1);
    assert_eq!(payloads(&mut connection, "chat:conv1").len(), 1);

    // Discovery over the bus, answered on a topic of another slot.
    xadd(&mut connection, REQUESTS, &request("tools.discover", "disc-1", json!({}), &topic(6)));
    let answers = wait_for(&mut connection, &topic(6), 1);
    let names: Vec<&str> = answers[0]["data"]["result"]["tools"]
        .as_array()
        .expect("a tool list")
        .iter()
        .map(|tool| tool["name"].as_str().unwrap_or_default())
        .collect();
    assert!(names.contains(&"echo") && names.contains(&"chat_send"), "{names:?}");

    // An entry that is not JSON is dead-lettered (in dlq:toolhost's slot), once.
    let () = redis::cmd("XADD")
        .arg(REQUESTS)
        .arg("*")
        .arg("id")
        .arg("m-bad")
        .arg("payload")
        .arg("not json")
        .query(&mut connection)
        .map(|_: String| ())
        .unwrap();
    // A response topic holding a key of another type: answered `internal` once on the default
    // topic and dead-lettered, its claim given back.
    let () = redis::cmd("SET").arg("results:wrong").arg("a string").query(&mut connection).unwrap();
    xadd(
        &mut connection,
        REQUESTS,
        &request("echo.requested", "wt-1", json!({"message": "x"}), "results:wrong"),
    );
    let letters = wait_for(&mut connection, "dlq:toolhost", 2);
    assert_eq!(letters.len(), 2, "{letters:#?}");
    assert!(letters.iter().any(|letter| letter["payload"] == "not json"), "{letters:#?}");
    let fallback = wait_for(&mut connection, "action-results", 1);
    let fallback: Vec<&Value> =
        fallback.iter().filter(|answer| answer["data"]["request_id"] == "wt-1").collect();
    assert_eq!(fallback.len(), 1);
    assert_eq!(fallback[0]["data"]["error_code"], "internal", "{fallback:?}");
    // The request can still be answered on a topic that takes it.
    xadd(&mut connection, REQUESTS, &request("echo.requested", "wt-1", json!({"message": "y"}), &topic(7)));
    assert_eq!(wait_for(&mut connection, &topic(7), 1)[0]["data"]["result"]["message"], "y");

    // The client subcommands reach the same cluster.
    let (code, stdout, stderr) =
        client(&cluster, &["call", "echo", "--args", r#"{"message":"from the cli"}"#]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("from the cli"), "{stdout}");
    let (code, stdout, stderr) = client(&cluster, &["tools"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("echo"), "{stdout}");
    let (code, stdout, stderr) = client(&cluster, &["tools", "--from-registry"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("echo"), "{stdout}");
    let (code, stdout, stderr) = client(&cluster, &["dlq", "list"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    assert!(stdout.contains("not json"), "{stdout}");
    let (code, stdout, _) = client(&cluster, &["check-config"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("cluster_nodes"), "{stdout}");
    assert_no_slot_errors(&toolhost);
}

/// The response topic of the replay tests, in another slot than the requests stream.
const WRONG: &str = "results:wrong";

/// A request `rp-1` dead-lettered because its response topic held a key of another type, then
/// retried by its caller once the cause was fixed and answered there, so that the request's
/// answered mark sits next to that topic, in its slot: what a replay must delete.
fn a_dead_letter_whose_request_was_answered_since(
    cluster: &RedisCluster,
    connection: &mut ClusterConnection,
) {
    assert_ne!(cluster.slot(WRONG), cluster.slot(REQUESTS));
    // The request names a response topic holding a key of another type: it is answered
    // `internal` on the default topic and dead-lettered.
    let () = redis::cmd("SET").arg(WRONG).arg("a string").query(connection).unwrap();
    xadd(connection, REQUESTS, &request("echo.requested", "rp-1", json!({"message": "first"}), WRONG));
    let letters = wait_for(connection, "dlq:toolhost", 1);
    assert_eq!(letters.len(), 1, "{letters:#?}");
    let fallback = wait_for(connection, "action-results", 1);
    assert_eq!(fallback[0]["data"]["error_code"], "internal", "{fallback:?}");
    // The cause is fixed, and the caller's own retry is answered there first: the request's
    // answered mark now sits next to the topic, in its slot.
    let () = redis::cmd("DEL").arg(WRONG).query(connection).map(|_: i64| ()).unwrap();
    xadd(connection, REQUESTS, &request("echo.requested", "rp-1", json!({"message": "retry"}), WRONG));
    let answered = wait_for(connection, WRONG, 1);
    assert_eq!(answered.len(), 1, "{answered:#?}");
    assert_eq!(answered[0]["data"]["result"]["message"], "retry");
    let marks: Vec<String> = ledger_keys(cluster, "rp-1")
        .into_iter()
        .filter(|key| key.contains("}answer:") && cluster.slot(key) == cluster.slot(WRONG))
        .collect();
    assert_eq!(marks.len(), 1, "the answered mark next to {WRONG}: {:?}", ledger_keys(cluster, "rp-1"));
}

/// After a replay of [`a_dead_letter_whose_request_was_answered_since`]'s letter: the replayed
/// request runs and is answered on its response topic, once (the group settles, nothing
/// pending, nothing undelivered, with exactly one more answer there), and the letter is gone.
fn assert_the_replay_is_answered_once(
    cluster: &RedisCluster,
    connection: &mut ClusterConnection,
    toolhost: &Toolhost,
) {
    let answered = wait_for(connection, WRONG, 2);
    let deadline = Instant::now() + WAIT;
    while backlog(connection, "") != (0, Some(0)) {
        assert!(Instant::now() < deadline, "not settled: {:?}", backlog(connection, ""));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = payloads(connection, WRONG);
    assert_eq!(after, answered, "{}", toolhost.log());
    assert_eq!(after.len(), 2, "{after:#?}\n{}", toolhost.log());
    assert_eq!(after[1]["data"]["request_id"], "rp-1");
    assert_eq!(after[1]["data"]["result"]["message"], "first", "{after:#?}");
    let (code, stdout, _) = client(cluster, &["dlq", "list"]);
    assert_eq!((code, stdout.as_str()), (0, ""), "the letter is gone");
    assert_no_slot_errors(toolhost);
}

/// `toolhost dlq replay`, run as a process, on a cluster: the replayed request runs and is
/// answered once on its response topic, although an answer for its request id is already there
/// (the replay deletes the answered mark next to that topic, in the topic's slot, as well as the
/// claim in the requests stream's).
#[test]
fn a_dead_letter_replayed_with_the_cli_is_answered_on_its_response_topic_on_a_cluster() {
    a_dead_letter_replayed_with_the_cli_is_answered_once(1);
}

/// The same in ledger format 3: the replay reads the claim's topic from a string.
#[test]
fn a_dead_letter_replayed_with_the_cli_is_answered_on_its_response_topic_on_a_cluster_in_ledger_format_3() {
    a_dead_letter_replayed_with_the_cli_is_answered_once(3);
}

fn a_dead_letter_replayed_with_the_cli_is_answered_once(format: u8) {
    let cluster = RedisCluster::start(3, 0);
    let toolhost = start_in_format(&cluster, "", format);
    let mut connection = cluster.connection();
    a_dead_letter_whose_request_was_answered_since(&cluster, &mut connection);

    // The operator replays the letter by its dlq_id.
    let (code, stdout, stderr) = client(&cluster, &["dlq", "list"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let listed: Vec<Value> = stdout.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(listed.len(), 1, "{stdout}");
    assert_eq!(listed[0]["request_id"], "rp-1");
    let dlq_id = listed[0]["dlq_id"].as_str().unwrap().to_owned();
    let (code, stdout, stderr) = client(&cluster, &["dlq", "replay", &dlq_id]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let replayed: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        (replayed["dlq_id"].as_str(), replayed["request_id"].as_str()),
        (Some(dlq_id.as_str()), Some("rp-1"))
    );
    assert_the_replay_is_answered_once(&cluster, &mut connection, &toolhost);
}

/// The console's Replay (its `POST /api/dlq/<toolbox>/<dlq id>/replay`, what the page's button
/// sends) on a cluster: the same as `dlq replay`, and audited as the console's.
#[test]
fn a_dead_letter_replayed_from_the_console_is_answered_on_its_response_topic_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let mut env = env_with_prefix(&cluster, "");
    // Without a token the console listens on loopback only, and needs only the CSRF token.
    env.push(("TOOLHOST__CONSOLE__LISTEN".to_owned(), "127.0.0.1:0".to_owned()));
    let pairs: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let toolhost = Toolhost::start(&pairs);
    let mut connection = cluster.connection();
    a_dead_letter_whose_request_was_answered_since(&cluster, &mut connection);

    let port = console_port(&toolhost);
    let http = |request: String| toolhost_e2e::mcp_http::raw(port, &request);
    let (status, page) =
        http(format!("GET /dlq HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"));
    assert_eq!(status, 200, "{page}");
    let csrf = page
        .split_once("name=\"csrf-token\" content=\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(csrf, _)| csrf.to_owned())
        .unwrap_or_else(|| panic!("no CSRF token on the page:\n{page}"));
    let letters: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg("dlq:toolhost").arg("-").arg("+").query(&mut connection).unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let dlq_id = &letters[0].0;
    assert!(page.contains(&format!("data-dlq-id=\"{dlq_id}\"")), "the letter on the page:\n{page}");

    let (status, answer) = http(format!(
        "POST /api/dlq/toolhost/{dlq_id}/replay HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         X-CSRF-Token: {csrf}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    ));
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"request_id\":\"rp-1\""), "{answer}");
    assert_the_replay_is_answered_once(&cluster, &mut connection, &toolhost);

    let audit: Vec<(String, std::collections::HashMap<String, String>)> =
        redis::cmd("XRANGE").arg("audit:toolhost").arg("-").arg("+").query(&mut connection).unwrap();
    assert!(
        audit.iter().any(|(_, fields)| fields.get("door").map(String::as_str) == Some("console")
            && fields.get("request_id").map(String::as_str) == Some("rp-1")
            && fields.get("reason").is_some_and(|reason| reason.starts_with("replay"))),
        "the replay audited: {audit:?}"
    );
}

#[test]
fn a_failover_of_the_requests_shard_loses_and_repeats_no_answer() {
    let cluster = RedisCluster::start(3, 1);
    let first = start(&cluster);
    let second = start(&cluster);
    let mut connection = cluster.connection();
    let originals = originals("f", 200);
    let (early, late) = originals.split_at(100);
    // Calls that run through the failover: their lease renewals and commits meet it.
    let slow: Vec<(String, Value, String)> = (0..10)
        .map(|index| {
            let id = format!("slow-{index}");
            let payload =
                request("terminal_run.requested", &id, json!({"command": "sleep 3"}), &topic(index % TOPICS));
            (id, payload, topic(index % TOPICS))
        })
        .collect();
    for (_, payload, _) in slow.iter().chain(early) {
        xadd(&mut connection, REQUESTS, payload);
    }
    std::thread::sleep(Duration::from_millis(300));
    let promoted = cluster.failover(cluster.slot(REQUESTS));
    assert_eq!(cluster.master_of(cluster.slot(REQUESTS)).port(), promoted);
    let mut connection = cluster.connection();
    for (_, payload, _) in late {
        xadd(&mut connection, REQUESTS, payload);
    }
    let named = named_topics(&[&originals, &slow]);
    let answered = assert_answered_once(&mut connection, &named, &[&first, &second]);
    assert_eq!(answered.len(), 210);
    for (id, (_, answer)) in &answered {
        // Every call succeeds: a failover is no crash, so no lease lapses and nothing is
        // interrupted.
        let sleeps = id.starts_with("slow-")
            || id.trim_start_matches("f-").parse::<usize>().unwrap().is_multiple_of(5);
        if !sleeps {
            assert_eq!(answer["data"]["success"], true, "{answer}");
        }
    }
    let succeeded = answered
        .keys()
        .filter(|id| id.starts_with("slow-"))
        .filter(|id| answered[*id].1["data"]["success"] == true)
        .count();
    eprintln!("{succeeded} of 10 calls running through the failover succeeded");
    assert_no_slot_errors(&first);
    assert_no_slot_errors(&second);
}

/// `GET /status` of the toolhost that wrote `log`, parsed.
fn status(log: &str) -> Value {
    use std::io::{Read as _, Write as _};
    let addr = log
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["message"] == "http listening")
        .and_then(|line| line["addr"].as_str().map(str::to_owned))
        .expect("the http address in the log");
    let Ok(mut stream) = std::net::TcpStream::connect(&addr) else { return Value::Null };
    let _ = stream.write_all(b"GET /status HTTP/1.0\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text.split_once("\r\n\r\n").and_then(|(_, body)| serde_json::from_str(body).ok()).unwrap_or(Value::Null)
}

/// Whether a process runs with exactly this command line.
fn running(words: &[&str]) -> bool {
    let wanted: Vec<u8> = words.iter().flat_map(|word| word.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|entry| std::fs::read(entry.path().join("cmdline")).is_ok_and(|cmdline| cmdline == wanted))
}

/// Waits until `check` holds, panicking with `what` after [`WAIT`].
fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_cancel_read_by_another_replica_stops_the_call_and_the_ledger_answers_later_cancels_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let mut env = env_with_prefix(&cluster, "");
    env.push(("TOOLHOST__DAEMON__HEARTBEAT_MS".to_owned(), "200".to_owned()));
    let start_with = |extra: &[(&str, &str)]| {
        let mut all = env.clone();
        all.extend(extra.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())));
        let refs: Vec<(&str, &str)> =
            all.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
        Toolhost::start(&refs)
    };
    // Two slots: the inbox's reader holds one and the call the other, so this replica reads
    // nothing more while the call runs, and the cancel reaches it only forwarded.
    let owner = start_with(&[("TOOLHOST__DISPATCH__MAX_IN_FLIGHT", "2")]);
    let mut connection = cluster.connection();
    let topic = topic(3);
    xadd(
        &mut connection,
        REQUESTS,
        &request("terminal_run.requested", "long", json!({"command": "sleep 67.1"}), &topic),
    );
    wait_until("the call never started", || running(&["sleep", "67.1"]));
    let other = start_with(&[]);
    for toolhost in [&owner, &other] {
        wait_until("the replicas never saw each other", || {
            status(&toolhost.log())["fleet"]["toolboxes"][GROUP]
                .as_array()
                .is_some_and(|live| live.len() == 2)
        });
    }

    let cancel = |connection: &mut ClusterConnection, request_id: &str| {
        xadd(connection, REQUESTS, &request("tool.cancel", request_id, json!({}), &topic));
    };
    let of = |connection: &mut ClusterConnection, request_id: &str, event_type: &str| -> Vec<Value> {
        payloads(connection, &topic)
            .into_iter()
            .filter(|entry| entry["type"] == event_type && entry["data"]["request_id"] == request_id)
            .collect()
    };
    cancel(&mut connection, "long");
    wait_until("the call was never answered", || {
        !of(&mut connection, "long", "terminal_run.requested.completed").is_empty()
    });
    wait_until("the cancel was never answered", || {
        !of(&mut connection, "long", "tool.cancel.completed").is_empty()
    });
    let answer = of(&mut connection, "long", "terminal_run.requested.completed").remove(0);
    assert_eq!(answer["data"]["error_code"], "cancelled", "{answer}");
    let state = of(&mut connection, "long", "tool.cancel.completed").remove(0);
    assert_eq!(state["data"]["result"]["state"], "cancelling", "{state}");
    wait_until("the command still runs", || !running(&["sleep", "67.1"]));
    let handled = |log: &str| log.lines().filter(|line| line.contains("\"tool\":\"tool.cancel\"")).count();
    assert_eq!(handled(&owner.log()), 0, "{}", owner.log());

    // Later cancels are answered from the ledger: the claim of the answered call, and nothing.
    cancel(&mut connection, "long");
    cancel(&mut connection, "never-sent");
    wait_until("the second cancel was never answered", || {
        of(&mut connection, "long", "tool.cancel.completed").len() == 2
    });
    wait_until("the unknown cancel was never answered", || {
        !of(&mut connection, "never-sent", "tool.cancel.completed").is_empty()
    });
    let states: Vec<Value> = of(&mut connection, "long", "tool.cancel.completed")
        .iter()
        .map(|entry| entry["data"]["result"]["state"].clone())
        .collect();
    assert_eq!(states, [json!("cancelling"), json!("answered")]);
    let unknown = of(&mut connection, "never-sent", "tool.cancel.completed").remove(0);
    assert_eq!(unknown["data"]["result"]["state"], "unknown", "{unknown}");
    assert_eq!(of(&mut connection, "long", "terminal_run.requested.completed").len(), 1);
    assert_no_slot_errors(&owner);
    assert_no_slot_errors(&other);
}

/// How many `WAIT`s `node` has run (`INFO commandstats`).
fn waits(node: &RedisProcess) -> u64 {
    let stats: String =
        redis::cmd("INFO").arg("commandstats").query(&mut node.connection()).unwrap_or_default();
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_wait:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

#[test]
fn with_replica_acks_the_wait_goes_to_the_primary_holding_the_records_and_counts_its_replica() {
    let cluster = RedisCluster::start(3, 1);
    let mut env = env_with_prefix(&cluster, "");
    env.push(("TOOLHOST__REDIS__REPLICA_ACKS".to_owned(), "1".to_owned()));
    env.push(("TOOLHOST__REDIS__REPLICA_ACK_TIMEOUT_MS".to_owned(), "500".to_owned()));
    let pairs: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let toolhost = Toolhost::start(&pairs);
    // The call records live in the requests stream's slot (hash tags), so that slot's primary is
    // the one to wait on.
    let slot = cluster.slot(REQUESTS);
    let holder = cluster.master_of(slot).port();
    let before: Vec<(u16, u64)> = cluster.nodes().iter().map(|node| (node.port(), waits(node))).collect();
    let mut connection = cluster.connection();
    let sleeps: Vec<(String, Value, String)> = (0..20)
        .map(|index| {
            let id = format!("acked-{index}");
            let payload =
                request("terminal_run.requested", &id, json!({"command": "sleep 0"}), &topic(index % TOPICS));
            (id, payload, topic(index % TOPICS))
        })
        .collect();
    for (_, payload, _) in &sleeps {
        xadd(&mut connection, REQUESTS, payload);
    }
    let answered = assert_answered_once(&mut connection, &named_topics(&[&sleeps]), &[&toolhost]);
    for (_, answer) in answered.values() {
        assert_eq!(answer["data"]["success"], true, "{answer}");
    }
    for (node, (port, waited_before)) in cluster.nodes().iter().zip(before) {
        let waited = waits(node) - waited_before;
        if port == holder {
            assert!(waited >= 1, "the records' primary ran no WAIT");
        } else {
            assert_eq!(waited, 0, "node {port} ran WAIT but holds no call record");
        }
    }

    // Its replica stopped: the next call is not run but answered `overloaded`.
    let replica = cluster.replica_of(slot);
    toolhost_e2e::signal(replica.pid(), libc::SIGSTOP);
    let id = "unacked".to_owned();
    let payload = request("terminal_run.requested", &id, json!({"command": "sleep 0"}), &topic(0));
    xadd(&mut connection, REQUESTS, &payload);
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        if let Some(found) = answers(&mut connection, "").get(&id) {
            break found[0].1.clone();
        }
        assert!(Instant::now() < deadline, "no answer; log:\n{}", toolhost.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    toolhost_e2e::signal(replica.pid(), libc::SIGCONT);
    assert_eq!(answer["data"]["error_code"], "overloaded", "{answer}");
}
