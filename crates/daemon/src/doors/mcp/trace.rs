//! The caller's trace context of an MCP request: `params._meta.traceparent` (SEP-414), else the
//! HTTP `traceparent` header of the streamable HTTP request that carried it.

use opentelemetry::KeyValue;
use opentelemetry::trace::SpanKind;
use rmcp::RoleServer;
use rmcp::model::{MetaObject, RequestMetaObject};
use rmcp::service::RequestContext;
use toolhost_envelope::TraceContext;

use crate::telemetry::{DoorSpan, Telemetry};

/// The first valid context of `_meta` (rmcp moves a request's `_meta` into its context; `params`
/// is read too in case it kept one) and the HTTP headers, in that order: `_meta` wins, and a
/// `_meta` whose `traceparent` is not valid is passed over, never copied on.
pub(super) fn caller(
    params: Option<&RequestMetaObject>,
    context: &RequestContext<RoleServer>,
) -> Option<TraceContext> {
    let from_meta = |meta: &MetaObject| TraceContext::read(meta.get_traceparent(), meta.get_tracestate());
    from_meta(&context.meta).or_else(|| params.and_then(|meta| from_meta(meta))).or_else(|| {
        let headers = &context.extensions.get::<axum::http::request::Parts>()?.headers;
        let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
        TraceContext::read(header("traceparent"), header("tracestate"))
    })
}

/// The door's SERVER span of a `tools/call`, by the MCP conventions (`tools/call <tool>`,
/// `mcp.method.name`, `gen_ai.tool.name`, `gen_ai.operation.name`, `jsonrpc.request.id`,
/// `mcp.session.id` when the HTTP session has one); `None` when the call is not sampled or
/// nothing is exported.
pub(super) fn server_span(
    telemetry: &Telemetry,
    caller: Option<&TraceContext>,
    tool: &str,
    jsonrpc_id: &str,
    transport: &'static str,
    context: &RequestContext<RoleServer>,
) -> Option<DoorSpan> {
    let mut attributes = vec![
        KeyValue::new("mcp.method.name", "tools/call"),
        KeyValue::new("gen_ai.tool.name", tool.to_owned()),
        KeyValue::new("gen_ai.operation.name", "execute_tool"),
        KeyValue::new("jsonrpc.request.id", jsonrpc_id.to_owned()),
        KeyValue::new("network.transport", if transport == "stdio" { "pipe" } else { "tcp" }),
    ];
    let session = context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.headers.get("mcp-session-id"))
        .and_then(|value| value.to_str().ok());
    if let Some(session) = session {
        attributes.push(KeyValue::new("mcp.session.id", session.to_owned()));
    }
    telemetry.door_span(caller, format!("tools/call {tool}"), SpanKind::Server, attributes)
}
