//! [`Bus`] over Redis Streams, through redis-rs connection managers.
//!
//! Blocking reads (`XREADGROUP ... BLOCK`, `XREAD ... BLOCK`) hold a connection for their whole
//! wait, so they run on connections of their own, taken from a small pool; everything else is
//! multiplexed on one connection. Every connection reconnects by itself after a failure.
//!
//! Group reads are bounded in bytes as well as in entries: no field value longer than
//! [`RedisOptions::max_field_bytes`] is ever held whole. On a single server reached over TCP
//! (plain or TLS) or a Unix socket, a group read is one plain `XREADGROUP ... COUNT n BLOCK` on a connection
//! of the bus's own (`raw_read`) that keeps the first [`DEFECT_HEAD_BYTES`] of a long value and
//! its size and SHA-1 as the bytes stream past. On a Redis Cluster the same reader connects to
//! the master that owns the stream's slot (`cluster_reads`, which learns the slots and follows
//! `MOVED` and failovers). Elsewhere (Sentinel, a cluster's `ASK` during a migration, or
//! [`RedisOptions::script_reads`]) new entries are read by a script (`scripts/read_group.lua`)
//! that cuts the same way on the server; only when that finds nothing does the reader block, and
//! then for one entry (`XREADGROUP COUNT 1 BLOCK`), so at most one raw entry of any size is in
//! memory from a read. Reclaims cut on the
//! server (`scripts/reclaim.lua`). Every entry is decoded on its own: a field that is not UTF-8
//! or over the limit becomes the entry's [`toolhost_envelope::EntryDefect`] and never fails the
//! rest of the reply.
//!
//! On a Redis Cluster ([`Topology::Cluster`]) the same operations run on redis-rs cluster
//! connections; what differs (the ledger's single-slot steps, scanning every primary, pruning
//! consumers with their heartbeats looked up first) is in the `cluster` submodule.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use redis::streams::StreamReadOptions;
use redis::{AsyncCommands, Script, Value};
use toolhost_envelope::{DEFECT_HEAD_BYTES, Entry};

use crate::batch::{Batcher, ReplicaWait, Shared};
use crate::bus::{
    CallKeys, CallStart, Committed, EntryRef, Finish, GroupInfo, KeptAnswer, Reclaimed, is_entry_id,
};
use crate::connection::{Connection, Connector, Topology};
use crate::raw_read::{self, RawReader, RawTarget, ReadError};
use crate::{Directory, Error, Groups, Ledger, Server, Streams};

mod cluster;
mod cluster_reads;

/// How to reach Redis and how to write to it.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://`, `rediss://` (TLS) or `unix://` URL, with credentials if any.
    pub url: String,
    /// Where Redis is: the server at `url`, or another topology.
    pub topology: Topology,
    /// The key prefix of [`crate::Keys`]: on a cluster, keys the ledger names itself (next to a
    /// response topic, a dead-letter topic) start with it too.
    pub key_prefix: String,
    /// Topics are trimmed to about this many entries on every publish.
    pub maxlen: usize,
    /// How long a non-blocking command may take before the connection counts as broken.
    pub response_timeout: Duration,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// Group reads and reclaims deliver a field value longer than this only as its head, size and
    /// digest (the entry's defect); the daemon sets its `max_payload_bytes`.
    pub max_field_bytes: usize,
    /// Group reads go through the read script, which cuts large values on the server, even
    /// where a connection of the bus's own could cut them as they arrive (a single server over
    /// TCP, plain or TLS, or a Unix socket, and a cluster's masters). Off by default; the script
    /// path is what Sentinel uses, and tests set this to check it on a single server and on a
    /// cluster.
    pub script_reads: bool,
    /// The CA to trust and the client certificate for `rediss://` (the URL, cluster nodes,
    /// sentinels and the master they name, and the streaming group reader); empty: the Mozilla
    /// roots and no client certificate.
    pub tls: crate::Tls,
    /// The batching tasks let the calls that are ready to run queue theirs before a script call
    /// goes out, so the calls of one read share one script call (less CPU per request); off,
    /// the first call of a read goes out alone and at once (see `batch.rs`). On by default.
    pub gather_batches: bool,
    /// How many replicas must have a call record before [`crate::Ledger::begin_call`] says the
    /// call may run: with 1 or more, call records are written on a connection kept for them and
    /// each batch of them is followed there by `WAIT <replica_acks> <replica_ack_timeout>`, and a
    /// record fewer replicas acknowledged comes back as [`CallStart::Unreplicated`]. 0 (the
    /// default): no `WAIT`, records go on the shared connection.
    pub replica_acks: u32,
    /// How long `WAIT` waits for [`RedisOptions::replica_acks`] or
    /// [`RedisOptions::publish_acks`] replicas (not 0).
    pub replica_ack_timeout: Duration,
    /// For callers whose request must survive a failover: how many replicas must have each entry
    /// [`Streams::publish`] and [`Streams::append`] write, checked with `WAIT` right after the
    /// `XADD`, in one pipeline on the shared connection (which it holds meanwhile: meant for a
    /// caller's bus, not the daemon's). An entry fewer replicas acknowledged in time is written,
    /// but is reported as [`Error::Unreplicated`]. 0 (the default): no `WAIT`.
    pub publish_acks: u32,
    /// How many idle connections are kept for blocking reads (of each kind): at least as many
    /// as the process runs blocking reads at once (a reader per stream and shard it reads), so
    /// that none is opened again for every read. Default 8.
    pub idle_blocking: usize,
    /// The ledger's format, written and read (`[dispatch] ledger_format`); see
    /// [`crate::LedgerFormat`]. Format 1 by default.
    pub ledger_format: crate::LedgerFormat,
}

impl RedisOptions {
    /// Options with the defaults for everything but the URL.
    pub fn new(url: impl Into<String>) -> RedisOptions {
        RedisOptions {
            url: url.into(),
            topology: Topology::Single,
            key_prefix: String::new(),
            maxlen: 100_000,
            response_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            max_field_bytes: 1024 * 1024,
            script_reads: false,
            tls: crate::Tls::default(),
            gather_batches: true,
            replica_acks: 0,
            replica_ack_timeout: Duration::from_secs(1),
            publish_acks: 0,
            idle_blocking: MAX_IDLE_BLOCKING,
            ledger_format: crate::LedgerFormat::One,
        }
    }

    /// The `WAIT` that follows call records, if any.
    fn replica_wait(&self) -> Option<ReplicaWait> {
        (self.replica_acks > 0)
            .then_some(ReplicaWait { replicas: self.replica_acks, timeout: self.replica_ack_timeout })
    }
}

/// The Redis implementation of [`Bus`].
pub struct RedisBus {
    connector: Connector,
    /// Whether Redis is a cluster: the ledger then runs as several single-slot steps.
    cluster: bool,
    options: RedisOptions,
    commands: Connection,
    /// The connection call records are written on when they wait for replicas
    /// ([`RedisOptions::replica_acks`]): `WAIT` holds it, so it serves the record batches alone.
    records: Option<Connection>,
    /// Idle connections for blocking reads.
    blocking: Idle<Connection>,
    /// Group reads that cut large values as they arrive (`raw_read`), on a single server reached
    /// over TCP (plain or TLS) or a Unix socket; `None` elsewhere.
    raw: Option<RawReads>,
    /// The same reads on a cluster, each on a connection to the master of its stream's slot;
    /// `None` elsewhere. Where neither is set (Sentinel, [`RedisOptions::script_reads`]), group
    /// reads go through the read script.
    cluster_raw: Option<cluster_reads::ClusterReads>,
    scripts: Scripts,
    /// The ledger steps every call takes, batched across concurrent calls (started on first use,
    /// inside the runtime).
    batchers: Batchers,
}

/// Where raw group reads connect, and their idle connections.
struct RawReads {
    target: RawTarget,
    idle: Idle<RawReader>,
}

/// What an `answer_batch.lua` call's shared part depends on: requests stream, group and
/// retention in ms.
type SharedOf = (String, String, u128);

#[derive(Default)]
struct Batchers {
    begin_call: OnceLock<Batcher>,
    finish: OnceLock<Batcher>,
    /// The common end of a call, `scripts/answer_batch.lua`.
    answer: OnceLock<Batcher>,
    /// The shared parts of `answer`'s calls made so far, by requests stream, group and
    /// retention in ms (a handful), so an answer does not allocate them again.
    answer_shared: Mutex<Vec<(SharedOf, Arc<Shared>)>>,
    /// The cluster ledger's steps (`scripts/cluster/`), each batched by slot.
    cluster_begin_call: OnceLock<Batcher>,
    cluster_claim: OnceLock<Batcher>,
    cluster_publish: OnceLock<Batcher>,
    cluster_settle: OnceLock<Batcher>,
    /// The common end of a call whose answer topic shares the stream's slot, in one script.
    cluster_answer_local: OnceLock<Batcher>,
}

struct Scripts {
    read_group: Script,
    renew_call: Script,
    reclaim: Script,
    delete_consumer: Script,
    prune_consumers: Script,
    prune_listed: Script,
    take_token: Script,
    move_once: Script,
}

/// How much longer than its BLOCK time a blocking read may take before it is abandoned.
const BLOCK_MARGIN: Duration = Duration::from_secs(3);
/// How many idle blocking connections are kept by default ([`RedisOptions::idle_blocking`]).
const MAX_IDLE_BLOCKING: usize = 8;

impl RedisBus {
    /// Prepares a bus for `options.url`. Connections are made lazily, so this succeeds while
    /// Redis is down; the first command then reports [`Error::Unavailable`].
    ///
    /// # Errors
    /// The URL cannot be parsed.
    pub fn new(options: RedisOptions) -> Result<RedisBus, Error> {
        let connector =
            Connector::new(&options.url, &options.topology, &options.tls, options.connect_timeout)?;
        let commands = connector.commands(options.response_timeout)?;
        // Its commands wait for replicas besides running: its timeout covers both.
        let records = match options.replica_acks {
            0 => None,
            _ => Some(connector.commands(options.response_timeout + options.replica_ack_timeout)?),
        };
        if options.topology.is_cluster() && !crate::slots::prefix_is_valid(&options.key_prefix) {
            return Err(Error::Protocol(format!(
                "key prefix '{}' cannot be used on a cluster: no braces, or one hash tag at its start",
                options.key_prefix
            )));
        }
        let raw = match matches!(options.topology, Topology::Single) && !options.script_reads {
            true => RawTarget::of(&options.url, &options.tls)?
                .map(|target| RawReads { target, idle: Idle::new(options.idle_blocking) }),
            false => None,
        };
        let cluster_raw = (options.topology.is_cluster() && !options.script_reads)
            .then(|| cluster_reads::ClusterReads::new(options.tls.clone(), options.idle_blocking));
        let idle_blocking = options.idle_blocking;
        Ok(RedisBus {
            cluster: options.topology.is_cluster(),
            connector,
            options,
            commands,
            records,
            blocking: Idle::new(idle_blocking),
            raw,
            cluster_raw,
            scripts: Scripts {
                read_group: Script::new(concat!(
                    include_str!("scripts/cut_fields.lua"),
                    include_str!("scripts/read_group.lua")
                )),
                renew_call: Script::new(include_str!("scripts/renew_call.lua")),
                reclaim: Script::new(concat!(
                    include_str!("scripts/cut_fields.lua"),
                    include_str!("scripts/reclaim.lua")
                )),
                delete_consumer: Script::new(include_str!("scripts/delete_consumer.lua")),
                prune_consumers: Script::new(include_str!("scripts/prune_consumers.lua")),
                prune_listed: Script::new(include_str!("scripts/cluster/prune_listed.lua")),
                take_token: Script::new(include_str!("scripts/take_token.lua")),
                move_once: Script::new(include_str!("scripts/move_once.lua")),
            },
            batchers: Batchers::default(),
        })
    }

    /// A group read on a connection of `raw`'s: the plain `XREADGROUP ... COUNT count BLOCK`,
    /// its large values cut as they arrive. A connection that failed or stalled is dropped.
    async fn raw_read_group(
        &self,
        raw: &RawReads,
        topic: &str,
        group: &str,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Entry>, RawFailure> {
        let mut reader = match raw.idle.take() {
            Some(reader) => reader,
            None => raw.target.connect(self.options.connect_timeout).await.map_err(RawFailure::Connect)?,
        };
        let limit = self.options.max_field_bytes;
        let read = reader.read_group(topic, group, consumer, count, block, limit);
        match tokio::time::timeout(block + BLOCK_MARGIN, read).await {
            Ok(Ok(entries)) => {
                raw.idle.give_back(reader);
                Ok(entries)
            }
            Ok(Err(ReadError::Reply(err))) => {
                raw.idle.give_back(reader);
                Err(RawFailure::Reply(err))
            }
            Ok(Err(ReadError::Broken(err))) => Err(RawFailure::Broken(err)),
            Err(_elapsed) => Err(RawFailure::Broken(stalled(block))),
        }
    }

    /// A group read on a cluster through the raw reader of the master serving `topic`'s slot (see
    /// `cluster_reads`); `None` when this read must go through the script instead (the master is
    /// not known, the slot is migrating, the cluster does not say where slots are).
    async fn cluster_raw_read_group(
        &self,
        reads: &cluster_reads::ClusterReads,
        topic: &str,
        group: &str,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Option<Vec<Entry>>, Error> {
        let slot = crate::slots::slot(topic.as_bytes());
        let mut tried = false;
        loop {
            let Some(map) = reads
                .map(&self.connector, self.options.connect_timeout, self.options.response_timeout)
                .await?
            else {
                return Ok(None);
            };
            let Some(raw) = map.reads_of(slot) else { return Ok(None) };
            let err = match self.raw_read_group(raw, topic, group, consumer, count, block).await {
                Ok(entries) => return Ok(Some(entries)),
                Err(RawFailure::Reply(err)) => match cluster_reads::Redirect::of(&err) {
                    cluster_reads::Redirect::Ask => return Ok(None),
                    cluster_reads::Redirect::None => return Err(err),
                    // The node refused the read, so nothing was delivered: read again where the
                    // map now says.
                    cluster_reads::Redirect::Moved => err,
                },
                // Nothing was sent: the node may be gone.
                Err(RawFailure::Connect(err)) => err,
                // Whatever the read delivered stays pending for the reclaimer, as on one server;
                // reading again now could only deliver other entries, but the node is suspect.
                Err(RawFailure::Broken(err)) => {
                    reads.forget(&map);
                    raw.idle.clear();
                    return Err(err);
                }
            };
            reads.forget(&map);
            if std::mem::replace(&mut tried, true) {
                return Err(err);
            }
        }
    }

    /// Runs a blocking read on a pooled connection, abandoning it if the server stalls.
    async fn blocking_read(&self, cmd: redis::Cmd, block: Duration) -> Result<Value, Error> {
        let mut connection = match self.blocking.take() {
            Some(connection) => connection,
            None => self.connector.blocking()?,
        };
        match tokio::time::timeout(block + BLOCK_MARGIN, cmd.query_async::<Value>(&mut connection)).await {
            Ok(Ok(value)) => {
                self.blocking.give_back(connection);
                Ok(value)
            }
            Ok(Err(err)) => {
                let err = Error::from(err);
                if !matches!(err, Error::Unavailable(_)) {
                    self.blocking.give_back(connection);
                }
                Err(err)
            }
            Err(_elapsed) => Err(stalled(block)),
        }
    }
}

/// How a raw group read failed.
enum RawFailure {
    /// No connection could be made: nothing was sent.
    Connect(Error),
    /// Redis answered with an error: nothing was delivered, and the connection is kept.
    Reply(Error),
    /// The connection broke or stalled during the read and was dropped: entries the read
    /// delivered, if any, are pending in the group until the reclaimer hands them out again.
    Broken(Error),
}

impl From<RawFailure> for Error {
    fn from(failure: RawFailure) -> Error {
        match failure {
            RawFailure::Connect(err) | RawFailure::Reply(err) | RawFailure::Broken(err) => err,
        }
    }
}

/// The error of a blocking read of `block` that did not come back within its margin.
fn stalled(block: Duration) -> Error {
    Error::Protocol(format!("blocking read did not return within {} ms", (block + BLOCK_MARGIN).as_millis()))
}

/// Idle connections of one kind, kept for the next blocking read (at most
/// [`RedisOptions::idle_blocking`]).
struct Idle<T>(Mutex<Vec<T>>, usize);

impl<T> Idle<T> {
    fn new(most: usize) -> Idle<T> {
        Idle(Mutex::new(Vec::new()), most.max(1))
    }

    fn take(&self) -> Option<T> {
        // A poisoned lock only means another reader panicked while pushing; the pool is still sound.
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop()
    }

    /// Drops every idle connection (their server is suspect).
    fn clear(&self) {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
    }

    fn give_back(&self, connection: T) {
        let mut idle = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if idle.len() < self.1 {
            idle.push(connection);
        }
    }
}

#[async_trait]
impl Streams for RedisBus {
    async fn publish(&self, topic: &str, id: &str, payload: &str) -> Result<String, Error> {
        self.append(topic, &[("id", id), ("payload", payload)], None).await
    }

    async fn append(
        &self,
        topic: &str,
        fields: &[(&str, &str)],
        maxlen: Option<u64>,
    ) -> Result<String, Error> {
        let maxlen = maxlen.map_or(self.options.maxlen, |maxlen| maxlen as usize);
        let mut connection = self.commands.clone();
        let trim = redis::streams::StreamMaxlen::Approx(maxlen);
        if self.options.publish_acks == 0 {
            let entry_id: String = connection.xadd_maxlen(topic, trim, "*", fields).await?;
            return Ok(entry_id);
        }
        // The WAIT in one pipeline with the XADD: on the same connection, so it counts the
        // replicas that have this entry.
        let wanted = self.options.publish_acks;
        let timeout = self.options.replica_ack_timeout;
        let (entry_id, acked): (String, u32) = redis::pipe()
            .xadd_maxlen(topic, trim, "*", fields)
            .cmd("WAIT")
            .arg(wanted)
            .arg(timeout.as_millis().max(1) as u64)
            .query_async(&mut connection)
            .await?;
        if acked < wanted {
            return Err(Error::Unreplicated { entry_id, acked, wanted, timeout });
        }
        Ok(entry_id)
    }

    async fn read(
        &self,
        topic: &str,
        cursor: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<Entry>, Error> {
        let after =
            if is_entry_id(cursor) { cursor.to_owned() } else { self.find_message(topic, cursor).await? };
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(count);
        if let Some(block) = block {
            cmd.arg("BLOCK").arg(block.as_millis() as u64);
        }
        cmd.arg("STREAMS").arg(topic).arg(after);
        let value = match block {
            Some(block) => self.blocking_read(cmd, block).await?,
            None => cmd.query_async(&mut self.commands.clone()).await?,
        };
        // Plain reads (answers, chat streams) are not cut: only group reads guard the daemon.
        entries_from_read(value, usize::MAX)
    }

    async fn read_back(&self, topic: &str, end: &str, count: usize) -> Result<Vec<Entry>, Error> {
        let mut cmd = redis::cmd("XREVRANGE");
        cmd.arg(topic).arg(end).arg("-").arg("COUNT").arg(count);
        let value: Value = cmd.query_async(&mut self.commands.clone()).await?;
        entries_from_range(value, usize::MAX)
    }

    async fn last_entry_id(&self, topic: &str) -> Result<String, Error> {
        let mut connection = self.commands.clone();
        let reply: redis::streams::StreamRangeReply = connection.xrevrange_count(topic, "+", "-", 1).await?;
        Ok(reply.ids.first().map_or_else(|| "0-0".to_owned(), |entry| entry.id.clone()))
    }

    async fn delete_entries(&self, topic: &str, entry_ids: &[String]) -> Result<u64, Error> {
        if entry_ids.is_empty() {
            return Ok(0);
        }
        let mut connection = self.commands.clone();
        let deleted: usize = connection.xdel(topic, entry_ids).await?;
        Ok(deleted as u64)
    }
}

#[async_trait]
impl Groups for RedisBus {
    async fn ensure_group_at(&self, topic: &str, group: &str, start: &str) -> Result<(), Error> {
        let mut connection = self.commands.clone();
        match connection.xgroup_create_mkstream::<_, _, _, ()>(topic, group, start).await {
            Ok(()) => Ok(()),
            Err(err) if err.code() == Some("BUSYGROUP") => Ok(()),
            // The first command of a start: a cluster connection that could not connect says
            // only that it has no connection, so ask what stopped it (a TLS failure ends start-up).
            Err(err) => match self.connector.tls_failure().await {
                Some(tls) => Err(tls),
                None => Err(err.into()),
            },
        }
    }

    async fn read_group(
        &self,
        topic: &str,
        group: &str,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Entry>, Error> {
        if let Some(raw) = &self.raw {
            return Ok(self.raw_read_group(raw, topic, group, consumer, count, block).await?);
        }
        if let Some(reads) = &self.cluster_raw
            && let Some(entries) =
                self.cluster_raw_read_group(reads, topic, group, consumer, count, block).await?
        {
            return Ok(entries);
        }
        let limit = self.options.max_field_bytes;
        // New entries without blocking, their large values cut on the server.
        let value: Value = self
            .scripts
            .read_group
            .key(topic)
            .arg(group)
            .arg(consumer)
            .arg(count)
            .arg(limit)
            .arg(DEFECT_HEAD_BYTES)
            .invoke_async(&mut self.commands.clone())
            .await
            .map_err(|err| match Error::from(err) {
                // Redis 7 keeps the code of an error raised by `redis.call`; 6.2 reports it as
                // `ERR Error running script ... NOGROUP ...`.
                Error::Refused(cause) if cause.message().contains("NOGROUP") => Error::NoGroup(cause),
                err => err,
            })?;
        let entries = entries_from_script(value, limit)?;
        if !entries.is_empty() || block.is_zero() {
            return Ok(entries);
        }
        // Nothing yet: wait for one entry, read raw (cut here). The next read goes back to the
        // script for whatever arrived meanwhile.
        let options =
            StreamReadOptions::default().group(group, consumer).count(1).block(block.as_millis() as usize);
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg(&options).arg("STREAMS").arg(topic).arg(">");
        let value = self.blocking_read(cmd, block).await?;
        entries_from_read(value, limit)
    }

    async fn ack(&self, topic: &str, group: &str, entry_ids: &[String]) -> Result<(), Error> {
        if entry_ids.is_empty() {
            return Ok(());
        }
        let mut connection = self.commands.clone();
        let _: u64 = connection.xack(topic, group, entry_ids).await?;
        Ok(())
    }

    async fn reclaim(
        &self,
        topic: &str,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        start: &str,
        count: usize,
    ) -> Result<Reclaimed, Error> {
        let value: Value = self
            .scripts
            .reclaim
            .key(topic)
            .arg(group)
            .arg(consumer)
            .arg(min_idle.as_millis() as u64)
            .arg(start)
            .arg(count)
            .arg(self.options.max_field_bytes)
            .arg(DEFECT_HEAD_BYTES)
            .invoke_async(&mut self.commands.clone())
            .await?;
        reclaimed_from_value(value, self.options.max_field_bytes)
    }

    async fn hand_over(&self, topic: &str, group: &str, consumer: &str, entry_id: &str) -> Result<(), Error> {
        let mut connection = self.commands.clone();
        let _: Value = redis::cmd("XCLAIM")
            .arg(topic)
            .arg(group)
            .arg(consumer)
            .arg(0)
            .arg(entry_id)
            .arg("JUSTID")
            .query_async(&mut connection)
            .await?;
        Ok(())
    }

    async fn move_once(
        &self,
        to: &str,
        mark: &str,
        fields: &[(&str, &str)],
        retention: Duration,
    ) -> Result<bool, Error> {
        if self.cluster {
            cluster::same_slot("move_once", &[to, mark])?;
        }
        let mut invocation = self.scripts.move_once.key(to);
        invocation.key(mark).arg(retention.as_millis().max(1) as u64);
        for (name, value) in fields {
            invocation.arg(*name).arg(*value);
        }
        let added: u8 = invocation.invoke_async(&mut self.commands.clone()).await?;
        Ok(added == 1)
    }

    async fn delete_consumer(&self, topic: &str, group: &str, consumer: &str) -> Result<bool, Error> {
        let deleted: u8 = self
            .scripts
            .delete_consumer
            .key(topic)
            .arg(group)
            .arg(consumer)
            .invoke_async(&mut self.commands.clone())
            .await?;
        Ok(deleted == 1)
    }

    async fn prune_consumers(
        &self,
        topic: &str,
        group: &str,
        keep: &str,
        min_idle: Duration,
        heartbeat_prefix: &str,
    ) -> Result<Vec<String>, Error> {
        if self.cluster {
            return self.cluster_prune_consumers(topic, group, keep, min_idle, heartbeat_prefix).await;
        }
        let deleted: Vec<String> = self
            .scripts
            .prune_consumers
            .key(topic)
            .arg(group)
            .arg(keep)
            .arg(min_idle.as_millis() as u64)
            .arg(heartbeat_prefix)
            .invoke_async(&mut self.commands.clone())
            .await?;
        Ok(deleted)
    }
}

#[async_trait]
impl Ledger for RedisBus {
    async fn begin_call(&self, call: &CallKeys<'_>, owner: &str, entry_id: &str) -> Result<CallStart, Error> {
        let batcher = if self.cluster {
            self.cluster_begin_batcher(call)?
        } else {
            self.batchers.begin_call.get_or_init(|| {
                let source =
                    concat!(include_str!("scripts/begin_call.lua"), include_str!("scripts/call_lease.lua"));
                let (connection, wait) = self.record_connection();
                Batcher::waiting(source, 3, 5, connection, false, self.options.gather_batches, wait)
            })
        };
        let (reply, acked) = batcher
            .invoke_acked(
                vec![call.answered.to_owned(), call.call.to_owned(), call.entry.to_owned()],
                vec![
                    owner.to_owned(),
                    call.lease.as_millis().to_string(),
                    call.retention.as_millis().to_string(),
                    entry_id.to_owned(),
                    self.ledger_reads_flag().to_owned(),
                ],
            )
            .await?;
        let start = start_from(reply)?;
        Ok(self.replicated(start, acked))
    }

    async fn renew_call(
        &self,
        call: &CallKeys<'_>,
        owner: &str,
        entry: &EntryRef<'_>,
        consumer: &str,
        tracked: bool,
    ) -> Result<bool, Error> {
        if self.cluster {
            cluster::same_slot("renew_call", &[call.call, entry.topic])?;
        }
        let renewed: u8 = self
            .scripts
            .renew_call
            .key(call.call)
            .key(entry.topic)
            .arg(owner)
            .arg(call.lease.as_millis() as u64)
            .arg(entry.group)
            .arg(consumer)
            .arg(entry.entry_id)
            .arg(flag(tracked))
            .invoke_async(&mut self.commands.clone())
            .await?;
        Ok(renewed == 1)
    }

    async fn finish(&self, finish: &Finish<'_>) -> Result<Committed, Error> {
        if self.cluster {
            return self.cluster_finish(finish).await;
        }
        if is_lean_answer(finish)
            && let (Some(call), Some(answer)) = (finish.call, finish.answer)
        {
            return self.answer(finish.entry, &call, answer, finish.tracked, finish.kept).await;
        }
        let entry = finish.entry;
        let (answered, call, refused, retention) = match finish.call {
            Some(call) => (call.answered, call.call, call.entry, call.retention),
            None => (entry.topic, entry.topic, entry.topic, Duration::ZERO),
        };
        let answer = finish.answer.unwrap_or(crate::Published { topic: entry.topic, id: "", payload: "" });
        let dead_letter =
            finish.dead_letter.unwrap_or(crate::Published { topic: entry.topic, id: "", payload: "" });
        let batcher = self.batchers.finish.get_or_init(|| {
            Batcher::new(
                concat!(include_str!("scripts/add_answer.lua"), include_str!("scripts/finish.lua")),
                7,
                14,
                self.commands.clone(),
                false,
                self.options.gather_batches,
            )
        });
        let keys = [
            entry.topic,
            answered,
            call,
            answer.topic,
            dead_letter.topic,
            finish.answer_copy.unwrap_or(answer.topic),
            refused,
        ];
        let args = [
            entry.group,
            entry.entry_id,
            &self.options.maxlen.to_string(),
            &retention.as_millis().to_string(),
            answer.id,
            answer.payload,
            dead_letter.id,
            dead_letter.payload,
            flag(finish.call.is_some()),
            flag(finish.answer_copy.is_some()),
            flag(finish.final_answer),
            finish.kept.unwrap_or_default(),
            flag(finish.replay),
            flag(self.options.ledger_format.writes_placeholders()),
        ];
        let reply = batcher
            .invoke(
                keys.iter().map(|key| (*key).to_owned()).collect(),
                args.iter().map(|arg| (*arg).to_owned()).collect(),
            )
            .await?;
        committed_from(reply)
    }
}

#[async_trait]
impl Directory for RedisBus {
    async fn replace_hash(&self, key: &str, fields: &[(String, String)]) -> Result<(), Error> {
        let mut pipe = redis::pipe();
        pipe.atomic().del(key).ignore();
        if !fields.is_empty() {
            pipe.hset_multiple(key, fields).ignore();
        }
        let () = pipe.query_async(&mut self.commands.clone()).await?;
        Ok(())
    }

    async fn hash_fields(&self, key: &str) -> Result<Vec<(String, String)>, Error> {
        let mut connection = self.commands.clone();
        let fields: Vec<(String, String)> = connection.hgetall(key).await?;
        Ok(fields)
    }

    async fn values(&self, keys: &[String]) -> Result<Vec<Option<String>>, Error> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut connection = self.commands.clone();
        let values: Vec<Option<String>> = redis::cmd("MGET").arg(keys).query_async(&mut connection).await?;
        Ok(values)
    }

    async fn set_expiring(&self, key: &str, value: &str, ttl: Duration) -> Result<(), Error> {
        let mut connection = self.commands.clone();
        let () = connection.pset_ex(key, value, ttl.as_millis() as u64).await?;
        Ok(())
    }

    async fn delete(&self, keys: &[String]) -> Result<(), Error> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut connection = self.commands.clone();
        let _: u64 = connection.del(keys).await?;
        Ok(())
    }

    async fn add_member(&self, key: &str, member: &str) -> Result<bool, Error> {
        let added: u64 = self.commands.clone().sadd(key, member).await?;
        Ok(added == 1)
    }

    async fn members(&self, key: &str) -> Result<Vec<String>, Error> {
        let mut members: Vec<String> = self.commands.clone().smembers(key).await?;
        members.sort();
        Ok(members)
    }

    async fn remove_members(&self, key: &str, members: &[String]) -> Result<(), Error> {
        if members.is_empty() {
            return Ok(());
        }
        let _: u64 = self.commands.clone().srem(key, members).await?;
        Ok(())
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool, Error> {
        let mut connection = self.commands.clone();
        let set: bool = connection.pexpire(key, ttl.as_millis() as i64).await?;
        Ok(set)
    }
}

#[async_trait]
impl crate::RateLimits for RedisBus {
    async fn take_token(&self, key: &str, per_second: f64, burst: f64) -> Result<Option<Duration>, Error> {
        let wait: u64 = self
            .scripts
            .take_token
            .key(key)
            .arg(per_second)
            .arg(burst)
            .invoke_async(&mut self.commands.clone())
            .await?;
        Ok((wait > 0).then(|| Duration::from_millis(wait)))
    }
}

#[async_trait]
impl Server for RedisBus {
    async fn ping(&self) -> Result<(), Error> {
        let _: String = redis::cmd("PING").query_async(&mut self.commands.clone()).await?;
        Ok(())
    }

    async fn keys_matching(&self, pattern: &str) -> Result<Vec<String>, Error> {
        if self.cluster {
            return self.cluster_keys_matching(pattern).await;
        }
        let mut connection = self.commands.clone();
        let mut cursor: u64 = 0;
        let mut keys = Vec::new();
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(500)
                .query_async(&mut connection)
                .await?;
            keys.extend(batch);
            if next == 0 {
                keys.sort();
                return Ok(keys);
            }
            cursor = next;
        }
    }

    async fn group_info(&self, topic: &str) -> Result<Vec<GroupInfo>, Error> {
        let mut connection = self.commands.clone();
        let reply: Result<redis::streams::StreamInfoGroupsReply, _> = connection.xinfo_groups(topic).await;
        let reply = match reply {
            Ok(reply) => reply,
            // XINFO on a missing key is an error, but a missing topic simply has no groups.
            Err(err) if err.to_string().contains("no such key") => return Ok(Vec::new()),
            Err(err) => return Err(err.into()),
        };
        Ok(reply
            .groups
            .into_iter()
            .map(|group| GroupInfo {
                name: group.name,
                pending: group.pending as u64,
                lag: group.lag.map(|lag| lag as u64),
            })
            .collect())
    }

    async fn eviction_policy(&self) -> Result<Option<String>, Error> {
        let reply: Value = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut self.commands.clone())
            .await?;
        let pairs: Vec<(String, String)> = match reply {
            Value::Map(pairs) => redis::from_redis_value(Value::Map(pairs)),
            other => redis::from_redis_value(other),
        }
        .map_err(|err| Error::Protocol(err.to_string()))?;
        Ok(pairs.into_iter().find(|(name, _)| name == "maxmemory-policy").map(|(_, policy)| policy))
    }

    async fn server_version(&self) -> Result<Option<String>, Error> {
        // A cluster connection may ask every node and answer a map of node to text.
        let reply: Value = redis::cmd("INFO").arg("server").query_async(&mut self.commands.clone()).await?;
        Ok(lowest_version(reply))
    }
}

/// The lowest `redis_version` of an `INFO server` reply (one text, or one per node).
fn lowest_version(reply: Value) -> Option<String> {
    let mut texts = Vec::new();
    info_texts(reply, &mut texts);
    let versions = texts.iter().flat_map(|text| text.lines()).filter_map(|line| {
        line.trim().strip_prefix("redis_version:").map(|version| version.trim().to_owned())
    });
    versions.min_by_key(|version| version_key(version))
}

/// The texts of an `INFO` reply: one string, or one per node in a map or array.
fn info_texts(reply: Value, texts: &mut Vec<String>) {
    match reply {
        Value::BulkString(bytes) => texts.push(String::from_utf8_lossy(&bytes).into_owned()),
        Value::SimpleString(text) | Value::VerbatimString { text, .. } => texts.push(text),
        Value::Map(pairs) => pairs.into_iter().for_each(|(_, value)| info_texts(value, texts)),
        Value::Array(values) | Value::Set(values) => {
            values.into_iter().for_each(|value| info_texts(value, texts))
        }
        Value::Attribute { data, .. } => info_texts(*data, texts),
        _ => {}
    }
}

/// `major.minor.patch` as numbers to order versions by; missing or unreadable parts count 0.
fn version_key(version: &str) -> Vec<u64> {
    version.split('.').map(|part| part.parse().unwrap_or(0)).collect()
}

impl RedisBus {
    /// The connection call records are written on, and the `WAIT` that follows them: the
    /// records' own connection when they wait for replicas, else the shared one.
    fn record_connection(&self) -> (Connection, Option<ReplicaWait>) {
        match &self.records {
            Some(records) => (records.clone(), self.options.replica_wait()),
            None => (self.commands.clone(), None),
        }
    }

    /// `start` as the caller must take it, given how many replicas acknowledged the record
    /// (`None`: nobody asked). A start that wrote a call record ([`CallStart::Fresh`],
    /// [`CallStart::StartedBefore`]) acknowledged by fewer replicas than
    /// [`RedisOptions::replica_acks`] becomes [`CallStart::Unreplicated`]; the others wrote
    /// nothing a failover could lose and run no tool, so they stand.
    fn replicated(&self, start: CallStart, acked: Option<u32>) -> CallStart {
        let Some(acked) = acked else { return start };
        let wanted = self.options.replica_acks;
        let started_before = match start {
            _ if acked >= wanted => return start,
            CallStart::Fresh => false,
            CallStart::StartedBefore { .. } => true,
            start => return start,
        };
        CallStart::Unreplicated { started_before, acked, wanted, timeout: self.options.replica_ack_timeout }
    }
}

impl RedisBus {
    /// Finds the entry id of the message whose `id` field is `message_id`, newest first.
    async fn find_message(&self, topic: &str, message_id: &str) -> Result<String, Error> {
        const PAGE: usize = 1000;
        let mut connection = self.commands.clone();
        let mut end = "+".to_owned();
        loop {
            let reply: redis::streams::StreamRangeReply =
                connection.xrevrange_count(topic, &end, "-", PAGE).await?;
            for entry in &reply.ids {
                if entry.get::<String>("id").as_deref() == Some(message_id) {
                    return Ok(entry.id.clone());
                }
            }
            match reply.ids.last() {
                Some(last) if reply.ids.len() == PAGE => end = format!("({}", last.id),
                _ => return Err(Error::CursorNotFound(message_id.to_owned())),
            }
        }
    }
}

impl RedisBus {
    /// The common end of a call, a final answer and nothing else, through the lean
    /// `scripts/answer_batch.lua`: one `SET NX GET` for the answered mark, the entry's refusal
    /// mark checked, the answer, and one `XACK` for all the entries of a stream and group
    /// finished together.
    async fn answer(
        &self,
        entry: EntryRef<'_>,
        call: &CallKeys<'_>,
        answer: crate::Published<'_>,
        tracked: bool,
        kept: Option<&str>,
    ) -> Result<Committed, Error> {
        let batcher = self.batchers.answer.get_or_init(|| {
            Batcher::for_batches(
                concat!(include_str!("scripts/add_answer.lua"), include_str!("scripts/answer_batch.lua")),
                (3, 4),
                5,
                self.commands.clone(),
                self.options.gather_batches,
            )
        });
        let shared = self.answer_shared(entry.topic, entry.group, call.retention);
        // The call record's key only when this call wrote one (or may have found one): the common
        // end, a read-only idempotent tool, carries three keys.
        let mut keys = Vec::with_capacity(if tracked { 4 } else { 3 });
        keys.extend([call.answered.to_owned(), call.entry.to_owned(), answer.topic.to_owned()]);
        if tracked {
            keys.push(call.call.to_owned());
        }
        let args = vec![
            entry.entry_id.to_owned(),
            answer.id.to_owned(),
            answer.payload.to_owned(),
            flag(tracked).to_owned(),
            kept.unwrap_or_default().to_owned(),
        ];
        let reply = batcher.invoke_shared(shared, keys, args).await?;
        committed_from(reply)
    }
}

impl RedisBus {
    /// How the answer and begin scripts read the ledger: whether format 2's notes of refusals
    /// are trusted, and on a cluster whether new claims are strings (`cluster::reads_flag`).
    fn ledger_reads_flag(&self) -> &'static str {
        if self.cluster {
            cluster::reads_flag(self.options.ledger_format)
        } else {
            flag(self.options.ledger_format.trusts_placeholders())
        }
    }

    /// The shared part of `answer_batch.lua` calls for a stream, group and retention.
    fn answer_shared(&self, topic: &str, group: &str, retention: Duration) -> Arc<Shared> {
        let millis = retention.as_millis();
        let mut known = self.batchers.answer_shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let found =
            known.iter().find(|((stream, of, ms), _)| stream == topic && of == group && *ms == millis);
        if let Some((_, shared)) = found {
            return Arc::clone(shared);
        }
        let shared = Arc::new(Shared {
            keys: vec![topic.to_owned()],
            args: vec![
                group.to_owned(),
                self.options.maxlen.to_string(),
                millis.to_string(),
                self.ledger_reads_flag().to_owned(),
            ],
        });
        known.push(((topic.to_owned(), group.to_owned(), millis), Arc::clone(&shared)));
        shared
    }
}

/// Whether `finish` is the common end of a call: a final answer and nothing else, which one
/// server ends with the lean `answer_batch.lua` and which, on a cluster, deletes a call record
/// only when the call may have one (`Finish::tracked`).
pub(crate) fn is_lean_answer(finish: &Finish<'_>) -> bool {
    finish.final_answer
        && finish.answer.is_some()
        && finish.answer_copy.is_none()
        && finish.dead_letter.is_none()
        && !finish.replay
}

/// A yes-or-no script argument: `"1"` or `"0"`.
pub(crate) fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}

/// Decodes a finish script's reply for one entry: 1 published, -1 wrong type, `{2, mark}` a
/// kept answer of another entry, else not published.
fn committed_from(reply: Value) -> Result<Committed, Error> {
    if let Value::Array(parts) = &reply
        && let [Value::Int(2), mark] = parts.as_slice()
    {
        let mark: String =
            redis::from_redis_value(mark.clone()).map_err(|err| Error::Protocol(err.to_string()))?;
        let kept = KeptAnswer::from_mark(&mark)
            .ok_or_else(|| Error::Protocol("a kept answer's mark without its payload".to_owned()))?;
        return Ok(Committed::Kept(kept));
    }
    let published: i8 = redis::from_redis_value(reply).map_err(|err| Error::Protocol(err.to_string()))?;
    Ok(match published {
        1 => Committed::Published,
        -1 => Committed::WrongType,
        _ => Committed::NotPublished,
    })
}

/// Decodes the reply of a `begin_call` script, `{state, entry}`, or `{0, '', mark}` for a request
/// answered with a kept answer.
fn start_from(reply: Value) -> Result<CallStart, Error> {
    if let Value::Array(parts) = &reply
        && let [Value::Int(0), _, mark] = parts.as_slice()
    {
        let mark: String =
            redis::from_redis_value(mark.clone()).map_err(|err| Error::Protocol(err.to_string()))?;
        return Ok(KeptAnswer::from_mark(&mark).map_or(CallStart::Answered, CallStart::AnsweredKept));
    }
    let (state, entry): (u8, String) =
        redis::from_redis_value(reply).map_err(|err| Error::Protocol(err.to_string()))?;
    Ok(match state {
        0 => CallStart::Answered,
        1 => CallStart::Fresh,
        2 => CallStart::StartedBefore { holder: entry },
        _ => CallStart::Busy { entry_id: entry },
    })
}

/// Decodes an `XREAD`/`XREADGROUP` reply, `[[stream, [[entry id, [field, value, ...]], ...]], ...]`
/// (or a map of streams, RESP3), each entry on its own (see [`entry_from_raw`]).
fn entries_from_read(value: Value, limit: usize) -> Result<Vec<Entry>, Error> {
    let bad = || Error::Protocol("malformed stream read reply".to_owned());
    let streams: Vec<Value> = match value {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(streams) => streams
            .into_iter()
            .map(|stream| array(stream)?.into_iter().nth(1))
            .collect::<Option<_>>()
            .ok_or_else(bad)?,
        Value::Map(streams) => streams.into_iter().map(|(_, items)| items).collect(),
        _ => return Err(bad()),
    };
    let mut entries = Vec::new();
    for items in streams {
        entries.extend(entries_from_range(items, limit)?);
    }
    Ok(entries)
}

/// Decodes the entries of one stream, `[[entry id, [field, value, ...]], ...]`: an `XRANGE` or
/// `XREVRANGE` reply, or one stream of an `XREAD` reply.
fn entries_from_range(items: Value, limit: usize) -> Result<Vec<Entry>, Error> {
    let bad = || Error::Protocol("malformed stream range reply".to_owned());
    let items = match items {
        Value::Nil => return Ok(Vec::new()),
        items => array(items).ok_or_else(bad)?,
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        let mut parts = array(item).ok_or_else(bad)?.into_iter();
        let (Some(entry_id), fields) = (parts.next().and_then(bytes), parts.next()) else {
            return Err(bad());
        };
        entries.push(
            entry_from_raw(&entry_id, fields.unwrap_or(Value::Nil), Value::Nil, limit).ok_or_else(bad)?,
        );
    }
    Ok(entries)
}

/// Decodes the reply of `scripts/read_group.lua`: `[[entry id, [field, value, ...]], ...]`, an
/// entry with a value cut on the server carrying a third element, `[[field, size, sha1], ...]`.
fn entries_from_script(value: Value, limit: usize) -> Result<Vec<Entry>, Error> {
    let bad = || Error::Protocol("malformed read_group reply".to_owned());
    let items = array(value).ok_or_else(bad)?;
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        let mut parts = array(item).ok_or_else(bad)?.into_iter();
        let (Some(entry_id), Some(fields)) = (parts.next().and_then(bytes), parts.next()) else {
            return Err(bad());
        };
        let cut = parts.next().unwrap_or(Value::Nil);
        entries.push(entry_from_raw(&entry_id, fields, cut, limit).ok_or_else(bad)?);
    }
    Ok(entries)
}

/// One entry from its raw id, its `[field, value, ...]` list (or map) and the server's list of
/// values it cut (`[[field, size, sha1], ...]`). Each value is judged on its own: one that is not
/// UTF-8, or longer than `limit`, becomes the entry's defect. `None` when the shape is wrong.
fn entry_from_raw(entry_id: &[u8], fields: Value, cut: Value, limit: usize) -> Option<Entry> {
    let entry_id = String::from_utf8_lossy(entry_id);
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = match fields {
        // An entry deleted while pending has no fields.
        Value::Nil => Vec::new(),
        Value::Map(pairs) => pairs
            .into_iter()
            .map(|(name, value)| Some((bytes(name)?, bytes(value)?)))
            .collect::<Option<_>>()?,
        fields => {
            let mut flat = array(fields)?.into_iter();
            let mut pairs = Vec::with_capacity(2);
            while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
                pairs.push((bytes(name)?, bytes(value)?));
            }
            pairs
        }
    };
    let mut cuts = Vec::new();
    if !matches!(cut, Value::Nil) {
        for item in array(cut)? {
            let mut parts = array(item)?.into_iter();
            let name = bytes(parts.next()?)?;
            let size = match parts.next()? {
                Value::Int(size) => u64::try_from(size).ok()?,
                other => String::from_utf8(bytes(other)?).ok()?.parse().ok()?,
            };
            let sha1 = String::from_utf8(bytes(parts.next()?)?).ok()?;
            cuts.push((name, size, sha1));
        }
    }
    Some(raw_read::entry_with_cuts(&entry_id, pairs, cuts, limit))
}

/// The bytes of a string reply.
fn bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.into_bytes()),
        _ => None,
    }
}

/// The items of an array reply.
fn array(value: Value) -> Option<Vec<Value>> {
    match value {
        Value::Array(items) | Value::Set(items) => Some(items),
        _ => None,
    }
}

/// Decodes the reply of `scripts/reclaim.lua`.
fn reclaimed_from_value(value: Value, limit: usize) -> Result<Reclaimed, Error> {
    let bad = || Error::Protocol("malformed reclaim reply".to_owned());
    let Value::Array(parts) = value else { return Err(bad()) };
    let [next_start, claimed, deleted]: [Value; 3] = parts.try_into().map_err(|_| bad())?;
    let next_start: String = redis::from_redis_value(next_start).map_err(|_| bad())?;
    let deleted: Vec<String> = redis::from_redis_value(deleted).map_err(|_| bad())?;
    let mut entries = Vec::new();
    for item in array(claimed).ok_or_else(bad)? {
        let mut parts = array(item).ok_or_else(bad)?.into_iter();
        let (Some(entry_id), Some(Value::Int(deliveries)), Some(fields), cut) =
            (parts.next().and_then(bytes), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let mut entry =
            entry_from_raw(&entry_id, fields, cut.unwrap_or(Value::Nil), limit).ok_or_else(bad)?;
        entry.deliveries = u64::try_from(deliveries).unwrap_or(1);
        entries.push(entry);
    }
    Ok(Reclaimed { next_start, entries, deleted })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rediss://` must reach a TLS handshake and fail it cleanly against a server that does not
    /// speak TLS, rather than panic for want of a rustls crypto provider.
    #[tokio::test]
    async fn tls_urls_fail_cleanly_against_a_plain_server() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(4) {
                let Ok(mut stream) = stream else { return };
                let _ = std::io::Write::write_all(&mut stream, b"-ERR not tls\r\n");
            }
        });
        let mut options = RedisOptions::new(format!("rediss://user:secret@127.0.0.1:{port}/0"));
        options.connect_timeout = Duration::from_millis(500);
        options.response_timeout = Duration::from_millis(500);
        let bus = RedisBus::new(options).unwrap();
        let err = bus.ping().await.unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn the_lowest_redis_version_of_an_info_reply_is_read() {
        let info = |version: &str| format!("# Server\r\nredis_version:{version}\r\nredis_mode:cluster\r\n");
        assert_eq!(lowest_version(Value::BulkString(info("6.2.14").into_bytes())).as_deref(), Some("6.2.14"));
        let nodes = Value::Map(vec![
            (Value::SimpleString("a:7000".to_owned()), Value::BulkString(info("7.10.0").into_bytes())),
            (Value::SimpleString("b:7001".to_owned()), Value::BulkString(info("7.2.4").into_bytes())),
        ]);
        assert_eq!(lowest_version(nodes).as_deref(), Some("7.2.4"));
        assert_eq!(lowest_version(Value::Nil), None);
        assert!(version_key("6.2.14") < version_key("7.0.0"));
    }
}
