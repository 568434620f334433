//! The request loop: read `action-requests` through the toolbox's consumer group, answer each
//! request exactly once on its response topic, ack only after the answer is committed.
//!
//! One [`Dispatcher`] per daemon handles the entries a `group::GroupReader` reads and reclaims
//! for it (the reader's loops are shared with the chat inbox). Every entry is handled in its own
//! task: admission, the ledger (`begin_call`), the tool run under a renewed lease, and its end
//! (dead letter, answer, answered mark, ack) committed by one atomic [`Bus::finish`].

mod request;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost_bus::{Bus, CallKeys, CallStart, Committed, EntryRef, Finish, Keys, Published, ResponseTopics};
use toolhost_envelope::{DiscoveryFormat, Entry, ErrorCode, EventEnvelope, ResultData, new_message_id};
use toolhost_tools::{Admit, Context, Failure, Full, Registry, Running, ToolLimits};
use tracing::{error, info, warn};

pub(crate) use request::{Admission, Request, Target, admit, entry_millis, now_since_epoch};

use crate::group::{EntryHandler, GroupSettings, Slot};
use crate::ledger;
use crate::services::Services;
use crate::shutdown::Shutdown;
use crate::stats::Stats;
use crate::telemetry::Telemetry;

/// What the dispatcher needs to know, resolved from configuration.
#[derive(Debug, Clone)]
pub struct DispatchSettings {
    /// The toolbox id: consumer group, ledger namespace and `source` of results.
    pub toolbox_id: String,
    /// This replica's consumer name, unique per process.
    pub consumer: String,
    /// Bare name of the requests topic.
    pub requests_topic: String,
    /// Bare name of the default results topic.
    pub results_topic: String,
    /// Larger payloads are dead-lettered.
    pub max_payload_bytes: usize,
    /// Most entries per read.
    pub read_batch: usize,
    /// How long a read blocks.
    pub block: Duration,
    /// Lease of a call; idle time after which pending entries are reclaimed.
    pub claim_idle: Duration,
    /// Deliveries after which an entry is dead-lettered.
    pub max_deliveries: u64,
    /// How long request ids are remembered as answered.
    pub answered_retention: Duration,
    /// Requests older than this answer `expired`.
    pub max_request_age: Option<Duration>,
    /// Whether events no tool consumes get an `unknown_tool` answer.
    pub answer_unknown_tools: bool,
    /// The response topics callers may name.
    pub response_topics: ResponseTopics,
}

/// Reads requests and answers them.
pub struct Dispatcher {
    bus: Arc<dyn Bus>,
    registry: Arc<Registry>,
    /// Per-tool concurrency limits and wait queues.
    limits: Arc<ToolLimits>,
    keys: Keys,
    settings: DispatchSettings,
    /// Full key of the requests stream.
    requests: String,
    /// Full key of the dead-letter stream.
    dead_letters: String,
    /// `toolhost:<toolbox_id>`.
    source: String,
    stats: Arc<Stats>,
    telemetry: Telemetry,
    shutdown: Shutdown,
}

/// The tool label of calls naming a tool that does not exist, in `tools.stats` and metrics.
const UNKNOWN_TOOL_LABEL: &str = "_unknown";

/// How a handled entry ended, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Success,
    Error(ErrorCode),
    DeadLetter,
    Duplicate,
    LeftPending,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Error(code) => code.as_str(),
            Outcome::DeadLetter => "dead_letter",
            Outcome::Duplicate => "duplicate",
            Outcome::LeftPending => "left_pending",
        }
    }
}

impl Dispatcher {
    /// A dispatcher over `bus` for the tools of `registry`.
    pub fn new(services: Services, settings: DispatchSettings) -> Dispatcher {
        let Services { bus, registry, limits, keys, stats, telemetry, shutdown } = services;
        Dispatcher {
            requests: keys.topic(&settings.requests_topic),
            dead_letters: keys.dead_letters(&settings.toolbox_id),
            source: format!("toolhost:{}", settings.toolbox_id),
            bus,
            registry,
            limits,
            keys,
            settings,
            stats,
            telemetry,
            shutdown,
        }
    }

    /// The full key of the requests stream.
    pub fn requests_key(&self) -> &str {
        &self.requests
    }

    /// How the requests stream is read: through the toolbox's group, as this replica.
    pub(crate) fn group_settings(&self) -> GroupSettings {
        GroupSettings {
            topic: self.requests.clone(),
            group: self.settings.toolbox_id.clone(),
            consumer: self.settings.consumer.clone(),
            read_batch: self.settings.read_batch,
            block: self.settings.block,
            claim_idle: self.settings.claim_idle,
            heartbeat_prefix: self.keys.heartbeat_prefix(&self.settings.toolbox_id),
        }
    }

    /// Handles one entry to its end and logs the outcome.
    async fn handle_entry(&self, entry: &Entry, slot: &mut Slot) {
        let started = Instant::now();
        if entry.deliveries > 1 {
            self.telemetry.redelivered();
        }
        let admission =
            admit(entry, self.settings.max_payload_bytes, &self.settings.response_topics, |event| {
                self.registry.by_event(event).map(str::to_owned)
            });
        let (outcome, tool, request) = match admission {
            Admission::DeadLetter(reason) => (self.dead_letter(entry, &reason, None).await, None, None),
            Admission::Request(request) => {
                // Caller-chosen names that no tool has share one label, on every path, so they
                // cannot grow `tools.stats` or the metric series without bound.
                let tool = match &request.target {
                    Target::Tool { name, .. } if self.registry.contains(name) => Some(name.as_str()),
                    Target::Tool { .. } | Target::Unknown(_) => Some(UNKNOWN_TOOL_LABEL),
                    Target::Discover => Some("tools.discover"),
                    Target::Stats => Some("tools.stats"),
                    Target::Invalid(_) | Target::Forbidden(_) => None,
                }
                .map(str::to_owned);
                let outcome = self.answer(entry, &request, slot).await;
                (outcome, tool, Some(request))
            }
        };
        let duration = started.elapsed();
        let tool_label = tool.as_deref().unwrap_or("-");
        if matches!(outcome, Outcome::Success | Outcome::Error(_)) {
            let code = match outcome {
                Outcome::Error(code) => Some(code.as_str()),
                _ => None,
            };
            self.stats.record(tool_label, code, duration);
        }
        self.telemetry.invocation(tool_label, outcome.label(), duration);
        let envelope = request.as_ref().map(|request| &request.envelope);
        info!(
            request_id = request.as_ref().map_or("-", |request| request.request_id.as_str()),
            correlation_id = envelope.and_then(EventEnvelope::effective_correlation_id).unwrap_or("-"),
            tenant_id = envelope.and_then(|e| e.tenant_id.as_deref()).unwrap_or("-"),
            tool = tool_label,
            outcome = outcome.label(),
            duration_ms = duration.as_secs_f64() * 1000.0,
            entry_id = %entry.entry_id,
            deliveries = entry.deliveries,
            "invocation"
        );
    }

    /// Runs a request (unless the ledger says otherwise) and commits its answer.
    ///
    /// For tool calls the ledger is consulted first, so a copy of a request that is answered or
    /// running elsewhere is neither dead-lettered as poison nor answered `expired` over the live
    /// call's answer.
    async fn answer(&self, entry: &Entry, request: &Request, slot: &mut Slot) -> Outcome {
        let answered_key = self.keys.answered(&self.settings.toolbox_id, &request.request_id);
        let call_key = self.keys.call(&self.settings.toolbox_id, &request.request_id);
        let call = CallKeys {
            answered: &answered_key,
            call: &call_key,
            lease: self.settings.claim_idle,
            retention: self.settings.answered_retention,
        };
        let poisoned = entry.deliveries > self.settings.max_deliveries;
        let owner = ledger::owner(&self.settings.consumer, &entry.entry_id);
        let result = match &request.target {
            Target::Tool { name, arguments } => match self.begin(entry, request, &call, name, &owner).await {
                Begin::End(outcome) => return outcome,
                _ if poisoned => return self.poison(entry, request).await,
                Begin::Answer(result) => result,
                Begin::Run => match self.expired(entry, request) {
                    Some(failure) => Err(failure),
                    None => match self
                        .run_tool(entry, request, &call, name, arguments.clone(), &owner, slot)
                        .await
                    {
                        Some(result) => result,
                        // Shutdown was forced: the entry stays pending with a lapsing lease, and
                        // a replica takes it over.
                        None => return Outcome::LeftPending,
                    },
                },
            },
            Target::Unknown(_) if !self.settings.answer_unknown_tools => {
                // Another toolbox sharing the stream answers it; only ack here.
                return self.ack_unanswered(entry).await;
            }
            _ if poisoned => return self.poison(entry, request).await,
            target => match self.expired(entry, request) {
                Some(failure) => Err(failure),
                None => self.answer_without_tool(target, &request.envelope),
            },
        };
        self.commit_result(entry, request, &call, result).await
    }

    /// The answer to a request that runs no tool.
    fn answer_without_tool(&self, target: &Target, envelope: &EventEnvelope) -> Result<Value, Failure> {
        match target {
            Target::Discover => Ok(self.discover(envelope)),
            Target::Stats => {
                Ok(json!({"toolbox_id": self.settings.toolbox_id, "tools": self.stats.snapshot()["tools"]}))
            }
            Target::Unknown(event) => Err(Failure::new(
                ErrorCode::UnknownTool,
                format!("no tool consumes the event '{event}'; send tools.discover to list the tools"),
            )),
            Target::Invalid(reason) => Err(Failure::new(ErrorCode::InvalidRequest, reason.clone())),
            Target::Forbidden(reason) => Err(Failure::new(ErrorCode::Forbidden, reason.clone())),
            // `answer` runs tools itself; this arm only keeps the match total.
            Target::Tool { name, .. } => {
                Err(Failure::new(ErrorCode::Internal, format!("tool '{name}' was not run")))
            }
        }
    }

    /// Commits the answer made of `result` and tells how the entry ended.
    async fn commit_result(
        &self,
        entry: &Entry,
        request: &Request,
        call: &CallKeys<'_>,
        result: Result<Value, Failure>,
    ) -> Outcome {
        let outcome = match &result {
            Ok(_) => Outcome::Success,
            Err(failure) => Outcome::Error(failure.code),
        };
        if let Err(failure) = &result
            && failure.code == ErrorCode::InvalidOutput
        {
            error!(request_id = %request.request_id, details = ?failure.details, "tool bug: output breaks the tool's output schema");
        }
        let final_answer = result.as_ref().err().is_none_or(|failure| failure.code.is_final());
        let data = match result {
            Ok(value) => ResultData::ok(&request.request_id, value),
            Err(failure) => failure_data(&request.request_id, failure),
        };
        self.commit_answer(entry, request, call, &data, None, final_answer).await.unwrap_or(outcome)
    }

    /// An `expired` failure when the request's deadline or the maximum age has passed.
    fn expired(&self, entry: &Entry, request: &Request) -> Option<Failure> {
        let now = now_since_epoch();
        if let Some(deadline) = request.deadline
            && deadline <= now
        {
            return Some(Failure::new(
                ErrorCode::Expired,
                "the request's deadline passed before it could run",
            ));
        }
        let max_age = self.settings.max_request_age?;
        let sent = Duration::from_millis(entry_millis(&entry.entry_id)?);
        (now.saturating_sub(sent) > max_age).then(|| {
            Failure::new(
                ErrorCode::Expired,
                format!("the request is older than the maximum age of {} ms", max_age.as_millis()),
            )
        })
    }

    /// Whether calls of `tool` run without a call record: read-only, idempotent tools.
    ///
    /// The record exists to keep two replicas from running one request at once and to refuse
    /// blindly re-running a call a crashed holder had started. A tool that changes nothing and can
    /// be repeated needs neither: running it twice has no effect a caller can see, and its answer
    /// is still published once, because the answered mark is checked when the answer is committed.
    /// Skipping the record saves a script and five commands in Redis per call.
    fn untracked(&self, tool: &str) -> bool {
        self.registry.annotations(tool).is_some_and(|a| a.read_only && a.idempotent)
    }

    /// Consults the ledger before running a tool.
    async fn begin(
        &self,
        entry: &Entry,
        request: &Request,
        call: &CallKeys<'_>,
        tool: &str,
        owner: &str,
    ) -> Begin {
        if self.untracked(tool) {
            return Begin::Run;
        }
        let forced = self.shutdown.forced();
        let begun = ledger::begin(&*self.bus, call, owner, &entry.entry_id, &request.request_id, forced);
        let Some(start) = begun.await else { return Begin::End(Outcome::LeftPending) };
        match start {
            CallStart::Fresh => Begin::Run,
            CallStart::Answered => Begin::End(self.ack_unanswered(entry).await),
            CallStart::Busy { entry_id } if entry_id == entry.entry_id => {
                // The owner is alive and will ack this very entry.
                Begin::End(Outcome::LeftPending)
            }
            CallStart::Busy { .. } => {
                // A re-sent copy while the original runs: the original's answer is the one.
                Begin::End(self.ack_unanswered(entry).await)
            }
            CallStart::StartedBefore => {
                let idempotent = self.registry.annotations(tool).is_some_and(|a| a.idempotent);
                if idempotent { Begin::Run } else { Begin::Answer(Err(ledger::interrupted(tool))) }
            }
            _ => Begin::End(Outcome::LeftPending),
        }
    }

    /// Runs a tool, renewing the lease while it waits for a run slot and runs. `None` when
    /// shutdown was forced first: the tool is cancelled and nothing is answered.
    #[allow(clippy::too_many_arguments)]
    async fn run_tool(
        &self,
        entry: &Entry,
        request: &Request,
        call: &CallKeys<'_>,
        tool: &str,
        arguments: Value,
        owner: &str,
        slot: &mut Slot,
    ) -> Option<Result<Value, Failure>> {
        let context = Context {
            request_id: request.request_id.clone(),
            correlation_id: request.envelope.effective_correlation_id().map(str::to_owned),
            conversation_id: request
                .envelope
                .data_str("conversation_id")
                .or(request.envelope.session_id.as_deref())
                .map(str::to_owned),
            cancel: self.shutdown.forced().child_token(),
        };
        let entry_ref =
            EntryRef { topic: &self.requests, group: &self.settings.toolbox_id, entry_id: &entry.entry_id };
        let period = self.settings.claim_idle / 3;
        let renew = ledger::renew(
            &*self.bus,
            call,
            owner,
            &entry_ref,
            &self.settings.consumer,
            &request.request_id,
            period,
        );
        let forced = self.shutdown.forced().clone();
        let wait_until = self.wait_deadline(entry, request);
        let call = async {
            // Arguments are checked before the call waits: a bad request never takes a queue slot.
            let arguments = self.registry.prepare(tool, arguments)?;
            let _running = self.wait_for_tool(tool, wait_until, slot).await?;
            let _in_flight = self.telemetry.in_flight_guard();
            let left = request.deadline.map(|deadline| deadline.saturating_sub(now_since_epoch()));
            self.registry.run(tool, arguments, &context, left).await
        };
        tokio::select! {
            res = call => Some(res),
            () = renew => Some(unreachable_renew()),
            () = forced.cancelled() => {
                context.cancel.cancel();
                warn!(request_id = %request.request_id, tool, "grace period over; call abandoned, left to a replica");
                None
            }
        }
    }

    /// The discovery answer in the requested format.
    fn discover(&self, envelope: &EventEnvelope) -> Value {
        let format = envelope.data_str("format").and_then(DiscoveryFormat::parse).unwrap_or_default();
        let tools = self.registry.export(
            format,
            &self.keys.topic(&self.settings.requests_topic),
            &self.keys.topic(&self.settings.results_topic),
        );
        json!({"toolbox_id": self.settings.toolbox_id, "format": format.as_str(), "tools": tools})
    }

    /// Dead-letters an entry that cannot be answered, acking it.
    async fn dead_letter(
        &self,
        entry: &Entry,
        reason: &str,
        answer: Option<(&Request, ResultData)>,
    ) -> Outcome {
        warn!(entry_id = %entry.entry_id, reason, "dead-lettering entry");
        let letter = self.letter(entry, reason);
        let letter_id = new_message_id();
        let dead = Published { topic: &self.dead_letters, id: &letter_id, payload: &letter };
        self.telemetry.dead_lettered();
        let committed = match answer {
            Some((request, data)) => {
                let answered_key = self.keys.answered(&self.settings.toolbox_id, &request.request_id);
                let call_key = self.keys.call(&self.settings.toolbox_id, &request.request_id);
                let call = CallKeys {
                    answered: &answered_key,
                    call: &call_key,
                    lease: self.settings.claim_idle,
                    retention: self.settings.answered_retention,
                };
                match self.commit_answer(entry, request, &call, &data, Some(dead), false).await {
                    None | Some(Outcome::Duplicate) => Some(()),
                    Some(Outcome::DeadLetter) => return Outcome::DeadLetter,
                    Some(_) => None,
                }
            }
            None => self.commit(entry, None, None, Some(dead), false).await.map(|_| ()),
        };
        committed.map_or(Outcome::LeftPending, |()| Outcome::DeadLetter)
    }

    /// The dead letter of a request entry.
    fn letter(&self, entry: &Entry, reason: &str) -> String {
        json!({
            "event": "dead_letter",
            "toolbox_id": self.settings.toolbox_id,
            "stream": self.requests,
            "request_entry_id": entry.entry_id,
            "id": entry.id,
            "payload": entry.payload,
            "deliveries": entry.deliveries,
            "error": reason,
            "dead_lettered_at": toolhost_envelope::now_rfc3339(),
        })
        .to_string()
    }

    /// An entry delivered too often: dead-letter it and answer `internal`.
    async fn poison(&self, entry: &Entry, request: &Request) -> Outcome {
        let reason = format!(
            "delivered {} times without completing (limit {}); each holder stopped or failed before answering",
            entry.deliveries, self.settings.max_deliveries
        );
        let data = ResultData::err(
            &request.request_id,
            ErrorCode::Internal,
            "the request failed repeatedly inside the tool host and was moved to the dead-letter stream",
        );
        self.dead_letter(entry, &reason, Some((request, data))).await
    }

    /// Commits a request's answer on its response topic. `None` when this answer is the one
    /// published; otherwise how the entry ended instead (a duplicate, left pending, or
    /// dead-lettered because the response topic holds a key that is not a stream).
    async fn commit_answer(
        &self,
        entry: &Entry,
        request: &Request,
        call: &CallKeys<'_>,
        data: &ResultData,
        dead_letter: Option<Published<'_>>,
        final_answer: bool,
    ) -> Option<Outcome> {
        let topic = self.keys.topic(&request.response_topic);
        let (id, payload) = request.envelope.result_json(&self.source, &topic, data);
        let answer = Published { topic: &topic, id: &id, payload: &payload };
        match self.commit(entry, Some(*call), Some(answer), dead_letter, final_answer).await {
            Some(Committed::Published) => None,
            Some(Committed::NotPublished) => Some(Outcome::Duplicate),
            Some(Committed::WrongType) => Some(self.wrong_type(entry, request, call, dead_letter).await),
            Some(_) | None => Some(Outcome::LeftPending),
        }
    }

    /// The response topic holds a key that is not a stream, so no answer can ever be published
    /// there: answer `internal` once on the default results topic and dead-letter the request,
    /// rather than let the entry loop through redeliveries.
    async fn wrong_type(
        &self,
        entry: &Entry,
        request: &Request,
        call: &CallKeys<'_>,
        dead_letter: Option<Published<'_>>,
    ) -> Outcome {
        let topic = self.keys.topic(&request.response_topic);
        error!(request_id = %request.request_id, topic, "response topic holds a key that is not a stream; dead-lettering");
        let reason = format!("response topic '{}' holds a key that is not a stream", request.response_topic);
        let letter = self.letter(entry, &reason);
        let letter_id = new_message_id();
        let dead =
            dead_letter.unwrap_or(Published { topic: &self.dead_letters, id: &letter_id, payload: &letter });
        self.telemetry.dead_lettered();
        let default_topic = self.keys.topic(&self.settings.results_topic);
        let data = ResultData::err(
            &request.request_id,
            ErrorCode::Internal,
            format!("the answer could not be published: {reason}; it was moved to the dead-letter stream"),
        );
        let committed = if topic == default_topic {
            // Even the default topic is unusable: only the dead letter can be written.
            self.commit(entry, Some(*call), None, Some(dead), false).await
        } else {
            let (id, payload) = request.envelope.result_json(&self.source, &default_topic, &data);
            let answer = Published { topic: &default_topic, id: &id, payload: &payload };
            self.commit(entry, Some(*call), Some(answer), Some(dead), false).await
        };
        match committed {
            Some(Committed::WrongType) => {
                let retry = self.commit(entry, Some(*call), None, Some(dead), false).await;
                retry.map_or(Outcome::LeftPending, |_| Outcome::DeadLetter)
            }
            Some(_) => Outcome::DeadLetter,
            None => Outcome::LeftPending,
        }
    }

    /// Acks an entry without answering it: its request was answered, or is being answered, by
    /// another entry.
    async fn ack_unanswered(&self, entry: &Entry) -> Outcome {
        self.commit(entry, None, None, None, false).await.map_or(Outcome::LeftPending, |_| Outcome::Duplicate)
    }

    /// Runs [`Bus::finish`] until it succeeds, Redis refuses it, or shutdown is forced.
    async fn commit(
        &self,
        entry: &Entry,
        call: Option<CallKeys<'_>>,
        answer: Option<Published<'_>>,
        dead_letter: Option<Published<'_>>,
        final_answer: bool,
    ) -> Option<Committed> {
        let finish = Finish {
            entry: EntryRef {
                topic: &self.requests,
                group: &self.settings.toolbox_id,
                entry_id: &entry.entry_id,
            },
            call,
            answer,
            answer_copy: None,
            dead_letter,
            final_answer,
        };
        ledger::finish(&*self.bus, &finish, self.shutdown.forced(), &self.telemetry).await
    }

    /// When a call waiting for its tool's run slot gives up: its deadline, else the maximum
    /// request age counted from the entry's time; `None` waits as long as it takes (the queue is
    /// bounded, so memory is too).
    fn wait_deadline(&self, entry: &Entry, request: &Request) -> Option<Duration> {
        let max_age = self.settings.max_request_age.and_then(|max_age| {
            entry_millis(&entry.entry_id).map(|sent| Duration::from_millis(sent) + max_age)
        });
        match (request.deadline, max_age) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes a run slot of `tool`: at once, or after a wait in its queue during which the call
    /// gives back its global slot, so calls of other tools are not held up behind it.
    ///
    /// # Errors
    /// `overloaded` when the tool's queue is full, `expired` when `wait_until` passes first.
    async fn wait_for_tool(
        &self,
        tool: &str,
        wait_until: Option<Duration>,
        slot: &mut Slot,
    ) -> Result<Running, Failure> {
        let waiting = match self.limits.admit(tool) {
            Admit::Run(running) => return Ok(running),
            Admit::Full(full) => return Err(self.overloaded(tool, full)),
            Admit::Wait(waiting) => waiting,
        };
        slot.release();
        let Some(until) = wait_until else { return Ok(waiting.ready().await) };
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
        let mean = self.stats.mean(tool).unwrap_or(Duration::from_millis(100));
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
}

impl EntryHandler for Dispatcher {
    async fn handle(&self, entry: Entry, mut slot: Slot) {
        self.handle_entry(&entry, &mut slot).await;
    }
}

/// What the ledger decided before a tool call.
enum Begin {
    /// Run the tool.
    Run,
    /// Answer this without running.
    Answer(Result<Value, Failure>),
    /// Nothing to answer; the entry ended this way.
    End(Outcome),
}

fn unreachable_renew() -> Result<Value, Failure> {
    // The renewal loop never ends; select! needs a value for its branch.
    Err(Failure::new(ErrorCode::Internal, "lease renewal stopped"))
}

fn failure_data(request_id: &str, failure: Failure) -> ResultData {
    let data = ResultData::err(request_id, failure.code, failure.message);
    match failure.details {
        Some(details) => data.with_details(details),
        None => data,
    }
}
