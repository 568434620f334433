//! Test support: `redis-server` processes on free loopback ports, a master and its replicas,
//! killed on drop, paused and resumed with SIGSTOP and SIGCONT.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server process owned by a test.
pub struct Server {
    port: u16,
    dir: PathBuf,
    child: Child,
}

/// A free loopback TCP port (bound, then released).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

impl Server {
    /// A server without persistence.
    pub fn master() -> Server {
        Server::start(&[])
    }

    /// A replica of `master`, started and in sync with it.
    pub fn replica_of(master: &Server) -> Server {
        let replica = Server::start(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if replica.info("replication").contains("master_link_status:up") {
                return replica;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the replica on port {} did not sync with its master", replica.port);
    }

    /// A Redis Cluster of this one server, which holds every slot.
    pub fn cluster_of_one() -> Server {
        let server = Server::start(&["--cluster-enabled", "yes"]);
        let mut connection = server.connection();
        let () = redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(0).arg(16383).query(&mut connection).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if server.cluster_info().contains("cluster_state:ok") {
                return server;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the cluster of one on port {} did not become ok", server.port);
    }

    /// A Redis Cluster of two masters without replicas, the first holding slots 0 to 8191 and
    /// the second the rest, so that a slot can be moved from one to the other.
    pub fn cluster_of_two() -> (Server, Server) {
        let first = Server::start(&["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]);
        let second = Server::start(&["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]);
        for (server, (start, end)) in [(&first, (0, 8191)), (&second, (8192, 16383))] {
            let () = redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(start)
                .arg(end)
                .query(&mut server.connection())
                .unwrap();
        }
        let () = redis::cmd("CLUSTER")
            .arg("MEET")
            .arg("127.0.0.1")
            .arg(second.port)
            .query(&mut first.connection())
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let ready = [&first, &second].iter().all(|server| {
                let info = server.cluster_info();
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:2")
            });
            if ready {
                return (first, second);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the cluster of two on ports {} and {} did not become ok", first.port, second.port);
    }

    /// The node's cluster id (`CLUSTER MYID`).
    pub fn cluster_id(&self) -> String {
        redis::cmd("CLUSTER").arg("MYID").query(&mut self.connection()).unwrap()
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn cluster_info(&self) -> String {
        redis::cmd("CLUSTER").arg("INFO").query(&mut self.connection()).unwrap()
    }

    /// `127.0.0.1:<port>`, a cluster's seed node.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn start(args: &[&str]) -> Server {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("toolhost-bus-test-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(args)
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the justfile installs it)");
        let server = Server { port, dir, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(mut connection) = redis::Client::open(server.url()).unwrap().get_connection()
                && redis::cmd("PING").query::<String>(&mut connection).is_ok()
            {
                return server;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not start on port {port}");
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A blocking connection for checks.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection().unwrap()
    }

    /// `INFO <section>`.
    pub fn info(&self, section: &str) -> String {
        redis::cmd("INFO").arg(section).query(&mut self.connection()).unwrap()
    }

    /// How many times the server ran `command` (`INFO commandstats`), 0 when never.
    pub fn calls(&self, command: &str) -> u64 {
        let stats = self.info("commandstats");
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse().unwrap())
    }

    /// SIGSTOP: the server hangs without closing connections (a replica then acknowledges
    /// nothing).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").arg(signal).arg(self.child.id().to_string()).status().unwrap();
        assert!(status.success(), "kill {signal} failed");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-CONT").arg(self.child.id().to_string()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
