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
//! request id. A question of the call (its newest entry an `.input_required` one) is the
//! `input_required` status; `tasks/update` answers it with `tool.input` and writes an entry
//! after it, so the task reads `working` again. Nothing about a task lives in the door's memory.

use std::time::Duration;

use rmcp::model::{
    CallToolResult, CreateTaskResult, DetailedTask, ErrorData as McpError, InputRequests, InputResponses,
    JsonObject, Task, TaskPayload, TaskStatus,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolhost_bus::Keys;
use toolhost_envelope::{ErrorCode, EventEnvelope, ResultData, new_message_id, now_rfc3339};

use super::mrtr::{self, Question};
use super::tools::call_result;
use crate::fleet_client::{ANSWER_MARGIN, CallEvent, FleetClient, Progress, Request};

/// How often a client should poll `tasks/get`.
const POLL_INTERVAL_MS: u64 = 1_000;

/// The event type of the entry `tasks/update` writes on a task's stream once the host took an
/// answer, after the question it answers.
const ANSWERED: &str = "toolhost.task.input_answered";

/// How many of a task stream's newest entries `tasks/get` reads: enough to see an answer, or a
/// question, behind the entries written after it (progress, an answered mark).
const RECENT_ENTRIES: usize = 16;

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
        let stream = fleet.keys().topic(&record.topic);
        let recent =
            fleet.bus().read_back(&stream, "+", RECENT_ENTRIES).await.map_err(|err| {
                McpError::internal_error(format!("cannot read the task's answer: {err}"), None)
            })?;
        // Newest first.
        let envelopes: Vec<EventEnvelope> = recent
            .into_iter()
            .filter_map(|entry| entry.payload)
            .filter_map(|payload| serde_json::from_str::<EventEnvelope>(&payload).ok())
            .collect();
        let updated = envelopes
            .first()
            .and_then(|envelope| envelope.time.clone())
            .unwrap_or_else(|| record.created_at.clone());
        let task = Task::new(task_id, TaskStatus::Working, record.created_at.clone(), updated)
            .with_ttl_ms(self.ttl_ms())
            .with_poll_interval_ms(POLL_INTERVAL_MS);
        let answer = envelopes.iter().find_map(|envelope| {
            (envelope.data.get("success").is_some())
                .then(|| serde_json::from_value::<ResultData>(envelope.data.clone()).ok())?
        });
        if let Some(answer) = answer {
            return Ok(finished(task, &record.tool, &answer));
        }
        let now = crate::clock::now_since_epoch().as_millis() as u64;
        if now > record.deadline_ms {
            let error = json!({"code": -32603, "message": format!("no toolbox answered the call of '{}' in time", record.tool)});
            return Ok(DetailedTask::new(task, TaskPayload::Failed { error: object(error) }));
        }
        // The call waits for its caller while a question has no `tasks/update` answer after it.
        let mut answered: Vec<&str> = Vec::new();
        let mut progress = None;
        for envelope in &envelopes {
            if envelope.event_type == ANSWERED {
                answered.extend(envelope.data.get("input_id").and_then(Value::as_str));
                continue;
            }
            match CallEvent::from_entry(&envelope.event_type, &envelope.data) {
                Some(CallEvent::InputRequired { input_id, request, .. })
                    if !answered.contains(&input_id.as_str()) =>
                {
                    if let Some(question) = Question::of(&input_id, &request, "") {
                        let input_requests = InputRequests::from([(question.input_id, question.request)]);
                        return Ok(DetailedTask::new(task, TaskPayload::InputRequired { input_requests }));
                    }
                }
                Some(CallEvent::Progress(report)) if progress.is_none() => progress = Some(report),
                _ => {}
            }
        }
        let task = match progress {
            Some(progress) => task.with_status_message(describe(&progress)),
            None => task,
        };
        Ok(DetailedTask::new(task, TaskPayload::Working))
    }

    /// `tasks/update`: answers the task's questions (`tool.input` for each of `responses`), and
    /// marks each answered on the task's stream, so `tasks/get` says `working` again.
    ///
    /// # Errors
    /// An unknown or expired task, an answer the host did not take (`unknown`, refused), or
    /// Redis failed.
    pub(crate) async fn update(
        &self,
        fleet: &FleetClient,
        task_id: &str,
        responses: InputResponses,
    ) -> Result<(), McpError> {
        let record = self.record(fleet, task_id).await?;
        let stream = fleet.keys().topic(&record.topic);
        for (input_id, response) in responses {
            let state = fleet
                .answer_input(&record.request_id, &input_id, response)
                .await
                .map_err(|err| McpError::internal_error(format!("cannot send the answer: {err}"), None))?;
            mrtr::taken(state, &input_id)?;
            let answered = json!({"id": new_message_id(), "type": ANSWERED, "time": now_rfc3339(),
                "data": {"request_id": record.request_id, "input_id": input_id}});
            fleet.bus().publish(&stream, &new_message_id(), &answered.to_string()).await.map_err(|err| {
                McpError::internal_error(format!("cannot mark the task's question answered: {err}"), None)
            })?;
        }
        Ok(())
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
