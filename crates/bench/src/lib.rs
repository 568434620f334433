//! A benchmark harness for toolhost, and the reference worker it is compared with.
//!
//! - [`envelope`]: the request and answer envelopes of CONTRACTS.md §2.
//! - [`refworker`]: the least work a correct at-least-once worker must do.
//! - [`load`]: the closed-loop load generator (lanes plus one answer dispatcher).
//! - [`fleet`]: 1, 2 and 4 replicas against one Redis and a 3-master cluster.
//! - [`plan`]: what is measured, in which order, against which target.
//! - [`target`]: starting workers and timing until they are ready.
//! - [`redis_server`]: a private `redis-server` per run.
//! - [`procfs`]: CPU time and RSS from `/proc`, and the machine description.
//! - [`report`]: the Markdown table and the JSON report.
//! - [`otlp_sink`]: an OTLP/HTTP receiver that answers every export and keeps nothing.
//!
//! The harness talks to the daemon only over Redis and through its process, never
//! through its crates, so it measures exactly what a caller would see.

pub mod envelope;
pub mod fleet;
pub mod load;
pub mod otlp_sink;
pub mod plan;
pub mod procfs;
pub mod redis_server;
pub mod refworker;
pub mod report;
pub mod shards;
pub mod target;
