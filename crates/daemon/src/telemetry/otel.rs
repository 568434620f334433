//! The OpenTelemetry pipeline: a bounded queue of finished spans in front of the OTLP export.
//!
//! toolhost makes its spans itself ([`super::spans`]) rather than through the SDK's tracer: a
//! call's span ids are chosen at admission, its sampling decision too, and its spans are
//! offered to the queue together when it ends; the SDK's per-span machinery (a context and a
//! locked span per span, its sampler, its processor chain, its `SpanData`) cost more than the
//! rest of an echo call (docs/PERFORMANCE.md, "Telemetry").
//!
//! Over OTLP/HTTP (`http/protobuf`) toolhost also encodes the request itself ([`super::otlp`])
//! and posts it with the daemon's reqwest client, one attempt bounded by the export timeout,
//! with the configured headers. A sampled call's spans come already encoded, written where each
//! ended ([`SpanQueue::offer_encoded`]), and are copied into the body of the batch being filled;
//! a door's span is encoded when it is offered ([`SpanQueue::offer`]). The export task only
//! writes a full batch's head and posts it. Over gRPC the queue keeps the spans as structs, and
//! the export task turns a batch into the SDK's `SpanData` for the `opentelemetry-otlp` tonic
//! exporter: that path is kept for its connection handling, and costs the conversion the HTTP
//! path saves.
//!
//! A span that ends is offered to the queue and never waited for: when the queue is full (the
//! collector is slow or down) it is dropped and counted
//! (`toolhost_telemetry_spans_dropped_total{reason="queue_full"}`); a call's spans are offered
//! together, so they are queued or dropped together. The queue holds batches: full ones
//! (`max_export_batch_size` spans) and the one being filled. One task, on the calls' runtime, is
//! woken when a batch is full and exports the full ones; every `schedule_delay_ms` (and when the
//! pipeline stops) it exports the one being filled too. Exports run one at a time, each bounded
//! by the export timeout; a batch the collector does not take is dropped and counted
//! (`reason="export_failed"`), never retried, so an outage costs memory of one queue at most.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use metrics::Counter;
use opentelemetry::InstrumentationScope;
use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use opentelemetry_otlp::{
    Protocol as OtlpProtocol, WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::otlp::{Body, Encoder};
use super::settings::{Export, Protocol, Settings};
use super::spans::{Attribute, Span, Status, Value};

/// The instrumentation scope of toolhost's spans.
const SCOPE: &str = "toolhost";

/// What the pipeline counts, registered on the Prometheus recorder by [`super::Telemetry`].
#[derive(Clone)]
pub(crate) struct ExportCounters {
    /// Spans the collector took.
    pub exported: Counter,
    /// Spans dropped because the queue was full.
    pub dropped_queue_full: Counter,
    /// Spans dropped because their batch's export failed or timed out.
    pub dropped_export_failed: Counter,
}

impl std::fmt::Debug for ExportCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportCounters").finish_non_exhaustive()
    }
}

/// Where finished spans go: the export queue, offered to and never waited on.
pub(crate) struct SpanQueue {
    held: Mutex<Held>,
    /// Encodes offered spans for OTLP/HTTP; `None` over gRPC, where they are kept as they are.
    encoder: Option<Arc<Encoder>>,
    dropped: Counter,
    /// `max_queue_size`, in spans.
    capacity: usize,
    /// `max_export_batch_size`.
    batch: usize,
    /// Wakes the export task: a batch is full.
    full: Notify,
}

/// What the queue holds.
#[derive(Default)]
struct Held {
    /// Batches of `max_export_batch_size` spans, oldest first.
    full: VecDeque<Batch>,
    /// The batch being filled.
    filling: Option<Batch>,
    /// Spans held, in every batch.
    spans: usize,
    /// The size of the last full batch's body: a new one is made that large.
    body_size: usize,
    /// The pipeline stopped: spans are refused.
    closed: bool,
}

/// The spans of one export.
#[derive(Debug)]
pub(crate) enum Batch {
    /// Encoded as they were offered (OTLP/HTTP).
    Encoded(Body),
    /// As they are, for the gRPC exporter.
    Spans(Vec<Span>),
}

impl Batch {
    fn len(&self) -> usize {
        match self {
            Batch::Encoded(body) => body.spans(),
            Batch::Spans(spans) => spans.len(),
        }
    }
}

impl SpanQueue {
    /// An empty queue of `export`'s bounds, encoding what it takes with `encoder` when given.
    fn new(export: &Export, encoder: Option<Arc<Encoder>>, dropped: Counter) -> SpanQueue {
        SpanQueue {
            held: Mutex::new(Held::default()),
            encoder,
            dropped,
            capacity: export.max_queue_size,
            // As the SDK's batch processor does: a batch is never larger than the queue, which
            // could then never fill one.
            batch: export.max_export_batch_size.min(export.max_queue_size).max(1),
            full: Notify::new(),
        }
    }

    /// Whether it takes a call's spans encoded ([`SpanQueue::offer_encoded`]): for OTLP/HTTP.
    pub(crate) fn encodes(&self) -> bool {
        self.encoder.is_some()
    }

    /// Takes room for `count` spans, or drops them (counted while the pipeline runs) when the
    /// queue has no room for them all or the pipeline stopped: `None` then.
    fn admit(&self, count: usize) -> Option<std::sync::MutexGuard<'_, Held>> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.closed {
            return None;
        }
        if held.spans + count > self.capacity {
            drop(held);
            self.dropped.increment(count as u64);
            return None;
        }
        held.spans += count;
        Some(held)
    }

    /// The batch being filled, made when there is none.
    fn filling<'h>(&self, held: &'h mut Held) -> &'h mut Batch {
        let body_size = held.body_size;
        held.filling.get_or_insert_with(|| match &self.encoder {
            Some(encoder) => Batch::Encoded(encoder.body(body_size)),
            None => Batch::Spans(Vec::with_capacity(self.batch)),
        })
    }

    /// Moves the batch being filled to the full ones when it holds a batch's worth: `true` then.
    fn full_now(&self, held: &mut Held) -> bool {
        let Some(batch) = held.filling.take_if(|batch| batch.len() >= self.batch) else { return false };
        if let Batch::Encoded(body) = &batch {
            held.body_size = body.size();
        }
        held.full.push_back(batch);
        true
    }

    /// Offers finished spans (a call's, together); when the queue has no room for them all (or
    /// the pipeline stopped) they are dropped, and counted while the pipeline runs.
    pub(crate) fn offer(&self, spans: Vec<Span>) {
        let Some(mut held) = self.admit(spans.len()) else { return };
        let mut filled = false;
        for span in spans {
            match self.filling(&mut held) {
                Batch::Encoded(body) => body.push(&span.as_ref()),
                Batch::Spans(spans) => spans.push(span),
            }
            filled |= self.full_now(&mut held);
        }
        drop(held);
        if filled {
            self.full.notify_one();
        }
    }

    /// Offers `count` finished spans (a call's) that [`super::otlp::push_span`] wrote into
    /// `bytes`, as [`SpanQueue::offer`] does: they join the batch being filled, the first of them
    /// completing it and the rest starting the next when they do not all fit.
    pub(crate) fn offer_encoded(&self, bytes: &[u8], count: usize) {
        let Some(mut held) = self.admit(count) else { return };
        let (mut rest, mut left, mut filled) = (bytes, count, false);
        while left > 0 {
            // A call's spans are offered encoded only to a queue with an encoder
            // (`CallSpan::start` asks `encodes`), whose batches are all encoded.
            let Batch::Encoded(body) = self.filling(&mut held) else {
                unreachable!("a queue that encodes fills encoded batches")
            };
            let taken = left.min(self.batch - body.spans());
            let at = if taken == left { rest.len() } else { super::otlp::spans_end(rest, taken) };
            body.extend(&rest[..at], taken);
            (rest, left) = (&rest[at..], left - taken);
            filled |= self.full_now(&mut held);
        }
        drop(held);
        if filled {
            self.full.notify_one();
        }
    }

    /// The oldest full batch, or with `partial` the one being filled when none is full.
    fn take(&self, partial: bool) -> Option<Batch> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let batch = match held.full.pop_front() {
            Some(batch) => batch,
            None if partial => held.filling.take()?,
            None => return None,
        };
        held.spans -= batch.len();
        Some(batch)
    }

    /// Refuses spans from now on.
    fn close(&self) {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).closed = true;
    }

    /// Spans in the queue.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).spans
    }
}

/// A running pipeline: the queue the lifecycle offers spans to, and the export task.
pub(crate) struct Pipeline {
    /// Takes finished spans; shared by every sampled call's span.
    pub spans: Arc<SpanQueue>,
    stop: CancellationToken,
    /// Told when the export thread has exported what the queue held at shutdown.
    export: std::sync::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline").finish_non_exhaustive()
    }
}

impl Pipeline {
    /// Builds the exporter and starts the export task on the current runtime; `None` when
    /// `settings` export nothing.
    ///
    /// # Errors
    /// The exporter cannot be built (a bad endpoint or header, the HTTP client's TLS setup).
    pub(crate) fn start(settings: &Settings, counters: ExportCounters) -> anyhow::Result<Option<Pipeline>> {
        let Some(export) = &settings.export else { return Ok(None) };
        let resource = Resource::builder().with_service_name(settings.service_name.clone()).build();
        let exporter = SpanExport::new(export, &resource)?;
        let stop = CancellationToken::new();
        let spans = Arc::new(SpanQueue::new(export, exporter.encoder(), counters.dropped_queue_full.clone()));
        // The export is one task among the calls, on their runtime: the spans are encoded where
        // they end, so what is left to it is the post, which waits for the collector without
        // holding a thread. On a thread of its own each post cost that thread two wake-ups (the
        // batch that filled, the collector's answer), each a switch between threads the call
        // workers paid for in CPU (docs/PERFORMANCE.md, telemetry round 8).
        let (done, exported) = tokio::sync::oneshot::channel();
        let export_loop =
            export_loop(spans.clone(), exporter, export.clone(), counters.clone(), stop.clone());
        tokio::spawn(async move {
            export_loop.await;
            let _ = done.send(());
        });
        Ok(Some(Pipeline { spans, stop, export: std::sync::Mutex::new(Some(exported)) }))
    }

    /// Stops taking spans and exports what the queue holds, for at most `grace`.
    pub(crate) async fn shutdown(&self, grace: Duration) {
        // The export task closes the queue (later spans are refused) and drains it.
        self.stop.cancel();
        let exported = self.export.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(exported) = exported {
            let _ = tokio::time::timeout(grace, exported).await;
        }
    }
}

/// How a batch of spans leaves the process.
enum SpanExport {
    /// OTLP/HTTP: toolhost's own encoding, posted with the daemon's reqwest client.
    Http {
        client: reqwest::Client,
        endpoint: reqwest::Url,
        headers: reqwest::header::HeaderMap,
        encoder: Arc<Encoder>,
    },
    /// OTLP/gRPC: the SDK's tonic exporter, given the SDK's `SpanData`.
    Grpc { exporter: Box<opentelemetry_otlp::SpanExporter>, scope: InstrumentationScope },
}

impl SpanExport {
    /// The export of `export`, built from the settings alone: every value the crate would
    /// otherwise read from `OTEL_*` variables is given explicitly.
    fn new(export: &Export, resource: &Resource) -> anyhow::Result<SpanExport> {
        match export.protocol {
            Protocol::HttpProtobuf => {
                let client = toolhost_tools::sources::http::client().map_err(anyhow::Error::msg)?;
                let endpoint = reqwest::Url::parse(&export.traces_endpoint).map_err(|err| {
                    anyhow::anyhow!(
                        "telemetry: the traces endpoint '{}' is not a URL: {err}",
                        export.traces_endpoint
                    )
                })?;
                Ok(SpanExport::Http {
                    client,
                    endpoint,
                    headers: http_headers(&export.headers)?,
                    encoder: Arc::new(Encoder::new(&resource_attributes(resource), SCOPE)),
                })
            }
            Protocol::Grpc => {
                let mut metadata = tonic_metadata(&export.headers)?;
                metadata.insert("user-agent", concat!("toolhost/", env!("CARGO_PKG_VERSION")).parse()?);
                let mut exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_protocol(OtlpProtocol::Grpc)
                    .with_endpoint(export.traces_endpoint.clone())
                    .with_timeout(export.timeout)
                    .with_metadata(metadata)
                    .build()?;
                opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, resource);
                Ok(SpanExport::Grpc {
                    exporter: Box::new(exporter),
                    scope: InstrumentationScope::builder(SCOPE).build(),
                })
            }
        }
    }

    /// The encoder the queue encodes spans with: OTLP/HTTP's.
    fn encoder(&self) -> Option<Arc<Encoder>> {
        match self {
            SpanExport::Http { encoder, .. } => Some(encoder.clone()),
            SpanExport::Grpc { .. } => None,
        }
    }

    /// Exports one batch; the error says why the collector did not take it.
    async fn export(&mut self, batch: Batch, timeout: Duration) -> Result<(), String> {
        match (self, batch) {
            (SpanExport::Http { client, endpoint, headers, encoder }, Batch::Encoded(body)) => {
                let body = encoder.finish(body);
                let response = client
                    .post(endpoint.clone())
                    .headers(headers.clone())
                    .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
                    .timeout(timeout)
                    .body(body)
                    .send()
                    .await
                    .map_err(|err| err.without_url().to_string())?;
                let status = response.status();
                // Read to the end, so the connection is kept for the next batch.
                let _ = response.bytes().await;
                if status.is_success() { Ok(()) } else { Err(format!("the collector answered {status}")) }
            }
            (SpanExport::Grpc { exporter, scope }, Batch::Spans(spans)) => {
                let spans = spans.into_iter().map(|span| span_data(span, scope)).collect();
                exporter.export(spans).await.map_err(|err| err.to_string())
            }
            (_, batch) => Err(format!("a batch of {} spans held for the other protocol", batch.len())),
        }
    }
}

/// The attributes of the resource every span is exported with (the service name, the SDK's
/// `telemetry.sdk.*`, `OTEL_RESOURCE_ATTRIBUTES`), in the resource's order.
pub(crate) fn resource_attributes(resource: &Resource) -> Vec<Attribute> {
    resource
        .iter()
        .map(|(key, value)| Attribute::from(opentelemetry::KeyValue::new(key.clone(), value.clone())))
        .collect()
}

/// The HTTP headers of the export headers.
fn http_headers(headers: &[(String, String)]) -> anyhow::Result<reqwest::header::HeaderMap> {
    let mut map = reqwest::header::HeaderMap::new();
    for (name, value) in headers {
        let key = reqwest::header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            anyhow::anyhow!("telemetry.otlp_headers: '{name}' is not a valid HTTP header name")
        })?;
        let value = reqwest::header::HeaderValue::from_str(value).map_err(|_| {
            anyhow::anyhow!("telemetry.otlp_headers: the value of '{name}' is not a valid HTTP header value")
        })?;
        map.insert(key, value);
    }
    Ok(map)
}

/// The gRPC metadata of the export headers.
pub(crate) fn tonic_metadata(headers: &[(String, String)]) -> anyhow::Result<tonic::metadata::MetadataMap> {
    let mut metadata = tonic::metadata::MetadataMap::new();
    for (name, value) in headers {
        let key =
            tonic::metadata::MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes()).map_err(|_| {
                anyhow::anyhow!("telemetry.otlp_headers: '{name}' is not a valid gRPC metadata name")
            })?;
        let value = value.parse().map_err(|_| {
            anyhow::anyhow!("telemetry.otlp_headers: the value of '{name}' is not valid metadata")
        })?;
        metadata.insert(key, value);
    }
    Ok(metadata)
}

/// A time OTLP counts in nanoseconds since the Unix epoch.
fn system_time(nanos: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos)
}

fn parsed_state(state: Option<&Arc<str>>) -> TraceState {
    state.and_then(|state| state.parse().ok()).unwrap_or_default()
}

/// The API's attribute of `attribute`.
fn key_value(attribute: Attribute) -> opentelemetry::KeyValue {
    let value = match attribute.value {
        Value::Static(text) => opentelemetry::Value::from(text),
        Value::Text(text) => opentelemetry::Value::from(text),
        Value::Int(value) => opentelemetry::Value::I64(value),
        Value::Bool(value) => opentelemetry::Value::Bool(value),
        Value::Double(value) => opentelemetry::Value::F64(value),
        Value::Array(array) => opentelemetry::Value::Array(array),
    };
    opentelemetry::KeyValue::new(attribute.key, value)
}

/// The SDK's `SpanData` of a span, for the SDK's gRPC exporter (and the encoder's tests).
pub(crate) fn span_data(span: Span, scope: &InstrumentationScope) -> SpanData {
    let context = SpanContext::new(
        TraceId::from_bytes(span.trace_id),
        SpanId::from_bytes(span.span_id),
        TraceFlags::new(span.flags),
        false,
        parsed_state(span.trace_state.as_ref()),
    );
    let mut events = SpanEvents::default();
    events.events = span
        .events
        .into_iter()
        .map(|event| {
            opentelemetry::trace::Event::new(
                event.name,
                system_time(event.time),
                event.attributes.into_iter().map(key_value).collect(),
                0,
            )
        })
        .collect();
    let mut links = SpanLinks::default();
    links.links = span
        .link
        .into_iter()
        .map(|link| {
            opentelemetry::trace::Link::with_context(SpanContext::new(
                TraceId::from_bytes(link.trace_id),
                SpanId::from_bytes(link.span_id),
                TraceFlags::new(link.flags),
                link.remote,
                parsed_state(link.trace_state.as_ref()),
            ))
        })
        .collect();
    SpanData {
        span_context: context,
        parent_span_id: span.parent.map_or(SpanId::INVALID, SpanId::from_bytes),
        parent_span_is_remote: span.parent_remote,
        span_kind: span.kind,
        name: span.name,
        start_time: system_time(span.start),
        end_time: system_time(span.end),
        attributes: span
            .shared
            .into_iter()
            .flat_map(|shared| shared.attributes.iter().cloned())
            .chain(span.attributes)
            .map(key_value)
            .collect(),
        dropped_attributes_count: 0,
        events,
        links,
        status: match span.status {
            Status::Unset => opentelemetry::trace::Status::Unset,
            Status::Error(description) => opentelemetry::trace::Status::error(description),
        },
        instrumentation_scope: scope.clone(),
    }
}

/// Exports the queue's batches, until `stop` closes the queue and it is empty. It wakes when a
/// batch is full, and exports the full ones; every `schedule_delay`, and when stopped, it exports
/// the one being filled too. It is never woken for a single span: a span offered costs its
/// sender no wake-up of this task.
async fn export_loop(
    queue: Arc<SpanQueue>,
    mut exporter: SpanExport,
    export: Export,
    counters: ExportCounters,
    stop: CancellationToken,
) {
    let mut failing = false;
    loop {
        let (stopping, partial) = tokio::select! {
            biased;
            () = stop.cancelled() => (true, true),
            () = queue.full.notified() => (false, false),
            () = tokio::time::sleep(export.schedule_delay) => (false, true),
        };
        if stopping {
            // Later spans are refused; what the queue holds is still exported.
            queue.close();
        }
        while let Some(batch) = queue.take(partial) {
            export_batch(&mut exporter, batch, &export, &counters, &mut failing).await;
        }
        if stopping {
            break;
        }
    }
}

/// Exports one batch, counting it as exported or dropped; `failing` keeps one warning per
/// outage.
async fn export_batch(
    exporter: &mut SpanExport,
    batch: Batch,
    export: &Export,
    counters: &ExportCounters,
    failing: &mut bool,
) {
    let count = batch.len() as u64;
    // The request's own timeout bounds the post; this bounds everything else.
    let result =
        tokio::time::timeout(export.timeout + Duration::from_secs(1), exporter.export(batch, export.timeout))
            .await;
    match result {
        Ok(Ok(())) => {
            counters.exported.increment(count);
            *failing = false;
        }
        Ok(Err(err)) => {
            counters.dropped_export_failed.increment(count);
            if !*failing {
                warn!(error = %err, spans = count, "cannot export spans; dropped (counted until the collector takes them again)");
            }
            *failing = true;
        }
        Err(_) => {
            counters.dropped_export_failed.increment(count);
            if !*failing {
                warn!(spans = count, "exporting spans timed out; dropped");
            }
            *failing = true;
        }
    }
}

/// A random span id, never all zero, from the thread's fast generator (the SDK's own way): a
/// child span's id, which nothing else needs to know before the span exists.
pub(crate) fn new_span_id() -> [u8; 8] {
    thread_local! {
        static IDS: opentelemetry_sdk::trace::RandomIdGenerator = opentelemetry_sdk::trace::RandomIdGenerator::default();
    }
    loop {
        let id = IDS.with(opentelemetry_sdk::trace::IdGenerator::new_span_id);
        if id != SpanId::INVALID {
            return id.to_bytes();
        }
    }
}

/// The metrics toolhost exports over OTLP, beside the Prometheus endpoint, collected every
/// `metrics_interval_ms` by one task. The histograms are recorded where the Prometheus ones are;
/// the counts (`toolhost.invocations`, `toolhost.in_flight`) are read from toolhost's own when
/// they are collected ([`Observed`]), so a call does not pay for them twice.
pub(crate) struct Meters {
    /// `toolhost.invocation.duration` (s), by `gen_ai.tool.name`.
    pub duration: opentelemetry::metrics::Histogram<f64>,
    /// `mcp.server.operation.duration` (s), the MCP conventions' metric, recorded by the MCP
    /// door for every `tools/call` (`mcp.method.name`, `gen_ai.tool.name`, `error.type`).
    pub mcp_operation: opentelemetry::metrics::Histogram<f64>,
    provider: opentelemetry_sdk::metrics::SdkMeterProvider,
    export: std::sync::Mutex<Option<JoinHandle<()>>>,
}

/// The counts the OTLP metrics read when they are collected.
pub(crate) struct Observed {
    /// Tool calls running now (`toolhost.in_flight`).
    pub in_flight: Box<dyn Fn() -> i64 + Send + Sync>,
    /// Calls each handled entry's total to `observe` with its attributes (`gen_ai.tool.name`,
    /// `toolhost.outcome`): `toolhost.invocations`.
    #[allow(clippy::type_complexity)]
    pub invocations: Box<dyn Fn(&mut dyn FnMut(u64, &[opentelemetry::KeyValue])) + Send + Sync>,
}

/// Buckets of the duration histograms, in seconds (the Prometheus histogram's).
const BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The SDK's manual reader, shared by the meter provider (which registers its pipeline) and the
/// export task (which collects from it).
#[derive(Debug, Clone)]
struct SharedReader(std::sync::Arc<opentelemetry_sdk::metrics::ManualReader>);

impl opentelemetry_sdk::metrics::reader::MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: std::sync::Weak<opentelemetry_sdk::metrics::Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, metrics: &mut opentelemetry_sdk::metrics::data::ResourceMetrics) -> OTelSdkResult {
        self.0.collect(metrics)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(
        &self,
        kind: opentelemetry_sdk::metrics::InstrumentKind,
    ) -> opentelemetry_sdk::metrics::Temporality {
        self.0.temporality(kind)
    }
}

impl Meters {
    /// Builds the metric exporter and starts the export task on the current runtime; `None`
    /// when `settings` export no metrics.
    ///
    /// # Errors
    /// The exporter cannot be built.
    pub(crate) fn start(settings: &Settings, observed: Observed) -> anyhow::Result<Option<Meters>> {
        use opentelemetry::metrics::MeterProvider as _;
        let Some(export) = &settings.export else { return Ok(None) };
        let Some(interval) = export.metrics_interval else { return Ok(None) };
        let exporter = metric_exporter(export)?;
        let reader =
            SharedReader(std::sync::Arc::new(opentelemetry_sdk::metrics::ManualReader::builder().build()));
        let resource = Resource::builder().with_service_name(settings.service_name.clone()).build();
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(reader.clone())
            .with_resource(resource.clone())
            .build();
        let meter = provider.meter(SCOPE);
        let Observed { in_flight, invocations } = observed;
        // The SDK keeps the callbacks with its pipeline; the instruments' handles are markers.
        meter
            .u64_observable_counter("toolhost.invocations")
            .with_description("Handled request entries, by tool and outcome.")
            .with_callback(move |observer| {
                invocations(&mut |total, attributes| observer.observe(total, attributes))
            })
            .build();
        meter
            .i64_observable_up_down_counter("toolhost.in_flight")
            .with_description("Tool calls running now.")
            .with_callback(move |observer| observer.observe(in_flight(), &[]))
            .build();
        let meters = Meters {
            duration: meter
                .f64_histogram("toolhost.invocation.duration")
                .with_unit("s")
                .with_description("How long handling a request entry took, by tool.")
                .with_boundaries(BUCKETS.to_vec())
                .build(),
            mcp_operation: meter
                .f64_histogram("mcp.server.operation.duration")
                .with_unit("s")
                .with_description("How long the MCP door took to answer a request, by method and tool.")
                .with_boundaries(BUCKETS.to_vec())
                .build(),
            provider,
            export: std::sync::Mutex::new(None),
        };
        let task = tokio::spawn(metrics_loop(reader, exporter, resource, interval, export.timeout));
        *meters.export.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(task);
        Ok(Some(meters))
    }

    /// Stops the export task (the last interval's metrics are not sent).
    pub(crate) fn shutdown(&self) {
        let task = self.export.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(task) = task {
            task.abort();
        }
        let _ = self.provider.shutdown();
    }
}

/// The OTLP metric exporter of `export`, built from the settings alone.
fn metric_exporter(export: &Export) -> anyhow::Result<opentelemetry_otlp::MetricExporter> {
    let exporter = match export.protocol {
        Protocol::HttpProtobuf => {
            let client = toolhost_tools::sources::http::client().map_err(anyhow::Error::msg)?;
            opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_http_client(client)
                .with_protocol(OtlpProtocol::HttpBinary)
                .with_endpoint(export.metrics_endpoint.clone())
                .with_timeout(export.timeout)
                .with_headers(export.headers.iter().cloned().collect())
                .build()?
        }
        Protocol::Grpc => opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_protocol(OtlpProtocol::Grpc)
            .with_endpoint(export.metrics_endpoint.clone())
            .with_timeout(export.timeout)
            .with_metadata(tonic_metadata(&export.headers)?)
            .build()?,
    };
    Ok(exporter)
}

/// Collects and exports the metrics every `interval`; a failed export is logged once per
/// outage and skipped (the next one carries the cumulative values).
async fn metrics_loop(
    reader: SharedReader,
    exporter: opentelemetry_otlp::MetricExporter,
    resource: Resource,
    interval: Duration,
    timeout: Duration,
) {
    use opentelemetry_sdk::metrics::exporter::PushMetricExporter as _;
    use opentelemetry_sdk::metrics::reader::MetricReader as _;
    let _ = resource;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        ticks.tick().await;
        let mut metrics = opentelemetry_sdk::metrics::data::ResourceMetrics::default();
        if reader.collect(&mut metrics).is_err() {
            continue;
        }
        let result = tokio::time::timeout(timeout + Duration::from_secs(1), exporter.export(&metrics)).await;
        match result {
            Ok(Ok(())) => failing = false,
            Ok(Err(err)) => {
                if !failing {
                    warn!(error = %err, "cannot export metrics; skipped until the collector takes them again");
                }
                failing = true;
            }
            Err(_) => {
                if !failing {
                    warn!("exporting metrics timed out; skipped");
                }
                failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use opentelemetry::trace::SpanKind;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::{Batch, ExportCounters, SpanExport, SpanQueue, export_loop};
    use crate::telemetry::settings::{Export, Protocol};
    use crate::telemetry::spans::{Span, Status, attr};

    /// One request as a collector on a local port saw it: its head (request line and headers,
    /// lower-cased) and its body; the collector answers `status`.
    async fn collect_one(listener: tokio::net::TcpListener, status: &str) -> (String, Vec<u8>) {
        let (mut stream, _) = listener.accept().await.unwrap();
        answer_one(&mut stream, status).await
    }

    /// Reads one request from `stream` and answers it with `status`.
    async fn answer_one(stream: &mut tokio::net::TcpStream, status: &str) -> (String, Vec<u8>) {
        let mut received = Vec::new();
        let mut chunk = [0_u8; 4096];
        let head_end = loop {
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the connection closed before the request's head");
            received.extend_from_slice(&chunk[..n]);
            if let Some(at) = received.windows(4).position(|window| window == b"\r\n\r\n") {
                break at + 4;
            }
        };
        let head = String::from_utf8(received[..head_end].to_vec()).unwrap().to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .map(|value| value.trim().parse().unwrap())
            .expect("a content-length");
        while received.len() < head_end + length {
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the connection closed before the request's body");
            received.extend_from_slice(&chunk[..n]);
        }
        let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
        stream.write_all(answer.as_bytes()).await.unwrap();
        (head, received[head_end..].to_vec())
    }

    fn export_to(endpoint: String) -> Export {
        Export {
            protocol: Protocol::HttpProtobuf,
            traces_endpoint: endpoint,
            metrics_endpoint: String::new(),
            headers: vec![("X-Tenant".to_owned(), "team a".to_owned())],
            timeout: Duration::from_secs(5),
            max_queue_size: 16,
            max_export_batch_size: 8,
            schedule_delay: Duration::from_millis(100),
            metrics_interval: None,
        }
    }

    fn one_span() -> Span {
        Span {
            trace_id: [7; 16],
            span_id: [8; 8],
            parent: None,
            parent_remote: false,
            flags: 1,
            trace_state: None,
            kind: SpanKind::Internal,
            name: Cow::Borrowed("admit"),
            start: 1,
            end: 2,
            shared: None,
            attributes: vec![attr("toolhost.door", "requests")],
            events: Vec::new(),
            link: None,
            status: Status::Unset,
        }
    }

    #[tokio::test]
    async fn a_batch_is_posted_as_protobuf_with_the_configured_headers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        let resource = opentelemetry_sdk::Resource::builder().with_service_name("toolhost-test").build();
        let mut exporter = SpanExport::new(&export_to(endpoint), &resource).unwrap();
        let collector = tokio::spawn(collect_one(listener, "200 OK"));
        let mut body = exporter.encoder().unwrap().body(0);
        body.push(&one_span().as_ref());
        body.push(&one_span().as_ref());
        exporter.export(Batch::Encoded(body), Duration::from_secs(5)).await.unwrap();
        let (head, body) = collector.await.unwrap();
        assert!(head.starts_with("post /v1/traces http/1.1\r\n"), "{head}");
        assert!(head.contains("\r\ncontent-type: application/x-protobuf\r\n"), "{head}");
        assert!(head.contains("\r\nx-tenant: team a\r\n"), "{head}");
        let request = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        let spans = &request.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].name, "admit");
    }

    /// The span ids of one export request's spans.
    fn span_ids(body: &[u8]) -> Vec<u8> {
        let request = ExportTraceServiceRequest::decode(body).unwrap();
        request.resource_spans[0].scope_spans[0].spans.iter().map(|span| span.span_id[0]).collect()
    }

    /// How a test offers a call's spans: as spans, or encoded first as a sampled call's are.
    #[derive(Clone, Copy)]
    enum Offered {
        Spans,
        Encoded,
    }

    impl Offered {
        fn offer(self, queue: &SpanQueue, spans: Vec<Span>) {
            match self {
                Offered::Spans => queue.offer(spans),
                Offered::Encoded => {
                    let mut bytes = Vec::new();
                    for span in &spans {
                        crate::telemetry::otlp::push_span(&span.as_ref(), &mut bytes);
                    }
                    queue.offer_encoded(&bytes, spans.len());
                }
            }
        }
    }

    async fn a_calls_spans_are_queued_together_and_batches_keep_their_size(offered: Offered) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut export = export_to(format!("http://{}/v1/traces", listener.local_addr().unwrap()));
        (export.max_queue_size, export.max_export_batch_size) = (7, 3);
        export.schedule_delay = Duration::from_secs(60);
        let resource = opentelemetry_sdk::Resource::builder().build();
        let exporter = SpanExport::new(&export, &resource).unwrap();
        let queue = Arc::new(SpanQueue::new(&export, exporter.encoder(), metrics::Counter::noop()));
        let counters = ExportCounters {
            exported: metrics::Counter::noop(),
            dropped_queue_full: metrics::Counter::noop(),
            dropped_export_failed: metrics::Counter::noop(),
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(export_loop(queue.clone(), exporter, export, counters, stop.clone()));
        // A span long enough that its length takes two bytes.
        let span = |id: u8| Span {
            span_id: [id; 8],
            attributes: vec![attr("toolhost.note", "n".repeat(usize::from(id) * 40))],
            ..one_span()
        };
        // More than the queue holds is refused whole: none of a call's spans is queued.
        offered.offer(&queue, (10..18).map(span).collect());
        assert_eq!(queue.waiting(), 0);
        // A call of two spans, then one of four: the first batch is full at three (the second
        // call's first span), the next at the call's next three, which leave none over.
        offered.offer(&queue, vec![span(1), span(2)]);
        offered.offer(&queue, vec![span(3), span(4), span(5), span(6)]);
        let (mut stream, _) = listener.accept().await.unwrap();
        let (_, first) = answer_one(&mut stream, "200 OK").await;
        assert_eq!(span_ids(&first), [1, 2, 3]);
        let (_, second) = answer_one(&mut stream, "200 OK").await;
        assert_eq!(span_ids(&second), [4, 5, 6]);
        assert_eq!(queue.waiting(), 0);
        offered.offer(&queue, vec![span(7)]);
        stop.cancel();
        // What was filling is sent when the pipeline stops.
        let (_, third) = answer_one(&mut stream, "200 OK").await;
        assert_eq!(span_ids(&third), [7]);
        task.await.unwrap();
        assert_eq!(queue.waiting(), 0);
        // Once stopped, nothing more is taken.
        offered.offer(&queue, vec![span(8)]);
        assert_eq!(queue.waiting(), 0);
    }

    #[tokio::test]
    async fn a_calls_spans_are_queued_together_and_batches_keep_their_size_when_offered_as_spans() {
        a_calls_spans_are_queued_together_and_batches_keep_their_size(Offered::Spans).await;
    }

    #[tokio::test]
    async fn a_calls_spans_are_queued_together_and_batches_keep_their_size_when_offered_encoded() {
        a_calls_spans_are_queued_together_and_batches_keep_their_size(Offered::Encoded).await;
    }

    /// The spans of one sampled call, made through a queue: as OTLP/HTTP exports them (encoded
    /// when offered) or as gRPC's exporter takes them, decoded with the times and the child ids
    /// left out.
    fn call_spans(encodes: bool) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
        use crate::telemetry::spans::{CallSpan, Delivery, call_names};
        let export = export_to("http://127.0.0.1:4318/v1/traces".to_owned());
        let resource = opentelemetry_sdk::Resource::builder().build();
        let encoder = SpanExport::new(&export, &resource).unwrap().encoder().unwrap();
        let queue = SpanQueue::new(&export, encodes.then(|| encoder.clone()), metrics::Counter::noop());
        let trace = toolhost_envelope::CallTrace {
            context: toolhost_envelope::TraceParent { trace_id: [3; 16], span_id: [4; 8], flags: 1 },
            parent: Some([5; 8]),
            tracestate: Some("vendor=value".to_owned()),
            origin: toolhost_envelope::TraceOrigin::Continued,
            rejected: false,
        };
        let delivery = Delivery {
            names: call_names("requests", "action-requests", "toolbox", "replica-1"),
            entry_id: "1790000000123-0",
            deliveries: 2,
            request_id: "",
            tool: Some("echo"),
        };
        let request_id = "r".repeat(200);
        let delivery = Delivery { request_id: &request_id, ..delivery };
        let mut span = CallSpan::start(&queue, true, &trace, delivery, SystemTime::now()).unwrap();
        span.admit(SystemTime::now()).fail("forbidden", "the tenant's policy");
        let remote = toolhost_tools::Remote {
            system: "mcp",
            target: "everything".to_owned(),
            name: "echo".to_owned(),
            transport: "pipe",
        };
        span.run("echo", Some(&remote)).set(opentelemetry::KeyValue::new("gen_ai.tool.call.result", "{}"));
        drop(span.settle());
        span.set(opentelemetry::KeyValue::new("toolhost.replayed", true));
        span.end("error", Some("timeout"));
        assert_eq!(queue.waiting(), 4);
        let body = match queue.take(true).unwrap() {
            Batch::Encoded(body) => encoder.finish(body),
            Batch::Spans(spans) => encoder.encode(&spans),
        };
        let request = ExportTraceServiceRequest::decode(body).unwrap();
        request.resource_spans[0].scope_spans[0]
            .spans
            .iter()
            .cloned()
            .map(|mut span| {
                (span.start_time_unix_nano, span.end_time_unix_nano) = (0, 0);
                if span.span_id != [4; 8] {
                    span.span_id.clear();
                }
                span
            })
            .collect()
    }

    /// A call's spans are the same whether the queue encodes them (OTLP/HTTP) or keeps them as
    /// they are for the gRPC exporter: their order, names, parents, links, attributes (the
    /// call's own, then those set later, then the outcome) and statuses.
    #[test]
    fn a_calls_spans_are_the_same_encoded_when_offered_or_kept_for_grpc() {
        let encoded = call_spans(true);
        assert_eq!(encoded, call_spans(false));
        let names: Vec<&str> = encoded.iter().map(|span| span.name.as_str()).collect();
        assert_eq!(names, ["admit", "tools/call echo", "settle action-requests", "process action-requests"]);
        let process = &encoded[3];
        let keys: Vec<&str> = process.attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(
            keys[7..],
            [
                "messaging.message.id",
                "toolhost.request_id",
                "gen_ai.tool.name",
                "messaging.redis_streams.delivery_count",
                "toolhost.replayed",
                "toolhost.outcome",
                "error.type",
            ]
        );
        assert_eq!(process.parent_span_id, [5; 8]);
        assert_eq!(process.links.len(), 1);
        assert_eq!(encoded[0].status.as_ref().unwrap().message, "the tenant's policy");
        assert!(encoded[..3].iter().all(|span| span.parent_span_id == [4; 8]));
    }

    #[test]
    fn a_full_batch_is_taken_before_the_one_filling_which_waits_for_the_schedule() {
        let export = Export { max_queue_size: 8, max_export_batch_size: 3, ..export_to(String::new()) };
        let queue = SpanQueue::new(&export, None, metrics::Counter::noop());
        let span = |id: u8| Span { span_id: [id; 8], ..one_span() };
        let ids = |batch: Option<Batch>| -> Vec<u8> {
            match batch {
                Some(Batch::Spans(spans)) => spans.iter().map(|span| span.span_id[0]).collect(),
                other => panic!("a batch of spans: {other:?}"),
            }
        };
        queue.offer((1..=4).map(span).collect());
        // A wake for a full batch takes the full one only; the one filling stays.
        assert_eq!(ids(queue.take(false)), [1, 2, 3]);
        assert!(queue.take(false).is_none());
        assert_eq!(queue.waiting(), 1);
        // The schedule (or the stop) takes it too.
        assert_eq!(ids(queue.take(true)), [4]);
        assert!(queue.take(true).is_none());
        assert_eq!(queue.waiting(), 0);
    }

    #[test]
    fn a_batch_is_never_larger_than_the_queue() {
        let export = Export { max_queue_size: 2, max_export_batch_size: 5, ..export_to(String::new()) };
        let queue = SpanQueue::new(&export, None, metrics::Counter::noop());
        queue.offer(vec![one_span(), one_span()]);
        // The queue is full, and so is its one batch: taken without waiting for the schedule.
        assert_eq!(queue.take(false).map(|batch| batch.len()), Some(2));
        assert_eq!(queue.waiting(), 0);
    }

    #[tokio::test]
    async fn a_refused_batch_is_an_error_that_names_the_status() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        let resource = opentelemetry_sdk::Resource::builder().build();
        let mut exporter = SpanExport::new(&export_to(endpoint), &resource).unwrap();
        let collector = tokio::spawn(collect_one(listener, "503 Service Unavailable"));
        let mut body = exporter.encoder().unwrap().body(0);
        body.push(&one_span().as_ref());
        let err = exporter.export(Batch::Encoded(body), Duration::from_secs(5)).await.unwrap_err();
        assert!(err.contains("503"), "{err}");
        collector.await.unwrap();
    }

    #[test]
    fn a_bad_header_or_endpoint_stops_the_pipeline_from_starting() {
        let resource = opentelemetry_sdk::Resource::builder().build();
        let mut export = export_to("http://127.0.0.1:4318/v1/traces".to_owned());
        export.headers = vec![("bad header".to_owned(), "x".to_owned())];
        let err = SpanExport::new(&export, &resource).err().unwrap();
        assert!(err.to_string().contains("'bad header'"), "{err}");
        let export = export_to("not a url".to_owned());
        assert!(SpanExport::new(&export, &resource).is_err());
    }
}
