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
//! [`refusal`] is what the two HTTP doors (MCP and console) do with the body of a request they
//! refuse.
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
pub(crate) mod context;
pub(crate) mod mcp;
pub(crate) mod ovos;
pub(crate) mod refusal;
pub(crate) mod requests;

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use toolhost_settings::KeyError;

use context::{Checks, DoorContext, FleetDoor};

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
