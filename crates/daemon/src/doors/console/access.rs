//! Who may use the console, and the headers every answer carries.
//!
//! - With a token (`[console] token_env`): every request needs it, as `Authorization: Bearer
//!   <token>` or as the login cookie. `GET /?token=<token>` sets the cookie and redirects to `/`,
//!   so the token leaves the address bar (as Jupyter does). The cookie holds a value derived from
//!   the token (HMAC-SHA256), never the token itself; it is `HttpOnly` and `SameSite=Strict`.
//! - Without one the console listens only on loopback (checked when the configuration is
//!   loaded), and it answers only requests whose `Host` is a loopback name, so a web page that
//!   rebinds its own name to 127.0.0.1 cannot reach it.
//! - Every `POST` needs the CSRF token the pages carry (`<meta name="csrf-token">`) in
//!   `X-CSRF-Token`; a cross-site form can send the cookie's credentials only where `SameSite`
//!   is not honoured, and never that header.
//! - Every answer has a `Content-Security-Policy` that allows only the console's own script and
//!   style (no inline script), and refuses framing.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::Console;

/// The login cookie's name.
pub(crate) const COOKIE: &str = "toolhost_console";

/// The header mutating requests carry the CSRF token in.
pub(crate) const CSRF_HEADER: &str = "x-csrf-token";

/// The policy of every answer.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; \
                   form-action 'self'";

/// The console's secrets, derived once at start.
pub(crate) struct Access {
    /// The token's SHA-256, when there is a token.
    token: Option<[u8; 32]>,
    /// What the login cookie holds.
    session: String,
    /// What `X-CSRF-Token` must hold.
    csrf: String,
}

impl Access {
    /// The access of a console with `token` (`None`: no token, loopback only).
    pub(crate) fn new(token: Option<&str>) -> Access {
        // Without a token the derived values come from a key of this process only.
        let key: Vec<u8> = match token {
            Some(token) => token.as_bytes().to_vec(),
            None => rand::random::<[u8; 32]>().to_vec(),
        };
        let derive = |purpose: &str| {
            let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap_or_else(|_| unreachable!());
            mac.update(purpose.as_bytes());
            mac.finalize().into_bytes().iter().map(|byte| format!("{byte:02x}")).collect::<String>()
        };
        Access {
            token: token.map(|token| <Sha256 as sha2::Digest>::digest(token.as_bytes()).into()),
            session: derive("toolhost console session"),
            csrf: derive("toolhost console csrf"),
        }
    }

    /// The CSRF token pages carry.
    pub(crate) fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Whether `presented` is the token.
    fn is_token(&self, presented: &str) -> bool {
        let Some(token) = &self.token else { return false };
        let digest: [u8; 32] = <Sha256 as sha2::Digest>::digest(presented.as_bytes()).into();
        bool::from(digest.ct_eq(token))
    }

    /// Whether the request carries the token or the login cookie.
    fn authenticated(&self, headers: &HeaderMap) -> bool {
        if self.token.is_none() {
            return true;
        }
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        if bearer.is_some_and(|token| self.is_token(token.trim())) {
            return true;
        }
        cookie(headers, COOKIE)
            .is_some_and(|value| bool::from(value.as_bytes().ct_eq(self.session.as_bytes())))
    }
}

/// The value of cookie `name`, if the request sent it.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Whether `host` (a `Host` header) names a loopback address.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The middleware in front of every route: the `?token=` login, the token, the `Host` of a
/// console without a token, the CSRF token of `POST`s, and the headers of every answer.
pub(crate) async fn check(State(console): State<Arc<Console>>, request: Request, next: Next) -> Response {
    let access = &console.access;
    let answered = if access.token.is_none()
        && !request.headers().get(header::HOST).and_then(|host| host.to_str().ok()).is_some_and(loopback_host)
    {
        Some(refuse(&request, StatusCode::FORBIDDEN, "this console answers only on a loopback host name"))
    } else if let Some(login) = login(access, &request) {
        Some(login)
    } else if !access.authenticated(request.headers()) {
        Some(refuse(
            &request,
            StatusCode::UNAUTHORIZED,
            "Unauthorized: open /?token=<token> or send Authorization: Bearer <token>",
        ))
    } else if request.method() != Method::GET
        && !request
            .headers()
            .get(CSRF_HEADER)
            .is_some_and(|value| bool::from(value.as_bytes().ct_eq(access.csrf.as_bytes())))
    {
        Some(refuse(&request, StatusCode::FORBIDDEN, "missing or wrong CSRF token"))
    } else {
        None
    };
    // A request answered here has its body read first, so its connection stays usable.
    let mut response = match answered {
        Some(response) => crate::doors::refusal::refuse(request.into_body(), response).await,
        None => next.run(request).await,
    };
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    response
}

/// `GET /?token=<token>`: the cookie and a redirect to `/` for the right token, 401 for a wrong
/// one; `None` for any other request.
fn login(access: &Access, request: &Request) -> Option<Response> {
    if request.uri().path() != "/" || request.method() != Method::GET {
        return None;
    }
    let presented = request
        .uri()
        .query()?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == "token")
        .map(|(_, value)| percent_decode(value))?;
    if !access.is_token(&presented) {
        return Some(refuse(request, StatusCode::UNAUTHORIZED, "Unauthorized: wrong token"));
    }
    let cookie = format!("{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict", access.session);
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    Some(response)
}

/// A refusal: JSON for the API, a small page for people.
fn refuse(request: &Request, status: StatusCode, message: &str) -> Response {
    if request.uri().path().starts_with("/api/") {
        return (status, axum::Json(json!({"error": message}))).into_response();
    }
    let body = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>toolhost console</title></head>\
         <body><h1>{}</h1><p>{}</p></body></html>",
        status.as_u16(),
        super::pages::escape(message)
    );
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// Decodes `%XX` escapes and `+` of a query value.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'%' if index + 2 < bytes.len() => {
                let digits = std::str::from_utf8(&bytes[index + 1..index + 3]).unwrap_or_default();
                match u8::from_str_radix(digits, 16) {
                    Ok(byte) => {
                        out.push(byte);
                        index += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        index += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                index += 1;
            }
            byte => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_checked_and_the_cookie_is_derived_from_it() {
        let access = Access::new(Some("0123456789abcdef"));
        assert!(access.is_token("0123456789abcdef"));
        assert!(!access.is_token("0123456789abcdeg"));
        assert!(!access.session.contains("0123456789abcdef"));
        let mut headers = HeaderMap::new();
        assert!(!access.authenticated(&headers));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer 0123456789abcdef"));
        assert!(access.authenticated(&headers));
        let mut headers = HeaderMap::new();
        let cookie = format!("other=1; {COOKIE}={}", access.session);
        headers.insert(header::COOKIE, HeaderValue::from_str(&cookie).unwrap());
        assert!(access.authenticated(&headers));
        headers.insert(header::COOKIE, HeaderValue::from_static("toolhost_console=forged"));
        assert!(!access.authenticated(&headers));
        assert_ne!(Access::new(Some("another token 123")).csrf, access.csrf);
    }

    #[test]
    fn only_loopback_host_names_pass_without_a_token() {
        for host in ["127.0.0.1:8930", "localhost:8930", "[::1]:8930", "localhost", "127.0.0.2"] {
            assert!(loopback_host(host), "{host}");
        }
        for host in ["evil.example:8930", "10.0.0.1:8930", "[2001:db8::1]:80", "localhost.evil.example"] {
            assert!(!loopback_host(host), "{host}");
        }
    }

    #[test]
    fn query_values_are_decoded() {
        assert_eq!(percent_decode("a%2Bb+c%zz%4"), "a+b c%zz%4");
    }
}
