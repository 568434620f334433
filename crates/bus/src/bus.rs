//! The transport's traits, each what one consumer needs ([`Streams`], [`Groups`], [`Ledger`],
//! [`Directory`], [`Server`]), the [`Bus`] that is all of them, and the values their operations exchange.

use std::time::Duration;

use async_trait::async_trait;
use toolhost_envelope::Entry;

use crate::Error;

/// The whole transport: every narrow trait at once.
///
/// Implementations: [`crate::RedisBus`] for production, against Redis or nothing. A consumer asks
/// for the narrowest trait it needs ([`Streams`], [`Groups`], [`Ledger`], [`Directory`], [`Server`]); the daemon
/// holds one `Arc<dyn Bus>` and hands out views of it. Entries read through a group stay pending
/// until acked, pending entries idle past a limit can be claimed by another consumer, and
/// delivery counts grow with each delivery.
pub trait Bus: FleetAccess + Groups + Ledger + Server + RateLimits {}

impl<T: Streams + Groups + Ledger + Directory + Server + RateLimits> Bus for T {}

/// Token buckets kept in Redis, shared by every replica (`[auth] shared_limits`).
#[async_trait]
pub trait RateLimits: Send + Sync + 'static {
    /// Takes one token from the bucket at `key`, which refills at `per_second` tokens a second
    /// up to `burst`, on the server's clock. `None` when a token was taken; else how long until
    /// one will be there.
    async fn take_token(&self, key: &str, per_second: f64, burst: f64) -> Result<Option<Duration>, Error>;
}

/// Plain streams: append, read after a cursor, delete entries. What callers, chat tools and the
/// dead-letter commands need.
#[async_trait]
pub trait Streams: Send + Sync + 'static {
    /// Appends one message (`id`, `payload`) to `topic`, trimming it to about the configured
    /// length. Returns the new entry id.
    async fn publish(&self, topic: &str, id: &str, payload: &str) -> Result<String, Error>;

    /// Appends one entry of `fields` (names and values as given, in order) to `topic`, trimming
    /// it to about `maxlen` entries (the configured length when `None`). Returns the new entry
    /// id. Signed requests (`id`, `payload`, `sig`) and audit entries are written this way.
    async fn append(
        &self,
        topic: &str,
        fields: &[(&str, &str)],
        maxlen: Option<u64>,
    ) -> Result<String, Error>;

    /// Reads up to `count` entries after `cursor` (an entry id, or the message id of an entry in
    /// the topic), waiting up to `block` when `Some` and there are none.
    async fn read(
        &self,
        topic: &str,
        cursor: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<Entry>, Error>;

    /// Up to `count` entries of `topic`, newest first, from `end` back (an entry id, inclusive,
    /// or `+` for the newest): `XREVRANGE`. For operators' views of capped streams, never for a
    /// path taken while serving.
    async fn read_back(&self, topic: &str, end: &str, count: usize) -> Result<Vec<Entry>, Error>;

    /// The id of the newest entry of `topic`, or `0-0` when it is empty.
    async fn last_entry_id(&self, topic: &str) -> Result<String, Error>;

    /// Deletes entries of `topic` by entry id (`XDEL`). Returns how many existed.
    async fn delete_entries(&self, topic: &str, entry_ids: &[String]) -> Result<u64, Error>;
}

/// Consumer groups: create, read new entries, ack, claim idle ones, remove consumers. What a
/// door's reader needs.
#[async_trait]
pub trait Groups: Send + Sync + 'static {
    /// Creates `group` on `topic` (and the topic itself) if missing, reading new entries only.
    async fn ensure_group(&self, topic: &str, group: &str) -> Result<(), Error> {
        self.ensure_group_at(topic, group, "$").await
    }

    /// Creates `group` on `topic` (and the topic itself) if missing, delivering the entries after
    /// `start` (`$`: only new ones, `0`: everything in the topic). An existing group is left as it
    /// is.
    ///
    /// A group that vanished (Redis lost its data) is created again from `0`: the entries callers
    /// added since are new to it, and any it had answered are recognised by the ledger.
    async fn ensure_group_at(&self, topic: &str, group: &str, start: &str) -> Result<(), Error>;

    /// Reads up to `count` new entries for `consumer`, waiting up to `block` when there are none.
    ///
    /// Each entry is decoded on its own: one whose `id` or `payload` cannot be read as text (not
    /// UTF-8, or longer than the transport's field limit) comes with [`Entry::defect`] set
    /// instead of failing the read, and the others are delivered as usual.
    ///
    /// # Cancel safety
    /// Not cancel safe: entries delivered by a dropped read stay pending until reclaimed.
    async fn read_group(
        &self,
        topic: &str,
        group: &str,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Entry>, Error>;

    /// Acknowledges entries of `group`.
    async fn ack(&self, topic: &str, group: &str, entry_ids: &[String]) -> Result<(), Error>;

    /// Claims for `consumer` up to `count` entries of `group` pending for at least `min_idle`,
    /// scanning from `start`. The entries carry their delivery counts, and defects as
    /// [`Bus::read_group`] reports them.
    async fn reclaim(
        &self,
        topic: &str,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        start: &str,
        count: usize,
    ) -> Result<Reclaimed, Error>;

    /// Moves a pending entry of `group` to `consumer` (`XCLAIM ... JUSTID`), without delivering
    /// it: that consumer's reclaimer takes it up once it has been idle for the lease. Used to
    /// hand an entry to the replica that hosts its tool.
    async fn hand_over(&self, topic: &str, group: &str, consumer: &str, entry_id: &str) -> Result<(), Error>;

    /// Adds an entry of `fields` (name, value, ...) to `to` unless `mark` (a key in `to`'s slot)
    /// says it was, and sets `mark` for `retention`: the move of a request that reached the wrong
    /// shard of a sharded requests stream to its home shard, safe to repeat until the source
    /// entry is acked. Returns whether it was added now.
    async fn move_once(
        &self,
        to: &str,
        mark: &str,
        fields: &[(&str, &str)],
        retention: Duration,
    ) -> Result<bool, Error>;

    /// Removes `consumer` from `group` if it holds no pending entries (deleting a consumer drops
    /// its pending entries, which would lose them). Returns whether it was removed.
    async fn delete_consumer(&self, topic: &str, group: &str, consumer: &str) -> Result<bool, Error>;

    /// Removes the consumers of `group` (other than `keep`) that hold no pending entries, have
    /// had nothing delivered for `min_idle`, and have no heartbeat (the key `heartbeat_prefix`
    /// followed by the consumer's name): replicas that were killed and never deleted themselves.
    /// A live consumer removed by mistake holds nothing to lose and is created again by its next
    /// read. Returns the names removed.
    async fn prune_consumers(
        &self,
        topic: &str,
        group: &str,
        keep: &str,
        min_idle: Duration,
        heartbeat_prefix: &str,
    ) -> Result<Vec<String>, Error>;
}

/// The exactly-once call ledger: record a call's start, keep its lease, commit its end. What the
/// call lifecycle needs; implemented against Redis only and tested against a real server.
#[async_trait]
pub trait Ledger: Send + Sync + 'static {
    /// Records that `owner` starts the call of a request, unless it was answered already or
    /// another owner holds a live lease on it.
    ///
    /// Holders renew every third of the lease, so a live holder always has more than two thirds
    /// of it left; a lease with less than a third left belongs to a holder that missed renewals
    /// and counts as lapsed. That margin also covers the moment between an entry's delivery
    /// (which starts its idle clock) and the lease's start, so a reclaim after the lease never
    /// finds a dead holder's lease still running.
    ///
    /// Safe to retry after an error: the same `owner` again gets what its first attempt got (and
    /// a fresh lease), so a lost reply never turns a fresh call into one "started before". An
    /// owner is therefore one handling of one entry; handling the entry again needs a new owner.
    async fn begin_call(&self, call: &CallKeys<'_>, owner: &str, entry_id: &str) -> Result<CallStart, Error>;

    /// Extends `owner`'s lease on a call and resets the idle time of its entry, so a slow call is
    /// not reclaimed. Returns `false` when the call is no longer `owner`'s.
    ///
    /// A call that is not `tracked` (one run without a call record: a read-only, idempotent
    /// tool) has no lease: only its entry's idle time is reset, and `false` means the entry is
    /// no longer pending to `consumer`.
    async fn renew_call(
        &self,
        call: &CallKeys<'_>,
        owner: &str,
        entry: &EntryRef<'_>,
        consumer: &str,
        tracked: bool,
    ) -> Result<bool, Error>;

    /// Atomically: publishes the answer (unless the request was answered already) and the dead
    /// letter (unless the entry was finished already), marks the request answered when the answer
    /// is final, and acks its entry. Reports whether this answer is the one published for the
    /// request.
    ///
    /// Safe to retry after an error, also when the first attempt was applied and only its reply
    /// was lost: the retry publishes nothing twice. A final answer is still reported as
    /// published, because the answered mark holds the answer's message id; an answer that is not
    /// final is guarded by its entry still being pending instead, and a retry reports it as a
    /// duplicate.
    ///
    /// When an answer topic holds a key that is not a stream, nothing at all is written and
    /// [`Committed::WrongType`] is returned: retrying the same finish can never succeed.
    async fn finish(&self, finish: &Finish<'_>) -> Result<Committed, Error>;
}

/// The fleet's shared records: the registry hashes, the heartbeats, the fleet set, and keys
/// that expire. What the publisher writes and what a client of the fleet reads.
#[async_trait]
pub trait Directory: Send + Sync + 'static {
    /// Replaces the hash at `key` with `fields`.
    async fn replace_hash(&self, key: &str, fields: &[(String, String)]) -> Result<(), Error>;

    /// All fields of the hash at `key`.
    async fn hash_fields(&self, key: &str) -> Result<Vec<(String, String)>, Error>;

    /// The values of `keys`, in order; `None` for a key that does not exist or holds no string.
    async fn values(&self, keys: &[String]) -> Result<Vec<Option<String>>, Error>;

    /// Sets `key` to `value`, expiring after `ttl`.
    async fn set_expiring(&self, key: &str, value: &str, ttl: Duration) -> Result<(), Error>;

    /// Deletes keys.
    async fn delete(&self, keys: &[String]) -> Result<(), Error>;

    /// Adds `member` to the set at `key`; `true` when it was not there.
    async fn add_member(&self, key: &str, member: &str) -> Result<bool, Error>;

    /// The members of the set at `key`, sorted; none when it does not exist.
    async fn members(&self, key: &str) -> Result<Vec<String>, Error>;

    /// Removes `members` from the set at `key`.
    async fn remove_members(&self, key: &str, members: &[String]) -> Result<(), Error>;

    /// Makes `key` (of any type: a private response stream too) expire after `ttl`; `false`
    /// when it does not exist.
    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool, Error>;
}

/// Facts about the server: readiness probes, group metrics, start-up checks, and the rare
/// keyspace walk of the operator's commands.
#[async_trait]
pub trait Server: Send + Sync + 'static {
    /// Checks that the server answers.
    async fn ping(&self) -> Result<(), Error>;

    /// Names of the keys matching a glob `pattern`. This walks the whole keyspace (every
    /// primary of a cluster): for tools and rare checks, never for a path taken while serving.
    async fn keys_matching(&self, pattern: &str) -> Result<Vec<String>, Error>;

    /// The consumer groups of `topic` with their pending counts and lag (`XINFO GROUPS`). A
    /// topic that does not exist has no groups.
    async fn group_info(&self, topic: &str) -> Result<Vec<GroupInfo>, Error>;

    /// The server's eviction policy (`maxmemory-policy`), `None` when the transport has none.
    /// Managed Redis services may refuse `CONFIG`: that is an error, not `None`.
    async fn eviction_policy(&self) -> Result<Option<String>, Error> {
        Ok(None)
    }

    /// The server's version (`redis_version` of `INFO server`; on a cluster the lowest of the
    /// nodes asked), `None` when the transport has none or does not say.
    async fn server_version(&self) -> Result<Option<String>, Error> {
        Ok(None)
    }
}

/// What a client of the fleet needs: plain streams (publish requests, read its private
/// response stream) and the directory (the fleet set, heartbeats, registries, its stream's
/// expiry). The MCP door, `toolhost mcp` and the command-line client hold only this.
pub trait FleetAccess: Streams + Directory {}

impl<T: Streams + Directory> FleetAccess for T {}

/// One consumer group of a topic, as [`Bus::group_info`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInfo {
    /// The group's name.
    pub name: String,
    /// Entries delivered to the group's consumers and not yet acked.
    pub pending: u64,
    /// Entries not yet delivered to the group; `None` when Redis cannot tell (after `XDEL` or
    /// trimming past the group's position).
    pub lag: Option<u64>,
}

/// The ledger keys of one request, with how long its records live.
#[derive(Debug, Clone, Copy)]
pub struct CallKeys<'a> {
    /// Set once the request was answered (to the answer's message id); lives for `retention`.
    pub answered: &'a str,
    /// The call in progress: owner, lease deadline, entry.
    pub call: &'a str,
    /// Set when the entry was answered by a refusal (an answer that is not final), by any
    /// toolbox reading the stream; lives for `retention`.
    pub entry: &'a str,
    /// How long a lease lasts without renewal. Holders renew every third of it.
    pub lease: Duration,
    /// How long the answered mark and the call record are kept.
    pub retention: Duration,
}

impl CallKeys<'_> {
    /// How often a holder renews its lease: every third of it. A live holder therefore always
    /// has more than two thirds left, and `begin_call` counts a lease with less than a third left
    /// as lapsed.
    pub fn renew_period(&self) -> Duration {
        self.lease / 3
    }
}

/// The owner of one handling of one entry: consumer, entry id and a random token.
///
/// [`Bus::begin_call`] gives the same owner the same answer again (so a retry after a lost reply
/// is safe), so each handling needs its own: an entry handled again by the same process, after
/// an earlier handling left it pending, must find that handling's record "started before".
pub fn call_owner(consumer: &str, entry_id: &str) -> String {
    let token = uuid::Uuid::new_v4().simple().to_string();
    format!("{consumer}/{entry_id}/{}", &token[..8])
}

/// One entry of a consumer group.
#[derive(Debug, Clone, Copy)]
pub struct EntryRef<'a> {
    /// The stream.
    pub topic: &'a str,
    /// The consumer group.
    pub group: &'a str,
    /// The entry id.
    pub entry_id: &'a str,
}

/// What [`Bus::begin_call`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallStart {
    /// Nobody started this request before: run it.
    Fresh,
    /// An earlier owner started it and its lease lapsed (it crashed or stalled).
    StartedBefore {
        /// The earlier owner ([`call_owner`]: consumer, entry id and token), for the log.
        holder: String,
    },
    /// It was answered already: ack without running or answering.
    Answered,
    /// It was answered already and its answer was kept ([`Finish::keep`]): answer this copy
    /// with it ([`Finish::replay`]) without running the tool.
    AnsweredKept(KeptAnswer),
    /// Another owner holds a live lease on it, for the entry named here.
    Busy {
        /// The entry the owner is working on.
        entry_id: String,
    },
    /// The call record was written ([`CallStart::Fresh`] or, with `started_before`,
    /// [`CallStart::StartedBefore`]), but fewer replicas than `wanted` acknowledged it within
    /// `timeout` (`[redis] replica_acks`): a failover now could lose the record, and a re-delivery
    /// on the new master would then run the tool a second time. Run nothing: answer `overloaded`
    /// (a refusal, whose commit deletes the record, so a retry with the same request id runs once
    /// the replicas are back), or `interrupted` for a call started before whose tool is not
    /// idempotent, which runs nothing anyway.
    Unreplicated {
        /// An earlier owner started the call (its lease lapsed).
        started_before: bool,
        /// How many replicas acknowledged the record in time.
        acked: u32,
        /// How many were asked for.
        wanted: u32,
        /// How long they were waited for.
        timeout: Duration,
    },
}

/// A message to append to a topic.
#[derive(Debug, Clone, Copy)]
pub struct Published<'a> {
    /// The topic.
    pub topic: &'a str,
    /// The message id (UUID).
    pub id: &'a str,
    /// The JSON payload.
    pub payload: &'a str,
}

/// Everything that ends one delivered entry, committed together by [`Bus::finish`].
#[derive(Debug, Clone, Copy)]
pub struct Finish<'a> {
    /// The entry to ack.
    pub entry: EntryRef<'a>,
    /// The request's ledger keys, when the request could be identified.
    pub call: Option<CallKeys<'a>>,
    /// The answer, skipped if the request was answered already.
    pub answer: Option<Published<'a>>,
    /// A second topic that receives the same answer (same id and payload) under the same
    /// once-only rule, e.g. a chat reply that goes to the conversation and to an agent's inbox.
    pub answer_copy: Option<&'a str>,
    /// A dead letter to publish in any case.
    pub dead_letter: Option<Published<'a>>,
    /// Whether the answer ends the request for good, so the answered mark is set and a later
    /// request with the same id is acked unanswered. Refusals that ran nothing (`overloaded`,
    /// `forbidden`, ...) are not final: a caller retrying with the same request id is answered
    /// again.
    pub final_answer: bool,
    /// Whether the request may have a call record to delete: this call wrote one
    /// ([`Ledger::begin_call`]), or an earlier holder of a redelivered entry may have. A first
    /// delivery of a read-only, idempotent tool has none and is finished without touching it.
    pub tracked: bool,
    /// What to keep of a final answer with the answered mark (the answer's `data`), so that a
    /// retry of the request (another entry with the same request id) can be answered with it. A
    /// final answer with something to keep that finds the request answered by another entry
    /// whose answer was kept writes nothing and returns [`Committed::Kept`], leaving the entry
    /// pending for a replay.
    pub kept: Option<&'a str>,
    /// Whether the answer replays a kept answer for a retry: it is published once for this entry
    /// (guarded like a refusal, by the entry), whatever the request's answered mark holds.
    pub replay: bool,
}

/// What [`Bus::finish`] did with the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Committed {
    /// This answer is the one published for the request (now, or by an earlier attempt of the
    /// same finish whose reply was lost).
    Published,
    /// Nothing was published: the request had been answered already, or there was no answer.
    /// The entry is acked.
    NotPublished,
    /// An answer topic holds a key of another type; nothing was written and the entry is still
    /// pending.
    WrongType,
    /// The request had been answered by another entry and that answer was kept
    /// ([`Finish::keep`]): nothing was written and the entry is still pending, to be answered
    /// with the kept answer ([`Finish::replay`]).
    Kept(KeptAnswer),
}

/// The value of a request's answered mark (on a cluster: the field `refused` of its claim) that
/// ledger format 2 writes when an entry of the request is refused (an answer that is not final)
/// and no final answer is there yet: "an entry of this request was answered, look at its refusal
/// mark". It is no answer: readers of format 2 treat it as "not answered". See
/// `docs/CONTRACTS.md`, "The ledger's format".
pub const REFUSED_MARK: &str = "refused";

/// The format of the ledger's marks a replica writes and reads (`[dispatch] ledger_format`,
/// `[dispatch] previous_ledger_format`), so a fleet rolls from format 1 to format 2, and from 2
/// to 3, without losing or doubling an answer (`docs/OPERATIONS.md`, "Rolling to ledger format
/// 2" and "Rolling to ledger format 3").
///
/// Format 1 writes a refusal as the entry's refusal mark alone, so a final answer must look
/// that mark up (one `EXISTS` per answer). Format 2 also sets the request's answered mark to
/// [`REFUSED_MARK`] when it has none (and keeps the mark alive as long as the refusal), so an
/// answered mark that is not there means no entry of the request was answered at all, and the
/// common answer (a request answered for the first time) is one `SET NX GET`.
///
/// Format 3 changes only a Redis Cluster's ledger: a new claim is one string ([`Claim`]) where
/// formats 1 and 2 write a hash, so the common answer on a cluster takes it with one `SET NX GET`
/// as one server takes its mark. One server's ledger is format 2's. Every format of this release
/// reads claims of both shapes; replicas of earlier releases read only hashes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LedgerFormat {
    /// Writes format 1, reads either (a placeholder is "not answered"). The default; what
    /// replicas of earlier releases write.
    #[default]
    One,
    /// Writes format 2, reads as format 1 (every answer looks its entry's refusal mark up):
    /// the fleet runs replicas of format 1 and 2 side by side (`ledger_format = 2` with
    /// `previous_ledger_format = 1`).
    Rolling,
    /// Writes format 2 and trusts it: an answer looks the entry's refusal mark up only when the
    /// answered mark is there. Every replica of the fleet must write format 2.
    Two,
    /// Writes format 2 (a cluster's new claims are hashes) and reads claims of both shapes: the
    /// fleet runs replicas of format 2 and 3 side by side (`ledger_format = 3` with
    /// `previous_ledger_format = 2`). Replicas of earlier releases, which read only hashes, may
    /// still run beside it; none may once any replica writes format 3.
    RollingToThree,
    /// Writes format 3 (a cluster's new claims are strings) and reads claims of both shapes, a
    /// hash left by format 2 honoured until it expires. Every replica of the fleet must be of this
    /// release and write format 2 or 3.
    Three,
}

impl LedgerFormat {
    /// Whether refusals also set the request's answered mark to [`REFUSED_MARK`].
    pub fn writes_placeholders(self) -> bool {
        self != LedgerFormat::One
    }

    /// Whether an answer skips the entry's refusal mark when the request's mark is not there.
    pub fn trusts_placeholders(self) -> bool {
        matches!(self, LedgerFormat::Two | LedgerFormat::RollingToThree | LedgerFormat::Three)
    }

    /// Whether a cluster's new claims are strings (format 3) rather than hashes.
    pub fn writes_claim_strings(self) -> bool {
        self == LedgerFormat::Three
    }
}

/// A request's claim on a Redis Cluster, the ledger's record of who answers it: a hash in ledger
/// formats 1 and 2, one string in format 3 (see `docs/CONTRACTS.md`, "The ledger's format"):
///
/// `<state><refused><topic length>:<topic>[<answer id>\n<entry id>[\n<kept>]]`
///
/// with `state` one of `a` (answered), `c` (claimed) or `-`, and `refused` `r` or `-`.
/// `scripts/cluster/claim_value.lua` writes and reads it inside Redis; this reads it outside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claim {
    /// The response topic the claim is held for (a full key).
    pub topic: Option<String>,
    /// `claimed` or `answered`.
    pub state: Option<String>,
    /// The final answer's message id.
    pub answer: Option<String>,
    /// The entry of the requests stream the final answer answered.
    pub entry: Option<String>,
    /// What is kept of the final answer for retries (its `data`, as JSON).
    pub kept: Option<String>,
    /// Whether an entry of the request was refused (format 2's field `refused`).
    pub refused: bool,
}

impl Claim {
    /// The claim from a hash's fields (formats 1 and 2); no fields, no claim.
    pub fn from_fields(fields: Vec<(String, String)>) -> Option<Claim> {
        if fields.is_empty() {
            return None;
        }
        let mut claim = Claim::default();
        for (field, value) in fields {
            match field.as_str() {
                "topic" => claim.topic = Some(value),
                "state" => claim.state = Some(value),
                "answer" => claim.answer = Some(value),
                "entry" => claim.entry = Some(value),
                "kept" => claim.kept = Some(value),
                REFUSED_MARK => claim.refused = true,
                _ => {}
            }
        }
        Some(claim)
    }

    /// The claim from its string (format 3); `None` when `value` is not one.
    pub fn from_value(value: &str) -> Option<Claim> {
        let state = match value.as_bytes().first()? {
            b'a' => Some("answered".to_owned()),
            b'c' => Some("claimed".to_owned()),
            b'-' => None,
            _ => return None,
        };
        let refused = match value.as_bytes().get(1)? {
            b'r' => true,
            b'-' => false,
            _ => return None,
        };
        let (length, rest) = value.get(2..)?.split_once(':')?;
        let length: usize = length.parse().ok()?;
        let topic = rest.get(..length)?;
        let tail = rest.get(length..)?;
        let mut claim = Claim {
            topic: (!topic.is_empty()).then(|| topic.to_owned()),
            state,
            refused,
            ..Claim::default()
        };
        if !tail.is_empty() {
            let mut parts = tail.splitn(3, '\n');
            claim.answer = parts.next().map(str::to_owned);
            claim.entry = parts.next().map(str::to_owned);
            claim.kept = parts.next().map(str::to_owned);
        }
        Some(claim)
    }

    /// The claim's string (format 3).
    pub fn to_value(&self) -> String {
        let state = match self.state.as_deref() {
            Some("answered") => 'a',
            Some("claimed") => 'c',
            _ => '-',
        };
        let topic = self.topic.as_deref().unwrap_or_default();
        let mut value = format!("{state}{}{}:{topic}", if self.refused { 'r' } else { '-' }, topic.len());
        if let Some(answer) = &self.answer {
            value.push_str(answer);
            if let Some(entry) = &self.entry {
                value.push('\n');
                value.push_str(entry);
                if let Some(kept) = &self.kept {
                    value.push('\n');
                    value.push_str(kept);
                }
            }
        }
        value
    }

    /// Whether the claim says the request was answered.
    pub fn is_answered(&self) -> bool {
        self.state.as_deref() == Some("answered")
    }

    /// The answer as kept for retries, once answered with an answer kept.
    pub fn kept_answer(&self) -> Option<KeptAnswer> {
        match (self.is_answered(), &self.entry, &self.kept) {
            (true, Some(entry_id), Some(data)) => Some(KeptAnswer {
                id: self.answer.clone().unwrap_or_default(),
                entry_id: entry_id.clone(),
                data: data.clone(),
            }),
            _ => None,
        }
    }
}

/// Reads a request's claim on a Redis Cluster, of either shape: its string (format 3) when the
/// key holds one, else its hash's fields (formats 1 and 2). `values` reads a key of another type
/// as missing, so a hash costs a second round trip; these readers (retries, cancels, the console,
/// `dlq replay`) are off the common answer's path.
///
/// # Errors
/// Redis failed, or the key holds a string that is not a claim.
pub async fn read_claim<D: Directory + ?Sized>(directory: &D, key: &str) -> Result<Option<Claim>, Error> {
    if let Some(value) =
        directory.values(std::slice::from_ref(&key.to_owned())).await?.into_iter().next().flatten()
    {
        return Claim::from_value(&value)
            .map(Some)
            .ok_or_else(|| Error::Protocol(format!("the claim at {key} is a string of no known shape")));
    }
    Ok(Claim::from_fields(directory.hash_fields(key).await?))
}

/// Whether `mark`, the value of a request's answered mark on one server, is an answer (not the
/// placeholder of format 2).
pub fn is_answer_mark(mark: &str) -> bool {
    mark != REFUSED_MARK
}

/// A request's final answer as the ledger keeps it for retries: the original answer's message
/// id, the entry it answered, and what was kept of it (its `data`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptAnswer {
    /// The original answer's message id.
    pub id: String,
    /// The entry of the requests stream it answered.
    pub entry_id: String,
    /// What was kept of the original answer: its `data`, as JSON.
    pub data: String,
}

impl KeptAnswer {
    /// Reads an answered mark: `<answer id>\n<entry id>\n<kept>` when the answer was kept,
    /// `None` for a mark that holds the answer's id alone.
    pub fn from_mark(mark: &str) -> Option<KeptAnswer> {
        let (id, rest) = mark.split_once('\n')?;
        let (entry_id, data) = rest.split_once('\n')?;
        Some(KeptAnswer { id: id.to_owned(), entry_id: entry_id.to_owned(), data: data.to_owned() })
    }
}

/// What [`Bus::reclaim`] returns.
#[derive(Debug, Clone, Default)]
pub struct Reclaimed {
    /// Where the next scan starts (`0-0` when the scan wrapped around).
    pub next_start: String,
    /// The claimed entries, with their delivery counts.
    pub entries: Vec<toolhost_envelope::Entry>,
    /// Pending entries found deleted from the topic (trimmed before anyone handled them); they
    /// were dropped from the group, since nothing is left to answer.
    pub deleted: Vec<String>,
}

/// Whether `cursor` has the shape of a stream entry id (`<ms>` or `<ms>-<seq>`).
pub(crate) fn is_entry_id(cursor: &str) -> bool {
    let mut parts = cursor.splitn(2, '-');
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|byte| byte.is_ascii_digit());
    parts.next().is_some_and(digits) && parts.next().is_none_or(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_read_back_what_was_written_whatever_their_topic_and_kept_answer_hold() {
        let claims = [
            Claim { refused: true, ..Claim::default() },
            Claim { topic: Some("t".to_owned()), state: Some("claimed".to_owned()), ..Claim::default() },
            Claim {
                topic: Some("{x}results:a:b\nc".to_owned()),
                state: Some("answered".to_owned()),
                answer: Some("a1".to_owned()),
                entry: Some("5-0".to_owned()),
                kept: Some("{\"m\":\"1\\n2:3\"}\n\n".to_owned()),
                refused: true,
            },
            Claim {
                topic: Some("t".to_owned()),
                state: Some("answered".to_owned()),
                answer: Some("a2".to_owned()),
                entry: Some("6-1".to_owned()),
                ..Claim::default()
            },
        ];
        for claim in claims {
            assert_eq!(Claim::from_value(&claim.to_value()), Some(claim.clone()), "{}", claim.to_value());
        }
        assert_eq!(Claim { refused: true, ..Claim::default() }.to_value(), "-r0:");
        let answered = Claim::from_value("a-1:ta2\n6-1\n{}").unwrap();
        assert_eq!(
            answered.kept_answer(),
            Some(KeptAnswer { id: "a2".to_owned(), entry_id: "6-1".to_owned(), data: "{}".to_owned() })
        );
        for not_a_claim in ["", "a", "x-0:", "a-9:short", "a-:t", "refused"] {
            assert_eq!(Claim::from_value(not_a_claim), None, "{not_a_claim:?}");
        }
    }

    #[test]
    fn entry_ids_are_told_from_message_ids() {
        assert!(is_entry_id("1700000000000-0"));
        assert!(is_entry_id("0"));
        assert!(!is_entry_id("7f9c0a52-1111-4222-8333-944455556666"));
        assert!(!is_entry_id("12-"));
        assert!(!is_entry_id(""));
    }
}
