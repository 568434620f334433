//! The `toolhost` daemon and its command-line client.
//!
//! `main` parses the command line ([`cli`]), loads the configuration ([`config`]) and runs a
//! client command or [`serve`]. Everything else is private to the crate:
//!
//! - `serve` cuts the configuration into what each part sees and runs the daemon: the doors
//!   (`doors`: the stream doors `requests` and `chat`, and the fleet doors `mcp`, `ovos` and
//!   `console`, each given its own settings and a context, never the whole configuration), the
//!   consumer-group readers (`group`), the one call lifecycle every stream door drives (`call`:
//!   admission, `auth`'s checks, the ledger, limits, the run, one answer), the tool sources and
//!   their registry (`sources`), the registry and heartbeat kept in Redis (`publish`, read back by
//!   `fleet` and `heartbeat`), SIGHUP reloads (`reload`) and the probe (`probe`, `outage`).
//! - `fleet_client`: a client of the fleet for the fleet doors: the fleet's tools, calls over the
//!   requests stream answered on a private stream.
//! - `ovos_bus`: the OpenVoiceOS messagebus, shared by the OVOS door and the OVOS source.
//! - `dead_letters`: the dead-letter streams, for `dlq` and the console.
//! - `client`, `dlq` and [`redis_acl`]: the client commands (`call`, `tools`, `dlq`,
//!   `redis-acl`); [`output`]: their stdout, quiet when the reader closes it.
//! - [`http`]: `/healthz`, `/readyz`, `/metrics` and `/status` on a thread of their own, and the
//!   `healthcheck` client; `telemetry` and `stats`: the metrics and readiness facts (a Prometheus
//!   recorder created by `serve`, no globals).
//!
//! **Invariant:** only this crate reads environment variables (in [`config`]) or installs a
//! tracing subscriber (in [`logging`]).

mod auth;
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
mod fleet_catalog;
mod fleet_client;
mod group;
mod heartbeat;
pub mod http;
pub mod logging;
mod outage;
pub mod output;
mod ovos_bus;
mod probe;
mod prompt;
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

/// Exit code for bad configuration and every other usage error, clap's own included (sysexits'
/// EX_USAGE; EX_CONFIG would be 78, but 64 is what operators' tooling expects from this daemon).
/// It differs from 2, the code for Redis unreachable or no answer.
pub const EXIT_CONFIG: i32 = 64;
