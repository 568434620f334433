//! Tool sources: where tools come from. Every source yields [`crate::Tool`]s the registry holds
//! and calls the same way (validation, limits, timeouts, output checks).
//!
//! - [`builtin`]: the tools compiled into toolhost (`echo`, `terminal_run`, `chat_send`, one
//!   per `[[agents]]` specialist, synthetic benchmark tools).
//! - [`command`]: `[[commands]]`, a program run with an argv template, on the terminal engine.
//! - [`http`]: `[[http_tools]]`, an HTTP endpoint called with `reqwest`.
//! - Hosted MCP servers (`[[mcp_servers]]`) are the `toolhost-mcp` crate's, since they need a
//!   protocol client of their own.
//!
//! A new kind of source is a new module here (or a crate, for a large one) yielding tools; the
//! daemon's `sources` module registers them. Nothing else changes.
//!
//! Each source has a settings type as the configuration spells it (serde, unknown keys refused)
//! and a definition compiled from it once, whose errors name the key at fault
//! ([`FieldError`]), so the daemon can report every bad key of every source together.

pub mod builtin;
pub mod command;
pub mod http;
mod template;

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use toolhost_envelope::Annotations;

/// The schema keyword that lets an argument's value start with `-` where it fills an argv
/// element (see [`command`]): `"x-toolhost-allow-dash": true` on the argument's property.
pub const ALLOW_DASH: &str = "x-toolhost-allow-dash";

/// One bad key of a source's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The key inside the source's table, e.g. `argv[2]` or `headers.Authorization`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl FieldError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError { field: field.into(), message: message.into() }
    }
}

/// `annotations = { ... }` of a source. A hint left out takes MCP's default: not read-only, not
/// idempotent, destructive unless read-only. So a crash never makes the ledger re-run a tool
/// nobody said was safe to repeat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AnnotationSettings {
    /// The tool changes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Running it twice has the effect of running it once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// It may destroy or overwrite something.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
}

impl AnnotationSettings {
    /// The annotations, defaults filled in.
    pub fn resolve(self) -> Annotations {
        let read_only = self.read_only.unwrap_or(false);
        Annotations {
            read_only,
            idempotent: self.idempotent.unwrap_or(false),
            destructive: self.destructive.unwrap_or(!read_only),
        }
    }
}

/// The argument schema of a source: `inline`, or the JSON file `file`, or (neither given) a
/// closed object of required strings, one per placeholder in `names`. Each name must be a
/// property of the schema.
fn argument_schema<'a>(
    inline: Option<&Value>,
    file: Option<&Path>,
    names: impl IntoIterator<Item = &'a str>,
    errors: &mut Vec<FieldError>,
) -> Value {
    let names: Vec<&str> = names.into_iter().collect();
    let (key, schema) = match (inline, file) {
        (Some(_), Some(_)) => {
            errors.push(FieldError::new(
                "argument_schema_file",
                "set argument_schema or argument_schema_file, not both",
            ));
            return Value::Null;
        }
        (Some(schema), None) => ("argument_schema", schema.clone()),
        (None, Some(path)) => match read_schema(path) {
            Ok(schema) => ("argument_schema_file", schema),
            Err(message) => {
                errors.push(FieldError::new("argument_schema_file", message));
                return Value::Null;
            }
        },
        (None, None) => {
            let properties: Map<String, Value> =
                names.iter().map(|name| ((*name).to_owned(), json!({"type": "string"}))).collect();
            let mut required: Vec<&str> = names.clone();
            required.sort_unstable();
            required.dedup();
            return json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false});
        }
    };
    let properties = schema.get("properties").and_then(Value::as_object);
    for name in names {
        if !properties.is_some_and(|properties| properties.contains_key(name)) {
            errors.push(FieldError::new(
                key,
                format!("the placeholder {{{name}}} is not a property of the argument schema"),
            ));
        }
    }
    schema
}

/// Reads a JSON schema file.
fn read_schema(path: &Path) -> Result<Value, String> {
    let text =
        std::fs::read_to_string(path).map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    serde_json::from_str(&text).map_err(|err| format!("{} is not JSON: {err}", path.display()))
}

/// The names of the properties of `schema` that carry [`ALLOW_DASH`]` = true`.
fn dash_allowed(schema: &Value) -> Vec<String> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|properties| {
            properties
                .iter()
                .filter(|(_, property)| property.get(ALLOW_DASH) == Some(&Value::Bool(true)))
                .map(|(name, _)| name.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// Checks the settings every source shares: the tool name and the numbers.
fn check_common(name: &str, numbers: &[(&str, u64)], errors: &mut Vec<FieldError>) {
    if !crate::valid_tool_name(name) {
        errors.push(FieldError::new("name", "must be 1-64 of [a-z0-9_] (it becomes a tool name)"));
    }
    for (key, value) in numbers {
        if *value == 0 {
            errors.push(FieldError::new(*key, "must be greater than 0"));
        }
    }
}

fn default_timeout_ms() -> u64 {
    10_000
}

fn default_max_bytes() -> usize {
    1024 * 1024
}

#[cfg(test)]
// A failed unwrap is a test failure with a clear message; that is what tests want.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn annotations_default_to_mcps_cautious_hints() {
        let none = AnnotationSettings::default().resolve();
        assert_eq!(none, Annotations { read_only: false, idempotent: false, destructive: true });
        let read_only =
            AnnotationSettings { read_only: Some(true), idempotent: Some(true), destructive: None };
        assert_eq!(
            read_only.resolve(),
            Annotations { read_only: true, idempotent: true, destructive: false }
        );
    }

    #[test]
    fn schemas_come_inline_from_a_file_or_from_the_placeholders() {
        let mut errors = Vec::new();
        let derived = argument_schema(None, None, ["b", "a", "b"], &mut errors);
        assert_eq!(
            derived,
            json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                   "required": ["a", "b"], "additionalProperties": false})
        );
        let inline = json!({"type": "object", "properties": {"a": {"type": "string", ALLOW_DASH: true}}});
        assert_eq!(argument_schema(Some(&inline), None, ["a"], &mut errors), inline);
        assert_eq!(dash_allowed(&inline), ["a"]);
        assert!(errors.is_empty(), "{errors:?}");
        argument_schema(Some(&inline), None, ["a", "zz"], &mut errors);
        assert_eq!(errors[0].field, "argument_schema");
        assert!(errors[0].message.contains("{zz}"), "{errors:?}");
        let path = std::env::temp_dir().join(format!("toolhost-schema-{}.json", uuid::Uuid::new_v4()));
        std::fs::write(&path, inline.to_string()).unwrap();
        let mut errors = Vec::new();
        assert_eq!(argument_schema(None, Some(&path), ["a"], &mut errors), inline);
        argument_schema(Some(&inline), Some(&path), ["a"], &mut errors);
        std::fs::remove_file(&path).unwrap();
        argument_schema(None, Some(&path), ["a"], &mut errors);
        let fields: Vec<&str> = errors.iter().map(|error| error.field.as_str()).collect();
        assert_eq!(fields, ["argument_schema_file", "argument_schema_file"]);
        assert!(errors[1].message.starts_with("cannot read"), "{errors:?}");
    }
}
