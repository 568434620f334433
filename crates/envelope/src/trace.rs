//! W3C trace context (<https://www.w3.org/TR/trace-context/>): the `traceparent` and `tracestate`
//! a call carries from its caller through every door and source, and the rule that turns what a
//! request says (`traceparent`, `tracestate`, the older opaque `trace_id`) into the trace the call
//! runs under ([`CallTrace::of`], docs/CONTRACTS.md "Trace context").
//!
//! Garbage never fails a call and is never copied on: a `traceparent` that does not parse starts
//! a new trace, and its `tracestate` is dropped with it.

use std::fmt;

/// The `traceparent` version toolhost writes.
const VERSION: &str = "00";
/// Length of a version-00 `traceparent`: `00-` + 32 + `-` + 16 + `-` + 2.
const TRACEPARENT_LEN: usize = 55;
/// The `sampled` bit of the trace flags.
const SAMPLED: u8 = 0x01;
/// At most this many list members in a `tracestate` (W3C: 32).
const TRACESTATE_MEMBERS: usize = 32;
/// At most this many bytes of `tracestate` are passed on (W3C: at least 512 must be propagated).
const TRACESTATE_BYTES: usize = 512;

/// A valid `traceparent`: a trace id, the id of the span that made it, and the trace flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The trace's id; never all zero.
    pub trace_id: [u8; 16],
    /// The id of the span the context comes from (W3C `parent-id`); never all zero.
    pub span_id: [u8; 8],
    /// Trace flags; bit 0 is `sampled`.
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` header value; `None` for anything the W3C rules reject: a wrong
    /// length, a character that is not lowercase hex, version `ff`, or an all-zero trace or span
    /// id. A version above `00` is read by its first four fields, as the W3C says.
    pub fn parse(text: &str) -> Option<TraceParent> {
        let bytes = text.as_bytes();
        if bytes.len() < TRACEPARENT_LEN {
            return None;
        }
        let version = hex_bytes::<1>(&bytes[0..2])?[0];
        if version == 0xff || (version == 0 && bytes.len() != TRACEPARENT_LEN) {
            return None;
        }
        // A future version may append fields after a dash.
        if bytes.len() > TRACEPARENT_LEN && bytes[TRACEPARENT_LEN] != b'-' {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let trace_id = hex_bytes::<16>(&bytes[3..35])?;
        let span_id = hex_bytes::<8>(&bytes[36..52])?;
        let flags = hex_bytes::<1>(&bytes[53..55])?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent { trace_id, span_id, flags })
    }

    /// A trace id read from the older opaque `trace_id` field, when it is one: 32 lowercase hex
    /// digits, not all zero.
    pub fn parse_trace_id(text: &str) -> Option<[u8; 16]> {
        (text.len() == 32).then(|| hex_bytes::<16>(text.as_bytes())).flatten().filter(|id| *id != [0; 16])
    }

    /// Whether the `sampled` flag is set.
    pub fn is_sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id as 16 lowercase hex digits.
    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }

    /// The same trace and flags with another span: the context a child span passes on.
    pub fn with_span(&self, span_id: [u8; 8]) -> TraceParent {
        TraceParent { span_id, ..*self }
    }

    /// The version-00 header value, as [`fmt::Display`] writes it: every answer carries one, so
    /// it is written into one buffer, digit by digit, without the formatting machinery.
    pub fn header(&self) -> String {
        let mut out = Vec::with_capacity(TRACEPARENT_LEN);
        out.extend_from_slice(VERSION.as_bytes());
        out.push(b'-');
        push_hex(&self.trace_id, &mut out);
        out.push(b'-');
        push_hex(&self.span_id, &mut out);
        out.push(b'-');
        push_hex(&[self.flags], &mut out);
        ascii(out)
    }
}

impl fmt::Display for TraceParent {
    /// The version-00 header value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.header())
    }
}

/// Checks a `tracestate` value; `None` when it breaks the W3C list rules (more than 32 members,
/// a member that is not `key=value` with the allowed characters) or is longer than 512 bytes.
/// Empty members (`a=1,,b=2`) are allowed, as the W3C says, and kept as sent.
pub fn valid_tracestate(text: &str) -> Option<&str> {
    if text.is_empty() || text.len() > TRACESTATE_BYTES {
        return None;
    }
    let mut members = 0;
    for member in text.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        members += 1;
        let (key, value) = member.split_once('=')?;
        let key_ok = !key.is_empty()
            && key.len() <= 256
            && key.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/' | b'@'));
        let value_ok = !value.is_empty()
            && value.len() <= 256
            && value.bytes().all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
            && !value.ends_with(' ');
        if !key_ok || !value_ok {
            return None;
        }
    }
    (members > 0 && members <= TRACESTATE_MEMBERS).then_some(text)
}

/// A caller's trace context as a door read it and passes it on: a valid `traceparent`, and its
/// `tracestate` when that is valid too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The caller's context.
    pub parent: TraceParent,
    /// The caller's `tracestate`.
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The context of a carrier's two values; `None` when `traceparent` is absent or not valid
    /// (its `tracestate` is then dropped too).
    pub fn read(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<TraceContext> {
        let parent = TraceParent::parse(traceparent?)?;
        Some(TraceContext { parent, tracestate: tracestate.and_then(valid_tracestate).map(str::to_owned) })
    }

    /// The `traceparent` value.
    pub fn traceparent(&self) -> String {
        self.parent.to_string()
    }
}

/// Where a call's trace came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceOrigin {
    /// The caller's valid `traceparent`: the call continues the caller's trace.
    Continued,
    /// No valid `traceparent`, but `trace_id` is a W3C trace id: the call joins that trace, as a
    /// root span of it.
    TraceId,
    /// Neither: the call starts a new trace.
    New,
}

/// The trace a call runs under: the caller's context when it gave a valid one, and the span
/// toolhost opened for the call, whose context it passes on (to the tool's source and in the
/// answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallTrace {
    /// This call's context: the caller's trace (or a new one) and the call's own span.
    pub context: TraceParent,
    /// The caller's span, when it gave a valid `traceparent`.
    pub parent: Option<[u8; 8]>,
    /// The caller's `tracestate`, kept only beside a valid `traceparent` and when it is valid.
    pub tracestate: Option<String>,
    /// Where the trace came from.
    pub origin: TraceOrigin,
    /// Whether the request carried a `traceparent` that was not valid (it was ignored).
    pub rejected: bool,
}

impl CallTrace {
    /// The trace of a call whose request carried these fields. A valid `traceparent` wins; else a
    /// `trace_id` that is a W3C trace id names the trace; else a new trace starts. The call's own
    /// span id is new in every case. `sample` decides the `sampled` flag from the trace id and
    /// the parent's flag (`None` for a call without a parent); see [`CallTrace::parent_only`].
    pub fn of(
        traceparent: Option<&str>,
        tracestate: Option<&str>,
        trace_id: Option<&str>,
        sample: impl FnOnce(&[u8; 16], Option<bool>) -> bool,
    ) -> CallTrace {
        let parsed = traceparent.and_then(TraceParent::parse);
        let rejected = traceparent.is_some() && parsed.is_none();
        let span_id = new_span_id();
        let flag = |sampled: bool| if sampled { SAMPLED } else { 0 };
        match parsed {
            Some(parent) => CallTrace {
                context: TraceParent {
                    trace_id: parent.trace_id,
                    span_id,
                    flags: (parent.flags & !SAMPLED)
                        | flag(sample(&parent.trace_id, Some(parent.is_sampled()))),
                },
                parent: Some(parent.span_id),
                tracestate: tracestate.and_then(valid_tracestate).map(str::to_owned),
                origin: TraceOrigin::Continued,
                rejected,
            },
            None => {
                let named = trace_id.and_then(TraceParent::parse_trace_id);
                let trace_id = named.unwrap_or_else(new_trace_id);
                CallTrace {
                    context: TraceParent { trace_id, span_id, flags: flag(sample(&trace_id, None)) },
                    parent: None,
                    tracestate: None,
                    origin: if named.is_some() { TraceOrigin::TraceId } else { TraceOrigin::New },
                    rejected,
                }
            }
        }
    }

    /// The sampling of a process that records nothing: a parent's flag is passed on, a new
    /// trace is not sampled.
    pub fn parent_only(_trace_id: &[u8; 16], parent: Option<bool>) -> bool {
        parent.unwrap_or(false)
    }

    /// The `traceparent` this call passes on: its trace, its own span, its flags.
    pub fn traceparent(&self) -> String {
        self.context.header()
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        self.context.trace_id_hex()
    }

    /// The call's own span id as 16 lowercase hex digits.
    pub fn span_id_hex(&self) -> String {
        self.context.span_id_hex()
    }

    /// The caller's span id as 16 lowercase hex digits, when it gave one.
    pub fn parent_id_hex(&self) -> Option<String> {
        self.parent.as_ref().map(|id| hex(id))
    }
}

/// A random trace id, never all zero.
pub fn new_trace_id() -> [u8; 16] {
    loop {
        let id = *uuid::Uuid::new_v4().as_bytes();
        if id != [0; 16] {
            return id;
        }
    }
}

/// A random span id, never all zero.
pub fn new_span_id() -> [u8; 8] {
    loop {
        let bytes = uuid::Uuid::new_v4().into_bytes();
        // The version and variant bits sit in bytes 6 and 8; the first six bytes and the last
        // eight are random, so take the last eight.
        let mut id = [0; 8];
        id.copy_from_slice(&bytes[8..]);
        // Byte 8 holds the variant's two fixed bits; mix in a random byte from the first half.
        id[0] ^= bytes[0] & 0xc0;
        if id != [0; 8] {
            return id;
        }
    }
}

/// `bytes` as lowercase hex digits. Written as bytes, not pushed as `char`s: a `char` push
/// encodes UTF-8 and checks the capacity per digit, and a call formats its ids several times.
fn hex(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    push_hex(bytes, &mut out);
    ascii(out)
}

/// Appends `bytes` as lowercase hex digits.
fn push_hex(bytes: &[u8], out: &mut Vec<u8>) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.extend(
        bytes.iter().flat_map(|byte| [DIGITS[usize::from(byte >> 4)], DIGITS[usize::from(byte & 0x0f)]]),
    );
}

/// Bytes that are ASCII (hex digits, dashes, the version) as a `String`.
fn ascii(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_default()
}

/// `N` bytes from `2N` lowercase hex digits; `None` for any other character or length.
fn hex_bytes<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != N * 2 {
        return None;
    }
    let value = |digit: u8| match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = (value(pair[0])? << 4) | value(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_parses_and_prints_back() {
        let parent = TraceParent::parse(VALID).unwrap();
        assert_eq!(parent.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parent.span_id_hex(), "00f067aa0ba902b7");
        assert!(parent.is_sampled());
        assert_eq!(parent.to_string(), VALID);
        assert_eq!(parent.header(), VALID);
        // The flags' two digits, whatever they are: unset, and a high nibble.
        for flags in ["00", "a1"] {
            let text = format!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flags}");
            assert_eq!(TraceParent::parse(&text).unwrap().header(), text);
        }
    }

    #[test]
    fn garbage_traceparents_are_rejected() {
        for garbage in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "é0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert_eq!(TraceParent::parse(later).unwrap().trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn a_valid_traceparent_wins_and_gets_a_span_of_the_call() {
        let trace = CallTrace::of(Some(VALID), Some("vendor=abc"), Some("opaque-1"), CallTrace::parent_only);
        assert_eq!(trace.origin, TraceOrigin::Continued);
        assert_eq!(trace.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(trace.parent_id_hex().as_deref(), Some("00f067aa0ba902b7"));
        assert_ne!(trace.span_id_hex(), "00f067aa0ba902b7");
        assert!(trace.context.is_sampled());
        assert_eq!(trace.tracestate.as_deref(), Some("vendor=abc"));
        assert!(TraceParent::parse(&trace.traceparent()).is_some());
    }

    #[test]
    fn garbage_starts_a_new_trace_and_drops_its_tracestate() {
        let garbage = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        let trace = CallTrace::of(Some(garbage), Some("vendor=abc"), None, CallTrace::parent_only);
        assert_eq!(trace.origin, TraceOrigin::New);
        assert!(trace.rejected);
        assert_eq!(trace.parent, None);
        assert_eq!(trace.tracestate, None);
        assert_ne!(trace.context.trace_id, [0; 16]);
        assert!(!trace.traceparent().contains("00000000000000000000000000000000"));
        let other = CallTrace::of(Some(garbage), None, None, CallTrace::parent_only);
        assert_ne!(trace.context.trace_id, other.context.trace_id);
    }

    #[test]
    fn a_trace_id_that_is_a_w3c_id_names_the_trace() {
        let trace =
            CallTrace::of(None, Some("vendor=abc"), Some("4bf92f3577b34da6a3ce929d0e0e4736"), |_, _| true);
        assert_eq!(trace.origin, TraceOrigin::TraceId);
        assert_eq!(trace.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(trace.parent, None);
        assert_eq!(trace.tracestate, None);
        assert!(trace.context.is_sampled());
        let opaque = CallTrace::of(None, None, Some("t-9"), CallTrace::parent_only);
        assert_eq!(opaque.origin, TraceOrigin::New);
        assert!(!opaque.rejected);
        assert!(!opaque.context.is_sampled());
    }

    #[test]
    fn a_carrier_is_read_only_with_a_valid_traceparent() {
        let context = TraceContext::read(Some(VALID), Some("a=1")).unwrap();
        assert_eq!((context.traceparent().as_str(), context.tracestate.as_deref()), (VALID, Some("a=1")));
        assert_eq!(TraceContext::read(Some(VALID), Some("bad")).unwrap().tracestate, None);
        assert_eq!(TraceContext::read(Some("00-xyz"), Some("a=1")), None);
        assert_eq!(TraceContext::read(None, Some("a=1")), None);
    }

    #[test]
    fn the_sampler_decides_the_flag_from_the_trace_and_the_parents_flag() {
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        let mut asked = None;
        let trace = CallTrace::of(Some(unsampled), None, None, |id, parent| {
            asked = Some((*id, parent));
            true
        });
        assert_eq!(asked, Some((trace.context.trace_id, Some(false))));
        assert!(trace.context.is_sampled());
        assert!(!CallTrace::of(Some(VALID), None, None, |_, _| false).context.is_sampled());
    }

    #[test]
    fn tracestate_follows_the_list_rules() {
        assert_eq!(
            valid_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        assert_eq!(valid_tracestate("a=1,,b@vendor=2"), Some("a=1,,b@vendor=2"));
        for bad in [
            "",
            "novalue",
            "Upper=1",
            "a=1,b",
            "a=x=y",
            &"a=1,".repeat(33),
            &format!("a={}", "x".repeat(600)),
        ] {
            assert_eq!(valid_tracestate(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn new_ids_are_never_zero_and_differ() {
        let ids: std::collections::HashSet<[u8; 8]> = (0..1000).map(|_| new_span_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(!ids.contains(&[0; 8]));
    }
}
