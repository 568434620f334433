//! SIGHUP: the configuration loaded again, its tool settings applied live
//! ([`Sources::reload`]), the settings that need a restart named.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::{Config, ProcessEnv, RawConfig};
use crate::sources::Sources;
use crate::telemetry::Telemetry;

/// Reloads the configuration on every SIGHUP until `stopping` fires: the tool settings apply
/// live ([`Sources::reload`]); a configuration that does not load or build is refused whole,
/// logged with its keys and counted, and the old one keeps serving.
pub(crate) async fn reload_on_hangup(
    sources: Arc<Sources>,
    mut running: Config,
    config_path: Option<std::path::PathBuf>,
    synthetic_tools: usize,
    telemetry: Telemetry,
    stopping: CancellationToken,
) {
    let mut hangups = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(err) => {
            warn!(error = %err, "cannot listen for SIGHUP; the configuration cannot be reloaded");
            return;
        }
    };
    loop {
        tokio::select! {
            () = stopping.cancelled() => return,
            received = hangups.recv() => if received.is_none() { return },
        }
        info!(config = ?config_path, "SIGHUP: reloading the configuration");
        let loaded = Config::load(config_path.as_deref(), &ProcessEnv).map_err(anyhow::Error::from);
        let applied = match loaded {
            Ok(config) => sources.reload(config.sources(synthetic_tools)).await.map(|()| config),
            Err(err) => Err(err),
        };
        match applied {
            Ok(config) => {
                telemetry.reloaded(true);
                let needs_restart = restart_only_changes(&running.raw, &config.raw);
                if needs_restart.is_empty() {
                    info!("configuration reloaded");
                } else {
                    warn!(keys = %needs_restart.join(","), "configuration reloaded; these settings need a restart to apply");
                }
                running = config;
            }
            Err(err) => {
                telemetry.reloaded(false);
                error!(error = %format!("{err:#}"), "configuration reload refused; the old configuration keeps serving");
            }
        }
    }
}

/// The keys of the settings that changed between `old` and `new` but apply only after a
/// restart: everything but the tools (`[tools]`, `[[agents]]`, `[[commands]]`,
/// `[[http_tools]]`, `[[mcp_servers]]`) and `daemon.chat_conversation_id`.
fn restart_only_changes(old: &RawConfig, new: &RawConfig) -> Vec<String> {
    let flat = |raw: &RawConfig| -> BTreeMap<String, Value> {
        let mut value = serde_json::to_value(raw).unwrap_or(Value::Null);
        if let Value::Object(sections) = &mut value {
            for live in ["tools", "agents", "commands", "http_tools", "mcp_servers"] {
                sections.remove(live);
            }
            if let Some(Value::Object(daemon)) = sections.get_mut("daemon") {
                daemon.remove("chat_conversation_id");
            }
        }
        let mut flat = BTreeMap::new();
        if let Value::Object(sections) = value {
            for (section, keys) in sections {
                match keys {
                    Value::Object(keys) => {
                        for (key, value) in keys {
                            flat.insert(format!("{section}.{key}"), value);
                        }
                    }
                    other => {
                        flat.insert(section, other);
                    }
                }
            }
        }
        flat
    };
    let (old, new) = (flat(old), flat(new));
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    keys.into_iter().filter(|key| old.get(*key) != new.get(*key)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn raw(env: &[(&str, &str)]) -> RawConfig {
        let env: HashMap<String, String> =
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Config::load(None, &env).unwrap().raw
    }

    #[test]
    fn tool_settings_apply_live_and_the_others_need_a_restart() {
        let old = raw(&[]);
        let new = raw(&[
            ("TOOLHOST__TOOLS__DISABLED", "echo"),
            ("TERMINAL_ALLOWED_COMMANDS", "ls"),
            ("CHAT_TOOL_CONVERSATION_ID", "c-9"),
            ("REDIS_URL", "redis://127.0.0.1:7000"),
            ("TOOLHOST__DISPATCH__MAX_IN_FLIGHT", "8"),
        ]);
        assert_eq!(restart_only_changes(&old, &new), ["dispatch.max_in_flight", "redis.url"]);
        assert!(restart_only_changes(&old, &old).is_empty());
    }
}
