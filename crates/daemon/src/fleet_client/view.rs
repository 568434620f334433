//! The fleet's tools as a client sees them: every tool a live replica of any toolbox hosts,
//! with the description its toolbox published.
//!
//! Read from the fleet set (`toolhost:fleet`), the heartbeats it lists and the registry hashes
//! of the live toolboxes. The registries are read only when a heartbeat's hosted tools or their
//! description hashes change, so watching costs one `SMEMBERS` and one `MGET` a period.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use toolhost_bus::{Error as BusError, FleetAccess, Keys};
use toolhost_envelope::ToolDescription;

use crate::heartbeat::Heartbeat;

/// Tool name to the hash of its description and the toolboxes hosting it: what decides whether
/// the registries must be read again.
pub(crate) type Digest = BTreeMap<String, (String, BTreeSet<String>)>;

/// The fleet's tools at one reading.
#[derive(Debug, Default)]
pub(crate) struct FleetTools {
    /// What the heartbeats said.
    digest: Digest,
    /// Every hosted tool's description, by name.
    tools: BTreeMap<String, ToolDescription>,
}

impl FleetTools {
    /// The descriptions, sorted by name.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &ToolDescription> {
        self.tools.values()
    }

    /// One tool's description.
    pub(crate) fn get(&self, name: &str) -> Option<&ToolDescription> {
        self.tools.get(name)
    }

    /// How many tools the fleet hosts.
    pub(crate) fn len(&self) -> usize {
        self.tools.len()
    }
}

/// Reads the live heartbeats and what they host; expired members of the fleet set are left for
/// the replicas' publishers to remove (a client never writes the fleet set).
async fn read_digest(bus: &dyn FleetAccess, keys: &Keys) -> Result<Digest, BusError> {
    let members = bus.members(&keys.fleet()).await?;
    let values = bus.values(&members).await?;
    let mut digest = Digest::new();
    for text in values.into_iter().flatten() {
        let Some(beat) = Heartbeat::parse(&text) else { continue };
        for (name, hosted) in beat.hosted {
            let entry = digest.entry(name).or_insert_with(|| (hosted.hash.clone(), BTreeSet::new()));
            // Two toolboxes with different descriptions under one name: the smaller hash wins,
            // so every client picks the same one.
            if hosted.hash < entry.0 {
                entry.0 = hosted.hash;
            }
            entry.1.insert(beat.toolbox_id.clone());
        }
    }
    Ok(digest)
}

/// Reads the fleet's tools; `previous` is returned as it is when nothing changed.
///
/// # Errors
/// Redis failed.
pub(crate) async fn read(
    bus: &dyn FleetAccess,
    keys: &Keys,
    previous: &Arc<FleetTools>,
) -> Result<Arc<FleetTools>, BusError> {
    let digest = read_digest(bus, keys).await?;
    if digest == previous.digest {
        return Ok(previous.clone());
    }
    let toolboxes: BTreeSet<&String> = digest.values().flat_map(|(_, toolboxes)| toolboxes).collect();
    let mut tools = BTreeMap::new();
    for toolbox in toolboxes {
        for (name, json) in bus.hash_fields(&keys.registry(toolbox)).await? {
            let Some((hash, _)) = digest.get(&name) else { continue };
            let Ok(description) = serde_json::from_str::<ToolDescription>(&json) else { continue };
            // Keep the version the heartbeats chose; a registry written before its heartbeat
            // changed is read again at the next change.
            if description.hash == *hash || !tools.contains_key(&name) {
                tools.insert(name, description);
            }
        }
    }
    Ok(Arc::new(FleetTools { digest, tools }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolhost_bus::{Directory, MemoryBus};

    use super::*;

    fn description(name: &str, hash: &str) -> String {
        json!({
            "name": name, "description": "d", "argument_schema": {"type": "object"},
            "output_schema": {}, "consumed_event": format!("{name}.requested"),
            "produced_event": format!("{name}.completed"), "annotations": {}, "timeout_ms": 1000,
            "hash": hash,
        })
        .to_string()
    }

    async fn beat(bus: &MemoryBus, keys: &Keys, toolbox: &str, consumer: &str, tools: &[(&str, &str)]) {
        let hosted: serde_json::Map<String, serde_json::Value> = tools
            .iter()
            .map(|(name, hash)| (name.to_string(), json!({"event": "e", "hash": hash})))
            .collect();
        let key = keys.heartbeat(toolbox, consumer);
        let value = json!({"toolbox_id": toolbox, "consumer": consumer, "hosted": hosted}).to_string();
        bus.set_expiring(&key, &value, std::time::Duration::from_secs(60)).await.unwrap();
        bus.add_member(&keys.fleet(), &key).await.unwrap();
        let fields: Vec<(String, String)> =
            tools.iter().map(|(name, hash)| (name.to_string(), description(name, hash))).collect();
        bus.replace_hash(&keys.registry(toolbox), &fields).await.unwrap();
    }

    #[tokio::test]
    async fn the_view_lists_every_live_toolboxs_tools_and_is_kept_while_nothing_changes() {
        let bus = MemoryBus::new();
        let keys = Keys::new("");
        beat(&bus, &keys, "a", "a-1", &[("echo", "h1"), ("time", "h2")]).await;
        beat(&bus, &keys, "b", "b-1", &[("search", "h3")]).await;
        let empty = Arc::new(FleetTools::default());
        let view = read(&bus, &keys, &empty).await.unwrap();
        let names: Vec<&str> = view.iter().map(|tool| tool.name.as_str()).collect();
        assert_eq!(names, ["echo", "search", "time"]);
        let again = read(&bus, &keys, &view).await.unwrap();
        assert!(Arc::ptr_eq(&view, &again), "an unchanged fleet keeps its view");
        // A registry field that no live heartbeat hosts is not a fleet tool.
        let mut fields = bus.hash_fields(&keys.registry("b")).await.unwrap();
        fields.push(("stale".to_owned(), description("stale", "h9")));
        bus.replace_hash(&keys.registry("b"), &fields).await.unwrap();
        beat(&bus, &keys, "c", "c-1", &[("other", "h4")]).await;
        let changed = read(&bus, &keys, &view).await.unwrap();
        assert!(changed.get("other").is_some());
        assert!(changed.get("stale").is_none());
    }

    #[tokio::test]
    async fn a_dead_replica_hosts_nothing() {
        let bus = MemoryBus::new();
        let keys = Keys::new("");
        beat(&bus, &keys, "a", "a-1", &[("echo", "h1")]).await;
        bus.delete(&[keys.heartbeat("a", "a-1")]).await.unwrap();
        let view = read(&bus, &keys, &Arc::new(FleetTools::default())).await.unwrap();
        assert_eq!(view.len(), 0);
    }
}
