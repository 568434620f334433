//! What the rest of the fleet hosts: every live replica of every toolbox reading the same Redis,
//! as their heartbeats tell it.
//!
//! Each replica's heartbeat (`toolhost:heartbeat:<toolbox_id>:<consumer>`, refreshed every
//! `[daemon] heartbeat_ms`, expiring after three) lists the tools it hosts, enabled ones only,
//! with the event each consumes and its description's hash. The view is read again on every
//! beat and swapped whole. Doors consult it before answering a request for a tool they do not
//! host themselves: when a live sibling hosts it, the sibling answers (see `doors::requests`).
//! The same name with different descriptions on two replicas is reported in the log, a metric
//! and `/status`.
//!
//! A door never answers `unknown_tool` from a view that may predate the request: the view
//! remembers when its reading began, and [`Fleet::read_after`] reads the fleet again when the
//! view began before the entry was delivered. Every replica writes its first heartbeat before
//! it reads (`serve`), so a tool whose host had beaten before the request was added is in any
//! view read after the entry was delivered, whatever the clocks say.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use serde_json::{Value, json};
use toolhost_bus::Directory;

use crate::heartbeat::Heartbeat;
pub(crate) use crate::heartbeat::Hosted;

/// One live replica hosting a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Host {
    /// Its toolbox (consumer group).
    pub toolbox_id: String,
    /// Its consumer name.
    pub consumer: String,
}

/// One reading of the fleet.
#[derive(Debug, Default)]
struct Snapshot {
    /// Tool name to the live replicas hosting it.
    tools: BTreeMap<String, Vec<Host>>,
    /// Consumed event to tool name.
    events: BTreeMap<String, String>,
    /// Live toolboxes and their replicas.
    toolboxes: BTreeMap<String, BTreeSet<String>>,
    /// Tool names served with different descriptions, with the toolboxes serving each version.
    conflicts: BTreeMap<String, Vec<String>>,
    /// When the reading this view came from began; `None` before the first.
    read_at: Option<Instant>,
}

/// Where the fleet is read from: the fleet set and the heartbeats it lists.
struct Source {
    bus: Arc<dyn Directory>,
    /// Full key of the fleet set.
    set: String,
}

/// The fleet as last read, shared by the doors and the publisher.
#[derive(Default)]
pub(crate) struct Fleet {
    snapshot: ArcSwap<Snapshot>,
    /// Where it is read from; `None` for a view only [`Fleet::update`] fills (tests).
    source: Option<Source>,
    /// Held by the one reading under way, so that readers waiting for a view newer than their
    /// entry share one reading instead of each making their own.
    reading: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").field("snapshot", &self.snapshot).finish_non_exhaustive()
    }
}

impl Fleet {
    /// A view read from `bus`: the heartbeats listed in the fleet set `set` (full key).
    pub(crate) fn reading(bus: Arc<dyn Directory>, set: String) -> Fleet {
        Fleet { source: Some(Source { bus, set }), ..Fleet::default() }
    }

    /// The heartbeat keys listed in the fleet set whose keys have not expired, with their
    /// values; listed keys that have expired (replicas that died) are taken off the list.
    pub(crate) async fn live_heartbeats(&self) -> Result<Vec<(String, String)>, toolhost_bus::Error> {
        let Some(Source { bus, set }) = &self.source else { return Ok(Vec::new()) };
        let keys = bus.members(set).await?;
        let values = bus.values(&keys).await?;
        let mut live = Vec::with_capacity(keys.len());
        let mut dead = Vec::new();
        for (key, value) in keys.into_iter().zip(values) {
            match value {
                Some(value) => live.push((key, value)),
                None => dead.push(key),
            }
        }
        bus.remove_members(set, &dead).await?;
        Ok(live)
    }

    /// Reads every live replica's heartbeat into the view. Returns the names of the tools newly
    /// found with conflicting descriptions, to report once.
    pub(crate) async fn read(&self) -> Result<Vec<String>, toolhost_bus::Error> {
        let _reading = self.reading.lock().await;
        self.read_locked().await
    }

    async fn read_locked(&self) -> Result<Vec<String>, toolhost_bus::Error> {
        let began = Instant::now();
        let beats = self.live_heartbeats().await?;
        Ok(self.update_at(beats.into_iter().map(|(_, value)| value), Some(began)))
    }

    /// Makes sure the view was read after `delivered` (when an entry was delivered here), reading
    /// the fleet again when it was not. Readings are shared: an entry delivered while one is
    /// under way waits for the next, which every entry waiting then shares. A view that is not
    /// read from Redis ([`Fleet::default`]) is taken as it is.
    ///
    /// # Errors
    /// Reading the fleet failed; the view is not known to be newer than the entry.
    pub(crate) async fn read_after(&self, delivered: Instant) -> Result<(), toolhost_bus::Error> {
        if self.source.is_none() || self.read_since(delivered) {
            return Ok(());
        }
        let _reading = self.reading.lock().await;
        // Another entry's reading may have begun after this one was delivered meanwhile.
        if self.read_since(delivered) {
            return Ok(());
        }
        self.read_locked().await.map(drop)
    }

    /// Whether the view's reading began at `instant` or later.
    fn read_since(&self, instant: Instant) -> bool {
        self.snapshot.load().read_at.is_some_and(|read_at| read_at >= instant)
    }

    /// Replaces the view with what `heartbeats` (their JSON texts) say. Returns the names of the
    /// tools newly found with conflicting descriptions, to report once.
    #[cfg(test)]
    pub(crate) fn update(&self, heartbeats: impl IntoIterator<Item = String>) -> Vec<String> {
        self.update_at(heartbeats, None)
    }

    /// [`Fleet::update`] with when the reading of `heartbeats` began.
    fn update_at(
        &self,
        heartbeats: impl IntoIterator<Item = String>,
        read_at: Option<Instant>,
    ) -> Vec<String> {
        let mut next = Snapshot { read_at, ..Snapshot::default() };
        let mut versions: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for text in heartbeats {
            let Some(beat) = Heartbeat::parse(&text) else { continue };
            next.toolboxes.entry(beat.toolbox_id.clone()).or_default().insert(beat.consumer.clone());
            for (name, hosted) in beat.hosted {
                let host = Host { toolbox_id: beat.toolbox_id.clone(), consumer: beat.consumer.clone() };
                next.tools.entry(name.clone()).or_default().push(host);
                if !hosted.event.is_empty() {
                    next.events.insert(hosted.event, name.clone());
                }
                versions
                    .entry(name)
                    .or_default()
                    .entry(hosted.hash)
                    .or_default()
                    .insert(beat.toolbox_id.clone());
            }
        }
        for (name, by_hash) in versions {
            if by_hash.len() > 1 {
                let toolboxes =
                    by_hash.into_values().flatten().collect::<BTreeSet<_>>().into_iter().collect();
                next.conflicts.insert(name, toolboxes);
            }
        }
        let previous = self.snapshot.load();
        let new_conflicts =
            next.conflicts.keys().filter(|name| !previous.conflicts.contains_key(*name)).cloned().collect();
        self.snapshot.store(Arc::new(next));
        new_conflicts
    }

    /// The live replicas other than `me` hosting `tool`, by tool name or by consumed event.
    pub(crate) fn hosts(&self, tool: &str, me: &str) -> Vec<Host> {
        let snapshot = self.snapshot.load();
        let name = snapshot.events.get(tool).map_or(tool, String::as_str);
        snapshot
            .tools
            .get(name)
            .map(|hosts| hosts.iter().filter(|host| host.consumer != me).cloned().collect())
            .unwrap_or_default()
    }

    /// Every live replica of every toolbox, `me` left out.
    pub(crate) fn replicas(&self, me: &str) -> Vec<Host> {
        let snapshot = self.snapshot.load();
        let mut res = Vec::new();
        for (toolbox_id, consumers) in &snapshot.toolboxes {
            for consumer in consumers.iter().filter(|consumer| consumer.as_str() != me) {
                res.push(Host { toolbox_id: toolbox_id.clone(), consumer: consumer.clone() });
            }
        }
        res
    }

    /// Whether a replica of `toolbox_id` is alive.
    pub(crate) fn is_live(&self, toolbox_id: &str) -> bool {
        self.snapshot.load().toolboxes.contains_key(toolbox_id)
    }

    /// How many tool names are served with different descriptions.
    pub(crate) fn conflicts(&self) -> usize {
        self.snapshot.load().conflicts.len()
    }

    /// The `/status` part: live toolboxes with their replicas, and conflicting descriptions.
    pub(crate) fn status(&self) -> Value {
        let snapshot = self.snapshot.load();
        json!({"toolboxes": snapshot.toolboxes, "conflicts": snapshot.conflicts})
    }
}

/// Where a door sends a request for a tool it does not host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// Nobody else hosts it: answer here (`unknown_tool`, `tool_disabled`).
    Here,
    /// Another toolbox hosts it, and reads the same entry through its own group: only ack.
    OtherToolbox,
    /// A replica of this toolbox hosts it: hand the entry to that consumer.
    Sibling(String),
}

/// Decides where a request for `tool`, which this replica (`me`, of `toolbox_id`) does not
/// host, goes.
pub(crate) fn route(fleet: &Fleet, tool: &str, toolbox_id: &str, me: &str) -> Route {
    let hosts = fleet.hosts(tool, me);
    if hosts.iter().any(|host| host.toolbox_id != toolbox_id) {
        return Route::OtherToolbox;
    }
    match hosts.into_iter().next() {
        Some(sibling) => Route::Sibling(sibling.consumer),
        None => Route::Here,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(toolbox: &str, consumer: &str, tools: &[(&str, &str)]) -> String {
        let hosted: BTreeMap<&str, Value> = tools
            .iter()
            .map(|(name, hash)| (*name, json!({"event": format!("{name}.requested"), "hash": hash})))
            .collect();
        json!({"toolbox_id": toolbox, "consumer": consumer, "hosted": hosted}).to_string()
    }

    #[test]
    fn requests_go_to_the_toolbox_or_sibling_that_hosts_them_and_nobody_else() {
        let fleet = Fleet::default();
        let conflicts = fleet.update([
            beat("db", "db-1", &[("query", "h1"), ("shared", "s1")]),
            beat("db", "db-2", &[("query", "h1"), ("shared", "s1"), ("fresh", "f1")]),
            beat("web", "web-1", &[("browse", "b1"), ("shared", "s2")]),
            "not json".to_owned(),
        ]);
        assert_eq!(conflicts, ["shared"]);
        assert_eq!(route(&fleet, "browse", "db", "db-1"), Route::OtherToolbox);
        assert_eq!(route(&fleet, "browse.requested", "db", "db-1"), Route::OtherToolbox);
        // A newer replica of the same toolbox hosts it (a reload ahead of this one).
        assert_eq!(route(&fleet, "fresh", "db", "db-1"), Route::Sibling("db-2".to_owned()));
        assert_eq!(route(&fleet, "nobody", "db", "db-1"), Route::Here);
        assert!(fleet.is_live("web") && !fleet.is_live("gone"));
        let others: Vec<String> = fleet.replicas("db-1").into_iter().map(|host| host.consumer).collect();
        assert_eq!(others, ["db-2", "web-1"]);
        assert_eq!(fleet.conflicts(), 1);
        // Reported once: the same conflict on the next reading is not new.
        let again = fleet
            .update([beat("db", "db-1", &[("shared", "s1")]), beat("web", "web-1", &[("shared", "s2")])]);
        assert!(again.is_empty());
        assert_eq!(fleet.status()["conflicts"]["shared"], json!(["db", "web"]));
    }
}
