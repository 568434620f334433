//! `echo`: returns its message. The smallest real tool, for checks and benchmarks.

use async_trait::async_trait;
use serde_json::{Value, json};
use toolhost_envelope::Annotations;

use crate::{Context, Tool, ToolError, ToolSpec};

/// Returns `{"message": <message>}`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Echo;

#[async_trait]
impl Tool for Echo {
    fn spec(&self) -> ToolSpec {
        let mut spec = ToolSpec::new(
            "echo",
            "Return the given message unchanged. Useful to check that the tool host answers.",
            json!({
                "type": "object",
                "properties": {"message": {"type": "string", "description": "The text to return."}},
                "required": ["message"],
                "additionalProperties": false,
            }),
            json!({
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
                "additionalProperties": false,
            }),
        );
        spec.annotations = Annotations { read_only: true, idempotent: true, destructive: false };
        spec.timeout = std::time::Duration::from_secs(5);
        spec
    }

    async fn call(&self, arguments: Value, _context: &Context) -> Result<Value, ToolError> {
        let message = arguments.get("message").cloned().unwrap_or(Value::Null);
        Ok(json!({ "message": message }))
    }
}
