//! A stdio MCP server as a managed child process.
//!
//! The child starts through the terminal engine's [`confine`]: a session and process group of
//! its own (its pid is the group id) under the terminal tool's rlimits, as its `run_as` user
//! when the daemon runs as root. Its environment is
//! cleared; only `PATH`, `HOME` and `LANG` from the daemon's environment map and the configured
//! `env` reach it. Stdin and stdout carry MCP; stderr goes to the log, line by line, at most
//! [`STDERR_BURST`] lines at once and [`STDERR_LINES_PER_SECOND`] a second after that, with a
//! count of the lines left out.
//!
//! Ending: [`ManagedChild::kill_and_wait`] kills the whole group and waits for the child,
//! explicitly. Grandchildren in the group (a `uvx` or `npx` wrapper's server, a shell pipeline)
//! are reparented when their parent dies: to init, which reaps them, or to this process when it
//! is PID 1 in a container without an init, or a subreaper. Those that became ours are reaped
//! too, by pid, so none stays a zombie; tokio's own reaping, which waits only for the pids it
//! spawned, is not disturbed. If a `ManagedChild` is dropped without it (a task aborted while the runtime
//! stops), its `Drop` still kills the group, synchronously, with no task to spawn; tokio then
//! reaps the child in the background.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::time::Instant;
use toolhost_tools::terminal::{Identity, Limits, confine, kill_group};

use crate::config::Secret;

/// Variables of the daemon's environment that reach every child.
pub const INHERITED_VARIABLES: [&str; 3] = ["PATH", "HOME", "LANG"];
/// Stderr lines logged at once before the rate applies.
pub const STDERR_BURST: u32 = 50;
/// Stderr lines logged per second after a burst.
pub const STDERR_LINES_PER_SECOND: u32 = 10;
/// Longest stderr line logged; longer lines are cut.
const STDERR_LINE_CHARS: usize = 2000;
/// How long to wait for a killed child to be reaped before giving up on it (it stays in the
/// kernel's hands only if it is stuck in uninterruptible sleep).
const REAP_GRACE: Duration = Duration::from_secs(10);

/// What starts one stdio server.
#[derive(Debug, Clone)]
pub struct ChildSpec<'a> {
    /// The source's name, for log lines.
    pub source: &'a str,
    /// The program.
    pub command: &'a str,
    /// Its arguments.
    pub args: &'a [String],
    /// The configured environment.
    pub env: &'a BTreeMap<String, Secret>,
    /// The working directory.
    pub cwd: Option<&'a PathBuf>,
    /// The daemon's environment, for `PATH`, `HOME` and `LANG`.
    pub base_env: &'a BTreeMap<String, String>,
    /// The terminal tool's rlimits.
    pub limits: Limits,
    /// The terminal tool's `run_as` identity, when the daemon runs as root.
    pub identity: Option<Identity>,
}

/// A running stdio server, its group killed when it ends.
#[derive(Debug)]
pub struct ManagedChild {
    child: Child,
    /// The child's pid, which is its process group's id; `None` once the group was killed.
    group: Option<u32>,
    /// The pid, kept after the child was reaped (tokio forgets it then).
    pid_at_spawn: Option<u32>,
}

/// The started child and its MCP pipes.
pub type Started = (ManagedChild, ChildStdout, ChildStdin);

impl ManagedChild {
    /// Starts the server.
    ///
    /// # Errors
    /// The program could not be started.
    pub fn spawn(spec: &ChildSpec<'_>) -> io::Result<Started> {
        let mut command = Command::new(spec.command);
        command.args(spec.args).env_clear();
        for name in INHERITED_VARIABLES {
            if let Some(value) = spec.base_env.get(name) {
                command.env(name, value);
            }
        }
        for (name, value) in spec.env {
            command.env(name, value.expose());
        }
        if let Some(cwd) = spec.cwd {
            command.current_dir(cwd);
        }
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(false);
        confine(&mut command, spec.limits, spec.identity);
        let mut child = command.spawn()?;
        let group = child.id();
        let missing = || io::Error::other("the child's pipes were not set up");
        let stdin = child.stdin.take().ok_or_else(missing)?;
        let stdout = child.stdout.take().ok_or_else(missing)?;
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(log_stderr(spec.source.to_owned(), stderr));
        }
        Ok((ManagedChild { child, group, pid_at_spawn: group }, stdout, stdin))
    }

    /// The child's pid (its process group's id), while it has not been killed.
    pub fn pid(&self) -> Option<u32> {
        self.group
    }

    /// Waits until the child exits.
    pub async fn exited(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Kills the child's whole process group and waits for the child, so none stays a zombie.
    pub async fn kill_and_wait(mut self, source: &str) {
        if let Some(group) = self.group.take() {
            // A leader already reaped (it exited by itself) with no member left: its pid is free
            // for reuse, so nothing is signalled.
            let gone = matches!(self.child.try_wait(), Ok(Some(_))) && group_members(group).is_empty();
            if !gone {
                kill_group(group);
            }
        }
        match tokio::time::timeout(REAP_GRACE, self.child.wait()).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => tracing::warn!(source, error = %err, "reaping an MCP server failed"),
            Err(_) => tracing::warn!(source, "a killed MCP server was not reaped in time"),
        }
        if let Some(pid) = self.pid_at_spawn {
            reap_orphans(source, pid).await;
        }
    }
}

/// How long to wait for the killed members of a group to die and be reparented.
const ORPHAN_GRACE: Duration = Duration::from_secs(5);
/// How often the group is looked at meanwhile (reparenting sends no event of its own).
const ORPHAN_POLL: Duration = Duration::from_millis(20);

/// Reaps every member of group `pgid` that became this process's child; returns when no member
/// is ours or alive, or after [`ORPHAN_GRACE`].
async fn reap_orphans(source: &str, pgid: u32) {
    let me = std::process::id();
    let deadline = Instant::now() + ORPHAN_GRACE;
    loop {
        let members = group_members(pgid);
        let mut waiting = false;
        for member in &members {
            if member.parent == me {
                reap(member.pid);
                waiting = true;
            } else if member.state != 'Z' {
                // Still dying, or not yet reparented.
                waiting = true;
            }
        }
        if !waiting {
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                source,
                pgid,
                members = members.len(),
                "members of a killed MCP server's group linger"
            );
            return;
        }
        tokio::time::sleep(ORPHAN_POLL).await;
    }
}

/// One process of a group, from `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Member {
    pid: u32,
    parent: u32,
    state: char,
}

/// The processes whose process group is `pgid`.
fn group_members(pgid: u32) -> Vec<Member> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let (state, parent, group) = parse_stat(&stat)?;
            (group == pgid).then_some(Member { pid, parent, state })
        })
        .collect()
}

/// State, parent pid and process group of a `/proc/<pid>/stat` line.
fn parse_stat(stat: &str) -> Option<(char, u32, u32)> {
    // The command sits in parentheses and may hold spaces or parentheses itself.
    let after = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = after.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    let group = fields.next()?.parse().ok()?;
    Some((state, parent, group))
}

/// Collects the exit status of our child `pid` if it has ended, without blocking.
fn reap(pid: u32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    // `pid` is a process reparented to us that tokio did not spawn, so no tokio handle waits on
    // it; its status is of no interest, and an error means it is not ours to reap.
    let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
}

impl Drop for ManagedChild {
    fn drop(&mut self) {
        if let Some(group) = self.group.take() {
            kill_group(group);
        }
    }
}

/// Logs the child's stderr lines under a rate limit, counting the lines left out.
async fn log_stderr(source: String, stderr: ChildStderr) {
    let mut lines = BufReader::new(stderr).lines();
    let mut limiter = RateLimit::new(STDERR_BURST, STDERR_LINES_PER_SECOND);
    while let Ok(Some(line)) = lines.next_line().await {
        if let Admitted::Yes { skipped } = limiter.admit(Instant::now()) {
            let line: String = line.chars().take(STDERR_LINE_CHARS).collect();
            if skipped > 0 {
                tracing::warn!(source = %source, skipped, "MCP server stderr lines were left out of the log");
            }
            tracing::info!(source = %source, line = %line, "MCP server stderr");
        }
    }
    if limiter.skipped > 0 {
        tracing::warn!(source = %source, skipped = limiter.skipped, "MCP server stderr lines were left out of the log");
    }
}

/// A token bucket: `burst` lines at once, `per_second` after that.
#[derive(Debug)]
struct RateLimit {
    tokens: f64,
    burst: f64,
    per_second: f64,
    last: Option<Instant>,
    /// Lines refused since the last admitted one.
    skipped: u64,
}

#[derive(Debug, PartialEq, Eq)]
enum Admitted {
    /// Log it, and say first how many lines were left out before it.
    Yes { skipped: u64 },
    /// Leave it out.
    No,
}

impl RateLimit {
    fn new(burst: u32, per_second: u32) -> RateLimit {
        RateLimit {
            tokens: f64::from(burst),
            burst: f64::from(burst),
            per_second: f64::from(per_second),
            last: None,
            skipped: 0,
        }
    }

    fn admit(&mut self, now: Instant) -> Admitted {
        if let Some(last) = self.last {
            let earned = now.saturating_duration_since(last).as_secs_f64() * self.per_second;
            self.tokens = (self.tokens + earned).min(self.burst);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Admitted::Yes { skipped: std::mem::take(&mut self.skipped) }
        } else {
            self.skipped += 1;
            Admitted::No
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_state_parent_and_group_even_with_odd_commands() {
        let stat = "4242 (node (worker) x) Z 17 4240 4240 0 -1 4194560 0";
        assert_eq!(parse_stat(stat), Some(('Z', 17, 4240)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn stderr_lines_past_the_burst_are_left_out_until_the_rate_refills_and_then_counted() {
        let mut limit = RateLimit::new(3, 2);
        let start = Instant::now();
        for _ in 0..3 {
            assert_eq!(limit.admit(start), Admitted::Yes { skipped: 0 });
        }
        assert_eq!(limit.admit(start), Admitted::No);
        assert_eq!(limit.admit(start), Admitted::No);
        // Half a second at 2 lines a second earns one line, which reports the two left out.
        assert_eq!(limit.admit(start + Duration::from_millis(500)), Admitted::Yes { skipped: 2 });
        assert_eq!(limit.admit(start + Duration::from_millis(500)), Admitted::No);
        // The bucket never holds more than the burst.
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(matches!(limit.admit(later), Admitted::Yes { .. }));
        }
        assert_eq!(limit.admit(later), Admitted::No);
    }
}
