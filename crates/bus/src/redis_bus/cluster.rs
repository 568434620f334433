//! The parts of [`RedisBus`] that differ on a Redis Cluster: the ledger as single-slot steps,
//! `SCAN` on every primary, and pruning consumers with their heartbeats looked up first.
//!
//! # The ledger on a cluster
//!
//! On one server [`crate::Ledger::finish`] is one script over keys of any slot. On a cluster a
//! script may only touch one slot, and the keys of one finish live in up to four: the requests
//! stream's (S), the response topic's (T, chosen by the caller), the answer copy's (C) and the
//! dead-letter topic's (D). So a finish runs as steps, each a script in one slot, in this order:
//!
//! 1. **claim** (S): a final answer takes the request's claim for its topic (a hash next to the
//!    stream, or in ledger format 3 a string, holding the topic and `claimed`). A claim held for
//!    another topic means a copy of the request named another response topic and that one gets the answer; a claim that says
//!    `answered` (or the entry's refusal mark) means there is nothing to publish. The same step
//!    reads whether the entry is still pending (for the dead letter).
//! 2. **publish** (T): the answer is appended unless the answered mark (final) or the entry's
//!    refusal mark (not final), both next to T, exists; appending and setting the mark are one
//!    script, so the answer is published once per topic.
//! 3. **copy** (C), when there is one and step 2 found this answer on T: the same, guarded by a
//!    mark of its own next to C.
//! 4. **dead letter** (D), when there is one and the entry is still pending: the same, guarded by
//!    a mark next to D keyed by the entry id.
//! 5. **settle** (S): the claim becomes `answered` (or is given back when no final answer could be
//!    published), the refusal mark's copy is set next to the stream, the call record is deleted
//!    and the entry acked.
//!
//! A crash between two steps leaves the entry pending, so it is reclaimed and finished again:
//! every step is guarded by its mark, so the retry publishes nothing twice and completes the
//! later steps. `docs/RELIABILITY.md` walks through each gap.

use std::time::Duration;

use redis::Value;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use super::RedisBus;
use crate::batch::Batcher;
use crate::bus::{CallKeys, Committed, Finish, KeptAnswer};
use crate::connection::Connection;
use crate::error::Cause;
use crate::slots::{ROLE_ANSWER, ROLE_COPY, ROLE_LETTER, ROLE_REFUSAL};
use crate::{Error, slots};

/// How long a dead letter's mark is kept at least: it only has to outlive the entry's last
/// redelivery.
const LETTER_MARK_TTL: Duration = Duration::from_secs(24 * 3600);

/// Fails unless every key is in the slot of the first: ledger keys must be built by
/// [`crate::Keys::for_cluster`].
pub(super) fn same_slot(step: &str, keys: &[&str]) -> Result<(), Error> {
    let Some(first) = keys.first() else { return Ok(()) };
    let at = slots::slot(first.as_bytes());
    if keys.iter().all(|key| slots::slot(key.as_bytes()) == at) {
        return Ok(());
    }
    Err(Error::Refused(Cause::other(format!(
        "{step}: the keys {keys:?} are in different cluster slots (ledger keys must come from Keys::for_cluster)"
    ))))
}

/// What the claim step found (see `scripts/cluster/claim.lua`).
struct Claimed {
    /// 0: publish; 1: the request (or this entry) was answered already; 2: the claim names
    /// another response topic, whose answer is the one.
    claim: i64,
    /// 1: the entry is pending; 0: it is not; -1: its group is gone.
    pending: i64,
    /// 1: the recorded answer is this very answer (a retry of this finish).
    own: i64,
    /// 1: this finish took the claim.
    taken: i64,
    /// The request was answered by another entry, whose answer is kept, and this final answer
    /// keeps its own: nothing is written, and the entry is answered with this one instead.
    kept: Option<KeptAnswer>,
}

/// Where the answer step left the finish.
struct Answered {
    /// This finish's answer is the one on the topic.
    published: bool,
    /// The request was answered by another finish.
    answered_before: bool,
    /// A final answer is on the topic.
    final_on_topic: bool,
    /// This entry's refusal is on the topic.
    refusal_on_topic: bool,
    /// Give the claim back when settling.
    release: bool,
}

/// A message to append once.
struct Message<'a> {
    /// Full key of its topic.
    topic: &'a str,
    /// Its message id.
    id: &'a str,
    /// Its payload.
    payload: &'a str,
}

/// How a message's marks guard it (see `scripts/cluster/publish.lua`).
struct Guard {
    /// Whether the marks are checked and set at all (an unidentified request's answer is
    /// published unguarded, as on one server).
    guarded: bool,
    /// Whether the final mark (rather than the refusal mark) is the one set.
    final_answer: bool,
    /// How long the mark is kept.
    retention: Duration,
}

/// What the publish step found.
struct Publish {
    /// 1: this message is the one on the topic; 0: another is; -1: not a stream.
    published: i8,
    /// A final answer is on the topic.
    final_on_topic: bool,
}

impl RedisBus {
    fn cluster_batcher<'a>(
        &'a self,
        cell: &'a std::sync::OnceLock<Batcher>,
        source: &str,
        keys: usize,
        args: usize,
    ) -> &'a Batcher {
        cell.get_or_init(|| {
            Batcher::new(source, keys, args, self.commands.clone(), true, self.options.gather_batches)
        })
    }

    /// The batcher of [`crate::Ledger::begin_call`] on a cluster: the claim, the call record and
    /// the refusal mark's copy, all in the requests stream's slot.
    pub(super) fn cluster_begin_batcher(&self, call: &CallKeys<'_>) -> Result<&Batcher, Error> {
        same_slot("begin_call", &[call.answered, call.call, call.entry])?;
        let source = concat!(
            include_str!("../scripts/cluster/claim_value.lua"),
            include_str!("../scripts/cluster/begin_call.lua"),
            include_str!("../scripts/call_lease.lua")
        );
        Ok(self.batchers.cluster_begin_call.get_or_init(|| {
            // On the records' own connection when they wait for replicas: the pipeline of script
            // and WAIT goes whole to the primary of the items' slot (WAIT names no key).
            let (connection, wait) = self.record_connection();
            Batcher::waiting(source, 3, 5, connection, true, self.options.gather_batches, wait)
        }))
    }

    /// [`crate::Ledger::finish`] on a cluster, in the steps the module documentation lists.
    pub(super) async fn cluster_finish(&self, finish: &Finish<'_>) -> Result<Committed, Error> {
        let keys = FinishKeys::new(self.options.key_prefix.as_str(), finish);
        same_slot("finish", &[finish.entry.topic, &keys.claim, &keys.record, &keys.refused])?;
        if let (true, Some(answer), Some((final_mark, refusal_mark))) =
            (super::is_lean_answer(finish) && finish.call.is_some(), finish.answer, &keys.answer)
            && slots::slot(answer.topic.as_bytes()) == slots::slot(finish.entry.topic.as_bytes())
        {
            return self.answer_local(finish, &keys, answer, [final_mark, refusal_mark]).await;
        }
        // Before anything is written: a copy topic of another type would leave the answer half
        // published (the answer topic itself is checked by its own step, which writes nothing then).
        if self.copy_of_wrong_type(finish).await? {
            return Ok(Committed::WrongType);
        }
        let claimed = self.finish_claim(finish, &keys).await?;
        if let Some(kept) = claimed.kept {
            return Ok(Committed::Kept(kept));
        }
        let Some(answered) = self.finish_answer(finish, &keys, &claimed).await? else {
            return Ok(Committed::WrongType);
        };
        if answered.published {
            self.finish_copy(finish, &keys).await?;
        }
        self.finish_letter(finish, &keys, &claimed, &answered).await?;

        // 5. Settle (S): the claim, the refusal mark's copy, the call record, the ack.
        let published = answered.published;
        let settle = Settle {
            answered: answered.final_on_topic,
            refused: answered.refusal_on_topic && !finish.final_answer,
            release: answered.release,
            published: if published { finish.answer.map_or("", |answer| answer.id) } else { "" },
            // The common end of a call that wrote no record (a read-only idempotent tool's
            // first delivery, `Finish::tracked` false) has none to delete, as one server's
            // answer script knows; every other end deletes it, as one server's finish does.
            delete_record: claimed.claim != 2 && (finish.tracked || !super::is_lean_answer(finish)),
            ack: true,
        };
        self.settle(finish, &keys, settle).await?;
        Ok(if published { Committed::Published } else { Committed::NotPublished })
    }

    /// The common end of a call (a final answer and nothing else) whose answer topic is in the
    /// stream's slot: the claim, the answer and the settle in one script written for batches
    /// (`scripts/cluster/answer_local.lua`), one call and one `XACK` for the answers of a stream
    /// and group that end together, like one server's `answer_batch.lua`.
    async fn answer_local(
        &self,
        finish: &Finish<'_>,
        keys: &FinishKeys,
        answer: crate::Published<'_>,
        [final_mark, refusal_mark]: [&String; 2],
    ) -> Result<Committed, Error> {
        let entry = finish.entry;
        let batcher = self.batchers.cluster_answer_local.get_or_init(|| {
            // Not split by slot: every key of a call is in the slot of its shared requests
            // stream (`cluster_finish` checks the item's keys against it), and items of
            // different streams have different shared parts, so they go in different calls.
            Batcher::for_batches(
                concat!(
                    include_str!("../scripts/add_answer.lua"),
                    include_str!("../scripts/cluster/claim_value.lua"),
                    include_str!("../scripts/cluster/answer_local.lua")
                ),
                (5, 6),
                5,
                self.commands.clone(),
                self.options.gather_batches,
            )
        });
        let shared =
            self.answer_shared(entry.topic, entry.group, retention(finish).max(Duration::from_millis(1)));
        let mut item_keys = Vec::with_capacity(if finish.tracked { 6 } else { 5 });
        item_keys.extend([
            keys.claim.clone(),
            keys.refused.clone(),
            answer.topic.to_owned(),
            final_mark.clone(),
            refusal_mark.clone(),
        ]);
        if finish.tracked {
            item_keys.push(keys.record.clone());
        }
        let args = vec![
            entry.entry_id.to_owned(),
            answer.id.to_owned(),
            answer.payload.to_owned(),
            flag(finish.tracked),
            finish.kept.unwrap_or_default().to_owned(),
        ];
        let reply = batcher.invoke_shared(shared, item_keys, args).await?;
        super::committed_from(reply)
    }

    /// Whether the answer's copy topic holds a key that is not a stream.
    async fn copy_of_wrong_type(&self, finish: &Finish<'_>) -> Result<bool, Error> {
        let (Some(_), Some(copy)) = (finish.answer, finish.answer_copy) else { return Ok(false) };
        let kind: String = redis::cmd("TYPE").arg(copy).query_async(&mut self.commands.clone()).await?;
        Ok(kind != "stream" && kind != "none")
    }

    /// Step 1, the claim (S), and whether the entry is still pending.
    async fn finish_claim(&self, finish: &Finish<'_>, keys: &FinishKeys) -> Result<Claimed, Error> {
        let entry = finish.entry;
        let identified = finish.call.is_some();
        let mut claimed = Claimed { claim: 0, pending: 1, own: 0, taken: 0, kept: None };
        if (identified && finish.answer.is_some()) || finish.dead_letter.is_some() {
            let batcher = self.cluster_batcher(
                &self.batchers.cluster_claim,
                concat!(
                    include_str!("../scripts/cluster/claim_value.lua"),
                    include_str!("../scripts/cluster/claim.lua")
                ),
                3,
                13,
            );
            let reply = batcher
                .invoke(
                    vec![entry.topic.to_owned(), keys.claim.clone(), keys.refused.clone()],
                    vec![
                        entry.group.to_owned(),
                        entry.entry_id.to_owned(),
                        flag(identified),
                        flag(finish.answer.is_some()),
                        flag(finish.final_answer),
                        finish.answer.map_or("", |answer| answer.topic).to_owned(),
                        retention(finish).as_millis().to_string(),
                        flag(finish.dead_letter.is_some()),
                        finish.answer.map_or("", |answer| answer.id).to_owned(),
                        flag(finish.replay),
                        flag(finish.kept.is_some()),
                        flag(self.options.ledger_format.trusts_placeholders()),
                        writes_flag(self.options.ledger_format).to_owned(),
                    ],
                )
                .await?;
            claimed = claimed_from(reply)?;
        }
        if claimed.claim == 2 {
            tracing::warn!(
                entry_id = entry.entry_id,
                "a copy of this request named another response topic, which gets the answer; this copy is acked unanswered"
            );
        }
        Ok(claimed)
    }

    /// Step 2, the answer (T), once. `None` when its topic holds a key that is not a stream:
    /// nothing was published, and a final answer's claim was given back.
    async fn finish_answer(
        &self,
        finish: &Finish<'_>,
        keys: &FinishKeys,
        claimed: &Claimed,
    ) -> Result<Option<Answered>, Error> {
        let claim = claimed.claim;
        let unchanged = Answered {
            published: claim == 1 && claimed.own == 1,
            answered_before: claim != 0,
            final_on_topic: false,
            refusal_on_topic: false,
            release: false,
        };
        let Some(answer) = finish.answer.filter(|_| claim == 0) else { return Ok(Some(unchanged)) };
        let identified = finish.call.is_some();
        let (final_mark, refusal_mark) = keys.answer.clone().unwrap_or_default();
        let message = Message { topic: answer.topic, id: answer.id, payload: answer.payload };
        let guard =
            Guard { guarded: identified, final_answer: finish.final_answer, retention: retention(finish) };
        let found = self.publish_once(message, &final_mark, &refusal_mark, guard).await?;
        if found.published == -1 {
            if identified && finish.final_answer {
                // Nobody can publish on this topic: give its claim back (whoever took it), so a
                // copy naming a topic that can take the answer is answered; the entry stays
                // pending, as on one server.
                self.settle(finish, keys, Settle { release: true, ..Settle::default() }).await?;
            }
            return Ok(None);
        }
        let published = found.published == 1;
        // A replay is guarded by the entry's mark alone (both marks are that one): what it finds
        // there is this entry's answer, never the request's final one.
        let final_on_topic = found.final_on_topic && !finish.replay;
        Ok(Some(Answered {
            published,
            answered_before: !published,
            final_on_topic,
            refusal_on_topic: !final_on_topic,
            // Claimed for a final answer that is not on the topic (this entry's refusal is): give
            // the claim back, if this finish took it.
            release: claimed.taken == 1 && !found.final_on_topic,
        }))
    }

    /// Step 3, the copy (C), once, when this answer is the one on T.
    async fn finish_copy(&self, finish: &Finish<'_>, keys: &FinishKeys) -> Result<(), Error> {
        let (Some(answer), Some(copy)) = (finish.answer, finish.answer_copy) else { return Ok(()) };
        let mark = keys.copy.clone().unwrap_or_default();
        let message = Message { topic: copy, id: answer.id, payload: answer.payload };
        let guard =
            Guard { guarded: finish.call.is_some(), final_answer: true, retention: retention(finish) };
        let found = self.publish_once(message, &mark, &mark, guard).await?;
        if found.published == -1 {
            tracing::error!(
                topic = copy,
                "the answer's copy topic holds a key that is not a stream; copy dropped"
            );
        }
        Ok(())
    }

    /// Step 4, the dead letter (D), once, while the entry is pending (or its group is gone and
    /// the request was not answered).
    async fn finish_letter(
        &self,
        finish: &Finish<'_>,
        keys: &FinishKeys,
        claimed: &Claimed,
        answered: &Answered,
    ) -> Result<(), Error> {
        let Some(letter) = finish.dead_letter else { return Ok(()) };
        if !(claimed.pending == 1 || (claimed.pending == -1 && !answered.answered_before)) {
            return Ok(());
        }
        let mark = keys.letter.clone().unwrap_or_default();
        let message = Message { topic: letter.topic, id: letter.id, payload: letter.payload };
        let guard =
            Guard { guarded: true, final_answer: true, retention: retention(finish).max(LETTER_MARK_TTL) };
        let found = self.publish_once(message, &mark, &mark, guard).await?;
        if found.published == -1 {
            return Err(Error::Refused(Cause::server(
                "WRONGTYPE",
                format!("the dead-letter topic '{}' holds a key that is not a stream", letter.topic),
            )));
        }
        Ok(())
    }

    /// Appends a message to its topic unless a mark says it was (see
    /// `scripts/cluster/publish.lua`).
    async fn publish_once(
        &self,
        message: Message<'_>,
        final_mark: &str,
        refusal_mark: &str,
        guard: Guard,
    ) -> Result<Publish, Error> {
        let batcher = self.cluster_batcher(
            &self.batchers.cluster_publish,
            concat!(
                include_str!("../scripts/add_answer.lua"),
                include_str!("../scripts/cluster/publish.lua")
            ),
            3,
            6,
        );
        let reply = batcher
            .invoke(
                vec![message.topic.to_owned(), final_mark.to_owned(), refusal_mark.to_owned()],
                vec![
                    self.options.maxlen.to_string(),
                    guard.retention.as_millis().max(1).to_string(),
                    message.id.to_owned(),
                    message.payload.to_owned(),
                    flag(guard.guarded),
                    flag(guard.final_answer),
                ],
            )
            .await?;
        let (published, final_on_topic): (i8, u8) =
            redis::from_redis_value(reply).map_err(|err| Error::Protocol(err.to_string()))?;
        Ok(Publish { published, final_on_topic: final_on_topic == 1 })
    }

    /// The settle step (see `scripts/cluster/settle.lua`).
    async fn settle(&self, finish: &Finish<'_>, keys: &FinishKeys, settle: Settle<'_>) -> Result<(), Error> {
        let entry = finish.entry;
        let batcher = self.cluster_batcher(
            &self.batchers.cluster_settle,
            concat!(
                include_str!("../scripts/cluster/claim_value.lua"),
                include_str!("../scripts/cluster/settle.lua")
            ),
            4,
            13,
        );
        batcher
            .invoke(
                vec![entry.topic.to_owned(), keys.claim.clone(), keys.record.clone(), keys.refused.clone()],
                vec![
                    entry.group.to_owned(),
                    entry.entry_id.to_owned(),
                    retention(finish).as_millis().max(1).to_string(),
                    flag(finish.call.is_some()),
                    flag(settle.answered),
                    flag(settle.refused),
                    flag(settle.release),
                    finish.answer.map_or("", |answer| answer.topic).to_owned(),
                    settle.published.to_owned(),
                    flag(settle.delete_record),
                    flag(settle.ack),
                    finish.kept.unwrap_or_default().to_owned(),
                    writes_flag(self.options.ledger_format).to_owned(),
                ],
            )
            .await?;
        Ok(())
    }

    /// [`crate::Server::keys_matching`] on a cluster: `SCAN` on every primary.
    pub(super) async fn cluster_keys_matching(&self, pattern: &str) -> Result<Vec<String>, Error> {
        let Connection::Cluster(connection) = &self.commands else {
            return Err(Error::Protocol("not a cluster connection".to_owned()));
        };
        let mut connection = connection.clone();
        let shards: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut connection).await?;
        let mut keys = Vec::new();
        for slot in primary_slots(shards)? {
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                slot,
                SlotAddr::Master,
            )));
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(500);
                let reply = connection.route_command(scan, route.clone()).await?;
                let (next, batch): (u64, Vec<String>) =
                    redis::from_redis_value(reply).map_err(|err| Error::Protocol(err.to_string()))?;
                keys.extend(batch);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        // A slot moving during the scan can show a key on two primaries.
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// [`crate::Groups::prune_consumers`] on a cluster: the heartbeats live in other slots, so
    /// they are looked up first, and the script deletes only consumers named to it.
    pub(super) async fn cluster_prune_consumers(
        &self,
        topic: &str,
        group: &str,
        keep: &str,
        min_idle: Duration,
        heartbeat_prefix: &str,
    ) -> Result<Vec<String>, Error> {
        let mut connection = self.commands.clone();
        let reply: redis::streams::StreamInfoConsumersReply =
            redis::AsyncCommands::xinfo_consumers(&mut connection, topic, group).await?;
        let idle_enough = min_idle.as_millis();
        let candidates: Vec<String> = reply
            .consumers
            .into_iter()
            .filter(|consumer| {
                consumer.name != keep && consumer.pending == 0 && consumer.idle as u128 >= idle_enough
            })
            .map(|consumer| consumer.name)
            .collect();
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let heartbeats: Vec<String> =
            candidates.iter().map(|name| format!("{heartbeat_prefix}{name}")).collect();
        let alive: Vec<Option<String>> =
            redis::cmd("MGET").arg(&heartbeats).query_async(&mut connection).await?;
        let silent: Vec<&String> =
            candidates.iter().zip(alive).filter(|(_, beat)| beat.is_none()).map(|(name, _)| name).collect();
        if silent.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = self.scripts.prune_listed.key(topic);
        invocation.arg(group).arg(min_idle.as_millis() as u64);
        for name in silent {
            invocation.arg(name);
        }
        let deleted: Vec<String> = invocation.invoke_async(&mut connection).await?;
        Ok(deleted)
    }
}

/// The keys of one cluster finish, by step: every step's keys share one slot.
#[derive(Debug)]
struct FinishKeys {
    /// The request's claim (S); the stream itself when the request is not identified.
    claim: String,
    /// The call record (S).
    record: String,
    /// The entry's refusal mark's copy (S).
    refused: String,
    /// The answered mark and the entry's refusal mark next to the answer's topic (T).
    answer: Option<(String, String)>,
    /// The mark of the answer's copy, next to the copy's topic (C).
    copy: Option<String>,
    /// The mark of the dead letter, next to the dead-letter topic (D).
    letter: Option<String>,
}

impl FinishKeys {
    /// The keys of `finish` under `prefix`. Marks next to T and C are the topic itself when the
    /// request is not identified (its answer is then published unguarded, as on one server).
    fn new(prefix: &str, finish: &Finish<'_>) -> FinishKeys {
        let entry = finish.entry;
        let (claim, record, refused) = match finish.call {
            Some(call) => (call.answered, call.call, call.entry),
            None => (entry.topic, entry.topic, entry.topic),
        };
        // The logical names the marks in other slots are made from.
        let request_tail = finish.call.map(|call| slots::tail(prefix, call.answered).to_owned());
        let entry_tail = match finish.call {
            Some(call) => slots::tail(prefix, call.entry).to_owned(),
            None => format!(
                "toolhost:ledger:{}:entry:{}",
                entry.topic.strip_prefix(prefix).unwrap_or(entry.topic),
                entry.entry_id
            ),
        };
        let answer = finish.answer.map(|answer| {
            let at = slots::slot(answer.topic.as_bytes());
            match &request_tail {
                // A replay is published once for its entry, like a refusal, whatever the final
                // mark of the original answer says (the retry may name the original's topic).
                Some(_) if finish.replay => {
                    let mark = slots::place(prefix, at, ROLE_REFUSAL, &entry_tail);
                    (mark.clone(), mark)
                }
                Some(tail) => (
                    slots::place(prefix, at, ROLE_ANSWER, tail),
                    slots::place(prefix, at, ROLE_REFUSAL, &entry_tail),
                ),
                None => (answer.topic.to_owned(), answer.topic.to_owned()),
            }
        });
        let copy = finish.answer_copy.map(|copy| {
            let at = slots::slot(copy.as_bytes());
            let tail = if finish.final_answer { request_tail.as_deref() } else { Some(entry_tail.as_str()) };
            match tail.filter(|_| finish.call.is_some()) {
                Some(tail) => slots::place(prefix, at, ROLE_COPY, tail),
                None => copy.to_owned(),
            }
        });
        let letter = finish.dead_letter.map(|letter| {
            slots::place(prefix, slots::slot(letter.topic.as_bytes()), ROLE_LETTER, &entry_tail)
        });
        FinishKeys {
            claim: claim.to_owned(),
            record: record.to_owned(),
            refused: refused.to_owned(),
            answer,
            copy,
            letter,
        }
    }
}

/// What the settle step records.
#[derive(Default)]
struct Settle<'a> {
    /// A final answer is on the response topic.
    answered: bool,
    /// This entry's refusal is on the response topic.
    refused: bool,
    /// Give the claim back.
    release: bool,
    /// The answer's id when this finish published it.
    published: &'a str,
    /// Delete the call record.
    delete_record: bool,
    /// Ack the entry.
    ack: bool,
}

/// How long the request's marks are kept.
fn retention(finish: &Finish<'_>) -> Duration {
    finish.call.map_or(Duration::ZERO, |call| call.retention)
}

/// Decodes the claim step's reply: `{claim, pending, own, taken}`, or `{3, pending, 0, 0, mark}`
/// for a request answered by another entry with its answer kept.
fn claimed_from(reply: Value) -> Result<Claimed, Error> {
    let protocol = |err: redis::ParsingError| Error::Protocol(err.to_string());
    if let Value::Array(parts) = &reply
        && let [Value::Int(3), pending, _, _, mark] = parts.as_slice()
    {
        let pending: i64 = redis::from_redis_value(pending.clone()).map_err(protocol)?;
        let mark: String = redis::from_redis_value(mark.clone()).map_err(protocol)?;
        let kept = KeptAnswer::from_mark(&mark)
            .ok_or_else(|| Error::Protocol("a kept answer's mark without its payload".to_owned()))?;
        return Ok(Claimed { claim: 1, pending, own: 0, taken: 0, kept: Some(kept) });
    }
    let (claim, pending, own, taken) = redis::from_redis_value(reply).map_err(protocol)?;
    Ok(Claimed { claim, pending, own, taken, kept: None })
}

/// A script's flag argument, owned.
fn flag(value: bool) -> String {
    super::flag(value).to_owned()
}

/// How the cluster scripts read and take claims in `format` (`answer_local.lua`'s ARGV[4],
/// `begin_call.lua`'s ARGV[5]): "0" the refusal marks are always looked up (format 1, or 2
/// rolling from 1), "1" format 2's notes are trusted, "3" trusted and new claims are strings.
pub(super) fn reads_flag(format: crate::LedgerFormat) -> &'static str {
    if format.writes_claim_strings() { "3" } else { super::flag(format.trusts_placeholders()) }
}

/// What the cluster scripts write in `format` (`claim.lua`'s and `settle.lua`'s ARGV[13]): "0"
/// format 1, "1" format 2 (refusals noted in the claim, new claims are hashes), "3" format 3
/// (refusals noted, new claims are strings).
fn writes_flag(format: crate::LedgerFormat) -> &'static str {
    if format.writes_claim_strings() { "3" } else { super::flag(format.writes_placeholders()) }
}

/// One slot of each primary, from a `CLUSTER SLOTS` reply (`[[start, end, [host, port, id], replicas...], ...]`).
fn primary_slots(reply: Value) -> Result<Vec<u16>, Error> {
    let bad = || Error::Protocol("malformed CLUSTER SLOTS reply".to_owned());
    let Value::Array(ranges) = reply else { return Err(bad()) };
    let mut primaries: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else { return Err(bad()) };
        let mut parts = parts.into_iter();
        let start: u16 =
            parts.next().and_then(|start| redis::from_redis_value(start).ok()).ok_or_else(bad)?;
        let _end = parts.next();
        let Some(Value::Array(primary)) = parts.next() else { return Err(bad()) };
        let mut primary = primary.into_iter();
        let host: String =
            primary.next().and_then(|host| redis::from_redis_value(host).ok()).ok_or_else(bad)?;
        let port: u16 = primary.next().and_then(|port| redis::from_redis_value(port).ok()).ok_or_else(bad)?;
        let address = format!("{host}:{port}");
        if !primaries.iter().any(|(known, _)| *known == address) {
            primaries.push((address, start));
        }
    }
    Ok(primaries.into_iter().map(|(_, slot)| slot).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Keys;
    use crate::bus::{EntryRef, Published};

    /// Every script of a cluster finish names keys of one slot, whatever the caller's topics are
    /// called, and the marks of different roles never share a name.
    #[test]
    fn every_step_of_a_finish_names_keys_of_one_slot() {
        let awkward = [
            "action-results",
            "results:{worker-7}",
            "results:}{x",
            "{}",
            "{",
            "résultats:ü",
            "results:{prod}:{x}",
            "chat:Planner",
        ];
        for prefix in ["", "prod:", "{prod}:"] {
            let keys = Keys::for_cluster(prefix);
            for stream in ["action-requests", "chat:ToolHost", "req{x}"] {
                let stream_key = keys.topic(stream);
                for (request_id, entry_id) in [("r-1", "1-0"), ("{r}", "2-0"), ("a}{b", "3-1")] {
                    let answered = keys.answered(stream, request_id);
                    let record = keys.call(stream, request_id);
                    let refused = keys.answered_entry(stream, entry_id);
                    for (topic, copy) in awkward.iter().zip(awkward.iter().rev()) {
                        let topic = keys.topic(topic);
                        let copy = keys.topic(copy);
                        let letters = keys.dead_letters("tool{box}");
                        for final_answer in [true, false] {
                            let finish = Finish {
                                entry: EntryRef { topic: &stream_key, group: "g", entry_id },
                                call: Some(CallKeys {
                                    answered: &answered,
                                    call: &record,
                                    entry: &refused,
                                    lease: Duration::from_secs(1),
                                    retention: Duration::from_secs(60),
                                }),
                                answer: Some(Published { topic: &topic, id: "a", payload: "{}" }),
                                answer_copy: Some(&copy),
                                dead_letter: Some(Published { topic: &letters, id: "d", payload: "{}" }),
                                final_answer,
                                tracked: true,
                                kept: None,
                                replay: false,
                            };
                            let found = FinishKeys::new(prefix, &finish);
                            let (final_mark, refusal_mark) = found.answer.clone().unwrap();
                            // `toolhost dlq replay` finds the mark by the same name.
                            assert_eq!(final_mark, keys.answered_mark(stream, request_id, &topic));
                            let copy_mark = found.copy.clone().unwrap();
                            let letter_mark = found.letter.clone().unwrap();
                            let steps: [&[&str]; 4] = [
                                &[&stream_key, &found.claim, &found.record, &found.refused],
                                &[&topic, &final_mark, &refusal_mark],
                                &[&copy, &copy_mark],
                                &[&letters, &letter_mark],
                            ];
                            for step in steps {
                                assert!(same_slot("test", step).is_ok(), "{prefix:?} {step:?}");
                            }
                            let mut names = vec![
                                &found.claim,
                                &found.record,
                                &found.refused,
                                &final_mark,
                                &refusal_mark,
                                &copy_mark,
                                &letter_mark,
                            ];
                            for name in &names {
                                assert!(name.starts_with(prefix), "{name}");
                            }
                            names.sort();
                            names.dedup();
                            assert_eq!(names.len(), 7, "{found:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ledger_keys_from_elsewhere_are_refused_rather_than_run_across_slots() {
        let keys = Keys::new("");
        let err = same_slot(
            "begin_call",
            &[&keys.answered("action-requests", "r-1"), &keys.call("action-requests", "r-2")],
        )
        .unwrap_err();
        assert!(!err.is_retryable() && err.to_string().contains("Keys::for_cluster"), "{err}");
    }

    #[test]
    fn cluster_slots_replies_name_one_slot_per_primary() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |start: i64, end: i64, port: i64| {
            Value::Array(vec![Value::Int(start), Value::Int(end), node(port), node(port + 100)])
        };
        let reply =
            Value::Array(vec![range(0, 5460, 7000), range(5461, 10922, 7001), range(10923, 16383, 7000)]);
        assert_eq!(primary_slots(reply).unwrap(), [0, 5461]);
        assert!(primary_slots(Value::Nil).is_err());
    }
}
