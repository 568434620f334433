//! A server's resources, resource templates and prompts: listed when the source connects and
//! again after `notifications/resources/list_changed` or `notifications/prompts/list_changed`,
//! kept beside its tools so the toolbox publishes them ([`crate::McpSources::catalog`]).
//!
//! A resource's URI and a template's `uriTemplate` stay as the server wrote them; a prompt's
//! name takes the source's prefix (`<prefix><name>`, no other change, since prompt names are
//! not bound to the tool name alphabet). Every other field is the server's own.

use std::time::Duration;

use rmcp::{Peer, RoleClient};
use serde::Serialize;
use serde_json::Value;

/// How long listing one kind (every page) may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// One server's resources, resource templates and prompts, as MCP objects.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Catalog {
    /// `resources/list`'s `Resource` objects, every page.
    pub resources: Vec<Value>,
    /// `resources/templates/list`'s `ResourceTemplate` objects, every page.
    pub templates: Vec<Value>,
    /// `prompts/list`'s `Prompt` objects, every page, named `<prefix><name>`.
    pub prompts: Vec<Value>,
}

impl Catalog {
    /// Whether the server lists nothing.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.templates.is_empty() && self.prompts.is_empty()
    }

    /// The catalog's entries keyed as the toolbox publishes them: `resource:<uri>`,
    /// `template:<uriTemplate>`, `prompt:<prefixed name>`, each with its MCP object. An entry
    /// without its key field is left out.
    pub fn entries(&self) -> Vec<(String, Value)> {
        let keyed = |kind: &str, field: &str, items: &[Value]| -> Vec<(String, Value)> {
            items
                .iter()
                .filter_map(|item| {
                    let key = item.get(field)?.as_str()?;
                    Some((format!("{kind}:{key}"), item.clone()))
                })
                .collect()
        };
        let mut entries = keyed("resource", "uri", &self.resources);
        entries.extend(keyed("template", "uriTemplate", &self.templates));
        entries.extend(keyed("prompt", "name", &self.prompts));
        entries
    }
}

/// Lists what the server's capabilities say it has. A kind the server does not declare stays
/// empty; a kind whose listing fails stays empty too, with the failure in the returned notes,
/// so that a broken `prompts/list` never takes the server's tools down.
pub(crate) async fn list(peer: &Peer<RoleClient>, prefix: &str) -> (Catalog, Vec<String>) {
    let capabilities = peer.peer_info().map(|info| info.capabilities.clone()).unwrap_or_default();
    let mut catalog = Catalog::default();
    let mut failures = Vec::new();
    if capabilities.resources.is_some() {
        match listed("resources/list", peer.list_all_resources()).await {
            Ok(resources) => catalog.resources = resources,
            Err(failure) => failures.push(failure),
        }
        match listed("resources/templates/list", peer.list_all_resource_templates()).await {
            Ok(templates) => catalog.templates = templates,
            Err(failure) => failures.push(failure),
        }
    }
    if capabilities.prompts.is_some() {
        match listed("prompts/list", peer.list_all_prompts()).await {
            Ok(prompts) => {
                catalog.prompts = prompts.into_iter().map(|prompt| prefixed(prefix, prompt)).collect()
            }
            Err(failure) => failures.push(failure),
        }
    }
    (catalog, failures)
}

/// A listing's items as JSON, or why it failed.
async fn listed<T: Serialize>(
    method: &str,
    listing: impl Future<Output = Result<Vec<T>, rmcp::service::ServiceError>>,
) -> Result<Vec<Value>, String> {
    match tokio::time::timeout(LIST_TIMEOUT, listing).await {
        Ok(Ok(items)) => items
            .iter()
            .map(|item| serde_json::to_value(item).map_err(|err| format!("{method}: {err}")))
            .collect(),
        Ok(Err(err)) => Err(format!("{method} failed: {err}")),
        Err(_elapsed) => Err(format!("{method} did not answer within {LIST_TIMEOUT:?}")),
    }
}

/// A prompt as JSON, its name prefixed.
fn prefixed(prefix: &str, prompt: Value) -> Value {
    let mut prompt = prompt;
    if let Some(name) = prompt.get("name").and_then(Value::as_str) {
        let name = format!("{prefix}{name}");
        prompt["name"] = Value::String(name);
    }
    prompt
}

/// The original name of `name`, a prompt of a source with `prefix`, if it is one of its names.
pub fn original_prompt_name<'a>(prefix: &str, name: &'a str) -> Option<&'a str> {
    name.strip_prefix(prefix)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn entries_are_keyed_by_uri_template_and_prefixed_name_and_keep_the_servers_fields() {
        let catalog = Catalog {
            resources: vec![
                json!({"uri": "test://static-text", "name": "text", "mimeType": "text/plain", "_meta": {"k": 1}}),
                json!({"name": "no uri"}),
            ],
            templates: vec![json!({"uriTemplate": "test://item/{id}", "name": "item"})],
            prompts: vec![prefixed("ref__", json!({"name": "greet", "arguments": [{"name": "who"}]}))],
        };
        let entries = catalog.entries();
        let keys: Vec<&str> = entries.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(keys, ["resource:test://static-text", "template:test://item/{id}", "prompt:ref__greet"]);
        assert_eq!(entries[0].1["_meta"], json!({"k": 1}));
        assert_eq!(entries[2].1["arguments"], json!([{"name": "who"}]));
        assert_eq!(original_prompt_name("ref__", "ref__greet"), Some("greet"));
        assert_eq!(original_prompt_name("ref__", "other"), None);
        assert!(!catalog.is_empty());
        assert!(Catalog::default().is_empty());
    }
}
