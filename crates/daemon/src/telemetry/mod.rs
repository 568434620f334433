//! What the daemon reports about itself: Prometheus metrics and the readiness facts behind `/readyz`.
//!
//! One [`Telemetry`] is created by `serve::run` and handed to every loop and to the HTTP server;
//! there are no globals. Metrics are kept by a `metrics_exporter_prometheus::PrometheusRecorder`
//! that is never installed as the process-wide `metrics` recorder: this module registers counters,
//! gauges and histograms on it directly and renders it for `/metrics`. That crate was already a
//! workspace dependency and renders real histogram buckets; `prometheus-client` would have served
//! as well.
//!
//! Metric names are the constants below; `docs/OPERATIONS.md` explains each one.
//!
//! Spans (issue 36): [`settings`] is `[telemetry]` with the standard `OTEL_*` variables,
//! [`otel`] the pipeline (a bounded queue of finished spans, the OTLP export), [`otlp`] the
//! OTLP/HTTP request encoded from toolhost's own span data, [`spans`] the spans of one call by
//! the messaging and MCP conventions. The pipeline is started once the
//! runtime runs ([`Telemetry::start_export`]); before that, and without an endpoint, no span is
//! made.

pub(crate) mod history;
mod otel;
mod otlp;
pub mod settings;
pub(crate) mod spans;

pub use settings::{Sampling, Settings};
pub(crate) use spans::{CallNames, CallSpan, Delivery, DoorSpan, call_names};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

/// Handled entries, by `tool` and `outcome` (`success`, an error code, `dead_letter`, ...).
pub const INVOCATIONS: &str = "toolhost_invocations_total";
/// How long handling an entry took, by `tool`.
pub const INVOCATION_DURATION: &str = "toolhost_invocation_duration_seconds";
/// Tool calls running now.
pub const IN_FLIGHT: &str = "toolhost_in_flight";
/// Entries moved to the dead-letter stream.
pub const DEAD_LETTERS: &str = "toolhost_dead_letters_total";
/// Entries taken over from another consumer after its lease lapsed.
pub const RECLAIMS: &str = "toolhost_reclaims_total";
/// Entries handled that had been delivered before.
pub const REDELIVERIES: &str = "toolhost_redeliveries_total";
/// Entries of a consumer group delivered and not acked, by `stream` and `group`.
pub const GROUP_PENDING: &str = "toolhost_group_pending";
/// Entries of a stream not yet delivered to a group, by `stream` and `group`.
pub const GROUP_LAG: &str = "toolhost_group_lag";
/// Times Redis answered again after it had stopped answering.
pub const REDIS_RECONNECTS: &str = "toolhost_redis_reconnects_total";
/// 1 while Redis answers, 0 otherwise.
pub const REDIS_UP: &str = "toolhost_redis_up";
/// Always 1, labelled with the `version`.
pub const BUILD_INFO: &str = "toolhost_build_info";
/// Gauge: tool names served with different descriptions by different toolboxes of the fleet.
pub const FLEET_CONFLICTS: &str = "toolhost_fleet_conflicts";
/// Gauge, label `source`: 1 while a hosted tool source (an MCP server) is connected.
pub const SOURCE_UP: &str = "toolhost_source_up";
/// Counter: configuration reloads applied.
pub const RELOADS: &str = "toolhost_config_reloads_total";
/// Counter: configuration reloads refused (the old configuration keeps serving).
pub const RELOAD_FAILURES: &str = "toolhost_config_reload_failures_total";
/// Counter: spans the OTLP collector took.
pub const SPANS_EXPORTED: &str = "toolhost_telemetry_spans_exported_total";
/// Counter, label `reason` (`queue_full`, `export_failed`): spans dropped, never waited for.
pub const SPANS_DROPPED: &str = "toolhost_telemetry_spans_dropped_total";

/// Histogram buckets of [`INVOCATION_DURATION`], in seconds: from a cache hit to a long command.
const DURATION_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// The `tool` label of calls to tools that do not exist. The name comes from the caller, so
/// using it as a label would let any caller grow the metrics without bound.
const UNKNOWN_TOOL_LABEL: &str = "_unknown";

/// With no probe result for this long, readiness no longer trusts the last one.
const PROBE_STALE_AFTER: Duration = Duration::from_secs(5);

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// `redis_state` values.
const REDIS_UNKNOWN: u8 = 0;
const REDIS_UP_STATE: u8 = 1;
const REDIS_DOWN: u8 = 2;

/// Shared handle to the daemon's metrics and readiness state.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

struct Inner {
    /// Where every metric lives; registered on directly, never installed globally.
    recorder: PrometheusRecorder,
    /// Renders the recorder for `/metrics`.
    handle: PrometheusHandle,
    /// `REDIS_UNKNOWN` until the first Redis operation, then up or down.
    redis_state: AtomicU8,
    /// Whether the consumer groups exist.
    groups_ready: AtomicBool,
    /// Set once shutdown began: no new work is taken.
    draining: AtomicBool,
    /// Reference point for `last_probe_ms`.
    started: Instant,
    /// Milliseconds after `started` of the last completed probe; 0 before the first one.
    last_probe_ms: AtomicU64,
    in_flight: Gauge,
    dead_letters: Counter,
    reclaims: Counter,
    redeliveries: Counter,
    reconnects: Counter,
    redis_up: Gauge,
    /// What `/status` shows beside readiness: the tool sources' states, kept current by the
    /// sources' loop.
    status: std::sync::Mutex<serde_json::Value>,
    /// Why a door that keeps a connection of its own (the OVOS messagebus) is not ready, by
    /// door; `None` while it is.
    doors_down: std::sync::Mutex<std::collections::BTreeMap<&'static str, Option<&'static str>>>,
    /// Each tool source's last `up` and since when (RFC 3339) it has been so.
    source_since: std::sync::Mutex<std::collections::HashMap<String, (bool, String)>>,
    reloads: Counter,
    reload_failures: Counter,
    /// The handles of [`INVOCATIONS`] and [`INVOCATION_DURATION`] by tool label, so counting an
    /// invocation looks them up once instead of registering them again (label vectors, key
    /// hashing and the recorder's lock) on every call.
    invocations: std::sync::Mutex<HashMap<String, ToolMetrics>>,
    /// `[telemetry]`, resolved.
    settings: Settings,
    /// The span pipeline, once [`Telemetry::start_export`] started it.
    pipeline: std::sync::OnceLock<otel::Pipeline>,
    /// The OTLP metrics, once [`Telemetry::start_export`] started them.
    meters: std::sync::OnceLock<otel::Meters>,
    /// Whether [`Telemetry::start_export`] ran.
    export_started: AtomicBool,
    /// The calls answered since the last history point, by tool label.
    history: std::sync::Mutex<std::collections::BTreeMap<String, history::ToolInterval>>,
    /// Tool calls running now, for history points.
    in_flight_now: std::sync::atomic::AtomicI64,
    /// The last pending count and lag of each consumer group this replica reports, by stream
    /// and group.
    groups: std::sync::Mutex<std::collections::BTreeMap<(String, String), (u64, u64)>>,
    /// What the pipeline counts.
    export_counters: otel::ExportCounters,
}

/// One tool label's invocation metrics.
struct ToolMetrics {
    duration: Histogram,
    /// The OTLP metrics' duration histogram bound to the tool's `gen_ai.tool.name`, once they
    /// are exported: a call's record then looks up no attribute set.
    otlp_duration: Option<opentelemetry::metrics::BoundHistogram<f64>>,
    /// [`INVOCATIONS`] by outcome label, with the OTLP metrics' attributes of that outcome
    /// (`gen_ai.tool.name`, `toolhost.outcome`); a handful per tool, so a list.
    /// And the outcome's total, which the OTLP metrics read when they are collected.
    outcomes: Vec<(String, Counter, [opentelemetry::KeyValue; 2], u64)>,
}

/// Whether the daemon can take work, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// Every reason it is not ready; empty when it is.
    pub reasons: Vec<&'static str>,
}

impl Readiness {
    /// Whether there is no reason not to be ready.
    pub fn is_ready(&self) -> bool {
        self.reasons.is_empty()
    }
}

impl Default for Telemetry {
    fn default() -> Telemetry {
        Telemetry::new()
    }
}

impl Telemetry {
    /// Fresh telemetry that exports nothing: Redis not yet seen, groups not yet created, every
    /// metric at zero.
    pub fn new() -> Telemetry {
        Telemetry::with_settings(Settings::default())
    }

    /// Fresh telemetry with `[telemetry]`'s settings; spans are exported once
    /// [`Telemetry::start_export`] ran.
    pub fn with_settings(settings: Settings) -> Telemetry {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(INVOCATION_DURATION.to_owned()), DURATION_BUCKETS)
            // Only fails for an empty bucket list, and DURATION_BUCKETS is not empty.
            .unwrap_or_else(|_| PrometheusBuilder::new())
            .build_recorder();
        describe(&recorder);
        let counter = |name: &'static str| recorder.register_counter(&Key::from_static_name(name), &METADATA);
        let gauge = |name: &'static str| recorder.register_gauge(&Key::from_static_name(name), &METADATA);
        let build_info = Key::from_parts(BUILD_INFO, vec![Label::new("version", env!("CARGO_PKG_VERSION"))]);
        recorder.register_gauge(&build_info, &METADATA).set(1.0);
        let dropped = |reason: &'static str| {
            recorder.register_counter(
                &Key::from_parts(SPANS_DROPPED, vec![Label::new("reason", reason)]),
                &METADATA,
            )
        };
        let export_counters = otel::ExportCounters {
            exported: counter(SPANS_EXPORTED),
            dropped_queue_full: dropped("queue_full"),
            dropped_export_failed: dropped("export_failed"),
        };
        let inner = Inner {
            settings,
            pipeline: std::sync::OnceLock::new(),
            meters: std::sync::OnceLock::new(),
            export_started: AtomicBool::new(false),
            history: std::sync::Mutex::new(std::collections::BTreeMap::new()),
            in_flight_now: std::sync::atomic::AtomicI64::new(0),
            groups: std::sync::Mutex::new(std::collections::BTreeMap::new()),
            export_counters,
            handle: recorder.handle(),
            in_flight: gauge(IN_FLIGHT),
            dead_letters: counter(DEAD_LETTERS),
            reclaims: counter(RECLAIMS),
            redeliveries: counter(REDELIVERIES),
            reconnects: counter(REDIS_RECONNECTS),
            redis_up: gauge(REDIS_UP),
            status: std::sync::Mutex::new(serde_json::json!({"sources": []})),
            doors_down: std::sync::Mutex::new(std::collections::BTreeMap::new()),
            source_since: std::sync::Mutex::new(std::collections::HashMap::new()),
            reloads: counter(RELOADS),
            reload_failures: counter(RELOAD_FAILURES),
            invocations: std::sync::Mutex::new(HashMap::new()),
            recorder,
            redis_state: AtomicU8::new(REDIS_UNKNOWN),
            groups_ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            started: Instant::now(),
            last_probe_ms: AtomicU64::new(0),
        };
        Telemetry { inner: Arc::new(inner) }
    }

    /// Starts the span pipeline on the current runtime when `[telemetry]` names a collector;
    /// does nothing the second time.
    ///
    /// # Errors
    /// The exporter cannot be built.
    pub fn start_export(&self) -> anyhow::Result<()> {
        if self.inner.export_started.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let settings = &self.inner.settings;
        if let Some(pipeline) = otel::Pipeline::start(settings, self.inner.export_counters.clone())? {
            let _ = self.inner.pipeline.set(pipeline);
        }
        let (in_flight, invocations) = (Arc::downgrade(&self.inner), Arc::downgrade(&self.inner));
        let observed = otel::Observed {
            in_flight: Box::new(move || {
                in_flight.upgrade().map_or(0, |inner| inner.in_flight_now.load(Ordering::Relaxed))
            }),
            invocations: Box::new(move |observe| {
                let Some(inner) = invocations.upgrade() else { return };
                let tools = inner.invocations.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                for metrics in tools.values() {
                    for (_, _, attributes, total) in &metrics.outcomes {
                        observe(*total, attributes);
                    }
                }
            }),
        };
        if let Some(meters) = otel::Meters::start(settings, observed)? {
            let _ = self.inner.meters.set(meters);
        }
        Ok(())
    }

    /// Exports the spans still queued, for at most `grace`, and stops the pipeline.
    pub async fn stop_export(&self, grace: Duration) {
        if let Some(pipeline) = self.inner.pipeline.get() {
            pipeline.shutdown(grace).await;
        }
        if let Some(meters) = self.inner.meters.get() {
            meters.shutdown();
        }
    }

    /// How calls' traces are sampled.
    pub fn sampling(&self) -> Sampling {
        self.inner.settings.sampling
    }

    /// `[telemetry]`, resolved.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The `process` span of a sampled call; `None` when the call is not sampled or nothing is
    /// exported.
    pub(crate) fn call_span<'a>(
        &'a self,
        trace: &toolhost_envelope::CallTrace,
        delivery: Delivery<'a>,
        started: std::time::SystemTime,
    ) -> Option<CallSpan<'a>> {
        if !trace.context.is_sampled() {
            return None;
        }
        let pipeline = self.inner.pipeline.get()?;
        CallSpan::start(&pipeline.spans, self.inner.settings.record_arguments, trace, delivery, started)
    }

    /// The span of a call through a fleet door, when it is sampled and spans are exported; see
    /// [`DoorSpan`].
    pub(crate) fn door_span(
        &self,
        caller: Option<&toolhost_envelope::TraceContext>,
        name: String,
        kind: opentelemetry::trace::SpanKind,
        attributes: Vec<opentelemetry::KeyValue>,
    ) -> Option<DoorSpan> {
        let pipeline = self.inner.pipeline.get()?;
        let attributes = attributes.into_iter().map(spans::Attribute::from).collect();
        DoorSpan::start(&pipeline.spans, self.inner.settings.sampling, caller, name, kind, attributes)
    }

    /// Records whether the last Redis operation reached the server. Counts a reconnect when
    /// Redis answers again after it had stopped answering.
    pub fn set_redis_up(&self, up: bool) {
        let state = if up { REDIS_UP_STATE } else { REDIS_DOWN };
        let before = self.inner.redis_state.swap(state, Ordering::Relaxed);
        if up && before == REDIS_DOWN {
            self.inner.reconnects.increment(1);
        }
        self.inner.redis_up.set(if up { 1.0 } else { 0.0 });
    }

    /// Whether the last Redis operation reached the server.
    pub fn redis_up(&self) -> bool {
        self.inner.redis_state.load(Ordering::Relaxed) == REDIS_UP_STATE
    }

    /// Records that the consumer groups exist (or vanished).
    pub fn set_groups_ready(&self, ready: bool) {
        self.inner.groups_ready.store(ready, Ordering::Relaxed);
    }

    /// Whether the consumer groups exist.
    pub fn groups_ready(&self) -> bool {
        self.inner.groups_ready.load(Ordering::Relaxed)
    }

    /// Records that shutdown began: the daemon takes no new work.
    pub fn set_draining(&self) {
        self.inner.draining.store(true, Ordering::Relaxed);
    }

    /// Records that a readiness probe just completed, whatever it found.
    pub fn probed(&self) {
        let millis = self.inner.started.elapsed().as_millis() as u64;
        self.inner.last_probe_ms.store(millis.max(1), Ordering::Relaxed);
    }

    /// Whether the daemon can take work now, with every reason it cannot.
    pub fn readiness(&self) -> Readiness {
        let mut reasons = Vec::new();
        if !self.redis_up() {
            reasons.push("redis does not answer");
        }
        if !self.groups_ready() {
            reasons.push("the consumer groups do not exist");
        }
        if self.inner.draining.load(Ordering::Relaxed) {
            reasons.push("shutting down");
        }
        let doors_down = self.inner.doors_down.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        reasons.extend(doors_down.values().flatten());
        drop(doors_down);
        let last_probe = self.inner.last_probe_ms.load(Ordering::Relaxed);
        let now = self.inner.started.elapsed().as_millis() as u64;
        if last_probe > 0 && now.saturating_sub(last_probe) > PROBE_STALE_AFTER.as_millis() as u64 {
            reasons.push("the redis probe has not completed recently");
        }
        Readiness { reasons }
    }

    /// Records one `tools/call` of the MCP door in `mcp.server.operation.duration` (OTLP only).
    pub(crate) fn mcp_operation(&self, tool: &str, error: Option<&str>, duration: Duration) {
        if let Some(meters) = self.inner.meters.get() {
            let mut attributes = vec![
                opentelemetry::KeyValue::new("mcp.method.name", "tools/call"),
                opentelemetry::KeyValue::new("gen_ai.tool.name", tool.to_owned()),
            ];
            if let Some(error) = error {
                attributes.push(opentelemetry::KeyValue::new("error.type", error.to_owned()));
            }
            meters.mcp_operation.record(duration.as_secs_f64(), &attributes);
        }
    }

    /// The history point of the interval since the last one (see [`history`]), as JSON text;
    /// the interval's counts start again from zero.
    pub(crate) fn history_point(&self) -> String {
        let tools = std::mem::take(&mut *self.inner.history.lock().unwrap_or_else(|p| p.into_inner()));
        let groups = self.inner.groups.lock().unwrap_or_else(|p| p.into_inner());
        let depth = groups.values().fold((0, 0), |(pending, lag), (p, l)| (pending + p, lag + l));
        drop(groups);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        history::point(
            now.as_millis() as u64,
            self.inner.in_flight_now.load(Ordering::Relaxed),
            depth,
            &tools,
        )
    }

    /// Counts one handled entry and its duration.
    ///
    /// A tool's labels (and their OTLP attributes, whose strings are shared) are made the first
    /// time it ends with an outcome; every later call only looks them up.
    pub fn invocation(&self, tool: &str, outcome: &str, duration: Duration) {
        let tool = if outcome == "unknown_tool" { UNKNOWN_TOOL_LABEL } else { tool };
        if let Some(error) = history::classify(outcome) {
            let mut history = self.inner.history.lock().unwrap_or_else(|p| p.into_inner());
            match history.get_mut(tool) {
                Some(interval) => interval.record(error, duration),
                None => history.entry(tool.to_owned()).or_default().record(error, duration),
            }
        }
        let mut invocations = self.inner.invocations.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !invocations.contains_key(tool) {
            let labels = vec![Label::new("tool", tool.to_owned())];
            let histogram = self.histogram(Key::from_parts(INVOCATION_DURATION, labels));
            invocations.insert(
                tool.to_owned(),
                ToolMetrics { duration: histogram, otlp_duration: None, outcomes: Vec::new() },
            );
        }
        let Some(metrics) = invocations.get_mut(tool) else { return };
        metrics.duration.record(duration.as_secs_f64());
        let at = match metrics.outcomes.iter().position(|(label, ..)| label == outcome) {
            Some(at) => at,
            None => {
                let labels =
                    vec![Label::new("tool", tool.to_owned()), Label::new("outcome", outcome.to_owned())];
                let counter = self.counter(Key::from_parts(INVOCATIONS, labels));
                let attributes = [
                    opentelemetry::KeyValue::new("gen_ai.tool.name", std::sync::Arc::<str>::from(tool)),
                    opentelemetry::KeyValue::new("toolhost.outcome", std::sync::Arc::<str>::from(outcome)),
                ];
                metrics.outcomes.push((outcome.to_owned(), counter, attributes, 0));
                metrics.outcomes.len() - 1
            }
        };
        let (_, counter, attributes, total) = &mut metrics.outcomes[at];
        counter.increment(1);
        *total += 1;
        if let Some(meters) = self.inner.meters.get() {
            metrics
                .otlp_duration
                .get_or_insert_with(|| meters.duration.bind(&attributes[..1]))
                .record(duration.as_secs_f64());
        }
    }

    /// Records the state of every tool source: `toolhost_source_up{source}` and the `/status`
    /// page's `sources`.
    ///
    /// Each source's details get `since`: when (RFC 3339) it last went up or down.
    pub fn set_sources(&self, sources: &[(String, bool)], mut details: serde_json::Value) {
        let mut since = self.inner.source_since.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (name, up) in sources {
            let labels = vec![Label::new("source", name.clone())];
            self.gauge(Key::from_parts(SOURCE_UP, labels)).set(if *up { 1.0 } else { 0.0 });
            match since.get_mut(name) {
                Some(known) if known.0 == *up => {}
                Some(known) => *known = (*up, toolhost_envelope::now_rfc3339()),
                None => {
                    since.insert(name.clone(), (*up, toolhost_envelope::now_rfc3339()));
                }
            }
        }
        for source in details.as_array_mut().into_iter().flatten() {
            let known =
                source.get("name").and_then(serde_json::Value::as_str).and_then(|name| since.get(name));
            if let Some((_, at)) = known {
                source["since"] = serde_json::json!(at);
            }
        }
        drop(since);
        let mut status = self.inner.status.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        status["sources"] = details;
    }

    /// Records the state of a door's own connection: the `/status` page's `doors.<door>`, and
    /// `down`, when set, as a reason the daemon is not ready.
    pub fn set_door(&self, door: &'static str, down: Option<&'static str>, details: serde_json::Value) {
        self.inner.doors_down.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(door, down);
        let mut status = self.inner.status.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        status["doors"][door] = details;
    }

    /// Records the fleet view: `toolhost_fleet_conflicts` and the `/status` page's `fleet`.
    pub fn set_fleet_conflicts(&self, conflicts: usize, fleet: serde_json::Value) {
        self.gauge(Key::from_static_name(FLEET_CONFLICTS)).set(conflicts as f64);
        let mut status = self.inner.status.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        status["fleet"] = fleet;
    }

    /// The tool sources' states, as the `/status` page shows them.
    pub fn sources(&self) -> serde_json::Value {
        let status = self.inner.status.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        status["sources"].clone()
    }

    /// The `/status` page: readiness and the tool sources.
    pub fn status(&self) -> serde_json::Value {
        let readiness = self.readiness();
        let mut status = self.inner.status.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        status["ready"] = serde_json::json!(readiness.is_ready());
        status["reasons"] = serde_json::json!(readiness.reasons);
        status
    }

    /// Counts a configuration reload, and whether it was refused.
    pub fn reloaded(&self, ok: bool) {
        if ok { &self.inner.reloads } else { &self.inner.reload_failures }.increment(1);
    }

    /// Counts an entry taken over from another consumer.
    pub fn reclaimed(&self) {
        self.inner.reclaims.increment(1);
    }

    /// Counts an entry delivered more than once.
    pub fn redelivered(&self) {
        self.inner.redeliveries.increment(1);
    }

    /// Counts a dead letter.
    pub fn dead_lettered(&self) {
        self.inner.dead_letters.increment(1);
    }

    /// Counts a running call until the guard drops.
    pub fn in_flight_guard(&self) -> InFlight {
        self.inner.in_flight.increment(1.0);
        self.inner.in_flight_now.fetch_add(1, Ordering::Relaxed);
        InFlight { telemetry: self.clone() }
    }

    /// Records the pending count and lag of a consumer group. An unknown lag is recorded as NaN,
    /// which Prometheus shows as such rather than as a made-up number.
    pub fn set_group(&self, stream: &str, group: &str, pending: u64, lag: Option<u64>) {
        let mut groups = self.inner.groups.lock().unwrap_or_else(|p| p.into_inner());
        groups.insert((stream.to_owned(), group.to_owned()), (pending, lag.unwrap_or(0)));
        drop(groups);
        let labels = || vec![Label::new("stream", stream.to_owned()), Label::new("group", group.to_owned())];
        self.gauge(Key::from_parts(GROUP_PENDING, labels())).set(pending as f64);
        self.gauge(Key::from_parts(GROUP_LAG, labels())).set(lag.map_or(f64::NAN, |lag| lag as f64));
    }

    /// Every metric in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        self.inner.handle.render()
    }

    /// Folds recorded histogram samples into their buckets, so memory stays bounded between
    /// scrapes. The probe calls it periodically.
    pub fn run_upkeep(&self) {
        self.inner.handle.run_upkeep();
    }

    fn counter(&self, key: Key) -> Counter {
        self.inner.recorder.register_counter(&key, &METADATA)
    }

    fn gauge(&self, key: Key) -> Gauge {
        self.inner.recorder.register_gauge(&key, &METADATA)
    }

    fn histogram(&self, key: Key) -> Histogram {
        self.inner.recorder.register_histogram(&key, &METADATA)
    }
}

/// The `# HELP` lines.
fn describe(recorder: &PrometheusRecorder) {
    let counters = [
        (INVOCATIONS, "Handled request entries, by tool and outcome."),
        (DEAD_LETTERS, "Entries moved to the dead-letter stream."),
        (RECLAIMS, "Entries taken over from another consumer after its lease lapsed."),
        (REDELIVERIES, "Handled entries that had been delivered before."),
        (REDIS_RECONNECTS, "Times Redis answered again after it had stopped answering."),
        (RELOADS, "Configuration reloads (SIGHUP) applied."),
        (RELOAD_FAILURES, "Configuration reloads (SIGHUP) refused; the old configuration keeps serving."),
        (SPANS_EXPORTED, "Spans the OTLP collector took."),
        (SPANS_DROPPED, "Spans dropped without waiting, by reason (queue_full, export_failed)."),
    ];
    for (name, help) in counters {
        recorder.describe_counter(name.into(), None, help.into());
    }
    let gauges = [
        (IN_FLIGHT, "Tool calls running now."),
        (GROUP_PENDING, "Entries delivered to a consumer group and not yet acknowledged."),
        (GROUP_LAG, "Entries of a stream not yet delivered to a consumer group (NaN when unknown)."),
        (REDIS_UP, "1 while Redis answers, 0 otherwise."),
        (BUILD_INFO, "Always 1; the version label names the running build."),
        (SOURCE_UP, "1 while a hosted tool source (an MCP server) is connected, 0 otherwise."),
        (FLEET_CONFLICTS, "Tool names served with different descriptions by different toolboxes."),
    ];
    for (name, help) in gauges {
        recorder.describe_gauge(name.into(), None, help.into());
    }
    recorder.describe_histogram(
        INVOCATION_DURATION.into(),
        Some(Unit::Seconds),
        "How long handling a request entry took, by tool.".into(),
    );
}

/// Decrements the in-flight count on drop.
pub struct InFlight {
    telemetry: Telemetry,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.telemetry.inner.in_flight.decrement(1.0);
        self.telemetry.inner.in_flight_now.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_doors_connection_shows_in_status_and_readiness() {
        let telemetry = Telemetry::new();
        telemetry.set_redis_up(true);
        telemetry.set_groups_ready(true);
        assert!(telemetry.readiness().is_ready());
        telemetry.set_door(
            "ovos",
            Some("the OVOS messagebus is not connected"),
            serde_json::json!({"connected": false}),
        );
        assert_eq!(telemetry.readiness().reasons, ["the OVOS messagebus is not connected"]);
        assert_eq!(telemetry.status()["doors"]["ovos"]["connected"], false);
        telemetry.set_door("ovos", None, serde_json::json!({"connected": true}));
        assert!(telemetry.readiness().is_ready());
        assert_eq!(telemetry.status()["doors"]["ovos"]["connected"], true);
    }

    #[test]
    fn invocations_are_counted_by_tool_and_outcome_with_buckets() {
        let telemetry = Telemetry::new();
        telemetry.invocation("echo", "success", Duration::from_millis(3));
        telemetry.invocation("echo", "invalid_arguments", Duration::from_millis(30));
        telemetry.invocation("no-such-tool-from-a-caller", "unknown_tool", Duration::from_millis(1));
        let text = telemetry.render();
        assert!(text.contains(r#"toolhost_invocations_total{tool="echo",outcome="success"} 1"#), "{text}");
        assert!(
            text.contains(r#"toolhost_invocations_total{tool="echo",outcome="invalid_arguments"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"toolhost_invocations_total{tool="_unknown",outcome="unknown_tool"} 1"#));
        assert!(!text.contains("no-such-tool-from-a-caller"), "{text}");
        assert!(text.contains(r#"toolhost_invocation_duration_seconds_bucket{tool="echo",le="0.005"} 1"#));
        assert!(text.contains(r#"toolhost_invocation_duration_seconds_bucket{tool="echo",le="+Inf"} 2"#));
        assert!(text.contains(r#"toolhost_invocation_duration_seconds_count{tool="echo"} 2"#));
        assert!(
            text.contains(&format!(r#"toolhost_build_info{{version="{}"}} 1"#, env!("CARGO_PKG_VERSION")))
        );
        assert!(text.contains("toolhost_dead_letters_total 0"), "{text}");
    }

    #[test]
    fn repeated_invocations_add_up_on_the_handles_looked_up_once() {
        let telemetry = Telemetry::new();
        for _ in 0..3 {
            telemetry.invocation("echo", "success", Duration::from_millis(3));
        }
        telemetry.invocation("echo", "timeout", Duration::from_millis(30));
        let text = telemetry.render();
        assert!(text.contains(r#"toolhost_invocations_total{tool="echo",outcome="success"} 3"#), "{text}");
        assert!(text.contains(r#"toolhost_invocations_total{tool="echo",outcome="timeout"} 1"#), "{text}");
        assert!(text.contains(r#"toolhost_invocation_duration_seconds_count{tool="echo"} 4"#), "{text}");
    }

    #[test]
    fn in_flight_follows_guards_and_groups_are_gauges() {
        let telemetry = Telemetry::new();
        let first = telemetry.in_flight_guard();
        let second = telemetry.in_flight_guard();
        assert!(telemetry.render().contains("toolhost_in_flight 2"));
        drop((first, second));
        assert!(telemetry.render().contains("toolhost_in_flight 0"));
        telemetry.set_group("action-requests", "toolhost", 3, Some(7));
        let text = telemetry.render();
        assert!(text.contains(r#"toolhost_group_pending{stream="action-requests",group="toolhost"} 3"#));
        assert!(text.contains(r#"toolhost_group_lag{stream="action-requests",group="toolhost"} 7"#));
    }

    #[test]
    fn reconnects_count_recoveries_only() {
        let telemetry = Telemetry::new();
        telemetry.set_redis_up(true);
        telemetry.set_redis_up(true);
        assert!(telemetry.render().contains("toolhost_redis_reconnects_total 0"));
        telemetry.set_redis_up(false);
        telemetry.set_redis_up(false);
        telemetry.set_redis_up(true);
        assert!(telemetry.render().contains("toolhost_redis_reconnects_total 1"));
        assert!(telemetry.render().contains("toolhost_redis_up 1"));
    }

    #[test]
    fn readiness_names_every_reason() {
        let telemetry = Telemetry::new();
        assert_eq!(
            telemetry.readiness().reasons,
            ["redis does not answer", "the consumer groups do not exist"]
        );
        telemetry.set_redis_up(true);
        telemetry.set_groups_ready(true);
        telemetry.probed();
        assert!(telemetry.readiness().is_ready());
        telemetry.set_draining();
        assert_eq!(telemetry.readiness().reasons, ["shutting down"]);
    }
}
