//! Keeps this toolbox's tool descriptions in Redis, with a heartbeat per replica.
//!
//! The registry is a hash `toolhost:registry:<toolbox_id>` (field: tool name, value: native
//! description JSON); each replica refreshes `toolhost:heartbeat:<toolbox_id>:<consumer>`, which
//! expires after three missed refreshes. A caller lists tools without a round trip to the daemon
//! and sees which replicas are alive.
//!
//! Beside it, the hash `toolhost:catalog:<toolbox_id>` holds the hosted MCP servers' resources,
//! resource templates and prompts (field `resource:<uri>`, `template:<uriTemplate>` or
//! `prompt:<name>`, value the MCP object's JSON), written when they change and with the
//! registry; it is removed with the registry when the last replica withdraws.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use toolhost_bus::{Directory, Keys};
use toolhost_envelope::DiscoveryFormat;
use toolhost_tools::SharedRegistry;
use tracing::warn;

use crate::fleet::{Fleet, Hosted};
use crate::telemetry::Telemetry;

use crate::outage::redis_warn;
use crate::shutdown::Shutdown;

/// How many heartbeats pass between two writes of the whole registry hash.
const REPUBLISH_EVERY: u64 = 12;

/// Publishes the registry and the heartbeat of one replica.
pub(crate) struct Publisher {
    pub bus: Arc<dyn Directory>,
    pub registry: Arc<SharedRegistry>,
    pub keys: Keys,
    pub toolbox_id: String,
    pub consumer: String,
    pub period: Duration,
    pub requests_topic: String,
    pub results_topic: String,
    /// The shards of the requests stream this replica reads (full keys).
    pub read_topics: Vec<String>,
    /// The chat inbox this replica reads (full key); with the requests stream, what its
    /// heartbeat lists as the streams it reads as a consumer group.
    pub inbox_topic: String,
    /// What the other replicas host, read again on every beat.
    pub fleet: Arc<Fleet>,
    pub telemetry: Telemetry,
    /// The catalog hash's fields, as [`Publisher::set_catalog`] last gave them.
    pub catalog: Mutex<Vec<(String, String)>>,
}

impl Publisher {
    fn registry_key(&self) -> String {
        self.keys.registry(&self.toolbox_id)
    }

    fn catalog_key(&self) -> String {
        self.keys.catalog(&self.toolbox_id)
    }

    /// Replaces the catalog this replica publishes (see [`Publisher::write_catalog`]).
    pub fn set_catalog(&self, fields: Vec<(String, String)>) {
        *self.catalog.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = fields;
    }

    /// Writes the catalog hash: this replica's fields, replacing the hash whole (replicas of a
    /// toolbox host the same servers; during a rolling reload the last writer's list stands
    /// until the next republish). An empty catalog deletes the hash.
    pub async fn write_catalog(&self) -> Result<(), toolhost_bus::Error> {
        let fields = self.catalog.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        if fields.is_empty() {
            return self.bus.delete(&[self.catalog_key()]).await;
        }
        self.bus.replace_hash(&self.catalog_key(), &fields).await
    }

    fn heartbeat_key(&self) -> String {
        self.keys.heartbeat(&self.toolbox_id, &self.consumer)
    }

    /// The registry hash's fields: tool name and native description JSON.
    ///
    /// One tool at a time, so the full descriptions (schemas as JSON values) never all sit in
    /// memory at once: with a thousand tools that peak would stay in the process's RSS.
    pub fn fields(&self) -> Vec<(String, String)> {
        let registry = self.registry.snapshot();
        registry
            .names()
            .into_iter()
            .filter(|name| registry.is_enabled(name))
            .filter_map(|name| {
                let description = registry.description(name)?;
                let native =
                    description.export(DiscoveryFormat::Native, &self.requests_topic, &self.results_topic);
                Some((name.to_owned(), native.to_string()))
            })
            .collect()
    }

    /// Writes the registry hash and the heartbeat once.
    ///
    /// The hash holds the tools of every live replica of this toolbox, not only this one's:
    /// replicas whose configurations differ for a while (a rolling reload) each write their own
    /// tools and keep the fields a live sibling hosts, so the listing does not flap between
    /// them. A field nobody live hosts is dropped.
    pub async fn publish_once(&self, fields: &[(String, String)]) -> Result<(), toolhost_bus::Error> {
        self.beat().await?;
        self.write_registry(fields).await?;
        self.write_catalog().await
    }

    /// Writes the registry hash: this replica's tools, and those of live siblings.
    async fn write_registry(&self, fields: &[(String, String)]) -> Result<(), toolhost_bus::Error> {
        let key = self.registry_key();
        let own: BTreeSet<&str> = fields.iter().map(|(name, _)| name.as_str()).collect();
        let mut union: Vec<(String, String)> = fields.to_vec();
        for (name, value) in self.bus.hash_fields(&key).await? {
            let sibling_hosts =
                self.fleet.hosts(&name, &self.consumer).iter().any(|host| host.toolbox_id == self.toolbox_id);
            if !own.contains(name.as_str()) && sibling_hosts {
                union.push((name, value));
            }
        }
        self.bus.replace_hash(&key, &union).await
    }

    /// Refreshes this replica's heartbeat, naming the tools it hosts, then reads every live
    /// replica's to update the fleet view. `true` when this replica was not listed in the fleet
    /// set: another reader took it for dead (it was paused past its heartbeat, or read between
    /// its heartbeat and its listing), and may have removed its toolbox's registry meanwhile.
    async fn beat(&self) -> Result<bool, toolhost_bus::Error> {
        let registry = self.registry.snapshot();
        let hosted: BTreeMap<&str, Hosted> = registry
            .enabled_names()
            .into_iter()
            .filter_map(|name| {
                let description = registry.description(name)?;
                Some((name, Hosted { event: description.consumed_event, hash: description.hash }))
            })
            .collect();
        let heartbeat = json!({
            "toolbox_id": self.toolbox_id,
            "consumer": self.consumer,
            "version": env!("CARGO_PKG_VERSION"),
            "tools": registry.names(),
            "hosted": hosted,
            "sources": self.telemetry.sources(),
            "groups": self
                .read_topics
                .iter()
                .chain([&self.inbox_topic])
                .map(|stream| json!({"stream": stream, "group": self.toolbox_id}))
                .collect::<Vec<_>>(),
            "at": toolhost_envelope::now_rfc3339(),
        });
        let key = self.heartbeat_key();
        self.bus.set_expiring(&key, &heartbeat.to_string(), self.period * 3).await?;
        let listed_anew = self.bus.add_member(&self.keys.fleet(), &key).await?;
        self.read_fleet().await?;
        Ok(listed_anew)
    }

    /// Reads every live replica's heartbeat into the fleet view; reports tools that newly have
    /// different descriptions on different toolboxes.
    async fn read_fleet(&self) -> Result<(), toolhost_bus::Error> {
        for name in self.fleet.read().await? {
            warn!(tool = %name, fleet = %self.fleet.status()["conflicts"][&name], "one tool name, different descriptions on different toolboxes");
        }
        self.telemetry.set_fleet_conflicts(self.fleet.conflicts(), self.fleet.status());
        Ok(())
    }

    /// Refreshes the heartbeat until shutdown, and every [`REPUBLISH_EVERY`] beats the registry
    /// too, in case Redis lost it. The fields are serialised again then, from the current
    /// snapshot, since a reload may have replaced it.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown) {
        let mut beats: u64 = 0;
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.period) => {}
                () = shutdown.stopping().cancelled() => return,
            }
            beats += 1;
            let res = if beats.is_multiple_of(REPUBLISH_EVERY) {
                self.publish_once(&self.fields()).await
            } else {
                // Listed anew after another reader dropped it: its registry may be gone too.
                match self.beat().await {
                    Ok(true) => match self.write_registry(&self.fields()).await {
                        Ok(()) => self.write_catalog().await,
                        Err(err) => Err(err),
                    },
                    Ok(false) => Ok(()),
                    Err(err) => Err(err),
                }
            };
            if let Err(err) = res {
                redis_warn!(&err, error = %err, "cannot refresh the registry heartbeat");
            }
        }
    }

    /// Removes this replica's heartbeat, and the registry when no other replica is alive.
    pub async fn withdraw(&self) -> Result<(), toolhost_bus::Error> {
        let key = self.heartbeat_key();
        self.bus.delete(std::slice::from_ref(&key)).await?;
        self.bus.remove_members(&self.keys.fleet(), &[key]).await?;
        let siblings = self.keys.heartbeat_prefix(&self.toolbox_id);
        let others = self.fleet.live_heartbeats().await?;
        if !others.iter().any(|(key, _)| key.starts_with(&siblings)) {
            // One key a command: on a Redis Cluster the two live in different slots.
            self.bus.delete(&[self.registry_key()]).await?;
            self.bus.delete(&[self.catalog_key()]).await?;
        }
        Ok(())
    }
}
