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
use toolhost_bus::{Bus, CallKeys, CallStart, EntryRef, Finish, Keys, Published};
use toolhost_envelope::{DiscoveryFormat, Entry, ErrorCode, EventEnvelope, ResultData, new_message_id};
use toolhost_tools::{Context, Failure, Registry};
use tracing::{error, info, warn};

pub(crate) use request::{Admission, Request, Target, admit, entry_millis, now_since_epoch};

use crate::group::{EntryHandler, GroupSettings};
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
}

/// Reads requests and answers them.
pub struct Dispatcher {
    bus: Arc<dyn Bus>,
    registry: Arc<Registry>,
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
        let Services { bus, registry, keys, stats, telemetry, shutdown } = services;
        Dispatcher {
            requests: keys.topic(&settings.requests_topic),
            dead_letters: keys.dead_letters(&settings.toolbox_id),
            source: format!("toolhost:{}", settings.toolbox_id),
            bus,
            registry,
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
    async fn handle_entry(&self, entry: &Entry) {
        let started = Instant::now();
        if entry.deliveries > 1 {
            self.telemetry.redelivered();
        }
        let admission = admit(entry, self.settings.max_payload_bytes, |event| {
            self.registry.by_event(event).map(str::to_owned)
        });
        let (outcome, tool, request) = match admission {
            Admission::DeadLetter(reason) => (self.dead_letter(entry, &reason, None).await, None, None),
            Admission::Request(request) => {
                let tool = match &request.target {
                    Target::Tool { name, .. } => Some(name.clone()),
                    Target::Discover => Some("tools.discover".to_owned()),
                    Target::Stats => Some("tools.stats".to_owned()),
                    _ => None,
                };
                let outcome = self.answer(entry, &request).await;
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
    async fn answer(&self, entry: &Entry, request: &Request) -> Outcome {
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
                    None => match self.run_tool(entry, request, &call, name, arguments.clone(), &owner).await
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
                return self
                    .commit(entry, None, None, None)
                    .await
                    .map_or(Outcome::LeftPending, |_| Outcome::Duplicate);
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
        let data = match result {
            Ok(value) => ResultData::ok(&request.request_id, value),
            Err(failure) => failure_data(&request.request_id, failure),
        };
        match self.commit_answer(entry, request, call, &data, None).await {
            Some(true) => outcome,
            Some(false) => Outcome::Duplicate,
            None => Outcome::LeftPending,
        }
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
            CallStart::Answered => Begin::End(
                self.commit(entry, None, None, None)
                    .await
                    .map_or(Outcome::LeftPending, |_| Outcome::Duplicate),
            ),
            CallStart::Busy { entry_id } if entry_id == entry.entry_id => {
                // The owner is alive and will ack this very entry.
                Begin::End(Outcome::LeftPending)
            }
            CallStart::Busy { .. } => {
                // A re-sent copy while the original runs: the original's answer is the one.
                Begin::End(
                    self.commit(entry, None, None, None)
                        .await
                        .map_or(Outcome::LeftPending, |_| Outcome::Duplicate),
                )
            }
            CallStart::StartedBefore => {
                let idempotent = self.registry.annotations(tool).is_some_and(|a| a.idempotent);
                if idempotent { Begin::Run } else { Begin::Answer(Err(ledger::interrupted(tool))) }
            }
            _ => Begin::End(Outcome::LeftPending),
        }
    }

    /// Runs a tool, renewing the lease while it runs. `None` when shutdown was forced first: the
    /// tool is cancelled and nothing is answered.
    async fn run_tool(
        &self,
        entry: &Entry,
        request: &Request,
        call: &CallKeys<'_>,
        tool: &str,
        arguments: Value,
        owner: &str,
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
        let left = request.deadline.map(|deadline| deadline.saturating_sub(now_since_epoch()));
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
        let _in_flight = self.telemetry.in_flight_guard();
        tokio::select! {
            res = self.registry.invoke(tool, arguments, &context, left) => Some(res),
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
        let letter = json!({
            "event": "dead_letter",
            "toolbox_id": self.settings.toolbox_id,
            "stream": self.requests,
            "entry_id": entry.entry_id,
            "id": entry.id,
            "payload": entry.payload,
            "deliveries": entry.deliveries,
            "error": reason,
            "dead_lettered_at": toolhost_envelope::now_rfc3339(),
        });
        let letter = letter.to_string();
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
                self.commit_answer(entry, request, &call, &data, Some(dead)).await.map(|_| ())
            }
            None => self.commit(entry, None, None, Some(dead)).await.map(|_| ()),
        };
        committed.map_or(Outcome::LeftPending, |()| Outcome::DeadLetter)
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

    /// Commits a request's answer. `None` when it could not be committed (left pending).
    async fn commit_answer(
        &self,
        entry: &Entry,
        request: &Request,
        call: &CallKeys<'_>,
        data: &ResultData,
        dead_letter: Option<Published<'_>>,
    ) -> Option<bool> {
        let topic = self
            .keys
            .topic(request.envelope.requested_response_topic().unwrap_or(&self.settings.results_topic));
        let (id, payload) = request.envelope.result_json(&self.source, &topic, data);
        let answer = Published { topic: &topic, id: &id, payload: &payload };
        self.commit(entry, Some(*call), Some(answer), dead_letter).await
    }

    /// Runs [`Bus::finish`] until it succeeds, Redis refuses it, or shutdown is forced.
    async fn commit(
        &self,
        entry: &Entry,
        call: Option<CallKeys<'_>>,
        answer: Option<Published<'_>>,
        dead_letter: Option<Published<'_>>,
    ) -> Option<bool> {
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
        };
        ledger::finish(&*self.bus, &finish, self.shutdown.forced(), &self.telemetry).await
    }
}

impl EntryHandler for Dispatcher {
    async fn handle(&self, entry: Entry) {
        self.handle_entry(&entry).await;
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
