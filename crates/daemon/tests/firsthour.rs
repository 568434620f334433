//! Issue 13: the caller's first hour with the real binary. Usage errors exit 64, a closed stdout
//! ends a command quietly, `TOOLHOST_CONFIG` reaches every subcommand, configuration errors come
//! all at once, stray `TOOLHOST_*` variables are warned about, an empty dead-letter list says so,
//! logs are human on a terminal, and a Redis outage is logged once, not once per retry.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Daemon, RedisServer, temp_dir};

/// Runs `toolhost` with only `env` (and PATH) set.
fn toolhost(args: &[&str], env: &[(&str, &str)]) -> Output {
    command(args, env).output().expect("run toolhost")
}

fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolhost"));
    command.args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn every_usage_error_exits_64_and_help_exits_0() {
    for args in [
        &["no-such-command"][..],
        &["tools", "--no-such-flag"],
        &["call"],
        &["call", "echo", "--log-format", "json"],
        &["tools", "--log-format", "json"],
        &["call", "echo", "--timeout", "soon"],
        &["tools", "--format", "yaml"],
        &["dlq", "replay"],
        &["serve", "--log-format", "xml"],
    ] {
        let output = toolhost(args, &[("REDIS_URL", "redis://127.0.0.1:1")]);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {}", stderr(&output));
        assert!(stderr(&output).contains("error"), "{args:?}: {}", stderr(&output));
    }
    for args in [&["--help"][..], &["--version"], &["serve", "--help"], &["dlq", "list", "--help"]] {
        let output = toolhost(args, &[]);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {}", stderr(&output));
        assert!(!output.stdout.is_empty(), "{args:?}");
    }
    let help = String::from_utf8(toolhost(&["serve", "--help"], &[]).stdout).unwrap();
    assert!(help.contains("--log-format"), "{help}");
    let help = String::from_utf8(toolhost(&["call", "--help"], &[]).stdout).unwrap();
    assert!(!help.contains("--log-format"), "{help}");
}

/// A child process killed on drop, so a failed assertion leaves no daemon behind.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `toolhost` with a stdout whose reader is gone, as `toolhost ... | head -c1` leaves it.
fn with_closed_stdout(args: &[&str], env: &[(&str, &str)]) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    command(args, env).stdout(writer).stderr(Stdio::piped()).output().expect("run toolhost")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_every_command_quietly() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(&redis, &[]);
    let mut connection = redis.connection().await;
    let letter = json!({"event": "dead_letter", "request_entry_id": "1-0", "error": "e", "payload": "{}"});
    crate::support::xadd(&mut connection, "dlq:toolhost", &letter.to_string()).await;
    let url = redis.url();
    let env = [("REDIS_URL", url.as_str())];
    for args in [
        &["tools"][..],
        &["tools", "--from-registry"],
        &["call", "echo", "--args", r#"{"message":"hi"}"#],
        &["check-config"],
        &["dlq", "list"],
        &["--help"],
        &["--version"],
    ] {
        let output = with_closed_stdout(args, &env);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {text}");
        assert!(!text.contains("panicked") && !text.contains("Broken pipe"), "{args:?}: {text}");
    }
    // `serve` loses its log lines, says nothing about each, serves on, and drains on SIGTERM.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    // Under a key prefix of its own, so only it can answer the call below.
    let own = [("REDIS_URL", url.as_str()), ("TOOLHOST__REDIS__KEY_PREFIX", "quiet:")];
    let mut serve = Reaped(
        command(&["serve"], &own)
            .env("TOOLHOST__HTTP__LISTEN", "127.0.0.1:0")
            .stdout(writer)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Ready once its tools are listed in Redis (its group is created just before).
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let listed = toolhost(&["tools", "--from-registry"], &own);
        let answer: Value = serde_json::from_slice(&listed.stdout).unwrap_or_default();
        if answer["tools"].as_array().is_some_and(|tools| !tools.is_empty()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = toolhost(&["call", "echo", "--args", r#"{"message":"still serving"}"#], &own);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    crate::support::signal(serve.0.id() as i32, libc::SIGTERM);
    let status = serve.0.wait().unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut serve.0.stderr.take().unwrap(), &mut text).unwrap();
    assert_eq!(status.code(), Some(0), "{text}");
    assert_eq!(text, "", "serve complained on stderr");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolhost_config_reaches_the_daemon_and_every_client_command() {
    let redis = RedisServer::start();
    let dir = temp_dir("toolhost-config");
    let file = dir.join("toolhost.toml");
    std::fs::write(&file, "[redis]\nkey_prefix = \"t13:\"\n[daemon]\ntoolbox_id = \"first-hour\"\n").unwrap();
    let file = file.to_str().unwrap();
    let _daemon = Daemon::start(&redis, &[("TOOLHOST_CONFIG", file)]);
    let url = redis.url();
    let env = [("REDIS_URL", url.as_str()), ("TOOLHOST_CONFIG", file)];

    let output = toolhost(&["call", "echo", "--args", r#"{"message":"same config"}"#], &env);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(serde_json::from_slice::<Value>(&output.stdout).unwrap(), json!({"message": "same config"}));
    let output = toolhost(&["tools", "--format", "toolbox"], &env);
    assert_eq!(serde_json::from_slice::<Value>(&output.stdout).unwrap()["toolbox_id"], "first-hour");
    let output = toolhost(&["check-config"], &env);
    assert!(String::from_utf8_lossy(&output.stdout).contains("toolbox_id = \"first-hour\""));
    let output = toolhost(&["dlq", "list"], &env);
    assert!(stderr(&output).contains("no dead letters in t13:dlq:first-hour"), "{}", stderr(&output));
    // Without the variable the client uses the defaults and finds no daemon there.
    let output = toolhost(&["call", "echo", "--args", "{}", "--timeout", "1s"], &env[..1]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    // The flag wins over the variable.
    let output = toolhost(&["check-config", "--config", "/nonexistent.toml"], &env);
    assert_eq!(output.status.code(), Some(64));
    assert!(stderr(&output).contains("--config: cannot read /nonexistent.toml"), "{}", stderr(&output));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn configuration_errors_come_all_at_once_and_stray_variables_are_warned_about() {
    let dir = temp_dir("all-errors");
    let file = dir.join("bad.toml");
    std::fs::write(&file, "[dispatch]\nmax_inflight = 8\nclaim_idle_ms = \"soon\"\n[htp]\nlisten = \"x\"\n")
        .unwrap();
    let file = file.to_str().unwrap();
    for subcommand in ["check-config", "serve", "tools"] {
        let env = [("TOOLHOST__LOG__FORMAT", "xml"), ("TOOLHOST_LOG__LEVEL", "debug")];
        let output = toolhost(&[subcommand, "--config", file], &env);
        assert_eq!(output.status.code(), Some(64), "{subcommand}");
        let text = stderr(&output);
        // The stray variable is warned about even when the configuration fails.
        assert!(text.contains("warning: TOOLHOST_LOG__LEVEL is not a variable toolhost reads"), "{text}");
        for key in ["dispatch.max_inflight", "dispatch.claim_idle_ms", "htp", "log.format"] {
            assert!(text.contains(&format!("  {key}: ")), "{subcommand}: {key} missing from {text}");
        }
    }
    let output = toolhost(
        &["check-config"],
        &[
            ("TOOLHOST_DISPATCH__MAX_IN_FLIGHT", "8"),
            ("TOOLHOST_SOAK_REQUESTS", "1"),
            ("TOOLHOST_CONFIG", ""),
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stderr(&output);
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        ["toolhost: warning: TOOLHOST_DISPATCH__MAX_IN_FLIGHT is not a variable toolhost reads; ignored \
             (did you mean TOOLHOST__DISPATCH__MAX_IN_FLIGHT?)"],
        "{text}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_empty_dead_letter_list_says_so() {
    let redis = RedisServer::start();
    let url = redis.url();
    let output = toolhost(&["dlq", "list"], &[("REDIS_URL", url.as_str())]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(output.stdout, b"", "stdout stays one JSON object per letter");
    assert_eq!(stderr(&output), "toolhost: no dead letters in dlq:toolhost\n");
}

#[test]
fn logs_are_human_on_a_terminal() {
    let redis = RedisServer::start();
    let url = redis.url();
    // `script` gives the daemon a pseudo-terminal as stdout; `timeout` stops it after a while.
    let serve = format!("timeout -s INT 3 {} serve", env!("CARGO_BIN_EXE_toolhost"));
    let output = Command::new("script")
        .args(["-qfec", &serve, "/dev/null"])
        .env("REDIS_URL", &url)
        .env("TOOLHOST__HTTP__LISTEN", "127.0.0.1:0")
        .env_remove("RUST_LOG")
        .output()
        .expect("script (util-linux) runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("INFO") && text.contains("ready"), "{text}");
    assert!(!text.contains("\"message\":\"ready\""), "JSON on a terminal:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_is_logged_once_with_its_url_and_length() {
    // With an append-only file, so the restarted server still has the groups.
    let mut redis = RedisServer::start_with(true);
    let daemon = Daemon::start(&redis, &[]);
    let before = daemon.log().lines().count();
    redis.kill();
    let down = Instant::now();
    daemon.wait_for_log("redis does not answer", Duration::from_secs(10));
    // Every loop retries many times in this window; only the probe may say so.
    while down.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(100));
    }
    redis.restart();
    daemon.wait_for_log("redis answers again", Duration::from_secs(20));
    let lines: Vec<Value> =
        daemon.log().lines().skip(before).filter_map(|line| serde_json::from_str(line).ok()).collect();
    let warnings: Vec<&Value> = lines.iter().filter(|line| line["level"] == "WARN").collect();
    assert_eq!(warnings.len(), 1, "one warning for the outage, not one per retry: {warnings:#?}");
    assert_eq!(warnings[0]["message"], "redis does not answer; not ready");
    assert_eq!(warnings[0]["redis"], redis.url());
    assert!(warnings[0]["hint"].as_str().unwrap().contains("REDIS_URL"), "{}", warnings[0]);
    let end: Vec<&Value> = lines.iter().filter(|line| line["message"] == "redis answers again").collect();
    assert_eq!(end.len(), 1, "{lines:#?}");
    let outage_ms = end[0]["outage_ms"].as_u64().unwrap();
    assert!((5000..20_000).contains(&outage_ms), "{}", end[0]);
}
