//! The MCP door over streamable HTTP: `/mcp` on `[mcp] listen`, its own port.
//!
//! rmcp's streamable HTTP service does the protocol: sessions by `Mcp-Session-Id` for the
//! `initialize` generations, 2026-07-28 requests served without one (each on a handler of its
//! own), the `Mcp-Method`/`Mcp-Name` headers checked against the body, JSON responses or SSE
//! streams, and the `Origin` and `Host` checks against DNS rebinding. This module adds what a
//! long-running daemon needs around it: the loopback origins allowed by default on a loopback
//! address, the body read here first (413 for one over `max_body_bytes`, after the excess is
//! drained so the client reads it; 400 with JSON-RPC's `-32700` for one that is not JSON), a cap
//! on open `initialize` sessions (503 past it), idle sessions closed, and a graceful stop.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Settings;
use super::handler::{Door, Session};

/// What the session cap needs.
#[derive(Clone)]
struct Cap {
    sessions: Arc<LocalSessionManager>,
    max: usize,
}

/// The bearer tokens the door accepts: its own, as SHA-256 digests (compared in constant time),
/// and, with `[mcp.oauth]`, an authorization server's JWTs; and where refusals are audited.
pub(crate) struct Tokens {
    /// `(digest, id, tenant)`.
    pub known: Vec<([u8; 32], String, String)>,
    /// The OAuth resource server, when `[mcp.oauth]` is set.
    pub oauth: Option<Arc<super::oauth::OAuth>>,
    /// The fleet's streams, for audit entries.
    pub bus: Arc<dyn toolhost_bus::FleetAccess>,
    /// Full key of the audit stream and about how many entries it keeps.
    pub audit_topic: String,
    pub audit_max_len: u64,
}

/// Who an HTTP request authenticated as, put in the request's extensions for the handler.
#[derive(Debug, Clone)]
pub(crate) struct Principal {
    /// The token's id.
    pub token_id: String,
    /// The tenant its calls are made for.
    pub tenant: String,
}

impl Tokens {
    /// The principal of `token`, if it is one of the door's tokens.
    fn principal(&self, token: &str) -> Option<Principal> {
        use sha2::Digest as _;
        use subtle::ConstantTimeEq as _;
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        // Every token is compared, so the time taken does not say which one matched.
        let mut found = None;
        for (known, id, tenant) in &self.known {
            if bool::from(known.ct_eq(&digest)) {
                found = Some(Principal { token_id: id.clone(), tenant: tenant.clone() });
            }
        }
        found
    }
}

/// Binds `[mcp] listen` and serves `/mcp` until `stop` is cancelled.
///
/// # Errors
/// The address cannot be bound.
pub(crate) async fn serve(
    door: Arc<Door>,
    settings: &Settings,
    tokens: Option<Tokens>,
    addr: SocketAddr,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(settings.session_idle());
    let sessions = Arc::new(sessions);
    let mut hosts = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned(), addr.to_string()];
    hosts.extend(settings.allowed_hosts.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_json_response(true)
        .with_allowed_hosts(hosts)
        .with_allowed_origins(allowed_origins(settings, addr))
        .enforce_origin_validation()
        .with_max_request_body_bytes(settings.max_body_bytes)
        .with_cancellation_token(stop.child_token());
    let service =
        StreamableHttpService::new(move || Ok(Session::new(door.clone())), sessions.clone(), config);
    let cap = Cap { sessions, max: settings.max_sessions };
    let mut router = Router::new()
        .route_service("/mcp", service)
        .layer(middleware::from_fn_with_state(cap, cap_sessions))
        .layer(middleware::from_fn_with_state(settings.max_body_bytes, check_body));
    // Checked before anything else, so no session is made for a request without a token.
    if let Some(tokens) = tokens {
        let oauth = tokens.oauth.clone();
        router = router.layer(middleware::from_fn_with_state(Arc::new(tokens), check_token));
        // The Protected Resource Metadata is public: at the well-known path, and at it followed
        // by the door's path (RFC 9728, section 3.1).
        if let Some(oauth) = oauth {
            let document = axum::Json(oauth.metadata());
            let serve = move || {
                let document = document.clone();
                async move { document }
            };
            router = router
                .route("/.well-known/oauth-protected-resource", axum::routing::get(serve.clone()))
                .route("/.well-known/oauth-protected-resource/mcp", axum::routing::get(serve));
        }
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|err| anyhow::anyhow!("cannot bind the MCP door to {addr} ([mcp] listen): {err}"))?;
    let bound = listener.local_addr().unwrap_or(addr);
    // An answer is written in pieces (an SSE priming event, then the message): without
    // TCP_NODELAY the second waits for the client's delayed ACK, about 40 ms.
    let listener = listener.tap_io(|stream| {
        if let Err(err) = stream.set_nodelay(true) {
            warn!(error = %err, "cannot set TCP_NODELAY on an MCP connection");
        }
    });
    info!(address = %bound, "MCP door listening at /mcp");
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, router).with_graceful_shutdown(stop.cancelled_owned()).await;
        if let Err(err) = served {
            warn!(error = %err, "the MCP door's HTTP server stopped");
        }
    }))
}

/// Lets through a request with one of the door's bearer tokens, or with `[mcp.oauth]` a JWT
/// valid for the door, naming its principal in the request's extensions; refuses any other
/// (401, or 403 for a missing scope, 503 when the issuer's keys cannot be read) with an audit
/// entry.
/// The refused request's body is read first ([`crate::doors::refusal`]), so the client can
/// reuse its connection.
async fn check_token(State(tokens): State<Arc<Tokens>>, mut request: Request, next: Next) -> Response {
    use super::oauth::Refusal;
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")))
        .map(str::trim);
    let refusal = match presented {
        None => Refusal::Missing,
        Some(token) => match (tokens.principal(token), &tokens.oauth) {
            (Some(principal), _) => {
                request.extensions_mut().insert(principal);
                return next.run(request).await;
            }
            (None, Some(oauth)) => match oauth.check(token).await {
                Ok(grant) => {
                    let principal =
                        Principal { token_id: format!("oauth:{}", grant.subject), tenant: grant.tenant };
                    request.extensions_mut().insert(principal);
                    return next.run(request).await;
                }
                Err(refusal) => refusal,
            },
            (None, None) => {
                Refusal::Invalid("the bearer token is not one of the MCP door's tokens".to_owned())
            }
        },
    };
    let reason = refusal.reason();
    let audit = crate::auth::AuditEntry {
        request_id: "-",
        tenant: "",
        principal: None,
        tool: "-",
        decision: "refused",
        reason: &reason,
        door: "mcp",
        source: None,
        arguments: None,
    };
    audit.write(&*tokens.bus, &tokens.audit_topic, tokens.audit_max_len, None).await;
    warn!(reason = %reason, "MCP request refused");
    let (status, code) = match refusal {
        Refusal::Scope(_) => (StatusCode::FORBIDDEN, -32001),
        Refusal::Keys(_) => (StatusCode::SERVICE_UNAVAILABLE, -32000),
        Refusal::Missing | Refusal::Invalid(_) => (StatusCode::UNAUTHORIZED, -32001),
    };
    let challenge =
        tokens.oauth.as_ref().map_or_else(|| "Bearer".to_owned(), |oauth| oauth.challenge(&refusal));
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": reason}});
    let mut response =
        (status, [(header::CONTENT_TYPE, "application/json")], Body::from(body.to_string())).into_response();
    if let Ok(value) = header::HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    crate::doors::refusal::refuse(request.into_body(), response).await
}

/// How much of a body over the limit is read and thrown away so that its client, still sending,
/// reads the 413; a client sending more is cut off.
const DRAIN_LIMIT: u64 = 64 * 1024 * 1024;

/// The `Origin` values allowed: `[mcp] allowed_origins`, or, when it is empty and the door
/// listens on a loopback address, the loopback origins on any port (a page served from the same
/// machine; a foreign origin is still refused, as the MCP specification asks).
fn allowed_origins(settings: &Settings, addr: SocketAddr) -> Vec<String> {
    if !settings.allowed_origins.is_empty() || !addr.ip().is_loopback() {
        return settings.allowed_origins.clone();
    }
    ["http", "https"]
        .iter()
        .flat_map(|scheme| {
            ["localhost", "127.0.0.1", "[::1]"].iter().map(move |host| format!("{scheme}://{host}:*"))
        })
        .collect()
}

/// Reads a POST's body before rmcp does: one over `max` is answered 413 (from its
/// `Content-Length` when it declares one, after reading and dropping what the client still
/// sends, up to [`DRAIN_LIMIT`]), and one that is not JSON 400 with JSON-RPC's parse error.
async fn check_body(State(max): State<usize>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > max as u64) {
        crate::doors::refusal::drain(body, DRAIN_LIMIT).await;
        return too_large(max);
    }
    let Ok(bytes) = axum::body::to_bytes(body, max).await else { return too_large(max) };
    // JSON of another shape (a batch, a method that is not a string) is rmcp's to refuse.
    let method = match serde_json::from_slice::<Message>(&bytes) {
        Ok(message) => message.method,
        Err(err) if err.classify() == serde_json::error::Category::Data => None,
        Err(err) => return parse_error(&err),
    };
    let mut parts = parts;
    if method.as_deref() == Some("initialize") {
        parts.extensions.insert(OpensSession);
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// The one field of a JSON-RPC message the door reads before rmcp: its method.
#[derive(serde::Deserialize)]
struct Message {
    method: Option<String>,
}

/// Marks a POST that opens an `initialize` session, the only kind `[mcp] max_sessions` counts.
#[derive(Clone, Copy)]
struct OpensSession;

/// 400 with JSON-RPC's parse error, for a body that is not JSON.
fn parse_error(err: &serde_json::Error) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32700, "message": format!("Parse error: the body is not JSON ({err})")},
    });
    (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "application/json")], Body::from(body.to_string()))
        .into_response()
}

/// 413, naming the limit; the connection closes after it.
fn too_large(max: usize) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32600, "message": format!("the request body is over the door's limit of {max} bytes ([mcp] max_body_bytes)")},
    });
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        [(header::CONTENT_TYPE, "application/json"), (header::CONNECTION, "close")],
        Body::from(body.to_string()),
    )
        .into_response()
}

/// Refuses a request that would open a session past `[mcp] max_sessions` (an `initialize`),
/// with 503 and a JSON-RPC error, so the client can retry later. A 2026-07-28 request opens no
/// session and is never refused here.
async fn cap_sessions(State(cap): State<Cap>, request: Request, next: Next) -> Response {
    let opens_session = request.extensions().get::<OpensSession>().is_some();
    if opens_session && cap.sessions.sessions.read().await.len() >= cap.max {
        let body = json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {"code": -32000, "message": format!("too many MCP sessions (the limit is {}); retry later", cap.max)},
        });
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "application/json"), (header::RETRY_AFTER, "1")],
            Body::from(body.to_string()),
        )
            .into_response();
    }
    let deletes = request.method() == Method::DELETE;
    let mut response = next.run(request).await;
    // A closed session answers 204, what clients check for (rmcp says 202 Accepted).
    if deletes && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_door_allows_the_loopback_origins_unless_told_otherwise() {
        let loopback: SocketAddr = "127.0.0.1:8931".parse().unwrap();
        let anywhere: SocketAddr = "0.0.0.0:8931".parse().unwrap();
        let origins = allowed_origins(&Settings::default(), loopback);
        for origin in ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*", "https://localhost:*"] {
            assert!(origins.iter().any(|allowed| allowed == origin), "{origin} in {origins:?}");
        }
        assert!(allowed_origins(&Settings::default(), anywhere).is_empty(), "no default off loopback");
        let listed =
            Settings { allowed_origins: vec!["https://app.example:443".to_owned()], ..Settings::default() };
        assert_eq!(allowed_origins(&listed, loopback), ["https://app.example:443"]);
    }
}
