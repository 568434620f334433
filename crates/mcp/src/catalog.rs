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

/// What a caller asks of the server that lists a resource or prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `resources/read`: params `{"uri"}`, routed by the URI.
    ReadResource,
    /// `prompts/get`: params `{"name", "arguments"?}`, routed by the (prefixed) name.
    GetPrompt,
    /// `completion/complete`: params `{"ref", "argument", "context"?}`, routed by `ref`: a
    /// `ref/prompt`'s name or a `ref/resource`'s URI or URI template.
    Complete,
}

impl Operation {
    /// The MCP method.
    pub fn method(self) -> &'static str {
        match self {
            Operation::ReadResource => "resources/read",
            Operation::GetPrompt => "prompts/get",
            Operation::Complete => "completion/complete",
        }
    }
}

/// What an operation's params name: the resource URI or the prompt name that routes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A resource URI, or for completion a URI template.
    Resource(String),
    /// A prompt name, as listed (prefixed).
    Prompt(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Resource(uri) => write!(f, "resource '{uri}'"),
            Target::Prompt(name) => write!(f, "prompt '{name}'"),
        }
    }
}

/// The target of `operation` in `params`.
///
/// # Errors
/// A sentence naming the missing or mistyped field.
pub fn target(operation: Operation, params: &Value) -> Result<Target, String> {
    let text = |value: Option<&Value>, what: &str| -> Result<String, String> {
        match value {
            Some(Value::String(text)) if !text.is_empty() => Ok(text.clone()),
            _ => Err(format!("{} needs {what}, a non-empty string", operation.method())),
        }
    };
    match operation {
        Operation::ReadResource => text(params.get("uri"), "'uri'").map(Target::Resource),
        Operation::GetPrompt => text(params.get("name"), "'name'").map(Target::Prompt),
        Operation::Complete => {
            let reference = params.get("ref");
            match reference.and_then(|r| r.get("type")).and_then(Value::as_str) {
                Some("ref/prompt") => {
                    text(reference.and_then(|r| r.get("name")), "'ref.name'").map(Target::Prompt)
                }
                Some("ref/resource") => {
                    text(reference.and_then(|r| r.get("uri")), "'ref.uri'").map(Target::Resource)
                }
                _ => Err(format!(
                    "{} needs 'ref' with 'type' \"ref/prompt\" or \"ref/resource\"",
                    operation.method()
                )),
            }
        }
    }
}

impl Catalog {
    /// Whether this server serves `target`: a listed resource URI, a URI one of its templates
    /// matches, a template it lists (for completion), or a prompt it lists.
    pub fn serves(&self, target: &Target) -> bool {
        match target {
            Target::Resource(uri) => {
                self.resources.iter().any(|r| r["uri"].as_str() == Some(uri))
                    || self
                        .templates
                        .iter()
                        .filter_map(|t| t["uriTemplate"].as_str())
                        .any(|template| template == uri || template_matches(template, uri))
            }
            Target::Prompt(name) => self.prompts.iter().any(|p| p["name"].as_str() == Some(name)),
        }
    }
}

/// Whether `uri` is an expansion of the RFC 6570 URI template `template`.
///
/// Literal text must match exactly; an expression matches one or more characters: any
/// characters for reserved (`{+var}`) and fragment (`{#var}`) expansion and for query
/// expressions (`{?var}`, `{&var}`), else any but `/`, `?` and `#`, so that `test://item/{id}`
/// matches `test://item/7` and not `test://item/7/more`.
pub fn template_matches(template: &str, uri: &str) -> bool {
    enum Part<'a> {
        Literal(&'a str),
        Expression { any: bool },
    }
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else { return false };
        if open > 0 {
            parts.push(Part::Literal(&rest[..open]));
        }
        let any = matches!(rest[open + 1..].chars().next(), Some('+' | '#' | '?' | '&'));
        parts.push(Part::Expression { any });
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Literal(rest));
    }
    fn matches(parts: &[Part<'_>], uri: &str) -> bool {
        match parts.split_first() {
            None => uri.is_empty(),
            Some((Part::Literal(text), tail)) => {
                uri.strip_prefix(text).is_some_and(|rest| matches(tail, rest))
            }
            Some((Part::Expression { any }, tail)) => {
                for (index, character) in uri.char_indices() {
                    if !any && matches!(character, '/' | '?' | '#') {
                        break;
                    }
                    if matches(tail, &uri[index + character.len_utf8()..]) {
                        return true;
                    }
                }
                false
            }
        }
    }
    matches(&parts, uri)
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

    #[test]
    fn templates_match_their_expansions_only() {
        assert!(template_matches("test://template/{id}/data", "test://template/123/data"));
        assert!(!template_matches("test://template/{id}/data", "test://template//data"));
        assert!(!template_matches("test://template/{id}/data", "test://template/1/2/data"));
        assert!(!template_matches("test://template/{id}/data", "test://template/123/data/x"));
        assert!(template_matches("file:///{+path}", "file:///a/b/c.txt"));
        assert!(template_matches("demo://item{?page,size}", "demo://item?page=2&size=3"));
        assert!(template_matches("demo://{a}-{b}", "demo://x-y-z"));
        assert!(!template_matches("demo://{a", "demo://x"));
        assert!(template_matches("demo://plain", "demo://plain"));
    }

    #[test]
    fn targets_are_read_from_params_and_served_by_the_catalog_that_lists_them() {
        let catalog = Catalog {
            resources: vec![json!({"uri": "test://static-text", "name": "text"})],
            templates: vec![json!({"uriTemplate": "test://template/{id}/data", "name": "item"})],
            prompts: vec![json!({"name": "ref__greet"})],
        };
        let read = target(Operation::ReadResource, &json!({"uri": "test://template/9/data"})).unwrap();
        assert!(catalog.serves(&read));
        assert!(catalog.serves(&Target::Resource("test://static-text".into())));
        assert!(!catalog.serves(&Target::Resource("test://other".into())));
        let get = target(Operation::GetPrompt, &json!({"name": "ref__greet", "arguments": {}})).unwrap();
        assert_eq!(get, Target::Prompt("ref__greet".into()));
        assert!(catalog.serves(&get));
        assert!(!catalog.serves(&Target::Prompt("greet".into())));
        let complete = json!({"ref": {"type": "ref/resource", "uri": "test://template/{id}/data"},
                              "argument": {"name": "id", "value": "1"}});
        assert!(catalog.serves(&target(Operation::Complete, &complete).unwrap()));
        let prompt = json!({"ref": {"type": "ref/prompt", "name": "ref__greet"}, "argument": {"name": "who", "value": ""}});
        assert_eq!(target(Operation::Complete, &prompt).unwrap(), Target::Prompt("ref__greet".into()));
        for (operation, params, needs) in [
            (Operation::ReadResource, json!({}), "'uri'"),
            (Operation::ReadResource, json!({"uri": 7}), "'uri'"),
            (Operation::GetPrompt, json!({"name": ""}), "'name'"),
            (Operation::Complete, json!({"ref": {"type": "ref/tool"}}), "'ref'"),
            (Operation::Complete, json!({"ref": {"type": "ref/prompt"}}), "'ref.name'"),
        ] {
            let error = target(operation, &params).unwrap_err();
            assert!(error.contains(operation.method()) && error.contains(needs), "{error}");
        }
    }
}
