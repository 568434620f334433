//! Starting and stopping the workers under test, and knowing when they are ready.
//!
//! A worker is ready when it reads `action-requests` through a consumer group: from then
//! on a request gets read. `toolhost serve` (current and baseline builds) and both reference
//! workers are spawned as processes with their output sent to a log file, and killed on drop.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use redis::AsyncCommands as _;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamInfoGroupsReply;
use tokio::process::{Child, Command};

use crate::envelope::REQUESTS_STREAM;

/// How long a target may take to become ready before it counts as failed.
pub const READY_LIMIT: Duration = Duration::from_secs(30);

/// Which worker a target is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Worker {
    /// `toolhost-refworker`: the at-least-once reference.
    Reference,
    /// `toolhost-refworker --exactly-once`: the exactly-once floor.
    Floor,
    /// `toolhost serve`.
    Toolhost,
    /// `toolhost serve` of a baseline build (`--baseline-bin`), for before/after runs.
    Baseline,
}

impl Worker {
    /// The name used in reports and `--only`.
    pub fn name(self) -> &'static str {
        match self {
            Worker::Reference => "at-least-once",
            Worker::Floor => "floor",
            Worker::Toolhost => "toolhost",
            Worker::Baseline => "toolhost-base",
        }
    }

    /// Whether this is a `toolhost serve` build.
    pub fn is_toolhost(self) -> bool {
        matches!(self, Worker::Toolhost | Worker::Baseline)
    }
}

/// How to start one target process.
#[derive(Clone, Debug)]
pub struct Launch {
    /// Which worker this is.
    pub worker: Worker,
    /// The executable.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables added to the harness's own.
    pub env: Vec<(String, String)>,
    /// Where stdout and stderr go.
    pub log_path: PathBuf,
}

impl Launch {
    /// The launch of `worker` from `program` against `redis_url`, with extra `serve` flags
    /// and environment for toolhost.
    pub fn new(
        worker: Worker,
        program: &Path,
        redis_url: &str,
        extra_args: &[String],
        extra_env: &[(String, String)],
        log_path: PathBuf,
    ) -> Self {
        let (args, env) = match worker {
            Worker::Reference => (vec!["--redis-url".to_owned(), redis_url.to_owned()], Vec::new()),
            Worker::Floor => (
                vec!["--redis-url".to_owned(), redis_url.to_owned(), "--exactly-once".to_owned()],
                Vec::new(),
            ),
            Worker::Toolhost | Worker::Baseline => {
                let mut args = vec!["serve".to_owned()];
                args.extend(extra_args.iter().cloned());
                let env = vec![
                    ("REDIS_URL".to_owned(), redis_url.to_owned()),
                    ("TOOLHOST__HTTP__LISTEN".to_owned(), "127.0.0.1:0".to_owned()),
                    ("RUST_LOG".to_owned(), "warn".to_owned()),
                    ("TOOLHOST__LOG__LEVEL".to_owned(), "warn".to_owned()),
                ];
                (args, env)
            }
        };
        let mut env = env;
        env.extend(extra_env.iter().cloned());
        Launch { worker, program: program.to_owned(), args, env, log_path }
    }
}

/// A running target process.
#[derive(Debug)]
pub struct Running {
    child: Child,
    pid: u32,
    /// From spawn to the first read through a consumer group.
    pub ready_after: Duration,
    log_path: PathBuf,
}

impl Running {
    /// The process id, for CPU and memory accounting.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process is still running.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last lines of the target's log, for error messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log_path)
    }

    /// Kills the process and waits for it to exit.
    pub async fn stop(mut self) {
        // Errors mean it already exited.
        let _ = self.child.kill().await;
    }
}

/// Spawns the target and waits until it reads through a consumer group, polling every 2 ms.
///
/// The caller flushes Redis first, so any consumer seen belongs to this process.
///
/// # Errors
///
/// When the program cannot be spawned, exits early, or is not ready within [`READY_LIMIT`];
/// the message then ends with the tail of its log.
pub async fn start(launch: &Launch, admin: &mut MultiplexedConnection) -> anyhow::Result<Running> {
    if let Some(parent) = launch.log_path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let log = std::fs::File::create(&launch.log_path)
        .with_context(|| format!("creating {}", launch.log_path.display()))?;
    let log_err = log.try_clone().context("duplicating the log file handle")?;
    let mut command = Command::new(&launch.program);
    command
        .args(&launch.args)
        .envs(launch.env.iter().map(|(key, value)| (key, value)))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .kill_on_drop(true);
    let spawned_at = Instant::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {} {}", launch.program.display(), launch.args.join(" ")))?;
    let pid = child.id().context("the target exited at once")?;
    loop {
        if has_consumer(admin).await {
            let ready_after = spawned_at.elapsed();
            return Ok(Running { child, pid, ready_after, log_path: launch.log_path.clone() });
        }
        if let Ok(Some(status)) = child.try_wait() {
            anyhow::bail!(
                "{} exited with {status} before it was ready; log tail: {}",
                launch.worker.name(),
                log_tail(&launch.log_path)
            );
        }
        if spawned_at.elapsed() > READY_LIMIT {
            let _ = child.kill().await;
            anyhow::bail!(
                "{} was not ready within {} s; log tail: {}",
                launch.worker.name(),
                READY_LIMIT.as_secs(),
                log_tail(&launch.log_path)
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Whether a worker reads `action-requests` through a group: a group exists and either has
/// a consumer or some client's last command was `XREADGROUP`. The second test is needed
/// because Redis 7.0 creates the consumer of a blocking `XREADGROUP` on an empty stream
/// only once it serves an entry, so a ready worker can show zero consumers.
async fn has_consumer(admin: &mut MultiplexedConnection) -> bool {
    let groups: redis::RedisResult<StreamInfoGroupsReply> = admin.xinfo_groups(REQUESTS_STREAM).await;
    let Ok(groups) = groups else { return false };
    if groups.groups.is_empty() {
        return false;
    }
    if groups.groups.iter().any(|group| group.consumers > 0) {
        return true;
    }
    let clients: redis::RedisResult<String> = redis::cmd("CLIENT").arg("LIST").query_async(admin).await;
    clients.is_ok_and(|clients| clients.lines().any(|client| client.contains(" cmd=xreadgroup")))
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
    if tail.is_empty() { format!("(empty: {})", path.display()) } else { tail }
}
