//! The fleet's resources, resource templates and prompts, as every live toolbox publishes them
//! in `toolhost:catalog:<toolbox_id>` (docs/CONTRACTS.md "Hosted MCP resources and prompts").
//!
//! One rule picks between toolboxes, for listing and for serving alike: a URI, template or
//! prompt name two toolboxes publish belongs to the smaller toolbox id, as the smaller hash picks
//! between two tool descriptions. The MCP door lists from here, and the requests door routes
//! `resources.read`, `prompts.get` and `completion.complete` by it.

use std::collections::{BTreeMap, BTreeSet};

use serde::de::DeserializeOwned;
use serde_json::Value;
use toolhost_bus::{Error as BusError, FleetAccess, Keys};
use toolhost_mcp::{Catalog, Target};
use tracing::warn;

use crate::heartbeat::Heartbeat;

/// Every live toolbox's published catalog fields, by toolbox id (ascending).
pub(crate) async fn published(
    bus: &dyn FleetAccess,
    keys: &Keys,
) -> Result<BTreeMap<String, Vec<(String, String)>>, BusError> {
    let members = bus.members(&keys.fleet()).await?;
    let values = bus.values(&members).await?;
    let toolboxes: BTreeSet<String> = values
        .into_iter()
        .flatten()
        .filter_map(|text| Heartbeat::parse(&text))
        .map(|b| b.toolbox_id)
        .collect();
    let mut catalogs = BTreeMap::new();
    for toolbox in toolboxes {
        let fields = bus.hash_fields(&keys.catalog(&toolbox)).await?;
        catalogs.insert(toolbox, fields);
    }
    Ok(catalogs)
}

/// The fleet's catalog fields, the smallest toolbox id's where two publish one field.
pub(crate) fn merged(published: BTreeMap<String, Vec<(String, String)>>) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    // Ascending, so the first toolbox to publish a field is the smallest id.
    for (key, value) in published.into_values().flatten() {
        fields.entry(key).or_insert(value);
    }
    fields
}

/// The objects of one kind (`resource`, `template`, `prompt`) in `fields`; one that does not
/// read as `T` is left out with a log line.
pub(crate) fn items<'a, T: DeserializeOwned>(
    fields: impl IntoIterator<Item = (&'a String, &'a String)>,
    kind: &str,
) -> Vec<T> {
    let prefix = format!("{kind}:");
    fields
        .into_iter()
        .filter(|(key, _)| key.starts_with(&prefix))
        .filter_map(|(key, value)| match serde_json::from_str(value) {
            Ok(item) => Some(item),
            Err(err) => {
                warn!(field = %key, error = %err, "a published catalog entry is not an MCP object; left out");
                None
            }
        })
        .collect()
}

/// One toolbox's published fields as a [`Catalog`].
fn catalog(fields: &[(String, String)]) -> Catalog {
    let pairs = || fields.iter().map(|(key, value)| (key, value));
    Catalog {
        resources: items::<Value>(pairs(), "resource"),
        templates: items::<Value>(pairs(), "template"),
        prompts: items::<Value>(pairs(), "prompt"),
    }
}

/// The toolbox that serves `target`: the smallest id whose published catalog lists it (a URI
/// its resources list or its templates match, a prompt name it lists).
pub(crate) fn server<'a>(
    published: &'a BTreeMap<String, Vec<(String, String)>>,
    target: &Target,
) -> Option<&'a str> {
    published.iter().find(|(_, fields)| catalog(fields).serves(target)).map(|(toolbox, _)| toolbox.as_str())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use rmcp::model::{Prompt, Resource};
    use serde_json::json;
    use toolhost_bus::{Directory, MemoryBus};

    use super::*;

    async fn beat(bus: &MemoryBus, keys: &Keys, toolbox: &str) {
        let key = keys.heartbeat(toolbox, "c1");
        let beat = json!({"toolbox_id": toolbox, "consumer": "c1", "hosted": {}});
        bus.set_expiring(&key, &beat.to_string(), Duration::from_secs(60)).await.unwrap();
        bus.add_member(&keys.fleet(), &key).await.unwrap();
    }

    fn resource(uri: &str, name: &str) -> (String, String) {
        (format!("resource:{uri}"), json!({"uri": uri, "name": name}).to_string())
    }

    #[tokio::test]
    async fn the_smaller_toolbox_id_wins_a_shared_uri_and_dead_toolboxes_list_nothing() {
        let (bus, keys) = (MemoryBus::new(), Keys::new(""));
        beat(&bus, &keys, "b").await;
        beat(&bus, &keys, "a").await;
        bus.replace_hash(
            &keys.catalog("b"),
            &[resource("test://shared", "from b"), resource("test://b", "b")],
        )
        .await
        .unwrap();
        bus.replace_hash(&keys.catalog("a"), &[resource("test://shared", "from a")]).await.unwrap();
        // Published, but no live heartbeat: not listed.
        bus.replace_hash(&keys.catalog("gone"), &[resource("test://gone", "gone")]).await.unwrap();
        let published = published(&bus, &keys).await.unwrap();
        assert_eq!(server(&published, &Target::Resource("test://shared".into())), Some("a"));
        assert_eq!(server(&published, &Target::Resource("test://b".into())), Some("b"));
        assert_eq!(server(&published, &Target::Resource("test://gone".into())), None);
        let fields = merged(published);
        let resources: Vec<Resource> = items(&fields, "resource");
        let listed: Vec<(&str, &str)> = resources.iter().map(|r| (r.uri.as_str(), r.name.as_str())).collect();
        assert_eq!(listed, [("test://b", "b"), ("test://shared", "from a")]);
        assert!(items::<Prompt>(&fields, "prompt").is_empty());
    }

    #[tokio::test]
    async fn a_template_routes_the_uris_it_matches_and_a_prompt_its_prefixed_name() {
        let (bus, keys) = (MemoryBus::new(), Keys::new(""));
        beat(&bus, &keys, "t").await;
        let template = json!({"uriTemplate": "test://template/{id}/data", "name": "item"});
        let fields = [
            ("template:test://template/{id}/data".to_owned(), template.to_string()),
            ("prompt:ref__greet".to_owned(), json!({"name": "ref__greet"}).to_string()),
        ];
        bus.replace_hash(&keys.catalog("t"), &fields).await.unwrap();
        let published = published(&bus, &keys).await.unwrap();
        assert_eq!(server(&published, &Target::Resource("test://template/7/data".into())), Some("t"));
        assert_eq!(server(&published, &Target::Resource("test://template/7/x/data".into())), None);
        assert_eq!(server(&published, &Target::Prompt("ref__greet".into())), Some("t"));
        assert_eq!(server(&published, &Target::Prompt("greet".into())), None);
    }

    #[test]
    fn an_entry_that_is_not_an_mcp_object_is_left_out() {
        let fields = BTreeMap::from([
            ("prompt:good".to_owned(), json!({"name": "good"}).to_string()),
            ("prompt:bad".to_owned(), json!({"title": "no name"}).to_string()),
        ]);
        let prompts: Vec<Prompt> = items(&fields, "prompt");
        assert_eq!(prompts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["good"]);
    }
}
