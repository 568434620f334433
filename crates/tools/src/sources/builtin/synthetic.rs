//! Synthetic tools for benchmarks: a realistic 20-field argument schema, echoed back.
//!
//! Registered only by `toolhost serve --synthetic-tools N`, to measure validation cost and
//! dispatch with many tools.

use async_trait::async_trait;
use serde_json::{Value, json};
use toolhost_envelope::Annotations;

use crate::{Context, Tool, ToolError, ToolSpec};

/// `synthetic_<NNNN>`: validates a 20-field object and returns it.
#[derive(Debug, Clone)]
pub struct Synthetic {
    name: String,
}

impl Synthetic {
    /// The synthetic tool number `index`.
    pub fn new(index: usize) -> Synthetic {
        Synthetic { name: format!("synthetic_{index:04}") }
    }

    /// The 20-field argument schema.
    pub fn schema() -> Value {
        let text = json!({"type": "string", "minLength": 1, "maxLength": 200});
        let count = json!({"type": "integer", "minimum": 0, "maximum": 1_000_000});
        let flag = json!({"type": "boolean"});
        json!({
            "type": "object",
            "properties": {
                "f00": text, "f01": text, "f02": text, "f03": text, "f04": text, "f05": text,
                "f06": count, "f07": count, "f08": count, "f09": count,
                "f10": flag, "f11": flag, "f12": flag,
                "f13": {"type": "string", "enum": ["low", "medium", "high"]},
                "f14": {"type": "number"},
                "f15": {"type": "array", "items": {"type": "string"}, "maxItems": 16},
                "f16": {"type": "object", "properties": {"k": {"type": "string"}, "v": {"type": "integer"}},
                        "required": ["k", "v"], "additionalProperties": false},
                "f17": {"type": "string", "format": "date-time"},
                "f18": {"type": "string", "pattern": "^[a-z0-9_]+$"},
                "f19": {"type": "string"},
            },
            "required": ["f00", "f01", "f02", "f03", "f04", "f05", "f06", "f07", "f08", "f09",
                         "f10", "f11", "f12", "f13", "f14", "f15", "f16", "f17", "f18"],
            "additionalProperties": false,
        })
    }
}

#[async_trait]
impl Tool for Synthetic {
    fn spec(&self) -> ToolSpec {
        let mut spec = ToolSpec::new(
            &self.name,
            "Benchmark tool: validates 20 fields and returns them.",
            Synthetic::schema(),
            Synthetic::schema(),
        );
        spec.annotations = Annotations { read_only: true, idempotent: true, destructive: false };
        spec
    }

    async fn call(&self, arguments: Value, _context: &Context) -> Result<Value, ToolError> {
        Ok(arguments)
    }
}
