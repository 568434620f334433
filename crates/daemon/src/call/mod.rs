//! The one call lifecycle every door drives.
//!
//! A delivered entry goes through the same states whichever door it came in by:
//!
//! ```text
//! delivered ─ admit ─┬─ dead-lettered (nothing says where to answer) ──────────────── acked
//!                    ├─ ignored (the door answers nothing, e.g. a control message) ─── acked
//!                    └─ admitted ─ ledger ─┬─ duplicate (answered, or running elsewhere) ─ acked
//!                                          ├─ left pending (owner alive, or Redis refused)
//!                                          ├─ poison (delivered too often) ─ dead-lettered + answered
//!                                          ├─ interrupted (a non-idempotent call's holder died) ─┐
//!                                          └─ running ─┬─ finished(outcome) ────────────────────┤
//!                                                      └─ left pending (shutdown forced)         │
//!                                          answered once + answered mark (if final) + acked ◄────┘
//! ```
//!
//! A [`Door`] says how its entries are read (admission), what running one means (a tool with
//! arguments, or an answer made without a tool), what the answer looks like and where it goes,
//! and how its dead letters look. [`Lifecycle`] does the rest, the same for every door: the
//! ledger (begin, lease renewal, commit), the per-tool limits and the global slot, deadlines,
//! poison, forced shutdown, a response topic of the wrong type, and the outcome's metrics.

pub(crate) mod cancel;
pub(crate) mod ledger;
pub(crate) mod progress;

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolhost_bus::{CallKeys, CallStart, Committed, EntryRef, Finish, KeptAnswer, Published, call_owner};
use toolhost_envelope::{Entry, ErrorCode, ResultData};
use toolhost_tools::{Admit, Context, Failure, Full, ProgressReport, Registry, Running};
use tracing::{debug, error, warn};

use crate::auth::{AuditEntry, Caller, Claim, Refusal};
use crate::group::{EntryHandler, Slot, StreamSettings};
use crate::services::Services;

/// The tool label of calls naming a tool that does not exist, in `tools.stats` and metrics.
pub(crate) const UNKNOWN_TOOL_LABEL: &str = "_unknown";

/// What admission made of an entry.
pub(crate) enum Admission<R> {
    /// Nothing tells where to answer: publish this dead letter; the reason is for the log.
    DeadLetter(Letter, String),
    /// Ack it without answering; the reason is for the log.
    Ignore(R, &'static str),
    /// Answer it.
    Request(R),
}

/// What answering an admitted request takes.
pub(crate) enum Work {
    /// Run a tool.
    Tool {
        /// The tool's name, as the caller gave it.
        name: String,
        /// The arguments, not yet validated.
        arguments: Value,
    },
    /// Answer without running a tool (discovery, statistics, refusals, help).
    Answer(Result<Value, Failure>, Reply),
    /// Ack without answering: another toolbox answers it.
    AckOnly,
    /// Hand the entry to this consumer of the same group, which hosts its tool.
    HandOver(String),
    /// Cancel the call with this request id, wherever it runs, and answer (not final) with
    /// what was found.
    Cancel(String),
}

/// How a door answers a request refused by authentication: never on a topic the (unverified)
/// payload chose.
pub(crate) enum Refused {
    /// Publish this answer (on the door's default topic).
    Answer(Answer),
    /// Dead-letter the entry with this letter.
    DeadLetter(Letter),
}

/// Which tools a caller may call, for listings (discovery, help).
#[derive(Clone, Copy)]
pub(crate) struct Permits<'a> {
    auth: &'a crate::auth::Auth,
    tenant: &'a str,
}

impl Permits<'_> {
    /// Whether the caller's policy lets it call `tool`.
    pub(crate) fn allows(&self, tool: &str) -> bool {
        !self.auth.has_policy() || self.auth.allows(self.tenant, tool)
    }
}

/// What kind of answer a [`Work::Answer`] is, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A result or an error, counted by its outcome.
    Result,
    /// A help text for a message that asked for no tool.
    Help,
}

/// An answer ready to publish.
pub(crate) struct Answer {
    /// Full key of the topic it goes to.
    pub topic: String,
    /// Full key of a second topic that gets the same answer, if any.
    pub copy: Option<String>,
    /// Its message id.
    pub id: String,
    /// Its JSON payload.
    pub payload: String,
    /// What the ledger keeps of it for a retry of the request (its `data`), when the door keeps
    /// answers ([`Door::keeps_answers`]).
    pub kept: Option<String>,
}

/// A dead letter ready to publish.
pub(crate) struct Letter {
    /// Full key of the dead-letter topic.
    pub topic: String,
    /// Its message id.
    pub id: String,
    /// Its JSON payload.
    pub payload: String,
}

/// How a handled entry ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Answered with a tool's result.
    Success,
    /// Answered with an error (`interrupted` included).
    Error(ErrorCode),
    /// Answered with help.
    Help,
    /// Acked unanswered, by the door's choice.
    Ignored,
    /// Moved to the dead-letter stream (and answered when it could be).
    DeadLetter,
    /// Acked unanswered: the request was answered, or is being answered, by another entry.
    Duplicate,
    /// A retry of a request answered by another entry, answered with that entry's kept answer.
    Replayed,
    /// Left pending: its owner is alive elsewhere, Redis refused the commit, or shutdown was
    /// forced; a replica (or this one) takes it over after the lease.
    LeftPending,
    /// Moved, unanswered, to a replica of the same toolbox that hosts its tool.
    HandedOver,
}

impl Outcome {
    /// The label of metrics and logs.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Error(code) => code.as_str(),
            Outcome::Help => "help",
            Outcome::Ignored => "ignored",
            Outcome::DeadLetter => "dead_letter",
            Outcome::Duplicate => "duplicate",
            Outcome::Replayed => "replayed",
            Outcome::LeftPending => "left_pending",
            Outcome::HandedOver => "handed_over",
        }
    }
}

/// One way calls come in: how an entry is read and answered.
pub(crate) trait Door: Send + Sync + 'static {
    /// An admitted entry.
    type Request: Send + Sync;

    /// The door's name in audit entries.
    const NAME: &'static str;

    /// Reads an entry.
    fn admit(&self, entry: &Entry, registry: &Registry) -> Admission<Self::Request>;

    /// The id the ledger remembers the request by.
    fn ledger_id(&self, request: &Self::Request) -> String;

    /// What the request says about its caller (tenant, time), for the signature check and the
    /// tenant's policy.
    fn claim<'a>(&self, request: &'a Self::Request) -> Claim<'a>;

    /// Where the request says it comes from (the envelope's `source`), for audit entries.
    fn source<'a>(&self, _request: &'a Self::Request) -> Option<&'a str> {
        None
    }

    /// How to answer a request refused by authentication (`failure` is `forbidden`).
    fn refusal(&self, entry: &Entry, request: &Self::Request, failure: Failure) -> Refused;

    /// What answering the request takes; `permits` says which tools the caller may call, for
    /// listings.
    fn work(&self, request: &Self::Request, registry: &Registry, permits: Permits<'_>) -> Work;

    /// When the request stops being worth running, as time since the UNIX epoch.
    fn deadline(&self, entry: &Entry, request: &Self::Request) -> Option<Duration>;

    /// What the tool is told about the call.
    fn context(&self, request: &Self::Request) -> Context;

    /// The answer to publish for `result`, and whether it is final for the request id.
    fn answer(&self, request: &Self::Request, result: &Result<Value, Failure>) -> Answer;

    /// An answer to publish instead when the answer's topic cannot take it (it holds another
    /// type of key), on a topic that can; `None` when there is no such topic.
    fn fallback(&self, request: &Self::Request, reason: &str) -> Option<Answer>;

    /// The dead letter of an admitted request's entry.
    fn letter(&self, entry: &Entry, request: &Self::Request, reason: &str) -> Letter;

    /// Whether the door relays the progress of its calls (see [`Door::progress`]).
    fn relays_progress(&self) -> bool {
        false
    }

    /// A progress entry of the request's running call, to publish on the answer's topic.
    fn progress(&self, _request: &Self::Request, _report: &ProgressReport) -> Option<Answer> {
        None
    }

    /// Whether the door keeps final answers with the answered mark and answers a retry of an
    /// answered request (another entry with the same request id) with the original answer.
    fn keeps_answers(&self) -> bool {
        false
    }

    /// Whether every tool call takes a call record, even of read-only, idempotent tools: a door
    /// whose calls have effects of their own (progress events) must not run a duplicate.
    fn tracks_every_call(&self) -> bool {
        false
    }

    /// Called before a tool runs (progress events).
    fn started(&self, _request: &Self::Request, _tool: &str) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Called after a tool ran or was answered without running (progress events).
    fn finished(
        &self,
        _request: &Self::Request,
        _tool: &str,
        _result: &Result<Value, Failure>,
        _duration: Duration,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// The tool label of the request for stats and metrics; `None` when it names no tool.
    fn tool_label(&self, request: &Self::Request, registry: &Registry) -> Option<String>;

    /// Logs the end of an entry's handling.
    fn log(
        &self,
        entry: &Entry,
        request: Option<&Self::Request>,
        tool: &str,
        outcome: Outcome,
        duration: Duration,
    );
}

/// Drives the entries of one door through the call lifecycle.
pub(crate) struct Lifecycle<D> {
    door: D,
    services: Services,
    settings: StreamSettings,
}

impl<D: Door> Lifecycle<D> {
    /// The lifecycle of `door`'s entries.
    pub(crate) fn new(door: D, services: Services, settings: StreamSettings) -> Lifecycle<D> {
        Lifecycle { door, services, settings }
    }

    /// Handles one entry to its end, then counts and logs how it ended.
    async fn handle_entry(&self, entry: &Entry, slot: &mut Slot) {
        let started = Instant::now();
        let services = &self.services;
        if entry.deliveries > 1 {
            services.telemetry.redelivered();
        }
        // One snapshot for the whole call: a reload meanwhile does not change its tools.
        let registry = services.registry.snapshot();
        let (outcome, request) = match self.door.admit(entry, &registry) {
            Admission::DeadLetter(letter, reason) => {
                (self.dead_letter(entry, None, letter, &reason, None).await, None)
            }
            Admission::Ignore(request, reason) => {
                tracing::debug!(entry_id = %entry.entry_id, reason, "entry ignored");
                let outcome = self.ack(entry, None).await.map_or(Outcome::LeftPending, |_| Outcome::Ignored);
                (outcome, Some(request))
            }
            Admission::Request(request) => {
                let claim = self.door.claim(&request);
                let caller = services
                    .gate
                    .authenticate(&entry.sig, entry.payload.as_deref(), claim)
                    .map(|key_id| Caller { tenant: claim.tenant.unwrap_or_default(), key_id });
                (self.answer(entry, &request, &registry, slot, caller).await, Some(request))
            }
        };
        let duration = started.elapsed();
        let tool = request.as_ref().and_then(|request| self.door.tool_label(request, &registry));
        let tool = tool.as_deref().unwrap_or("-");
        if let Outcome::Success | Outcome::Error(_) = outcome {
            let code = match outcome {
                Outcome::Error(code) => Some(code.as_str()),
                _ => None,
            };
            services.stats.record(tool, code, duration);
        }
        services.telemetry.invocation(tool, outcome.label(), duration);
        // Not logged: entries the door ignores, and a sibling's call this toolbox does not
        // host (acked as its duplicate), so each call has one line, the host's.
        let not_ours = outcome == Outcome::Duplicate && tool == UNKNOWN_TOOL_LABEL;
        if let Some(log) = &services.call_log
            && outcome != Outcome::Ignored
            && !not_ours
        {
            log.record(crate::call_log::Record {
                request_id: request.as_ref().map_or_else(|| entry.id.clone(), |r| self.door.ledger_id(r)),
                tool: tool.to_owned(),
                tenant: request
                    .as_ref()
                    .and_then(|r| self.door.claim(r).tenant)
                    .unwrap_or_default()
                    .to_owned(),
                door: D::NAME,
                source: request.as_ref().and_then(|r| self.door.source(r)).unwrap_or_default().to_owned(),
                outcome: outcome.label(),
                duration_us: duration.as_micros() as u64,
                entry_id: entry.entry_id.clone(),
                deliveries: entry.deliveries,
            });
        }
        self.door.log(entry, request.as_ref(), tool, outcome, duration);
    }

    /// Takes an admitted request to its end.
    ///
    /// For tool calls the ledger is consulted first, so a copy of a request that is answered or
    /// running elsewhere is neither dead-lettered as poison nor answered `expired` over the live
    /// call's answer.
    async fn answer(
        &self,
        entry: &Entry,
        request: &D::Request,
        registry: &Registry,
        slot: &mut Slot,
        caller: Result<Caller<'_>, Refusal>,
    ) -> Outcome {
        let ledger_id = self.door.ledger_id(request);
        let keys = &self.services.keys;
        let answered = keys.answered(&self.settings.ledger, &ledger_id);
        let record = keys.call(&self.settings.ledger, &ledger_id);
        let refused = keys.answered_entry(&self.settings.ledger, &entry.entry_id);
        let call = CallKeys {
            answered: &answered,
            call: &record,
            entry: &refused,
            lease: self.settings.claim_idle,
            retention: self.settings.answered_retention,
        };
        let caller = match caller {
            Ok(caller) => caller,
            Err(refusal) => return self.refuse(entry, request, &call, &ledger_id, refusal).await,
        };
        let poisoned = entry.deliveries > self.settings.max_deliveries;
        let gate = &self.services.gate;
        let permits = Permits { auth: gate.auth(), tenant: caller.tenant };
        let mut work = self.door.work(request, registry, permits);
        // The tenant's policy and limits, before the ledger: a refused call takes no record.
        let mut _in_flight = None;
        if let Work::Tool { name, arguments } = &work {
            match gate.admit_call(caller, name).await {
                Ok(counted) => _in_flight = counted,
                Err(failure) => {
                    self.audit(
                        request,
                        &ledger_id,
                        caller,
                        name,
                        "refused",
                        &failure.message,
                        Some(arguments),
                    )
                    .await;
                    work = Work::Answer(Err(failure), Reply::Result);
                }
            }
        }
        // Whether a call record was written for this request, which finishing then deletes.
        let mut tracked = false;
        // A cancel's answer is never final: the id it names is the call's, not its own.
        let mut cancel = false;
        // Held until the call's answer is committed: a `tool.cancel` finds the call here.
        let mut registration = None;
        let (result, reply) = match work {
            Work::HandOver(consumer) => return self.hand_over(entry, &consumer).await,
            Work::AckOnly => {
                return self.ack(entry, None).await.map_or(Outcome::LeftPending, |_| Outcome::Duplicate);
            }
            Work::Answer(_, _) if poisoned => return self.poison(entry, request, &call).await,
            Work::Answer(result, reply) => match self.expired(entry, request) {
                Some(failure) => (Err(failure), Reply::Result),
                None => (result, reply),
            },
            Work::Cancel(_) if poisoned => return self.poison(entry, request, &call).await,
            Work::Cancel(call_id) => {
                cancel = true;
                match self.expired(entry, request) {
                    Some(failure) => (Err(failure), Reply::Result),
                    None => {
                        let forced = self.services.shutdown.forced();
                        let ledger = &self.settings.ledger;
                        let Some(state) = self.services.calls.cancel(ledger, &call_id, forced).await else {
                            return Outcome::LeftPending;
                        };
                        (Ok(json!({"request_id": call_id, "state": state.as_str()})), Reply::Result)
                    }
                }
            }
            Work::Tool { name, arguments } => {
                // Registered before the ledger step, so a cancel that finds the call record
                // also finds the call here.
                let (cancel_token, registered) =
                    self.services.calls.register(&self.settings.ledger, &ledger_id);
                registration = Some(registered);
                // A read-only, idempotent tool runs without a call record, so without a lease to
                // own: no owner (its renewal only keeps its entry).
                let owner = (!self.untracked(&name, registry))
                    .then(|| call_owner(&self.settings.consumer, &entry.entry_id));
                let begun = self.begin(entry, &call, &ledger_id, &name, owner.as_deref(), registry).await;
                // A redelivered entry may have a record its earlier holder wrote.
                tracked = entry.deliveries > 1 || !matches!(begun, Begin::Run { tracked: false });
                let result = match begun {
                    Begin::End(outcome) => return outcome,
                    Begin::Replay(kept) => return self.replay(entry, request, &call, kept).await,
                    _ if poisoned => return self.poison(entry, request, &call).await,
                    Begin::Interrupted => {
                        let result = Err(ledger::interrupted(&name));
                        self.door.finished(request, &name, &result, Duration::ZERO).await;
                        result
                    }
                    Begin::Refuse(failure) => Err(failure),
                    Begin::Run { tracked: recorded } => match self.expired(entry, request) {
                        Some(failure) => Err(failure),
                        None => {
                            if registry.annotations(&name).is_some_and(|a| a.destructive) {
                                let reason = "a tool annotated destructive";
                                self.audit(
                                    request,
                                    &ledger_id,
                                    caller,
                                    &name,
                                    "allowed",
                                    reason,
                                    Some(&arguments),
                                )
                                .await;
                            }
                            let running = self.run_tool(
                                entry,
                                request,
                                &call,
                                &ledger_id,
                                registry,
                                &name,
                                arguments,
                                owner.as_deref().unwrap_or_default(),
                                recorded,
                                &cancel_token,
                                slot,
                            );
                            match running.await {
                                Some(result) => result,
                                // Shutdown was forced: the entry stays pending with a lapsing
                                // lease, and a replica takes it over.
                                None => return Outcome::LeftPending,
                            }
                        }
                    },
                };
                (result, Reply::Result)
            }
        };
        let outcome = match (&result, reply) {
            (_, Reply::Help) => Outcome::Help,
            (Ok(_), Reply::Result) => Outcome::Success,
            (Err(failure), Reply::Result) => Outcome::Error(failure.code),
        };
        if let Err(failure) = &result
            && failure.code == ErrorCode::InvalidOutput
        {
            error!(entry_id = %entry.entry_id, details = ?failure.details, "tool bug: output breaks the tool's output schema");
        }
        let final_answer = !cancel && result.as_ref().err().is_none_or(|failure| failure.code.is_final());
        let answer = self.door.answer(request, &result);
        let committed = self.commit(entry, Some(call), Some(&answer), None, final_answer, tracked).await;
        drop(registration);
        match committed {
            Some(Committed::Published) => outcome,
            Some(Committed::NotPublished) => Outcome::Duplicate,
            Some(Committed::WrongType) => self.wrong_type(entry, request, &call, &answer).await,
            // Another entry of the request was answered meanwhile: its answer is this one's too.
            Some(Committed::Kept(kept)) => self.replay(entry, request, &call, kept).await,
            Some(_) | None => Outcome::LeftPending,
        }
    }

    /// Answers a retry of an answered request with the original answer, kept with its answered
    /// mark: the same `data`, in an envelope made for the retry (its response event and topic,
    /// its correlation id), published once for this entry and never run again.
    async fn replay(
        &self,
        entry: &Entry,
        request: &D::Request,
        call: &CallKeys<'_>,
        kept: KeptAnswer,
    ) -> Outcome {
        let Some(result) = kept_result(&kept.data) else {
            warn!(entry_id = %entry.entry_id, answer_id = %kept.id, "a kept answer cannot be read; the retry is acked unanswered");
            return self.ack(entry, Some(*call)).await.map_or(Outcome::LeftPending, |_| Outcome::Duplicate);
        };
        debug!(entry_id = %entry.entry_id, answer_id = %kept.id, "answering a retry with the kept answer");
        let answer = self.door.answer(request, &result);
        match self.commit_as(entry, Some(*call), Some(&answer), None, false, true, true).await {
            Some(Committed::Published) => Outcome::Replayed,
            Some(Committed::NotPublished) => Outcome::Duplicate,
            Some(Committed::WrongType) => self.wrong_type(entry, request, call, &answer).await,
            Some(_) | None => Outcome::LeftPending,
        }
    }

    /// Answers a request refused by authentication the door's way (on a topic the payload did
    /// not choose, or as a dead letter), not final: nothing ran, so the request id stays free.
    async fn refuse(
        &self,
        entry: &Entry,
        request: &D::Request,
        call: &CallKeys<'_>,
        ledger_id: &str,
        refusal: Refusal,
    ) -> Outcome {
        let tenant = self.door.claim(request).tenant.unwrap_or_default();
        let caller = Caller { tenant, key_id: refusal.key_id.as_deref() };
        let reason = refusal.failure.message.clone();
        let tool = self.door.tool_label(request, &self.services.registry.snapshot());
        self.audit(request, ledger_id, caller, tool.as_deref().unwrap_or("-"), "refused", &reason, None)
            .await;
        match self.door.refusal(entry, request, refusal.failure) {
            Refused::Answer(answer) => {
                match self.commit(entry, Some(*call), Some(&answer), None, false, false).await {
                    Some(Committed::Published) => Outcome::Error(ErrorCode::Forbidden),
                    Some(Committed::NotPublished) => Outcome::Duplicate,
                    Some(Committed::WrongType) => self.wrong_type(entry, request, call, &answer).await,
                    Some(_) | None => Outcome::LeftPending,
                }
            }
            Refused::DeadLetter(letter) => self.dead_letter(entry, Some(call), letter, &reason, None).await,
        }
    }

    /// Appends to the audit stream.
    #[allow(clippy::too_many_arguments)]
    async fn audit(
        &self,
        request: &D::Request,
        request_id: &str,
        caller: Caller<'_>,
        tool: &str,
        decision: &'static str,
        reason: &str,
        arguments: Option<&Value>,
    ) {
        let entry = AuditEntry {
            request_id,
            tenant: caller.tenant,
            principal: caller.key_id.map(|id| format!("key:{id}")),
            tool,
            decision,
            reason,
            door: D::NAME,
            source: self.door.source(request),
            arguments,
        };
        self.services.gate.audit(entry).await;
    }

    /// Consults the ledger before running a tool; a call without an `owner` is not recorded.
    async fn begin(
        &self,
        entry: &Entry,
        call: &CallKeys<'_>,
        ledger_id: &str,
        tool: &str,
        owner: Option<&str>,
        registry: &Registry,
    ) -> Begin {
        let Some(owner) = owner else {
            return Begin::Run { tracked: false };
        };
        let annotations = registry.annotations(tool);
        let forced = self.services.shutdown.forced();
        let bus = &*self.services.bus;
        let Some(start) = ledger::begin(bus, call, owner, &entry.entry_id, ledger_id, forced).await else {
            return Begin::End(Outcome::LeftPending);
        };
        match start {
            CallStart::Fresh => Begin::Run { tracked: true },
            // The owner is alive and will ack this very entry.
            CallStart::Busy { entry_id } if entry_id == entry.entry_id => Begin::End(Outcome::LeftPending),
            CallStart::AnsweredKept(kept) if self.door.keeps_answers() => Begin::Replay(kept),
            // Answered, or a re-sent copy while the original runs: the original's answer is the one.
            CallStart::Answered | CallStart::AnsweredKept(_) | CallStart::Busy { .. } => {
                Begin::End(self.ack(entry, None).await.map_or(Outcome::LeftPending, |_| Outcome::Duplicate))
            }
            CallStart::StartedBefore if annotations.is_some_and(|a| a.idempotent) => {
                Begin::Run { tracked: true }
            }
            CallStart::StartedBefore => Begin::Interrupted,
            // Too few replicas have the record: a failover could lose it and run the tool again.
            // A call started before whose tool is not idempotent runs nothing anyway.
            CallStart::Unreplicated { started_before: true, .. }
                if !annotations.is_some_and(|a| a.idempotent) =>
            {
                Begin::Interrupted
            }
            CallStart::Unreplicated { acked, wanted, timeout, .. } => {
                warn!(
                    request_id = ledger_id,
                    tool,
                    acked,
                    wanted,
                    "too few replicas acknowledged the call record; not run, answered overloaded"
                );
                Begin::Refuse(ledger::unreplicated(tool, acked, wanted, timeout))
            }
            _ => Begin::End(Outcome::LeftPending),
        }
    }

    /// Whether a call of `tool` runs without a call record: a read-only, idempotent tool, unless
    /// the door tracks every call. Running such a tool twice has no effect a caller can see, and
    /// its answer is still published once, because the answered mark is checked when the answer
    /// is committed; this saves a script and five commands per call.
    fn untracked(&self, tool: &str, registry: &Registry) -> bool {
        !self.door.tracks_every_call()
            && registry.annotations(tool).is_some_and(|a| a.read_only && a.idempotent)
    }

    /// Runs a tool: waits for a run slot of the tool, renewing the lease while it waits and runs
    /// (for a call without a record, `recorded` false, only its entry's idle time), and reports
    /// its steps to the door. `None` when shutdown was forced first: the tool is cancelled and
    /// nothing is answered.
    #[allow(clippy::too_many_arguments)]
    async fn run_tool(
        &self,
        entry: &Entry,
        request: &D::Request,
        call: &CallKeys<'_>,
        ledger_id: &str,
        registry: &Registry,
        tool: &str,
        arguments: Value,
        owner: &str,
        recorded: bool,
        cancelled: &CancellationToken,
        slot: &mut Slot,
    ) -> Option<Result<Value, Failure>> {
        let services = &self.services;
        let mut context = self.door.context(request);
        context.cancel = services.shutdown.forced().child_token();
        let relay = progress::Relay::new(services.progress_per_second);
        if self.door.relays_progress() {
            context.progress = relay.handle();
        }
        let write_progress = |report: ProgressReport| async move {
            let Some(entry) = self.door.progress(request, &report) else { return };
            if let Err(err) = services.bus.publish(&entry.topic, &entry.id, &entry.payload).await {
                debug!(error = %err, entry_id = %entry.id, "cannot write a progress entry; dropped");
            }
        };
        let relay_stop = CancellationToken::new();
        let entry_ref =
            EntryRef { topic: &self.settings.topic, group: &self.settings.group, entry_id: &entry.entry_id };
        let renew = ledger::renew(
            &*services.bus,
            call,
            owner,
            &entry_ref,
            &self.settings.consumer,
            ledger_id,
            recorded,
        );
        let forced = services.shutdown.forced().clone();
        let deadline = self.door.deadline(entry, request);
        let started = Instant::now();
        let run = async {
            // Cancelled before it started (while its ledger step waited out a Redis outage): it
            // never starts.
            if cancelled.is_cancelled() {
                return Err(cancelled_failure(tool));
            }
            self.door.started(request, tool).await;
            // Arguments are checked before the call waits: a bad request never takes a queue slot.
            let arguments = registry.prepare(tool, arguments)?;
            let _running = self.wait_for_tool(tool, deadline, slot).await?;
            let _in_flight = services.telemetry.in_flight_guard();
            let left = deadline.map(|deadline| deadline.saturating_sub(now_since_epoch()));
            registry.run(tool, arguments, &context, left).await
        };
        // Polled in this order: a tool that answers at once (most read-only tools) ends the call
        // on the first poll, before the lease renewal sets up its timer or the shutdown watch
        // registers a waiter. A cancel drops the tool's future, which stops it (a command's
        // process group is killed, an MCP server gets `notifications/cancelled`), also while it
        // waits in the tool's queue.
        let call = async {
            let result = tokio::select! {
                biased;
                res = run => Some(res),
                () = renew => Some(Err(Failure::new(ErrorCode::Internal, "lease renewal stopped"))),
                () = cancelled.cancelled() => {
                    context.cancel.cancel();
                    Some(Err(cancelled_failure(tool)))
                }
                () = forced.cancelled() => {
                    context.cancel.cancel();
                    warn!(entry_id = %entry.entry_id, tool, "grace period over; call abandoned, left to a replica");
                    None
                }
            };
            relay_stop.cancel();
            result
        };
        // The relay stops with the call, finishing a write under way, so no progress entry is
        // written after the answer.
        let (result, ()) = tokio::join!(call, relay.run(&relay_stop, write_progress));
        let result = result?;
        self.door.finished(request, tool, &result, started.elapsed()).await;
        Some(result)
    }

    /// Takes a run slot of `tool`: at once, or after a wait in its queue during which the call
    /// gives back its global slot, so calls of other tools are not held up behind it.
    ///
    /// # Errors
    /// `overloaded` when the tool's queue is full, `expired` when `deadline` passes first.
    async fn wait_for_tool(
        &self,
        tool: &str,
        deadline: Option<Duration>,
        slot: &mut Slot,
    ) -> Result<Running, Failure> {
        let waiting = match self.services.limits.admit(tool) {
            Admit::Run(running) => return Ok(running),
            Admit::Full(full) => return Err(self.overloaded(tool, full)),
            Admit::Wait(waiting) => waiting,
        };
        slot.release();
        let Some(until) = deadline else { return Ok(waiting.ready().await) };
        let left = until.saturating_sub(now_since_epoch());
        tokio::time::timeout(left, waiting.ready()).await.map_err(|_elapsed| {
            Failure::new(
                ErrorCode::Expired,
                format!("the request's deadline passed while it waited for a free slot of '{tool}'"),
            )
        })
    }

    /// The `overloaded` answer for a tool whose queue is full, with a hint of when a retry may
    /// find room: the time the calls ahead take at the tool's recent mean duration.
    fn overloaded(&self, tool: &str, full: Full) -> Failure {
        let settings = full.settings;
        let mean = self.services.stats.mean(tool).unwrap_or(Duration::from_millis(100));
        let ahead = (settings.max_queue + settings.max_concurrent) as u32;
        let retry_after = (mean * ahead / settings.max_concurrent.max(1) as u32)
            .clamp(Duration::from_millis(100), Duration::from_secs(30));
        Failure {
            code: ErrorCode::Overloaded,
            message: format!(
                "'{tool}' is at its limit of {} running and {} waiting calls; retry later",
                settings.max_concurrent, settings.max_queue
            ),
            details: Some(json!({
                "retry_after_ms": retry_after.as_millis() as u64,
                "max_concurrent": settings.max_concurrent,
                "max_queue": settings.max_queue,
            })),
        }
    }

    /// An `expired` failure when the request's deadline has passed.
    fn expired(&self, entry: &Entry, request: &D::Request) -> Option<Failure> {
        let deadline = self.door.deadline(entry, request)?;
        (deadline <= now_since_epoch())
            .then(|| Failure::new(ErrorCode::Expired, "the request's deadline passed before it could run"))
    }

    /// An entry delivered too often: dead-letter it and answer `internal` when it can be.
    async fn poison(&self, entry: &Entry, request: &D::Request, call: &CallKeys<'_>) -> Outcome {
        let reason = format!(
            "delivered {} times without completing (limit {}); each holder stopped or failed before answering",
            entry.deliveries, self.settings.max_deliveries
        );
        let failure = Failure::new(
            ErrorCode::Internal,
            "the request failed repeatedly inside the tool host and was moved to the dead-letter stream",
        );
        let answer = self.door.answer(request, &Err(failure));
        let letter = self.door.letter(entry, request, &reason);
        self.dead_letter(entry, Some(call), letter, &reason, Some(&answer)).await
    }

    /// The answer's topic holds a key that is not a stream, so no answer can ever be published
    /// there: publish the door's fallback answer (not final) and dead-letter the request, rather
    /// than let the entry loop through redeliveries.
    async fn wrong_type(
        &self,
        entry: &Entry,
        request: &D::Request,
        call: &CallKeys<'_>,
        answer: &Answer,
    ) -> Outcome {
        error!(entry_id = %entry.entry_id, topic = %answer.topic, "answer topic holds a key that is not a stream; dead-lettering");
        let reason =
            format!("the answer's topic '{}' holds a key that is not a stream", self.bare(&answer.topic));
        let fallback = self.door.fallback(request, &reason);
        let letter = self.door.letter(entry, request, &reason);
        self.dead_letter(entry, Some(call), letter, &reason, fallback.as_ref()).await
    }

    /// A full key without the configured prefix, for sentences callers read.
    fn bare<'a>(&self, key: &'a str) -> &'a str {
        key.strip_prefix(self.services.keys.prefix()).unwrap_or(key)
    }

    /// Dead-letters an entry, acking it, with an answer (not final) when one is given.
    async fn dead_letter(
        &self,
        entry: &Entry,
        call: Option<&CallKeys<'_>>,
        letter: Letter,
        reason: &str,
        answer: Option<&Answer>,
    ) -> Outcome {
        warn!(entry_id = %entry.entry_id, reason, "dead-lettering entry");
        self.services.telemetry.dead_lettered();
        let call = call.copied();
        let committed = match self.commit(entry, call, answer, Some(&letter), false, true).await {
            // Even the fallback topic cannot take an answer: write the dead letter alone.
            Some(Committed::WrongType) => self.commit(entry, call, None, Some(&letter), false, true).await,
            committed => committed,
        };
        committed.map_or(Outcome::LeftPending, |_| Outcome::DeadLetter)
    }

    /// Moves an entry to `consumer`, a replica of this toolbox that hosts its tool; it stays
    /// pending here when Redis refuses, and is reclaimed as usual.
    async fn hand_over(&self, entry: &Entry, consumer: &str) -> Outcome {
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

    /// Acks an entry without answering it.
    async fn ack(&self, entry: &Entry, call: Option<CallKeys<'_>>) -> Option<Committed> {
        self.commit(entry, call, None, None, false, true).await
    }

    /// Commits the end of an entry through [`ledger::finish`]: the answer, the dead letter, the
    /// answered mark (when final) and the ack, atomically.
    async fn commit(
        &self,
        entry: &Entry,
        call: Option<CallKeys<'_>>,
        answer: Option<&Answer>,
        letter: Option<&Letter>,
        final_answer: bool,
        tracked: bool,
    ) -> Option<Committed> {
        self.commit_as(entry, call, answer, letter, final_answer, tracked, false).await
    }

    /// [`Lifecycle::commit`], for an answer that replays a kept one when `replay`. A final answer
    /// of a door that keeps answers is kept with its mark (its `data`) when that fits
    /// `[dispatch] kept_answer_max_bytes`.
    #[allow(clippy::too_many_arguments)]
    async fn commit_as(
        &self,
        entry: &Entry,
        call: Option<CallKeys<'_>>,
        answer: Option<&Answer>,
        letter: Option<&Letter>,
        final_answer: bool,
        tracked: bool,
        replay: bool,
    ) -> Option<Committed> {
        let kept = answer.and_then(|answer| answer.kept.as_deref()).filter(|kept| {
            final_answer && self.door.keeps_answers() && kept.len() <= self.settings.kept_answer_max_bytes
        });
        let finish = Finish {
            entry: EntryRef {
                topic: &self.settings.topic,
                group: &self.settings.group,
                entry_id: &entry.entry_id,
            },
            call,
            answer: answer.map(|answer| Published {
                topic: &answer.topic,
                id: &answer.id,
                payload: &answer.payload,
            }),
            answer_copy: answer.and_then(|answer| answer.copy.as_deref()),
            dead_letter: letter.map(|letter| Published {
                topic: &letter.topic,
                id: &letter.id,
                payload: &letter.payload,
            }),
            final_answer,
            tracked,
            kept,
            replay,
        };
        let services = &self.services;
        ledger::finish(&*services.bus, &finish, services.shutdown.forced(), &services.telemetry).await
    }
}

impl<D: Door> EntryHandler for Lifecycle<D> {
    async fn handle(&self, entry: Entry, mut slot: Slot) {
        self.handle_entry(&entry, &mut slot).await;
    }
}

/// What the ledger decided before a tool call.
enum Begin {
    /// Run the tool; `tracked` when a call record was written for it.
    Run { tracked: bool },
    /// A holder started it and died, and the tool is not idempotent: answer `interrupted`.
    Interrupted,
    /// Nothing to answer; the entry ended this way.
    End(Outcome),
    /// Answered already, with this answer kept: answer this retry with it.
    Replay(KeptAnswer),
    /// Run nothing and answer this refusal (not final: a retry with the same request id runs);
    /// its commit deletes the call record the ledger step wrote.
    Refuse(Failure),
}

/// The result a kept answer's `data` holds; `None` when it is not a result's `data`.
fn kept_result(data: &str) -> Option<Result<Value, Failure>> {
    let data = serde_json::from_str::<ResultData>(data).ok()?;
    Some(if data.success {
        Ok(data.result.unwrap_or(Value::Null))
    } else {
        Err(Failure {
            code: data.error_code.unwrap_or(ErrorCode::Internal),
            message: data.error.unwrap_or_default(),
            details: data.details,
        })
    })
}

/// The answer of a call stopped by a `tool.cancel`.
fn cancelled_failure(tool: &str) -> Failure {
    Failure::new(ErrorCode::Cancelled, format!("the call of '{tool}' was cancelled by a tool.cancel request"))
}

/// Now, as time since the UNIX epoch.
pub(crate) fn now_since_epoch() -> Duration {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
}
