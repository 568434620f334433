//! `[auth]` and `[[policy]]` as written in the configuration, and their checks.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use toolhost_settings::KeyError;

/// The sections the caller-facing security owns: `[auth]` and `[[policy]]`. They are read apart
/// from the rest of the configuration, as the doors' sections are.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSections {
    /// `[auth]`.
    #[serde(default)]
    pub auth: AuthSettings,
    /// `[[policy]]`, one rule per tenant (`"*"`: the default rule).
    #[serde(default)]
    pub policy: Vec<PolicySettings>,
}

impl AuthSections {
    /// The top-level keys of the sections, as written in the configuration.
    pub const NAMES: &[&str] = &["auth", "policy"];
}

/// `[auth]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// Unsigned requests are refused.
    pub require_signature: bool,
    /// A signed request's envelope `time` must be this close to now; 0: not checked.
    pub max_skew_ms: u64,
    /// The keys that may sign requests; several at once, for rotation.
    pub keys: Vec<KeySettings>,
    /// The key (an id of `keys`) the daemon's own doors that are clients of the fleet (the MCP
    /// door) sign their requests with, for the tenant they authenticated; empty: unsigned.
    pub door_key: String,
    /// Rate-limit buckets in Redis, shared by the toolbox's replicas, instead of per replica.
    pub shared_limits: bool,
    /// Audit entries carry the call's arguments, redacted.
    pub audit_arguments: bool,
    /// About how many entries the audit stream keeps.
    pub audit_max_len: u64,
}

impl Default for AuthSettings {
    fn default() -> AuthSettings {
        AuthSettings {
            require_signature: false,
            max_skew_ms: 300_000,
            keys: Vec::new(),
            door_key: String::new(),
            shared_limits: false,
            audit_arguments: false,
            audit_max_len: 100_000,
        }
    }
}

/// `[[auth.keys]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeySettings {
    /// The key id signatures name.
    pub id: String,
    /// The environment variable holding the secret; the secret is never written in the file.
    pub secret_env: String,
    /// The only `tenant_id` values the key may sign for; absent: any.
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
}

/// `[[policy]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySettings {
    /// The envelope's `tenant_id` this rule is for; `"*"`: every tenant without a rule of its own.
    pub tenant: String,
    /// Globs of the tools the tenant may call (default: every tool).
    #[serde(default = "every_tool")]
    pub allow: Vec<String>,
    /// Globs of the tools the tenant may not call; deny wins over allow.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Calls a tenant may start, as `<n>/s`, `<n>/m` or `<n>/h`; absent: no rate limit.
    #[serde(default)]
    pub rate: Option<String>,
    /// Calls a tenant may start at once after being idle (default: one second's worth, at least 1).
    #[serde(default)]
    pub burst: Option<u32>,
    /// Calls of the tenant running at once on a replica; absent: no limit.
    #[serde(default)]
    pub max_in_flight: Option<u32>,
}

fn every_tool() -> Vec<String> {
    vec!["*".to_owned()]
}

/// A rate: tokens a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rate {
    pub per_second: f64,
    pub burst: f64,
}

/// Parses `50/s`, `600/m`, `1000/h` (a positive number, then the unit).
pub(crate) fn parse_rate(text: &str) -> Result<f64, String> {
    let (count, unit) =
        text.trim().split_once('/').ok_or_else(|| format!("'{text}' is not <number>/s, /m or /h"))?;
    let count: f64 = count.trim().parse().map_err(|_| format!("'{text}': '{count}' is not a number"))?;
    if !(count.is_finite() && count > 0.0) {
        return Err(format!("'{text}': the number must be positive"));
    }
    let seconds = match unit.trim() {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("'{text}': unit '{other}' is not s, m or h")),
    };
    Ok(count / seconds)
}

impl PolicySettings {
    /// The rule's rate and burst, when it has a rate.
    pub(crate) fn rate(&self) -> Option<Rate> {
        let per_second = parse_rate(self.rate.as_deref()?).ok()?;
        let burst = self.burst.map_or_else(|| per_second.ceil().max(1.0), f64::from);
        Some(Rate { per_second, burst })
    }
}

impl AuthSections {
    /// Every bad key of the sections; `vars` is the environment the secrets come from.
    pub(crate) fn validate(&self, vars: &HashMap<String, String>) -> Vec<KeyError> {
        let mut errors = Vec::new();
        let mut bad = |key: String, message: String| errors.push(KeyError { key, message });
        let auth = &self.auth;
        let mut ids = HashSet::new();
        for (index, key) in auth.keys.iter().enumerate() {
            let at = |field: &str| format!("auth.keys[{index}].{field}");
            if key.id.is_empty() || key.id.contains(':') || key.id.len() > 64 {
                bad(at("id"), "must be 1 to 64 characters without ':'".to_owned());
            } else if !ids.insert(key.id.as_str()) {
                bad(at("id"), format!("key id '{}' is given twice", key.id));
            }
            match vars.get(&key.secret_env) {
                _ if key.secret_env.is_empty() => {
                    bad(at("secret_env"), "names the environment variable holding the secret".to_owned());
                }
                None => bad(at("secret_env"), format!("the variable {} is not set", key.secret_env)),
                Some(secret) if secret.len() < 16 => bad(
                    at("secret_env"),
                    format!("the secret in {} is shorter than 16 bytes", key.secret_env),
                ),
                Some(_) => {}
            }
        }
        if auth.require_signature && auth.keys.is_empty() {
            bad(
                "auth.require_signature".to_owned(),
                "no key can sign: add an [[auth.keys]] entry".to_owned(),
            );
        }
        if !auth.door_key.is_empty() && !ids.contains(auth.door_key.as_str()) {
            bad(
                "auth.door_key".to_owned(),
                format!("'{}' is not the id of an [[auth.keys]] entry", auth.door_key),
            );
        }
        if auth.audit_max_len == 0 {
            bad("auth.audit_max_len".to_owned(), "must be greater than 0".to_owned());
        }
        let mut tenants = HashSet::new();
        for (index, rule) in self.policy.iter().enumerate() {
            let at = |field: &str| format!("policy[{index}].{field}");
            if rule.tenant.is_empty() {
                bad(at("tenant"), "names a tenant, or \"*\" for the default rule".to_owned());
            } else if !tenants.insert(rule.tenant.as_str()) {
                bad(at("tenant"), format!("tenant '{}' has two rules", rule.tenant));
            }
            for (field, globs) in [("allow", &rule.allow), ("deny", &rule.deny)] {
                for glob in globs {
                    if let Err(err) = glob::Pattern::new(glob) {
                        bad(at(field), format!("'{glob}' is not a glob: {err}"));
                    }
                }
            }
            if let Some(rate) = &rule.rate
                && let Err(message) = parse_rate(rate)
            {
                bad(at("rate"), message);
            }
            if rule.burst == Some(0) {
                bad(at("burst"), "must be greater than 0".to_owned());
            }
            if rule.burst.is_some() && rule.rate.is_none() {
                bad(at("burst"), "needs a rate".to_owned());
            }
            if rule.max_in_flight == Some(0) {
                bad(at("max_in_flight"), "must be greater than 0".to_owned());
            }
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_per_second_minute_and_hour() {
        assert_eq!(parse_rate("50/s"), Ok(50.0));
        assert_eq!(parse_rate(" 120 / m "), Ok(2.0));
        assert_eq!(parse_rate("3600/h"), Ok(1.0));
        for bad in ["50", "0/s", "-1/s", "x/s", "5/d", "inf/s"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        let rule = |rate: &str, burst| PolicySettings {
            tenant: "a".to_owned(),
            allow: every_tool(),
            deny: Vec::new(),
            rate: Some(rate.to_owned()),
            burst,
            max_in_flight: None,
        };
        assert_eq!(rule("50/s", None).rate(), Some(Rate { per_second: 50.0, burst: 50.0 }));
        assert_eq!(rule("1/m", None).rate().unwrap().burst, 1.0);
        assert_eq!(rule("10/s", Some(3)).rate().unwrap().burst, 3.0);
    }

    #[test]
    fn every_bad_key_is_named() {
        let sections: AuthSections = toml::from_str(
            r#"
            [auth]
            require_signature = true
            door_key = "nope"
            audit_max_len = 0
            [[auth.keys]]
            id = "a:b"
            secret_env = "UNSET"
            [[auth.keys]]
            id = "short"
            secret_env = "SHORT"
            [[policy]]
            tenant = "acme"
            allow = ["[x"]
            rate = "5/d"
            [[policy]]
            tenant = "acme"
            burst = 0
            max_in_flight = 0
            "#,
        )
        .unwrap();
        let vars = HashMap::from([("SHORT".to_owned(), "abc".to_owned())]);
        let keys: Vec<String> = sections.validate(&vars).into_iter().map(|err| err.key).collect();
        assert_eq!(
            keys,
            [
                "auth.keys[0].id",
                "auth.keys[0].secret_env",
                "auth.keys[1].secret_env",
                "auth.door_key",
                "auth.audit_max_len",
                "policy[0].allow",
                "policy[0].rate",
                "policy[1].tenant",
                "policy[1].burst",
                "policy[1].burst",
                "policy[1].max_in_flight",
            ]
        );
        let fine: AuthSections = toml::from_str(
            "[auth]\nrequire_signature = true\n[[auth.keys]]\nid = \"k\"\nsecret_env = \"S\"\n",
        )
        .unwrap();
        let vars = HashMap::from([("S".to_owned(), "0123456789abcdef".to_owned())]);
        assert!(fine.validate(&vars).is_empty());
    }
}
