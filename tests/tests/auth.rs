//! Issue 25 from outside, through the built binary: the MCP door's bearer tokens and its signed
//! calls for the token's tenant, `toolhost call --key-id`, and the `redis-cli` + `openssl`
//! signing example of docs/CONTRACTS.md run exactly as written. Run by `just test-security`.

// Test code: a failed step is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost_e2e::mcp_http::{post, session_id};
use toolhost_e2e::{RedisProcess, Toolhost, free_port, temp_dir, toolhost_bin};

const DOOR_SECRET: &str = "door-secret-0123456789";
const AGENTS_SECRET: &str = "agents-secret-0123456789";
const ACME_TOKEN: &str = "acme-token-abcdefghijklmnop";
const GLOBEX_TOKEN: &str = "globex-token-abcdefghijklmnop";

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

/// The configuration every process here shares: signatures required, two keys, a policy.
fn config(dir: &Path, mcp_port: u16) -> PathBuf {
    let path = dir.join("toolhost.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[auth]
require_signature = true
door_key = "door"

[[auth.keys]]
id = "door"
secret_env = "DOOR_KEY"

[[auth.keys]]
id = "agents-1"
secret_env = "TOOLHOST_KEY_AGENTS_1"
tenants = ["acme"]

[[policy]]
tenant = "acme"
allow = ["echo"]

[[policy]]
tenant = "*"
allow = []

[mcp]
listen = "127.0.0.1:{mcp_port}"

[[mcp.tokens]]
id = "acme-laptop"
tenant = "acme"
secret_env = "ACME_TOKEN"

[[mcp.tokens]]
id = "globex-ci"
tenant = "globex"
secret_env = "GLOBEX_TOKEN"
"#
        ),
    )
    .unwrap();
    path
}

fn env<'a>(redis: &'a str, config: &'a Path) -> Vec<(&'a str, &'a str)> {
    vec![
        ("REDIS_URL", redis),
        ("TOOLHOST_CONFIG", config.to_str().unwrap()),
        ("DOOR_KEY", DOOR_SECRET),
        ("TOOLHOST_KEY_AGENTS_1", AGENTS_SECRET),
        ("ACME_TOKEN", ACME_TOKEN),
        ("GLOBEX_TOKEN", GLOBEX_TOKEN),
    ]
}

/// A Redis and a toolhost on the shared configuration (the MCP door on `mcp_port`).
struct Host {
    redis: RedisProcess,
    url: String,
    config: PathBuf,
    toolhost: Toolhost,
}

impl Host {
    fn start(name: &str, mcp_port: u16) -> Host {
        let redis = RedisProcess::start(&[]);
        let config = config(&temp_dir(name), mcp_port);
        let url = redis.url();
        let toolhost = Toolhost::start(&env(&url, &config));
        Host { redis, url, config, toolhost }
    }

    /// `toolhost <subcommand>` on the shared configuration, with a clean environment.
    fn command(&self, subcommand: &str) -> Command {
        let mut command = Command::new(toolhost_bin());
        command.arg(subcommand).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
        for (name, value) in env(&self.url, &self.config) {
            command.env(name, value);
        }
        command
    }
}

/// Every entry of the audit stream, as field maps.
fn audit(redis: &RedisProcess) -> Vec<HashMap<String, String>> {
    let entries: Vec<(String, HashMap<String, String>)> =
        redis::cmd("XRANGE").arg("audit:toolhost").arg("-").arg("+").query(&mut redis.connection()).unwrap();
    entries.into_iter().map(|(_, fields)| fields).collect()
}

/// The JSON-RPC message of a door's answer (JSON, or the `data:` line of an SSE event).
fn message(response: &str) -> Value {
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    // An SSE stream has a priming event with empty data first; the message is the first `data:`
    // line with JSON.
    let text = body
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .find(|data| data.trim_start().starts_with('{'))
        .unwrap_or(body);
    serde_json::from_str(text.trim()).unwrap_or_else(|err| panic!("{err}: {response}"))
}

/// Opens a session with `token`; the headers of its later requests.
fn session(port: u16, token: &str) -> String {
    let auth = format!("Authorization: Bearer {token}\r\n");
    let (status, response) = post(port, &auth, INITIALIZE);
    assert_eq!(status, 200, "{response}");
    let headers =
        format!("{auth}Mcp-Session-Id: {}\r\nMCP-Protocol-Version: 2025-11-25\r\n", session_id(&response));
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let (status, _) = post(port, &headers, initialized);
    assert!(status == 202 || status == 200, "initialized: {status}");
    headers
}

fn tool_names(listed: &Value) -> Vec<String> {
    listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn mcp_tokens_gate_the_http_door_and_its_calls_are_signed_for_the_tokens_tenant() {
    let port = free_port();
    let host = Host::start("auth-mcp", port);
    let (redis, toolhost) = (&host.redis, &host.toolhost);
    toolhost.wait_for_log("MCP door listening", Duration::from_secs(10));

    // No token, or a wrong one: 401 before any session is made, each audited.
    let (status, response) = post(port, "", INITIALIZE);
    assert_eq!(status, 401, "{response}");
    assert!(response.to_ascii_lowercase().contains("www-authenticate: bearer"), "{response}");
    assert!(session_id(&response).is_empty());
    let (status, response) = post(port, "Authorization: Bearer not-a-token-of-ours\r\n", INITIALIZE);
    assert_eq!(status, 401, "{response}");
    assert_eq!(message(&response)["error"]["code"], -32001);

    // acme's token: only what acme may call is listed; its calls run, signed by the door's key.
    let acme = session(port, ACME_TOKEN);
    // The fleet's tools are read every watch period; wait until the toolbox is seen.
    let deadline = Instant::now() + Duration::from_secs(10);
    let listed = loop {
        let (_, response) = post(port, &acme, r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
        let listed = message(&response);
        if !tool_names(&listed).is_empty() || Instant::now() > deadline {
            break listed;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(tool_names(&listed), ["echo"]);
    let call = |headers: &str, id: u32, tool: &str, arguments: Value| {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
        message(&post(port, headers, &body.to_string()).1)
    };
    let echoed = call(&acme, 3, "echo", json!({"message": "signed by the door"}));
    assert_eq!(echoed["result"]["isError"], false, "{echoed}");
    assert_eq!(echoed["result"]["structuredContent"]["message"], "signed by the door");
    // Out of acme's policy: the host refuses it, whoever asks.
    let refused = call(&acme, 4, "chat_send", json!({"recipient": "chat:x", "content": "hi"}));
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    let text = refused["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("forbidden: 'chat_send' is not allowed"), "{text}");

    // globex's token sees nothing, and may call nothing.
    let globex = session(port, GLOBEX_TOKEN);
    let (_, response) = post(port, &globex, r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    assert!(tool_names(&message(&response)).is_empty(), "{response}");
    let refused = call(&globex, 3, "echo", json!({"message": "x"}));
    assert_eq!(refused["result"]["isError"], true, "{refused}");

    // A session opened with a token serves no request without one.
    let stripped: String = acme
        .lines()
        .filter(|line| !line.starts_with("Authorization"))
        .map(|line| format!("{line}\n"))
        .collect();
    let (status, _) =
        post(port, &stripped.replace('\n', "\r\n"), r#"{"jsonrpc":"2.0","id":9,"method":"tools/list"}"#);
    assert_eq!(status, 401);

    let entries = audit(redis);
    let refused_tokens: Vec<&str> =
        entries.iter().filter(|entry| entry["door"] == "mcp").map(|entry| entry["reason"].as_str()).collect();
    assert_eq!(
        refused_tokens,
        [
            "the request carries no bearer token",
            "the bearer token is not one of the MCP door's tokens",
            "the request carries no bearer token"
        ]
    );
    let chat_send = entries.iter().find(|entry| entry["tool"] == "chat_send").unwrap();
    assert_eq!(chat_send["tenant"], "acme");
    assert_eq!(chat_send["principal"], "key:door");
    assert_eq!(chat_send["source"], "toolhost:mcp:http token:acme-laptop");
    let globex_echo = entries.iter().find(|entry| entry["tenant"] == "globex").unwrap();
    assert_eq!((globex_echo["tool"].as_str(), globex_echo["decision"].as_str()), ("echo", "refused"));
    let log = toolhost.log();
    for secret in [DOOR_SECRET, AGENTS_SECRET, ACME_TOKEN, GLOBEX_TOKEN] {
        assert!(!log.contains(secret) && !format!("{entries:?}").contains(secret), "a secret leaked");
    }
}

/// Runs `toolhost mcp` over stdio as `tenant`: initialize, list the tools, call echo; the
/// listed names and the call's result.
fn stdio_session(host: &Host, tenant: &str) -> (Vec<String>, Value) {
    use std::io::{BufRead as _, BufReader, Write as _};
    let mut child = host
        .command("mcp")
        .env("TOOLHOST__MCP__TENANT", tenant)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = |message: &Value| writeln!(stdin, "{message}").unwrap();
    let mut answer = |id: u64| loop {
        let message: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        if message["id"] == id {
            return message;
        }
    };
    send(&serde_json::from_str(INITIALIZE).unwrap());
    answer(1);
    send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    // The fleet's tools are read every watch period: ask until the toolbox is seen.
    let deadline = Instant::now() + Duration::from_secs(10);
    let listed = loop {
        send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
        let listed = tool_names(&answer(2));
        if !listed.is_empty() || Instant::now() > deadline {
            break listed;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo", "arguments": {"message": "stdio"}}});
    send(&call);
    let called = answer(3);
    let _ = child.kill();
    let _ = child.wait();
    (listed, called["result"].clone())
}

#[test]
fn toolhost_mcp_over_stdio_calls_as_the_tenant_its_configuration_names() {
    let host = Host::start("auth-stdio", free_port());
    let (listed, called) = stdio_session(&host, "acme");
    assert_eq!(listed, ["echo"]);
    assert_eq!(called["isError"], false, "{called}");
    assert_eq!(called["structuredContent"]["message"], "stdio");
    let (listed, called) = stdio_session(&host, "globex");
    assert!(listed.is_empty(), "{listed:?}");
    assert_eq!(called["isError"], true, "{called}");
    assert!(called["content"][0]["text"].as_str().unwrap().starts_with("forbidden:"), "{called}");
}

/// `toolhost call` with the shared configuration and extra arguments: exit code, stdout.
fn toolhost_call(host: &Host, args: &[&str], extra_env: &[(&str, &str)]) -> (i32, String, String) {
    let output = host.command("call").args(args).envs(extra_env.iter().copied()).output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn toolhost_call_signs_with_key_id_and_an_unsigned_call_is_refused_on_the_default_topic() {
    let host = Host::start("auth-cli", free_port());
    let redis = &host.redis;
    let args = ["echo", "--args", r#"{"message":"from the cli"}"#, "--timeout", "5s"];

    let signed = [&args[..], &["--key-id", "agents-1", "--tenant", "acme"]].concat();
    let (code, stdout, stderr) = toolhost_call(&host, &signed, &[]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(serde_json::from_str::<Value>(&stdout).unwrap(), json!({"message": "from the cli"}));

    // A key the configuration does not list, with its secret from TOOLHOST_SIGNING_SECRET: the
    // host does not know it either.
    let unknown = [&args[..], &["--key-id", "laptop", "--tenant", "acme"]].concat();
    let (code, _, stderr) =
        toolhost_call(&host, &unknown, &[("TOOLHOST_SIGNING_SECRET", "some-secret-0123456789")]);
    assert_eq!(code, 2, "refused on the default topic, so the private stream gets no answer: {stderr}");
    let (code, _, stderr) = toolhost_call(&host, &unknown, &[]);
    assert_eq!(code, 64, "{stderr}");
    assert!(stderr.contains("TOOLHOST_SIGNING_SECRET"), "{stderr}");
    // The agents key may not sign for globex.
    let globex = [&args[..], &["--key-id", "agents-1", "--tenant", "globex"]].concat();
    let (code, _, _) = toolhost_call(&host, &globex, &[]);
    assert_eq!(code, 2);

    let results: Vec<(String, HashMap<String, String>)> =
        redis::cmd("XRANGE").arg("action-results").arg("-").arg("+").query(&mut redis.connection()).unwrap();
    let errors: Vec<String> = results
        .iter()
        .map(|(_, fields)| serde_json::from_str::<Value>(&fields["payload"]).unwrap())
        .map(|answer| answer["data"]["error"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].contains("unknown key id 'laptop'"), "{errors:?}");
    assert!(errors[1].contains("may not sign for tenant 'globex'"), "{errors:?}");
}

/// The `sh` block after the `signing-example` marker of docs/CONTRACTS.md.
fn signing_example() -> String {
    let contracts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONTRACTS.md");
    let text = std::fs::read_to_string(contracts).unwrap();
    let after = &text[text.find("<!-- signing-example").expect("the marker")..];
    let block = &after[after.find("```sh\n").unwrap() + 6..];
    block[..block.find("```").unwrap()].to_owned()
}

#[test]
fn the_contracts_redis_cli_and_openssl_example_is_answered() {
    let host = Host::start("auth-example", free_port());
    let redis = &host.redis;
    let example = signing_example();
    let run = |secret: &str| {
        let output = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &example])
            .env("TOOLHOST_KEY_AGENTS_1", secret)
            .env("REDIS_PORT", redis.port().to_string())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    };
    // With a wrong secret first: refused, and not final, so the right one then runs.
    run("not-the-agents-secret");
    run(AGENTS_SECRET);
    let deadline = Instant::now() + Duration::from_secs(10);
    let answers = loop {
        let results: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
            .arg("action-results")
            .arg("-")
            .arg("+")
            .query(&mut redis.connection())
            .unwrap();
        let answers: Vec<Value> =
            results.iter().map(|(_, fields)| serde_json::from_str(&fields["payload"]).unwrap()).collect();
        if answers.len() >= 2 || Instant::now() > deadline {
            break answers;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(answers.len(), 2, "{answers:#?}");
    assert_eq!(answers[0]["data"]["error_code"], "forbidden", "{answers:#?}");
    assert!(answers[0]["data"]["error"].as_str().unwrap().contains("does not match"));
    assert_eq!(answers[1]["data"]["success"], true, "{answers:#?}");
    assert_eq!(answers[1]["data"]["result"], json!({"message": "hi"}));
    assert_eq!(answers[1]["data"]["request_id"], "r-signed-1");
}
