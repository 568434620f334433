//! The [`Tool`] trait and what a call receives.

use std::sync::Arc;
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

    /// Runs the tool and answers its result with the content blocks it gave beside it (an
    /// image, audio, a resource); by default [`Tool::call`]'s result alone. The host calls this.
    ///
    /// # Cancel safety
    /// As [`Tool::call`].
    async fn call_output(&self, arguments: Value, context: &Context) -> Result<crate::Output, ToolError> {
        self.call(arguments, context).await.map(crate::Output::from)
    }
    /// Where a run of the tool goes when it leaves the process (an MCP server, an HTTP
    /// service), for the span of the run; `None` for a tool that runs here.
    fn remote(&self) -> Option<Remote> {
        None
    }
}

/// What a tool's run calls outside the process, as its span names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// `mcp`, `http` or `chat` (a specialist agent).
    pub system: &'static str,
    /// The server, service or agent called (an `[[mcp_servers]]` name, a URL's host).
    pub target: String,
    /// The tool's name there (an MCP server's own name of the tool).
    pub name: String,
    /// `pipe` (a stdio child) or `tcp`.
    pub transport: &'static str,
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
    /// Cancelled when the call must stop (timeout, shutdown, a `tool.cancel`).
    pub cancel: CancellationToken,
    /// Where the tool reports how far it got; reports go nowhere unless the host relays them.
    pub progress: Progress,
    /// Where the tool's log messages for its caller go (a hosted MCP server's
    /// `notifications/message`); nowhere unless the host relays them.
    pub log: Log,
    /// Where the tool asks its caller for input (a hosted MCP server's `elicitation/create`
    /// and `sampling/createMessage`); every question is declined unless the host relays them.
    pub input: crate::Input,
    /// The W3C trace context of the call, which a source passes out to what it calls
    /// (`_meta.traceparent`, the `traceparent` header, the `TRACEPARENT` variable); `None`
    /// outside a traced call.
    pub trace: Option<toolhost_envelope::CallTrace>,
}

impl Context {
    /// The `traceparent` and `tracestate` (when kept) this call passes out.
    pub fn trace_headers(&self) -> Option<(String, Option<&str>)> {
        self.trace.as_ref().map(|trace| (trace.traceparent(), trace.tracestate.as_deref()))
    }
}

/// One progress report of a running call, as MCP's `notifications/progress` carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressReport {
    /// How far the call got; grows with every report, even when the total is unknown.
    pub progress: f64,
    /// What `progress` counts up to, when known.
    pub total: Option<f64>,
    /// A sentence about the current step.
    pub message: Option<String>,
}

/// Where a running tool reports progress: a cheap, cloneable handle. Reporting never waits and
/// never fails; the host decides what reaches the caller (it rate-limits and drops reports).
#[derive(Clone, Default)]
pub struct Progress {
    sink: Option<Arc<dyn Fn(ProgressReport) + Send + Sync>>,
}

impl Progress {
    /// A handle that hands every report to `sink`, which must not block.
    pub fn new(sink: impl Fn(ProgressReport) + Send + Sync + 'static) -> Progress {
        Progress { sink: Some(Arc::new(sink)) }
    }

    /// Reports progress; does nothing when nobody listens.
    pub fn report(&self, report: ProgressReport) {
        if let Some(sink) = &self.sink {
            sink(report);
        }
    }

    /// Whether reports go anywhere, so a tool can skip asking its backend for progress.
    pub fn is_relayed(&self) -> bool {
        self.sink.is_some()
    }
}

/// One log message of a running call, as MCP's `notifications/message` carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct LogReport {
    /// The syslog level MCP names: `debug`, `info`, `notice`, `warning`, `error`, `critical`,
    /// `alert` or `emergency`.
    pub level: String,
    /// The logger's name, when the tool gave one.
    pub logger: Option<String>,
    /// What it logged: any JSON.
    pub data: Value,
}

/// Where a running tool sends log messages for its caller: a cheap, cloneable handle like
/// [`Progress`]. Sending never waits and never fails; the host rate-limits what reaches the
/// caller.
#[derive(Clone, Default)]
pub struct Log {
    sink: Option<Arc<dyn Fn(LogReport) + Send + Sync>>,
}

impl Log {
    /// A handle that hands every message to `sink`, which must not block.
    pub fn new(sink: impl Fn(LogReport) + Send + Sync + 'static) -> Log {
        Log { sink: Some(Arc::new(sink)) }
    }

    /// Sends a message; does nothing when nobody listens.
    pub fn report(&self, report: LogReport) {
        if let Some(sink) = &self.sink {
            sink(report);
        }
    }

    /// Whether messages go anywhere.
    pub fn is_relayed(&self) -> bool {
        self.sink.is_some()
    }
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log").field("relayed", &self.is_relayed()).finish()
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress").field("relayed", &self.is_relayed()).finish()
    }
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
    /// The tool's answer is over a configured bound (`max_response_bytes`): answers
    /// `tool_failed` with `{"limit_bytes", "size_bytes", "setting"}` in the details, so a caller
    /// knows which setting to raise. Nothing of the answer is kept.
    #[error("{message}")]
    TooLarge {
        /// One readable sentence naming the limit.
        message: String,
        /// The bound.
        limit_bytes: usize,
        /// The answer's size.
        size_bytes: usize,
        /// The setting that holds the bound.
        setting: &'static str,
    },
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
            ToolError::Failed(_) | ToolError::TooLarge { .. } => ErrorCode::ToolFailed,
            ToolError::Timeout(_) => ErrorCode::Timeout,
            ToolError::Unavailable { .. } => ErrorCode::Overloaded,
        }
    }

    /// Structure for the caller to act on, carried into the answer's `details`:
    /// `{"retry_after_ms"}` for [`ToolError::Unavailable`], `{"limit_bytes", "size_bytes",
    /// "setting"}` for [`ToolError::TooLarge`], nothing for the others.
    pub fn details(&self) -> Option<Value> {
        match self {
            ToolError::Unavailable { retry_after, .. } => {
                Some(json!({ "retry_after_ms": u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX) }))
            }
            ToolError::TooLarge { limit_bytes, size_bytes, setting, .. } => {
                Some(json!({ "limit_bytes": limit_bytes, "size_bytes": size_bytes, "setting": setting }))
            }
            _ => None,
        }
    }
}
