//! A master and its replica watched by three `redis-server --sentinel` processes, for the
//! Sentinel suite: everything on free loopback ports, each sentinel with its own configuration
//! file and log in a directory of its own (a sentinel rewrites its file as it learns the
//! topology).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{LOG_LEVEL, RedisProcess, free_port, read_log, tail, temp_dir};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "mymaster";

/// The sentinels' `down-after-milliseconds`.
///
/// Not 1000: that is a sentinel's own ping and reconnect period, and right after a failover it
/// cannot keep to it. When a sentinel switches to the promoted replica it resets the master's
/// link and counts from that moment, but reconnects at most once per second (the old address
/// was being retried every second), so its first `PING` to the new master can leave up to 1 s
/// later: with 1000 it judged the new master down about 1.01-1.03 s after `+switch-master`, in
/// 2 of 5 runs here, before the first `PONG`. The other sentinels' `is-master-down` answers about
/// the old master are kept for 5 s, so that was `+odown #quorum 3/2` at once, and the reset also
/// allows a new failover at once: a second failover, epoch + 1, which promoted the old master
/// that the test had just started again as a replica (stale, not yet synced) and made the real
/// new master its replica (a full resync that threw its data away). The failover suite then
/// waited in vain for the old master to turn replica; the sentinel logs showed `+sdown master`
/// 1.033 s after `+switch-master`, `+try-failover`, `+selected-slave` of the restarted server and
/// `MASTER MODE enabled (user request from ... name=sentinel-...-cmd)` in its log. 3000 leaves
/// that first `PING` two seconds; [`Watched::wait_for_master`] also waits for its `PONG`.
pub const DOWN_AFTER_MS: u64 = 3000;

/// One `redis-server --sentinel` process.
pub struct SentinelProcess {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    stopped: bool,
}

impl SentinelProcess {
    /// Starts a sentinel watching the master on `master_port` (quorum 2, down after
    /// [`DOWN_AFTER_MS`], failover timeout 3 s), logging to `sentinel.log` in its directory, and
    /// waits until it answers `PING`.
    pub fn start(master_port: u16) -> SentinelProcess {
        let port = free_port();
        let dir = temp_dir("sentinel");
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {log}\nloglevel {LOG_LEVEL}\n\
                 sentinel resolve-hostnames no\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {MASTER_NAME} 3000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = dir.display(),
                log = dir.join("sentinel.log").display(),
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the justfile installs it)");
        let sentinel = SentinelProcess { port, dir, child: Some(child), stopped: false };
        poll("the sentinel to answer PING", Duration::from_secs(10), || {
            sentinel.try_connection().and_then(|mut c| redis::cmd("PING").query::<String>(&mut c).ok())
        });
        sentinel
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stops the process (SIGSTOP): it keeps accepting connections and answers nothing.
    pub fn stop(&mut self) {
        if let Some(child) = &self.child {
            crate::signal(child.id(), libc::SIGSTOP);
            self.stopped = true;
        }
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&read_log(&self.dir.join("sentinel.log"), 0), lines)
    }

    /// What it says now, for a failure's message: the master it names, that master's flags and
    /// the replicas it knows with their flags; then the last `lines` lines of its log.
    pub fn describe(&self, lines: usize) -> String {
        let pid = self.child.as_ref().map_or(0, Child::id);
        let stopped = if self.stopped { " (stopped)" } else { "" };
        let mut out = format!("sentinel on port {} (pid {pid}){stopped}:\n", self.port);
        if let Some(mut connection) = (!self.stopped).then(|| self.try_connection()).flatten() {
            let master: redis::RedisResult<HashMap<String, String>> =
                redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME).query(&mut connection);
            let replicas: redis::RedisResult<Vec<HashMap<String, String>>> =
                redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME).query(&mut connection);
            let field =
                |map: &HashMap<String, String>, name: &str| map.get(name).cloned().unwrap_or_default();
            match master {
                Ok(master) => out.push_str(&format!(
                    "  master {}:{} flags={} config-epoch={} failover-state={} last-ping-sent={}\n",
                    field(&master, "ip"),
                    field(&master, "port"),
                    field(&master, "flags"),
                    field(&master, "config-epoch"),
                    field(&master, "failover-state"),
                    field(&master, "last-ping-sent"),
                )),
                Err(err) => out.push_str(&format!("  SENTINEL MASTER failed: {err}\n")),
            }
            match replicas {
                Ok(replicas) => {
                    for replica in replicas {
                        out.push_str(&format!(
                            "  replica {} flags={} master-link-status={} master={}:{} role-reported={}\n",
                            field(&replica, "name"),
                            field(&replica, "flags"),
                            field(&replica, "master-link-status"),
                            field(&replica, "master-host"),
                            field(&replica, "master-port"),
                            field(&replica, "role-reported"),
                        ));
                    }
                }
                Err(err) => out.push_str(&format!("  SENTINEL REPLICAS failed: {err}\n")),
            }
        } else {
            out.push_str("  (not asked: stopped or not answering)\n");
        }
        out.push_str(&format!("  its log:\n{}", self.log_tail(lines)));
        out
    }

    fn try_connection(&self) -> Option<redis::Connection> {
        let connection = redis::Client::open(self.url())
            .ok()?
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        connection.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        Some(connection)
    }

    /// A blocking connection, for commands to the sentinel.
    pub fn connection(&self) -> redis::Connection {
        self.try_connection().expect("connect to the sentinel")
    }

    /// The port of the master this sentinel names now (`SENTINEL get-master-addr-by-name`).
    pub fn master_port(&self) -> Option<u16> {
        let mut connection = self.try_connection()?;
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER_NAME)
            .query(&mut connection)
            .ok()?;
        Some(port)
    }

    /// Whether it watches the server on `port` as a settled master: it names that port, flags it
    /// `master` only (not down, no failover in progress, connected), and has had a `PONG` for its
    /// last `PING` (`last-ping-sent` 0; right after a switch it counts from the switch until the
    /// first `PONG`).
    fn settled_on(&self, port: u16) -> bool {
        let Some(mut connection) = self.try_connection() else { return false };
        let master: redis::RedisResult<HashMap<String, String>> =
            redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME).query(&mut connection);
        master.is_ok_and(|master| {
            master.get("port").map(String::as_str) == Some(port.to_string().as_str())
                && master.get("flags").map(String::as_str) == Some("master")
                && master.get("last-ping-sent").map(String::as_str) == Some("0")
        })
    }

    /// How many replicas and other sentinels it knows, and whether `SENTINEL CKQUORUM` is OK.
    fn knows(&self) -> Option<(usize, usize, bool)> {
        let mut connection = self.try_connection()?;
        let replicas: Vec<redis::Value> =
            redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME).query(&mut connection).ok()?;
        let sentinels: Vec<redis::Value> =
            redis::cmd("SENTINEL").arg("SENTINELS").arg(MASTER_NAME).query(&mut connection).ok()?;
        let quorum = redis::cmd("SENTINEL").arg("CKQUORUM").arg(MASTER_NAME).query::<String>(&mut connection);
        Some((replicas.len(), sentinels.len(), quorum.is_ok()))
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A master, its replica and three sentinels watching them.
pub struct Watched {
    /// The two data servers: the first starts as master, the second as its replica.
    pub servers: [RedisProcess; 2],
    /// The three sentinels.
    pub sentinels: Vec<SentinelProcess>,
}

impl Watched {
    /// Starts the master, the replica and the sentinels, and waits until the replica is in sync
    /// and every sentinel knows the replica and the two other sentinels, with quorum: from then
    /// on a failover can happen.
    pub fn start() -> Watched {
        let (master, replica) = master_and_replica();
        let sentinels: Vec<SentinelProcess> = (0..3).map(|_| SentinelProcess::start(master.port())).collect();
        poll("the sentinels to know each other and the replica", Duration::from_secs(30), || {
            sentinels
                .iter()
                .all(|sentinel| {
                    sentinel
                        .knows()
                        .is_some_and(|(replicas, others, quorum)| replicas >= 1 && others >= 2 && quorum)
                })
                .then_some(())
        });
        Watched { servers: [master, replica], sentinels }
    }

    /// The sentinel URLs, comma-separated (as `TOOLHOST__REDIS__SENTINELS` takes them).
    pub fn sentinel_urls(&self) -> String {
        self.sentinels.iter().map(SentinelProcess::url).collect::<Vec<_>>().join(",")
    }

    /// The port of the master the first answering sentinel names.
    pub fn named_master(&self) -> Option<u16> {
        self.sentinels.iter().filter(|sentinel| !sentinel.stopped).find_map(SentinelProcess::master_port)
    }

    /// The data server on `port`.
    pub fn server(&self, port: u16) -> &RedisProcess {
        self.servers.iter().find(|server| server.port() == port).expect("a data server on that port")
    }

    /// The data server that is not on `port`.
    pub fn other(&self, port: u16) -> &RedisProcess {
        self.servers.iter().find(|server| server.port() != port).expect("two data servers")
    }

    /// Every sentinel's [`SentinelProcess::describe`], with the last `lines` lines of each log.
    pub fn describe_sentinels(&self, lines: usize) -> String {
        self.sentinels.iter().map(|sentinel| sentinel.describe(lines)).collect()
    }

    /// Waits until every live sentinel names the server on `port` as master, has had a `PONG`
    /// from it and has no failover in progress, and that server answers `ROLE` as one; the panic
    /// after `timeout` says what the sentinels and both servers last reported, with the tails of
    /// their logs.
    ///
    /// Naming it is not enough before the old master comes back: until a sentinel's first `PING`
    /// to the new master is answered it may still judge it down and start another failover
    /// ([`DOWN_AFTER_MS`] says how that went), and a server restarted meanwhile is then the only
    /// replica it can promote. Waiting for every sentinel to hear the new master keeps a restart
    /// after this wait out of that window: a failover started in it finds no replica but the dead
    /// old master and gives up (`-failover-abort-no-good-slave`, as one run here did by luck).
    pub fn wait_for_master(&self, port: u16, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let named = self
                .sentinels
                .iter()
                .filter(|sentinel| !sentinel.stopped)
                .all(|sentinel| sentinel.settled_on(port));
            if named && role(self.server(port)).as_deref() == Some("master") {
                return;
            }
            if Instant::now() >= deadline {
                let other = self.other(port);
                panic!(
                    "timed out after {timeout:?} waiting for the sentinels to name 127.0.0.1:{port} as \
                     master.\nThe server on {port} (pid {}) said:\n{}\nits log:\n{}\nThe server on {} \
                     (pid {}) said:\n{}\nits log:\n{}\n{}",
                    self.server(port).pid(),
                    info_replication(self.server(port)),
                    self.server(port).log_tail(40),
                    other.port(),
                    other.pid(),
                    info_replication(other),
                    other.log_tail(40),
                    self.describe_sentinels(40),
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the master's writes so far are on the replica: a write, then `WAIT 1`.
    /// Replication is ordered, so every earlier write, whoever made it, is on the replica too.
    pub fn replicated(&self, master: &RedisProcess) {
        let mut connection = master.connection();
        let () = redis::cmd("SET")
            .arg("e2e:fence")
            .arg(uuid::Uuid::new_v4().to_string())
            .query(&mut connection)
            .expect("SET");
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut connection).expect("WAIT");
        assert_eq!(acked, 1, "the replica did not acknowledge the master's writes");
    }
}

/// What `server` answers to `INFO replication` (on a connection with timeouts, so that it cannot
/// hang or panic), or why it did not answer.
pub fn info_replication(server: &RedisProcess) -> String {
    let answer = redis::Client::open(server.url())
        .and_then(|client| client.get_connection_with_timeout(Duration::from_millis(500)))
        .and_then(|mut connection| {
            connection.set_read_timeout(Some(Duration::from_secs(2)))?;
            redis::cmd("INFO").arg("replication").query::<String>(&mut connection)
        });
    answer.unwrap_or_else(|err| format!("no INFO answer: {err}"))
}

/// The role a server reports (`master`, `slave`), if it answers.
pub fn role(server: &RedisProcess) -> Option<String> {
    let mut connection = redis::Client::open(server.url())
        .ok()?
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    let reply: Vec<redis::Value> = redis::cmd("ROLE").query(&mut connection).ok()?;
    match reply.first()? {
        redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        redis::Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// A master and a replica of it, once the replica is in sync.
pub fn master_and_replica() -> (RedisProcess, RedisProcess) {
    let master = RedisProcess::start(&[]);
    let port = master.port().to_string();
    let replica = RedisProcess::start(&["--replicaof", "127.0.0.1", &port]);
    poll("the replica to sync", Duration::from_secs(20), || {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut replica.connection()).ok()?;
        info.contains("master_link_status:up").then_some(())
    });
    (master, replica)
}

/// The answers on `server`'s stream `results`, every answer of each request id; none while the
/// server cannot be reached (a test polls through a failover).
pub fn answers(server: &RedisProcess, results: &str) -> HashMap<String, Vec<Value>> {
    let mut answers: HashMap<String, Vec<Value>> = HashMap::new();
    let Ok(mut connection) = redis::Client::open(server.url()).and_then(|client| client.get_connection())
    else {
        return answers;
    };
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg(results).arg("-").arg("+").query(&mut connection).unwrap_or_default();
    for (_, fields) in entries {
        let Some((_, payload)) = fields.into_iter().find(|(name, _)| name == "payload") else { continue };
        let payload: Value = serde_json::from_str(&payload).expect("answer payload is JSON");
        if let Some(id) = payload["data"]["request_id"].as_str() {
            answers.entry(id.to_owned()).or_default().push(payload);
        }
    }
    answers
}

/// Calls `probe` every 50 ms until it returns something, panicking with `what` after `timeout`.
pub fn poll<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
