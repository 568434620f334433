//! What a tool answers: its `result` (checked against its output schema), and, where it gave
//! more than text, its MCP content blocks (docs/CONTRACTS.md, "Content blocks").
//!
//! Blocks are MCP's JSON as the tool wrote it (`type`, `annotations` and `_meta` kept). They are
//! checked before they are answered: an unknown `type`, a missing field or base64 that does not
//! decode is `invalid_output`, never passed on for a client to choke on.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

/// A tool's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// What the answer's `result` holds: the value the output schema describes.
    pub result: Value,
    /// The content blocks, when the tool gave more than one text block: an image, audio, a
    /// resource link or an embedded resource, or `structuredContent` beside its content.
    pub content: Option<Vec<Value>>,
}

impl From<Value> for Output {
    fn from(result: Value) -> Output {
        Output { result, content: None }
    }
}

/// The answer of an MCP `CallToolResult` in its JSON form (`{"content", "structuredContent"?,
/// "isError"?}`), as a hosted MCP server or an `output = "mcp"` command gives it: `result` is
/// `structuredContent`, else the text blocks joined by newlines; `content` is the blocks, unless
/// they say no more than `result` (no blocks; one plain text block that is the text, or beside
/// `structuredContent` its JSON).
///
/// # Errors
/// `isError`: the text to answer `tool_failed` with; a value that is not a `CallToolResult`.
pub fn from_call_result(value: Value) -> Result<Output, CallResultError> {
    let Value::Object(mut fields) = value else {
        return Err(CallResultError::Malformed("a CallToolResult must be a JSON object".to_owned()));
    };
    let blocks = match fields.remove("content") {
        None => Vec::new(),
        Some(Value::Array(blocks)) => blocks,
        Some(_) => {
            return Err(CallResultError::Malformed("its content must be an array of blocks".to_owned()));
        }
    };
    let structured = fields.remove("structuredContent").filter(|value| !value.is_null());
    let text = blocks
        .iter()
        .filter(|block| block.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|block| block.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n");
    if fields.get("isError").and_then(Value::as_bool) == Some(true) {
        return Err(CallResultError::IsError(if text.is_empty() {
            structured.map_or_else(|| "the MCP tool reported an error".to_owned(), |s| s.to_string())
        } else {
            text
        }));
    }
    let plain = match blocks.as_slice() {
        [] => true,
        [block]
            if block.get("type").and_then(Value::as_str) == Some("text")
                && block.get("annotations").is_none_or(Value::is_null)
                && block.get("_meta").is_none_or(Value::is_null) =>
        {
            match &structured {
                None => true,
                Some(structured) => serde_json::from_str::<Value>(&text).ok().as_ref() == Some(structured),
            }
        }
        _ => false,
    };
    Ok(Output { result: structured.unwrap_or(Value::String(text)), content: (!plain).then_some(blocks) })
}

/// Why a `CallToolResult` is not an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallResultError {
    /// It says `isError`: the tool's text.
    #[error("{0}")]
    IsError(String),
    /// It is not a `CallToolResult`.
    #[error("{0}")]
    Malformed(String),
}

/// The block types MCP defines (2025-11-25).
pub const BLOCK_TYPES: [&str; 5] = ["text", "image", "audio", "resource_link", "resource"];

/// Checks that every block is one MCP defines, with its fields, and that its base64 decodes.
///
/// # Errors
/// The first bad block: its index and what is wrong with it.
pub fn check_blocks(blocks: &[Value]) -> Result<(), String> {
    for (index, block) in blocks.iter().enumerate() {
        check_block(block).map_err(|reason| format!("content block {index}: {reason}"))?;
    }
    Ok(())
}

fn check_block(block: &Value) -> Result<(), String> {
    let kind = block.get("type").and_then(Value::as_str).ok_or("it has no string `type`")?;
    match kind {
        "text" => string(block, "text").map(drop),
        "image" | "audio" => {
            string(block, "mimeType")?;
            base64(block, "data")
        }
        "resource_link" => {
            string(block, "uri")?;
            string(block, "name").map(drop)
        }
        "resource" => {
            let resource =
                block.get("resource").filter(|r| r.is_object()).ok_or("it has no `resource` object")?;
            string(resource, "uri").map_err(|reason| format!("its resource: {reason}"))?;
            match (resource.get("text"), resource.get("blob")) {
                (Some(Value::String(_)), None) => Ok(()),
                (None, Some(_)) => {
                    base64(resource, "blob").map_err(|reason| format!("its resource: {reason}"))
                }
                _ => Err("its resource has neither a string `text` nor a `blob`".to_owned()),
            }
        }
        other => Err(format!("unknown type '{other}' (MCP's are {})", BLOCK_TYPES.join(", "))),
    }
}

fn string<'a>(value: &'a Value, field: &str) -> Result<&'a str, String> {
    value.get(field).and_then(Value::as_str).ok_or_else(|| format!("it has no string `{field}`"))
}

fn base64(value: &Value, field: &str) -> Result<(), String> {
    let data = string(value, field)?;
    STANDARD.decode(data).map(drop).map_err(|err| format!("its `{field}` is not base64: {err}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_mcp_block_type_passes_with_its_annotations_and_meta() {
        let blocks = [
            json!({"type": "text", "text": "hi", "annotations": {"audience": ["user"]}}),
            json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png", "_meta": {"k": 1}}),
            json!({"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"}),
            json!({"type": "resource_link", "uri": "file:///a.txt", "name": "a.txt"}),
            json!({"type": "resource", "resource": {"uri": "test://t", "text": "x", "mimeType": "text/plain"}}),
            json!({"type": "resource", "resource": {"uri": "test://b", "blob": "AAEC"}}),
        ];
        assert_eq!(check_blocks(&blocks), Ok(()));
    }

    #[test]
    fn a_call_result_is_its_structured_content_or_texts_with_the_blocks_that_say_more() {
        let image = json!({"type": "image", "data": "AAAA", "mimeType": "image/png"});
        let output = from_call_result(json!({"content": [{"type": "text", "text": "a"}, image]})).unwrap();
        assert_eq!(
            output,
            Output { result: json!("a"), content: Some(vec![json!({"type": "text", "text": "a"}), image]) }
        );
        let structured =
            json!({"content": [{"type": "text", "text": "{\"k\": 1}"}], "structuredContent": {"k": 1}});
        assert_eq!(from_call_result(structured).unwrap(), Output { result: json!({"k": 1}), content: None });
        let failed = json!({"content": [{"type": "text", "text": "no"}], "isError": true});
        assert_eq!(from_call_result(failed), Err(CallResultError::IsError("no".to_owned())));
        assert!(matches!(from_call_result(json!([1])), Err(CallResultError::Malformed(_))));
        assert!(matches!(from_call_result(json!({"content": "x"})), Err(CallResultError::Malformed(_))));
    }

    #[test]
    fn bad_blocks_name_the_block_and_what_is_wrong() {
        let check = |block: Value| check_blocks(&[json!({"type": "text", "text": "ok"}), block]).unwrap_err();
        let err = check(json!({"type": "image", "data": "not base64!", "mimeType": "image/png"}));
        assert!(err.starts_with("content block 1: its `data` is not base64"), "{err}");
        let err = check(json!({"type": "video", "data": ""}));
        assert!(err.contains("unknown type 'video'"), "{err}");
        assert!(check(json!({"type": "image", "data": "AAAA"})).contains("`mimeType`"));
        assert!(check(json!({"type": "resource", "resource": {"uri": "u"}})).contains("neither"));
        assert!(check(json!({"text": "no type"})).contains("no string `type`"));
    }
}
