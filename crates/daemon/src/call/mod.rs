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
//! A [`Door`] says how its entries are read (admission: the door's request, plus the ids,
//! claim, deadline and tool label every request has, in [`Admitted`]), what running one means
//! (a tool with arguments, or an answer made without a tool), what the answer looks like and
//! where it goes, and how its refusals and dead letters look; its fixed options are one
//! [`DoorTraits`]. [`Lifecycle`] does the rest, the same for every door: the ledger (begin,
//! lease renewal, commit), the per-tool limits and the global slot, deadlines, poison, forced
//! shutdown, a response topic of the wrong type, and the outcome's metrics. The tool path is in
//! `tool.rs`, the ends of an entry (answers, replays, refusals, dead letters, acks, each one
//! commit) in `commit.rs`.

pub(crate) mod cancel;
pub(crate) mod catalog;
mod commit;
pub(crate) mod input;
pub(crate) mod ledger;
pub(crate) mod progress;
mod tool;

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolhost_bus::CallKeys;
use toolhost_envelope::{CallTrace, Entry, ErrorCode};
use toolhost_tools::{Context, Failure, LogReport, Output, ProgressReport, Registry};

use self::commit::{Answering, Finality, Record};
use crate::auth::policy::InFlight;
use crate::auth::{AuditEntry, Caller, Claim, Refusal};
use crate::group::{EntryHandler, Slot, StreamSettings};
use crate::services::Services;
use crate::telemetry::{CallNames, CallSpan, Delivery, call_names};

/// The tool label of calls naming a tool that does not exist, in `tools.stats` and metrics.
pub(crate) const UNKNOWN_TOOL_LABEL: &str = "_unknown";

/// What admission made of an entry.
pub(crate) enum Admission<R> {
    /// Nothing tells where to answer: publish this dead letter; the reason is for the log.
    DeadLetter(Letter, String),
    /// Ack it without answering; the reason is for the log.
    Ignore(Admitted<R>, &'static str),
    /// Answer it.
    Request(Admitted<R>),
}

/// An admitted entry: the door's own reading of it, and what the lifecycle needs of every
/// request, read once at admission.
pub(crate) struct Admitted<R> {
    /// The door's reading of the entry, handed back to the door's methods.
    pub request: R,
    /// The id the ledger remembers the request by.
    pub ledger_id: String,
    /// The tenant the request claims, for the signature check, the tenant's policy and logs.
    pub tenant: Option<String>,
    /// When the request says it was made (RFC 3339), for the signature check.
    pub time: Option<String>,
    /// Where the request says it comes from (the envelope's `source`), for audit entries.
    pub source: Option<String>,
    /// When the request stops being worth running, as time since the UNIX epoch.
    pub deadline: Option<Duration>,
    /// What the tool is told about the call.
    pub ids: CallIds,
    /// The tool label of the request for stats, metrics and logs; `None` when it names no tool.
    pub tool_label: Option<String>,
    /// While the requests stream's shard count changes: the ledger (bare name) the request id
    /// had under the previous count, when it was another. An answer kept there answers the
    /// request, which then does not run again.
    pub former_ledger: Option<String>,
}

impl<R> Admitted<R> {
    /// What the request says about its caller, for the signature check and the tenant's policy.
    pub(crate) fn claim(&self) -> Claim<'_> {
        Claim { tenant: self.tenant.as_deref(), time: self.time.as_deref() }
    }
}

/// The ids a tool is told about its call (its [`Context`], less what the lifecycle adds).
pub(crate) struct CallIds {
    /// The request's id.
    pub request_id: String,
    /// The caller's correlation id.
    pub correlation_id: Option<String>,
    /// The conversation the call runs in, when it has one.
    pub conversation_id: Option<String>,
    /// The trace the call runs under (docs/CONTRACTS.md "Trace context"), passed out by the
    /// tool's source.
    pub trace: CallTrace,
}

impl CallIds {
    /// A tool's context with these ids, its cancellation token and progress handle unset.
    fn context(&self) -> Context {
        Context {
            request_id: self.request_id.clone(),
            correlation_id: self.correlation_id.clone(),
            conversation_id: self.conversation_id.clone(),
            cancel: CancellationToken::default(),
            progress: Default::default(),
            log: Default::default(),
            input: Default::default(),
            trace: Some(self.trace.clone()),
        }
    }
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
    Answer(Result<Output, Failure>, Reply),
    /// Ack without answering: another toolbox answers it.
    AckOnly,
    /// Hand the entry to this consumer of the same group, which hosts its tool.
    HandOver(String),
    /// Move the entry to this shard (bare name) of the requests stream, its home by the shard
    /// rule, and ack it here.
    Move(String),
    /// Cancel the call with this request id, wherever it runs, and answer (not final) with
    /// what was found.
    Cancel(String),
    /// Answer a question of a running call (`tool.input`), wherever it waits, and answer (not
    /// final) with what was found.
    Input {
        /// The call's request id.
        call_id: String,
        /// The question's id.
        input_id: String,
        /// The caller's response.
        response: Value,
    },
    /// Answer a catalog request (resources, prompts, completion) with these params; see
    /// `catalog.rs`.
    Catalog {
        /// What it asks for.
        ask: catalog::CatalogAsk,
        /// MCP's params: the request's `data` without the reserved keys.
        params: Value,
    },
}

/// What a door decided about a request: the work, and whether the decision rests on no live
/// replica hosting the request's tool.
pub(crate) enum Decision {
    /// Do this.
    Work(Work),
    /// Do this because the fleet view names no live host of the tool (an `unknown_tool` answer,
    /// a disabled tool's refusal). The view may predate the entry, so the lifecycle first makes
    /// sure it was read after the entry's delivery ([`crate::fleet::Fleet::read_after`]), then
    /// asks the door again: a toolbox that had started before the request was added is then in
    /// it.
    Unhosted(Work),
}

impl From<Work> for Decision {
    fn from(work: Work) -> Decision {
        Decision::Work(work)
    }
}

/// How a door answers a request refused by authentication: never on a topic the (unverified)
/// payload chose.
pub(crate) enum Refused {
    /// Publish this answer (on the door's default topic).
    Answer(Answer),
    /// Dead-letter the entry with this letter.
    DeadLetter(Letter),
}

/// A door's fixed policy: its name, and which of the lifecycle's options its calls take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DoorTraits {
    /// The door's name in audit entries and the call log.
    pub name: &'static str,
    /// Whether the door relays the progress of its calls (see [`Door::progress`]).
    pub relays_progress: bool,
    /// Whether the door keeps final answers with the answered mark and answers a retry of an
    /// answered request (another entry with the same request id) with the original answer.
    pub keeps_answers: bool,
    /// Whether every tool call takes a call record, even of read-only, idempotent tools: a door
    /// whose calls have effects of their own (progress events) must not run a duplicate.
    pub tracks_every_call: bool,
}

/// What the lifecycle tells a door about a request's handling, for the door's own progress
/// events and its log line.
pub(crate) enum Event<'a, R> {
    /// A tool is about to run.
    Started {
        /// The door's request.
        request: &'a R,
    },
    /// A tool ran, or was answered `interrupted` without running.
    Finished {
        /// The door's request.
        request: &'a R,
        /// What it returned.
        result: &'a Result<Output, Failure>,
        /// How long it ran.
        duration: Duration,
    },
    /// The entry's handling ended.
    Ended {
        /// The entry.
        entry: &'a Entry,
        /// The door's request; `None` when the entry was not admitted.
        request: Option<&'a R>,
        /// The request's tool label, `-` when it names no tool.
        tool: &'a str,
        /// How it ended.
        outcome: Outcome,
        /// How long its handling took.
        duration: Duration,
    },
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
    /// Moved, unanswered, to its home shard of the requests stream, where it is answered.
    Moved,
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
            Outcome::Moved => "moved",
        }
    }
}

/// One way calls come in: what varies by door. Admission reads an entry; the rest shapes the
/// door's answers, progress entries, refusals and dead letters. Everything between (the
/// ledger, limits, deadlines, poison, commits, counting) is the [`Lifecycle`]'s, the same for
/// every door.
pub(crate) trait Door: Send + Sync + 'static {
    /// The door's reading of an admitted entry.
    type Request: Send + Sync;

    /// The door's name and options.
    const TRAITS: DoorTraits;

    /// Reads an entry.
    fn admit(&self, entry: &Entry, registry: &Registry) -> Admission<Self::Request>;

    /// What answering the request takes; `permits` says which tools the caller may call, for
    /// listings.
    fn work(&self, request: &Self::Request, registry: &Registry, permits: Permits<'_>) -> Decision;

    /// The answer to publish for `result`.
    fn answer(&self, request: &Self::Request, result: &Result<Output, Failure>) -> Answer;

    /// A progress entry of the request's running call, to publish on the answer's topic (only
    /// asked of a door that [relays progress](DoorTraits::relays_progress)).
    fn progress(&self, _request: &Self::Request, _report: &ProgressReport) -> Option<Answer> {
        None
    }

    /// A log entry of the request's running call, to publish on the answer's topic (only asked
    /// of a door that [relays progress](DoorTraits::relays_progress)).
    fn log(&self, _request: &Self::Request, _report: &LogReport) -> Option<Answer> {
        None
    }

    /// An input-required entry of the request's running call (`data` as docs/CONTRACTS.md
    /// "Input from the caller" gives it), to publish on the answer's topic (only asked of a door
    /// that [relays progress](DoorTraits::relays_progress)); `None` declines every question.
    fn input_required(&self, _request: &Self::Request, _data: &Value) -> Option<Answer> {
        None
    }

    /// How to answer a request refused by authentication (`failure` is `forbidden`).
    fn refusal(&self, entry: &Entry, request: &Self::Request, failure: Failure) -> Refused;

    /// The dead letter of an admitted request's entry.
    fn letter(&self, entry: &Entry, request: &Self::Request, reason: &str) -> Letter;

    /// An answer to publish instead when the answer's topic cannot take it (it holds another
    /// type of key), on a topic that can; `None` when there is no such topic.
    fn fallback(&self, request: &Self::Request, reason: &str) -> Option<Answer>;

    /// Told of a request's steps: a tool's start and end (progress events), and the end of the
    /// entry's handling (the door's log line).
    fn observe(&self, event: Event<'_, Self::Request>) -> impl Future<Output = ()> + Send;
}

/// Drives the entries of one door through the call lifecycle.
pub(crate) struct Lifecycle<D> {
    door: D,
    services: Services,
    settings: StreamSettings,
    /// The names and attributes of the spans of its calls.
    span_names: &'static CallNames,
}

/// One admitted entry on its way through the lifecycle: what each step needs of it.
struct Call<'a, R> {
    /// The delivered entry.
    entry: &'a Entry,
    /// What the door admitted it as.
    admitted: &'a Admitted<R>,
    /// The request's keys in the ledger.
    keys: CallKeys<'a>,
    /// The call's `process` span, when it is sampled and spans are exported.
    span: Option<&'a CallSpan<'a>>,
}

impl<R> Call<'_, R> {
    /// The door's request.
    fn request(&self) -> &R {
        &self.admitted.request
    }
}

/// When an entry reached this replica: `delivered` orders it against the fleet's heartbeats,
/// `admitted_at` starts its span.
#[derive(Clone, Copy)]
struct Times {
    delivered: Instant,
    admitted_at: std::time::SystemTime,
}

impl<D: Door> Lifecycle<D> {
    /// The lifecycle of `door`'s entries.
    pub(crate) fn new(door: D, services: Services, settings: StreamSettings) -> Lifecycle<D> {
        let span_names = call_names(D::TRAITS.name, &settings.ledger, &settings.group, &settings.consumer);
        Lifecycle { door, services, settings, span_names }
    }

    /// Handles one entry to its end, then counts and logs how it ended.
    async fn handle_entry(&self, entry: &Entry, slot: &Slot) {
        // After the entry's delivery: what the fleet view must be newer than (see `decide`).
        let started = Instant::now();
        let services = &self.services;
        if entry.deliveries > 1 {
            services.telemetry.redelivered();
        }
        // One snapshot for the whole call: a reload meanwhile does not change its tools.
        let registry = services.registry.snapshot();
        let (outcome, admitted) = match self.door.admit(entry, &registry) {
            Admission::DeadLetter(letter, reason) => {
                (self.dead_letter(entry, None, letter, &reason, None).await, None)
            }
            Admission::Ignore(admitted, reason) => {
                tracing::debug!(entry_id = %entry.entry_id, reason, "entry ignored");
                let outcome = self.ack(entry, None).await.map_or(Outcome::LeftPending, |_| Outcome::Ignored);
                (outcome, Some(admitted))
            }
            Admission::Request(admitted) => {
                let admitted_at = std::time::SystemTime::now();
                let claim = admitted.claim();
                let key_id = services.gate.authenticate(&entry.sig, entry.payload.as_deref(), claim);
                let caller = match &key_id {
                    Ok(key_id) => {
                        Ok(Caller { tenant: claim.tenant.unwrap_or_default(), key_id: key_id.as_deref() })
                    }
                    Err(refusal) => Err(refusal.clone()),
                };
                let times = Times { delivered: started, admitted_at };
                (self.answer(entry, &admitted, &registry, slot, caller, times).await, Some(admitted))
            }
        };
        self.count(entry, admitted.as_ref(), outcome, started.elapsed()).await;
    }

    /// The `process` span of an admitted request (begun at `started`), when it is sampled and
    /// spans are exported.
    fn call_span<'s>(
        &'s self,
        entry: &'s Entry,
        admitted: &'s Admitted<D::Request>,
        started: std::time::SystemTime,
    ) -> Option<CallSpan<'s>> {
        let delivery = Delivery {
            names: self.span_names,
            entry_id: &entry.entry_id,
            deliveries: entry.deliveries,
            request_id: &admitted.ids.request_id,
            tool: admitted.tool_label.as_deref(),
        };
        self.services.telemetry.call_span(&admitted.ids.trace, delivery, started)
    }

    /// Counts how an entry's handling ended (statistics, metrics, the call log) and has the door
    /// log it.
    async fn count(
        &self,
        entry: &Entry,
        admitted: Option<&Admitted<D::Request>>,
        outcome: Outcome,
        duration: Duration,
    ) {
        let services = &self.services;
        let tool = admitted.and_then(|admitted| admitted.tool_label.as_deref()).unwrap_or("-");
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
                request_id: admitted.map_or_else(|| entry.id.clone(), |a| a.ledger_id.clone()),
                tool: tool.to_owned(),
                tenant: admitted.and_then(|a| a.tenant.clone()).unwrap_or_default(),
                door: D::TRAITS.name,
                source: admitted.and_then(|a| a.source.clone()).unwrap_or_default(),
                outcome: outcome.label(),
                duration_us: duration.as_micros() as u64,
                entry_id: entry.entry_id.clone(),
                deliveries: entry.deliveries,
                trace_id: admitted.map(|a| a.ids.trace.trace_id_hex()).unwrap_or_default(),
            });
        }
        let request = admitted.map(|admitted| &admitted.request);
        self.door.observe(Event::Ended { entry, request, tool, outcome, duration }).await;
    }

    /// Takes an admitted request to its end.
    ///
    /// For tool calls the ledger is consulted first, so a copy of a request that is answered or
    /// running elsewhere is neither dead-lettered as poison nor answered `expired` over the live
    /// call's answer.
    async fn answer(
        &self,
        entry: &Entry,
        admitted: &Admitted<D::Request>,
        registry: &Registry,
        slot: &Slot,
        caller: Result<Caller<'_>, Refusal>,
        times: Times,
    ) -> Outcome {
        let Times { delivered, admitted_at } = times;
        let (keys, settings) = (&self.services.keys, &self.settings);
        let answered = keys.answered(&settings.ledger, &admitted.ledger_id);
        let record = keys.call(&settings.ledger, &admitted.ledger_id);
        let refused = keys.answered_entry(&settings.ledger, &entry.entry_id);
        let keys = CallKeys {
            answered: &answered,
            call: &record,
            entry: &refused,
            lease: settings.claim_idle,
            retention: settings.answered_retention,
        };
        let caller = match caller {
            Ok(caller) => caller,
            Err(refusal) => {
                let span = self.call_span(entry, admitted, admitted_at);
                if let Some(span) = &span {
                    span.admit(admitted_at)
                        .fail(ErrorCode::Forbidden.as_str(), "the request's signature was refused");
                }
                let call = Call { entry, admitted, keys, span: span.as_ref() };
                let outcome = self.refuse(&call, refusal).await;
                if let Some(span) = span {
                    end_span(span, outcome);
                }
                return outcome;
            }
        };
        let Some(work) = self.decide(admitted, registry, caller.tenant, delivered).await else {
            return Outcome::LeftPending;
        };
        // An entry only acked here (another toolbox answers it) gets no span: the host's is the
        // call's.
        let span = match work {
            Work::AckOnly => None,
            _ => self.call_span(entry, admitted, admitted_at),
        };
        let admit = span.as_ref().map(|span| span.admit(admitted_at));
        let call = Call { entry, admitted, keys, span: span.as_ref() };
        let asked_tool = matches!(work, Work::Tool { .. });
        // Held while the call runs: the tenant's count of calls in flight.
        let (work, _in_flight) = self.apply_policy(&call, caller, work).await;
        match (admit, &work) {
            (Some(admit), Work::Answer(Err(failure), _)) if asked_tool => {
                admit.fail(failure.code.as_str(), &failure.message);
            }
            (admit, _) => drop(admit),
        }
        let outcome = self.run_work(&call, registry, caller, slot, work).await;
        if let Some(span) = span {
            end_span(span, outcome);
        }
        outcome
    }

    /// Does what answering an admitted request takes.
    async fn run_work(
        &self,
        call: &Call<'_, D::Request>,
        registry: &Registry,
        caller: Caller<'_>,
        slot: &Slot,
        work: Work,
    ) -> Outcome {
        let entry = call.entry;
        match work {
            Work::HandOver(consumer) => self.hand_over(entry, &consumer).await,
            Work::Move(home) => self.move_home(entry, &home).await,
            Work::AckOnly => self.ack(entry, None).await.map_or(Outcome::LeftPending, |_| Outcome::Duplicate),
            Work::Answer(..) | Work::Cancel(_) | Work::Input { .. } if self.poisoned(entry) => {
                self.poison(call).await
            }
            Work::Answer(result, reply) => {
                let (result, reply) = match self.expired(call) {
                    Some(failure) => (Err(failure), Reply::Result),
                    None => (result, reply),
                };
                let finality = Finality::of(&result);
                self.conclude(call, Answering { result, reply, finality, record: Record::Absent }, None).await
            }
            Work::Cancel(call_id) => self.cancel(call, &call_id).await,
            Work::Input { call_id, input_id, response } => {
                self.answer_input(call, &call_id, &input_id, response).await
            }
            Work::Catalog { ask, params } => self.catalog(call, caller, ask, params).await,
            Work::Tool { name, arguments } => {
                self.call_tool(call, registry, caller, slot, name, arguments).await
            }
        }
    }

    /// What answering the request takes, as its door decides it. A decision that rests on no
    /// live replica hosting the tool is taken again from a fleet view read after the entry was
    /// `delivered`, so a toolbox that beat before the request was added is never answered for
    /// with `unknown_tool`. `None` when the fleet cannot be read: the entry is left pending.
    async fn decide(
        &self,
        admitted: &Admitted<D::Request>,
        registry: &Registry,
        tenant: &str,
        delivered: Instant,
    ) -> Option<Work> {
        let ask = || {
            let auth = self.services.gate.auth();
            self.door.work(&admitted.request, registry, Permits { auth: &auth, tenant })
        };
        match ask() {
            Decision::Work(work) => return Some(work),
            Decision::Unhosted(_) => {}
        }
        if let Err(err) = self.services.fleet.read_after(delivered).await {
            crate::outage::redis_warn!(&err, error = %err, request_id = %admitted.ledger_id, "cannot read the fleet to route a request nobody seemed to host; left pending");
            return None;
        }
        match ask() {
            Decision::Work(work) | Decision::Unhosted(work) => Some(work),
        }
    }

    /// Applies the tenant's policy and limits to a tool call, before the ledger, so a refused
    /// call takes no record: the refusal is audited and becomes the answer. Returns what
    /// answering takes then, and the tenant's in-flight count of the call, to hold while it runs.
    async fn apply_policy(
        &self,
        call: &Call<'_, D::Request>,
        caller: Caller<'_>,
        work: Work,
    ) -> (Work, Option<InFlight>) {
        let Work::Tool { name, arguments } = &work else { return (work, None) };
        match self.police(call, caller, name, arguments).await {
            Ok(counted) => (work, counted),
            Err(failure) => (Work::Answer(Err(failure), Reply::Result), None),
        }
    }

    /// The tenant's policy and limits for a call of `name` (a tool, or a catalog request's
    /// type): the tenant's in-flight count of the call, to hold while it runs, or the refusal,
    /// audited.
    async fn police(
        &self,
        call: &Call<'_, D::Request>,
        caller: Caller<'_>,
        name: &str,
        arguments: &Value,
    ) -> Result<Option<InFlight>, Failure> {
        match self.services.gate.admit_call(caller, name).await {
            Ok(counted) => Ok(counted),
            Err(failure) => {
                self.audit(call, caller, name, "refused", &failure.message, Some(arguments)).await;
                Err(failure)
            }
        }
    }

    /// Cancels the call `call_id` names, wherever it runs, and answers with what was found; the
    /// answer is never final, since the id it names is the call's, not the cancel's own.
    async fn cancel(&self, call: &Call<'_, D::Request>, call_id: &str) -> Outcome {
        let result = match self.expired(call) {
            Some(failure) => Err(failure),
            None => {
                let forced = self.services.shutdown.forced();
                let Some(state) = self.services.calls.cancel(&self.settings.ledger, call_id, forced).await
                else {
                    return Outcome::LeftPending;
                };
                Ok(json!({"request_id": call_id, "state": state.as_str()}).into())
            }
        };
        let answering =
            Answering { result, reply: Reply::Result, finality: Finality::NotFinal, record: Record::Absent };
        self.conclude(call, answering, None).await
    }

    /// Appends to the audit stream.
    async fn audit(
        &self,
        call: &Call<'_, D::Request>,
        caller: Caller<'_>,
        tool: &str,
        decision: &'static str,
        reason: &str,
        arguments: Option<&Value>,
    ) {
        let entry = AuditEntry {
            request_id: &call.admitted.ledger_id,
            tenant: caller.tenant,
            principal: caller.key_id.map(|id| format!("key:{id}")),
            tool,
            decision,
            reason,
            door: D::TRAITS.name,
            source: call.admitted.source.as_deref(),
            arguments,
        };
        self.services.gate.audit(entry).await;
    }

    /// Whether the entry was delivered too often to be answered in the usual way.
    fn poisoned(&self, entry: &Entry) -> bool {
        entry.deliveries > self.settings.max_deliveries
    }

    /// An `expired` failure when the request's deadline has passed.
    fn expired(&self, call: &Call<'_, D::Request>) -> Option<Failure> {
        let deadline = call.admitted.deadline?;
        (deadline <= crate::clock::now_since_epoch())
            .then(|| Failure::new(ErrorCode::Expired, "the request's deadline passed before it could run"))
    }
}

/// Ends a call's `process` span with its outcome: an error answer (refusals, timeouts and
/// cancels included) and a dead letter set `error.type`; a retry answered from the ledger says
/// so.
fn end_span(mut span: CallSpan, outcome: Outcome) {
    let error = match outcome {
        Outcome::Error(code) => Some(code.as_str()),
        Outcome::DeadLetter => Some("dead_letter"),
        _ => None,
    };
    if outcome == Outcome::Replayed {
        span.set(opentelemetry::KeyValue::new("toolhost.replayed", true));
        span.event("answered from the ledger", Vec::new());
    }
    span.end(outcome.label(), error);
}

impl<D: Door> EntryHandler for Lifecycle<D> {
    async fn handle(&self, entry: Entry, slot: Slot) {
        self.handle_entry(&entry, &slot).await;
    }
}
