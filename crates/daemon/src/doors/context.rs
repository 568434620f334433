//! What a door sees: its own settings, and the context `serve` hands it ([`DoorContext`] for a
//! door that is a client of the fleet, [`StreamContext`] for a stream door), never the whole
//! configuration.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use toolhost_bus::{Bus, Keys};
use toolhost_settings::{EnvVars, KeyError};

use crate::auth::AuthHandle;
use crate::call::{Door, Lifecycle};
use crate::fleet_client::{ClientSettings, FleetClient};
use crate::group::{GroupReader, Reading};
use crate::outage::RedisPlace;
use crate::services::Services;
use crate::telemetry::Telemetry;

/// What `serve` hands every door beside its own settings: never the whole configuration.
#[derive(Clone)]
pub(crate) struct DoorContext {
    /// Redis, for the fleet client and what a door reads itself (the console).
    pub bus: Arc<dyn Bus>,
    /// The key names.
    pub keys: Keys,
    /// Bare name of the requests stream.
    pub requests_stream: String,
    /// Its shards (`[streams] shards`; one: the stream itself).
    pub shards: toolhost_bus::Shards,
    /// Bare name of the default results stream.
    pub results_stream: String,
    /// This daemon's toolbox id.
    pub toolbox_id: String,
    /// `[auth]` and `[[policy]]` as in force: the doors' signing key, the policies, the audit.
    pub auth: AuthHandle,
    /// The environment, for the secrets a door's settings name by variable (`*_env`).
    pub env: EnvVars,
    /// Metrics and readiness.
    pub telemetry: Telemetry,
    /// Cancelled when the doors are to stop (after the drain).
    pub stop: CancellationToken,
    /// Where Redis is, for messages about its failures.
    pub redis: RedisPlace,
    /// `single`, `cluster` or `sentinel`.
    pub topology: &'static str,
    /// How long an answered request id is remembered.
    pub answered_retention: Duration,
}

/// Where a door's refusals are audited.
pub(crate) struct AuditTarget {
    /// The audit stream's key.
    pub topic: String,
    /// Its approximate length cap.
    pub max_len: u64,
}

impl DoorContext {
    /// Opens the door's fleet client: its private stream (outliving a door that dies by
    /// `stream_ttl`), the fleet's tools read every `watch_period`, requests signed with the doors'
    /// key and made for `tenant`.
    ///
    /// # Errors
    /// Redis cannot be reached; the message says where it was looked for.
    pub(crate) async fn open_fleet(
        &self,
        source: &str,
        stream_ttl: Duration,
        watch_period: Duration,
        tenant: Option<String>,
    ) -> anyhow::Result<FleetClient> {
        let client = ClientSettings {
            shards: self.shards.clone(),
            source: source.to_owned(),
            stream_ttl,
            watch_period: Some(watch_period),
            signing: self.auth.load().door_key().cloned(),
            tenant,
        };
        FleetClient::open(self.bus.clone(), self.keys.clone(), client)
            .await
            .map_err(|err| anyhow::anyhow!(self.redis.failure(&err)))
    }

    /// This daemon's audit stream.
    pub(crate) fn audit(&self) -> AuditTarget {
        AuditTarget { topic: self.keys.audit(&self.toolbox_id), max_len: self.auth.load().audit_max_len() }
    }
}

/// What `serve` hands a stream door: the services every call uses, the process's one budget of
/// `max_in_flight` slots, this replica's consumer name and how a group is read.
pub(crate) struct StreamContext {
    /// What the call lifecycle uses.
    pub services: Services,
    /// The slots every door's reader takes from.
    pub budget: Arc<Semaphore>,
    /// This replica's consumer name.
    pub consumer: String,
    /// How the door's group is read.
    pub reading: Reading,
}

impl StreamContext {
    /// The reader of the stream `topic` (full key; its ledger is `ledger`, the bare name),
    /// driving `door`'s entries through the call lifecycle.
    pub(crate) fn reader<D: Door>(
        &self,
        door: D,
        ledger: &str,
        topic: String,
    ) -> Arc<GroupReader<Lifecycle<D>>> {
        let stream = self.reading.stream(topic, ledger, &self.consumer);
        let services = &self.services;
        let lifecycle = Arc::new(Lifecycle::new(door, services.clone(), stream.clone()));
        let (bus, shutdown, telemetry) =
            (services.bus.clone(), services.shutdown.clone(), services.telemetry.clone());
        Arc::new(GroupReader::new(bus, stream, lifecycle, self.budget.clone(), shutdown, telemetry))
    }
}

/// What a door's section is checked against besides itself.
pub(crate) struct Checks<'a> {
    /// The environment (secrets named by `*_env` settings must be set).
    pub vars: &'a HashMap<String, String>,
    /// This daemon's toolbox id.
    pub toolbox_id: &'a str,
}

/// A door that is a client of the fleet, as its section: checked with the rest of the
/// configuration, started by `serve` with the door context.
pub(crate) trait FleetDoor {
    /// Every bad key of the section.
    fn validate(&self, checks: &Checks<'_>) -> Vec<KeyError>;

    /// Starts the door when its section enables it; it stops when the context's `stop` is
    /// cancelled, and its handle ends when it has.
    ///
    /// # Errors
    /// The door cannot start (Redis unreachable, an address taken); the message names it.
    fn start(&self, cx: &DoorContext) -> impl Future<Output = anyhow::Result<Option<JoinHandle<()>>>> + Send;
}
