//! The [`Tool`] trait and what a call receives.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolhost_envelope::{Annotations, ErrorCode};

/// What a tool declares about itself.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    /// Unique name, 1-64 of `[a-zA-Z0-9_-]` (see [`crate::valid_tool_name`]).
    pub name: String,
    /// What the tool does, for a model to read.
    pub description: String,
    /// JSON Schema (draft 2020-12) of the arguments.
    pub argument_schema: Value,
    /// JSON Schema (draft 2020-12) of the result.
    pub output_schema: Value,
    /// The event that invokes it; default `<name>.requested`.
    pub consumed_event: Option<String>,
    /// The event of its results; default `<name>.completed`.
    pub produced_event: Option<String>,
    /// Behaviour hints.
    pub annotations: Annotations,
    /// How long one call may run before it is cancelled.
    pub timeout: Duration,
    /// How many calls of this tool may run at once (`None`: only the global limit applies).
    pub max_concurrent: Option<usize>,
}

impl ToolSpec {
    /// A spec with default events, no annotations, a 30 s timeout and no own concurrency limit.
    pub fn new(name: &str, description: &str, argument_schema: Value, output_schema: Value) -> ToolSpec {
        ToolSpec {
            name: name.to_owned(),
            description: description.to_owned(),
            argument_schema,
            output_schema,
            consumed_event: None,
            produced_event: None,
            annotations: Annotations::default(),
            timeout: Duration::from_secs(30),
            max_concurrent: None,
        }
    }
}

/// A tool.
///
/// The error type is the concrete [`ToolError`] rather than an associated type so that tools of
/// different kinds can sit in one registry as `Arc<dyn Tool>`. Optional capabilities go in
/// separate traits.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// The tool's declaration; called once, at registration.
    fn spec(&self) -> ToolSpec;

    /// Runs the tool on arguments that passed the argument schema.
    ///
    /// # Cancel safety
    /// The future may be dropped at any await when the call times out or the host stops; a tool
    /// that starts processes or holds resources must release them on drop.
    async fn call(&self, arguments: Value, context: &Context) -> Result<Value, ToolError>;
}

/// What a call knows about where it comes from.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// The request's id.
    pub request_id: String,
    /// The caller's correlation id.
    pub correlation_id: Option<String>,
    /// The conversation the call runs in, when it has one.
    pub conversation_id: Option<String>,
    /// Cancelled when the call must stop (timeout, shutdown).
    pub cancel: CancellationToken,
}

/// Why a tool call failed, from the tool's side.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToolError {
    /// The arguments passed the schema but make no sense (the model should correct them).
    #[error("{0}")]
    InvalidArguments(String),
    /// Policy refuses the call (the model should not retry it as is).
    #[error("{0}")]
    Forbidden(String),
    /// The tool tried and failed (a retry may succeed).
    #[error("{0}")]
    Failed(String),
    /// The tool gave up waiting on something it depends on.
    #[error("{0}")]
    Timeout(String),
    /// What the tool depends on is down for now (an MCP server restarting): the call was not
    /// started, and a retry after `retry_after` may succeed. Answers `overloaded` with
    /// `retry_after_ms` in the details.
    #[error("{message}")]
    Unavailable {
        /// One readable sentence.
        message: String,
        /// When a retry may find it back.
        retry_after: Duration,
    },
}

impl ToolError {
    /// The wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            ToolError::InvalidArguments(_) => ErrorCode::InvalidArguments,
            ToolError::Forbidden(_) => ErrorCode::Forbidden,
            ToolError::Failed(_) => ErrorCode::ToolFailed,
            ToolError::Timeout(_) => ErrorCode::Timeout,
            ToolError::Unavailable { .. } => ErrorCode::Overloaded,
        }
    }

    /// Structure for the caller to act on, carried into the answer's `details`:
    /// `{"retry_after_ms"}` for [`ToolError::Unavailable`], nothing for the others.
    pub fn details(&self) -> Option<Value> {
        match self {
            ToolError::Unavailable { retry_after, .. } => {
                Some(json!({ "retry_after_ms": u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX) }))
            }
            _ => None,
        }
    }
}
