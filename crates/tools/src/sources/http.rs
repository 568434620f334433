//! `[[http_tools]]`: an HTTP endpoint called with `reqwest`.
//!
//! - **URL.** `url` is a template whose placeholders may fill the path and the query, never the
//!   scheme, host or port (checked at load). A path placeholder is percent-encoded as one
//!   segment's worth of text (`/` becomes `%2F`, so a value cannot add segments), and a value
//!   that would make a segment `.` or `..` is refused; a path placeholder must be given. A query
//!   pair (`name={value}`) whose placeholder is absent is left out.
//! - **Arguments** not used by the URL go, for `POST`, `PUT` and `PATCH`, as the JSON object
//!   body (`{}` when none is left); for `GET` and `DELETE`, as query pairs after the template's
//!   (a scalar as its text, an array as one pair per item, an object as its JSON text).
//! - **Headers** are fixed at load (the daemon expands `${VAR}` from its environment before they
//!   get here); their values are marked sensitive and never logged.
//! - **Answers.** Redirects are not followed. A 2xx body with a JSON content type (or none) that
//!   parses is the result; any other 2xx body is a string result. Another status answers
//!   `tool_failed` with the status and a short excerpt of the body; a body past
//!   `max_response_bytes`, checked while it streams in, answers `tool_failed`; an `image/*` or
//!   `audio/*` body is an MCP image or audio block in the answer's `content`, its `result` a
//!   sentence naming it (docs/CONTRACTS.md, "Content blocks"); a connection
//!   error answers `tool_failed`; `timeout_ms` passing answers `timeout`. The daemon's secrets
//!   (its Redis password, the values of the header variables) are hidden in every answer.
//! - **TLS** is rustls with the ring provider and the Mozilla roots built into the binary
//!   ([`client`]), the same as Redis's `rediss://`; reqwest brings no provider of its own.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::template::{Template, scalar_text};
use super::{AnnotationSettings, FieldError, argument_schema, check_common};
use crate::terminal::redact::Redactor;
use crate::{Context, Output, Tool, ToolError, ToolSpec};

/// What a percent-encoded value keeps as is: RFC 3986's unreserved characters.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
/// Characters of a failure's body excerpt.
const EXCERPT_CHARS: usize = 200;
/// Bytes of a failure's body read for its excerpt.
const EXCERPT_BYTES: usize = 4096;
/// How long the registry waits past `timeout_ms` before it drops a call reqwest should have
/// ended itself.
const TIMEOUT_MARGIN: Duration = Duration::from_secs(1);

/// One `[[http_tools]]` table as configured.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpToolSettings {
    /// The tool name.
    pub name: String,
    /// What the tool does, for a model to read.
    pub description: String,
    /// `GET`, `POST` (default), `PUT`, `PATCH` or `DELETE`.
    #[serde(default = "default_method")]
    pub method: String,
    /// `http://` or `https://` URL, placeholders in the path and query only.
    pub url: String,
    /// Request headers; values may hold `${VAR}`, expanded from the daemon's environment at load.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
    /// JSON Schema of the arguments, inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argument_schema: Option<Value>,
    /// JSON Schema of the arguments, from a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argument_schema_file: Option<std::path::PathBuf>,
    /// JSON Schema of the result; unset: anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// How long one request may take, connecting included (default 10000).
    #[serde(default = "super::default_timeout_ms")]
    pub timeout_ms: u64,
    /// Most bytes of response body (default 1 MiB).
    #[serde(default = "super::default_max_bytes")]
    pub max_response_bytes: usize,
    /// Requests at once (unset: only `[dispatch] max_in_flight` limits it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<usize>,
    /// Behaviour hints.
    #[serde(default)]
    pub annotations: AnnotationSettings,
}

fn default_method() -> String {
    "POST".to_owned()
}

/// The HTTP client every HTTP tool shares: rustls with ring and the Mozilla roots, no redirects
/// followed, no proxy.
///
/// # Errors
/// The TLS configuration or the client cannot be built.
pub fn client() -> Result<reqwest::Client, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| err.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .user_agent(concat!("toolhost/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|err| err.to_string())
}

/// The URL template, split where placeholders may go.
#[derive(Debug, Clone)]
struct UrlTemplate {
    /// `scheme://authority`, literal.
    origin: String,
    /// The path's segments after the first `/`.
    segments: Vec<Template>,
    /// The query's `&`-separated pairs.
    query: Vec<Template>,
}

impl UrlTemplate {
    fn parse(url: &str) -> Result<UrlTemplate, String> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err("must be an absolute http:// or https:// URL".to_owned());
        };
        if !matches!(scheme, "http" | "https") {
            return Err(format!("scheme '{scheme}' is not http or https"));
        }
        if url.contains('#') {
            return Err("must not have a fragment (#...)".to_owned());
        }
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, rest) = rest.split_at(authority_end);
        if authority.is_empty() {
            return Err("names no host".to_owned());
        }
        if authority.contains(['{', '}']) {
            return Err("placeholders may fill the path and the query, never the host or port".to_owned());
        }
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let parse_all =
            |parts: Vec<&str>| parts.into_iter().map(Template::parse).collect::<Result<Vec<_>, _>>();
        let path = path.strip_prefix('/').unwrap_or(path);
        let segments = if path.is_empty() { Vec::new() } else { parse_all(path.split('/').collect())? };
        let query = parse_all(query.split('&').filter(|pair| !pair.is_empty()).collect())?;
        let template = UrlTemplate { origin: format!("{scheme}://{authority}"), segments, query };
        // With every placeholder filled, it must be a URL with a host.
        let sample = template.render(&Map::new(), Some("x"))?;
        if sample.host_str().is_none_or(str::is_empty) {
            return Err("names no host".to_owned());
        }
        Ok(template)
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().chain(&self.query).flat_map(Template::names)
    }

    /// The URL with `arguments` filled in (or, with `sample`, every placeholder set to it).
    fn render(&self, arguments: &Map<String, Value>, sample: Option<&str>) -> Result<Url, String> {
        let value = |name: &str| -> Result<Option<String>, String> {
            if let Some(sample) = sample {
                return Ok(Some(sample.to_owned()));
            }
            match arguments.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(value) => scalar_text(value)
                    .map(|text| Some(utf8_percent_encode(&text, COMPONENT).to_string()))
                    .ok_or_else(|| {
                        format!("argument '{name}' must be a string, number or boolean in the URL")
                    }),
            }
        };
        let mut url = self.origin.clone();
        for segment in &self.segments {
            let Some(text) = segment.render(value)? else {
                let name = segment.names().find(|name| arguments.get(*name).is_none_or(Value::is_null));
                return Err(format!("argument '{}' is needed for the URL", name.unwrap_or_default()));
            };
            if !segment.is_literal()
                && matches!(
                    text.to_ascii_lowercase().as_str(),
                    "." | ".." | "%2e" | "%2e%2e" | ".%2e" | "%2e."
                )
            {
                return Err("a path argument may not be '.' or '..'".to_owned());
            }
            url.push('/');
            url.push_str(&text);
        }
        let pairs: Vec<String> = self
            .query
            .iter()
            .map(|pair| pair.render(value))
            .filter_map(Result::transpose)
            .collect::<Result<_, _>>()?;
        if !pairs.is_empty() {
            url.push('?');
            url.push_str(&pairs.join("&"));
        }
        Url::parse(&url).map_err(|err| format!("the URL does not parse: {err}"))
    }
}

/// An HTTP tool, compiled from its settings.
#[derive(Debug, Clone)]
pub struct HttpTool {
    spec: ToolSpec,
    method: Method,
    url: UrlTemplate,
    /// Arguments the URL uses; the others go in the body or the query.
    in_url: HashSet<String>,
    headers: HeaderMap,
    timeout: Duration,
    max_response_bytes: usize,
    client: reqwest::Client,
    redactor: Redactor,
}

impl HttpTool {
    /// Checks and compiles `settings`, with `headers` its header values as expanded by the
    /// daemon. Calls go through `client` (see [`client`]); answers have `secrets` hidden.
    ///
    /// # Errors
    /// Every bad key, each named inside the table (`url`, `method`, `headers.<name>`, ...).
    pub fn new(
        settings: &HttpToolSettings,
        headers: &[(String, String)],
        client: reqwest::Client,
        secrets: &[String],
    ) -> Result<HttpTool, Vec<FieldError>> {
        let mut errors = Vec::new();
        check_common(
            &settings.name,
            &[
                ("timeout_ms", settings.timeout_ms),
                ("max_response_bytes", settings.max_response_bytes as u64),
            ],
            &mut errors,
        );
        if settings.max_concurrent == Some(0) {
            errors.push(FieldError::new("max_concurrent", "must be greater than 0"));
        }
        let method = match settings.method.to_ascii_uppercase().as_str() {
            "GET" => Some(Method::GET),
            "POST" => Some(Method::POST),
            "PUT" => Some(Method::PUT),
            "PATCH" => Some(Method::PATCH),
            "DELETE" => Some(Method::DELETE),
            _ => {
                errors.push(FieldError::new("method", "expected GET, POST, PUT, PATCH or DELETE"));
                None
            }
        };
        let url = UrlTemplate::parse(&settings.url)
            .map_err(|message| errors.push(FieldError::new("url", message)))
            .ok();
        let mut header_map = HeaderMap::new();
        for (name, value) in headers {
            let key = format!("headers.{name}");
            match (HeaderName::try_from(name.as_str()), HeaderValue::try_from(value.as_str())) {
                (Ok(name), Ok(mut value)) => {
                    value.set_sensitive(true);
                    header_map.insert(name, value);
                }
                (Err(_), _) => errors.push(FieldError::new(key, "not a valid header name")),
                // The message must not quote the value: it may hold an expanded secret.
                (_, Err(_)) => errors.push(FieldError::new(
                    key,
                    "the value (after ${VAR} expansion) is not a valid header value",
                )),
            }
        }
        let names: Vec<String> = url.iter().flat_map(UrlTemplate::names).map(str::to_owned).collect();
        let arguments = argument_schema(
            settings.argument_schema.as_ref(),
            settings.argument_schema_file.as_deref(),
            names.iter().map(String::as_str),
            &mut errors,
        );
        let (Some(method), Some(url), true) = (method, url, errors.is_empty()) else { return Err(errors) };
        let output_schema = settings.output_schema.clone().unwrap_or_else(|| json!({}));
        let mut spec = ToolSpec::new(&settings.name, &settings.description, arguments, output_schema);
        let timeout = Duration::from_millis(settings.timeout_ms);
        spec.timeout = timeout + TIMEOUT_MARGIN;
        spec.annotations = settings.annotations.resolve();
        spec.max_concurrent = settings.max_concurrent;
        Ok(HttpTool {
            spec,
            method,
            url,
            in_url: names.into_iter().collect(),
            headers: header_map,
            timeout,
            max_response_bytes: settings.max_response_bytes,
            client,
            redactor: Redactor::secrets_only(secrets),
        })
    }

    /// The request `arguments` make: the URL, and the JSON body when the method has one.
    ///
    /// # Errors
    /// A sentence for the caller (`invalid_arguments`).
    fn request(&self, arguments: &Map<String, Value>) -> Result<(Url, Option<Value>), String> {
        let mut url = self.url.render(arguments, None)?;
        let rest: Map<String, Value> = arguments
            .iter()
            .filter(|(name, value)| !self.in_url.contains(*name) && !value.is_null())
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        if matches!(self.method, Method::GET | Method::DELETE) {
            if !rest.is_empty() {
                let mut pairs = url.query_pairs_mut();
                for (name, value) in &rest {
                    let items = match value {
                        Value::Array(items) => items.iter().collect(),
                        value => vec![value],
                    };
                    for item in items {
                        pairs.append_pair(name, &scalar_text(item).unwrap_or_else(|| item.to_string()));
                    }
                }
            }
            return Ok((url, None));
        }
        Ok((url, Some(Value::Object(rest))))
    }

    /// Reads at most `limit` bytes of the body, and whether there was more (the rest is not
    /// read: the connection is dropped).
    async fn body(
        &self,
        mut response: reqwest::Response,
        limit: usize,
    ) -> Result<(Vec<u8>, bool), ToolError> {
        if response.content_length().is_some_and(|length| length > limit as u64) {
            return Ok((Vec::new(), true));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|err| self.transport_error(&err))? {
            if body.len() + chunk.len() > limit {
                body.extend_from_slice(&chunk[..limit - body.len()]);
                return Ok((body, true));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body, false))
    }

    /// `timeout` for a request that ran out of time, `tool_failed` for any other failure; the
    /// message names no URL (the URL is the operator's, and may carry what it should not show).
    fn transport_error(&self, err: &reqwest::Error) -> ToolError {
        if err.is_timeout() {
            return ToolError::Timeout(format!(
                "the HTTP request did not finish within {} ms",
                self.timeout.as_millis()
            ));
        }
        let mut message = String::from("the HTTP request failed");
        let mut source: Option<&dyn std::error::Error> = std::error::Error::source(err);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        ToolError::Failed(self.redactor.redact(&message))
    }
}

/// Whether a `Content-Type` says JSON: `application/json` or any `+json` type.
/// The MCP block type of a body of `content_type`: `image` for `image/*`, `audio` for `audio/*`.
fn media_block_type(content_type: &str) -> Option<&'static str> {
    let media = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    if media.starts_with("image/") {
        Some("image")
    } else if media.starts_with("audio/") {
        Some("audio")
    } else {
        None
    }
}

/// An image or audio body: one block of it (base64, its media type), and a sentence saying so
/// as the result, for a reader of text. Such a body is never redacted: it is not text.
fn media_output(kind: &str, content_type: &str, body: &[u8]) -> Output {
    let mime = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let block = json!({"type": kind, "data": base64::engine::general_purpose::STANDARD.encode(body), "mimeType": mime});
    Output {
        result: Value::String(format!("an {kind} ({mime}, {} bytes), in the answer's content", body.len())),
        content: Some(vec![block]),
    }
}

fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

/// A short, single-line excerpt of a body.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line,
    }
}

#[async_trait]
impl Tool for HttpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn remote(&self) -> Option<crate::Remote> {
        // Never the credentials a URL may hold before its host.
        let authority = self.url.origin.split_once("://").map_or(self.url.origin.as_str(), |(_, rest)| rest);
        let host = authority.rsplit('@').next().unwrap_or(authority);
        Some(crate::Remote {
            system: "http",
            target: host.to_owned(),
            name: self.spec.name.clone(),
            transport: "tcp",
        })
    }

    async fn call(&self, arguments: Value, context: &Context) -> Result<Value, ToolError> {
        self.call_output(arguments, context).await.map(|output| output.result)
    }

    async fn call_output(&self, arguments: Value, context: &Context) -> Result<Output, ToolError> {
        let empty = Map::new();
        let (url, body) =
            self.request(arguments.as_object().unwrap_or(&empty)).map_err(ToolError::InvalidArguments)?;
        let mut headers = self.headers.clone();
        // The call's trace context replaces any the operator configured: it is this call's.
        if let Some((traceparent, tracestate)) = context.trace_headers() {
            if let Ok(value) = HeaderValue::from_str(&traceparent) {
                headers.insert(HeaderName::from_static("traceparent"), value);
            }
            match tracestate.map(HeaderValue::from_str) {
                Some(Ok(value)) => {
                    headers.insert(HeaderName::from_static("tracestate"), value);
                }
                _ => {
                    headers.remove("tracestate");
                }
            }
        }
        let mut request =
            self.client.request(self.method.clone(), url).headers(headers).timeout(self.timeout);
        if let Some(body) = body {
            request = request.header(CONTENT_TYPE, "application/json").body(body.to_string());
        }
        let response = request.send().await.map_err(|err| self.transport_error(&err))?;
        let status = response.status();
        let content_type =
            response.headers().get(CONTENT_TYPE).and_then(|value| value.to_str().ok()).map(str::to_owned);
        if !status.is_success() {
            // The excerpt needs only the start of the body, however long it is.
            let (body, _) = self.body(response, EXCERPT_BYTES.min(self.max_response_bytes)).await?;
            let excerpt = self.redactor.redact(&excerpt(&body));
            let status = status.to_string();
            return Err(ToolError::Failed(if excerpt.is_empty() {
                format!("the service answered HTTP {status}")
            } else {
                format!("the service answered HTTP {status}: {excerpt}")
            }));
        }
        let (body, more) = self.body(response, self.max_response_bytes).await?;
        if more {
            return Err(ToolError::Failed(format!(
                "the response body is larger than max_response_bytes ({})",
                self.max_response_bytes
            )));
        }
        if let Some(kind) = content_type.as_deref().and_then(media_block_type) {
            return Ok(media_output(kind, content_type.as_deref().unwrap_or_default(), &body));
        }
        let parsed = match content_type.as_deref() {
            Some(kind) if is_json(kind) => Some(serde_json::from_slice::<Value>(&body).map_err(|err| {
                ToolError::Failed(format!("the service answered {kind} that is not JSON: {err}"))
            })?),
            None => serde_json::from_slice::<Value>(&body).ok(),
            Some(_) => None,
        };
        Ok(Output::from(match parsed {
            Some(value) => self.redactor.redact_json(value),
            None => Value::String(self.redactor.redact(&String::from_utf8_lossy(&body))),
        }))
    }
}

#[cfg(test)]
// A failed unwrap is a test failure with a clear message; that is what tests want.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn settings(method: &str, url: &str, schema: Value) -> HttpToolSettings {
        serde_json::from_value(
            json!({"name": "t", "description": "d", "method": method, "url": url, "argument_schema": schema}),
        )
        .unwrap()
    }

    fn tool(method: &str, url: &str, schema: Value) -> HttpTool {
        HttpTool::new(&settings(method, url, schema), &[], client().unwrap(), &[]).unwrap()
    }

    fn request(tool: &HttpTool, arguments: Value) -> Result<(String, Option<Value>), String> {
        tool.request(arguments.as_object().unwrap()).map(|(url, body)| (url.to_string(), body))
    }

    fn schema(names: &[&str]) -> Value {
        let properties: Map<String, Value> =
            names.iter().map(|name| ((*name).to_owned(), json!({}))).collect();
        json!({"type": "object", "properties": properties})
    }

    #[test]
    fn placeholders_fill_the_path_and_query_percent_encoded() {
        let tool = tool(
            "POST",
            "https://orders.internal:8443/api/orders/{id}/lines?lang={lang}&fixed=1",
            schema(&["id", "lang", "note"]),
        );
        let (url, body) = request(&tool, json!({"id": "a/b c?#é", "lang": "en&x=1", "note": "n"})).unwrap();
        assert_eq!(
            url,
            "https://orders.internal:8443/api/orders/a%2Fb%20c%3F%23%C3%A9/lines?lang=en%26x%3D1&fixed=1"
        );
        assert_eq!(body, Some(json!({"note": "n"})));
        // An absent query argument drops its pair; an absent path argument is refused.
        assert_eq!(
            request(&tool, json!({"id": 7})).unwrap(),
            ("https://orders.internal:8443/api/orders/7/lines?fixed=1".to_owned(), Some(json!({})))
        );
        assert!(request(&tool, json!({"lang": "en"})).unwrap_err().contains("'id' is needed"));
        for dots in ["..", "."] {
            let err = request(&tool, json!({"id": dots})).unwrap_err();
            assert!(err.contains("'.' or '..'"), "{dots}: {err}");
        }
        // Escapes in a value are text, not dots.
        assert!(request(&tool, json!({"id": "%2e%2e"})).unwrap().0.contains("/orders/%252e%252e/lines"));
        assert!(request(&tool, json!({"id": ["x"]})).unwrap_err().contains("must be a string"));
    }

    #[test]
    fn get_sends_the_other_arguments_as_the_query() {
        let tool = tool("GET", "http://127.0.0.1:9/search/{kind}", schema(&["kind", "q", "tags", "filter"]));
        let (url, body) = request(
            &tool,
            json!({"kind": "books", "q": "a b&c", "tags": ["x", 2], "filter": {"y": 1}, "gone": null}),
        )
        .unwrap();
        assert_eq!(url, "http://127.0.0.1:9/search/books?filter=%7B%22y%22%3A1%7D&q=a+b%26c&tags=x&tags=2");
        assert_eq!(body, None);
    }

    #[test]
    fn the_host_is_never_a_placeholder_and_bad_settings_name_their_keys() {
        for (url, message) in [
            ("http://{host}/x", "never the host"),
            ("http://example.com:{port}/x", "never the host"),
            ("ftp://example.com/x", "not http or https"),
            ("example.com/x", "absolute"),
            ("http://example.com/x#{frag}", "fragment"),
            ("http:///x", "names no host"),
            ("http://example.com/{x", "never closed"),
        ] {
            let errors = HttpTool::new(
                &settings("GET", url, schema(&["host", "port", "frag", "x"])),
                &[],
                client().unwrap(),
                &[],
            )
            .unwrap_err();
            assert_eq!(errors[0].field, "url", "{url}");
            assert!(errors[0].message.contains(message), "{url}: {errors:?}");
        }
        let headers = [
            ("Bad Name".to_owned(), "v".to_owned()),
            ("X-Token".to_owned(), "line\nbreak-s3cret".to_owned()),
        ];
        let errors = HttpTool::new(
            &settings("TRACE", "http://example.com/{missing}", schema(&[])),
            &headers,
            client().unwrap(),
            &[],
        )
        .unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|error| error.field.as_str()).collect();
        assert_eq!(
            fields,
            ["method", "headers.Bad Name", "headers.X-Token", "argument_schema"],
            "{errors:?}"
        );
        assert!(errors.iter().all(|error| !error.message.contains("s3cret")), "{errors:?}");
    }

    #[tokio::test]
    async fn tls_runs_on_ring_and_a_bad_handshake_is_tool_failed() {
        // A server that answers a TLS client hello with plain text: the handshake starts (which
        // panics when rustls has no provider) and fails.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            while let Ok((mut stream, _)) = listener.accept().await {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\n\r\nnot tls").await;
            }
        });
        let tool = tool("GET", &format!("https://127.0.0.1:{port}/x"), schema(&[]));
        let err = tool.call(json!({}), &Context::default()).await.unwrap_err();
        let ToolError::Failed(message) = err else { panic!("{err:?}") };
        // rustls read the reply as a TLS record and found it corrupt.
        assert!(
            message.starts_with("the HTTP request failed: ") && message.contains("corrupt message"),
            "{message}"
        );
        assert!(!message.contains("127.0.0.1"), "{message}");
    }

    #[tokio::test]
    async fn the_calls_trace_context_goes_out_as_headers_replacing_the_operators() {
        // A one-shot server that answers with the request's head as text.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = stream.read(&mut buf).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                let body = String::from_utf8_lossy(&head).to_lowercase();
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
            }
        });
        let headers = [(
            "traceparent".to_owned(),
            "00-11111111111111111111111111111111-1111111111111111-01".to_owned(),
        )];
        let tool = HttpTool::new(
            &settings("GET", &format!("http://127.0.0.1:{port}/x"), schema(&[])),
            &headers,
            client().unwrap(),
            &[],
        )
        .unwrap();
        let trace = toolhost_envelope::CallTrace::of(
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("vendor=x"),
            None,
            toolhost_envelope::CallTrace::parent_only,
        );
        let context = Context { trace: Some(trace.clone()), ..Context::default() };
        let head = tool.call(json!({}), &context).await.unwrap();
        let head = head.as_str().unwrap();
        assert!(head.contains(&format!("traceparent: {}\r\n", trace.traceparent())), "{head}");
        assert!(head.contains("tracestate: vendor=x\r\n"), "{head}");
        assert_eq!(head.matches("traceparent:").count(), 1, "{head}");
        // Outside a traced call the operator's header goes as configured.
        let head = tool.call(json!({}), &Context::default()).await.unwrap();
        assert!(head.as_str().unwrap().contains("traceparent: 00-1111"), "{head}");
    }

    #[test]
    fn excerpts_are_short_and_json_is_recognised() {
        assert_eq!(excerpt(b"  not\n  found  "), "not found");
        assert_eq!(excerpt("é".repeat(300).as_bytes()), format!("{}...", "é".repeat(200)));
        assert!(is_json("application/json; charset=utf-8") && is_json("application/problem+json"));
        assert!(!is_json("text/plain"));
    }
}
