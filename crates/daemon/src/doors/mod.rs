//! The doors calls come in by. Each reads its own stream and says what answering an entry means;
//! the call lifecycle ([`crate::call`]) does the rest, the same for every door.
//!
//! - [`requests`]: `action-requests`, answered with result envelopes on the caller's response
//!   topic.
//! - [`chat`]: the agent inbox `chat:<AGENT_NAME>`, answered with chat replies.
//!
//! A new door (an MCP server, a message bus) is a new module here implementing
//! [`crate::call::Door`], and a reader for it in `serve`; nothing else changes.

pub(crate) mod chat;
pub(crate) mod requests;
