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

/// Attributes that every span of one kind on one stream carries alike (the messaging system,
/// the operation, the stream, the group, the consumer), kept with their OTLP encoding: made once
/// per distinct set, for the process's life (the values come from the configuration, never
/// from a caller), so a span carries a reference and the encoder copies the bytes.
#[derive(Debug, PartialEq)]
pub(crate) struct SharedAttributes {
    pub attributes: Vec<Attribute>,
    /// Each attribute as a `Span.attributes` field, one after the other.
    pub encoded: Vec<u8>,
}

impl SharedAttributes {
    fn new(attributes: Vec<Attribute>) -> SharedAttributes {
        let encoded = super::otlp::span_attributes(&attributes);
        SharedAttributes { attributes, encoded }
    }

    /// Made once and kept for the process's life.
    pub(crate) fn leaked(attributes: Vec<Attribute>) -> &'static SharedAttributes {
        Box::leak(Box::new(SharedAttributes::new(attributes)))
    }
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
    /// The attributes shared with every span of its kind on its stream; written before
    /// `attributes`.
    pub shared: Option<&'static SharedAttributes>,
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

/// The wall clock now, in nanoseconds since the Unix epoch: read as `clock_gettime` gives it,
/// without `SystemTime`'s checked subtraction from the epoch (a span reads the clock at each of
/// its ends, so a sampled call does four times).
pub(crate) fn now_nanos() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME) {
        Ok(now) if now.tv_sec() >= 0 => (now.tv_sec() as u64) * 1_000_000_000 + now.tv_nsec() as u64,
        _ => unix_nanos(SystemTime::now()),
    }
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
    /// The attributes of a `settle` span on the stream `value`.
    settle_attributes: &'static SharedAttributes,
}

/// How many interned values of one kind a thread keeps at hand.
const RECENT: usize = 16;

/// The interned value `hit` finds among the thread's few most recently used ones (`recent`),
/// else what `miss` finds in the process's table, which then joins them: a call looks up the
/// same few values every time (its stream, group, consumer, tool), so it takes no lock.
fn recently<T: Copy + 'static>(
    recent: &'static std::thread::LocalKey<std::cell::RefCell<Vec<T>>>,
    hit: impl Fn(&T) -> bool,
    miss: impl FnOnce() -> Option<T>,
) -> Option<T> {
    recent.with(|recent| {
        if let Some(found) = recent.borrow().iter().find(|&item| hit(item)) {
            return Some(*found);
        }
        let found = miss()?;
        let mut recent = recent.borrow_mut();
        if recent.len() == RECENT {
            recent.remove(0);
        }
        recent.push(found);
        Some(found)
    })
}

/// The [`Fixed`] strings of `value`.
fn fixed(value: &str) -> &'static Fixed {
    thread_local! {
        static FIXED: std::cell::RefCell<Vec<&'static Fixed>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let found = recently(&FIXED, |fixed| fixed.value == value, || Some(interned(value)));
    found.unwrap_or_else(|| interned(value))
}

/// The process's [`Fixed`] strings of `value`, made the first time it is asked for.
fn interned(value: &str) -> &'static Fixed {
    static VALUES: RwLock<Option<HashMap<Box<str>, &'static Fixed>>> = RwLock::new(None);
    if let Some(fixed) =
        VALUES.read().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(|values| values.get(value))
    {
        return fixed;
    }
    let mut all = VALUES.write().unwrap_or_else(PoisonError::into_inner);
    all.get_or_insert_with(HashMap::new).entry(value.into()).or_insert_with(|| {
        let value: &'static str = Box::leak(value.into());
        Box::leak(Box::new(Fixed {
            value,
            process: Box::leak(format!("process {value}").into_boxed_str()),
            settle: Box::leak(format!("settle {value}").into_boxed_str()),
            settle_attributes: SharedAttributes::leaked(vec![
                attr("messaging.system", MESSAGING_SYSTEM),
                attr("messaging.operation.type", "settle"),
                attr("messaging.operation.name", "ack"),
                attr("messaging.destination.name", value),
            ]),
        }))
    })
}

/// The attributes of a `process` span that are the same for every call one consumer takes
/// from one stream through one door, made once per distinct set. The values are interned
/// already (`door` is a literal), so the set is found by their addresses.
fn process_attributes(
    door: &'static str,
    stream: &'static str,
    group: &'static str,
    consumer: &'static str,
) -> &'static SharedAttributes {
    type Key = [(usize, usize); 4];
    thread_local! {
        static SETS: std::cell::RefCell<Vec<(Key, &'static SharedAttributes)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    static ALL: Mutex<Option<HashMap<Key, &'static SharedAttributes>>> = Mutex::new(None);
    let key: Key = [door, stream, group, consumer].map(|value| (value.as_ptr() as usize, value.len()));
    let interned = || {
        let mut all = ALL.lock().unwrap_or_else(PoisonError::into_inner);
        *all.get_or_insert_with(HashMap::new).entry(key).or_insert_with(|| {
            SharedAttributes::leaked(vec![
                attr("messaging.system", MESSAGING_SYSTEM),
                attr("messaging.operation.type", "process"),
                attr("messaging.operation.name", "process"),
                attr("messaging.destination.name", stream),
                attr("messaging.consumer.group.name", group),
                attr("messaging.client.id", consumer),
                attr("toolhost.door", door),
            ])
        })
    };
    let found = recently(&SETS, |(at, _)| *at == key, || Some((key, interned())));
    found.map_or_else(interned, |(_, found)| found)
}

/// `<operation> <name>` (a run span's name) made once per tool, with `name` as its tail: a
/// call's run span then allocates neither. Tool names come from the catalog, which a hosted
/// server can change over time, so at most [`MAX_RUN_NAMES`] are kept; past that, `None`, and
/// the span makes its own.
fn run_name(operation: &'static str, name: &str) -> Option<&'static str> {
    thread_local! {
        static NAMES: std::cell::RefCell<Vec<(&'static str, &'static str)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    type Names = HashMap<(&'static str, Box<str>), &'static str>;
    static ALL: Mutex<Option<Names>> = Mutex::new(None);
    let hit = |&(op, full): &(&'static str, &'static str)| {
        std::ptr::eq(op, operation)
            && full.len() == operation.len() + 1 + name.len()
            && full.starts_with(operation)
            && full.ends_with(name)
    };
    let miss = || {
        let mut all = ALL.lock().unwrap_or_else(PoisonError::into_inner);
        let all = all.get_or_insert_with(HashMap::new);
        let full = match all.get(&(operation, name.into())) {
            Some(full) => *full,
            None if all.len() < MAX_RUN_NAMES => {
                let full: &'static str = Box::leak(format!("{operation} {name}").into_boxed_str());
                all.insert((operation, name.into()), full);
                full
            }
            None => return None,
        };
        Some((operation, full))
    };
    recently(&NAMES, hit, miss).map(|(_, full)| full)
}

/// How many run span names [`run_name`] keeps.
const MAX_RUN_NAMES: usize = 4096;

/// The run span's name and the tool's name as attribute values: shared when interned.
fn run_strings(operation: &'static str, name: &str) -> (Cow<'static, str>, Value) {
    match run_name(operation, name) {
        Some(full) => (Cow::Borrowed(full), Value::Static(&full[operation.len() + 1..])),
        None => (Cow::Owned(format!("{operation} {name}")), Value::Text(name.to_owned())),
    }
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
    shared: Option<&'static SharedAttributes>,
    attributes: Vec<Attribute>,
}

impl Open {
    /// The span, ended now.
    fn finish(self, events: Vec<Event>, link: Option<Link>, status: Status) -> Span {
        Span {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            parent_remote: self.parent_remote,
            flags: self.flags,
            trace_state: self.trace_state,
            kind: self.kind,
            name: self.name,
            start: self.start,
            end: now_nanos(),
            shared: self.shared,
            attributes: self.attributes,
            events,
            link,
            status,
        }
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
    /// The call's child spans that have ended, offered with the call's own when it ends: one
    /// offer to the export queue per call.
    children: Mutex<Vec<Span>>,
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
        let shared = process_attributes(
            delivery.door,
            names.value,
            fixed(delivery.group).value,
            fixed(delivery.consumer).value,
        );
        let mut attributes = Vec::with_capacity(6);
        attributes.extend([
            attr("messaging.message.id", delivery.entry_id.to_owned()),
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
            shared: Some(shared),
            attributes,
        };
        Some(CallSpan {
            queue: queue.clone(),
            // The admit, run and settle spans, and the call's own.
            children: Mutex::new(Vec::with_capacity(4)),
            link: span.link_to_parent(),
            span,
            names,
            events: Vec::new(),
            record_arguments,
        })
    }

    /// A child span of the call, started at `start`.
    fn child(
        &self,
        name: Cow<'static, str>,
        kind: SpanKind,
        shared: Option<&'static SharedAttributes>,
        attributes: Vec<Attribute>,
        start: u64,
    ) -> ChildSpan<'_> {
        let parent = &self.span;
        ChildSpan {
            sink: &self.children,
            span: Some(Open {
                trace_id: parent.trace_id,
                span_id: new_span_id(),
                parent: Some(parent.span_id),
                parent_remote: false,
                flags: parent.flags,
                trace_state: parent.trace_state.clone(),
                kind,
                name,
                start,
                shared,
                attributes,
            }),
            failed: Mutex::new(None),
            extra: Mutex::new(Vec::new()),
        }
    }

    /// The `admit` span, from `started`: the signature, the tenant's policy and limits.
    pub(crate) fn admit(&self, started: SystemTime) -> ChildSpan<'_> {
        self.child(Cow::Borrowed("admit"), SpanKind::Internal, None, Vec::new(), unix_nanos(started))
    }

    /// The span of the tool's run: `tools/call <name>` (CLIENT, by the MCP conventions) toward
    /// an MCP server, `execute_tool <tool>` otherwise (CLIENT toward an HTTP service or an
    /// agent, INTERNAL for a tool that runs here).
    pub(crate) fn run(&self, tool: &str, remote: Option<&Remote>) -> ChildSpan<'_> {
        let operation = attr("gen_ai.operation.name", "execute_tool");
        let (name, kind, attributes) = match remote {
            Some(remote) if remote.system == "mcp" => {
                let (name, server_tool) = run_strings("tools/call", &remote.name);
                (
                    name,
                    SpanKind::Client,
                    vec![
                        operation,
                        attr("mcp.method.name", "tools/call"),
                        attr("gen_ai.tool.name", server_tool),
                        attr("toolhost.tool", tool.to_owned()),
                        attr("server.address", remote.target.clone()),
                        attr("network.transport", remote.transport),
                    ],
                )
            }
            Some(remote) => {
                let (name, tool) = run_strings("execute_tool", tool);
                (
                    name,
                    SpanKind::Client,
                    vec![
                        operation,
                        attr("gen_ai.tool.name", tool),
                        attr("toolhost.remote.system", remote.system),
                        attr("server.address", remote.target.clone()),
                    ],
                )
            }
            None => {
                let (name, tool) = run_strings("execute_tool", tool);
                (name, SpanKind::Internal, vec![operation, attr("gen_ai.tool.name", tool)])
            }
        };
        self.child(name, kind, None, attributes, now_nanos())
    }

    /// The `settle` span: the commit of the answer, the marks and the ack.
    pub(crate) fn settle(&self) -> ChildSpan<'_> {
        self.child(
            Cow::Borrowed(self.names.settle),
            SpanKind::Client,
            Some(self.names.settle_attributes),
            Vec::new(),
            now_nanos(),
        )
    }

    /// Sets an attribute of the `process` span.
    pub(crate) fn set(&mut self, attribute: impl Into<Attribute>) {
        self.span.attributes.push(attribute.into());
    }

    /// Adds an event to the `process` span.
    pub(crate) fn event(&mut self, name: &'static str, attributes: Vec<Attribute>) {
        self.events.push(Event { name, time: now_nanos(), attributes });
    }

    /// Ends the `process` span with the call's outcome: `error.type` and an error status for an
    /// answer that is an error (refusals, timeouts and cancels included) or a dead letter.
    pub(crate) fn end(self, outcome: &'static str, error: Option<&'static str>) {
        let CallSpan { queue, children, mut span, link, events, .. } = self;
        span.attributes.push(attr("toolhost.outcome", outcome));
        let status = match error {
            Some(error) => {
                span.attributes.push(attr("error.type", error));
                Status::Error(Cow::Borrowed(error))
            }
            None => Status::Unset,
        };
        let mut spans = children.into_inner().unwrap_or_else(PoisonError::into_inner);
        spans.push(span.finish(events, link, status));
        queue.offer(spans);
    }
}

/// A child span of a call; it ends when dropped, or with [`ChildSpan::fail`], and is exported
/// with the call's `process` span (a call that never ends its span exports neither).
pub(crate) struct ChildSpan<'a> {
    sink: &'a Mutex<Vec<Span>>,
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
        let span = span.finish(Vec::new(), None, status);
        self.sink.lock().unwrap_or_else(PoisonError::into_inner).push(span);
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
                start: now_nanos(),
                shared: None,
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
        self.queue.offer(vec![span.finish(Vec::new(), self.link.take(), status)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_span_name_is_made_once_and_its_tail_is_the_tool() {
        let (name, tool) = run_strings("execute_tool", "echo");
        assert_eq!(name, "execute_tool echo");
        assert_eq!(tool, Value::Static("echo"));
        let (again, _) = run_strings("execute_tool", "echo");
        let (Cow::Borrowed(first), Cow::Borrowed(second)) = (name, again) else { panic!("interned") };
        assert!(std::ptr::eq(first, second), "the same string, not a copy");
        let (other, _) = run_strings("tools/call", "echo");
        assert_eq!(other, "tools/call echo");
        // A name that only shares the operation's length is not mistaken for another.
        assert_eq!(run_strings("execute_tool", "ecko").0, "execute_tool ecko");
    }

    #[test]
    fn a_value_pushed_out_of_the_threads_recent_ones_is_still_the_one_interned() {
        let first = fixed("recent-0");
        for n in 1..=RECENT {
            fixed(&format!("recent-{n}"));
        }
        // `recent-0` left the thread's list; the process's table still gives the same strings.
        assert!(std::ptr::eq(first, fixed("recent-0")));
        assert_eq!((first.process, first.settle), ("process recent-0", "settle recent-0"));
    }

    #[test]
    fn past_the_cap_a_run_span_name_is_made_per_call() {
        let mut made = 0;
        for n in 0..=MAX_RUN_NAMES {
            if run_name("execute_tool", &format!("cap-test-{n}")).is_none() {
                made += 1;
            }
        }
        assert!(made >= 1, "at most {MAX_RUN_NAMES} names are kept");
        let (name, tool) = run_strings("execute_tool", "cap-test-beyond");
        assert_eq!(
            (name.as_ref(), tool),
            ("execute_tool cap-test-beyond", Value::Text("cap-test-beyond".to_owned()))
        );
    }

    #[test]
    fn the_shared_process_attributes_are_made_once_per_stream_group_and_consumer() {
        let (stream, group, consumer) = (fixed("s1").value, fixed("g1").value, fixed("c1").value);
        let first = process_attributes("requests", stream, group, consumer);
        assert!(std::ptr::eq(first, process_attributes("requests", stream, group, consumer)));
        let other = process_attributes("requests", stream, fixed("g2").value, consumer);
        assert!(!std::ptr::eq(first, other));
        let value = |set: &SharedAttributes, key: &str| {
            set.attributes
                .iter()
                .find(|attribute| attribute.key == key)
                .map(|attribute| attribute.value.clone())
        };
        assert_eq!(value(first, "messaging.consumer.group.name"), Some(Value::Static("g1")));
        assert_eq!(value(other, "messaging.consumer.group.name"), Some(Value::Static("g2")));
        assert_eq!(first.encoded, super::super::otlp::span_attributes(&first.attributes));
        let settle = fixed("s1").settle_attributes;
        assert_eq!(value(settle, "messaging.operation.type"), Some(Value::Static("settle")));
        assert_eq!(value(settle, "messaging.destination.name"), Some(Value::Static("s1")));
    }
}
