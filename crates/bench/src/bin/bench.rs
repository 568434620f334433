//! `toolhost-bench`: measures toolhost against a Redis floor and the reference worker.
//!
//! Prints a Markdown table and writes `report.json` and `report.md` under `target/bench/`.
//!
//! ```text
//! cargo build --release -p toolhost -p toolhost-bench
//! target/release/toolhost-bench --quick                 # smoke run, about a minute
//! target/release/toolhost-bench                         # 3 reps x 5 s per row
//! target/release/toolhost-bench --only floor,reference  # without the daemon
//! target/release/toolhost-bench --soak 1000000          # RSS over a million requests
//! ```
//!
//! `redis-server` must be on `PATH`; the harness starts its own on a free loopback port.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use toolhost_bench::plan::{self, Options};
use toolhost_bench::target::Worker;

/// Benchmark toolhost: throughput, latency, CPU and memory beside the reference worker.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Smoke run: one short repetition per row and three starts for the ready time.
    #[arg(long)]
    quick: bool,
    /// Targets to measure, comma separated: floor, reference, toolhost (default: all; with
    /// --soak: toolhost).
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<TargetName>>,
    /// Seconds per repetition (default 5, or 1 with --quick).
    #[arg(long)]
    duration_s: Option<f64>,
    /// Repetitions per row; the median is reported (default 3, or 1 with --quick).
    #[arg(long)]
    reps: Option<usize>,
    /// Seconds of warm-up per row (default 1, or 0.5 with --quick).
    #[arg(long)]
    warmup_s: Option<f64>,
    /// The toolhost executable (default: `toolhost` next to this program).
    #[arg(long)]
    toolhost_bin: Option<PathBuf>,
    /// The reference worker executable (default: `toolhost-refworker` next to this program).
    #[arg(long)]
    refworker_bin: Option<PathBuf>,
    /// Only soak: send this many requests at 64 in flight and watch RSS every second.
    #[arg(long)]
    soak: Option<u64>,
    /// Where report.json, report.md and target logs go (default: `target/bench`).
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

/// A value of `--only`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum TargetName {
    /// Sequential PINGs against Redis.
    #[value(alias = "redis")]
    Floor,
    /// `toolhost-refworker`.
    Reference,
    /// `toolhost serve`.
    Toolhost,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
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
    let report = match runtime.block_on(plan::run(&options)) {
        Ok(report) => report,
        Err(err) => {
            eprintln!("toolhost-bench: {err:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("{}", report.to_markdown());
    if let Err(err) = report.write(&options.out_dir) {
        eprintln!("toolhost-bench: {err:#}");
        return std::process::ExitCode::FAILURE;
    }
    eprintln!("bench: wrote {}", options.out_dir.join("report.json").display());
    std::process::ExitCode::SUCCESS
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
    let only = match (&args.only, args.soak) {
        (Some(only), _) => only.clone(),
        (None, Some(_)) => vec![TargetName::Toolhost],
        (None, None) => vec![TargetName::Floor, TargetName::Reference, TargetName::Toolhost],
    };
    let mut workers: Vec<Worker> = Vec::new();
    for name in &only {
        let worker = match name {
            TargetName::Floor => continue,
            TargetName::Reference => Worker::Reference,
            TargetName::Toolhost => Worker::Toolhost,
        };
        if !workers.contains(&worker) {
            workers.push(worker);
        }
    }
    Options {
        quick: args.quick,
        floor: only.contains(&TargetName::Floor),
        workers,
        duration: seconds(args.duration_s, if args.quick { 1.0 } else { 5.0 }),
        reps: args.reps.unwrap_or(if args.quick { 1 } else { 3 }).max(1),
        warmup: seconds(args.warmup_s, if args.quick { 0.5 } else { 1.0 }),
        ready_starts: if args.quick { 3 } else { 5 },
        toolhost_bin: args.toolhost_bin.clone().unwrap_or_else(|| sibling("toolhost")),
        refworker_bin: args.refworker_bin.clone().unwrap_or_else(|| sibling("toolhost-refworker")),
        soak: args.soak,
        out_dir: args.out_dir.clone().unwrap_or(default_out_dir),
    }
}

fn seconds(given: Option<f64>, default: f64) -> Duration {
    Duration::from_secs_f64(given.filter(|s| s.is_finite() && *s > 0.0).unwrap_or(default))
}
