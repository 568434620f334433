//! The hosted MCP servers' resources, prompts and completions, served for the requests door
//! (`resources.read`, `prompts.get`, `completion.complete`), and their resource subscriptions
//! (`resources.subscribe`, `resources.unsubscribe`).
//!
//! A subscription is held by leases: each subscriber (an MCP door) names itself and a time to
//! live, and renews it while one of its clients wants the URI. The toolbox subscribes upstream
//! when the first lease of a URI is taken and unsubscribes when the last one is given back or
//! lapses, so a door that dies without a word costs the server at most one lease of updates.
//! The server's updates go on the fleet stream `toolhost:mcp:resource-updated`, which every
//! door reads.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost_envelope::new_message_id;
use toolhost_mcp::{McpSources, Operation, Target};
use toolhost_tools::ToolError;
use tracing::{debug, warn};

use super::Sources;

/// How many updates the fleet stream keeps, about.
const UPDATES_MAX_LEN: u64 = 10_000;

/// Who holds a lease on which URI, until when.
#[derive(Default)]
pub(crate) struct Leases {
    by_uri: Mutex<BTreeMap<String, HashMap<String, Instant>>>,
}

impl Leases {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, HashMap<String, Instant>>> {
        self.by_uri.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes or renews `holder`'s lease of `uri`; whether it is the URI's first.
    fn take(&self, uri: &str, holder: &str, until: Instant) -> bool {
        let mut leases = self.lock();
        let holders = leases.entry(uri.to_owned()).or_default();
        let first = holders.is_empty();
        holders.insert(holder.to_owned(), until);
        first
    }

    /// Gives back `holder`'s lease of `uri`; whether it was the URI's last.
    fn give_back(&self, uri: &str, holder: &str) -> bool {
        let mut leases = self.lock();
        let Some(holders) = leases.get_mut(uri) else { return false };
        holders.remove(holder);
        let last = holders.is_empty();
        if last {
            leases.remove(uri);
        }
        last
    }

    /// Drops the leases lapsed at `now`; the URIs left without one.
    fn lapse(&self, now: Instant) -> Vec<String> {
        let mut leases = self.lock();
        let mut gone = Vec::new();
        leases.retain(|uri, holders| {
            holders.retain(|_, until| *until > now);
            if holders.is_empty() {
                gone.push(uri.clone());
            }
            !holders.is_empty()
        });
        gone
    }
}

impl Sources {
    /// Whether a hosted server of this toolbox lists `target`.
    pub(crate) async fn serves(&self, target: &Target) -> bool {
        self.hosted.lock().await.values().any(|hosted| hosted.sources.serves_target(target))
    }

    /// The hosted server that lists `target`: the first by server name, the rule that picks
    /// which server's entry this toolbox publishes.
    async fn serving(&self, target: &Target) -> Option<McpSources> {
        let hosted = self.hosted.lock().await;
        hosted
            .values()
            .find(|hosted| hosted.sources.serves_target(target))
            .map(|hosted| hosted.sources.clone())
    }

    /// Sends `operation` to the hosted server that lists what `params` name.
    ///
    /// # Errors
    /// As [`McpSources::request`]; params naming what no server lists are `InvalidArguments`.
    pub(crate) async fn request(&self, operation: Operation, params: Value) -> Result<Value, ToolError> {
        let target =
            toolhost_mcp::catalog::target(operation, &params).map_err(ToolError::InvalidArguments)?;
        match self.serving(&target).await {
            Some(sources) => sources.request(operation, params).await,
            None => Err(ToolError::InvalidArguments(format!("no hosted MCP server lists {target}"))),
        }
    }

    /// Takes or renews `holder`'s lease of the resource `uri` for `ttl`, subscribing upstream
    /// when it is the first.
    ///
    /// # Errors
    /// As [`McpSources::subscribe`]; the lease is not kept then.
    pub(crate) async fn subscribe(&self, uri: &str, holder: &str, ttl: Duration) -> Result<(), ToolError> {
        let target = Target::Resource(uri.to_owned());
        let Some(sources) = self.serving(&target).await else {
            return Err(ToolError::InvalidArguments(format!("no hosted MCP server lists {target}")));
        };
        if !self.leases.take(uri, holder, Instant::now() + ttl) {
            return Ok(());
        }
        let subscribed = sources.subscribe(uri).await;
        if subscribed.is_err() {
            self.leases.give_back(uri, holder);
        }
        subscribed
    }

    /// Gives back `holder`'s lease of `uri`, unsubscribing upstream when it was the last.
    pub(crate) async fn unsubscribe(&self, uri: &str, holder: &str) {
        if self.leases.give_back(uri, holder) {
            self.unsubscribe_upstream(uri).await;
        }
    }

    /// Unsubscribes upstream from the URIs whose leases all lapsed.
    pub(super) async fn expire_leases(&self) {
        for uri in self.leases.lapse(Instant::now()) {
            debug!(uri, "every lease of a resource subscription lapsed; unsubscribing");
            self.unsubscribe_upstream(&uri).await;
        }
    }

    async fn unsubscribe_upstream(&self, uri: &str) {
        let sources: Vec<McpSources> =
            self.hosted.lock().await.values().map(|hosted| hosted.sources.clone()).collect();
        for source in sources {
            source.unsubscribe(uri).await;
        }
    }

    /// Puts a server's resource update on the fleet stream the doors read.
    pub(super) async fn resource_updated(&self, source: &str, uri: &str) {
        let toolbox_id = self.settings().toolbox_id;
        let payload = json!({"uri": uri, "toolbox_id": toolbox_id, "source": source}).to_string();
        let id = new_message_id();
        let fields = [("id", id.as_str()), ("payload", payload.as_str())];
        if let Err(err) = self.bus.append(&self.keys.resource_updates(), &fields, Some(UPDATES_MAX_LEN)).await
        {
            warn!(error = %err, uri, source, "cannot publish a resource update; dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uri_is_held_while_any_lease_lives() {
        let leases = Leases::default();
        let now = Instant::now();
        assert!(leases.take("test://a", "door-1", now + Duration::from_secs(10)));
        assert!(!leases.take("test://a", "door-2", now + Duration::from_secs(1)));
        assert!(!leases.take("test://a", "door-1", now + Duration::from_secs(20)));
        assert!(!leases.give_back("test://a", "door-2"));
        assert!(leases.lapse(now + Duration::from_secs(15)).is_empty());
        assert_eq!(leases.lapse(now + Duration::from_secs(21)), ["test://a"]);
        assert!(leases.take("test://a", "door-2", now + Duration::from_secs(1)));
        assert!(leases.give_back("test://a", "door-2"));
        assert!(!leases.give_back("test://unknown", "door-2"));
    }
}
