//! OTLP's `ExportTraceServiceRequest`, encoded straight from toolhost's spans into one buffer
//! per batch.
//!
//! The SDK's exporter turns each span into the generated protobuf structs (an owned `String`
//! or `Vec` per name, id, key and value) and then encodes those; here each field is written as
//! it is, from a borrowed view of the span ([`SpanRef`]), by one writer ([`push_span`]). A
//! sampled call's spans are written when each ends into the call's buffer, which the queue copies
//! into the [`Body`] of the batch being filled; a span kept as a struct (a door's, or a test's) is
//! written into the body when it is offered. The export task writes only the request's head in
//! front of a full batch. A batch is one `ResourceSpans` with one `ScopeSpans`: the resource and
//! the scope are encoded once, when the pipeline starts, and copied into every batch's head. The
//! field numbers and wire types are those of `opentelemetry/proto/trace/v1/trace.proto` and
//! `common/v1/common.proto`; the unit tests decode what is written here with the
//! `opentelemetry-proto` crate's generated types and compare it with what the SDK's own
//! conversion makes of the same span.

use opentelemetry::trace::SpanKind;
use prost::encoding::{WireType, encode_varint, encoded_len_varint, key_len};

use super::spans::{Attribute, Event, Link, SpanRef, Value};

/// `Span.flags`: the low 8 bits are the W3C trace flags; these say whether the parent (or the
/// link's context) is remote, and that the flags say so (`SpanFlags` in trace.proto).
const CONTEXT_HAS_IS_REMOTE: u32 = 0x100;
const CONTEXT_IS_REMOTE: u32 = 0x200;

/// Encodes batches of spans for one resource and one instrumentation scope.
pub(crate) struct Encoder {
    /// `ResourceSpans.resource` (field 1), tag and length included.
    resource: Vec<u8>,
    /// `ScopeSpans.scope` (field 1), tag and length included.
    scope: Vec<u8>,
}

/// The spans of one export request, encoded as they were offered (each a `ScopeSpans.spans`
/// field) after room for the request's head, which [`Encoder::finish`] writes in front of them
/// when the batch is sent: a span is encoded once, by the thread that ended it, and the body
/// goes to the HTTP client without a copy.
#[derive(Debug)]
pub(crate) struct Body {
    bytes: Vec<u8>,
    /// Where the spans start: the room left for the head.
    room: usize,
    spans: usize,
}

impl Body {
    /// Appends `span`.
    pub(crate) fn push(&mut self, span: &SpanRef<'_>) {
        push_span(span, &mut self.bytes);
        self.spans += 1;
    }

    /// Appends `spans` spans that [`push_span`] wrote into `bytes`.
    pub(crate) fn extend(&mut self, bytes: &[u8], spans: usize) {
        self.bytes.extend_from_slice(bytes);
        self.spans += spans;
    }

    /// How many spans it holds.
    pub(crate) fn spans(&self) -> usize {
        self.spans
    }

    /// Its size in bytes, the room for the head included.
    pub(crate) fn size(&self) -> usize {
        self.bytes.len()
    }
}

/// The most bytes a length's varint takes.
const MAX_VARINT_LEN: usize = 10;

impl Encoder {
    /// An encoder for spans of `resource` (its attributes) and of the scope named `scope`.
    pub(crate) fn new(resource: &[Attribute], scope: &str) -> Encoder {
        let mut resource_message = Vec::new();
        for attribute in resource {
            message(1, key_value_len(attribute), &mut resource_message, |buf| key_value(attribute, buf));
        }
        let mut scope_message = Vec::new();
        string(1, scope, &mut scope_message);
        let mut encoder = Encoder { resource: Vec::new(), scope: Vec::new() };
        message(1, resource_message.len(), &mut encoder.resource, |buf| {
            buf.extend_from_slice(&resource_message);
        });
        message(1, scope_message.len(), &mut encoder.scope, |buf| buf.extend_from_slice(&scope_message));
        encoder
    }

    /// The most the head of a request can take: the resource and the scope, and the tags and
    /// lengths of the two messages that hold them.
    fn head_room(&self) -> usize {
        self.resource.len() + self.scope.len() + 2 * (key_len(2) + MAX_VARINT_LEN)
    }

    /// An empty body, with room for `capacity` bytes (a previous batch's size) so that filling
    /// it does not grow it: and for an eighth more, since the next batch's spans may be longer
    /// (growing a batch's body copies all of it), and one byte, since a span is written after
    /// two bytes left for its length, one of which a short span gives back ([`delimited`]).
    pub(crate) fn body(&self, capacity: usize) -> Body {
        let room = self.head_room();
        let mut bytes = Vec::with_capacity(capacity.max(room) + capacity / 8 + 1);
        bytes.resize(room, 0);
        Body { bytes, room, spans: 0 }
    }

    /// The `ExportTraceServiceRequest` of `body`'s spans: the head written in the room left for
    /// it, the spans where they are.
    pub(crate) fn finish(&self, body: Body) -> bytes::Bytes {
        let Body { mut bytes, room, .. } = body;
        let scope_spans_len = self.scope.len() + (bytes.len() - room);
        let resource_spans_len = self.resource.len() + field_len(2, scope_spans_len);
        let mut head = Vec::with_capacity(room);
        // ExportTraceServiceRequest.resource_spans = 1
        header(1, resource_spans_len, &mut head);
        head.extend_from_slice(&self.resource);
        // ResourceSpans.scope_spans = 2
        header(2, scope_spans_len, &mut head);
        head.extend_from_slice(&self.scope);
        let start = room - head.len();
        bytes[start..room].copy_from_slice(&head);
        bytes::Bytes::from(bytes).slice(start..)
    }

    /// The `ExportTraceServiceRequest` of `spans`.
    #[cfg(test)]
    pub(crate) fn encode(&self, spans: &[super::spans::Span]) -> bytes::Bytes {
        let mut body = self.body(0);
        for span in spans {
            body.push(&span.as_ref());
        }
        self.finish(body)
    }
}

/// Writes `span` as a `ScopeSpans.spans` field: what a [`Body`] holds, one after the other.
pub(crate) fn push_span(span: &SpanRef<'_>, buf: &mut Vec<u8>) {
    // ScopeSpans.spans = 2
    put_key(2, WireType::LengthDelimited, buf);
    delimited(buf, |buf| write_span(span, buf));
}

/// Where the first `n` of the spans [`push_span`] wrote into `bytes` end (all of them when
/// there are fewer): a call's spans written together can still be split between two batches.
pub(crate) fn spans_end(bytes: &[u8], n: usize) -> usize {
    let mut at = 0;
    for _ in 0..n {
        if at >= bytes.len() {
            break;
        }
        // The field's key (one byte), then its length.
        let mut rest = &bytes[at + 1..];
        let before = rest.len();
        let len = prost::encoding::decode_varint(&mut rest).map_or(0, |len| len as usize);
        at += 1 + (before - rest.len()) + len;
    }
    at.min(bytes.len())
}

/// The length of a length-delimited field of `len` bytes, its tag included.
#[inline]
fn field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// A varint: one byte for the small values (every tag toolhost writes, most lengths) without
/// a call, else prost's.
#[inline]
fn put_varint(value: u64, buf: &mut Vec<u8>) {
    if value < 0x80 {
        buf.push(value as u8);
    } else {
        encode_varint(value, buf);
    }
}

/// A field's key.
#[inline]
fn put_key(tag: u32, wire_type: WireType, buf: &mut Vec<u8>) {
    put_varint(u64::from(tag << 3 | wire_type as u32), buf);
}

/// The tag and length of a length-delimited field.
#[inline]
fn header(tag: u32, len: usize, buf: &mut Vec<u8>) {
    put_key(tag, WireType::LengthDelimited, buf);
    put_varint(len as u64, buf);
}

/// The length and body of a length-delimited field whose key is written, the body written by
/// `body` first: two bytes are left for the length and it is written in them once known, as the
/// shortest varint (as prost writes it), the body moved when that takes one byte or more than
/// two. A span need not be walked twice, once for its length and once to write it.
#[inline]
fn delimited(buf: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) {
    let at = buf.len();
    buf.extend_from_slice(&[0, 0]);
    body(buf);
    let len = buf.len() - at - 2;
    if len < 0x80 {
        buf[at] = len as u8;
        buf.remove(at + 1);
    } else if len < 0x4000 {
        buf[at] = (len as u8 & 0x7f) | 0x80;
        buf[at + 1] = (len >> 7) as u8;
    } else {
        let mut length = Vec::with_capacity(MAX_VARINT_LEN);
        encode_varint(len as u64, &mut length);
        buf.splice(at..at + 2, length);
    }
}

/// A nested message of `len` bytes, written by `body`.
#[inline]
fn message(tag: u32, len: usize, buf: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) {
    header(tag, len, buf);
    let start = buf.len();
    body(buf);
    debug_assert_eq!(buf.len() - start, len, "the length of field {tag} was computed wrong");
}

/// A `bytes` or `string` field that is always written (a oneof member, an id).
#[inline]
fn bytes_always(tag: u32, value: &[u8], buf: &mut Vec<u8>) {
    header(tag, value.len(), buf);
    buf.extend_from_slice(value);
}

/// A proto3 `string` field: nothing when empty.
#[inline]
fn string(tag: u32, value: &str, buf: &mut Vec<u8>) {
    if !value.is_empty() {
        bytes_always(tag, value.as_bytes(), buf);
    }
}

#[inline]
fn string_len(tag: u32, value: &str) -> usize {
    if value.is_empty() { 0 } else { field_len(tag, value.len()) }
}

/// A proto3 `fixed64` field: nothing when zero.
#[inline]
fn fixed64(tag: u32, value: u64, buf: &mut Vec<u8>) {
    if value != 0 {
        put_key(tag, WireType::SixtyFourBit, buf);
        buf.extend_from_slice(&value.to_le_bytes());
    }
}

fn fixed64_len(tag: u32, value: u64) -> usize {
    if value == 0 { 0 } else { key_len(tag) + 8 }
}

/// A proto3 `fixed32` field: nothing when zero.
#[inline]
fn fixed32(tag: u32, value: u32, buf: &mut Vec<u8>) {
    if value != 0 {
        put_key(tag, WireType::ThirtyTwoBit, buf);
        buf.extend_from_slice(&value.to_le_bytes());
    }
}

fn fixed32_len(tag: u32, value: u32) -> usize {
    if value == 0 { 0 } else { key_len(tag) + 4 }
}

/// A proto3 `varint` field (an enum, a `uint32`): nothing when zero.
#[inline]
fn varint(tag: u32, value: u64, buf: &mut Vec<u8>) {
    if value != 0 {
        put_key(tag, WireType::Varint, buf);
        put_varint(value, buf);
    }
}

fn varint_len(tag: u32, value: u64) -> usize {
    if value == 0 { 0 } else { key_len(tag) + encoded_len_varint(value) }
}

/// `Span.SpanKind`.
fn kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

/// `Span.flags` or `Link.flags`.
fn flags(trace_flags: u8, remote: bool) -> u32 {
    u32::from(trace_flags) | CONTEXT_HAS_IS_REMOTE | if remote { CONTEXT_IS_REMOTE } else { 0 }
}

fn trace_state(span_trace_state: Option<&std::sync::Arc<str>>) -> &str {
    span_trace_state.map_or("", |state| state)
}

/// The `trace_id` (1) and `span_id` (2) fields, keys and lengths included, as one array: the
/// bytes are moved into place, with no call per part.
#[inline]
fn ids(trace_id: &[u8; 16], span_id: &[u8; 8]) -> [u8; 28] {
    let [t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15] = *trace_id;
    let [s0, s1, s2, s3, s4, s5, s6, s7] = *span_id;
    [
        0x0a, 16, t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, 0x12, 8, s0, s1, s2,
        s3, s4, s5, s6, s7,
    ]
}

/// `start_time_unix_nano` (7) and `end_time_unix_nano` (8), both not zero, as one array.
#[inline]
fn times(start: u64, end: u64) -> [u8; 18] {
    let [a0, a1, a2, a3, a4, a5, a6, a7] = start.to_le_bytes();
    let [b0, b1, b2, b3, b4, b5, b6, b7] = end.to_le_bytes();
    [0x39, a0, a1, a2, a3, a4, a5, a6, a7, 0x41, b0, b1, b2, b3, b4, b5, b6, b7]
}

/// `Span`, its fields in the order of their numbers, as prost writes them (the tests compare
/// the bytes with the SDK's).
fn write_span(span: &SpanRef<'_>, buf: &mut Vec<u8>) {
    buf.extend_from_slice(&ids(span.trace_id, &span.span_id));
    string(3, trace_state(span.trace_state), buf);
    if let Some(parent) = &span.parent {
        let [p0, p1, p2, p3, p4, p5, p6, p7] = *parent;
        buf.extend_from_slice(&[0x22, 8, p0, p1, p2, p3, p4, p5, p6, p7]); // parent_span_id = 4
    }
    string(5, span.name, buf);
    buf.extend_from_slice(&[0x30, kind(span.kind) as u8]); // kind = 6
    if span.start != 0 && span.end != 0 {
        buf.extend_from_slice(&times(span.start, span.end));
    } else {
        fixed64(7, span.start, buf);
        fixed64(8, span.end, buf);
    }
    if let Some(shared) = span.shared {
        buf.extend_from_slice(&shared.encoded);
    }
    for (key, value) in span.texts {
        text_attribute(key, value, buf);
    }
    for attributes in span.attributes {
        for attribute in attributes {
            attribute_field(9, attribute, buf);
        }
    }
    for event_item in span.events {
        message(11, event_len(event_item), buf, |buf| event(event_item, buf));
    }
    if let Some(link_item) = span.link {
        message(13, link_len(link_item), buf, |buf| link(link_item, buf));
    }
    // The SDK always writes the status, an empty message when it is unset.
    match span.error {
        None => buf.extend_from_slice(&[0x7a, 0]), // status = 15, empty
        Some(description) => message(15, string_len(2, description) + varint_len(3, 2), buf, |buf| {
            // Status.message = 2, Status.code = 3: STATUS_CODE_ERROR
            string(2, description, buf);
            varint(3, 2, buf);
        }),
    }
    fixed32(16, flags(span.flags, span.parent_remote), buf);
}

/// `attributes` as `Span.attributes` fields, one after the other: what a span's
/// [`super::spans::SharedAttributes`] writes.
pub(crate) fn span_attributes(attributes: &[Attribute]) -> Vec<u8> {
    let mut buf = Vec::new();
    for attribute in attributes {
        message(9, key_value_len(attribute), &mut buf, |buf| key_value(attribute, buf));
    }
    buf
}

fn event_len(event: &Event) -> usize {
    fixed64_len(1, event.time)
        + string_len(2, event.name)
        + event.attributes.iter().map(|attribute| field_len(3, key_value_len(attribute))).sum::<usize>()
}

/// `Span.Event`.
fn event(event: &Event, buf: &mut Vec<u8>) {
    fixed64(1, event.time, buf);
    string(2, event.name, buf);
    for attribute in &event.attributes {
        message(3, key_value_len(attribute), buf, |buf| key_value(attribute, buf));
    }
}

fn link_len(link: &Link) -> usize {
    field_len(1, link.trace_id.len())
        + field_len(2, link.span_id.len())
        + string_len(3, trace_state(link.trace_state.as_ref()))
        + fixed32_len(6, flags(link.flags, link.remote))
}

/// `Span.Link` (toolhost's links carry no attributes).
fn link(link: &Link, buf: &mut Vec<u8>) {
    bytes_always(1, &link.trace_id, buf);
    bytes_always(2, &link.span_id, buf);
    string(3, trace_state(link.trace_state.as_ref()), buf);
    fixed32(6, flags(link.flags, link.remote), buf);
}

#[inline]
fn key_value_len(attribute: &Attribute) -> usize {
    string_len(1, &attribute.key) + field_len(2, any_value_len(&attribute.value))
}

/// A field `tag` holding `attribute` as a `KeyValue`: a text value through [`text_field`],
/// anything else as a nested message.
#[inline]
fn attribute_field(tag: u32, attribute: &Attribute, buf: &mut Vec<u8>) {
    match &attribute.value {
        Value::Static(text) => text_field(tag, &attribute.key, text, buf),
        Value::Text(text) => text_field(tag, &attribute.key, text, buf),
        _ => message(tag, key_value_len(attribute), buf, |buf| key_value(attribute, buf)),
    }
}

/// A `Span.attributes` field of a text value.
#[inline]
pub(crate) fn text_attribute(key: &str, value: &str, buf: &mut Vec<u8>) {
    text_field(9, key, value, buf);
}

/// A field `tag` holding the `KeyValue` of `key` and a text value. When the key and value are
/// short (every length one byte: the common case) it is written from its parts after one
/// reservation, with no lengths computed twice; else as a nested message.
#[inline]
fn text_field(tag: u32, key: &str, text: &str, buf: &mut Vec<u8>) {
    let (key_bytes, value) = (key.as_bytes(), text.as_bytes());
    if tag < 16 && !key.is_empty() && 2 + key.len() + 4 + value.len() < 0x80 {
        // KeyValue { key = 1, value = 2: AnyValue { string_value = 1 } }
        let any_len = 2 + value.len();
        let key_value_len = 2 + key.len() + 2 + any_len;
        buf.reserve(2 + key_value_len);
        buf.extend_from_slice(&[(tag << 3 | 2) as u8, key_value_len as u8, 0x0a, key.len() as u8]);
        buf.extend_from_slice(key_bytes);
        buf.extend_from_slice(&[0x12, any_len as u8, 0x0a, value.len() as u8]);
        buf.extend_from_slice(value);
    } else {
        let value = Scalar::Text(text);
        message(tag, string_len(1, key) + field_len(2, scalar_len(&value)), buf, |buf| {
            string(1, key, buf);
            message(2, scalar_len(&value), buf, |buf| scalar(&value, buf));
        });
    }
}

/// `KeyValue`.
#[inline]
fn key_value(attribute: &Attribute, buf: &mut Vec<u8>) {
    string(1, &attribute.key, buf);
    message(2, any_value_len(&attribute.value), buf, |buf| any_value(&attribute.value, buf));
}

/// A member of `AnyValue`'s oneof, as the array's elements are.
enum Scalar<'a> {
    Text(&'a str),
    Bool(bool),
    Int(i64),
    Double(f64),
}

#[inline]
fn scalar_len(scalar: &Scalar<'_>) -> usize {
    match scalar {
        Scalar::Text(text) => field_len(1, text.len()),
        Scalar::Bool(_) => key_len(2) + 1,
        Scalar::Int(value) => key_len(3) + encoded_len_varint(*value as u64),
        Scalar::Double(_) => key_len(4) + 8,
    }
}

/// A oneof member is written even when it holds its type's default.
#[inline]
fn scalar(scalar: &Scalar<'_>, buf: &mut Vec<u8>) {
    match scalar {
        Scalar::Text(text) => bytes_always(1, text.as_bytes(), buf),
        Scalar::Bool(value) => {
            put_key(2, WireType::Varint, buf);
            put_varint(u64::from(*value), buf);
        }
        Scalar::Int(value) => {
            put_key(3, WireType::Varint, buf);
            put_varint(*value as u64, buf);
        }
        Scalar::Double(value) => {
            put_key(4, WireType::SixtyFourBit, buf);
            buf.extend_from_slice(&value.to_le_bytes());
        }
    }
}

/// The elements of an array value, as scalars.
fn elements(array: &opentelemetry::Array) -> Vec<Scalar<'_>> {
    match array {
        opentelemetry::Array::Bool(values) => values.iter().map(|value| Scalar::Bool(*value)).collect(),
        opentelemetry::Array::I64(values) => values.iter().map(|value| Scalar::Int(*value)).collect(),
        opentelemetry::Array::F64(values) => values.iter().map(|value| Scalar::Double(*value)).collect(),
        opentelemetry::Array::String(values) => {
            values.iter().map(|value| Scalar::Text(value.as_str())).collect()
        }
        // `Array` is non-exhaustive; a kind it adds later is exported as no element.
        _ => Vec::new(),
    }
}

#[inline]
fn any_value_len(value: &Value) -> usize {
    match value {
        Value::Static(text) => scalar_len(&Scalar::Text(text)),
        Value::Text(text) => scalar_len(&Scalar::Text(text)),
        Value::Int(value) => scalar_len(&Scalar::Int(*value)),
        Value::Bool(value) => scalar_len(&Scalar::Bool(*value)),
        Value::Double(value) => scalar_len(&Scalar::Double(*value)),
        Value::Array(array) => field_len(5, array_len(&elements(array))),
    }
}

/// `ArrayValue.values` (field 1): each element is an `AnyValue`.
fn array_len(elements: &[Scalar<'_>]) -> usize {
    elements.iter().map(|element| field_len(1, scalar_len(element))).sum()
}

/// `AnyValue`.
#[inline]
fn any_value(value: &Value, buf: &mut Vec<u8>) {
    match value {
        Value::Static(text) => scalar(&Scalar::Text(text), buf),
        Value::Text(text) => scalar(&Scalar::Text(text), buf),
        Value::Int(value) => scalar(&Scalar::Int(*value), buf),
        Value::Bool(value) => scalar(&Scalar::Bool(*value), buf),
        Value::Double(value) => scalar(&Scalar::Double(*value), buf),
        Value::Array(array) => {
            let elements = elements(array);
            message(5, array_len(&elements), buf, |buf| {
                for element in &elements {
                    message(1, scalar_len(element), buf, |buf| scalar(element, buf));
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::Arc;

    use opentelemetry::InstrumentationScope;
    use opentelemetry::trace::SpanKind;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::trace::v1::{span, status};
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::Resource;
    use prost::Message as _;

    use super::Encoder;
    use crate::telemetry::otel::{resource_attributes, span_data};
    use crate::telemetry::spans::{Attribute, Event, Link, SharedAttributes, Span, Status, Value, attr};

    const TRACE: [u8; 16] =
        [0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36];
    const CALLER: [u8; 8] = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];
    const PROCESS: [u8; 8] = [0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0];
    const RUN: [u8; 8] = [0xff, 0, 0, 0, 0, 0, 0, 0x01];
    const DOOR: [u8; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
    const ADMIT: [u8; 8] = [8, 7, 6, 5, 4, 3, 2, 1];
    const START: u64 = 1_790_000_000_123_456_789;

    fn resource() -> Resource {
        Resource::builder().with_service_name("toolhost-test").build()
    }

    /// A `process` span (a remote parent, a link, a tracestate, an event, an error), a child run
    /// span (a local parent, no status), and a door's root span with every kind of value.
    fn spans() -> Vec<Span> {
        let state: Arc<str> = "vendor=value,other=1".into();
        let process = Span {
            trace_id: TRACE,
            span_id: PROCESS,
            parent: Some(CALLER),
            parent_remote: true,
            flags: 1,
            trace_state: Some(state.clone()),
            kind: SpanKind::Consumer,
            name: Cow::Borrowed("process action-requests"),
            start: START,
            end: START + 2_500_000,
            shared: Some(SharedAttributes::leaked(vec![
                attr("messaging.system", "redis_streams"),
                attr("messaging.operation.type", "process"),
            ])),
            attributes: vec![
                attr("messaging.message.id", "1790000000123-0".to_owned()),
                attr("messaging.redis_streams.delivery_count", 2_i64),
                attr("toolhost.replayed", true),
                attr("error.type", "timeout"),
                // Text values at the edges of the one-byte lengths: empty, the longest that
                // fits them, one past it, and a value whose own length takes two bytes.
                attr("toolhost.empty", ""),
                attr("toolhost.edge", "e".repeat(0x7f - 6 - "toolhost.edge".len())),
                attr("toolhost.past", "p".repeat(0x80 - 6 - "toolhost.past".len())),
                attr("toolhost.long", "l".repeat(300)),
            ],
            events: vec![Event {
                name: "answered from the ledger",
                time: START + 1_000,
                attributes: vec![attr("toolhost.outcome", "success")],
            }],
            link: Some(Link {
                trace_id: TRACE,
                span_id: CALLER,
                flags: 1,
                trace_state: Some(state),
                remote: true,
            }),
            status: Status::Error(Cow::Borrowed("timeout")),
        };
        let run = Span {
            trace_id: TRACE,
            span_id: RUN,
            parent: Some(PROCESS),
            parent_remote: false,
            flags: 1,
            trace_state: None,
            kind: SpanKind::Client,
            name: Cow::Owned("tools/call echo".to_owned()),
            start: START + 10,
            end: START + 20,
            shared: None,
            attributes: vec![
                attr("gen_ai.operation.name", "execute_tool"),
                attr("gen_ai.tool.name", String::new()),
            ],
            events: Vec::new(),
            link: None,
            status: Status::Unset,
        };
        let door = Span {
            trace_id: TRACE,
            span_id: DOOR,
            parent: None,
            parent_remote: false,
            flags: 1,
            trace_state: None,
            kind: SpanKind::Server,
            name: Cow::Borrowed("POST /api/call"),
            start: START,
            end: START + 1,
            shared: None,
            attributes: vec![
                Attribute::from(opentelemetry::KeyValue::new("http.response.status_code", 202)),
                attr("negative", -7_i64),
                attr("zero", 0_i64),
                attr("off", false),
                Attribute { key: Cow::Owned("ratio".to_owned()), value: Value::Double(0.25) },
                Attribute::from(opentelemetry::KeyValue::new(
                    "list",
                    opentelemetry::Value::Array(opentelemetry::Array::String(vec!["a".into(), "".into()])),
                )),
                Attribute::from(opentelemetry::KeyValue::new(
                    "numbers",
                    opentelemetry::Value::Array(opentelemetry::Array::I64(vec![1, -1])),
                )),
                // A span whose length takes three bytes.
                attr("huge", "h".repeat(20_000)),
            ],
            events: Vec::new(),
            link: None,
            status: Status::Error(Cow::Owned("refused: the tenant's policy".to_owned())),
        };
        // An `admit` span: no attributes, so short enough that its length takes one byte.
        let admit = Span {
            trace_id: TRACE,
            span_id: ADMIT,
            parent: Some(PROCESS),
            parent_remote: false,
            flags: 1,
            trace_state: None,
            kind: SpanKind::Internal,
            name: Cow::Borrowed("admit"),
            start: START,
            end: START + 5,
            shared: None,
            attributes: Vec::new(),
            events: Vec::new(),
            link: None,
            status: Status::Unset,
        };
        vec![process, run, door, admit]
    }

    /// What the SDK's exporter encodes for the same spans and resource: the generated types,
    /// filled by `opentelemetry-proto`'s own conversion from `SpanData`.
    fn sdk_request(spans: Vec<Span>, resource: &Resource) -> ExportTraceServiceRequest {
        let scope = InstrumentationScope::builder("toolhost").build();
        let spans = spans.into_iter().map(|span| span_data(span, &scope)).collect();
        ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans,
                &ResourceAttributesWithSchema::from(resource),
            ),
        }
    }

    fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
        let found = attributes.iter().find(|attribute| attribute.key == key)?;
        found.value.as_ref()?.value.as_ref()
    }

    fn text(value: &str) -> Option<&'static any_value::Value> {
        Some(Box::leak(Box::new(any_value::Value::StringValue(value.to_owned()))))
    }

    #[test]
    fn the_request_is_the_bytes_the_sdks_exporter_would_send() {
        let resource = resource();
        let encoder = Encoder::new(&resource_attributes(&resource), "toolhost");
        let ours = encoder.encode(&spans()).to_vec();
        let sdk = sdk_request(spans(), &resource);
        assert_eq!(ExportTraceServiceRequest::decode(ours.as_slice()).unwrap(), sdk);
        assert_eq!(ours, sdk.encode_to_vec());
    }

    #[test]
    fn every_field_decodes_as_written() {
        let resource = resource();
        let encoder = Encoder::new(&resource_attributes(&resource), "toolhost");
        let request = ExportTraceServiceRequest::decode(encoder.encode(&spans())).unwrap();
        assert_eq!(request.resource_spans.len(), 1);
        let resource_spans = &request.resource_spans[0];
        let resource_attributes = &resource_spans.resource.as_ref().unwrap().attributes;
        assert_eq!(attribute(resource_attributes, "service.name"), text("toolhost-test"));
        assert_eq!(attribute(resource_attributes, "telemetry.sdk.language"), text("rust"));
        assert_eq!(resource_spans.scope_spans.len(), 1);
        let scope_spans = &resource_spans.scope_spans[0];
        assert_eq!(scope_spans.scope.as_ref().unwrap().name, "toolhost");
        let [process, run, door, admit] = scope_spans.spans.as_slice() else {
            panic!("four spans: {scope_spans:?}")
        };
        // The length of each span took one, two and three bytes.
        assert!(admit.encoded_len() < 0x80 && run.encoded_len() >= 0x80 && door.encoded_len() >= 0x4000);
        assert_eq!(
            (admit.name.as_str(), admit.span_id.as_slice(), admit.end_time_unix_nano),
            ("admit", &ADMIT[..], START + 5)
        );

        assert_eq!(process.trace_id, TRACE);
        assert_eq!(process.span_id, PROCESS);
        assert_eq!(process.parent_span_id, CALLER);
        assert_eq!(process.flags, 0x301, "sampled, with a remote parent");
        assert_eq!(process.trace_state, "vendor=value,other=1");
        assert_eq!(process.kind, span::SpanKind::Consumer as i32);
        assert_eq!(process.name, "process action-requests");
        assert_eq!((process.start_time_unix_nano, process.end_time_unix_nano), (START, START + 2_500_000));
        assert_eq!(attribute(&process.attributes, "messaging.system"), text("redis_streams"));
        assert_eq!(attribute(&process.attributes, "messaging.message.id"), text("1790000000123-0"));
        assert_eq!(
            attribute(&process.attributes, "messaging.redis_streams.delivery_count"),
            Some(&any_value::Value::IntValue(2))
        );
        assert_eq!(
            attribute(&process.attributes, "toolhost.replayed"),
            Some(&any_value::Value::BoolValue(true))
        );
        // Text at the edges of one-byte lengths decodes whole.
        for (key, len) in
            [("toolhost.empty", 0), ("toolhost.edge", 108), ("toolhost.past", 109), ("toolhost.long", 300)]
        {
            let Some(any_value::Value::StringValue(value)) = attribute(&process.attributes, key) else {
                panic!("{key} is text: {process:?}")
            };
            assert_eq!(value.len(), len, "{key}");
        }
        // The shared attributes come first, then the span's own.
        assert_eq!(process.attributes.len(), 10);
        assert_eq!(process.attributes[1].key, "messaging.operation.type");
        assert_eq!(attribute(&process.attributes, "messaging.operation.type"), text("process"));
        let [event] = process.events.as_slice() else { panic!("one event: {process:?}") };
        assert_eq!((event.name.as_str(), event.time_unix_nano), ("answered from the ledger", START + 1_000));
        assert_eq!(attribute(&event.attributes, "toolhost.outcome"), text("success"));
        let [link] = process.links.as_slice() else { panic!("one link: {process:?}") };
        assert_eq!(
            (link.trace_id.as_slice(), link.span_id.as_slice()),
            (TRACE.as_slice(), CALLER.as_slice())
        );
        assert_eq!(link.flags, 0x301);
        assert_eq!(link.trace_state, "vendor=value,other=1");
        let process_status = process.status.as_ref().unwrap();
        assert_eq!(process_status.code, status::StatusCode::Error as i32);
        assert_eq!(process_status.message, "timeout");

        assert_eq!(run.parent_span_id, PROCESS);
        assert_eq!(run.flags, 0x101, "sampled, with a local parent");
        assert_eq!(run.kind, span::SpanKind::Client as i32);
        assert_eq!(run.name, "tools/call echo");
        assert_eq!(run.trace_state, "");
        assert_eq!(attribute(&run.attributes, "gen_ai.tool.name"), text(""));
        assert!(run.links.is_empty() && run.events.is_empty());
        assert_eq!(run.status.as_ref().unwrap().code, status::StatusCode::Unset as i32);

        assert!(door.parent_span_id.is_empty(), "a root span has no parent");
        assert_eq!(door.flags, 0x101);
        assert_eq!(door.kind, span::SpanKind::Server as i32);
        assert_eq!(
            attribute(&door.attributes, "http.response.status_code"),
            Some(&any_value::Value::IntValue(202))
        );
        assert_eq!(attribute(&door.attributes, "negative"), Some(&any_value::Value::IntValue(-7)));
        let Some(any_value::Value::StringValue(huge)) = attribute(&door.attributes, "huge") else {
            panic!("huge is text: {door:?}")
        };
        assert_eq!(huge.len(), 20_000);
        assert_eq!(attribute(&door.attributes, "zero"), Some(&any_value::Value::IntValue(0)));
        assert_eq!(attribute(&door.attributes, "off"), Some(&any_value::Value::BoolValue(false)));
        assert_eq!(attribute(&door.attributes, "ratio"), Some(&any_value::Value::DoubleValue(0.25)));
        let strings = |values: &[&str]| ArrayValue {
            values: values
                .iter()
                .map(|value| AnyValue { value: Some(any_value::Value::StringValue((*value).to_owned())) })
                .collect(),
        };
        assert_eq!(
            attribute(&door.attributes, "list"),
            Some(&any_value::Value::ArrayValue(strings(&["a", ""])))
        );
        let numbers = ArrayValue {
            values: [1, -1]
                .into_iter()
                .map(|n| AnyValue { value: Some(any_value::Value::IntValue(n)) })
                .collect(),
        };
        assert_eq!(attribute(&door.attributes, "numbers"), Some(&any_value::Value::ArrayValue(numbers)));
        assert_eq!(door.status.as_ref().unwrap().message, "refused: the tenant's policy");
    }

    #[test]
    fn a_body_filled_a_span_at_a_time_is_one_request_of_only_its_own_spans() {
        let resource = resource();
        let encoder = Encoder::new(&resource_attributes(&resource), "toolhost");
        let all = spans();
        let whole = encoder.encode(&all);
        let one = ExportTraceServiceRequest::decode(encoder.encode(&all[1..2])).unwrap();
        assert_eq!(one, sdk_request(all[1..2].to_vec(), &resource));
        // Filled as the queue fills it: a span at a time, the next body sized by the last.
        let mut first = encoder.body(0);
        for span in &all {
            first.push(&span.as_ref());
        }
        let mut body = encoder.body(first.size());
        let capacity = body.bytes.capacity();
        for span in &all {
            body.push(&span.as_ref());
        }
        assert_eq!((body.spans(), body.bytes.capacity()), (all.len(), capacity), "no growth");
        assert_eq!(encoder.finish(first), whole, "the same bytes as the batch encoded at once");
        assert_eq!(encoder.finish(body), whole);
    }
}
