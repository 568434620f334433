//! The 2026-07-28 form of a server's questions (MRTR): a `tools/call` answered with an
//! `InputRequiredResult` is retried, with the caller's answers (`inputResponses`) and the
//! server's `requestState`, until the server answers for good, at most [`MAX_ROUNDS`] times.
//!
//! Each of a round's `inputRequests` is asked of the call's caller through its
//! [`toolhost_tools::Input`], as an `elicitation/create` or `sampling/createMessage` of the
//! `initialize` generations is (`crate::input`); a decline answers an elicitation
//! `action: "decline"` and fails the call for sampling (an MRTR response has no error form), and
//! `roots/list` is answered with no roots (toolhost offers none).
//!
//! Only a source that negotiated 2026-07-28 gets such a result (rmcp turns it into an error for
//! older peers). A server's own task (`crate::task`) asks its questions the same way, in its
//! `input_required` state, and [`answer_requests`] answers them too.

use rmcp::model::{InputRequiredResult, InputResponses};
use serde_json::{Value, json};
use toolhost_tools::{Input, InputKind, InputReply, InputRequest, ToolError};

/// The most rounds of questions one call may take, as rmcp's own `call_tool`
/// (`DEFAULT_MRTR_MAX_ROUNDS`).
pub(crate) const MAX_ROUNDS: usize = 10;

/// The caller's answers to one round's questions, keyed as the server keyed them.
///
/// # Errors
/// `Failed` for a request that is no elicitation, sampling or roots request, or a sampling
/// request nobody answered.
pub(crate) async fn answer_round(
    tool: &str,
    input: &Input,
    round: &InputRequiredResult,
) -> Result<InputResponses, ToolError> {
    match &round.input_requests {
        Some(requests) => answer_requests(tool, input, requests.iter()).await,
        None => Ok(InputResponses::new()),
    }
}

/// The caller's answers to `requests`, keyed as the server keyed them.
///
/// # Errors
/// As [`answer_round`].
pub(crate) async fn answer_requests<'a>(
    tool: &str,
    input: &Input,
    requests: impl Iterator<Item = (&'a String, &'a rmcp::model::InputRequest)>,
) -> Result<InputResponses, ToolError> {
    let mut responses = InputResponses::new();
    for (key, request) in requests {
        let request = serde_json::to_value(request).map_err(|err| {
            ToolError::Failed(format!("MCP tool '{tool}' asked in a form toolhost cannot read: {err}"))
        })?;
        let method = request.get("method").and_then(Value::as_str).unwrap_or_default().to_owned();
        let params = request.get("params").cloned().unwrap_or_else(|| json!({}));
        let kind = match method.as_str() {
            "elicitation/create" => InputKind::Elicitation,
            "sampling/createMessage" => InputKind::Sampling,
            "roots/list" => {
                responses.insert(key.clone(), json!({"roots": []}));
                continue;
            }
            other => {
                return Err(ToolError::Failed(format!(
                    "MCP tool '{tool}' asked its caller '{other}', which toolhost does not relay"
                )));
            }
        };
        let response = match input.ask(InputRequest { kind, method, params }).await {
            InputReply::Answered(response) => response,
            InputReply::Declined(_) if kind == InputKind::Elicitation => json!({"action": "decline"}),
            InputReply::Declined(why) => {
                return Err(ToolError::Failed(format!(
                    "MCP tool '{tool}' asked its caller to sample and nobody did: {why}"
                )));
            }
        };
        responses.insert(key.clone(), response);
    }
    Ok(responses)
}

/// The failure of a call whose server still asks after [`MAX_ROUNDS`] rounds.
pub(crate) fn too_many_rounds(tool: &str) -> ToolError {
    ToolError::Failed(format!(
        "MCP tool '{tool}' asked for input {MAX_ROUNDS} times without finishing; toolhost stopped retrying"
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn round(requests: Value) -> InputRequiredResult {
        serde_json::from_value(
            json!({"resultType": "input_required", "inputRequests": requests, "requestState": "s"}),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn each_question_of_a_round_is_asked_and_answered_under_its_key() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let input = {
            let asked = asked.clone();
            Input::new(move |question| {
                asked.lock().unwrap().push((question.kind, question.params.clone()));
                Box::pin(async move {
                    match question.kind {
                        InputKind::Elicitation => {
                            InputReply::Answered(json!({"action": "accept", "content": {"n": 1}}))
                        }
                        InputKind::Sampling => InputReply::Declined("nobody".into()),
                    }
                })
            })
        };
        let elicit = json!({"method": "elicitation/create", "params": {"mode": "form", "message": "n?",
            "requestedSchema": {"type": "object", "properties": {"n": {"type": "integer"}}}}});
        let roots = json!({"method": "roots/list"});
        let responses =
            answer_round("t", &input, &round(json!({"form": elicit, "roots": roots}))).await.unwrap();
        assert_eq!(responses["form"], json!({"action": "accept", "content": {"n": 1}}));
        assert_eq!(responses["roots"], json!({"roots": []}));
        assert_eq!(asked.lock().unwrap()[0].1["message"], "n?");
        let sample = json!({"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}});
        let refused = answer_round("t", &input, &round(json!({"s": sample}))).await.unwrap_err();
        assert!(refused.to_string().contains("nobody"), "{refused}");
        // Without a host that relays questions, an elicitation is declined.
        let declined = answer_round("t", &Input::default(), &round(json!({"form": elicit}))).await.unwrap();
        assert_eq!(declined["form"], json!({"action": "decline"}));
    }
}
