//! The OpenTelemetry pipeline: a bounded queue of finished spans in front of the OTLP exporter.
//!
//! toolhost makes its spans' exportable data itself ([`super::spans`]) rather than through the
//! SDK's tracer: a call's span ids are chosen at admission, its sampling decision too, and its
//! spans are built once, when each ends, straight into the queue; the SDK's per-span machinery
//! (a context and a locked span per span, its sampler, its id generator, its processor chain)
//! cost more than the rest of an echo call (docs/PERFORMANCE.md, "Telemetry"). The SDK's
//! exporter still encodes and sends them.
//!
//! A span that ends is offered to the queue and never waited for: when the queue is full (the
//! collector is slow or down) it is dropped and counted
//! (`toolhost_telemetry_spans_dropped_total{reason="queue_full"}`). One task on the daemon's
//! runtime takes spans from the queue in batches (`max_export_batch_size`, or what came within
//! `schedule_delay_ms`) and exports them, one export at a time, each bounded by the export
//! timeout; a batch the collector does not take is dropped and counted
//! (`reason="export_failed"`), never retried, so an outage costs memory of one queue at most.
//! The SDK's own batch processor counts its drops only in a log line at shutdown, hence this one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use metrics::Counter;
use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::{
    Protocol as OtlpProtocol, WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::settings::{Export, Protocol, Settings};

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
    queue: mpsc::Sender<SpanData>,
    dropped: Counter,
    /// Spans in the queue; the export task is woken when they make a full batch.
    waiting: AtomicUsize,
    /// `max_export_batch_size`.
    batch: usize,
    /// Wakes the export task: a batch is full.
    full: Notify,
    /// The instrumentation scope every span names (its strings are static: a clone allocates
    /// nothing).
    pub scope: InstrumentationScope,
}

impl SpanQueue {
    /// Offers a finished span; when the queue is full (or the pipeline stopped) it is dropped,
    /// and counted while the pipeline runs.
    pub(crate) fn offer(&self, span: SpanData) {
        match self.queue.try_send(span) {
            Ok(()) => {
                if self.waiting.fetch_add(1, Ordering::Relaxed) + 1 == self.batch {
                    self.full.notify_one();
                }
            }
            Err(mpsc::error::TrySendError::Full(_)) => self.dropped.increment(1),
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Spans in the queue.
    fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The export task took `count` spans off the queue.
    fn taken(&self, count: usize) {
        self.waiting.fetch_sub(count, Ordering::Relaxed);
    }
}

/// A running pipeline: the queue the lifecycle offers spans to, and the export task.
pub(crate) struct Pipeline {
    /// Takes finished spans; shared by every sampled call's span.
    pub spans: Arc<SpanQueue>,
    stop: CancellationToken,
    export: std::sync::Mutex<Option<JoinHandle<()>>>,
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
    /// The exporter cannot be built (a bad header, the HTTP client's TLS setup).
    pub(crate) fn start(settings: &Settings, counters: ExportCounters) -> anyhow::Result<Option<Pipeline>> {
        let Some(export) = &settings.export else { return Ok(None) };
        let resource = Resource::builder().with_service_name(settings.service_name.clone()).build();
        let mut exporter = span_exporter(export)?;
        opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
        let (queue, receiver) = mpsc::channel(export.max_queue_size);
        let stop = CancellationToken::new();
        let spans = Arc::new(SpanQueue {
            queue,
            dropped: counters.dropped_queue_full.clone(),
            waiting: AtomicUsize::new(0),
            batch: export.max_export_batch_size,
            full: Notify::new(),
            scope: InstrumentationScope::builder(SCOPE).build(),
        });
        let task = tokio::spawn(export_loop(
            receiver,
            spans.clone(),
            exporter,
            export.clone(),
            counters.clone(),
            stop.clone(),
        ));
        Ok(Some(Pipeline { spans, stop, export: std::sync::Mutex::new(Some(task)) }))
    }

    /// Stops taking spans and exports what the queue holds, for at most `grace`.
    pub(crate) async fn shutdown(&self, grace: Duration) {
        // The export task closes the queue (later spans are refused) and drains it.
        self.stop.cancel();
        let task = self.export.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(grace, task).await;
        }
    }
}

/// The OTLP span exporter of `export`, built from the settings alone: every value the crate
/// would otherwise read from `OTEL_*` variables is given explicitly.
fn span_exporter(export: &Export) -> anyhow::Result<opentelemetry_otlp::SpanExporter> {
    let exporter = match export.protocol {
        Protocol::HttpProtobuf => {
            let client = toolhost_tools::sources::http::client().map_err(anyhow::Error::msg)?;
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(client)
                .with_protocol(OtlpProtocol::HttpBinary)
                .with_endpoint(export.traces_endpoint.clone())
                .with_timeout(export.timeout)
                .with_headers(export.headers.iter().cloned().collect())
                .build()?
        }
        Protocol::Grpc => {
            let mut metadata = tonic_metadata(&export.headers)?;
            metadata.insert("user-agent", concat!("toolhost/", env!("CARGO_PKG_VERSION")).parse()?);
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_protocol(OtlpProtocol::Grpc)
                .with_endpoint(export.traces_endpoint.clone())
                .with_timeout(export.timeout)
                .with_metadata(metadata)
                .build()?
        }
    };
    Ok(exporter)
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

/// Takes spans off the queue in batches and exports them, until `stop` closes the queue and it
/// is empty. It wakes when a batch is full, every `schedule_delay` or when stopped, never for a
/// single span: a span offered costs its sender no wake-up of this task.
async fn export_loop(
    mut spans: mpsc::Receiver<SpanData>,
    queue: Arc<SpanQueue>,
    exporter: opentelemetry_otlp::SpanExporter,
    export: Export,
    counters: ExportCounters,
    stop: CancellationToken,
) {
    let mut failing = false;
    loop {
        let stopping = tokio::select! {
            biased;
            () = stop.cancelled() => true,
            () = queue.full.notified() => false,
            () = tokio::time::sleep(export.schedule_delay) => false,
        };
        if stopping {
            // Later spans are refused; what the queue holds is still taken.
            spans.close();
        }
        loop {
            let mut batch = Vec::with_capacity(export.max_export_batch_size.min(queue.waiting()));
            while batch.len() < export.max_export_batch_size {
                match spans.try_recv() {
                    Ok(span) => batch.push(span),
                    Err(_) => break,
                }
            }
            queue.taken(batch.len());
            if batch.is_empty() {
                break;
            }
            let full = batch.len() == export.max_export_batch_size;
            export_batch(&exporter, batch, &export, &counters, &mut failing).await;
            if !full {
                break;
            }
        }
        if stopping {
            break;
        }
    }
}

/// Exports one batch, counting it as exported or dropped; `failing` keeps one warning per
/// outage.
async fn export_batch(
    exporter: &opentelemetry_otlp::SpanExporter,
    batch: Vec<SpanData>,
    export: &Export,
    counters: &ExportCounters,
    failing: &mut bool,
) {
    let count = batch.len() as u64;
    // The exporter's own timeout bounds the request; this bounds everything else.
    let result = tokio::time::timeout(export.timeout + Duration::from_secs(1), exporter.export(batch)).await;
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
pub(crate) fn new_span_id() -> opentelemetry::trace::SpanId {
    thread_local! {
        static IDS: opentelemetry_sdk::trace::RandomIdGenerator = opentelemetry_sdk::trace::RandomIdGenerator::default();
    }
    loop {
        let id = IDS.with(opentelemetry_sdk::trace::IdGenerator::new_span_id);
        if id != opentelemetry::trace::SpanId::INVALID {
            return id;
        }
    }
}

/// The metrics toolhost exports over OTLP, beside the Prometheus endpoint: recorded where the
/// Prometheus ones are, collected every `metrics_interval_ms` by one task.
pub(crate) struct Meters {
    /// `toolhost.invocations`: handled entries by `gen_ai.tool.name` and `toolhost.outcome`.
    pub invocations: opentelemetry::metrics::Counter<u64>,
    /// `toolhost.invocation.duration` (s), by `gen_ai.tool.name`.
    pub duration: opentelemetry::metrics::Histogram<f64>,
    /// `toolhost.in_flight`: tool calls running now.
    pub in_flight: opentelemetry::metrics::UpDownCounter<i64>,
    /// `mcp.server.operation.duration` (s), the MCP conventions' metric, recorded by the MCP
    /// door for every `tools/call` (`mcp.method.name`, `gen_ai.tool.name`, `error.type`).
    pub mcp_operation: opentelemetry::metrics::Histogram<f64>,
    provider: opentelemetry_sdk::metrics::SdkMeterProvider,
    export: std::sync::Mutex<Option<JoinHandle<()>>>,
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
    pub(crate) fn start(settings: &Settings) -> anyhow::Result<Option<Meters>> {
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
        let meters = Meters {
            invocations: meter
                .u64_counter("toolhost.invocations")
                .with_description("Handled request entries, by tool and outcome.")
                .build(),
            duration: meter
                .f64_histogram("toolhost.invocation.duration")
                .with_unit("s")
                .with_description("How long handling a request entry took, by tool.")
                .with_boundaries(BUCKETS.to_vec())
                .build(),
            in_flight: meter
                .i64_up_down_counter("toolhost.in_flight")
                .with_description("Tool calls running now.")
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
