//! The spans of one call, by the OpenTelemetry conventions for messaging and for MCP, with the
//! convention toolhost keeps for Redis Streams (docs/CONTRACTS.md, "Spans"):
//!
//! ```text
//! caller: send action-requests (PRODUCER) ──────────────┐ parent and link
//! toolbox: process action-requests (CONSUMER) ◄─────────┘
//!            ├─ admit (INTERNAL): signature, policy, limits
//!            ├─ tools/call <tool> (CLIENT, to an MCP server) | execute_tool <tool> (INTERNAL or CLIENT)
//!            └─ settle action-requests (CLIENT): the answer, the marks and the XACK in one script
//! ```
//!
//! `messaging.system` is `redis_streams`; the destination is the stream's bare name, the consumer
//! group is the toolbox id and the message id is the stream entry id. A span is made only for a
//! sampled call; an unsampled call costs one flag test.

use std::borrow::Cow;

use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;
use toolhost_envelope::{CallTrace, TraceContext, TraceParent};
use toolhost_tools::Remote;

use super::otel::with_ids;

/// `messaging.system` of toolhost's streams: no convention names Redis Streams yet.
pub const MESSAGING_SYSTEM: &str = "redis_streams";

/// Where a call came from, for its `process` span.
pub(crate) struct Delivery<'a> {
    /// The door's name (`requests`, `chat`).
    pub door: &'static str,
    /// The stream's bare name.
    pub stream: &'a str,
    /// The consumer group (the toolbox id).
    pub group: &'a str,
    /// This replica's consumer name.
    pub consumer: &'a str,
    /// The stream entry id.
    pub entry_id: &'a str,
    /// The entry's delivery count.
    pub deliveries: u64,
    /// The request id.
    pub request_id: &'a str,
    /// The tool's label, when it names one.
    pub tool: Option<&'a str>,
}

/// The `process` span of one sampled call, and what its children are made with.
pub(crate) struct CallSpan {
    cx: Context,
    tracer: SdkTracer,
    stream: String,
    /// Whether arguments and results become attributes.
    pub record_arguments: bool,
}

/// The remote span context of the caller's `traceparent`.
fn caller_context(trace: &CallTrace) -> Option<SpanContext> {
    let parent = trace.parent?;
    let state =
        trace.tracestate.as_deref().and_then(|text| text.parse::<TraceState>().ok()).unwrap_or_default();
    Some(SpanContext::new(
        TraceId::from_bytes(trace.context.trace_id),
        SpanId::from_bytes(parent),
        TraceFlags::new(trace.context.flags),
        true,
        state,
    ))
}

impl CallSpan {
    /// Starts the `process` span of a call with the ids the call was given at admission: a
    /// child of the caller's span, linked to it as the messaging conventions link a message's
    /// creation context. `None` when the call is not sampled.
    pub(crate) fn start(
        tracer: &SdkTracer,
        record_arguments: bool,
        trace: &CallTrace,
        delivery: &Delivery<'_>,
        started: std::time::SystemTime,
    ) -> Option<CallSpan> {
        if !trace.context.is_sampled() {
            return None;
        }
        let caller = caller_context(trace);
        let parent = match &caller {
            Some(caller) => Context::new().with_remote_span_context(caller.clone()),
            None => Context::new(),
        };
        let mut attributes = vec![
            KeyValue::new("messaging.system", MESSAGING_SYSTEM),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.destination.name", delivery.stream.to_owned()),
            KeyValue::new("messaging.consumer.group.name", delivery.group.to_owned()),
            KeyValue::new("messaging.client.id", delivery.consumer.to_owned()),
            KeyValue::new("messaging.message.id", delivery.entry_id.to_owned()),
            KeyValue::new("toolhost.door", delivery.door),
            KeyValue::new("toolhost.request_id", delivery.request_id.to_owned()),
        ];
        if delivery.deliveries > 1 {
            attributes
                .push(KeyValue::new("messaging.redis_streams.delivery_count", delivery.deliveries as i64));
        }
        if let Some(tool) = delivery.tool {
            attributes.push(KeyValue::new("gen_ai.tool.name", tool.to_owned()));
        }
        let links = caller.map(|caller| vec![Link::with_context(caller)]).unwrap_or_default();
        let builder = tracer
            .span_builder(format!("process {}", delivery.stream))
            .with_kind(SpanKind::Consumer)
            .with_start_time(started)
            .with_attributes(attributes)
            .with_links(links);
        let span = with_ids(trace.context.trace_id, trace.context.span_id, || {
            tracer.build_with_context(builder, &parent)
        });
        Some(CallSpan {
            cx: parent.with_span(span),
            tracer: tracer.clone(),
            stream: delivery.stream.to_owned(),
            record_arguments,
        })
    }

    /// A child span of the call.
    pub(crate) fn child(
        &self,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> ChildSpan {
        let builder = self.tracer.span_builder(name).with_kind(kind).with_attributes(attributes);
        ChildSpan(self.cx.with_span(self.tracer.build_with_context(builder, &self.cx)))
    }

    /// The `admit` span, from `started`: the signature, the tenant's policy and limits.
    pub(crate) fn admit(&self, started: std::time::SystemTime) -> ChildSpan {
        let builder =
            self.tracer.span_builder("admit").with_kind(SpanKind::Internal).with_start_time(started);
        ChildSpan(self.cx.with_span(self.tracer.build_with_context(builder, &self.cx)))
    }

    /// The span of the tool's run: `tools/call <name>` (CLIENT, by the MCP conventions) toward
    /// an MCP server, `execute_tool <tool>` otherwise (CLIENT toward an HTTP service or an
    /// agent, INTERNAL for a tool that runs here).
    pub(crate) fn run(&self, tool: &str, remote: Option<&Remote>) -> ChildSpan {
        let operation = KeyValue::new("gen_ai.operation.name", "execute_tool");
        let (name, kind, attributes) = match remote {
            Some(remote) if remote.system == "mcp" => (
                format!("tools/call {}", remote.name),
                SpanKind::Client,
                vec![
                    operation,
                    KeyValue::new("mcp.method.name", "tools/call"),
                    KeyValue::new("gen_ai.tool.name", remote.name.clone()),
                    KeyValue::new("toolhost.tool", tool.to_owned()),
                    KeyValue::new("server.address", remote.target.clone()),
                    KeyValue::new("network.transport", remote.transport),
                ],
            ),
            Some(remote) => (
                format!("execute_tool {tool}"),
                SpanKind::Client,
                vec![
                    operation,
                    KeyValue::new("gen_ai.tool.name", tool.to_owned()),
                    KeyValue::new("toolhost.remote.system", remote.system),
                    KeyValue::new("server.address", remote.target.clone()),
                ],
            ),
            None => (
                format!("execute_tool {tool}"),
                SpanKind::Internal,
                vec![operation, KeyValue::new("gen_ai.tool.name", tool.to_owned())],
            ),
        };
        self.child(name, kind, attributes)
    }

    /// The `settle` span: the commit of the answer, the marks and the ack.
    pub(crate) fn settle(&self) -> ChildSpan {
        self.child(
            format!("settle {}", self.stream),
            SpanKind::Client,
            vec![
                KeyValue::new("messaging.system", MESSAGING_SYSTEM),
                KeyValue::new("messaging.operation.type", "settle"),
                KeyValue::new("messaging.operation.name", "ack"),
                KeyValue::new("messaging.destination.name", self.stream.clone()),
            ],
        )
    }

    /// Sets an attribute of the `process` span.
    pub(crate) fn set(&self, attribute: KeyValue) {
        self.cx.span().set_attribute(attribute);
    }

    /// Adds an event to the `process` span.
    pub(crate) fn event(&self, name: &'static str, attributes: Vec<KeyValue>) {
        self.cx.span().add_event(name, attributes);
    }

    /// Ends the `process` span with the call's outcome: `error.type` and an error status for an
    /// answer that is an error (refusals, timeouts and cancels included) or a dead letter.
    pub(crate) fn end(self, outcome: &'static str, error: Option<&'static str>) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("toolhost.outcome", outcome));
        if let Some(error) = error {
            span.set_attribute(KeyValue::new("error.type", error));
            span.set_status(Status::error(error));
        }
        span.end();
    }
}

/// A child span of a call; it ends when dropped, or with [`ChildSpan::fail`].
pub(crate) struct ChildSpan(Context);

impl ChildSpan {
    /// Marks the span failed with `error.type` and a description, and ends it.
    pub(crate) fn fail(self, error_type: &str, description: &str) {
        let span = self.0.span();
        span.set_attribute(KeyValue::new("error.type", error_type.to_owned()));
        span.set_status(Status::error(description.to_owned()));
        span.end();
    }

    /// Sets an attribute.
    pub(crate) fn set(&self, attribute: KeyValue) {
        self.0.span().set_attribute(attribute);
    }

    /// The call's trace with this span as the one it passes on: what a tool's source sends out,
    /// so the server's span is a child of the tool's run.
    pub(crate) fn passed_on(&self, trace: &CallTrace) -> CallTrace {
        let mut passed = trace.clone();
        passed.context.span_id = self.0.span().span_context().span_id().to_bytes();
        passed
    }
}

impl Drop for ChildSpan {
    fn drop(&mut self) {
        self.0.span().end();
    }
}

/// The span of a call through a fleet door (the MCP door's SERVER span `tools/call <tool>`):
/// a child of the caller's context, and the context the door writes in its request, so the
/// toolbox's `process` span is its child. It ends when dropped.
pub(crate) struct DoorSpan {
    cx: Context,
    tracestate: Option<String>,
}

impl DoorSpan {
    /// Starts the span when the call is sampled: the caller's flag decides when it gave a
    /// context (parent-based sampling), else `sampling` decides on a new trace id.
    pub(crate) fn start(
        tracer: &SdkTracer,
        sampling: super::Sampling,
        caller: Option<&TraceContext>,
        name: String,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> Option<DoorSpan> {
        let trace_id = caller.map_or_else(toolhost_envelope::new_trace_id, |caller| caller.parent.trace_id);
        if !sampling.sampled(&trace_id, caller.map(|caller| caller.parent.is_sampled())) {
            return None;
        }
        let parent = match caller {
            Some(caller) => {
                let state = caller
                    .tracestate
                    .as_deref()
                    .and_then(|text| text.parse::<TraceState>().ok())
                    .unwrap_or_default();
                Context::new().with_remote_span_context(SpanContext::new(
                    TraceId::from_bytes(caller.parent.trace_id),
                    SpanId::from_bytes(caller.parent.span_id),
                    TraceFlags::new(caller.parent.flags),
                    true,
                    state,
                ))
            }
            None => Context::new(),
        };
        let builder = tracer.span_builder(name).with_kind(kind).with_attributes(attributes);
        let span = with_ids(trace_id, toolhost_envelope::new_span_id(), || {
            tracer.build_with_context(builder, &parent)
        });
        Some(DoorSpan {
            cx: parent.with_span(span),
            tracestate: caller.and_then(|caller| caller.tracestate.clone()),
        })
    }

    /// The context the door writes in its request: this span's.
    pub(crate) fn passed_on(&self) -> TraceContext {
        let context = self.cx.span().span_context().clone();
        TraceContext {
            parent: TraceParent {
                trace_id: context.trace_id().to_bytes(),
                span_id: context.span_id().to_bytes(),
                flags: context.trace_flags().to_u8(),
            },
            tracestate: self.tracestate.clone(),
        }
    }

    /// Marks the span failed with `error.type`.
    pub(crate) fn fail(&self, error_type: &str, description: &str) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("error.type", error_type.to_owned()));
        span.set_status(Status::error(description.to_owned()));
    }
}

impl Drop for DoorSpan {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}
