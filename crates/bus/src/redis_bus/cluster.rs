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
//!    stream, holding the topic and `claimed`). A claim held for another topic means a copy of
//!    the request named another response topic and that one gets the answer; a claim that says
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
use crate::bus::{CallKeys, Committed, Finish};
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
            include_str!("../scripts/cluster/begin_call.lua"),
            include_str!("../scripts/call_lease.lua")
        );
        Ok(self.batchers.cluster_begin_call.get_or_init(|| {
            // On the records' own connection when they wait for replicas: the pipeline of script
            // and WAIT goes whole to the primary of the items' slot (WAIT names no key).
            let (connection, wait) = self.record_connection();
            Batcher::waiting(source, 3, 4, connection, true, self.options.gather_batches, wait)
        }))
    }

    /// [`crate::Ledger::finish`] on a cluster, in the steps the module documentation lists.
    pub(super) async fn cluster_finish(&self, finish: &Finish<'_>) -> Result<Committed, Error> {
        let entry = finish.entry;
        let prefix = self.options.key_prefix.as_str();
        let identified = finish.call.is_some();
        let retention = finish.call.map_or(Duration::ZERO, |call| call.retention);
        let keys = FinishKeys::new(prefix, finish);
        let (claim_key, record, refused) = (keys.claim.as_str(), keys.record.as_str(), keys.refused.as_str());
        same_slot("finish", &[entry.topic, claim_key, record, refused])?;
        let bool_arg = |value: bool| if value { "1" } else { "0" }.to_owned();

        // Before anything is written: a copy topic of another type would leave the answer half
        // published (the answer topic itself is checked by its own step, which writes nothing then).
        if let (Some(_), Some(copy)) = (finish.answer, finish.answer_copy) {
            let kind: String = redis::cmd("TYPE").arg(copy).query_async(&mut self.commands.clone()).await?;
            if kind != "stream" && kind != "none" {
                return Ok(Committed::WrongType);
            }
        }

        // 1. The claim (S), and whether the entry is still pending.
        let (mut claim, mut pending, mut own, mut taken) = (0i64, 1i64, 0i64, 0i64);
        if (identified && finish.answer.is_some()) || finish.dead_letter.is_some() {
            let answer_topic = finish.answer.map_or("", |answer| answer.topic);
            let answer_id = finish.answer.map_or("", |answer| answer.id);
            let batcher = self.cluster_batcher(
                &self.batchers.cluster_claim,
                include_str!("../scripts/cluster/claim.lua"),
                3,
                9,
            );
            let reply = batcher
                .invoke(
                    vec![entry.topic.to_owned(), claim_key.to_owned(), refused.to_owned()],
                    vec![
                        entry.group.to_owned(),
                        entry.entry_id.to_owned(),
                        bool_arg(identified),
                        bool_arg(finish.answer.is_some()),
                        bool_arg(finish.final_answer),
                        answer_topic.to_owned(),
                        retention.as_millis().to_string(),
                        bool_arg(finish.dead_letter.is_some()),
                        answer_id.to_owned(),
                    ],
                )
                .await?;
            (claim, pending, own, taken) =
                redis::from_redis_value(reply).map_err(|err| Error::Protocol(err.to_string()))?;
        }
        if claim == 2 {
            tracing::warn!(
                entry_id = entry.entry_id,
                "a copy of this request named another response topic, which gets the answer; this copy is acked unanswered"
            );
        }

        // 2. The answer (T), once.
        let mut published = claim == 1 && own == 1;
        let mut answered_before = claim != 0;
        let mut final_on_topic = false;
        let mut refusal_on_topic = false;
        let mut release = false;
        if let Some(answer) = finish.answer.filter(|_| claim == 0) {
            let (final_mark, refusal_mark) = keys.answer.clone().unwrap_or_default();
            let found = self
                .publish_once(
                    answer.topic,
                    &final_mark,
                    &refusal_mark,
                    answer.id,
                    answer.payload,
                    identified,
                    finish.final_answer,
                    retention,
                )
                .await?;
            if found.published == -1 {
                if identified && finish.final_answer {
                    // Nobody can publish on this topic: give its claim back (whoever took it), so
                    // a copy naming a topic that can take the answer is answered; the entry stays
                    // pending, as on one server.
                    self.settle(
                        finish,
                        claim_key,
                        record,
                        refused,
                        Settle { release: true, ..Settle::default() },
                    )
                    .await?;
                }
                return Ok(Committed::WrongType);
            }
            published = found.published == 1;
            answered_before = !published;
            final_on_topic = found.final_on_topic;
            refusal_on_topic = !found.final_on_topic;
            // Claimed for a final answer that is not on the topic (this entry's refusal is): give
            // the claim back, if this finish took it.
            release = taken == 1 && !found.final_on_topic;
        }

        // 3. The copy (C), once, when this answer is the one on T.
        if let (Some(answer), Some(copy), true) = (finish.answer, finish.answer_copy, published) {
            let mark = keys.copy.clone().unwrap_or_default();
            let found = self
                .publish_once(copy, &mark, &mark, answer.id, answer.payload, identified, true, retention)
                .await?;
            if found.published == -1 {
                tracing::error!(
                    topic = copy,
                    "the answer's copy topic holds a key that is not a stream; copy dropped"
                );
            }
        }

        // 4. The dead letter (D), once, while the entry is pending (or its group is gone and the
        // request was not answered).
        if let Some(letter) = finish.dead_letter
            && (pending == 1 || (pending == -1 && !answered_before))
        {
            let mark = keys.letter.clone().unwrap_or_default();
            let found = self
                .publish_once(
                    letter.topic,
                    &mark,
                    &mark,
                    letter.id,
                    letter.payload,
                    true,
                    true,
                    retention.max(LETTER_MARK_TTL),
                )
                .await?;
            if found.published == -1 {
                return Err(Error::Refused(Cause::server(
                    "WRONGTYPE",
                    format!("the dead-letter topic '{}' holds a key that is not a stream", letter.topic),
                )));
            }
        }

        // 5. Settle (S): the claim, the refusal mark's copy, the call record, the ack.
        let settle = Settle {
            answered: final_on_topic,
            refused: refusal_on_topic && !finish.final_answer,
            release,
            published: if published { finish.answer.map_or("", |answer| answer.id) } else { "" },
            delete_record: claim != 2,
            ack: true,
        };
        self.settle(finish, claim_key, record, refused, settle).await?;
        Ok(if published { Committed::Published } else { Committed::NotPublished })
    }

    /// Appends a message to `topic` unless a mark says it was (see `scripts/cluster/publish.lua`).
    #[allow(clippy::too_many_arguments)]
    async fn publish_once(
        &self,
        topic: &str,
        final_mark: &str,
        refusal_mark: &str,
        id: &str,
        payload: &str,
        guarded: bool,
        final_answer: bool,
        retention: Duration,
    ) -> Result<Publish, Error> {
        let batcher = self.cluster_batcher(
            &self.batchers.cluster_publish,
            include_str!("../scripts/cluster/publish.lua"),
            3,
            6,
        );
        let reply = batcher
            .invoke(
                vec![topic.to_owned(), final_mark.to_owned(), refusal_mark.to_owned()],
                vec![
                    self.options.maxlen.to_string(),
                    retention.as_millis().max(1).to_string(),
                    id.to_owned(),
                    payload.to_owned(),
                    if guarded { "1" } else { "0" }.to_owned(),
                    if final_answer { "1" } else { "0" }.to_owned(),
                ],
            )
            .await?;
        let (published, final_on_topic): (i8, u8) =
            redis::from_redis_value(reply).map_err(|err| Error::Protocol(err.to_string()))?;
        Ok(Publish { published, final_on_topic: final_on_topic == 1 })
    }

    /// The settle step (see `scripts/cluster/settle.lua`).
    async fn settle(
        &self,
        finish: &Finish<'_>,
        claim: &str,
        record: &str,
        refused: &str,
        settle: Settle<'_>,
    ) -> Result<(), Error> {
        let entry = finish.entry;
        let flag = |value: bool| if value { "1" } else { "0" }.to_owned();
        let batcher = self.cluster_batcher(
            &self.batchers.cluster_settle,
            include_str!("../scripts/cluster/settle.lua"),
            4,
            11,
        );
        let retention = finish.call.map_or(Duration::ZERO, |call| call.retention);
        batcher
            .invoke(
                vec![entry.topic.to_owned(), claim.to_owned(), record.to_owned(), refused.to_owned()],
                vec![
                    entry.group.to_owned(),
                    entry.entry_id.to_owned(),
                    retention.as_millis().max(1).to_string(),
                    flag(finish.call.is_some()),
                    flag(settle.answered),
                    flag(settle.refused),
                    flag(settle.release),
                    finish.answer.map_or("", |answer| answer.topic).to_owned(),
                    settle.published.to_owned(),
                    flag(settle.delete_record),
                    flag(settle.ack),
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
