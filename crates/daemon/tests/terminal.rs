//! Issue 4: `terminal_run` through the daemon against real processes, rule by rule.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Daemon, RedisServer, ask, temp_dir};

/// Runs one command through the daemon and returns the answer's `data`.
async fn run(redis: &RedisServer, id: &str, arguments: Value) -> Value {
    ask(redis, &[("terminal_run.requested", id, arguments)]).await.remove(id).unwrap()
}

fn outcome(answer: &Value) -> &Value {
    assert_eq!(answer["success"], true, "{answer}");
    &answer["result"]
}

fn refused(answer: &Value, code: &str, message: &str) {
    assert_eq!(answer["success"], false, "{answer}");
    assert_eq!(answer["error_code"], code, "{answer}");
    assert_eq!(answer["error"], message, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_parsing_and_exit_codes() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(
        &redis,
        &[("TERMINAL_ALLOWED_COMMANDS", "echo,false,sh,printf,rm"), ("TERMINAL_DENY_COMMANDS", "rm")],
    );
    let ran = run(&redis, "echo", json!({"command": "echo hello"})).await;
    let result = outcome(&ran);
    assert_eq!(result["ok"], true);
    assert_eq!(result["exit_code"], 0);
    assert_eq!(result["timeout"], false);
    assert_eq!(result["truncated"], false);
    assert_eq!(result["output"], "hello\n");
    assert_eq!(result["summary"], "ok=true exit=0 timeout=false truncated=false\noutput:\nhello\n");
    assert!(result["duration_ms"].is_u64());

    let quoted = run(&redis, "quotes", json!({"command": r#"printf '%s|' "a  b" 'c d' e"#})).await;
    assert_eq!(outcome(&quoted)["output"], "a  b|c d|e|");
    // No shell: metacharacters are plain arguments.
    let literal = run(&redis, "literal", json!({"command": "echo $HOME; ls | cat > /tmp/x"})).await;
    assert_eq!(outcome(&literal)["output"], "$HOME; ls | cat > /tmp/x\n");

    refused(
        &run(&redis, "ls", json!({"command": "ls -la"})).await,
        "forbidden",
        "Command 'ls' is not allowed",
    );
    refused(
        &run(&redis, "rm", json!({"command": "rm -rf /tmp/nothing"})).await,
        "forbidden",
        "Command 'rm' is denied by policy",
    );
    // Deny wins even through a path, and the directory never picks another binary.
    refused(
        &run(&redis, "rm-path", json!({"command": "/bin/../usr/bin/rm x"})).await,
        "forbidden",
        "Command 'rm' is denied by policy",
    );
    let empty = run(&redis, "empty", json!({"command": "   "})).await;
    assert_eq!(empty["error_code"], "invalid_arguments", "{empty}");
    let unbalanced = run(&redis, "unbalanced", json!({"command": "echo 'open"})).await;
    assert_eq!(unbalanced["error_code"], "invalid_arguments", "{unbalanced}");

    let failed = outcome(&run(&redis, "false", json!({"command": "false"})).await).clone();
    assert_eq!((failed["ok"].clone(), failed["exit_code"].clone()), (json!(false), json!(1)));
    assert!(
        failed["summary"]
            .as_str()
            .unwrap()
            .starts_with("ok=false exit=1 timeout=false truncated=false\noutput:\n")
    );
    let three = outcome(&run(&redis, "exit3", json!({"command": "sh -c 'exit 3'"})).await).clone();
    assert_eq!(three["exit_code"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn working_directories_stay_in_the_sandbox() {
    let sandbox = temp_dir("sandbox");
    std::fs::create_dir_all(sandbox.join("inside/deeper")).unwrap();
    std::os::unix::fs::symlink("/etc", sandbox.join("escape")).unwrap();
    let redis = RedisServer::start();
    let root = sandbox.to_str().unwrap().to_owned();
    let _daemon = Daemon::start(
        &redis,
        &[("TERMINAL_ALLOWED_COMMANDS", "pwd"), ("TERMINAL_SANDBOX_CWD", root.as_str())],
    );
    let here =
        outcome(&run(&redis, "inside", json!({"command": "pwd", "cwd": "inside/deeper"})).await).clone();
    assert!(here["output"].as_str().unwrap().trim_end().ends_with("/inside/deeper"), "{here}");
    let default = outcome(&run(&redis, "default", json!({"command": "pwd"})).await).clone();
    assert!(
        default["output"]
            .as_str()
            .unwrap()
            .trim_end()
            .ends_with(sandbox.file_name().unwrap().to_str().unwrap())
    );
    for (id, cwd) in
        [("dotdot", "../"), ("nested-dotdot", "inside/../../"), ("absolute", "/etc"), ("symlink", "escape")]
    {
        refused(
            &run(&redis, id, json!({"command": "pwd", "cwd": cwd})).await,
            "forbidden",
            "Working directory escapes sandbox root",
        );
    }
    let _ = std::fs::remove_dir_all(&sandbox);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_is_replaced_and_secrets_are_redacted() {
    let redis = RedisServer::start();
    let _daemon = Daemon::start(
        &redis,
        &[
            ("TERMINAL_ALLOWED_COMMANDS", "env,echo"),
            ("TERMINAL_REDACT_SUBSTRINGS", "internal.example"),
            ("TERMINAL_REDACT_PATTERNS", r"acct-\d{6},([unclosed"),
            ("CANARY_SECRET", "canary-7f3a"),
        ],
    );
    let env = outcome(&run(&redis, "env", json!({"command": "env"})).await).clone();
    let mut lines: Vec<&str> = env["output"].as_str().unwrap().lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["LC_ALL=C", "PATH=/usr/bin:/bin:/usr/local/bin"], "{env}");

    let secrets = [
        ("sk", "key sk-abcdefghijklmnop0123", "sk-abcdefghijklmnop0123"),
        ("api_key", "api_key=abc123secret", "abc123secret"),
        ("token", "token=tok-998877", "tok-998877"),
        ("password", "password=hunter2", "hunter2"),
        ("secret", "secret=s3cr3t-value", "s3cr3t-value"),
        ("authorization", "authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
        ("bearer", "sent Bearer abc.def-ghi", "abc.def-ghi"),
        ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl", "eyJzdWIiOiIxMjM0In0"),
        ("substring", "host internal.example up", "internal.example"),
        ("pattern", "account acct-123456 ok", "acct-123456"),
    ];
    for (id, text, secret) in secrets {
        let printed = outcome(&run(&redis, id, json!({"command": format!("echo '{text}'")})).await).clone();
        let output = printed["output"].as_str().unwrap();
        assert!(!output.contains(secret), "{id}: {output}");
        assert!(output.contains("[REDACTED]"), "{id}: {output}");
        assert!(!printed["summary"].as_str().unwrap().contains(secret), "{id}: {printed}");
    }
}

/// Process ids whose command line is exactly `words`.
fn processes(words: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = words.iter().flat_map(|word| word.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| cmdline == wanted))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_are_capped_and_timeouts_leave_nothing_behind() {
    let redis = RedisServer::start();
    let daemon = Daemon::start(
        &redis,
        &[
            ("TERMINAL_ALLOWED_COMMANDS", "yes,sh,echo"),
            ("TERMINAL_TIMEOUT_SECONDS", "1"),
            ("TERMINAL_OUTPUT_CAP_BYTES", "4096"),
            ("TERMINAL_FUNCTION_OUTPUT_MAX_CHARS", "20"),
        ],
    );
    let rss_before = daemon.rss_kib();
    for round in 0..3 {
        let flood = outcome(&run(&redis, &format!("yes-{round}"), json!({"command": "yes"})).await).clone();
        assert_eq!(flood["timeout"], true, "{flood}");
        assert_eq!(flood["truncated"], true);
        assert_eq!(flood["ok"], false);
        assert_eq!(flood["exit_code"], Value::Null);
        assert_eq!(flood["output"].as_str().unwrap().len(), 4096);
        assert_eq!(
            flood["summary"],
            format!("ok=false exit=None timeout=true truncated=true\noutput:\n{}", "y\n".repeat(10))
        );
    }
    // `yes` wrote gigabytes' worth of lines at full speed for three seconds; the daemon kept 4 KiB
    // of each. Allow for allocator noise, not for buffering the flood.
    let rss_after = daemon.rss_kib();
    assert!(rss_after < rss_before + 16 * 1024, "RSS grew from {rss_before} KiB to {rss_after} KiB");

    let marker = ["sleep", "31.7"];
    let background =
        outcome(&run(&redis, "background", json!({"command": "sh -c 'sleep 31.7 & sleep 31.7'"})).await)
            .clone();
    assert_eq!(background["timeout"], true, "{background}");
    // The group was killed with the call; give the kernel a moment to reap.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes(&marker).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(processes(&marker), Vec::<u32>::new(), "sleep processes survived the call");

    let wide = "é".repeat(30);
    let cut = outcome(&run(&redis, "chars", json!({"command": format!("echo {wide}")})).await).clone();
    assert_eq!(cut["output"], format!("{wide}\n"));
    assert_eq!(
        cut["summary"],
        format!("ok=true exit=0 timeout=false truncated=false\noutput:\n{}", "é".repeat(20))
    );
}
