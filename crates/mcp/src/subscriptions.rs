//! Resource subscriptions of the `initialize` generations: toolhost subscribes to a hosted
//! server's resource (`resources/subscribe`) while someone wants its updates, and the server's
//! `notifications/resources/updated` become [`crate::McpEvent::ResourceUpdated`].
//!
//! A source keeps the URIs it is subscribed to and subscribes to them again on every new
//! connection, so a restarted server keeps sending the updates. A server that does not declare
//! `resources.subscribe` is never asked.

use std::time::Duration;

use rmcp::model::{SubscribeRequestParams, UnsubscribeRequestParams};
use rmcp::{Peer, RoleClient};
use toolhost_tools::ToolError;

use crate::mapping;
use crate::source::Shared;

/// How long a subscribe or unsubscribe may take.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the server declares resource subscriptions.
fn offers_subscriptions(peer: &Peer<RoleClient>) -> bool {
    peer.peer_info()
        .and_then(|info| info.capabilities.resources.as_ref().and_then(|resources| resources.subscribe))
        .unwrap_or(false)
}

impl Shared {
    /// Subscribes to `uri` at the server, and keeps it subscribed across reconnections.
    ///
    /// # Errors
    /// The server is down (`Unavailable`), does not offer subscriptions or refuses the URI
    /// (`InvalidArguments`), does not answer in time (`Timeout`), or fails (`Failed`).
    #[allow(deprecated)]
    pub(crate) async fn subscribe(&self, uri: &str) -> Result<(), ToolError> {
        let name = &self.spec.name;
        let Some(peer) = self.peer() else { return Err(self.unavailable()) };
        if !offers_subscriptions(&peer) {
            return Err(ToolError::InvalidArguments(format!(
                "MCP server '{name}' does not offer resource subscriptions"
            )));
        }
        let request = peer.subscribe(SubscribeRequestParams::new(uri));
        match tokio::time::timeout(SUBSCRIBE_TIMEOUT, request).await {
            Ok(Ok(())) => {
                self.subscribed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(uri.to_owned());
                Ok(())
            }
            Ok(Err(error)) => Err(mapping::service_error("resources/subscribe", name, error).0),
            Err(_elapsed) => Err(ToolError::Timeout(format!(
                "MCP server '{name}' did not answer resources/subscribe within {SUBSCRIBE_TIMEOUT:?}"
            ))),
        }
    }

    /// Unsubscribes from `uri`: forgotten at once, and the server told when it is up.
    #[allow(deprecated)]
    pub(crate) async fn unsubscribe(&self, uri: &str) {
        let was = self.subscribed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(uri);
        let Some(peer) = self.peer().filter(|peer| was && offers_subscriptions(peer)) else { return };
        let request = peer.unsubscribe(UnsubscribeRequestParams::new(uri));
        match tokio::time::timeout(SUBSCRIBE_TIMEOUT, request).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::warn!(source = %self.spec.name, uri, error = %err, "resources/unsubscribe failed");
            }
            Err(_elapsed) => {
                tracing::warn!(source = %self.spec.name, uri, "resources/unsubscribe did not answer in time");
            }
        }
    }

    /// Subscribes again, on a new connection, to every URI toolhost is subscribed to; a URI the
    /// server refuses now is forgotten, with a log line.
    #[allow(deprecated)]
    pub(crate) async fn resubscribe(&self, peer: &Peer<RoleClient>) {
        let uris: Vec<String> = self
            .subscribed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        if uris.is_empty() {
            return;
        }
        for uri in uris {
            let request = peer.subscribe(SubscribeRequestParams::new(uri.as_str()));
            let failed = match tokio::time::timeout(SUBSCRIBE_TIMEOUT, request).await {
                Ok(Ok(())) => continue,
                Ok(Err(err)) => err.to_string(),
                Err(_elapsed) => "no answer in time".to_owned(),
            };
            tracing::warn!(source = %self.spec.name, uri, error = %failed, "cannot subscribe to a resource again after reconnecting; its updates stop");
            self.subscribed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&uri);
        }
    }
}
