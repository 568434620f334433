//! `toolhost-refworker`: the reference worker, see [`toolhost_bench::refworker`].

use clap::Parser;
use toolhost_bench::envelope::DEFAULT_GROUP;
use toolhost_bench::refworker::{self, Config};

/// The least work a correct at-least-once worker on `action-requests` must do.
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
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let config = Config {
        redis_url: args.redis_url,
        group: args.group,
        consumer: args.consumer.unwrap_or_else(refworker::default_consumer),
        count: args.count.max(1),
        block_ms: args.block_ms,
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
