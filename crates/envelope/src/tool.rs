//! Tool descriptions (contract section 3) and the formats agent frameworks read them in.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Everything a caller needs to know to call one tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDescription {
    /// Unique name, 1-64 of `[a-zA-Z0-9_-]`.
    pub name: String,
    /// What the tool does, for a model to read.
    pub description: String,
    /// JSON Schema (draft 2020-12) of the arguments.
    pub argument_schema: Value,
    /// JSON Schema (draft 2020-12) of the result.
    pub output_schema: Value,
    /// The event type that invokes the tool on the requests topic.
    pub consumed_event: String,
    /// The event type of its results when the caller names none.
    pub produced_event: String,
    /// Behaviour hints.
    pub annotations: Annotations,
    /// How long one call may run.
    pub timeout_ms: u64,
    /// The operator marked it long-running (`[tools.limits."<name>"] long_running`): doors that
    /// can answer later (MCP tasks) do so whatever its timeout. Left out when false, so the
    /// hashes of other tools' descriptions do not change.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub long_running: bool,
    /// Hex SHA-256 of the description without this field, so callers can cache.
    #[serde(default)]
    pub hash: String,
}

/// Behaviour hints of a tool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Annotations {
    /// The tool changes nothing.
    pub read_only: bool,
    /// Running it twice with the same arguments has the effect of running it once.
    pub idempotent: bool,
    /// It may destroy or overwrite something.
    pub destructive: bool,
}

/// The formats discovery answers in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiscoveryFormat {
    /// [`ToolDescription`] as is.
    #[default]
    Native,
    /// OpenAI function tools.
    Openai,
    /// MCP `tools/list` entries.
    Mcp,
    /// Voice-assistant toolbox list entries.
    Toolbox,
    /// Capability records.
    Capabilities,
}

impl DiscoveryFormat {
    /// Every format.
    pub const ALL: [DiscoveryFormat; 5] = [
        DiscoveryFormat::Native,
        DiscoveryFormat::Openai,
        DiscoveryFormat::Mcp,
        DiscoveryFormat::Toolbox,
        DiscoveryFormat::Capabilities,
    ];

    /// Parses a format name as callers write it.
    pub fn parse(name: &str) -> Option<DiscoveryFormat> {
        DiscoveryFormat::ALL.into_iter().find(|format| format.as_str() == name)
    }

    /// The format's name.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoveryFormat::Native => "native",
            DiscoveryFormat::Openai => "openai",
            DiscoveryFormat::Mcp => "mcp",
            DiscoveryFormat::Toolbox => "toolbox",
            DiscoveryFormat::Capabilities => "capabilities",
        }
    }
}

impl ToolDescription {
    /// This tool in `format`; `requests_topic` and `results_topic` feed capability records.
    pub fn export(&self, format: DiscoveryFormat, requests_topic: &str, results_topic: &str) -> Value {
        match format {
            // Serialising a struct of strings and values cannot fail.
            DiscoveryFormat::Native => serde_json::to_value(self).unwrap_or(Value::Null),
            DiscoveryFormat::Openai => self.openai(),
            DiscoveryFormat::Mcp => json!({
                "name": self.name,
                "description": self.description,
                "inputSchema": self.argument_schema,
                "outputSchema": self.output_schema,
                "annotations": {
                    "readOnlyHint": self.annotations.read_only,
                    "idempotentHint": self.annotations.idempotent,
                    "destructiveHint": self.annotations.destructive,
                },
            }),
            DiscoveryFormat::Toolbox => json!({
                "name": self.name,
                "description": self.description,
                "argument_schema": self.argument_schema,
                "output_schema": self.output_schema,
            }),
            DiscoveryFormat::Capabilities => json!({
                "task_name": self.name,
                "description": self.description,
                "consumed_event": {
                    "event_name": self.consumed_event,
                    "topic": requests_topic,
                    "payload_schema": self.argument_schema,
                },
                "produced_events": [{
                    "event_name": self.produced_event,
                    "topic": results_topic,
                    "payload_schema": self.output_schema,
                }],
            }),
        }
    }

    /// The OpenAI function tool, strict-ready where the schema allows it.
    fn openai(&self) -> Value {
        let (parameters, strict) = match strict_parameters(&self.argument_schema) {
            Some(parameters) => (parameters, true),
            None => (self.argument_schema.clone(), false),
        };
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
                "strict": strict,
            },
        })
    }
}

/// Rewrites an argument schema the way OpenAI strict mode needs it, or `None` where it cannot.
///
/// Strict mode wants every property listed in `required` and every object closed. An optional
/// argument therefore becomes nullable and required; the daemon treats `null` for an optional
/// argument as absent before validating, so the meaning is unchanged. A root that is not a plain
/// object, or an object that allows extra properties, cannot be made strict.
pub fn strict_parameters(schema: &Value) -> Option<Value> {
    let object = schema.as_object()?;
    if object.get("type").and_then(Value::as_str) != Some("object") || object.contains_key("anyOf") {
        return None;
    }
    strict_schema(schema)
}

fn strict_schema(schema: &Value) -> Option<Value> {
    let Some(object) = schema.as_object() else {
        // `true`/`false` schemas are not accepted in strict mode.
        return None;
    };
    let mut out = object.clone();
    if let Some(properties) = object.get("properties").and_then(Value::as_object) {
        if !matches!(object.get("additionalProperties"), None | Some(Value::Bool(false))) {
            return None;
        }
        let required: Vec<&str> = object
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut new_properties = Map::new();
        for (name, property) in properties {
            let property = strict_schema(property)?;
            let property = if required.contains(&name.as_str()) { property } else { nullable(property) };
            new_properties.insert(name.clone(), property);
        }
        out.insert("required".into(), Value::Array(properties.keys().cloned().map(Value::String).collect()));
        out.insert("properties".into(), Value::Object(new_properties));
        out.insert("additionalProperties".into(), Value::Bool(false));
    } else if object.get("type").and_then(Value::as_str) == Some("object") {
        if !matches!(object.get("additionalProperties"), None | Some(Value::Bool(false))) {
            return None;
        }
        out.insert("properties".into(), json!({}));
        out.insert("required".into(), json!([]));
        out.insert("additionalProperties".into(), Value::Bool(false));
    }
    if let Some(items) = object.get("items") {
        out.insert("items".into(), strict_schema(items)?);
    }
    for key in ["anyOf", "$defs", "definitions"] {
        if let Some(value) = object.get(key) {
            out.insert(key.into(), strict_each(value)?);
        }
    }
    Some(Value::Object(out))
}

fn strict_each(value: &Value) -> Option<Value> {
    match value {
        Value::Array(schemas) => {
            schemas.iter().map(strict_schema).collect::<Option<Vec<_>>>().map(Value::Array)
        }
        Value::Object(schemas) => schemas
            .iter()
            .map(|(name, schema)| Some((name.clone(), strict_schema(schema)?)))
            .collect::<Option<Map<_, _>>>()
            .map(Value::Object),
        _ => None,
    }
}

fn nullable(mut schema: Value) -> Value {
    let Some(object) = schema.as_object_mut() else { return schema };
    match object.get_mut("type") {
        Some(Value::String(kind)) => {
            let kind = std::mem::take(kind);
            object.insert("type".into(), json!([kind, "null"]));
        }
        Some(Value::Array(kinds)) => {
            if !kinds.contains(&json!("null")) {
                kinds.push(json!("null"));
            }
        }
        _ => return json!({"anyOf": [schema, {"type": "null"}]}),
    }
    if let Some(Value::Array(values)) = object.get_mut("enum")
        && !values.contains(&Value::Null)
    {
        values.push(Value::Null);
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo() -> ToolDescription {
        ToolDescription {
            name: "echo".into(),
            description: "Returns its message.".into(),
            argument_schema: json!({"type": "object", "properties": {"message": {"type": "string"}},
                                    "required": ["message"], "additionalProperties": false}),
            output_schema: json!({"type": "object", "properties": {"message": {"type": "string"}}}),
            consumed_event: "echo.requested".into(),
            produced_event: "echo.completed".into(),
            annotations: Annotations { read_only: true, idempotent: true, destructive: false },
            timeout_ms: 1000,
            long_running: false,
            hash: "abc".into(),
        }
    }

    #[test]
    fn formats_have_their_shapes() {
        let tool = echo();
        assert_eq!(
            tool.export(DiscoveryFormat::Openai, "action-requests", "action-results"),
            json!({"type": "function", "function": {"name": "echo", "description": "Returns its message.",
                   "parameters": tool.argument_schema, "strict": true}})
        );
        assert_eq!(
            tool.export(DiscoveryFormat::Mcp, "a", "b"),
            json!({"name": "echo", "description": "Returns its message.", "inputSchema": tool.argument_schema,
                   "outputSchema": tool.output_schema,
                   "annotations": {"readOnlyHint": true, "idempotentHint": true, "destructiveHint": false}})
        );
        assert_eq!(
            tool.export(DiscoveryFormat::Capabilities, "action-requests", "action-results"),
            json!({"task_name": "echo", "description": "Returns its message.",
                   "consumed_event": {"event_name": "echo.requested", "topic": "action-requests",
                                      "payload_schema": tool.argument_schema},
                   "produced_events": [{"event_name": "echo.completed", "topic": "action-results",
                                        "payload_schema": tool.output_schema}]})
        );
        let native = tool.export(DiscoveryFormat::Native, "a", "b");
        assert_eq!(serde_json::from_value::<ToolDescription>(native).unwrap(), tool);
    }

    #[test]
    fn optional_arguments_become_nullable_and_required() {
        let schema = json!({"type": "object", "properties": {
            "command": {"type": "string"}, "cwd": {"type": "string"},
            "level": {"enum": ["a", "b"], "type": "string"}, "any": {"description": "x"},
            "inner": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            "required": ["command"]});
        let strict = strict_parameters(&schema).unwrap();
        assert_eq!(
            strict,
            json!({"type": "object", "additionalProperties": false,
                   "required": ["any", "command", "cwd", "inner", "level"],
                   "properties": {
                       "command": {"type": "string"},
                       "cwd": {"type": ["string", "null"]},
                       "level": {"enum": ["a", "b", null], "type": ["string", "null"]},
                       "any": {"anyOf": [{"description": "x"}, {"type": "null"}]},
                       "inner": {"type": ["object", "null"], "additionalProperties": false,
                                 "required": ["x"], "properties": {"x": {"type": ["integer", "null"]}}}}})
        );
    }

    #[test]
    fn open_objects_and_root_unions_are_not_strict() {
        let open =
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true});
        assert_eq!(strict_parameters(&open), None);
        let union = json!({"type": "object", "anyOf": [{"required": ["a"]}]});
        assert_eq!(strict_parameters(&union), None);
        let mut tool = echo();
        tool.argument_schema = open.clone();
        assert_eq!(
            tool.export(DiscoveryFormat::Openai, "a", "b")["function"],
            json!({"name": "echo", "description": "Returns its message.", "parameters": open, "strict": false})
        );
    }

    #[test]
    fn format_names_parse() {
        for format in DiscoveryFormat::ALL {
            assert_eq!(DiscoveryFormat::parse(format.as_str()), Some(format));
        }
        assert_eq!(DiscoveryFormat::parse("yaml"), None);
    }
}
