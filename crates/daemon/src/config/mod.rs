//! Configuration: `config/default.toml`, then an optional file, then the environment.
//!
//! Two stages, built once before any socket is opened: [`RawConfig`] mirrors the file and
//! environment layers (serde, unknown keys refused), and [`Config::load`] checks every value and
//! reports all bad keys in one pass.
//!
//! The `[redis]` section is in [`redis`], the layering that names every bad key in `layer`.
//!
//! **Invariant:** only this module reads environment variables, through the [`Env`] trait so
//! tests can pass a map.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
pub use toolhost_settings::{ConfigError, Env, EnvVars, KeyError, ProcessEnv};
use toolhost_settings::{mask_secret, mask_url, percent_decode};

pub use redis::RedisSection;
use toolhost_tools::terminal::Identity;

use crate::sources::{ExpandedHeaders, ToolsSection};
use layer::layer;

mod layer;
mod redis;
#[cfg(test)]
mod tests;

/// The built-in defaults, the same text as `config/default.toml`.
pub const DEFAULT_TOML: &str = include_str!("../../../../config/default.toml");

/// Prefix of the structured overrides: `TOOLHOST__SECTION__KEY`.
pub const ENV_PREFIX: &str = "TOOLHOST";
/// The configuration file, when `--config` is not given; every subcommand reads it, so client
/// commands run in a container see what its daemon sees.
pub const ENV_CONFIG: &str = "TOOLHOST_CONFIG";
/// The secret `toolhost call --key-id` signs with when the key is not in `[[auth.keys]]`.
pub const ENV_SIGNING_SECRET: &str = "TOOLHOST_SIGNING_SECRET";
/// Variables named `TOOLHOST_*` that are not configuration keys and so get no warning: the
/// configuration file, the golden-sample and soak knobs of the test suite, and the streams of
/// `examples/worker.py`.
pub const ENV_RESERVED: &[&str] = &[
    ENV_CONFIG,
    ENV_SIGNING_SECRET,
    "TOOLHOST_BLESS",
    "TOOLHOST_SOAK_REQUESTS",
    "TOOLHOST_REQUESTS_STREAM",
    "TOOLHOST_RESULTS_STREAM",
];
/// The log formats `[log] format` accepts; `auto` is human on a terminal and JSON otherwise.
pub const LOG_FORMATS: &[&str] = &["auto", "json", "pretty"];

/// How long a reader waits, at most, for the calls of a read of two entries or more to end
/// before it reads again, with `[dispatch] batch_under_load`.
pub const READ_HOLD: Duration = Duration::from_millis(1);

/// The Redis URL callers already set.
pub const ENV_REDIS_URL: &str = "REDIS_URL";
/// The agent name callers already set.
pub const ENV_AGENT_NAME: &str = "AGENT_NAME";
/// The default conversation of `chat_send`.
pub const ENV_CHAT_CONVERSATION_ID: &str = "CHAT_TOOL_CONVERSATION_ID";
/// `terminal_run` policy variables and the `[tools.terminal]` key each one sets.
pub const ENV_TERMINAL: &[(&str, &str)] = &[
    ("TERMINAL_ALLOWED_COMMANDS", "allowed_commands"),
    ("TERMINAL_DENY_COMMANDS", "deny_commands"),
    ("TERMINAL_TIMEOUT_SECONDS", "timeout_seconds"),
    ("TERMINAL_OUTPUT_CAP_BYTES", "output_cap_bytes"),
    ("TERMINAL_FUNCTION_OUTPUT_MAX_CHARS", "function_output_max_chars"),
    ("TERMINAL_REDACT_SUBSTRINGS", "redact_substrings"),
    ("TERMINAL_REDACT_PATTERNS", "redact_patterns"),
    ("TERMINAL_SANDBOX_CWD", "sandbox_cwd"),
    ("TERMINAL_MAX_PROCESSES", "max_processes"),
    ("TERMINAL_CPU_SECONDS", "cpu_seconds"),
    ("TERMINAL_FILE_SIZE_BYTES", "file_size_bytes"),
    ("TERMINAL_MAX_CONCURRENT", "max_concurrent"),
];
/// The configuration as layered from file and environment.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct RawConfig {
    pub redis: RedisSection,
    pub daemon: DaemonSection,
    pub streams: StreamsSection,
    pub dispatch: DispatchSection,
    pub http: HttpSection,
    pub log: LogSection,
    /// `[telemetry]`: spans and metrics over OTLP (issue 36), defined beside the pipeline.
    pub telemetry: crate::telemetry::settings::Section,
    pub tools: ToolsSection,
    /// The tool sources' sections (`[[agents]]`, `[[commands]]`, `[[http_tools]]`,
    /// `[[mcp_servers]]`), defined beside the sources and read apart from the rest.
    #[serde(flatten, skip_deserializing)]
    pub sources: crate::sources::SourceSections,
    /// The sections each door owns (`[mcp]`, ...), defined in the door's own folder and read
    /// apart from the rest (see `deserialize_all`).
    #[serde(flatten, skip_deserializing)]
    pub doors: crate::doors::DoorSections,
    /// `[auth]` and `[[policy]]`, defined beside the checks in `auth` and read apart from the rest.
    #[serde(flatten, skip_deserializing)]
    pub auth: crate::auth::AuthSections,
}

/// `[daemon]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct DaemonSection {
    pub toolbox_id: String,
    pub agent_name: String,
    pub chat_conversation_id: String,
    pub heartbeat_ms: u64,
    /// Worker threads of the async runtime (default 1); 0: one per core.
    pub worker_threads: usize,
}

/// `[streams]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct StreamsSection {
    pub requests: String,
    pub results: String,
    pub maxlen: usize,
    pub max_payload_bytes: usize,
    /// Glob patterns a caller's `response_topic` must match (bare names, before `key_prefix`).
    pub response_topics: Vec<String>,
    /// How many shards the requests stream is split into (1: the one stream).
    pub shards: u16,
    /// The shards this replica reads; empty: all of them. Numbers, or their text (a
    /// comma-separated `TOOLHOST__STREAMS__READ_SHARDS=0,1,2` gives text).
    #[serde(deserialize_with = "shard_numbers")]
    pub read_shards: Vec<u16>,
    /// While the shard count changes: the count it changes from (0: no change under way).
    pub previous_shards: u16,
}

/// A list of shard numbers, each a number or its text; one number alone is a list of one (the
/// environment gives `TOOLHOST__STREAMS__READ_SHARDS=1` as a number, not a list).
fn shard_numbers<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<u16>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Item {
        Number(u16),
        Text(String),
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Items {
        Many(Vec<Item>),
        One(Item),
    }
    let items = match Items::deserialize(deserializer)? {
        Items::Many(items) => items,
        Items::One(item) => vec![item],
    };
    items
        .into_iter()
        .map(|item| match item {
            Item::Number(number) => Ok(number),
            Item::Text(text) => text
                .trim()
                .parse()
                .map_err(|_| serde::de::Error::custom(format!("{text:?} is not a shard number"))),
        })
        .collect()
}

/// `[dispatch]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct DispatchSection {
    pub max_in_flight: usize,
    pub read_batch: usize,
    /// Under load, one answer script call per read and a reader that waits (at most
    /// [`READ_HOLD`]) for a busy read's calls before it reads again; off, a read's first answer
    /// goes out alone and at once, and the reader reads again at once.
    pub batch_under_load: bool,
    pub block_ms: u64,
    pub claim_idle_ms: u64,
    pub max_deliveries: u64,
    pub answered_retention_ms: u64,
    pub max_request_age_ms: u64,
    pub shutdown_grace_ms: u64,
    pub answer_unknown_tools: bool,
    /// Most progress entries written per call and second.
    pub progress_per_second: u64,
    /// The largest answer payload kept with its answered mark, so a retry of the request is
    /// answered with it; 0 keeps none.
    pub kept_answer_max_bytes: usize,
    /// The ledger's format this replica writes: 1 (the default), 2 (refusals folded into the
    /// request's answered mark) or 3 (as 2, and a cluster's claims are strings). See
    /// [`toolhost_bus::LedgerFormat`].
    pub ledger_format: u8,
    /// While a fleet rolls from ledger format 1 to 2: 1, so a replica writing format 2 still
    /// reads as format 1 does; from 2 to 3: 2, so a replica of format 3 still writes format 2's
    /// hashes while replicas of earlier releases may run; 0 otherwise.
    pub previous_ledger_format: u8,
}

/// `[http]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct HttpSection {
    pub listen: String,
    /// Connections served at once; a new one past it closes the oldest.
    pub max_connections: usize,
    /// How long a connection may go without sending a complete request header.
    pub idle_timeout_ms: u64,
}

/// `[log]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct LogSection {
    pub format: String,
    pub level: String,
}

/// The validated configuration the daemon runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// Everything as layered, for sections whose values need no conversion.
    pub raw: RawConfig,
    /// Parsed `[http] listen`.
    pub http_listen: SocketAddr,
    /// `[dispatch] block_ms`.
    pub block: Duration,
    /// `[dispatch] claim_idle_ms`: the lease of a call.
    pub claim_idle: Duration,
    /// `[dispatch] answered_retention_ms`.
    pub answered_retention: Duration,
    /// `[dispatch] max_request_age_ms`, `None` for no limit.
    pub max_request_age: Option<Duration>,
    /// `[dispatch] shutdown_grace_ms`.
    pub shutdown_grace: Duration,
    /// `[daemon] heartbeat_ms`.
    pub heartbeat: Duration,
    /// `[http] idle_timeout_ms`.
    pub http_idle_timeout: Duration,
    /// `[tools.terminal] run_as`, resolved once: whom terminal commands run as (`None`: the
    /// daemon's own user).
    pub terminal_identity: Option<Identity>,
    /// `[streams] response_topics`, compiled.
    pub response_topics: toolhost_bus::ResponseTopics,
    /// `[redis] ca_file`, `client_cert_file` and `client_key_file`, read and checked.
    pub redis_tls: toolhost_bus::Tls,
    /// `[[http_tools]] headers` with `${VAR}` expanded, one list per tool, in order.
    pub http_headers: ExpandedHeaders,
    /// The environment hosted MCP servers start from (`${VAR}` in their settings, and the
    /// children's `PATH`, `HOME` and `LANG`); read here, where the daemon reads its environment.
    pub mcp_env: EnvVars,
    /// `[auth]` and `[[policy]]`, with the signing keys' secrets read from the environment.
    pub auth: std::sync::Arc<crate::auth::Auth>,
    /// `[telemetry]` with the standard `OTEL_*` variables over it.
    pub telemetry: crate::telemetry::Settings,
    /// Things worth telling the operator that do not stop start-up, such as `TOOLHOST_*`
    /// variables that toolhost does not read; `main` prints them on stderr.
    pub warnings: Vec<String>,
}

impl Config {
    /// Loads defaults, then `file` (if any), then the environment, and validates the result.
    ///
    /// # Errors
    /// The file cannot be read or parsed, a key is unknown, or a value is bad.
    ///
    /// Without `file`, the file named by `TOOLHOST_CONFIG` (when set and not empty) is used.
    /// Every unknown key, value of the wrong type and bad value is reported, not just the first.
    pub fn load(file: Option<&Path>, env: &dyn Env) -> Result<Config, ConfigError> {
        let vars: HashMap<String, String> = env.vars().into_iter().collect();
        let from_env = vars.get(ENV_CONFIG).filter(|path| !path.is_empty()).map(PathBuf::from);
        let source = match (file, &from_env) {
            (Some(path), _) => Some(("--config", path)),
            (None, Some(path)) => Some((ENV_CONFIG, path.as_path())),
            (None, None) => None,
        };
        let (mut raw, mut errors) = layer(source, &vars)?;
        // A relative schema file is found beside the configuration file that names it.
        if let Some(dir) = source.and_then(|(_, path)| path.parent()) {
            raw.sources.resolve_relative_paths(dir);
        }
        match validate(raw, &vars, &mut errors) {
            Some(mut config) if errors.is_empty() => {
                config.warnings = unknown_variables(&vars);
                Ok(config)
            }
            _ => Err(ConfigError(errors)),
        }
    }
}

/// A warning for each `TOOLHOST_*` variable that is neither a `TOOLHOST__<SECTION>__<KEY>`
/// setting (those are checked as keys) nor reserved, e.g. `TOOLHOST_DISPATCH__X` with one
/// underscore: it would otherwise be ignored without a word.
pub fn unknown_variables(vars: &HashMap<String, String>) -> Vec<String> {
    let mut names: Vec<&String> = vars
        .keys()
        .filter(|name| name.starts_with(ENV_PREFIX) && !name.starts_with("TOOLHOST__"))
        .filter(|name| !ENV_RESERVED.contains(&name.as_str()))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let rest = name.trim_start_matches(ENV_PREFIX).trim_start_matches('_');
            if rest.contains("__") {
                format!("{name} is not a variable toolhost reads; ignored (did you mean TOOLHOST__{rest}?)")
            } else {
                format!(
                    "{name} is not a variable toolhost reads; ignored (settings are TOOLHOST__<SECTION>__<KEY>, \
                     other names are {})",
                    ENV_RESERVED.join(", ")
                )
            }
        })
        .collect()
}

/// Checks every value, adding each bad key to `errors`; the typed configuration when the values
/// can be converted at all.
fn validate(
    mut raw: RawConfig,
    vars: &HashMap<String, String>,
    errors: &mut Vec<KeyError>,
) -> Option<Config> {
    raw.redis.normalize();
    let http_headers = raw.sources.validate(&raw.tools, vars, errors);
    errors.extend(
        raw.doors.validate(&crate::doors::context::Checks { vars, toolbox_id: &raw.daemon.toolbox_id }),
    );
    errors.extend(raw.auth.validate(vars));
    let telemetry = raw.telemetry.resolve(vars, errors);
    let auth = std::sync::Arc::new(crate::auth::Auth::new(&raw.auth, vars));
    let mcp_env = EnvVars(vars.iter().map(|(name, value)| (name.clone(), value.clone())).collect());
    let mut bad =
        |key: &str, message: &str| errors.push(KeyError { key: key.to_owned(), message: message.to_owned() });
    raw.redis.validate(&mut bad);
    for (key, value) in [
        ("daemon.toolbox_id", &raw.daemon.toolbox_id),
        ("daemon.agent_name", &raw.daemon.agent_name),
        ("streams.requests", &raw.streams.requests),
        ("streams.results", &raw.streams.results),
    ] {
        if value.is_empty() || value.chars().any(char::is_whitespace) {
            bad(key, "must be non-empty and without spaces");
        }
    }
    for (key, value) in [
        ("dispatch.max_in_flight", raw.dispatch.max_in_flight as u64),
        ("dispatch.read_batch", raw.dispatch.read_batch as u64),
        ("dispatch.claim_idle_ms", raw.dispatch.claim_idle_ms),
        ("dispatch.max_deliveries", raw.dispatch.max_deliveries),
        ("dispatch.answered_retention_ms", raw.dispatch.answered_retention_ms),
        ("dispatch.progress_per_second", raw.dispatch.progress_per_second),
        ("daemon.heartbeat_ms", raw.daemon.heartbeat_ms),
        ("streams.maxlen", raw.streams.maxlen as u64),
        ("streams.max_payload_bytes", raw.streams.max_payload_bytes as u64),
        ("redis.response_timeout_ms", raw.redis.response_timeout_ms),
        ("http.max_connections", raw.http.max_connections as u64),
        ("http.idle_timeout_ms", raw.http.idle_timeout_ms),
    ] {
        if value == 0 {
            bad(key, "must be greater than 0");
        }
    }
    if raw.streams.shards == 0 || raw.streams.shards > toolhost_bus::MAX_SHARDS {
        bad("streams.shards", &format!("must be 1 to {}", toolhost_bus::MAX_SHARDS));
    }
    if raw.streams.previous_shards > toolhost_bus::MAX_SHARDS
        || (raw.streams.previous_shards != 0 && raw.streams.previous_shards == raw.streams.shards)
    {
        bad(
            "streams.previous_shards",
            &format!(
                "must be 0 (no change under way) or a count from 1 to {} other than shards",
                toolhost_bus::MAX_SHARDS
            ),
        );
    }
    if !(1..=3).contains(&raw.dispatch.ledger_format) {
        bad("dispatch.ledger_format", "must be 1, 2 or 3");
    }
    if !matches!((raw.dispatch.ledger_format, raw.dispatch.previous_ledger_format), (_, 0) | (2, 1) | (3, 2))
    {
        bad(
            "dispatch.previous_ledger_format",
            "must be 0 (no roll under way), 1 with ledger_format = 2 (a roll from format 1 to 2), or 2 with \
             ledger_format = 3 (a roll from format 2 to 3)",
        );
    }
    let mut read = raw.streams.read_shards.clone();
    read.sort_unstable();
    read.dedup();
    if read.len() < raw.streams.read_shards.len() {
        bad("streams.read_shards", "names a shard twice");
    }
    if let Some(shard) = read.iter().find(|shard| **shard >= raw.streams.shards) {
        bad(
            "streams.read_shards",
            &format!(
                "shard {shard} does not exist: the shards are 0 to {}",
                raw.streams.shards.saturating_sub(1)
            ),
        );
    }
    let response_topics = toolhost_bus::ResponseTopics::new(
        &raw.streams.response_topics,
        &raw.streams.results,
        &raw.streams.requests,
    )
    .map_err(|err| bad("streams.response_topics", &format!("not a glob pattern: {err}")))
    .ok();
    for (name, limit) in &raw.tools.limits {
        if limit.max_concurrent == Some(0) {
            bad(&format!("tools.limits.{name}.max_concurrent"), "must be greater than 0");
        }
    }
    if raw.dispatch.claim_idle_ms < 100 && raw.dispatch.claim_idle_ms > 0 {
        bad("dispatch.claim_idle_ms", "must be at least 100");
    }
    if !LOG_FORMATS.contains(&raw.log.format.as_str()) {
        bad("log.format", "expected auto, json or pretty");
    }
    if tracing_subscriber::EnvFilter::try_new(&raw.log.level).is_err() {
        bad("log.level", "not a valid tracing filter");
    }
    let http_listen = raw.http.listen.parse::<SocketAddr>();
    if http_listen.is_err() {
        bad("http.listen", "expected host:port, e.g. 127.0.0.1:9464");
    }
    let terminal = &raw.tools.terminal;
    if !(terminal.timeout_seconds.is_finite() && terminal.timeout_seconds > 0.0) {
        bad("tools.terminal.timeout_seconds", "must be a positive number");
    }
    if terminal.output_cap_bytes == 0 {
        bad("tools.terminal.output_cap_bytes", "must be greater than 0");
    }
    let terminal_identity = toolhost_tools::terminal::resolve_run_as(terminal.run_as.as_deref())
        .map_err(|message| bad("tools.terminal.run_as", &message))
        .unwrap_or(None);
    let redis_tls = raw.redis.tls(&mut bad);
    let http_listen = http_listen.ok()?;
    let response_topics = response_topics?;
    let ms = Duration::from_millis;
    Some(Config {
        http_listen,
        block: ms(raw.dispatch.block_ms),
        claim_idle: ms(raw.dispatch.claim_idle_ms),
        answered_retention: ms(raw.dispatch.answered_retention_ms),
        max_request_age: (raw.dispatch.max_request_age_ms > 0).then(|| ms(raw.dispatch.max_request_age_ms)),
        shutdown_grace: ms(raw.dispatch.shutdown_grace_ms),
        heartbeat: ms(raw.daemon.heartbeat_ms),
        http_idle_timeout: ms(raw.http.idle_timeout_ms),
        terminal_identity,
        response_topics,
        redis_tls,
        http_headers,
        mcp_env,
        auth,
        telemetry,
        warnings: Vec::new(),
        raw,
    })
}

impl Config {
    /// How to reach Redis, for the daemon and the client subcommands alike: the URL, the
    /// topology and the write settings.
    pub fn redis_options(&self) -> toolhost_bus::RedisOptions {
        let raw = &self.raw;
        let mut options = toolhost_bus::RedisOptions::new(raw.redis.url.clone());
        options.topology = raw.redis.topology();
        // A blocking read per shard read, the chat inbox's and the control stream's, and room.
        let shards_read = match raw.streams.read_shards.len() {
            0 => usize::from(raw.streams.shards),
            read => read,
        } + usize::from(raw.streams.previous_shards);
        options.idle_blocking = options.idle_blocking.max(shards_read + 4);
        options.key_prefix.clone_from(&raw.redis.key_prefix);
        options.tls = self.redis_tls.clone();
        options.maxlen = raw.streams.maxlen;
        options.response_timeout = Duration::from_millis(raw.redis.response_timeout_ms);
        // Group reads deliver larger values only as head, size and digest, so one read stays small.
        options.max_field_bytes = raw.streams.max_payload_bytes;
        options.gather_batches = raw.dispatch.batch_under_load;
        options.ledger_format = self.ledger_format();
        options.replica_acks = raw.redis.replica_acks;
        options.replica_ack_timeout = Duration::from_millis(raw.redis.replica_ack_timeout_ms);
        options
    }

    /// What the tool sources and the registry are built from, with `synthetic_tools` benchmark
    /// tools.
    pub(crate) fn sources(&self, synthetic_tools: usize) -> crate::sources::Settings {
        let raw = &self.raw;
        let ovos = &raw.doors.ovos;
        crate::sources::Settings {
            sections: raw.sources.clone(),
            tools: raw.tools.clone(),
            agent_name: raw.daemon.agent_name.clone(),
            chat_conversation_id: raw.daemon.chat_conversation_id.clone(),
            toolbox_id: raw.daemon.toolbox_id.clone(),
            terminal_identity: self.terminal_identity,
            http_headers: self.http_headers.clone(),
            secrets: self.secrets(),
            env: self.mcp_env.clone(),
            synthetic_tools,
            ovos: crate::sources::OvosHosting {
                url: ovos.url.clone(),
                max_frame_bytes: ovos.max_frame_bytes,
                host_toolboxes: ovos.host_toolboxes.clone(),
                rediscover: ovos.rediscover(),
                call_timeout: ovos.call_timeout(),
            },
            grace: self.shutdown_grace,
        }
    }

    /// The shards of the requests stream (`[streams] requests` and `shards`).
    pub fn shards(&self) -> toolhost_bus::Shards {
        toolhost_bus::Shards::new(&self.raw.streams.requests, self.raw.streams.shards)
    }

    /// The ledger's format, from `[dispatch] ledger_format` and `previous_ledger_format`.
    pub fn ledger_format(&self) -> toolhost_bus::LedgerFormat {
        match (self.raw.dispatch.ledger_format, self.raw.dispatch.previous_ledger_format) {
            (2, 0) => toolhost_bus::LedgerFormat::Two,
            (2, _) => toolhost_bus::LedgerFormat::Rolling,
            (3, 0) => toolhost_bus::LedgerFormat::Three,
            (3, _) => toolhost_bus::LedgerFormat::RollingToThree,
            _ => toolhost_bus::LedgerFormat::One,
        }
    }

    /// The shards the fleet is changing from (`[streams] previous_shards`), while it does.
    pub fn previous_shards(&self) -> Option<toolhost_bus::Shards> {
        let count = self.raw.streams.previous_shards;
        (count != 0).then(|| toolhost_bus::Shards::new(&self.raw.streams.requests, count))
    }

    /// The requests door's settings, from `[streams]`, `[dispatch]` and `[daemon]`.
    pub(crate) fn requests_door(&self) -> crate::doors::requests::Settings {
        let raw = &self.raw;
        crate::doors::requests::Settings {
            toolbox_id: raw.daemon.toolbox_id.clone(),
            requests_topic: raw.streams.requests.clone(),
            shards: self.shards(),
            shard: 0,
            read_shards: raw.streams.read_shards.clone(),
            previous: self.previous_shards(),
            draining: false,
            results_topic: raw.streams.results.clone(),
            max_payload_bytes: raw.streams.max_payload_bytes,
            max_request_age: self.max_request_age,
            answer_unknown_tools: raw.dispatch.answer_unknown_tools,
            response_topics: self.response_topics.clone(),
        }
    }

    /// The chat door's settings, from `[daemon]` and `[streams]`.
    pub(crate) fn chat_door(&self) -> crate::doors::chat::Settings {
        let raw = &self.raw;
        crate::doors::chat::Settings {
            agent_name: raw.daemon.agent_name.clone(),
            max_payload_bytes: raw.streams.max_payload_bytes,
            toolbox_id: raw.daemon.toolbox_id.clone(),
        }
    }

    /// How the stream doors' groups are read, from `[dispatch]` and `[daemon]`.
    pub(crate) fn reading(&self) -> crate::group::Reading {
        let raw = &self.raw;
        crate::group::Reading {
            group: raw.daemon.toolbox_id.clone(),
            read_batch: raw.dispatch.read_batch,
            read_hold: self.read_hold(),
            block: self.block,
            claim_idle: self.claim_idle,
            max_deliveries: raw.dispatch.max_deliveries,
            answered_retention: self.answered_retention,
            kept_answer_max_bytes: raw.dispatch.kept_answer_max_bytes,
            heartbeat_prefix: self.keys().heartbeat_prefix(&raw.daemon.toolbox_id),
        }
    }

    /// How long a reader waits for a busy read's calls before it reads again (zero: not at all).
    pub fn read_hold(&self) -> Duration {
        if self.raw.dispatch.batch_under_load { READ_HOLD } else { Duration::ZERO }
    }

    /// The key names: a cluster's when `[redis] cluster_nodes` is set.
    pub fn keys(&self) -> toolhost_bus::Keys {
        let redis = &self.raw.redis;
        if redis.cluster_nodes.is_empty() {
            toolhost_bus::Keys::new(redis.key_prefix.clone())
        } else {
            toolhost_bus::Keys::for_cluster(redis.key_prefix.clone())
        }
    }

    /// The effective configuration as TOML, with secrets masked: the Redis password and the
    /// terminal redaction substrings and patterns.
    pub fn masked_toml(&self) -> String {
        let mut raw = self.raw.clone();
        raw.redis.url = mask_url(&raw.redis.url);
        raw.redis.cluster_nodes = raw.redis.cluster_nodes.iter().map(|node| mask_url(node)).collect();
        raw.redis.sentinels = raw.redis.sentinels.iter().map(|url| mask_url(url)).collect();
        raw.redis.sentinel_password = mask_secret(&raw.redis.sentinel_password).to_owned();
        let terminal = &mut raw.tools.terminal;
        terminal.redact_substrings = terminal.redact_substrings.iter().map(|_| "***".to_owned()).collect();
        terminal.redact_patterns = terminal.redact_patterns.iter().map(|_| "***".to_owned()).collect();
        for tool in &mut raw.sources.http_tools {
            tool.headers.values_mut().for_each(|value| *value = "***".to_owned());
        }
        toml::to_string_pretty(&raw).unwrap_or_else(|err| format!("# cannot print configuration: {err}\n"))
    }
}

impl Config {
    /// The daemon's own secrets that a child process could print or a service echo back: the
    /// password of the Redis URL and of every sentinel URL (or the whole user information when it
    /// has no `:`), as written and percent-decoded, a `pass`/`password` query parameter,
    /// `sentinel_password`, and what the `${VAR}` references of `[[http_tools]] headers` expanded
    /// to. Empty when there are none.
    pub fn secrets(&self) -> Vec<String> {
        let mut res = self.http_headers.secrets.clone();
        res.extend_from_slice(self.auth.secrets());
        res.extend(self.raw.redis.secrets());
        let decoded: Vec<String> = res.iter().map(|secret| percent_decode(secret)).collect();
        res.extend(decoded);
        res.retain(|secret| !secret.is_empty());
        res.sort();
        res.dedup();
        res
    }
}
