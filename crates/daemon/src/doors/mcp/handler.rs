//! One MCP session: the rmcp server handler that lists the fleet's tools and calls them through
//! the fleet client.
//!
//! Every session (a stdio process has one, the HTTP door one per `Mcp-Session-Id`) has its own
//! [`Session`] over the shared [`Door`]. A call's request id is made from the session and the
//! JSON-RPC id, so a client's retry of the same id reuses it and the host's ledger runs the tool
//! once; the session also keeps its latest answers, so such a retry is answered at once.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, DiscoverRequestMethod,
    DiscoverResult, ErrorData as McpError, GetTaskParams, GetTaskResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{RoleServer, ServerHandler};
use toolhost_envelope::ToolDescription;
use tracing::debug;

use super::tasks::Tasks;
use crate::fleet_client::FleetClient;

/// How often a session's `list_changed` watch checks that the session is still open.
const SESSION_CHECK: Duration = Duration::from_secs(60);

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
        Door::principal(context).map(|principal| principal.tenant.clone()).or_else(|| self.tenant.clone())
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

    pub(super) fn remembered(&self, jsonrpc_id: &str) -> Option<CallToolResult> {
        self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).by_id.get(jsonrpc_id).cloned()
    }

    pub(super) fn remember(&self, jsonrpc_id: String, result: &CallToolResult) {
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

    /// The request id of the call with JSON-RPC id `jsonrpc_id`: the same for a retry.
    pub(super) fn request_id(&self, jsonrpc_id: &str) -> String {
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
            .enable_prompts()
            .enable_resources()
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
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        info
    }

    /// The `initialize` generations only: a client that opens with a newer discovery request is
    /// refused (`-32601`), so it falls back to `initialize`.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn discover(&self, _context: RequestContext<RoleServer>) -> Result<DiscoverResult, McpError> {
        Err(McpError::method_not_found::<DiscoverRequestMethod>())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.list(request, &context)
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

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.door.tasks.cancel(&self.door.fleet, &request.task_id).await
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let mut changes = self.door.fleet.changes();
        let peer = context.peer;
        debug!(transport = self.door.transport, session = %self.id, "MCP session initialized");
        // Tells the client of every change of the fleet's tools until the session ends; a
        // session that ends while the fleet stays the same is noticed within a minute.
        tokio::spawn(async move {
            changes.borrow_and_update();
            let mut check = tokio::time::interval(SESSION_CHECK);
            loop {
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() || peer.notify_tool_list_changed().await.is_err() {
                            return;
                        }
                    }
                    _ = check.tick() => {
                        if peer.is_transport_closed() {
                            return;
                        }
                    }
                }
            }
        });
    }

    // Issue 33: thin delegations to the door's other modules.

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.set_log_level(request)
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
}
