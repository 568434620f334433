//! The harness of the end-to-end suites: real `redis-server` processes in the topologies
//! production uses (one server, a cluster, a master watched by sentinels), started on free
//! loopback ports, and the built `toolhost` binary run as a separate process.
//!
//! Everything is killed on drop. The suites run with `just test-fleet`, which builds the binary
//! first; `TOOLHOST_BIN` names another binary.

use std::io::Read as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod cluster;
pub mod mcp_http;
pub mod ovos;
pub mod tls;

/// A free loopback TCP port (bound, then released).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// A free loopback port below 55536 whose cluster-bus port (plus 10000) is free too.
pub fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 55536 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

/// A fresh, unique temporary directory.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("toolhost-e2e-{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// The toolhost binary under test: `TOOLHOST_BIN`, or the workspace's debug build.
pub fn toolhost_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("TOOLHOST_BIN") {
        return PathBuf::from(path);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), PathBuf::from);
    let binary = target.join("debug").join("toolhost");
    assert!(
        binary.exists(),
        "{} is missing: run `cargo build --bin toolhost` first (just test-fleet does)",
        binary.display()
    );
    binary
}

/// A Python venv made by `scripts/<script>` (default `~/.cache/toolhost/<name>`, or the
/// directory the variable `env` names); panics naming the script and the recipe when it is
/// missing.
pub fn venv(env: &str, name: &str, script: &str, recipe: &str) -> PathBuf {
    let venv = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/toolhost").join(name)
    });
    assert!(
        venv.join("bin/python").exists(),
        "{} is missing: run scripts/{script} (`just {recipe}` does)",
        venv.display()
    );
    venv
}

/// The venv of the MCP door's clients (the official MCP Python SDK and the Agents SDK), as
/// `scripts/ensure-mcp-door-venv.sh` lays it out.
pub fn mcp_door_venv() -> PathBuf {
    venv("TOOLHOST_MCP_DOOR_VENV", "venv-mcp-door", "ensure-mcp-door-venv.sh", "test-mcp-door")
}

/// Runs `script` with the Python client's venv (`scripts/ensure-python-client-venv.sh`), the
/// client taken from this checkout (`clients/python/src`), and a clean environment plus `env`.
/// Returns the exit code, stdout and stderr.
pub fn python_client(script: &str, env: &[(&str, String)]) -> (i32, String, String) {
    let venv =
        venv("TOOLHOST_PYTHON_VENV", "venv-python-client", "ensure-python-client-venv.sh", "test-fleet");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let output = Command::new(venv.join("bin/python"))
        .arg("-c")
        .arg(script)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("PYTHONPATH", workspace.join("clients/python/src"))
        .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
        .output()
        .expect("run the Python client");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A file of the suite's fixtures, `tests/<dir>/<name>`.
pub fn fixture(dir: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join(name)
}

/// The name of the user running the tests: a root daemon runs commands and hosted servers as
/// `nobody`, who cannot read root's home where the venvs are, so the tests name their own user.
pub fn user() -> String {
    std::env::var("USER").ok().filter(|user| !user.is_empty()).unwrap_or_else(|| "root".to_owned())
}

/// Sends a signal to a process.
pub fn signal(pid: u32, signal: i32) {
    if pid > 0 {
        let _ = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status();
    }
}

/// The level of the test servers' and sentinels' logs. `notice` has every replication step
/// (connecting, PSYNC, full resync, BGSAVE for replicas, link lost, `REPLICAOF` with the client
/// that sent it) and every sentinel event (`+sdown`, `+odown`, `+tilt`, `+switch-master`,
/// `+convert-to-slave`, ...); `verbose` adds a line per client connection, and the tests' own
/// polling would push all of that out of a tail.
pub const LOG_LEVEL: &str = "notice";

/// The last `lines` lines of `text`, each indented, after how many were left out.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let skipped = all.len().saturating_sub(lines);
    let mut out = if skipped > 0 { format!("    ({skipped} earlier lines)\n") } else { String::new() };
    for line in &all[skipped..] {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The first `head` and the last `last` lines of `text`, each indented, with how many were left
/// out between them.
pub fn head_and_tail(text: &str, head: usize, last: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    if all.len() <= head + last {
        return tail(text, all.len());
    }
    let mut out = tail(&all[..head].join("\n"), head);
    out.push_str(&format!("    ... ({} lines) ...\n", all.len() - head - last));
    out.push_str(&tail(&all[all.len() - last..].join("\n"), last));
    out
}

/// The file at `path` from byte `from` on, lossily decoded; a note instead when it cannot be read.
pub fn read_log(path: &Path, from: u64) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let from = usize::try_from(from).unwrap_or(usize::MAX).min(bytes.len());
            String::from_utf8_lossy(&bytes[from..]).into_owned()
        }
        Err(err) => format!("({} cannot be read: {err})", path.display()),
    }
}

/// A `redis-server` process owned by a test, on a free port in a directory of its own, logging
/// to `redis.log` there (appended to across restarts).
pub struct RedisProcess {
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    /// The length of the log when the server was last started: where its current life begins.
    log_start: u64,
}

impl RedisProcess {
    /// Starts `redis-server` with `args` after the port, bind, directory and no persistence, and
    /// waits until it answers `PING`.
    ///
    /// A free port can be taken by someone else between the check and the server's bind (other
    /// suites run beside this one), and a cluster node also binds its bus on the port plus 10000:
    /// a server that exits at start is tried again on another port, a few times.
    pub fn start(args: &[&str]) -> RedisProcess {
        let cluster = args.contains(&"--cluster-enabled");
        let mut server = RedisProcess {
            port: 0,
            dir: temp_dir("redis"),
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            child: None,
            log_start: 0,
        };
        for _ in 0..4 {
            server.port = if cluster { free_cluster_port() } else { free_port() };
            if server.try_spawn() {
                return server;
            }
            server.kill();
        }
        panic!("redis-server did not start on four free ports; the last was {}", server.port);
    }

    fn spawn(&mut self) {
        assert!(self.try_spawn(), "redis-server did not start on port {}", self.port);
    }

    /// Starts the server and waits until it answers `PING`; false if it exited or never
    /// answered in 10 s.
    fn try_spawn(&mut self) -> bool {
        let log = self.log_path();
        self.log_start = std::fs::metadata(&log).map_or(0, |meta| meta.len());
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(["--loglevel", LOG_LEVEL])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the justfile installs it)");
        let child = self.child.insert(child);
        let port = self.port;
        wait_until_ready(child, Duration::from_secs(10), Duration::from_millis(20), || ping(port))
    }

    /// Whether the server answers `PING`.
    pub fn ping(&self) -> bool {
        ping(self.port)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its log file, `<dir>/redis.log`.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// The last `lines` lines of its log, over all its lives.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&read_log(&self.log_path(), 0), lines)
    }

    /// The first `head` and last `last` lines its log has had since it was last started.
    pub fn log_since_start(&self, head: usize, last: usize) -> String {
        head_and_tail(&read_log(&self.log_path(), self.log_start), head, last)
    }

    /// A blocking connection, for set-up and checks.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url()).expect("client").get_connection().expect("connect to test redis")
    }

    /// Kills the server (SIGKILL: no shutdown save).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, directory and arguments.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts it again, empty, as a replica of `master_port` from its first moment, so that it is
    /// never an empty master that a sentinel or a client could take for the real one.
    ///
    /// Empty: a replica keeps the RDB of its last full resync as `dump.rdb` (`rdb-del-sync-files`
    /// is off by default, even without persistence), and a server started beside it loads it, so
    /// it came back with the data of an earlier round and tried a partial resync from it.
    pub fn restart_as_replica_of(&mut self, master_port: u16) {
        self.kill();
        let _ = std::fs::remove_file(self.dir.join("dump.rdb"));
        let kept = self.args.clone();
        self.args.extend(["--replicaof".to_owned(), "127.0.0.1".to_owned(), master_port.to_string()]);
        self.spawn();
        self.args = kept;
    }

    /// The process id (0 once killed).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `toolhost <args>` with a clean environment (PATH, an HTTP endpoint on a free port, JSON logs
/// at info) plus `env`, its stdout and stderr both written to `log`.
pub fn toolhost_command(args: &[&str], env: &[(&str, &str)], log: &Path) -> Command {
    let stdout = std::fs::File::create(log).expect("log file");
    let stderr = stdout.try_clone().expect("log file");
    let mut command = Command::new(toolhost_bin());
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("TOOLHOST__HTTP__LISTEN", "127.0.0.1:0")
        .env("TOOLHOST__LOG__LEVEL", "info")
        .env("TOOLHOST__LOG__FORMAT", "json")
        .stdout(stdout)
        .stderr(stderr);
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

/// A `toolhost serve` process owned by a test.
pub struct Toolhost {
    child: Option<Child>,
    log: PathBuf,
    dir: PathBuf,
}

impl Toolhost {
    /// Starts `toolhost serve` with a clean environment plus `env` (which must say how to reach
    /// Redis), logging JSON to a file, and waits until it logs `ready`.
    pub fn start(env: &[(&str, &str)]) -> Toolhost {
        Toolhost::start_args(&[], env)
    }

    /// [`Toolhost::start`] with `args` after `serve` (`--config <file>`).
    pub fn start_args(args: &[&str], env: &[(&str, &str)]) -> Toolhost {
        let dir = temp_dir("toolhost");
        let log = dir.join("toolhost.log");
        let args: Vec<&str> = std::iter::once("serve").chain(args.iter().copied()).collect();
        let child = toolhost_command(&args, env, &log).spawn().expect("spawn toolhost");
        let toolhost = Toolhost { child: Some(child), log, dir };
        toolhost.wait_for_log("\"message\":\"ready\"", Duration::from_secs(30));
        toolhost
    }

    /// The log so far.
    pub fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&self.log) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    /// Waits until the log contains `needle`, panicking with the log after `timeout`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.log().contains(needle) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("toolhost did not log {needle} within {timeout:?}; log:\n{}", self.log());
    }

    /// The process id (0 once killed).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// SIGKILL, and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits up to `timeout` for the exit code.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        signal(self.pid(), libc::SIGTERM);
        let mut child = self.child.take()?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }
}

impl Drop for Toolhost {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
pub mod sentinel;

/// Whether the Redis server on `port` of the loopback answers `PING`.
fn ping(port: u16) -> bool {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|client| client.get_connection_with_timeout(Duration::from_millis(500)))
        .and_then(|mut connection| redis::cmd("PING").query::<String>(&mut connection))
        .is_ok()
}

/// Waits until `ready` says a started `child` serves, polling every `every`: false when the
/// child exits first or `within` passes.
pub(crate) fn wait_until_ready(
    child: &mut Child,
    within: Duration,
    every: Duration,
    mut ready: impl FnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if ready() {
            return true;
        }
        if matches!(child.try_wait(), Ok(Some(_))) {
            return false;
        }
        std::thread::sleep(every);
    }
    false
}
