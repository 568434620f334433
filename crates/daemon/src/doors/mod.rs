//! The doors calls come in by.
//!
//! - [`requests`]: `action-requests`, answered with result envelopes on the caller's response
//!   topic.
//! - [`chat`]: the agent inbox `chat:<AGENT_NAME>`, answered with chat replies.
//! - [`mcp`]: MCP clients over stdio (`toolhost mcp`) and streamable HTTP (`[mcp] listen`),
//!   served the whole fleet's tools through the fleet client.
//! - [`ovos`]: the OpenVoiceOS messagebus (`[ovos] url`), where toolhost answers as a `ToolBox`
//!   with the whole fleet's tools.
//! - [`console`]: the web console (`[console] listen`), where operators see the fleet, call a
//!   tool from a form, follow calls and replay dead letters.
//!
//! The two stream doors read a consumer group and implement [`crate::call::Door`], which the
//! call lifecycle drives. A door that speaks another protocol (MCP, a message bus) is a client of
//! the fleet: it turns its protocol's calls into requests on the requests stream, so they get
//! the same lifecycle on whichever toolbox hosts the tool.
//!
//! Each door owns its settings: a `settings.rs` in its folder. A door sees its settings and
//! the [`DoorContext`] `serve` hands it, never the whole configuration: adding a door that is a
//! client of the fleet is its folder, its line in [`fleet_doors!`] (which gathers the sections
//! into [`DoorSections`] and starts the doors), and its section. The stream doors' settings are
//! read from the shared sections (`[streams]`, `[dispatch]`, `[daemon]`) by `config`, and
//! `serve` runs their consumer groups.

pub(crate) mod chat;
pub(crate) mod console;
pub(crate) mod mcp;
pub(crate) mod ovos;
pub(crate) mod requests;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use toolhost_bus::{Bus, Keys};
use toolhost_settings::{EnvVars, KeyError};

use tokio::sync::Semaphore;

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
            requests_topic: self.requests_stream.clone(),
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

/// The list of doors that are clients of the fleet: one line each, its section's key and its
/// settings type (a [`FleetDoor`] in its folder). It makes [`DoorSections`].
macro_rules! fleet_doors {
    ($($(#[$doc:meta])* $name:ident: $settings:ty,)*) => {
        /// The configuration sections the fleet doors own, one field per door, each defined in
        /// the door's folder. They are read apart from the rest of the configuration.
        #[derive(Debug, Clone, Default, Deserialize, Serialize)]
        #[serde(deny_unknown_fields)]
        pub struct DoorSections {
            $($(#[$doc])* #[serde(default)] pub $name: $settings,)*
        }

        impl DoorSections {
            /// The top-level keys of the sections, as written in the configuration.
            pub const NAMES: &[&str] = &[$(stringify!($name)),*];

            /// Every bad key of every door's section.
            pub(crate) fn validate(&self, checks: &Checks<'_>) -> Vec<KeyError> {
                let mut errors = Vec::new();
                $(errors.extend(FleetDoor::validate(&self.$name, checks));)*
                errors
            }

            /// Starts every configured door.
            ///
            /// # Errors
            /// A door cannot start; the message names it.
            pub(crate) async fn start(&self, cx: &DoorContext) -> anyhow::Result<Vec<JoinHandle<()>>> {
                let mut running = Vec::new();
                $(running.extend(FleetDoor::start(&self.$name, cx).await?);)*
                Ok(running)
            }
        }
    };
}

fleet_doors! {
    /// `[console]`: the web console (and the call log it reads).
    console: console::Settings,
    /// `[mcp]`: the MCP door.
    mcp: mcp::Settings,
    /// `[ovos]`: the OpenVoiceOS door (and the OVOS tool source's keys).
    ovos: ovos::Settings,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_names_are_the_fields() {
        let written = serde_json::to_value(DoorSections::default()).unwrap();
        let fields: Vec<&str> = written.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(fields, DoorSections::NAMES);
    }
}
