//! Group reads on a Redis Cluster without the read script: the streaming reader (`raw_read`)
//! connected to the master that owns each stream's slot.
//!
//! [`ClusterReads`] keeps a map of slot ranges to masters, learnt with `CLUSTER SLOTS` on a
//! connection of its own (to a master it knows, else to a seed node; not through redis-rs's
//! cluster connection, whose own slot refreshes it must not wait behind), and per master a
//! [`RawReads`]: its target (the node's address with
//! the scheme, credentials and TLS of the seed nodes, `Connector::cluster_node_url`; a TLS
//! connection checks the name the cluster announces) and its idle connections. A read goes to
//! the master of its stream's slot as the map says; when the map is wrong the read finds out:
//!
//! - `MOVED` (the slot moved, or the node turned replica in a failover: a read blocked there is
//!   cut off with `MOVED` or `UNBLOCKED`), `READONLY`, or no connection to the node: nothing was
//!   read, so the map is learnt again and the read tried once more; what still fails reaches the
//!   caller as [`Error::Unavailable`], and the next read learns the map again.
//! - `ASK` (the slot is being migrated and the stream has left already): this one read goes
//!   through the script on the cluster connection, which follows `ASK` itself.
//! - A connection that breaks or stalls during the read: the error reaches the caller and the
//!   map and that node's idle connections are dropped, exactly as one server's reader drops its
//!   connection. `XREADGROUP ... >` delivers each entry at most once into the group's pending
//!   list; entries delivered to a read whose reply was lost stay pending there until the
//!   reclaimer hands them out again, as on one server. A read is sent again only after a reply
//!   that delivered nothing (a redirection) or when none was sent (no connection), so no entry
//!   is delivered twice and none is skipped.
//!
//! A node whose address the cluster does not know (`?`) has its slots read through the script, as
//! does every read when the cluster refuses `CLUSTER SLOTS` (a proxy, an ACL without
//! `cluster|slots`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::warn;

use super::{Idle, RawReads};
use crate::connection::Connector;
use crate::raw_read::RawTarget;
use crate::{Error, Tls};

/// Where a cluster's raw group reads connect: the masters of the slots, learnt when needed.
pub(super) struct ClusterReads {
    tls: Tls,
    /// How many idle connections are kept per node.
    idle_most: usize,
    /// The current map and the nodes' reads, so that a map learnt again keeps the idle
    /// connections of the nodes it still names.
    state: Mutex<State>,
    /// Held while the map is learnt, so that concurrent reads learn it once.
    learning: tokio::sync::Mutex<()>,
    /// Set when the cluster refused `CLUSTER SLOTS`: every read then goes through the script.
    refused: AtomicBool,
}

#[derive(Default)]
struct State {
    /// `None` until learnt, and again once a read found it wrong.
    map: Option<Arc<SlotMap>>,
    /// The reads of every node of the last map, by `host:port`.
    nodes: Vec<(String, Arc<RawReads>)>,
}

/// Slot ranges and the reads of the master serving each.
pub(super) struct SlotMap {
    /// `(first slot, last slot, reads)`, sorted by first slot; `None` for a master whose address
    /// is not announced.
    ranges: Vec<(u16, u16, Option<Arc<RawReads>>)>,
}

/// What a failed raw read's error says about the map.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Redirect {
    /// The node no longer serves the slot as master: learn the map again, and read again.
    Moved,
    /// The slot is migrating and the stream has left: read through the script this once.
    Ask,
    /// Nothing about the map.
    None,
}

impl ClusterReads {
    /// Reads with `tls` for the nodes' `rediss://` connections, keeping up to `idle_most` idle
    /// connections per node.
    pub(super) fn new(tls: Tls, idle_most: usize) -> ClusterReads {
        ClusterReads {
            tls,
            idle_most,
            state: Mutex::new(State::default()),
            learning: tokio::sync::Mutex::new(()),
            refused: AtomicBool::new(false),
        }
    }

    /// The current map, learnt from the cluster first when there is none (each connection made
    /// within `connect_timeout`, each answer awaited `response_timeout`); `None` when the cluster
    /// refuses to say (reads then go through the script).
    ///
    /// # Errors
    /// No node answered `CLUSTER SLOTS` (the last one's error), or a node's target cannot be made.
    pub(super) async fn map(
        &self,
        connector: &Connector,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Option<Arc<SlotMap>>, Error> {
        if self.refused.load(Ordering::Relaxed) {
            return Ok(None);
        }
        if let Some(map) = self.current() {
            return Ok(Some(map));
        }
        let _learning = self.learning.lock().await;
        // Another read may have learnt it meanwhile.
        if let Some(map) = self.current() {
            return Ok(Some(map));
        }
        // The masters of the last map first (the current ones, most likely), then the seeds.
        let mut askable: Vec<RawTarget> =
            self.lock().nodes.iter().map(|(_, reads)| reads.target.clone()).collect();
        for (host, port) in connector.cluster_seeds() {
            if let Some(url) = connector.cluster_node_url(&host, port)
                && let Some(target) = RawTarget::of(&url, &self.tls)?
            {
                askable.push(target);
            }
        }
        let mut last_err = Error::Protocol("no cluster node to ask for its slots".to_owned());
        let mut learnt = None;
        for target in &askable {
            let asked = async {
                let mut reader = target.connect(connect_timeout).await?;
                reader.cluster_slots(target.host(), response_timeout).await
            };
            match asked.await {
                Ok(ranges) => {
                    learnt = Some(ranges);
                    break;
                }
                Err(Error::Refused(cause)) => {
                    warn!(error = %cause, "the cluster refuses CLUSTER SLOTS; group reads go through the read script");
                    self.refused.store(true, Ordering::Relaxed);
                    return Ok(None);
                }
                Err(err) => last_err = err,
            }
        }
        let Some(ranges) = learnt else { return Err(last_err) };
        let mut state = self.lock();
        let mut nodes: Vec<(String, Arc<RawReads>)> = Vec::new();
        let mut map = SlotMap { ranges: Vec::with_capacity(ranges.len()) };
        for (first, last, address) in ranges {
            let reads = match address {
                None => None,
                Some((host, port)) => {
                    let key = format!("{host}:{port}");
                    let known = nodes
                        .iter()
                        .chain(&state.nodes)
                        .find(|(known, _)| *known == key)
                        .map(|(_, reads)| Arc::clone(reads));
                    let reads = match known {
                        Some(reads) => Some(reads),
                        None => self.reads_of(connector, &host, port)?,
                    };
                    if let Some(reads) = &reads
                        && !nodes.iter().any(|(known, _)| *known == key)
                    {
                        nodes.push((key, Arc::clone(reads)));
                    }
                    reads
                }
            };
            map.ranges.push((first, last, reads));
        }
        map.ranges.sort_by_key(|(first, _, _)| *first);
        let map = Arc::new(map);
        state.map = Some(Arc::clone(&map));
        state.nodes = nodes;
        Ok(Some(map))
    }

    /// Forgets `map` if it is still the current one, so the next read learns the map again.
    pub(super) fn forget(&self, map: &Arc<SlotMap>) {
        let mut state = self.lock();
        if state.map.as_ref().is_some_and(|current| Arc::ptr_eq(current, map)) {
            state.map = None;
        }
    }

    fn current(&self) -> Option<Arc<SlotMap>> {
        self.lock().map.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a reader panicked while swapping the map; the state is sound.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// New reads of the node at `host:port`; `None` when it cannot be written as a URL the reader
    /// can reach.
    fn reads_of(&self, connector: &Connector, host: &str, port: u16) -> Result<Option<Arc<RawReads>>, Error> {
        let Some(url) = connector.cluster_node_url(host, port) else { return Ok(None) };
        Ok(RawTarget::of(&url, &self.tls)?
            .map(|target| Arc::new(RawReads { target, idle: Idle::new(self.idle_most) })))
    }
}

impl SlotMap {
    /// The reads of the master serving `slot`, if the map knows one the reader can reach.
    pub(super) fn reads_of(&self, slot: u16) -> Option<&Arc<RawReads>> {
        let at = self.ranges.partition_point(|(first, _, _)| *first <= slot).checked_sub(1)?;
        let (_, last, reads) = &self.ranges[at];
        (slot <= *last).then_some(reads.as_ref()).flatten()
    }
}

impl Redirect {
    /// What `err`, a raw read's error reply, says about the map.
    pub(super) fn of(err: &Error) -> Redirect {
        let Error::Unavailable(cause) = err else { return Redirect::None };
        match cause.code() {
            Some("MOVED" | "READONLY") => Redirect::Moved,
            // A read blocked on a master that turned replica.
            Some("UNBLOCKED") => Redirect::Moved,
            Some("ASK") => Redirect::Ask,
            _ => Redirect::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cause;

    #[test]
    fn a_slot_is_found_in_its_range_only() {
        let reads = |port: u16| {
            let url = format!("redis://127.0.0.1:{port}");
            let target = RawTarget::of(&url, &Tls::default()).unwrap().unwrap();
            Some(Arc::new(RawReads { target, idle: Idle::new(1) }))
        };
        let map = SlotMap { ranges: vec![(0, 99, reads(1)), (100, 199, None), (300, 16383, reads(2))] };
        let port = |slot: u16| map.reads_of(slot).map(|reads| format!("{:?}", reads.target));
        assert!(port(0).unwrap().contains("127.0.0.1:1,"));
        assert!(port(99).unwrap().contains("127.0.0.1:1,"));
        assert_eq!(port(100), None, "a master whose address is not announced");
        assert_eq!(port(250), None, "a slot no master serves");
        assert!(port(16383).unwrap().contains("127.0.0.1:2,"));
    }

    #[test]
    fn redirections_are_told_apart_from_other_errors() {
        let of = |reply: &str| Redirect::of(&Error::from_cause(Cause::parse(reply)));
        assert_eq!(of("MOVED 3999 127.0.0.1:6381"), Redirect::Moved);
        assert_eq!(
            of(
                "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)"
            ),
            Redirect::Moved
        );
        assert_eq!(of("ASK 3999 127.0.0.1:6381"), Redirect::Ask);
        assert_eq!(of("CLUSTERDOWN The cluster is down"), Redirect::None);
        assert_eq!(of("NOGROUP No such key"), Redirect::None);
    }
}
