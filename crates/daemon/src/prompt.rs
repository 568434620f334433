//! `toolhost call`'s answers to a call's questions (docs/CONTRACTS.md, "Input from the
//! caller"): an elicitation is asked on the terminal, one line per field of its
//! `requestedSchema`; a sampling request, or any question while stdin is not a terminal, is
//! declined.
//!
//! Blank input takes the field's `default`; a blank required field without one, or end of input
//! (Ctrl-D), declines the whole form.

use std::io::{BufRead, IsTerminal, Write};

use serde_json::{Map, Value, json};

use crate::fleet_client::InputKind;

/// The response to a question of `kind`, `request` being `{"method", "params"}`: a form filled
/// in on the terminal, else a decline. Blocks on stdin: run it off the async workers.
pub(crate) fn answer(kind: InputKind, request: &Value) -> Value {
    let stdin = std::io::stdin();
    if kind != InputKind::Elicitation || !stdin.is_terminal() {
        return declined(kind);
    }
    let params = request.get("params").cloned().unwrap_or(Value::Null);
    let mut lines = stdin.lock();
    let mut stderr = std::io::stderr();
    fill(&params, &mut lines, &mut stderr).unwrap_or_else(|| declined(kind))
}

/// The answer that declines a question of `kind`.
pub(crate) fn declined(kind: InputKind) -> Value {
    match kind {
        InputKind::Elicitation => json!({"action": "decline"}),
        InputKind::Sampling => {
            json!({"error": {"code": -1, "message": "toolhost call does not sample; declined"}})
        }
    }
}

/// Asks for each field of the form `params` describes on `out`, reading answers from `input`;
/// the accepted `ElicitResult`, or `None` to decline.
fn fill(params: &Value, input: &mut impl BufRead, out: &mut impl Write) -> Option<Value> {
    let message = params.get("message").and_then(Value::as_str).unwrap_or("the tool asks for input");
    let _ = writeln!(out, "toolhost: {message}");
    let schema = params.get("requestedSchema").cloned().unwrap_or_else(|| json!({}));
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let empty = Map::new();
    let properties = schema.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let mut content = Map::new();
    for (name, field) in properties {
        let is_required = required.contains(&name.as_str());
        loop {
            let _ = write!(out, "  {}: ", label(name, field, is_required));
            let _ = out.flush();
            let mut line = String::new();
            if input.read_line(&mut line).ok()? == 0 {
                let _ = writeln!(out);
                return None;
            }
            match value(field, line.trim()) {
                Ok(Some(value)) => {
                    content.insert(name.clone(), value);
                    break;
                }
                Ok(None) if !is_required => break,
                Ok(None) => return None,
                Err(why) => {
                    let _ = writeln!(out, "  {why}; try again");
                }
            }
        }
    }
    Some(json!({"action": "accept", "content": content}))
}

/// How a field is asked: its title or name, type, choices, default and whether it is required.
fn label(name: &str, field: &Value, required: bool) -> String {
    let title = field.get("title").and_then(Value::as_str).unwrap_or(name);
    let kind = field.get("type").and_then(Value::as_str).unwrap_or("string");
    let mut label = format!("{title} ({kind}");
    if let Some(choices) = choices(field) {
        label.push_str(&format!(": {}", choices.join(" | ")));
    }
    label.push(')');
    if let Some(default) = field.get("default") {
        label.push_str(&format!(" [{default}]"));
    }
    if required {
        label.push_str(" *");
    }
    label
}

/// A field's allowed values: `enum`, or the `const`s of `oneOf`/`anyOf` (SEP-1330).
fn choices(field: &Value) -> Option<Vec<String>> {
    let text = |value: &Value| value.as_str().map_or_else(|| value.to_string(), str::to_owned);
    if let Some(values) = field.get("enum").and_then(Value::as_array) {
        return Some(values.iter().map(text).collect());
    }
    let options = field.get("oneOf").or_else(|| field.get("anyOf")).and_then(Value::as_array)?;
    Some(options.iter().filter_map(|option| option.get("const")).map(text).collect())
}

/// The value typed for `field`: `None` for a blank line (its `default` when it has one).
///
/// # Errors
/// A sentence when the text is not of the field's type.
fn value(field: &Value, text: &str) -> Result<Option<Value>, String> {
    if text.is_empty() {
        return Ok(field.get("default").cloned());
    }
    let kind = field.get("type").and_then(Value::as_str).unwrap_or("string");
    let value = match kind {
        "integer" => {
            text.parse::<i64>().map(Value::from).map_err(|_| format!("'{text}' is not an integer"))?
        }
        "number" => text.parse::<f64>().map(Value::from).map_err(|_| format!("'{text}' is not a number"))?,
        "boolean" => match text {
            "y" | "yes" | "true" => Value::Bool(true),
            "n" | "no" | "false" => Value::Bool(false),
            _ => return Err(format!("'{text}' is not yes or no")),
        },
        "array" => Value::Array(text.split(',').map(|item| Value::String(item.trim().to_owned())).collect()),
        _ => Value::String(text.to_owned()),
    };
    Ok(Some(value))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn filled(params: Value, typed: &str) -> (Option<Value>, String) {
        let mut out = Vec::new();
        let answer = fill(&params, &mut typed.as_bytes(), &mut out);
        (answer, String::from_utf8(out).unwrap())
    }

    #[test]
    fn a_form_is_filled_field_by_field_with_defaults_types_and_retries() {
        let params = json!({"message": "Who are you?", "requestedSchema": {"type": "object",
            "properties": {
                "age": {"type": "integer"},
                "name": {"type": "string", "title": "Your name"},
                "role": {"type": "string", "enum": ["dev", "ops"], "default": "dev"},
                "subscribe": {"type": "boolean"}
            },
            "required": ["name", "age"]}});
        let (answer, shown) = filled(params, "old\n42\nAda\n\nyes\n");
        assert_eq!(
            answer,
            Some(
                json!({"action": "accept", "content": {"age": 42, "name": "Ada", "role": "dev", "subscribe": true}})
            )
        );
        assert!(shown.contains("Who are you?"), "{shown}");
        assert!(shown.contains("'old' is not an integer; try again"), "{shown}");
        assert!(shown.contains("role (string: dev | ops) [\"dev\"]"), "{shown}");
        assert!(shown.contains("Your name (string) *"), "{shown}");
    }

    #[test]
    fn end_of_input_or_a_blank_required_field_declines() {
        let params = json!({"message": "m", "requestedSchema": {"type": "object",
            "properties": {"name": {"type": "string"}}, "required": ["name"]}});
        assert_eq!(filled(params.clone(), "").0, None);
        assert_eq!(filled(params, "\n").0, None);
        assert_eq!(declined(InputKind::Elicitation), json!({"action": "decline"}));
        assert_eq!(declined(InputKind::Sampling)["error"]["code"], -1);
    }
}
