//! A hosted server's own task (the MCP Tasks extension, SEP-2663, `io.modelcontextprotocol/tasks`):
//! a `tools/call` answered with a `CreateTaskResult` is followed to its end.
//!
//! - toolhost declares the extension in a call's `_meta` client capabilities only to a server
//!   that offers it ([`offered`], [`declare`]); only such a call may be answered with a task.
//! - [`follow`] polls `tasks/get`, waiting the server's `pollIntervalMs` between polls (kept
//!   within [`MIN_POLL`] and [`MAX_POLL`]; [`DEFAULT_POLL`] when it gives none).
//! - An `input_required` task's questions are asked of the call's caller through its
//!   [`Input`], as an `InputRequiredResult`'s are (`crate::mrtr`), and answered with
//!   `tasks/update`; each key is asked once.
//! - `completed` gives the task's result, which the source maps like any `tools/call` result;
//!   `failed` maps the task's JSON-RPC error like a failed `tools/call`; `cancelled` (by the
//!   server) fails the call.
//! - A call that stops following before the end (its caller cancelled, its deadline passed,
//!   shutdown: the future is dropped) sends `tasks/cancel` for the task ([`CancelOnDrop`]).
//!
//! The 2025-11-25 task form (SEP-1686: `tasks` in the `initialize` capabilities, a `task`
//! field in `tools/call`) is not offered: toolhost never asks for it, so such a server answers
//! its tools plainly.

use std::collections::BTreeSet;
use std::time::Duration;

use rmcp::model::{
    CallToolResult, CancelTaskParams, CancelTaskRequest, ClientCapabilities, ClientRequest, CreateTaskResult,
    GetTaskParams, GetTaskRequest, RequestMetaObject, ServerResult, TaskPayload, UpdateTaskParams,
    UpdateTaskRequest,
};
use rmcp::service::PeerRequestOptions;
use rmcp::{ErrorData, Peer, RoleClient, ServiceError};
use serde_json::Value;
use toolhost_tools::{Input, ToolError};

use crate::{mapping, mrtr};

/// The shortest wait between two polls, whatever the server suggests.
pub(crate) const MIN_POLL: Duration = Duration::from_millis(50);
/// The longest wait between two polls, whatever the server suggests.
pub(crate) const MAX_POLL: Duration = Duration::from_secs(5);
/// The wait between two polls of a server that suggests none.
pub(crate) const DEFAULT_POLL: Duration = Duration::from_secs(1);
/// How long the `tasks/cancel` of an abandoned task may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the server `peer` talks to offers the tasks extension.
pub(crate) fn offered(peer: &Peer<RoleClient>) -> bool {
    peer.peer_info().is_some_and(|info| info.capabilities.supports_tasks())
}

/// The `_meta` of a call that may be answered with a task: toolhost's client capabilities with
/// the tasks extension added (rmcp puts them in every request of a 2026-07-28 session; these,
/// extended after, win).
pub(crate) fn declare(capabilities: ClientCapabilities) -> RequestMetaObject {
    let mut capabilities = capabilities;
    capabilities
        .extensions
        .get_or_insert_default()
        .insert(rmcp::model::TASKS_EXTENSION_ID.to_owned(), serde_json::Map::new());
    let mut meta = RequestMetaObject::new();
    meta.set_client_capabilities(capabilities);
    meta
}

/// Sends `request` with `meta` (the declaration of [`declare`]: the server checks it on every
/// `tasks/*` request, and rmcp's own `get_task` and the like send only the session's).
async fn send(
    peer: &Peer<RoleClient>,
    request: ClientRequest,
    meta: &RequestMetaObject,
) -> Result<ServerResult, ServiceError> {
    let mut options = PeerRequestOptions::no_options();
    options.meta = Some(meta.clone());
    peer.send_request_with_option(request, options).await?.await_response().await
}

/// The wait before the next poll, from the server's suggestion.
pub(crate) fn poll_interval(suggested_ms: Option<u64>) -> Duration {
    suggested_ms.map_or(DEFAULT_POLL, |ms| Duration::from_millis(ms).clamp(MIN_POLL, MAX_POLL))
}

/// Sends `tasks/cancel` for a task nobody follows any more, unless disarmed.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    meta: RequestMetaObject,
    task_id: Option<String>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(task_id) = self.task_id.take() else { return };
        let peer = self.peer.clone();
        let meta = self.meta.clone();
        // Best effort, as `notifications/cancelled` is: the call has already ended.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let request = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(
                    CancelTaskParams::new(task_id.clone()),
                ));
                match tokio::time::timeout(CANCEL_TIMEOUT, send(&peer, request, &meta)).await {
                    Ok(Ok(_)) => tracing::debug!(task_id, "MCP task cancelled"),
                    Ok(Err(error)) => tracing::debug!(task_id, %error, "tasks/cancel failed"),
                    Err(_) => tracing::debug!(task_id, "tasks/cancel did not answer in time"),
                }
            });
        }
    }
}

/// Follows the task `created` of tool `tool` (of source `source`) to its end: its final
/// `tools/call` result. `meta` is the call's declaration of the extension ([`declare`]).
///
/// # Errors
/// The failure of a task that failed or was cancelled by the server, a question nobody could
/// answer (`crate::mrtr`), a `tasks/get` or `tasks/update` that failed, and a result toolhost
/// cannot read. The second element tells whether the connection broke.
pub(crate) async fn follow(
    (tool, source): (&str, &str),
    peer: &Peer<RoleClient>,
    (created, meta): (CreateTaskResult, &RequestMetaObject),
    input: &Input,
) -> Result<CallToolResult, (ToolError, bool)> {
    let task_id = created.task.task_id.clone();
    let mut guard = CancelOnDrop { peer: peer.clone(), meta: meta.clone(), task_id: Some(task_id.clone()) };
    let failed = |error| mapping::service_error(tool, source, error);
    let mut wait = poll_interval(created.task.poll_interval_ms);
    let mut answered = BTreeSet::new();
    let mut ask_first = false;
    loop {
        if !ask_first {
            tokio::time::sleep(wait).await;
        }
        ask_first = false;
        let request = ClientRequest::GetTaskRequest(GetTaskRequest::new(GetTaskParams::new(task_id.clone())));
        let detailed = match send(peer, request, meta).await.map_err(failed)? {
            ServerResult::GetTaskResult(polled) => polled.task,
            _ => return Err(failed(ServiceError::UnexpectedResponse)),
        };
        wait = poll_interval(detailed.task.poll_interval_ms);
        match detailed.payload {
            TaskPayload::Working => {}
            TaskPayload::InputRequired { input_requests } => {
                let fresh: Vec<_> =
                    input_requests.iter().filter(|(key, _)| !answered.contains(*key)).collect();
                if fresh.is_empty() {
                    continue;
                }
                let responses = mrtr::answer_requests(tool, input, fresh.into_iter())
                    .await
                    .map_err(|error| (error, false))?;
                answered.extend(responses.keys().cloned());
                let update = UpdateTaskParams::new(task_id.clone(), responses);
                let request = ClientRequest::UpdateTaskRequest(UpdateTaskRequest::new(update));
                send(peer, request, meta).await.map_err(failed)?;
                // The server may take the answers at once: look again without waiting.
                ask_first = true;
            }
            TaskPayload::Completed { result } => {
                guard.task_id = None;
                return serde_json::from_value(Value::Object(result)).map_err(|err| {
                    (
                        ToolError::Failed(format!(
                            "MCP tool '{tool}' finished its task {task_id} with a result toolhost cannot read: {err}"
                        )),
                        false,
                    )
                });
            }
            TaskPayload::Failed { error } => {
                guard.task_id = None;
                return Err(match serde_json::from_value::<ErrorData>(Value::Object(error.clone())) {
                    Ok(error) => mapping::service_error(tool, source, ServiceError::McpError(error)),
                    Err(_) => (
                        ToolError::Failed(format!(
                            "MCP tool '{tool}' failed in its task {task_id}: {}",
                            Value::Object(error)
                        )),
                        false,
                    ),
                });
            }
            TaskPayload::Cancelled => {
                guard.task_id = None;
                let why =
                    detailed.task.status_message.map(|message| format!(": {message}")).unwrap_or_default();
                return Err((
                    ToolError::Failed(format!(
                        "MCP server '{source}' cancelled the task {task_id} of tool '{tool}'{why}"
                    )),
                    false,
                ));
            }
            _ => {
                return Err((
                    ToolError::Failed(format!(
                        "MCP tool '{tool}' reported its task {task_id} in a state toolhost does not know"
                    )),
                    false,
                ));
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_interval_follows_the_server_within_bounds() {
        assert_eq!(poll_interval(None), DEFAULT_POLL);
        assert_eq!(poll_interval(Some(200)), Duration::from_millis(200));
        assert_eq!(poll_interval(Some(0)), MIN_POLL);
        assert_eq!(poll_interval(Some(600_000)), MAX_POLL);
    }

    #[test]
    fn a_call_declares_the_tasks_extension_beside_toolhosts_own_capabilities() {
        let meta = declare(crate::input::capabilities());
        let capabilities = meta.client_capabilities().unwrap();
        assert!(capabilities.supports_tasks());
        assert!(capabilities.elicitation.is_some());
        let wire = serde_json::to_value(&meta).unwrap();
        assert!(
            wire["io.modelcontextprotocol/clientCapabilities"]["extensions"][rmcp::model::TASKS_EXTENSION_ID]
                .is_object(),
            "{wire}"
        );
    }
}
