//! A server's `elicitation/create` and `sampling/createMessage`, asked of the call they belong to.
//!
//! Over streamable HTTP rmcp tells a client which of its requests' response streams a server's
//! request came on ([`InboundStreamOrigin::OutboundRequest`]), which names the call. A request on
//! the standalone stream, or over stdio, names nothing: it goes to the server's one call in
//! flight when it has exactly one, and is declined otherwise (a question must not reach a
//! caller it may not be about). The call's [`Input`] then asks its caller; what comes back is
//! the server's answer, or a decline (`action: "decline"` for an elicitation, an error for
//! sampling) when nobody answered in time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::model::{
    ClientCapabilities, ElicitRequestParams, ElicitResult, ElicitationCapability, ErrorCode,
    FormElicitationCapability, RequestId, SamplingCapability,
};
#[allow(deprecated)]
use rmcp::model::{CreateMessageRequestParams, CreateMessageResult};
use rmcp::service::{InboundStreamOrigin, RequestContext};
use rmcp::{ErrorData, RoleClient};
use serde_json::{Value, json};
use toolhost_tools::{Input, InputKind, InputReply, InputRequest};
use tracing::debug;

/// The JSON-RPC code MCP gives a sampling request the user rejected.
const USER_REJECTED: i32 = -1;

/// What toolhost declares to a server: form elicitation and sampling. It cannot know at
/// `initialize` whether a call's eventual caller can answer, so it declares both and declines
/// for callers that cannot.
pub(crate) fn capabilities() -> ClientCapabilities {
    let mut capabilities = ClientCapabilities::default();
    capabilities.elicitation = Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
    #[allow(deprecated)]
    let sampling = SamplingCapability::default();
    capabilities.sampling = Some(sampling);
    capabilities
}

/// The calls in flight on one server, with where their questions go.
#[derive(Default)]
pub(crate) struct InputRoutes {
    calls: Mutex<HashMap<u64, (Option<RequestId>, Input)>>,
    next: AtomicU64,
}

/// Keeps a call among the server's calls in flight until dropped.
pub(crate) struct InputRoute<'a> {
    routes: &'a InputRoutes,
    id: u64,
}

impl InputRoutes {
    /// Counts a call in flight, its questions going to `input`, until the guard is dropped.
    pub(crate) fn add(&self, input: Input) -> InputRoute<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.calls).insert(id, (None, input));
        InputRoute { routes: self, id }
    }

    /// The input of the call a server request came for: the one whose `tools/call` stream it
    /// came on, else the only call in flight; `None` when that is not one call.
    fn find(&self, origin: Option<&InboundStreamOrigin>) -> Option<Input> {
        let calls = lock(&self.calls);
        if let Some(InboundStreamOrigin::OutboundRequest(id)) = origin
            && let Some((_, input)) = calls.values().find(|(sent, _)| sent.as_ref() == Some(id))
        {
            return Some(input.clone());
        }
        if calls.len() == 1 { calls.values().next().map(|(_, input)| input.clone()) } else { None }
    }

    /// Asks the caller of the call `context` belongs to; a decline when no one call is found.
    async fn ask(
        &self,
        source: &str,
        context: &RequestContext<RoleClient>,
        request: InputRequest,
    ) -> InputReply {
        let origin = context.extensions.get::<InboundStreamOrigin>();
        match self.find(origin) {
            Some(input) => input.ask(request).await,
            None => {
                debug!(source, method = %request.method, "a server request not tied to one call; declined");
                InputReply::Declined(format!(
                    "MCP server '{source}' asked while it ran several calls, and toolhost cannot tell for which"
                ))
            }
        }
    }

    /// Handles a server's `elicitation/create`.
    ///
    /// # Errors
    /// An answer that is not an `ElicitResult` (the host checked it, so this is an internal error).
    pub(crate) async fn elicit(
        &self,
        source: &str,
        params: ElicitRequestParams,
        context: &RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let request = InputRequest {
            kind: InputKind::Elicitation,
            method: "elicitation/create".to_owned(),
            params: serde_json::to_value(&params).map_err(internal)?,
        };
        let answer = match self.ask(source, context, request).await {
            InputReply::Answered(answer) => answer,
            InputReply::Declined(why) => {
                debug!(source, why, "elicitation declined");
                json!({"action": "decline"})
            }
        };
        serde_json::from_value(answer).map_err(internal)
    }

    /// Handles a server's `sampling/createMessage`.
    ///
    /// # Errors
    /// The caller refused or nobody answered (`-1`, the user rejected it), or the caller's own
    /// error.
    #[allow(deprecated)]
    pub(crate) async fn sample(
        &self,
        source: &str,
        params: CreateMessageRequestParams,
        context: &RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let request = InputRequest {
            kind: InputKind::Sampling,
            method: "sampling/createMessage".to_owned(),
            params: serde_json::to_value(&params).map_err(internal)?,
        };
        match self.ask(source, context, request).await {
            InputReply::Declined(why) => Err(ErrorData::new(ErrorCode(USER_REJECTED), why, None)),
            InputReply::Answered(answer) => sampling_answer(answer),
        }
    }
}

impl InputRoute<'_> {
    /// Records the JSON-RPC id of the call's `tools/call`, which names the stream its server's
    /// requests come on.
    pub(crate) fn sent(&self, request_id: RequestId) {
        if let Some((sent, _)) = lock(&self.routes.calls).get_mut(&self.id) {
            *sent = Some(request_id);
        }
    }
}

impl Drop for InputRoute<'_> {
    fn drop(&mut self) {
        lock(&self.routes.calls).remove(&self.id);
    }
}

/// A caller's sampling answer: a `CreateMessageResult`, or `{"error": {"code", "message"}}`.
#[allow(deprecated)]
fn sampling_answer(answer: Value) -> Result<CreateMessageResult, ErrorData> {
    if let Some(error) = answer.get("error") {
        let code = error.get("code").and_then(Value::as_i64).and_then(|code| i32::try_from(code).ok());
        let message = error.get("message").and_then(Value::as_str).unwrap_or("the caller refused to sample");
        return Err(ErrorData::new(ErrorCode(code.unwrap_or(USER_REJECTED)), message.to_owned(), None));
    }
    serde_json::from_value(answer).map_err(internal)
}

fn internal(err: serde_json::Error) -> ErrorData {
    ErrorData::internal_error(format!("toolhost could not relay the question: {err}"), None)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, deprecated)]
mod tests {
    use super::*;

    fn input(tag: &'static str) -> Input {
        Input::new(move |_| Box::pin(async move { InputReply::Answered(json!(tag)) }))
    }

    async fn asked(input: Option<Input>) -> Option<Value> {
        let question = InputRequest { kind: InputKind::Sampling, method: "m".into(), params: json!({}) };
        match input?.ask(question).await {
            InputReply::Answered(value) => Some(value),
            InputReply::Declined(_) => None,
        }
    }

    #[tokio::test]
    async fn a_question_goes_to_the_call_whose_stream_it_came_on_else_to_the_only_call() {
        let routes = InputRoutes::default();
        assert!(routes.find(None).is_none(), "no call in flight");
        let first = routes.add(input("first"));
        first.sent(RequestId::Number(1));
        assert_eq!(asked(routes.find(None)).await, Some(json!("first")), "the only call");
        let second = routes.add(input("second"));
        second.sent(RequestId::Number(2));
        assert!(routes.find(Some(&InboundStreamOrigin::Unassociated)).is_none(), "two calls: nobody's");
        let on_two = InboundStreamOrigin::OutboundRequest(RequestId::Number(2));
        assert_eq!(asked(routes.find(Some(&on_two))).await, Some(json!("second")));
        drop(second);
        drop(first);
        assert!(lock(&routes.calls).is_empty());
    }

    #[test]
    fn a_sampling_refusal_is_the_callers_error_and_a_result_is_read() {
        let refused = sampling_answer(json!({"error": {"code": -1, "message": "no"}})).unwrap_err();
        assert_eq!((refused.code.0, refused.message.as_ref()), (-1, "no"));
        let result = sampling_answer(json!({"role": "assistant", "content": {"type": "text", "text": "hi"},
            "model": "m"}))
        .unwrap();
        assert_eq!(result.model, "m");
        assert!(sampling_answer(json!({"role": 5})).is_err());
    }
}
