//! The `toolhost` binary: parse the command line, load configuration, install logging, run.
//!
//! Exit codes: 0 done, 1 failed (or the tool answered an error), 2 transport problem,
//! 64 usage error: bad configuration (every command loads the configuration first, exactly as
//! `serve` does) or a bad command line, clap's own errors included.

use clap::Parser;
use toolhost::cli::{Cli, Command};
use toolhost::config::{Config, ConfigError, Env, ProcessEnv, unknown_variables};
use toolhost::{EXIT_CONFIG, EXIT_TRANSPORT, dumpable, http, logging, output, serve};

// The daemon allocates many small, short-lived buffers per request (JSON values, Redis frames)
// from several threads; glibc malloc spent about a third of the daemon's CPU on them under load.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    // First of all, before any secret is read: commands the daemon runs as its own user must
    // not be able to read its environment or memory through /proc.
    if let Err(err) = dumpable::forbid_dumps() {
        eprintln!("toolhost: warning: cannot make the process non-dumpable: {err}");
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // Help and version go to stdout and are not errors; everything else is a usage
            // error, 64 like bad configuration, not clap's 2, which is the transport code here.
            let code = if err.use_stderr() { EXIT_CONFIG } else { 0 };
            // Nothing to do about a closed stdout or stderr here but exit.
            let _ = err.print();
            std::process::exit(code);
        }
    };
    let config = match Config::load(cli.config.as_deref(), &ProcessEnv) {
        Ok(config) => config,
        Err(err) => {
            // A stray variable may be the reason, e.g. TOOLHOST_DISPATCH__X with one underscore.
            for warning in unknown_variables(&ProcessEnv.vars().into_iter().collect()) {
                eprintln!("toolhost: warning: {warning}");
            }
            eprintln!("toolhost: {err}");
            std::process::exit(EXIT_CONFIG);
        }
    };
    for warning in &config.warnings {
        eprintln!("toolhost: warning: {warning}");
    }
    if let Command::Healthcheck { path, timeout } = &cli.command {
        std::process::exit(healthcheck(&config, path, *timeout));
    }
    if let Command::RedisAcl { user } = &cli.command {
        match toolhost::redis_acl::setuser_line(&config, user) {
            Ok(line) => output::text(&format!("{line}\n")),
            Err(err) => {
                eprintln!("toolhost: {err}");
                std::process::exit(EXIT_CONFIG);
            }
        }
        std::process::exit(0);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if config.raw.daemon.worker_threads > 0 {
        builder.worker_threads(config.raw.daemon.worker_threads);
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("toolhost: cannot start the async runtime: {err}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Serve { log_format, synthetic_tools } => {
                let format = log_format.as_deref().unwrap_or(&config.raw.log.format);
                let rust_log = std::env::var("RUST_LOG").ok();
                if let Err(err) = logging::install(format, &config.raw.log.level, rust_log.as_deref()) {
                    eprintln!("toolhost: cannot install logging: {err}");
                }
                let options = serve::ServeOptions { synthetic_tools, config_path: cli.config.clone() };
                match serve::run(config, options, serve::shutdown_signal()).await {
                    Ok(()) => 0,
                    Err(err) => {
                        eprintln!("toolhost: {err:#}");
                        exit_code(&err)
                    }
                }
            }
            Command::Call { tool, args, timeout, key_id, tenant, replica_acks } => {
                let identity = toolhost::CallIdentity { key_id, tenant, replica_acks };
                toolhost::run_call(&config, &tool, &args, timeout, &identity).await
            }
            Command::Tools { format, from_registry, timeout } => {
                toolhost::run_tools(&config, &format, from_registry, timeout).await
            }
            Command::Dlq { action } => toolhost::run_dlq(&config, &action).await,
            Command::Mcp => {
                let rust_log = std::env::var("RUST_LOG").ok();
                if let Err(err) = logging::install_stderr(&config.raw.log.level, rust_log.as_deref()) {
                    eprintln!("toolhost: cannot install logging: {err}");
                }
                match toolhost::serve_mcp_stdio(&config).await {
                    Ok(()) => 0,
                    Err(err) => {
                        eprintln!("toolhost: {err:#}");
                        EXIT_TRANSPORT
                    }
                }
            }
            // In the runtime: preparing the bus, as `serve` does, needs one (nothing is sent).
            Command::CheckConfig => check_config(&config),
            Command::Healthcheck { .. } | Command::RedisAcl { .. } => 0,
        }
    });
    std::process::exit(code);
}

/// `toolhost check-config`: what `serve` checks before it touches Redis, then the masked TOML.
fn check_config(config: &Config) -> i32 {
    let checked = serve::connect(config)
        .and_then(|(bus, keys)| serve::build_registry(config, &serve::ServeOptions::default(), &bus, &keys));
    if let Err(err) = checked {
        eprintln!("toolhost: {err:#}");
        return exit_code(&err);
    }
    output::text(&config.masked_toml());
    0
}

/// `toolhost healthcheck`: 0 when the local HTTP endpoint answers 200 on `path`, else 1.
fn healthcheck(config: &Config, path: &str, timeout: std::time::Duration) -> i32 {
    let target = http::local_target(config.http_listen);
    match http::get_status(target, path, timeout) {
        Ok(200) => 0,
        Ok(status) => {
            eprintln!("toolhost: http://{target}{path} answered {status}");
            1
        }
        Err(err) => {
            eprintln!("toolhost: http://{target}{path}: {err}");
            1
        }
    }
}

/// 64 for configuration errors, 1 for anything else.
fn exit_code(err: &anyhow::Error) -> i32 {
    if err.downcast_ref::<ConfigError>().is_some() { EXIT_CONFIG } else { 1 }
}
