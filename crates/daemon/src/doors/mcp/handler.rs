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
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    DiscoverRequestMethod, DiscoverResult, ErrorData as McpError, GetTaskParams, GetTaskResult,
    Implementation, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProtocolVersion,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use toolhost_envelope::{DiscoveryFormat, ErrorCode, ResultData, ToolDescription};
use tracing::{debug, info};

use super::tasks::Tasks;
use crate::fleet_client::{CallFailure, FleetClient, Request};

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
    fn exposes(&self, name: &str) -> bool {
        self.tools.iter().any(|pattern| pattern.matches(name))
    }

    /// The bearer token a request authenticated with, if any.
    fn principal(context: &RequestContext<RoleServer>) -> Option<&super::http::Principal> {
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<super::http::Principal>())
    }

    /// The tenant of a request: its bearer token's, else the door's.
    fn tenant(&self, context: &RequestContext<RoleServer>) -> Option<String> {
        Door::principal(context).map(|principal| principal.tenant.clone()).or_else(|| self.tenant.clone())
    }

    /// Whether `tenant`'s policy lets it call `name`, for listings.
    fn permits(&self, tenant: Option<&str>, name: &str) -> bool {
        let auth = self.auth.load();
        !auth.has_policy() || auth.allows(tenant.unwrap_or_default(), name)
    }

    /// The exposed fleet tool `name`.
    fn tool(&self, name: &str) -> Option<ToolDescription> {
        if !self.exposes(name) {
            return None;
        }
        self.fleet.tools().get(name).cloned()
    }
}

/// One session's handler.
#[derive(Clone)]
pub(crate) struct Session {
    door: Arc<Door>,
    /// A random id of the session, part of its calls' request ids.
    id: String,
    /// The latest answers by JSON-RPC id, for retries.
    answers: Arc<Mutex<Remembered>>,
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
        Session { door, id: uuid::Uuid::new_v4().simple().to_string(), answers: Arc::default() }
    }

    fn remembered(&self, jsonrpc_id: &str) -> Option<CallToolResult> {
        self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).by_id.get(jsonrpc_id).cloned()
    }

    fn remember(&self, jsonrpc_id: String, result: &CallToolResult) {
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
    fn request_id(&self, jsonrpc_id: &str) -> String {
        let id: String = jsonrpc_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .take(64)
            .collect();
        format!("mcp-{}-{id}", self.id)
    }

    /// Lists the exposed tools `tenant` may call from `offset`, one page.
    fn page(&self, offset: usize, tenant: Option<&str>) -> (Vec<Tool>, Option<String>) {
        let fleet = self.door.fleet.tools();
        let exposed: Vec<&ToolDescription> = fleet
            .iter()
            .filter(|tool| self.door.exposes(&tool.name) && self.door.permits(tenant, &tool.name))
            .collect();
        let end = (offset + self.door.page_size).min(exposed.len());
        let tools =
            exposed.get(offset..end).unwrap_or_default().iter().filter_map(|tool| mcp_tool(tool)).collect();
        let next = (end < exposed.len()).then(|| end.to_string());
        (tools, next)
    }

    /// Runs a call to its answer, relaying progress to the client and cancelling the call when
    /// the client cancels its request.
    async fn run_call(
        &self,
        request: Request,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let fleet = &self.door.fleet;
        let (progress, relay) = match context.meta.get_progress_token() {
            Some(token) => {
                let (sender, mut receiver) = mpsc::unbounded_channel::<crate::fleet_client::Progress>();
                let peer = context.peer.clone();
                let relay = tokio::spawn(async move {
                    while let Some(progress) = receiver.recv().await {
                        let mut param = ProgressNotificationParam::new(token.clone(), progress.progress);
                        if let Some(total) = progress.total {
                            param = param.with_total(total);
                        }
                        if let Some(message) = progress.message {
                            param = param.with_message(message);
                        }
                        if peer.notify_progress(param).await.is_err() {
                            return;
                        }
                    }
                });
                (Some(sender), Some(relay))
            }
            None => (None, None),
        };
        let answer = tokio::select! {
            answer = fleet.call(&request, progress) => answer,
            () = context.ct.cancelled() => {
                let state = fleet.cancel(&request.request_id).await;
                info!(request_id = %request.request_id, tool = %request.tool, ?state, "MCP client cancelled its call");
                if let Some(relay) = relay {
                    relay.abort();
                }
                return Err(McpError::internal_error("the call was cancelled by the client", None));
            }
        };
        if let Some(relay) = relay {
            relay.abort();
        }
        Ok(match answer {
            Ok(result) => call_result(&request.tool, &result),
            Err(failure) => failure_result(&request.tool, &failure),
        })
    }
}

impl ServerHandler for Session {
    fn get_info(&self) -> ServerConfig {
        let capabilities =
            ServerCapabilities::builder().enable_tools().enable_tool_list_changed().enable_tasks().build();
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
        let offset = match request.and_then(|request| request.cursor) {
            None => 0,
            Some(cursor) => cursor.parse::<usize>().map_err(|_| {
                McpError::invalid_params(format!("'{cursor}' is not a cursor this server gave"), None)
            })?,
        };
        let (tools, next) = self.page(offset, self.door.tenant(&context).as_deref());
        let mut result = ListToolsResult::with_all_items(tools);
        result.next_cursor = next;
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let Some(tool) = self.door.tool(&name) else {
            return Err(McpError::invalid_params(
                format!("unknown tool '{name}': no live toolbox hosts it (see tools/list)"),
                Some(json!({"tool": name})),
            ));
        };
        let jsonrpc_id = context.id.to_string();
        if let Some(answer) = self.remembered(&jsonrpc_id) {
            return Ok(answer.into());
        }
        let call = Request {
            tool: name,
            arguments: Value::Object(request.arguments.unwrap_or_default()),
            request_id: self.request_id(&jsonrpc_id),
            timeout: Duration::from_millis(tool.timeout_ms.max(1)),
            response_topic: None,
            tenant: self.door.tenant(&context),
            via: Door::principal(&context).map(|principal| format!("token:{}", principal.token_id)),
        };
        let wants_task = context.client_capabilities().is_some_and(|caps| caps.supports_tasks());
        if wants_task && (tool.long_running || call.timeout > self.door.task_threshold) {
            let task = self.door.tasks.create(&self.door.fleet, call).await?;
            return Ok(CallToolResponse::Task(task));
        }
        let result = self.run_call(call, &context).await?;
        self.remember(jsonrpc_id, &result);
        Ok(result.into())
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
}

/// The MCP form of a fleet tool; `outputSchema` only when it describes an object, as MCP wants.
pub(crate) fn mcp_tool(tool: &ToolDescription) -> Option<Tool> {
    let mut exported = tool.export(DiscoveryFormat::Mcp, "", "");
    let object_output = tool.output_schema.get("type").and_then(Value::as_str) == Some("object");
    if !object_output && let Some(fields) = exported.as_object_mut() {
        fields.remove("outputSchema");
    }
    serde_json::from_value(exported).ok()
}

/// The MCP result of a host's answer: `structuredContent` for an object, and a text block with
/// the same JSON; an error as `isError` with a text a model can act on.
pub(crate) fn call_result(tool: &str, result: &ResultData) -> CallToolResult {
    if result.success {
        return match result.result.clone().unwrap_or(Value::Null) {
            value @ Value::Object(_) => CallToolResult::structured(value),
            Value::String(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            value => CallToolResult::success(vec![ContentBlock::text(value.to_string())]),
        };
    }
    CallToolResult::error(vec![ContentBlock::text(error_text(tool, result))])
}

/// The text of a failed answer: the code and sentence, then what the details let a model fix.
fn error_text(tool: &str, result: &ResultData) -> String {
    let code = result.error_code.map_or("internal", ErrorCode::as_str);
    let sentence = result.error.as_deref().unwrap_or("the call failed");
    let mut text = format!("{code}: {sentence}");
    let details = result.details.as_ref();
    if let Some(errors) = details.and_then(|details| details.get("errors")).and_then(Value::as_array) {
        text.push_str(&format!("\nThe arguments of '{tool}' break its schema:"));
        for error in errors {
            let pointer =
                error.get("pointer").and_then(Value::as_str).filter(|p| !p.is_empty()).unwrap_or("/");
            let rule = error.get("rule").and_then(Value::as_str).unwrap_or("?");
            let message = error.get("message").and_then(Value::as_str).unwrap_or_default();
            text.push_str(&format!("\n- at {pointer} (rule {rule}): {message}"));
        }
    }
    if let Some(retry) = details.and_then(|details| details.get("retry_after_ms")).and_then(Value::as_u64) {
        text.push_str(&format!("\nretry_after_ms: {retry}"));
    }
    text
}

/// The MCP result when no answer came.
pub(crate) fn failure_result(tool: &str, failure: &CallFailure) -> CallToolResult {
    let text = match failure {
        CallFailure::NoAnswer(waited) => format!(
            "timeout: no toolbox answered the call of '{tool}' within {} ms; is a toolbox hosting it running?",
            waited.as_millis()
        ),
        other => format!("internal: {other}"),
    };
    CallToolResult::error(vec![ContentBlock::text(text)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(data: Value) -> ResultData {
        serde_json::from_value(data).unwrap()
    }

    #[test]
    fn objects_are_structured_content_with_the_same_json_as_text() {
        let result =
            call_result("echo", &answer(json!({"request_id": "r", "success": true, "result": {"a": 1}})));
        assert_eq!(result.structured_content, Some(json!({"a": 1})));
        assert_eq!(result.is_error, Some(false));
        let text = serde_json::to_value(&result.content[0]).unwrap();
        assert_eq!(text["text"], "{\"a\":1}");
        let result =
            call_result("t", &answer(json!({"request_id": "r", "success": true, "result": "plain"})));
        assert_eq!(serde_json::to_value(&result.content[0]).unwrap()["text"], "plain");
        assert_eq!(result.structured_content, None);
    }

    #[test]
    fn invalid_arguments_name_every_pointer_and_rule_and_overloaded_its_retry() {
        let result = call_result(
            "echo",
            &answer(
                json!({"request_id": "r", "success": false, "error": "bad arguments", "error_code": "invalid_arguments",
                "details": {"errors": [{"pointer": "/message", "rule": "type", "expected": "string", "message": "5 is not of type \"string\""}]}}),
            ),
        );
        assert_eq!(result.is_error, Some(true));
        let text = serde_json::to_value(&result.content[0]).unwrap()["text"].as_str().unwrap().to_owned();
        assert!(text.starts_with("invalid_arguments: bad arguments"), "{text}");
        assert!(text.contains("at /message (rule type)"), "{text}");
        let result = call_result(
            "slow",
            &answer(json!({"request_id": "r", "success": false, "error": "full", "error_code": "overloaded",
                "details": {"retry_after_ms": 250}})),
        );
        let text = serde_json::to_value(&result.content[0]).unwrap()["text"].as_str().unwrap().to_owned();
        assert!(text.contains("overloaded: full") && text.contains("retry_after_ms: 250"), "{text}");
    }

    #[test]
    fn output_schemas_that_are_not_objects_are_left_out() {
        let mut tool: ToolDescription = serde_json::from_value(json!({
            "name": "t", "description": "d", "argument_schema": {"type": "object"},
            "output_schema": {"type": ["object", "string"]}, "consumed_event": "t.requested",
            "produced_event": "t.completed", "annotations": {"read_only": true}, "timeout_ms": 1000
        }))
        .unwrap();
        let exported = mcp_tool(&tool).unwrap();
        assert!(exported.output_schema.is_none());
        assert_eq!(exported.annotations.and_then(|a| a.read_only_hint), Some(true));
        tool.output_schema = json!({"type": "object"});
        assert!(mcp_tool(&tool).unwrap().output_schema.is_some());
    }
}
