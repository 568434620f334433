//! The fleet benchmark: throughput with 1, 2 and 4 replicas of toolhost against one Redis and
//! against a 3-master Redis Cluster, with the CPU split per process (each replica, each Redis,
//! the load generator).
//!
//! Every replica belongs to one toolbox and reads the requests stream. With one shard (the
//! default) that stream lives on one node of the cluster: the curve is expected to stay flat
//! there, and this measures what the cluster path costs per request. `--shards N` splits it
//! (`[streams] shards`), the generator putting each request on its shard by the contract's rule,
//! and the report gives the busiest Redis node's share of the Redis CPU.
//!
//! The `replicated` topology is a master with one replica (issue 37): one toolhost, `echo` and
//! `terminal_run` (a tool that is not idempotent, so tracked) with `[redis] replica_acks` 0 and
//! 1, and the `WAIT`s the master ran per request (`INFO commandstats`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use tokio::process::{Child, Command};

use crate::envelope::{RESULTS_STREAM, RequestKind};
use crate::load::{self, Generator, LoadSpec};
use crate::procfs::{self, MachineInfo};
use crate::redis_server::{RedisCluster, RedisServer};

/// Where Redis runs for a fleet row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// One `redis-server`.
    Single,
    /// Three masters (or `--cluster-masters`), no replicas.
    Cluster,
    /// A master and one replica of it: the `replica_acks` rows.
    Replicated,
}

impl Topology {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Single => "single",
            Topology::Cluster => "cluster",
            Topology::Replicated => "replicated",
        }
    }
}

/// What the fleet benchmark runs.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    /// Topologies, in order.
    pub topologies: Vec<Topology>,
    /// Replica counts, in order.
    pub replicas: Vec<usize>,
    /// Shard counts of the requests stream (`[streams] shards`), in order; each replica count
    /// runs with each.
    pub shards: Vec<usize>,
    /// Whether each replica reads only its part of the shards (`[streams] read_shards`: replica
    /// i of R reads the shards k with k mod R = i) instead of all of them.
    pub split_shards: bool,
    /// Whether requests name a results topic of their shard's slot instead of the default one.
    pub shard_results: bool,
    /// `[dispatch] ledger_format` of the replicas (1, 2 or 3).
    pub ledger_format: u8,
    /// Masters of the cluster topology (3 by default; 1 is a cluster-mode server holding every
    /// slot, which separates what the cluster path costs from what spreading it over nodes does).
    pub cluster_masters: usize,
    /// Requests in flight.
    pub in_flight: usize,
    /// Length of the measured run.
    pub duration: Duration,
    /// Warm-up before it.
    pub warmup: Duration,
    /// The `toolhost` executable.
    pub toolhost_bin: PathBuf,
    /// Where target logs go.
    pub out_dir: PathBuf,
}

/// One process's share of a row.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessCpu {
    /// `toolhost-1`, `redis-0`, `load`.
    pub process: String,
    /// CPU time per answered request, µs.
    pub us_per_request: f64,
    /// CPU time over wall time: 1.0 is one core busy.
    pub cores: f64,
}

/// One command on one Redis node, per answered request.
#[derive(Clone, Debug, Serialize)]
pub struct NodeCommand {
    /// `redis-0`, `redis-1`, ...
    pub node: String,
    /// The command, as `INFO commandstats` names it (`evalsha`, `xadd`, `xgroup|create`).
    pub command: String,
    /// Calls per answered request.
    pub calls_per_request: f64,
    /// Microseconds per answered request.
    pub us_per_request: f64,
}

/// One measured fleet row.
#[derive(Clone, Debug, Serialize)]
pub struct FleetRow {
    /// Where Redis ran.
    pub topology: Topology,
    /// Replicas of toolhost.
    pub replicas: usize,
    /// Shards of the requests stream.
    pub shards: usize,
    /// Whether each replica read only its part of the shards.
    pub split_shards: bool,
    /// Whether answers went to a results topic per shard.
    pub shard_results: bool,
    /// What was called: `echo`, or `terminal_run` running `echo hi`.
    pub tool: String,
    /// `[redis] replica_acks` of toolhost (the replicated topology's rows only).
    pub replica_acks: Option<u32>,
    /// `WAIT`s the master ran per answered request (the replicated topology's rows only).
    pub waits_per_request: Option<f64>,
    /// Requests in flight.
    pub in_flight: usize,
    /// Answered requests per second.
    pub rps: f64,
    /// Latency percentiles, µs.
    pub p50_us: u64,
    /// 99th percentile latency, µs.
    pub p99_us: u64,
    /// Answered requests.
    pub n_answered: u64,
    /// Answers with `success: false`.
    pub n_failed: u64,
    /// Requests unanswered within the load generator's limit, or not sent.
    pub n_timeouts: u64,
    /// `[dispatch] ledger_format` of the replicas.
    pub ledger_format: u8,
    /// Masters: the cluster's, else 1.
    pub masters: usize,
    /// CPU per process.
    pub cpu: Vec<ProcessCpu>,
    /// What each Redis node ran per answered request, by command (`INFO commandstats`: the
    /// commands scripts run are counted under their own names too, and their time inside the
    /// script's), the load generator's included.
    pub commands: Vec<NodeCommand>,
    /// Why the row is incomplete.
    pub error: Option<String>,
}

impl FleetRow {
    /// What went wrong in the row, for the report: the harness's error, or the failed and
    /// unanswered requests, or `none`.
    fn errors(&self) -> String {
        match &self.error {
            Some(error) => error.clone(),
            None if self.n_failed + self.n_timeouts > 0 => {
                format!("{} failed, {} unanswered", self.n_failed, self.n_timeouts)
            }
            None => "none".to_owned(),
        }
    }

    fn sum(&self, prefix: &str) -> f64 {
        self.cpu.iter().filter(|cpu| cpu.process.starts_with(prefix)).map(|cpu| cpu.us_per_request).sum()
    }
}

/// The fleet benchmark's report.
#[derive(Clone, Debug, Serialize)]
pub struct FleetReport {
    /// Where it ran.
    pub machine: MachineInfo,
    /// Its rows.
    pub rows: Vec<FleetRow>,
}

impl FleetReport {
    /// The Markdown table, one row per topology and replica count, CPU per request by component.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let fleet: Vec<&FleetRow> =
            self.rows.iter().filter(|row| row.topology != Topology::Replicated).collect();
        if !fleet.is_empty() {
            out.push_str(
                "| Redis | replicas | shards | req/s | p50 µs | p99 µs | toolhost CPU µs/req (per replica) | Redis CPU µs/req (per node) | busiest node's share | load µs/req | errors |\n\
                 |---|---:|---:|---:|---:|---:|---|---|---:|---:|---|\n",
            );
        }
        for row in fleet {
            let parts = |prefix: &str| {
                row.cpu
                    .iter()
                    .filter(|cpu| cpu.process.starts_with(prefix))
                    .map(|cpu| format!("{:.1}", cpu.us_per_request))
                    .collect::<Vec<_>>()
                    .join(" + ")
            };
            let errors = row.errors();
            let busiest = row
                .cpu
                .iter()
                .filter(|cpu| cpu.process.starts_with("redis"))
                .map(|cpu| cpu.us_per_request)
                .fold(0.0_f64, f64::max);
            let share = if row.sum("redis") > 0.0 { 100.0 * busiest / row.sum("redis") } else { 0.0 };
            let masters = match row.topology {
                Topology::Cluster if row.masters != 3 => {
                    format!(" ({} master{})", row.masters, if row.masters == 1 { "" } else { "s" })
                }
                _ => String::new(),
            };
            out.push_str(&format!(
                "| {}{masters} | {} | {}{} | {:.0} | {} | {} | {:.1} ({}) | {:.1} ({}) | {share:.0} % | {:.1} | {} |\n",
                row.topology.name(),
                row.replicas,
                row.shards,
                match (row.split_shards, row.shard_results) {
                    (true, true) => " (split, results per shard)",
                    (true, false) => " (split)",
                    (false, true) => " (results per shard)",
                    (false, false) => "",
                },
                row.rps,
                row.p50_us,
                row.p99_us,
                row.sum("toolhost"),
                parts("toolhost"),
                row.sum("redis"),
                parts("redis"),
                row.sum("load"),
                errors,
            ));
        }
        out.push_str(&commands_markdown(&self.rows));
        let replicated: Vec<&FleetRow> =
            self.rows.iter().filter(|row| row.topology == Topology::Replicated).collect();
        if !replicated.is_empty() {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(
                "| tool (master + 1 replica) | replica_acks | req/s | p50 µs | p99 µs | WAITs/req | toolhost CPU µs/req | Redis CPU µs/req (master + replica) | errors |\n\
                 |---|---:|---:|---:|---:|---:|---:|---|---|\n",
            );
            for row in replicated {
                let redis: Vec<String> = row
                    .cpu
                    .iter()
                    .filter(|cpu| cpu.process.starts_with("redis"))
                    .map(|cpu| format!("{:.1}", cpu.us_per_request))
                    .collect();
                let errors = row.errors();
                out.push_str(&format!(
                    "| {} | {} | {:.0} | {} | {} | {:.3} | {:.1} | {} | {} |\n",
                    row.tool,
                    row.replica_acks.unwrap_or(0),
                    row.rps,
                    row.p50_us,
                    row.p99_us,
                    row.waits_per_request.unwrap_or(0.0),
                    row.sum("toolhost"),
                    redis.join(" + "),
                    errors,
                ));
            }
        }
        out
    }

    /// Writes `fleet.json` and `fleet.md` into `dir`.
    ///
    /// # Errors
    ///
    /// When the files cannot be written.
    pub fn write(&self, dir: &std::path::Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("fleet.json"), serde_json::to_string_pretty(self)?)?;
        std::fs::write(dir.join("fleet.md"), self.to_markdown())?;
        Ok(())
    }
}

/// The per-node command table of the fleet rows: for each row, every command a node ran at
/// least 0.01 times per answered request, µs and calls per request.
fn commands_markdown(rows: &[FleetRow]) -> String {
    let mut out = String::new();
    for row in rows.iter().filter(|row| row.topology != Topology::Replicated && !row.commands.is_empty()) {
        out.push_str(&format!(
            "\nRedis by node and command, {} with {} replica(s), {} shard(s), ledger format {}: µs per answered request (calls per request)\n\n| node | commands |\n|---|---|\n",
            row.topology.name(),
            row.replicas,
            row.shards,
            row.ledger_format
        ));
        let mut nodes: Vec<&str> = row.commands.iter().map(|command| command.node.as_str()).collect();
        nodes.dedup();
        for node in nodes {
            let cells: Vec<String> = row
                .commands
                .iter()
                .filter(|command| command.node == node && command.calls_per_request >= 0.01)
                .map(|command| {
                    format!(
                        "`{}` {:.1} ({:.2})",
                        command.command, command.us_per_request, command.calls_per_request
                    )
                })
                .collect();
            out.push_str(&format!("| {node} | {} |\n", cells.join(", ")));
        }
    }
    out
}

/// Streams with the URL of the node holding each.
type Keyed = Vec<(String, String)>;

/// A running Redis of any topology.
enum Redis {
    Single(RedisServer),
    Cluster(RedisCluster),
    /// A master and its replica.
    Replicated(RedisServer, RedisServer),
}

impl Redis {
    fn start(topology: Topology, cluster_masters: usize) -> anyhow::Result<Redis> {
        Ok(match topology {
            Topology::Single => Redis::Single(RedisServer::start()?),
            Topology::Cluster => Redis::Cluster(RedisCluster::start(cluster_masters)?),
            Topology::Replicated => {
                let master = RedisServer::start()?;
                let port = master.url().rsplit(':').next().unwrap_or_default().to_owned();
                let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port])?;
                wait_for_sync(&replica)?;
                Redis::Replicated(master, replica)
            }
        })
    }

    /// Every server, for CPU accounting.
    fn servers(&self) -> Vec<&RedisServer> {
        match self {
            Redis::Single(server) => vec![server],
            Redis::Cluster(cluster) => cluster.nodes().iter().collect(),
            Redis::Replicated(master, replica) => vec![master, replica],
        }
    }

    /// The servers that take writes (a replica refuses `FLUSHALL` and repeats its master's keys).
    fn primaries(&self) -> Vec<&RedisServer> {
        match self {
            Redis::Replicated(master, _) => vec![master],
            _ => self.servers(),
        }
    }

    /// The environment that points toolhost at this Redis.
    fn env(&self) -> Vec<(String, String)> {
        match self {
            Redis::Single(server) | Redis::Replicated(server, _) => {
                vec![("REDIS_URL".to_owned(), server.url())]
            }
            Redis::Cluster(cluster) => {
                let nodes: Vec<String> = cluster.nodes().iter().map(RedisServer::url).collect();
                vec![
                    ("REDIS_URL".to_owned(), nodes[0].clone()),
                    ("TOOLHOST__REDIS__CLUSTER_NODES".to_owned(), nodes.join(",")),
                ]
            }
        }
    }

    /// Where the load generator publishes requests (each of `shards` shards' stream and the
    /// URL of its node) and reads answers: the default results topic, or with `private` one
    /// results topic per shard in the shard's own slot (`results:bench:{<tag>}`), as callers on
    /// private streams spread theirs.
    fn endpoints(&self, shards: usize, private: bool) -> anyhow::Result<(Keyed, Keyed)> {
        let streams: Vec<String> = (0..shards.max(1)).map(|k| crate::shards::stream(k, shards)).collect();
        let topics: Vec<String> = if private {
            streams
                .iter()
                .map(|stream| match stream.split_once(':') {
                    Some((_, tag)) => format!("results:bench:{tag}"),
                    None => "results:bench".to_owned(),
                })
                .collect()
        } else {
            vec![RESULTS_STREAM.to_owned()]
        };
        let url_for = |key: &str| -> anyhow::Result<String> {
            match self {
                Redis::Single(server) | Redis::Replicated(server, _) => Ok(server.url()),
                Redis::Cluster(cluster) => cluster.url_for(key),
            }
        };
        let publish = streams
            .into_iter()
            .map(|stream| Ok((url_for(&stream)?, stream)))
            .collect::<anyhow::Result<Vec<(String, String)>>>()?;
        let reads = topics
            .into_iter()
            .map(|topic| Ok((url_for(&topic)?, topic)))
            .collect::<anyhow::Result<Vec<(String, String)>>>()?;
        let swap = |pairs: Vec<(String, String)>| pairs.into_iter().map(|(url, key)| (key, url)).collect();
        Ok((swap(publish), swap(reads)))
    }

    async fn flush(&self) -> anyhow::Result<()> {
        for server in self.primaries() {
            let mut connection =
                redis::Client::open(server.url())?.get_multiplexed_async_connection().await?;
            let () = redis::cmd("FLUSHALL").query_async(&mut connection).await.context("FLUSHALL")?;
        }
        Ok(())
    }

    /// Heartbeats of live replicas, counted on every node.
    async fn heartbeats(&self) -> anyhow::Result<usize> {
        let mut count = 0;
        for server in self.primaries() {
            let mut connection =
                redis::Client::open(server.url())?.get_multiplexed_async_connection().await?;
            let keys: Vec<String> =
                redis::cmd("KEYS").arg("toolhost:heartbeat:*").query_async(&mut connection).await?;
            count += keys.len();
        }
        Ok(count)
    }

    /// Each server's CPU time so far, µs, from `/proc`.
    fn cpu_us(&self, ticks_per_second: u64) -> Vec<Option<f64>> {
        self.servers().iter().map(|server| cpu_us(server.pid(), ticks_per_second)).collect()
    }
}

/// Waits up to 20 s until `replica` reports its link to the master up.
fn wait_for_sync(replica: &RedisServer) -> anyhow::Result<()> {
    let mut connection = redis::Client::open(replica.url())?.get_connection()?;
    let started = Instant::now();
    loop {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut connection)?;
        if info.contains("master_link_status:up") {
            return Ok(());
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(20), "the replica did not sync within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Calls and microseconds of every command `server` has run (`INFO commandstats`).
async fn commandstats(server: &RedisServer) -> anyhow::Result<BTreeMap<String, (u64, u64)>> {
    let mut connection = redis::Client::open(server.url())?.get_multiplexed_async_connection().await?;
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut connection).await?;
    let field = |fields: &str, name: &str| {
        fields.split(',').find_map(|field| field.strip_prefix(name)).and_then(|value| value.parse().ok())
    };
    Ok(stats
        .lines()
        .filter_map(|line| line.strip_prefix("cmdstat_")?.split_once(':'))
        .filter_map(|(command, fields)| {
            Some((command.to_owned(), (field(fields, "calls=")?, field(fields, "usec=")?)))
        })
        .collect())
}

/// How many `WAIT`s `server` has run.
async fn waits(server: &RedisServer) -> anyhow::Result<u64> {
    Ok(commandstats(server).await?.get("wait").map_or(0, |&(calls, _)| calls))
}

fn cpu_us(pid: u32, ticks_per_second: u64) -> Option<f64> {
    procfs::cpu_ticks(pid).ok().map(|ticks| ticks as f64 * 1e6 / ticks_per_second as f64)
}

/// Runs every topology and replica count.
///
/// # Errors
///
/// Only when a topology cannot be started at all; a failing row records its error.
pub async fn run(options: &FleetOptions) -> anyhow::Result<FleetReport> {
    let mut report = FleetReport { machine: MachineInfo::collect(), rows: Vec::new() };
    for &topology in &options.topologies {
        let redis = Redis::start(topology, options.cluster_masters)
            .with_context(|| format!("starting the {} Redis", topology.name()))?;
        // The replicated topology's rows: one toolhost, each tool with replica_acks 0 and 1.
        let rows: Vec<(usize, usize, RequestKind, Option<u32>)> = match topology {
            Topology::Replicated => [RequestKind::echo(100), RequestKind::TerminalRun]
                .into_iter()
                .flat_map(|kind| [(1, 1, kind.clone(), Some(0)), (1, 1, kind, Some(1))])
                .collect(),
            _ => options
                .shards
                .iter()
                .flat_map(|&shards| {
                    options
                        .replicas
                        .iter()
                        .map(move |&replicas| (replicas, shards, RequestKind::echo(100), None))
                })
                .collect(),
        };
        for (replicas, shards, kind, replica_acks) in rows {
            let acks = replica_acks.map(|acks| format!(", replica_acks {acks}")).unwrap_or_default();
            eprintln!(
                "bench: fleet {} with {replicas} replica(s), {shards} shard(s), {}{acks}",
                topology.name(),
                tool_name(&kind)
            );
            let row = measure(options, &redis, topology, (replicas, shards), kind, replica_acks).await;
            if let Some(error) = &row.error {
                eprintln!("bench:   error: {error}");
            }
            report.rows.push(row);
        }
    }
    Ok(report)
}

/// The tool a request kind calls, for reports.
fn tool_name(kind: &RequestKind) -> String {
    kind.event_type().trim_end_matches(".requested").to_owned()
}

async fn measure(
    options: &FleetOptions,
    redis: &Redis,
    topology: Topology,
    (replicas, shards): (usize, usize),
    kind: RequestKind,
    replica_acks: Option<u32>,
) -> FleetRow {
    let mut row = FleetRow {
        topology,
        replicas,
        shards,
        split_shards: options.split_shards && shards >= replicas && shards > 1,
        shard_results: options.shard_results,
        tool: tool_name(&kind),
        replica_acks,
        waits_per_request: None,
        ledger_format: options.ledger_format,
        masters: match redis {
            Redis::Cluster(cluster) => cluster.nodes().len(),
            _ => 1,
        },
        in_flight: options.in_flight,
        rps: 0.0,
        p50_us: 0,
        p99_us: 0,
        n_answered: 0,
        n_failed: 0,
        n_timeouts: 0,
        cpu: Vec::new(),
        commands: Vec::new(),
        error: None,
    };
    let mut children = Vec::new();
    if let Err(err) = run_row(options, redis, &mut row, kind, &mut children).await {
        row.error = Some(format!("{err:#}"));
    }
    for mut child in children {
        let _ = child.kill().await;
    }
    row
}

async fn run_row(
    options: &FleetOptions,
    redis: &Redis,
    row: &mut FleetRow,
    kind: RequestKind,
    children: &mut Vec<Child>,
) -> anyhow::Result<()> {
    redis.flush().await?;
    let mut env = redis.env();
    if let Some(acks) = row.replica_acks {
        env.push(("TOOLHOST__REDIS__REPLICA_ACKS".to_owned(), acks.to_string()));
    }
    if matches!(kind, RequestKind::TerminalRun) {
        env.push(("TERMINAL_ALLOWED_COMMANDS".to_owned(), "echo".to_owned()));
    }
    env.push(("TOOLHOST__STREAMS__SHARDS".to_owned(), row.shards.to_string()));
    env.push(("TOOLHOST__DISPATCH__LEDGER_FORMAT".to_owned(), row.ledger_format.to_string()));
    for index in 0..row.replicas {
        let mut env = env.clone();
        if row.split_shards {
            let mine: Vec<String> =
                (0..row.shards).filter(|k| k % row.replicas == index).map(|k| k.to_string()).collect();
            env.push(("TOOLHOST__STREAMS__READ_SHARDS".to_owned(), mine.join(",")));
        }
        let acks = row.replica_acks.map(|acks| format!("-{}-acks-{acks}", row.tool)).unwrap_or_default();
        let log_path = options.out_dir.join(format!(
            "fleet-{}-{}-shards-{}{acks}-replica-{index}.log",
            row.topology.name(),
            row.replicas,
            row.shards
        ));
        std::fs::create_dir_all(&options.out_dir)?;
        let log = std::fs::File::create(&log_path)?;
        let child = Command::new(&options.toolhost_bin)
            .arg("serve")
            .envs(env.iter().map(|(name, value)| (name, value)))
            .env("TOOLHOST__HTTP__LISTEN", "127.0.0.1:0")
            .env("TOOLHOST__LOG__LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", options.toolhost_bin.display()))?;
        children.push(child);
    }
    let started = Instant::now();
    while redis.heartbeats().await? < row.replicas {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "the replicas did not all heartbeat within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (publish, read) = redis.endpoints(row.shards, options.shard_results)?;
    let warmup = LoadSpec {
        generator: Generator::Harness,
        in_flight: row.in_flight,
        kind: kind.clone(),
        duration: options.warmup,
        max_requests: None,
    };
    let warm = load::run_sharded(&publish, &read, &warmup).await?;
    anyhow::ensure!(
        warm.n_answered() > 0,
        "no answer during warm-up: {}",
        warm.first_error.unwrap_or_default()
    );

    let ticks = procfs::ticks_per_second();
    let pids: Vec<u32> = children.iter().filter_map(Child::id).collect();
    anyhow::ensure!(pids.len() == row.replicas, "a replica exited before the run");
    let replicas_before: Vec<Option<f64>> = pids.iter().map(|&pid| cpu_us(pid, ticks)).collect();
    let redis_before = redis.cpu_us(ticks);
    let load_before = cpu_us(std::process::id(), ticks);
    let mut stats_before = Vec::new();
    for server in redis.primaries() {
        stats_before.push(commandstats(server).await?);
    }
    let waits_before = match redis.primaries().first() {
        Some(master) if row.replica_acks.is_some() => Some(waits(master).await?),
        _ => None,
    };
    let spec = LoadSpec {
        generator: Generator::Harness,
        in_flight: row.in_flight,
        kind,
        duration: options.duration,
        max_requests: None,
    };
    let load = load::run_sharded(&publish, &read, &spec).await?;
    let replicas_after: Vec<Option<f64>> = pids.iter().map(|&pid| cpu_us(pid, ticks)).collect();
    let redis_after = redis.cpu_us(ticks);
    let load_after = cpu_us(std::process::id(), ticks);
    let answered = load.n_answered().max(1) as f64;
    for (index, (server, before)) in redis.primaries().into_iter().zip(&stats_before).enumerate() {
        for (command, (calls, usec)) in commandstats(server).await? {
            let (calls_before, usec_before) = before.get(&command).copied().unwrap_or_default();
            row.commands.push(NodeCommand {
                node: format!("redis-{index}"),
                command,
                calls_per_request: calls.saturating_sub(calls_before) as f64 / answered,
                us_per_request: usec.saturating_sub(usec_before) as f64 / answered,
            });
        }
    }
    if let (Some(before), Some(master)) = (waits_before, redis.primaries().first()) {
        let after = waits(master).await?;
        row.waits_per_request = Some(after.saturating_sub(before) as f64 / load.n_answered().max(1) as f64);
    }

    row.rps = load.rps();
    row.p50_us = load.histogram.value_at_quantile(0.5);
    row.p99_us = load.histogram.value_at_quantile(0.99);
    row.n_answered = load.n_answered();
    row.n_failed = load.n_failed;
    row.n_timeouts = load.n_timeouts + load.n_send_errors;
    let wall_us = load.elapsed.as_secs_f64() * 1e6;
    let answered = row.n_answered.max(1) as f64;
    let mut share = |process: String, before: Option<f64>, after: Option<f64>| {
        if let (Some(before), Some(after)) = (before, after) {
            let used = (after - before).max(0.0);
            row.cpu.push(ProcessCpu { process, us_per_request: used / answered, cores: used / wall_us });
        }
    };
    for (index, (before, after)) in replicas_before.into_iter().zip(replicas_after).enumerate() {
        share(format!("toolhost-{index}"), before, after);
    }
    for (index, (before, after)) in redis_before.into_iter().zip(redis_after).enumerate() {
        share(format!("redis-{index}"), before, after);
    }
    share("load".to_owned(), load_before, load_after);
    if let Some(error) = load.first_error {
        row.error = Some(error);
    }
    Ok(())
}
