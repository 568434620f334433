//! The fleet at start (issue 35, part 1): a toolbox that starts while callers keep the stream
//! busy is never answered for with `unknown_tool` by the toolboxes already running, whose views
//! of the fleet are up to a heartbeat old, for any request added after its first heartbeat; on
//! one server and on a Redis Cluster.
//!
//! The ledger's format changed on a live fleet (docs/OPERATIONS.md, "Rolling to ledger format 2"
//! and "Rolling to ledger format 3"): each roll's steps under a steady caller, every entry
//! answered once; on one server and on a Redis Cluster.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
                // The callers stop when this ends, its assertion failing included.
                let _stopper = StopOnDrop(&stop);
                let deadline = Instant::now() + WAIT;
                while !has_beaten(&mut *connection, "c") {
                    if stop.load(Ordering::Relaxed) {
                        // Toolbox c failed to start; that failure is the test's.
                        return Vec::new();
                    }
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
                ids
            })
        };
        // The callers stop however this ends: toolbox c failing to start included, so that a
        // failure fails the test instead of hanging it.
        let _stopper = StopOnDrop(&stop);
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

/// A replica's ledger settings: `[dispatch] ledger_format` and `previous_ledger_format` (0 for
/// none).
type LedgerSettings = (u8, u8);

/// A change of the ledger's format on a live fleet, as docs/OPERATIONS.md lays it out: the
/// settings every replica runs at the start, then those of each rolling upgrade in turn.
struct Roll {
    start: LedgerSettings,
    steps: &'static [LedgerSettings],
}

impl Roll {
    /// The format every replica writes at the start.
    fn first_format(&self) -> u8 {
        self.start.0
    }

    /// The format every replica writes once the roll is done.
    fn last_format(&self) -> u8 {
        self.steps.last().map_or(self.start.0, |settings| settings.0)
    }
}

/// "Rolling to ledger format 2": from format 1, to 2 rolling from 1, to 2 alone.
const ROLL_1_TO_2: Roll = Roll { start: (1, 0), steps: &[(2, 1), (2, 0)] };

/// "Rolling to ledger format 3": from format 2 alone, to 3 rolling from 2, to 3 alone.
const ROLL_2_TO_3: Roll = Roll { start: (2, 0), steps: &[(3, 2), (3, 0)] };

/// Retries sent once the roll is done, of requests answered before it began.
const LATE_RETRIES: usize = 20;

/// The environment of a replica with ledger `settings`.
fn ledger_env((format, previous): LedgerSettings) -> Vec<(String, String)> {
    vec![
        ("TERMINAL_ALLOWED_COMMANDS".to_owned(), "echo,date".to_owned()),
        ("TOOLHOST__DISPATCH__LEDGER_FORMAT".to_owned(), format.to_string()),
        ("TOOLHOST__DISPATCH__PREVIOUS_LEDGER_FORMAT".to_owned(), previous.to_string()),
    ]
}

/// Toolbox `id` hosting `stamp` with ledger `settings`.
fn roll_toolbox(topology: &dyn Topology, id: &str, settings: LedgerSettings) -> Toolhost {
    let env = ledger_env(settings);
    let pairs: Vec<(&str, &str)> = env.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    toolbox_with(topology, id, STAMP, &pairs)
}

/// What an entry the roll's caller sent asks, and so what its one answer must be.
#[derive(Debug, Clone, Copy)]
enum Asked {
    /// `stamp` for a new request id: `success`.
    Stamp,
    /// `stamp` again for the request id of this earlier entry (by index), which was answered: the
    /// original answer's `data`.
    Retry(usize),
    /// [`Asked::Retry`] sent once the roll is done, of a stamp answered before it began.
    LateRetry(usize),
    /// A tool nobody hosts: `unknown_tool`, once across both toolboxes.
    Unknown,
    /// `echo` with arguments it refuses: `invalid_arguments`, which uses nothing up.
    Invalid,
    /// `echo` for the request id of a refused entry, now right: `success`.
    Fixed,
}

impl Asked {
    /// The event type and `data` of the request.
    fn request(self) -> (&'static str, Value) {
        match self {
            Asked::Stamp | Asked::Retry(_) | Asked::LateRetry(_) => ("tool.invoke", json!({"tool": "stamp"})),
            Asked::Unknown => ("tool.invoke", json!({"tool": "nobody"})),
            Asked::Invalid => ("echo.requested", json!({"message": 5})),
            Asked::Fixed => ("echo.requested", json!({"message": "fixed"})),
        }
    }
}

/// An entry the roll's caller sent: its request id, what it asks, and the roll's step when it was
/// sent (0 before the first, `steps.len() + 1` once the roll is done). Its correlation id is
/// [`correlation`] of its index.
#[derive(Debug, Clone)]
struct Sent {
    id: String,
    asked: Asked,
    step: usize,
}

fn correlation(index: usize) -> String {
    format!("c-{index}")
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

/// Sends entries until `stop`, each round four new `stamp` calls, a call of a tool nobody hosts,
/// an `echo` refused for its arguments, and for up to four answered entries their follow-up (a
/// stamp's retry, a refused echo's fix, once each); once `step` passes the roll's last step, also
/// retries of the first [`LATE_RETRIES`] stamps, answered before the roll began. Returns what it
/// sent.
fn roll_caller(
    mut connection: Box<dyn ConnectionLike + Send>,
    results: &str,
    steps: usize,
    step: &AtomicUsize,
    stop: &AtomicBool,
) -> Vec<Sent> {
    let mut sent: Vec<Sent> = Vec::new();
    let mut seen: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut cursor = "-".to_owned();
    let mut followed: BTreeSet<usize> = BTreeSet::new();
    let mut late_retries_sent = false;
    let mut round = 0usize;
    while !stop.load(Ordering::Relaxed) {
        cursor = answers_by_correlation(&mut *connection, results, &cursor, &mut seen);
        let now = step.load(Ordering::Relaxed);
        let mut batch: Vec<(String, Asked)> =
            (0..4).map(|index| (format!("stamp-{round}-{index}"), Asked::Stamp)).collect();
        batch.push((format!("unknown-{round}"), Asked::Unknown));
        batch.push((format!("echo-{round}"), Asked::Invalid));
        let follow_ups: Vec<(usize, String, Asked)> = sent
            .iter()
            .enumerate()
            .filter(|(index, _)| seen.contains_key(&correlation(*index)) && !followed.contains(index))
            .filter_map(|(index, entry)| match entry.asked {
                Asked::Stamp => Some((index, entry.id.clone(), Asked::Retry(index))),
                Asked::Invalid => Some((index, entry.id.clone(), Asked::Fixed)),
                _ => None,
            })
            .take(4)
            .collect();
        for (index, id, asked) in follow_ups {
            followed.insert(index);
            batch.push((id, asked));
        }
        if now > steps && !late_retries_sent {
            late_retries_sent = true;
            let early = sent
                .iter()
                .enumerate()
                .filter(|(_, entry)| entry.step == 0 && matches!(entry.asked, Asked::Stamp));
            batch.extend(
                early.take(LATE_RETRIES).map(|(index, entry)| (entry.id.clone(), Asked::LateRetry(index))),
            );
        }
        let mut payloads = Vec::new();
        for (id, asked) in batch {
            let (event, mut data) = asked.request();
            data["correlation_id"] = Value::String(correlation(sent.len()));
            data["response_topic"] = Value::String(results.to_owned());
            payloads.push(request(event, &id, data));
            sent.push(Sent { id, asked, step: now });
        }
        send(&mut *connection, &payloads);
        round += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    sent
}

/// What the ledger holds for a request: one server's answered mark, or a cluster's claim and
/// whether it is a string (format 3) or a hash (formats 1 and 2).
#[derive(Debug)]
enum Held {
    Nothing,
    Mark(String),
    Claim { string: bool, claim: toolhost_bus::Claim },
}

fn held(connection: &mut dyn ConnectionLike, keys: &toolhost_bus::Keys, request_id: &str) -> Held {
    let key = keys.answered(REQUESTS, request_id);
    if !keys.is_cluster() {
        let mark: Option<String> = redis::cmd("GET").arg(&key).query(connection).unwrap();
        return mark.map_or(Held::Nothing, Held::Mark);
    }
    let kind: String = redis::cmd("TYPE").arg(&key).query(connection).unwrap();
    match kind.as_str() {
        "none" => Held::Nothing,
        "string" => {
            let value: String = redis::cmd("GET").arg(&key).query(connection).unwrap();
            let claim = toolhost_bus::Claim::from_value(&value)
                .unwrap_or_else(|| panic!("{key}: no claim: {value:?}"));
            Held::Claim { string: true, claim }
        }
        "hash" => {
            let fields: Vec<(String, String)> = redis::cmd("HGETALL").arg(&key).query(connection).unwrap();
            Held::Claim { string: false, claim: toolhost_bus::Claim::from_fields(fields).unwrap() }
        }
        other => panic!("{key} is a {other}"),
    }
}

/// Whether `held` is what ledger `format` leaves for a request answered with `answer` (its
/// `data`, kept for retries), or for one whose only entry was refused (`None`): one server's
/// mark holds the kept answer, or in format 2 and later notes the refusal (format 1 writes
/// nothing); a cluster's claim is a string in format 3 and a hash before, answered with the kept
/// answer, or noting the refusal and nothing else.
fn holds_as_written(held: &Held, format: u8, answer: Option<&Value>) -> bool {
    let kept_is = |kept: Option<&str>, data: &Value| {
        kept.and_then(|kept| serde_json::from_str::<Value>(kept).ok()).is_some_and(|kept| &kept == data)
    };
    match (held, answer) {
        (Held::Mark(mark), Some(data)) => {
            kept_is(toolhost_bus::KeptAnswer::from_mark(mark).as_ref().map(|kept| kept.data.as_str()), data)
        }
        (Held::Mark(mark), None) => format >= 2 && mark == toolhost_bus::REFUSED_MARK,
        (Held::Nothing, None) => format == 1,
        (Held::Claim { string, claim }, Some(data)) => {
            *string == (format == 3) && claim.is_answered() && kept_is(claim.kept.as_deref(), data)
        }
        (Held::Claim { string, claim }, None) => {
            format >= 2 && *string == (format == 3) && claim.refused && claim.state.is_none()
        }
        (Held::Nothing, Some(_)) => false,
    }
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A fleet changes its ledger's format under load by `roll` (docs/OPERATIONS.md, "Rolling to
/// ledger format 2" and "Rolling to ledger format 3"): toolboxes `a` and `b` (two consumer groups
/// on one stream, so every entry is read twice) start with `roll.start`; at each step each is
/// replaced by a replica with the step's settings, started beside it before it stops. A caller
/// ([`roll_caller`]) keeps sending new `stamp` calls, retries of answered ones, calls of a tool
/// nobody hosts, and `echo` calls refused for their arguments followed by the same request id
/// sent right, and once the roll is done retries of stamps answered before it began. Every entry
/// is answered once, and every retry with its original answer, on either side of each step;
/// every replaced replica drains and exits 0. The ledger holds what the first format wrote for
/// the first requests and what the last format wrote for the last. On a cluster the calls name a
/// results topic in the requests stream's slot, so their final answers take the one-script
/// answer and their refusals and replays the five steps.
fn a_fleet_rolls_its_ledger_format_under_load(topology: &dyn Topology, roll: &Roll) {
    let mut a = roll_toolbox(topology, "a", roll.start);
    let mut b = roll_toolbox(topology, "b", roll.start);
    let results = topology.roll_results();
    let stop = AtomicBool::new(false);
    let step = AtomicUsize::new(0);
    let sent = std::thread::scope(|scope| {
        let caller = scope.spawn(|| roll_caller(topology.connect(), results, roll.steps.len(), &step, &stop));
        // Stops the caller however this ends: the scope waits for it, a failed assertion too.
        let stopper = StopOnDrop(&stop);
        // Each step runs a while under load, the new replica beside the old one first.
        let settle = || std::thread::sleep(Duration::from_secs(2));
        settle();
        for (index, settings) in roll.steps.iter().enumerate() {
            step.store(index + 1, Ordering::Relaxed);
            for (id, replica) in [("a", &mut a), ("b", &mut b)] {
                let next = roll_toolbox(topology, id, *settings);
                settle();
                let code = replica.terminate(Duration::from_secs(20));
                assert_eq!(code, Some(0), "{id} before step {} did not drain", index + 1);
                *replica = next;
            }
            settle();
        }
        step.store(roll.steps.len() + 1, Ordering::Relaxed);
        settle();
        drop(stopper);
        caller.join().unwrap()
    });

    let mut connection = topology.connect();
    let deadline = Instant::now() + WAIT;
    let mut found = BTreeMap::new();
    loop {
        found.clear();
        answers_by_correlation(&mut *connection, results, "-", &mut found);
        if (0..sent.len()).all(|index| found.contains_key(&correlation(index))) || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Time for a second answer to show, were there one: longer than a lease.
    std::thread::sleep(Duration::from_secs(3));
    found.clear();
    answers_by_correlation(&mut *connection, results, "-", &mut found);
    let answer = |index: usize| found.get(&correlation(index)).map(Vec::as_slice).unwrap_or_default();
    let mut failures = Vec::new();
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, Sent { id, asked, step }) in sent.iter().enumerate() {
        let datas = answer(index);
        let [data] = datas else {
            failures
                .push(format!("c-{index} {id} {asked:?} at step {step}: {} answers: {datas:?}", datas.len()));
            continue;
        };
        let (kind, right) = match asked {
            Asked::Stamp => ("stamp", data["success"] == true),
            Asked::Retry(original) => ("retry", answer(*original) == datas),
            Asked::LateRetry(original) => ("late retry", answer(*original) == datas),
            Asked::Unknown => ("unknown", data["error_code"] == "unknown_tool"),
            Asked::Invalid => ("invalid", data["error_code"] == "invalid_arguments"),
            Asked::Fixed => ("fixed", data["success"] == true && data["result"]["message"] == "fixed"),
        };
        *kinds.entry(kind).or_default() += 1;
        if !right {
            failures.push(format!("c-{index} {id} {asked:?} at step {step}: {data}"));
        }
    }
    let tail = |toolbox: &Toolhost| toolbox.log().lines().rev().take(40).collect::<Vec<_>>().join("\n");
    assert!(
        failures.is_empty(),
        "{} of {} entries went wrong ({kinds:?}), e.g. {:?}\nlog of a:\n{}\nlog of b:\n{}",
        failures.len(),
        sent.len(),
        &failures[..failures.len().min(10)],
        tail(&a),
        tail(&b)
    );
    assert!(kinds.get("retry").is_some_and(|&retries| retries >= 20), "too few retries: {kinds:?}");
    assert!(kinds.get("fixed").is_some_and(|&fixed| fixed >= 20), "too few fixed requests: {kinds:?}");
    assert_eq!(kinds.get("late retry"), Some(&LATE_RETRIES), "late retries: {kinds:?}");

    // The first requests, answered before the roll, hold what the first format wrote (a claim
    // keeps the shape it was created in, though a replica of the last format answered its late
    // retry); the last, sent once it was done, what the last format writes.
    let keys = topology.keys();
    let rolled = roll.steps.len() + 1;
    for (when, format, at_step) in [("first", roll.first_format(), 0), ("last", roll.last_format(), rolled)] {
        let of = |what: fn(&Asked) -> bool| {
            let mut at =
                sent.iter().enumerate().filter(|(_, entry)| entry.step == at_step && what(&entry.asked));
            let found = if when == "first" { at.next() } else { at.next_back() };
            found.unwrap()
        };
        let (stamp, Sent { id: stamp_id, .. }) = of(|asked| matches!(asked, Asked::Stamp));
        let stamp_held = held(&mut *connection, &keys, stamp_id);
        assert!(
            holds_as_written(&stamp_held, format, answer(stamp).first()),
            "the {when} stamp {stamp_id}, answered in format {format} with {:?}: {stamp_held:?}",
            answer(stamp)
        );
        let (_, Sent { id: unknown_id, .. }) = of(|asked| matches!(asked, Asked::Unknown));
        let unknown_held = held(&mut *connection, &keys, unknown_id);
        assert!(
            holds_as_written(&unknown_held, format, None),
            "the {when} unknown call {unknown_id}, refused in format {format}: {unknown_held:?}"
        );
    }
}

#[test]
fn on_one_server_a_fleet_rolls_from_ledger_format_1_to_2_under_load() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    a_fleet_rolls_its_ledger_format_under_load(&OneServer(RedisProcess::start(&[])), &ROLL_1_TO_2);
}

#[test]
fn on_a_cluster_a_fleet_rolls_from_ledger_format_1_to_2_under_load() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    a_fleet_rolls_its_ledger_format_under_load(&Cluster(RedisCluster::start(3, 0)), &ROLL_1_TO_2);
}

/// On one server format 3 writes what format 2 does: the roll changes nothing there, and the test
/// holds it to that.
#[test]
fn on_one_server_a_fleet_rolls_from_ledger_format_2_to_3_under_load() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    a_fleet_rolls_its_ledger_format_under_load(&OneServer(RedisProcess::start(&[])), &ROLL_2_TO_3);
}

/// On a cluster the claims change from hashes to strings: replicas of format 2 beside those of
/// step 1 (which write hashes and read both), then those beside step 2's (which write strings),
/// with the hashes written before honoured to the end.
#[test]
fn on_a_cluster_a_fleet_rolls_from_ledger_format_2_to_3_under_load() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    a_fleet_rolls_its_ledger_format_under_load(&Cluster(RedisCluster::start(3, 0)), &ROLL_2_TO_3);
}
