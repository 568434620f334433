//! Configuration: `config/default.toml`, then an optional file, then the environment.
//!
//! Two stages, built once before any socket is opened: [`RawConfig`] mirrors the file and
//! environment layers (serde, unknown keys refused), and [`Config::load`] checks every value and
//! reports all bad keys in one pass.
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
use toolhost_tools::terminal::Identity;

use crate::sources::{ExpandedHeaders, ToolsSection};

/// The built-in defaults, the same text as `config/default.toml`.
pub const DEFAULT_TOML: &str = include_str!("../../../config/default.toml");

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
/// How many bad keys one load reports at most before it gives up looking for more.
const MAX_KEY_ERRORS: usize = 64;

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
/// Terminal keys whose value is a comma-separated list.
const TERMINAL_LISTS: &[&str] =
    &["allowed_commands", "deny_commands", "redact_substrings", "redact_patterns"];

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

/// `[redis]`
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct RedisSection {
    pub url: String,
    /// Seed nodes of a Redis Cluster; non-empty means cluster mode (`url` then only lends its
    /// scheme, credentials and database to nodes written bare).
    #[serde(default)]
    pub cluster_nodes: Vec<String>,
    pub key_prefix: String,
    pub response_timeout_ms: u64,
    /// Sentinel URLs; when any is set, the master is found through them and `url` gives only its
    /// credentials, database and TLS.
    pub sentinels: Vec<String>,
    pub sentinel_master: String,
    /// For the sentinels whose URL names none; empty: none.
    pub sentinel_username: String,
    pub sentinel_password: String,
    /// How often the sentinels are asked for the master when nothing fails; 0: only on failures.
    pub sentinel_check_ms: u64,
    /// PEM file of the CA that signed the servers' certificates, for every `rediss://`
    /// connection; empty: the Mozilla roots.
    pub ca_file: String,
    /// PEM files of the client certificate and its key, for mutual TLS; empty: none.
    pub client_cert_file: String,
    pub client_key_file: String,
}

/// Masks the passwords, so a configuration printed with `{:?}` leaks nothing.
impl std::fmt::Debug for RedisSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sentinels: Vec<String> = self.sentinels.iter().map(|url| mask_url(url)).collect();
        f.debug_struct("RedisSection")
            .field("url", &mask_url(&self.url))
            .field("cluster_nodes", &self.cluster_nodes.iter().map(|node| mask_url(node)).collect::<Vec<_>>())
            .field("key_prefix", &self.key_prefix)
            .field("response_timeout_ms", &self.response_timeout_ms)
            .field("sentinels", &sentinels)
            .field("sentinel_master", &self.sentinel_master)
            .field("sentinel_username", &self.sentinel_username)
            .field("sentinel_password", &mask_secret(&self.sentinel_password))
            .field("sentinel_check_ms", &self.sentinel_check_ms)
            .field("ca_file", &self.ca_file)
            .field("client_cert_file", &self.client_cert_file)
            .field("client_key_file", &self.client_key_file)
            .finish()
    }
}

impl RedisSection {
    /// Where Redis is, for logs and messages, passwords masked: the URL, the cluster's nodes, or
    /// the sentinels and the master's name.
    pub fn describe(&self) -> String {
        if !self.cluster_nodes.is_empty() {
            let nodes: Vec<String> = self.cluster_nodes.iter().map(|node| mask_url(node)).collect();
            format!("cluster {}", nodes.join(","))
        } else if self.sentinels.is_empty() {
            mask_url(&self.url)
        } else {
            let sentinels: Vec<String> = self.sentinels.iter().map(|url| mask_url(url)).collect();
            format!("master {} via sentinels {}", self.sentinel_master, sentinels.join(","))
        }
    }

    /// Where Redis is, for messages about its failures.
    pub fn place(&self) -> crate::outage::RedisPlace {
        let master = (!self.sentinels.is_empty()).then(|| self.sentinel_master.clone());
        crate::outage::RedisPlace::new(self.describe(), master)
    }
}

/// The TLS files of `[redis]`, read and checked; every problem goes to `bad`, and then the
/// settings are left empty (the configuration is refused anyway).
fn redis_tls(redis: &RedisSection, bad: &mut impl FnMut(&str, &str)) -> toolhost_bus::Tls {
    let mut read = |key: &str, path: &str| -> Option<Vec<u8>> {
        if path.is_empty() {
            return None;
        }
        std::fs::read(path).map_err(|err| bad(key, &format!("cannot read {path}: {err}"))).ok()
    };
    let ca = read("redis.ca_file", &redis.ca_file);
    let cert = read("redis.client_cert_file", &redis.client_cert_file);
    let key = read("redis.client_key_file", &redis.client_key_file);
    if redis.client_cert_file.is_empty() != redis.client_key_file.is_empty() {
        bad("redis.client_key_file", "client_cert_file and client_key_file go together: set both or neither");
        return toolhost_bus::Tls::default();
    }
    let set = [&redis.ca_file, &redis.client_cert_file].iter().any(|path| !path.is_empty());
    let tls_url = |url: &str| url.starts_with("rediss://");
    let uses_tls = tls_url(&redis.url)
        || redis.cluster_nodes.iter().any(|node| tls_url(node))
        || redis.sentinels.iter().any(|url| tls_url(url));
    if set && !uses_tls {
        bad(
            if redis.ca_file.is_empty() { "redis.client_cert_file" } else { "redis.ca_file" },
            "is set, but no connection uses TLS: write redis.url (or the sentinels or cluster nodes) as rediss://",
        );
        return toolhost_bus::Tls::default();
    }
    let ca_checked = match toolhost_bus::Tls::new(ca.clone(), None) {
        Ok(_) => true,
        Err(message) => {
            bad("redis.ca_file", &format!("{}: {message}", redis.ca_file));
            false
        }
    };
    let identity = cert.zip(key);
    match toolhost_bus::Tls::new(ca, identity) {
        Ok(tls) => tls,
        Err(message) => {
            if ca_checked {
                bad(
                    "redis.client_cert_file",
                    &format!("{} with {}: {message}", redis.client_cert_file, redis.client_key_file),
                );
            }
            toolhost_bus::Tls::default()
        }
    }
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

fn single(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::single(key, message)
}

/// Layers defaults, the file (named by the flag or variable in `file.0`) and the environment;
/// returns the result with every key error repaired, and those errors.
fn layer(
    file: Option<(&str, &Path)>,
    vars: &HashMap<String, String>,
) -> Result<(RawConfig, Vec<KeyError>), ConfigError> {
    let mut builder =
        config::Config::builder().add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml));
    if let Some((origin, path)) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|err| single(origin, format!("cannot read {}: {err}", path.display())))?;
        builder = builder.add_source(config::File::from_str(&text, config::FileFormat::Toml));
    }
    let structured: config::Map<String, String> = vars
        .iter()
        .filter(|(name, _)| name.starts_with("TOOLHOST__"))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    builder = builder.add_source(
        config::Environment::with_prefix(ENV_PREFIX)
            .prefix_separator("__")
            .separator("__")
            .try_parsing(true)
            .list_separator(",")
            .with_list_parse_key("tools.disabled")
            .with_list_parse_key("redis.cluster_nodes")
            .with_list_parse_key("redis.sentinels")
            .source(Some(structured)),
    );
    let set =
        |builder: config::ConfigBuilder<config::builder::DefaultState>, key: &str, value: config::Value| {
            builder.set_override(key, value).map_err(|err| single(key, err.to_string()))
        };
    if let Some(url) = vars.get(ENV_REDIS_URL) {
        builder = set(builder, "redis.url", url.clone().into())?;
    }
    if let Some(name) = vars.get(ENV_AGENT_NAME) {
        builder = set(builder, "daemon.agent_name", name.clone().into())?;
    }
    if let Some(conversation) = vars.get(ENV_CHAT_CONVERSATION_ID) {
        builder = set(builder, "daemon.chat_conversation_id", conversation.clone().into())?;
    }
    for (variable, key) in ENV_TERMINAL {
        let Some(value) = vars.get(*variable) else { continue };
        let path = format!("tools.terminal.{key}");
        let value: config::Value = if TERMINAL_LISTS.contains(key) {
            let items: Vec<String> =
                value.split(',').map(str::trim).filter(|item| !item.is_empty()).map(str::to_owned).collect();
            items.into()
        } else {
            terminal_scalar(variable, value)?
        };
        builder = set(builder, &path, value)?;
    }
    let layered = builder.build().map_err(|err| single("config", err.to_string()))?;
    deserialize_all(&layered)
}

/// Deserialises the layered configuration, collecting every unknown key and every value of the
/// wrong type instead of stopping at the first: serde names one bad key per attempt, so that key
/// is dropped (unknown) or set back to its default (wrong type) and the rest is tried again.
///
/// The sections the doors and the sources own ([`crate::doors::DoorSections`],
/// [`crate::sources::SourceSections`]) are read apart from the rest, so their keys are named as
/// exactly as the others'.
fn deserialize_all(layered: &config::Config) -> Result<(RawConfig, Vec<KeyError>), ConfigError> {
    let as_json = |layered: &config::Config| {
        layered
            .clone()
            .try_deserialize::<serde_json::Value>()
            .map_err(|err| single("config", err.to_string()))
    };
    let mut value = as_json(layered)?;
    let defaults = config::Config::builder()
        .add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml))
        .build()
        .map_err(|err| single("config", err.to_string()))?;
    let defaults = as_json(&defaults)?;
    let doors_value = take_sections(&mut value, crate::doors::DoorSections::NAMES);
    let sources_value = take_sections(&mut value, crate::sources::SourceSections::NAMES);
    let auth_value = take_sections(&mut value, crate::auth::AuthSections::NAMES);
    let mut errors = Vec::new();
    let doors = deserialize_repairing::<crate::doors::DoorSections>(doors_value, &defaults, &mut errors);
    let sources =
        deserialize_repairing::<crate::sources::SourceSections>(sources_value, &defaults, &mut errors);
    let auth = deserialize_repairing::<crate::auth::AuthSections>(auth_value, &defaults, &mut errors);
    match (deserialize_repairing::<RawConfig>(value, &defaults, &mut errors), doors, sources, auth) {
        (Some(mut raw), Some(doors), Some(sources), Some(auth)) => {
            raw.doors = doors;
            raw.sources = sources;
            raw.auth = auth;
            Ok((raw, errors))
        }
        _ => Err(ConfigError(errors)),
    }
}

/// Moves the top-level keys `names` of `value` into an object of their own.
fn take_sections(value: &mut serde_json::Value, names: &[&str]) -> serde_json::Value {
    let mut taken = serde_json::Map::new();
    if let Some(all) = value.as_object_mut() {
        for name in names {
            if let Some(section) = all.remove(*name) {
                taken.insert((*name).to_owned(), section);
            }
        }
    }
    serde_json::Value::Object(taken)
}

/// Deserialises `value` as `T`, adding each unknown key or value of the wrong type to `errors`
/// and repairing it from `defaults` until it reads; `None` when it cannot be repaired.
fn deserialize_repairing<T: serde::de::DeserializeOwned>(
    mut value: serde_json::Value,
    defaults: &serde_json::Value,
    errors: &mut Vec<KeyError>,
) -> Option<T> {
    while errors.len() < MAX_KEY_ERRORS {
        let err = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(read) => return Some(read),
            Err(err) => err,
        };
        let key = err.path().to_string();
        let message = err.inner().to_string();
        let message = message.split(", expected one of").next().unwrap_or_default().to_owned();
        // A missing field is reported at its parent: name the field itself.
        let missing = message.strip_prefix("missing field `").and_then(|rest| rest.split('`').next());
        match missing {
            Some(field) => errors.push(KeyError {
                key: format!("{key}.{field}"),
                message: "missing configuration field".to_owned(),
            }),
            None => errors.push(KeyError { key: key.clone(), message }),
        }
        if !repair(&mut value, &key, defaults) {
            break;
        }
    }
    None
}

/// Path segments of a dotted key such as `agents[1].timeout_s`.
fn key_path(key: &str) -> Vec<Result<usize, String>> {
    let mut path = Vec::new();
    for part in key.split('.') {
        let mut pieces = part.split('[');
        if let Some(name) = pieces.next().filter(|name| !name.is_empty()) {
            path.push(Err(name.to_owned()));
        }
        for index in pieces {
            path.push(index.trim_end_matches(']').parse::<usize>().map_err(|_| index.to_owned()));
        }
    }
    path
}

/// Sets `key` in `value` back to its value in `defaults`, or removes it when it has no default
/// (an unknown key). Returns whether anything changed, so the caller cannot loop forever.
fn repair(value: &mut serde_json::Value, key: &str, defaults: &serde_json::Value) -> bool {
    use serde_json::Value;
    let path = key_path(key);
    let Some((last, parents)) = path.split_last() else { return false };
    let mut default = Some(defaults);
    let mut node = value;
    for segment in parents {
        default = default.and_then(|default| match segment {
            Ok(index) => default.get(index),
            Err(name) => default.get(name.as_str()),
        });
        let next = match segment {
            Ok(index) => node.get_mut(index),
            Err(name) => node.get_mut(name.as_str()),
        };
        let Some(next) = next else { return false };
        node = next;
    }
    let default = default.and_then(|default| match last {
        Ok(index) => default.get(index),
        Err(name) => default.get(name.as_str()),
    });
    match (node, last, default) {
        (Value::Object(map), Err(name), Some(default)) => {
            map.insert(name.clone(), default.clone()) != Some(default.clone())
        }
        (Value::Object(map), Err(name), None) => map.remove(name).is_some(),
        (Value::Array(items), Ok(index), _) if *index < items.len() => {
            items.remove(*index);
            true
        }
        _ => false,
    }
}

/// Parses a scalar `TERMINAL_*` value into the type its key wants.
fn terminal_scalar(variable: &str, value: &str) -> Result<config::Value, ConfigError> {
    if *variable == *"TERMINAL_SANDBOX_CWD" {
        return Ok(value.to_owned().into());
    }
    if *variable == *"TERMINAL_TIMEOUT_SECONDS" {
        return value
            .trim()
            .parse::<f64>()
            .map(Into::into)
            .map_err(|_| single(variable, "expected a number of seconds"));
    }
    value.trim().parse::<u64>().map(Into::into).map_err(|_| single(variable, "expected a whole number"))
}

/// Checks every value, adding each bad key to `errors`; the typed configuration when the values
/// can be converted at all.
fn validate(
    mut raw: RawConfig,
    vars: &HashMap<String, String>,
    errors: &mut Vec<KeyError>,
) -> Option<Config> {
    // `TOOLHOST__REDIS__SENTINELS=""` (an unset compose variable) means no Sentinel, and
    // `TOOLHOST__REDIS__CLUSTER_NODES=""` no cluster; items are trimmed (`"a:1, b:2"`).
    raw.redis.sentinels =
        raw.redis.sentinels.iter().map(|url| url.trim().to_owned()).filter(|url| !url.is_empty()).collect();
    raw.redis.cluster_nodes = raw
        .redis
        .cluster_nodes
        .iter()
        .map(|node| node.trim().to_owned())
        .filter(|node| !node.is_empty())
        .collect();
    let http_headers = raw.sources.validate(&raw.tools, vars, errors);
    errors.extend(
        raw.doors.validate(&crate::doors::context::Checks { vars, toolbox_id: &raw.daemon.toolbox_id }),
    );
    errors.extend(raw.auth.validate(vars));
    let auth = std::sync::Arc::new(crate::auth::Auth::new(&raw.auth, vars));
    let mcp_env = EnvVars(vars.iter().map(|(name, value)| (name.clone(), value.clone())).collect());
    let mut bad =
        |key: &str, message: &str| errors.push(KeyError { key: key.to_owned(), message: message.to_owned() });
    if redis::parse_redis_url(&raw.redis.url).is_none() && !raw.redis.url.starts_with("unix://") {
        bad("redis.url", "expected a redis://, rediss:// or unix:// URL");
    }
    if !raw.redis.cluster_nodes.is_empty() {
        for (index, node) in raw.redis.cluster_nodes.iter().enumerate() {
            if !node.contains("://") && (node.contains('@') || node.contains('/')) {
                bad(
                    &format!("redis.cluster_nodes[{index}]"),
                    &format!(
                        "'{}' is not host:port: write a node with credentials or a database as a redis:// or \
                         rediss:// URL (or give them in redis.url)",
                        mask_url(node)
                    ),
                );
            } else if !valid_cluster_node(node) {
                bad(
                    &format!("redis.cluster_nodes[{index}]"),
                    &format!("expected host:port or a redis:// or rediss:// URL, got '{}'", mask_url(node)),
                );
            }
        }
        if let Some(problem) = toolhost_bus::Keys::cluster_prefix_problem(&raw.redis.key_prefix) {
            bad("redis.key_prefix", &problem);
        }
        // A cluster has database 0 only; `url` lends its database to bare nodes.
        let database = |url: &str| {
            redis::parse_redis_url(url)
                .map(|url| url.path().trim_matches('/').to_owned())
                .filter(|db| !db.is_empty() && db != "0")
        };
        if let Some(db) = database(&raw.redis.url) {
            bad("redis.url", &format!("names database {db}, but a Redis Cluster has database 0 only"));
        }
    }
    if !raw.redis.cluster_nodes.is_empty() && !raw.redis.sentinels.is_empty() {
        bad(
            "redis.sentinels",
            "a Redis Cluster is not watched by Sentinel: set redis.cluster_nodes or redis.sentinels, not both",
        );
    }
    for (index, url) in raw.redis.sentinels.iter().enumerate() {
        let key = format!("redis.sentinels[{index}]");
        match redis::parse_redis_url(url) {
            None => bad(&key, "expected a redis:// or rediss:// URL of a sentinel"),
            Some(parsed) if !matches!(parsed.scheme(), "redis" | "rediss") => bad(
                &key,
                &format!(
                    "sentinels are reached over TCP: expected a redis:// or rediss:// URL, not {}://",
                    parsed.scheme()
                ),
            ),
            // Sentinels have no databases: redis-rs would send SELECT, which they refuse.
            Some(parsed) if !matches!(parsed.path(), "" | "/" | "/0") => {
                bad(&key, "a sentinel URL names no database (no /<db>)")
            }
            Some(_) => {}
        }
    }
    if !raw.redis.sentinels.is_empty() {
        if raw.redis.url.starts_with("unix://") {
            bad(
                "redis.url",
                "with redis.sentinels the master is reached over TCP: expected redis:// or rediss://",
            );
        }
        if raw.redis.sentinel_master.is_empty() || raw.redis.sentinel_master.chars().any(char::is_whitespace)
        {
            bad("redis.sentinel_master", "must be non-empty and without spaces");
        }
    }
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
    let redis_tls = redis_tls(&raw.redis, &mut bad);
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
        if !raw.redis.cluster_nodes.is_empty() {
            options.topology = toolhost_bus::Topology::Cluster { nodes: raw.redis.cluster_nodes.clone() };
        }
        options.key_prefix.clone_from(&raw.redis.key_prefix);
        if !raw.redis.sentinels.is_empty() {
            let given = |value: &str| (!value.is_empty()).then(|| value.to_owned());
            options.topology = toolhost_bus::Topology::Sentinel(toolhost_bus::Sentinels {
                urls: raw.redis.sentinels.clone(),
                master_name: raw.redis.sentinel_master.clone(),
                username: given(&raw.redis.sentinel_username),
                password: given(&raw.redis.sentinel_password),
                check_interval: (raw.redis.sentinel_check_ms > 0)
                    .then(|| Duration::from_millis(raw.redis.sentinel_check_ms)),
            });
        }
        options.tls = self.redis_tls.clone();
        options.maxlen = raw.streams.maxlen;
        options.response_timeout = Duration::from_millis(raw.redis.response_timeout_ms);
        // Group reads deliver larger values only as head, size and digest, so one read stays small.
        options.max_field_bytes = raw.streams.max_payload_bytes;
        options.gather_batches = raw.dispatch.batch_under_load;
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

    /// The requests door's settings, from `[streams]`, `[dispatch]` and `[daemon]`.
    pub(crate) fn requests_door(&self) -> crate::doors::requests::Settings {
        let raw = &self.raw;
        crate::doors::requests::Settings {
            toolbox_id: raw.daemon.toolbox_id.clone(),
            requests_topic: raw.streams.requests.clone(),
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
        let redis = &self.raw.redis;
        let mut res = self.http_headers.secrets.clone();
        res.extend_from_slice(self.auth.secrets());
        res.push(redis.sentinel_password.clone());
        for url in std::iter::once(&redis.url).chain(&redis.sentinels).chain(&redis.cluster_nodes) {
            if let Some(scheme_end) = url.find("://") {
                let rest = &url[scheme_end + 3..];
                if let Some(at) = rest.rfind('@') {
                    let userinfo = &rest[..at];
                    res.push(userinfo.split_once(':').map_or(userinfo, |(_, password)| password).to_owned());
                }
            }
            if let Some((_, query)) = url.split_once('?') {
                for pair in query.split('&') {
                    if let Some(("pass" | "password", value)) = pair.split_once('=') {
                        res.push(value.to_owned());
                    }
                }
            }
        }
        let decoded: Vec<String> = res.iter().map(|secret| percent_decode(secret)).collect();
        res.extend(decoded);
        res.retain(|secret| !secret.is_empty());
        res.sort();
        res.dedup();
        res
    }
}

/// Whether `node` names a cluster node: `host:port` (no credentials, no database: those need a
/// URL), or a `redis://` or `rediss://` URL.
fn valid_cluster_node(node: &str) -> bool {
    if node.contains("://") {
        return redis::parse_redis_url(node).is_some_and(|url| {
            matches!(url.scheme(), "redis" | "rediss") && url.host_str().is_some_and(|host| !host.is_empty())
        });
    }
    !node.contains(['@', '/'])
        && node.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn file(text: &str) -> tempfile_path::TempPath {
        tempfile_path::TempPath::with(text)
    }

    mod tempfile_path {
        /// A file under the temp dir, removed on drop.
        pub struct TempPath(pub std::path::PathBuf);
        impl TempPath {
            pub fn with(text: &str) -> TempPath {
                let path =
                    std::env::temp_dir().join(format!("toolhost-config-{}.toml", uuid::Uuid::new_v4()));
                std::fs::write(&path, text).unwrap();
                TempPath(path)
            }
        }
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn defaults_load() {
        let config = Config::load(None, &env(&[])).unwrap();
        assert_eq!(config.raw.daemon.toolbox_id, "toolhost");
        assert_eq!(config.raw.streams.requests, "action-requests");
        assert_eq!(config.claim_idle, Duration::from_secs(30));
        assert_eq!(config.raw.tools.terminal.allowed_commands, Vec::<String>::new());
        assert_eq!(config.raw.tools.terminal.timeout_seconds, 5.0);
    }

    #[test]
    fn environment_overrides_file_and_defaults() {
        let path = file("[dispatch]\nmax_in_flight = 8\nclaim_idle_ms = 1000\n");
        let config = Config::load(
            Some(&path.0),
            &env(&[
                ("TOOLHOST__DISPATCH__CLAIM_IDLE_MS", "2000"),
                ("TOOLHOST__DISPATCH__MAX_DELIVERIES", "3"),
                ("TOOLHOST__TOOLS__DISABLED", "echo,terminal_run"),
                ("REDIS_URL", "redis://:hunter2@127.0.0.1:7000/0"),
                ("AGENT_NAME", "Helper"),
                ("TERMINAL_ALLOWED_COMMANDS", "echo, ls"),
                ("TERMINAL_TIMEOUT_SECONDS", "2.5"),
            ]),
        )
        .unwrap();
        assert_eq!(config.raw.dispatch.max_in_flight, 8);
        assert_eq!(config.claim_idle, Duration::from_secs(2));
        assert_eq!(config.raw.dispatch.max_deliveries, 3);
        assert_eq!(config.raw.tools.disabled, ["echo", "terminal_run"]);
        assert_eq!(config.raw.daemon.agent_name, "Helper");
        assert_eq!(config.raw.tools.terminal.allowed_commands, ["echo", "ls"]);
        assert_eq!(config.raw.tools.terminal.timeout_seconds, 2.5);
        let printed = config.masked_toml();
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("redis://:***@127.0.0.1:7000/0"), "{printed}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let path = file("[dispatch]\nmax_inflight = 8\n");
        let err = Config::load(Some(&path.0), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("max_inflight"), "{err}");
        let err = Config::load(None, &env(&[("TOOLHOST__DISPATCH__BOGUS", "1")])).unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let path = file(
            "[dispatch]\nmax_in_flight = 0\n[log]\nformat = \"xml\"\n[http]\nlisten = \"nowhere\"\n\
             [streams]\nresponse_topics = [\"results:[\"]\n[tools.limits.\"terminal_run\"]\nmax_concurrent = 0\n",
        );
        let err = Config::load(Some(&path.0), &env(&[])).unwrap_err();
        let text = err.to_string();
        for key in [
            "dispatch.max_in_flight",
            "log.format",
            "http.listen",
            "streams.response_topics",
            "tools.limits.terminal_run.max_concurrent",
        ] {
            assert!(text.contains(key), "{key} missing from {text}");
        }
        let err = Config::load(None, &env(&[("TOOLHOST__DISPATCH__MAX_IN_FLIGHT", "lots")])).unwrap_err();
        assert!(err.to_string().contains("max_in_flight"), "{err}");
        let err = Config::load(None, &env(&[("TERMINAL_TIMEOUT_SECONDS", "soon")])).unwrap_err();
        assert!(err.to_string().contains("TERMINAL_TIMEOUT_SECONDS"), "{err}");
    }

    #[test]
    fn progress_per_second_is_read_and_must_be_above_zero() {
        assert_eq!(Config::load(None, &env(&[])).unwrap().raw.dispatch.progress_per_second, 10);
        let three = file("[dispatch]\nprogress_per_second = 3\n");
        assert_eq!(Config::load(Some(&three.0), &env(&[])).unwrap().raw.dispatch.progress_per_second, 3);
        let zero = file("[dispatch]\nprogress_per_second = 0\n");
        let err = Config::load(Some(&zero.0), &env(&[])).unwrap_err();
        assert!(format!("{err:#}").contains("dispatch.progress_per_second"), "{err:#}");
    }

    #[test]
    fn default_toml_writes_out_every_key_with_its_default() {
        let written: toml::Value = toml::from_str(DEFAULT_TOML).unwrap();
        let mut effective = toml::Value::try_from(&Config::load(None, &env(&[])).unwrap().raw).unwrap();
        // The tables with no entries by default are documented as commented-out examples.
        let tables = effective.as_table_mut().unwrap();
        assert_eq!(tables.remove("agents"), Some(toml::Value::Array(Vec::new())));
        assert_eq!(tables.remove("policy"), Some(toml::Value::Array(Vec::new())));
        let keys = tables["auth"].as_table_mut().unwrap().remove("keys");
        assert_eq!(keys, Some(toml::Value::Array(Vec::new())));
        let tokens = tables["mcp"].as_table_mut().unwrap().remove("tokens");
        assert_eq!(tokens, Some(toml::Value::Array(Vec::new())));
        let tools = tables["tools"].as_table_mut().unwrap();
        assert_eq!(tools.remove("limits"), Some(toml::Value::Table(toml::Table::new())));
        assert_eq!(written, effective);
    }

    #[test]
    fn default_toml_examples_load_and_set_the_keys_left_unset() {
        // `# [table]` and `# key = value` lines are examples; the rest of the comments are prose.
        let example = |line: &str| {
            let Some(rest) = line.strip_prefix("# ") else { return false };
            let key = rest.split(" = ").next().unwrap_or_default();
            rest.starts_with('[')
                || (rest.contains(" = ") && key.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        };
        let uncommented: String = DEFAULT_TOML
            .lines()
            .map(|line| if example(line) { &line[2..] } else { line })
            .map(|line| format!("{line}\n"))
            .collect();
        let path = file(&uncommented);
        let secrets = [
            ("ORDERS_TOKEN", "t"),
            ("TOOLHOST_KEY_AGENTS_1", "0123456789abcdef"),
            ("MCP_TOKEN_LAPTOP", "fedcba9876543210"),
        ];
        let config = Config::load(Some(&path.0), &env(&secrets)).unwrap();
        assert_eq!(config.raw.auth.auth.keys[0].tenants.as_deref(), Some(&["acme".to_owned()][..]));
        assert_eq!(config.raw.auth.policy[0].deny, ["terminal_run"]);
        assert_eq!(config.raw.doors.mcp.tokens[0].tenant, "acme");
        assert!(config.secrets().contains(&"0123456789abcdef".to_owned()));
        let terminal = &config.raw.tools.terminal;
        assert!(terminal.sandbox_cwd.is_some());
        assert!(terminal.max_processes.is_some() && terminal.cpu_seconds.is_some());
        assert!(terminal.file_size_bytes.is_some());
        assert_eq!(config.raw.tools.limits["terminal_run"].max_concurrent, Some(2));
        assert_eq!(config.raw.sources.agents.len(), 1);
        assert_eq!(config.raw.sources.agents[0].name, "coder");
    }

    #[test]
    fn one_unknown_key_does_not_hide_the_others() {
        let path = file(
            "bogus = 1\n[dispatch]\nmax_inflight = 8\nmax_deliveries = \"many\"\nread_batch = 0\n\
             [log]\nformat = \"xml\"\n[[agents]]\nname = \"coder\"\ndescription = \"d\"\ntimeout = 3\n",
        );
        let err = Config::load(Some(&path.0), &env(&[("TOOLHOST__HTTP__LISTENER", "x")])).unwrap_err();
        let keys: Vec<&str> = err.0.iter().map(|error| error.key.as_str()).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            [
                "agents[0].timeout",
                "bogus",
                "dispatch.max_deliveries",
                "dispatch.max_inflight",
                "dispatch.read_batch",
                "http.listener",
                "log.format",
            ],
            "{err}"
        );
        let text = err.to_string();
        assert!(text.contains("  dispatch.max_inflight: unknown field `max_inflight`\n"), "{text}");
    }

    #[test]
    fn batching_under_load_is_on_by_default_and_reaches_the_bus_and_the_readers_when_off() {
        let config = |extra: &[(&str, &str)]| Config::load(None, &env(extra)).unwrap();
        let on = config(&[]);
        assert!(on.raw.dispatch.batch_under_load);
        assert!(on.redis_options().gather_batches);
        assert_eq!(on.read_hold(), READ_HOLD);
        let off = config(&[("TOOLHOST__DISPATCH__BATCH_UNDER_LOAD", "false")]);
        assert!(!off.redis_options().gather_batches);
        assert_eq!(off.read_hold(), Duration::ZERO);
    }

    #[test]
    fn toolhost_config_names_the_file_when_no_flag_does() {
        let named = file("[dispatch]\nmax_in_flight = 7\n");
        let flagged = file("[dispatch]\nmax_in_flight = 9\n");
        let vars = env(&[(ENV_CONFIG, named.0.to_str().unwrap())]);
        assert_eq!(Config::load(None, &vars).unwrap().raw.dispatch.max_in_flight, 7);
        assert_eq!(Config::load(Some(&flagged.0), &vars).unwrap().raw.dispatch.max_in_flight, 9);
        assert_eq!(Config::load(None, &env(&[(ENV_CONFIG, "")])).unwrap().raw.dispatch.max_in_flight, 256);
        let err = Config::load(None, &env(&[(ENV_CONFIG, "/nonexistent/toolhost.toml")])).unwrap_err();
        assert_eq!(err.0[0].key, ENV_CONFIG, "{err}");
    }

    #[test]
    fn unknown_toolhost_variables_are_warned_about() {
        let config = Config::load(
            None,
            &env(&[
                ("TOOLHOST_DISPATCH__MAX_IN_FLIGHT", "8"),
                ("TOOLHOST_VERBOSE", "1"),
                ("TOOLHOST_CONFIG", ""),
                ("TOOLHOST_SOAK_REQUESTS", "10"),
                ("TOOLHOST__DISPATCH__MAX_IN_FLIGHT", "9"),
            ]),
        )
        .unwrap();
        assert_eq!(config.raw.dispatch.max_in_flight, 9);
        assert_eq!(config.warnings.len(), 2, "{:?}", config.warnings);
        assert!(config.warnings[0].starts_with("TOOLHOST_DISPATCH__MAX_IN_FLIGHT is not a variable"));
        assert!(config.warnings[0].contains("did you mean TOOLHOST__DISPATCH__MAX_IN_FLIGHT?"));
        assert!(config.warnings[1].starts_with("TOOLHOST_VERBOSE is not a variable"));
        assert!(config.warnings[1].contains("TOOLHOST_CONFIG"), "{}", config.warnings[1]);
    }

    #[test]
    fn log_format_auto_is_the_default() {
        assert_eq!(Config::load(None, &env(&[])).unwrap().raw.log.format, "auto");
        for format in LOG_FORMATS {
            let config = Config::load(None, &env(&[("TOOLHOST__LOG__FORMAT", format)])).unwrap();
            assert_eq!(config.raw.log.format, *format);
        }
    }

    #[test]
    fn agents_need_tool_names() {
        let path = file(
            "[[agents]]\nname = \"coder\"\ndescription = \"Writes code.\"\n\n\
             [[agents]]\nname = \"dev.agent\"\ndescription = \"d\"\ntimeout_s = 0\n",
        );
        let err = Config::load(Some(&path.0), &env(&[])).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("agents[1].name: must be 1-64 of [a-zA-Z0-9_-]"), "{text}");
        assert!(text.contains("agents[1].timeout_s"), "{text}");
        assert!(!text.contains("agents[0]"), "{text}");
        let path = file("[[agents]]\nname = \"coder\"\ndescription = \"Writes code.\"\n");
        let config = Config::load(Some(&path.0), &env(&[])).unwrap();
        assert_eq!(config.raw.sources.agents[0].parameter, "message");
        assert_eq!(config.raw.sources.agents[0].timeout_s, 30.0);
    }

    #[test]
    fn http_headers_are_expanded_and_masked() {
        let path = file(
            "[[http_tools]]\nname = \"lookup\"\ndescription = \"d\"\nurl = \"http://127.0.0.1:9/orders/{id}\"\n\
             headers = { Authorization = \"Bearer ${ORDERS_TOKEN}\", X-Team = \"ops-literal\" }\n",
        );
        let config = Config::load(Some(&path.0), &env(&[("ORDERS_TOKEN", "s3cret-tok")])).unwrap();
        let headers = config.http_headers.of(0);
        assert!(
            headers.contains(&("Authorization".to_owned(), "Bearer s3cret-tok".to_owned())),
            "{headers:?}"
        );
        assert!(config.secrets().contains(&"s3cret-tok".to_owned()));
        let printed = config.masked_toml();
        assert!(!printed.contains("s3cret") && !printed.contains("ops-literal"), "{printed}");
        assert!(printed.contains("Authorization = \"***\""), "{printed}");
        assert!(!format!("{config:?}").contains("s3cret"));
        // The method defaults to POST.
        assert_eq!(config.raw.sources.http_tools[0].method, "POST");
        let err = Config::load(Some(&path.0), &env(&[])).unwrap_err().to_string();
        assert!(
            err.contains(
                "http_tools[0].headers.Authorization: the environment variable ORDERS_TOKEN is not set"
            ),
            "{err}"
        );
    }

    #[test]
    fn every_bad_source_key_is_named_together() {
        let dir = std::env::temp_dir().join(format!("toolhost-config-dir-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(dir.join("schemas")).unwrap();
        std::fs::write(
            dir.join("schemas/wc.json"),
            r#"{"type": "object", "properties": {"file": {"type": "string"}}}"#,
        )
        .unwrap();
        let path = dir.join("toolhost.toml");
        std::fs::write(
            &path,
            "[dispatch]\nmax_in_flight = 0\n\n\
             [[commands]]\nname = \"word_count\"\ndescription = \"d\"\nargv = [\"wc\", \"-w\", \"{file}\"]\nargument_schema_file = \"schemas/wc.json\"\n\n\
             [[commands]]\nname = \"broken\"\ndescription = \"d\"\nargv = [\"{prog}\"]\ntimeout_ms = 0\nbogus = 1\n",
        )
        .unwrap();
        let err = Config::load(Some(&path), &env(&[])).unwrap_err().to_string();
        assert!(err.contains("bogus"), "{err}");
        std::fs::write(&path, "[[commands]]\nname = \"nameless\"\nargv = [\"wc\"]\n").unwrap();
        let err = Config::load(Some(&path), &env(&[])).unwrap_err().to_string();
        assert!(err.contains("commands[0].description: missing configuration field"), "{err}");
        std::fs::write(
            &path,
            "[dispatch]\nmax_in_flight = 0\n\n\
             [[commands]]\nname = \"word_count\"\ndescription = \"d\"\nargv = [\"wc\", \"-w\", \"{file}\"]\nargument_schema_file = \"schemas/wc.json\"\n\n\
             [[commands]]\nname = \"broken\"\ndescription = \"d\"\nargv = [\"{prog}\"]\ntimeout_ms = 0\n\n\
             [[http_tools]]\nname = \"h\"\ndescription = \"d\"\nmethod = \"TRACE\"\nurl = \"http://{host}/x\"\n",
        )
        .unwrap();
        let err = Config::load(Some(&path), &env(&[])).unwrap_err().to_string();
        for key in [
            "dispatch.max_in_flight",
            "commands[1].timeout_ms",
            "commands[1].argv[0]: the program cannot be a placeholder",
            "http_tools[0].method",
            "http_tools[0].url: placeholders may fill the path and the query, never the host",
        ] {
            assert!(err.contains(key), "{key} missing from {err}");
        }
        assert!(!err.contains("commands[0]"), "the schema file is found beside the configuration: {err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn urls_are_masked() {
        assert_eq!(mask_url("redis://user:pw@host:6379/0"), "redis://user:***@host:6379/0");
        assert_eq!(mask_url("rediss://:pw@host"), "rediss://:***@host");
        assert_eq!(mask_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(mask_url("redis://:pa/ss@host:6379/0"), "redis://:***@host:6379/0");
        assert_eq!(mask_url("redis://token@host"), "redis://***@host");
        // Query parameters `secrets()` counts as secrets, and credentials written without a scheme.
        assert_eq!(
            mask_url("unix:///run/redis.sock?db=1&pass=s3cret"),
            "unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(mask_url("redis://h:1/0?password=s3cret&x=1"), "redis://h:1/0?password=***&x=1");
        assert_eq!(mask_url("ops:s3cret@10.0.0.1:7000"), "ops:***@10.0.0.1:7000");
        assert_eq!(mask_url("10.0.0.1:7000"), "10.0.0.1:7000");
        let config =
            Config::load(None, &env(&[("REDIS_URL", "unix:///run/redis.sock?db=1&password=s3cret")]))
                .unwrap();
        assert_eq!(config.secrets(), ["s3cret"]);
        for printed in [config.masked_toml(), format!("{config:?}"), config.raw.redis.describe()] {
            assert!(!printed.contains("s3cret"), "{printed}");
        }
    }

    #[test]
    fn cluster_nodes_are_trimmed_and_bare_nodes_take_no_credentials() {
        let nodes = |value: &str| Config::load(None, &env(&[("TOOLHOST__REDIS__CLUSTER_NODES", value)]));
        // Unset (an empty compose variable): no cluster.
        let config = nodes("").unwrap();
        assert!(config.raw.redis.cluster_nodes.is_empty());
        assert!(!config.redis_options().topology.is_cluster());
        let config = nodes(" 10.0.0.1:7000, 10.0.0.2:7001 ,").unwrap();
        assert_eq!(config.raw.redis.cluster_nodes, ["10.0.0.1:7000", "10.0.0.2:7001"]);
        assert!(config.redis_options().topology.is_cluster());
        let err = nodes("ops:s3cret@10.0.0.1:7000,10.0.0.2:7001/2").unwrap_err().to_string();
        for key in ["redis.cluster_nodes[0]", "redis.cluster_nodes[1]"] {
            assert!(err.contains(key), "{key}: {err}");
        }
        assert!(err.contains("redis:// or rediss:// URL"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
        assert!(!valid_cluster_node("ops:s3cret@10.0.0.1:7000") && !valid_cluster_node("h:1/2"));
        assert!(valid_cluster_node("redis://ops:s3cret@10.0.0.1:7000"));
    }

    #[test]
    fn a_unix_sentinel_url_is_refused_as_not_tcp() {
        let err = Config::load(
            None,
            &env(&[
                ("TOOLHOST__REDIS__SENTINELS", "unix:///run/sentinel.sock"),
                ("TOOLHOST__REDIS__SENTINEL_MASTER", "orders"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("redis.sentinels[0]") && err.contains("not unix://"), "{err}");
        assert!(!err.contains("database"), "{err}");
    }

    #[test]
    fn secrets_are_the_url_password_as_written_and_decoded() {
        let secrets = |url: &str| Config::load(None, &env(&[("REDIS_URL", url)])).unwrap().secrets();
        assert_eq!(secrets("redis://:hunter2@127.0.0.1:6379/0"), ["hunter2"]);
        assert_eq!(secrets("redis://ops:p%40ss%2Fw@127.0.0.1"), ["p%40ss%2Fw", "p@ss/w"]);
        assert_eq!(secrets("redis://token@127.0.0.1"), ["token"]);
        assert_eq!(secrets("unix:///run/redis.sock?db=1&pass=s3cret"), ["s3cret"]);
        assert_eq!(secrets("redis://127.0.0.1:6379"), Vec::<String>::new());
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn unknown_run_as_users_are_named() {
        let err = Config::load(None, &env(&[("TOOLHOST__TOOLS__TERMINAL__RUN_AS", "toolhost-no-such-user")]))
            .unwrap_err();
        assert!(
            err.to_string().contains("tools.terminal.run_as: no user named 'toolhost-no-such-user'"),
            "{err}"
        );
        let path = file("[http]\nmax_connections = 0\nidle_timeout_ms = 0\n");
        let err = Config::load(Some(&path.0), &env(&[])).unwrap_err().to_string();
        assert!(err.contains("http.max_connections") && err.contains("http.idle_timeout_ms"), "{err}");
    }

    #[test]
    fn sentinels_are_read_from_the_environment_and_become_the_topology() {
        let config = Config::load(
            None,
            &env(&[
                ("TOOLHOST__REDIS__SENTINELS", "redis://10.0.0.1:26379, rediss://:s3ntinel@10.0.0.2:26380"),
                ("TOOLHOST__REDIS__SENTINEL_MASTER", "orders"),
                ("TOOLHOST__REDIS__SENTINEL_PASSWORD", "hunter2"),
                ("REDIS_URL", "redis://:s3cret@ignored:6379/2"),
            ]),
        )
        .unwrap();
        assert_eq!(
            config.raw.redis.sentinels,
            ["redis://10.0.0.1:26379", "rediss://:s3ntinel@10.0.0.2:26380"]
        );
        let options = config.redis_options();
        let toolhost_bus::Topology::Sentinel(sentinels) = &options.topology else {
            panic!("{:?}", options.topology)
        };
        assert_eq!(sentinels.master_name, "orders");
        assert_eq!((sentinels.username.as_deref(), sentinels.password.as_deref()), (None, Some("hunter2")));
        assert_eq!(sentinels.check_interval, Some(Duration::from_secs(5)));
        assert_eq!(options.url, "redis://:s3cret@ignored:6379/2");
        for printed in [config.masked_toml(), format!("{config:?}"), config.raw.redis.describe()] {
            for secret in ["s3ntinel", "hunter2", "s3cret"] {
                assert!(!printed.contains(secret), "{secret} in {printed}");
            }
        }
        assert!(config.masked_toml().contains("rediss://:***@10.0.0.2:26380"), "{}", config.masked_toml());
        assert!(
            config.raw.redis.describe().starts_with("master orders via sentinels redis://10.0.0.1:26379,")
        );
        assert_eq!(config.secrets(), ["hunter2", "s3cret", "s3ntinel"]);
        // Unset (an empty compose variable): no Sentinel.
        let config = Config::load(None, &env(&[("TOOLHOST__REDIS__SENTINELS", "")])).unwrap();
        assert!(config.raw.redis.sentinels.is_empty());
        assert_eq!(config.redis_options().topology, toolhost_bus::Topology::Single);
    }

    #[test]
    fn bad_sentinel_settings_are_named_together() {
        let path = file(
            "[redis]\nurl = \"unix:///run/redis.sock\"\nsentinels = [\"http://x:1\", \"redis://:s3cret@h:26379/1\"]\n\
             sentinel_master = \"\"\n",
        );
        let err = Config::load(Some(&path.0), &env(&[])).unwrap_err();
        let text = err.to_string();
        for key in ["redis.sentinels[0]", "redis.sentinels[1]", "redis.url", "redis.sentinel_master"] {
            assert!(text.contains(key), "{key} missing from {text}");
        }
        assert!(!text.contains("s3cret"), "{text}");
    }

    #[test]
    fn acl_users_and_tls_urls_are_accepted() {
        for url in [
            "redis://ops:s3cret@10.0.0.1:6379/2",
            "rediss://:s3cret@redis.example:6380",
            "unix:///run/redis.sock",
        ] {
            let config = Config::load(None, &env(&[("REDIS_URL", url)])).unwrap();
            assert_eq!(config.raw.redis.url, url);
            assert!(!config.masked_toml().contains("s3cret"));
            assert!(!format!("{config:?}").contains("s3cret"));
        }
        let err = Config::load(None, &env(&[("REDIS_URL", "http://:s3cret@host")])).unwrap_err();
        assert!(err.to_string().contains("redis.url") && !err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn cluster_nodes_choose_the_topology_and_are_masked() {
        let config = Config::load(
            None,
            &env(&[
                ("REDIS_URL", "rediss://app:s3cret@seed:6379"),
                ("TOOLHOST__REDIS__CLUSTER_NODES", "10.0.0.1:7000,redis://ops:n0de@10.0.0.2:7001"),
            ]),
        )
        .unwrap();
        assert_eq!(config.raw.redis.cluster_nodes, ["10.0.0.1:7000", "redis://ops:n0de@10.0.0.2:7001"]);
        let options = config.redis_options();
        assert!(options.topology.is_cluster());
        assert!(config.keys().is_cluster());
        for printed in [config.masked_toml(), format!("{config:?}"), config.raw.redis.describe()] {
            assert!(!printed.contains("s3cret") && !printed.contains("n0de"), "{printed}");
        }
        assert!(config.secrets().contains(&"n0de".to_owned()));
        // Without nodes: one server, as before.
        let single = Config::load(None, &env(&[])).unwrap();
        assert!(!single.redis_options().topology.is_cluster() && !single.keys().is_cluster());
        let path = file("[redis]\ncluster_nodes = [\"nope\", \"unix:///x.sock\"]\nkey_prefix = \"a{b}:\"\n");
        let err = Config::load(Some(&path.0), &env(&[])).unwrap_err().to_string();
        for key in ["redis.cluster_nodes[0]", "redis.cluster_nodes[1]", "redis.key_prefix"] {
            assert!(err.contains(key), "{key}: {err}");
        }
        let path = file("[redis]\ncluster_nodes = [\"127.0.0.1:7000\"]\nkey_prefix = \"{toolhost}:\"\n");
        assert!(Config::load(Some(&path.0), &env(&[])).is_ok());
        let err =
            Config::load(Some(&path.0), &env(&[("REDIS_URL", "redis://:s3cret@seed:6379/2")])).unwrap_err();
        assert!(err.to_string().contains("redis.url") && err.to_string().contains("database 0"), "{err}");
    }
}
