//! The tools toolhost ships, one file each.

mod agent;
mod chat_send;
mod echo;
mod synthetic;
mod terminal_run;

pub use agent::{AgentSettings, AgentTool, CONVERSATION_ID};
pub use chat_send::{BAD_RECIPIENT, ChatSend, EMPTY_CONTENT, NO_CONVERSATION, Route, route};
pub use echo::Echo;
pub use synthetic::Synthetic;
pub use terminal_run::TerminalRun;
