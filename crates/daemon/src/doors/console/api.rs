//! The console's JSON and SSE endpoints: a call from the try-it form and its events, cancel,
//! the live call log, the fleet, and the dead-letter actions. Every action is audited.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use opentelemetry::KeyValue;
use opentelemetry::trace::SpanKind;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use toolhost_envelope::{TraceContext, new_message_id};

use super::{Console, read};
use crate::auth::AuditEntry;
use crate::fleet_client::{CallFailure, CancelState, Progress, Request};
use crate::telemetry::DoorSpan;

/// How long a finished call's events stay for a page that follows it late.
const KEEP_FINISHED: Duration = Duration::from_secs(300);

/// How often the live call log looks for new entries.
const LOG_POLL: Duration = Duration::from_millis(500);

/// A call made from the console, followed by its page: its events so far, and a tick per event.
pub(crate) struct Followed {
    events: Mutex<Vec<(&'static str, Value)>>,
    done: AtomicBool,
    changed: watch::Sender<usize>,
}

impl Followed {
    fn push(&self, kind: &'static str, data: Value, last: bool) {
        let count = {
            let mut events = self.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            events.push((kind, data));
            events.len()
        };
        if last {
            self.done.store(true, Ordering::SeqCst);
        }
        self.changed.send_replace(count);
    }
}

/// An error answer.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

/// The body of `POST /api/call`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CallBody {
    tool: String,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    request_id: Option<String>,
    /// The page's trace context (W3C `traceparent`), passed on when valid.
    #[serde(default)]
    traceparent: Option<String>,
}

/// `POST /api/call`: publishes the call and answers 202 with its request id; its events come on
/// The console's SERVER span of a call from its page, `POST /api/call` by the HTTP conventions
/// (`http.request.method`, `http.route`, `http.response.status_code` 202) with the tool's
/// (`gen_ai.tool.name`, `gen_ai.operation.name` `execute_tool`): a child of the page's context,
/// and the context the request carries. It lasts until the call's answer (or its timeout)
/// reaches the console, not only until the 202, so it shows the call as the page follows it.
/// `None` when the call is not sampled or nothing is exported.
fn call_span(console: &Console, caller: Option<&TraceContext>, request: &Request) -> Option<DoorSpan> {
    let attributes = vec![
        KeyValue::new("http.request.method", "POST"),
        KeyValue::new("http.route", "/api/call"),
        KeyValue::new("http.response.status_code", 202),
        KeyValue::new("gen_ai.tool.name", request.tool.clone()),
        KeyValue::new("gen_ai.operation.name", "execute_tool"),
        KeyValue::new("toolhost.door", "console"),
        KeyValue::new("toolhost.request_id", request.request_id.clone()),
    ];
    console.telemetry.door_span(caller, "POST /api/call".to_owned(), SpanKind::Server, attributes)
}

/// `GET /api/calls/<request id>/events`.
pub(crate) async fn call(State(console): State<Arc<Console>>, body: Option<Json<CallBody>>) -> Response {
    let Some(Json(body)) = body else {
        return error(
            StatusCode::BAD_REQUEST,
            "the body must be JSON: {\"tool\", \"arguments\", \"request_id\"?}",
        );
    };
    let tools = console.fleet.tools();
    let Some(tool) = tools.get(&body.tool) else {
        return error(StatusCode::NOT_FOUND, format!("no live toolbox hosts a tool named '{}'", body.tool));
    };
    let request_id = body.request_id.filter(|id| !id.trim().is_empty()).unwrap_or_else(new_message_id);
    if request_id.len() > 200 {
        return error(StatusCode::BAD_REQUEST, "request_id is longer than 200 bytes");
    }
    let arguments = body.arguments.unwrap_or_else(|| json!({}));
    let timeout = match tool.timeout_ms {
        0 => console.call_timeout,
        ms => Duration::from_millis(ms).min(console.call_timeout),
    };
    let mut request = Request {
        tool: body.tool.clone(),
        arguments: arguments.clone(),
        request_id: request_id.clone(),
        timeout,
        response_topic: None,
        tenant: console.tenant.clone(),
        via: Some("console".to_owned()),
        trace: None,
    };
    let caller = TraceContext::read(body.traceparent.as_deref(), None);
    let span = call_span(&console, caller.as_ref(), &request);
    request.trace = span.as_ref().map(DoorSpan::passed_on).or(caller);
    audit(&console, &request_id, &body.tool, "call").await;
    let followed = Arc::new(Followed {
        events: Mutex::new(Vec::new()),
        done: AtomicBool::new(false),
        changed: watch::Sender::new(0),
    });
    console.lock_calls().insert(request_id.clone(), followed.clone());
    let (progress, mut reports) = mpsc::unbounded_channel::<Progress>();
    let relay = followed.clone();
    tokio::spawn(async move {
        while let Some(report) = reports.recv().await {
            let data = json!({"progress": report.progress, "total": report.total, "message": report.message});
            relay.push("progress", data, false);
        }
    });
    let fleet = console.fleet.clone();
    let weak = Arc::downgrade(&console);
    tokio::spawn(async move {
        let failed = match fleet.call(&request, Some(progress)).await {
            Ok(answer) => {
                let failed =
                    answer.error_code.map(|code| (code.as_str(), "the call was answered with an error"));
                followed.push("answer", serde_json::to_value(&answer).unwrap_or_default(), true);
                failed
            }
            Err(CallFailure::NoAnswer(wait)) => {
                followed.push(
                    "timeout",
                    json!({"error": format!("no toolbox answered within {} ms", wait.as_millis())}),
                    true,
                );
                Some(("timeout", "no toolbox answered in time"))
            }
            Err(err) => {
                followed.push("timeout", json!({"error": err.to_string()}), true);
                Some(("no_answer", "the call could not be made"))
            }
        };
        if let (Some(span), Some((error_type, description))) = (&span, failed) {
            span.fail(error_type, description);
        }
        // The console's span ends when the call's outcome reached the console.
        drop(span);
        tokio::time::sleep(KEEP_FINISHED).await;
        if let Some(console) = weak.upgrade() {
            console.lock_calls().remove(&request.request_id);
        }
    });
    (StatusCode::ACCEPTED, Json(json!({"request_id": request_id}))).into_response()
}

/// `GET /api/calls/<request id>/events`: the call's events as SSE (`progress`, then `answer` or
/// `timeout`), from its first one.
pub(crate) async fn events(State(console): State<Arc<Console>>, Path(request_id): Path<String>) -> Response {
    let Some(followed) = console.lock_calls().get(&request_id).cloned() else {
        return error(
            StatusCode::NOT_FOUND,
            "no call with this request id was made from this console lately",
        );
    };
    let changes = followed.changed.subscribe();
    let stream =
        futures::stream::unfold((followed, changes, 0usize), |(followed, mut changes, sent)| async move {
            loop {
                let next = {
                    let events = followed.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    events.get(sent).cloned()
                };
                if let Some((kind, data)) = next {
                    let event = Event::default().event(kind).data(data.to_string());
                    return Some((Ok::<Event, Infallible>(event), (followed, changes, sent + 1)));
                }
                if followed.done.load(Ordering::SeqCst) {
                    return None;
                }
                if changes.changed().await.is_err() {
                    return None;
                }
            }
        });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// The body of `POST /api/cancel`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelBody {
    request_id: String,
}

/// `POST /api/cancel`: cancels a call, anywhere in the fleet, and says what the host did.
pub(crate) async fn cancel(State(console): State<Arc<Console>>, body: Option<Json<CancelBody>>) -> Response {
    let Some(Json(body)) = body else {
        return error(StatusCode::BAD_REQUEST, "the body must be JSON: {\"request_id\"}");
    };
    audit(&console, &body.request_id, "-", "cancel").await;
    match console.fleet.cancel(&body.request_id).await {
        Ok(CancelState::Answered(state)) => Json(json!({"state": state})).into_response(),
        Ok(CancelState::NoAnswer) => Json(json!({"state": "no_answer"})).into_response(),
        Err(err) => error(StatusCode::SERVICE_UNAVAILABLE, err.to_string()),
    }
}

/// `GET /api/fleet`: what the fleet page shows, as JSON.
pub(crate) async fn fleet(State(console): State<Arc<Console>>) -> Response {
    let view = read::fleet(&console).await;
    Json(view.to_json(&console)).into_response()
}

/// `GET /api/history`: the live replicas' recent history, for the charts.
pub(crate) async fn history(State(console): State<Arc<Console>>) -> Response {
    Json(read::history(&console).await).into_response()
}

/// `GET /api/calls/stream`: every call logged from now on, in any toolbox's log, as SSE events
/// `call`.
pub(crate) async fn call_log(
    State(console): State<Arc<Console>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut cursors = BTreeMap::new();
    for toolbox in read::toolboxes(&console).await {
        let last = read::last_call_id(&console, &toolbox).await;
        cursors.insert(toolbox, last);
    }
    let pending: std::collections::VecDeque<Event> = std::collections::VecDeque::new();
    let stream = futures::stream::unfold(
        (console, cursors, pending),
        |(console, mut cursors, mut pending)| async move {
            loop {
                if let Some(event) = pending.pop_front() {
                    return Some((Ok(event), (console, cursors, pending)));
                }
                tokio::time::sleep(LOG_POLL).await;
                // A toolbox that came up since is followed from its log's start.
                for toolbox in read::toolboxes(&console).await {
                    cursors.entry(toolbox).or_insert_with(|| "0-0".to_owned());
                }
                for call in read::calls_after(&console, &mut cursors).await {
                    pending.push_back(Event::default().event("call").data(call.to_json().to_string()));
                }
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// `POST /api/dlq/<toolbox>/<dlq id>/replay`: puts the letter's request back on its stream.
pub(crate) async fn replay(
    State(console): State<Arc<Console>>,
    Path((toolbox, dlq_id)): Path<(String, String)>,
) -> Response {
    let (letters, letter) = match find_letter(&console, &toolbox, &dlq_id).await {
        Ok(found) => found,
        Err(refusal) => return refusal,
    };
    let request_id = letter.request_id().unwrap_or_default();
    audit(&console, &request_id, "-", &format!("replay dlq:{toolbox} {dlq_id}")).await;
    match letters.replay(&letter).await {
        Ok(entry_id) => Json(json!({"entry_id": entry_id, "request_id": request_id})).into_response(),
        Err(err) => error(StatusCode::CONFLICT, format!("{err:#}")),
    }
}

/// `POST /api/dlq/<toolbox>/<dlq id>/delete`: deletes the letter.
pub(crate) async fn delete(
    State(console): State<Arc<Console>>,
    Path((toolbox, dlq_id)): Path<(String, String)>,
) -> Response {
    let (letters, letter) = match find_letter(&console, &toolbox, &dlq_id).await {
        Ok(found) => found,
        Err(refusal) => return refusal,
    };
    let request_id = letter.request_id().unwrap_or_default();
    audit(&console, &request_id, "-", &format!("delete dlq:{toolbox} {dlq_id}")).await;
    match letters.purge(std::slice::from_ref(&letter)).await {
        Ok(deleted) => Json(json!({"deleted": deleted})).into_response(),
        Err(err) => error(StatusCode::SERVICE_UNAVAILABLE, err.to_string()),
    }
}

/// The letter `dlq_id` of `toolbox`, or the answer saying why there is none.
async fn find_letter(
    console: &Console,
    toolbox: &str,
    dlq_id: &str,
) -> Result<(crate::dead_letters::DeadLetters, crate::dead_letters::Letter), Response> {
    let letters = read::dead_letters(console, toolbox);
    match letters.get(dlq_id).await {
        Ok(Some(letter)) => Ok((letters, letter)),
        Ok(None) => Err(error(StatusCode::NOT_FOUND, format!("no dead letter {dlq_id} in dlq:{toolbox}"))),
        Err(err) => Err(error(StatusCode::SERVICE_UNAVAILABLE, err.to_string())),
    }
}

/// Writes a console action to the audit stream, as the console's tenant. The arguments of a
/// call are recorded (redacted, with `[auth] audit_arguments`) by the toolbox that runs it.
async fn audit(console: &Console, request_id: &str, tool: &str, reason: &str) {
    let entry = AuditEntry {
        request_id,
        tenant: console.tenant.as_deref().unwrap_or_default(),
        principal: Some("console".to_owned()),
        tool,
        decision: "allowed",
        reason,
        door: "console",
        source: Some("toolhost:console"),
        arguments: None,
    };
    entry.write(&*console.bus, &console.audit_topic, console.audit_max_len, None).await;
}
