//! Resource subscriptions through the door: which clients want which resource's updates, the
//! leases that keep the hosting toolbox subscribed upstream, and the relay of the fleet stream
//! of updates (`toolhost:mcp:resource-updated`) to those clients.
//!
//! An `initialize` session subscribes with `resources/subscribe`; a 2026-07-28 client names
//! URIs in `subscriptions/listen`'s `resourceSubscriptions`. Both register here, under the
//! [`super::subscriptions::Subscriptions`] relay. The first watcher of a URI makes the door send
//! `resources.subscribe` (a lease of [`LEASE`], named by the door's own subscriber id), which it
//! renews every third of that while anyone watches; the last watcher leaving (an
//! `unsubscribe`, a closed session or stream) makes it send `resources.unsubscribe`. Each
//! update read from the fleet stream goes to every watcher of its URI, as
//! `notifications/resources/updated`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{ErrorData as McpError, ResourceUpdatedNotificationParam};
use rmcp::service::Peer;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::fleet_client::{ANSWER_MARGIN, FleetClient};

/// How long a subscription lease lives unless renewed.
const LEASE: Duration = Duration::from_secs(60);
/// How long one request about a lease may take.
const LEASE_REQUEST: Duration = Duration::from_secs(10);
/// How long a read of the update stream blocks.
const READ_BLOCK: Duration = Duration::from_secs(1);

/// Where a watcher of a resource hears of its updates.
enum Watcher {
    /// An `initialize` session.
    Session(Peer<RoleServer>),
    /// A `subscriptions/listen` stream.
    Listen(mpsc::UnboundedSender<String>),
}

impl Watcher {
    fn is_gone(&self) -> bool {
        match self {
            Watcher::Session(peer) => peer.is_transport_closed(),
            Watcher::Listen(sender) => sender.is_closed(),
        }
    }
}

/// Who asked for a URI first: the lease's requests are made for this tenant.
#[derive(Clone, Default)]
pub(super) struct Asker {
    /// The tenant.
    pub tenant: Option<String>,
    /// The principal it came through.
    pub via: Option<String>,
}

/// One watched URI.
struct Watched {
    asker: Asker,
    watchers: HashMap<String, Watcher>,
}

/// The door's resource subscriptions.
pub(crate) struct ResourceUpdates {
    fleet: FleetClient,
    /// The door's subscriber id, naming its leases.
    subscriber: String,
    watched: Mutex<HashMap<String, Watched>>,
    next: AtomicU64,
    stop: CancellationToken,
}

impl ResourceUpdates {
    /// The door's subscriptions, relaying the fleet's updates until the door stops.
    pub(crate) fn start(fleet: FleetClient) -> Arc<ResourceUpdates> {
        let updates = Arc::new(ResourceUpdates {
            fleet,
            subscriber: format!("mcp-door-{}", uuid::Uuid::new_v4().simple()),
            watched: Mutex::default(),
            next: AtomicU64::new(0),
            stop: CancellationToken::new(),
        });
        tokio::spawn(updates.clone().relay());
        tokio::spawn(updates.clone().renew());
        updates
    }

    /// Stops relaying and renewing.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        self.watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Watches `uri` for the session `key`.
    ///
    /// # Errors
    /// The hosting toolbox refused the subscription (no toolbox lists the URI, its server does
    /// not offer subscriptions, the tenant's policy), or nothing answered.
    pub(super) async fn subscribe_session(
        &self,
        uri: &str,
        key: &str,
        peer: Peer<RoleServer>,
        asker: Asker,
    ) -> Result<(), McpError> {
        self.watch(uri, key.to_owned(), Watcher::Session(peer), asker).await
    }

    /// Stops watching `uri` for the session `key`.
    pub(super) async fn unsubscribe_session(&self, uri: &str, key: &str) {
        self.unwatch(uri, key).await;
    }

    /// Watches every URI of `uris` for a `subscriptions/listen` stream; the updates come on the
    /// returned receiver until the stream ends ([`ResourceUpdates::forget_listen`]).
    ///
    /// # Errors
    /// As [`ResourceUpdates::subscribe_session`], for the first URI refused.
    pub(super) async fn subscribe_listen(
        &self,
        uris: &[String],
        asker: Asker,
    ) -> Result<(String, mpsc::UnboundedReceiver<String>), McpError> {
        let key = format!("listen-{}", self.next.fetch_add(1, Ordering::Relaxed));
        let (sender, receiver) = mpsc::unbounded_channel();
        for uri in uris {
            if let Err(err) =
                self.watch(uri, key.clone(), Watcher::Listen(sender.clone()), asker.clone()).await
            {
                self.forget_listen(&key, uris).await;
                return Err(err);
            }
        }
        Ok((key, receiver))
    }

    /// Stops watching `uris` for the listen stream `key`.
    pub(super) async fn forget_listen(&self, key: &str, uris: &[String]) {
        for uri in uris {
            self.unwatch(uri, key).await;
        }
    }

    async fn watch(&self, uri: &str, key: String, watcher: Watcher, asker: Asker) -> Result<(), McpError> {
        let first = {
            let mut watched = self.lock();
            match watched.get_mut(uri) {
                Some(entry) => {
                    entry.watchers.insert(key.clone(), watcher);
                    None
                }
                None => Some(watcher),
            }
        };
        let Some(watcher) = first else { return Ok(()) };
        self.lease("resources.subscribe", uri, &asker).await?;
        let mut watched = self.lock();
        let entry =
            watched.entry(uri.to_owned()).or_insert_with(|| Watched { asker, watchers: HashMap::new() });
        entry.watchers.insert(key, watcher);
        Ok(())
    }

    async fn unwatch(&self, uri: &str, key: &str) {
        let asker = {
            let mut watched = self.lock();
            let Some(entry) = watched.get_mut(uri) else { return };
            entry.watchers.remove(key);
            if !entry.watchers.is_empty() {
                return;
            }
            watched.remove(uri).map(|entry| entry.asker).unwrap_or_default()
        };
        if let Err(err) = self.lease("resources.unsubscribe", uri, &asker).await {
            debug!(uri, error = %err.message, "resources.unsubscribe failed; the lease lapses instead");
        }
    }

    /// Sends a lease request about `uri` and waits for its answer.
    async fn lease(&self, event_type: &str, uri: &str, asker: &Asker) -> Result<(), McpError> {
        let mut data = Map::new();
        data.insert("uri".to_owned(), json!(uri));
        data.insert("subscriber".to_owned(), json!(self.subscriber));
        data.insert("ttl_ms".to_owned(), json!(LEASE.as_millis() as u64));
        data.insert("timeout_ms".to_owned(), json!(LEASE_REQUEST.as_millis() as u64));
        let caller = (asker.tenant.as_deref(), asker.via.as_deref(), None);
        let answer = self
            .fleet
            .ask_for(event_type, data, LEASE_REQUEST + ANSWER_MARGIN, caller)
            .await
            .map_err(|err| McpError::internal_error(format!("{event_type}: {err}"), None))?;
        if answer.success {
            return Ok(());
        }
        Err(super::catalog::catalog_error(event_type, answer))
    }

    /// Renews every watched URI's lease every third of its life, and lets go of URIs whose
    /// watchers have all gone.
    async fn renew(self: Arc<Self>) {
        let mut tick = tokio::time::interval(LEASE / 3);
        tick.tick().await;
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (live, gone) = {
                let mut watched = self.lock();
                let mut gone = Vec::new();
                for (uri, entry) in watched.iter_mut() {
                    entry.watchers.retain(|_, watcher| !watcher.is_gone());
                    if entry.watchers.is_empty() {
                        gone.push((uri.clone(), entry.asker.clone()));
                    }
                }
                watched.retain(|_, entry| !entry.watchers.is_empty());
                let live: Vec<(String, Asker)> =
                    watched.iter().map(|(uri, entry)| (uri.clone(), entry.asker.clone())).collect();
                (live, gone)
            };
            for (uri, asker) in gone {
                let _ = self.lease("resources.unsubscribe", &uri, &asker).await;
            }
            for (uri, asker) in live {
                if let Err(err) = self.lease("resources.subscribe", &uri, &asker).await {
                    warn!(uri, error = %err.message, "cannot renew a resource subscription; trying again later");
                }
            }
        }
    }

    /// Reads the fleet stream of updates from its end and hands each to its URI's watchers.
    async fn relay(self: Arc<Self>) {
        let topic = self.fleet.keys().resource_updates();
        let bus = self.fleet.bus().clone();
        let mut cursor = loop {
            match bus.last_entry_id(&topic).await {
                Ok(last) => break last,
                Err(err) => {
                    debug!(error = %err, "cannot read the resource updates stream yet");
                    tokio::select! {
                        () = self.stop.cancelled() => return,
                        () = tokio::time::sleep(READ_BLOCK) => {}
                    }
                }
            }
        };
        loop {
            let read = tokio::select! {
                () = self.stop.cancelled() => return,
                read = bus.read(&topic, &cursor, 100, Some(READ_BLOCK)) => read,
            };
            let entries = match read {
                Ok(entries) => entries,
                Err(err) => {
                    debug!(error = %err, "cannot read the resource updates stream; reading again");
                    tokio::time::sleep(READ_BLOCK).await;
                    continue;
                }
            };
            for entry in entries {
                cursor.clone_from(&entry.entry_id);
                let uri = entry
                    .payload
                    .as_deref()
                    .and_then(|payload| serde_json::from_str::<Value>(payload).ok())
                    .and_then(|payload| payload.get("uri").and_then(Value::as_str).map(str::to_owned));
                if let Some(uri) = uri {
                    self.deliver(&uri).await;
                }
            }
        }
    }

    /// Tells every watcher of `uri` that it changed.
    async fn deliver(&self, uri: &str) {
        let peers: Vec<Peer<RoleServer>> = {
            let watched = self.lock();
            let Some(entry) = watched.get(uri) else { return };
            entry
                .watchers
                .values()
                .filter_map(|watcher| match watcher {
                    Watcher::Session(peer) => Some(peer.clone()),
                    Watcher::Listen(sender) => {
                        let _ = sender.send(uri.to_owned());
                        None
                    }
                })
                .collect()
        };
        for peer in peers {
            if let Err(err) = peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri)).await {
                debug!(uri, error = %err, "a session subscribed to a resource has gone");
            }
        }
    }
}
