//! Test support: a real `redis-server` on a free loopback port, and the real `toolhost` binary.
//!
//! Both are killed on drop. Tests use their own servers, so they can stop, restart or pause them
//! to inject faults without disturbing each other.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use serde_json::Value;

/// A redis-server process owned by a test.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    appendonly: bool,
    password: Option<String>,
    child: Option<Child>,
}

/// A free loopback TCP port (bound, then released).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// Process ids whose command line is exactly `words` (a zombie has none, so it does not count).
pub fn processes(words: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = words.iter().flat_map(|word| word.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| cmdline == wanted))
        .collect()
}

/// A fresh, unique temporary directory.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("toolhost-test-{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

impl RedisServer {
    /// Starts a server without persistence.
    pub fn start() -> RedisServer {
        RedisServer::start_with(false)
    }

    /// Starts a server; with `appendonly` it keeps an AOF in its own directory, so a restart
    /// keeps the data.
    pub fn start_with(appendonly: bool) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            dir: temp_dir("redis"),
            appendonly,
            password: None,
            child: None,
        };
        server.spawn();
        server
    }

    /// Starts a server without persistence that requires `password` (`requirepass`); its
    /// [`RedisServer::url`] carries the password.
    pub fn start_with_password(password: &str) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            dir: temp_dir("redis"),
            appendonly: false,
            password: Some(password.to_owned()),
            child: None,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let mut command = Command::new("redis-server");
        if let Some(password) = &self.password {
            command.args(["--requirepass", password]);
        }
        let child = command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", if self.appendonly { "yes" } else { "no" }])
            .args(["--appendfsync", "always", "--dir"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the justfile installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(client) = redis::Client::open(self.url())
                && let Ok(mut connection) = client.get_connection()
                && redis::cmd("PING").query::<String>(&mut connection).is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not start on port {}", self.port);
    }

    /// `redis://127.0.0.1:<port>`, or `redis://:<password>@127.0.0.1:<port>` with a password.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A new async connection.
    pub async fn connection(&self) -> MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis")
    }

    /// Kills the server (SIGKILL: no shutdown save).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP: the server hangs without closing connections.
    pub fn pause(&self) {
        signal(self.pid(), libc::SIGSTOP);
    }

    /// SIGCONT.
    pub fn resume(&self) {
        signal(self.pid(), libc::SIGCONT);
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |child| child.id() as i32)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends a signal to a process this test started.
pub fn signal(pid: i32, signal: i32) {
    if pid > 0 {
        let _ = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status();
    }
}

/// A `toolhost serve` process owned by a test.
pub struct Daemon {
    child: Option<Child>,
    log: PathBuf,
    dir: PathBuf,
}

impl Daemon {
    /// Starts `toolhost serve` against `redis` with extra environment variables and waits until
    /// it logs `ready`.
    pub fn start(redis: &RedisServer, env: &[(&str, &str)]) -> Daemon {
        Daemon::start_args(redis, env, &[])
    }

    /// Same as [`Daemon::start`] with extra `serve` arguments.
    pub fn start_args(redis: &RedisServer, env: &[(&str, &str)], args: &[&str]) -> Daemon {
        Daemon::start_wrapped(redis, env, args, &[])
    }

    /// Same as [`Daemon::start_args`], run through `wrapper` (a program and its arguments that
    /// exec the rest of the command line, such as `setpriv --reuid=65534 ...`); the daemon keeps
    /// the wrapper's process id.
    pub fn start_wrapped(
        redis: &RedisServer,
        env: &[(&str, &str)],
        args: &[&str],
        wrapper: &[&str],
    ) -> Daemon {
        let dir = temp_dir("daemon");
        let log = dir.join("toolhost.log");
        let stdout = std::fs::File::create(&log).expect("log file");
        let stderr = stdout.try_clone().expect("log file");
        let mut command = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut command = Command::new(program);
                command.args(wrapper_args).arg(reachable_binary(&dir));
                command
            }
            None => Command::new(env!("CARGO_BIN_EXE_toolhost")),
        };
        command
            .arg("serve")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("REDIS_URL", redis.url())
            .env("TOOLHOST__HTTP__LISTEN", "127.0.0.1:0")
            .env("TOOLHOST__LOG__LEVEL", "info")
            .stdout(stdout)
            .stderr(stderr);
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command.spawn().expect("spawn toolhost");
        let daemon = Daemon { child: Some(child), log, dir };
        daemon.wait_for_log("\"message\":\"ready\"", Duration::from_secs(20));
        daemon
    }

    /// The daemon's log so far.
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

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |child| child.id() as i32)
    }

    /// Sends a signal.
    pub fn signal(&self, sig: i32) {
        signal(self.pid(), sig);
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
        self.signal(libc::SIGTERM);
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

    /// Resident memory in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find(|line| line.starts_with("VmRSS:"))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|kib| kib.parse().ok())
            .unwrap_or(0)
    }

    /// The directory holding the log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The toolhost binary at a path every user can reach: the build directory may sit below one
/// that only root may enter, and a wrapper may start the daemon as another user. A hard link
/// (or, across file systems, a copy) in `dir`, which is made world-searchable.
fn reachable_binary(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("open the daemon dir");
    let binary = dir.join("toolhost");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_toolhost"), &binary).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_toolhost"), &binary).expect("copy the toolhost binary");
    }
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755))
        .expect("make toolhost executable");
    binary
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A request envelope shaped exactly like contract section 2.
pub fn request(event_type: &str, request_id: &str, data: Value) -> Value {
    let mut data = data;
    data["request_id"] = Value::String(request_id.to_owned());
    serde_json::json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "source": "agent:planner",
        "specversion": "1.0",
        "type": event_type,
        "topic": "action-requests",
        "time": chrono::Utc::now().to_rfc3339(),
        "data": data,
        "correlation_id": format!("c-{request_id}"),
        "tenant_id": "acme",
        "user_id": "u-7",
        "session_id": "s-1",
    })
}

/// XADDs a payload to a stream as the contract's `id` + `payload` entry.
pub async fn xadd(connection: &mut MultiplexedConnection, stream: &str, payload: &str) -> String {
    redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("id")
        .arg(uuid::Uuid::new_v4().to_string())
        .arg("payload")
        .arg(payload)
        .query_async(connection)
        .await
        .expect("XADD")
}

/// Every payload of a stream, parsed, oldest first.
pub async fn payloads(connection: &mut MultiplexedConnection, stream: &str) -> Vec<Value> {
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg(stream).arg("-").arg("+").query_async(connection).await.expect("XRANGE");
    entries
        .into_iter()
        .filter_map(|(_, fields)| fields.into_iter().find(|(name, _)| name == "payload"))
        .map(|(_, payload)| serde_json::from_str(&payload).unwrap_or(Value::String(payload)))
        .collect()
}

/// Waits until `stream` holds at least `count` entries; returns their payloads.
pub async fn wait_for(
    connection: &mut MultiplexedConnection,
    stream: &str,
    count: usize,
    timeout: Duration,
) -> Vec<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let found = payloads(connection, stream).await;
        if found.len() >= count || Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The number of entries pending in a group.
pub async fn pending(connection: &mut MultiplexedConnection, stream: &str, group: &str) -> u64 {
    let reply: redis::Value =
        redis::cmd("XPENDING").arg(stream).arg(group).query_async(connection).await.expect("XPENDING");
    match reply {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(count)) => *count as u64,
            _ => 0,
        },
        _ => 0,
    }
}

/// Waits until every entry of `stream` was delivered to `group` and acked: then every answer
/// that will ever be published for them has been (answers commit atomically with the ack), so a
/// test can count answers without waiting "long enough" for a duplicate that might come late.
pub async fn settled(connection: &mut MultiplexedConnection, stream: &str, group: &str) {
    settled_within(connection, stream, group, Duration::from_secs(20)).await;
}

/// [`settled`] with its own deadline.
pub async fn settled_within(
    connection: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    loop {
        let lag = group_lag(connection, stream, group).await;
        if lag == Some(0) && pending(connection, stream, group).await == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{stream} did not settle for {group}: lag {lag:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The entries of `stream` not yet delivered to `group` (`XINFO GROUPS` lag), if Redis can tell.
pub async fn group_lag(connection: &mut MultiplexedConnection, stream: &str, group: &str) -> Option<u64> {
    let reply: redis::Value =
        redis::cmd("XINFO").arg("GROUPS").arg(stream).query_async(connection).await.ok()?;
    let redis::Value::Array(groups) = reply else { return None };
    groups.into_iter().find_map(|group_info| {
        let fields: Vec<redis::Value> = match group_info {
            redis::Value::Array(fields) => fields,
            redis::Value::Map(pairs) => pairs.into_iter().flat_map(|(key, value)| [key, value]).collect(),
            _ => return None,
        };
        let text = |value: &redis::Value| match value {
            redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            redis::Value::SimpleString(text) => text.clone(),
            _ => String::new(),
        };
        let named = fields.chunks(2).any(|pair| text(&pair[0]) == "name" && text(&pair[1]) == group);
        let lag = fields.chunks(2).find(|pair| text(&pair[0]) == "lag").and_then(|pair| match pair[1] {
            redis::Value::Int(lag) => u64::try_from(lag).ok(),
            _ => None,
        });
        if named { lag } else { None }
    })
}

/// The answers to `request_id` among result payloads.
pub fn answers_to<'a>(results: &'a [Value], request_id: &str) -> Vec<&'a Value> {
    results.iter().filter(|result| result["data"]["request_id"] == request_id).collect()
}

/// Waits up to 15 s for the first answer to `request_id` on `stream`.
pub async fn answer(connection: &mut MultiplexedConnection, stream: &str, request_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let found = payloads(connection, stream).await;
        if let Some(answer) = answers_to(&found, request_id).first() {
            return (*answer).clone();
        }
        assert!(Instant::now() < deadline, "no answer to {request_id} on {stream}: {found:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `requests` (event type, request id, data) and returns one answer per request id.
pub async fn ask(redis: &RedisServer, requests: &[(&str, &str, Value)]) -> HashMap<String, Value> {
    let mut connection = redis.connection().await;
    let before = wait_for(&mut connection, "action-results", 0, Duration::ZERO).await.len();
    for (event, id, data) in requests {
        xadd(&mut connection, "action-requests", &request(event, id, data.clone()).to_string()).await;
    }
    let results =
        wait_for(&mut connection, "action-results", before + requests.len(), Duration::from_secs(20)).await;
    let mut answers = HashMap::new();
    for (_, id, _) in requests {
        let found = answers_to(&results, id);
        assert_eq!(found.len(), 1, "request {id}: {results:#?}");
        answers.insert((*id).to_owned(), found[0]["data"].clone());
    }
    answers
}

/// `GET path` with a raw HTTP/1.0 request: status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect to toolhost HTTP");
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status = reply.get(9..12).and_then(|code| code.parse().ok()).unwrap_or(0);
    let body = reply.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    (status, body)
}

/// The HTTP address a daemon logged (`"message":"http listening","addr":...`).
pub fn http_addr(log: &str) -> SocketAddr {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["message"] == "http listening")
        .and_then(|line| line["addr"].as_str()?.parse().ok())
        .unwrap_or_else(|| panic!("no http listening line in:\n{log}"))
}

/// Polls `GET path` until `check` accepts the reply; returns the last reply.
pub fn wait_http(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    check: impl Fn(u16, &str) -> bool,
) -> (u16, String) {
    let deadline = Instant::now() + timeout;
    loop {
        let (status, body) = http_get(addr, path);
        if check(status, &body) || Instant::now() >= deadline {
            return (status, body);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Publishes one request (`m-1`) to `stream` and delivers it to consumer `c1` of `group` through
/// `bus`: the starting point of the ledger tests. Returns its entry id.
pub async fn deliver_one(bus: &toolhost_bus::RedisBus, stream: &str, group: &str) -> String {
    use toolhost_bus::{Groups as _, Streams as _};
    bus.ensure_group(stream, group).await.unwrap();
    let entry_id = bus.publish(stream, "m-1", "{}").await.unwrap();
    bus.read_group(stream, group, "c1", 10, Duration::from_millis(10)).await.unwrap();
    entry_id
}

/// The ledger keys of request `r-1` in the ledger tests, with `lease` and a minute's retention.
pub fn call_r1(lease: Duration) -> toolhost_bus::CallKeys<'static> {
    toolhost_bus::CallKeys {
        answered: "toolhost:toolhost:answered:r-1",
        call: "toolhost:toolhost:call:r-1",
        entry: "toolhost:toolhost:entry:r-1",
        lease,
        retention: Duration::from_secs(60),
    }
}
