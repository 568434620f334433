//! Who may call what: signed requests, tenant policy and rate limits, and the audit stream.
//!
//! The call lifecycle (`crate::call`) asks [`Gate`] at two points, the same for every door:
//!
//! - [`Gate::authenticate`], right after admission: the entry's `sig` against the keys, the
//!   envelope's `time` against the clock, the tenant against what the key may sign for. A
//!   refusal is answered `forbidden` by the door on a topic the payload does not choose.
//! - [`Gate::admit_call`], before a tool call reaches the ledger: the tenant's policy (allow and
//!   deny globs), its in-flight limit and its rate. A refusal is `forbidden` or `overloaded`
//!   with `retry_after_ms`.
//!
//! Every refusal, and every call of a tool annotated destructive, is written to the capped
//! stream `audit:<toolbox_id>` ([`Gate::audit`]). No refusal is final: nothing ran, so the request
//! id stays free for a correctly signed, allowed request.

pub(crate) mod policy;
pub(crate) mod settings;
pub(crate) mod sign;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost_bus::{Bus, Keys};
use toolhost_envelope::{ErrorCode, Sig};
use toolhost_tools::Failure;
use toolhost_tools::terminal::Redactor;
use tracing::warn;

use self::policy::{Counters, InFlight, Limited, Policies, Verdict};
pub use self::settings::AuthSections;
pub(crate) use self::sign::SigningKey;

/// The validated `[auth]` and `[[policy]]`, with the keys' secrets read from the environment.
pub struct Auth {
    require_signature: bool,
    max_skew: Option<Duration>,
    keys: HashMap<String, Key>,
    door_key: Option<SigningKey>,
    policies: Policies,
    shared_limits: bool,
    audit_arguments: bool,
    audit_max_len: u64,
    /// The keys' secrets, which the daemon redacts wherever it prints.
    secrets: Vec<String>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key ids only: never a secret.
        f.debug_struct("Auth")
            .field("require_signature", &self.require_signature)
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
            .field("policies", &self.policies)
            .finish_non_exhaustive()
    }
}

/// One key that may sign.
struct Key {
    key: SigningKey,
    tenants: Option<Vec<String>>,
}

/// What a door's request says about its caller, for [`Gate::authenticate`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Claim<'a> {
    /// The tenant the request claims (the envelope's `tenant_id`).
    pub tenant: Option<&'a str>,
    /// When the request says it was made (RFC 3339).
    pub time: Option<&'a str>,
}

/// Who a request comes from, once authenticated.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller<'a> {
    /// The tenant (`""` when the request names none).
    pub tenant: &'a str,
    /// The key that signed it.
    pub key_id: Option<&'a str>,
}

/// Why a request was refused before it ran.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    /// The answer's error.
    pub failure: Failure,
    /// The key the request named, when it named one.
    pub key_id: Option<String>,
}

impl Auth {
    /// The checked sections, with secrets from `vars` (a key whose variable is missing, which
    /// validation reports, is left out).
    pub(crate) fn new(sections: &AuthSections, vars: &HashMap<String, String>) -> Auth {
        let settings = &sections.auth;
        let mut keys = HashMap::new();
        let mut secrets = Vec::new();
        for key in &settings.keys {
            let Some(secret) = vars.get(&key.secret_env) else { continue };
            secrets.push(secret.clone());
            let signing = SigningKey::new(&key.id, secret.as_bytes());
            keys.insert(key.id.clone(), Key { key: signing, tenants: key.tenants.clone() });
        }
        let door_key = keys.get(&settings.door_key).map(|key| key.key.clone());
        Auth {
            require_signature: settings.require_signature,
            max_skew: (settings.max_skew_ms > 0).then(|| Duration::from_millis(settings.max_skew_ms)),
            keys,
            door_key,
            policies: Policies::new(&sections.policy),
            shared_limits: settings.shared_limits,
            audit_arguments: settings.audit_arguments,
            audit_max_len: settings.audit_max_len,
            secrets,
        }
    }

    /// The keys' secrets.
    pub(crate) fn secrets(&self) -> &[String] {
        &self.secrets
    }

    /// The configured key `id`, with its secret.
    pub(crate) fn key(&self, id: &str) -> Option<&SigningKey> {
        self.keys.get(id).map(|key| &key.key)
    }

    /// The key the daemon's fleet-client doors sign with, if any.
    pub(crate) fn door_key(&self) -> Option<&SigningKey> {
        self.door_key.as_ref()
    }

    /// Whether `tenant` may call `tool` by its policy (listings: `tools.discover`, MCP `tools/list`).
    pub(crate) fn allows(&self, tenant: &str, tool: &str) -> bool {
        self.policies.allows(tenant, tool)
    }

    /// About how many entries the audit stream keeps.
    pub(crate) fn audit_max_len(&self) -> u64 {
        self.audit_max_len
    }

    /// Whether listings need filtering at all.
    pub(crate) fn has_policy(&self) -> bool {
        !self.policies.is_open()
    }

    /// Checks an entry's signature, time and tenant; the key id that signed it, if it was signed.
    pub(crate) fn verify<'s>(
        &'s self,
        sig: &Sig,
        payload: &str,
        claim: Claim<'_>,
        now: Duration,
    ) -> Result<Option<&'s str>, Refusal> {
        let refuse = |message: String, key_id: Option<&str>| Refusal {
            failure: Failure::new(ErrorCode::Forbidden, message),
            key_id: key_id.map(str::to_owned),
        };
        let sig = match sig {
            Sig::Absent if self.require_signature => {
                return Err(refuse(
                    "unsigned request: this tool host requires signed requests".to_owned(),
                    None,
                ));
            }
            Sig::Absent => return Ok(None),
            Sig::Duplicated => return Err(refuse("the entry has more than one sig field".to_owned(), None)),
            Sig::One(sig) => sig,
        };
        let parsed = sign::parse(sig).map_err(|why| refuse(why.to_owned(), None))?;
        let Some((key_id, key)) = self.keys.get_key_value(parsed.key_id) else {
            return Err(refuse(format!("unknown key id '{}'", parsed.key_id), Some(parsed.key_id)));
        };
        if !key.key.verifies(payload.as_bytes(), &parsed.mac) {
            return Err(refuse("the signature does not match the payload".to_owned(), Some(key_id)));
        }
        if let Some(max_skew) = self.max_skew {
            let Some(time) = claim.time else {
                return Err(refuse(
                    "a signed request must carry the envelope's time".to_owned(),
                    Some(key_id),
                ));
            };
            let sent = chrono::DateTime::parse_from_rfc3339(time)
                .ok()
                .and_then(|at| u64::try_from(at.timestamp_millis()).ok())
                .map(Duration::from_millis)
                .ok_or_else(|| refuse(format!("time '{time}' is not an RFC 3339 time"), Some(key_id)))?;
            let skew = sent.abs_diff(now);
            if skew > max_skew {
                return Err(refuse(
                    format!(
                        "time '{time}' is {} ms from the tool host's clock, more than max_skew_ms {}",
                        skew.as_millis(),
                        max_skew.as_millis()
                    ),
                    Some(key_id),
                ));
            }
        }
        if let Some(tenants) = &key.tenants {
            let tenant = claim.tenant.unwrap_or_default();
            if !tenants.iter().any(|allowed| allowed == tenant) {
                return Err(refuse(
                    format!("key '{key_id}' may not sign for tenant '{tenant}'"),
                    Some(key_id),
                ));
            }
        }
        Ok(Some(key_id))
    }
}

/// [`Auth`] as in force, swapped whole when it changes: what the doors hold.
pub(crate) type AuthHandle = Arc<arc_swap::ArcSwap<Auth>>;

/// The lifecycle's view of [`Auth`]: the checks, the limits' state and the audit stream.
pub struct Gate {
    auth: AuthHandle,
    bus: Arc<dyn Bus>,
    keys: Keys,
    toolbox_id: String,
    /// Full key of `audit:<toolbox_id>`.
    audit_topic: String,
    counters: Arc<Counters>,
    redactor: Redactor,
}

/// One audit entry.
#[derive(Debug)]
pub(crate) struct AuditEntry<'a> {
    pub request_id: &'a str,
    pub tenant: &'a str,
    /// `key:<id>` or `token:<id>`; empty when the request named neither.
    pub principal: Option<String>,
    pub tool: &'a str,
    /// `refused` or `allowed`.
    pub decision: &'static str,
    pub reason: &'a str,
    /// The door the request came in by (`requests`, `chat`), and the envelope's `source`.
    pub door: &'a str,
    pub source: Option<&'a str>,
    pub arguments: Option<&'a Value>,
}

impl Gate {
    /// The gate of toolbox `toolbox_id`; `secrets` are hidden in audited arguments.
    pub(crate) fn new(
        auth: AuthHandle,
        bus: Arc<dyn Bus>,
        keys: Keys,
        toolbox_id: &str,
        secrets: &[String],
    ) -> Gate {
        let mut redactor = Redactor::new(&[], &[], &mut Vec::new());
        redactor.add_secrets(secrets);
        Gate {
            audit_topic: keys.audit(toolbox_id),
            auth,
            bus,
            keys,
            toolbox_id: toolbox_id.to_owned(),
            counters: Arc::new(Counters::default()),
            redactor,
        }
    }

    /// The configuration in force, for as long as the guard is held (never across an await).
    pub(crate) fn auth(&self) -> arc_swap::Guard<Arc<Auth>> {
        self.auth.load()
    }

    /// Checks an entry's signature; see [`Auth::verify`]. The id of the key that signed it.
    pub(crate) fn authenticate(
        &self,
        sig: &Sig,
        payload: Option<&str>,
        claim: Claim<'_>,
    ) -> Result<Option<String>, Refusal> {
        let auth = self.auth.load();
        let key_id = auth.verify(sig, payload.unwrap_or_default(), claim, crate::clock::now_since_epoch())?;
        Ok(key_id.map(str::to_owned))
    }

    /// Whether `caller` may call `tool` now: its policy, then its in-flight limit, then its rate.
    /// The in-flight count, when the tenant has a limit, is held until the returned guard drops.
    ///
    /// # Errors
    /// `forbidden` out of policy; `overloaded` with `retry_after_ms` over a limit.
    pub(crate) async fn admit_call(
        &self,
        caller: Caller<'_>,
        tool: &str,
    ) -> Result<Option<InFlight>, Failure> {
        let auth = self.auth.load_full();
        let rule = match auth.policies.rule(caller.tenant) {
            Verdict::Open => return Ok(None),
            Verdict::NoRule => {
                return Err(Failure::new(
                    ErrorCode::Forbidden,
                    format!("tenant '{}' has no policy and there is no default policy", caller.tenant),
                ));
            }
            Verdict::Rule(rule) => rule,
        };
        if let Some(why) = rule.refuses(tool) {
            return Err(Failure::new(ErrorCode::Forbidden, format!("'{tool}' is {why}")));
        }
        let in_flight = match rule.max_in_flight {
            Some(max) => {
                Some(self.counters.enter(caller.tenant, max).map_err(|why| self.limited(caller, why))?)
            }
            None => None,
        };
        if let Some(rate) = rule.rate {
            if auth.shared_limits {
                let key = self.keys.rate_bucket(&self.toolbox_id, caller.tenant);
                match self.bus.take_token(&key, rate.per_second, rate.burst).await {
                    Ok(None) => {}
                    Ok(Some(wait)) => return Err(self.limited(caller, Limited::Rate(wait))),
                    // The limit cannot be read: refuse rather than let a tenant past it.
                    Err(err) => {
                        return Err(Failure::new(
                            ErrorCode::Overloaded,
                            format!("the rate limit could not be checked: {err}"),
                        )
                        .with_details(json!({"retry_after_ms": 1000})));
                    }
                }
            } else {
                self.counters
                    .take(caller.tenant, rate, Instant::now())
                    .map_err(|why| self.limited(caller, why))?;
            }
        }
        Ok(in_flight)
    }

    fn limited(&self, caller: Caller<'_>, why: Limited) -> Failure {
        let (message, retry_after) = match why {
            Limited::InFlight(max) => (
                format!("tenant '{}' has {max} calls in flight, its limit; retry later", caller.tenant),
                Duration::from_millis(100),
            ),
            Limited::Rate(wait) => {
                (format!("tenant '{}' is over its rate limit; retry later", caller.tenant), wait)
            }
        };
        Failure::new(ErrorCode::Overloaded, message)
            .with_details(json!({"retry_after_ms": (retry_after.as_millis() as u64).max(1)}))
    }

    /// `value` redacted as the audit stream redacts arguments (the daemon's secrets, token
    /// shapes, members whose key names a secret), for span attributes.
    pub(crate) fn redact_json(&self, value: Value) -> Value {
        self.redactor.redact_json(value)
    }

    /// Appends an entry to the audit stream, with the call's arguments (redacted) when
    /// `[auth] audit_arguments` is on.
    pub(crate) async fn audit(&self, entry: AuditEntry<'_>) {
        let auth = self.auth.load_full();
        let arguments = match entry.arguments {
            Some(arguments) if auth.audit_arguments => {
                Some(self.redactor.redact_json(arguments.clone()).to_string())
            }
            _ => None,
        };
        entry.write(&*self.bus, &self.audit_topic, auth.audit_max_len, arguments.as_deref()).await;
    }
}

impl AuditEntry<'_> {
    /// Appends the entry to `topic` (about `max_len` entries kept), with `arguments` as given. A
    /// failed write is logged, never fatal: the decision stands either way.
    pub(crate) async fn write(
        &self,
        bus: &dyn toolhost_bus::Streams,
        topic: &str,
        max_len: u64,
        arguments: Option<&str>,
    ) {
        let time = toolhost_envelope::now_rfc3339();
        let principal = self.principal.as_deref().unwrap_or_default();
        let mut fields = vec![
            ("time", time.as_str()),
            ("request_id", self.request_id),
            ("tenant", self.tenant),
            ("principal", principal),
            ("tool", self.tool),
            ("decision", self.decision),
            ("reason", self.reason),
            ("door", self.door),
        ];
        if let Some(source) = self.source {
            fields.push(("source", source));
        }
        if let Some(arguments) = arguments {
            fields.push(("arguments", arguments));
        }
        if let Err(err) = bus.append(topic, &fields, Some(max_len)).await {
            warn!(error = %err, request_id = self.request_id, "cannot write an audit entry");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(toml: &str, vars: &[(&str, &str)]) -> Auth {
        let sections: AuthSections = toml::from_str(toml).unwrap();
        let vars: HashMap<String, String> =
            vars.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect();
        assert!(sections.validate(&vars).is_empty());
        Auth::new(&sections, &vars)
    }

    const SECRET: &str = "0123456789abcdef0123";

    fn signed() -> Auth {
        auth(
            r#"
            [auth]
            require_signature = true
            max_skew_ms = 1000
            [[auth.keys]]
            id = "old"
            secret_env = "OLD"
            [[auth.keys]]
            id = "acme-1"
            secret_env = "NEW"
            tenants = ["acme"]
            "#,
            &[("OLD", "another secret of 20b"), ("NEW", SECRET)],
        )
    }

    #[test]
    fn each_refusal_says_why_and_a_good_signature_passes() {
        let auth = signed();
        let payload = r#"{"type":"echo.requested"}"#;
        let sig =
            |payload: &str| Sig::One(SigningKey::new("acme-1", SECRET.as_bytes()).sign(payload.as_bytes()));
        let now = Duration::from_secs(1_700_000_000);
        let time = "2023-11-14T22:13:20Z"; // 1_700_000_000 s
        let claim = Claim { tenant: Some("acme"), time: Some(time) };
        let verify = |sig: &Sig, payload: &str, claim| auth.verify(sig, payload, claim, now);
        assert_eq!(verify(&sig(payload), payload, claim).unwrap(), Some("acme-1"));
        let refused =
            |sig: &Sig, payload: &str, claim| verify(sig, payload, claim).unwrap_err().failure.message;
        assert!(refused(&Sig::Absent, payload, claim).contains("unsigned"));
        assert!(refused(&Sig::Duplicated, payload, claim).contains("more than one sig"));
        // A payload changed after signing.
        assert!(refused(&sig(payload), r#"{"type":"echo.requested" }"#, claim).contains("does not match"));
        let forged = Sig::One(SigningKey::new("acme-1", b"guessed secret 0000").sign(payload.as_bytes()));
        assert!(refused(&forged, payload, claim).contains("does not match"));
        let unknown = Sig::One(SigningKey::new("nobody", SECRET.as_bytes()).sign(payload.as_bytes()));
        assert!(refused(&unknown, payload, claim).contains("unknown key id 'nobody'"));
        let truncated =
            Sig::One(SigningKey::new("acme-1", SECRET.as_bytes()).sign(payload.as_bytes())[..40].to_owned());
        assert!(refused(&truncated, payload, claim).contains("64 hex digits"));
        let stale = Claim { time: Some("2023-11-14T22:13:18Z"), ..claim };
        assert!(refused(&sig(payload), payload, stale).contains("2000 ms from the tool host's clock"));
        let ahead = Claim { time: Some("2023-11-14T22:13:22Z"), ..claim };
        assert!(refused(&sig(payload), payload, ahead).contains("more than max_skew_ms"));
        assert!(refused(&sig(payload), payload, Claim { time: None, ..claim }).contains("must carry"));
        assert!(
            refused(&sig(payload), payload, Claim { time: Some("yesterday"), ..claim }).contains("RFC 3339")
        );
        let other = Claim { tenant: Some("globex"), ..claim };
        assert!(refused(&sig(payload), payload, other).contains("may not sign for tenant 'globex'"));
        // The other key, during a rotation, signs for any tenant.
        let old = Sig::One(SigningKey::new("old", b"another secret of 20b").sign(payload.as_bytes()));
        assert_eq!(verify(&old, payload, other).unwrap(), Some("old"));
        // Every refusal is forbidden.
        let refusal = verify(&Sig::Absent, payload, claim).unwrap_err();
        assert_eq!(refusal.failure.code, ErrorCode::Forbidden);
    }

    #[test]
    fn without_require_signature_unsigned_requests_pass_and_signed_ones_are_still_checked() {
        let auth = auth("[[auth.keys]]\nid = \"k\"\nsecret_env = \"K\"\n", &[("K", SECRET)]);
        let now = crate::clock::now_since_epoch();
        assert_eq!(auth.verify(&Sig::Absent, "{}", Claim::default(), now).unwrap(), None);
        let bad = Sig::One(SigningKey::new("k", b"not the secret at all").sign(b"{}"));
        assert!(auth.verify(&bad, "{}", Claim::default(), now).is_err());
        assert!(format!("{auth:?}").contains("\"k\""));
        assert!(!format!("{auth:?}").contains(SECRET), "Debug never shows a secret");
        assert_eq!(auth.secrets(), [SECRET]);
    }
}
