//! Which MCP revision a request speaks, and what the door does differently for it.
//!
//! The door serves two generations from one handler:
//!
//! - the `initialize` generations (2024-11-05 to 2025-11-25): a session opened by `initialize`
//!   (over HTTP, named by `Mcp-Session-Id`), the client's capabilities given once;
//! - 2026-07-28: no `initialize` and no session; `server/discover` is optional, and every
//!   request carries its protocol version and client capabilities in `_meta`.
//!
//! rmcp does the wire differences (`resultType`, the `Mcp-Method` and `Mcp-Name` headers,
//! `ping` refused); this module says, for one request, which generation it is in and fills what
//! the door decides for 2026-07-28: the cache hints of list results.

use rmcp::RoleServer;
use rmcp::model::{CacheScope, ErrorData as McpError, ListToolsResult, ProtocolVersion};
use rmcp::service::RequestContext;

/// Whether `context`'s request speaks 2026-07-28 or newer: no session, its version and
/// capabilities in its own `_meta`.
pub(crate) fn is_stateless(context: &RequestContext<RoleServer>) -> bool {
    context.protocol_version().is_some_and(|version| version >= ProtocolVersion::V_2026_07_28)
}

/// Sets the SEP-2549 cache hints of a `tools/list` page for a 2026-07-28 request: fresh for
/// `ttl_ms` (the door's `[mcp] watch_ms`, the period at which the door itself reads the fleet's
/// tools again, so a cached page is never older than twice that), and `private`, because the
/// list is filtered per tenant. Older requests get none (their schema has no such fields).
pub(crate) fn cache_hints(result: &mut ListToolsResult, context: &RequestContext<RoleServer>, ttl_ms: u64) {
    if is_stateless(context) {
        result.ttl_ms = Some(ttl_ms);
        result.cache_scope = Some(CacheScope::Private);
    }
}

/// The refusal of a method the 2026-07-28 revision removed (`logging/setLevel`: a request asks
/// for log messages with `io.modelcontextprotocol/logLevel` in its `_meta` instead).
pub(crate) fn removed(method: &str) -> McpError {
    McpError::new(
        rmcp::model::ErrorCode::METHOD_NOT_FOUND,
        format!("{method} is not part of MCP 2026-07-28"),
        Some(serde_json::json!({"method": method, "protocolVersion": "2026-07-28"})),
    )
}
