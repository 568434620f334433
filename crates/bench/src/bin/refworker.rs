//! `toolhost-refworker`: the reference workers, see [`toolhost_bench::refworker`].

use clap::Parser;
use toolhost_bench::envelope::DEFAULT_GROUP;
use toolhost_bench::refworker::{self, Config, Mode};

/// The least work a correct worker on `action-requests` must do: at least once by default,
/// exactly once with `--exactly-once`.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Redis URL.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Consumer group, also the toolbox id in the answers' `source`.
    #[arg(long, default_value = DEFAULT_GROUP)]
    group: String,
    /// Consumer name; defaults to `refworker-<pid>`.
    #[arg(long)]
    consumer: Option<String>,
    /// Entries per XREADGROUP.
    #[arg(long, default_value_t = 64)]
    count: usize,
    /// BLOCK milliseconds per XREADGROUP.
    #[arg(long, default_value_t = refworker::DEFAULT_BLOCK.as_millis() as usize)]
    block_ms: usize,
    /// The exactly-once floor: per entry `SET <answered mark> NX PX`, the answer's XADD only
    /// if that set it, and the batch's XACK, in one script call per batch; reclaims entries
    /// idle for --claim-idle-ms with XAUTOCLAIM on start.
    #[arg(long)]
    exactly_once: bool,
    /// With --exactly-once: how long an answered mark lives, ms.
    #[arg(long, default_value_t = refworker::DEFAULT_RETENTION.as_millis() as u64)]
    retention_ms: u64,
    /// With --exactly-once: pending entries idle this long are reclaimed on start, ms.
    #[arg(long, default_value_t = refworker::DEFAULT_CLAIM_IDLE.as_millis() as u64)]
    claim_idle_ms: u64,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let config = Config {
        redis_url: args.redis_url,
        group: args.group,
        consumer: args.consumer.unwrap_or_else(refworker::default_consumer),
        count: args.count.max(1),
        block_ms: args.block_ms,
        mode: if args.exactly_once { Mode::ExactlyOnce } else { Mode::AtLeastOnce },
        retention_ms: args.retention_ms.max(1),
        claim_idle_ms: args.claim_idle_ms,
    };
    // One connection and a sequential loop: a single-threaded runtime is all it needs.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("toolhost-refworker: cannot start the runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(refworker::run(config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("toolhost-refworker: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
