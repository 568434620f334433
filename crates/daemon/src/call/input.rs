//! Input from the caller (docs/CONTRACTS.md, "Input from the caller"): a running tool's
//! questions (a hosted MCP server's `elicitation/create` and `sampling/createMessage`) become
//! non-final `<answer type>.input_required` entries, and a `tool.input` request answers them.
//!
//! - A question gets an `input_id` (a UUID v4) and waits in this replica's [`Inputs`], beside
//!   the call's cancellation token in the running-calls table ([`super::cancel::Calls`]). While
//!   it waits the call gives back its `[dispatch] max_in_flight` slot (as a call queued for its
//!   tool's `max_concurrent` does) and keeps renewing its lease; its deadline still runs.
//! - When the deadline leaves less than [`DECLINE_MARGIN`], the host stops waiting and declines
//!   for the caller ([`InputReply::Declined`]), and the tool decides; an answer after that
//!   changes nothing (`unknown`).
//! - A `tool.input` is routed as a `tool.cancel` is: the replica that reads it answers it when
//!   it runs the call, else forwards it on the other replicas' control streams and takes the
//!   first that had it. Every toolbox reading the requests stream does the same, so an accepted
//!   answer is remembered for [`REMEMBERED`] under the `tool.input`'s own id: each reader of
//!   that one request then answers `accepted` alike, while another `tool.input` for the same
//!   question is `unknown`.
//! - A response is checked where the question waits: an elicitation's `action`, and the content
//!   of an accepted one against the question's `requestedSchema`; a sampling answer is a
//!   `CreateMessageResult` or `{"error": {"code", "message"}}`. A response that fails is
//!   `invalid_arguments` with the usual `details.errors`, and the question keeps waiting.
//!
//! Nothing here survives the replica: a restart loses the question, and the takeover runs the
//! call again (docs/RELIABILITY.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use toolhost_envelope::ErrorCode;
use toolhost_tools::{Failure, Input, InputKind, InputReply, InputRequest, describe_errors};
use tracing::debug;

use super::commit::{Answering, Finality, Record};
use super::{Call, Door, Lifecycle, Outcome, Reply};
use crate::clock::now_since_epoch;
use crate::group::Slot;

/// How close to the call's deadline the host stops waiting for an answer and declines.
pub(crate) const DECLINE_MARGIN: Duration = Duration::from_secs(1);
/// How long an accepted answer is remembered under its `tool.input`'s id.
const REMEMBERED: Duration = Duration::from_secs(60);

/// What a `tool.input` found: `state: accepted | unknown`, or a response the question refuses.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum InputOutcome {
    /// The call was waiting for this input and has it now.
    Accepted,
    /// No call waits for this input (never asked, answered already, or past its deadline).
    Unknown,
    /// The response does not fit the question: a sentence and the schema errors.
    Invalid {
        /// One readable sentence.
        message: String,
        /// Each error as `describe_errors` gives it.
        errors: Vec<Value>,
    },
}

impl InputOutcome {
    /// The reply to a forwarded input.
    fn to_reply(&self) -> Value {
        match self {
            InputOutcome::Accepted => json!({"state": "accepted"}),
            InputOutcome::Unknown => json!({"state": "unknown"}),
            InputOutcome::Invalid { message, errors } => {
                json!({"state": "invalid", "message": message, "errors": errors})
            }
        }
    }

    /// The outcome a forwarded input's reply tells.
    fn from_reply(reply: &Value) -> InputOutcome {
        match reply.get("state").and_then(Value::as_str) {
            Some("accepted") => InputOutcome::Accepted,
            Some("invalid") => InputOutcome::Invalid {
                message: reply.get("message").and_then(Value::as_str).unwrap_or_default().to_owned(),
                errors: reply.get("errors").and_then(Value::as_array).cloned().unwrap_or_default(),
            },
            _ => InputOutcome::Unknown,
        }
    }
}

/// A question: its ledger (the requests stream's bare name), call request id and input id.
type InputKey = (String, String, String);

/// A question waiting for its answer.
struct Asked {
    kind: InputKind,
    /// An elicitation's `requestedSchema`.
    schema: Option<Value>,
    reply: oneshot::Sender<Value>,
}

/// The questions of the calls this replica runs.
#[derive(Default)]
pub(crate) struct Inputs {
    asked: Mutex<HashMap<InputKey, Asked>>,
    /// Answers accepted lately, with the id of the `tool.input` that gave each and when.
    accepted: Mutex<HashMap<InputKey, (String, Instant)>>,
}

/// A question's place among the waiting ones; dropping it withdraws the question.
pub(crate) struct Asking {
    inputs: Arc<Inputs>,
    key: InputKey,
}

impl Drop for Asking {
    fn drop(&mut self) {
        lock(&self.inputs.asked).remove(&self.key);
    }
}

impl Inputs {
    /// Registers a question of the call `call_id` of `ledger`: its input id, where the answer
    /// comes, and the guard that withdraws it.
    pub(crate) fn ask(
        self: &Arc<Self>,
        ledger: &str,
        call_id: &str,
        request: &InputRequest,
    ) -> (String, oneshot::Receiver<Value>, Asking) {
        let input_id = uuid::Uuid::new_v4().to_string();
        let key = (ledger.to_owned(), call_id.to_owned(), input_id.clone());
        let (reply, receiver) = oneshot::channel();
        let schema = match request.kind {
            InputKind::Elicitation => request.params.get("requestedSchema").cloned(),
            InputKind::Sampling => None,
        };
        lock(&self.asked).insert(key.clone(), Asked { kind: request.kind, schema, reply });
        (input_id, receiver, Asking { inputs: self.clone(), key })
    }

    /// Answers the question `input_id` of `call_id` with `response`, given by the `tool.input`
    /// whose own id is `answer_id`.
    pub(crate) fn answer(
        &self,
        ledger: &str,
        call_id: &str,
        input_id: &str,
        answer_id: &str,
        response: Value,
    ) -> InputOutcome {
        let key = (ledger.to_owned(), call_id.to_owned(), input_id.to_owned());
        {
            let mut accepted = lock(&self.accepted);
            accepted.retain(|_, (_, at)| at.elapsed() < REMEMBERED);
            if let Some((by, _)) = accepted.get(&key) {
                return if by == answer_id { InputOutcome::Accepted } else { InputOutcome::Unknown };
            }
        }
        let mut asked = lock(&self.asked);
        let Some(question) = asked.get(&key) else { return InputOutcome::Unknown };
        if let Err((message, errors)) = check(question.kind, question.schema.as_ref(), &response) {
            return InputOutcome::Invalid { message, errors };
        }
        let Some(question) = asked.remove(&key) else { return InputOutcome::Unknown };
        drop(asked);
        // A question whose call stopped waiting just now is not answered by this.
        if question.reply.send(response).is_err() {
            return InputOutcome::Unknown;
        }
        lock(&self.accepted).insert(key, (answer_id.to_owned(), Instant::now()));
        InputOutcome::Accepted
    }

    /// Answers a forwarded `tool.input` control message; `None` when it lacks a field.
    pub(super) fn answer_forwarded(&self, message: &Value) -> Option<Value> {
        let text = |key: &str| message.get(key).and_then(Value::as_str);
        let outcome = self.answer(
            text("ledger")?,
            text("request_id")?,
            text("input_id")?,
            text("answer_id")?,
            message.get("response")?.clone(),
        );
        Some(outcome.to_reply())
    }
}

impl super::cancel::Calls {
    /// Answers the question `input_id` of the call `call_id` of `ledger`, wherever in the fleet
    /// it waits; `answer_id` is the `tool.input`'s own id.
    pub(crate) async fn input(
        &self,
        ledger: &str,
        call_id: &str,
        input_id: &str,
        answer_id: &str,
        response: Value,
    ) -> InputOutcome {
        match self.inputs().answer(ledger, call_id, input_id, answer_id, response.clone()) {
            InputOutcome::Unknown => {}
            outcome => return outcome,
        }
        let message = json!({"kind": "input", "ledger": ledger, "request_id": call_id,
            "input_id": input_id, "answer_id": answer_id, "response": response});
        let found =
            |reply: &Value| reply.get("state").and_then(Value::as_str).is_some_and(|s| s != "unknown");
        self.forward_until(message, found)
            .await
            .map_or(InputOutcome::Unknown, |reply| InputOutcome::from_reply(&reply))
    }
}

/// Checks a response against its question.
///
/// # Errors
/// A sentence and the errors, each as `describe_errors` gives it.
fn check(kind: InputKind, schema: Option<&Value>, response: &Value) -> Result<(), (String, Vec<Value>)> {
    let shape = |message: &str| (message.to_owned(), vec![json!({"pointer": "", "message": message})]);
    let Some(fields) = response.as_object() else {
        return Err(shape("data.response must be a JSON object"));
    };
    match kind {
        InputKind::Elicitation => {
            let action = fields.get("action").and_then(Value::as_str);
            if !matches!(action, Some("accept" | "decline" | "cancel")) {
                return Err(shape("an elicitation's response needs action: accept, decline or cancel"));
            }
            let content = fields.get("content").cloned().unwrap_or_else(|| json!({}));
            if action != Some("accept") {
                return Ok(());
            }
            if !content.is_object() {
                return Err(shape("an accepted elicitation's content must be a JSON object"));
            }
            let Some(schema) = schema else { return Ok(()) };
            let validator = jsonschema::validator_for(schema).map_err(|err| {
                shape(&format!(
                    "the question's requestedSchema does not compile, so no answer fits it: {err}"
                ))
            })?;
            if validator.is_valid(&content) {
                return Ok(());
            }
            let errors = describe_errors(&validator, schema, &content);
            Err(("the response's content breaks the question's requestedSchema".to_owned(), errors))
        }
        InputKind::Sampling => {
            if let Some(error) = fields.get("error") {
                let fits = error.get("message").is_some_and(Value::is_string)
                    && error.get("code").is_none_or(Value::is_i64);
                return if fits {
                    Ok(())
                } else {
                    Err(shape("a refused sampling's error needs a message (and an integer code)"))
                };
            }
            #[allow(deprecated)]
            let parsed = serde_json::from_value::<rmcp::model::CreateMessageResult>(response.clone());
            parsed.map(drop).map_err(|err| {
                shape(&format!("a sampling response must be an MCP CreateMessageResult: {err}"))
            })
        }
    }
}

/// A question handed from the tool to the relay, with where the relay says it waits.
type Question = (InputRequest, oneshot::Sender<Waiting>);

/// A question the relay published: its answer, its place, and when the host stops waiting.
pub(super) struct Waiting {
    answer: oneshot::Receiver<Value>,
    _asking: Asking,
    /// When the call's deadline passes, as time since the UNIX epoch.
    expires: Duration,
}

impl Waiting {
    /// The answer, or a decline once the deadline leaves less than [`DECLINE_MARGIN`].
    async fn reply(self) -> InputReply {
        let left = self.expires.saturating_sub(now_since_epoch()).saturating_sub(DECLINE_MARGIN);
        match tokio::time::timeout(left, self.answer).await {
            Ok(Ok(answer)) => InputReply::Answered(answer),
            Ok(Err(_)) => InputReply::Declined("the call stopped waiting for input".to_owned()),
            Err(_elapsed) => InputReply::Declined(
                "nobody answered before the call's deadline came within a second; declined for the caller"
                    .to_owned(),
            ),
        }
    }
}

/// The two ends of a call's questions: the tool's [`Input`] handle and the relay's receiver.
pub(super) fn channel() -> (Input, mpsc::UnboundedReceiver<Question>) {
    let (sender, questions) = mpsc::unbounded_channel::<Question>();
    let input = Input::new(move |request| {
        let (placed, waiting) = oneshot::channel();
        let sent = sender.send((request, placed)).is_ok();
        Box::pin(async move {
            match waiting.await {
                Ok(waiting) if sent => waiting.reply().await,
                _ => InputReply::Declined("the call is ending".to_owned()),
            }
        })
    });
    (input, questions)
}

impl<D: Door> Lifecycle<D> {
    /// Publishes the questions of a running call until `stop` fires: each one waits in
    /// [`Inputs`], is written as `<answer type>.input_required`, and gives back the call's slot.
    /// `expires` is when the call's run ends at the latest.
    pub(super) async fn relay_questions(
        &self,
        call: &Call<'_, D::Request>,
        mut questions: mpsc::UnboundedReceiver<Question>,
        slot: &Slot,
        expires: &Mutex<Option<Duration>>,
        stop: &CancellationToken,
    ) {
        let services = &self.services;
        let call_id = &call.admitted.ledger_id;
        loop {
            let (request, placed) = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                question = questions.recv() => match question {
                    Some(question) => question,
                    None => return,
                },
            };
            let expires = lock(expires).or(call.admitted.deadline).unwrap_or_else(now_since_epoch);
            let (input_id, answer, asking) =
                services.calls.inputs().ask(&self.settings.ledger, call_id, &request);
            let data = json!({
                "request_id": call_id,
                "input_id": input_id,
                "kind": request.kind.as_str(),
                "request": {"method": request.method, "params": request.params},
                "expires_at_ms": expires.as_millis() as u64,
            });
            if let Some(entry) = self.door.input_required(call.request(), &data)
                && let Err(err) = services.bus.publish(&entry.topic, &entry.id, &entry.payload).await
            {
                // The question waits all the same: it is declined at the deadline.
                debug!(error = %err, entry_id = %entry.id, "cannot write an input-required entry");
            }
            slot.release();
            let _ = placed.send(Waiting { answer, _asking: asking, expires });
        }
    }

    /// Answers a `tool.input` for the question `input_id` of the call `call_id`; never final,
    /// since the request id it carries is the call's.
    pub(super) async fn answer_input(
        &self,
        call: &Call<'_, D::Request>,
        call_id: &str,
        input_id: &str,
        response: Value,
    ) -> Outcome {
        let result = match self.expired(call) {
            Some(failure) => Err(failure),
            None => {
                let answer_id = &call.admitted.ledger_id;
                let calls = &self.services.calls;
                match calls.input(&self.settings.ledger, call_id, input_id, answer_id, response).await {
                    InputOutcome::Accepted => {
                        Ok(json!({"request_id": call_id, "input_id": input_id, "state": "accepted"}).into())
                    }
                    InputOutcome::Unknown => {
                        Ok(json!({"request_id": call_id, "input_id": input_id, "state": "unknown"}).into())
                    }
                    InputOutcome::Invalid { message, errors } => {
                        Err(Failure::new(ErrorCode::InvalidArguments, message)
                            .with_details(json!({"input_id": input_id, "errors": errors})))
                    }
                }
            }
        };
        let answering =
            Answering { result, reply: Reply::Result, finality: Finality::NotFinal, record: Record::Absent };
        self.conclude(call, answering, None).await
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn question() -> InputRequest {
        InputRequest {
            kind: InputKind::Elicitation,
            method: "elicitation/create".into(),
            params: json!({"message": "name?", "requestedSchema": {"type": "object",
                "properties": {"name": {"type": "string"}}, "required": ["name"]}}),
        }
    }

    #[test]
    fn an_answer_is_checked_taken_once_and_remembered_for_the_same_tool_input() {
        let inputs = Arc::new(Inputs::default());
        let (input_id, mut answer, asking) = inputs.ask("requests", "call-1", &question());
        assert_eq!(uuid::Uuid::parse_str(&input_id).unwrap().get_version_num(), 4);
        assert_eq!(inputs.answer("requests", "call-1", "other", "t-1", json!({})), InputOutcome::Unknown);
        let bad = inputs.answer(
            "requests",
            "call-1",
            &input_id,
            "t-1",
            json!({"action": "accept", "content": {"name": 5}}),
        );
        let InputOutcome::Invalid { errors, .. } = bad else { panic!("{bad:?}") };
        assert_eq!(errors[0]["pointer"], "/name");
        let missing = inputs.answer("requests", "call-1", &input_id, "t-1", json!({"action": "accept"}));
        assert!(matches!(missing, InputOutcome::Invalid { .. }), "required content is missing");
        assert!(matches!(
            inputs.answer("requests", "call-1", &input_id, "t-1", json!({"action": "maybe"})),
            InputOutcome::Invalid { .. }
        ));
        let good = json!({"action": "accept", "content": {"name": "Ada"}});
        assert_eq!(
            inputs.answer("requests", "call-1", &input_id, "t-2", good.clone()),
            InputOutcome::Accepted
        );
        assert_eq!(answer.try_recv().unwrap(), good);
        // The same tool.input read by another toolbox: accepted alike; another one: unknown.
        assert_eq!(
            inputs.answer("requests", "call-1", &input_id, "t-2", good.clone()),
            InputOutcome::Accepted
        );
        assert_eq!(inputs.answer("requests", "call-1", &input_id, "t-3", good), InputOutcome::Unknown);
        drop(asking);
        assert!(lock(&inputs.asked).is_empty());
    }

    #[test]
    fn a_withdrawn_question_takes_no_answer_and_a_decline_needs_no_content() {
        let inputs = Arc::new(Inputs::default());
        let (input_id, answer, asking) = inputs.ask("requests", "c", &question());
        drop(asking);
        drop(answer);
        let decline = json!({"action": "decline"});
        assert_eq!(inputs.answer("requests", "c", &input_id, "t", decline.clone()), InputOutcome::Unknown);
        let (input_id, _answer, _asking) = inputs.ask("requests", "c", &question());
        assert_eq!(inputs.answer("requests", "c", &input_id, "t", decline), InputOutcome::Accepted);
    }

    #[test]
    fn a_sampling_answer_is_a_create_message_result_or_a_refusal() {
        let sampling = |response: Value| check(InputKind::Sampling, None, &response);
        assert!(
            sampling(json!({"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"}))
                .is_ok()
        );
        assert!(sampling(json!({"error": {"code": -1, "message": "no"}})).is_ok());
        assert!(sampling(json!({"error": {"code": "x"}})).is_err());
        assert!(sampling(json!({"role": "assistant"})).is_err());
        assert!(sampling(json!("text")).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn nobody_answering_is_a_decline_a_second_before_the_deadline() {
        let inputs = Arc::new(Inputs::default());
        let (_, answer, asking) = inputs.ask("requests", "c", &question());
        let expires = now_since_epoch() + Duration::from_secs(5);
        let reply = Waiting { answer, _asking: asking, expires }.reply().await;
        assert!(matches!(reply, InputReply::Declined(ref why) if why.contains("deadline")), "{reply:?}");
    }
}
