//! Durable MCP tasks (the `io.modelcontextprotocol/tasks` extension), kept in Redis.
//!
//! A task is one call with a request id like any other. Its id is a random UUID (122 random
//! bits, so not guessable), and Redis holds, for the answered-mark retention:
//!
//! - the task record `toolhost:mcp:task:<task_id>`: the request id, the tool, the answer
//!   stream, the creation time and the deadline;
//! - the task's own answer stream `results:mcp-task:<task_id>`, named as the call's
//!   `response_topic`: the host writes the call's progress entries and its answer there.
//!
//! `tasks/get` reads the record and the newest entry of that stream, so it works after the door
//! restarts and from any replica of the door; `tasks/cancel` sends `tool.cancel` for the
//! request id. Nothing about a task lives in the door's memory.

use std::time::Duration;

use rmcp::model::{
    CallToolResult, CreateTaskResult, DetailedTask, ErrorData as McpError, JsonObject, Task, TaskPayload,
    TaskStatus,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolhost_bus::Keys;
use toolhost_envelope::{ErrorCode, EventEnvelope, ResultData, new_message_id, now_rfc3339};

use super::tools::call_result;
use crate::fleet_client::{ANSWER_MARGIN, FleetClient, Progress, Request};

/// How often a client should poll `tasks/get`.
const POLL_INTERVAL_MS: u64 = 1_000;

/// The durable tasks of a door.
pub(crate) struct Tasks {
    /// How long a task and its answer are kept: the answered-mark retention.
    pub retention: Duration,
}

/// What Redis keeps of a task.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    request_id: String,
    tool: String,
    /// Bare name of the task's answer stream.
    topic: String,
    created_at: String,
    /// When the call's timeout plus the margin has passed, in ms since the UNIX epoch.
    deadline_ms: u64,
}

impl Tasks {
    fn ttl_ms(&self) -> u64 {
        self.retention.as_millis() as u64
    }

    /// Makes `call` a task: writes its record and answer stream, then publishes the request.
    ///
    /// # Errors
    /// Redis failed (`-32603`).
    pub(crate) async fn create(
        &self,
        fleet: &FleetClient,
        mut call: Request,
    ) -> Result<CreateTaskResult, McpError> {
        let task_id = uuid::Uuid::new_v4().to_string();
        let topic = Keys::mcp_task_results(&task_id);
        let created_at = now_rfc3339();
        let deadline = crate::clock::now_since_epoch() + call.timeout + ANSWER_MARGIN;
        let record = Record {
            request_id: call.request_id.clone(),
            tool: call.tool.clone(),
            topic: topic.clone(),
            created_at: created_at.clone(),
            deadline_ms: deadline.as_millis() as u64,
        };
        let bus = fleet.bus();
        let keys = fleet.keys();
        let redis = |err: toolhost_bus::Error| {
            McpError::internal_error(format!("cannot keep the task in Redis: {err}"), None)
        };
        // The stream exists before the host writes to it, so the TTL set now holds.
        let opened = json!({"id": new_message_id(), "type": "toolhost.task.created", "data": {"request_id": call.request_id}});
        let stream = keys.topic(&topic);
        bus.publish(&stream, &new_message_id(), &opened.to_string()).await.map_err(redis)?;
        bus.expire(&stream, self.retention).await.map_err(redis)?;
        // Serialising a struct of strings and numbers cannot fail.
        let text = serde_json::to_string(&record).unwrap_or_default();
        bus.set_expiring(&keys.mcp_task(&task_id), &text, self.retention).await.map_err(redis)?;
        call.response_topic = Some(topic);
        fleet.submit(&call).await.map_err(|err| McpError::internal_error(err.to_string(), None))?;
        let task = Task::new(task_id, TaskStatus::Working, created_at.clone(), created_at)
            .with_ttl_ms(self.ttl_ms())
            .with_poll_interval_ms(POLL_INTERVAL_MS);
        Ok(CreateTaskResult::new(task))
    }

    async fn record(&self, fleet: &FleetClient, task_id: &str) -> Result<Record, McpError> {
        let key = fleet.keys().mcp_task(task_id);
        let values = fleet
            .bus()
            .values(std::slice::from_ref(&key))
            .await
            .map_err(|err| McpError::internal_error(format!("cannot read the task: {err}"), None))?;
        values.into_iter().flatten().next().and_then(|text| serde_json::from_str(&text).ok()).ok_or_else(
            || McpError::invalid_params(format!("unknown task '{task_id}' (or its retention passed)"), None),
        )
    }

    /// The task's state, from Redis.
    ///
    /// # Errors
    /// An unknown or expired task (`-32602`), or Redis failed (`-32603`).
    pub(crate) async fn get(&self, fleet: &FleetClient, task_id: &str) -> Result<DetailedTask, McpError> {
        let record = self.record(fleet, task_id).await?;
        let last = fleet
            .last_entry(&record.topic)
            .await
            .map_err(|err| McpError::internal_error(format!("cannot read the task's answer: {err}"), None))?;
        let envelope = last
            .and_then(|entry| entry.payload)
            .and_then(|payload| serde_json::from_str::<EventEnvelope>(&payload).ok());
        let updated = envelope
            .as_ref()
            .and_then(|envelope| envelope.time.clone())
            .unwrap_or_else(|| record.created_at.clone());
        let task = Task::new(task_id, TaskStatus::Working, record.created_at.clone(), updated)
            .with_ttl_ms(self.ttl_ms())
            .with_poll_interval_ms(POLL_INTERVAL_MS);
        let answer = envelope.as_ref().and_then(|envelope| {
            (envelope.data.get("success").is_some())
                .then(|| serde_json::from_value::<ResultData>(envelope.data.clone()).ok())?
        });
        if let Some(answer) = answer {
            return Ok(finished(task, &record.tool, &answer));
        }
        let progress = envelope
            .filter(|envelope| envelope.event_type.ends_with(".progress"))
            .and_then(|envelope| Progress::from_data(&envelope.data));
        let now = crate::clock::now_since_epoch().as_millis() as u64;
        if now > record.deadline_ms {
            let error = json!({"code": -32603, "message": format!("no toolbox answered the call of '{}' in time", record.tool)});
            return Ok(DetailedTask::new(task, TaskPayload::Failed { error: object(error) }));
        }
        let task = match progress {
            Some(progress) => task.with_status_message(describe(&progress)),
            None => task,
        };
        Ok(DetailedTask::new(task, TaskPayload::Working))
    }

    /// Cancels the task's call (`tool.cancel`); its state follows in `tasks/get`.
    ///
    /// # Errors
    /// An unknown or expired task, or the cancel could not be sent.
    pub(crate) async fn cancel(&self, fleet: &FleetClient, task_id: &str) -> Result<(), McpError> {
        let record = self.record(fleet, task_id).await?;
        fleet
            .cancel(&record.request_id)
            .await
            .map_err(|err| McpError::internal_error(err.to_string(), None))?;
        Ok(())
    }
}

/// A finished task: `cancelled` for a cancelled call, else `completed` with the tool result
/// (`isError` for every other failure, as MCP wants for tool errors).
fn finished(task: Task, tool: &str, answer: &ResultData) -> DetailedTask {
    if answer.error_code == Some(ErrorCode::Cancelled) {
        return DetailedTask::new(
            task.with_status_message(answer.error.clone().unwrap_or_default()),
            TaskPayload::Cancelled,
        );
    }
    let result: CallToolResult = call_result(tool, answer);
    let result = serde_json::to_value(result).unwrap_or_else(|_| json!({}));
    DetailedTask::new(task, TaskPayload::Completed { result: object(result) })
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// The status message of a progress report.
fn describe(progress: &Progress) -> String {
    let amount = match progress.total {
        Some(total) => format!("{}/{}", progress.progress, total),
        None => progress.progress.to_string(),
    };
    match &progress.message {
        Some(message) => format!("{amount}: {message}"),
        None => amount,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> Task {
        Task::new("t", TaskStatus::Working, "a", "a")
    }

    #[test]
    fn answers_finish_tasks_by_their_code() {
        let done: ResultData =
            serde_json::from_value(json!({"request_id": "r", "success": true, "result": {"x": 1}})).unwrap();
        let finished_task = finished(task(), "echo", &done);
        assert_eq!(finished_task.status(), TaskStatus::Completed);
        let cancelled: ResultData = serde_json::from_value(
            json!({"request_id": "r", "success": false, "error": "stopped", "error_code": "cancelled"}),
        )
        .unwrap();
        assert_eq!(finished(task(), "echo", &cancelled).status(), TaskStatus::Cancelled);
        let failed: ResultData = serde_json::from_value(
            json!({"request_id": "r", "success": false, "error": "boom", "error_code": "tool_failed"}),
        )
        .unwrap();
        match finished(task(), "echo", &failed).payload {
            TaskPayload::Completed { result } => assert_eq!(result["isError"], true),
            other => panic!("expected completed, got {other:?}"),
        }
    }

    #[test]
    fn progress_reads_as_a_status_message() {
        let progress = Progress { progress: 3.0, total: Some(10.0), message: Some("copying".to_owned()) };
        assert_eq!(describe(&progress), "3/10: copying");
        assert_eq!(describe(&Progress { progress: 1.5, total: None, message: None }), "1.5");
    }
}
