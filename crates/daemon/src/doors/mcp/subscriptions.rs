//! The one relay of the door's change notifications.
//!
//! A client hears that the fleet's tool set changed (a toolbox started, stopped, or changed its
//! tools; the fleet client notices within `[mcp] watch_ms`) in either of two ways:
//!
//! - an `initialize` session gets `notifications/tools/list_changed` from the moment it is
//!   initialized until it closes ([`Subscriptions::follow_session`]);
//! - a 2026-07-28 client opens `subscriptions/listen` with `toolsListChanged` in its filter and
//!   gets the same notification, stamped with its subscription, for as long as the request
//!   stays open ([`Subscriptions::listen`]).
//!
//! Both read the same source, the fleet client's change counter, so they cannot disagree.
//! Resource updates come the same two ways, from one source too: an `initialize` session's
//! `resources/subscribe` and a listen stream's `resourceSubscriptions` both register with
//! [`ResourceUpdates`] (`resource_updates.rs`), which relays the fleet stream of updates.

use std::sync::Arc;
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{ErrorData as McpError, SubscriptionFilter};
use rmcp::service::{Peer, SubscriptionContext};
use tokio::sync::watch;
use tracing::debug;

use super::resource_updates::{Asker, ResourceUpdates};
use crate::fleet_client::FleetClient;

/// How often a session's watch checks that the session is still open.
const SESSION_CHECK: Duration = Duration::from_secs(60);

/// The door's source of change notifications.
pub(crate) struct Subscriptions {
    /// The fleet client's count of changes of its tool set.
    changes: watch::Receiver<u64>,
    /// Who watches which resource, and the relay of their updates.
    pub(super) resources: Arc<ResourceUpdates>,
}

impl Subscriptions {
    /// Relays the changes of `fleet`'s tools and the updates of the resources its clients
    /// subscribe to.
    pub(crate) fn new(fleet: &FleetClient) -> Subscriptions {
        Subscriptions { changes: fleet.changes(), resources: ResourceUpdates::start(fleet.clone()) }
    }

    /// Stops relaying resource updates.
    pub(crate) fn stop(&self) {
        self.resources.stop();
    }

    /// What a `subscriptions/listen` filter is granted: the tool list's changes and the
    /// resources named. Everything else asked for is left out of the acknowledgement.
    pub(crate) fn accept(requested: &SubscriptionFilter) -> SubscriptionFilter {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed.filter(|wanted| *wanted);
        accepted.resource_subscriptions =
            requested.resource_subscriptions.clone().filter(|uris| !uris.is_empty());
        accepted
    }

    /// Serves one `subscriptions/listen` stream until the client cancels it or the door stops.
    ///
    /// # Errors
    /// None today: a stream whose client has gone ends quietly.
    pub(crate) async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let tools = context.accepted().tools_list_changed == Some(true);
        let uris = context.accepted().resource_subscriptions.clone().unwrap_or_default();
        let (key, mut updates) = if uris.is_empty() {
            (None, None)
        } else {
            let (key, updates) = self.resources.subscribe_listen(&uris, Asker::default()).await?;
            (Some(key), Some(updates))
        };
        let mut changes = self.changes.clone();
        changes.borrow_and_update();
        let ended = loop {
            tokio::select! {
                () = context.cancelled() => break Ok(()),
                changed = changes.changed(), if tools => {
                    if changed.is_err() {
                        // The door is stopping: a graceful end of the stream.
                        break Ok(());
                    }
                    if let Err(err) = context.sink().notify_tool_list_changed().await {
                        debug!(error = %err, "a subscriptions/listen stream closed");
                        break Ok(());
                    }
                }
                Some(uri) = async { updates.as_mut()?.recv().await }, if updates.is_some() => {
                    if let Err(err) = context.sink().notify_resource_updated(uri).await {
                        debug!(error = %err, "a subscriptions/listen stream closed");
                        break Ok(());
                    }
                }
            }
        };
        if let Some(key) = key {
            self.resources.forget_listen(&key, &uris).await;
        }
        ended
    }

    /// Tells an `initialize` session of every change of the fleet's tools until it ends; a
    /// session that ends while the fleet stays the same is noticed within a minute.
    pub(crate) fn follow_session(&self, peer: Peer<RoleServer>) {
        let mut changes = self.changes.clone();
        tokio::spawn(async move {
            changes.borrow_and_update();
            let mut check = tokio::time::interval(SESSION_CHECK);
            loop {
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() || peer.notify_tool_list_changed().await.is_err() {
                            return;
                        }
                    }
                    _ = check.tick() => {
                        if peer.is_transport_closed() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_list_and_resources_are_granted() {
        let requested = SubscriptionFilter::builder()
            .tools_list_changed()
            .resources_list_changed()
            .resource_subscriptions(["file:///a"])
            .build();
        let accepted = Subscriptions::accept(&requested);
        assert_eq!(accepted.tools_list_changed, Some(true));
        assert_eq!(accepted.resources_list_changed, None);
        assert_eq!(accepted.resource_subscriptions, Some(vec!["file:///a".to_owned()]));
        let nothing = Subscriptions::accept(&SubscriptionFilter::builder().prompts_list_changed().build());
        assert_eq!(nothing, SubscriptionFilter::new());
    }
}
