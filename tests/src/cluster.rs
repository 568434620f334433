//! A Redis Cluster of `redis-server` processes on free loopback ports: masters, optionally with
//! a replica each, joined by `redis-cli --cluster create`.

use std::process::Command;
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};
use serde_json::Value;

use crate::RedisProcess;

/// A running cluster. Every node is killed on drop.
pub struct RedisCluster {
    nodes: Vec<RedisProcess>,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each, creates the cluster and waits
    /// until every node reports `cluster_state:ok` and every replica has synced.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let count = masters * (1 + replicas);
        let nodes: Vec<RedisProcess> = (0..count)
            .map(|_| {
                RedisProcess::start(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes.iter().map(|node| format!("127.0.0.1:{}", node.port())).collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes")
            .output()
            .expect("redis-cli must be installed");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok(Duration::from_secs(30));
        cluster
    }

    /// The nodes as `host:port`, for `[redis] cluster_nodes`.
    pub fn addresses(&self) -> Vec<String> {
        self.nodes.iter().map(|node| format!("127.0.0.1:{}", node.port())).collect()
    }

    /// The nodes, comma-separated, for `TOOLHOST__REDIS__CLUSTER_NODES`.
    pub fn nodes_env(&self) -> String {
        self.addresses().join(",")
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisProcess] {
        &self.nodes
    }

    /// A cluster connection, for set-up and checks.
    pub fn connection(&self) -> ClusterConnection {
        let urls: Vec<String> = self.nodes.iter().map(RedisProcess::url).collect();
        ClusterClient::builder(urls)
            .retries(20)
            .build()
            .expect("cluster client")
            .get_connection()
            .expect("connect to the test cluster")
    }

    /// Waits until every live node says `cluster_state:ok`, knows all slots, and every replica's
    /// link to its master is up.
    pub fn wait_until_ok(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let ok = self.nodes.iter().filter(|node| node.pid() != 0).all(|node| {
                let Ok(mut connection) =
                    redis::Client::open(node.url()).and_then(|client| client.get_connection())
                else {
                    return false;
                };
                let info: String =
                    redis::cmd("CLUSTER").arg("INFO").query(&mut connection).unwrap_or_default();
                let replication: String =
                    redis::cmd("INFO").arg("replication").query(&mut connection).unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && (replication.contains("role:master") || replication.contains("master_link_status:up"))
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not become ok within {timeout:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The slot of `key`, as the cluster computes it.
    pub fn slot(&self, key: &str) -> u16 {
        let mut connection = self.nodes[0].connection();
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut connection).expect("CLUSTER KEYSLOT")
    }

    /// The node serving `slot` as master.
    pub fn master_of(&self, slot: u16) -> &RedisProcess {
        let port = *self.masters_of(slot).first().expect("a master serves the slot");
        self.nodes.iter().find(|node| node.port() == port).expect("a node on that port")
    }

    /// A replica of the master serving `slot`.
    pub fn replica_of(&self, slot: u16) -> &RedisProcess {
        let master = self.master_of(slot);
        let mut connection = master.connection();
        let id: String = redis::cmd("CLUSTER").arg("MYID").query(&mut connection).expect("CLUSTER MYID");
        self.nodes
            .iter()
            .filter(|node| node.pid() != 0 && node.port() != master.port())
            .find(|node| {
                let nodes: String =
                    redis::cmd("CLUSTER").arg("NODES").query(&mut node.connection()).unwrap_or_default();
                nodes.lines().any(|line| line.contains("myself") && line.contains(&id))
            })
            .expect("the master has a replica")
    }

    /// `CLUSTER FAILOVER` on a replica of the master serving `slot`: the replica becomes master in
    /// a coordinated switch. Returns once it reports itself master and the cluster is ok.
    pub fn failover(&self, slot: u16) -> u16 {
        let replica = self.replica_of(slot);
        let mut connection = replica.connection();
        let () = redis::cmd("CLUSTER").arg("FAILOVER").query(&mut connection).expect("CLUSTER FAILOVER");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let role: String =
                redis::cmd("INFO").arg("replication").query(&mut connection).unwrap_or_default();
            if role.contains("role:master") {
                break;
            }
            assert!(Instant::now() < deadline, "the replica did not take over");
            std::thread::sleep(Duration::from_millis(50));
        }
        // The promoted replica says `master` before the old master has heard of it: until then
        // the old one still says `master` and claims the slot, and `master_of` could name it.
        let port = replica.port();
        while self.masters_of(slot).iter().any(|&master| master != port) {
            assert!(Instant::now() < deadline, "the old master did not give the slot up");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.wait_until_ok(Duration::from_secs(30));
        port
    }

    /// The ports of the live nodes that say they are a master serving `slot`: one, but two for
    /// a moment during a failover.
    fn masters_of(&self, slot: u16) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|node| node.pid() != 0)
            .filter(|node| {
                let mut connection = node.connection();
                let role: String =
                    redis::cmd("INFO").arg("replication").query(&mut connection).unwrap_or_default();
                let nodes: String =
                    redis::cmd("CLUSTER").arg("NODES").query(&mut connection).unwrap_or_default();
                role.contains("role:master") && owns(&nodes, slot)
            })
            .map(RedisProcess::port)
            .collect()
    }
}

/// Whether the `CLUSTER NODES` line of `myself` lists `slot` among its ranges.
fn owns(nodes: &str, slot: u16) -> bool {
    nodes.lines().filter(|line| line.contains("myself")).any(|line| {
        line.split_whitespace().skip(8).any(|range| {
            let (start, end) = range.split_once('-').unwrap_or((range, range));
            match (start.parse::<u16>(), end.parse::<u16>()) {
                (Ok(start), Ok(end)) => (start..=end).contains(&slot),
                _ => false,
            }
        })
    })
}

/// Every payload of `stream`, parsed (`null` for one that is not JSON), oldest first.
pub fn payloads(connection: &mut ClusterConnection, stream: &str) -> Vec<Value> {
    let mut found = Vec::new();
    let mut start = "-".to_owned();
    loop {
        let page: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(500)
            .query(connection)
            .expect("XRANGE");
        let Some((last, _)) = page.last() else { return found };
        start = format!("({last}");
        for (_, fields) in page {
            let payload = fields.into_iter().find(|(name, _)| name == "payload").map(|(_, payload)| payload);
            found
                .push(payload.and_then(|payload| serde_json::from_str(&payload).ok()).unwrap_or(Value::Null));
        }
    }
}
