//! Keeps this toolbox's tool descriptions in Redis, with a heartbeat per replica.
//!
//! The registry is a hash `toolhost:registry:<toolbox_id>` (field: tool name, value: native
//! description JSON); each replica refreshes `toolhost:heartbeat:<toolbox_id>:<consumer>`, which
//! expires after three missed refreshes. A caller lists tools without a round trip to the daemon
//! and sees which replicas are alive.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolhost_bus::{Keys, Store};
use toolhost_envelope::DiscoveryFormat;
use toolhost_tools::SharedRegistry;

use crate::outage::redis_warn;
use crate::shutdown::Shutdown;

/// How many heartbeats pass between two writes of the whole registry hash.
const REPUBLISH_EVERY: u64 = 12;

/// Publishes the registry and the heartbeat of one replica.
pub(crate) struct Publisher {
    pub bus: Arc<dyn Store>,
    pub registry: Arc<SharedRegistry>,
    pub keys: Keys,
    pub toolbox_id: String,
    pub consumer: String,
    pub period: Duration,
    pub requests_topic: String,
    pub results_topic: String,
}

impl Publisher {
    fn registry_key(&self) -> String {
        self.keys.registry(&self.toolbox_id)
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

    /// Writes the registry hash (`fields`) and the heartbeat once.
    pub async fn publish_once(&self, fields: &[(String, String)]) -> Result<(), toolhost_bus::Error> {
        self.bus.replace_hash(&self.registry_key(), fields).await?;
        self.beat().await
    }

    async fn beat(&self) -> Result<(), toolhost_bus::Error> {
        let heartbeat = json!({
            "toolbox_id": self.toolbox_id,
            "consumer": self.consumer,
            "version": env!("CARGO_PKG_VERSION"),
            "tools": self.registry.snapshot().names(),
            "at": toolhost_envelope::now_rfc3339(),
        });
        self.bus.set_expiring(&self.heartbeat_key(), &heartbeat.to_string(), self.period * 3).await
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
                self.beat().await
            };
            if let Err(err) = res {
                redis_warn!(&err, error = %err, "cannot refresh the registry heartbeat");
            }
        }
    }

    /// Removes this replica's heartbeat, and the registry when no other replica is alive.
    pub async fn withdraw(&self) -> Result<(), toolhost_bus::Error> {
        self.bus.delete(&[self.heartbeat_key()]).await?;
        let others = self.bus.keys_matching(&self.keys.heartbeat_pattern(&self.toolbox_id)).await?;
        if others.is_empty() {
            self.bus.delete(&[self.registry_key()]).await?;
        }
        Ok(())
    }
}
