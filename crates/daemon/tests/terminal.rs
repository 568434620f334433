//! Issue 4: `terminal_run` through the daemon against real processes, rule by rule; issue 12:
//! commands cannot read the daemon's secrets, and error answers name no host path.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Daemon, RedisServer, ask, payloads, processes, temp_dir};

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
    // Commands of a root daemon run as nobody, who must be able to enter the sandbox.
    for dir in [sandbox.clone(), sandbox.join("inside"), sandbox.join("inside/deeper")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
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

/// The Redis password of the secret tests: it must never reach an answer.
const CANARY: &str = "canary-pw-5e1d0c";

/// Every answer on the results stream, as text.
async fn all_answers(redis: &RedisServer) -> String {
    let mut connection = redis.connection().await;
    payloads(&mut connection, "action-results")
        .await
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A file a command may `cat`, holding the daemon's Redis URL and password, readable by all.
fn leaky_file(redis: &RedisServer) -> std::path::PathBuf {
    let dir = temp_dir("leaky");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.join("settings.env");
    std::fs::write(&path, format!("REDIS_URL={}\nREDIS_PASSWORD={CANARY}\n", redis.url())).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

/// Checks that `cat /proc/<daemon>/environ` fails and that `cat` of a file holding the password
/// prints it redacted; then that no answer holds the password.
async fn secrets_stay_hidden(redis: &RedisServer, daemon: &Daemon) {
    let environ = format!("/proc/{}/environ", daemon.pid());
    // Non-dumpable: the daemon's /proc files that expose secrets belong to root, whatever its uid.
    assert_eq!(std::fs::metadata(&environ).unwrap().uid(), 0, "{environ} is not root's");
    let read = outcome(&run(redis, "environ", json!({"command": format!("cat {environ}")})).await).clone();
    assert_eq!(read["ok"], false, "{read}");
    assert!(read["output"].as_str().unwrap().contains("Permission denied"), "{read}");

    let file = leaky_file(redis);
    let printed =
        outcome(&run(redis, "leaky", json!({"command": format!("cat {}", file.display())})).await).clone();
    assert_eq!(printed["ok"], true, "{printed}");
    let output = printed["output"].as_str().unwrap();
    assert!(output.contains("REDIS_URL=redis://:[REDACTED]@127.0.0.1:"), "{output}");
    assert!(output.contains("REDIS_PASSWORD=[REDACTED]"), "{output}");
    let _ = std::fs::remove_dir_all(file.parent().unwrap());

    let answers = all_answers(redis).await;
    assert!(!answers.contains(CANARY), "the password reached an answer: {answers}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_root_daemons_commands_cannot_read_its_environment() {
    assert!(
        std::path::Path::new("/usr/bin/setpriv").exists(),
        "setpriv (util-linux) is needed to start the daemon as another user"
    );
    let redis = RedisServer::start_with_password(CANARY);
    let daemon = Daemon::start_wrapped(
        &redis,
        &[("TERMINAL_ALLOWED_COMMANDS", "cat,id")],
        &[],
        &["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"],
    );
    // The daemon and its commands share the uid: only non-dumpability keeps them apart.
    let who = outcome(&run(&redis, "id", json!({"command": "id -u"})).await).clone();
    assert_eq!(who["output"], "65534\n", "{who}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    assert!(status.lines().any(|line| line.starts_with("Uid:\t65534")), "{status}");
    secrets_stay_hidden(&redis, &daemon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_daemons_commands_run_as_run_as_and_cannot_read_its_environment() {
    let redis = RedisServer::start_with_password(CANARY);
    let daemon = Daemon::start(
        &redis,
        &[("TERMINAL_ALLOWED_COMMANDS", "cat,id"), ("TOOLHOST__TOOLS__TERMINAL__RUN_AS", "nobody")],
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    assert!(status.lines().any(|line| line.starts_with("Uid:\t0")), "these tests run as root: {status}");
    let user = outcome(&run(&redis, "uid", json!({"command": "id -u"})).await).clone();
    assert_eq!(user["output"], "65534\n", "{user}");
    // No supplementary group of root's is kept.
    let groups = outcome(&run(&redis, "groups", json!({"command": "id -G"})).await).clone();
    assert_eq!(groups["output"], "65534\n", "{groups}");
    secrets_stay_hidden(&redis, &daemon).await;
}

/// Substrings of `text` that look like absolute paths: a `/` at the start of a word, followed
/// by a name character.
fn absolute_paths(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut res = Vec::new();
    for (index, window) in chars.windows(2).enumerate() {
        let starts_word = index == 0 || matches!(chars[index - 1], ' ' | '\'' | '"' | '(' | '=' | ':' | '\n');
        if starts_word
            && window[0] == '/'
            && (window[1].is_alphanumeric() || window[1] == '_' || window[1] == '.')
        {
            res.push(chars[index..].iter().take_while(|c| !c.is_whitespace()).collect());
        }
    }
    res
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_answers_name_no_host_path() {
    assert_eq!(absolute_paths("at /tmp/x and (/etc) ok"), ["/tmp/x", "/etc)"]);
    assert!(absolute_paths("a/b 1/2 http 6/7 (os error 2)").is_empty());
    let sandbox = temp_dir("paths");
    std::fs::set_permissions(&sandbox, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(sandbox.join("file"), "x").unwrap();
    // Root may enter it; the commands' user (nobody, the default for a root daemon) may not.
    std::fs::create_dir(sandbox.join("locked")).unwrap();
    std::fs::set_permissions(sandbox.join("locked"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let root = sandbox.to_str().unwrap().to_owned();
    let redis = RedisServer::start();
    let _daemon = Daemon::start(
        &redis,
        &[
            ("TERMINAL_ALLOWED_COMMANDS", "pwd,id,toolhost-no-such-program"),
            ("TERMINAL_SANDBOX_CWD", root.as_str()),
        ],
    );
    let who = outcome(&run(&redis, "id", json!({"command": "id -u"})).await).clone();
    assert_eq!(who["output"], "65534\n", "a root daemon runs commands as nobody by default: {who}");
    let mut answers = vec![
        run(&redis, "missing", json!({"command": "pwd", "cwd": "missing/deeper"})).await,
        run(&redis, "file", json!({"command": "pwd", "cwd": "file"})).await,
        run(&redis, "locked", json!({"command": "pwd", "cwd": "locked"})).await,
        run(&redis, "uninstalled", json!({"command": "toolhost-no-such-program"})).await,
    ];
    std::fs::remove_dir_all(&sandbox).unwrap();
    answers.push(run(&redis, "no-sandbox", json!({"command": "pwd"})).await);
    let seen: Vec<(String, String)> = answers
        .iter()
        .map(|answer| {
            assert_eq!(answer["success"], false, "{answer}");
            (answer["error_code"].as_str().unwrap().to_owned(), answer["error"].as_str().unwrap().to_owned())
        })
        .collect();
    let expected = [
        ("invalid_arguments", "Working directory is not usable: No such file or directory (os error 2)"),
        ("invalid_arguments", "Working directory is not usable: not a directory"),
        ("tool_failed", "Command could not be started: Permission denied (os error 13)"),
        (
            "tool_failed",
            "Command could not be started: program 'toolhost-no-such-program' is not installed on this host",
        ),
        ("invalid_arguments", "Working directory is not usable: the sandbox root is not available"),
    ];
    assert_eq!(seen, expected.map(|(code, error)| (code.to_owned(), error.to_owned())));
    for answer in &answers {
        let text = format!("{} {}", answer["error"], answer["details"]);
        assert!(!text.contains(&root), "{answer}");
        assert_eq!(absolute_paths(&text), Vec::<String>::new(), "{answer}");
    }
}
