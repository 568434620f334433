//! Wire types of toolhost: what other programs put on the bus and read from it.
//!
//! - [`entry`]: the two fields of every stream entry (`id`, `payload`).
//! - [`event`]: request and result event envelopes (CloudEvents-like) and result data.
//! - [`chat`]: chat message envelopes, conversation stream events and dead letters.
//! - [`trace`]: W3C trace context (`traceparent`, `tracestate`) and the trace a call runs under.
//! - [`tool`]: tool descriptions and their export formats (OpenAI, MCP, toolbox, capabilities).
//!
//! **Invariant:** this crate does no I/O and has no async runtime; it is serde types and pure functions.

mod chat;
mod entry;
mod event;
mod tool;
mod trace;

pub use chat::{
    AGENT_PREFIX, Address, CHAT_PREFIX, ChatEnvelope, ChatKind, DeadLetterEvent, StepStatus, StreamEvent,
    StreamEventKind,
};
pub use entry::{DEFECT_HEAD_BYTES, DefectKind, Entry, EntryDefect, FIELD_ID, FIELD_PAYLOAD, FIELD_SIG, Sig};
pub use event::{
    BadRequestId, ErrorCode, EventEnvelope, RESERVED_DATA_KEYS, ResultData, SPEC_VERSION, new_message_id,
    now_rfc3339, request_id,
};
pub use tool::{Annotations, DiscoveryFormat, ToolDescription};
pub use trace::{
    CallTrace, TraceContext, TraceOrigin, TraceParent, new_span_id, new_trace_id, valid_tracestate,
};
