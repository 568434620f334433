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
}

struct OneServer(RedisProcess);

impl Topology for OneServer {
    fn env(&self) -> Vec<(String, String)> {
        vec![("REDIS_URL".to_owned(), self.0.url())]
    }

    fn connect(&self) -> Box<dyn ConnectionLike + Send> {
        Box::new(self.0.connection())
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
}

/// Toolbox `id` with the default heartbeat (5 s, so the running toolboxes' views lag the new
/// one's start by up to that), short leases, and for `with_new_tool` a command tool no other
/// toolbox hosts.
fn toolbox(topology: &dyn Topology, id: &str, with_new_tool: bool) -> Toolhost {
    let dir: PathBuf = temp_dir(&format!("fleet-{id}"));
    let path = dir.join("toolhost.toml");
    let mut config = format!("[daemon]\ntoolbox_id = \"{id}\"\n\n[dispatch]\nclaim_idle_ms = 1500\n");
    if with_new_tool {
        config.push_str(
            "\n[[commands]]\nname = \"fresh\"\ndescription = \"Says fresh.\"\nargv = [\"echo\", \"fresh\"]\n",
        );
    }
    std::fs::write(&path, config).unwrap();
    let mut env = topology.env();
    env.push(("TERMINAL_ALLOWED_COMMANDS".to_owned(), "echo".to_owned()));
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
    let mut by_id: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut start = "-".to_owned();
    loop {
        let page: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(RESULTS)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(1000)
            .query(connection)
            .unwrap();
        let Some((last, _)) = page.last() else { return by_id };
        start = format!("({last}");
        for (_, fields) in page {
            let Some((_, payload)) = fields.into_iter().find(|(name, _)| name == "payload") else { continue };
            let answer: Value = serde_json::from_str(&payload).unwrap();
            let id = answer["data"]["request_id"].as_str().unwrap_or_default().to_owned();
            by_id.entry(id).or_default().push(answer["data"].clone());
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
