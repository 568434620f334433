//! Messages of the OVOS messagebus as `ovos-bus-client`'s `Message` reads and writes them: a JSON
//! object `{"type", "data", "context"}`.
//!
//! Reading follows `Message.deserialize`: a missing or empty `type` is `""` (no handler takes
//! it), and a missing or empty (`null`, `false`, `0`, `""`, `[]`) `data` or `context` is `{}`;
//! any other `data` or `context` that is not an object is refused, as `Message`'s constructor
//! refuses it. A reply follows `Message.reply`: the request's whole context, with `source` and
//! `destination` swapped when both are there.

use serde_json::{Map, Value, json};

/// One message of the bus.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BusMessage {
    /// `type`.
    pub msg_type: String,
    /// `data`.
    pub data: Map<String, Value>,
    /// `context`.
    pub context: Map<String, Value>,
}

/// Why a frame is not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Defect {
    /// Not JSON at all.
    #[error("the frame is not JSON: {0}")]
    NotJson(String),
    /// JSON, but not an object.
    #[error("the frame is JSON but not an object")]
    NotAnObject,
    /// `type` is there but not a string.
    #[error("the message's type is not a string")]
    TypeNotString,
    /// `type` is missing or empty.
    #[error("the message has no type")]
    NoType,
    /// `data` or `context` is there but not an object.
    #[error("the message's {0} is not an object")]
    NotObject(&'static str),
}

impl BusMessage {
    /// A message of `msg_type` with `data` and `context`.
    pub(crate) fn new(
        msg_type: impl Into<String>,
        data: Map<String, Value>,
        context: Map<String, Value>,
    ) -> Self {
        BusMessage { msg_type: msg_type.into(), data, context }
    }

    /// Reads one frame.
    ///
    /// # Errors
    /// The frame is not a message (see the module's rules).
    pub(crate) fn parse(frame: &[u8]) -> Result<BusMessage, Defect> {
        let value: Value = serde_json::from_slice(frame).map_err(|err| Defect::NotJson(err.to_string()))?;
        let Value::Object(mut object) = value else { return Err(Defect::NotAnObject) };
        let msg_type = match object.remove("type") {
            Some(Value::String(msg_type)) if !msg_type.is_empty() => msg_type,
            Some(value) if truthy(&value) => return Err(Defect::TypeNotString),
            _ => return Err(Defect::NoType),
        };
        let data = object_or_empty(object.remove("data"), "data")?;
        let context = object_or_empty(object.remove("context"), "context")?;
        Ok(BusMessage { msg_type, data, context })
    }

    /// The frame of the message, as `Message.serialize` writes it.
    pub(crate) fn serialize(&self) -> String {
        json!({"type": self.msg_type, "data": self.data, "context": self.context}).to_string()
    }

    /// `Message.response(data)`: a reply of type `<type>.response`.
    pub(crate) fn response(&self, data: Map<String, Value>) -> BusMessage {
        self.reply(format!("{}.response", self.msg_type), data)
    }

    /// `Message.reply(msg_type, data)`: the whole context, `destination` taken from `data` when
    /// it has one, then `source` and `destination` swapped when both are there.
    pub(crate) fn reply(&self, msg_type: String, data: Map<String, Value>) -> BusMessage {
        let mut context = self.context.clone();
        if let Some(destination) = data.get("destination") {
            context.insert("destination".to_owned(), destination.clone());
        }
        if let (Some(source), Some(destination)) = (context.get("source"), context.get("destination")) {
            let (source, destination) = (source.clone(), destination.clone());
            context.insert("source".to_owned(), destination);
            context.insert("destination".to_owned(), source);
        }
        BusMessage { msg_type, data, context }
    }
}

/// Python's truth value of a JSON value.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(flag) => *flag,
        Value::Number(number) => number.as_f64().is_some_and(|n| n != 0.0),
        Value::String(text) => !text.is_empty(),
        Value::Array(items) => !items.is_empty(),
        Value::Object(fields) => !fields.is_empty(),
    }
}

fn object_or_empty(value: Option<Value>, field: &'static str) -> Result<Map<String, Value>, Defect> {
    match value {
        Some(Value::Object(object)) => Ok(object),
        Some(other) if truthy(&other) => Err(Defect::NotObject(field)),
        _ => Ok(Map::new()),
    }
}

/// Python's name of the type of a JSON value, as `json.loads` gives it (`type(x).__name__`).
pub(crate) fn python_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(number) if number.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Python's `str()` of a JSON scalar, as an f-string prints it.
pub(crate) fn python_str(value: &Value) -> String {
    match value {
        Value::Null => "None".to_owned(),
        Value::Bool(true) => "True".to_owned(),
        Value::Bool(false) => "False".to_owned(),
        Value::String(text) => text.clone(),
        Value::Number(number) => match number.as_f64() {
            Some(float) if number.is_f64() && float.fract() == 0.0 && float.abs() < 1e16 => {
                format!("{float:.1}")
            }
            _ => number.to_string(),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn frames_are_read_as_message_deserialize_reads_them() {
        let message = BusMessage::parse(br#"{"type": "a", "data": {"x": 1}, "context": {"s": 2}}"#).unwrap();
        assert_eq!(message, BusMessage::new("a", object(json!({"x": 1})), object(json!({"s": 2}))));
        for empty in ["null", "false", "0", "\"\"", "[]", "{}"] {
            let frame = format!(r#"{{"type": "a", "data": {empty}, "context": {empty}}}"#);
            let message = BusMessage::parse(frame.as_bytes()).unwrap();
            assert!(message.data.is_empty() && message.context.is_empty(), "{frame}");
        }
        assert_eq!(BusMessage::parse(br#"{"type": "a"}"#).unwrap().data, Map::new());
        assert!(matches!(BusMessage::parse(b"not json"), Err(Defect::NotJson(_))));
        assert_eq!(BusMessage::parse(b"[1]"), Err(Defect::NotAnObject));
        assert_eq!(BusMessage::parse(br#"{"data": {}}"#), Err(Defect::NoType));
        assert_eq!(BusMessage::parse(br#"{"type": "", "data": {}}"#), Err(Defect::NoType));
        assert_eq!(BusMessage::parse(br#"{"type": 5}"#), Err(Defect::TypeNotString));
        assert_eq!(BusMessage::parse(br#"{"type": "a", "data": [1]}"#), Err(Defect::NotObject("data")));
        assert_eq!(BusMessage::parse(br#"{"type": "a", "context": "x"}"#), Err(Defect::NotObject("context")));
    }

    #[test]
    fn a_response_keeps_the_whole_context_and_swaps_source_and_destination() {
        let request = BusMessage::new(
            "q",
            Map::new(),
            object(
                json!({"source": "persona", "destination": "tools", "session": {"session_id": "s-1"}, "x": [1]}),
            ),
        );
        let reply = request.response(object(json!({"result": 1})));
        assert_eq!(reply.msg_type, "q.response");
        assert_eq!(
            Value::Object(reply.context),
            json!({"source": "tools", "destination": "persona", "session": {"session_id": "s-1"}, "x": [1]})
        );
        // Only a source: nothing to swap.
        let request = BusMessage::new("q", Map::new(), object(json!({"source": "persona"})));
        assert_eq!(Value::Object(request.response(Map::new()).context), json!({"source": "persona"}));
        let frame: Value =
            serde_json::from_str(&request.response(object(json!({"a": 1}))).serialize()).unwrap();
        assert_eq!(frame, json!({"type": "q.response", "data": {"a": 1}, "context": {"source": "persona"}}));
    }

    #[test]
    fn python_names_and_strings_of_json_values() {
        let types: Vec<&str> =
            [json!(null), json!(true), json!(1), json!(1.5), json!("s"), json!([]), json!({})]
                .iter()
                .map(python_type)
                .collect();
        assert_eq!(types, ["NoneType", "bool", "int", "float", "str", "list", "dict"]);
        let strings: Vec<String> = [json!(null), json!(false), json!(5), json!(5.0), json!(0.25), json!("n")]
            .iter()
            .map(python_str)
            .collect();
        assert_eq!(strings, ["None", "False", "5", "5.0", "0.25", "n"]);
    }
}
