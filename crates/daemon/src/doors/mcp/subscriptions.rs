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
//! Both read the same source, the fleet client's change counter, so they cannot disagree; other
//! kinds of update (resources) are added here, beside it.

use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{ErrorData as McpError, SubscriptionFilter};
use rmcp::service::{Peer, SubscriptionContext};
use tokio::sync::watch;
use tracing::debug;

/// How often a session's watch checks that the session is still open.
const SESSION_CHECK: Duration = Duration::from_secs(60);

/// The door's source of change notifications.
pub(crate) struct Subscriptions {
    /// The fleet client's count of changes of its tool set.
    changes: watch::Receiver<u64>,
}

impl Subscriptions {
    /// Relays the changes counted by `changes` (the fleet client's).
    pub(crate) fn new(changes: watch::Receiver<u64>) -> Subscriptions {
        Subscriptions { changes }
    }

    /// What a `subscriptions/listen` filter is granted: the tool list's changes, the only kind
    /// the door has. Everything else asked for is left out of the acknowledgement.
    pub(crate) fn accept(requested: &SubscriptionFilter) -> SubscriptionFilter {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed.filter(|wanted| *wanted);
        accepted
    }

    /// Serves one `subscriptions/listen` stream until the client cancels it or the door stops.
    ///
    /// # Errors
    /// None today: a stream whose client has gone ends quietly.
    pub(crate) async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        if context.accepted().tools_list_changed != Some(true) {
            context.cancelled().await;
            return Ok(());
        }
        let mut changes = self.changes.clone();
        changes.borrow_and_update();
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() {
                        // The door is stopping: a graceful end of the stream.
                        return Ok(());
                    }
                    if let Err(err) = context.sink().notify_tool_list_changed().await {
                        debug!(error = %err, "a subscriptions/listen stream closed");
                        return Ok(());
                    }
                }
            }
        }
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
    fn only_the_tool_list_is_granted() {
        let requested = SubscriptionFilter::builder()
            .tools_list_changed()
            .resources_list_changed()
            .resource_subscriptions(["file:///a"])
            .build();
        let accepted = Subscriptions::accept(&requested);
        assert_eq!(accepted.tools_list_changed, Some(true));
        assert_eq!(accepted.resources_list_changed, None);
        assert_eq!(accepted.resource_subscriptions, None);
        let nothing = Subscriptions::accept(&SubscriptionFilter::builder().prompts_list_changed().build());
        assert_eq!(nothing, SubscriptionFilter::new());
    }
}
