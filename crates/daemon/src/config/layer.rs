//! Layering defaults, a file and the environment into a [`RawConfig`], naming every unknown key
//! and value of the wrong type instead of stopping at the first.

use std::collections::HashMap;
use std::path::Path;

use toolhost_settings::{ConfigError, KeyError};

use super::{
    DEFAULT_TOML, ENV_AGENT_NAME, ENV_CHAT_CONVERSATION_ID, ENV_PREFIX, ENV_REDIS_URL, ENV_TERMINAL,
    RawConfig,
};

/// How many bad keys one load reports at most before it gives up looking for more.
const MAX_KEY_ERRORS: usize = 64;
/// Terminal keys whose value is a comma-separated list.
const TERMINAL_LISTS: &[&str] =
    &["allowed_commands", "deny_commands", "redact_substrings", "redact_patterns"];

pub(super) fn single(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::single(key, message)
}

/// Layers defaults, the file (named by the flag or variable in `file.0`) and the environment;
/// returns the result with every key error repaired, and those errors.
pub(super) fn layer(
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
            .with_list_parse_key("streams.read_shards")
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
