//! Issue 15's reload: SIGHUP re-reads the configuration file; tool sources that were added,
//! removed or changed are applied without a restart, a configuration that does not load is
//! refused whole while the old one keeps serving, and settings that need a restart are named.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Daemon, RedisServer, ask, temp_dir};

const WAIT: Duration = Duration::from_secs(20);

/// A `[[commands]]` table for a tool that answers `text` through `echo`.
fn echo_command(name: &str, text: &str) -> String {
    format!(
        "[[commands]]\nname = \"{name}\"\ndescription = \"Says {text}.\"\nargv = [\"echo\", \"{text}\"]\n\
         annotations = {{ read_only = true, idempotent = true }}\n\n"
    )
}

async fn tool_names(redis: &RedisServer, id: &str) -> Vec<String> {
    let answers = ask(redis, &[("tools.discover", id, json!({}))]).await;
    answers[id]["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Counts the log lines that carry `needle`, for waiting on the n-th reload.
fn count(log: &str, needle: &str) -> usize {
    log.lines().filter(|line| line.contains(needle)).count()
}

/// Sends SIGHUP and waits for the reload's outcome line (applied or refused), the `nth` of them.
fn reload(daemon: &Daemon, nth: usize) -> String {
    daemon.signal(libc::SIGHUP);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let log = daemon.log();
        let done = count(&log, "configuration reloaded") + count(&log, "configuration reload refused");
        if done >= nth {
            return log;
        }
        assert!(std::time::Instant::now() < deadline, "reload {nth} never finished:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_and_removes_tools_refuses_a_broken_file_and_names_restart_only_settings() {
    let redis = RedisServer::start();
    let dir = temp_dir("reload");
    let path = dir.join("toolhost.toml");
    std::fs::write(&path, echo_command("say_one", "one")).unwrap();
    let daemon = Daemon::start_args(&redis, &[], &["--config", path.to_str().unwrap()]);
    assert!(tool_names(&redis, "d-1").await.contains(&"say_one".to_owned()));

    // A tool added, one removed: the new registry serves at once, the old tool is gone.
    std::fs::write(&path, echo_command("say_two", "two")).unwrap();
    let log = reload(&daemon, 1);
    assert_eq!(count(&log, "configuration reloaded"), 1, "{log}");
    let names = tool_names(&redis, "d-2").await;
    assert!(names.contains(&"say_two".to_owned()) && !names.contains(&"say_one".to_owned()), "{names:?}");
    let answers =
        ask(&redis, &[("say_two.requested", "c-1", json!({})), ("say_one.requested", "c-2", json!({}))])
            .await;
    assert_eq!(answers["c-1"]["result"], json!("two\n"), "{answers:?}");
    assert_eq!(answers["c-2"]["error_code"], "unknown_tool", "{answers:?}");
    let registry: Vec<String> = redis::cmd("HKEYS")
        .arg("toolhost:registry:toolhost")
        .query_async(&mut redis.connection().await)
        .await
        .unwrap();
    assert!(
        registry.contains(&"say_two".to_owned()) && !registry.contains(&"say_one".to_owned()),
        "{registry:?}"
    );

    // A file that does not load is refused whole; the tools it would have changed keep serving.
    std::fs::write(&path, format!("{}[dispatch]\nmax_inflight = 3\n", echo_command("say_three", "three")))
        .unwrap();
    let log = reload(&daemon, 2);
    assert_eq!(count(&log, "configuration reload refused"), 1, "{log}");
    assert!(log.contains("max_inflight"), "the refusal names the key:\n{log}");
    let answers = ask(&redis, &[("say_two.requested", "c-3", json!({}))]).await;
    assert_eq!(answers["c-3"]["result"], json!("two\n"));

    // Settings that cannot change while running are named, the tool settings still apply.
    std::fs::write(&path, format!("{}[dispatch]\nmax_in_flight = 3\n", echo_command("say_three", "three")))
        .unwrap();
    let log = reload(&daemon, 3);
    let line: Value = log
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["message"].as_str().is_some_and(|message| message.contains("need a restart")))
        .unwrap_or_else(|| panic!("no restart line:\n{log}"));
    assert_eq!(line["keys"], "dispatch.max_in_flight", "{line}");
    assert!(tool_names(&redis, "d-3").await.contains(&"say_three".to_owned()));
}
