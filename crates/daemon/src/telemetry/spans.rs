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
//! Nothing of the SDK's span types is made per span. A sampled call's span ([`CallSpan`]) keeps
//! its fields as they are, the call's own strings borrowed, and each of its spans is written as
//! OTLP protobuf ([`super::otlp`]) from a borrowed view ([`SpanRef`]) when it ends, into the
//! call's buffer, which the export queue ([`super::otel`]) takes whole when the call ends; over
//! gRPC the view becomes a [`Span`] instead, plain data with attributes keyed by static strings,
//! as a door's span is. Names and attribute values that are the same for every call are static
//! strings, and the strings a reader or a tool repeats are made once ([`call_names`],
//! [`run_names`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
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

impl Span {
    /// The span borrowed, as the encoder writes it.
    pub(crate) fn as_ref(&self) -> SpanRef<'_> {
        SpanRef {
            trace_id: &self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            parent_remote: self.parent_remote,
            flags: self.flags,
            trace_state: self.trace_state.as_ref(),
            kind: &self.kind,
            name: &self.name,
            start: self.start,
            end: self.end,
            shared: self.shared,
            texts: &[],
            attributes: [&self.attributes, &[], &[]],
            events: &self.events,
            link: self.link.as_ref(),
            error: match &self.status {
                Status::Unset => None,
                Status::Error(description) => Some(description),
            },
        }
    }
}

/// A finished span whose fields are borrowed from where they were kept while it ran: a call's
/// spans are written from it straight into the bytes the export queue takes, with no [`Span`]
/// made ([`CallSpan`]), and a [`Span`] is written through it too.
pub(crate) struct SpanRef<'a> {
    pub trace_id: &'a [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub parent_remote: bool,
    pub flags: u8,
    pub trace_state: Option<&'a Arc<str>>,
    pub kind: &'a SpanKind,
    pub name: &'a str,
    pub start: u64,
    pub end: u64,
    pub shared: Option<&'static SharedAttributes>,
    /// Text attributes whose values are borrowed, written after `shared`.
    pub texts: &'a [(&'static str, &'a str)],
    /// The other attributes, written after `texts`, list by list.
    pub attributes: [&'a [Attribute]; 3],
    pub events: &'a [Event],
    pub link: Option<&'a Link>,
    /// The status: unset, or an error with its description.
    pub error: Option<&'a str>,
}

impl SpanRef<'_> {
    /// The span, owned: what the gRPC exporter takes.
    pub(crate) fn to_span(&self) -> Span {
        let texts = self.texts.iter().map(|(key, value)| attr(key, (*value).to_owned()));
        let others = self.attributes.iter().flat_map(|attributes| attributes.iter().cloned());
        Span {
            trace_id: *self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            parent_remote: self.parent_remote,
            flags: self.flags,
            trace_state: self.trace_state.cloned(),
            kind: self.kind.clone(),
            name: Cow::Owned(self.name.to_owned()),
            start: self.start,
            end: self.end,
            shared: self.shared,
            attributes: texts.chain(others).collect(),
            events: self.events.to_vec(),
            link: self.link.cloned(),
            status: self
                .error
                .map_or(Status::Unset, |description| Status::Error(Cow::Owned(description.to_owned()))),
        }
    }
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
#[derive(Clone, Copy)]
pub(crate) struct Delivery<'a> {
    /// The names and attributes the calls of its reader share ([`call_names`]).
    pub names: &'static CallNames,
    /// The stream entry id.
    pub entry_id: &'a str,
    /// The entry's delivery count.
    pub deliveries: u64,
    /// The request id.
    pub request_id: &'a str,
    /// The tool's label, when it names one.
    pub tool: Option<&'a str>,
}

/// The span names and attributes that every call one consumer takes from one stream through
/// one door shares: made once per distinct set and kept for the process's life ([`call_names`]).
/// The values come from the configuration (the door's streams, the toolbox id, the replica's
/// consumer name), never from a caller, so there are few of them.
pub(crate) struct CallNames {
    /// `process <stream>`, the name of the `process` spans.
    process: &'static str,
    /// `settle <stream>`.
    settle: &'static str,
    /// The attributes of a `process` span.
    process_attributes: &'static SharedAttributes,
    /// The attributes of a `settle` span.
    settle_attributes: &'static SharedAttributes,
}

/// The [`CallNames`] of the calls `consumer` takes from `stream` for `group` through `door`:
/// looked up once per reader, not per call.
pub(crate) fn call_names(
    door: &'static str,
    stream: &str,
    group: &str,
    consumer: &str,
) -> &'static CallNames {
    type Key = (&'static str, String, String, String);
    static ALL: Mutex<Option<HashMap<Key, &'static CallNames>>> = Mutex::new(None);
    let mut all = ALL.lock().unwrap_or_else(PoisonError::into_inner);
    let key = (door, stream.to_owned(), group.to_owned(), consumer.to_owned());
    all.get_or_insert_with(HashMap::new).entry(key).or_insert_with(|| {
        let leak = |value: String| -> &'static str { Box::leak(value.into_boxed_str()) };
        let (stream, group, consumer) =
            (leak(stream.to_owned()), leak(group.to_owned()), leak(consumer.to_owned()));
        Box::leak(Box::new(CallNames {
            process: leak(format!("process {stream}")),
            settle: leak(format!("settle {stream}")),
            process_attributes: SharedAttributes::leaked(vec![
                attr("messaging.system", MESSAGING_SYSTEM),
                attr("messaging.operation.type", "process"),
                attr("messaging.operation.name", "process"),
                attr("messaging.destination.name", stream),
                attr("messaging.consumer.group.name", group),
                attr("messaging.client.id", consumer),
                attr("toolhost.door", door),
            ]),
            settle_attributes: SharedAttributes::leaked(vec![
                attr("messaging.system", MESSAGING_SYSTEM),
                attr("messaging.operation.type", "settle"),
                attr("messaging.operation.name", "ack"),
                attr("messaging.destination.name", stream),
            ]),
        }))
    })
}

/// How many interned values of one kind a thread keeps at hand.
const RECENT: usize = 16;

/// The interned value `hit` finds among the thread's few most recently used ones (`recent`),
/// else what `miss` finds in the process's table, which then joins them: a call looks up the
/// same few values every time (its tool), so it takes no lock.
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

/// A run span's name, `<operation> <name>`, and the attributes every run of that tool carries
/// alike: `gen_ai.operation.name`, for `tools/call` `mcp.method.name`, and `gen_ai.tool.name`
/// (`name`, the name's tail).
struct RunNames {
    operation: &'static str,
    name: &'static str,
    attributes: &'static SharedAttributes,
}

/// The [`RunNames`] of `name` under `operation`, made once per tool: a call's run span then
/// allocates nothing. Tool names come from the catalog, which a hosted server can change over
/// time, so at most [`MAX_RUN_NAMES`] are kept; past that, `None`, and the span makes its own.
fn run_names(operation: &'static str, name: &str) -> Option<&'static RunNames> {
    thread_local! {
        static NAMES: std::cell::RefCell<Vec<&'static RunNames>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    type Names = HashMap<(&'static str, Box<str>), &'static RunNames>;
    static ALL: Mutex<Option<Names>> = Mutex::new(None);
    let hit = |names: &&'static RunNames| {
        std::ptr::eq(names.operation, operation)
            && names.name.len() == operation.len() + 1 + name.len()
            && names.name.ends_with(name)
    };
    let miss = || {
        let mut all = ALL.lock().unwrap_or_else(PoisonError::into_inner);
        let all = all.get_or_insert_with(HashMap::new);
        match all.get(&(operation, name.into())) {
            Some(names) => Some(*names),
            None if all.len() < MAX_RUN_NAMES => {
                let full: &'static str = Box::leak(format!("{operation} {name}").into_boxed_str());
                let names: &'static RunNames = Box::leak(Box::new(RunNames {
                    operation,
                    name: full,
                    attributes: SharedAttributes::leaked(run_attributes(
                        operation,
                        &full[operation.len() + 1..],
                    )),
                }));
                all.insert((operation, name.into()), names);
                Some(names)
            }
            None => None,
        }
    };
    recently(&NAMES, hit, miss)
}

/// How many run span names [`run_names`] keeps.
const MAX_RUN_NAMES: usize = 4096;

/// The attributes a run span of `name` under `operation` starts with.
fn run_attributes(operation: &'static str, name: impl Into<Value>) -> Vec<Attribute> {
    let mut attributes = vec![attr("gen_ai.operation.name", "execute_tool")];
    if operation == "tools/call" {
        attributes.push(attr("mcp.method.name", "tools/call"));
    }
    attributes.push(attr("gen_ai.tool.name", name));
    attributes
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

    /// The link to this span's parent; `None` for a root span.
    fn link_to_parent(&self) -> Option<Link> {
        parent_link(self.trace_id, self.parent, self.flags, self.trace_state.as_ref())
    }
}

/// The link to a span's parent, a context from another process (the messaging conventions'
/// link to a message's creation context); `None` without a parent.
fn parent_link(
    trace_id: [u8; 16],
    parent: Option<[u8; 8]>,
    flags: u8,
    trace_state: Option<&Arc<str>>,
) -> Option<Link> {
    Some(Link { trace_id, span_id: parent?, flags, trace_state: trace_state.cloned(), remote: true })
}

/// A parent span id as the envelope gives it; all zero is no parent.
fn parent_id(span_id: [u8; 8]) -> Option<[u8; 8]> {
    (span_id != [0; 8]).then_some(span_id)
}

/// The `process` span of one sampled call, and what its children are made with. Its fields
/// are kept as they are (the call's own strings borrowed) until the call ends; each child span
/// is written when it ends into the call's spans, in the form the export queue takes, and the
/// call's whole set is offered at once when the `process` span ends.
pub(crate) struct CallSpan<'a> {
    queue: &'a SpanQueue,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    /// The caller's span id; `None` for a root span.
    parent: Option<[u8; 8]>,
    flags: u8,
    trace_state: Option<Arc<str>>,
    /// Nanoseconds since the Unix epoch.
    start: u64,
    delivery: Delivery<'a>,
    /// The call's child spans that have ended.
    ended: Mutex<Ended>,
    /// Attributes set while it runs.
    attributes: Vec<Attribute>,
    events: Vec<Event>,
    link: Option<Link>,
    /// Whether arguments and results become attributes.
    pub record_arguments: bool,
}

/// A call's spans that have ended, as its queue takes them.
enum Ended {
    /// Written by [`super::otlp::push_span`] (OTLP/HTTP), and how many.
    Encoded(Vec<u8>, usize),
    /// As they are, for the gRPC exporter.
    Spans(Vec<Span>),
}

impl Ended {
    fn add(&mut self, span: &SpanRef<'_>) {
        match self {
            Ended::Encoded(bytes, spans) => {
                super::otlp::push_span(span, bytes);
                *spans += 1;
            }
            Ended::Spans(spans) => spans.push(span.to_span()),
        }
    }
}

/// How many bytes a call's four spans take, about: their buffer is made that large once.
const CALL_SPANS_BYTES: usize = 1536;

impl<'a> CallSpan<'a> {
    /// Starts the `process` span of a call with the ids the call was given at admission: a
    /// child of the caller's span, linked to it as the messaging conventions link a message's
    /// creation context. `None` when the call is not sampled.
    pub(crate) fn start(
        queue: &'a SpanQueue,
        record_arguments: bool,
        trace: &CallTrace,
        delivery: Delivery<'a>,
        started: SystemTime,
    ) -> Option<CallSpan<'a>> {
        if !trace.context.is_sampled() {
            return None;
        }
        let parent = trace.parent.and_then(parent_id);
        let trace_state = trace_state(trace.tracestate.as_deref());
        let link = parent_link(trace.context.trace_id, parent, trace.context.flags, trace_state.as_ref());
        let ended = if queue.encodes() {
            Ended::Encoded(Vec::with_capacity(CALL_SPANS_BYTES), 0)
        } else {
            // The admit, run and settle spans, and the call's own.
            Ended::Spans(Vec::with_capacity(4))
        };
        Some(CallSpan {
            queue,
            trace_id: trace.context.trace_id,
            span_id: trace.context.span_id,
            parent,
            flags: trace.context.flags,
            trace_state,
            start: unix_nanos(started),
            delivery,
            ended: Mutex::new(ended),
            attributes: Vec::new(),
            events: Vec::new(),
            link,
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
        ChildSpan {
            call: self,
            span_id: new_span_id(),
            name,
            kind,
            start,
            shared,
            attributes,
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
        let (operation, name, kind) = match remote {
            Some(remote) if remote.system == "mcp" => ("tools/call", remote.name.as_str(), SpanKind::Client),
            Some(_) => ("execute_tool", tool, SpanKind::Client),
            None => ("execute_tool", tool, SpanKind::Internal),
        };
        // What only some runs carry, after the attributes every run of the tool carries.
        let more = match remote {
            Some(remote) if remote.system == "mcp" => vec![
                attr("toolhost.tool", tool.to_owned()),
                attr("server.address", remote.target.clone()),
                attr("network.transport", remote.transport),
            ],
            Some(remote) => {
                vec![
                    attr("toolhost.remote.system", remote.system),
                    attr("server.address", remote.target.clone()),
                ]
            }
            None => Vec::new(),
        };
        let start = now_nanos();
        match run_names(operation, name) {
            Some(names) => self.child(Cow::Borrowed(names.name), kind, Some(names.attributes), more, start),
            None => {
                let mut attributes = run_attributes(operation, name.to_owned());
                attributes.extend(more);
                self.child(Cow::Owned(format!("{operation} {name}")), kind, None, attributes, start)
            }
        }
    }

    /// The `settle` span: the commit of the answer, the marks and the ack.
    pub(crate) fn settle(&self) -> ChildSpan<'_> {
        let names = self.delivery.names;
        self.child(
            Cow::Borrowed(names.settle),
            SpanKind::Client,
            Some(names.settle_attributes),
            Vec::new(),
            now_nanos(),
        )
    }

    /// Sets an attribute of the `process` span.
    pub(crate) fn set(&mut self, attribute: impl Into<Attribute>) {
        self.attributes.push(attribute.into());
    }

    /// Adds an event to the `process` span.
    pub(crate) fn event(&mut self, name: &'static str, attributes: Vec<Attribute>) {
        self.events.push(Event { name, time: now_nanos(), attributes });
    }

    /// Ends the `process` span with the call's outcome: `error.type` and an error status for an
    /// answer that is an error (refusals, timeouts and cancels included) or a dead letter.
    pub(crate) fn end(self, outcome: &'static str, error: Option<&'static str>) {
        let delivery = &self.delivery;
        let texts = [
            ("messaging.message.id", delivery.entry_id),
            ("toolhost.request_id", delivery.request_id),
            ("gen_ai.tool.name", delivery.tool.unwrap_or_default()),
        ];
        let texts = if delivery.tool.is_some() { &texts[..] } else { &texts[..2] };
        let counted = [attr("messaging.redis_streams.delivery_count", delivery.deliveries as i64)];
        let counted = if delivery.deliveries > 1 { &counted[..] } else { &[] };
        let outcome = [attr("toolhost.outcome", outcome), attr("error.type", error.unwrap_or_default())];
        let outcome = if error.is_some() { &outcome[..] } else { &outcome[..1] };
        let span = SpanRef {
            trace_id: &self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            parent_remote: self.parent.is_some(),
            flags: self.flags,
            trace_state: self.trace_state.as_ref(),
            kind: &SpanKind::Consumer,
            name: delivery.names.process,
            start: self.start,
            end: now_nanos(),
            shared: Some(delivery.names.process_attributes),
            texts,
            attributes: [counted, &self.attributes, outcome],
            events: &self.events,
            link: self.link.as_ref(),
            error,
        };
        let mut ended = self.ended.into_inner().unwrap_or_else(PoisonError::into_inner);
        ended.add(&span);
        match ended {
            Ended::Encoded(bytes, spans) => self.queue.offer_encoded(&bytes, spans),
            Ended::Spans(spans) => self.queue.offer(spans),
        }
    }
}

/// A child span of a call; it ends when dropped, or with [`ChildSpan::fail`], and is exported
/// with the call's `process` span (a call that never ends its span exports neither).
pub(crate) struct ChildSpan<'c> {
    call: &'c CallSpan<'c>,
    span_id: [u8; 8],
    name: Cow<'static, str>,
    kind: SpanKind,
    /// Nanoseconds since the Unix epoch.
    start: u64,
    shared: Option<&'static SharedAttributes>,
    attributes: Vec<Attribute>,
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
        passed.context.span_id = self.span_id;
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
        let end = now_nanos();
        let extra = std::mem::take(self.extra.get_mut().unwrap_or_else(PoisonError::into_inner));
        let failed = self.failed.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        let error_type = failed.as_ref().map(|(error_type, _)| attr("error.type", error_type.clone()));
        let call = self.call;
        let span = SpanRef {
            trace_id: &call.trace_id,
            span_id: self.span_id,
            parent: Some(call.span_id),
            parent_remote: false,
            flags: call.flags,
            trace_state: call.trace_state.as_ref(),
            kind: &self.kind,
            name: &self.name,
            start: self.start,
            end,
            shared: self.shared,
            texts: &[],
            attributes: [&self.attributes, &extra, error_type.as_slice()],
            events: &[],
            link: None,
            error: failed.as_ref().map(|(_, description)| description.as_str()),
        };
        call.ended.lock().unwrap_or_else(PoisonError::into_inner).add(&span);
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
    fn a_run_spans_names_are_made_once_and_its_tool_is_the_names_tail() {
        let names = run_names("execute_tool", "echo").unwrap();
        assert_eq!(names.name, "execute_tool echo");
        let again = run_names("execute_tool", "echo").unwrap();
        assert!(std::ptr::eq(names, again), "the same names, not a copy");
        assert_eq!(
            names.attributes.attributes,
            [attr("gen_ai.operation.name", "execute_tool"), attr("gen_ai.tool.name", "echo")]
        );
        let other = run_names("tools/call", "echo").unwrap();
        assert_eq!(other.name, "tools/call echo");
        assert_eq!(other.attributes.attributes[1], attr("mcp.method.name", "tools/call"));
        // A name that only shares the operation's length is not mistaken for another.
        assert_eq!(run_names("execute_tool", "ecko").unwrap().name, "execute_tool ecko");
    }

    #[test]
    fn a_name_pushed_out_of_the_threads_recent_ones_is_still_the_one_interned() {
        let first = run_names("execute_tool", "recent-0").unwrap();
        for n in 1..=RECENT {
            run_names("execute_tool", &format!("recent-{n}"));
        }
        // `recent-0` left the thread's list; the process's table still gives the same names.
        assert!(std::ptr::eq(first, run_names("execute_tool", "recent-0").unwrap()));
    }

    #[test]
    fn past_the_cap_a_run_span_name_is_made_per_call() {
        let mut made = 0;
        for n in 0..=MAX_RUN_NAMES {
            if run_names("execute_tool", &format!("cap-test-{n}")).is_none() {
                made += 1;
            }
        }
        assert!(made >= 1, "at most {MAX_RUN_NAMES} names are kept");
    }

    #[test]
    fn the_names_of_a_readers_calls_are_made_once_per_stream_group_and_consumer() {
        let first = call_names("requests", "s1", "g1", "c1");
        assert!(std::ptr::eq(first, call_names("requests", "s1", "g1", "c1")));
        let other = call_names("requests", "s1", "g2", "c1");
        assert!(!std::ptr::eq(first, other));
        assert_eq!((first.process, first.settle), ("process s1", "settle s1"));
        let value = |set: &SharedAttributes, key: &str| {
            set.attributes
                .iter()
                .find(|attribute| attribute.key == key)
                .map(|attribute| attribute.value.clone())
        };
        assert_eq!(
            value(first.process_attributes, "messaging.consumer.group.name"),
            Some(Value::Static("g1"))
        );
        assert_eq!(
            value(other.process_attributes, "messaging.consumer.group.name"),
            Some(Value::Static("g2"))
        );
        assert_eq!(
            first.process_attributes.encoded,
            super::super::otlp::span_attributes(&first.process_attributes.attributes)
        );
        assert_eq!(value(first.settle_attributes, "messaging.operation.type"), Some(Value::Static("settle")));
        assert_eq!(value(first.settle_attributes, "messaging.destination.name"), Some(Value::Static("s1")));
    }
}
