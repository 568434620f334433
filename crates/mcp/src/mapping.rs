//! MCP's tools, results and errors in toolhost's terms.
//!
//! - A tool's `inputSchema` is the argument schema and its `outputSchema` the output schema; a
//!   tool without `outputSchema` gets [`permissive_output_schema`].
//! - Annotations: `readOnlyHint`, `idempotentHint`, `destructiveHint`, with MCP's defaults where
//!   a hint is absent (not read-only, not idempotent, destructive), so that the ledger never
//!   re-runs such a tool blindly after a crash. `destructiveHint` only counts for a tool that is
//!   not read-only (as in MCP): a read-only tool is never destructive.
//! - A result with `structuredContent` answers with it; text-only content with the texts joined
//!   by newlines; other content with the content list as MCP gave it; `isError` with
//!   `tool_failed` and the server's text.

use serde_json::{Value, json};
use toolhost_envelope::Annotations;
use toolhost_tools::{ToolError, ToolSpec};

use rmcp::ServiceError;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, ErrorCode, Tool as McpTool};

use crate::config::ServerSpec;

/// The output schema of a tool that declares none: any object (its `structuredContent`), string
/// (its text) or array (its content blocks).
pub fn permissive_output_schema() -> Value {
    json!({
        "description": "The tool declared no outputSchema. Its answer is its structuredContent (an object), \
                        else its text content joined by newlines (a string), else its content blocks as \
                        the MCP server gave them (an array of objects with a `type`).",
        "type": ["object", "string", "array"]
    })
}

/// The toolhost spec of `tool` under the name `name`.
pub fn spec(server: &ServerSpec, name: &str, tool: &McpTool) -> ToolSpec {
    let description =
        tool.description.as_deref().map(str::to_owned).or_else(|| tool.title.clone()).unwrap_or_default();
    let argument_schema = Value::Object((*tool.input_schema).clone());
    let output_schema = tool
        .output_schema
        .as_ref()
        .map_or_else(permissive_output_schema, |schema| Value::Object((**schema).clone()));
    let mut spec = ToolSpec::new(name, &description, argument_schema, output_schema);
    spec.annotations = annotations(tool);
    spec.timeout = server.timeout;
    spec
}

/// toolhost's annotations from MCP's hints, with MCP's defaults for absent ones.
pub fn annotations(tool: &McpTool) -> Annotations {
    let hints = tool.annotations.as_ref();
    let read_only = hints.and_then(|hints| hints.read_only_hint).unwrap_or(false);
    let idempotent = hints.and_then(|hints| hints.idempotent_hint).unwrap_or(false);
    let destructive = !read_only && hints.and_then(|hints| hints.destructive_hint).unwrap_or(true);
    Annotations { read_only, idempotent, destructive }
}

/// The answer of a finished `tools/call`.
///
/// # Errors
/// `tool_failed` for `isError`, an input-required result or a task.
pub fn answer(tool: &str, response: CallToolResponse) -> Result<Value, ToolError> {
    match response {
        CallToolResponse::Complete(result) => complete(result),
        CallToolResponse::InputRequired(_) => Err(ToolError::Failed(format!(
            "MCP tool '{tool}' asked for input from the user before it could finish; toolhost offers \
             MCP servers no elicitation, sampling or roots, so the call cannot complete"
        ))),
        CallToolResponse::Task(_) => Err(ToolError::Failed(format!(
            "MCP tool '{tool}' answered with a task to poll later; toolhost does not run MCP tasks"
        ))),
        _ => Err(ToolError::Failed(format!("MCP tool '{tool}' answered in a form toolhost does not know"))),
    }
}

fn complete(result: CallToolResult) -> Result<Value, ToolError> {
    if result.is_error == Some(true) {
        let text = texts(&result.content).unwrap_or_default();
        let text = if text.is_empty() {
            result
                .structured_content
                .map_or_else(|| "the MCP tool reported an error".to_owned(), |s| s.to_string())
        } else {
            text
        };
        return Err(ToolError::Failed(text));
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured);
    }
    if let Some(text) = texts(&result.content) {
        return Ok(Value::String(text));
    }
    serde_json::to_value(&result.content)
        .map_err(|err| ToolError::Failed(format!("the MCP tool's content could not be encoded: {err}")))
}

/// The texts of `content` joined by newlines, if every block is text (and so for no blocks).
fn texts(content: &[ContentBlock]) -> Option<String> {
    content
        .iter()
        .map(|block| match block {
            ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .map(|texts| texts.join("\n"))
}

/// What a failed request means for the caller. `went_away` is whether the connection broke (the
/// supervisor then checks the server).
pub fn service_error(tool: &str, source: &str, error: ServiceError) -> (ToolError, bool) {
    match error {
        ServiceError::McpError(error) if error.code == ErrorCode::INVALID_PARAMS => (
            ToolError::InvalidArguments(format!(
                "MCP tool '{tool}' refused its arguments: {}",
                error.message
            )),
            false,
        ),
        ServiceError::McpError(error) => (
            ToolError::Failed(format!(
                "MCP tool '{tool}' failed with JSON-RPC error {}: {}",
                error.code.0, error.message
            )),
            false,
        ),
        ServiceError::Timeout { timeout } => (
            ToolError::Timeout(format!("MCP tool '{tool}' did not answer within {} ms", timeout.as_millis())),
            false,
        ),
        ServiceError::TransportClosed | ServiceError::TransportSend(_) => (
            ToolError::Failed(format!(
                "MCP server '{source}' went away during the call of '{tool}'; the call was not retried"
            )),
            true,
        ),
        other => (ToolError::Failed(format!("MCP tool '{tool}' failed: {other}")), false),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn tool(value: Value) -> McpTool {
        serde_json::from_value(value).unwrap()
    }

    fn result(value: Value) -> CallToolResponse {
        CallToolResponse::Complete(serde_json::from_value(value).unwrap())
    }

    #[test]
    fn absent_hints_take_mcp_defaults_and_read_only_tools_are_never_destructive() {
        let bare = tool(json!({"name": "t", "inputSchema": {"type": "object"}}));
        assert_eq!(
            annotations(&bare),
            Annotations { read_only: false, idempotent: false, destructive: true }
        );
        let read_only = tool(json!({"name": "t", "inputSchema": {"type": "object"},
            "annotations": {"readOnlyHint": true}}));
        assert_eq!(
            annotations(&read_only),
            Annotations { read_only: true, idempotent: false, destructive: false }
        );
        let safe = tool(json!({"name": "t", "inputSchema": {"type": "object"},
            "annotations": {"idempotentHint": true, "destructiveHint": false}}));
        assert_eq!(
            annotations(&safe),
            Annotations { read_only: false, idempotent: true, destructive: false }
        );
    }

    #[test]
    fn results_answer_with_structured_content_then_text_then_the_content_list() {
        let structured = result(json!({"content": [{"type": "text", "text": "{\"a\":1}"}],
            "structuredContent": {"a": 1}}));
        assert_eq!(answer("t", structured).unwrap(), json!({"a": 1}));
        let text =
            result(json!({"content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}));
        assert_eq!(answer("t", text).unwrap(), json!("one\ntwo"));
        let image = json!([{"type": "text", "text": "see"}, {"type": "image", "data": "AAAA", "mimeType": "image/png"}]);
        let mixed = result(json!({"content": image}));
        assert_eq!(answer("t", mixed).unwrap(), image);
    }

    #[test]
    fn is_error_answers_tool_failed_with_the_servers_text() {
        let failed =
            result(json!({"content": [{"type": "text", "text": "Invalid timezone: Mars"}], "isError": true}));
        assert_eq!(answer("t", failed).unwrap_err(), ToolError::Failed("Invalid timezone: Mars".into()));
    }

    #[test]
    fn json_rpc_invalid_params_answers_invalid_arguments() {
        let error = ServiceError::McpError(rmcp::ErrorData::invalid_params("a must be a number", None));
        let (mapped, went_away) = service_error("t", "s", error);
        assert!(
            matches!(mapped, ToolError::InvalidArguments(ref text) if text.contains("a must be a number"))
        );
        assert!(!went_away);
        let (mapped, went_away) = service_error("t", "s", ServiceError::TransportClosed);
        assert_eq!(mapped.code(), toolhost_envelope::ErrorCode::ToolFailed);
        assert!(went_away);
    }
}
