//! The requests door's settings. The door has no section of its own: `config` reads them from
//! the shared sections (`[streams]`, `[dispatch]`, `[daemon]`), whose keys stay where they are.

use std::time::Duration;

use toolhost_bus::{ResponseTopics, Shards};

/// What the requests door needs to know.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The toolbox id: ledger namespace and `source` of results.
    pub toolbox_id: String,
    /// Bare name of the requests topic: the shard this door reads.
    pub requests_topic: String,
    /// The shards of the requests stream (`[streams] shards`), for the shard rule.
    pub shards: Shards,
    /// The shard this door reads.
    pub shard: u16,
    /// The shards this replica reads (`[streams] read_shards`); empty: all.
    pub read_shards: Vec<u16>,
    /// While the shard count changes, the shards of the count it changes from
    /// (`[streams] previous_shards`).
    pub previous: Option<Shards>,
    /// Whether this door reads a stream of the previous count, which it drains: every request
    /// there is moved to its shard under the current count.
    pub draining: bool,
    /// Bare name of the default results topic.
    pub results_topic: String,
    /// Larger payloads are dead-lettered.
    pub max_payload_bytes: usize,
    /// Requests older than this answer `expired`.
    pub max_request_age: Option<Duration>,
    /// Whether events no tool consumes get an `unknown_tool` answer.
    pub answer_unknown_tools: bool,
    /// The response topics callers may name.
    pub response_topics: ResponseTopics,
}
