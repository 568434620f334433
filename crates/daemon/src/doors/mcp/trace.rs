//! The caller's trace context of an MCP request: `params._meta.traceparent` (SEP-414), else the
//! HTTP `traceparent` header of the streamable HTTP request that carried it.

use rmcp::RoleServer;
use rmcp::model::{MetaObject, RequestMetaObject};
use rmcp::service::RequestContext;
use toolhost_envelope::TraceContext;

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
