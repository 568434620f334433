//! The OpenVoiceOS door: toolhost as a `ToolBox` on the OVOS messagebus.
//!
//! With `[ovos] url`, `toolhost serve` keeps a websocket connection to the bus
//! ([`crate::ovos_bus::link`]) and
//! answers what a `ToolBox` of `ovos-plugin-manager` answers ([`toolbox`]): discovery of the
//! fleet's tools and calls on both topic forms, with the reference's replies and error strings.
//! It is a client of the fleet ([`crate::fleet_client`]): a bus call becomes one request on the
//! requests stream, answered with the call lifecycle of whichever toolbox hosts the tool.
//!
//! The door owns `[ovos]` ([`Settings`]); the OVOS tool source (`crate::sources::ovos`), which
//! hosts the tools of other toolboxes on the bus, is configured in `[ovos]` too; both speak the
//! bus through [`crate::ovos_bus`].

mod settings;
mod toolbox;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tracing::info;

pub use settings::Settings;

use super::context::{Checks, DoorContext, FleetDoor};
use crate::ovos_bus::link::{self, Link, LinkEvent};
use toolbox::ToolBox;

/// How long the fleet client's private stream outlives a door that died without closing it.
const STREAM_TTL: Duration = Duration::from_secs(60);
/// How often the fleet's tools are read again.
const WATCH_PERIOD: Duration = Duration::from_secs(1);
/// The reason `/readyz` gives while the bus is not connected.
pub(crate) const NOT_CONNECTED: &str = "the OVOS messagebus is not connected";

impl FleetDoor for Settings {
    fn validate(&self, checks: &Checks<'_>) -> Vec<toolhost_settings::KeyError> {
        Settings::validate(self, checks.toolbox_id)
    }

    /// Starts the door when `[ovos] url` is set.
    async fn start(&self, cx: &DoorContext) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
        start(self, cx).await
    }
}

/// Starts the door when `[ovos] url` is set; it stops when the context's `stop` is cancelled.
///
/// # Errors
/// Redis cannot be reached.
async fn start(settings: &Settings, cx: &DoorContext) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    if !settings.enabled() {
        return Ok(None);
    }
    // Signed with the doors' key when [auth] requires signatures; bus calls are made for
    // [ovos] tenant, the bus itself having no identity.
    let fleet = cx.open_fleet("toolhost:ovos", STREAM_TTL, WATCH_PERIOD, settings.tenant()).await?;
    let stop = cx.stop.clone();
    let reporter = cx.telemetry.clone();
    let on_change: link::OnChange = Box::new(move |status| {
        let down = (!status.connected).then_some(NOT_CONNECTED);
        reporter.set_door("ovos", down, serde_json::to_value(status).unwrap_or_default());
    });
    let link_stop = stop.child_token();
    let (link, mut events) =
        Link::start("door", &settings.url, settings.max_frame_bytes, on_change, link_stop);
    let toolbox_id = cx.toolbox_id.clone();
    // Validated when the configuration was loaded.
    let tools = settings.tools.iter().filter_map(|pattern| glob::Pattern::new(pattern).ok()).collect();
    let door = Arc::new(ToolBox {
        fleet: fleet.clone(),
        link,
        call_topic: crate::ovos_bus::call_topic(&toolbox_id),
        toolbox_id,
        tools,
        call_timeout: settings.call_timeout(),
        tenant: settings.tenant(),
        permits: Arc::new(Semaphore::new(settings.max_concurrent_calls)),
        max_concurrent_calls: settings.max_concurrent_calls,
        telemetry: cx.telemetry.clone(),
    });
    info!(toolbox_id = %door.toolbox_id, tools = fleet.tools().len(), "OVOS door started");
    Ok(Some(tokio::spawn(async move {
        let mut changes = fleet.changes();
        changes.borrow_and_update();
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                event = events.recv() => match event {
                    Some(LinkEvent::Connected) => door.announce(),
                    Some(LinkEvent::Message(message)) => door.on_message(message),
                    Some(LinkEvent::Disconnected) => {}
                    None => break,
                },
                changed = changes.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    if door.link.is_connected() {
                        door.announce();
                    }
                }
            }
        }
        fleet.close().await;
    })))
}
