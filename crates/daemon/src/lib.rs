//! The `toolhost` daemon and its command-line client.
//!
//! - [`cli`]: the command line (`serve`, `call`, `tools`, `check-config`, `healthcheck`, `dlq`,
//!   `redis-acl`).
//! - [`config`]: layered configuration (defaults, file, environment), validated once.
//! - [`serve`]: builds everything from a [`config::Config`] and runs until shutdown.
//! - `call`: the one call lifecycle every door drives: admission, the ledger, limits, the tool
//!   run, the answer committed once, the ack.
//! - `doors`: how calls come in: `doors::requests` (`action-requests`) and `doors::chat` (the
//!   inbox `chat:<AGENT_NAME>`).
//! - `host_access`: what the user commands and stdio MCP servers run as cannot reach, found at
//!   start.
//! - `group`: the consumer-group read and reclaim loops every door runs on.
//! - `fleet`: what the other live replicas and toolboxes host, from their heartbeats; where a
//!   request for a tool this replica lacks goes.
//! - `fleet_client`: a client of the fleet (the MCP door, `toolhost mcp`): the fleet's tools
//!   from the registries, calls over the requests stream answered on a private stream.
//! - `publish`: the tool registry and heartbeat kept in Redis.
//! - `sources`: the tool sources at run time (hosted MCP servers included) and the registry
//!   rebuilt from them when their tools change or SIGHUP reloads the configuration.
//! - `client`: the `call` and `tools` commands.
//! - [`redis_acl`]: the `redis-acl` command, the least-privilege Redis user's `ACL SETUSER` line.
//! - `dlq`: the `dlq list|replay|purge` commands over `dlq:<toolbox_id>`.
//! - [`output`]: stdout of the client commands, quiet when the reader closes it.
//! - [`http`]: `/healthz`, `/readyz` and `/metrics` on a thread of their own, and the
//!   `healthcheck` client.
//! - `probe`: pings Redis and reads the consumer groups for readiness and group metrics.
//! - `outage`: a Redis outage logged once by the probe, not once per retry by every loop.
//! - `telemetry`: the metrics (a Prometheus recorder created by `serve`, no globals) and the
//!   readiness facts.
//!
//! **Invariant:** only this crate reads environment variables (in [`config`]) or installs a
//! tracing subscriber (in [`logging`]).

pub mod auth;
mod backoff;
mod call;
mod call_log;
pub mod cli;
mod client;
mod clock;
pub mod config;
mod dead_letters;
mod dlq;
mod doors;
pub mod dumpable;
mod fleet;
mod fleet_client;
mod group;
mod heartbeat;
pub mod http;
pub mod logging;
mod outage;
pub mod output;
mod ovos_bus;
mod probe;
mod publish;
pub mod redis_acl;
mod reload;
pub mod serve;
mod services;
mod shutdown;
mod sources;
mod stats;
mod telemetry;

pub use client::{CallIdentity, EXIT_TRANSPORT, run_call, run_tools};
pub use dlq::run_dlq;
pub use serve::serve_mcp_stdio;
pub use services::Services;
pub use shutdown::Shutdown;
pub use stats::Stats;
pub use telemetry::Telemetry;

/// Exit code for bad configuration and every other usage error, clap's own included (sysexits'
/// EX_USAGE; EX_CONFIG would be 78, but 64 is what operators' tooling expects from this daemon).
/// It differs from 2, the code for Redis unreachable or no answer.
pub const EXIT_CONFIG: i32 = 64;
