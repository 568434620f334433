//! Running one checked command: its own session and process group, stdin from
//! `/dev/null` (or the bytes a [`Spec`] gives, written while the command runs), a
//! replaced environment, optional rlimits, stdout and stderr on one pipe (or stderr
//! apart, its last bytes kept) read incrementally under a byte cap, and a
//! wall-clock timeout that kills the whole group.
//!
//! The group is killed in every way the call can end: on timeout, after the
//! main child exits (so background grandchildren do not outlive the call), and
//! by [`GroupGuard`]'s `Drop` when the future is cancelled.

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, setsid};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe::Receiver;
use tokio::process::{Child, ChildStdin, Command};

use super::Refusal;
use super::identity::Identity;
use super::parse::{FIXED_PATH, ParsedCommand};

/// How long to keep reading after the group was killed, waiting for end of
/// file. Only a process that left the group (and so survived the kill) can
/// hold the pipe open longer; its output is then abandoned.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// How long to wait for a SIGKILLed child to be reaped before leaving it to
/// tokio's background orphan reaping.
const REAP_GRACE: Duration = Duration::from_secs(5);

/// Size of one read from the output pipe.
const CHUNK_BYTES: usize = 8192;

/// Everything needed to start one command.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Absolute path of the program, resolved through [`FIXED_PATH`].
    pub program: PathBuf,
    /// The checked command: `argv[0]` and the arguments.
    pub parsed: ParsedCommand,
    /// Working directory; `None` inherits the daemon's.
    pub cwd: Option<PathBuf>,
    /// Resource limits applied in the child before exec.
    pub limits: Limits,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// Bytes of output kept.
    pub output_cap_bytes: usize,
    /// The user and group the command runs as; `None` runs it as this process.
    pub identity: Option<Identity>,
    /// Bytes written to the command's stdin, which is then closed; `None`: `/dev/null`.
    pub stdin: Option<Vec<u8>>,
    /// `Some(cap)`: stderr goes to a pipe of its own, of which the last `cap` bytes are kept in
    /// [`Execution::stderr`]; `None`: it shares the output pipe with stdout.
    pub stderr_tail_bytes: Option<usize>,
    /// Variables set beside `PATH` and `LC_ALL` (a command tool's `TRACEPARENT`).
    pub env: Vec<(&'static str, String)>,
}

/// Optional rlimits; each is set as both soft and hard limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    /// `RLIMIT_NPROC`.
    pub max_processes: Option<u64>,
    /// `RLIMIT_CPU`, in seconds.
    pub cpu_seconds: Option<u64>,
    /// `RLIMIT_FSIZE`, in bytes.
    pub file_size_bytes: Option<u64>,
}

/// What happened to a command that was started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// Exit code; `None` after a timeout or when a signal ended the child.
    pub exit_code: Option<i32>,
    /// Whether the wall-clock limit was hit.
    pub timeout: bool,
    /// Whether output beyond the cap was discarded.
    pub truncated: bool,
    /// At most `output_cap_bytes` of stdout, with stderr unless it was kept apart.
    pub output: Vec<u8>,
    /// The last bytes of stderr when [`Spec::stderr_tail_bytes`] kept it apart; else empty.
    pub stderr: Vec<u8>,
}

/// Starts the command and waits for it, its output and its group.
///
/// This is the engine other hosted children can reuse: a [`Spec`] says what to run and as
/// whom, and nothing here knows about the terminal policy.
///
/// # Errors
///
/// [`Refusal::SpawnFailed`] if the pipe cannot be made or the program cannot start.
///
/// # Cancel safety
///
/// Dropping the future kills the whole process group (see [`GroupGuard`]).
pub async fn execute(spec: &Spec) -> Result<Execution, Refusal> {
    let (mut child, mut pipes) = spawn(spec)?;
    let mut guard = GroupGuard::new(&child)?;
    let mut output = Capture::new(spec.output_cap_bytes, Keep::Head);
    let mut stderr = Capture::new(spec.stderr_tail_bytes.unwrap_or(0), Keep::Tail);
    let feed = feed(pipes.stdin.take(), spec.stdin.clone().unwrap_or_default());
    let ended = supervise(&mut child, &mut pipes, [&mut output, &mut stderr], feed, spec.timeout).await;
    // Kill whatever is left of the group, including background grandchildren,
    // before draining, so nothing can keep writing to (or holding) the pipes.
    guard.kill_and_disarm();
    drain(&mut pipes, [&mut output, &mut stderr]).await;
    let exit_code = match ended {
        Ended::Exited(status) => status.code(),
        Ended::TimedOut | Ended::WaitFailed => {
            reap(&mut child).await;
            None
        }
    };
    Ok(Execution {
        exit_code,
        timeout: matches!(ended, Ended::TimedOut),
        truncated: output.truncated,
        output: output.kept,
        stderr: stderr.kept,
    })
}

/// The parent's ends of the command's pipes.
#[derive(Debug)]
struct Pipes {
    /// Stdout, with stderr unless that has its own pipe.
    output: Receiver,
    /// Stderr, when it is kept apart.
    stderr: Option<Receiver>,
    /// Stdin, when the spec gives bytes for it.
    stdin: Option<ChildStdin>,
}

impl Pipes {
    /// The open read ends, output first.
    fn readers(&mut self) -> [Option<&mut Receiver>; 2] {
        [Some(&mut self.output), self.stderr.as_mut()]
    }
}

/// Writes `bytes` to the command's stdin and closes it. A command that exits or closes its
/// stdin without reading everything is not an error: the rest is dropped.
async fn feed(stdin: Option<ChildStdin>, bytes: Vec<u8>) {
    if let Some(mut stdin) = stdin {
        let _ = stdin.write_all(&bytes).await;
    }
}

/// How the main child's run ended.
#[derive(Debug)]
enum Ended {
    /// It exited (and was reaped) with this status.
    Exited(ExitStatus),
    /// The wall-clock limit passed first.
    TimedOut,
    /// Waiting for it failed; it is treated like an abnormal end.
    WaitFailed,
}

/// Builds the command, with both output streams on one pipe unless stderr is kept apart, and
/// starts it.
fn spawn(spec: &Spec) -> Result<(Child, Pipes), Refusal> {
    let spawn_failed = |err: io::Error| Refusal::SpawnFailed(err.to_string());
    let receiver = |reader: io::PipeReader| Receiver::from_owned_fd(OwnedFd::from(reader));
    // One pipe for both streams keeps their output interleaved as produced.
    let (reader, writer) = io::pipe().map_err(spawn_failed)?;
    let (stderr, stderr_writer) = match spec.stderr_tail_bytes {
        Some(_) => {
            let (reader, writer) = io::pipe().map_err(spawn_failed)?;
            (Some(receiver(reader).map_err(spawn_failed)?), writer)
        }
        None => (None, writer.try_clone().map_err(spawn_failed)?),
    };
    let output = receiver(reader).map_err(spawn_failed)?;
    let mut command = Command::new(&spec.program);
    command
        .arg0(&spec.parsed.name)
        .args(&spec.parsed.args)
        .env_clear()
        .env("PATH", FIXED_PATH)
        .env("LC_ALL", "C")
        .envs(spec.env.iter().map(|(name, value)| (*name, value.as_str())))
        .stdin(if spec.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(writer)
        .stderr(stderr_writer)
        .kill_on_drop(false);
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    if let Some(identity) = spec.identity {
        // In the child the standard library calls setgroups(0) (when this process is root, as it
        // must be to switch), then setgid, then setuid, all before it enters the working
        // directory and runs `install_pre_exec`'s closure: the command keeps no supplementary
        // group of ours, and the directory is entered with the command's own rights.
        command.uid(identity.uid).gid(identity.gid);
    }
    install_pre_exec(&mut command, spec.limits);
    let mut child = command.spawn().map_err(spawn_failed)?;
    // `command` still holds our copies of the pipes' write ends; it must be
    // dropped now, or end of file could never be seen.
    drop(command);
    let stdin = child.stdin.take();
    Ok((child, Pipes { output, stderr, stdin }))
}

/// Makes the child a session (and process group) leader and applies the rlimits.
// `pre_exec` is the one call here with no safe wrapper.
#[allow(unsafe_code)]
pub(super) fn install_pre_exec(command: &mut Command, limits: Limits) {
    let enter_sandbox = move || -> io::Result<()> {
        setsid()?;
        let wanted = [
            (Resource::RLIMIT_NPROC, limits.max_processes),
            (Resource::RLIMIT_CPU, limits.cpu_seconds),
            (Resource::RLIMIT_FSIZE, limits.file_size_bytes),
        ];
        for (resource, value) in wanted {
            let Some(value) = value else { continue };
            setrlimit(resource, value, value)?;
        }
        Ok(())
    };
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe functions may be used. It calls only setsid and
    // setrlimit (nix's thin wrappers of the plain system calls) and reads errno;
    // it allocates nothing and takes no locks.
    unsafe {
        command.pre_exec(enter_sandbox);
    }
}

/// Reads output and feeds stdin until the child exits or the timeout passes.
async fn supervise(
    child: &mut Child,
    pipes: &mut Pipes,
    captures: [&mut Capture; 2],
    feed: impl Future<Output = ()>,
    timeout: Duration,
) -> Ended {
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    tokio::pin!(feed);
    let mut feeding = true;
    let [mut output, mut stderr] = pipes.readers();
    let [output_capture, stderr_capture] = captures;
    let mut chunk = vec![0_u8; CHUNK_BYTES];
    let mut stderr_chunk = vec![0_u8; CHUNK_BYTES];
    // Not `biased`: a flooding child keeps the pipe always readable, and the
    // deadline must still get its turn.
    loop {
        tokio::select! {
            res = read_some(&mut output, &mut chunk), if output.is_some() => match res {
                Some(n_read) => output_capture.push(&chunk[..n_read]),
                None => output = None,
            },
            res = read_some(&mut stderr, &mut stderr_chunk), if stderr.is_some() => match res {
                Some(n_read) => stderr_capture.push(&stderr_chunk[..n_read]),
                None => stderr = None,
            },
            () = &mut feed, if feeding => feeding = false,
            status = child.wait() => return match status {
                Ok(status) => Ended::Exited(status),
                Err(err) => {
                    tracing::warn!(error = %err, "waiting for a command failed");
                    Ended::WaitFailed
                }
            },
            () = &mut deadline => return Ended::TimedOut,
        }
    }
}

/// Reads once from an open pipe: the count read, or `None` at end of file or on an error.
async fn read_some(receiver: &mut Option<&mut Receiver>, chunk: &mut [u8]) -> Option<usize> {
    let receiver = receiver.as_mut()?;
    match receiver.read(chunk).await {
        Ok(0) | Err(_) => None,
        Ok(n_read) => Some(n_read),
    }
}

/// Reads what is left in the pipes, until end of file or [`DRAIN_GRACE`].
async fn drain(pipes: &mut Pipes, captures: [&mut Capture; 2]) {
    let read_to_end = async {
        for (receiver, capture) in pipes.readers().into_iter().zip(captures) {
            let Some(receiver) = receiver else { continue };
            let mut chunk = vec![0_u8; CHUNK_BYTES];
            while let Ok(n_read @ 1..) = receiver.read(&mut chunk).await {
                capture.push(&chunk[..n_read]);
            }
        }
    };
    // Hitting the grace period means a process outside the group holds a
    // pipe; its further output is not ours to wait for.
    let _ = tokio::time::timeout(DRAIN_GRACE, read_to_end).await;
}

/// Reaps a child that was killed, so it does not stay a zombie.
async fn reap(child: &mut Child) {
    match tokio::time::timeout(REAP_GRACE, child.wait()).await {
        Ok(Ok(_)) => {}
        Ok(Err(err)) => tracing::warn!(error = %err, "reaping a terminal command failed"),
        Err(_) => tracing::warn!("a killed terminal command was not reaped in time"),
    }
}

/// Which bytes a [`Capture`] keeps when there are more than its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// The first ones (the output: what a command printed first explains the rest).
    Head,
    /// The last ones (stderr: the error a command ends with is the one that matters).
    Tail,
}

/// Output kept under a byte cap; bytes beyond it are counted as truncation.
#[derive(Debug)]
struct Capture {
    /// At most `cap` bytes.
    kept: Vec<u8>,
    /// Most bytes kept.
    cap: usize,
    /// Which bytes are kept.
    keep: Keep,
    /// Whether any byte was discarded.
    truncated: bool,
}

impl Capture {
    fn new(cap: usize, keep: Keep) -> Self {
        Capture { kept: Vec::with_capacity(cap.min(64 * 1024)), cap, keep, truncated: false }
    }

    fn push(&mut self, bytes: &[u8]) {
        let room = self.cap.saturating_sub(self.kept.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        match self.keep {
            Keep::Head => self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]),
            Keep::Tail => {
                let bytes = &bytes[bytes.len().saturating_sub(self.cap)..];
                let excess = (self.kept.len() + bytes.len()).saturating_sub(self.cap);
                self.kept.drain(..excess);
                self.kept.extend_from_slice(bytes);
            }
        }
    }
}

/// Kills the child's process group when dropped, unless disarmed.
///
/// The child is a session leader, so its pid is the group id. Disarming after
/// the explicit kill avoids signalling a group id the kernel may have reused
/// once every member has been reaped.
#[derive(Debug)]
pub struct GroupGuard {
    /// Process group id of the command.
    pgid: Pid,
    /// Whether `Drop` still has to kill the group.
    armed: bool,
}

impl GroupGuard {
    fn new(child: &Child) -> Result<Self, Refusal> {
        let pgid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| Refusal::SpawnFailed("the child has no process id".to_owned()))?;
        Ok(GroupGuard { pgid, armed: true })
    }

    fn kill_and_disarm(&mut self) {
        kill_group(self.pgid);
        self.armed = false;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            kill_group(self.pgid);
        }
    }
}

/// Sends SIGKILL to every process in group `pgid`; a group already gone is fine.
pub(super) fn kill_group(pgid: Pid) {
    // A pgid of 0 or less would address our own group or every process.
    if pgid.as_raw() <= 0 {
        return;
    }
    // An error means the group is gone (or was never ours to signal): nothing to kill.
    let _ = killpg(pgid, Signal::SIGKILL);
}

#[cfg(test)]
// A failed unwrap is a test failure with a clear message; that is what tests want.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_at_most_cap_bytes() {
        let mut capture = Capture::new(5, Keep::Head);
        capture.push(b"abc");
        assert!(!capture.truncated);
        capture.push(b"de");
        assert!(!capture.truncated);
        capture.push(b"f");
        assert!(capture.truncated);
        assert_eq!(capture.kept, b"abcde");
        let mut zero = Capture::new(0, Keep::Head);
        zero.push(b"");
        assert!(!zero.truncated);
        zero.push(b"x");
        assert!(zero.truncated && zero.kept.is_empty());
    }

    #[test]
    fn a_tail_capture_keeps_the_last_cap_bytes() {
        let mut capture = Capture::new(5, Keep::Tail);
        capture.push(b"abc");
        capture.push(b"de");
        assert!(!capture.truncated);
        capture.push(b"fg");
        assert_eq!(capture.kept, b"cdefg");
        capture.push(b"0123456789");
        assert!(capture.truncated);
        assert_eq!(capture.kept, b"56789");
    }

    #[test]
    fn nonpositive_groups_are_never_signalled() {
        // Would kill the test runner's own group or everything if not guarded.
        kill_group(Pid::from_raw(0));
        kill_group(Pid::from_raw(-1));
    }
}
