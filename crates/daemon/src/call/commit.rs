//! The ends of an entry's handling, each one commit through [`ledger::finish`]: an answer (and
//! what to do when it finds the request answered, or its topic unusable), a replay of a kept
//! answer, a refusal, a dead letter, a plain ack, and a hand-over to a replica.

use serde_json::Value;
use toolhost_bus::{CallKeys, Committed, EntryRef, Finish, KeptAnswer, Published};
use toolhost_envelope::{Entry, ErrorCode, ResultData};
use toolhost_tools::{Failure, Output};
use tracing::{debug, error, warn};

use super::{Answer, Call, Door, Letter, Lifecycle, Outcome, Refused, Reply, ledger};
use crate::auth::{Caller, Refusal};
use crate::call::cancel::Registration;
use crate::telemetry::CallSpan;

/// How an answer stands to its request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Finality {
    /// It ends the request for good: the answered mark is set (with the answer kept, for a door
    /// that keeps answers), and a later entry with the same request id is not answered again.
    Final,
    /// It leaves the request id free (refusals that ran nothing, a cancel's answer, a notice
    /// with a dead letter): a retry is answered again.
    #[default]
    NotFinal,
    /// It replays a kept answer for a retry: published once for this entry (guarded by the
    /// entry, like a refusal), whatever the request's answered mark holds.
    Replay,
}

impl Finality {
    /// Final unless the result is an error that leaves the request id free.
    pub(super) fn of(result: &Result<Output, Failure>) -> Finality {
        match result {
            Err(failure) if !failure.code.is_final() => Finality::NotFinal,
            _ => Finality::Final,
        }
    }
}

/// Whether the request may have a call record, which the commit then deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Record {
    /// This call wrote one, or an earlier holder of a redelivered entry may have.
    #[default]
    MayExist,
    /// None was written: a first delivery of a read-only, idempotent tool, or a request that ran
    /// no tool; the commit does not touch the record.
    Absent,
}

/// An answer to commit: the result, what kind of reply it is, and how the commit treats it.
pub(super) struct Answering {
    /// What the request is answered with.
    pub result: Result<Output, Failure>,
    /// What kind of answer it is, for logs and metrics.
    pub reply: Reply,
    /// How it stands to the request id.
    pub finality: Finality,
    /// Whether a call record may exist.
    pub record: Record,
}

/// What one commit writes with the entry's ack.
#[derive(Clone, Copy, Default)]
struct End<'a> {
    /// The request's ledger keys, when the request could be identified.
    call: Option<CallKeys<'a>>,
    /// The answer to publish.
    answer: Option<&'a Answer>,
    /// The dead letter to publish.
    letter: Option<&'a Letter>,
    /// How the answer stands to its request id.
    finality: Finality,
    /// Whether a call record may exist.
    record: Record,
}

impl<D: Door> Lifecycle<D> {
    /// Commits the answer to a request and settles what the commit found. `held` (a running
    /// call's registration, which a `tool.cancel` finds it by) is dropped once the answer is
    /// committed.
    pub(super) async fn conclude(
        &self,
        call: &Call<'_, D::Request>,
        answering: Answering,
        held: Option<Registration<'_>>,
    ) -> Outcome {
        let Answering { result, reply, finality, record } = answering;
        let outcome = match (&result, reply) {
            (_, Reply::Help) => Outcome::Help,
            (Ok(_), Reply::Result) => Outcome::Success,
            (Err(failure), Reply::Result) => Outcome::Error(failure.code),
        };
        if let Err(failure) = &result
            && failure.code == ErrorCode::InvalidOutput
        {
            error!(entry_id = %call.entry.entry_id, details = ?failure.details, "tool bug: output breaks the tool's output schema");
        }
        let answer = self.door.answer(call.request(), &result);
        let end = End { call: Some(call.keys), answer: Some(&answer), letter: None, finality, record };
        let settle = call.span.map(CallSpan::settle);
        let committed = self.commit(call.entry, end).await;
        drop(settle);
        drop(held);
        match committed {
            // Another entry of the request was answered meanwhile: its answer is this one's too.
            Some(Committed::Kept(kept)) => self.replay(call, kept).await,
            committed => self.settle(call, committed, &answer, outcome).await,
        }
    }

    /// What a commit of `answer` made of the entry: `published` when the answer went out.
    async fn settle(
        &self,
        call: &Call<'_, D::Request>,
        committed: Option<Committed>,
        answer: &Answer,
        published: Outcome,
    ) -> Outcome {
        match committed {
            Some(Committed::Published) => published,
            Some(Committed::NotPublished) => Outcome::Duplicate,
            Some(Committed::WrongType) => self.wrong_type(call, answer).await,
            Some(_) | None => Outcome::LeftPending,
        }
    }

    /// Answers a retry of an answered request with the original answer, kept with its answered
    /// mark: the same `data`, in an envelope made for the retry (its response event and topic,
    /// its correlation id), published once for this entry and never run again.
    pub(super) async fn replay(&self, call: &Call<'_, D::Request>, kept: KeptAnswer) -> Outcome {
        let entry = call.entry;
        let Some(result) = kept_result(&kept.data) else {
            warn!(entry_id = %entry.entry_id, answer_id = %kept.id, "a kept answer cannot be read; the retry is acked unanswered");
            return self
                .ack(entry, Some(call.keys))
                .await
                .map_or(Outcome::LeftPending, |_| Outcome::Duplicate);
        };
        debug!(entry_id = %entry.entry_id, answer_id = %kept.id, "answering a retry with the kept answer");
        let answer = self.door.answer(call.request(), &result);
        let end = End {
            call: Some(call.keys),
            answer: Some(&answer),
            finality: Finality::Replay,
            ..End::default()
        };
        let committed = self.commit(entry, end).await;
        self.settle(call, committed, &answer, Outcome::Replayed).await
    }

    /// Answers a request refused by authentication the door's way (on a topic the payload did
    /// not choose, or as a dead letter), not final: nothing ran, so the request id stays free.
    pub(super) async fn refuse(&self, call: &Call<'_, D::Request>, refusal: Refusal) -> Outcome {
        let tenant = call.admitted.tenant.as_deref().unwrap_or_default();
        let caller = Caller { tenant, key_id: refusal.key_id.as_deref() };
        let reason = refusal.failure.message.clone();
        let tool = call.admitted.tool_label.as_deref().unwrap_or("-");
        self.audit(call, caller, tool, "refused", &reason, None).await;
        match self.door.refusal(call.entry, call.request(), refusal.failure) {
            Refused::Answer(answer) => {
                let end = End {
                    call: Some(call.keys),
                    answer: Some(&answer),
                    record: Record::Absent,
                    ..End::default()
                };
                let committed = self.commit(call.entry, end).await;
                self.settle(call, committed, &answer, Outcome::Error(ErrorCode::Forbidden)).await
            }
            Refused::DeadLetter(letter) => {
                self.dead_letter(call.entry, Some(&call.keys), letter, &reason, None).await
            }
        }
    }

    /// An entry delivered too often: dead-letter it and answer `internal` when it can be.
    pub(super) async fn poison(&self, call: &Call<'_, D::Request>) -> Outcome {
        let reason = format!(
            "delivered {} times without completing (limit {}); each holder stopped or failed before answering",
            call.entry.deliveries, self.settings.max_deliveries
        );
        let failure = Failure::new(
            ErrorCode::Internal,
            "the request failed repeatedly inside the tool host and was moved to the dead-letter stream",
        );
        let answer = self.door.answer(call.request(), &Err(failure));
        let letter = self.door.letter(call.entry, call.request(), &reason);
        self.dead_letter(call.entry, Some(&call.keys), letter, &reason, Some(&answer)).await
    }

    /// The answer's topic holds a key that is not a stream, so no answer can ever be published
    /// there: publish the door's fallback answer (not final) and dead-letter the request, rather
    /// than let the entry loop through redeliveries.
    async fn wrong_type(&self, call: &Call<'_, D::Request>, answer: &Answer) -> Outcome {
        let entry = call.entry;
        error!(entry_id = %entry.entry_id, topic = %answer.topic, "answer topic holds a key that is not a stream; dead-lettering");
        let reason =
            format!("the answer's topic '{}' holds a key that is not a stream", self.bare(&answer.topic));
        let fallback = self.door.fallback(call.request(), &reason);
        let letter = self.door.letter(entry, call.request(), &reason);
        self.dead_letter(entry, Some(&call.keys), letter, &reason, fallback.as_ref()).await
    }

    /// A full key without the configured prefix, for sentences callers read.
    fn bare<'a>(&self, key: &'a str) -> &'a str {
        key.strip_prefix(self.services.keys.prefix()).unwrap_or(key)
    }

    /// Dead-letters an entry, acking it, with an answer (not final) when one is given.
    pub(super) async fn dead_letter(
        &self,
        entry: &Entry,
        call: Option<&CallKeys<'_>>,
        letter: Letter,
        reason: &str,
        answer: Option<&Answer>,
    ) -> Outcome {
        warn!(entry_id = %entry.entry_id, reason, "dead-lettering entry");
        self.services.telemetry.dead_lettered();
        let end = End { call: call.copied(), answer, letter: Some(&letter), ..End::default() };
        let committed = match self.commit(entry, end).await {
            // Even the fallback topic cannot take an answer: write the dead letter alone.
            Some(Committed::WrongType) => self.commit(entry, End { answer: None, ..end }).await,
            committed => committed,
        };
        committed.map_or(Outcome::LeftPending, |_| Outcome::DeadLetter)
    }

    /// Moves an entry to `consumer`, a replica of this toolbox that hosts its tool; it stays
    /// pending here when Redis refuses, and is reclaimed as usual.
    pub(super) async fn hand_over(&self, entry: &Entry, consumer: &str) -> Outcome {
        let settings = &self.settings;
        let moved =
            self.services.bus.hand_over(&settings.topic, &settings.group, consumer, &entry.entry_id).await;
        match moved {
            Ok(()) => Outcome::HandedOver,
            Err(err) => {
                warn!(error = %err, entry_id = %entry.entry_id, consumer, "cannot hand the entry to the replica hosting its tool");
                Outcome::LeftPending
            }
        }
    }

    /// Moves an entry that reached the wrong shard of the requests stream to its home shard
    /// `home` (bare name), then acks it here: the move is guarded by a mark in the home shard's
    /// slot, so an entry moved and then reclaimed before its ack (a crash between the two) is
    /// moved once. The moved copy is a new entry of the home shard, answered there by the ledger
    /// of its request id.
    pub(super) async fn move_home(&self, entry: &Entry, home: &str) -> Outcome {
        let (settings, keys) = (&self.settings, &self.services.keys);
        let mark = keys.moved(home, &settings.ledger, &entry.entry_id);
        let mut fields = vec![("id", entry.id.as_str())];
        if let Some(payload) = entry.payload.as_deref() {
            fields.push(("payload", payload));
        }
        if let toolhost_envelope::Sig::One(sig) = &entry.sig {
            fields.push(("sig", sig.as_str()));
        }
        let moved =
            self.services.bus.move_once(&keys.topic(home), &mark, &fields, settings.answered_retention).await;
        if let Err(err) = moved {
            warn!(error = %err, entry_id = %entry.entry_id, home, "cannot move the request to its home shard; left pending");
            return Outcome::LeftPending;
        }
        debug!(entry_id = %entry.entry_id, home, "a request on the wrong shard moved to its home shard");
        self.ack(entry, None).await.map_or(Outcome::LeftPending, |_| Outcome::Moved)
    }

    /// Acks an entry without answering it.
    pub(super) async fn ack(&self, entry: &Entry, call: Option<CallKeys<'_>>) -> Option<Committed> {
        self.commit(entry, End { call, ..End::default() }).await
    }

    /// Commits the end of an entry through [`ledger::finish`]: the answer, the dead letter, the
    /// answered mark (when final) and the ack, atomically. A final answer of a door that keeps
    /// answers is kept with its mark (its `data`) when that fits `[dispatch]
    /// kept_answer_max_bytes`.
    async fn commit(&self, entry: &Entry, end: End<'_>) -> Option<Committed> {
        let settings = &self.settings;
        let kept = end.answer.and_then(|answer| answer.kept.as_deref()).filter(|kept| {
            end.finality == Finality::Final
                && D::TRAITS.keeps_answers
                && kept.len() <= settings.kept_answer_max_bytes
        });
        let published = |topic, id, payload| Published { topic, id, payload };
        let finish = Finish {
            entry: EntryRef { topic: &settings.topic, group: &settings.group, entry_id: &entry.entry_id },
            call: end.call,
            answer: end.answer.map(|answer| published(&answer.topic, &answer.id, &answer.payload)),
            answer_copy: end.answer.and_then(|answer| answer.copy.as_deref()),
            dead_letter: end.letter.map(|letter| published(&letter.topic, &letter.id, &letter.payload)),
            final_answer: end.finality == Finality::Final,
            tracked: end.record == Record::MayExist,
            kept,
            replay: end.finality == Finality::Replay,
        };
        let services = &self.services;
        ledger::finish(&*services.bus, &finish, services.shutdown.forced(), &services.telemetry).await
    }
}

/// The result a kept answer's `data` holds; `None` when it is not a result's `data`.
fn kept_result(data: &str) -> Option<Result<Output, Failure>> {
    let data = serde_json::from_str::<ResultData>(data).ok()?;
    Some(if data.success {
        Ok(Output { result: data.result.unwrap_or(Value::Null), content: data.content })
    } else {
        Err(Failure {
            code: data.error_code.unwrap_or(ErrorCode::Internal),
            message: data.error.unwrap_or_default(),
            details: data.details,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_errors_that_leave_the_request_id_free_are_not_final() {
        let failure = |code| Err(Failure::new(code, "why"));
        assert_eq!(Finality::of(&Ok(Value::Null.into())), Finality::Final);
        assert_eq!(Finality::of(&failure(ErrorCode::ToolFailed)), Finality::Final);
        assert_eq!(Finality::of(&failure(ErrorCode::Cancelled)), Finality::Final);
        assert_eq!(Finality::of(&failure(ErrorCode::Overloaded)), Finality::NotFinal);
        assert_eq!(Finality::of(&failure(ErrorCode::Internal)), Finality::NotFinal);
    }
}
