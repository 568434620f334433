//! Issue 15's hosted MCP servers through the daemon: a real, unmodified `mcp-server-time`
//! configured in `[[mcp_servers]]` is listed in discovery, called over Redis like a built-in, and
//! removed by a reload, after which its child process is gone. These need the servers of
//! `scripts/ensure-mcp-servers.sh`, so they run in `just test-mcp` (which installs them).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Daemon, RedisServer, ask, temp_dir};

const WAIT: Duration = Duration::from_secs(30);

/// The installed `mcp-server-time`, as `scripts/ensure-mcp-servers.sh` lays it out.
fn time_server() -> PathBuf {
    let cache = std::env::var_os("TOOLHOST_MCP_SERVERS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/toolhost/mcp-servers")
    });
    let program = cache.join("time/bin/mcp-server-time");
    assert!(
        program.exists(),
        "{} is missing: run scripts/ensure-mcp-servers.sh (`just test-mcp`)",
        program.display()
    );
    program
}

/// The name of the user running the tests (the `run_as` a root daemon needs to reach the servers).
fn nix_user() -> String {
    std::env::var("USER").ok().filter(|user| !user.is_empty()).unwrap_or_else(|| "root".to_owned())
}

/// Pids of the processes whose command line names `needle`.
fn processes_named(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // A zombie has no command line left; its stat still names it.
        if String::from_utf8_lossy(&cmdline).contains(needle)
            || (stat.contains(needle) && stat.contains(") Z "))
        {
            pids.push(pid);
        }
    }
    pids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn a_hosted_mcp_server_is_listed_called_over_redis_and_stopped_by_a_reload() {
    let program = time_server();
    let redis = RedisServer::start();
    let dir = temp_dir("mcp-hosted");
    let path = dir.join("toolhost.toml");
    // The servers are installed under the invoking user's home: the child runs as that user
    // (a root daemon would otherwise run it as `nobody`, who cannot read root's home).
    let server = format!(
        "[tools.terminal]\nrun_as = \"{}\"\n\n[[mcp_servers]]\nname = \"time\"\ncommand = \"{}\"\n\
         args = [\"--local-timezone\", \"UTC\"]\n",
        nix_user(),
        program.display()
    );
    std::fs::write(&path, &server).unwrap();
    let daemon = Daemon::start_args(&redis, &[], &["--config", path.to_str().unwrap()]);

    let answers = ask(&redis, &[("tools.discover", "d-1", json!({"format": "openai"}))]).await;
    let tools = answers["d-1"]["result"]["tools"].as_array().unwrap().clone();
    let names: Vec<&str> = tools.iter().filter_map(|tool| tool["function"]["name"].as_str()).collect();
    assert!(names.contains(&"time__get_current_time"), "{names:?}");
    let call = json!({"tool": "time__get_current_time", "arguments": {"timezone": "UTC"}});
    let answers = ask(&redis, &[("tool.invoke", "c-1", call)]).await;
    assert_eq!(answers["c-1"]["success"], true, "{answers:?}");
    assert_eq!(answers["c-1"]["result"]["timezone"], "UTC", "{answers:?}");
    // Arguments are validated before the server sees them.
    let bad = json!({"tool": "time__get_current_time", "arguments": {"timezone": 5}});
    let answers = ask(&redis, &[("tool.invoke", "c-2", bad)]).await;
    assert_eq!(answers["c-2"]["error_code"], "invalid_arguments", "{answers:?}");
    let running = processes_named("mcp-server-time");
    assert!(!running.is_empty(), "the server's child runs");

    // A reload that changes the server but whose tools cannot build (a command tool takes one of
    // its names) is refused whole: the server started for it is stopped again, and the old one
    // keeps serving.
    let clash = format!(
        "{}\n[[commands]]\nname = \"time__get_current_time\"\ndescription = \"Takes the name.\"\nargv = [\"date\"]\n",
        server.replace("\"UTC\"]", "\"Europe/Paris\"]")
    );
    std::fs::write(&path, clash).unwrap();
    daemon.signal(libc::SIGHUP);
    let deadline = Instant::now() + WAIT;
    while !daemon.log().contains("configuration reload refused") {
        assert!(Instant::now() < deadline, "the clashing reload was not refused:\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while processes_named("mcp-server-time") != running {
        assert!(
            Instant::now() < deadline,
            "the server started for the refused reload is still there: {:?} against {running:?}",
            processes_named("mcp-server-time")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let call = json!({"tool": "time__get_current_time", "arguments": {"timezone": "UTC"}});
    let answers = ask(&redis, &[("tool.invoke", "c-old", call)]).await;
    assert_eq!(answers["c-old"]["success"], true, "{answers:?}");

    // Removing the server from the file and reloading stops it: no process left, not even a zombie.
    std::fs::write(&path, format!("[tools.terminal]\nrun_as = \"{}\"\n", nix_user())).unwrap();
    daemon.signal(libc::SIGHUP);
    let deadline = Instant::now() + WAIT;
    while !processes_named("mcp-server-time").is_empty() {
        assert!(Instant::now() < deadline, "the removed server's child is still there:\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answers = ask(&redis, &[("tool.invoke", "c-3", json!({"tool": "time__get_current_time"}))]).await;
    assert_eq!(answers["c-3"]["error_code"], "unknown_tool", "{answers:?}");
    // `/status` follows within its refresh period.
    let addr = crate::support::http_addr(&daemon.log());
    let (_, status) = crate::support::wait_http(addr, "/status", WAIT, |_, body| {
        serde_json::from_str::<Value>(body).is_ok_and(|status| status["sources"] == json!([]))
    });
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["sources"], json!([]), "{status}");
}

/// The installed server-everything entry script, as `scripts/ensure-mcp-servers.sh` lays it out.
fn everything_server() -> PathBuf {
    let cache = std::env::var_os("TOOLHOST_MCP_SERVERS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/toolhost/mcp-servers")
    });
    let script = cache.join("everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        script.exists(),
        "{} is missing: run scripts/ensure-mcp-servers.sh (`just test-mcp`)",
        script.display()
    );
    script
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn a_hosted_mcp_calls_progress_is_relayed_at_the_rate_and_a_cancel_reaches_the_server() {
    let script = everything_server();
    let redis = RedisServer::start();
    let dir = temp_dir("mcp-progress");
    let tap = dir.join("stdin.jsonl");
    // Everything the daemon sends the server is copied to `tap` on its way.
    let args =
        json!(["-c", r#"tee -a "$0" | exec "$@""#, tap.display().to_string(), "node", script, "stdio"]);
    let path = dir.join("toolhost.toml");
    std::fs::write(
        &path,
        format!(
            "[dispatch]\nprogress_per_second = 2\n\n[tools.terminal]\nrun_as = \"{}\"\n\n\
             [[mcp_servers]]\nname = \"everything\"\ncommand = \"/bin/sh\"\nargs = {args}\n",
            nix_user()
        ),
    )
    .unwrap();
    let _daemon = Daemon::start_args(&redis, &[], &["--config", path.to_str().unwrap()]);
    let mut connection = redis.connection().await;

    // Ten notifications a second, relayed at two a second.
    let tool = "everything__trigger-long-running-operation";
    let long = crate::support::request(
        &format!("{tool}.requested"),
        "long-1",
        json!({"duration": 60, "steps": 600}),
    );
    crate::support::xadd(&mut connection, "action-requests", &long.to_string()).await;
    let progress_type = format!("{tool}.requested.completed.progress");
    let of_call = |results: Vec<Value>, event_type: &str| -> Vec<Value> {
        results
            .into_iter()
            .filter(|entry| entry["type"] == event_type && entry["data"]["request_id"] == "long-1")
            .collect()
    };
    let deadline = Instant::now() + WAIT;
    let progress = loop {
        let found =
            of_call(crate::support::payloads(&mut connection, "action-results").await, &progress_type);
        if found.len() >= 4 {
            break found;
        }
        assert!(Instant::now() < deadline, "no progress entries: {found:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for entry in &progress {
        assert_eq!(entry["data"]["total"], 600.0, "{entry}");
        assert!(entry["data"].get("success").is_none(), "a progress entry is no answer: {entry}");
        assert_eq!(entry["correlation_id"], "c-long-1", "{entry}");
        assert_eq!(entry["tenant_id"], "acme", "{entry}");
        assert_eq!(entry["source"], "toolhost:toolhost", "{entry}");
    }
    let stamps: Vec<chrono::DateTime<chrono::Utc>> =
        progress.iter().map(|entry| entry["time"].as_str().unwrap().parse().unwrap()).collect();
    for (pair, stamp) in progress.windows(2).zip(stamps.windows(2)) {
        assert!(pair[1]["data"]["progress"].as_f64() > pair[0]["data"]["progress"].as_f64(), "{progress:#?}");
        // 500 ms apart at two a second (the stamps have millisecond precision).
        assert!(stamp[1] - stamp[0] >= chrono::Duration::milliseconds(499), "{progress:#?}");
    }

    // Cancelled: the server is told, by the call's JSON-RPC id, and the call answers `cancelled`.
    let cancel = crate::support::request("tool.cancel", "long-1", json!({}));
    crate::support::xadd(&mut connection, "action-requests", &cancel.to_string()).await;
    let deadline = Instant::now() + WAIT;
    let answer = loop {
        let found = of_call(
            crate::support::payloads(&mut connection, "action-results").await,
            &format!("{tool}.requested.completed"),
        );
        if let Some(answer) = found.into_iter().next() {
            break answer;
        }
        assert!(Instant::now() < deadline, "the cancelled call was never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(answer["data"]["error_code"], "cancelled", "{answer}");
    let deadline = Instant::now() + WAIT;
    loop {
        let lines: Vec<Value> = std::fs::read_to_string(&tap)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        let call_id = lines.iter().find(|line| line["method"] == "tools/call").map(|line| line["id"].clone());
        let cancelled = lines.iter().any(|line| {
            line["method"] == "notifications/cancelled"
                && Some(&line["params"]["requestId"]) == call_id.as_ref()
        });
        if cancelled {
            break;
        }
        assert!(Instant::now() < deadline, "no notifications/cancelled for the call: {lines:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    crate::support::settled(&mut connection, "action-requests", "toolhost").await;
    let results = crate::support::payloads(&mut connection, "action-results").await;
    let answered_at = results.iter().position(|entry| entry["id"] == answer["id"]).unwrap();
    assert!(
        results[answered_at..].iter().all(|entry| entry["type"] != progress_type.as_str()),
        "no progress entry after the answer: {results:#?}"
    );
    let cancels: Vec<&Value> =
        results.iter().filter(|entry| entry["type"] == "tool.cancel.completed").collect();
    assert_eq!(cancels.len(), 1, "{cancels:#?}");
    assert_eq!(cancels[0]["data"]["result"]["state"], "cancelling", "{cancels:#?}");
}
