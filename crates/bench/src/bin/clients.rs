//! `toolhost-bench-clients`: the Redis client's own CPU, side by side, for the two shapes of
//! traffic the daemon sends (issue 17 asks for this comparison before replacing redis-rs's
//! multiplexed connection, toolhost's largest single cost in its profile).
//!
//! Against one `redis-server` of its own, in one process on one runtime thread (the daemon's
//! default), each client runs:
//!
//! - **answer**: 64 tasks each await `EVALSHA` of a script with four keys and four arguments, one
//!   a 300-byte payload (an answer's shape), which returns 1: small replies, many in flight;
//! - **read**: one task loops `XRANGE` of 17 entries with an echo request's fields (a read
//!   batch's shape): few commands, large replies to parse.
//!
//! Clients:
//!
//! - `redis-rs multiplexed`: what toolhost uses; every task calls the shared connection;
//! - `redis-rs pipelined`: one task owns the connection and sends what the others queued as one
//!   explicit pipeline per round trip (a dedicated connection with explicit pipelining);
//! - `fred`: fred's client, every task calling it.
//!
//! Reported: operations per second and the process's CPU per operation (`/proc/self/stat`), the
//! median of the repetitions. The script does nothing, so Redis's cost is the same for all.
//!
//! ```text
//! cargo build --release -p toolhost-bench && target/release/toolhost-bench-clients
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use fred::interfaces::{ClientLike as _, LuaInterface as _, StreamsInterface as _};
use redis::aio::MultiplexedConnection;
use tokio::sync::{mpsc, oneshot};
use toolhost_bench::procfs;
use toolhost_bench::redis_server::RedisServer;

/// Compare Redis clients on the daemon's traffic shapes.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Seconds per repetition.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Repetitions per row; the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

/// Tasks in flight in the answer workload, as the daemon's benchmark row.
const IN_FLIGHT: usize = 64;
/// Entries per read, about the daemon's read batch at 64 in flight.
const READ_BATCH: usize = 17;
const SCRIPT: &str = "return 1";
const STREAM: &str = "bench-clients:requests";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    Multiplexed,
    Pipelined,
    Fred,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::Multiplexed => "redis-rs multiplexed",
            Client::Pipelined => "redis-rs pipelined",
            Client::Fred => "fred",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Answer,
    Read,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Answer => "answer (EVALSHA, 64 in flight)",
            Workload::Read => "read (XRANGE of 17 entries)",
        }
    }
}

/// One repetition's result.
#[derive(Clone, Copy, Debug)]
struct Rep {
    ops_per_s: f64,
    cpu_us_per_op: f64,
}

/// What each client needs to run a workload.
struct Setup {
    url: String,
    sha: String,
    payload: String,
}

/// The keys and arguments of one answer-shaped call.
fn answer_call(setup: &Setup, n: u64) -> (Vec<String>, Vec<String>) {
    let request = format!("r-{n}");
    let keys = vec![
        format!("toolhost:ledger:action-requests:answered:{request}"),
        format!("toolhost:ledger:action-requests:entry:{n}-0"),
        format!("toolhost:ledger:action-requests:call:{request}"),
        "action-results".to_owned(),
    ];
    let args =
        vec![format!("{n}-0"), uuid::Uuid::new_v4().to_string(), setup.payload.clone(), "0".to_owned()];
    (keys, args)
}

async fn redis_rs(url: &str) -> anyhow::Result<MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    Ok(client.get_multiplexed_async_connection().await?)
}

async fn fred_client(url: &str) -> anyhow::Result<fred::clients::Client> {
    let config = fred::types::config::Config::from_url(url)?;
    let client = fred::types::Builder::from_config(config).build()?;
    client.init().await?;
    Ok(client)
}

/// What every lane shares: the setup, the count of operations done and the stop flag.
#[derive(Clone)]
struct Lanes {
    setup: Arc<Setup>,
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Lanes {
    /// Spawns `count` tasks that each run `op(setup, n)` with a rising `n` until stopped,
    /// counting every operation.
    fn spawn<F, Fut>(&self, count: usize, op: F, tasks: &mut Vec<tokio::task::JoinHandle<anyhow::Result<()>>>)
    where
        F: Fn(Arc<Setup>, u64) -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
    {
        for lane in 0..count {
            let (lanes, op) = (self.clone(), op.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = lane as u64 * 1_000_000_000;
                while !lanes.stop.load(Ordering::Relaxed) {
                    op(Arc::clone(&lanes.setup), n).await?;
                    n += 1;
                    lanes.done.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(())
            }));
        }
    }
}

/// Runs `workload` on `client` for `duration`, counting operations.
async fn drive(
    client: Client,
    workload: Workload,
    setup: Arc<Setup>,
    duration: Duration,
) -> anyhow::Result<u64> {
    let lanes = Lanes { setup, done: Arc::new(AtomicU64::new(0)), stop: Arc::new(AtomicBool::new(false)) };
    let mut tasks = Vec::new();
    let count = if workload == Workload::Answer { IN_FLIGHT } else { 1 };
    match client {
        Client::Multiplexed => {
            let connection = redis_rs(&lanes.setup.url).await?;
            let op = move |setup: Arc<Setup>, n: u64| {
                let mut connection = connection.clone();
                async move {
                    let cmd = match workload {
                        Workload::Answer => {
                            let (keys, args) = answer_call(&setup, n);
                            let mut cmd = redis::cmd("EVALSHA");
                            cmd.arg(&setup.sha).arg(keys.len()).arg(&keys).arg(&args);
                            cmd
                        }
                        Workload::Read => read_cmd(),
                    };
                    let _: redis::Value = cmd.query_async(&mut connection).await?;
                    anyhow::Ok(())
                }
            };
            lanes.spawn(count, op, &mut tasks);
        }
        Client::Pipelined if workload == Workload::Read => {
            // One reader on its own connection: the pipeline is its one command.
            let connection = redis_rs(&lanes.setup.url).await?;
            let op = move |_setup: Arc<Setup>, _n: u64| {
                let mut connection = connection.clone();
                async move {
                    let mut pipe = redis::pipe();
                    pipe.add_command(read_cmd());
                    let _: Vec<redis::Value> = pipe.query_async(&mut connection).await?;
                    anyhow::Ok(())
                }
            };
            lanes.spawn(count, op, &mut tasks);
        }
        Client::Pipelined => {
            type Queued = ((Vec<String>, Vec<String>), oneshot::Sender<redis::Value>);
            let mut connection = redis_rs(&lanes.setup.url).await?;
            let (queue, mut queued) = mpsc::unbounded_channel::<Queued>();
            let sha = lanes.setup.sha.clone();
            // The connection's owner: everything queued goes out as one pipeline.
            tasks.push(tokio::spawn(async move {
                let mut batch = Vec::with_capacity(IN_FLIGHT);
                while queued.recv_many(&mut batch, IN_FLIGHT).await > 0 {
                    let mut pipe = redis::pipe();
                    for ((keys, args), _) in &batch {
                        pipe.cmd("EVALSHA").arg(&sha).arg(keys.len()).arg(keys).arg(args);
                    }
                    let replies: Vec<redis::Value> = pipe.query_async(&mut connection).await?;
                    for ((_, reply), value) in batch.drain(..).zip(replies) {
                        let _ = reply.send(value);
                    }
                }
                anyhow::Ok(())
            }));
            let op = move |setup: Arc<Setup>, n: u64| {
                let queue = queue.clone();
                async move {
                    let (reply, answer) = oneshot::channel();
                    queue.send((answer_call(&setup, n), reply)).ok().context("the owner stopped")?;
                    answer.await.context("the owner dropped a call")?;
                    anyhow::Ok(())
                }
            };
            lanes.spawn(count, op, &mut tasks);
        }
        Client::Fred => {
            let fred = fred_client(&lanes.setup.url).await?;
            let op = move |setup: Arc<Setup>, n: u64| {
                let fred = fred.clone();
                async move {
                    let _: fred::types::Value = match workload {
                        Workload::Answer => {
                            let (keys, args) = answer_call(&setup, n);
                            fred.evalsha(setup.sha.as_str(), keys, args).await?
                        }
                        Workload::Read => fred.xrange(STREAM, "-", "+", Some(READ_BATCH as u64)).await?,
                    };
                    anyhow::Ok(())
                }
            };
            lanes.spawn(count, op, &mut tasks);
        }
    }
    tokio::time::sleep(duration).await;
    lanes.stop.store(true, Ordering::Relaxed);
    let count = lanes.done.load(Ordering::Relaxed);
    // The lanes end when they see `stop`; the pipelined owner when the lanes, which hold the
    // queue's senders, are gone.
    for task in tasks {
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(joined) => joined??,
            Err(_) => anyhow::bail!("a task of {} did not stop", client.name()),
        }
    }
    Ok(count)
}

/// The read-shaped command: `XRANGE` of one read batch.
fn read_cmd() -> redis::Cmd {
    let mut cmd = redis::cmd("XRANGE");
    cmd.arg(STREAM).arg("-").arg("+").arg("COUNT").arg(READ_BATCH);
    cmd
}

async fn rep(
    client: Client,
    workload: Workload,
    setup: &Arc<Setup>,
    duration: Duration,
) -> anyhow::Result<Rep> {
    let pid = std::process::id();
    let ticks_per_second = procfs::ticks_per_second() as f64;
    let before = procfs::cpu_ticks(pid)?;
    let started = Instant::now();
    let ops = drive(client, workload, Arc::clone(setup), duration).await?;
    let elapsed = started.elapsed();
    let after = procfs::cpu_ticks(pid)?;
    anyhow::ensure!(ops > 0, "{} did no {} operation", client.name(), workload.name());
    Ok(Rep {
        ops_per_s: ops as f64 / elapsed.as_secs_f64(),
        cpu_us_per_op: (after - before) as f64 * 1e6 / ticks_per_second / ops as f64,
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // One runtime thread, as the daemon runs by default.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let redis = RedisServer::start()?;
    let mut admin = redis_rs(&redis.url()).await?;
    let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(SCRIPT).query_async(&mut admin).await?;
    let request = serde_json::json!({
        "type": "tool.invoke",
        "response_event": "bench.result",
        "data": {"tool": "echo", "arguments": {"message": "x".repeat(100)}, "request_id": uuid::Uuid::new_v4().to_string()},
    })
    .to_string();
    for _ in 0..READ_BATCH {
        let _: String = redis::cmd("XADD")
            .arg(STREAM)
            .arg("*")
            .arg("id")
            .arg(uuid::Uuid::new_v4().to_string())
            .arg("payload")
            .arg(&request)
            .query_async(&mut admin)
            .await?;
    }
    let setup = Arc::new(Setup { url: redis.url(), sha, payload: "p".repeat(300) });
    let duration = Duration::from_secs_f64(args.seconds);
    let mut table = String::from(
        "| workload | client | ops/s | client CPU µs/op | ops/s of each rep |\n|---|---|---:|---:|---|\n",
    );
    for workload in [Workload::Answer, Workload::Read] {
        for client in [Client::Multiplexed, Client::Pipelined, Client::Fred] {
            let mut reps = Vec::new();
            for _ in 0..args.reps {
                reps.push(rep(client, workload, &setup, duration).await?);
            }
            let each: Vec<String> = reps.iter().map(|rep| format!("{:.0}", rep.ops_per_s)).collect();
            table.push_str(&format!(
                "| {} | {} | {:.0} | {:.2} | {} |\n",
                workload.name(),
                client.name(),
                median(reps.iter().map(|rep| rep.ops_per_s).collect()),
                median(reps.iter().map(|rep| rep.cpu_us_per_op).collect()),
                each.join(", ")
            ));
        }
    }
    print!("{table}");
    let out = std::path::PathBuf::from("target/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("clients.md"), &table)?;
    Ok(())
}
