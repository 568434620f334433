//! A hosted tool's questions, asked of the door's MCP client: a call's
//! [`CallEvent::InputRequired`] becomes `elicitation/create` or `sampling/createMessage` to a
//! client of the `initialize` generations that declared the capability, and the client's answer
//! goes back to the call with [`FleetClient::answer_input`] (docs/CONTRACTS.md, "Input from the
//! caller", and "The MCP door").
//!
//! - The request rides the stream of the client's `tools/call` (rmcp's `OriginatingRequestId`),
//!   so a client that reads only that stream gets it.
//! - A client without the capability gets the decline: `action: "decline"`, or a sampling
//!   error. A 2026-07-28 client (where rmcp sends no server-to-client request) is asked with an
//!   `InputRequiredResult` instead (`mrtr.rs`); a call that reaches this module for one (a task)
//!   gets the decline too.
//! - A client's JSON-RPC error is the answer too: an elicitation is then declined, and a
//!   sampling refused with the client's code and message. The host checks the answer; one it
//!   refuses (a form that breaks `requestedSchema`) is declined instead, so the call goes on.

use rmcp::RoleServer;
#[allow(deprecated)]
use rmcp::model::CreateMessageRequest;
use rmcp::model::{ClientResult, ElicitRequest, GetExtensions, ProtocolVersion, RequestId, ServerRequest};
use rmcp::service::{OriginatingRequestId, Peer, ServiceError};
use serde_json::{Value, json};
use tracing::debug;

use crate::fleet_client::{FleetClient, InputKind, InputState};

/// Asks the client the question `input_id` of the call `request_id` (`request` is
/// `{"method", "params"}` as the server gave it) and answers the call with what it says;
/// `originating` is the client's `tools/call` request. Declines for a client that cannot be asked.
pub(super) async fn ask(
    peer: &Peer<RoleServer>,
    originating: &RequestId,
    (fleet, request_id): (&FleetClient, &str),
    (input_id, kind, request): (&str, InputKind, &Value),
) {
    let response = match asked(peer, originating, kind, request).await {
        Some(response) => response,
        None => declined(kind, "the MCP client cannot be asked"),
    };
    let state = fleet.answer_input(request_id, input_id, response).await;
    let state = match state {
        Ok(InputState::Refused(refusal)) => {
            // The host refused the client's answer: the call is not left waiting for one.
            debug!(%request_id, %input_id, %refusal, "the MCP client's answer was refused; declined instead");
            let decline = declined(kind, &format!("the client's answer was refused: {refusal}"));
            fleet.answer_input(request_id, input_id, decline).await
        }
        state => state,
    };
    debug!(%request_id, %input_id, kind = kind.as_str(), ?state, "answered a question of a call");
}

/// The client's answer, or `None` when it cannot be asked.
async fn asked(
    peer: &Peer<RoleServer>,
    originating: &RequestId,
    kind: InputKind,
    request: &Value,
) -> Option<Value> {
    let info = peer.peer_info()?;
    if info.protocol_version >= ProtocolVersion::V_2026_07_28 {
        return None;
    }
    let capabilities = &info.capabilities;
    let params = request.get("params").cloned().unwrap_or_else(|| json!({}));
    let mut request = match kind {
        InputKind::Elicitation if capabilities.elicitation.is_some() => {
            ServerRequest::ElicitRequest(ElicitRequest::new(serde_json::from_value(params).ok()?))
        }
        #[allow(deprecated)]
        InputKind::Sampling if capabilities.sampling.is_some() => ServerRequest::CreateMessageRequest(
            CreateMessageRequest::new(serde_json::from_value(params).ok()?),
        ),
        _ => return None,
    };
    request.extensions_mut().insert(OriginatingRequestId(originating.clone()));
    Some(match peer.send_request(request).await {
        Ok(ClientResult::ElicitResult(result)) => serde_json::to_value(result).ok()?,
        #[allow(deprecated)]
        Ok(ClientResult::CreateMessageResult(result)) => serde_json::to_value(result).ok()?,
        Ok(_) => declined(kind, "the MCP client answered in a form toolhost does not know"),
        Err(ServiceError::McpError(error)) => match kind {
            InputKind::Elicitation => declined(kind, &error.message),
            InputKind::Sampling => json!({"error": {"code": error.code.0, "message": error.message}}),
        },
        Err(error) => declined(kind, &error.to_string()),
    })
}

/// The answer that declines a question of `kind`: `action: "decline"` for an elicitation, and
/// for sampling the error MCP gives a rejected request (`-1`), saying `why`.
pub(crate) fn declined(kind: InputKind, why: &str) -> Value {
    match kind {
        InputKind::Elicitation => json!({"action": "decline"}),
        InputKind::Sampling => {
            json!({"error": {"code": -1, "message": format!("the caller declined to sample: {why}")}})
        }
    }
}
