//! Catalog requests on the requests stream: `resources.list`, `resources.templates.list`,
//! `resources.read`, `prompts.list`, `prompts.get` and `completion.complete`, whose `data` is
//! MCP's params plus the reserved keys every request may carry (`request_id`, `timeout_ms`, ...).
//! The lifecycle answers them (`call/catalog.rs`).

use serde_json::{Map, Value};
use toolhost_envelope::RESERVED_DATA_KEYS;

use super::admit::Target;
use crate::call::catalog::CatalogAsk;

/// The target of a request of type `event_type`, when it is a catalog request; its params are
/// `data` without the reserved keys.
pub(super) fn target(event_type: &str, data: &Map<String, Value>) -> Option<Target> {
    let ask = CatalogAsk::of_type(event_type)?;
    let params: Map<String, Value> = data
        .iter()
        .filter(|(key, _)| !RESERVED_DATA_KEYS.contains(&key.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some(Target::Catalog { ask, params: Value::Object(params) })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;
    use toolhost_mcp::Operation;

    use super::*;

    #[test]
    fn params_are_data_without_the_reserved_keys() {
        let data =
            json!({"request_id": "r1", "timeout_ms": 500, "uri": "test://static-text", "_meta": {"k": 1}});
        let Some(Target::Catalog { ask, params }) = target("resources.read", data.as_object().unwrap())
        else {
            panic!("not a catalog request");
        };
        assert_eq!(ask, CatalogAsk::Send(Operation::ReadResource));
        assert_eq!(params, json!({"uri": "test://static-text", "_meta": {"k": 1}}));
        assert!(target("resources.readx", data.as_object().unwrap()).is_none());
    }
}
