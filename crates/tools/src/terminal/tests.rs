//! End-to-end tests of [`run`] with real processes: policy refusals, sandbox
//! escapes, the environment, redaction, caps, timeouts, process-group cleanup
//! and rlimits. Time is only bounded from above, generously, to prove that a
//! call returns promptly.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::*;

/// Upper bound for calls that must return promptly despite a 30 s child.
const PROMPTLY: Duration = Duration::from_secs(10);

fn policy_with(allowed: &[&str], edit: impl FnOnce(&mut TerminalSettings)) -> TerminalPolicy {
    let mut settings = TerminalSettings {
        allowed_commands: allowed.iter().map(|s| (*s).to_owned()).collect(),
        ..TerminalSettings::default()
    };
    edit(&mut settings);
    let (policy, warnings) = TerminalPolicy::new(&settings);
    assert!(warnings.is_empty(), "{warnings:?}");
    policy
}

fn policy(allowed: &[&str]) -> TerminalPolicy {
    policy_with(allowed, |_| {})
}

async fn check_output(policy: &TerminalPolicy, command: &str, expected: &str) {
    let outcome = run(policy, command, None).await.unwrap();
    assert_eq!(outcome.output, expected, "command: {command:?}");
    assert!(outcome.ok, "{outcome:?}");
}

async fn check_refused(policy: &TerminalPolicy, command: &str, cwd: Option<&str>, expected: Refusal) {
    assert_eq!(run(policy, command, cwd).await, Err(expected), "command: {command:?}, cwd: {cwd:?}");
}

/// A directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N_DIRS: AtomicUsize = AtomicUsize::new(0);
        let dir_idx = N_DIRS.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("toolhost-terminal-test-{}-{dir_idx}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(std::fs::canonicalize(&path).unwrap())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Pids of live (not zombie) processes in group `pgid`, from `/proc/*/stat`.
fn live_members(pgid: i32) -> Vec<i32> {
    let mut res = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the parenthesized command name: state, ppid, pgrp.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let dead = matches!(fields[0], "Z" | "X");
        if !dead && fields[2].parse::<i32>() == Ok(pgid) {
            res.push(pid);
        }
    }
    res
}

/// Waits (at most 5 s, for the kernel to finish the kills) until group `pgid` is empty.
async fn assert_group_gone(pgid: i32) {
    assert!(pgid > 1, "bad pgid {pgid}");
    for _ in 0..50 {
        if live_members(pgid).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("processes left in group {pgid}: {:?}", live_members(pgid));
}

fn first_line_pid(output: &str) -> i32 {
    output.lines().next().unwrap().trim().parse().unwrap()
}

#[tokio::test]
async fn allowed_program_runs_with_quotes_respected() {
    let policy = policy(&["echo"]);
    let outcome = run(&policy, "echo \"a b\"  'c'", None).await.unwrap();
    assert_eq!(outcome.output, "a b c\n");
    assert_eq!(outcome.exit_code, Some(0));
    assert!(outcome.ok && !outcome.timeout && !outcome.truncated);
    assert_eq!(outcome.summary, "ok=true exit=0 timeout=false truncated=false\noutput:\na b c\n");
    let json = serde_json::to_value(&outcome).unwrap();
    assert_eq!(json["exit_code"], 0);
    // Shell syntax is just text without a shell.
    check_output(&policy, "echo $HOME; ls > x", "$HOME; ls > x\n").await;
}

#[tokio::test]
async fn refusals() {
    let echo_rm = policy_with(&["echo", "rm"], |s| s.deny_commands = vec!["rm".to_owned()]);
    check_refused(&echo_rm, "cat /etc/passwd", None, Refusal::NotAllowed("cat".to_owned())).await;
    check_refused(&echo_rm, "rm -rf /", None, Refusal::Denied("rm".to_owned())).await;
    check_refused(&echo_rm, "/bin/../usr/bin/rm x", None, Refusal::Denied("rm".to_owned())).await;
    check_refused(&echo_rm, "   ", None, Refusal::Empty).await;
    check_refused(
        &echo_rm,
        "echo \"a b",
        None,
        Refusal::Unparsable("unbalanced quotes or a trailing backslash".to_owned()),
    )
    .await;
    check_refused(&echo_rm, "ls", None, Refusal::NotAllowed("ls".to_owned())).await;
    let nothing_allowed = policy(&[]);
    check_refused(&nothing_allowed, "echo hi", None, Refusal::NotAllowed("echo".to_owned())).await;
}

#[tokio::test]
async fn a_path_runs_the_allowed_basename_from_the_fixed_path() {
    let policy = policy(&["echo"]);
    check_output(&policy, "/no/such/dir/echo hi", "hi\n").await;
    check_output(&policy, "./echo hi", "hi\n").await;
}

#[tokio::test]
async fn uninstalled_program_is_a_spawn_failure() {
    let policy = policy(&["toolhost-no-such-program"]);
    let err = run(&policy, "toolhost-no-such-program", None).await.unwrap_err();
    assert!(matches!(err, Refusal::SpawnFailed(_)), "{err:?}");
    assert!(!err.is_forbidden());
}

#[test]
fn refusal_texts_codes_and_summary() {
    let cases = [
        (Refusal::Empty, "command must be non-empty", false),
        (Refusal::Unparsable("x".into()), "command could not be parsed: x", false),
        (Refusal::NotAllowed("cat".into()), "Command 'cat' is not allowed", true),
        (Refusal::Denied("rm".into()), "Command 'rm' is denied by policy", true),
        (Refusal::CwdEscapes, "Working directory escapes sandbox root", true),
        (Refusal::CwdInvalid("x".into()), "Working directory is not usable: x", false),
        (Refusal::SpawnFailed("x".into()), "Command could not be started: x", false),
    ];
    let policy = policy(&[]);
    for (refusal, text, forbidden) in cases {
        assert_eq!(refusal.to_string(), text);
        assert_eq!(refusal.is_forbidden(), forbidden, "{refusal:?}");
        assert_eq!(
            refusal.summary(&policy),
            format!("ok=false exit=None timeout=false truncated=false\nerror:\n{text}")
        );
    }
    let short = policy_with(&[], |s| s.function_output_max_chars = 9);
    assert_eq!(
        Refusal::NotAllowed("é".into()).summary(&short),
        "ok=false exit=None timeout=false truncated=false\nerror:\nCommand '"
    );
}

#[tokio::test]
async fn sandbox_keeps_the_working_directory_inside() {
    let root = TempDir::new();
    let outside = TempDir::new();
    std::fs::create_dir(root.0.join("sub")).unwrap();
    std::fs::write(root.0.join("file"), "x").unwrap();
    std::os::unix::fs::symlink(&outside.0, root.0.join("link")).unwrap();
    let policy = policy_with(&["pwd"], |s| s.sandbox_cwd = Some(root.0.clone()));
    let root_text = root.0.display().to_string();
    check_output(&policy, "pwd", &format!("{root_text}\n")).await;
    let in_sub = run(&policy, "pwd", Some("sub")).await.unwrap();
    assert_eq!(in_sub.output, format!("{root_text}/sub\n"));
    let absolute_inside = run(&policy, "pwd", Some(&format!("{root_text}/sub"))).await.unwrap();
    assert_eq!(absolute_inside.output, format!("{root_text}/sub\n"));
    let outside_text = outside.0.display().to_string();
    for escape in ["..", "sub/../..", "../../../etc", "/", "/etc", &outside_text, "link", "link/."] {
        check_refused(&policy, "pwd", Some(escape), Refusal::CwdEscapes).await;
    }
    for unusable in ["missing", "file"] {
        let err = run(&policy, "pwd", Some(unusable)).await.unwrap_err();
        assert!(matches!(err, Refusal::CwdInvalid(_)), "{unusable}: {err:?}");
    }
}

#[tokio::test]
async fn without_sandbox_cwd_is_used_as_given() {
    let policy = policy(&["pwd"]);
    let at_root = run(&policy, "pwd", Some("/")).await.unwrap();
    assert_eq!(at_root.output, "/\n");
    let err = run(&policy, "pwd", Some("/toolhost/no/such/dir")).await.unwrap_err();
    assert!(matches!(err, Refusal::CwdInvalid(_)), "{err:?}");
}

#[tokio::test]
async fn environment_holds_only_path_and_lc_all() {
    let policy = policy(&["env"]);
    let outcome = run(&policy, "env", None).await.unwrap();
    let mut lines: Vec<&str> = outcome.output.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["LC_ALL=C", "PATH=/usr/bin:/bin:/usr/local/bin"]);
}

#[tokio::test]
async fn stdin_is_closed_and_stderr_shares_the_pipe() {
    // `cat` would wait forever on an open stdin.
    check_output(&policy(&["cat"]), "cat", "").await;
    check_output(&policy(&["sh"]), "sh -c 'echo out; echo err >&2; echo out2'", "out\nerr\nout2\n").await;
}

#[tokio::test]
async fn built_in_redaction() {
    let policy = policy(&["echo"]);
    let cases = [
        ("echo sk-abcdefghijklmnop1234", "[REDACTED]\n"),
        ("echo api_key=abc apikey:def", "api_key=[REDACTED] apikey:[REDACTED]\n"),
        ("echo 'Authorization: Basic dXNlcg=='", "Authorization: [REDACTED]\n"),
        ("echo token=t1 password=p2 secret=s3", "token=[REDACTED] password=[REDACTED] secret=[REDACTED]\n"),
        ("echo 'PASSWORD=p2'", "PASSWORD=[REDACTED]\n"),
        ("echo 'x Bearer abc.def-123 y'", "x Bearer [REDACTED] y\n"),
        ("echo eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln", "[REDACTED]\n"),
    ];
    for (command, expected) in cases {
        check_output(&policy, command, expected).await;
    }
}

#[tokio::test]
async fn configured_redaction_and_invalid_pattern_warning() {
    let settings = TerminalSettings {
        allowed_commands: vec!["echo".to_owned()],
        redact_substrings: vec!["hunter2".to_owned()],
        redact_patterns: vec!["acct-[0-9]+".to_owned(), "([unclosed".to_owned()],
        ..TerminalSettings::default()
    };
    let (policy, warnings) = TerminalPolicy::new(&settings);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("([unclosed"), "{warnings:?}");
    check_output(&policy, "echo hunter2 acct-42 ([unclosed", "[REDACTED] [REDACTED] ([unclosed\n").await;
}

#[tokio::test]
async fn flood_is_capped_and_times_out() {
    let policy = policy_with(&["yes"], |s| s.timeout_seconds = 1.0);
    let started = Instant::now();
    let outcome = run(&policy, "yes", None).await.unwrap();
    assert!(started.elapsed() < PROMPTLY, "{:?}", started.elapsed());
    assert!(outcome.timeout && outcome.truncated && !outcome.ok);
    assert_eq!(outcome.exit_code, None);
    assert_eq!(outcome.output.len(), 8192);
    assert!(outcome.summary.starts_with("ok=false exit=None timeout=true truncated=true\noutput:\ny\ny\n"));
    assert_eq!(outcome.summary.lines().skip(2).count(), 500);
}

#[tokio::test]
async fn timeout_kills_the_whole_group() {
    let policy = policy_with(&["sh"], |s| s.timeout_seconds = 1.0);
    let started = Instant::now();
    let outcome = run(&policy, "sh -c 'echo $$; sleep 30 & sleep 30'", None).await.unwrap();
    assert!(started.elapsed() < PROMPTLY, "{:?}", started.elapsed());
    assert!(outcome.timeout && !outcome.ok && !outcome.truncated);
    assert_eq!(outcome.exit_code, None);
    assert_group_gone(first_line_pid(&outcome.output)).await;
}

#[tokio::test]
async fn background_grandchild_does_not_outlive_a_normal_exit() {
    let policy = policy(&["sh"]);
    let started = Instant::now();
    let outcome = run(&policy, "sh -c 'echo $$; sleep 30 & echo done'", None).await.unwrap();
    assert!(started.elapsed() < PROMPTLY, "{:?}", started.elapsed());
    assert!(outcome.ok && !outcome.timeout, "{outcome:?}");
    assert!(outcome.output.ends_with("\ndone\n"), "{outcome:?}");
    assert_group_gone(first_line_pid(&outcome.output)).await;
}

#[tokio::test]
async fn cancelled_run_still_kills_the_group() {
    let dir = TempDir::new();
    let policy = policy_with(&["sh"], |s| s.sandbox_cwd = Some(dir.0.clone()));
    let call = run(&policy, "sh -c 'echo $$ > pid; sleep 30 & sleep 30'", None);
    let res = tokio::time::timeout(Duration::from_secs(2), call).await;
    assert!(res.is_err(), "the call should still be running: {res:?}");
    let pid_text = std::fs::read_to_string(dir.0.join("pid")).unwrap();
    assert_group_gone(first_line_pid(&pid_text)).await;
}

#[tokio::test]
async fn exit_codes_and_signals() {
    let policy = policy(&["sh", "false"]);
    let three = run(&policy, "sh -c 'echo bye; exit 3'", None).await.unwrap();
    assert_eq!((three.ok, three.exit_code, three.timeout), (false, Some(3), false));
    assert_eq!(three.summary, "ok=false exit=3 timeout=false truncated=false\noutput:\nbye\n");
    let one = run(&policy, "false", None).await.unwrap();
    assert_eq!((one.ok, one.exit_code), (false, Some(1)));
    let killed = run(&policy, "sh -c 'kill -9 $$'", None).await.unwrap();
    assert_eq!((killed.ok, killed.exit_code, killed.timeout), (false, None, false));
    assert!(killed.summary.starts_with("ok=false exit=None timeout=false truncated=false\n"));
}

#[tokio::test]
async fn summary_cuts_text_by_chars_and_cap_cuts_bytes() {
    let short = policy_with(&["echo"], |s| s.function_output_max_chars = 3);
    let outcome = run(&short, "echo héllo", None).await.unwrap();
    assert_eq!(outcome.output, "héllo\n");
    assert_eq!(outcome.summary, "ok=true exit=0 timeout=false truncated=false\noutput:\nhél");
    // `é€` is 5 bytes; 3 keep `é` and half of `€`, decoded lossily.
    let tiny_cap = policy_with(&["echo"], |s| s.output_cap_bytes = 3);
    let outcome = run(&tiny_cap, "echo é€", None).await.unwrap();
    assert!(outcome.truncated && outcome.ok);
    assert_eq!(outcome.output, "é\u{FFFD}");
}

#[tokio::test]
async fn file_size_limit_is_enforced() {
    let dir = TempDir::new();
    let policy = policy_with(&["dd"], |s| {
        s.sandbox_cwd = Some(dir.0.clone());
        s.file_size_bytes = Some(4096);
    });
    let outcome = run(&policy, "dd if=/dev/zero of=big bs=1000 count=100", None).await.unwrap();
    assert!(!outcome.ok, "{outcome:?}");
    let written = std::fs::metadata(dir.0.join("big")).unwrap().len();
    assert!(written <= 4096, "{written} bytes written");
}

#[tokio::test]
async fn cpu_limit_ends_a_busy_loop() {
    let policy = policy_with(&["sh"], |s| {
        s.cpu_seconds = Some(1);
        s.timeout_seconds = 60.0;
    });
    let started = Instant::now();
    let outcome = run(&policy, "sh -c 'while :; do :; done'", None).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(50), "{:?}", started.elapsed());
    // SIGXCPU ends it, well before the wall-clock timeout.
    assert_eq!((outcome.ok, outcome.exit_code, outcome.timeout), (false, None, false));
}

#[tokio::test]
async fn generous_limits_do_not_disturb_a_normal_run() {
    // RLIMIT_NPROC does not bind root, so only check that setting it works.
    let policy = policy_with(&["sh"], |s| {
        s.max_processes = Some(10_000);
        s.cpu_seconds = Some(60);
        s.file_size_bytes = Some(1 << 20);
    });
    check_output(&policy, "sh -c 'echo hi'", "hi\n").await;
}

#[test]
fn temp_dirs_are_unique_and_removed() {
    let first = TempDir::new();
    let second = TempDir::new();
    assert_ne!(first.0, second.0);
    let path: PathBuf = first.0.clone();
    drop(first);
    assert!(!Path::new(&path).exists());
}

#[tokio::test]
async fn refusals_name_no_host_path() {
    let root = TempDir::new();
    let sandbox = root.0.join("sandbox");
    std::fs::create_dir(&sandbox).unwrap();
    std::fs::write(sandbox.join("file"), "x").unwrap();
    let sandboxed =
        policy_with(&["pwd", "toolhost-no-such-program"], |s| s.sandbox_cwd = Some(sandbox.clone()));
    let plain = policy(&["pwd"]);
    let root_text = root.0.display().to_string();
    let mut refusals = vec![
        run(&sandboxed, "pwd", Some("missing/deeper")).await.unwrap_err(),
        run(&sandboxed, "pwd", Some("file")).await.unwrap_err(),
        run(&sandboxed, "toolhost-no-such-program", None).await.unwrap_err(),
        run(&plain, "pwd", Some("/toolhost/no/such/dir")).await.unwrap_err(),
    ];
    std::fs::remove_file(sandbox.join("file")).unwrap();
    std::fs::remove_dir(&sandbox).unwrap();
    refusals.push(run(&sandboxed, "pwd", None).await.unwrap_err());
    assert_eq!(
        refusals.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "Working directory is not usable: No such file or directory (os error 2)",
            "Working directory is not usable: not a directory",
            "Command could not be started: program 'toolhost-no-such-program' is not installed on this host",
            "Working directory is not usable: No such file or directory (os error 2)",
            "Working directory is not usable: the sandbox root is not available",
        ]
    );
    for refusal in &refusals {
        let text = refusal.to_string();
        assert!(!text.contains('/'), "{text}");
        assert!(!refusal.summary(&sandboxed).contains(&root_text), "{refusal:?}");
    }
}

#[tokio::test]
async fn host_secrets_are_redacted_from_output() {
    let policy = policy(&["echo"]).with_secrets(&["pw-7f3a9".to_owned()]);
    let outcome = run(&policy, "echo REDIS_URL=redis://:pw-7f3a9@10.0.0.1:6379 and pw-7f3a9 alone", None)
        .await
        .unwrap();
    assert_eq!(outcome.output, "REDIS_URL=redis://:[REDACTED]@10.0.0.1:6379 and [REDACTED] alone\n");
    assert!(!outcome.summary.contains("pw-7f3a9"));
}

/// Whether this test process is root, and so may switch users.
fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[tokio::test]
async fn commands_run_as_the_configured_identity_without_extra_groups() {
    let identity = Identity { uid: 65534, gid: 65534 };
    let policy = policy(&["id"]).with_identity(Some(identity));
    if !running_as_root() {
        // Only root may switch users; anything else must fail to start, never run as itself.
        let err = run(&policy, "id -u", None).await.unwrap_err();
        assert!(matches!(err, Refusal::SpawnFailed(_)), "{err:?}");
        return;
    }
    let user = run(&policy, "id -u", None).await.unwrap();
    assert_eq!(user.output, "65534\n");
    let group = run(&policy, "id -g", None).await.unwrap();
    assert_eq!(group.output, "65534\n");
    // Root's supplementary groups are not kept.
    let groups = run(&policy, "id -G", None).await.unwrap();
    assert_eq!(groups.output, "65534\n");
}
