//! Keeps this toolbox's tool descriptions in Redis, with a heartbeat per replica.
//!
//! The registry is a hash `toolhost:registry:<toolbox_id>` (field: tool name, value: native
//! description JSON); each replica refreshes `toolhost:heartbeat:<toolbox_id>:<consumer>`, which
//! expires after three missed refreshes. A caller lists tools without a round trip to the daemon
//! and sees which replicas are alive.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolhost_bus::{Bus, Keys};
use toolhost_envelope::DiscoveryFormat;
use toolhost_tools::Registry;
use tracing::warn;

use crate::shutdown::Shutdown;

/// Publishes the registry and the heartbeat of one replica.
pub(crate) struct Publisher {
    pub bus: Arc<dyn Bus>,
    pub registry: Arc<Registry>,
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

    /// Writes the registry hash and the heartbeat once.
    pub async fn publish_once(&self) -> Result<(), toolhost_bus::Error> {
        let fields: Vec<(String, String)> = self
            .registry
            .export(DiscoveryFormat::Native, &self.requests_topic, &self.results_topic)
            .into_iter()
            .map(|tool| (tool["name"].as_str().unwrap_or_default().to_owned(), tool.to_string()))
            .collect();
        self.bus.replace_hash(&self.registry_key(), &fields).await?;
        self.beat().await
    }

    async fn beat(&self) -> Result<(), toolhost_bus::Error> {
        let heartbeat = json!({
            "toolbox_id": self.toolbox_id,
            "consumer": self.consumer,
            "version": env!("CARGO_PKG_VERSION"),
            "tools": self.registry.names(),
            "at": toolhost_envelope::now_rfc3339(),
        });
        self.bus.set_expiring(&self.heartbeat_key(), &heartbeat.to_string(), self.period * 3).await
    }

    /// Refreshes the heartbeat (and the registry, in case Redis lost it) until shutdown.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.period) => {}
                () = shutdown.stopping().cancelled() => return,
            }
            if let Err(err) = self.publish_once().await {
                warn!(error = %err, "cannot refresh the registry heartbeat");
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
