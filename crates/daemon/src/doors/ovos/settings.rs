//! `[ovos]`: the OpenVoiceOS section, owned by the door. The OVOS tool source
//! (`crate::sources::ovos`) reads its own keys here too (`host_toolboxes`, `rediscover_ms`): one
//! bus, one section.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use toolhost_settings::KeyError;

use crate::ovos_bus::valid_toolbox_id;

/// `[ovos]` as written in the configuration.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// The messagebus, e.g. `ws://127.0.0.1:8181/core`; empty: off.
    pub url: String,
    /// Globs of the fleet tools the persona sees.
    pub tools: Vec<String>,
    /// The longest a bus call may run (bus calls carry no deadline of their own); a tool whose
    /// own timeout is shorter keeps it.
    pub call_timeout_ms: u64,
    /// Toolbox ids on the bus hosted as tools `ovos__<toolbox_id>__<tool>`; `"*"` for every
    /// toolbox but this one.
    pub host_toolboxes: Vec<String>,
    /// How often the hosted toolboxes are asked to discover again.
    pub rediscover_ms: u64,
    /// The largest websocket message (and frame) read from the bus; a larger one closes the
    /// connection, which is opened again.
    pub max_frame_bytes: usize,
    /// Bus calls waiting for their answers at once; a call past this is answered
    /// `RuntimeError: overloaded: …` at once.
    pub max_concurrent_calls: usize,
    /// Sent as the `tenant_id` of every request a bus call becomes; empty: none.
    pub tenant: String,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            url: String::new(),
            tools: vec!["*".to_owned()],
            call_timeout_ms: 30_000,
            host_toolboxes: Vec::new(),
            rediscover_ms: 30_000,
            max_frame_bytes: 4 * 1024 * 1024,
            max_concurrent_calls: 256,
            tenant: String::new(),
        }
    }
}

impl Settings {
    /// Whether the bus is configured.
    pub(crate) fn enabled(&self) -> bool {
        !self.url.trim().is_empty()
    }

    /// The longest a bus call may run.
    pub(crate) fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms)
    }

    /// The rediscovery period of the hosted toolboxes.
    pub(crate) fn rediscover(&self) -> Duration {
        Duration::from_millis(self.rediscover_ms)
    }

    /// The tenant sent with every request, if any.
    pub(crate) fn tenant(&self) -> Option<String> {
        Some(self.tenant.trim()).filter(|tenant| !tenant.is_empty()).map(str::to_owned)
    }

    /// Every bad key of the section.
    pub(crate) fn validate(&self, toolbox_id: &str) -> Vec<KeyError> {
        let mut errors = Vec::new();
        let mut bad = |key: &str, message: String| {
            errors.push(KeyError { key: format!("ovos.{key}"), message });
        };
        let url = self.url.trim();
        if !url.is_empty() {
            if url.starts_with("wss://") {
                bad(
                    "url",
                    format!(
                        "'{}': wss:// is not supported; reach the bus over ws:// on loopback or a private network",
                        toolhost_settings::mask_url(url)
                    ),
                );
            } else if url
                .parse::<tokio_tungstenite::tungstenite::http::Uri>()
                .map_or(true, |uri| uri.scheme_str() != Some("ws") || uri.host().is_none_or(str::is_empty))
            {
                bad(
                    "url",
                    format!(
                        "'{}' is not a ws:// URL such as ws://127.0.0.1:8181/core",
                        toolhost_settings::mask_url(url)
                    ),
                );
            }
        }
        for (index, pattern) in self.tools.iter().enumerate() {
            if let Err(err) = glob::Pattern::new(pattern) {
                bad(&format!("tools[{index}]"), format!("'{pattern}' is not a glob: {err}"));
            }
        }
        for (index, toolbox) in self.host_toolboxes.iter().enumerate() {
            if toolbox == "*" {
                continue;
            }
            if !valid_toolbox_id(toolbox) {
                bad(
                    &format!("host_toolboxes[{index}]"),
                    format!("'{toolbox}' is not a toolbox id (1 to 64 of a-z, A-Z, 0-9, '_', '-', '.')"),
                );
            } else if *toolbox == toolbox_id {
                bad(
                    &format!("host_toolboxes[{index}]"),
                    format!("'{toolbox}' is this toolbox's own id (daemon.toolbox_id): it is never hosted"),
                );
            }
        }
        if !self.host_toolboxes.is_empty() && !self.enabled() {
            bad("host_toolboxes", "needs ovos.url: the toolboxes are reached over the bus".to_owned());
        }
        if self.tenant.chars().any(char::is_control) || self.tenant.len() > 256 {
            bad("tenant", "must be at most 256 characters, none of them control characters".to_owned());
        }
        for (key, value) in [
            ("call_timeout_ms", self.call_timeout_ms),
            ("rediscover_ms", self.rediscover_ms),
            ("max_frame_bytes", self.max_frame_bytes as u64),
            ("max_concurrent_calls", self.max_concurrent_calls as u64),
        ] {
            if value == 0 {
                bad(key, "must be above 0".to_owned());
            }
        }
        if self.max_frame_bytes > 0 && self.max_frame_bytes < 1024 {
            bad("max_frame_bytes", "must be at least 1024".to_owned());
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(change: impl FnOnce(&mut Settings)) -> Vec<String> {
        let mut settings = Settings { url: "ws://127.0.0.1:8181/core".to_owned(), ..Settings::default() };
        change(&mut settings);
        settings
            .validate("toolhost")
            .into_iter()
            .map(|error| format!("{}: {}", error.key, error.message))
            .collect()
    }

    #[test]
    fn bad_keys_are_named_and_the_own_toolbox_cannot_be_hosted() {
        assert!(errors(|_| {}).is_empty());
        assert!(
            errors(|settings| settings.host_toolboxes = vec!["*".to_owned(), "weather.v2".to_owned()])
                .is_empty()
        );
        let found = errors(|settings| settings.url = "wss://bus.example/core".to_owned());
        assert!(
            found[0].starts_with("ovos.url: ") && found[0].contains("wss:// is not supported"),
            "{found:?}"
        );
        let found = errors(|settings| settings.url = "http://127.0.0.1:8181/core".to_owned());
        assert!(found[0].starts_with("ovos.url: "), "{found:?}");
        let found = errors(|settings| settings.max_frame_bytes = 10);
        assert!(found[0].starts_with("ovos.max_frame_bytes: "), "{found:?}");
        let found = errors(|settings| settings.call_timeout_ms = 0);
        assert!(found[0].starts_with("ovos.call_timeout_ms: "), "{found:?}");
        let found = errors(|settings| settings.host_toolboxes = vec!["toolhost".to_owned()]);
        assert!(found[0].contains("this toolbox's own id"), "{found:?}");
        let found = errors(|settings| settings.host_toolboxes = vec!["a b".to_owned()]);
        assert!(found[0].starts_with("ovos.host_toolboxes[0]: "), "{found:?}");
        let found = errors(|settings| {
            settings.url = String::new();
            settings.host_toolboxes = vec!["weather".to_owned()];
        });
        assert!(found[0].contains("needs ovos.url"), "{found:?}");
    }
}
