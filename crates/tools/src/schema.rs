//! JSON Schema compilation and model-readable validation failures.

use jsonschema::{Draft, Validator};
use serde_json::{Value, json};

/// A schema that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("{which} schema of tool '{tool}' is invalid: {message}")]
pub struct SchemaError {
    /// The tool.
    pub tool: String,
    /// `argument` or `output`.
    pub which: &'static str,
    /// What the compiler said.
    pub message: String,
}

/// Compiles a draft 2020-12 schema, checking formats too.
pub(crate) fn compile(tool: &str, which: &'static str, schema: &Value) -> Result<Validator, SchemaError> {
    jsonschema::options()
        .with_draft(Draft::Draft202012)
        .should_validate_formats(true)
        .build(schema)
        .map_err(|err| SchemaError { tool: tool.to_owned(), which, message: err.to_string() })
}

/// Lists every way `instance` breaks `schema` (compiled as `validator`) as
/// `{"pointer", "rule", "expected", "message"}` objects, in words a model can act on: `pointer`
/// is the JSON pointer of the offending value, `rule` the schema keyword it broke and `expected`
/// that keyword's value in the schema.
pub fn describe_errors(validator: &Validator, schema: &Value, instance: &Value) -> Vec<Value> {
    validator
        .iter_errors(instance)
        .map(|err| {
            let pointer = err.instance_path().to_string();
            let expected = schema.pointer(err.schema_path().as_str()).cloned().unwrap_or(Value::Null);
            let place =
                if pointer.is_empty() { "arguments".to_owned() } else { format!("argument '{pointer}'") };
            json!({
                "pointer": pointer,
                "rule": err.kind().keyword(),
                "expected": expected,
                "message": format!("{place}: {err}"),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_name_pointer_and_rule() {
        let schema = json!({"type": "object", "properties": {"message": {"type": "string"}},
                            "required": ["message"], "additionalProperties": false});
        let validator = compile("echo", "argument", &schema).unwrap();
        let errors = describe_errors(&validator, &schema, &json!({"message": 5}));
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0]["pointer"], "/message");
        assert_eq!(errors[0]["rule"], "type");
        assert_eq!(errors[0]["expected"], "string");
        assert!(errors[0]["message"].as_str().unwrap().contains("argument '/message'"));
        let errors = describe_errors(&validator, &schema, &json!({}));
        assert_eq!(errors[0]["pointer"], "");
        assert_eq!(errors[0]["rule"], "required");
    }

    #[test]
    fn broken_schemas_are_refused() {
        let err = compile("bad", "argument", &json!({"type": 5})).unwrap_err();
        assert!(err.to_string().contains("argument schema of tool 'bad' is invalid"), "{err}");
    }
}
