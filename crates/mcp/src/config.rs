//! One `[[mcp_servers]]` entry: its TOML form ([`McpServerConfig`]), its checks, and the
//! resolved form a source runs from ([`ServerSpec`]), with `${VAR}` expanded.
//!
//! Values of `env` and `headers` are [`Secret`]s: their `Debug` and their serialisation print
//! `***`, so `check-config` and the logs never show them, expansions included.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::names::valid_name_part;

/// Default of [`McpServerConfig::timeout_ms`].
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// Default of [`McpServerConfig::max_concurrent`].
pub const DEFAULT_MAX_CONCURRENT: usize = 16;
/// Default of [`McpServerConfig::max_response_bytes`]: 1 MiB, as `[[http_tools]]`.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1 << 20;
/// Longest prefix accepted, so that a prefixed name keeps room for the tool's own name.
pub const MAX_PREFIX_LEN: usize = 32;

/// Headers the streamable HTTP transport sets itself.
const RESERVED_HEADERS: [&str; 4] = ["accept", "mcp-session-id", "mcp-protocol-version", "last-event-id"];

/// One `[[mcp_servers]]` entry as written in the configuration.
///
/// Exactly one transport: `command` (with `args`, `env`, `cwd`) starts a stdio child; `url`
/// (with `headers`) reaches a streamable HTTP server.
#[derive(Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The source's name, 1-64 of `[a-zA-Z0-9_-]`, unique among the servers.
    pub name: String,
    /// Program of a stdio server, looked up on the child's `PATH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// The child's environment: only these, plus `PATH`, `HOME` and `LANG`, reach it. Values may
    /// hold `${VAR}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, Secret>,
    /// The child's working directory (default: the daemon's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// Endpoint of a streamable HTTP server (`http://` or `https://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Headers sent with every HTTP request. Values may hold `${VAR}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, Secret>,
    /// Put in front of every tool name; default `"<name>__"`, `""` allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Longest a call may run, unless the request's deadline is earlier (default 60000).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Calls of this server's tools running at once (default 16).
    #[serde(default = "default_max_concurrent")]
    pub max_concurrent: usize,
    /// Allow list by the server's original tool names; default all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Largest answer of a call, the size of its result's JSON (default 1 MiB); a larger one
    /// answers `tool_failed` naming this limit, never cut.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: usize,
    /// How the session opens: `"legacy"` (`initialize`, up to 2025-11-25), `"auto"` (probe
    /// `server/discover` for 2026-07-28, else `initialize`), or `"2026-07-28"` (discover only);
    /// default `"auto"` over HTTP and `"legacy"` over stdio (see [`Protocol`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
}

fn default_max_response_bytes() -> usize {
    DEFAULT_MAX_RESPONSE_BYTES
}

/// The protocol generation a source opens its session in (`[[mcp_servers]] protocol`).
///
/// `Auto` probes with `server/discover` and falls back to `initialize` when the server answers
/// as a legacy one (an error, at once) or says nothing for rmcp's 10 s; a stdio server that
/// ignores an unknown request would cost those 10 s at every start, which is why stdio defaults
/// to `Legacy` and HTTP, whose legacy servers answer an unknown method at once, to `Auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum Protocol {
    /// `initialize`, the newest version up to 2025-11-25.
    #[serde(rename = "legacy")]
    Legacy,
    /// 2026-07-28 when the server offers it, else `initialize`.
    #[serde(rename = "auto")]
    Auto,
    /// 2026-07-28 only: a server that does not offer it does not connect.
    #[serde(rename = "2026-07-28")]
    Modern,
}

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}

fn default_max_concurrent() -> usize {
    DEFAULT_MAX_CONCURRENT
}

impl fmt::Debug for McpServerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServerConfig")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env)
            .field("cwd", &self.cwd)
            .field("url", &self.url)
            .field("headers", &self.headers)
            .field("prefix", &self.prefix)
            .field("timeout_ms", &self.timeout_ms)
            .field("max_concurrent", &self.max_concurrent)
            .field("tools", &self.tools)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("protocol", &self.protocol)
            .finish()
    }
}

/// A configured value that must not be shown: `Debug` and serialisation print `***`.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself, for the child or the request; never for a log line.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("***")
    }
}

/// How a source reaches its server, with every `${VAR}` expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking MCP on stdin and stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Its environment besides `PATH`, `HOME` and `LANG`.
        env: BTreeMap<String, Secret>,
        /// Its working directory.
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP endpoint.
    Http {
        /// The endpoint.
        url: String,
        /// Headers sent with every request.
        headers: BTreeMap<String, Secret>,
    },
}

/// A checked server entry, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// The source's name.
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
    /// Put in front of every tool name.
    pub prefix: String,
    /// Per-call limit.
    pub timeout: Duration,
    /// Calls running at once.
    pub max_concurrent: usize,
    /// Allow list by original names, if any.
    pub tools: Option<Vec<String>>,
    /// Largest answer of a call, in bytes of its result's JSON.
    pub max_response_bytes: usize,
    /// How the session opens.
    pub protocol: Protocol,
}

/// One problem with the configuration, naming its key (`mcp_servers[0].url`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ConfigError {
    /// The key, such as `mcp_servers[1].headers.Authorization`.
    pub key: String,
    /// What is wrong with it.
    pub message: String,
}

/// Every problem found in the `[[mcp_servers]]` entries, one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<ConfigError>);

/// Checks every entry and resolves it against `env` (the daemon's environment, for `${VAR}`).
///
/// # Errors
/// Every problem found, each naming its key: names invalid or repeated, no transport or both,
/// keys of the other transport, a bad URL, prefix, header or variable name, a zero timeout or
/// concurrency, and `${VAR}` references to variables `env` lacks.
pub fn resolve(
    configs: &[McpServerConfig],
    env: &BTreeMap<String, String>,
) -> Result<Vec<ServerSpec>, ConfigErrors> {
    let mut errors = Vec::new();
    let mut specs = Vec::new();
    for (index, config) in configs.iter().enumerate() {
        let before = errors.len();
        let spec = resolve_one(index, config, env, &mut errors);
        if let Some(first) = configs[..index].iter().position(|other| other.name == config.name) {
            errors.push(ConfigError {
                key: format!("mcp_servers[{index}].name"),
                message: format!("'{}' is also the name of mcp_servers[{first}]", config.name),
            });
        }
        if errors.len() == before {
            specs.extend(spec);
        }
    }
    if errors.is_empty() { Ok(specs) } else { Err(ConfigErrors(errors)) }
}

fn resolve_one(
    index: usize,
    config: &McpServerConfig,
    env: &BTreeMap<String, String>,
    errors: &mut Vec<ConfigError>,
) -> Option<ServerSpec> {
    let key = |field: &str| format!("mcp_servers[{index}].{field}");
    let mut bad = |field: String, message: String| errors.push(ConfigError { key: field, message });
    if !valid_name_part(&config.name) || config.name.is_empty() || config.name.len() > 64 {
        bad(key("name"), "must be 1-64 of [a-zA-Z0-9_-]".to_owned());
    }
    let prefix = config.prefix.clone().unwrap_or_else(|| format!("{}__", config.name));
    if !valid_name_part(&prefix) || prefix.len() > MAX_PREFIX_LEN {
        bad(key("prefix"), format!("must be at most {MAX_PREFIX_LEN} of [a-zA-Z0-9_-]"));
    }
    if config.timeout_ms == 0 {
        bad(key("timeout_ms"), "must be at least 1".to_owned());
    }
    if config.max_response_bytes == 0 {
        bad(key("max_response_bytes"), "must be at least 1".to_owned());
    }
    if config.max_concurrent == 0 {
        bad(key("max_concurrent"), "must be at least 1".to_owned());
    }
    if let Some(tools) = &config.tools {
        for (position, tool) in tools.iter().enumerate() {
            if tool.is_empty() {
                bad(key(&format!("tools[{position}]")), "must not be empty".to_owned());
            }
        }
    }
    let transport = match (&config.command, &config.url) {
        (Some(_), Some(_)) => {
            bad(key("url"), "give either command (stdio) or url (streamable HTTP), not both".to_owned());
            None
        }
        (None, None) => {
            bad(key("command"), "give command (stdio) or url (streamable HTTP)".to_owned());
            None
        }
        (Some(command), None) => {
            if command.is_empty() {
                bad(key("command"), "must not be empty".to_owned());
            }
            for name in config.headers.keys() {
                bad(
                    key(&format!("headers.{name}")),
                    "headers are for url servers; this one has a command".to_owned(),
                );
            }
            let mut expanded = BTreeMap::new();
            for (name, value) in &config.env {
                let field = key(&format!("env.{name}"));
                if !toolhost_settings::is_variable_name(name) {
                    bad(field.clone(), "is not a variable name ([A-Za-z_][A-Za-z0-9_]*)".to_owned());
                }
                match expand(value.expose(), env) {
                    Ok(value) => {
                        expanded.insert(name.clone(), Secret(value));
                    }
                    Err(message) => bad(field, message),
                }
            }
            Some(Transport::Stdio {
                command: command.clone(),
                args: config.args.clone(),
                env: expanded,
                cwd: config.cwd.clone(),
            })
        }
        (None, Some(url)) => {
            for (field, present) in [
                ("args", !config.args.is_empty()),
                ("env", !config.env.is_empty()),
                ("cwd", config.cwd.is_some()),
            ] {
                if present {
                    bad(key(field), format!("{field} is for command servers; this one has a url"));
                }
            }
            match reqwest::Url::parse(url) {
                Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
                Ok(_) => bad(key("url"), "must be an http:// or https:// URL".to_owned()),
                Err(err) => bad(key("url"), format!("is not a URL: {err}")),
            }
            let mut expanded = BTreeMap::new();
            for (name, value) in &config.headers {
                let field = key(&format!("headers.{name}"));
                if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    bad(field.clone(), "is not an HTTP header name".to_owned());
                } else if RESERVED_HEADERS.iter().any(|reserved| reserved.eq_ignore_ascii_case(name)) {
                    bad(field.clone(), "is set by the MCP transport itself".to_owned());
                }
                match expand(value.expose(), env) {
                    Ok(value) if reqwest::header::HeaderValue::from_str(&value).is_err() => {
                        bad(field, "is not a valid header value once expanded".to_owned());
                    }
                    Ok(value) => {
                        expanded.insert(name.clone(), Secret(value));
                    }
                    Err(message) => bad(field, message),
                }
            }
            Some(Transport::Http { url: url.clone(), headers: expanded })
        }
    }?;
    let protocol = config.protocol.unwrap_or(match transport {
        Transport::Stdio { .. } => Protocol::Legacy,
        Transport::Http { .. } => Protocol::Auto,
    });
    Some(ServerSpec {
        protocol,
        name: config.name.clone(),
        transport,
        prefix,
        timeout: Duration::from_millis(config.timeout_ms),
        max_concurrent: config.max_concurrent,
        tools: config.tools.clone(),
        max_response_bytes: config.max_response_bytes,
    })
}

/// Expands the `${VAR}` references of `text` from `env`.
fn expand(text: &str, env: &BTreeMap<String, String>) -> Result<String, String> {
    toolhost_settings::expand_vars(text, |name| env.get(name).map(String::as_str))
        .map(|expanded| expanded.text)
        .map_err(|err| err.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<McpServerConfig> {
        #[derive(Deserialize)]
        struct File {
            mcp_servers: Vec<McpServerConfig>,
        }
        toml::from_str::<File>(text).unwrap().mcp_servers
    }

    fn env() -> BTreeMap<String, String> {
        [("TIME_TOKEN".to_owned(), "s3cret".to_owned())].into()
    }

    #[test]
    fn the_issue_example_parses_with_defaults_and_expands_variables() {
        let configs = parse(
            r#"
            [[mcp_servers]]
            name = "time"
            command = "uvx"
            args = ["mcp-server-time", "--local-timezone", "UTC"]
            env = { TZ = "UTC", TOKEN = "Bearer ${TIME_TOKEN}" }
            cwd = "/srv/tools"
            tools = ["get_current_time"]

            [[mcp_servers]]
            name = "remote"
            url = "http://127.0.0.1:8000/mcp"
            headers = { Authorization = "Bearer ${TIME_TOKEN}" }
            prefix = ""
            timeout_ms = 5000
            max_concurrent = 2
            "#,
        );
        let specs = resolve(&configs, &env()).unwrap();
        assert_eq!(specs[0].prefix, "time__");
        assert_eq!(specs[0].timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
        assert_eq!(specs[0].max_concurrent, DEFAULT_MAX_CONCURRENT);
        assert_eq!(specs[0].tools.as_deref(), Some(&["get_current_time".to_owned()][..]));
        let Transport::Stdio { env, cwd, .. } = &specs[0].transport else { panic!("stdio expected") };
        assert_eq!(env["TOKEN"].expose(), "Bearer s3cret");
        assert_eq!(cwd.as_deref(), Some(std::path::Path::new("/srv/tools")));
        assert_eq!(specs[1].prefix, "");
        let Transport::Http { headers, .. } = &specs[1].transport else { panic!("http expected") };
        assert_eq!(headers["Authorization"].expose(), "Bearer s3cret");
    }

    #[test]
    fn env_and_header_values_are_masked_in_debug_and_serialisation() {
        let configs = parse(
            r#"
            [[mcp_servers]]
            name = "remote"
            url = "http://127.0.0.1:8000/mcp"
            headers = { Authorization = "Bearer literal-secret" }
            "#,
        );
        let shown = format!("{configs:?} {}", serde_json::to_string(&configs).unwrap());
        assert!(!shown.contains("literal-secret"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
        let specs = resolve(&configs, &env()).unwrap();
        assert!(!format!("{specs:?}").contains("literal-secret"));
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let configs = parse(
            r#"
            [[mcp_servers]]
            name = "both"
            command = "x"
            url = "http://a/mcp"

            [[mcp_servers]]
            name = "bad name"
            prefix = "has.dot"
            timeout_ms = 0
            max_concurrent = 0
            max_response_bytes = 0

            [[mcp_servers]]
            name = "remote"
            url = "ftp://a/mcp"
            env = { A = "b" }
            headers = { Authorization = "Bearer ${MISSING}" }

            [[mcp_servers]]
            name = "both"
            command = "x"
            headers = { X = "y" }
            env = { "1A" = "b" }
            "#,
        );
        let text = resolve(&configs, &env()).unwrap_err().to_string();
        for expected in [
            "mcp_servers[0].url: give either command (stdio) or url (streamable HTTP), not both",
            "mcp_servers[1].name: must be 1-64 of [a-zA-Z0-9_-]",
            "mcp_servers[1].prefix: must be at most 32 of [a-zA-Z0-9_-]",
            "mcp_servers[1].timeout_ms: must be at least 1",
            "mcp_servers[1].max_concurrent: must be at least 1",
            "mcp_servers[1].max_response_bytes: must be at least 1",
            "mcp_servers[1].command: give command (stdio) or url (streamable HTTP)",
            "mcp_servers[2].url: must be an http:// or https:// URL",
            "mcp_servers[2].env: env is for command servers; this one has a url",
            "mcp_servers[2].headers.Authorization: the environment variable MISSING is not set",
            "mcp_servers[3].headers.X: headers are for url servers",
            "mcp_servers[3].env.1A: is not a variable name",
            "mcp_servers[3].name: 'both' is also the name of mcp_servers[0]",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err =
            toml::from_str::<McpServerConfig>("name = \"a\"\ncommand = \"x\"\ntimeout = 5\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `timeout`"), "{err}");
    }

    #[test]
    fn the_protocol_defaults_to_legacy_over_stdio_and_auto_over_http_and_takes_three_values() {
        let configs = parse(
            "[[mcp_servers]]\nname = \"s\"\ncommand = \"x\"\n\n[[mcp_servers]]\nname = \"h\"\nurl = \"http://h/mcp\"\n\n\
             [[mcp_servers]]\nname = \"m\"\ncommand = \"x\"\nprotocol = \"2026-07-28\"\n\n\
             [[mcp_servers]]\nname = \"l\"\nurl = \"http://l/mcp\"\nprotocol = \"legacy\"\n",
        );
        let protocols: Vec<Protocol> =
            resolve(&configs, &env()).unwrap().iter().map(|spec| spec.protocol).collect();
        assert_eq!(protocols, [Protocol::Legacy, Protocol::Auto, Protocol::Modern, Protocol::Legacy]);
        let err = toml::from_str::<McpServerConfig>("name = \"a\"\ncommand = \"x\"\nprotocol = \"2025\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("unknown variant `2025`"), "{err}");
    }

    #[test]
    fn expansion_leaves_plain_dollars_and_refuses_unclosed_references() {
        assert_eq!(expand("a$b ${TIME_TOKEN}!", &env()).unwrap(), "a$b s3cret!");
        assert_eq!(expand("${TIME_TOKEN", &env()).unwrap_err(), "a '${' is never closed");
    }
}
