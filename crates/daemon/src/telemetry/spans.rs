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
//!
//! Each span is kept as plain data while it runs (its ids, start time and attributes) and
//! becomes one `SpanData` when it ends, offered to the export queue ([`super::otel`]); names
//! and attribute values that are the same for every call are static strings, and a stream's
//! names are made once per stream ([`names`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::SystemTime;

use opentelemetry::trace::{
    Event, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use toolhost_envelope::{CallTrace, TraceContext, TraceParent};
use toolhost_tools::Remote;

use super::otel::{SpanQueue, new_span_id};

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

/// The names of one stream's spans and the values its attributes repeat, made once.
struct StreamNames {
    process: &'static str,
    settle: &'static str,
    stream: &'static str,
}

/// The strings every call of a stream repeats (its span names, the stream, the group and the
/// consumer), made once per distinct value and kept for the process's life: they come from the
/// configuration (the door's streams, the toolbox id, the replica's consumer name), never from
/// a caller, so there are few of them.
fn names(stream: &str) -> &'static StreamNames {
    static NAMES: RwLock<Option<HashMap<Box<str>, &'static StreamNames>>> = RwLock::new(None);
    if let Some(names) =
        NAMES.read().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(|names| names.get(stream))
    {
        return names;
    }
    let mut all = NAMES.write().unwrap_or_else(PoisonError::into_inner);
    all.get_or_insert_with(HashMap::new).entry(stream.into()).or_insert_with(|| {
        Box::leak(Box::new(StreamNames {
            process: Box::leak(format!("process {stream}").into_boxed_str()),
            settle: Box::leak(format!("settle {stream}").into_boxed_str()),
            stream: Box::leak(stream.into()),
        }))
    })
}

/// A value of configuration (the group, the consumer) as a static string, made once per value;
/// see [`names`].
fn fixed(value: &str) -> &'static str {
    static VALUES: RwLock<Option<HashMap<Box<str>, &'static str>>> = RwLock::new(None);
    if let Some(fixed) =
        VALUES.read().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(|values| values.get(value))
    {
        return fixed;
    }
    let mut all = VALUES.write().unwrap_or_else(PoisonError::into_inner);
    all.get_or_insert_with(HashMap::new).entry(value.into()).or_insert_with(|| Box::leak(value.into()))
}

/// A static string as an attribute value: no allocation.
fn text(value: &'static str) -> Value {
    Value::String(StringValue::from(value))
}

/// A span being made: what it becomes when it ends.
struct Open {
    context: SpanContext,
    parent: SpanId,
    parent_remote: bool,
    kind: SpanKind,
    name: Cow<'static, str>,
    start: SystemTime,
    attributes: Vec<KeyValue>,
}

impl Open {
    /// The span's data, ended now.
    fn finish(self, queue: &SpanQueue, events: Vec<Event>, links: Vec<Link>, status: Status) {
        let mut span_events = SpanEvents::default();
        span_events.events = events;
        let mut span_links = SpanLinks::default();
        span_links.links = links;
        queue.offer(SpanData {
            span_context: self.context,
            parent_span_id: self.parent,
            parent_span_is_remote: self.parent_remote,
            span_kind: self.kind,
            name: self.name,
            start_time: self.start,
            end_time: SystemTime::now(),
            attributes: self.attributes,
            dropped_attributes_count: 0,
            events: span_events,
            links: span_links,
            status,
            instrumentation_scope: queue.scope.clone(),
        });
    }
}

/// The `tracestate` of a context, parsed; empty when it is absent or not valid.
fn trace_state(tracestate: Option<&str>) -> TraceState {
    tracestate.and_then(|text| text.parse::<TraceState>().ok()).unwrap_or_default()
}

/// The `process` span of one sampled call, and what its children are made with.
pub(crate) struct CallSpan {
    queue: Arc<SpanQueue>,
    span: Open,
    names: &'static StreamNames,
    link: Option<SpanContext>,
    events: Vec<Event>,
    /// Whether arguments and results become attributes.
    pub record_arguments: bool,
}

impl CallSpan {
    /// Starts the `process` span of a call with the ids the call was given at admission: a
    /// child of the caller's span, linked to it as the messaging conventions link a message's
    /// creation context. `None` when the call is not sampled.
    pub(crate) fn start(
        queue: &Arc<SpanQueue>,
        record_arguments: bool,
        trace: &CallTrace,
        delivery: &Delivery<'_>,
        started: SystemTime,
    ) -> Option<CallSpan> {
        if !trace.context.is_sampled() {
            return None;
        }
        let state = trace_state(trace.tracestate.as_deref());
        let trace_id = TraceId::from_bytes(trace.context.trace_id);
        let flags = TraceFlags::new(trace.context.flags);
        let link = trace
            .parent
            .map(|parent| SpanContext::new(trace_id, SpanId::from_bytes(parent), flags, true, state.clone()));
        let names = names(delivery.stream);
        let mut attributes = Vec::with_capacity(12);
        attributes.extend([
            KeyValue::new("messaging.system", MESSAGING_SYSTEM),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.destination.name", text(names.stream)),
            KeyValue::new("messaging.consumer.group.name", text(fixed(delivery.group))),
            KeyValue::new("messaging.client.id", text(fixed(delivery.consumer))),
            KeyValue::new("messaging.message.id", delivery.entry_id.to_owned()),
            KeyValue::new("toolhost.door", delivery.door),
            KeyValue::new("toolhost.request_id", delivery.request_id.to_owned()),
        ]);
        if delivery.deliveries > 1 {
            attributes
                .push(KeyValue::new("messaging.redis_streams.delivery_count", delivery.deliveries as i64));
        }
        if let Some(tool) = delivery.tool {
            attributes.push(KeyValue::new("gen_ai.tool.name", tool.to_owned()));
        }
        Some(CallSpan {
            queue: queue.clone(),
            span: Open {
                context: SpanContext::new(
                    trace_id,
                    SpanId::from_bytes(trace.context.span_id),
                    flags,
                    false,
                    state,
                ),
                parent: trace.parent.map_or(SpanId::INVALID, SpanId::from_bytes),
                parent_remote: trace.parent.is_some(),
                kind: SpanKind::Consumer,
                name: Cow::Borrowed(names.process),
                start: started,
                attributes,
            },
            names,
            link,
            events: Vec::new(),
            record_arguments,
        })
    }

    /// A child span of the call, started now.
    fn child(&self, name: Cow<'static, str>, kind: SpanKind, attributes: Vec<KeyValue>) -> ChildSpan<'_> {
        self.child_from(name, kind, attributes, SystemTime::now())
    }

    fn child_from(
        &self,
        name: Cow<'static, str>,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
        start: SystemTime,
    ) -> ChildSpan<'_> {
        let parent = &self.span.context;
        let context = SpanContext::new(
            parent.trace_id(),
            new_span_id(),
            parent.trace_flags(),
            false,
            parent.trace_state().clone(),
        );
        ChildSpan {
            queue: &self.queue,
            span: Some(Open {
                context,
                parent: parent.span_id(),
                parent_remote: false,
                kind,
                name,
                start,
                attributes,
            }),
            failed: Mutex::new(None),
            extra: Mutex::new(Vec::new()),
        }
    }

    /// The `admit` span, from `started`: the signature, the tenant's policy and limits.
    pub(crate) fn admit(&self, started: SystemTime) -> ChildSpan<'_> {
        self.child_from(Cow::Borrowed("admit"), SpanKind::Internal, Vec::new(), started)
    }

    /// The span of the tool's run: `tools/call <name>` (CLIENT, by the MCP conventions) toward
    /// an MCP server, `execute_tool <tool>` otherwise (CLIENT toward an HTTP service or an
    /// agent, INTERNAL for a tool that runs here).
    pub(crate) fn run(&self, tool: &str, remote: Option<&Remote>) -> ChildSpan<'_> {
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
        self.child(Cow::Owned(name), kind, attributes)
    }

    /// The `settle` span: the commit of the answer, the marks and the ack.
    pub(crate) fn settle(&self) -> ChildSpan<'_> {
        self.child(
            Cow::Borrowed(self.names.settle),
            SpanKind::Client,
            vec![
                KeyValue::new("messaging.system", MESSAGING_SYSTEM),
                KeyValue::new("messaging.operation.type", "settle"),
                KeyValue::new("messaging.operation.name", "ack"),
                KeyValue::new("messaging.destination.name", text(self.names.stream)),
            ],
        )
    }

    /// Sets an attribute of the `process` span.
    pub(crate) fn set(&mut self, attribute: KeyValue) {
        self.span.attributes.push(attribute);
    }

    /// Adds an event to the `process` span.
    pub(crate) fn event(&mut self, name: &'static str, attributes: Vec<KeyValue>) {
        self.events.push(Event::new(name, SystemTime::now(), attributes, 0));
    }

    /// Ends the `process` span with the call's outcome: `error.type` and an error status for an
    /// answer that is an error (refusals, timeouts and cancels included) or a dead letter.
    pub(crate) fn end(self, outcome: &'static str, error: Option<&'static str>) {
        let CallSpan { queue, mut span, link, events, .. } = self;
        span.attributes.push(KeyValue::new("toolhost.outcome", outcome));
        let status = match error {
            Some(error) => {
                span.attributes.push(KeyValue::new("error.type", error));
                Status::error(error)
            }
            None => Status::Unset,
        };
        let links = link.map(|link| vec![Link::with_context(link)]).unwrap_or_default();
        span.finish(&queue, events, links, status);
    }
}

/// A child span of a call; it ends when dropped, or with [`ChildSpan::fail`].
pub(crate) struct ChildSpan<'a> {
    queue: &'a SpanQueue,
    span: Option<Open>,
    /// `error.type` and the description, once it failed.
    failed: Mutex<Option<(String, String)>>,
    /// Attributes set while it runs.
    extra: Mutex<Vec<KeyValue>>,
}

impl ChildSpan<'_> {
    /// Marks the span failed with `error.type` and a description, and ends it.
    pub(crate) fn fail(self, error_type: &str, description: &str) {
        *self.failed.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((error_type.to_owned(), description.to_owned()));
    }

    /// Sets an attribute.
    pub(crate) fn set(&self, attribute: KeyValue) {
        self.extra.lock().unwrap_or_else(PoisonError::into_inner).push(attribute);
    }

    /// The call's trace with this span as the one it passes on: what a tool's source sends out,
    /// so the server's span is a child of the tool's run.
    pub(crate) fn passed_on(&self, trace: &CallTrace) -> CallTrace {
        let mut passed = trace.clone();
        if let Some(span) = &self.span {
            passed.context.span_id = span.context.span_id().to_bytes();
        }
        passed
    }
}

impl Drop for ChildSpan<'_> {
    fn drop(&mut self) {
        let Some(mut span) = self.span.take() else { return };
        span.attributes.append(self.extra.get_mut().unwrap_or_else(PoisonError::into_inner));
        let status = match self.failed.get_mut().unwrap_or_else(PoisonError::into_inner).take() {
            Some((error_type, description)) => {
                span.attributes.push(KeyValue::new("error.type", error_type));
                Status::error(description)
            }
            None => Status::Unset,
        };
        span.finish(self.queue, Vec::new(), Vec::new(), status);
    }
}

/// The span of a call through a fleet door (the MCP door's SERVER span `tools/call <tool>`):
/// a child of the caller's context, and the context the door writes in its request, so the
/// toolbox's `process` span is its child. It ends when dropped.
pub(crate) struct DoorSpan {
    queue: Arc<SpanQueue>,
    span: Option<Open>,
    tracestate: Option<String>,
    /// The caller's context as a link, for a door that consumes a message (the OVOS door).
    link: Option<SpanContext>,
    /// Attributes set while it runs.
    extra: Mutex<Vec<KeyValue>>,
    /// `error.type` and the description, once it failed.
    failed: Mutex<Option<(String, String)>>,
}

impl DoorSpan {
    /// Starts the span when the call is sampled: the caller's flag decides when it gave a
    /// context (parent-based sampling), else `sampling` decides on a new trace id.
    pub(crate) fn start(
        queue: &Arc<SpanQueue>,
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
        let state = trace_state(caller.and_then(|caller| caller.tracestate.as_deref()));
        let context = SpanContext::new(
            TraceId::from_bytes(trace_id),
            SpanId::from_bytes(toolhost_envelope::new_span_id()),
            TraceFlags::SAMPLED,
            false,
            state,
        );
        Some(DoorSpan {
            queue: queue.clone(),
            span: Some(Open {
                context,
                parent: caller.map_or(SpanId::INVALID, |caller| SpanId::from_bytes(caller.parent.span_id)),
                parent_remote: caller.is_some(),
                kind,
                name: Cow::Owned(name),
                start: SystemTime::now(),
                attributes,
            }),
            tracestate: caller.and_then(|caller| caller.tracestate.clone()),
            link: None,
            extra: Mutex::new(Vec::new()),
            failed: Mutex::new(None),
        })
    }

    /// Links the span to its parent, the caller's context, as the messaging conventions link a
    /// consumer's span to the message's creation context; nothing when it has no parent.
    pub(crate) fn linked(mut self) -> DoorSpan {
        if let Some(span) = &self.span
            && span.parent != SpanId::INVALID
        {
            let context = &span.context;
            self.link = Some(SpanContext::new(
                context.trace_id(),
                span.parent,
                context.trace_flags(),
                true,
                context.trace_state().clone(),
            ));
        }
        self
    }

    /// Sets an attribute.
    pub(crate) fn set(&self, attribute: KeyValue) {
        self.extra.lock().unwrap_or_else(PoisonError::into_inner).push(attribute);
    }

    /// The context the door writes in its request: this span's.
    pub(crate) fn passed_on(&self) -> TraceContext {
        let (trace_id, span_id) = self
            .span
            .as_ref()
            .map(|span| (span.context.trace_id().to_bytes(), span.context.span_id().to_bytes()))
            .unwrap_or_default();
        TraceContext {
            parent: TraceParent { trace_id, span_id, flags: TraceFlags::SAMPLED.to_u8() },
            tracestate: self.tracestate.clone(),
        }
    }

    /// Marks the span failed with `error.type`.
    pub(crate) fn fail(&self, error_type: &str, description: &str) {
        *self.failed.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((error_type.to_owned(), description.to_owned()));
    }
}

impl Drop for DoorSpan {
    fn drop(&mut self) {
        let Some(mut span) = self.span.take() else { return };
        span.attributes.append(self.extra.get_mut().unwrap_or_else(PoisonError::into_inner));
        let status = match self.failed.get_mut().unwrap_or_else(PoisonError::into_inner).take() {
            Some((error_type, description)) => {
                span.attributes.push(KeyValue::new("error.type", error_type));
                Status::error(description)
            }
            None => Status::Unset,
        };
        let links = self.link.take().map(|link| vec![Link::with_context(link)]).unwrap_or_default();
        span.finish(&self.queue, Vec::new(), links, status);
    }
}
