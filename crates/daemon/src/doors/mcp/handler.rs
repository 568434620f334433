//! One MCP session: the rmcp server handler that lists the fleet's tools and calls them through
//! the fleet client.
//!
//! Every session (a stdio process has one, the HTTP door one per `Mcp-Session-Id`, and one per
//! request of a 2026-07-28 client, which has no session) has its own [`Session`] over the shared
//! [`Door`]. In the `initialize` generations a call's request id is made from the session and
//! the JSON-RPC id, so a client's retry of the same id reuses it and the host's ledger runs the
//! tool once; the session also keeps its latest answers, so such a retry is answered at once. A
//! 2026-07-28 call has no session to scope its JSON-RPC id, so it gets a fresh request id
//! ([`Session::call_key`]; docs/CONTRACTS.md, "Request ids of MCP calls").

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ErrorData as McpError,
    GetTaskParams, GetTaskResult, Implementation, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    ServerCapabilities, ServerConfig, SubscriptionFilter, Tool, UpdateTaskParams,
};
// The 2026-07-28 revision deprecates logging; the door refuses its request there.
#[allow(deprecated)]
use rmcp::model::SetLevelRequestParams;
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{RoleServer, ServerHandler};
use toolhost_envelope::ToolDescription;
use tracing::debug;

use super::generation;
use super::subscriptions::Subscriptions;
use super::tasks::Tasks;
use crate::fleet_client::FleetClient;

/// How many answers a session keeps for retries of the same JSON-RPC id.
const REMEMBERED_ANSWERS: usize = 256;

/// What every session of a door shares.
pub(crate) struct Door {
    /// The fleet the tools come from.
    pub fleet: FleetClient,
    /// Globs of the tools exposed.
    pub tools: Vec<glob::Pattern>,
    /// Tools per `tools/list` page.
    pub page_size: usize,
    /// Calls of tools whose timeout is above this become tasks.
    pub task_threshold: Duration,
    /// The durable tasks.
    pub tasks: Tasks,
    /// Where the door is, for logs: `stdio` or `http`.
    pub transport: &'static str,
    /// The tenant policy, for `tools/list`.
    pub auth: crate::auth::AuthHandle,
    /// The tenant of calls no token names (`[mcp] tenant`).
    pub tenant: Option<String>,
    /// How long a 2026-07-28 client may cache a `tools/list` page: `[mcp] watch_ms`.
    pub list_ttl_ms: u64,
    /// The relay of `list_changed` to sessions and `subscriptions/listen` streams.
    pub subscriptions: Subscriptions,
    /// Where the door's spans go.
    pub telemetry: crate::telemetry::Telemetry,
    /// The codec of the 2026-07-28 `requestState` (`mrtr.rs`).
    pub request_states: super::mrtr::RequestStates,
}

impl Door {
    /// Whether the door exposes `name`.
    pub(super) fn exposes(&self, name: &str) -> bool {
        self.tools.iter().any(|pattern| pattern.matches(name))
    }

    /// The bearer token a request authenticated with, if any.
    pub(super) fn principal(context: &RequestContext<RoleServer>) -> Option<&super::http::Principal> {
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<super::http::Principal>())
    }

    /// The tenant of a request: its bearer token's, else the door's.
    pub(super) fn tenant(&self, context: &RequestContext<RoleServer>) -> Option<String> {
        Door::principal(context)
            .map(|principal| principal.tenant.clone())
            .filter(|tenant| !tenant.is_empty())
            .or_else(|| self.tenant.clone())
    }

    /// Whether `tenant`'s policy lets it call `name`, for listings.
    pub(super) fn permits(&self, tenant: Option<&str>, name: &str) -> bool {
        let auth = self.auth.load();
        !auth.has_policy() || auth.allows(tenant.unwrap_or_default(), name)
    }

    /// The exposed fleet tool `name`.
    pub(super) fn tool(&self, name: &str) -> Option<ToolDescription> {
        if !self.exposes(name) {
            return None;
        }
        self.fleet.tools().get(name).cloned()
    }
}

/// One session's handler.
#[derive(Clone)]
pub(crate) struct Session {
    pub(super) door: Arc<Door>,
    /// A random id of the session, part of its calls' request ids.
    id: String,
    /// The latest answers by JSON-RPC id, for retries.
    answers: Arc<Mutex<Remembered>>,
    /// The level `logging/setLevel` set (issue 33, `logging.rs`).
    pub(super) log_level: super::logging::SessionLevel,
}

/// How a call is known: the request id it is made with, and, in a session, the JSON-RPC id its
/// answer is remembered by for the client's retries.
pub(super) struct CallKey {
    /// The request id of the call on the requests stream.
    pub request_id: String,
    /// The JSON-RPC id, for an `initialize` session only.
    remembered_as: Option<String>,
}

/// Answers kept for retries, oldest first.
#[derive(Default)]
struct Remembered {
    order: VecDeque<String>,
    by_id: HashMap<String, CallToolResult>,
}

impl Session {
    /// A new session of `door`.
    pub(crate) fn new(door: Arc<Door>) -> Session {
        Session {
            door,
            id: uuid::Uuid::new_v4().simple().to_string(),
            answers: Arc::default(),
            log_level: super::logging::SessionLevel::default(),
        }
    }

    /// How the call of `context`'s request is known. In an `initialize` session, by the session
    /// and its JSON-RPC id, the same for a retry of that id; on 2026-07-28, which has no session
    /// to scope a JSON-RPC id (two clients, or one client's two requests on two connections, may
    /// use the same), by a fresh random id: a retry is a new call.
    pub(super) fn call_key(&self, context: &RequestContext<RoleServer>) -> CallKey {
        if generation::is_stateless(context) {
            return CallKey {
                request_id: format!("mcp-{}", uuid::Uuid::new_v4().simple()),
                remembered_as: None,
            };
        }
        let jsonrpc_id = context.id.to_string();
        CallKey { request_id: self.request_id(&jsonrpc_id), remembered_as: Some(jsonrpc_id) }
    }

    /// The answer already given to the call `key`, for a retry in the same session.
    pub(super) fn remembered(&self, key: &CallKey) -> Option<CallToolResult> {
        let jsonrpc_id = key.remembered_as.as_deref()?;
        self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).by_id.get(jsonrpc_id).cloned()
    }

    /// Keeps the answer of the call `key` for the session's retries (none on 2026-07-28).
    pub(super) fn remember(&self, key: &CallKey, result: &CallToolResult) {
        let Some(jsonrpc_id) = key.remembered_as.clone() else { return };
        let mut answers = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if answers.by_id.insert(jsonrpc_id.clone(), result.clone()).is_none() {
            answers.order.push_back(jsonrpc_id);
        }
        while answers.order.len() > REMEMBERED_ANSWERS {
            if let Some(oldest) = answers.order.pop_front() {
                answers.by_id.remove(&oldest);
            }
        }
    }

    /// The session's random id, which names it among a resource's watchers.
    pub(super) fn key(&self) -> &str {
        &self.id
    }

    /// The request id of the session's call with JSON-RPC id `jsonrpc_id`: the same for a retry.
    fn request_id(&self, jsonrpc_id: &str) -> String {
        let id: String = jsonrpc_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .take(64)
            .collect();
        format!("mcp-{}-{id}", self.id)
    }
}

impl ServerHandler for Session {
    // Logging is deprecated in 2026-07-28 (SEP-2577); the `initialize` generations are served it.
    #[allow(deprecated)]
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_logging()
            .enable_completions()
            .enable_prompts()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_tasks()
            .build();
        let mut info = ServerConfig::new(capabilities);
        info.server_info = Implementation::new("toolhost", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "The tools of every live toolhost toolbox on this Redis, called with toolhost's promises."
                .to_owned(),
        );
        // What `initialize` answers with at most; `server/discover` lists every version.
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        info
    }

    /// Every revision up to 2026-07-28: `initialize` negotiates among the older ones, and a
    /// request of a 2026-07-28 client names its version in `_meta` (rmcp checks it against this
    /// list, `-32022` for another). `server/discover` is rmcp's, from this list and
    /// [`Session::get_info`].
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2026_07_28))
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut result = self.list(request, &context)?;
        generation::cache_hints(&mut result, &context, self.door.list_ttl_ms);
        Ok(result)
    }

    /// The exposed tool `name`, for rmcp's check of `Mcp-Param-*` headers against its schema.
    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.door.tool(name).as_ref().and_then(super::tools::mcp_tool)
    }

    /// Refused on 2026-07-28, which removed it; the `initialize` generations set the level of
    /// the hosted servers' log messages the session is sent.
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if generation::is_stateless(&context) {
            return Err(generation::removed("logging/setLevel"));
        }
        self.set_log_level(request)
    }

    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(Subscriptions::accept(requested))
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        self.door.subscriptions.listen(context).await
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.call(request, context).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        self.door.tasks.get(&self.door.fleet, &request.task_id).await.map(GetTaskResult::new)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.door.tasks.update(&self.door.fleet, &request.task_id, request.input_responses).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.door.tasks.cancel(&self.door.fleet, &request.task_id).await
    }

    /// An `initialize` session hears of every change of the fleet's tools until it ends.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        debug!(transport = self.door.transport, session = %self.id, "MCP session initialized");
        self.door.subscriptions.follow_session(context.peer);
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, McpError> {
        self.list_fleet_resources().await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourceTemplatesResult, McpError> {
        self.list_fleet_resource_templates().await
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, McpError> {
        self.list_fleet_prompts().await
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, McpError> {
        self.read_fleet_resource(request, &context).await.map(Into::into)
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, McpError> {
        self.get_fleet_prompt(request, &context).await.map(Into::into)
    }

    async fn complete(
        &self,
        request: rmcp::model::CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CompleteResult, McpError> {
        self.complete_fleet(request, &context).await
    }

    // Legacy-only in rmcp (refused on 2026-07-28, which has `subscriptions/listen` instead).
    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.subscribe_fleet_resource(request.uri, context).await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.door.subscriptions.resources.unsubscribe_session(&request.uri, self.key()).await;
        Ok(())
    }
}
