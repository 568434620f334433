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
//! Each span is plain data ([`Span`]: fixed fields, attributes keyed by static strings) from its
//! start to its end, when it is offered to the export queue ([`super::otel`]), which encodes it
//! as OTLP protobuf itself ([`super::otlp`]); nothing of the SDK's span types is made per span.
//! Names and attribute values that are the same for every call are static strings, and the
//! strings a stream or a replica repeats are made once ([`fixed`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::SystemTime;

use opentelemetry::trace::{SpanKind, TraceFlags, TraceState};
use toolhost_envelope::{CallTrace, TraceContext, TraceParent};
use toolhost_tools::Remote;

use super::otel::{SpanQueue, new_span_id};

/// `messaging.system` of toolhost's streams: no convention names Redis Streams yet.
pub const MESSAGING_SYSTEM: &str = "redis_streams";

/// An attribute's value: a static string costs no allocation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Static(&'static str),
    Text(String),
    Int(i64),
    Bool(bool),
    Double(f64),
    /// A homogeneous array (from an `opentelemetry::KeyValue`; toolhost's own spans set none).
    Array(opentelemetry::Array),
}

/// One attribute: its key is static for toolhost's own spans.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Attribute {
    pub key: Cow<'static, str>,
    pub value: Value,
}

/// An attribute with a static key.
pub(crate) fn attr(key: &'static str, value: impl Into<Value>) -> Attribute {
    Attribute { key: Cow::Borrowed(key), value: value.into() }
}

impl From<&'static str> for Value {
    fn from(value: &'static str) -> Value {
        Value::Static(value)
    }
}

impl From<String> for Value {
    fn from(value: String) -> Value {
        Value::Text(value)
    }
}

impl From<i64> for Value {
    fn from(value: i64) -> Value {
        Value::Int(value)
    }
}

impl From<bool> for Value {
    fn from(value: bool) -> Value {
        Value::Bool(value)
    }
}

/// The doors build their attributes with the OpenTelemetry API's `KeyValue`; a door span is
/// one per call through a door, so its keys are copied rather than matched on.
impl From<opentelemetry::KeyValue> for Attribute {
    fn from(attribute: opentelemetry::KeyValue) -> Attribute {
        let value = match attribute.value {
            opentelemetry::Value::Bool(value) => Value::Bool(value),
            opentelemetry::Value::I64(value) => Value::Int(value),
            opentelemetry::Value::F64(value) => Value::Double(value),
            opentelemetry::Value::String(value) => Value::Text(value.into()),
            opentelemetry::Value::Array(value) => Value::Array(value),
            // `Value` is non-exhaustive; a kind it adds later is exported as its text.
            other => Value::Text(other.to_string()),
        };
        Attribute { key: Cow::Owned(attribute.key.into()), value }
    }
}

/// An event of a span.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Event {
    pub name: &'static str,
    /// Nanoseconds since the Unix epoch.
    pub time: u64,
    pub attributes: Vec<Attribute>,
}

/// A span's link: the context it points to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Link {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
    pub trace_state: Option<Arc<str>>,
    /// Whether the context came from another process (always, for toolhost's links).
    pub remote: bool,
}

/// A span's status: unset, or an error with its description.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Status {
    Unset,
    Error(Cow<'static, str>),
}

/// A finished span, as the export queue takes it: everything OTLP's `Span` carries, with no
/// per-span allocation beyond its attributes' list and the values that are not static.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The parent's span id; `None` for a root span.
    pub parent: Option<[u8; 8]>,
    /// Whether the parent is another process's span.
    pub parent_remote: bool,
    /// The W3C trace flags.
    pub flags: u8,
    /// The `tracestate` header, already checked (an invalid one is dropped).
    pub trace_state: Option<Arc<str>>,
    pub kind: SpanKind,
    pub name: Cow<'static, str>,
    /// Nanoseconds since the Unix epoch.
    pub start: u64,
    pub end: u64,
    pub attributes: Vec<Attribute>,
    pub events: Vec<Event>,
    /// toolhost's spans have one link at most: the message's creation context.
    pub link: Option<Link>,
    pub status: Status,
}

/// Nanoseconds since the Unix epoch (zero before it), as OTLP counts time.
pub(crate) fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64)
}

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

/// A string every call repeats (a stream, the group, the consumer) as a static string, with the
/// span names a stream's calls use, made once per distinct value and kept for the process's
/// life: they come from the configuration (the door's streams, the toolbox id, the replica's
/// consumer name), never from a caller, so there are few of them.
struct Fixed {
    value: &'static str,
    /// `process <value>`, the name of a stream's `process` spans.
    process: &'static str,
    /// `settle <value>`.
    settle: &'static str,
}

/// The [`Fixed`] strings of `value`.
fn fixed(value: &str) -> &'static Fixed {
    static VALUES: RwLock<Option<HashMap<Box<str>, &'static Fixed>>> = RwLock::new(None);
    if let Some(fixed) =
        VALUES.read().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(|values| values.get(value))
    {
        return fixed;
    }
    let mut all = VALUES.write().unwrap_or_else(PoisonError::into_inner);
    all.get_or_insert_with(HashMap::new).entry(value.into()).or_insert_with(|| {
        Box::leak(Box::new(Fixed {
            value: Box::leak(value.into()),
            process: Box::leak(format!("process {value}").into_boxed_str()),
            settle: Box::leak(format!("settle {value}").into_boxed_str()),
        }))
    })
}

/// The `tracestate` of a context in its normal form; `None` when it is absent or not valid.
fn trace_state(tracestate: Option<&str>) -> Option<Arc<str>> {
    let state = tracestate?.parse::<TraceState>().ok()?.header();
    (!state.is_empty()).then(|| state.into())
}

/// A span being made: what it becomes when it ends.
struct Open {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    parent_remote: bool,
    flags: u8,
    trace_state: Option<Arc<str>>,
    kind: SpanKind,
    name: Cow<'static, str>,
    start: u64,
    attributes: Vec<Attribute>,
}

impl Open {
    /// The span, ended now, offered to the export queue.
    fn finish(self, queue: &SpanQueue, events: Vec<Event>, link: Option<Link>, status: Status) {
        queue.offer(Span {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            parent_remote: self.parent_remote,
            flags: self.flags,
            trace_state: self.trace_state,
            kind: self.kind,
            name: self.name,
            start: self.start,
            end: unix_nanos(SystemTime::now()),
            attributes: self.attributes,
            events,
            link,
            status,
        });
    }

    /// The link to this span's parent, a context from another process; `None` for a root span.
    fn link_to_parent(&self) -> Option<Link> {
        Some(Link {
            trace_id: self.trace_id,
            span_id: self.parent?,
            flags: self.flags,
            trace_state: self.trace_state.clone(),
            remote: true,
        })
    }
}

/// A parent span id as the envelope gives it; all zero is no parent.
fn parent_id(span_id: [u8; 8]) -> Option<[u8; 8]> {
    (span_id != [0; 8]).then_some(span_id)
}

/// The `process` span of one sampled call, and what its children are made with.
pub(crate) struct CallSpan {
    queue: Arc<SpanQueue>,
    span: Open,
    names: &'static Fixed,
    link: Option<Link>,
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
        let names = fixed(delivery.stream);
        let mut attributes = Vec::with_capacity(12);
        attributes.extend([
            attr("messaging.system", MESSAGING_SYSTEM),
            attr("messaging.operation.type", "process"),
            attr("messaging.operation.name", "process"),
            attr("messaging.destination.name", names.value),
            attr("messaging.consumer.group.name", fixed(delivery.group).value),
            attr("messaging.client.id", fixed(delivery.consumer).value),
            attr("messaging.message.id", delivery.entry_id.to_owned()),
            attr("toolhost.door", delivery.door),
            attr("toolhost.request_id", delivery.request_id.to_owned()),
        ]);
        if delivery.deliveries > 1 {
            attributes.push(attr("messaging.redis_streams.delivery_count", delivery.deliveries as i64));
        }
        if let Some(tool) = delivery.tool {
            attributes.push(attr("gen_ai.tool.name", tool.to_owned()));
        }
        let parent = trace.parent.and_then(parent_id);
        let span = Open {
            trace_id: trace.context.trace_id,
            span_id: trace.context.span_id,
            parent,
            parent_remote: parent.is_some(),
            flags: trace.context.flags,
            trace_state: trace_state(trace.tracestate.as_deref()),
            kind: SpanKind::Consumer,
            name: Cow::Borrowed(names.process),
            start: unix_nanos(started),
            attributes,
        };
        Some(CallSpan {
            queue: queue.clone(),
            link: span.link_to_parent(),
            span,
            names,
            events: Vec::new(),
            record_arguments,
        })
    }

    /// A child span of the call, started now.
    fn child(&self, name: Cow<'static, str>, kind: SpanKind, attributes: Vec<Attribute>) -> ChildSpan<'_> {
        self.child_from(name, kind, attributes, SystemTime::now())
    }

    fn child_from(
        &self,
        name: Cow<'static, str>,
        kind: SpanKind,
        attributes: Vec<Attribute>,
        start: SystemTime,
    ) -> ChildSpan<'_> {
        let parent = &self.span;
        ChildSpan {
            queue: &self.queue,
            span: Some(Open {
                trace_id: parent.trace_id,
                span_id: new_span_id(),
                parent: Some(parent.span_id),
                parent_remote: false,
                flags: parent.flags,
                trace_state: parent.trace_state.clone(),
                kind,
                name,
                start: unix_nanos(start),
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
        let operation = attr("gen_ai.operation.name", "execute_tool");
        let (name, kind, attributes) = match remote {
            Some(remote) if remote.system == "mcp" => (
                format!("tools/call {}", remote.name),
                SpanKind::Client,
                vec![
                    operation,
                    attr("mcp.method.name", "tools/call"),
                    attr("gen_ai.tool.name", remote.name.clone()),
                    attr("toolhost.tool", tool.to_owned()),
                    attr("server.address", remote.target.clone()),
                    attr("network.transport", remote.transport),
                ],
            ),
            Some(remote) => (
                format!("execute_tool {tool}"),
                SpanKind::Client,
                vec![
                    operation,
                    attr("gen_ai.tool.name", tool.to_owned()),
                    attr("toolhost.remote.system", remote.system),
                    attr("server.address", remote.target.clone()),
                ],
            ),
            None => (
                format!("execute_tool {tool}"),
                SpanKind::Internal,
                vec![operation, attr("gen_ai.tool.name", tool.to_owned())],
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
                attr("messaging.system", MESSAGING_SYSTEM),
                attr("messaging.operation.type", "settle"),
                attr("messaging.operation.name", "ack"),
                attr("messaging.destination.name", self.names.value),
            ],
        )
    }

    /// Sets an attribute of the `process` span.
    pub(crate) fn set(&mut self, attribute: impl Into<Attribute>) {
        self.span.attributes.push(attribute.into());
    }

    /// Adds an event to the `process` span.
    pub(crate) fn event(&mut self, name: &'static str, attributes: Vec<Attribute>) {
        self.events.push(Event { name, time: unix_nanos(SystemTime::now()), attributes });
    }

    /// Ends the `process` span with the call's outcome: `error.type` and an error status for an
    /// answer that is an error (refusals, timeouts and cancels included) or a dead letter.
    pub(crate) fn end(self, outcome: &'static str, error: Option<&'static str>) {
        let CallSpan { queue, mut span, link, events, .. } = self;
        span.attributes.push(attr("toolhost.outcome", outcome));
        let status = match error {
            Some(error) => {
                span.attributes.push(attr("error.type", error));
                Status::Error(Cow::Borrowed(error))
            }
            None => Status::Unset,
        };
        span.finish(&queue, events, link, status);
    }
}

/// A child span of a call; it ends when dropped, or with [`ChildSpan::fail`].
pub(crate) struct ChildSpan<'a> {
    queue: &'a SpanQueue,
    span: Option<Open>,
    /// `error.type` and the description, once it failed.
    failed: Mutex<Option<(String, String)>>,
    /// Attributes set while it runs.
    extra: Mutex<Vec<Attribute>>,
}

impl ChildSpan<'_> {
    /// Marks the span failed with `error.type` and a description, and ends it.
    pub(crate) fn fail(self, error_type: &str, description: &str) {
        *self.failed.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((error_type.to_owned(), description.to_owned()));
    }

    /// Sets an attribute.
    pub(crate) fn set(&self, attribute: impl Into<Attribute>) {
        self.extra.lock().unwrap_or_else(PoisonError::into_inner).push(attribute.into());
    }

    /// The call's trace with this span as the one it passes on: what a tool's source sends out,
    /// so the server's span is a child of the tool's run.
    pub(crate) fn passed_on(&self, trace: &CallTrace) -> CallTrace {
        let mut passed = trace.clone();
        if let Some(span) = &self.span {
            passed.context.span_id = span.span_id;
        }
        passed
    }
}

/// The status of a span that may have failed, with `error.type` added to its attributes.
fn failed_status(attributes: &mut Vec<Attribute>, failed: Option<(String, String)>) -> Status {
    match failed {
        Some((error_type, description)) => {
            attributes.push(attr("error.type", error_type));
            Status::Error(Cow::Owned(description))
        }
        None => Status::Unset,
    }
}

impl Drop for ChildSpan<'_> {
    fn drop(&mut self) {
        let Some(mut span) = self.span.take() else { return };
        span.attributes.append(self.extra.get_mut().unwrap_or_else(PoisonError::into_inner));
        let failed = self.failed.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        let status = failed_status(&mut span.attributes, failed);
        span.finish(self.queue, Vec::new(), None, status);
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
    link: Option<Link>,
    /// Attributes set while it runs.
    extra: Mutex<Vec<Attribute>>,
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
        attributes: Vec<Attribute>,
    ) -> Option<DoorSpan> {
        let trace_id = caller.map_or_else(toolhost_envelope::new_trace_id, |caller| caller.parent.trace_id);
        if !sampling.sampled(&trace_id, caller.map(|caller| caller.parent.is_sampled())) {
            return None;
        }
        let parent = caller.and_then(|caller| parent_id(caller.parent.span_id));
        Some(DoorSpan {
            queue: queue.clone(),
            span: Some(Open {
                trace_id,
                span_id: toolhost_envelope::new_span_id(),
                parent,
                parent_remote: caller.is_some(),
                flags: TraceFlags::SAMPLED.to_u8(),
                trace_state: trace_state(caller.and_then(|caller| caller.tracestate.as_deref())),
                kind,
                name: Cow::Owned(name),
                start: unix_nanos(SystemTime::now()),
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
        self.link = self.span.as_ref().and_then(Open::link_to_parent);
        self
    }

    /// Sets an attribute.
    pub(crate) fn set(&self, attribute: impl Into<Attribute>) {
        self.extra.lock().unwrap_or_else(PoisonError::into_inner).push(attribute.into());
    }

    /// The context the door writes in its request: this span's.
    pub(crate) fn passed_on(&self) -> TraceContext {
        let (trace_id, span_id) =
            self.span.as_ref().map(|span| (span.trace_id, span.span_id)).unwrap_or_default();
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
        let failed = self.failed.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        let status = failed_status(&mut span.attributes, failed);
        span.finish(&self.queue, Vec::new(), self.link.take(), status);
    }
}
