//! Integration tests of the bus against real redis-server processes the tests start.

// A failed unwrap in a test is a test failure with its message; that is what tests want.
#![allow(clippy::unwrap_used)]

/// A redis-server, and a replica of it, on free loopback ports.
mod support;

/// `[redis] replica_acks`: call records acknowledged by replicas before a tool runs.
mod replica_acks;
