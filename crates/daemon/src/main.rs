//! The `toolhost` binary: parse the command line, load configuration, install logging, run.

use clap::Parser;
use toolhost::cli::{Cli, Command};
use toolhost::config::{Config, ProcessEnv};
use toolhost::{EXIT_CONFIG, logging, serve};

fn main() {
    let cli = Cli::parse();
    let config = match Config::load(cli.config.as_deref(), &ProcessEnv) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("toolhost: {err}");
            std::process::exit(EXIT_CONFIG);
        }
    };
    if let Command::CheckConfig = cli.command {
        print!("{}", config.masked_toml());
        return;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("toolhost: cannot start the async runtime: {err}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Serve { synthetic_tools } => {
                let format = cli.log_format.as_deref().unwrap_or(&config.raw.log.format);
                let rust_log = std::env::var("RUST_LOG").ok();
                if let Err(err) = logging::install(format, &config.raw.log.level, rust_log.as_deref()) {
                    eprintln!("toolhost: cannot install logging: {err}");
                }
                let options = serve::ServeOptions { synthetic_tools };
                match serve::run(config, options, serve::shutdown_signal()).await {
                    Ok(()) => 0,
                    Err(err) => {
                        eprintln!("toolhost: {err:#}");
                        1
                    }
                }
            }
            Command::Call { tool, args, timeout } => toolhost::run_call(&config, &tool, &args, timeout).await,
            Command::Tools { format, from_registry, timeout } => {
                toolhost::run_tools(&config, &format, from_registry, timeout).await
            }
            Command::CheckConfig => 0,
        }
    });
    std::process::exit(code);
}
