//! One MCP server as a tool source: its supervisor (connect, list, watch, restart) and its tools.
//!
//! The supervisor is one task per server. It connects (starting the stdio child, or opening a
//! streamable HTTP session), lists the tools following pagination, and then watches: for the
//! child's exit, the session's end, a call that saw the connection break (checked with a ping),
//! and `notifications/tools/list_changed` (debounced by [`LIST_CHANGED_DEBOUNCE`], then re-listed).
//! Resources, resource templates and prompts ([`crate::catalog`]) are listed after the tools on
//! every connection and again after their own `list_changed`, debounced the same way.
//! When the connection is lost it kills the child's group and waits for it, marks the source
//! down, and tries again after a capped exponential backoff with jitter (250 ms up to
//! [`MAX_BACKOFF`]). On shutdown it does the same and stops.
//!
//! The tools of a source stay listed while it is down; a call then answers at once with
//! [`ToolError::Unavailable`] (`overloaded`, with `retry_after_ms` until the next attempt).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};
#[allow(deprecated)]
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ClientConfig, ClientRequest, CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams,
    ElicitResult, ErrorCode, Implementation, ListRootsResult, LoggingMessageNotificationParam,
    ProgressNotificationParam, ProgressToken, ProtocolVersion, RequestId, RequestMetaObject,
    ResourceUpdatedNotificationParam, ServerResult,
};
use rmcp::service::{
    NotificationContext, PeerRequestOptions, RequestContext, RunningService, RunningServiceCancellationToken,
    ServiceError,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolhost_tools::terminal::{Identity, Limits};
use toolhost_tools::{Context, Output, Progress, ProgressReport, Registry, Tool, ToolError, ToolSpec};

use crate::catalog::{self, Catalog, Operation, Target};
use crate::child::{ChildSpec, ManagedChild};
use crate::config::{ServerSpec, Transport};
use crate::input::{InputRoute, InputRoutes};
use crate::logging::LogRoutes;
use crate::{mapping, mrtr, names, task};

/// Quiet time after a `list_changed` before the tools are listed again, so a burst is one list.
pub const LIST_CHANGED_DEBOUNCE: Duration = Duration::from_millis(300);
/// Longest wait between two attempts to reach a server that is down.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Shortest wait before the first attempt after a loss.
const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// How long connecting and initialising may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long listing the tools may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a ping that checks a connection may take.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the session may take to close before the supervisor stops waiting for it.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// The retry hint while a connection attempt is under way.
const CONNECTING_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the daemon hears from its sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpEvent {
    /// The tools of `source` changed (after `list_changed` or a restart): rebuild the registry
    /// from [`crate::McpSources::tools`] and republish it.
    ToolsChanged {
        /// The source's name.
        source: String,
    },
    /// The resources, resource templates or prompts of `source` changed (after a
    /// `list_changed` of theirs or a restart): republish [`crate::McpSources::catalog`].
    CatalogChanged {
        /// The source's name.
        source: String,
    },
    /// `source` sent `notifications/resources/updated` for `uri`, a resource toolhost
    /// subscribed to ([`crate::McpSources::subscribe`]).
    ResourceUpdated {
        /// The source's name.
        source: String,
        /// The resource's URI, as the server wrote it.
        uri: String,
    },
    /// `source` is connected and its tools answer.
    Up {
        /// The source's name.
        source: String,
    },
    /// `source` was lost; its tools answer `overloaded` until it is back.
    Down {
        /// The source's name.
        source: String,
        /// Why, in one sentence.
        error: String,
    },
}

/// A source's state, for `/status` and metrics (`toolhost_source_up{source}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceStatus {
    /// The source's name.
    pub name: String,
    /// `stdio` or `http`.
    pub transport: &'static str,
    /// Whether it is connected.
    pub up: bool,
    /// Connection attempts after the first.
    pub restarts: u64,
    /// Tools it serves (listed, allowed, with compiling schemas).
    pub tools: usize,
    /// Listings refused because a name collided with another source's tool.
    pub rejected_lists: u64,
    /// The stdio child's pid while it runs.
    pub pid: Option<u32>,
    /// The last failure, if any.
    pub last_error: Option<String>,
}

/// How stdio children run: the terminal tool's rlimits and its resolved `run_as` identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct Children {
    /// `[tools.terminal]` `max_processes`, `cpu_seconds`, `file_size_bytes`
    /// ([`Limits::from_settings`]).
    pub limits: Limits,
    /// The user children run as ([`toolhost_tools::terminal::resolve_run_as`]); `None` runs them
    /// as the daemon's own user (what a daemon not started as root does anyway).
    pub run_as: Option<Identity>,
}

/// What every source shares: the daemon's environment, the children's limits, the names each
/// source serves (to refuse collisions), the event channel and the shutdown token.
pub(crate) struct Common {
    pub(crate) base_env: BTreeMap<String, String>,
    pub(crate) children: Children,
    pub(crate) names: Mutex<BTreeMap<String, BTreeSet<String>>>,
    pub(crate) events: mpsc::UnboundedSender<McpEvent>,
    pub(crate) shutdown: CancellationToken,
}

/// One source's shared state: read by its tools, written by its supervisor.
pub(crate) struct Shared {
    pub(crate) spec: ServerSpec,
    peer: RwLock<Option<Peer<RoleClient>>>,
    status: Mutex<SourceStatus>,
    /// When the next connection attempt starts, while the source is down and waiting.
    next_attempt: Mutex<Option<Instant>>,
    tools: RwLock<Vec<Arc<dyn Tool>>>,
    /// Fingerprint of the listing the current tools come from.
    listing: Mutex<String>,
    /// The server's resources, resource templates and prompts, from its last listing.
    catalog: RwLock<Catalog>,
    permits: Semaphore,
    /// A call saw the connection break.
    recheck: Notify,
    /// Where the server's `notifications/progress` go, by progress token.
    progress: Arc<ProgressRoutes>,
    /// The calls in flight, for the server's `notifications/message`.
    logs: Arc<LogRoutes>,
    /// The calls in flight, for the server's `elicitation/create` and `sampling/createMessage`.
    inputs: Arc<InputRoutes>,
    /// The resource URIs toolhost is subscribed to, subscribed again on every connection.
    pub(crate) subscribed: Mutex<BTreeSet<String>>,
}

/// The calls waiting for progress, by the progress token their request carried.
///
/// rmcp picks a request's token itself as it sends the request, so a call learns its token only
/// once the request is on its way; a notification that overtakes that moment is kept among a
/// few orphans and handed over when the call registers.
#[derive(Default)]
pub(crate) struct ProgressRoutes {
    inner: Mutex<Routes>,
}

#[derive(Default)]
struct Routes {
    /// Each call's handle and the last progress it was given.
    calls: HashMap<ProgressToken, (Progress, Option<f64>)>,
    /// Notifications for tokens nobody registered, with when they came.
    orphans: VecDeque<(Instant, ProgressNotificationParam)>,
}

/// How many notifications for tokens nobody registered are kept (the latest win).
const PROGRESS_ORPHANS: usize = 16;
/// How long such a notification is kept. One that overtook its call's registration is
/// microseconds ahead; one that is older came after its call ended, and must not reach a later
/// call that gets the same token (rmcp numbers tokens from 0 again on a new connection).
const PROGRESS_ORPHAN_AGE: Duration = Duration::from_secs(1);

impl ProgressRoutes {
    /// Sends the progress of `token` to `progress` until the guard is dropped.
    fn add(self: &Arc<Self>, token: ProgressToken, progress: Progress) -> ProgressRoute {
        let orphans = {
            let mut routes = lock(&self.inner);
            let (mine, others): (Vec<_>, Vec<_>) =
                routes.orphans.drain(..).partition(|(_, orphan)| orphan.progress_token == token);
            routes.orphans = others.into();
            let mut last: Option<f64> = None;
            let mut fresh = Vec::new();
            for (_, orphan) in mine.into_iter().filter(|(at, _)| at.elapsed() < PROGRESS_ORPHAN_AGE) {
                if last.is_none_or(|last| orphan.progress > last) {
                    last = Some(orphan.progress);
                    fresh.push(orphan);
                }
            }
            routes.calls.insert(token.clone(), (progress.clone(), last));
            fresh
        };
        for orphan in orphans {
            progress.report(report_of(orphan));
        }
        ProgressRoute { routes: self.clone(), token }
    }

    /// Hands a notification to the call it belongs to. rmcp handles each notification on a task
    /// of its own, so two may arrive out of order: one that does not advance the call's progress
    /// is dropped (MCP says progress grows with every notification).
    fn deliver(&self, params: ProgressNotificationParam) {
        let progress = {
            let mut routes = lock(&self.inner);
            match routes.calls.get_mut(&params.progress_token) {
                Some((_, last)) if last.is_some_and(|last| params.progress <= last) => return,
                Some((progress, last)) => {
                    *last = Some(params.progress);
                    progress.clone()
                }
                None => {
                    if routes.orphans.len() == PROGRESS_ORPHANS {
                        routes.orphans.pop_front();
                    }
                    routes.orphans.push_back((Instant::now(), params));
                    return;
                }
            }
        };
        progress.report(report_of(params));
    }
}

/// Removes a call's progress route when the call ends.
struct ProgressRoute {
    routes: Arc<ProgressRoutes>,
    token: ProgressToken,
}

impl Drop for ProgressRoute {
    fn drop(&mut self) {
        let mut routes = lock(&self.routes.inner);
        routes.calls.remove(&self.token);
        // A notification that came after the call ended belongs to nobody.
        routes.orphans.retain(|(_, orphan)| orphan.progress_token != self.token);
    }
}

fn report_of(params: ProgressNotificationParam) -> ProgressReport {
    ProgressReport { progress: params.progress, total: params.total, message: params.message }
}

/// Tells the server about a call nobody waits for any more (the future was dropped: a timeout,
/// a cancel, shutdown), as rmcp's own `call_tool_once` does.
struct Abandoned {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let peer = self.peer.clone();
        let params =
            CancelledNotificationParam::new(Some(id), Some("request abandoned by the caller".to_owned()));
        // Best effort, like rmcp's: the notification is queued on the session's own task.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = peer.notify_cancelled(params).await;
            });
        }
    }
}

/// `tools/call` with a progress route: what `call_tool_once` does, keeping the request's
/// progress token so the server's `notifications/progress` for it reach `progress`, and its id
/// so the server's questions on its stream reach the call's `input`; `meta` is added to the
/// request's `_meta` (the tasks extension, [`task::declare`]).
async fn call_with_progress(
    peer: &Peer<RoleClient>,
    params: CallToolRequestParams,
    routes: &Arc<ProgressRoutes>,
    progress: &Progress,
    input: &InputRoute<'_>,
    meta: Option<RequestMetaObject>,
) -> Result<CallToolResponse, ServiceError> {
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let mut options = PeerRequestOptions::no_options();
    options.meta = meta;
    let handle = peer.send_request_with_option(request, options).await?;
    let _route = routes.add(handle.progress_token.clone(), progress.clone());
    input.sent(handle.id.clone());
    let mut abandoned = Abandoned { peer: peer.clone(), id: Some(handle.id.clone()) };
    let result = handle.await_response().await;
    abandoned.id = None;
    match result? {
        ServerResult::CallToolResult(result) => Ok(CallToolResponse::Complete(result)),
        ServerResult::InputRequiredResult(result) => Ok(CallToolResponse::InputRequired(result)),
        ServerResult::CreateTaskResult(result) => Ok(CallToolResponse::Task(result)),
        // A reply without `content` decodes as an empty result.
        ServerResult::EmptyResult(_) => Ok(CallToolResponse::Complete(CallToolResult::default())),
        _ => Err(ServiceError::UnexpectedResponse),
    }
}

/// How the first connection attempt of a source ended.
pub(crate) enum FirstAttempt {
    /// Connected and listed.
    Up,
    /// Not reached (it keeps trying).
    Down(String),
    /// Its names collide with another source's: a configuration error.
    Collision(String),
}

impl Shared {
    pub(crate) fn new(spec: ServerSpec) -> Arc<Shared> {
        let status = SourceStatus {
            name: spec.name.clone(),
            transport: match spec.transport {
                Transport::Stdio { .. } => "stdio",
                Transport::Http { .. } => "http",
            },
            up: false,
            restarts: 0,
            tools: 0,
            rejected_lists: 0,
            pid: None,
            last_error: None,
        };
        Arc::new(Shared {
            permits: Semaphore::new(spec.max_concurrent.max(1)),
            spec,
            peer: RwLock::new(None),
            status: Mutex::new(status),
            next_attempt: Mutex::new(None),
            tools: RwLock::new(Vec::new()),
            listing: Mutex::new(String::new()),
            catalog: RwLock::new(Catalog::default()),
            recheck: Notify::new(),
            progress: Arc::default(),
            logs: Arc::default(),
            inputs: Arc::default(),
            subscribed: Mutex::default(),
        })
    }

    pub(crate) fn status(&self) -> SourceStatus {
        lock(&self.status).clone()
    }

    pub(crate) fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub(crate) fn catalog(&self) -> Catalog {
        self.catalog.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Lists the server's catalog again and keeps it; `true` when it differs from the last.
    async fn relist_catalog(&self, peer: &Peer<RoleClient>) -> bool {
        let (catalog, failures) = catalog::list(peer, &self.spec.prefix).await;
        for failure in failures {
            tracing::warn!(source = %self.spec.name, error = %failure, "an MCP server's catalog listing failed; that kind stays empty");
        }
        let mut kept = self.catalog.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *kept == catalog {
            return false;
        }
        *kept = catalog;
        true
    }

    pub(crate) fn peer(&self) -> Option<Peer<RoleClient>> {
        self.peer.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn set_peer(&self, peer: Option<Peer<RoleClient>>) {
        *self.peer.write().unwrap_or_else(std::sync::PoisonError::into_inner) = peer;
    }

    /// The answer of a call while the source is down.
    pub(crate) fn unavailable(&self) -> ToolError {
        let retry_after = lock(&self.next_attempt)
            .map(|at| at.saturating_duration_since(Instant::now()))
            .unwrap_or(CONNECTING_RETRY_AFTER)
            .max(Duration::from_millis(100));
        ToolError::Unavailable {
            message: format!("MCP server '{}' is down and being restarted; retry later", self.spec.name),
            retry_after,
        }
    }
}

impl Shared {
    /// Whether this server lists `target` (see [`Catalog::serves`]).
    pub(crate) fn serves(&self, target: &Target) -> bool {
        self.catalog.read().unwrap_or_else(std::sync::PoisonError::into_inner).serves(target)
    }

    /// Sends `operation` with `params` to the server, a prompt's name taken back to the server's
    /// own, within the server's `timeout_ms` and `max_concurrent`; the MCP result as JSON.
    ///
    /// # Errors
    /// Params MCP does not accept or the server refuses: `InvalidArguments`; the server down:
    /// `Unavailable`; no answer in time: `Timeout`; a result over `max_response_bytes`:
    /// `TooLarge`; any other failure: `Failed`.
    pub(crate) async fn request(&self, operation: Operation, mut params: Value) -> Result<Value, ToolError> {
        let method = operation.method();
        let name = &self.spec.name;
        let prompt = match operation {
            Operation::GetPrompt => params.get_mut("name"),
            Operation::Complete => params.get_mut("ref").and_then(|r| r.get_mut("name")),
            Operation::ReadResource => None,
        };
        if let Some(prompt) = prompt
            && let Some(original) =
                prompt.as_str().and_then(|n| catalog::original_prompt_name(&self.spec.prefix, n))
        {
            *prompt = Value::String(original.to_owned());
        }
        let invalid = |err: serde_json::Error| ToolError::InvalidArguments(format!("{method}: {err}"));
        let request = match operation {
            Operation::ReadResource => ClientRequest::ReadResourceRequest(
                rmcp::model::ReadResourceRequest::new(serde_json::from_value(params).map_err(invalid)?),
            ),
            Operation::GetPrompt => ClientRequest::GetPromptRequest(rmcp::model::GetPromptRequest::new(
                serde_json::from_value(params).map_err(invalid)?,
            )),
            Operation::Complete => ClientRequest::CompleteRequest(rmcp::model::CompleteRequest::new(
                serde_json::from_value(params).map_err(invalid)?,
            )),
        };
        let Some(peer) = self.peer() else { return Err(self.unavailable()) };
        let _permit = self.permits.acquire().await;
        let answered = tokio::time::timeout(self.spec.timeout, peer.send_request(request)).await;
        let result = match answered {
            Err(_elapsed) => {
                return Err(ToolError::Timeout(format!(
                    "MCP server '{name}' did not answer {method} within {} ms",
                    self.spec.timeout.as_millis()
                )));
            }
            Ok(Err(error)) => {
                let (error, went_away) = mapping::service_error(method, name, error);
                if went_away {
                    self.recheck.notify_one();
                }
                return Err(error);
            }
            Ok(Ok(result)) => result,
        };
        let result = match (operation, result) {
            (Operation::ReadResource, ServerResult::ReadResourceResult(result)) => {
                serde_json::to_value(result)
            }
            (Operation::GetPrompt, ServerResult::GetPromptResult(result)) => serde_json::to_value(result),
            (Operation::Complete, ServerResult::CompleteResult(result)) => serde_json::to_value(result),
            _ => {
                return Err(ToolError::Failed(format!(
                    "MCP server '{name}' answered {method} in a form toolhost does not know"
                )));
            }
        }
        .map_err(|err| ToolError::Failed(format!("MCP server '{name}': {method} result: {err}")))?;
        let size = result.to_string().len();
        let limit = self.spec.max_response_bytes;
        if size > limit {
            return Err(ToolError::TooLarge {
                message: format!(
                    "MCP server '{name}' answered {method} with {size} bytes, over its max_response_bytes of {limit}"
                ),
                limit_bytes: limit,
                size_bytes: size,
                setting: "max_response_bytes",
            });
        }
        Ok(result)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One tool of an MCP server.
struct McpTool {
    spec: ToolSpec,
    /// The server's own name of the tool.
    original: String,
    source: Arc<Shared>,
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    async fn call(&self, arguments: Value, context: &Context) -> Result<Value, ToolError> {
        self.call_output(arguments, context).await.map(|output| output.result)
    }

    fn remote(&self) -> Option<toolhost_tools::Remote> {
        Some(toolhost_tools::Remote {
            system: "mcp",
            target: self.source.spec.name.clone(),
            name: self.original.clone(),
            transport: match self.source.spec.transport {
                Transport::Stdio { .. } => "pipe",
                Transport::Http { .. } => "tcp",
            },
        })
    }

    /// Calls the tool on the server. A call cut short (the future dropped at a timeout, or
    /// `context.cancel` fired) sends `notifications/cancelled` for its request.
    async fn call_output(&self, arguments: Value, context: &Context) -> Result<Output, ToolError> {
        let source = &self.source;
        let Some(peer) = source.peer() else { return Err(source.unavailable()) };
        let cancelled = || {
            ToolError::Timeout(format!(
                "the call of '{}' was cancelled; MCP server '{}' was told so",
                self.spec.name, source.spec.name
            ))
        };
        let _permit = tokio::select! {
            permit = source.permits.acquire() => permit.ok(),
            () = context.cancel.cancelled() => return Err(cancelled()),
        };
        let _in_flight = source.logs.add(context.log.clone());
        let asks = source.inputs.add(context.input.clone());
        let mut params = CallToolRequestParams::new(self.original.clone());
        // The call's trace context rides in `_meta` (SEP-414).
        if let Some((traceparent, tracestate)) = context.trace_headers() {
            let mut meta = RequestMetaObject::new();
            meta.set_traceparent(traceparent);
            if let Some(tracestate) = tracestate {
                meta.set_tracestate(tracestate);
            }
            params.meta = Some(meta);
        }
        params.arguments = match arguments {
            Value::Object(map) => Some(map),
            Value::Null => None,
            other => {
                return Err(ToolError::InvalidArguments(format!("arguments must be an object, not {other}")));
            }
        };
        let name = &self.spec.name;
        let failed = |(error, went_away): (ToolError, bool)| {
            if went_away {
                source.recheck.notify_one();
            }
            error
        };
        // A server that offers the tasks extension is told the call may be answered with a task.
        let tasks = task::offered(&peer).then(|| task::declare(crate::input::capabilities()));
        // Dropping this future before its answer makes rmcp send notifications/cancelled (or
        // `Abandoned`, when progress is relayed), or `tasks/cancel` for a task being followed.
        // An `InputRequiredResult` (MRTR, 2026-07-28) is answered through the call's input and
        // the call retried (`mrtr`); a task is followed to its end (`task`).
        let call = async {
            let mut params = params;
            let mut rounds = 0;
            loop {
                let sent = if context.progress.is_relayed() || context.input.is_relayed() || tasks.is_some() {
                    let meta = tasks.clone();
                    call_with_progress(
                        &peer,
                        params.clone(),
                        &source.progress,
                        &context.progress,
                        &asks,
                        meta,
                    )
                    .await
                } else {
                    peer.call_tool_once(params.clone()).await
                };
                let response = match sent {
                    Ok(CallToolResponse::Task(created)) => {
                        // Only a call that declared the extension gets a task; one that did not
                        // is followed with the same declaration all the same.
                        let meta =
                            tasks.clone().unwrap_or_else(|| task::declare(crate::input::capabilities()));
                        let task = (created, &meta);
                        let result = task::follow((name, &source.spec.name), &peer, task, &context.input)
                            .await
                            .map_err(failed)?;
                        CallToolResponse::Complete(result)
                    }
                    Ok(response) => response,
                    Err(error) => return Err(failed(mapping::service_error(name, &source.spec.name, error))),
                };
                let CallToolResponse::InputRequired(round) = response else {
                    return mapping::answer(name, response, source.spec.max_response_bytes);
                };
                if rounds == mrtr::MAX_ROUNDS {
                    return Err(mrtr::too_many_rounds(name));
                }
                rounds += 1;
                let responses = mrtr::answer_round(name, &context.input, &round).await?;
                params = params.with_input_responses(responses);
                params.request_state = round.request_state;
            }
        };
        tokio::select! {
            biased;
            () = context.cancel.cancelled() => Err(cancelled()),
            res = call => res,
        }
    }
}

/// The client side toolhost shows a server: elicitation and sampling, asked of the call's caller
/// ([`crate::input`]), and a note of `list_changed`.
pub(crate) struct Handler {
    info: ClientConfig,
    changed: mpsc::Sender<()>,
    /// Notes a `list_changed` of resources or prompts.
    catalog_changed: mpsc::Sender<()>,
    progress: Arc<ProgressRoutes>,
    logs: Arc<LogRoutes>,
    /// Where the server's questions go.
    inputs: Arc<InputRoutes>,
    /// The source's name, for log messages no call takes.
    source: String,
    /// Where resource updates go (the daemon's events).
    updates: mpsc::UnboundedSender<McpEvent>,
}

impl Handler {
    fn new(
        changed: mpsc::Sender<()>,
        catalog_changed: mpsc::Sender<()>,
        progress: Arc<ProgressRoutes>,
        logs: Arc<LogRoutes>,
        inputs: Arc<InputRoutes>,
        (source, updates): (&str, mpsc::UnboundedSender<McpEvent>),
    ) -> Handler {
        // Elicitation and sampling, but no roots. The last protocol version with `initialize`,
        // so that list_changed arrives as a plain notification.
        let info = ClientConfig::new(
            crate::input::capabilities(),
            Implementation::new("toolhost", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE);
        Handler { info, changed, catalog_changed, progress, logs, inputs, source: source.to_owned(), updates }
    }
}

fn not_offered(what: &str) -> ErrorData {
    ErrorData::new(ErrorCode::METHOD_NOT_FOUND, format!("toolhost offers MCP servers no {what}"), None)
}

// Sampling and roots are deprecated in MCP (SEP-2577); servers of the `initialize` generations
// still ask for sampling, which is relayed to the caller; roots are refused.
#[allow(deprecated)]
impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        // A full channel already holds a change to handle; this one joins it.
        let _ = self.changed.try_send(());
        std::future::ready(())
    }

    fn on_resource_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        let _ = self.catalog_changed.try_send(());
        std::future::ready(())
    }

    fn on_prompt_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        let _ = self.catalog_changed.try_send(());
        std::future::ready(())
    }

    fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        let _ = self.updates.send(McpEvent::ResourceUpdated { source: self.source.clone(), uri: params.uri });
        std::future::ready(())
    }

    fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        self.progress.deliver(params);
        std::future::ready(())
    }

    fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        self.logs.deliver(&self.source, params);
        std::future::ready(())
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.inputs.sample(&self.source, params, &context).await
    }

    fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<ListRootsResult, ErrorData>> + Send + '_ {
        std::future::ready(Err(not_offered("roots")))
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.inputs.elicit(&self.source, request, &context).await
    }
}

/// A live connection: the session and, for stdio, the child.
struct Connection {
    peer: Peer<RoleClient>,
    /// Stops the session; taken when used.
    stop: Option<RunningServiceCancellationToken>,
    /// Resolves when the session has ended; not polled again once it has.
    ended: Pin<Box<dyn Future<Output = ()> + Send>>,
    has_ended: bool,
    child: Option<ManagedChild>,
    changed: mpsc::Receiver<()>,
    catalog_changed: mpsc::Receiver<()>,
}

impl Connection {
    fn new(
        service: RunningService<RoleClient, Handler>,
        child: Option<ManagedChild>,
        (changed, catalog_changed): (mpsc::Receiver<()>, mpsc::Receiver<()>),
    ) -> Connection {
        let peer = service.peer().clone();
        let stop = Some(service.cancellation_token());
        let ended = Box::pin(async move {
            let _ = service.waiting().await;
        });
        Connection { peer, stop, ended, has_ended: false, child, changed, catalog_changed }
    }

    /// Closes the session, then kills the child's group and waits for it.
    async fn close(mut self, source: &str) {
        if let Some(stop) = self.stop.take() {
            stop.cancel();
        }
        if !self.has_ended && tokio::time::timeout(CLOSE_TIMEOUT, &mut self.ended).await.is_err() {
            tracing::warn!(source, "an MCP session did not close in time");
        }
        if let Some(child) = self.child.take() {
            child.kill_and_wait(source).await;
        }
    }
}

/// Why a connection ended.
enum Ended {
    Shutdown,
    Lost(String),
}

/// Runs one source until shutdown. `first` hears how the first attempt ended.
pub(crate) async fn supervise(
    shared: Arc<Shared>,
    common: Arc<Common>,
    first: tokio::sync::oneshot::Sender<FirstAttempt>,
) {
    let name = shared.spec.name.clone();
    let mut first = Some(first);
    let mut backoff = backoff();
    loop {
        // connect() watches the shutdown itself, so that a child it started is killed and
        // waited for rather than dropped.
        let attempt = connect(&shared, &common).await;
        if common.shutdown.is_cancelled() {
            if let Ok(connection) = attempt {
                connection.close(&name).await;
            }
            break;
        }
        let failure = match attempt {
            Ok(mut connection) => match listed(&shared, &common, &connection.peer, first.is_some()).await {
                None => {
                    connection.close(&name).await;
                    break;
                }
                Some(listed) => match listed {
                    Ok(()) => {
                        backoff = self::backoff();
                        let relisted = tokio::select! {
                            changed = shared.relist_catalog(&connection.peer) => Some(changed),
                            () = common.shutdown.cancelled() => None,
                        };
                        let Some(catalog_changed) = relisted else {
                            connection.close(&name).await;
                            break;
                        };
                        if catalog_changed && first.is_none() {
                            let _ = common.events.send(McpEvent::CatalogChanged { source: name.clone() });
                        }
                        shared.resubscribe(&connection.peer).await;
                        shared.set_peer(Some(connection.peer.clone()));
                        {
                            let mut status = lock(&shared.status);
                            status.up = true;
                            status.last_error = None;
                            status.pid = connection.child.as_ref().and_then(ManagedChild::pid);
                        }
                        let protocol =
                            connection.peer.peer_info().map(|info| info.protocol_version.to_string());
                        tracing::info!(source = %name, tools = shared.status().tools, protocol, "MCP server is up");
                        if let Some(first) = first.take() {
                            let _ = first.send(FirstAttempt::Up);
                        } else {
                            let _ = common.events.send(McpEvent::Up { source: name.clone() });
                        }
                        let ended = watch(&shared, &common, &mut connection).await;
                        shared.set_peer(None);
                        {
                            let mut status = lock(&shared.status);
                            status.up = false;
                            status.pid = None;
                        }
                        connection.close(&name).await;
                        match ended {
                            Ended::Shutdown => break,
                            Ended::Lost(error) => {
                                let _ = common
                                    .events
                                    .send(McpEvent::Down { source: name.clone(), error: error.clone() });
                                error
                            }
                        }
                    }
                    Err(ListFailure::Collision(error)) if first.is_some() => {
                        connection.close(&name).await;
                        if let Some(first) = first.take() {
                            let _ = first.send(FirstAttempt::Collision(error));
                        }
                        break;
                    }
                    Err(ListFailure::Collision(error) | ListFailure::Failed(error)) => {
                        connection.close(&name).await;
                        error
                    }
                },
            },
            Err(error) => error,
        };
        tracing::warn!(source = %name, error = %failure, "MCP server is down");
        lock(&shared.status).last_error = Some(failure.clone());
        if let Some(first) = first.take() {
            let _ = first.send(FirstAttempt::Down(failure));
        }
        // backon's jitter may add up to the delay itself; the cap holds after it.
        let delay = backoff.next().unwrap_or(MAX_BACKOFF).min(MAX_BACKOFF);
        *lock(&shared.next_attempt) = Some(Instant::now() + delay);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = common.shutdown.cancelled() => break,
        }
        *lock(&shared.next_attempt) = None;
        lock(&shared.status).restarts += 1;
    }
    shared.set_peer(None);
    lock(&common.names).remove(&name);
    tracing::info!(source = %name, "MCP source stopped");
}

/// [`list`], or `None` when the daemon stops first.
async fn listed(
    shared: &Arc<Shared>,
    common: &Common,
    peer: &Peer<RoleClient>,
    initial: bool,
) -> Option<Result<(), ListFailure>> {
    tokio::select! {
        listed = list(shared, common, peer, initial) => Some(listed),
        () = common.shutdown.cancelled() => None,
    }
}

fn backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(MIN_BACKOFF)
        .with_max_delay(MAX_BACKOFF)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Connects and initialises.
async fn connect(shared: &Shared, common: &Common) -> Result<Connection, String> {
    let spec = &shared.spec;
    let (changed_tx, changed) = mpsc::channel(1);
    let (catalog_tx, catalog_changed) = mpsc::channel(1);
    let changed = (changed, catalog_changed);
    let listeners = crate::lifecycle::Listeners {
        changed: changed_tx.clone(),
        catalog_changed: catalog_tx.clone(),
        events: common.events.clone(),
        source: spec.name.clone(),
    };
    let named = (spec.name.as_str(), common.events.clone());
    let handler = Handler::new(
        changed_tx,
        catalog_tx,
        shared.progress.clone(),
        shared.logs.clone(),
        shared.inputs.clone(),
        named,
    );
    let connection = connect_with(shared, common, handler, changed).await?;
    if crate::lifecycle::is_modern(&connection.peer)
        && let Err(err) = crate::lifecycle::listen(&connection.peer, listeners).await
    {
        tracing::warn!(source = %spec.name, error = %err, "subscriptions/listen of a 2026-07-28 server failed; its list changes are not followed");
    }
    Ok(connection)
}

/// Starts or reaches the server and opens the session with `handler`.
async fn connect_with(
    shared: &Shared,
    common: &Common,
    handler: Handler,
    changed: (mpsc::Receiver<()>, mpsc::Receiver<()>),
) -> Result<Connection, String> {
    let spec = &shared.spec;
    match &spec.transport {
        Transport::Stdio { command, args, env, cwd } => {
            let child_spec = ChildSpec {
                source: &spec.name,
                command,
                args,
                env,
                cwd: cwd.as_ref(),
                base_env: &common.base_env,
                limits: common.children.limits,
                identity: common.children.run_as,
            };
            let (child, stdout, stdin) = ManagedChild::spawn(&child_spec).map_err(|err| {
                format!("MCP server '{}' could not be started ({command}): {err}", spec.name)
            })?;
            lock(&shared.status).pid = child.pid();
            let served = tokio::select! {
                served = tokio::time::timeout(CONNECT_TIMEOUT, handler.open((stdout, stdin), spec.protocol)) => served,
                () = common.shutdown.cancelled() => {
                    child.kill_and_wait(&spec.name).await;
                    return Err(format!("MCP server '{}' was stopped while it started", spec.name));
                }
            };
            match served {
                Ok(Ok(service)) => Ok(Connection::new(service, Some(child), changed)),
                Ok(Err(err)) => {
                    child.kill_and_wait(&spec.name).await;
                    Err(format!("MCP server '{}' did not initialise: {err}", spec.name))
                }
                Err(_elapsed) => {
                    child.kill_and_wait(&spec.name).await;
                    Err(format!("MCP server '{}' did not initialise within {CONNECT_TIMEOUT:?}", spec.name))
                }
            }
        }
        Transport::Http { url, headers } => {
            let mut custom = HashMap::new();
            for (name, value) in headers {
                let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|err| format!("header {name}: {err}"))?;
                let mut value = reqwest::header::HeaderValue::from_str(value.expose())
                    .map_err(|_| format!("header {name} has an invalid value"))?;
                value.set_sensitive(true);
                custom.insert(name, value);
            }
            let client = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|err| format!("MCP server '{}': HTTP client: {err}", spec.name))?;
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(custom)
                .reinit_on_expired_session(true);
            let transport = StreamableHttpClientTransport::with_client(client, config);
            let served = tokio::select! {
                served = tokio::time::timeout(CONNECT_TIMEOUT, handler.open(transport, spec.protocol)) => served,
                () = common.shutdown.cancelled() => {
                    return Err(format!("MCP server '{}' was stopped while it connected", spec.name));
                }
            };
            match served {
                Ok(Ok(service)) => Ok(Connection::new(service, None, changed)),
                Ok(Err(err)) => Err(format!("MCP server '{}' at {url} did not initialise: {err}", spec.name)),
                Err(_elapsed) => Err(format!(
                    "MCP server '{}' at {url} did not initialise within {CONNECT_TIMEOUT:?}",
                    spec.name
                )),
            }
        }
    }
}

enum ListFailure {
    Collision(String),
    Failed(String),
}

/// Lists the tools (every page) and takes them in, unless a name collides with another
/// source's. `initial` lists never emit `ToolsChanged`.
async fn list(
    shared: &Arc<Shared>,
    common: &Common,
    peer: &Peer<RoleClient>,
    initial: bool,
) -> Result<(), ListFailure> {
    let spec = &shared.spec;
    let listed = match tokio::time::timeout(LIST_TIMEOUT, peer.list_all_tools()).await {
        Ok(Ok(listed)) => listed,
        Ok(Err(err)) => {
            return Err(ListFailure::Failed(format!("MCP server '{}': tools/list failed: {err}", spec.name)));
        }
        Err(_elapsed) => {
            return Err(ListFailure::Failed(format!(
                "MCP server '{}': tools/list did not answer in time",
                spec.name
            )));
        }
    };
    let allowed = allowed(spec, listed);
    let fingerprint = serde_json::to_string(&allowed).unwrap_or_default();
    if !initial && *lock(&shared.listing) == fingerprint && !shared.tools().is_empty() {
        return Ok(());
    }
    let (tools, taken) = build_tools(shared, &allowed);
    if let Err(error) = claim(&common.names, &spec.name, taken) {
        if initial {
            return Err(ListFailure::Collision(error));
        }
        lock(&shared.status).rejected_lists += 1;
        tracing::error!(source = %spec.name, error = %error, "new tool list refused; the old one stays");
        return Ok(());
    }
    let count = tools.len();
    *shared.tools.write().unwrap_or_else(std::sync::PoisonError::into_inner) = tools;
    *lock(&shared.listing) = fingerprint;
    lock(&shared.status).tools = count;
    if !initial {
        let _ = common.events.send(McpEvent::ToolsChanged { source: spec.name.clone() });
    }
    Ok(())
}

/// The listed tools the allow list lets through (all without one).
fn allowed(spec: &ServerSpec, listed: Vec<rmcp::model::Tool>) -> Vec<rmcp::model::Tool> {
    listed
        .into_iter()
        .filter(|tool| {
            spec.tools.as_ref().is_none_or(|allow| allow.iter().any(|name| name == tool.name.as_ref()))
        })
        .collect()
}

/// The toolhost tools of a listing and their names. A tool whose mapped name another tool of
/// the same listing took first, or whose schemas the registry does not compile, is skipped with
/// a log line; the others are kept.
fn build_tools(shared: &Arc<Shared>, listed: &[rmcp::model::Tool]) -> (Vec<Arc<dyn Tool>>, BTreeSet<String>) {
    let spec = &shared.spec;
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let mut taken = BTreeSet::new();
    for tool in listed {
        let name = names::tool_name(&spec.prefix, &tool.name);
        if taken.contains(&name) {
            tracing::warn!(source = %spec.name, tool = %tool.name, name = %name,
                "MCP tool skipped: its mapped name is taken by another tool of the same server");
            continue;
        }
        let mcp_tool: Arc<dyn Tool> = Arc::new(McpTool {
            spec: mapping::spec(spec, &name, tool),
            original: tool.name.to_string(),
            source: shared.clone(),
        });
        // The registry's own compilation decides: a schema it refuses skips the tool alone.
        if let Err(err) = Registry::new().register(mcp_tool.clone()) {
            tracing::warn!(source = %spec.name, tool = %tool.name, error = %err,
                "MCP tool skipped: its schema does not compile");
            continue;
        }
        taken.insert(name);
        tools.push(mcp_tool);
    }
    (tools, taken)
}

/// Records `taken` as the names `source` serves, unless another source serves one of them.
///
/// # Errors
/// A sentence naming the tool and both sources.
fn claim(
    names: &Mutex<BTreeMap<String, BTreeSet<String>>>,
    source: &str,
    taken: BTreeSet<String>,
) -> Result<(), String> {
    let mut all = lock(names);
    for (other, theirs) in all.iter().filter(|(other, _)| other.as_str() != source) {
        if let Some(clash) = taken.intersection(theirs).next() {
            return Err(format!(
                "tool name '{clash}' is served by both MCP server '{other}' and MCP server '{source}'"
            ));
        }
    }
    all.insert(source.to_owned(), taken);
    Ok(())
}

/// Watches a live connection until it is lost or the daemon stops.
async fn watch(shared: &Arc<Shared>, common: &Common, connection: &mut Connection) -> Ended {
    let name = &shared.spec.name;
    loop {
        let child_exit = async {
            match connection.child.as_mut() {
                Some(child) => {
                    child.exited().await.map_or_else(|err| err.to_string(), |status| status.to_string())
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = common.shutdown.cancelled() => return Ended::Shutdown,
            status = child_exit => return Ended::Lost(format!("MCP server '{name}' exited ({status})")),
            () = &mut connection.ended, if !connection.has_ended => {
                connection.has_ended = true;
                return Ended::Lost(format!("MCP server '{name}' closed the session"));
            }
            () = shared.recheck.notified() => {
                let peer = connection.peer.clone();
                let alive = tokio::time::timeout(PING_TIMEOUT, peer.send_request(rmcp::model::ClientRequest::PingRequest(Default::default()))).await;
                if !matches!(alive, Ok(Ok(_))) {
                    return Ended::Lost(format!("MCP server '{name}' stopped answering"));
                }
            }
            Some(()) = connection.catalog_changed.recv() => {
                quiet(&mut connection.catalog_changed, LIST_CHANGED_DEBOUNCE).await;
                tracing::info!(source = %name, "MCP server's resources or prompts changed; listing them again");
                if shared.relist_catalog(&connection.peer).await {
                    let _ = common.events.send(McpEvent::CatalogChanged { source: name.clone() });
                }
            }
            Some(()) = connection.changed.recv() => {
                quiet(&mut connection.changed, LIST_CHANGED_DEBOUNCE).await;
                tracing::info!(source = %name, "MCP server's tools changed; listing them again");
                if let Err(ListFailure::Failed(error) | ListFailure::Collision(error)) = list(shared, common, &connection.peer, false).await {
                    tracing::warn!(source = %name, error = %error, "listing the changed tools failed; the old list stays");
                }
            }
        }
    }
}

/// Returns once `changes` has been quiet for `spell`: a burst of notifications is one.
async fn quiet(changes: &mut mpsc::Receiver<()>, spell: Duration) {
    loop {
        tokio::select! {
            Some(()) = changes.recv() => continue,
            () = tokio::time::sleep(spell) => return,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn progress_reaches_its_call_in_order_also_when_it_overtakes_the_registration() {
        let routes = Arc::new(ProgressRoutes::default());
        let token = |n| ProgressToken(rmcp::model::NumberOrString::Number(n));
        let note = |n, progress| ProgressNotificationParam::new(token(n), progress);
        // Before the call registered: kept for it.
        routes.deliver(note(1, 1.0));
        // Another call's.
        routes.deliver(note(2, 5.0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let route = {
            let seen = seen.clone();
            routes.add(token(1), Progress::new(move |report| lock(&seen).push(report.progress)))
        };
        routes.deliver(note(1, 3.0));
        // Overtaken by a later one: dropped.
        routes.deliver(note(1, 2.0));
        routes.deliver(note(1, 4.0));
        drop(route);
        // After the call: nobody's.
        routes.deliver(note(1, 9.0));
        assert_eq!(*lock(&seen), [1.0, 3.0, 4.0]);
        assert!(lock(&routes.inner).calls.is_empty());
    }

    #[tokio::test]
    async fn a_burst_of_list_changed_waits_for_one_quiet_spell_after_the_last() {
        let spell = Duration::from_millis(200);
        let gap = Duration::from_millis(40);
        let (changed, mut changes) = mpsc::channel(1);
        let burst = tokio::spawn(async move {
            for _ in 0..5 {
                let _ = changed.try_send(());
                tokio::time::sleep(gap).await;
            }
            changed
        });
        changes.recv().await.unwrap();
        let started = Instant::now();
        quiet(&mut changes, spell).await;
        // The burst's notifications came less than a spell apart, so the wait ends only a
        // spell after the last of them, and nothing of the burst is left over.
        assert!(started.elapsed() >= gap * 4 + spell, "{:?}", started.elapsed());
        let changed = burst.await.unwrap();
        assert!(changes.try_recv().is_err());
        drop(changed);
    }

    fn shared(prefix: &str, allow: Option<&[&str]>) -> Arc<Shared> {
        Shared::new(ServerSpec {
            name: "s".into(),
            transport: Transport::Http { url: "http://127.0.0.1:1/mcp".into(), headers: BTreeMap::new() },
            prefix: prefix.into(),
            timeout: Duration::from_secs(5),
            max_concurrent: 1,
            tools: allow.map(|names| names.iter().map(|name| (*name).to_owned()).collect()),
            max_response_bytes: crate::config::DEFAULT_MAX_RESPONSE_BYTES,
            protocol: crate::config::Protocol::Legacy,
        })
    }

    fn listed(tools: serde_json::Value) -> Vec<rmcp::model::Tool> {
        serde_json::from_value(tools).unwrap()
    }

    #[test]
    fn tools_with_broken_schemas_or_taken_names_are_skipped_and_the_rest_kept() {
        let shared = shared("p__", None);
        let tools = listed(serde_json::json!([
            {"name": "a.b", "inputSchema": {"type": "object"}},
            {"name": "a/b", "inputSchema": {"type": "object"}},
            {"name": "broken", "inputSchema": {"type": 5}},
            {"name": "bad-output", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object", "minProperties": "x"}},
            {"name": "fine", "inputSchema": {"type": "object"}}
        ]));
        let (tools, names) = build_tools(&shared, &tools);
        assert_eq!(names, BTreeSet::from(["p__a_b".to_owned(), "p__fine".to_owned()]));
        let specs: Vec<String> = tools.iter().map(|tool| tool.spec().name).collect();
        assert_eq!(specs, ["p__a_b", "p__fine"]);
    }

    #[test]
    fn the_allow_list_filters_by_original_names() {
        let shared = shared("", Some(&["keep.me"]));
        let tools = allowed(
            &shared.spec,
            listed(serde_json::json!([
                {"name": "keep.me", "inputSchema": {"type": "object"}},
                {"name": "keep_me", "inputSchema": {"type": "object"}}
            ])),
        );
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].name, "keep.me");
    }

    #[test]
    fn a_name_another_source_serves_is_refused_naming_both_and_a_source_may_replace_its_own() {
        let names = Mutex::new(BTreeMap::new());
        let set = |items: &[&str]| items.iter().map(|item| (*item).to_owned()).collect::<BTreeSet<_>>();
        claim(&names, "first", set(&["x", "y"])).unwrap();
        let refused = claim(&names, "second", set(&["z", "y"])).unwrap_err();
        assert_eq!(refused, "tool name 'y' is served by both MCP server 'first' and MCP server 'second'");
        assert!(!lock(&names).contains_key("second"), "a refused list claims nothing");
        claim(&names, "first", set(&["x", "y", "w"])).unwrap();
        claim(&names, "second", set(&["z"])).unwrap();
        assert_eq!(lock(&names)["first"], set(&["w", "x", "y"]));
    }
}
