//! The command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// A daemon that hosts tools for LLM agents on Redis Streams.
#[derive(Debug, Parser)]
#[command(name = "toolhost", version, about)]
pub struct Cli {
    /// Configuration file, layered over the defaults and under the environment
    /// [default: the file named by TOOLHOST_CONFIG, if set].
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve tools until SIGINT or SIGTERM.
    Serve {
        /// Log format: auto (human on a terminal, JSON otherwise), json or pretty; overrides
        /// `[log] format`.
        #[arg(long, value_parser = ["auto", "json", "pretty"])]
        log_format: Option<String>,
        /// Register N synthetic benchmark tools (synthetic_0000...).
        #[arg(long, hide = true, default_value_t = 0)]
        synthetic_tools: usize,
    },
    /// Call a tool through Redis and print its result.
    Call {
        /// The tool's name.
        tool: String,
        /// The arguments, a JSON object.
        #[arg(long, default_value = "{}")]
        args: String,
        /// How long to wait for the answer, e.g. 30s or 500ms.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        timeout: Duration,
        /// Sign the request with this key: the secret is `secret_env` of the `[[auth.keys]]`
        /// entry with this id, else the variable TOOLHOST_SIGNING_SECRET.
        #[arg(long)]
        key_id: Option<String>,
        /// The tenant the call is made for (the envelope's `tenant_id`).
        #[arg(long)]
        tenant: Option<String>,
        /// Wait until N Redis replicas have the request (`WAIT` after its `XADD`, up to
        /// `[redis] replica_ack_timeout_ms`), and fail (exit 2) when fewer did: a failover then
        /// could lose the request. 0: do not wait.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=16))]
        replica_acks: u32,
    },
    /// List the tools of the running toolbox.
    Tools {
        /// native, openai, mcp, toolbox or capabilities.
        #[arg(long, default_value = "native", value_parser = ["native", "openai", "mcp", "toolbox", "capabilities"])]
        format: String,
        /// Read the registry key in Redis instead of asking the daemon over the bus.
        #[arg(long)]
        from_registry: bool,
        /// How long to wait for the answer.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Serve every live toolbox's tools to one MCP client over stdin and stdout (what desktop
    /// and IDE clients launch); logs go to stderr.
    Mcp,
    /// Validate the effective configuration exactly as `serve` would and print it with secrets
    /// masked; exits 64 naming every bad key.
    CheckConfig,
    /// Print the `ACL SETUSER` line of the least-privilege Redis user this configuration needs
    /// (its key patterns and the commands toolhost sends), with a `<password>` placeholder.
    RedisAcl {
        /// The Redis user name.
        #[arg(long, default_value = crate::redis_acl::DEFAULT_USER)]
        user: String,
    },
    /// Exit 0 if the local daemon's HTTP endpoint answers 200, else 1 (for container health
    /// checks: needs no curl).
    Healthcheck {
        /// The route to ask: /healthz (alive) or /readyz (ready).
        #[arg(long, default_value = "/healthz")]
        path: String,
        /// How long to wait for the answer.
        #[arg(long, default_value = "2s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Inspect, replay or purge the dead-letter stream `dlq:<toolbox_id>`.
    Dlq {
        /// What to do with the dead letters.
        #[command(subcommand)]
        action: DlqAction,
    },
}

/// The `dlq` subcommands.
#[derive(Debug, Subcommand)]
pub enum DlqAction {
    /// Print the dead letters, oldest first, one JSON object per line.
    List {
        /// Print at most this many.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Put dead-lettered requests back on the requests stream, so they are answered (again).
    Replay {
        /// Ids of dead letters (`dlq_id`, as `list` prints them).
        #[arg(required_unless_present = "all", value_name = "DLQ_ID")]
        dlq_ids: Vec<String>,
        /// Replay every dead letter.
        #[arg(long, conflicts_with = "dlq_ids")]
        all: bool,
    },
    /// Delete dead letters without replaying them.
    Purge {
        /// Ids of dead letters (`dlq_id`, as `list` prints them).
        #[arg(required_unless_present = "all", value_name = "DLQ_ID")]
        dlq_ids: Vec<String>,
        /// Delete every dead letter.
        #[arg(long, conflicts_with = "dlq_ids")]
        all: bool,
    },
}

/// Parses `30s`, `500ms`, `2m` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(split) => text.split_at(split),
        None => (text, "s"),
    };
    let value: f64 = number.parse().map_err(|_| format!("'{text}' is not a duration like 30s or 500ms"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("unknown unit '{unit}' in '{text}'; use ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|err| format!("'{text}': {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlq_needs_ids_or_all() {
        assert!(Cli::try_parse_from(["toolhost", "dlq", "replay"]).is_err());
        assert!(Cli::try_parse_from(["toolhost", "dlq", "replay", "1-0", "--all"]).is_err());
        let cli = Cli::try_parse_from(["toolhost", "dlq", "purge", "--all"]).unwrap();
        assert!(matches!(cli.command, Command::Dlq { action: DlqAction::Purge { all: true, .. } }));
    }

    #[test]
    fn log_format_is_a_serve_option_only() {
        let cli = Cli::try_parse_from(["toolhost", "serve", "--log-format", "pretty"]).unwrap();
        assert!(
            matches!(cli.command, Command::Serve { log_format: Some(ref format), .. } if format == "pretty")
        );
        let err = Cli::try_parse_from(["toolhost", "call", "echo", "--log-format", "json"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument);
        assert!(Cli::try_parse_from(["toolhost", "serve", "--log-format", "xml"]).is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5h").is_err());
    }
}
