//! `resources/list`, `resources/templates/list` and `prompts/list`: the hosted MCP servers'
//! resources, resource templates and prompts, read from what every live toolbox publishes
//! (`toolhost:catalog:<toolbox_id>`, docs/CONTRACTS.md "Hosted MCP resources and prompts").
//!
//! A URI, template or prompt name two toolboxes publish is listed once, as the smaller toolbox id
//! published it, the same rule that picks which toolbox serves it. Each list is one page, sorted
//! by URI, template or name. Lists are not filtered by tenant: the tenant policy names tools.

use std::collections::{BTreeMap, BTreeSet};

use rmcp::model::{
    ErrorData as McpError, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, Prompt,
    Resource, ResourceTemplate,
};
use serde::de::DeserializeOwned;
use toolhost_bus::{Error as BusError, FleetAccess, Keys};
use tracing::warn;

use super::handler::Session;
use crate::heartbeat::Heartbeat;

/// Every live toolbox's catalog fields, the smallest toolbox id's where two publish one field.
async fn read(bus: &dyn FleetAccess, keys: &Keys) -> Result<BTreeMap<String, String>, BusError> {
    let members = bus.members(&keys.fleet()).await?;
    let values = bus.values(&members).await?;
    let toolboxes: BTreeSet<String> = values
        .into_iter()
        .flatten()
        .filter_map(|text| Heartbeat::parse(&text))
        .map(|b| b.toolbox_id)
        .collect();
    let mut fields = BTreeMap::new();
    // Ascending, so the first toolbox to publish a field is the smallest id.
    for toolbox in toolboxes {
        for (key, value) in bus.hash_fields(&keys.catalog(&toolbox)).await? {
            fields.entry(key).or_insert(value);
        }
    }
    Ok(fields)
}

/// The MCP objects of one kind (`resource`, `template`, `prompt`); one that does not read as
/// MCP's type is left out with a log line.
fn items<T: DeserializeOwned>(fields: &BTreeMap<String, String>, kind: &str) -> Vec<T> {
    let prefix = format!("{kind}:");
    fields
        .iter()
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

impl Session {
    async fn catalog_fields(&self) -> Result<BTreeMap<String, String>, McpError> {
        let fleet = &self.door.fleet;
        read(fleet.bus().as_ref(), fleet.keys()).await.map_err(|err| {
            McpError::internal_error(format!("cannot read the fleet's resources and prompts: {err}"), None)
        })
    }

    /// `resources/list`.
    pub(super) async fn list_fleet_resources(&self) -> Result<ListResourcesResult, McpError> {
        let fields = self.catalog_fields().await?;
        Ok(ListResourcesResult::with_all_items(items::<Resource>(&fields, "resource")))
    }

    /// `resources/templates/list`.
    pub(super) async fn list_fleet_resource_templates(
        &self,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let fields = self.catalog_fields().await?;
        Ok(ListResourceTemplatesResult::with_all_items(items::<ResourceTemplate>(&fields, "template")))
    }

    /// `prompts/list`.
    pub(super) async fn list_fleet_prompts(&self) -> Result<ListPromptsResult, McpError> {
        let fields = self.catalog_fields().await?;
        Ok(ListPromptsResult::with_all_items(items::<Prompt>(&fields, "prompt")))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use toolhost_bus::{Directory, MemoryBus};

    use super::*;

    async fn beat(bus: &MemoryBus, keys: &Keys, toolbox: &str) {
        let key = keys.heartbeat(toolbox, "c1");
        let beat = json!({"toolbox_id": toolbox, "consumer": "c1", "hosted": {}});
        bus.set_expiring(&key, &beat.to_string(), Duration::from_secs(60)).await.unwrap();
        bus.add_member(&keys.fleet(), &key).await.unwrap();
    }

    #[tokio::test]
    async fn the_smaller_toolbox_id_wins_a_shared_uri_and_dead_toolboxes_list_nothing() {
        let (bus, keys) = (MemoryBus::new(), Keys::new(""));
        beat(&bus, &keys, "b").await;
        beat(&bus, &keys, "a").await;
        let resource = |uri: &str, name: &str| {
            (format!("resource:{uri}"), json!({"uri": uri, "name": name}).to_string())
        };
        bus.replace_hash(
            &keys.catalog("b"),
            &[resource("test://shared", "from b"), resource("test://b", "b")],
        )
        .await
        .unwrap();
        bus.replace_hash(&keys.catalog("a"), &[resource("test://shared", "from a")]).await.unwrap();
        // Published, but no live heartbeat: not listed.
        bus.replace_hash(&keys.catalog("gone"), &[resource("test://gone", "gone")]).await.unwrap();
        let fields = read(&bus, &keys).await.unwrap();
        let resources: Vec<Resource> = items(&fields, "resource");
        let listed: Vec<(&str, &str)> = resources.iter().map(|r| (r.uri.as_str(), r.name.as_str())).collect();
        assert_eq!(listed, [("test://b", "b"), ("test://shared", "from a")]);
        assert!(items::<Prompt>(&fields, "prompt").is_empty());
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
