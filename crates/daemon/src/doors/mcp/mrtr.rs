//! A hosted tool's questions in the 2026-07-28 form (SEP-2322, multi round-trip requests): the
//! door answers the client's `tools/call` with an `InputRequiredResult`, and the client retries
//! `tools/call` with `inputResponses` and the `requestState` it was given (docs/CONTRACTS.md,
//! "The MCP door").
//!
//! - The call is not sent again: it keeps running on its toolbox, waiting for its input. The
//!   retry sends the answer with `tool.input` (routed to the replica that runs the call) and
//!   then reads the call's answer stream from just after the question, so it sees the answer,
//!   or the next question, wherever it was written meanwhile.
//! - `requestState` is sealed with rmcp's [`RequestStateCodec`] (HMAC-SHA256): it names the
//!   call's request id, the question's input id, the answer stream (the private stream of the
//!   fleet client of the door replica that made the call) and the entry to read after, and the
//!   call's deadline, which is also its expiry. It is bound to the tool and the tenant, so it
//!   cannot be replayed for another tool or by another tenant.
//! - The keys are shared by the door's replicas through Redis, in the set
//!   `toolhost:mcp:request-state-keys` (members `<key id>:<64 hex>`): the first replica to find it
//!   empty adds a random key; every replica seals with the smallest key id and opens with any
//!   key of the set, reading the set again when a state names a key it does not hold. So a retry
//!   may land on any replica.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData as McpError,
    InputRequest, InputRequests, InputRequiredResult, RequestStateCodec, RequestStateError, SealOptions,
};
use rmcp::service::RequestContext;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use toolhost_envelope::{EventEnvelope, ResultData};
use tracing::{debug, info, warn};

use super::elicit;
use super::handler::Session;
use super::tools::{call_result, progress_param};
use crate::fleet_client::{CallEvent, FleetClient, InputKind, InputState, is_call_entry};

/// How long one read of the answer stream blocks before the deadline and the client's cancel
/// are looked at again.
const READ_BLOCK: Duration = Duration::from_secs(1);

/// A question of a running call, to be put to a 2026-07-28 client.
#[derive(Debug)]
pub(super) struct Question {
    /// The question's input id, the key of its `inputRequests` entry.
    pub input_id: String,
    /// The server's request, in rmcp's form.
    pub request: InputRequest,
    /// The entry id of the question on the call's answer stream.
    pub at: String,
}

impl Question {
    /// The question of an `.input_required` entry, when rmcp can put it in an
    /// `InputRequiredResult` (an elicitation or a sampling request it can read).
    pub(super) fn of(input_id: &str, request: &Value, at: &str) -> Option<Question> {
        let request = serde_json::from_value::<InputRequest>(request.clone()).ok()?;
        Some(Question { input_id: input_id.to_owned(), request, at: at.to_owned() })
    }
}

/// Where a 2026-07-28 client's call hands its question, and what the client may be asked: the
/// kinds it declared (`elicitation`, `sampling`) in its request's capabilities. A question of
/// another kind is declined, as for a client of the `initialize` generations.
pub(super) struct Asks {
    /// Takes the question; the call's wait ends with it.
    pub sender: tokio::sync::mpsc::UnboundedSender<Question>,
    elicitation: bool,
    sampling: bool,
}

impl Asks {
    /// What `context`'s client may be asked, with `sender` taking the question.
    pub(super) fn of(
        context: &RequestContext<RoleServer>,
        sender: tokio::sync::mpsc::UnboundedSender<Question>,
    ) -> Asks {
        let capabilities = context.client_capabilities();
        Asks {
            sender,
            elicitation: capabilities.as_ref().is_some_and(|caps| caps.elicitation.is_some()),
            sampling: capabilities.as_ref().is_some_and(|caps| caps.sampling.is_some()),
        }
    }

    /// Whether the client may be asked a question of `kind`.
    pub(super) fn allows(&self, kind: InputKind) -> bool {
        match kind {
            InputKind::Elicitation => self.elicitation,
            InputKind::Sampling => self.sampling,
        }
    }
}

/// How a call that may ask ends for now: with its answer, or with a question for the client.
#[derive(Debug)]
pub(super) enum Outcome {
    /// The call's answer.
    Answer(CallToolResult),
    /// The call waits for the client's answer to this question.
    Asked(Question),
}

/// What a sealed `requestState` says.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Waiting {
    /// The call's request id.
    request_id: String,
    /// The question the retry answers.
    input_id: String,
    /// The bare name of the call's answer stream.
    topic: String,
    /// The entry of the question on it: the retry reads after it.
    after: String,
    /// The call's deadline (its timeout plus the answer margin), in ms since the UNIX epoch.
    deadline_ms: u64,
}

/// The door's `requestState` codec, loaded from Redis at first use.
#[derive(Default)]
pub(crate) struct RequestStates {
    /// The codec and when its keys were read.
    codec: Mutex<Option<(Arc<RequestStateCodec>, Instant)>>,
}

/// The least time between two reads of the key set for states naming a key this replica does
/// not hold: a client sending states with made-up key ids costs Redis one read a second at
/// most, not one per request.
const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// What [`RequestStates::codec`] does with the codec it holds (read at `loaded`, if any) for a
/// request that asked at `asked` (`reload`: for a state naming a key it does not hold).
#[derive(Debug, PartialEq)]
enum Load {
    /// Use the codec held: no reload is asked for, or one was made since the request asked.
    Held,
    /// Read the key set.
    Read,
    /// The last read was too recent: wait this long, then decide again.
    Wait(Duration),
}

fn load(loaded: Option<Instant>, reload: bool, asked: Instant, now: Instant) -> Load {
    match loaded {
        None => Load::Read,
        Some(_) if !reload => Load::Held,
        Some(loaded) if loaded >= asked => Load::Held,
        Some(loaded) if now.duration_since(loaded) < RELOAD_INTERVAL => {
            Load::Wait(RELOAD_INTERVAL - now.duration_since(loaded))
        }
        Some(_) => Load::Read,
    }
}

/// What a `requestState` is bound to: the tool and the tenant of the call.
fn binding(tool: &str, tenant: Option<&str>) -> Vec<u8> {
    format!("toolhost/mcp/tools/call\n{tool}\n{}", tenant.unwrap_or_default()).into_bytes()
}

fn now_ms() -> u64 {
    crate::clock::now_since_epoch().as_millis() as u64
}

fn internal(what: &str) -> impl Fn(toolhost_bus::Error) -> McpError + '_ {
    move |err| McpError::internal_error(format!("{what}: {err}"), None)
}

impl RequestStates {
    /// The codec: the keys of the shared set, sealing with the smallest key id. `reload` reads
    /// the set again (a state named a key this replica does not hold yet), at most once per
    /// [`RELOAD_INTERVAL`]: a request that finds the last read too recent waits for the next.
    async fn codec(&self, fleet: &FleetClient, reload: bool) -> Result<Arc<RequestStateCodec>, McpError> {
        let asked = Instant::now();
        let mut held = loop {
            let held = self.codec.lock().await;
            match load(held.as_ref().map(|(_, loaded)| *loaded), reload, asked, Instant::now()) {
                Load::Held => {
                    if let Some((codec, _)) = held.as_ref() {
                        return Ok(codec.clone());
                    }
                }
                Load::Read => break held,
                Load::Wait(wait) => {
                    drop(held);
                    tokio::time::sleep(wait).await;
                }
            }
        };
        let key = fleet.keys().mcp_request_state_keys();
        let bus = fleet.bus();
        let redis = internal("cannot read the requestState keys");
        let mut members = bus.members(&key).await.map_err(&redis)?;
        if members.is_empty() {
            let kid = uuid::Uuid::new_v4().simple().to_string();
            let secret: String =
                rand::random::<[u8; 32]>().iter().map(|byte| format!("{byte:02x}")).collect();
            bus.add_member(&key, &format!("{kid}:{secret}")).await.map_err(&redis)?;
            members = bus.members(&key).await.map_err(&redis)?;
        }
        let ring: Vec<(String, Vec<u8>)> = members
            .iter()
            .filter_map(|member| member.split_once(':'))
            .filter(|(kid, secret)| !kid.is_empty() && secret.len() >= RequestStateCodec::MIN_KEY_LENGTH)
            .map(|(kid, secret)| (kid.to_owned(), secret.as_bytes().to_vec()))
            .collect();
        let active = ring.iter().map(|(kid, _)| kid.clone()).min().ok_or_else(|| {
            McpError::internal_error(format!("{key} holds no usable requestState key"), None)
        })?;
        let codec = RequestStateCodec::new_with_keyring(active, ring).map_err(|err| {
            McpError::internal_error(format!("the requestState keys in {key}: {err}"), None)
        })?;
        let codec = Arc::new(codec);
        *held = Some((codec.clone(), Instant::now()));
        Ok(codec)
    }

    /// The `InputRequiredResult` of `question`, asked by the call `request_id` whose answers
    /// arrive on `topic`, with its `requestState` sealed until the call's deadline.
    async fn seal(
        &self,
        fleet: &FleetClient,
        bound: &[u8],
        question: Question,
        (request_id, topic, deadline_ms): (&str, &str, u64),
    ) -> Result<InputRequiredResult, McpError> {
        let waiting = Waiting {
            request_id: request_id.to_owned(),
            input_id: question.input_id.clone(),
            topic: topic.to_owned(),
            after: question.at,
            deadline_ms,
        };
        let ttl = Duration::from_millis(deadline_ms.saturating_sub(now_ms()).max(1));
        let codec = self.codec(fleet, false).await?;
        let sealed = codec
            .seal_json_with(&waiting, &SealOptions::new().associated_data(bound).ttl(ttl))
            .map_err(|err| McpError::internal_error(format!("cannot seal the requestState: {err}"), None))?;
        let requests = InputRequests::from([(question.input_id, question.request)]);
        Ok(InputRequiredResult::new(Some(requests), Some(sealed)))
    }

    /// What a client's `requestState` says, when this door sealed it for this tool and tenant
    /// and the call's deadline has not passed.
    async fn open(&self, fleet: &FleetClient, sealed: &str, bound: &[u8]) -> Result<Waiting, McpError> {
        let codec = self.codec(fleet, false).await?;
        let opened = match codec.open_json_with::<Waiting>(sealed, bound) {
            Err(RequestStateError::UnknownKeyId) => {
                self.codec(fleet, true).await?.open_json_with(sealed, bound)
            }
            opened => opened,
        };
        opened.map_err(|err| {
            let reason = match err {
                RequestStateError::Expired => "expired: the call's deadline has passed".to_owned(),
                err => format!("rejected: {err}; it is not one this server gave for a call of this tool"),
            };
            McpError::invalid_params(format!("requestState {reason}"), Some(json!({"requestState": reason})))
        })
    }
}

impl Session {
    /// The `InputRequiredResult` for `question` of the call of `tool` that `call` names: its
    /// request id, the bare name of its answer stream and its deadline.
    pub(super) async fn input_required(
        &self,
        (tool, tenant): (&str, Option<&str>),
        question: Question,
        call: (&str, &str, u64),
    ) -> Result<InputRequiredResult, McpError> {
        debug!(request_id = %call.0, input_id = %question.input_id, "the call asks its 2026-07-28 client");
        self.door.request_states.seal(&self.door.fleet, &binding(tool, tenant), question, call).await
    }

    /// A retried `tools/call` with `inputResponses` and `requestState`: answers the waiting
    /// question of the call the state names, then waits for the call's answer or its next
    /// question, from where the state says.
    pub(super) async fn resume(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let door = &self.door;
        let fleet = &door.fleet;
        let tool = request.name.to_string();
        let tenant = door.tenant(context);
        let Some(sealed) = request.request_state.as_deref() else {
            return Err(McpError::invalid_params(
                "inputResponses without the requestState this server gave: nothing waits for them",
                None,
            ));
        };
        let waiting = door.request_states.open(fleet, sealed, &binding(&tool, tenant.as_deref())).await?;
        let responses = request.input_responses.unwrap_or_default();
        if let Some(other) = responses.keys().find(|key| **key != waiting.input_id) {
            return Err(McpError::invalid_params(
                format!("unknown: the call did not ask '{other}'; it waits for '{}'", waiting.input_id),
                Some(json!({"state": "unknown", "inputId": other})),
            ));
        }
        let Some(response) = responses.get(&waiting.input_id) else {
            return Err(McpError::invalid_params(
                format!(
                    "inputResponses has no answer to '{}', the question requestState names",
                    waiting.input_id
                ),
                Some(json!({"inputId": waiting.input_id})),
            ));
        };
        let state = fleet
            .answer_input(&waiting.request_id, &waiting.input_id, response.clone())
            .await
            .map_err(|err| McpError::internal_error(format!("cannot send the answer: {err}"), None))?;
        taken(state, &waiting.input_id)?;
        debug!(request_id = %waiting.request_id, input_id = %waiting.input_id, "a 2026-07-28 client answered");
        match self.follow(&tool, &waiting, context).await? {
            Outcome::Answer(result) => Ok(CallToolResponse::Complete(result)),
            Outcome::Asked(question) => {
                let call = (waiting.request_id.as_str(), waiting.topic.as_str(), waiting.deadline_ms);
                let asked = self.input_required((&tool, tenant.as_deref()), question, call).await?;
                Ok(CallToolResponse::InputRequired(asked))
            }
        }
    }

    /// Reads the call's answer stream after the answered question until its answer, its next
    /// question, its deadline or the client's cancel; relays its progress meanwhile.
    async fn follow(
        &self,
        tool: &str,
        waiting: &Waiting,
        context: &RequestContext<RoleServer>,
    ) -> Result<Outcome, McpError> {
        let fleet = &self.door.fleet;
        let stream = fleet.keys().topic(&waiting.topic);
        let progress_token = context.meta.get_progress_token();
        // Nothing reads this end: the sender only carries what the client may be asked.
        let asks = Asks::of(context, tokio::sync::mpsc::unbounded_channel().0);
        let mut cursor = waiting.after.clone();
        let mut failures: u32 = 0;
        loop {
            let left = waiting.deadline_ms.saturating_sub(now_ms());
            if left == 0 {
                return Ok(Outcome::Answer(CallToolResult::error(vec![ContentBlock::text(format!(
                    "timeout: no answer to the call of '{tool}' arrived before its deadline; is the toolbox hosting it running?"
                ))])));
            }
            let block = READ_BLOCK.min(Duration::from_millis(left));
            let read = tokio::select! {
                read = fleet.bus().read(&stream, &cursor, 256, Some(block)) => read,
                () = context.ct.cancelled() => {
                    let state = fleet.cancel(&waiting.request_id).await;
                    info!(request_id = %waiting.request_id, %tool, ?state, "MCP client cancelled its retried call");
                    return Err(McpError::internal_error("the call was cancelled by the client", None));
                }
            };
            let entries = match read {
                Ok(entries) => entries,
                Err(err) => {
                    failures = failures.saturating_add(1);
                    if failures == 1 {
                        warn!(error = %err, %stream, "cannot read a call's answer stream; retrying");
                    }
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(failures.min(20)))).await;
                    continue;
                }
            };
            failures = 0;
            for entry in entries {
                cursor.clone_from(&entry.entry_id);
                let Some(envelope) = entry
                    .payload
                    .as_deref()
                    .and_then(|payload| serde_json::from_str::<EventEnvelope>(payload).ok())
                else {
                    continue;
                };
                if !is_call_entry(&envelope.event_type)
                    || envelope.data.get("request_id").and_then(Value::as_str) != Some(&waiting.request_id)
                {
                    continue;
                }
                match CallEvent::from_entry(&envelope.event_type, &envelope.data) {
                    Some(CallEvent::Progress(progress)) => {
                        let Some(token) = &progress_token else { continue };
                        let _ = context.peer.notify_progress(progress_param(token, progress)).await;
                    }
                    Some(CallEvent::InputRequired { input_id, kind, request, .. }) => {
                        match Question::of(&input_id, &request, &entry.entry_id) {
                            Some(question) if asks.allows(kind) => return Ok(Outcome::Asked(question)),
                            _ => decline(fleet, &waiting.request_id, &input_id, kind),
                        }
                    }
                    // Logging is not part of 2026-07-28 (SEP-2577).
                    Some(CallEvent::Log(_)) => {}
                    None => {
                        if let Ok(answer) = serde_json::from_value::<ResultData>(envelope.data) {
                            return Ok(Outcome::Answer(call_result(tool, &answer)));
                        }
                    }
                }
            }
        }
    }
}

/// `Ok` when the host took the answer to `input_id`; else the JSON-RPC error that says why.
///
/// # Errors
/// `unknown` (nothing waits for it), `refused` (the host's refusal, e.g. a form that breaks
/// `requestedSchema`; the question keeps waiting), or no word from the host in time.
pub(super) fn taken(state: InputState, input_id: &str) -> Result<(), McpError> {
    match state {
        InputState::Accepted => Ok(()),
        InputState::Unknown => Err(McpError::invalid_params(
            format!(
                "unknown: the call no longer waits for '{input_id}' (answered already, ended, or past its deadline)"
            ),
            Some(json!({"state": "unknown", "inputId": input_id})),
        )),
        InputState::Refused(refusal) => Err(McpError::invalid_params(
            format!("the answer to '{input_id}' was refused: {refusal}"),
            Some(json!({"state": "refused", "inputId": input_id, "error": refusal})),
        )),
        InputState::NoAnswer => Err(McpError::internal_error(
            format!("the host running the call did not take the answer to '{input_id}' in time"),
            None,
        )),
    }
}

/// Declines, on a task of its own, a question that cannot be put to a 2026-07-28 client: it did
/// not declare the capability, or rmcp cannot read the question.
pub(super) fn decline(fleet: &FleetClient, request_id: &str, input_id: &str, kind: InputKind) {
    let (fleet, request_id, input_id) = (fleet.clone(), request_id.to_owned(), input_id.to_owned());
    tokio::spawn(async move {
        let response = elicit::declined(kind, "the MCP client cannot be asked");
        let state = fleet.answer_input(&request_id, &input_id, response).await;
        debug!(%request_id, %input_id, ?state, "declined a question for a 2026-07-28 client");
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_set_is_read_again_at_most_once_a_second() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        // Nothing held: read, reload or not.
        assert_eq!(load(None, false, at(0), at(0)), Load::Read);
        assert_eq!(load(None, true, at(0), at(0)), Load::Read);
        // Held, no reload asked: use it.
        assert_eq!(load(Some(at(0)), false, at(5_000), at(5_000)), Load::Held);
        // A state naming an unknown key, a second after the last read: read.
        assert_eq!(load(Some(at(0)), true, at(1_000), at(1_000)), Load::Read);
        // Too soon after the last read: wait for the rest of the second.
        assert_eq!(load(Some(at(0)), true, at(300), at(300)), Load::Wait(Duration::from_millis(700)));
        // Another request read the set after this one asked: that read is this one's.
        assert_eq!(load(Some(at(400)), true, at(300), at(1_000)), Load::Held);
    }

    #[test]
    fn a_sealed_state_opens_only_for_its_tool_and_tenant_and_not_once_tampered() {
        let codec = RequestStateCodec::new_with_keyring("a", [("a", [7u8; 32].to_vec())]).unwrap();
        let waiting = Waiting {
            request_id: "mcp-1".to_owned(),
            input_id: "i-1".to_owned(),
            topic: "results:fleet-1".to_owned(),
            after: "1-0".to_owned(),
            deadline_ms: now_ms() + 60_000,
        };
        let bound = binding("slow__ask", Some("t1"));
        let sealed = codec
            .seal_json_with(
                &waiting,
                &SealOptions::new().associated_data(&bound).ttl(Duration::from_secs(60)),
            )
            .unwrap();
        assert_eq!(codec.open_json_with::<Waiting>(&sealed, &bound).unwrap(), waiting);
        assert!(codec.open_json_with::<Waiting>(&sealed, &binding("slow__ask", Some("t2"))).is_err());
        assert!(codec.open_json_with::<Waiting>(&sealed, &binding("echo", Some("t1"))).is_err());
        let mut tampered = sealed.clone().into_bytes();
        let last = tampered.len() - 1;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();
        assert!(codec.open_json_with::<Waiting>(&tampered, &bound).is_err());
        // Another key ring (another deployment's keys) does not open it.
        let other = RequestStateCodec::new_with_keyring("a", [("a", [8u8; 32].to_vec())]).unwrap();
        assert!(other.open_json_with::<Waiting>(&sealed, &bound).is_err());
    }

    #[test]
    fn elicitation_and_sampling_questions_have_the_2026_07_28_form() {
        let elicit = json!({"method": "elicitation/create", "params": {"message": "Name?", "requestedSchema":
            {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}});
        let question = Question::of("i-1", &elicit, "5-0").unwrap();
        assert!(matches!(question.request, InputRequest::Elicitation(_)));
        assert_eq!(serde_json::to_value(&question.request).unwrap()["params"]["message"], "Name?");
        let sample = json!({"method": "sampling/createMessage", "params": {"messages":
            [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 10}});
        assert!(matches!(
            Question::of("i-2", &sample, "6-0").unwrap().request,
            InputRequest::CreateMessage(_)
        ));
        assert!(Question::of("i-3", &json!({"method": "nonsense"}), "7-0").is_none());
    }
}
