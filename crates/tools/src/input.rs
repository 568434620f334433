//! Questions a running tool asks its caller: a hosted MCP server's `elicitation/create` and
//! `sampling/createMessage` (docs/CONTRACTS.md, "Input from the caller").
//!
//! A tool asks through the [`Input`] handle of its [`crate::Context`]; the host decides how the
//! question reaches the caller and for how long it waits. The handle never fails: a host that
//! relays no questions, or a caller that does not answer in time, gives
//! [`InputReply::Declined`], and the tool decides what that means.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;

/// What a tool asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// An MCP `elicitation/create`: the user fills in a form (or follows a URL).
    Elicitation,
    /// An MCP `sampling/createMessage`: the caller's model writes a message.
    Sampling,
}

impl InputKind {
    /// The wire name, `elicitation` or `sampling`.
    pub fn as_str(self) -> &'static str {
        match self {
            InputKind::Elicitation => "elicitation",
            InputKind::Sampling => "sampling",
        }
    }
}

/// One question: the server's request as MCP gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct InputRequest {
    /// What is asked.
    pub kind: InputKind,
    /// The MCP method (`elicitation/create`, `sampling/createMessage`).
    pub method: String,
    /// The request's params, as the server sent them.
    pub params: Value,
}

/// What the caller (or the host, for it) answered.
#[derive(Debug, Clone, PartialEq)]
pub enum InputReply {
    /// The caller's response: an MCP `ElicitResult` or `CreateMessageResult` (or, for sampling,
    /// `{"error": {"code", "message"}}` when the caller refused), checked by the host.
    Answered(Value),
    /// Nobody answered: the host relays no questions, or the call's deadline came too close.
    /// The sentence says why.
    Declined(String),
}

/// The future of one question's reply.
pub type InputFuture = Pin<Box<dyn Future<Output = InputReply> + Send>>;

/// Where a running tool asks its caller for input: a cheap, cloneable handle like
/// [`crate::Progress`]. Without a host that relays questions, every question is declined.
#[derive(Clone, Default)]
pub struct Input {
    asker: Option<Arc<dyn Fn(InputRequest) -> InputFuture + Send + Sync>>,
}

impl Input {
    /// A handle that hands every question to `asker`.
    pub fn new(asker: impl Fn(InputRequest) -> InputFuture + Send + Sync + 'static) -> Input {
        Input { asker: Some(Arc::new(asker)) }
    }

    /// Asks the caller and waits for the reply.
    ///
    /// # Cancel safety
    /// Dropping the future withdraws the question: a later answer to it changes nothing.
    pub async fn ask(&self, request: InputRequest) -> InputReply {
        match &self.asker {
            Some(asker) => asker(request).await,
            None => InputReply::Declined("the host relays no questions to this call's caller".to_owned()),
        }
    }

    /// Whether questions go anywhere.
    pub fn is_relayed(&self) -> bool {
        self.asker.is_some()
    }
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input").field("relayed", &self.is_relayed()).finish()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn an_unrelayed_question_is_declined_and_a_relayed_one_gets_the_asker_reply() {
        let question = InputRequest {
            kind: InputKind::Elicitation,
            method: "elicitation/create".into(),
            params: json!({}),
        };
        let reply = Input::default().ask(question.clone()).await;
        assert!(matches!(reply, InputReply::Declined(ref why) if why.contains("relays no questions")));
        let input = Input::new(|request| {
            Box::pin(async move { InputReply::Answered(json!({"asked": request.method})) })
        });
        assert!(input.is_relayed());
        assert_eq!(input.ask(question).await, InputReply::Answered(json!({"asked": "elicitation/create"})));
    }
}
