//! The transport: topics are Redis Streams, read through consumer groups.
//!
//! - [`Bus`]: the operations the daemon needs (publish, group read, ack, reclaim, plain read,
//!   group statistics, entry deletion) and the call ledger that makes answers exactly-once
//!   ([`Bus::begin_call`], [`Bus::finish`]).
//! - [`RedisBus`]: the Redis implementation, over redis-rs connection managers.
//! - [`MemoryBus`]: an in-memory implementation with the same semantics, for unit tests.
//! - [`Keys`]: every Redis key and stream name, built in one place.
//! - [`Caller`]: publish a request and await its answer, for clients and agents written in Rust.
//!
//! **Invariant:** nothing outside this crate talks to Redis directly, except the daemon's health
//! probe and benchmarks.

mod batch;
mod bus;
mod caller;
mod error;
mod keys;
mod memory;
mod redis_bus;

pub use bus::{
    Bus, CallKeys, CallStart, Committed, EntryRef, Finish, GroupInfo, Published, Reclaimed, call_owner,
};
pub use caller::{CallError, Caller};
pub use error::{Cause, Error};
pub use keys::{Keys, RESERVED_TOPIC_PREFIXES, ResponseTopics, TopicRefusal};
pub use memory::MemoryBus;
pub use redis_bus::{RedisBus, RedisOptions};
