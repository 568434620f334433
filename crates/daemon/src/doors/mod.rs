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
//! Each door owns its configuration section: its settings type lives in its folder, and
//! [`DoorSections`] gathers them, so `config` never names a door's keys.

pub(crate) mod chat;
pub(crate) mod console;
pub(crate) mod mcp;
pub(crate) mod ovos;
pub(crate) mod requests;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use toolhost_bus::Bus;

use crate::config::{Config, KeyError, RawConfig};
use crate::telemetry::Telemetry;

/// The configuration sections the doors own, one field per door, each defined in the door's
/// folder. They are read apart from the rest of the configuration.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DoorSections {
    /// `[mcp]`: the MCP door.
    #[serde(default)]
    pub mcp: mcp::Settings,
    /// `[ovos]`: the OpenVoiceOS door (and the OVOS tool source's keys).
    #[serde(default)]
    pub ovos: ovos::Settings,
    /// `[console]`: the web console (and the call log it reads).
    #[serde(default)]
    pub console: console::Settings,
}

impl DoorSections {
    /// The top-level keys of the sections, as written in the configuration.
    pub const NAMES: &[&str] = &["console", "mcp", "ovos"];

    /// Every bad key of every door's section.
    /// `vars` is the environment secrets are read from.
    pub(crate) fn validate(
        &self,
        raw: &RawConfig,
        vars: &std::collections::HashMap<String, String>,
    ) -> Vec<KeyError> {
        let mut errors = self.mcp.validate(raw, vars);
        errors.extend(self.ovos.validate(raw));
        errors.extend(self.console.validate(vars));
        errors
    }
}

/// Starts every configured door that is a client of the fleet; each stops when `stop` is
/// cancelled, and its handle ends when it has.
///
/// # Errors
/// A door cannot start (Redis unreachable, an address taken); the message names it.
pub(crate) async fn start(
    config: &Config,
    bus: Arc<dyn Bus>,
    telemetry: &Telemetry,
    stop: &CancellationToken,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut running = Vec::new();
    running.extend(mcp::start(config, bus.clone(), stop.clone()).await?);
    running.extend(ovos::start(config, bus.clone(), telemetry, stop.clone()).await?);
    running.extend(console::start(config, bus, stop.clone()).await?);
    Ok(running)
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
