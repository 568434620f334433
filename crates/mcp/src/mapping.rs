//! MCP's tools, results and errors in toolhost's terms.
//!
//! - A tool's `inputSchema` is the argument schema and its `outputSchema` the output schema; a
//!   tool without `outputSchema` gets [`permissive_output_schema`].
//! - Annotations: `readOnlyHint`, `idempotentHint`, `destructiveHint`, with MCP's defaults where
//!   a hint is absent (not read-only, not idempotent, destructive), so that the ledger never
//!   re-runs such a tool blindly after a crash. `destructiveHint` only counts for a tool that is
//!   not read-only (as in MCP): a read-only tool is never destructive.
//! - A result's `result` is its `structuredContent`, else its texts joined by newlines; its
//!   content blocks travel beside it as MCP gave them (`annotations` and `_meta` kept) unless
//!   they say no more than that (docs/CONTRACTS.md, "Content blocks"); `isError` answers
//!   `tool_failed` with the server's text; a result over `max_response_bytes` answers
//!   `tool_failed` naming the limit.

use serde_json::{Value, json};
use toolhost_envelope::Annotations;
use toolhost_tools::{Output, ToolError, ToolSpec, from_call_result};

use rmcp::ServiceError;
use rmcp::model::{CallToolResponse, ErrorCode, Tool as McpTool};

use crate::config::ServerSpec;

/// The output schema of a tool that declares none: any object (its `structuredContent`) or
/// string (its text); its other content blocks travel in the answer's `content`.
pub fn permissive_output_schema() -> Value {
    json!({
        "description": "The tool declared no outputSchema. Its answer is its structuredContent (an object), \
                        else its text content joined by newlines (a string); images, audio and resources \
                        are in the answer's content blocks.",
        "type": ["object", "string"]
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

/// The answer of a finished `tools/call`, checked against `max_response_bytes` (the size of the
/// result's JSON).
///
/// # Errors
/// `tool_failed` for `isError`, an input-required result, a task, or a result over
/// `max_response_bytes`.
pub fn answer(
    tool: &str,
    response: CallToolResponse,
    max_response_bytes: usize,
) -> Result<Output, ToolError> {
    match response {
        CallToolResponse::Complete(result) => {
            let size_bytes = serde_json::to_vec(&result).map_or(0, |bytes| bytes.len());
            if size_bytes > max_response_bytes {
                return Err(ToolError::TooLarge {
                    message: format!(
                        "MCP tool '{tool}' answered {size_bytes} bytes, over the server's max_response_bytes \
                         ({max_response_bytes}); raise [[mcp_servers]] max_response_bytes or ask for less"
                    ),
                    limit_bytes: max_response_bytes,
                    size_bytes,
                    setting: "max_response_bytes",
                });
            }
            let value = serde_json::to_value(&result).map_err(|err| {
                ToolError::Failed(format!("the MCP tool's result could not be read: {err}"))
            })?;
            from_call_result(value).map_err(|err| ToolError::Failed(err.to_string()))
        }
        // The source answers these itself and retries (`mrtr`); one that reaches here was not.
        CallToolResponse::InputRequired(_) => Err(ToolError::Failed(format!(
            "MCP tool '{tool}' asked for input before it could finish, and the question was not answered"
        ))),
        // The source follows a task to its end (`task`); one that reaches here was not.
        CallToolResponse::Task(_) => Err(ToolError::Failed(format!(
            "MCP tool '{tool}' answered with a task that was not followed to its end"
        ))),
        _ => Err(ToolError::Failed(format!("MCP tool '{tool}' answered in a form toolhost does not know"))),
    }
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

    fn output(response: CallToolResponse) -> Output {
        answer("t", response, 1 << 20).unwrap()
    }

    #[test]
    fn results_are_structured_content_then_text_and_blocks_travel_where_they_say_more() {
        // structuredContent with its JSON as the one text block: the blocks say nothing more.
        let structured = result(json!({"content": [{"type": "text", "text": "{\"a\":1}"}],
            "structuredContent": {"a": 1}}));
        assert_eq!(output(structured), Output { result: json!({"a": 1}), content: None });
        let text =
            result(json!({"content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}));
        let two_texts = output(text);
        assert_eq!(two_texts.result, json!("one\ntwo"));
        assert_eq!(two_texts.content.map(|blocks| blocks.len()), Some(2), "two blocks are kept as two");
        let one = output(result(json!({"content": [{"type": "text", "text": "one"}]})));
        assert_eq!(one, Output { result: json!("one"), content: None });
        // Images, audio and resources, with annotations and _meta, as the server wrote them.
        let blocks = json!([
            {"type": "text", "text": "see"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png", "annotations": {"audience": ["user"], "priority": 0.5}},
            {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav", "_meta": {"k": "v"}},
            {"type": "resource_link", "uri": "file:///a.txt", "name": "a.txt", "mimeType": "text/plain"},
            {"type": "resource", "resource": {"uri": "test://r", "mimeType": "text/plain", "text": "body"}}
        ]);
        let mixed = output(result(json!({"content": blocks})));
        assert_eq!(mixed.result, json!("see"), "result is the text, as for a text-only reader");
        assert_eq!(mixed.content, Some(blocks.as_array().unwrap().clone()));
        // structuredContent beside other blocks keeps both.
        let both =
            output(result(json!({"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}],
            "structuredContent": {"w": 1}})));
        assert_eq!(both.result, json!({"w": 1}));
        assert_eq!(both.content.unwrap()[0]["type"], "image");
        // An annotated text block is kept, so its annotations reach the client.
        let annotated = output(result(
            json!({"content": [{"type": "text", "text": "x", "annotations": {"priority": 1.0}}]}),
        ));
        assert!(annotated.content.is_some());
    }

    #[test]
    fn an_answer_over_max_response_bytes_names_the_limit_and_keeps_nothing() {
        let big = result(
            json!({"content": [{"type": "image", "data": "A".repeat(4000), "mimeType": "image/png"}]}),
        );
        let err = answer("shot", big, 1000).unwrap_err();
        assert_eq!(err.code(), toolhost_envelope::ErrorCode::ToolFailed);
        assert!(err.to_string().contains("max_response_bytes (1000)"), "{err}");
        let details = err.details().unwrap();
        assert_eq!(details["limit_bytes"], 1000);
        assert_eq!(details["setting"], "max_response_bytes");
        assert!(details["size_bytes"].as_u64().unwrap() > 4000);
    }

    #[test]
    fn is_error_answers_tool_failed_with_the_servers_text() {
        let failed =
            result(json!({"content": [{"type": "text", "text": "Invalid timezone: Mars"}], "isError": true}));
        assert_eq!(
            answer("t", failed, 1 << 20).unwrap_err(),
            ToolError::Failed("Invalid timezone: Mars".into())
        );
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
