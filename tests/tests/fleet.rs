//! The fleet at start (issue 35, part 1): a toolbox that starts while callers keep the stream
//! busy is never answered for with `unknown_tool` by the toolboxes already running, whose views
//! of the fleet are up to a heartbeat old, for any request added after its first heartbeat; on
//! one server and on a Redis Cluster.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::ConnectionLike;
use serde_json::{Value, json};
use toolhost_e2e::cluster::RedisCluster;
use toolhost_e2e::{RedisProcess, Toolhost, temp_dir};

const REQUESTS: &str = "action-requests";
const RESULTS: &str = "action-results";
const WAIT: Duration = Duration::from_secs(120);
/// Requests for the new toolbox's tool, sent once its first heartbeat is in Redis.
const NEW_TOOL_REQUESTS: usize = 200;

/// One test at a time: each starts three daemons and keeps them busy.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Where the toolboxes meet: its environment for a daemon, and connections for the test.
trait Topology: Sync {
    fn env(&self) -> Vec<(String, String)>;
    fn connect(&self) -> Box<dyn ConnectionLike + Send>;
    /// The names of the keys toolhost uses there.
    fn keys(&self) -> toolhost_bus::Keys;
    /// The results topic of the roll's calls: on a cluster one in the requests stream's slot,
    /// so final answers take the one-script path and refusals and replays the five steps.
    fn roll_results(&self) -> &'static str;
}

struct OneServer(RedisProcess);

impl Topology for OneServer {
    fn env(&self) -> Vec<(String, String)> {
        vec![("REDIS_URL".to_owned(), self.0.url())]
    }

    fn connect(&self) -> Box<dyn ConnectionLike + Send> {
        Box::new(self.0.connection())
    }

    fn keys(&self) -> toolhost_bus::Keys {
        toolhost_bus::Keys::new("")
    }

    fn roll_results(&self) -> &'static str {
        RESULTS
    }
}

struct Cluster(RedisCluster);

impl Topology for Cluster {
    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("REDIS_URL".to_owned(), self.0.nodes()[0].url()),
            ("TOOLHOST__REDIS__CLUSTER_NODES".to_owned(), self.0.nodes_env()),
        ]
    }

    fn connect(&self) -> Box<dyn ConnectionLike + Send> {
        Box::new(self.0.connection())
    }

    fn keys(&self) -> toolhost_bus::Keys {
        toolhost_bus::Keys::for_cluster("")
    }

    fn roll_results(&self) -> &'static str {
        "results:{action-requests}"
    }
}

/// Toolbox `id` with the default heartbeat (5 s, so the running toolboxes' views lag the new
/// one's start by up to that), short leases, and for `with_new_tool` a command tool no other
/// toolbox hosts.
fn toolbox(topology: &dyn Topology, id: &str, with_new_tool: bool) -> Toolhost {
    let tool =
        "\n[[commands]]\nname = \"fresh\"\ndescription = \"Says fresh.\"\nargv = [\"echo\", \"fresh\"]\n";
    toolbox_with(topology, id, if with_new_tool { tool } else { "" }, &[])
}

/// Toolbox `id` as [`toolbox`] starts it, with `tools` added to its configuration and `env` to
/// its environment.
fn toolbox_with(topology: &dyn Topology, id: &str, tools: &str, env: &[(&str, &str)]) -> Toolhost {
    let dir: PathBuf = temp_dir(&format!("fleet-{id}"));
    let path = dir.join("toolhost.toml");
    let config = format!("[daemon]\ntoolbox_id = \"{id}\"\n\n[dispatch]\nclaim_idle_ms = 1500\n{tools}");
    std::fs::write(&path, config).unwrap();
    let mut all = topology.env();
    all.push(("TERMINAL_ALLOWED_COMMANDS".to_owned(), "echo".to_owned()));
    // Later settings win.
    all.extend(env.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())));
    let env = all;
    let pairs: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    Toolhost::start_args(&["--config", path.to_str().unwrap()], &pairs)
}

fn request(event_type: &str, request_id: &str, data: Value) -> String {
    let mut data = data;
    data["request_id"] = Value::String(request_id.to_owned());
    json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "source": "agent:planner",
        "specversion": "1.0",
        "type": event_type,
        "topic": REQUESTS,
        "data": data,
    })
    .to_string()
}

/// Adds `payloads` to the requests stream (one command each: a cluster connection has no
/// pipelines).
fn send(connection: &mut dyn ConnectionLike, payloads: &[String]) {
    for payload in payloads {
        redis::cmd("XADD")
            .arg(REQUESTS)
            .arg("*")
            .arg("id")
            .arg(uuid::Uuid::new_v4().to_string())
            .arg("payload")
            .arg(payload)
            .query::<String>(connection)
            .expect("XADD");
    }
}

/// Every answer's `data` on the results stream, by request id.
fn answers(connection: &mut dyn ConnectionLike) -> BTreeMap<String, Vec<Value>> {
    let mut by_id = BTreeMap::new();
    read_answers(connection, RESULTS, "-", |answer| &answer["data"]["request_id"], &mut by_id);
    by_id
}

/// Reads `topic` from entry `start` (an XRANGE bound) to its end, a page at a time, adding each
/// answer's `data` to `into` under the string `key` picks from the answer; returns where the
/// next read starts.
fn read_answers(
    connection: &mut dyn ConnectionLike,
    topic: &str,
    start: &str,
    key: impl Fn(&Value) -> &Value,
    into: &mut BTreeMap<String, Vec<Value>>,
) -> String {
    let mut start = start.to_owned();
    loop {
        let page: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(topic)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(1000)
            .query(connection)
            .unwrap();
        let Some((last, _)) = page.last() else { return start };
        start = format!("({last}");
        for (_, fields) in page {
            let Some((_, payload)) = fields.into_iter().find(|(name, _)| name == "payload") else { continue };
            let answer: Value = serde_json::from_str(&payload).unwrap();
            let id = key(&answer).as_str().unwrap_or_default().to_owned();
            into.entry(id).or_default().push(answer["data"].clone());
        }
    }
}

/// Whether toolbox `id` has a heartbeat listed in the fleet set (written before it reads).
fn has_beaten(connection: &mut dyn ConnectionLike, id: &str) -> bool {
    let members: Vec<String> = redis::cmd("SMEMBERS").arg("toolhost:fleet").query(connection).unwrap();
    members.iter().any(|member| member.starts_with(&format!("toolhost:heartbeat:{id}:")))
}

/// Two toolboxes answer `echo` while two callers keep sending; a third toolbox hosting `fresh`
/// starts meanwhile, and from its first heartbeat on `fresh` is asked for among the load. Every
/// request is answered once, and every `fresh` request `success`.
fn a_toolbox_started_under_load_is_never_answered_for_with_unknown_tool(topology: &dyn Topology) {
    let _a = toolbox(topology, "a", false);
    let _b = toolbox(topology, "b", false);
    let stop = Arc::new(AtomicBool::new(false));
    let mut expected: BTreeMap<String, &str> = BTreeMap::new();
    let (third, fresh_ids, load_ids) = std::thread::scope(|scope| {
        let callers: Vec<_> = (0..2)
            .map(|caller| {
                let stop = stop.clone();
                let mut connection = topology.connect();
                scope.spawn(move || {
                    let mut ids = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let batch: Vec<String> =
                            (0..10).map(|index| format!("load-{caller}-{}", ids.len() + index)).collect();
                        let payloads: Vec<String> = batch
                            .iter()
                            .map(|id| request("echo.requested", id, json!({"message": "load"})))
                            .collect();
                        send(&mut *connection, &payloads);
                        ids.extend(batch);
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    ids
                })
            })
            .collect();
        let fresh = {
            let stop = stop.clone();
            let mut connection = topology.connect();
            scope.spawn(move || {
                let deadline = Instant::now() + WAIT;
                while !has_beaten(&mut *connection, "c") {
                    assert!(Instant::now() < deadline, "toolbox c never wrote a heartbeat");
                    std::thread::sleep(Duration::from_millis(2));
                }
                // At once, and for a while after: the running toolboxes' views are older.
                let mut ids = Vec::new();
                while ids.len() < NEW_TOOL_REQUESTS {
                    let batch: Vec<String> =
                        (0..5).map(|index| format!("fresh-{}", ids.len() + index)).collect();
                    let payloads: Vec<String> =
                        batch.iter().map(|id| request("tool.invoke", id, json!({"tool": "fresh"}))).collect();
                    send(&mut *connection, &payloads);
                    ids.extend(batch);
                    std::thread::sleep(Duration::from_millis(20));
                }
                stop.store(true, Ordering::Relaxed);
                ids
            })
        };
        // Started while the callers send.
        std::thread::sleep(Duration::from_millis(300));
        let third = toolbox(topology, "c", true);
        let fresh_ids = fresh.join().unwrap();
        let load_ids: Vec<String> = callers.into_iter().flat_map(|caller| caller.join().unwrap()).collect();
        (third, fresh_ids, load_ids)
    });
    for id in &load_ids {
        expected.insert(id.clone(), "echo");
    }
    for id in &fresh_ids {
        expected.insert(id.clone(), "fresh");
    }
    let mut connection = topology.connect();
    let deadline = Instant::now() + WAIT;
    let found = loop {
        let found = answers(&mut *connection);
        if expected.keys().all(|id| found.contains_key(id)) || Instant::now() > deadline {
            break found;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Time for a second answer to show, were there one: longer than a lease.
    std::thread::sleep(Duration::from_secs(3));
    let found_again = answers(&mut *connection);
    assert_eq!(found.len(), found_again.len(), "answers kept coming after every request was answered");
    let mut failures = Vec::new();
    for (id, tool) in &expected {
        let Some(datas) = found_again.get(id) else {
            failures.push(format!("{id} ({tool}): no answer"));
            continue;
        };
        if datas.len() != 1 {
            failures.push(format!("{id} ({tool}): {} answers: {datas:?}", datas.len()));
        } else if datas[0]["success"] != true {
            failures.push(format!("{id} ({tool}): {}", datas[0]));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} requests ({} for the new tool) went wrong, e.g. {:?}\nlog of c:\n{}",
        failures.len(),
        expected.len(),
        fresh_ids.len(),
        &failures[..failures.len().min(10)],
        third.log().lines().rev().take(40).collect::<Vec<_>>().join("\n")
    );
    assert!(load_ids.len() > fresh_ids.len(), "the load ran beside the new toolbox's start");
}

#[test]
fn on_one_server_a_toolbox_started_under_load_is_never_answered_for_with_unknown_tool() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let topology = OneServer(RedisProcess::start(&[]));
    a_toolbox_started_under_load_is_never_answered_for_with_unknown_tool(&topology);
}

#[test]
fn on_a_cluster_a_toolbox_started_under_load_is_never_answered_for_with_unknown_tool() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let topology = Cluster(RedisCluster::start(3, 0));
    a_toolbox_started_under_load_is_never_answered_for_with_unknown_tool(&topology);
}

/// A command tool whose every run answers something new (the clock in nanoseconds), so a retry
/// answered with the original answer is told from a second run.
const STAMP: &str =
    "\n[[commands]]\nname = \"stamp\"\ndescription = \"Says the time.\"\nargv = [\"date\", \"+%s%N\"]\n";

/// The environment of a replica of ledger format `format` (`[dispatch] ledger_format`) rolling
/// from `previous` (`previous_ledger_format`, 0 for none).
fn ledger_env(format: &'static str, previous: &'static str) -> [(&'static str, &'static str); 3] {
    [
        ("TERMINAL_ALLOWED_COMMANDS", "echo,date"),
        ("TOOLHOST__DISPATCH__LEDGER_FORMAT", format),
        ("TOOLHOST__DISPATCH__PREVIOUS_LEDGER_FORMAT", previous),
    ]
}

/// What an entry the roll's caller sent asks, and so what its one answer must be.
#[derive(Debug, Clone)]
enum Asked {
    /// `stamp` for a new request id: `success`.
    Stamp,
    /// `stamp` again for the request id of this earlier entry (by correlation id), which was
    /// answered: the original answer's `data`.
    Retry(String),
    /// A tool nobody hosts: `unknown_tool`, once across both toolboxes.
    Unknown,
    /// `echo` with arguments it refuses: `invalid_arguments`, which uses nothing up.
    Invalid,
    /// `echo` for the request id of a refused entry, now right: `success`.
    Fixed,
}

/// Every answer on the results stream, by correlation id (one per entry the caller sent), from
/// entry `after` on: the answers' `data`, and where the next read starts.
fn answers_by_correlation(
    connection: &mut dyn ConnectionLike,
    topic: &str,
    after: &str,
    into: &mut BTreeMap<String, Vec<Value>>,
) -> String {
    read_answers(connection, topic, after, |answer| &answer["correlation_id"], into)
}

/// A fleet rolls from ledger format 1 to 2 under load (docs/OPERATIONS.md, "Rolling to ledger
/// format 2"): toolboxes `a` and `b` (two consumer groups on one stream, so every entry is read
/// twice) start at format 1; each is replaced by a replica of format 2 rolling from 1, started
/// beside it before it stops, then each of those by one of format 2. A caller keeps sending new
/// `stamp` calls, retries of answered ones, calls of a tool nobody hosts, and `echo` calls
/// refused for their arguments followed by the same request id sent right. Every entry is
/// answered once, and every retry with its original answer, on either side of each step. On a
/// cluster the calls name a results topic in the requests stream's slot, so their final answers
/// take the one-script answer and their refusals and replays the five steps.
fn a_fleet_rolls_from_ledger_format_1_to_2_under_load(topology: &dyn Topology) {
    let format_1 = ledger_env("1", "0");
    let rolling = ledger_env("2", "1");
    let format_2 = ledger_env("2", "0");
    let mut a = toolbox_with(topology, "a", STAMP, &format_1);
    let mut b = toolbox_with(topology, "b", STAMP, &format_1);
    let results = topology.roll_results();
    let stop = Arc::new(AtomicBool::new(false));
    let asked = std::thread::scope(|scope| {
        let caller = {
            let stop = stop.clone();
            let mut connection = topology.connect();
            scope.spawn(move || {
                let mut asked: BTreeMap<String, (String, Asked)> = BTreeMap::new();
                let mut seen: BTreeMap<String, Vec<Value>> = BTreeMap::new();
                let (mut cursor, mut sent) = ("-".to_owned(), 0usize);
                let mut retried: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
                while !stop.load(Ordering::Relaxed) {
                    cursor = answers_by_correlation(&mut *connection, results, &cursor, &mut seen);
                    let mut batch: Vec<(String, String, Asked, Value)> = Vec::new();
                    for _ in 0..4 {
                        let id = format!("stamp-{sent}-{}", batch.len());
                        batch.push((id, "tool.invoke".to_owned(), Asked::Stamp, json!({"tool": "stamp"})));
                    }
                    batch.push((
                        format!("unknown-{sent}"),
                        "tool.invoke".to_owned(),
                        Asked::Unknown,
                        json!({"tool": "nobody"}),
                    ));
                    batch.push((
                        format!("echo-{sent}"),
                        "echo.requested".to_owned(),
                        Asked::Invalid,
                        json!({"message": 5}),
                    ));
                    // Answered entries get a retry (a stamp) or their fix (a refused echo), once.
                    let answered: Vec<(String, String, Asked)> = asked
                        .iter()
                        .filter(|(correlation, _)| {
                            seen.contains_key(*correlation) && !retried.contains(*correlation)
                        })
                        .filter_map(|(correlation, (id, what))| match what {
                            Asked::Stamp => {
                                Some((correlation.clone(), id.clone(), Asked::Retry(correlation.clone())))
                            }
                            Asked::Invalid => Some((correlation.clone(), id.clone(), Asked::Fixed)),
                            _ => None,
                        })
                        .take(4)
                        .collect();
                    for (correlation, id, what) in answered {
                        retried.insert(correlation);
                        let (event, data) = match what {
                            Asked::Fixed => ("echo.requested", json!({"message": "fixed"})),
                            _ => ("tool.invoke", json!({"tool": "stamp"})),
                        };
                        batch.push((id, event.to_owned(), what, data));
                    }
                    let mut payloads = Vec::new();
                    for (id, event, what, mut data) in batch {
                        let correlation = format!("c-{}", asked.len());
                        data["correlation_id"] = Value::String(correlation.clone());
                        data["response_topic"] = Value::String(results.to_owned());
                        payloads.push(request(&event, &id, data));
                        asked.insert(correlation, (id, what));
                    }
                    send(&mut *connection, &payloads);
                    sent += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                asked
            })
        };
        // Each step runs a while under load, the new replica beside the old one first.
        let settle = || std::thread::sleep(Duration::from_secs(2));
        settle();
        for env in [&rolling, &format_2] {
            let next_a = toolbox_with(topology, "a", STAMP, env);
            settle();
            a.terminate(Duration::from_secs(20));
            a = next_a;
            let next_b = toolbox_with(topology, "b", STAMP, env);
            settle();
            b.terminate(Duration::from_secs(20));
            b = next_b;
            settle();
        }
        stop.store(true, Ordering::Relaxed);
        caller.join().unwrap()
    });

    let mut connection = topology.connect();
    let deadline = Instant::now() + WAIT;
    let mut found = BTreeMap::new();
    loop {
        found.clear();
        answers_by_correlation(&mut *connection, results, "-", &mut found);
        if asked.keys().all(|correlation| found.contains_key(correlation)) || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Time for a second answer to show, were there one: longer than a lease.
    std::thread::sleep(Duration::from_secs(3));
    found.clear();
    answers_by_correlation(&mut *connection, results, "-", &mut found);
    let mut failures = Vec::new();
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (correlation, (id, what)) in &asked {
        let datas = found.get(correlation).cloned().unwrap_or_default();
        let [data] = datas.as_slice() else {
            failures.push(format!("{correlation} {id} {what:?}: {} answers: {datas:?}", datas.len()));
            continue;
        };
        let (kind, right) = match what {
            Asked::Stamp => ("stamp", data["success"] == true),
            Asked::Retry(original) => ("retry", found.get(original).is_some_and(|first| first == &datas)),
            Asked::Unknown => ("unknown", data["error_code"] == "unknown_tool"),
            Asked::Invalid => ("invalid", data["error_code"] == "invalid_arguments"),
            Asked::Fixed => ("fixed", data["success"] == true && data["result"]["message"] == "fixed"),
        };
        *kinds.entry(kind).or_default() += 1;
        if !right {
            failures.push(format!("{correlation} {id} {what:?}: {data}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} entries went wrong ({kinds:?}), e.g. {:?}\nlog of a:\n{}",
        failures.len(),
        asked.len(),
        &failures[..failures.len().min(10)],
        a.log().lines().rev().take(40).collect::<Vec<_>>().join("\n")
    );
    assert!(kinds.get("retry").is_some_and(|&retries| retries >= 20), "too few retries: {kinds:?}");
    assert!(kinds.get("fixed").is_some_and(|&fixed| fixed >= 20), "too few fixed requests: {kinds:?}");
    // Format 2 wrote its notes of refusals: the last refused request id's mark holds one.
    let keys = topology.keys();
    let last_unknown = asked
        .values()
        .filter(|(_, what)| matches!(what, Asked::Unknown))
        .map(|(id, _)| id)
        .max_by_key(|id| id.trim_start_matches("unknown-").parse::<usize>().unwrap())
        .unwrap();
    let key = keys.answered(REQUESTS, last_unknown);
    let noted: bool = if keys.is_cluster() {
        redis::cmd("HEXISTS").arg(&key).arg(toolhost_bus::REFUSED_MARK).query(&mut *connection).unwrap()
    } else {
        redis::cmd("GET").arg(&key).query::<Option<String>>(&mut *connection).unwrap().as_deref()
            == Some(toolhost_bus::REFUSED_MARK)
    };
    assert!(noted, "no note of the refusal of {last_unknown} in {key}");
}

#[test]
fn on_one_server_a_fleet_rolls_from_ledger_format_1_to_2_under_load() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    a_fleet_rolls_from_ledger_format_1_to_2_under_load(&OneServer(RedisProcess::start(&[])));
}

#[test]
fn on_a_cluster_a_fleet_rolls_from_ledger_format_1_to_2_under_load() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    a_fleet_rolls_from_ledger_format_1_to_2_under_load(&Cluster(RedisCluster::start(3, 0)));
}
