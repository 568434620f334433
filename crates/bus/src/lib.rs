//! The transport: topics are Redis Streams, read through consumer groups.
//!
//! - Narrow traits, each what one consumer needs: [`Streams`] (publish, plain read: callers,
//!   chat tools, dead-letter commands), [`Groups`] (consumer-group reads, acks, claims: a door's
//!   reader), [`Ledger`] (the exactly-once call ledger: [`Ledger::begin_call`],
//!   [`Ledger::finish`]), [`Directory`] (the registry hashes, heartbeats and the fleet set: the
//!   publisher and clients of the fleet) and [`Server`] (server facts: probes, start-up checks);
//!   [`Bus`] is all five, and [`FleetAccess`] (streams and the directory) is what a client of
//!   the fleet holds.
//! - [`RedisBus`]: the Redis implementation, over redis-rs connection managers.
//! - [`MemoryBus`]: a test double of [`Streams`], [`Directory`] and [`Server`] only; groups and the ledger are
//!   tested against a real Redis.
//! - [`Keys`]: every Redis key and stream name, built in one place.
//! - [`acl`]: the commands toolhost sends, for the least-privilege Redis user
//!   (`toolhost redis-acl`).
//! - [`Tls`]: TLS to Redis with the operator's own CA and client certificate, for every
//!   connection the bus makes.
//! - [`Caller`]: publish a request and await its answer, for clients and agents written in Rust.
//!
//! **Invariant:** nothing outside this crate talks to Redis directly, except the daemon's health
//! probe and benchmarks.

pub mod acl;
mod batch;
mod bus;
mod caller;
mod connection;
mod error;
mod keys;
mod memory;
mod raw_read;
mod redis_bus;
mod sentinel;
mod shards;
mod slots;
mod tls;

pub use bus::{
    Bus, CallKeys, CallStart, Claim, Committed, Directory, EntryRef, Finish, FleetAccess, GroupInfo, Groups,
    KeptAnswer, Ledger, LedgerFormat, Published, REFUSED_MARK, RateLimits, Reclaimed, Server, Streams,
    call_owner, is_answer_mark, read_claim,
};
pub use caller::{CallError, Caller, Pending};
pub use connection::Topology;
pub use error::{Cause, Error};
pub use keys::{AclNames, Keys, RESERVED_TOPIC_PREFIXES, ResponseTopics, TopicRefusal};
pub use memory::MemoryBus;
pub use redis_bus::{RedisBus, RedisOptions};
pub use sentinel::Sentinels;
pub use shards::{MAX_SHARDS, Shards};
pub use tls::Tls;
