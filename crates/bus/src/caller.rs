//! A client for tool hosts: publish one request, await its answer by `request_id`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use toolhost_envelope::{EventEnvelope, ResultData, SPEC_VERSION, new_message_id, now_rfc3339};

use crate::{Error, Keys, Streams};

/// Calls tools through a bus, the way an agent worker does.
#[derive(Clone)]
pub struct Caller {
    bus: Arc<dyn Streams>,
    /// Full key of the requests stream.
    requests_topic: String,
    /// Full key of the results stream, where answers are read.
    results_topic: String,
    /// Bare name of the results topic, as written into `response_topic`: the tool host puts its
    /// own key prefix in front of it.
    response_topic: String,
    source: String,
}

/// Why a call produced no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The bus failed.
    #[error(transparent)]
    Bus(#[from] Error),
    /// No answer arrived in time.
    #[error("no answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// An answer arrived whose data is not a result.
    #[error("malformed answer: {0}")]
    Malformed(String),
}

impl Caller {
    /// A caller publishing to the bare topic `requests_topic` and reading answers from the bare
    /// topic `results_topic`, both under `keys`' prefix, writing `source` into its envelopes.
    ///
    /// The envelope names the results topic bare, as every caller does: the tool host adds the
    /// key prefix itself.
    pub fn new(
        bus: Arc<dyn Streams>,
        keys: &Keys,
        requests_topic: &str,
        results_topic: &str,
        source: &str,
    ) -> Caller {
        Caller {
            bus,
            requests_topic: keys.topic(requests_topic),
            results_topic: keys.topic(results_topic),
            response_topic: results_topic.to_owned(),
            source: source.to_owned(),
        }
    }

    /// Sends an event of `event_type` with `data` (a `request_id` is added when missing) and waits
    /// up to `timeout` for the result with the same `request_id`.
    ///
    /// # Errors
    /// The bus failed, the answer did not come in time, or it was not a result.
    pub async fn call(
        &self,
        event_type: &str,
        data: Map<String, Value>,
        timeout: Duration,
    ) -> Result<(EventEnvelope, ResultData), CallError> {
        let pending = self.send(event_type, data).await?;
        self.wait(&pending, timeout).await
    }

    /// Sends an event of `event_type` with `data` (a `request_id` is added when missing), to
    /// [`Caller::wait`] for its answer later.
    ///
    /// # Errors
    /// The bus failed.
    pub async fn send(&self, event_type: &str, data: Map<String, Value>) -> Result<Pending, CallError> {
        let mut data = data;
        let request_id = match data.get("request_id").and_then(Value::as_str) {
            Some(id) => id.to_owned(),
            None => {
                let id = new_message_id();
                data.insert("request_id".to_owned(), Value::String(id.clone()));
                id
            }
        };
        let request = EventEnvelope {
            id: new_message_id(),
            source: Some(self.source.clone()),
            specversion: Some(SPEC_VERSION.to_owned()),
            event_type: event_type.to_owned(),
            topic: Some(self.requests_topic.clone()),
            time: Some(now_rfc3339()),
            data: Value::Object(data),
            correlation_id: Some(request_id.clone()),
            response_topic: Some(self.response_topic.clone()),
            ..EventEnvelope::default()
        };
        // Start reading after the newest answer that exists before the request is sent.
        let cursor = self.bus.last_entry_id(&self.results_topic).await?;
        let payload = serde_json::to_string(&request).map_err(|err| CallError::Malformed(err.to_string()))?;
        self.bus.publish(&self.requests_topic, &request.id, &payload).await?;
        Ok(Pending { request_id, answer_type: request.result_type(), cursor })
    }

    /// Waits up to `timeout` for the answer to `pending`: the entry of its answer type with its
    /// `request_id` and a `success` field. Progress entries (no `success`) and the answers of
    /// other requests naming the same id (a `tool.cancel`'s) are passed over. May be called again
    /// for the same request: it reads from the same place.
    ///
    /// # Errors
    /// The bus failed, the answer did not come in time, or it was not a result.
    pub async fn wait(
        &self,
        pending: &Pending,
        timeout: Duration,
    ) -> Result<(EventEnvelope, ResultData), CallError> {
        let mut cursor = pending.cursor.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(CallError::Timeout(timeout));
            }
            let block = left.min(Duration::from_secs(1)).max(Duration::from_millis(1));
            for entry in self.bus.read(&self.results_topic, &cursor, 100, Some(block)).await? {
                cursor.clone_from(&entry.entry_id);
                let Some(answer) = entry.payload.and_then(|p| serde_json::from_str::<EventEnvelope>(&p).ok())
                else {
                    continue;
                };
                if answer.data.get("request_id").and_then(Value::as_str) != Some(pending.request_id.as_str())
                    || answer.event_type != pending.answer_type
                    || answer.data.get("success").is_none()
                {
                    continue;
                }
                let result: ResultData = serde_json::from_value(answer.data.clone())
                    .map_err(|err| CallError::Malformed(err.to_string()))?;
                return Ok((answer, result));
            }
        }
    }
}

/// A request [`Caller::send`] sent, whose answer has not been read yet.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The request's `data.request_id`.
    pub request_id: String,
    /// The type its answer has.
    answer_type: String,
    /// The answers topic's newest entry before the request was sent.
    cursor: String,
}
