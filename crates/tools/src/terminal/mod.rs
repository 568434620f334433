//! The `terminal_run` execution engine (CONTRACTS.md section 6): runs one
//! allowed command without a shell and returns its capped, redacted output.
//!
//! This is a pure library: no `Tool` trait, no Redis, no environment reading.
//! The tool wrapper builds a [`TerminalPolicy`] once from [`TerminalSettings`],
//! logs the warnings, limits concurrency with `max_concurrent`, and calls [`run`].
//!
//! Decisions:
//!
//! - **Program rule.** The command is split into words like a shell would
//!   (`shlex`), but never run by one. The program is the basename of the first
//!   word; deny is checked before allow. A first word that is a path is
//!   reduced to its basename and the program is then looked up by that
//!   basename in the fixed `PATH` (`/usr/bin:/bin:/usr/local/bin`), so
//!   `/tmp/evil/ls` runs the system `ls`, never a file the model placed or
//!   named itself, and `/bin/../usr/bin/rm` is checked (and refused) as `rm`.
//! - **Working directory.** With a sandbox, `cwd` is relative to the sandbox
//!   root, defaults to it, and must resolve (symlinks followed) inside it.
//!   Without one, `cwd` must be an existing directory, and the default is the
//!   daemon's own working directory.
//! - **Summary cut.** Only the text after `output:` / `error:` is cut to
//!   `function_output_max_chars` characters (on a char boundary); the status
//!   line is always whole. [`RunOutcome::output`] holds the uncut (but capped
//!   and redacted) text.
//! - **SpawnFailed** is not forbidden ([`Refusal::is_forbidden`] is false): the
//!   command passed the policy but the host could not start it (program not
//!   installed, fork failure). The wrapper should answer `tool_failed`; the
//!   other non-forbidden refusals are `invalid_arguments`.
//! - **Redaction after the cap.** The byte cap is applied first, so a secret
//!   cut in half by the cap may escape the built-in patterns; the part that
//!   survives is shorter than the whole secret.
//!
//! - **No host paths in refusals.** A refusal's text reaches the caller, so it
//!   never names a host path (the sandbox root, a resolved working directory,
//!   the directories searched for a program); those go to the log.
//! - **Identity.** With [`TerminalPolicy::with_identity`], the command runs as
//!   that user and group, with no supplementary groups, so it cannot read the
//!   host process's files or `/proc/<pid>/environ`. The working directory is
//!   entered as that user, so it must be reachable by it.
//!
//! The process runs in its own session and process group with stdin from
//! `/dev/null` and only `PATH` and `LC_ALL=C` in its environment; see the
//! `exec` module for how the group is killed on timeout, after exit and on
//! cancellation.

pub mod access;
pub(crate) mod exec;
mod identity;
pub(crate) mod parse;
mod policy;
pub(crate) mod redact;
mod summary;
#[cfg(test)]
// A failed unwrap is a test failure with a clear message; that is what tests want.
#[allow(clippy::unwrap_used)]
mod tests;

use std::time::Instant;

use serde::Serialize;

pub use exec::Limits;
pub use identity::{DEFAULT_RUN_AS, Identity, resolve_run_as};
pub use parse::FIXED_PATH;
pub use policy::{TerminalPolicy, TerminalSettings};
pub use redact::Redactor;

impl Limits {
    /// The rlimits of `settings` (`max_processes`, `cpu_seconds`, `file_size_bytes`).
    pub fn from_settings(settings: &TerminalSettings) -> Limits {
        Limits {
            max_processes: settings.max_processes,
            cpu_seconds: settings.cpu_seconds,
            file_size_bytes: settings.file_size_bytes,
        }
    }
}

/// Makes `command` start the way terminal commands start: in a session and process group of
/// its own (its pid is the group id), under `limits`, and as `identity` when one is given (the
/// resolved `run_as` of a daemon started as root). For other hosts of child processes (MCP
/// servers), which choose their own program, arguments, environment and stdio.
pub fn confine(command: &mut tokio::process::Command, limits: Limits, identity: Option<Identity>) {
    if let Some(identity) = identity {
        // As for terminal commands: setgroups(0), setgid, setuid in the child, before the
        // working directory is entered and the rlimits are set.
        command.uid(identity.uid).gid(identity.gid);
    }
    exec::install_pre_exec(command, limits);
}

/// Sends SIGKILL to every process in the group a [`confine`]d child leads (its pid); a group
/// that is gone already, and a pid of 0 or one that does not fit a `pid_t`, are ignored.
pub fn kill_group(pid: u32) {
    if let Ok(pgid) = i32::try_from(pid) {
        exec::kill_group(nix::unistd::Pid::from_raw(pgid));
    }
}

/// Why a command was not run. Each variant maps to one error code (see
/// [`Refusal::is_forbidden`]).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The command is empty or only whitespace (`invalid_arguments`).
    #[error("command must be non-empty")]
    Empty,
    /// The command cannot be split into words, e.g. unbalanced quotes (`invalid_arguments`).
    #[error("command could not be parsed: {0}")]
    Unparsable(String),
    /// The program is not on the allow list (`forbidden`).
    #[error("Command '{0}' is not allowed")]
    NotAllowed(String),
    /// The program is on the deny list (`forbidden`).
    #[error("Command '{0}' is denied by policy")]
    Denied(String),
    /// The working directory resolves outside the sandbox root (`forbidden`).
    #[error("Working directory escapes sandbox root")]
    CwdEscapes,
    /// The working directory does not exist or is not a directory (`invalid_arguments`).
    #[error("Working directory is not usable: {0}")]
    CwdInvalid(String),
    /// The allowed program could not be started, e.g. it is not installed
    /// (not forbidden; the wrapper should answer `tool_failed`).
    #[error("Command could not be started: {0}")]
    SpawnFailed(String),
}

impl Refusal {
    /// Whether this refusal is a policy decision (`forbidden`) rather than bad
    /// input or a host failure.
    pub fn is_forbidden(&self) -> bool {
        matches!(self, Refusal::NotAllowed(_) | Refusal::Denied(_) | Refusal::CwdEscapes)
    }

    /// Model-facing text: `ok=false exit=None timeout=false truncated=false\nerror:\n<reason>`,
    /// the reason cut to the policy's character cap.
    pub fn summary(&self, policy: &TerminalPolicy) -> String {
        let max_chars = policy.settings().function_output_max_chars;
        summary::summary(false, None, false, false, "error", &self.to_string(), max_chars)
    }
}

/// The result of a command that was started; a non-zero exit or a timeout is
/// still a `RunOutcome`, with `ok: false`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunOutcome {
    /// True iff the command exited with code 0 before the timeout.
    pub ok: bool,
    /// Exit code; `None` after a timeout or when a signal ended the command.
    pub exit_code: Option<i32>,
    /// Whether the wall-clock limit was hit (the process group was killed).
    pub timeout: bool,
    /// Whether output beyond `output_cap_bytes` was discarded.
    pub truncated: bool,
    /// Wall-clock time from start to the end of output collection.
    pub duration_ms: u64,
    /// Combined stdout and stderr: capped, decoded as lossy UTF-8, redacted.
    pub output: String,
    /// Model-facing summary, the output cut to `function_output_max_chars` characters.
    pub summary: String,
}

/// Checks policy, spawns, captures.
///
/// # Errors
///
/// A [`Refusal`] when the command breaks the policy or cannot be started.
/// Once the command has started, every ending is `Ok`.
///
/// # Cancel safety
///
/// If the future is dropped, the command's whole process group is still killed
/// (a guard's `Drop` does it); the child is then reaped by tokio in the background.
pub async fn run(policy: &TerminalPolicy, command: &str, cwd: Option<&str>) -> Result<RunOutcome, Refusal> {
    let settings = policy.settings();
    let parsed = parse::parse_command(settings, command)?;
    let cwd = parse::resolve_cwd(settings, cwd)?;
    let program = parse::resolve_program(&parsed.name)?;
    let spec = exec::Spec {
        program,
        parsed,
        cwd,
        limits: policy.limits(),
        timeout: policy.timeout(),
        output_cap_bytes: settings.output_cap_bytes,
        identity: policy.identity(),
        stdin: None,
        stderr_tail_bytes: None,
        env: Vec::new(),
    };
    let started = Instant::now();
    let execution = exec::execute(&spec).await?;
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let output = policy.redactor().redact(&String::from_utf8_lossy(&execution.output));
    let ok = execution.exit_code == Some(0) && !execution.timeout;
    let summary = summary::summary(
        ok,
        execution.exit_code,
        execution.timeout,
        execution.truncated,
        "output",
        &output,
        settings.function_output_max_chars,
    );
    Ok(RunOutcome {
        ok,
        exit_code: execution.exit_code,
        timeout: execution.timeout,
        truncated: execution.truncated,
        duration_ms,
        output,
        summary,
    })
}
