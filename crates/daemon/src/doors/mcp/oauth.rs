//! The MCP door as an OAuth 2.1 resource server (`[mcp.oauth]`), as the MCP authorization
//! specification asks of an HTTP server:
//!
//! - Protected Resource Metadata (RFC 9728) at `/.well-known/oauth-protected-resource` (and at
//!   the same path followed by the resource's own path, `/mcp`), naming the authorization server;
//! - a request without a valid token is `401` with `WWW-Authenticate: Bearer
//!   resource_metadata="..."`, so a client finds where to get one;
//! - an access token is a JWT signed by one of the issuer's keys (its JWKS), for this door: `iss`
//!   is the issuer, `aud` holds the door's canonical URL (RFC 8707), `exp` and `nbf` hold within
//!   a bounded clock skew;
//! - the tenant whose `[[policy]]` the calls get is a claim of the token (`tenant_claim`), and a
//!   scope (`required_scope`) gates the door: a token without it is `403 insufficient_scope`.
//!
//! The JWKS is fetched when first needed and kept; a token naming a key the set does not have
//! makes the door fetch it again, as does a set older than `jwks_max_age_ms`, each at most once
//! per `jwks_refresh_min_ms` (so made-up key ids, or an issuer that is down, cannot make it
//! hammer the issuer); while a new read fails, the kept set serves on. A token that
//! passed is remembered (by its SHA-256) until it expires or the set changes, so a client's
//! next requests cost a hash and a lookup. The door never forwards a token: calls travel over
//! Redis as the door's own requests.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Value, json};

use super::settings::OAuthSettings;

/// The signature algorithms accepted: the asymmetric ones a JWKS publishes keys for. `HS*` (a
/// shared secret) and `none` never are.
const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// How many passed tokens are remembered; past it, the memory starts over.
const REMEMBERED_TOKENS: usize = 4096;

/// How long a JWKS fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Who a token says the caller is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Grant {
    /// `sub`, else `client_id`, else `-`: names the caller in logs and audit entries.
    pub subject: String,
    /// The tenant its calls are made for.
    pub tenant: String,
}

/// Why a request is refused, each with its HTTP answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refusal {
    /// No token: `401`, `WWW-Authenticate` names the metadata only.
    Missing,
    /// A token that is not valid for this door: `401 invalid_token`.
    Invalid(String),
    /// A valid token without the door's scope: `403 insufficient_scope`.
    Scope(String),
    /// The issuer's keys cannot be read: `503`.
    Keys(String),
}

impl Refusal {
    /// The sentence logged, audited and sent.
    pub(crate) fn reason(&self) -> String {
        match self {
            Refusal::Missing => "the request carries no bearer token".to_owned(),
            Refusal::Invalid(why) | Refusal::Scope(why) | Refusal::Keys(why) => why.clone(),
        }
    }
}

/// The keys of the issuer's JWKS, by key id.
struct Keys {
    by_kid: HashMap<String, DecodingKey>,
    /// A key without a `kid`, used for tokens that name none when it is the only key.
    only: Option<DecodingKey>,
    fetched_at: Instant,
}

/// The door's resource server.
pub(crate) struct OAuth {
    settings: OAuthSettings,
    /// The tenant when `tenant_claim` is empty: `[mcp] tenant`.
    default_tenant: String,
    /// The URL of the Protected Resource Metadata, in `WWW-Authenticate`.
    metadata_url: String,
    http: reqwest::Client,
    keys: RwLock<Option<Keys>>,
    /// When the JWKS was last fetched (or tried), so unknown key ids refetch it at most once per
    /// `jwks_refresh_min_ms`; held across the fetch, so concurrent requests wait for one fetch.
    fetching: tokio::sync::Mutex<Option<Instant>>,
    /// Tokens that passed, by SHA-256, with their grant and expiry (seconds since the epoch).
    passed: Mutex<HashMap<[u8; 32], (Grant, u64)>>,
}

impl OAuth {
    /// The resource server of `settings`; `default_tenant` is `[mcp] tenant`.
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub(crate) fn new(settings: &OAuthSettings, default_tenant: &str) -> anyhow::Result<OAuth> {
        let http = toolhost_tools::sources::http::client()
            .map_err(|err| anyhow::anyhow!("cannot build the HTTP client of [mcp.oauth]: {err}"))?;
        Ok(OAuth {
            metadata_url: metadata_url(&settings.resource),
            settings: settings.clone(),
            default_tenant: default_tenant.to_owned(),
            http,
            keys: RwLock::new(None),
            fetching: tokio::sync::Mutex::new(None),
            passed: Mutex::new(HashMap::new()),
        })
    }

    /// The Protected Resource Metadata document (RFC 9728).
    pub(crate) fn metadata(&self) -> Value {
        let mut document = json!({
            "resource": self.settings.resource,
            "authorization_servers": [self.settings.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": "toolhost MCP door",
        });
        if !self.settings.required_scope.is_empty() {
            document["scopes_supported"] = json!([self.settings.required_scope]);
        }
        document
    }

    /// The `WWW-Authenticate` value of a refusal.
    pub(crate) fn challenge(&self, refusal: &Refusal) -> String {
        let metadata = format!("resource_metadata=\"{}\"", self.metadata_url);
        let scope = if self.settings.required_scope.is_empty() {
            String::new()
        } else {
            format!(", scope=\"{}\"", self.settings.required_scope)
        };
        let quoted = |text: &str| text.replace(['"', '\\'], "'");
        match refusal {
            Refusal::Missing | Refusal::Keys(_) => format!("Bearer {metadata}{scope}"),
            Refusal::Invalid(why) => {
                format!("Bearer error=\"invalid_token\", error_description=\"{}\", {metadata}", quoted(why))
            }
            Refusal::Scope(why) => format!(
                "Bearer error=\"insufficient_scope\", error_description=\"{}\", {metadata}{scope}",
                quoted(why)
            ),
        }
    }

    /// Checks `token`: the grant it carries, or why it is refused.
    pub(crate) async fn check(&self, token: &str) -> Result<Grant, Refusal> {
        let digest = digest(token);
        let now = jsonwebtoken::get_current_timestamp();
        if let Some(grant) = self.remembered(&digest, now) {
            return Ok(grant);
        }
        let header = jsonwebtoken::decode_header(token)
            .map_err(|err| Refusal::Invalid(format!("the bearer token is not a JWT ({err})")))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(Refusal::Invalid(format!(
                "the token is signed with {:?}, which the door does not accept",
                header.alg
            )));
        }
        let kid = header.kid.clone();
        if self.stale() {
            // A set past jwks_max_age_ms is read again; while the issuer cannot be reached, the
            // kept one serves on.
            self.refresh().await?;
        }
        let key = match self.key(kid.as_deref()) {
            Some(key) => key,
            None => {
                self.refresh().await?;
                self.key(kid.as_deref()).ok_or_else(|| {
                    Refusal::Invalid(format!(
                        "the token names key '{}', which the issuer's JWKS does not have",
                        kid.as_deref().unwrap_or("(none)")
                    ))
                })?
            }
        };
        let claims = self.verify(token, header.alg, &key)?;
        let grant = self.grant(&claims)?;
        let expires = claims.get("exp").and_then(Value::as_u64).unwrap_or(now);
        self.remember(digest, &grant, expires);
        Ok(grant)
    }

    /// The claims of `token` once its signature, issuer, audience and times hold.
    fn verify(&self, token: &str, alg: Algorithm, key: &DecodingKey) -> Result<Value, Refusal> {
        let mut validation = Validation::new(alg);
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&[&self.settings.resource]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = self.settings.clock_skew_ms / 1000;
        jsonwebtoken::decode::<Value>(token, key, &validation).map(|data| data.claims).map_err(|err| {
            use jsonwebtoken::errors::ErrorKind;
            Refusal::Invalid(match err.kind() {
                ErrorKind::ExpiredSignature => "the token has expired".to_owned(),
                ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".to_owned(),
                ErrorKind::InvalidAudience => {
                    format!("the token is not for this door (its aud must hold {})", self.settings.resource)
                }
                ErrorKind::InvalidIssuer => {
                    format!("the token was not issued by {}", self.settings.issuer)
                }
                ErrorKind::InvalidSignature => "the token's signature does not verify".to_owned(),
                ErrorKind::MissingRequiredClaim(claim) => format!("the token has no '{claim}' claim"),
                _ => format!("the token is not valid: {err}"),
            })
        })
    }

    /// The grant of verified `claims`: the scope the door needs and the tenant.
    fn grant(&self, claims: &Value) -> Result<Grant, Refusal> {
        let required = &self.settings.required_scope;
        if !required.is_empty() && !scopes(claims).any(|scope| scope == required) {
            return Err(Refusal::Scope(format!("the token lacks the scope '{required}'")));
        }
        let subject = ["sub", "client_id"]
            .iter()
            .find_map(|claim| claims.get(*claim).and_then(Value::as_str))
            .unwrap_or("-")
            .to_owned();
        let claim = &self.settings.tenant_claim;
        let tenant = if claim.is_empty() {
            self.default_tenant.clone()
        } else {
            match claims.get(claim) {
                Some(Value::String(tenant)) if !tenant.is_empty() => tenant.clone(),
                _ => {
                    return Err(Refusal::Invalid(format!(
                        "the token names no tenant (its '{claim}' claim must be a non-empty string)"
                    )));
                }
            }
        };
        Ok(Grant { subject, tenant })
    }

    fn remembered(&self, digest: &[u8; 32], now: u64) -> Option<Grant> {
        let passed = self.passed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Within the skew, as the full check would.
        let skew = self.settings.clock_skew_ms / 1000;
        passed.get(digest).filter(|(_, expires)| now <= expires + skew).map(|(grant, _)| grant.clone())
    }

    fn remember(&self, digest: [u8; 32], grant: &Grant, expires: u64) {
        let mut passed = self.passed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if passed.len() >= REMEMBERED_TOKENS {
            passed.clear();
        }
        passed.insert(digest, (grant.clone(), expires));
    }

    /// The key for `kid` from the kept JWKS, if it has it.
    fn key(&self, kid: Option<&str>) -> Option<DecodingKey> {
        let keys = self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let keys = keys.as_ref()?;
        match kid {
            Some(kid) => keys.by_kid.get(kid).cloned(),
            None => keys.only.clone(),
        }
    }

    /// Whether no JWKS is kept, or the kept one is older than `jwks_max_age_ms`.
    fn stale(&self) -> bool {
        let max_age = Duration::from_millis(self.settings.jwks_max_age_ms);
        self.keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_none_or(|keys| keys.fetched_at.elapsed() > max_age)
    }

    /// Reads the JWKS again, unless it was tried less than `jwks_refresh_min_ms` ago. A failed
    /// read keeps the set already kept.
    ///
    /// # Errors
    /// No set is kept and none could be read.
    async fn refresh(&self) -> Result<(), Refusal> {
        let mut last = self.fetching.lock().await;
        let min = Duration::from_millis(self.settings.jwks_refresh_min_ms);
        let kept = || self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner).is_some();
        if last.is_some_and(|at| at.elapsed() < min) {
            return if kept() {
                Ok(())
            } else {
                Err(Refusal::Keys(format!(
                    "the issuer's keys at {} could not be read (tried again every {} ms)",
                    self.settings.jwks_url, self.settings.jwks_refresh_min_ms
                )))
            };
        }
        *last = Some(Instant::now());
        let set = match self.fetch().await {
            Ok(set) => set,
            Err(err) if kept() => {
                tracing::warn!(error = %err, "the issuer's JWKS could not be read again; the kept one serves on");
                return Ok(());
            }
            Err(err) => return Err(Refusal::Keys(err)),
        };
        let keys = keys_of(&set);
        tracing::info!(url = %self.settings.jwks_url, keys = keys.by_kid.len(), "the issuer's JWKS was read");
        *self.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(keys);
        // A key may have left the set: tokens passed with it are checked again.
        self.passed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
        Ok(())
    }

    async fn fetch(&self) -> Result<JwkSet, String> {
        let url = &self.settings.jwks_url;
        let failed = |err: String| format!("cannot read the issuer's keys at {url}: {err}");
        let response =
            self.http.get(url).timeout(FETCH_TIMEOUT).send().await.map_err(|err| failed(err.to_string()))?;
        if !response.status().is_success() {
            return Err(failed(format!("HTTP {}", response.status())));
        }
        let body = response.bytes().await.map_err(|err| failed(err.to_string()))?;
        serde_json::from_slice(&body).map_err(|err| failed(format!("not a JWKS ({err})")))
    }
}

/// The usable keys of `set`: those with a supported algorithm, by `kid`.
fn keys_of(set: &JwkSet) -> Keys {
    let mut by_kid = HashMap::new();
    let mut unnamed = Vec::new();
    for jwk in set.keys.iter().filter(|jwk| jwk.is_supported()) {
        let Ok(key) = DecodingKey::from_jwk(jwk) else { continue };
        match &jwk.common.key_id {
            Some(kid) => {
                by_kid.insert(kid.clone(), key);
            }
            None => unnamed.push(key),
        }
    }
    let only = (by_kid.is_empty() && unnamed.len() == 1).then(|| unnamed.remove(0));
    Keys { by_kid, only, fetched_at: Instant::now() }
}

/// The scopes of a token: `scope` (space-separated, RFC 8693 and RFC 9068) or `scp` (a list).
fn scopes(claims: &Value) -> impl Iterator<Item = &str> {
    let spaced = claims.get("scope").and_then(Value::as_str).into_iter().flat_map(str::split_whitespace);
    let listed = claims.get("scp").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
    spaced.chain(listed)
}

fn digest(token: &str) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// The Protected Resource Metadata URL of `resource` (RFC 9728, section 3.1): the well-known
/// path inserted between the host and the resource's path.
pub(crate) fn metadata_url(resource: &str) -> String {
    let (scheme, rest) = resource.split_once("://").unwrap_or(("https", resource));
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(authority, path)| (authority, path));
    let path = path.trim_end_matches('/');
    if path.is_empty() {
        format!("{scheme}://{authority}/.well-known/oauth-protected-resource")
    } else {
        format!("{scheme}://{authority}/.well-known/oauth-protected-resource/{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metadata_url_inserts_the_well_known_path_before_the_resources_path() {
        assert_eq!(
            metadata_url("https://tools.example.com/mcp"),
            "https://tools.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_url("http://127.0.0.1:8931"),
            "http://127.0.0.1:8931/.well-known/oauth-protected-resource"
        );
    }

    #[test]
    fn scopes_come_from_scope_or_scp() {
        let claims = json!({"scope": "a  tools:call b", "scp": ["c"]});
        assert_eq!(scopes(&claims).collect::<Vec<_>>(), ["a", "tools:call", "b", "c"]);
        assert_eq!(scopes(&json!({})).count(), 0);
    }

    fn oauth(tenant_claim: &str, required_scope: &str) -> OAuth {
        let settings = OAuthSettings {
            issuer: "https://as.example".to_owned(),
            jwks_url: "https://as.example/jwks".to_owned(),
            resource: "https://door.example/mcp".to_owned(),
            tenant_claim: tenant_claim.to_owned(),
            required_scope: required_scope.to_owned(),
            ..OAuthSettings::default()
        };
        OAuth::new(&settings, "fallback").unwrap()
    }

    #[test]
    fn the_grant_needs_the_scope_and_names_the_tenant_from_its_claim() {
        let door = oauth("org", "tools:call");
        let grant = door.grant(&json!({"sub": "u1", "org": "acme", "scope": "tools:call"})).unwrap();
        assert_eq!(grant, Grant { subject: "u1".to_owned(), tenant: "acme".to_owned() });
        assert!(matches!(door.grant(&json!({"sub": "u1", "org": "acme"})), Err(Refusal::Scope(_))));
        assert!(matches!(
            door.grant(&json!({"sub": "u1", "org": 5, "scope": "tools:call"})),
            Err(Refusal::Invalid(_))
        ));
        let open = oauth("", "");
        assert_eq!(open.grant(&json!({"client_id": "c"})).unwrap().tenant, "fallback");
    }

    #[tokio::test]
    async fn an_issuer_whose_keys_cannot_be_read_is_503_and_tried_again_only_after_a_while() {
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let settings = OAuthSettings {
            issuer: "https://as.example".to_owned(),
            jwks_url: format!("http://127.0.0.1:{port}/jwks"),
            resource: "https://door.example/mcp".to_owned(),
            ..OAuthSettings::default()
        };
        let door = OAuth::new(&settings, "").unwrap();
        let part = |value: Value| {
            use base64::Engine as _;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string())
        };
        let token =
            format!("{}.{}.c2ln", part(json!({"alg": "RS256", "kid": "k1"})), part(json!({"sub": "x"})));
        match door.check(&token).await {
            Err(Refusal::Keys(why)) => assert!(why.contains("cannot read the issuer's keys"), "{why}"),
            other => panic!("expected a 503 refusal, got {other:?}"),
        }
        let tried = *door.fetching.lock().await;
        match door.check(&token).await {
            Err(Refusal::Keys(why)) => assert!(why.contains("tried again every 10000 ms"), "{why}"),
            other => panic!("expected a 503 refusal, got {other:?}"),
        }
        assert_eq!(*door.fetching.lock().await, tried, "no second read within jwks_refresh_min_ms");
        let hs = format!("{}.{}.c2ln", part(json!({"alg": "HS256"})), part(json!({"sub": "x"})));
        assert!(matches!(door.check(&hs).await, Err(Refusal::Invalid(why)) if why.contains("HS256")));
    }

    #[test]
    fn challenges_name_the_metadata_and_the_error() {
        let door = oauth("", "tools:call");
        let url = "https://door.example/.well-known/oauth-protected-resource/mcp";
        assert_eq!(
            door.challenge(&Refusal::Missing),
            format!("Bearer resource_metadata=\"{url}\", scope=\"tools:call\"")
        );
        let invalid = door.challenge(&Refusal::Invalid("the \"token\" has expired".to_owned()));
        assert!(invalid.starts_with("Bearer error=\"invalid_token\""), "{invalid}");
        assert!(invalid.contains("'token'") && invalid.contains(url), "{invalid}");
        let scope = door.challenge(&Refusal::Scope("no".to_owned()));
        assert!(
            scope.contains("error=\"insufficient_scope\"") && scope.contains("scope=\"tools:call\""),
            "{scope}"
        );
        assert_eq!(door.metadata()["scopes_supported"], json!(["tools:call"]));
        assert_eq!(door.metadata()["authorization_servers"], json!(["https://as.example"]));
    }
}
