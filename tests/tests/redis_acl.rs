//! The least-privilege Redis user, end to end: the line `toolhost redis-acl` prints is applied to
//! a real `redis-server`, the daemon runs as that user, and the request path works through it (a
//! call, discovery, a chat tool call, a cancel, a dead letter and its listing, the fleet
//! heartbeat) with no command refused; the same user cannot flush, reconfigure or list the
//! server, nor write a key outside its patterns.

use std::io::{BufRead as _, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost_e2e::tls::{Pki, TlsRedis, TlsSentinel, run_toolhost};
use toolhost_e2e::{RedisProcess, Toolhost, toolhost_bin};

const PASSWORD: &str = "acl-pw-7";
const WAIT: Duration = Duration::from_secs(15);

/// Prints the line for `env` and applies it with the server's default (admin) user.
fn apply_acl(redis: &RedisProcess, env: &[(&str, &str)]) -> String {
    let (code, out) = run_toolhost(&["redis-acl", "--user", "toolhost"], env, WAIT);
    assert_eq!(code, Some(0), "{out}");
    let line = out.trim().to_owned();
    assert!(line.starts_with("ACL SETUSER toolhost reset on ><password> "), "{line}");
    let applied = line.replace("<password>", PASSWORD);
    let mut words = applied.split_whitespace();
    let mut command = redis::cmd(words.next().unwrap_or_default());
    for word in words {
        command.arg(word);
    }
    let () = command.query(&mut redis.connection()).expect("apply the ACL line");
    line
}

/// Adds `payload` to `stream` as the contract's `id` + `payload` entry (as the admin user: the
/// callers are not toolhost).
fn xadd(redis: &RedisProcess, stream: &str, payload: &str) {
    let _: String = redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("id")
        .arg(uuid::Uuid::new_v4().to_string())
        .arg("payload")
        .arg(payload)
        .query(&mut redis.connection())
        .expect("XADD");
}

/// The payloads of `stream`, parsed.
fn payloads(redis: &RedisProcess, stream: &str) -> Vec<Value> {
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg(stream).arg("-").arg("+").query(&mut redis.connection()).unwrap_or_default();
    entries
        .into_iter()
        .filter_map(|(_, fields)| fields.into_iter().find(|(name, _)| name == "payload"))
        .filter_map(|(_, payload)| serde_json::from_str(&payload).ok())
        .collect()
}

/// Waits until `stream` holds a payload that `matches`, and returns it.
fn wait_for_payload(redis: &RedisProcess, stream: &str, matches: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(found) = payloads(redis, stream).into_iter().find(&matches) {
            return found;
        }
        assert!(Instant::now() < deadline, "nothing matching on {stream}: {:#?}", payloads(redis, stream));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Not one command was refused on the way but the one toolhost is meant to go without: `CONFIG
/// GET maxmemory-policy` at start, whose refusal is noted (it would read every setting,
/// passwords included). Redis's `ACL LOG` says so, and so does the daemon's log.
fn assert_only_config_get_refused(redis: &RedisProcess, daemon: &Toolhost) {
    let denied: Vec<Vec<(String, redis::Value)>> =
        redis::cmd("ACL").arg("LOG").query(&mut redis.connection()).expect("ACL LOG");
    for entry in &denied {
        let object = entry.iter().find(|(name, _)| name == "object").map(|(_, value)| format!("{value:?}"));
        assert!(object.as_deref().is_some_and(|object| object.contains("config|get")), "refused: {entry:?}");
    }
    let log = daemon.log();
    let refusals: Vec<&str> =
        log.lines().filter(|line| line.contains("NOPERM") && !line.contains("maxmemory-policy")).collect();
    assert!(refusals.is_empty(), "{refusals:#?}");
}

fn request(event_type: &str, request_id: &str, data: Value) -> String {
    let mut data = data;
    data["request_id"] = json!(request_id);
    json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "source": "agent:acl-test",
        "specversion": "1.0",
        "type": event_type,
        "topic": "action-requests",
        "data": data,
    })
    .to_string()
}

/// Calls echo through `toolhost mcp` (stdio), a client of the fleet: it reads the registries
/// and heartbeats and gets its answer on a private results stream, all as the user of `env`.
fn call_through_mcp_stdio(env: &[(&str, &str)]) -> Value {
    let mut command = Command::new(toolhost_bin());
    command
        .arg("mcp")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("spawn toolhost mcp");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let mut send = |message: Value| writeln!(stdin, "{message}").expect("write to toolhost mcp");
    let answer = |id: u64| -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = received.recv_timeout(left).expect("an answer from toolhost mcp");
            let message: Value = serde_json::from_str(&line).expect("JSON-RPC");
            if message["id"] == json!(id) {
                return message;
            }
        }
    };
    send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "acl-test", "version": "1"}}}));
    answer(1);
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    // The fleet's tools come from the registries; wait until echo is listed.
    let deadline = Instant::now() + WAIT;
    let mut next_id = 2;
    loop {
        send(json!({"jsonrpc": "2.0", "id": next_id, "method": "tools/list"}));
        let listed = answer(next_id);
        next_id += 1;
        if listed.to_string().contains("\"echo\"") {
            break;
        }
        assert!(Instant::now() < deadline, "echo never listed: {listed}");
        std::thread::sleep(Duration::from_millis(200));
    }
    send(json!({"jsonrpc": "2.0", "id": next_id, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "via mcp"}}}));
    let res = answer(next_id);
    drop(stdin);
    let _ = child.wait();
    res
}

#[test]
fn the_daemon_serves_as_the_user_redis_acl_prints_and_that_user_can_do_nothing_else() {
    let redis = RedisProcess::start(&[]);
    let plain = redis.url();
    let line = apply_acl(&redis, &[("REDIS_URL", plain.as_str())]);
    let url = format!("redis://toolhost:{PASSWORD}@127.0.0.1:{}", redis.port());
    let env = [("REDIS_URL", url.as_str()), ("AGENT_NAME", "ToolHost")];
    let daemon = Toolhost::start(&env);

    // A call, through the client commands as the same user.
    let (code, out) =
        run_toolhost(&["call", "echo", "--args", r#"{"message":"least privilege"}"#], &env, WAIT);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("least privilege"), "{out}");
    // Discovery over the bus and from the registry.
    for args in [&["tools"][..], &["tools", "--from-registry"][..]] {
        let (code, out) = run_toolhost(args, &env, WAIT);
        assert_eq!(code, Some(0), "{args:?}: {out}");
        assert!(out.contains("echo"), "{args:?}: {out}");
    }
    // A cancel of a call nobody runs is answered.
    xadd(&redis, "action-requests", &request("tool.cancel", "nobody-runs-this", json!({})));
    wait_for_payload(&redis, "action-results", |payload| {
        payload["type"] == "tool.cancel.completed" && payload["data"]["request_id"] == "nobody-runs-this"
    });
    // A chat message that calls a tool: the inbox, the conversation stream and the reply.
    let chat = json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "conversation_id": "conv-acl",
        "sender": "user:alice",
        "recipient": "agent:ToolHost",
        "type": "message",
        "content": r#"{"tool": "echo", "arguments": {"message": "from chat"}}"#,
        "metadata": {},
        "created_at": "2026-01-01T00:00:00Z",
    });
    xadd(&redis, "chat:ToolHost", &chat.to_string());
    wait_for_payload(&redis, "chat:conv-acl", |payload| payload.to_string().contains("from chat"));
    wait_for_payload(&redis, "stream:conv-acl", |payload| payload.to_string().contains("tool_step"));
    // A payload that cannot be answered is dead-lettered, and listed as the same user.
    let _: String = redis::cmd("XADD")
        .arg(&["action-requests", "*", "id", "garbage-1", "payload", "not json"][..])
        .query(&mut redis.connection())
        .unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let (code, out) = run_toolhost(&["dlq", "list"], &env, WAIT);
        assert_eq!(code, Some(0), "{out}");
        if out.contains("\"payload_excerpt\":\"not json\"") {
            break;
        }
        assert!(Instant::now() < deadline, "no dead letter listed: {out}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The MCP door (stdio), a client of the fleet with its private results stream.
    let called = call_through_mcp_stdio(&env);
    assert!(called.to_string().contains("via mcp") && called["result"]["isError"] != json!(true), "{called}");
    // The fleet heartbeat, written by the daemon as its user.
    let members: Vec<String> =
        redis::cmd("SMEMBERS").arg("toolhost:fleet").query(&mut redis.connection()).unwrap();
    assert!(!members.is_empty(), "no fleet member");
    let exists: u64 = redis::cmd("EXISTS").arg(&members).query(&mut redis.connection()).unwrap();
    assert_eq!(exists, members.len() as u64, "{members:?}");
    assert_only_config_get_refused(&redis, &daemon);
    assert!(!daemon.log().contains("\"level\":\"ERROR\""), "{}", daemon.log());

    // And the user can do nothing else.
    let mut restricted = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    let refused = |connection: &mut redis::Connection, args: &[&str]| {
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        let err = command
            .query::<redis::Value>(connection)
            .map(|_| ())
            .expect_err(&format!("{args:?} was allowed"));
        assert!(err.to_string().contains("no permissions"), "{args:?}: {err}");
    };
    refused(&mut restricted, &["FLUSHALL"]);
    refused(&mut restricted, &["CONFIG", "SET", "maxmemory", "1"]);
    refused(&mut restricted, &["CONFIG", "GET", "requirepass"]);
    refused(&mut restricted, &["KEYS", "*"]);
    refused(&mut restricted, &["SCAN", "0"]);
    refused(&mut restricted, &["SET", "someone-elses:key", "x"]);
    refused(&mut restricted, &["XADD", "other-stream", "*", "f", "v"]);
    refused(&mut restricted, &["DEL", "session:42"]);
    refused(&mut restricted, &["ACL", "SETUSER", "toolhost", "+@all"]);
    refused(&mut restricted, &["EVAL", "return 1", "0"]);
    // While its own keys stay in reach.
    let _: String = redis::cmd("XADD")
        .arg(&["action-results", "*", "f", "v"][..])
        .query(&mut restricted)
        .expect("its own results stream");
    assert!(line.contains(" -@all "), "{line}");
}

/// On a cluster the line grants `CLUSTER SLOTS` and the keys placed in other slots; with
/// Sentinel, `ROLE` (the check that the master the sentinels name is one). Both over TLS here,
/// since the harness's smallest cluster and sentinel are the TLS suite's.
#[test]
fn a_cluster_and_a_sentinel_master_serve_as_the_redis_acl_user() {
    let pki = Pki::new();
    let ca = pki.file("ca.pem");
    let node = TlsRedis::start_cluster(&pki);
    let nodes = format!("127.0.0.1:{}", node.tls_port);
    let plain = node.server.url();
    apply_acl(
        &node.server,
        &[("REDIS_URL", plain.as_str()), ("TOOLHOST__REDIS__CLUSTER_NODES", nodes.as_str())],
    );
    let url = format!("rediss://toolhost:{PASSWORD}@127.0.0.1:1");
    let env = [
        ("REDIS_URL", url.as_str()),
        ("TOOLHOST__REDIS__CLUSTER_NODES", nodes.as_str()),
        ("TOOLHOST__REDIS__CA_FILE", ca.as_str()),
    ];
    let daemon = Toolhost::start(&env);
    let (code, out) = run_toolhost(&["call", "echo", "--args", r#"{"message":"on a cluster"}"#], &env, WAIT);
    assert_eq!(code, Some(0), "{out}");
    assert_only_config_get_refused(&node.server, &daemon);

    let master = TlsRedis::start(&pki, "server", false);
    let sentinel = TlsSentinel::start(&pki, master.tls_port);
    let sentinels = sentinel.url();
    let plain = master.server.url();
    apply_acl(
        &master.server,
        &[("REDIS_URL", plain.as_str()), ("TOOLHOST__REDIS__SENTINELS", sentinels.as_str())],
    );
    let env = [
        ("REDIS_URL", url.as_str()),
        ("TOOLHOST__REDIS__SENTINELS", sentinels.as_str()),
        ("TOOLHOST__REDIS__CA_FILE", ca.as_str()),
    ];
    let daemon = Toolhost::start(&env);
    let (code, out) = run_toolhost(&["call", "echo", "--args", r#"{"message":"via sentinels"}"#], &env, WAIT);
    assert_eq!(code, Some(0), "{out}");
    assert_only_config_get_refused(&master.server, &daemon);
}
