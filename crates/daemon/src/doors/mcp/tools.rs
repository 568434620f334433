//! The tools half of an MCP session: `tools/list` pages, `tools/call` run through the fleet
//! client (or made a task), and the MCP form of tools and answers.

use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData as McpError,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProgressToken, RequestId, Tool,
};
use rmcp::service::{Peer, RequestContext};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use toolhost_envelope::{DiscoveryFormat, ErrorCode, ResultData, ToolDescription};
use tracing::info;

use super::handler::{Door, Session};
use super::logging::{self, SessionLevel};
use super::mrtr::{self, Asks, Outcome, Question};
use super::{elicit, generation};
use crate::fleet_client::{CallEvent, CallFailure, FleetClient, Request};
use crate::telemetry::DoorSpan;

impl Session {
    /// `tools/list`: one page of the exposed tools the request's tenant may call.
    pub(super) fn list(
        &self,
        request: Option<PaginatedRequestParams>,
        context: &RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let offset = match request.and_then(|request| request.cursor) {
            None => 0,
            Some(cursor) => cursor.parse::<usize>().map_err(|_| {
                McpError::invalid_params(format!("'{cursor}' is not a cursor this server gave"), None)
            })?,
        };
        let (tools, next) = self.page(offset, self.door.tenant(context).as_deref());
        let mut result = ListToolsResult::with_all_items(tools);
        result.next_cursor = next;
        Ok(result)
    }

    /// `tools/call`: a task for a long call when the client takes tasks, else the answer.
    pub(super) async fn call(
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
        // A 2026-07-28 retry answering the call's question: the call already runs.
        if request.request_state.is_some() || request.input_responses.is_some() {
            let started = std::time::Instant::now();
            let response = self.resume(request, &context).await;
            let error = match &response {
                Err(error) => Some(error.code.0.to_string()),
                Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => {
                    Some("tool_error".to_owned())
                }
                Ok(_) => None,
            };
            self.door.telemetry.mcp_operation(&name, error.as_deref(), started.elapsed());
            return response;
        }
        let key = self.call_key(&context);
        if let Some(answer) = self.remembered(&key) {
            return Ok(answer.into());
        }
        let caller = super::trace::caller(request.meta.as_ref(), &context);
        let door = &self.door;
        let span = super::trace::server_span(
            &door.telemetry,
            caller.as_ref(),
            &name,
            &context.id.to_string(),
            door.transport,
            &context,
        );
        let trace = span.as_ref().map(DoorSpan::passed_on).or(caller);
        let call = Request {
            tool: name,
            arguments: Value::Object(request.arguments.unwrap_or_default()),
            request_id: key.request_id.clone(),
            timeout: Duration::from_millis(tool.timeout_ms.max(1)),
            response_topic: None,
            tenant: self.door.tenant(&context),
            via: Door::principal(&context).map(|principal| format!("token:{}", principal.token_id)),
            trace,
        };
        let wants_task = context.client_capabilities().is_some_and(|caps| caps.supports_tasks());
        if wants_task && (tool.long_running || call.timeout > self.door.task_threshold) {
            let task = self.door.tasks.create(&self.door.fleet, call).await?;
            return Ok(CallToolResponse::Task(task));
        }
        let started = std::time::Instant::now();
        let tool_name = call.tool.clone();
        let (request_id, tenant) = (call.request_id.clone(), call.tenant.clone());
        let deadline = crate::clock::now_since_epoch() + call.timeout + crate::fleet_client::ANSWER_MARGIN;
        let result = match self.run_call(call, &context).await {
            Ok(Outcome::Answer(result)) => Ok(result),
            Ok(Outcome::Asked(question)) => {
                door.telemetry.mcp_operation(&tool_name, None, started.elapsed());
                let deadline_ms = deadline.as_millis() as u64;
                let call = (request_id.as_str(), self.door.fleet.answer_topic(), deadline_ms);
                let asked = self.input_required((&tool_name, tenant.as_deref()), question, call);
                return asked.await.map(CallToolResponse::InputRequired);
            }
            Err(error) => Err(error),
        };
        let error = match &result {
            Err(error) => Some((error.code.0.to_string(), error.message.to_string())),
            Ok(result) if result.is_error == Some(true) => {
                Some(("tool_error".to_owned(), "the tool answered an error".to_owned()))
            }
            Ok(_) => None,
        };
        if let (Some(span), Some((error_type, message))) = (&span, &error) {
            span.fail(error_type, message);
        }
        let error_type = error.as_ref().map(|(error_type, _)| error_type.as_str());
        door.telemetry.mcp_operation(&tool_name, error_type, started.elapsed());
        let result = result?;
        self.remember(&key, &result);
        Ok(result.into())
    }

    /// Lists the exposed tools `tenant` may call from `offset`, one page.
    pub(super) fn page(&self, offset: usize, tenant: Option<&str>) -> (Vec<Tool>, Option<String>) {
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

    /// Runs a call to its answer, relaying its progress (when the client asked for it) and its
    /// questions to the client, and cancelling the call when the client cancels its request.
    /// Every event read before the answer reaches the client before the answer does. For a
    /// 2026-07-28 client, a question ends the wait: the call goes on, and the client is given
    /// the question to answer in a retry (`mrtr.rs`).
    pub(super) async fn run_call(
        &self,
        request: Request,
        context: &RequestContext<RoleServer>,
    ) -> Result<Outcome, McpError> {
        let fleet = &self.door.fleet;
        let (events, receiver) = mpsc::unbounded_channel::<CallEvent>();
        let (asks, mut asked) = mpsc::unbounded_channel::<Question>();
        let relay = tokio::spawn(relay(
            receiver,
            context.peer.clone(),
            context.meta.get_progress_token(),
            self.log_level.clone(),
            fleet.clone(),
            (request.request_id.clone(), context.id.clone()),
            generation::is_stateless(context).then(|| Asks::of(context, asks)),
        ));
        let answer = tokio::select! {
            answer = fleet.call_with_events(&request, events) => answer,
            Some(question) = asked.recv() => {
                relay.abort();
                return Ok(Outcome::Asked(question));
            }
            () = context.ct.cancelled() => {
                let state = fleet.cancel(&request.request_id).await;
                info!(request_id = %request.request_id, tool = %request.tool, ?state, "MCP client cancelled its call");
                relay.abort();
                return Err(McpError::internal_error("the call was cancelled by the client", None));
            }
        };
        // The call's sender is dropped with its waiter, so the relay ends once it has sent what
        // it holds; a client that stops reading does not hold the answer back past the bound.
        let mut relay = relay;
        if tokio::time::timeout(RELAY_DRAIN, &mut relay).await.is_err() {
            relay.abort();
        }
        Ok(Outcome::Answer(match answer {
            Ok(result) => call_result(&request.tool, &result),
            Err(failure) => failure_result(&request.tool, &failure),
        }))
    }
}

/// How long a call's answer waits for its relay to pass on the events before it.
const RELAY_DRAIN: Duration = Duration::from_secs(5);

/// Passes a call's events on to the MCP client until the call ends: progress as
/// `notifications/progress` under the request's token, log entries as `notifications/message`
/// at or above the session's level; a question is asked of the client ([`elicit::ask`], on a
/// task of its own, so that progress and the answer are not held up behind the client's user),
/// or, for a 2026-07-28 client (`asks`), handed back to be returned as an `InputRequiredResult`,
/// which ends the relay.
// `notifications/message` is deprecated in 2026-07-28 (SEP-2577); the `initialize` generations
// have it.
#[allow(deprecated)]
async fn relay(
    mut events: mpsc::UnboundedReceiver<CallEvent>,
    peer: Peer<RoleServer>,
    progress_token: Option<ProgressToken>,
    log_level: SessionLevel,
    fleet: FleetClient,
    (request_id, originating): (String, RequestId),
    asks: Option<Asks>,
) {
    while let Some(event) = events.recv().await {
        match event {
            CallEvent::Progress(progress) => {
                let Some(token) = &progress_token else { continue };
                if peer.notify_progress(progress_param(token, progress)).await.is_err() {
                    return;
                }
            }
            CallEvent::Log(message) => {
                let Some(param) = logging::notification(&log_level, message) else { continue };
                if peer.notify_logging_message(param).await.is_err() {
                    return;
                }
            }
            CallEvent::InputRequired { input_id, kind, request, at } => {
                if let Some(asks) = &asks {
                    match Question::of(&input_id, &request, &at) {
                        Some(question) if asks.allows(kind) => {
                            let _ = asks.sender.send(question);
                            return;
                        }
                        _ => {
                            mrtr::decline(&fleet, &request_id, &input_id, kind);
                            continue;
                        }
                    }
                }
                let (peer, fleet, request_id, originating) =
                    (peer.clone(), fleet.clone(), request_id.clone(), originating.clone());
                tokio::spawn(async move {
                    let call = (&fleet, request_id.as_str());
                    elicit::ask(&peer, &originating, call, (&input_id, kind, &request)).await;
                });
            }
        }
    }
}

/// A call's progress entry as the MCP notification for the client that gave `token`.
pub(crate) fn progress_param(
    token: &ProgressToken,
    progress: crate::fleet_client::Progress,
) -> ProgressNotificationParam {
    let mut param = ProgressNotificationParam::new(token.clone(), progress.progress);
    if let Some(total) = progress.total {
        param = param.with_total(total);
    }
    if let Some(message) = progress.message {
        param = param.with_message(message);
    }
    param
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

/// The MCP result of a host's answer: the tool's own content blocks when the answer has them
/// (else a text block of its result), and `structuredContent` for an object result; an error as
/// `isError` with a text a model can act on.
pub(crate) fn call_result(tool: &str, result: &ResultData) -> CallToolResult {
    if result.success {
        let value = result.result.clone().unwrap_or(Value::Null);
        let blocks = result.content.as_ref().map(|blocks| {
            blocks
                .iter()
                .map(|block| serde_json::from_value::<ContentBlock>(block.clone()))
                .collect::<Result<Vec<_>, _>>()
        });
        return match (blocks, value) {
            (Some(Ok(blocks)), value) => {
                let mut res = CallToolResult::success(blocks);
                if value.is_object() {
                    res.structured_content = Some(value);
                }
                res
            }
            // The host checked the blocks; one it let through that rmcp cannot read is an error
            // of ours, said so rather than dropped.
            (Some(Err(err)), _) => CallToolResult::error(vec![ContentBlock::text(format!(
                "internal: the answer of '{tool}' holds a content block the door cannot read: {err}"
            ))]),
            (None, value @ Value::Object(_)) => CallToolResult::structured(value),
            (None, Value::String(text)) => CallToolResult::success(vec![ContentBlock::text(text)]),
            (None, value) => CallToolResult::success(vec![ContentBlock::text(value.to_string())]),
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
    fn content_blocks_reach_the_client_as_the_server_wrote_them_beside_structured_content() {
        let blocks = json!([
            {"type": "text", "text": "a red dot"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png", "annotations": {"audience": ["user"]}},
            {"type": "resource", "resource": {"uri": "test://r", "text": "body", "mimeType": "text/plain"}, "_meta": {"k": 1}}
        ]);
        let result = call_result(
            "shot",
            &answer(json!({"request_id": "r", "success": true, "result": "a red dot", "content": blocks})),
        );
        assert_eq!(serde_json::to_value(&result.content).unwrap(), blocks);
        assert_eq!(result.structured_content, None);
        let result = call_result(
            "shot",
            &answer(json!({"request_id": "r", "success": true, "result": {"w": 1}, "content": [blocks[1]]})),
        );
        assert_eq!(result.structured_content, Some(json!({"w": 1})));
        assert_eq!(serde_json::to_value(&result.content).unwrap()[0]["type"], "image");
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
