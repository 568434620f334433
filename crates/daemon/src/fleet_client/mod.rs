//! A client of the fleet: what the MCP door, `toolhost mcp` and other doors that are not a
//! consumer group use to list and call every tool of every live toolbox.
//!
//! It hosts nothing. It calls a tool the way any caller does, by publishing a `tool.invoke`
//! request to the requests stream, so the call gets the fleet's promises (validation, limits,
//! deadlines, the ledger, one answer per request id) from whichever toolbox hosts the tool. The
//! answers come back on a private response stream of its own, `results:<client id>`, which it
//! creates with a TTL, keeps alive while it lives and deletes when it closes; one reader task
//! routes answers and progress entries to the calls waiting for them, by request id.
//!
//! The fleet's tools are read from the fleet set, heartbeats and registries ([`view`]) every
//! watch period, and a change is announced on [`FleetClient::changes`].
//!
//! It holds only [`FleetAccess`]: plain streams and the directory, no groups, no ledger.

pub(crate) mod events;
pub(crate) mod view;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use toolhost_bus::{Error as BusError, FleetAccess, Keys};
use toolhost_envelope::{
    Entry, EventEnvelope, ResultData, SPEC_VERSION, TraceContext, new_message_id, now_rfc3339,
};
use tracing::{debug, warn};

pub(crate) use events::{CallEvent, InputKind, InputState, LogMessage};
pub(crate) use view::FleetTools;

/// How long past a call's timeout the client waits for its answer before it says no toolbox
/// answered: the host answers `timeout` itself at the timeout, and this covers the trip back.
pub(crate) const ANSWER_MARGIN: Duration = Duration::from_secs(2);

/// How long a cancel waits for the host to say what it did.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// The event type of a cancel's answer (docs/CONTRACTS.md, "Cancelling a call").
const CANCEL_ANSWER: &str = "tool.cancel.completed";

/// The event type of the entry that creates a private stream, skipped by its reader.
const OPENED: &str = "toolhost.client.opened";

/// How a client of the fleet is set up.
#[derive(Debug, Clone)]
pub(crate) struct ClientSettings {
    /// The requests stream's shards (one: the stream itself), which requests are spread over by
    /// the shard rule.
    pub shards: toolhost_bus::Shards,
    /// What the requests' `source` says, e.g. `toolhost:mcp`.
    pub source: String,
    /// How long the private response stream outlives the client when it dies without closing.
    pub stream_ttl: Duration,
    /// How often the fleet's tools are read again; `None`: never (a client that only calls).
    pub watch_period: Option<Duration>,
    /// The key requests are signed with (`[auth] door_key`, `toolhost call --key-id`); `None`:
    /// unsigned.
    pub signing: Option<crate::auth::SigningKey>,
    /// The tenant of requests that name none themselves (a cancel, a call without
    /// [`Request::tenant`]).
    pub tenant: Option<String>,
}

/// One call of a fleet tool.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// The tool's name.
    pub tool: String,
    /// Its arguments (validated by the host).
    pub arguments: Value,
    /// The request id: a retry with the same id is answered from the host's ledger.
    pub request_id: String,
    /// The call's timeout, sent as `timeout_ms`.
    pub timeout: Duration,
    /// Bare name of the topic the answer goes to; `None` for the client's private stream.
    pub response_topic: Option<String>,
    /// The tenant the call is made for (the one its door authenticated); `None`: the client's.
    pub tenant: Option<String>,
    /// Who the door authenticated (`token:<id>`), added to the request's `source` so the host's
    /// audit entries name it.
    pub via: Option<String>,
    /// The caller's trace context, written as the request's `traceparent` and `tracestate`.
    pub trace: Option<TraceContext>,
}

/// A progress report of a running call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Progress {
    /// How far it is.
    pub progress: f64,
    /// Out of how much, when known.
    pub total: Option<f64>,
    /// What it is doing.
    pub message: Option<String>,
}

impl Progress {
    /// The progress of a progress entry's `data`; `None` when it is not one.
    pub(crate) fn from_data(data: &Value) -> Option<Progress> {
        if data.get("success").is_some() {
            return None;
        }
        Some(Progress {
            progress: data.get("progress")?.as_f64()?,
            total: data.get("total").and_then(Value::as_f64),
            message: data.get("message").and_then(Value::as_str).map(str::to_owned),
        })
    }
}

/// Why a call has no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallFailure {
    /// The request could not be published.
    #[error("cannot publish the request: {0}")]
    Bus(#[from] BusError),
    /// Nothing answered within the tool's timeout plus the margin.
    #[error("no toolbox answered within {} ms", .0.as_millis())]
    NoAnswer(Duration),
    /// The client is closed.
    #[error("the fleet client is closed")]
    Closed,
}

/// What a cancel did, as the host answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CancelState {
    /// The host's `state`: `cancelling`, `answered` or `unknown`.
    Answered(String),
    /// The host did not answer the cancel in time.
    NoAnswer,
}

/// Where a waiting call's non-final entries go.
enum Sink {
    /// Progress reports only (the callers that show nothing else).
    Progress(mpsc::UnboundedSender<Progress>),
    /// Every [`CallEvent`].
    Events(mpsc::UnboundedSender<CallEvent>),
}

/// One call waiting for its answer.
struct Waiter {
    answer: oneshot::Sender<ResultData>,
    sink: Option<Sink>,
}

/// What the host answered to an input: `result.state`, or the error code and message.
type InputAnswer = Result<String, String>;

/// Calls waiting for answers, cancels and inputs waiting for theirs, by request id (inputs by
/// request id and input id).
#[derive(Default)]
struct Pending {
    calls: HashMap<String, Vec<Waiter>>,
    cancels: HashMap<String, Vec<oneshot::Sender<String>>>,
    inputs: HashMap<(String, String), Vec<oneshot::Sender<InputAnswer>>>,
}

struct Inner {
    bus: Arc<dyn FleetAccess>,
    keys: Keys,
    settings: ClientSettings,
    /// Bare name of the private response stream.
    private_topic: String,
    /// Its full key.
    private_key: String,
    pending: Mutex<Pending>,
    view: ArcSwap<FleetTools>,
    changes: watch::Sender<u64>,
    stop: CancellationToken,
}

/// A client of the fleet; cheap to clone, closed by [`FleetClient::close`] (or when the last
/// clone is dropped, without deleting its stream, which then expires).
#[derive(Clone)]
pub(crate) struct FleetClient {
    inner: Arc<Inner>,
}

impl FleetClient {
    /// Opens a client: creates its private response stream with its TTL, reads the fleet once,
    /// and starts the answer reader, the stream's keep-alive and the fleet watch.
    ///
    /// # Errors
    /// Redis failed.
    pub(crate) async fn open(
        bus: Arc<dyn FleetAccess>,
        keys: Keys,
        settings: ClientSettings,
    ) -> Result<FleetClient, BusError> {
        let client_id = format!("fleet-{}", new_message_id());
        let private_topic = Keys::private_results(&client_id);
        let inner = Arc::new(Inner {
            private_key: keys.topic(&private_topic),
            private_topic,
            bus,
            keys,
            settings,
            pending: Mutex::new(Pending::default()),
            view: ArcSwap::from_pointee(FleetTools::default()),
            changes: watch::Sender::new(0),
            stop: CancellationToken::new(),
        });
        inner.create_stream().await?;
        tokio::spawn(read_answers(Arc::downgrade(&inner), inner.stop.clone()));
        tokio::spawn(keep_alive(Arc::downgrade(&inner), inner.stop.clone()));
        if let Some(period) = inner.settings.watch_period {
            inner.refresh().await?;
            tokio::spawn(watch_fleet(Arc::downgrade(&inner), period, inner.stop.clone()));
        }
        Ok(FleetClient { inner })
    }

    /// The fleet's tools as last read.
    pub(crate) fn tools(&self) -> Arc<FleetTools> {
        self.inner.view.load_full()
    }

    /// Ticks each time the fleet's tools change.
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// The key prefix and key builder of the client's Redis.
    pub(crate) fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    /// The Redis access the client holds, for doors that keep records of their own (tasks).
    pub(crate) fn bus(&self) -> &Arc<dyn FleetAccess> {
        &self.inner.bus
    }

    /// The bare name of the client's private response stream, where the answers and non-final
    /// entries of its calls arrive; any process on the Redis may read it while the client lives.
    pub(crate) fn answer_topic(&self) -> &str {
        &self.inner.private_topic
    }

    /// Calls a tool and waits for its answer, sending progress entries to `progress`.
    ///
    /// # Errors
    /// The request could not be published, or no toolbox answered within the tool's timeout
    /// plus [`ANSWER_MARGIN`].
    ///
    /// # Cancel safety
    /// Dropping the future stops waiting; the call itself goes on unless it is cancelled with
    /// [`FleetClient::cancel`].
    pub(crate) async fn call(
        &self,
        request: &Request,
        progress: Option<mpsc::UnboundedSender<Progress>>,
    ) -> Result<ResultData, CallFailure> {
        let wait = request.timeout + ANSWER_MARGIN;
        self.wait_for(&request.request_id, progress.map(Sink::Progress), wait, self.submit(request)).await
    }

    /// Calls a tool and waits for its answer, sending every non-final entry (progress, log,
    /// input required) to `events`.
    ///
    /// # Errors
    /// As [`FleetClient::call`].
    ///
    /// # Cancel safety
    /// As [`FleetClient::call`]; a question left unanswered is declined at the call's deadline.
    pub(crate) async fn call_with_events(
        &self,
        request: &Request,
        events: mpsc::UnboundedSender<CallEvent>,
    ) -> Result<ResultData, CallFailure> {
        let wait = request.timeout + ANSWER_MARGIN;
        self.wait_for(&request.request_id, Some(Sink::Events(events)), wait, self.submit(request)).await
    }

    /// Answers the question `input_id` of the call `request_id` (`tool.input`, routed to the
    /// replica that runs the call) with `response`, an MCP `ElicitResult` or `CreateMessageResult`,
    /// and returns what the host did with it.
    ///
    /// # Errors
    /// The answer could not be published.
    pub(crate) async fn answer_input(
        &self,
        request_id: &str,
        input_id: &str,
        response: Value,
    ) -> Result<InputState, CallFailure> {
        let inner = &self.inner;
        let key = (request_id.to_owned(), input_id.to_owned());
        let (sender, receiver) = oneshot::channel();
        inner.lock().inputs.entry(key.clone()).or_default().push(sender);
        let mut data = Map::new();
        data.insert("request_id".to_owned(), json!(request_id));
        data.insert("input_id".to_owned(), json!(input_id));
        data.insert("response".to_owned(), response);
        let published =
            inner.publish("tool.input", data, request_id, &inner.private_topic, (None, None, None)).await;
        let answer = match published {
            Ok(()) => tokio::time::timeout(CANCEL_WAIT, receiver).await.ok().and_then(Result::ok),
            Err(err) => {
                inner.lock().inputs.remove(&key);
                return Err(err);
            }
        };
        let mut pending = inner.lock();
        if let Some(senders) = pending.inputs.get_mut(&key) {
            senders.retain(|sender| !sender.is_closed());
            if senders.is_empty() {
                pending.inputs.remove(&key);
            }
        }
        Ok(match answer {
            None => InputState::NoAnswer,
            Some(Ok(state)) if state == "accepted" => InputState::Accepted,
            Some(Ok(_)) => InputState::Unknown,
            Some(Err(refusal)) => InputState::Refused(refusal),
        })
    }

    /// Sends a request of another type than a call (`tools.stats`, `tools.discover`) with a new
    /// request id added to `data`, and waits up to `wait` for its answer.
    ///
    /// # Errors
    /// The request could not be published, or nothing answered within `wait`.
    pub(crate) async fn ask(
        &self,
        event_type: &str,
        data: Map<String, Value>,
        wait: Duration,
    ) -> Result<ResultData, CallFailure> {
        self.ask_for(event_type, data, wait, (None, None, None)).await
    }

    /// [`FleetClient::ask`] for a caller: its tenant, the principal it came `via` and its
    /// trace context, as a call's [`Request`] names them.
    ///
    /// # Errors
    /// The request could not be published, or nothing answered within `wait`.
    pub(crate) async fn ask_for(
        &self,
        event_type: &str,
        mut data: Map<String, Value>,
        wait: Duration,
        caller: (Option<&str>, Option<&str>, Option<&TraceContext>),
    ) -> Result<ResultData, CallFailure> {
        let request_id = new_message_id();
        data.insert("request_id".to_owned(), json!(request_id));
        let inner = &self.inner;
        let publish = inner.publish(event_type, data, &request_id, &inner.private_topic, caller);
        self.wait_for(&request_id, None, wait, publish).await
    }

    /// Registers a waiter for `request_id`'s answer, runs `send`, and waits up to `wait`.
    async fn wait_for(
        &self,
        request_id: &str,
        sink: Option<Sink>,
        wait: Duration,
        send: impl Future<Output = Result<(), CallFailure>>,
    ) -> Result<ResultData, CallFailure> {
        let inner = &self.inner;
        if inner.stop.is_cancelled() {
            return Err(CallFailure::Closed);
        }
        let (answer, receiver) = oneshot::channel();
        inner.lock().calls.entry(request_id.to_owned()).or_default().push(Waiter { answer, sink });
        // Removes this call's waiter however the wait ends.
        let _forget = Forget { inner, request_id };
        send.await?;
        match tokio::time::timeout(wait, receiver).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_closed)) => Err(CallFailure::Closed),
            Err(_elapsed) => Err(CallFailure::NoAnswer(wait)),
        }
    }

    /// Publishes a call's request without waiting for its answer (tasks read it later).
    ///
    /// # Errors
    /// The request could not be published.
    pub(crate) async fn submit(&self, request: &Request) -> Result<(), CallFailure> {
        let mut data = Map::new();
        data.insert("request_id".to_owned(), json!(request.request_id));
        data.insert("tool".to_owned(), json!(request.tool));
        data.insert("arguments".to_owned(), request.arguments.clone());
        data.insert("timeout_ms".to_owned(), json!(request.timeout.as_millis() as u64));
        let topic = request.response_topic.as_deref().unwrap_or(&self.inner.private_topic);
        let caller = (request.tenant.as_deref(), request.via.as_deref(), request.trace.as_ref());
        self.inner.publish("tool.invoke", data, &request.request_id, topic, caller).await
    }

    /// Asks the host to cancel the call `request_id` (`tool.cancel`) and returns what it did.
    ///
    /// # Errors
    /// The cancel could not be published.
    pub(crate) async fn cancel(&self, request_id: &str) -> Result<CancelState, CallFailure> {
        let inner = &self.inner;
        let (sender, receiver) = oneshot::channel();
        inner.lock().cancels.entry(request_id.to_owned()).or_default().push(sender);
        let mut data = Map::new();
        data.insert("request_id".to_owned(), json!(request_id));
        let published =
            inner.publish("tool.cancel", data, request_id, &inner.private_topic, (None, None, None)).await;
        let state = match published {
            Ok(()) => tokio::time::timeout(CANCEL_WAIT, receiver).await.ok().and_then(Result::ok),
            Err(err) => {
                inner.lock().cancels.remove(request_id);
                return Err(err);
            }
        };
        // A late answer finds no sender; the others waiting for the same id keep theirs.
        let mut pending = inner.lock();
        if let Some(senders) = pending.cancels.get_mut(request_id) {
            senders.retain(|sender| !sender.is_closed());
            if senders.is_empty() {
                pending.cancels.remove(request_id);
            }
        }
        Ok(state.map_or(CancelState::NoAnswer, CancelState::Answered))
    }

    /// Stops the client's tasks and deletes its private stream. Calls still waiting end with
    /// [`CallFailure::Closed`].
    pub(crate) async fn close(&self) {
        let inner = &self.inner;
        inner.stop.cancel();
        let pending = std::mem::take(&mut *inner.lock());
        drop(pending);
        if let Err(err) = inner.bus.delete(std::slice::from_ref(&inner.private_key)).await {
            warn!(error = %err, stream = %inner.private_key, "cannot delete the private response stream; it expires");
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        // A panic while the lock is held leaves a map that is still consistent.
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Creates the private stream with an entry of its own, so the TTL has a key to hold.
    async fn create_stream(&self) -> Result<(), BusError> {
        let opened = json!({"id": new_message_id(), "type": OPENED, "time": now_rfc3339()}).to_string();
        self.bus.publish(&self.private_key, &new_message_id(), &opened).await?;
        self.bus.expire(&self.private_key, self.settings.stream_ttl).await?;
        Ok(())
    }

    async fn refresh(&self) -> Result<(), BusError> {
        let previous = self.view.load_full();
        let next = view::read(&*self.bus, &self.keys, &previous).await?;
        if !Arc::ptr_eq(&previous, &next) {
            debug!(tools = next.len(), "the fleet's tools changed");
            self.view.store(next);
            self.changes.send_modify(|tick| *tick += 1);
        }
        Ok(())
    }

    /// The bare name of the shard of the requests stream a request goes to, by the shard rule
    /// (docs/CONTRACTS.md, "Sharded requests streams"): its `data.request_id`'s, a cancel's the
    /// call's, shard 0 for `tools.*`.
    fn shard(&self, event_type: &str, data: &Map<String, Value>) -> String {
        let shards = &self.settings.shards;
        let request_id = data.get("request_id").and_then(Value::as_str);
        shards.stream(shards.of_request(event_type, request_id).unwrap_or(0))
    }

    async fn publish(
        &self,
        event_type: &str,
        data: Map<String, Value>,
        request_id: &str,
        response_topic: &str,
        (tenant, via, trace): (Option<&str>, Option<&str>, Option<&TraceContext>),
    ) -> Result<(), CallFailure> {
        let source = match via {
            Some(via) => format!("{} {via}", self.settings.source),
            None => self.settings.source.clone(),
        };
        let request = EventEnvelope {
            id: new_message_id(),
            source: Some(source),
            specversion: Some(SPEC_VERSION.to_owned()),
            event_type: event_type.to_owned(),
            topic: Some(self.shard(event_type, &data)),
            time: Some(now_rfc3339()),
            data: Value::Object(data),
            correlation_id: Some(request_id.to_owned()),
            response_topic: Some(response_topic.to_owned()),
            tenant_id: tenant.or(self.settings.tenant.as_deref()).map(str::to_owned),
            traceparent: trace.map(TraceContext::traceparent),
            tracestate: trace.and_then(|trace| trace.tracestate.clone()),
            ..EventEnvelope::default()
        };
        // Serialising a struct of strings and JSON values cannot fail.
        let payload = serde_json::to_string(&request).unwrap_or_default();
        let requests_key = self.keys.topic(request.topic.as_deref().unwrap_or_default());
        match &self.settings.signing {
            // Signed over the exact bytes written.
            Some(key) => {
                let sig = key.sign(payload.as_bytes());
                let fields =
                    [("id", request.id.as_str()), ("payload", payload.as_str()), ("sig", sig.as_str())];
                self.bus.append(&requests_key, &fields, None).await?;
            }
            None => {
                self.bus.publish(&requests_key, &request.id, &payload).await?;
            }
        }
        Ok(())
    }

    /// Routes one entry of the private stream to whoever waits for it.
    fn route(&self, entry: Entry) {
        let Some(envelope) =
            entry.payload.as_deref().and_then(|payload| serde_json::from_str::<EventEnvelope>(payload).ok())
        else {
            return;
        };
        let Some(request_id) = envelope.data.get("request_id").and_then(Value::as_str) else { return };
        let request_id = request_id.to_owned();
        let request_id = request_id.as_str();
        let mut pending = self.lock();
        if envelope.event_type == CANCEL_ANSWER {
            let state = envelope.data.pointer("/result/state").and_then(Value::as_str).unwrap_or("unknown");
            for sender in pending.cancels.remove(request_id).unwrap_or_default() {
                let _ = sender.send(state.to_owned());
            }
            return;
        }
        if envelope.event_type == events::INPUT_ANSWER {
            let input_id =
                envelope.data.pointer("/result/input_id").and_then(Value::as_str).unwrap_or_default();
            let answer = match envelope.data.get("success").and_then(Value::as_bool) {
                Some(false) => Err(format!(
                    "{}: {}",
                    envelope.data.get("error_code").and_then(Value::as_str).unwrap_or("failed"),
                    envelope.data.get("error").and_then(Value::as_str).unwrap_or_default()
                )),
                _ => Ok(envelope
                    .data
                    .pointer("/result/state")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_owned()),
            };
            let key = (request_id.to_owned(), input_id.to_owned());
            let senders = match pending.inputs.remove(&key) {
                Some(senders) => senders,
                // A refusal names no input id: it goes to the request's one waiting answer.
                None => {
                    let keys: Vec<_> =
                        pending.inputs.keys().filter(|(id, _)| id == request_id).cloned().collect();
                    if keys.len() == 1 {
                        pending.inputs.remove(&keys[0]).unwrap_or_default()
                    } else {
                        Vec::new()
                    }
                }
            };
            for sender in senders {
                let _ = sender.send(answer.clone());
            }
            return;
        }
        if let Some(mut event) = CallEvent::from_entry(&envelope.event_type, &envelope.data) {
            if let CallEvent::InputRequired { at, .. } = &mut event {
                at.clone_from(&entry.entry_id);
            }
            for waiter in pending.calls.get(request_id).into_iter().flatten() {
                match (&waiter.sink, &event) {
                    (Some(Sink::Events(sender)), _) => {
                        let _ = sender.send(event.clone());
                    }
                    (Some(Sink::Progress(sender)), CallEvent::Progress(progress)) => {
                        let _ = sender.send(progress.clone());
                    }
                    _ => {}
                }
            }
            return;
        }
        let Ok(result) = serde_json::from_value::<ResultData>(envelope.data) else { return };
        for waiter in pending.calls.remove(request_id).unwrap_or_default() {
            let _ = waiter.answer.send(result.clone());
        }
    }
}

/// Whether an entry of type `event_type` on a private stream is about a call (its answer or a
/// non-final entry), not the answer of a cancel or an input, nor the stream's opening entry.
pub(crate) fn is_call_entry(event_type: &str) -> bool {
    ![CANCEL_ANSWER, events::INPUT_ANSWER, OPENED].contains(&event_type)
}

/// Removes a call's closed waiters when its wait ends.
struct Forget<'a> {
    inner: &'a Inner,
    request_id: &'a str,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        let mut pending = self.inner.lock();
        if let Some(waiters) = pending.calls.get_mut(self.request_id) {
            waiters.retain(|waiter| !waiter.answer.is_closed());
            if waiters.is_empty() {
                pending.calls.remove(self.request_id);
            }
        }
    }
}

/// Reads the private stream until the client stops, routing every entry.
async fn read_answers(inner: std::sync::Weak<Inner>, stop: CancellationToken) {
    let mut cursor = "0-0".to_owned();
    let mut failures: u32 = 0;
    loop {
        let Some(client) = inner.upgrade() else { return };
        let (bus, key) = (client.bus.clone(), client.private_key.clone());
        drop(client);
        let read = tokio::select! {
            read = bus.read(&key, &cursor, 256, Some(Duration::from_secs(1))) => read,
            () = stop.cancelled() => return,
        };
        match read {
            Ok(entries) => {
                failures = 0;
                let Some(client) = inner.upgrade() else { return };
                for entry in entries {
                    cursor.clone_from(&entry.entry_id);
                    client.route(entry);
                }
            }
            Err(err) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    warn!(error = %err, "cannot read the private response stream; retrying");
                }
                let pause = Duration::from_millis(50 * u64::from(failures.min(20)));
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = stop.cancelled() => return,
                }
            }
        }
    }
}

/// Refreshes the private stream's TTL, creating it again if it expired meanwhile.
async fn keep_alive(inner: std::sync::Weak<Inner>, stop: CancellationToken) {
    loop {
        let Some(period) = inner.upgrade().map(|client| client.settings.stream_ttl / 3) else { return };
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = stop.cancelled() => return,
        }
        let Some(client) = inner.upgrade() else { return };
        let kept = client.bus.expire(&client.private_key, client.settings.stream_ttl).await;
        let res = match kept {
            Ok(true) => Ok(()),
            Ok(false) => client.create_stream().await,
            Err(err) => Err(err),
        };
        if let Err(err) = res {
            warn!(error = %err, "cannot refresh the private response stream's TTL");
        }
    }
}

/// Reads the fleet's tools every `period`.
async fn watch_fleet(inner: std::sync::Weak<Inner>, period: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = stop.cancelled() => return,
        }
        let Some(client) = inner.upgrade() else { return };
        if let Err(err) = client.refresh().await {
            debug!(error = %err, "cannot read the fleet's tools");
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use toolhost_bus::{MemoryBus, Streams};

    use super::*;

    #[test]
    fn progress_entries_are_told_from_answers() {
        let progress =
            Progress::from_data(&json!({"request_id": "r", "progress": 2, "total": 4, "message": "half"}));
        assert_eq!(
            progress,
            Some(Progress { progress: 2.0, total: Some(4.0), message: Some("half".to_owned()) })
        );
        assert_eq!(Progress::from_data(&json!({"request_id": "r", "success": true, "progress": 1})), None);
    }

    fn settings() -> ClientSettings {
        ClientSettings {
            shards: toolhost_bus::Shards::new("action-requests", 1),
            source: "toolhost:test".to_owned(),
            stream_ttl: Duration::from_secs(60),
            watch_period: Some(Duration::from_secs(60)),
            signing: None,
            tenant: None,
        }
    }

    fn answer(event_type: &str, data: Value) -> String {
        json!({"id": new_message_id(), "type": event_type, "data": data}).to_string()
    }

    #[tokio::test]
    async fn answers_and_progress_reach_the_call_that_waits_for_them_and_no_other() {
        let bus = Arc::new(MemoryBus::new());
        let client = FleetClient::open(bus.clone(), Keys::new(""), settings()).await.unwrap();
        let private = client.inner.private_key.clone();
        let (progress_tx, mut progress_rx) = mpsc::unbounded_channel();
        let request = |id: &str| Request {
            tool: "echo".to_owned(),
            arguments: json!({"message": "hi"}),
            request_id: id.to_owned(),
            timeout: Duration::from_secs(5),
            response_topic: None,
            tenant: None,
            via: None,
            trace: None,
        };
        let (r1, r2) = (request("r-1"), request("r-2"));
        let first = client.call(&r1, Some(progress_tx));
        let second = client.call(&r2, None);
        let answers = async {
            // Wait until both requests are on the requests stream, then answer them in reverse.
            loop {
                let entries = bus.read("action-requests", "0-0", 10, None).await.unwrap();
                if entries.len() == 2 {
                    let envelope: EventEnvelope =
                        serde_json::from_str(entries[0].payload.as_deref().unwrap()).unwrap();
                    assert_eq!(envelope.event_type, "tool.invoke");
                    assert_eq!(envelope.response_topic.as_deref(), Some(client.inner.private_topic.as_str()));
                    assert_eq!(envelope.data["timeout_ms"], 5000);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let progress = answer("x.progress", json!({"request_id": "r-1", "progress": 1}));
            bus.publish(&private, "p", &progress).await.unwrap();
            let done = answer("x", json!({"request_id": "r-2", "success": true, "result": 2}));
            bus.publish(&private, "a2", &done).await.unwrap();
            let done = answer("x", json!({"request_id": "r-1", "success": true, "result": 1}));
            bus.publish(&private, "a1", &done).await.unwrap();
        };
        let (first, second, ()) = tokio::join!(first, second, answers);
        assert_eq!(first.unwrap().result, Some(json!(1)));
        assert_eq!(second.unwrap().result, Some(json!(2)));
        assert_eq!(progress_rx.recv().await.map(|p| p.progress), Some(1.0));
        assert!(client.inner.lock().calls.is_empty(), "answered calls leave no waiter");
        client.close().await;
        assert!(matches!(client.call(&request("r-3"), None).await, Err(CallFailure::Closed)));
    }

    #[tokio::test]
    async fn a_call_with_events_gets_logs_and_questions_and_an_input_gets_the_hosts_state() {
        let bus = Arc::new(MemoryBus::new());
        let client = FleetClient::open(bus.clone(), Keys::new(""), settings()).await.unwrap();
        let private = client.inner.private_key.clone();
        let request = Request {
            tool: "ask".to_owned(),
            arguments: json!({}),
            request_id: "r-q".to_owned(),
            timeout: Duration::from_secs(5),
            response_topic: None,
            tenant: None,
            via: None,
            trace: None,
        };
        let (events, mut received) = mpsc::unbounded_channel();
        let call = client.call_with_events(&request, events);
        let host = async {
            while bus.read("action-requests", "0-0", 10, None).await.unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let log = json!({"request_id": "r-q", "level": "warning", "data": "low disk"});
            bus.publish(&private, "l", &answer("x.log", log)).await.unwrap();
            let question = json!({"request_id": "r-q", "input_id": "i-1", "kind": "sampling",
                "request": {"method": "sampling/createMessage", "params": {}}});
            let asked_at = bus.publish(&private, "q", &answer("x.input_required", question)).await.unwrap();
            let answered = client.answer_input("r-q", "i-1", json!({"role": "assistant"}));
            let accept = async {
                loop {
                    let entries = bus.read("action-requests", "0-0", 10, None).await.unwrap();
                    if let Some(entry) = entries.get(1) {
                        let envelope: EventEnvelope =
                            serde_json::from_str(entry.payload.as_deref().unwrap()).unwrap();
                        assert_eq!(envelope.event_type, "tool.input");
                        assert_eq!(
                            envelope.data,
                            json!({"request_id": "r-q", "input_id": "i-1", "response": {"role": "assistant"}})
                        );
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let state = json!({"request_id": "r-q", "result": {"request_id": "r-q", "input_id": "i-1", "state": "accepted"}});
                bus.publish(&private, "s", &answer("tool.input.completed", state)).await.unwrap();
            };
            let (answered, ()) = tokio::join!(answered, accept);
            assert_eq!(answered.unwrap(), InputState::Accepted);
            let done = answer("x", json!({"request_id": "r-q", "success": true, "result": 1}));
            bus.publish(&private, "a", &done).await.unwrap();
            asked_at
        };
        let (answered, asked_at) = tokio::join!(call, host);
        assert_eq!(answered.unwrap().result, Some(json!(1)));
        assert!(matches!(received.recv().await, Some(CallEvent::Log(log)) if log.level == "warning"));
        // The question names its entry on the stream, where a retry of a 2026-07-28 call reads on.
        assert!(matches!(
            received.recv().await,
            Some(CallEvent::InputRequired { kind: InputKind::Sampling, ref input_id, ref at, .. })
                if input_id == "i-1" && *at == asked_at
        ));
        assert_eq!(received.recv().await, None, "the events end with the answer");
        assert!(client.inner.lock().inputs.is_empty());
        client.close().await;
    }

    #[tokio::test]
    async fn a_requests_tenant_is_the_envelopes_tenant_id() {
        let bus = Arc::new(MemoryBus::new());
        let client = FleetClient::open(bus.clone(), Keys::new(""), settings()).await.unwrap();
        let mut request = Request {
            tool: "echo".to_owned(),
            arguments: json!({}),
            request_id: "r-t".to_owned(),
            timeout: Duration::from_secs(1),
            response_topic: None,
            tenant: Some("house-1".to_owned()),
            via: None,
            trace: None,
        };
        client.submit(&request).await.unwrap();
        request.tenant = None;
        client.submit(&request).await.unwrap();
        let entries = bus.read("action-requests", "0-0", 10, None).await.unwrap();
        let tenants: Vec<Option<String>> = entries
            .iter()
            .map(|entry| {
                serde_json::from_str::<EventEnvelope>(entry.payload.as_deref().unwrap()).unwrap().tenant_id
            })
            .collect();
        assert_eq!(tenants, [Some("house-1".to_owned()), None]);
        client.close().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_nobody_answers_ends_after_its_timeout_and_the_margin() {
        let bus = Arc::new(MemoryBus::new());
        let client = FleetClient::open(bus, Keys::new(""), settings()).await.unwrap();
        let request = Request {
            tool: "slow".to_owned(),
            arguments: json!({}),
            request_id: "r".to_owned(),
            timeout: Duration::from_secs(3),
            response_topic: None,
            tenant: None,
            via: None,
            trace: None,
        };
        match client.call(&request, None).await {
            Err(CallFailure::NoAnswer(waited)) => assert_eq!(waited, Duration::from_secs(3) + ANSWER_MARGIN),
            other => panic!("expected no answer, got {other:?}"),
        }
        assert!(client.inner.lock().calls.is_empty());
    }
}
