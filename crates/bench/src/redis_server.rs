//! A private `redis-server` on a free loopback port, killed when dropped.
//!
//! Persistence is off (`--save "" --appendonly no`) so disk never enters the numbers.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// A running `redis-server` owned by the harness.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts `redis-server` from `PATH` and waits until it answers PING.
    ///
    /// # Errors
    ///
    /// When no port is free, `redis-server` is not on `PATH`, or it does not answer in 10 s.
    pub fn start() -> anyhow::Result<Self> {
        RedisServer::start_with(&[])
    }

    /// [`RedisServer::start`] with extra `redis-server` arguments.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`].
    pub fn start_with(extra_args: &[&str]) -> anyhow::Result<Self> {
        // Binding port 0 and releasing it leaves a tiny race with other processes; the
        // readiness check below catches a server that lost it.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .context("finding a free loopback port")?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting redis-server (is it on PATH?)")?;
        let server = RedisServer { child, port };
        server.wait_until_ready(Duration::from_secs(10))?;
        Ok(server)
    }

    /// The URL clients connect with.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's process id, for its CPU and memory accounting.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_until_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let client = redis::Client::open(self.url())?;
        let started = Instant::now();
        loop {
            let pong: redis::RedisResult<String> =
                client.get_connection().and_then(|mut connection| redis::cmd("PING").query(&mut connection));
            match pong {
                Ok(_) => return Ok(()),
                Err(err) if started.elapsed() > limit => {
                    return Err(err).context(format!("redis-server on port {} did not answer", self.port));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // Errors mean the server already exited, which is what we want anyway.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private Redis Cluster: `masters` `redis-server --cluster-enabled yes` processes on free
/// loopback ports, joined by `redis-cli --cluster create`, without replicas; one master takes
/// every slot with `CLUSTER ADDSLOTSRANGE`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    dir: std::path::PathBuf,
}

impl RedisCluster {
    /// Starts the nodes, creates the cluster and waits until every node says `cluster_state:ok`.
    ///
    /// # Errors
    ///
    /// When a node does not start, `redis-cli` is missing or fails, or the cluster does not
    /// come up within 30 s.
    pub fn start(masters: usize) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("toolhost-bench-cluster-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut nodes = Vec::with_capacity(masters);
        for index in 0..masters {
            let node_dir = dir.join(format!("node-{index}"));
            std::fs::create_dir_all(&node_dir)?;
            let conf = node_dir.join("nodes.conf");
            nodes.push(RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &conf.to_string_lossy(),
                "--cluster-node-timeout",
                "5000",
                "--dir",
                &node_dir.to_string_lossy(),
            ])?);
        }
        if masters == 1 {
            // `redis-cli --cluster create` wants three masters: one node takes every slot itself.
            let mut connection = redis::Client::open(nodes[0].url())?.get_connection()?;
            let () = redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(0).arg(16383).query(&mut connection)?;
            let cluster = RedisCluster { nodes, dir };
            cluster.wait_until_ok()?;
            return Ok(cluster);
        }
        let addresses: Vec<String> = nodes.iter().map(|node| format!("127.0.0.1:{}", node.port)).collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .context("running redis-cli --cluster create (is redis-cli on PATH?)")?;
        anyhow::ensure!(
            created.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        let cluster = RedisCluster { nodes, dir };
        cluster.wait_until_ok()?;
        Ok(cluster)
    }

    /// Waits at most 30 s for every node to say `cluster_state:ok`.
    fn wait_until_ok(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        while !self.is_ok() {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "the cluster did not reach state ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn is_ok(&self) -> bool {
        self.nodes.iter().all(|node| {
            redis::Client::open(node.url())
                .and_then(|client| client.get_connection())
                .and_then(|mut connection| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut connection))
                .is_ok_and(|info| info.contains("cluster_state:ok"))
        })
    }

    /// The nodes, every one a master.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The URL of the node that serves `key`'s slot.
    ///
    /// # Errors
    ///
    /// When the nodes cannot be asked.
    pub fn url_for(&self, key: &str) -> anyhow::Result<String> {
        let mut connection = redis::Client::open(self.nodes[0].url())?.get_connection()?;
        let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut connection)?;
        let ranges: Vec<(u16, u16, Vec<redis::Value>)> =
            redis::cmd("CLUSTER").arg("SLOTS").query(&mut connection).map(|ranges: Vec<redis::Value>| {
                ranges
                    .into_iter()
                    .filter_map(|range| {
                        let redis::Value::Array(mut parts) = range else { return None };
                        if parts.len() < 3 {
                            return None;
                        }
                        let rest = parts.split_off(2);
                        let start: u16 = redis::from_redis_value(parts[0].clone()).ok()?;
                        let end: u16 = redis::from_redis_value(parts[1].clone()).ok()?;
                        Some((start, end, rest))
                    })
                    .collect()
            })?;
        for (start, end, owners) in ranges {
            if (start..=end).contains(&slot) {
                let redis::Value::Array(master) =
                    owners.into_iter().next().context("a slot range without a master")?
                else {
                    anyhow::bail!("unexpected CLUSTER SLOTS reply");
                };
                let port: u16 = redis::from_redis_value(master.get(1).cloned().context("no port")?)?;
                return Ok(format!("redis://127.0.0.1:{port}"));
            }
        }
        anyhow::bail!("no node serves slot {slot}")
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
