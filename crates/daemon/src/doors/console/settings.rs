//! `[console]`: the web console's configuration section, owned by the door. The call log the
//! console reads (`record_calls`, `calls_max_len`) is written by every toolbox that sets it, so
//! it is read here by `serve` too.

use std::collections::HashMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use toolhost_settings::KeyError;

/// `[console]` as written in the configuration.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// The console's address, e.g. `127.0.0.1:8930`; empty: off.
    pub listen: String,
    /// The environment variable holding the console's bearer token; empty: no token, and the
    /// console binds only a loopback address.
    pub token_env: String,
    /// The tenant the console's calls are made for (and audited as); empty: none.
    pub tenant: String,
    /// Whether this toolbox writes its call log (`calls:<toolbox_id>`); unset: when `listen` is
    /// set.
    pub record_calls: Option<bool>,
    /// About how many entries the call log keeps.
    pub calls_max_len: u64,
    /// How long a call from the console's try-it form may run, at most, in milliseconds.
    pub call_timeout_ms: u64,
    /// A link to a call's trace in a trace viewer (Jaeger, Tempo), `{trace_id}` standing for
    /// the trace id; empty: the trace id is shown without a link.
    pub trace_url: String,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            listen: String::new(),
            token_env: String::new(),
            tenant: "console".to_owned(),
            record_calls: None,
            calls_max_len: 10_000,
            call_timeout_ms: 300_000,
            trace_url: String::new(),
        }
    }
}

impl Settings {
    /// The listen address, `None` when the console is off.
    pub(crate) fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen.trim().parse().ok()
    }

    /// Whether this toolbox writes its call log.
    pub(crate) fn records_calls(&self) -> bool {
        self.record_calls.unwrap_or_else(|| !self.listen.trim().is_empty()) && self.calls_max_len > 0
    }

    /// The tenant of the console's calls, if any.
    pub(crate) fn tenant(&self) -> Option<String> {
        Some(self.tenant.trim()).filter(|tenant| !tenant.is_empty()).map(str::to_owned)
    }

    /// Every bad key of the section; `vars` is the environment the token is read from.
    pub(crate) fn validate(&self, vars: &HashMap<String, String>) -> Vec<KeyError> {
        let mut errors = Vec::new();
        let mut bad = |key: &str, message: String| {
            errors.push(KeyError { key: format!("console.{key}"), message });
        };
        let listen = self.listen.trim();
        if listen.is_empty() {
            return errors;
        }
        let Some(addr) = self.listen_addr() else {
            bad("listen", format!("'{listen}' is not an address and port such as 127.0.0.1:8930"));
            return errors;
        };
        let token_env = self.token_env.trim();
        if token_env.is_empty() {
            if !addr.ip().is_loopback() {
                bad(
                    "listen",
                    format!(
                        "'{listen}' is not a loopback address: a console without a token (console.token_env) listens only on loopback"
                    ),
                );
            }
        } else {
            match vars.get(token_env) {
                None => bad("token_env", format!("the environment variable {token_env} is not set")),
                Some(token) if token.len() < 16 => bad(
                    "token_env",
                    format!("the token in {token_env} is too short: use at least 16 characters"),
                ),
                Some(_) => {}
            }
        }
        if self.call_timeout_ms == 0 {
            bad("call_timeout_ms", "must be at least 1".to_owned());
        }
        let trace_url = self.trace_url.trim();
        if !trace_url.is_empty()
            && (!(trace_url.starts_with("http://") || trace_url.starts_with("https://"))
                || !trace_url.contains("{trace_id}"))
        {
            bad(
                "trace_url",
                format!(
                    "'{trace_url}' must be an http:// or https:// URL holding {{trace_id}}, such as \
                     http://jaeger:16686/trace/{{trace_id}}"
                ),
            );
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect()
    }

    #[test]
    fn without_a_token_only_loopback_is_accepted() {
        let mut settings = Settings { listen: "0.0.0.0:8930".to_owned(), ..Settings::default() };
        let errors = settings.validate(&vars(&[]));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].key, "console.listen");
        assert!(errors[0].message.contains("loopback"), "{}", errors[0].message);
        settings.listen = "127.0.0.1:8930".to_owned();
        assert!(settings.validate(&vars(&[])).is_empty());
        settings.listen = "[::1]:0".to_owned();
        assert!(settings.validate(&vars(&[])).is_empty());
    }

    #[test]
    fn a_token_must_be_set_and_long_enough() {
        let settings = Settings {
            listen: "0.0.0.0:8930".to_owned(),
            token_env: "CONSOLE_TOKEN".to_owned(),
            ..Settings::default()
        };
        let missing = settings.validate(&vars(&[]));
        assert_eq!(missing[0].key, "console.token_env");
        assert!(missing[0].message.contains("CONSOLE_TOKEN is not set"), "{}", missing[0].message);
        let short = settings.validate(&vars(&[("CONSOLE_TOKEN", "short")]));
        assert!(short[0].message.contains("too short"), "{}", short[0].message);
        assert!(settings.validate(&vars(&[("CONSOLE_TOKEN", "0123456789abcdef")])).is_empty());
    }

    #[test]
    fn the_call_log_follows_listen_unless_set() {
        let mut settings = Settings::default();
        assert!(!settings.records_calls());
        settings.listen = "127.0.0.1:8930".to_owned();
        assert!(settings.records_calls());
        settings.record_calls = Some(false);
        assert!(!settings.records_calls());
        let settings = Settings { record_calls: Some(true), ..Settings::default() };
        assert!(settings.records_calls());
        let settings = Settings { record_calls: Some(true), calls_max_len: 0, ..Settings::default() };
        assert!(!settings.records_calls());
        assert!(
            Settings { listen: "nowhere".to_owned(), ..Settings::default() }.validate(&vars(&[]))[0]
                .message
                .contains("not an address")
        );
    }
}
