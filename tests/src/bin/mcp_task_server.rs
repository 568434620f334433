//! A small MCP server over stdio, on rmcp's server side, for the tests only: no published
//! server answers `tools/call` with a task of its own (SEP-2663) or asks in the 2026-07-28 form
//! (an `InputRequiredResult`), so `tests/tests/mcp_fidelity.rs` hosts this one behind toolhost.
//!
//! Tools answered with a task (only for a call that declared the tasks extension; any other
//! call is refused, so a passing test shows toolhost declared it):
//! - `task_echo {text}`: works for a while, then completes with `echo: <text>`, a
//!   `structuredContent` of `{"echo": <text>}` and a small image;
//! - `task_ask`: asks for a name inside the task (`input_required`, answered by `tasks/update`)
//!   and completes with `hello <name>`, or `no name: <action>` when declined;
//! - `task_fail`: fails with a JSON-RPC error;
//! - `task_endless`: works until `tasks/cancel`.
//!
//! `mrtr_ask` answers its first call with an `InputRequiredResult` (`requestState` `round-1`)
//! and the retry with `hello <name> (state <requestState>)`, or `declined: <action>`.
//!
//! Each task's life is written, one line at a time, to the file `TASK_SERVER_MARKS` names:
//! `created <tool> <task id>`, `updated <task id>`, `cancel <task id>` (the `tasks/cancel`
//! arrived) and `cancelled <task id>` (the task stopped for it).

use std::io::Write as _;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, CreateTaskResult,
    GetTaskParams, GetTaskResult, Implementation, InputRequest, InputRequiredResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskContext, TaskExit, TaskManager, TaskOptions};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Value, json};

/// The wait a task suggests between two polls.
const POLL_MS: u64 = 100;

struct TaskServer {
    tasks: TaskManager,
}

/// Notes a step of a task's life in `TASK_SERVER_MARKS`.
fn mark(line: &str) {
    let Ok(path) = std::env::var("TASK_SERVER_MARKS") else { return };
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(file, "{line}");
    }
}

fn result(value: Value) -> Result<CallToolResult, TaskExit> {
    serde_json::from_value(value)
        .map_err(|err| TaskExit::Error(ErrorData::internal_error(err.to_string(), None)))
}

fn text(text: &str) -> Result<CallToolResult, TaskExit> {
    result(json!({"content": [{"type": "text", "text": text}]}))
}

/// An `elicitation/create` asking for a name.
fn ask_name(message: &str) -> InputRequest {
    serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"]
            }
        }
    }))
    .expect("an elicitation request")
}

/// `hello <name>` for an accepted elicitation, else `None` and the action.
fn named(response: &Value) -> Result<String, String> {
    let action = response["action"].as_str().unwrap_or("none");
    match response["content"]["name"].as_str() {
        Some(name) if action == "accept" => Ok(format!("hello {name}")),
        _ => Err(action.to_owned()),
    }
}

async fn echo(context: TaskContext, arguments: Value) -> Result<CallToolResult, TaskExit> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    context.set_status_message("halfway");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let said = arguments["text"].as_str().unwrap_or_default().to_owned();
    result(json!({
        "content": [
            {"type": "text", "text": format!("echo: {said}")},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}
        ],
        "structuredContent": {"echo": said}
    }))
}

async fn ask(context: TaskContext) -> Result<CallToolResult, TaskExit> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    let response = context.request_input("name", ask_name("Your name, for the task?")).await?;
    mark(&format!("updated {}", context.task_id()));
    match named(&response) {
        Ok(hello) => text(&hello),
        Err(action) => text(&format!("no name: {action}")),
    }
}

async fn endless(context: TaskContext) -> Result<CallToolResult, TaskExit> {
    tokio::select! {
        () = context.cancelled() => {
            mark(&format!("cancelled {}", context.task_id()));
            Err(TaskExit::Cancelled)
        }
        () = tokio::time::sleep(Duration::from_secs(120)) => text("never cancelled"),
    }
}

impl TaskServer {
    fn spawn(&self, tool: &str, arguments: Value) -> CallToolResponse {
        let options = TaskOptions::new().with_poll_interval_ms(POLL_MS).with_status_message("started");
        let task = self.tasks.spawn(options, |context| match tool {
            "task_echo" => Box::pin(echo(context, arguments)),
            "task_ask" => Box::pin(ask(context)),
            "task_fail" => Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Err(TaskExit::Error(ErrorData::internal_error("the task broke on purpose", None)))
            }),
            _ => Box::pin(endless(context)),
        });
        mark(&format!("created {tool} {}", task.task_id));
        CallToolResponse::Task(CreateTaskResult::new(task))
    }

    fn mrtr(params: &CallToolRequestParams) -> Result<CallToolResponse, ErrorData> {
        let Some(responses) = &params.input_responses else {
            let round: InputRequiredResult = serde_json::from_value(json!({
                "resultType": "input_required",
                "inputRequests": {"name": ask_name("Your name, for the retry?")},
                "requestState": "round-1"
            }))
            .map_err(|err| ErrorData::internal_error(err.to_string(), None))?;
            return Ok(CallToolResponse::InputRequired(round));
        };
        let state = params.request_state.clone().unwrap_or_default();
        let said = match responses.get("name").map(named) {
            Some(Ok(hello)) => format!("{hello} (state {state})"),
            Some(Err(action)) => format!("declined: {action}"),
            None => "no answer under 'name'".to_owned(),
        };
        text(&said).map(CallToolResponse::Complete).map_err(|_| ErrorData::internal_error("text", None))
    }
}

impl ServerHandler for TaskServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
            .with_server_info(Implementation::new("toolhost-test-task-server", "1"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let object = json!({"type": "object"});
        let tools = json!({"tools": [
            {"name": "task_echo", "description": "Echoes its text from a task.",
             "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
            {"name": "task_ask", "description": "Asks for a name from a task.", "inputSchema": object},
            {"name": "task_fail", "description": "A task that fails.", "inputSchema": object},
            {"name": "task_endless", "description": "A task that runs until cancelled.", "inputSchema": object},
            {"name": "mrtr_ask", "description": "Asks for a name with an InputRequiredResult.", "inputSchema": object}
        ]});
        serde_json::from_value(tools).map_err(|err| ErrorData::internal_error(err.to_string(), None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = request.name.to_string();
        if tool == "mrtr_ask" {
            return TaskServer::mrtr(&request);
        }
        if !context.client_capabilities().is_some_and(|capabilities| capabilities.supports_tasks()) {
            return Err(ErrorData::invalid_request(
                format!("'{tool}' runs only as a task, and the call did not declare the tasks extension"),
                None,
            ));
        }
        let arguments = request.arguments.map_or(Value::Null, Value::Object);
        Ok(self.spawn(&tool, arguments))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.tasks.get_task(&request.task_id).map(GetTaskResult::new)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        mark(&format!("cancel {}", request.task_id));
        self.tasks.cancel_task(&request.task_id)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let server = TaskServer { tasks: TaskManager::new() };
    match server.serve(rmcp::transport::stdio()).await {
        Ok(running) => {
            let _ = running.waiting().await;
        }
        Err(error) => eprintln!("the task server did not start: {error}"),
    }
}
