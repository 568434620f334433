//! Integration tests of the bus against real redis-server processes the tests start.

// A failed unwrap in a test is a test failure with its message; that is what tests want.
#![allow(clippy::unwrap_used)]

/// A redis-server, and a replica of it, on free loopback ports.
mod support;

/// `[redis] replica_acks`: call records acknowledged by replicas before a tool runs.
mod replica_acks;

/// `[dispatch] ledger_format`: refusals folded into the answered mark (format 2), and the roll
/// from format 1, on one server and on a cluster.
mod ledger_format;

/// Group reads on a cluster through the streaming reader, connected to each stream's master,
/// across a slot that moves.
mod cluster_reads;
