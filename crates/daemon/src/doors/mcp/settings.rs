//! `[mcp]`: the MCP door's configuration section, owned by the door.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use toolhost_settings::KeyError;

/// `[mcp]` as written in the configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Streamable HTTP at `/mcp` on this address; empty: off.
    pub listen: String,
    /// `Origin` values a browser may send (scheme, host and port; `:*` for any port). A request
    /// with any other `Origin` is refused; requests without one (programs) pass.
    pub allowed_origins: Vec<String>,
    /// `Host` values accepted besides the loopback names and the listen address.
    pub allowed_hosts: Vec<String>,
    /// Globs of the fleet tools the door exposes.
    pub tools: Vec<String>,
    /// The largest request body accepted.
    pub max_body_bytes: usize,
    /// `initialize` sessions open at once; a new one past this is refused (2026-07-28 opens none).
    pub max_sessions: usize,
    /// A session with no request for this long is closed.
    pub session_idle_ms: u64,
    /// A call of a tool whose timeout is above this becomes a durable task for clients that
    /// declare the tasks extension.
    pub task_threshold_ms: u64,
    /// How often the fleet's tools are read again; the `ttlMs` of 2026-07-28 `tools/list` pages.
    pub watch_ms: u64,
    /// Tools per `tools/list` page.
    pub page_size: usize,
    /// The tenant calls are made for when no token names one: every call of `toolhost mcp`
    /// over stdio, and HTTP calls when no `tokens` are configured. Empty: none.
    pub tenant: String,
    /// Bearer tokens of the HTTP door, one per client, each for a tenant; when any is given,
    /// every HTTP request must carry one of them.
    pub tokens: Vec<TokenSettings>,
    /// `[mcp.oauth]`: the HTTP door as an OAuth 2.1 resource server; absent: off.
    pub oauth: Option<OAuthSettings>,
}

/// `[mcp.oauth]`: JWT access tokens of an authorization server, checked against its JWKS.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OAuthSettings {
    /// The authorization server: the tokens' `iss`, and what the Protected Resource Metadata
    /// names.
    pub issuer: String,
    /// Where the issuer publishes its keys (its metadata's `jwks_uri`).
    pub jwks_url: String,
    /// The door's canonical URL (RFC 8707), e.g. `https://tools.example.com/mcp`: a token's
    /// `aud` must hold it.
    pub resource: String,
    /// The claim naming the tenant whose `[[policy]]` the calls get; empty: `[mcp] tenant`.
    pub tenant_claim: String,
    /// A scope every token must carry (in `scope` or `scp`); empty: none.
    pub required_scope: String,
    /// How far `exp` and `nbf` may be off, for clocks that disagree.
    pub clock_skew_ms: u64,
    /// The JWKS is fetched again for a token naming an unknown key at most this often.
    pub jwks_refresh_min_ms: u64,
    /// The JWKS is fetched again when it is older than this.
    pub jwks_max_age_ms: u64,
}

impl Default for OAuthSettings {
    fn default() -> OAuthSettings {
        OAuthSettings {
            issuer: String::new(),
            jwks_url: String::new(),
            resource: String::new(),
            tenant_claim: String::new(),
            required_scope: String::new(),
            clock_skew_ms: 60_000,
            jwks_refresh_min_ms: 10_000,
            jwks_max_age_ms: 3_600_000,
        }
    }
}

/// The longest clock skew accepted.
const MAX_CLOCK_SKEW_MS: u64 = 300_000;

/// `[[mcp.tokens]]`: a bearer token of the HTTP door.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSettings {
    /// The token's id, in logs and audit entries (never the token).
    pub id: String,
    /// The tenant its calls are made for.
    pub tenant: String,
    /// The environment variable holding the token.
    pub secret_env: String,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            listen: String::new(),
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            tools: vec!["*".to_owned()],
            max_body_bytes: 4 * 1024 * 1024,
            max_sessions: 256,
            session_idle_ms: 300_000,
            task_threshold_ms: 10_000,
            watch_ms: 1_000,
            page_size: 100,
            tenant: String::new(),
            tokens: Vec::new(),
            oauth: None,
        }
    }
}

impl Settings {
    /// The listen address, `None` when the HTTP door is off.
    pub(crate) fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen.trim().parse().ok()
    }

    /// The idle time after which a session closes.
    pub(crate) fn session_idle(&self) -> Duration {
        Duration::from_millis(self.session_idle_ms)
    }

    /// The task threshold.
    pub(crate) fn task_threshold(&self) -> Duration {
        Duration::from_millis(self.task_threshold_ms)
    }

    /// The fleet watch period.
    pub(crate) fn watch_period(&self) -> Duration {
        Duration::from_millis(self.watch_ms)
    }

    /// Every bad key of the section.
    pub(crate) fn validate(&self, vars: &HashMap<String, String>) -> Vec<KeyError> {
        let mut errors = Vec::new();
        let mut bad = |key: &str, message: String| {
            errors.push(KeyError { key: format!("mcp.{key}"), message });
        };
        if !self.listen.trim().is_empty() && self.listen_addr().is_none() {
            bad("listen", format!("'{}' is not an address and port such as 127.0.0.1:8931", self.listen));
        }
        for (index, origin) in self.allowed_origins.iter().enumerate() {
            if origin != "null" && !(origin.starts_with("http://") || origin.starts_with("https://")) {
                bad(
                    &format!("allowed_origins[{index}]"),
                    format!("'{origin}' must start with http:// or https:// (or be \"null\")"),
                );
            }
        }
        for (index, pattern) in self.tools.iter().enumerate() {
            if let Err(err) = glob::Pattern::new(pattern) {
                bad(&format!("tools[{index}]"), format!("'{pattern}' is not a glob: {err}"));
            }
        }
        let mut ids = std::collections::HashSet::new();
        for (index, token) in self.tokens.iter().enumerate() {
            let at = |field: &str| format!("tokens[{index}].{field}");
            if token.id.is_empty() || !ids.insert(token.id.as_str()) {
                bad(&at("id"), format!("'{}' must be a non-empty id no other token has", token.id));
            }
            if token.tenant.is_empty() {
                bad(&at("tenant"), "names the tenant the token's calls are made for".to_owned());
            }
            match vars.get(&token.secret_env) {
                None => bad(&at("secret_env"), format!("the variable '{}' is not set", token.secret_env)),
                Some(secret) if secret.len() < 16 => {
                    bad(
                        &at("secret_env"),
                        format!("the token in {} is shorter than 16 bytes", token.secret_env),
                    );
                }
                Some(_) => {}
            }
        }
        if let Some(oauth) = &self.oauth {
            for (key, url) in
                [("issuer", &oauth.issuer), ("jwks_url", &oauth.jwks_url), ("resource", &oauth.resource)]
            {
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    bad(&format!("oauth.{key}"), format!("'{url}' must be an http:// or https:// URL"));
                }
            }
            if oauth.resource.contains('#') {
                bad("oauth.resource", "a resource URL has no fragment (RFC 8707)".to_owned());
            }
            if oauth.clock_skew_ms > MAX_CLOCK_SKEW_MS {
                bad("oauth.clock_skew_ms", format!("must be at most {MAX_CLOCK_SKEW_MS}"));
            }
            if oauth.jwks_max_age_ms == 0 {
                bad("oauth.jwks_max_age_ms", "must be above 0".to_owned());
            }
        }
        for (key, value) in [
            ("max_body_bytes", self.max_body_bytes as u64),
            ("max_sessions", self.max_sessions as u64),
            ("session_idle_ms", self.session_idle_ms),
            ("watch_ms", self.watch_ms),
            ("page_size", self.page_size as u64),
        ] {
            if value == 0 {
                bad(key, "must be above 0".to_owned());
            }
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oauth_needs_urls_and_a_bounded_skew() {
        let settings: Settings = toml::from_str(
            "[oauth]\nissuer = \"as.example\"\njwks_url = \"https://as.example/jwks\"\n\
             resource = \"https://door.example/mcp#x\"\nclock_skew_ms = 600000\n",
        )
        .unwrap();
        let errors: Vec<String> =
            settings.validate(&HashMap::new()).into_iter().map(|error| error.key).collect();
        assert_eq!(errors, ["mcp.oauth.issuer", "mcp.oauth.resource", "mcp.oauth.clock_skew_ms"]);
        let good: Settings = toml::from_str(
            "[oauth]\nissuer = \"https://as.example\"\njwks_url = \"https://as.example/jwks\"\n\
             resource = \"https://door.example/mcp\"\n",
        )
        .unwrap();
        assert!(good.validate(&HashMap::new()).is_empty());
        let oauth = good.oauth.unwrap();
        assert_eq!((oauth.clock_skew_ms, oauth.jwks_refresh_min_ms), (60_000, 10_000));
        assert!(Settings::default().oauth.is_none(), "off by default");
    }
}
