//! How a source opens its session (`[[mcp_servers]] protocol`), and what a 2026-07-28 session
//! needs that an `initialize` one gets by itself.
//!
//! A 2026-07-28 server sends `list_changed` and resource updates only on a
//! `subscriptions/listen` stream, never as plain notifications, so a source that negotiated it
//! opens one stream for the tool, resource and prompt lists when it connects and feeds what
//! comes to the same channels the `initialize` generations' notifications feed. Resource
//! subscriptions of such a server are not relayed (`resources/subscribe` is removed there; a
//! stream per URI is not built), and its log messages need a per-request opt-in toolhost does
//! not send.

use rmcp::model::{ProtocolVersion, ServerNotification, SubscriptionFilter};
use rmcp::service::{ClientInitializeError, ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::transport::IntoTransport;
use rmcp::{Peer, RoleClient};
use tokio::sync::mpsc;

use crate::config::Protocol;
use crate::source::{Handler, McpEvent};

impl Handler {
    /// Opens the session over `transport` as `protocol` says.
    pub(crate) async fn open<T, E, A>(
        self,
        transport: T,
        protocol: Protocol,
    ) -> Result<RunningService<RoleClient, Handler>, ClientInitializeError>
    where
        T: IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let modern = vec![ProtocolVersion::V_2026_07_28];
        let mode = match protocol {
            Protocol::Legacy => ClientLifecycleMode::Initialize,
            Protocol::Auto => ClientLifecycleMode::Auto {
                preferred_versions: modern,
                legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
            },
            Protocol::Modern => ClientLifecycleMode::Discover { preferred_versions: modern },
        };
        self.serve_with_lifecycle(transport, mode).await
    }
}

/// Whether the session speaks 2026-07-28 (or later).
pub(crate) fn is_modern(peer: &Peer<RoleClient>) -> bool {
    peer.peer_info().is_some_and(|info| info.protocol_version >= ProtocolVersion::V_2026_07_28)
}

/// Where a 2026-07-28 session's stream of list changes goes: the channels the `initialize`
/// generations' notifications feed.
pub(crate) struct Listeners {
    pub changed: mpsc::Sender<()>,
    pub catalog_changed: mpsc::Sender<()>,
    pub events: mpsc::UnboundedSender<McpEvent>,
    pub source: String,
}

/// On a 2026-07-28 session, opens `subscriptions/listen` for the lists the server declares it
/// changes and relays its notifications until the stream or the session ends. Returns how it
/// opened (`Err` with why not; nothing to listen for is `Ok(false)`).
pub(crate) async fn listen(peer: &Peer<RoleClient>, to: Listeners) -> Result<bool, String> {
    let capabilities = peer.peer_info().map(|info| info.capabilities.clone()).unwrap_or_default();
    let mut filter = SubscriptionFilter::new();
    if capabilities.tools.as_ref().and_then(|tools| tools.list_changed) == Some(true) {
        filter.tools_list_changed = Some(true);
    }
    if capabilities.resources.as_ref().and_then(|resources| resources.list_changed) == Some(true) {
        filter.resources_list_changed = Some(true);
    }
    if capabilities.prompts.as_ref().and_then(|prompts| prompts.list_changed) == Some(true) {
        filter.prompts_list_changed = Some(true);
    }
    if filter == SubscriptionFilter::new() {
        return Ok(false);
    }
    let mut subscription = peer.listen(filter).await.map_err(|err| err.to_string())?;
    tokio::spawn(async move {
        loop {
            match subscription.next().await {
                Ok(Some(ServerNotification::ToolListChangedNotification(_))) => {
                    let _ = to.changed.try_send(());
                }
                Ok(Some(
                    ServerNotification::ResourceListChangedNotification(_)
                    | ServerNotification::PromptListChangedNotification(_),
                )) => {
                    let _ = to.catalog_changed.try_send(());
                }
                Ok(Some(ServerNotification::ResourceUpdatedNotification(updated))) => {
                    let uri = updated.params.uri;
                    let _ = to.events.send(McpEvent::ResourceUpdated { source: to.source.clone(), uri });
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    });
    Ok(true)
}
