//! Tools and how they are called.
//!
//! - [`Tool`]: what a tool is (a [`ToolSpec`] and an async `call`), with its [`Context`].
//! - [`Input`]: where a running tool asks its caller (a hosted MCP server's elicitation and
//!   sampling requests), declined unless the host relays them.
//! - [`Registry`]: every tool of a toolbox, its compiled schemas, and [`Registry::invoke`], which
//!   validates arguments, runs the tool under its timeout, catches panics and validates output.
//! - [`SharedRegistry`]: the current registry snapshot, swapped whole on reload.
//! - [`ToolLimits`]: per-tool concurrency limits and bounded wait queues, kept outside the
//!   registry and keyed by tool name.
//! - [`builtin`]: the tools toolhost ships.
//! - [`sources`]: tools an operator configures: command-line programs and HTTP endpoints.
//!
//! **Invariant:** `tools` reaches Redis only through `toolhost_bus::Bus`, reads no environment
//! variables and installs no logging subscriber: the daemon hands every setting in.

mod content;
mod input;
mod limits;
mod registry;
mod schema;
mod shared;
/// Tool sources configured in TOML: `[[commands]]` and `[[http_tools]]`.
pub mod sources;
/// The built-in tools, re-exported at the crate root as they were before sources had a home.
pub use sources::builtin;
/// The `terminal_run` engine: policy, sandboxed execution, capture, redaction, summary.
pub mod terminal;
mod tool;

pub use content::{BLOCK_TYPES, CallResultError, Output, check_blocks, from_call_result};
pub use input::{Input, InputFuture, InputKind, InputReply, InputRequest};
pub use limits::{Admit, DEFAULT_MAX_QUEUE, Full, LimitSettings, Running, ToolLimits, Waiting};
pub use registry::{Failure, Registry, RegistryError, valid_tool_name};
pub use schema::{SchemaError, describe_errors};
pub use shared::SharedRegistry;
pub use tool::{Context, Log, LogReport, Progress, ProgressReport, Remote, Tool, ToolError, ToolSpec};
