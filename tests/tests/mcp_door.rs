//! The MCP door with real clients: the official `mcp` Python SDK, the OpenAI Agents SDK and the
//! official TypeScript SDK clients list and call tools that a *second* toolhost process hosts
//! (one of them from a hosted MCP server), over streamable HTTP (`[mcp] listen`) and over stdio
//! (`toolhost mcp`), in the `initialize` generations and in 2026-07-28 (no handshake, no
//! session); cancel, progress, durable tasks across a restart of the door and across doors,
//! `list_changed` and `subscriptions/listen`, a hosted tool's question answered by a 2026-07-28
//! client (an `InputRequiredResult` and a retried call, on either door; a task's
//! `input_required` answered by `tasks/update`), and hostile input.
//!
//! The Python clients run in `tests/mcp_door/scenarios.py` under the venv `just test-mcp-door`
//! makes (`scripts/ensure-mcp-door-venv.sh`; `TOOLHOST_MCP_DOOR_VENV` names another); the
//! TypeScript ones in `tests/mcp_door/ts_clients.cjs` from `scripts/ensure-mcp-ts-clients.sh`'s
//! cache (`TOOLHOST_MCP_TS_CLIENTS`). The hosted MCP server is `tests/mcp_door/slow_server.py`,
//! on the Python SDK; the OAuth tests' authorization server is `tests/mcp_door/auth_server.py`,
//! on joserfc (`scripts/ensure-mcp-oauth-venv.sh`, `TOOLHOST_MCP_OAUTH_VENV`).

// Test code: a failed step is a failed test.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost_e2e::mcp_http::{post, raw, session_id};
use toolhost_e2e::{RedisProcess, Toolhost, free_port, temp_dir, toolhost_bin, user};

/// The TypeScript clients, as `scripts/ensure-mcp-ts-clients.sh` installs them.
fn ts_clients() -> PathBuf {
    let dir = std::env::var_os("TOOLHOST_MCP_TS_CLIENTS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/toolhost/mcp-ts-clients")
    });
    assert!(
        dir.join("node_modules/@modelcontextprotocol/client").exists(),
        "{} is missing: run scripts/ensure-mcp-ts-clients.sh (`just test-mcp-door` does)",
        dir.display()
    );
    dir
}

fn fixture(name: &str) -> PathBuf {
    toolhost_e2e::fixture("mcp_door", name)
}

/// A Redis, a toolbox `hosts` hosting the slow MCP server, and a toolbox `door` serving the MCP
/// door over HTTP.
struct Fleet {
    redis: RedisProcess,
    hosts: Option<Toolhost>,
    door: Option<Toolhost>,
    dir: PathBuf,
    door_port: u16,
    /// More `[mcp]` keys for the door.
    door_extra: String,
}

impl Fleet {
    fn start() -> Fleet {
        Fleet::start_with("")
    }

    fn start_with(door_extra: &str) -> Fleet {
        let redis = RedisProcess::start(&[]);
        let dir = temp_dir("mcp-door");
        std::fs::create_dir_all(dir.join("marks")).unwrap();
        let hosts_config = dir.join("hosts.toml");
        std::fs::write(
            &hosts_config,
            format!(
                "[daemon]\ntoolbox_id = \"hosts\"\n[tools.terminal]\nrun_as = \"{}\"\n\n[[mcp_servers]]\nname = \"slow\"\n\
                 command = \"{}\"\nargs = [\"{}\"]\ntimeout_ms = 8000\nenv = {{ SLOW_SERVER_MARKS = \"{}\" }}\n",
                user(),
                toolhost_e2e::mcp_door_venv().join("bin/python").display(),
                fixture("slow_server.py").display(),
                dir.join("marks").display()
            ),
        )
        .unwrap();
        let hosts = Toolhost::start(&[
            ("REDIS_URL", &redis.url()),
            ("TOOLHOST_CONFIG", hosts_config.to_str().unwrap()),
        ]);
        let mut fleet = Fleet {
            redis,
            hosts: Some(hosts),
            door: None,
            dir,
            door_port: free_port(),
            door_extra: door_extra.to_owned(),
        };
        fleet.start_door();
        fleet
    }

    /// The door's configuration, also what `toolhost mcp` reads.
    fn door_config(&self) -> PathBuf {
        self.write_door_config("door", self.door_port)
    }

    fn write_door_config(&self, toolbox_id: &str, port: u16) -> PathBuf {
        let path = self.dir.join(format!("{toolbox_id}.toml"));
        std::fs::write(
            &path,
            format!(
                "[redis]\nurl = \"{}\"\n[daemon]\ntoolbox_id = \"{toolbox_id}\"\n[mcp]\nlisten = \"127.0.0.1:{port}\"\n\
                 max_body_bytes = 65536\nmax_sessions = 8\n\
                 task_threshold_ms = 1000\npage_size = 2\n{}\n",
                self.redis.url(),
                self.door_extra.replace("{door_port}", &port.to_string())
            ),
        )
        .unwrap();
        path
    }

    /// A second door, another replica on the same Redis, and its URL.
    fn start_second_door(&self) -> (Toolhost, String) {
        let port = free_port();
        let config = self.write_door_config("door2", port);
        let door = Toolhost::start(&[("TOOLHOST_CONFIG", config.to_str().unwrap())]);
        door.wait_for_log("MCP door listening at /mcp", Duration::from_secs(10));
        (door, format!("http://127.0.0.1:{port}/mcp"))
    }

    /// Starts a toolbox `toolbox_id` hosting one more tool, `tool`, so the fleet's tools change.
    fn start_toolbox_with(&self, toolbox_id: &str, tool: &str) -> Toolhost {
        let config = self.dir.join(format!("{toolbox_id}.toml"));
        std::fs::write(
            &config,
            format!(
                "[daemon]\ntoolbox_id = \"{toolbox_id}\"\n[[commands]]\nname = \"{tool}\"\n\
                 description = \"Uptime.\"\nargv = [\"uptime\"]\n"
            ),
        )
        .unwrap();
        Toolhost::start(&[("REDIS_URL", &self.redis.url()), ("TOOLHOST_CONFIG", config.to_str().unwrap())])
    }

    fn start_door(&mut self) {
        let config = self.door_config();
        let door = Toolhost::start(&[("TOOLHOST_CONFIG", config.to_str().unwrap())]);
        door.wait_for_log("MCP door listening at /mcp", Duration::from_secs(10));
        self.door = Some(door);
    }

    fn restart_door(&mut self) {
        if let Some(mut door) = self.door.take() {
            assert_eq!(door.terminate(Duration::from_secs(30)), Some(0), "the door stops cleanly");
        }
        self.start_door();
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.door_port)
    }

    fn stdio(&self) -> String {
        format!("stdio:{}", self.door_config().display())
    }

    fn marks(&self) -> String {
        std::fs::read_to_string(self.dir.join("marks/cancelled")).unwrap_or_default()
    }

    /// Every entry of every fleet client's private stream and task stream.
    fn client_answers(&self) -> Vec<Value> {
        let mut connection = self.redis.connection();
        let keys: Vec<String> = redis::cmd("KEYS").arg("results:*").query(&mut connection).unwrap();
        let mut answers = Vec::new();
        for key in keys {
            let entries: Vec<(String, Vec<(String, String)>)> =
                redis::cmd("XRANGE").arg(&key).arg("-").arg("+").query(&mut connection).unwrap();
            for (_, fields) in entries {
                for (field, value) in fields {
                    if field == "payload"
                        && let Ok(payload) = serde_json::from_str::<Value>(&value)
                    {
                        answers.push(payload);
                    }
                }
            }
        }
        answers
    }
}

fn scenario_command(args: &[&str]) -> Command {
    let mut command = Command::new(toolhost_e2e::mcp_door_venv().join("bin/python"));
    command
        .arg(fixture("scenarios.py"))
        .args(args)
        .env("MCP_DOOR_TOOLHOST", toolhost_bin())
        .stderr(Stdio::inherit());
    command
}

/// Runs a scenario to its end and returns its report (the last line).
fn scenario(args: &[&str]) -> Value {
    let output = scenario_command(args).stdout(Stdio::piped()).output().expect("run scenarios.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().find(|line| line.starts_with('{')).unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|_| panic!("scenario {args:?} reported nothing:\n{stdout}"))
}

/// Which generation a client was asked to speak.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// `initialize`, up to 2025-11-25.
    Legacy,
    /// 2026-07-28, no handshake.
    Modern,
}

fn check_list_call(target: &str, mode: Mode, report: &Value) {
    if mode == Mode::Legacy {
        assert_eq!(report["protocol"], "2025-11-25", "{target}: {report}");
        assert_eq!(report["initialized"], true, "{target}: {report}");
        assert_eq!(report["discovered"], false, "{target}: {report}");
    } else {
        assert_eq!(report["protocol"], "2026-07-28", "{target}: {report}");
        assert_eq!(report["initialized"], false, "{target}: no initialize: {report}");
        // ttlMs is the door's [mcp] watch_ms (1 s by default); the list is filtered per tenant.
        assert_eq!(
            report["hints"],
            json!({"ttl_ms": 1000, "cache_scope": "private", "result_type": "complete"}),
            "{target}: {report}"
        );
    }
    let tools: Vec<&str> = report["tools"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for name in ["echo", "slow__add", "slow__slow"] {
        assert!(tools.contains(&name), "{target}: {name} listed: {tools:?}");
    }
    assert_eq!(report["echo"]["structured"], json!({"message": "hi"}), "{target}: {report}");
    assert_eq!(report["echo"]["text"], "{\"message\":\"hi\"}", "{target}: {report}");
    assert_eq!(
        report["add"]["structured"],
        json!({"sum": 5}),
        "{target}: the hosted tool of the other process: {report}"
    );
    assert_eq!(report["bad"]["error"], true, "{target}: {report}");
    let bad = report["bad"]["text"].as_str().unwrap();
    assert!(bad.starts_with("invalid_arguments") && bad.contains("/message (rule type)"), "{target}: {bad}");
    assert_eq!(report["unknown"]["code"], -32602, "{target}: {report}");
}

#[test]
fn mcp_clients_list_and_call_tools_another_toolhost_hosts_over_http_and_stdio() {
    let fleet = Fleet::start();
    for target in [fleet.url(), fleet.stdio()] {
        check_list_call(&target, Mode::Legacy, &scenario(&["--mode", "legacy", "list-call", &target]));
        check_list_call(&target, Mode::Modern, &scenario(&["--mode", "2026-07-28", "list-call", &target]));
    }
    // A client that probes server/discover finds 2026-07-28 and uses it.
    let auto = scenario(&["--mode", "auto", "list-call", &fleet.url()]);
    check_list_call("http, auto", Mode::Modern, &auto);
    assert_eq!(auto["discovered"], true, "{auto}");
}

#[test]
fn the_typescript_sdk_clients_list_and_call_in_both_generations() {
    let fleet = Fleet::start();
    let run = |args: &[&str]| -> Value {
        let output = Command::new("node")
            .arg(fixture("ts_clients.cjs"))
            .args(args)
            .env("MCP_TS_CLIENTS", ts_clients())
            .env("MCP_DOOR_TOOLHOST", toolhost_bin())
            .stderr(Stdio::inherit())
            .output()
            .expect("run node");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let last = stdout.lines().rev().find(|line| line.starts_with('{')).unwrap_or_default();
        serde_json::from_str(last)
            .unwrap_or_else(|_| panic!("ts_clients {args:?} reported nothing:\n{stdout}"))
    };
    let check = |what: &str, report: &Value| {
        assert!(report.get("failed").is_none(), "{what}: {report}");
        let tools: Vec<&str> = report["tools"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        assert!(tools.contains(&"echo") && tools.contains(&"slow__add"), "{what}: {report}");
        assert_eq!(report["echo"]["structured"], json!({"message": "hi"}), "{what}: {report}");
        assert_eq!(report["add"]["structured"], json!({"sum": 5}), "{what}: {report}");
        assert_eq!(report["unknown"]["code"], -32602, "{what}: {report}");
    };
    for target in [fleet.url(), fleet.stdio()] {
        // @modelcontextprotocol/sdk 1.x: initialize, no cache hints.
        let old = run(&["sdk", &target]);
        check(&format!("sdk {target}"), &old);
        assert_eq!(old["hints"], json!({"ttlMs": null, "cacheScope": null}), "{old}");
        // @modelcontextprotocol/client 2.x pinned to 2026-07-28: no session, cache hints.
        let new = run(&["client", "2026-07-28", &target]);
        check(&format!("client {target}"), &new);
        assert_eq!(new["protocol"], "2026-07-28", "{new}");
        assert_eq!(new["session"], Value::Null, "{new}");
        assert_eq!(new["hints"], json!({"ttlMs": 1000, "cacheScope": "private"}), "{new}");
        // The 2.x client's own MRTR driver answers the hosted tool's question through its
        // elicitation handler and retries the call.
        let asked = run(&["ask", &target]);
        assert!(asked.get("failed").is_none(), "ask {target}: {asked}");
        assert_eq!(asked["asked"], json!(["Name?"]), "ask {target}: {asked}");
        assert_eq!(asked["structured"], json!({"action": "accept", "name": "Lin"}), "ask {target}: {asked}");
    }
    let old = run(&["sdk", &fleet.url()]);
    assert_eq!(old["protocol"], "2025-11-25", "{old}");
    assert!(old["session"].is_string(), "an initialize session over HTTP: {old}");
    let auto = run(&["client", "auto", &fleet.url()]);
    check("client auto", &auto);
    assert_eq!(auto["protocol"], "2026-07-28", "{auto}");
}

#[test]
fn a_2026_07_28_client_cancels_and_sees_progress_over_http_and_stdio() {
    let fleet = Fleet::start();
    for (round, target) in [fleet.url(), fleet.stdio()].into_iter().enumerate() {
        let report = scenario(&["--mode", "2026-07-28", "progress", &target]);
        assert_eq!(report["result"], json!({"slept": 1.5}), "{target}: {report}");
        let progress = report["progress"].as_array().unwrap();
        assert!(!progress.is_empty() && progress[0]["total"] == 15.0, "{target}: {report}");

        let report = scenario(&["--mode", "2026-07-28", "cancel", &target]);
        assert_eq!(report["outcome"], "cancelled", "{target}: {report}");
        assert_eq!(report["progress_seen"], true, "{target}: {report}");
        assert_eq!(report["after"], json!({"message": "after"}), "{target}: {report}");
        // The hosted server is told; over HTTP the call's answer is on the door's stream (the
        // stdio door's stream goes with its process, when the client closes it).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let cancelled = fleet
                .client_answers()
                .iter()
                .filter(|answer| answer["data"]["error_code"] == "cancelled")
                .count();
            if fleet.marks().lines().count() > round && (round > 0 || cancelled > 0) {
                if round == 0 {
                    assert_eq!(cancelled, 1, "{target}: one cancelled answer");
                }
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{target}: the hosted server was told ({:?}) and the call answered cancelled",
                fleet.marks()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_2026_07_28_client_answers_a_hosted_tools_question_by_retrying_its_call_over_http_and_stdio() {
    let fleet = Fleet::start();
    for target in [fleet.url(), fleet.stdio()] {
        let report = scenario(&["--mode", "2026-07-28", "ask", &target]);
        assert_eq!(report["protocol"], "2026-07-28", "{target}: {report}");
        // The SDK's elicitation callback got each question through an InputRequiredResult and
        // answered it in its retry of tools/call.
        assert_eq!(report["asked"], json!(["Name?", "No?"]), "{target}: {report}");
        assert_eq!(
            report["accepted"]["structured"],
            json!({"action": "accept", "name": "Ada"}),
            "{target}: {report}"
        );
        assert_eq!(report["declined"]["structured"]["action"], "decline", "{target}: {report}");
    }
}

#[test]
fn a_2026_07_28_retry_with_a_bad_request_state_or_answer_is_refused_and_the_other_replica_takes_it() {
    let fleet = Fleet::start();
    let (_second, second_url) = fleet.start_second_door();
    let report = scenario(&["ask-raw", &fleet.url(), &second_url]);
    let first = &report["first"]["body"]["result"];
    assert_eq!(first["resultType"], "input_required", "{report}");
    let requests = first["inputRequests"].as_object().unwrap();
    assert_eq!(requests.len(), 1, "{report}");
    let question = requests.values().next().unwrap();
    assert_eq!(question["method"], "elicitation/create", "{report}");
    assert_eq!(question["params"]["message"], "Name?", "{report}");
    assert_eq!(question["params"]["requestedSchema"]["required"], json!(["name"]), "{report}");
    let state = first["requestState"].as_str().unwrap();
    assert!(state.starts_with("rs2."), "sealed by rmcp's keyring codec: {state}");
    let error = |step: &str| {
        let error = &report[step]["body"]["error"];
        assert_eq!(error["code"], -32602, "{step}: {report}");
        error["message"].as_str().unwrap().to_owned()
    };
    for step in ["tampered", "forged", "other_tool"] {
        assert!(error(step).starts_with("requestState rejected"), "{step}: {report}");
    }
    assert!(error("no_state").contains("without the requestState"), "{report}");
    assert!(error("unknown_key").starts_with("unknown: the call did not ask 'never-asked'"), "{report}");
    // The host checks the answer against requestedSchema, as `tool.input` does; the question
    // keeps waiting.
    let refused = error("refused");
    assert!(refused.contains("invalid_arguments"), "{refused}");
    assert_eq!(report["refused"]["body"]["error"]["data"]["state"], "refused", "{report}");
    // The other replica took the answer and followed the call, made by the first, to its end.
    let answered = &report["answered"]["body"]["result"];
    assert_eq!(answered["resultType"], "complete", "{report}");
    assert_eq!(answered["structuredContent"], json!({"action": "accept", "name": "Ada"}), "{report}");
    // The question was answered: the same state again is `unknown`.
    assert!(error("replayed").starts_with("unknown: the call no longer waits"), "{report}");
    assert_eq!(report["replayed"]["body"]["error"]["data"]["state"], "unknown", "{report}");
    // A client that did not declare elicitation is declined for, and the tool goes on.
    let incapable = &report["incapable"]["body"]["result"];
    assert_eq!(incapable["resultType"], "complete", "{report}");
    assert_eq!(incapable["structuredContent"]["action"], "decline", "{report}");
    // A task's question is its `input_required` status, answered by `tasks/update` on the
    // other door; a refused answer is the update's error, and a second answer is `unknown`.
    assert_eq!(report["task_created"]["body"]["result"]["resultType"], "task", "{report}");
    let asked = &report["task_asked"];
    assert_eq!(asked["status"], "input_required", "{report}");
    let requests = asked["inputRequests"].as_object().unwrap();
    assert_eq!(requests.values().next().unwrap()["params"]["message"], "Name?", "{report}");
    assert_eq!(report["task_refused"]["body"]["error"]["data"]["state"], "refused", "{report}");
    assert!(report["task_update"]["body"]["error"].is_null(), "{report}");
    assert_eq!(report["task_again"]["body"]["error"]["data"]["state"], "unknown", "{report}");
    let final_task = &report["task_final"];
    assert_eq!(final_task["status"], "completed", "{report}");
    assert_eq!(
        final_task["result"]["structuredContent"],
        json!({"action": "accept", "name": "Grace"}),
        "{report}"
    );
    // One call ran for the answered question: its request id answered once, with Ada.
    let answers: Vec<Value> = fleet
        .client_answers()
        .into_iter()
        .filter(|answer| answer["data"]["result"]["name"] == "Ada")
        .collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
}

#[test]
fn list_changed_reaches_a_2026_07_28_client_through_subscriptions_listen() {
    let fleet = Fleet::start();
    let mut toolboxes = Vec::new();
    for (target, toolbox, tool) in
        [(fleet.url(), "third", "uptime_http"), (fleet.stdio(), "fourth", "uptime_stdio")]
    {
        let mut child = scenario_command(&["--mode", "2026-07-28", "listen", &target])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(ready, "READY", "{target}");
        toolboxes.push(fleet.start_toolbox_with(toolbox, tool));
        let report: Value =
            serde_json::from_str(&lines.last().and_then(Result::ok).unwrap_or_default()).unwrap();
        let _ = child.wait();
        assert_eq!(report["protocol"], "2026-07-28", "{target}: {report}");
        assert_eq!(report["honored"], json!({"toolsListChanged": true}), "{target}: {report}");
        assert_eq!(report["event"], "ToolsListChanged", "{target}: {report}");
        assert!(!report["before"].as_array().unwrap().contains(&json!(tool)), "{target}: {report}");
        assert!(report["after"].as_array().unwrap().contains(&json!(tool)), "{target}: {report}");
    }
}

#[test]
fn a_2026_07_28_request_needs_no_session_and_a_task_made_on_one_door_is_read_on_another() {
    let fleet = Fleet::start();
    let (_second, second_url) = fleet.start_second_door();
    let report = scenario(&["modern-raw", &fleet.url(), &second_url]);
    for step in ["first", "retry"] {
        assert_eq!(report[step]["status"], 200, "{step}: {report}");
        assert_eq!(report[step]["session"], Value::Null, "no Mcp-Session-Id: {report}");
        assert_eq!(report[step]["body"]["result"]["resultType"], "complete", "{report}");
        assert_eq!(
            report[step]["body"]["result"]["structuredContent"],
            json!({"message": "again"}),
            "{report}"
        );
    }
    // The same JSON-RPC id twice, with no session to scope it: two calls, two request ids, each
    // a fresh `mcp-<32 hex>` (docs/CONTRACTS.md, "Request ids of MCP calls").
    let ids: Vec<String> = fleet
        .client_answers()
        .into_iter()
        .filter(|answer| answer["data"]["result"] == json!({"message": "again"}))
        .filter_map(|answer| answer["data"]["request_id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ids.len(), 2, "a retry is a new call: {ids:?}");
    assert_ne!(ids[0], ids[1], "{ids:?}");
    for id in &ids {
        let hex = id.strip_prefix("mcp-").unwrap_or_default();
        assert!(hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    }
    // What 2026-07-28 removed is refused.
    assert_eq!(report["set_level"]["body"]["error"]["code"], -32601, "{report}");
    assert_eq!(report["ping"]["body"]["error"]["code"], -32601, "{report}");
    // Mcp-Method and Mcp-Name must match the body.
    for step in ["mismatch", "wrong_name"] {
        assert_eq!(report[step]["status"], 400, "{step}: {report}");
        assert_eq!(report[step]["body"]["error"]["code"], -32020, "{step}: {report}");
    }
    // A task made through the first door is polled through the second, with Mcp-Name = its id.
    let created = &report["created"]["body"]["result"];
    assert_eq!(created["resultType"], "task", "{report}");
    assert_eq!(created["status"], "working", "{report}");
    let last = &report["task_final"];
    assert_eq!(last["status"], "completed", "{report}");
    assert_eq!(last["taskId"], created["taskId"], "{report}");
    assert_eq!(last["result"]["structuredContent"], json!({"slept": 2.0}), "{report}");
}

#[test]
fn hosted_schemas_reach_clients_with_their_2020_12_keywords() {
    let fleet = Fleet::start();
    for mode in ["2026-07-28", "legacy"] {
        let report = scenario(&["--mode", mode, "schema", &fleet.url()]);
        let own = &report["own"];
        assert!(own.to_string().contains("prefixItems") && own.get("$defs").is_some(), "{report}");
        assert_eq!(report["served"], *own, "{mode}: the schema as the hosted server wrote it: {report}");
        assert_eq!(report["good"]["structured"], json!({"sum": 15}), "{mode}: {report}");
        assert_eq!(report["bad"]["error"], true, "{mode}: {report}");
        let bad = report["bad"]["text"].as_str().unwrap();
        assert!(bad.starts_with("invalid_arguments") && bad.contains("/size/1"), "{mode}: {bad}");
    }
}

#[test]
fn the_agents_sdk_lists_and_invokes_fleet_tools_over_http_and_stdio() {
    let fleet = Fleet::start();
    for target in [fleet.url(), fleet.stdio()] {
        let report = scenario(&["agents", &target]);
        let tools: Vec<&str> = report["tools"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        assert!(tools.contains(&"echo") && tools.contains(&"slow__add"), "{target}: {report}");
        // The SDK hands the model the tool's text content: the same JSON as the structured result.
        let text =
            |name: &str| report["results"][name]["text"].as_str().map(str::to_owned).unwrap_or_default();
        assert_eq!(
            serde_json::from_str::<Value>(&text("echo")).ok(),
            Some(json!({"message": "from agents"})),
            "{target}: {report}"
        );
        assert_eq!(
            serde_json::from_str::<Value>(&text("slow__add")).ok(),
            Some(json!({"sum": 42})),
            "{target}: {report}"
        );
    }
}

#[test]
fn a_client_cancel_stops_the_hosted_tool_and_the_call_is_answered_cancelled_once() {
    let fleet = Fleet::start();
    let report = scenario(&["cancel", &fleet.url()]);
    assert_eq!(report["outcome"], "cancelled", "{report}");
    assert_eq!(report["progress_seen"], true, "progress reached the client before the cancel: {report}");
    assert_eq!(report["after"], json!({"message": "after"}), "{report}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cancelled: Vec<Value> = fleet
            .client_answers()
            .into_iter()
            .filter(|answer| answer["data"]["error_code"] == "cancelled")
            .collect();
        if fleet.marks().contains("slow") && !cancelled.is_empty() {
            assert_eq!(cancelled.len(), 1, "one cancelled answer: {cancelled:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hosted server was told ({:?}) and the call answered cancelled",
            fleet.marks()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn progress_of_a_hosted_tool_reaches_the_mcp_client() {
    let fleet = Fleet::start();
    let report = scenario(&["progress", &fleet.url()]);
    assert_eq!(report["result"], json!({"slept": 1.5}), "{report}");
    let progress = report["progress"].as_array().unwrap();
    assert!(!progress.is_empty(), "{report}");
    assert!(progress.len() <= 16, "rate-limited to about 10 a second: {report}");
    assert_eq!(progress[0]["total"], 15.0, "{report}");
}

#[test]
fn a_long_call_is_a_task_that_survives_a_restart_of_the_door() {
    let mut fleet = Fleet::start();
    let created = scenario(&["task-create", &fleet.url()]);
    let result = &created["response"]["result"];
    assert_eq!(result["resultType"], "task", "{created}");
    assert_eq!(result["status"], "working", "{created}");
    let task_id = result["taskId"].as_str().unwrap().to_owned();
    assert_eq!(task_id.len(), 36, "a UUID: {task_id}");
    fleet.restart_door();
    let got = scenario(&["task-get", &fleet.url(), &task_id]);
    assert_eq!(got["final"]["status"], "completed", "{got}");
    assert_eq!(got["final"]["result"]["structuredContent"], json!({"slept": 4.0}), "{got}");
    let unknown = scenario(&["task-get", &fleet.url(), "00000000-0000-4000-8000-000000000000"]);
    assert!(unknown["states"][0]["code"] == -32602, "an unknown task: {unknown}");
}

#[test]
fn list_changed_reaches_the_client_when_a_second_toolbox_starts() {
    let fleet = Fleet::start();
    let mut child = scenario_command(&["list-changed", &fleet.url()]).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(ready, "READY");
    let config = fleet.dir.join("third.toml");
    std::fs::write(
        &config,
        "[daemon]\ntoolbox_id = \"third\"\n[[commands]]\nname = \"uptime_now\"\ndescription = \"Uptime.\"\nargv = [\"uptime\"]\n",
    )
    .unwrap();
    let _third =
        Toolhost::start(&[("REDIS_URL", &fleet.redis.url()), ("TOOLHOST_CONFIG", config.to_str().unwrap())]);
    let report: Value = serde_json::from_str(&lines.last().and_then(Result::ok).unwrap_or_default()).unwrap();
    let _ = child.wait();
    assert_eq!(report["notified"], true, "{report}");
    assert!(report["after"].as_array().unwrap().contains(&json!("uptime_now")), "{report}");
}

#[test]
fn a_call_nobody_answers_ends_after_the_tools_timeout_with_no_toolbox_answered() {
    let mut fleet = Fleet::start();
    // The hosting toolbox dies without a word: its heartbeat still lists its tools for a while,
    // so the door still lists them and the other toolboxes leave the request to it.
    if let Some(mut hosts) = fleet.hosts.take() {
        hosts.kill9();
    }
    let started = Instant::now();
    let report = scenario(&["call", &fleet.url(), "slow__add", r#"{"a": 1, "b": 2}"#]);
    assert_eq!(report["error"], true, "{report}");
    let text = report["text"].as_str().unwrap_or_default();
    assert!(text.contains("no toolbox answered"), "{report}");
    // The tool's timeout is 8 s; the door waits that plus its margin, and not much longer.
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
}

#[test]
fn the_tools_globs_narrow_what_the_door_exposes() {
    let fleet = Fleet::start_with("tools = [\"echo\", \"slow__*\"]");
    let report = scenario(&["list-call", &fleet.url()]);
    check_list_call("narrowed", Mode::Legacy, &report);
    assert_eq!(
        report["tools"],
        json!(["echo", "slow__add", "slow__ask", "slow__shape", "slow__slow"]),
        "{report}"
    );
    let hidden =
        scenario(&["call", &fleet.url(), "chat_send", r#"{"recipient": "chat:x", "content": "hi"}"#]);
    assert!(
        hidden["raised"].as_str().unwrap_or_default().contains("unknown tool"),
        "a hidden tool is unknown: {hidden}"
    );
}

#[test]
fn idle_sessions_are_closed() {
    let fleet = Fleet::start_with("session_idle_ms = 1000");
    let port = fleet.door_port;
    let (status, response) = post(port, "", INITIALIZE);
    assert_eq!(status, 200);
    let session = session_id(&response);
    let headers = format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n");
    wait_until_closed(port, &headers, Duration::from_millis(2500), "the idle session");
    check_list_call(
        "a new session after the idle one closed",
        Mode::Legacy,
        &scenario(&["list-call", &fleet.url()]),
    );
}

#[test]
fn a_client_that_stops_reading_holds_up_only_its_own_session() {
    let fleet = Fleet::start_with("session_idle_ms = 2000");
    let port = fleet.door_port;
    let (status, response) = post(port, "", INITIALIZE);
    assert_eq!(status, 200);
    let session = session_id(&response);
    let headers = format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n");
    let (status, _) = post(port, &headers, r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    assert!((200..300).contains(&status), "initialized: {status}");
    // The session's standalone SSE stream, opened and never read.
    let mut sse = TcpStream::connect(("127.0.0.1", port)).unwrap();
    sse.write_all(
        format!("GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n{headers}\r\n")
            .as_bytes(),
    )
    .unwrap();
    // Calls with large answers pipelined on one connection that is never read, with a small
    // receive buffer: the door's writes to it stall once the socket buffers are full, and it
    // reads the next request only after it has written the previous answer.
    let mut redis = fleet.redis.connection();
    let published = |redis: &mut redis::Connection| -> usize {
        redis::cmd("XLEN").arg("action-requests").query(redis).unwrap()
    };
    let before = published(&mut redis);
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into()).unwrap();
    let mut calls: TcpStream = socket.into();
    calls.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let message = "x".repeat(60_000);
    const PIPELINED: usize = 200;
    for id in 0..PIPELINED {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"message":"{message}"}}}}}}"#
        );
        let request = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\n{headers}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if calls.write_all(request.as_bytes()).is_err() {
            break; // the door stopped reading this connection
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    let called = published(&mut redis) - before;
    assert!(called > 0 && called < PIPELINED, "the stalled connection's calls: {called} of {PIPELINED} made");
    // Other clients are served meanwhile.
    check_list_call("http beside a stalled client", Mode::Legacy, &scenario(&["list-call", &fleet.url()]));
    // The stalled session is closed once idle, and its slot is free again.
    wait_until_closed(port, &headers, Duration::from_millis(3000), "the stalled session");
    drop((sse, calls));
    check_list_call(
        "http after the stalled client left",
        Mode::Legacy,
        &scenario(&["list-call", &fleet.url()]),
    );
    let log = fleet.door.as_ref().unwrap().log();
    assert!(!log.contains("panicked"), "the door panicked:\n{log}");
}

#[test]
fn toolhost_mcp_over_stdio_answers_malformed_frames_and_serves_on() {
    let fleet = Fleet::start();
    let mut child = Command::new(toolhost_bin())
        .args(["mcp", "--config"])
        .arg(fleet.door_config())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let long = format!("{{\"jsonrpc\":\"2.0\",\"id\":99,\"method\":\"{}\"}}", "x".repeat(200_000));
    for frame in [
        "not json at all",
        "{\"jsonrpc\":\"2.0\"}",
        "[1,2,3]",
        "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":42}",
        &long,
    ] {
        writeln!(stdin, "{frame}").unwrap();
    }
    writeln!(stdin, "{INITIALIZE}").unwrap();
    writeln!(stdin, r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#).unwrap();
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"echo","arguments":{{"message":"still here"}}}}}}"#).unwrap();
    stdin.flush().unwrap();
    let mut answered = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let Ok(message) = serde_json::from_str::<Value>(&line) else { continue };
        answered.push(message.clone());
        if message["id"] == 2 {
            assert_eq!(message["result"]["structuredContent"], json!({"message": "still here"}), "{message}");
            break;
        }
    }
    assert!(
        answered
            .iter()
            .any(|message| message["id"] == 1 && message["result"]["protocolVersion"] == "2025-11-25"),
        "{answered:?}"
    );
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "toolhost mcp exits 0 when its client closes stdin: {status}");
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

/// The headers of a 2026-07-28 request of `method`.
fn modern_headers(method: &str) -> String {
    format!("MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: {method}\r\n")
}

/// A 2026-07-28 request of `method`, its version and capabilities in `_meta`.
fn modern(method: &str, params: &str) -> String {
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}"#;
    let params = params.trim_end_matches('}');
    let separator = if params.len() > 1 { "," } else { "" };
    format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{params}{separator}{meta}}}}}"#)
}

#[test]
fn hostile_input_gets_the_protocols_errors_and_the_door_keeps_serving() {
    let fleet = Fleet::start();
    let port = fleet.door_port;
    // A real client keeps calling while the door is driven with bad input.
    let url = fleet.url();
    let calls = std::thread::spawn(move || {
        (0..3).map(|_| scenario(&["--mode", "legacy", "list-call", &url])).collect::<Vec<_>>()
    });

    let (status, body) = post(port, "", "{not json");
    assert_eq!(status, 400, "not JSON: {body}");
    assert!(body.contains("-32700"), "a JSON-RPC parse error: {body}");
    let (status, _) = post(port, "", r#"{"jsonrpc":"2.0","id":1}"#);
    assert!((400..500).contains(&status), "no method: {status}");
    let (status, _) = post(port, "", &format!("{{\"pad\":\"{}\"}}", "x".repeat(70_000)));
    assert_eq!(status, 413, "a body over max_body_bytes");
    // A body far over the limit is read and dropped, so the client, still sending, reads the 413.
    let (status, body) = post(port, "", &format!("{{\"pad\":\"{}\"}}", "x".repeat(12 * 1024 * 1024)));
    assert_eq!(status, 413, "a 12 MiB body: {}", &body[..body.len().min(300)]);
    assert!(body.contains("max_body_bytes"), "the 413 names the limit: {body}");
    // A chunked body declares no length: it is refused at the limit as it is read.
    let chunk = "x".repeat(70_000);
    let (status, _) = raw(
        port,
        &format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n\
             {:x}\r\n{chunk}\r\n0\r\n\r\n",
            chunk.len()
        ),
    );
    assert_eq!(status, 413, "a chunked body over max_body_bytes");
    let (status, _) = post(port, "Origin: http://evil.example\r\n", INITIALIZE);
    assert_eq!(status, 403, "a foreign Origin");
    // No allowed_origins on a loopback address: the loopback origins are allowed, any port.
    let (status, _) = post(port, "Origin: http://localhost:3000\r\n", INITIALIZE);
    assert_eq!(status, 200, "a localhost Origin");
    let (status, _) = post(port, &format!("Origin: http://127.0.0.1:{port}\r\n"), INITIALIZE);
    assert_eq!(status, 200, "the door's own loopback Origin");
    // What the conformance suite's dns-rebinding-protection sends (0.1.16): Host and Origin both
    // the server's localhost address is accepted, both a foreign name refused.
    let conformance = |host: &str| {
        raw(
            port,
            &format!(
                "POST /mcp HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\nContent-Type: application/json\r\n\
                 Accept: application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{INITIALIZE}",
                INITIALIZE.len()
            ),
        )
        .0
    };
    assert_eq!(conformance(&format!("localhost:{port}")), 200, "localhost Host and Origin");
    let foreign = conformance("evil.example.com");
    assert!((400..500).contains(&foreign), "a foreign Host and Origin: {foreign}");
    let (status, _) = raw(
        port,
        "POST /mcp HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    );
    assert!((400..500).contains(&status), "a foreign Host: {status}");
    // Inside a session: an unknown method is -32601, and the session serves on.
    let (status, response) = post(port, "", INITIALIZE);
    assert_eq!(status, 200);
    let session = session_id(&response);
    let headers = format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n");
    let (_, body) = post(port, &headers, r#"{"jsonrpc":"2.0","id":7,"method":"no/such/method"}"#);
    assert!(body.contains("-32601"), "an unknown method: {body}");
    let (_, body) = post(port, &headers, r#"{"jsonrpc":"2.0","id":8,"method":"tools/list"}"#);
    assert!(body.contains("\"echo\""), "the session serves on: {body}");
    // server/discover answers every version the door speaks, with no session made.
    let (status, body) = post(port, &modern_headers("server/discover"), &modern("server/discover", "{}"));
    assert_eq!(status, 200, "discover: {body}");
    assert!(!body.to_ascii_lowercase().contains("mcp-session-id"), "no session: {body}");
    for version in ["2026-07-28", "2025-11-25", "2025-06-18", "2024-11-05"] {
        assert!(body.contains(version), "{version} in {body}");
    }
    // A 2026-07-28 request naming another version in _meta is refused with -32022.
    let old_meta = modern("tools/list", "{}").replace("\"2026-07-28\"", "\"2099-01-01\"");
    let (_, body) = post(port, &modern_headers("tools/list").replace("2026-07-28", "2099-01-01"), &old_meta);
    assert!(body.contains("-32022") || body.contains("-32600"), "an unknown version: {body}");
    for report in calls.join().unwrap() {
        check_list_call("http under hostile input", Mode::Legacy, &report);
    }

    // Sessions past max_sessions are refused with 503; closing one makes room again.
    let mut sessions = Vec::new();
    let mut refused = 0;
    for _ in 0..12 {
        let (status, response) = post(port, "", INITIALIZE);
        match status {
            200 => sessions.push(session_id(&response)),
            503 => refused += 1,
            other => panic!("initialize answered {other}: {response}"),
        }
    }
    assert!(refused > 0 && sessions.len() <= 8, "{} sessions, {refused} refused", sessions.len());
    // A 2026-07-28 request opens no session, so a full door still serves it.
    let (status, body) = post(port, &modern_headers("tools/list"), &modern("tools/list", "{}"));
    assert_eq!(status, 200, "2026-07-28 with the sessions full: {body}");
    assert!(body.contains("\"echo\""), "{body}");
    let delete = |session: &str| {
        raw(
            port,
            &format!(
                "DELETE /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nMcp-Session-Id: {session}\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    for session in &sessions {
        let (status, _) = delete(session);
        assert_eq!(status, 204, "a closed session");
    }
    check_list_call(
        "http after the sessions closed",
        Mode::Legacy,
        &scenario(&["--mode", "legacy", "list-call", &fleet.url()]),
    );
}

/// Asks the session of `headers` for its tools every `every` (longer than its idle time, since
/// each request keeps it alive) until the door says it is gone (404), for at most 30 s.
fn wait_until_closed(port: u16, headers: &str, every: Duration, what: &str) {
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = post(port, headers, list);
        if status == 404 {
            return;
        }
        assert!(Instant::now() < deadline, "{what} is still open: {status}");
        std::thread::sleep(every);
    }
}

/// The venv of the test authorization server, as `scripts/ensure-mcp-oauth-venv.sh` lays it out.
fn oauth_venv() -> PathBuf {
    toolhost_e2e::venv(
        "TOOLHOST_MCP_OAUTH_VENV",
        "venv-mcp-oauth",
        "ensure-mcp-oauth-venv.sh",
        "test-mcp-door",
    )
}

/// The test authorization server (`tests/mcp_door/auth_server.py`, on joserfc), stopped when
/// dropped.
struct AuthServer {
    child: std::process::Child,
    url: String,
}

impl AuthServer {
    fn start() -> AuthServer {
        let port = free_port();
        let mut child = Command::new(oauth_venv().join("bin/python"))
            .arg(fixture("auth_server.py"))
            .arg(port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start auth_server.py");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(
            lines.next().and_then(Result::ok).unwrap_or_default(),
            "READY",
            "the authorization server"
        );
        AuthServer { child, url: format!("http://127.0.0.1:{port}") }
    }
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_http_door_is_an_oauth_resource_server_for_an_authorization_servers_tokens() {
    let issuer = AuthServer::start();
    let fleet = Fleet::start_with(&format!(
        "[mcp.oauth]\nissuer = \"{0}\"\njwks_url = \"{0}/jwks\"\nresource = \"http://127.0.0.1:{{door_port}}/mcp\"\n\
         tenant_claim = \"org\"\nrequired_scope = \"tools:call\"\njwks_refresh_min_ms = 1000\n\
         [[policy]]\ntenant = \"acme\"\nallow = [\"echo\"]\n[[policy]]\ntenant = \"beta\"\nallow = [\"echo\", \"slow__*\"]\n",
        issuer.url
    ));
    let url = fleet.url();
    let report = scenario(&["--mode", "2026-07-28", "oauth", &url, &issuer.url]);
    let metadata_url =
        format!("http://127.0.0.1:{}/.well-known/oauth-protected-resource/mcp", fleet.door_port);

    // RFC 9728's metadata, at the well-known path with and without the door's path.
    for key in ["prm", "prm_root"] {
        assert_eq!(report[key]["resource"], url, "{key}: {report}");
        assert_eq!(report[key]["authorization_servers"], json!([issuer.url]), "{key}: {report}");
        assert_eq!(report[key]["scopes_supported"], json!(["tools:call"]), "{key}: {report}");
    }
    // No token: 401 naming the metadata, so a client knows where to get one.
    assert_eq!(report["none"]["status"], 401, "{report}");
    assert_eq!(
        report["none"]["challenge"],
        format!("Bearer resource_metadata=\"{metadata_url}\", scope=\"tools:call\""),
        "{report}"
    );
    // A valid token: the tenant from its `org` claim, whose [[policy]] filters the list.
    for key in ["valid", "again", "rotated"] {
        assert_eq!(report[key]["status"], 200, "{key}: {report}");
        assert_eq!(report[key]["tools"], json!(["echo"]), "{key}: acme may call echo only: {report}");
    }
    assert_eq!(report["beta"]["tools"], json!(["echo", "slow__add"]), "beta's first page: {report}");
    // Every refusal: 401 invalid_token (403 insufficient_scope for the scope), with the reason.
    let refusals = [
        ("wrong_audience", 401, "invalid_token", "the token is not for this door"),
        ("expired", 401, "invalid_token", "the token has expired"),
        ("not_yet", 401, "invalid_token", "the token is not valid yet (nbf)"),
        ("wrong_issuer", 401, "invalid_token", "the token was not issued by"),
        ("unknown_key", 401, "invalid_token", "the token names key 'never-published'"),
        ("missing_scope", 403, "insufficient_scope", "the token lacks the scope 'tools:call'"),
        ("no_tenant", 401, "invalid_token", "the token names no tenant"),
        ("not_a_jwt", 401, "invalid_token", "the bearer token is not a JWT"),
        ("old_key_after_rotation", 401, "invalid_token", "the token names key 'key-1'"),
    ];
    for (key, status, error, reason) in refusals {
        let step = &report[key];
        assert_eq!(step["status"], status, "{key}: {report}");
        let challenge = step["challenge"].as_str().unwrap_or_default();
        assert!(challenge.starts_with(&format!("Bearer error=\"{error}\"")), "{key}: {challenge}");
        assert!(challenge.contains(&format!("resource_metadata=\"{metadata_url}\"")), "{key}: {challenge}");
        let message = step["body"]["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(reason), "{key}: {message}");
    }
    // An unknown key id makes the door read the JWKS again at most once per jwks_refresh_min_ms.
    assert!(report["fetches_for_unknown_keys"].as_u64().unwrap() <= 1, "{report}");
    assert_eq!(report["rotated_kid"], "key-2", "{report}");

    // SDK clients follow the metadata to the issuer, get tokens (client_credentials, bound to
    // the door by RFC 8707's resource) and call, each as its tenant.
    assert_eq!(report["sdk_acme"]["protocol"], "2026-07-28", "{report}");
    assert_eq!(report["sdk_acme"]["tools"], json!(["echo"]), "{report}");
    assert_eq!(report["sdk_acme"]["echo"], json!({"message": "from agent-acme"}), "{report}");
    assert_eq!(
        report["sdk_beta"]["tools"],
        json!(["echo", "slow__add", "slow__ask", "slow__shape", "slow__slow"]),
        "{report}"
    );
    assert_eq!(report["sdk_beta"]["echo"], json!({"message": "from agent-beta"}), "{report}");

    let mut connection = fleet.redis.connection();
    // Every refusal is audited, with its reason.
    let audit: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg("audit:door").arg("-").arg("+").query(&mut connection).unwrap();
    let reasons: Vec<String> = audit
        .iter()
        .filter(|(_, fields)| fields.contains(&("decision".to_owned(), "refused".to_owned())))
        .filter(|(_, fields)| fields.contains(&("door".to_owned(), "mcp".to_owned())))
        .filter_map(|(_, fields)| {
            fields.iter().find(|(name, _)| name == "reason").map(|(_, value)| value.clone())
        })
        .collect();
    for (key, _, _, reason) in refusals {
        assert!(reasons.iter().any(|audited| audited.starts_with(reason)), "{key} audited: {reasons:?}");
    }
    assert!(reasons.iter().any(|audited| audited == "the request carries no bearer token"), "{reasons:?}");
    // The calls carry the tenant of the token's claim, and no token travels to the hosts.
    let requests: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg("action-requests").arg("-").arg("+").query(&mut connection).unwrap();
    let payloads: Vec<Value> = requests
        .iter()
        .flat_map(|(_, fields)| fields.iter())
        .filter(|(name, _)| name == "payload")
        .filter_map(|(_, value)| serde_json::from_str(value).ok())
        .collect();
    let first_token = report["first_token"].as_str().unwrap();
    for payload in &payloads {
        let text = payload.to_string();
        assert!(!text.contains(first_token) && !text.contains("eyJ"), "a token in a request: {text}");
    }
    for (client, tenant) in [("agent-acme", "acme"), ("agent-beta", "beta")] {
        let call = payloads
            .iter()
            .find(|payload| payload["data"]["arguments"]["message"] == format!("from {client}"))
            .unwrap_or_else(|| panic!("{client}'s call in {payloads:?}"));
        assert_eq!(call["tenant_id"], tenant, "{call}");
        assert_eq!(call["source"], format!("toolhost:mcp:http token:oauth:{client}"), "{call}");
    }

    // A refused request whose body comes after its headers (a separate write, as an HTTP client
    // may send it) leaves its connection usable: the client's next request on it, the metadata
    // the 401 names, is answered. Answered before the body arrived, the connection used to
    // close under the client's feet, and the SDK's OAuth flow failed at random.
    let mut stream = TcpStream::connect(("127.0.0.1", fleet.door_port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n",
        fleet.door_port,
        body.len()
    )
    .unwrap();
    stream.flush().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    stream.write_all(body.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let (status, headers, _) = read_response(&mut reader);
    assert!(status.contains(" 401 "), "{status}");
    assert!(!headers.iter().any(|line| line.eq_ignore_ascii_case("connection: close")), "{headers:?}");
    write!(
        stream,
        "GET /.well-known/oauth-protected-resource/mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
        fleet.door_port
    )
    .unwrap();
    let (status, _, metadata) = read_response(&mut reader);
    assert!(status.contains(" 200 "), "the same connection, after the 401: {status}");
    assert_eq!(serde_json::from_str::<Value>(&metadata).unwrap()["resource"], url);
}

/// Reads one HTTP/1.1 response with a `Content-Length` body: its status line, headers and body.
fn read_response(reader: &mut BufReader<TcpStream>) -> (String, Vec<String>, String) {
    use std::io::Read as _;
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end().to_owned();
        if line.is_empty() {
            break;
        }
        headers.push(line);
    }
    let length = headers
        .iter()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}
