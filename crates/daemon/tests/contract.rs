//! Issue 3: tools as contracts — validation, misbehaving tools, discovery formats, the CLI client.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use toolhost::config::Config;
use toolhost_tools::builtin::Echo;
use toolhost_tools::{Context, Registry, Tool, ToolError, ToolSpec};

use crate::support::{Daemon, RedisServer, ask, pending};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_and_missing_arguments_point_at_the_problem() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[]);
    let answers = ask(
        &redis,
        &[
            ("echo.requested", "wrong-type", json!({"message": 42})),
            ("echo.requested", "missing", json!({})),
            ("echo.requested", "extra", json!({"message": "hi", "shout": true})),
            ("tool.invoke", "invoke-bad", json!({"tool": "echo", "arguments": {"message": ["x"]}})),
        ],
    )
    .await;
    let wrong = &answers["wrong-type"];
    assert_eq!(wrong["success"], false);
    assert_eq!(wrong["error_code"], "invalid_arguments");
    assert_eq!(wrong["details"]["errors"][0]["pointer"], "/message");
    assert_eq!(wrong["details"]["errors"][0]["rule"], "type");
    assert_eq!(wrong["details"]["errors"][0]["expected"], "string");
    assert!(wrong["error"].as_str().unwrap().contains("/message"), "{wrong}");
    let missing = &answers["missing"];
    assert_eq!(missing["error_code"], "invalid_arguments");
    assert_eq!(missing["details"]["errors"][0]["rule"], "required");
    assert!(missing["error"].as_str().unwrap().contains("message"), "{missing}");
    assert_eq!(answers["extra"]["details"]["errors"][0]["rule"], "additionalProperties");
    assert_eq!(answers["invoke-bad"]["details"]["errors"][0]["pointer"], "/message");
}

/// Waits until the consumer group exists: it is created at the stream's end, so requests sent
/// before it would never be read.
async fn wait_for_group(redis: &RedisServer, stream: &str, group: &str) {
    let mut connection = redis.connection().await;
    let deadline = std::time::Instant::now() + WAIT;
    while std::time::Instant::now() < deadline {
        let groups: redis::RedisResult<Vec<std::collections::HashMap<String, redis::Value>>> =
            redis::cmd("XINFO").arg("GROUPS").arg(stream).query_async(&mut connection).await;
        let found = groups.is_ok_and(|groups| {
            groups.iter().any(|info| matches!(info.get("name"), Some(redis::Value::BulkString(name)) if name == group.as_bytes()))
        });
        if found {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("consumer group {group} never appeared on {stream}");
}

/// A tool that misbehaves the way its name says.
struct Misbehaving(&'static str);

#[async_trait]
impl Tool for Misbehaving {
    fn spec(&self) -> ToolSpec {
        let mut spec = ToolSpec::new(
            self.0,
            "test tool",
            json!({"type": "object"}),
            json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}),
        );
        spec.timeout = Duration::from_millis(300);
        spec
    }

    async fn call(&self, _arguments: Value, _context: &Context) -> Result<Value, ToolError> {
        match self.0 {
            "panicking" => panic!("tool exploded"),
            "sleeping" => {
                tokio::time::sleep(Duration::from_secs(120)).await;
                Ok(json!({"ok": true}))
            }
            _ => Ok(json!({"ok": "not a boolean"})),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_tools_are_answered_and_the_daemon_keeps_serving() {
    let redis = RedisServer::start();
    let env: HashMap<String, String> = HashMap::from([
        ("REDIS_URL".to_owned(), redis.url()),
        ("TOOLHOST__HTTP__LISTEN".to_owned(), "127.0.0.1:0".to_owned()),
    ]);
    let config = Config::load(None, &env).unwrap();
    let mut registry = Registry::new();
    registry.register(Arc::new(Echo)).unwrap();
    for name in ["panicking", "sleeping", "broken_output"] {
        registry.register(Arc::new(Misbehaving(name))).unwrap();
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let daemon = tokio::spawn(toolhost::serve::run_with_registry(config, registry, async {
        let _ = stopped.await;
    }));
    wait_for_group(&redis, "action-requests", "toolhost").await;
    let answers = ask(
        &redis,
        &[
            ("panicking.requested", "p", json!({})),
            ("sleeping.requested", "s", json!({})),
            ("broken_output.requested", "b", json!({})),
            ("echo.requested", "after", json!({"message": "still here"})),
        ],
    )
    .await;
    assert_eq!(answers["p"]["error_code"], "tool_failed");
    assert!(answers["p"]["error"].as_str().unwrap().contains("tool exploded"));
    assert_eq!(answers["s"]["error_code"], "timeout");
    assert_eq!(answers["b"]["error_code"], "invalid_output");
    assert_eq!(answers["b"]["details"]["errors"][0]["pointer"], "/ok");
    assert_eq!(answers["after"]["result"], json!({"message": "still here"}));
    let mut connection = redis.connection().await;
    assert_eq!(pending(&mut connection, "action-requests", "toolhost").await, 0);
    let _ = stop.send(());
    daemon.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_answers_every_format_over_the_bus() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[]);
    let formats = ["native", "openai", "mcp", "toolbox", "capabilities"];
    let requests: Vec<(&str, &str, Value)> =
        formats.iter().map(|format| ("tools.discover", *format, json!({"format": format}))).collect();
    let answers = ask(&redis, &requests).await;
    for format in formats {
        let result = &answers[format]["result"];
        assert_eq!(result["toolbox_id"], "toolhost");
        assert_eq!(result["format"], format);
        assert_eq!(result["tools"].as_array().unwrap().len(), 3, "{result}");
    }
    // Listings are sorted by name.
    for format in formats {
        let tools = answers[format]["result"]["tools"].as_array().unwrap();
        let names: Vec<&str> = tools.iter().map(tool_name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "{format}");
    }
    let tool = |format: &str, name: &str| -> Value {
        let tools = answers[format]["result"]["tools"].as_array().unwrap();
        tools
            .iter()
            .find(|tool| tool_name(tool) == name)
            .unwrap_or_else(|| panic!("{format}: no {name}"))
            .clone()
    };
    let native = &tool("native", "echo");
    assert_eq!(native["name"], "echo");
    assert_eq!(native["consumed_event"], "echo.requested");
    assert_eq!(native["produced_event"], "echo.completed");
    assert_eq!(native["annotations"], json!({"read_only": true, "idempotent": true, "destructive": false}));
    assert_eq!(native["hash"].as_str().unwrap().len(), 64);
    let openai = &tool("openai", "echo");
    assert_eq!(openai["type"], "function");
    assert_eq!(openai["function"]["name"], "echo");
    assert_eq!(openai["function"]["strict"], true);
    assert_eq!(openai["function"]["parameters"], native["argument_schema"]);
    let terminal = &tool("openai", "terminal_run");
    assert_eq!(terminal["function"]["name"], "terminal_run");
    assert_eq!(terminal["function"]["parameters"]["required"], json!(["command", "cwd"]));
    assert_eq!(terminal["function"]["parameters"]["properties"]["cwd"]["type"], json!(["string", "null"]));
    let mcp = &tool("mcp", "terminal_run");
    assert_eq!(mcp["name"], "terminal_run");
    assert_eq!(
        mcp["annotations"],
        json!({"readOnlyHint": false, "idempotentHint": false, "destructiveHint": true})
    );
    assert!(mcp["inputSchema"].is_object() && mcp["outputSchema"].is_object());
    let toolbox = &tool("toolbox", "chat_send");
    assert_eq!(
        toolbox.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["argument_schema", "description", "name", "output_schema"]
    );
    let capability = &tool("capabilities", "echo");
    assert_eq!(capability["task_name"], "echo");
    assert_eq!(capability["consumed_event"]["event_name"], "echo.requested");
    assert_eq!(capability["consumed_event"]["topic"], "action-requests");
    assert_eq!(capability["produced_events"][0]["topic"], "action-results");
    assert_eq!(capability["produced_events"][0]["payload_schema"], native["output_schema"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_disabled_tools() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[("TOOLHOST__TOOLS__DISABLED", "terminal_run")]);
    let answers = ask(
        &redis,
        &[
            ("echo.requested", "ok-1", json!({"message": "a"})),
            ("echo.requested", "ok-2", json!({"message": "b"})),
            ("echo.requested", "bad", json!({})),
            ("terminal_run.requested", "off", json!({"command": "ls"})),
        ],
    )
    .await;
    assert_eq!(answers["off"]["error_code"], "tool_disabled");
    let stats = ask(&redis, &[("tools.stats", "stats", json!({}))]).await;
    let echo = &stats["stats"]["result"]["tools"]["echo"];
    assert_eq!(echo["requests"], 3, "{stats:?}");
    assert_eq!(echo["errors"]["invalid_arguments"], 1);
    assert!(echo["mean_ms"].as_f64().unwrap() >= 0.0);
    assert!(echo["p99_ms"].as_f64().unwrap() >= 0.0);
    let discovered = ask(&redis, &[("tools.discover", "list", json!({}))]).await;
    let names: Vec<&str> = discovered["list"]["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["chat_send", "echo"]);
}

/// Runs the `toolhost` binary as a client; returns exit code, stdout and stderr.
fn client(redis_url: &str, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .args(args)
        .env_clear()
        .env("REDIS_URL", redis_url)
        .output()
        .unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    (output.status.code().unwrap_or(-1), text(output.stdout), text(output.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_exits_zero_one_or_two() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[]);
    let (code, stdout, _) = client(&redis.url(), &["call", "echo", "--args", r#"{"message":"hi"}"#]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Value>(&stdout).unwrap(), json!({"message": "hi"}));
    let (code, stdout, stderr) = client(&redis.url(), &["call", "echo", "--args", r#"{"message":1}"#]);
    assert_eq!(code, 1, "{stderr}");
    let error: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(error["error_code"], "invalid_arguments");
    assert_eq!(error["details"]["errors"][0]["pointer"], "/message");
    let (code, _, stderr) = client(&redis.url(), &["call", "nope", "--args", "{}"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no tool named 'nope'"), "{stderr}");
    // A usage error, like clap's own: 64, not the transport code 2.
    let (code, _, stderr) = client(&redis.url(), &["call", "echo", "--args", "not json"]);
    assert_eq!(code, 64, "{stderr}");
    // No daemon on this Redis: the answer never comes.
    let lonely = RedisServer::start();
    let (code, _, stderr) = client(&lonely.url(), &["call", "echo", "--args", "{}", "--timeout", "500ms"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("no answer within 500 ms"), "{stderr}");
    // No Redis at all: named by its URL, password masked, with a hint, by every client command.
    let url = "redis://:s3cret@127.0.0.1:1";
    for args in [
        &["call", "echo", "--args", "{}", "--timeout", "1s"][..],
        &["tools", "--timeout", "1s"][..],
        &["tools", "--from-registry"][..],
        &["dlq", "list"][..],
    ] {
        let (code, stdout, stderr) = client(url, args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert_eq!(stdout, "", "{args:?}");
        assert!(stderr.contains("Redis at redis://:***@127.0.0.1:1 does not answer"), "{args:?}: {stderr}");
        assert!(stderr.contains("is redis-server running there? Set REDIS_URL"), "{args:?}: {stderr}");
        assert!(!stderr.contains("s3cret") && !stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_command_prints_exactly_what_discovery_answers() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[]);
    let formats = ["native", "openai", "mcp", "toolbox", "capabilities"];
    let requests: Vec<(&str, &str, Value)> =
        formats.iter().map(|format| ("tools.discover", *format, json!({"format": format}))).collect();
    let answers = ask(&redis, &requests).await;
    for format in formats {
        let over_the_bus = &answers[format]["result"];
        assert_eq!(over_the_bus["toolbox_id"], "toolhost", "{format}");
        for args in
            [&["tools", "--format", format][..], &["tools", "--format", format, "--from-registry"][..]]
        {
            let (code, stdout, stderr) = client(&redis.url(), args);
            assert_eq!(code, 0, "{args:?}: {stderr}");
            let printed: Value = serde_json::from_str(&stdout).unwrap();
            assert_eq!(&printed, over_the_bus, "{args:?}");
        }
    }
    let (code, _, stderr) = client(&redis.url(), &["tools", "--format", "yaml"]);
    assert_eq!(code, 64, "{stderr}");
}

/// The Python environment with the openai-agents SDK, created once under `target/`.
fn agents_python() -> std::path::PathBuf {
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/py-openai-agents");
    let python = venv.join("bin/python");
    if !python.exists() {
        let status = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().unwrap();
        assert!(status.success(), "python3 -m venv failed");
    }
    let installed = Command::new(&python).args(["-c", "import agents"]).status().unwrap().success();
    if !installed {
        let status = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "openai-agents==0.24.0"])
            .status()
            .unwrap();
        assert!(status.success(), "pip install openai-agents failed");
    }
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_agents_sdk_accepts_the_openai_list() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[]);
    let (code, stdout, stderr) = client(&redis.url(), &["tools", "--format", "openai"]);
    assert_eq!(code, 0, "{stderr}");
    let answer: Value = serde_json::from_str(&stdout).unwrap();
    let stdout = answer["tools"].to_string();
    let python = agents_python();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_agents_check.py");
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(stdout.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{report}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(report.contains("ok echo strict=True"), "{report}");
    assert!(report.contains("ok terminal_run strict=True"), "{report}");
}

/// A listed tool's name, in any discovery format.
fn tool_name(tool: &Value) -> &str {
    [&tool["name"], &tool["function"]["name"], &tool["task_name"]]
        .into_iter()
        .find_map(Value::as_str)
        .unwrap_or_default()
}
