//! The requests door: `action-requests`, read through the toolbox's consumer group, each request
//! answered once on its response topic.
//!
//! Admission (`admit`) turns an entry into a [`Request`]: the envelope, its request id, what it
//! asks for and where the answer goes. Everything after that is the call lifecycle's
//! ([`crate::call`]); this door only says what answering means: a tool call, a discovery or
//! statistics answer, or a refusal, published as a result envelope.

mod admit;
mod catalog;
mod settings;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use toolhost_bus::{Keys, Shards};
use toolhost_envelope::{
    CallTrace, DiscoveryFormat, Entry, ErrorCode, EventEnvelope, ResultData, new_message_id,
};
use toolhost_tools::{Failure, LogReport, Output, ProgressReport, Registry};
use tracing::info;

pub(crate) use self::admit::{Request, Target, entry_millis};
pub(crate) use self::settings::Settings;
use crate::call::{
    Admission, Admitted, Answer, CallIds, Decision, Door, DoorTraits, Event, Letter, Lifecycle, Outcome,
    Permits, Refused, Reply, UNKNOWN_TOOL_LABEL, Work,
};
use crate::doors::context::StreamContext;
use crate::fleet::{Fleet, Route, route};
use crate::group::GroupReader;
use crate::stats::Stats;
use crate::telemetry::Sampling;

/// Starts the requests door: a reader of each shard of the requests stream this replica reads
/// (`[streams] read_shards`, all by default), in the toolbox's consumer group. With one shard,
/// one reader of the requests stream itself. Each shard's ledger is its own: the shard rule puts
/// every copy of a request id on one shard.
pub(crate) fn start(settings: Settings, cx: &StreamContext) -> Vec<Arc<GroupReader<Lifecycle<Requests>>>> {
    let services = &cx.services;
    let read: Vec<u16> = if settings.read_shards.is_empty() {
        (0..settings.shards.count()).collect()
    } else {
        settings.read_shards.clone()
    };
    let current = read.into_iter().map(|shard| (settings.shards.stream(shard), shard, false));
    // While the count changes, the previous count's streams too, drained into the current ones.
    let all = settings.shards.streams();
    let previous: Vec<String> =
        settings.previous.iter().flat_map(Shards::streams).filter(|stream| !all.contains(stream)).collect();
    let streams: Vec<(String, u16, bool)> =
        current.chain(previous.into_iter().map(|stream| (stream, u16::MAX, true))).collect();
    streams
        .into_iter()
        .map(|(stream, shard, draining)| {
            let topic = services.keys.topic(&stream);
            let settings = Settings { requests_topic: stream.clone(), shard, draining, ..settings.clone() };
            let door = Requests::new(
                services.keys.clone(),
                services.stats.clone(),
                services.fleet.clone(),
                &cx.consumer,
                settings,
                services.telemetry.sampling(),
            );
            cx.reader(door, &stream, topic)
        })
        .collect()
}

/// The requests door.
pub struct Requests {
    keys: Keys,
    settings: Settings,
    /// Full key of the requests stream.
    requests: String,
    /// Full key of the dead-letter stream.
    dead_letters: String,
    /// `toolhost:<toolbox_id>`.
    source: String,
    /// Per-tool statistics, for `tools.stats`.
    stats: Arc<Stats>,
    /// What the other replicas host, for requests this one cannot serve.
    fleet: Arc<Fleet>,
    /// This replica's consumer name.
    consumer: String,
    /// How new traces are sampled (the `sampled` flag of a call's context).
    sampling: Sampling,
}

impl Requests {
    /// The door of the requests stream.
    pub(crate) fn new(
        keys: Keys,
        stats: Arc<Stats>,
        fleet: Arc<Fleet>,
        consumer: &str,
        settings: Settings,
        sampling: Sampling,
    ) -> Requests {
        Requests {
            fleet,
            sampling,
            consumer: consumer.to_owned(),
            requests: keys.topic(&settings.requests_topic),
            dead_letters: keys.dead_letters(&settings.toolbox_id),
            source: format!("toolhost:{}", settings.toolbox_id),
            keys,
            settings,
            stats,
        }
    }

    /// The shard `request` belongs on, when it is not the one it was read from: its request id's
    /// (a `tool.cancel`'s is the call's), shard 0 for `tools.*`. A request without an id of its
    /// own, or one whose envelope cannot be run (it is answered where it is), stays; on a stream
    /// of the previous shard count, which is drained, every request that can be run moves on its
    /// first delivery. A redelivered one stays and is answered through that stream's ledger: a
    /// replica of the previous count may still be running it (this one reclaimed it from there),
    /// and only one ledger can see both.
    fn elsewhere(&self, request: &Request) -> Option<u16> {
        let settings = &self.settings;
        if matches!(request.target, Target::Invalid(_) | Target::Forbidden(_)) {
            return None;
        }
        let id = (!request.id_is_entry_id).then_some(request.request_id.as_str());
        let home = settings.shards.of_request(&request.envelope.event_type, id);
        if settings.draining {
            return (!request.redelivered).then_some(home.unwrap_or(0));
        }
        if settings.shards.count() == 1 {
            return None;
        }
        home.filter(|home| *home != settings.shard)
    }

    /// While the shard count changes: the ledger the request id had under the previous count,
    /// when it is not this shard's.
    fn former_ledger(&self, request: &Request) -> Option<String> {
        let previous = self.settings.previous.as_ref()?;
        if request.id_is_entry_id || self.settings.draining {
            return None;
        }
        let home = previous.of_request(&request.envelope.event_type, Some(&request.request_id))?;
        Some(previous.stream(home)).filter(|former| *former != self.settings.requests_topic)
    }

    /// The discovery answer in the requested format: the tools the caller may call.
    fn discover(&self, envelope: &EventEnvelope, registry: &Registry, permits: Permits<'_>) -> Value {
        let format = envelope.data_str("format").and_then(DiscoveryFormat::parse).unwrap_or_default();
        let tools = registry.export_where(
            format,
            &self.keys.topic(&self.settings.shards.stream(0)),
            &self.keys.topic(&self.settings.results_topic),
            |tool| permits.allows(tool),
        );
        json!({"toolbox_id": self.settings.toolbox_id, "format": format.as_str(), "tools": tools})
    }

    /// The result envelope of `request` on the bare `topic`.
    fn result_on(&self, request: &Request, topic: &str, data: &ResultData) -> Answer {
        let topic = self.keys.topic(topic);
        let (id, payload, kept) = request.envelope.result_json_with_data(&self.source, &topic, data);
        Answer { topic, copy: None, id, payload, kept: Some(kept) }
    }

    /// The dead letter of an entry.
    ///
    /// An unreadable payload (not UTF-8, or over `max_payload_bytes`) is never copied whole:
    /// `defect` holds its first 64 KiB (base64), size and SHA-1, and `payload` is `null` unless
    /// that head is the whole payload as text (then it stays replayable).
    fn dead_letter(&self, entry: &Entry, reason: &str) -> Letter {
        let defect = entry.unreadable(self.settings.max_payload_bytes);
        let kept = match &defect {
            Some(defect) if defect.field == toolhost_envelope::FIELD_PAYLOAD => defect.whole_text(),
            _ => entry.payload.as_deref(),
        };
        let mut letter = json!({
            "event": "dead_letter",
            "toolbox_id": self.settings.toolbox_id,
            "stream": self.requests,
            "request_entry_id": entry.entry_id,
            "id": entry.id,
            "payload": kept,
            "deliveries": entry.deliveries,
            "error": reason,
            "dead_lettered_at": toolhost_envelope::now_rfc3339(),
        });
        if let Some(defect) = defect {
            letter["defect"] = defect.to_json();
        }
        Letter { topic: self.dead_letters.clone(), id: new_message_id(), payload: letter.to_string() }
    }
}

impl Door for Requests {
    type Request = Request;

    /// Progress is relayed to the caller, and answers are kept: a caller that lost its answer
    /// and sends the request again gets the original answer.
    const TRAITS: DoorTraits =
        DoorTraits { name: "requests", relays_progress: true, keeps_answers: true, tracks_every_call: false };

    fn admit(&self, entry: &Entry, registry: &Registry) -> Admission<Request> {
        let topics = &self.settings.response_topics;
        let resolve = |event: &str| registry.by_event(event).map(str::to_owned);
        match admit::admit(entry, self.settings.max_payload_bytes, topics, resolve, self.sampling) {
            admit::Admission::DeadLetter(reason) => {
                Admission::DeadLetter(self.dead_letter(entry, &reason), reason)
            }
            admit::Admission::Request(request) => {
                Admission::Request(self.admitted(entry, *request, registry))
            }
        }
    }

    /// `forbidden` on the default results topic, never on the topic the unverified payload
    /// names.
    fn refusal(&self, _entry: &Entry, request: &Request, failure: Failure) -> Refused {
        let data = ResultData::err(&request.request_id, failure.code, failure.message);
        Refused::Answer(self.result_on(request, &self.settings.results_topic, &data))
    }

    fn work(&self, request: &Request, registry: &Registry, permits: Permits<'_>) -> Decision {
        let answer = |result| Work::Answer(result, Reply::Result);
        let toolbox_id = &self.settings.toolbox_id;
        // A request this replica cannot serve goes to the replica that can; only when nobody
        // live hosts it is it answered here, once across the fleet (see `call` and the ledger),
        // from a view of the fleet read after the entry came (`Decision::Unhosted`).
        let elsewhere = |tool: &str, here: Work| match route(&self.fleet, tool, toolbox_id, &self.consumer) {
            Route::Here => Decision::Unhosted(here),
            Route::OtherToolbox => Work::AckOnly.into(),
            Route::Sibling(consumer) => Work::HandOver(consumer).into(),
        };
        // A request on the wrong shard goes to its home shard, whose ledger holds its id.
        if let Some(home) = self.elsewhere(request) {
            return Work::Move(self.settings.shards.stream(home)).into();
        }
        // Discovery and statistics addressed to another live toolbox are its to answer.
        let addressed = request.envelope.data_str("toolbox_id").filter(|id| *id != toolbox_id.as_str());
        let work = match &request.target {
            Target::Tool { name, arguments } => {
                let run = Work::Tool { name: name.clone(), arguments: arguments.clone() };
                return if registry.is_enabled(name) { run.into() } else { elsewhere(name, run) };
            }
            // Deprecated: another toolbox sharing the stream answers it; only ack here.
            Target::Unknown(_) if !self.settings.answer_unknown_tools => Work::AckOnly,
            Target::Unknown(event) => {
                let unknown = answer(Err(Failure::new(
                    ErrorCode::UnknownTool,
                    format!("no tool consumes the event '{event}'; send tools.discover to list the tools"),
                )));
                return elsewhere(event, unknown);
            }
            Target::Discover | Target::Stats if addressed.is_some_and(|id| self.fleet.is_live(id)) => {
                Work::AckOnly
            }
            Target::Discover | Target::Stats if addressed.is_some() => answer(Err(Failure::new(
                ErrorCode::InvalidRequest,
                format!("no live toolbox '{}' reads this stream", addressed.unwrap_or_default()),
            ))),
            // Every toolbox reading the stream looks for the call; one of them answers.
            Target::Cancel { call_id, .. } => Work::Cancel(call_id.clone()),
            // As a cancel: every toolbox looks for the question; one of them answers.
            Target::Input { call_id, input_id, response, .. } => Work::Input {
                call_id: call_id.clone(),
                input_id: input_id.clone(),
                response: response.clone(),
            },
            // Every toolbox reading the stream reads it; the one that serves it answers.
            Target::Catalog { ask, params } => Work::Catalog { ask: *ask, params: params.clone() },
            Target::Discover => answer(Ok(self.discover(&request.envelope, registry, permits).into())),
            Target::Stats => answer(Ok(
                json!({"toolbox_id": self.settings.toolbox_id, "tools": self.stats.snapshot()["tools"]})
                    .into(),
            )),
            Target::Invalid(reason) => answer(Err(Failure::new(ErrorCode::InvalidRequest, reason.clone()))),
            Target::Forbidden(reason) => answer(Err(Failure::new(ErrorCode::Forbidden, reason.clone()))),
        };
        work.into()
    }

    fn answer(&self, request: &Request, result: &Result<Output, Failure>) -> Answer {
        let data = match result {
            Ok(output) => ResultData::ok(&request.request_id, output.result.clone())
                .with_content(output.content.clone()),
            Err(failure) => {
                let data = ResultData::err(&request.request_id, failure.code, failure.message.clone());
                match &failure.details {
                    Some(details) => data.with_details(details.clone()),
                    None => data,
                }
            }
        };
        self.result_on(request, &request.response_topic, &data)
    }

    /// `<answer type>.progress` on the answer's topic, `data` without `success`.
    fn progress(&self, request: &Request, report: &ProgressReport) -> Option<Answer> {
        let mut data = json!({"request_id": request.request_id, "progress": report.progress});
        if let Some(total) = report.total {
            data["total"] = json!(total);
        }
        if let Some(message) = &report.message {
            data["message"] = json!(message);
        }
        let topic = self.keys.topic(&request.response_topic);
        let (id, payload) = request.envelope.progress_json(&self.source, &topic, &data);
        Some(Answer { topic, copy: None, id, payload, kept: None })
    }

    /// `<answer type>.log` on the answer's topic, `data` without `success`.
    fn log(&self, request: &Request, report: &LogReport) -> Option<Answer> {
        let mut data = json!({"request_id": request.request_id, "level": report.level, "data": report.data});
        if let Some(logger) = &report.logger {
            data["logger"] = json!(logger);
        }
        let topic = self.keys.topic(&request.response_topic);
        let (id, payload) = request.envelope.log_json(&self.source, &topic, &data);
        Some(Answer { topic, copy: None, id, payload, kept: None })
    }

    /// `<answer type>.input_required` on the answer's topic, `data` without `success`.
    fn input_required(&self, request: &Request, data: &Value) -> Option<Answer> {
        let topic = self.keys.topic(&request.response_topic);
        let (id, payload) = request.envelope.input_required_json(&self.source, &topic, data);
        Some(Answer { topic, copy: None, id, payload, kept: None })
    }

    /// `internal`, once, on the default results topic (unless that is the topic that failed).
    fn fallback(&self, request: &Request, reason: &str) -> Option<Answer> {
        if request.response_topic == self.settings.results_topic {
            return None;
        }
        let data = ResultData::err(
            &request.request_id,
            ErrorCode::Internal,
            format!("the answer could not be published: {reason}; it was moved to the dead-letter stream"),
        );
        Some(self.result_on(request, &self.settings.results_topic, &data))
    }

    fn letter(&self, entry: &Entry, _request: &Request, reason: &str) -> Letter {
        self.dead_letter(entry, reason)
    }

    /// Only the end of a request is logged here.
    async fn observe(&self, event: Event<'_, Request>) {
        if let Event::Ended { entry, request, tool, outcome, duration } = event {
            self.log(entry, request, tool, outcome, duration);
        }
    }
}

impl Requests {
    /// Logs the end of an entry's handling.
    fn log(
        &self,
        entry: &Entry,
        request: Option<&Request>,
        tool: &str,
        outcome: Outcome,
        duration: Duration,
    ) {
        let envelope = request.map(|request| &request.envelope);
        let trace = request.map(|request| &request.trace);
        // The caller's `trace_id` when it is not the W3C trace id the call runs under.
        let caller_trace_id = envelope
            .and_then(|envelope| envelope.trace_id.as_deref())
            .filter(|id| trace.is_none_or(|trace| *id != trace.trace_id_hex()));
        info!(
            request_id = request.map_or("-", |request| request.request_id.as_str()),
            trace_id = trace.map(CallTrace::trace_id_hex),
            span_id = trace.map(CallTrace::span_id_hex),
            caller_trace_id,
            trace_rejected = trace.is_some_and(|trace| trace.rejected).then_some(true),
            correlation_id = envelope.and_then(EventEnvelope::effective_correlation_id).unwrap_or("-"),
            tenant_id = envelope.and_then(|e| e.tenant_id.as_deref()).unwrap_or("-"),
            tool,
            outcome = outcome.label(),
            duration_ms = duration.as_secs_f64() * 1000.0,
            entry_id = %entry.entry_id,
            deliveries = entry.deliveries,
            "invocation"
        );
    }

    /// An admitted request, with what the lifecycle reads of every request.
    fn admitted(&self, entry: &Entry, request: Request, registry: &Registry) -> Admitted<Request> {
        let envelope = &request.envelope;
        Admitted {
            ledger_id: ledger_id(&request),
            tenant: envelope.tenant_id.clone(),
            time: envelope.time.clone(),
            source: envelope.source.clone().filter(|source| !source.is_empty()),
            deadline: self.deadline(entry, &request),
            ids: CallIds {
                request_id: request.request_id.clone(),
                correlation_id: envelope.effective_correlation_id().map(str::to_owned),
                conversation_id: envelope
                    .data_str("conversation_id")
                    .or(envelope.session_id.as_deref())
                    .map(str::to_owned),
                trace: request.trace.clone(),
            },
            tool_label: tool_label(&request, registry),
            former_ledger: self.former_ledger(&request),
            request,
        }
    }

    /// The caller's deadline, or the maximum request age counted from the entry's time,
    /// whichever comes first.
    fn deadline(&self, entry: &Entry, request: &Request) -> Option<Duration> {
        let max_age = self.settings.max_request_age.and_then(|max_age| {
            entry_millis(&entry.entry_id).map(|sent| Duration::from_millis(sent) + max_age)
        });
        match (request.deadline, max_age) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The id the ledger remembers a request by. A cancel (and a `tool.input`) is remembered by its
/// own id: the request id it carries is the call's, whose answered mark must not swallow the
/// cancel's answer (and a cancel's answer sets no mark). A malformed one too, since committing
/// its answer under the call's id would delete the running call's record.
fn ledger_id(request: &Request) -> String {
    match &request.target {
        Target::Cancel { cancel_id, .. } => format!("{}:{cancel_id}", admit::TOOL_CANCEL),
        Target::Input { answer_id, .. } => format!("{}:{answer_id}", admit::TOOL_INPUT),
        Target::Invalid(_)
            if matches!(request.envelope.event_type.as_str(), admit::TOOL_CANCEL | admit::TOOL_INPUT) =>
        {
            format!("{}:{}:invalid", request.envelope.event_type, request.envelope.id)
        }
        _ => request.request_id.clone(),
    }
}

/// The tool label of a request for stats, metrics and logs; `None` when it names no tool.
/// Caller-chosen names that no tool has share one label, on every path, so they cannot grow
/// `tools.stats` or the metric series without bound.
fn tool_label(request: &Request, registry: &Registry) -> Option<String> {
    match &request.target {
        Target::Tool { name, .. } if registry.contains(name) => Some(name.clone()),
        Target::Tool { .. } | Target::Unknown(_) => Some(UNKNOWN_TOOL_LABEL.to_owned()),
        Target::Discover => Some(admit::TOOLS_DISCOVER.to_owned()),
        Target::Stats => Some(admit::TOOLS_STATS.to_owned()),
        Target::Cancel { .. } => Some(admit::TOOL_CANCEL.to_owned()),
        Target::Input { .. } => Some(admit::TOOL_INPUT.to_owned()),
        Target::Catalog { ask, .. } => Some(ask.request_type().to_owned()),
        Target::Invalid(_) | Target::Forbidden(_) => None,
    }
}
