//! `toolhost-bench`: measures toolhost beside the at-least-once reference worker and the
//! exactly-once floor (both `toolhost-refworker`), and a Redis round trip.
//!
//! Prints a Markdown table and writes `report.json` and `report.md` under `target/bench/`.
//!
//! ```text
//! cargo build --release -p toolhost -p toolhost-bench
//! target/release/toolhost-bench --quick                     # smoke run, about a minute
//! target/release/toolhost-bench                             # 3 reps x 5 s per row
//! target/release/toolhost-bench --interleave 5              # the issue's targets: echo at 1
//!                                                           # and 64 in flight, 5 runs each,
//!                                                           # and the independent generator
//!                                                           # at 64 (50,000 requests a run)
//! target/release/toolhost-bench --baseline-bin OLD/toolhost # adds toolhost-base rows
//! target/release/toolhost-bench --only at-least-once,floor  # without the daemon
//! target/release/toolhost-bench --interleave 5 --in-flight 64 --only toolhost --auth
//!                                                           # signed + policy beside plain echo
//! target/release/toolhost-bench --soak 1000000              # RSS over a million requests
//! target/release/toolhost-bench --marks 100000              # Redis bytes per answered mark
//! target/release/toolhost-bench --fleet                     # 1, 2, 4 replicas on one Redis
//!                                                           # and on a 3-master cluster, and
//!                                                           # replica_acks 0 and 1 against a
//!                                                           # master with one replica
//! ```
//!
//! `redis-server` must be on `PATH`; the harness starts its own on a free loopback port.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use toolhost_bench::fleet::{FleetOptions, Topology};
use toolhost_bench::load::Generator;
use toolhost_bench::plan::{self, Options};
use toolhost_bench::target::Worker;

/// Benchmark toolhost: throughput, latency, CPU and memory beside the reference worker.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Smoke run: one short repetition per row and three starts for the ready time.
    #[arg(long)]
    quick: bool,
    /// Targets to measure, comma separated: ping, at-least-once, floor, toolhost,
    /// toolhost-base (default: all, toolhost-base with --baseline-bin; with --soak: toolhost;
    /// with --marks: floor, toolhost and toolhost-base).
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<TargetName>>,
    /// Seconds per repetition (default 5, or 1 with --quick).
    #[arg(long)]
    duration_s: Option<f64>,
    /// Repetitions per row; the median is reported (default 3, or 1 with --quick).
    #[arg(long)]
    reps: Option<usize>,
    /// Run the echo rows at 1 and 64 in flight (or --in-flight) this many times each, the
    /// targets taking turns, every run on a fresh target with one repetition; each row
    /// reports the median of its runs.
    #[arg(long)]
    interleave: Option<usize>,
    /// Only the 100 B echo rows at these in-flight counts, comma separated.
    #[arg(long, value_delimiter = ',')]
    in_flight: Option<Vec<usize>>,
    /// Load generators of the interleaved rows, comma separated: harness (this harness's own,
    /// at every in-flight count) and independent (issue 27's shape at 64 in flight, or the
    /// first --in-flight, a fixed count of requests).
    #[arg(long, value_delimiter = ',', default_value = "harness,independent")]
    generators: Vec<GeneratorName>,
    /// Requests of one independent-generator run (default 50000, or 5000 with --quick).
    #[arg(long)]
    independent_requests: Option<u64>,
    /// Warm-up requests before it (default 3000, or 500 with --quick).
    #[arg(long)]
    independent_warmup: Option<u64>,
    /// Seconds of warm-up per row (default 1, or 0.5 with --quick).
    #[arg(long)]
    warmup_s: Option<f64>,
    /// The toolhost executable (default: `toolhost` next to this program).
    #[arg(long)]
    toolhost_bin: Option<PathBuf>,
    /// The reference worker executable (default: `toolhost-refworker` next to this program).
    #[arg(long)]
    refworker_bin: Option<PathBuf>,
    /// A baseline toolhost executable, measured beside the current one as `toolhost-base`.
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
    /// Only weigh the answered marks: send this many requests through each target that keeps
    /// marks and report Redis bytes per retained mark.
    #[arg(long)]
    marks: Option<u64>,
    /// Only soak: send this many requests at 64 in flight and watch RSS every second.
    #[arg(long)]
    soak: Option<u64>,
    /// With --interleave: also run toolhost with `require_signature` and a tenant policy,
    /// signed requests, in turn with the others (the cost of issue 25's checks per request).
    #[arg(long)]
    auth: bool,
    /// With --interleave: also run toolhost with OpenTelemetry on, exporting to an OTLP
    /// receiver in the harness that answers and keeps nothing, at sampler ratio 0 and 1, in
    /// turn with the others (the cost of issue 36's spans per request); the baseline build too,
    /// with --baseline-bin, so that two builds compare in one run.
    #[arg(long)]
    telemetry: bool,
    /// Only the fleet rows: 1, 2 and 4 replicas (or --replicas) of toolhost at 64 in flight
    /// (or the first --in-flight), against one Redis and a 3-master cluster, and the
    /// `replica_acks` rows against a master with one replica (or --topologies), with the CPU of
    /// every process.
    #[arg(long)]
    fleet: bool,
    /// Replica counts of the fleet rows, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    replicas: Vec<usize>,
    /// Shard counts of the requests stream (`[streams] shards`) of the fleet rows on one Redis
    /// and on the cluster, comma separated; each replica count runs with each.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    shards: Vec<usize>,
    /// With --shards: each replica reads only its part of the shards (`[streams] read_shards`,
    /// replica i of R the shards k with k mod R = i) instead of every shard.
    #[arg(long)]
    split_shards: bool,
    /// With --shards: each request names a results topic in its shard's slot
    /// (`results:bench:{<tag>}`) instead of the default `action-results`, as callers with private
    /// results streams spread their answers.
    #[arg(long)]
    shard_results: bool,
    /// `[dispatch] ledger_format` of the fleet rows' replicas: 1 (the default), 2 or 3.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    ledger_format: u8,
    /// Topologies of the fleet rows, comma separated: single, cluster, replicated (a master with
    /// one replica: echo and terminal_run with `[redis] replica_acks` 0 and 1, one toolhost).
    #[arg(long, value_delimiter = ',', default_value = "single,cluster,replicated")]
    topologies: Vec<FleetTopology>,
    /// Masters of the fleet rows' cluster: 3, or 1 (a cluster-mode server holding every slot:
    /// the cluster path's cost without the spreading), or more.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    cluster_masters: u16,
    /// Where report.json, report.md and target logs go (default: `target/bench`).
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

/// A value of `--topologies`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum FleetTopology {
    /// One redis-server.
    Single,
    /// A 3-master Redis Cluster.
    Cluster,
    /// A master with one replica: the `replica_acks` rows.
    Replicated,
}

/// A value of `--generators`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum GeneratorName {
    /// The harness's own generator.
    Harness,
    /// Issue 27's independent generator.
    Independent,
}

/// A value of `--only`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum TargetName {
    /// Sequential PINGs against Redis.
    #[value(alias = "redis")]
    Ping,
    /// `toolhost-refworker`, the at-least-once reference.
    #[value(alias = "reference")]
    AtLeastOnce,
    /// `toolhost-refworker --exactly-once`, the exactly-once floor.
    #[value(alias = "exactly-once")]
    Floor,
    /// `toolhost serve`.
    Toolhost,
    /// `toolhost serve` from --baseline-bin.
    ToolhostBase,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.baseline_bin.is_none()
        && args.only.as_ref().is_some_and(|only| only.contains(&TargetName::ToolhostBase))
    {
        eprintln!("toolhost-bench: toolhost-base needs --baseline-bin");
        return std::process::ExitCode::from(2);
    }
    let options = options(&args);
    // The harness shares the machine with the targets; one thread keeps its own share small
    // and the same for every row.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("toolhost-bench: cannot start the runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if args.fleet {
        return fleet(&runtime, &args, &options);
    }
    let report = runtime.block_on(plan::run(&options));
    emit(
        report.map(|report| (report.to_markdown(), report)),
        |report| report.write(&options.out_dir),
        &options.out_dir.join("report.json"),
    )
}

/// Prints a finished run's table and writes its files with `write`, or reports why it failed.
fn emit<R>(
    run: anyhow::Result<(String, R)>,
    write: impl FnOnce(&R) -> anyhow::Result<()>,
    written: &Path,
) -> std::process::ExitCode {
    let res = run.and_then(|(markdown, report)| {
        println!("{markdown}");
        write(&report)
    });
    match res {
        Ok(()) => {
            eprintln!("bench: wrote {}", written.display());
            std::process::ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("toolhost-bench: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn fleet(runtime: &tokio::runtime::Runtime, args: &Args, options: &Options) -> std::process::ExitCode {
    let fleet_options = FleetOptions {
        topologies: args
            .topologies
            .iter()
            .map(|topology| match topology {
                FleetTopology::Single => Topology::Single,
                FleetTopology::Cluster => Topology::Cluster,
                FleetTopology::Replicated => Topology::Replicated,
            })
            .collect(),
        replicas: args.replicas.iter().copied().filter(|&replicas| replicas > 0).collect(),
        shards: args.shards.iter().copied().map(|shards| shards.clamp(1, 1024)).collect(),
        split_shards: args.split_shards,
        shard_results: args.shard_results,
        ledger_format: args.ledger_format,
        cluster_masters: usize::from(args.cluster_masters),
        in_flight: options.in_flight.as_ref().and_then(|in_flight| in_flight.first().copied()).unwrap_or(64),
        duration: options.duration,
        warmup: options.warmup,
        toolhost_bin: options.toolhost_bin.clone(),
        out_dir: options.out_dir.clone(),
    };
    let report = runtime.block_on(toolhost_bench::fleet::run(&fleet_options));
    emit(
        report.map(|report| (report.to_markdown(), report)),
        |report| report.write(&options.out_dir),
        &options.out_dir.join("fleet.json"),
    )
}

fn options(args: &Args) -> Options {
    let exe_dir = std::env::current_exe().ok().and_then(|exe| exe.parent().map(Path::to_path_buf));
    let sibling = |name: &str| match &exe_dir {
        Some(dir) => dir.join(name),
        None => PathBuf::from("target/release").join(name),
    };
    // Binaries live in target/<profile>/, so the report goes to target/bench/ beside them.
    let default_out_dir = exe_dir
        .as_deref()
        .and_then(Path::parent)
        .filter(|dir| dir.file_name().is_some_and(|name| name == "target"))
        .map_or_else(|| PathBuf::from("target/bench"), |target_dir| target_dir.join("bench"));
    let mut only = match (&args.only, args.soak, args.marks) {
        (Some(only), _, _) => only.clone(),
        (None, Some(_), _) => vec![TargetName::Toolhost],
        (None, None, Some(_)) => vec![TargetName::Floor, TargetName::Toolhost],
        (None, None, None) => {
            vec![TargetName::Ping, TargetName::AtLeastOnce, TargetName::Floor, TargetName::Toolhost]
        }
    };
    if args.only.is_none() && args.baseline_bin.is_some() && args.soak.is_none() {
        only.push(TargetName::ToolhostBase);
    }
    let mut workers: Vec<Worker> = Vec::new();
    for name in &only {
        let worker = match name {
            TargetName::Ping => continue,
            TargetName::AtLeastOnce => Worker::Reference,
            TargetName::Floor => Worker::Floor,
            TargetName::Toolhost => Worker::Toolhost,
            TargetName::ToolhostBase => Worker::Baseline,
        };
        if !workers.contains(&worker) {
            workers.push(worker);
        }
    }
    let interleave = args.interleave.unwrap_or(0);
    Options {
        quick: args.quick,
        ping: only.contains(&TargetName::Ping) && interleave == 0,
        workers,
        duration: seconds(args.duration_s, if args.quick { 1.0 } else { 5.0 }),
        reps: args.reps.unwrap_or(if args.quick { 1 } else { 3 }).max(1),
        warmup: seconds(args.warmup_s, if args.quick { 0.5 } else { 1.0 }),
        ready_starts: if args.quick { 3 } else { 5 },
        toolhost_bin: args.toolhost_bin.clone().unwrap_or_else(|| sibling("toolhost")),
        refworker_bin: args.refworker_bin.clone().unwrap_or_else(|| sibling("toolhost-refworker")),
        baseline_bin: args.baseline_bin.clone(),
        interleave,
        in_flight: args.in_flight.clone().filter(|in_flight| !in_flight.is_empty()),
        generators: args
            .generators
            .iter()
            .map(|generator| match generator {
                GeneratorName::Harness => Generator::Harness,
                GeneratorName::Independent => Generator::Independent,
            })
            .collect(),
        independent_requests: args
            .independent_requests
            .unwrap_or(if args.quick { 5_000 } else { 50_000 })
            .max(1),
        independent_warmup: args.independent_warmup.unwrap_or(if args.quick { 500 } else { 3_000 }).max(1),
        marks: args.marks,
        soak: args.soak,
        out_dir: args.out_dir.clone().unwrap_or(default_out_dir),
        auth: args.auth,
        telemetry: args.telemetry,
    }
}

fn seconds(given: Option<f64>, default: f64) -> Duration {
    Duration::from_secs_f64(given.filter(|s| s.is_finite() && *s > 0.0).unwrap_or(default))
}
