//! `logging/setLevel` and `notifications/message` for the `initialize` generations: a hosted
//! tool's log entries (`<answer type>.log`) reach the MCP client that made the call, at or
//! above the level its session set.
//!
//! Logging is deprecated in MCP 2026-07-28 (SEP-2577), whose requests carry their level in
//! `_meta` instead; this serves the generations that have `logging/setLevel`.

use std::sync::{Arc, Mutex};

use rmcp::model::ErrorData as McpError;
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam, SetLevelRequestParams};
use tracing::debug;

use super::handler::Session;
use crate::fleet_client::LogMessage;

/// The level a session set; before `logging/setLevel`, every message the tool sent is passed on
/// (MCP leaves the choice to the server, and the hosted server chose to send them).
#[derive(Clone, Default)]
pub(crate) struct SessionLevel(Arc<Mutex<Option<u8>>>);

impl SessionLevel {
    /// Whether a message at `level` (MCP's name) is sent to this session; an unknown name is
    /// sent as an error is.
    pub(crate) fn admits(&self, level: &str) -> bool {
        let floor = *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        floor.is_none_or(|floor| severity(level).unwrap_or(ERROR) >= floor)
    }

    fn set(&self, level: u8) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(level);
    }
}

/// The severity of `error`, for a level name no MCP revision has.
const ERROR: u8 = 4;

/// RFC 5424's order of MCP's level names, `debug` lowest.
fn severity(level: &str) -> Option<u8> {
    let names = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];
    names.iter().position(|name| *name == level).and_then(|index| u8::try_from(index).ok())
}

#[allow(deprecated)]
fn level_of(name: &str) -> Option<LoggingLevel> {
    serde_json::from_value(serde_json::Value::String(name.to_owned())).ok()
}

impl Session {
    /// `logging/setLevel`: this session's messages from now on are those at or above `level`.
    #[allow(deprecated)]
    pub(super) fn set_log_level(&self, request: SetLevelRequestParams) -> Result<(), McpError> {
        let name =
            serde_json::to_value(request.level).ok().and_then(|value| value.as_str().map(str::to_owned));
        let Some(level) = name.as_deref().and_then(severity) else {
            return Err(McpError::invalid_params("unknown logging level", None));
        };
        debug!(level = name.as_deref().unwrap_or_default(), "MCP session set its logging level");
        self.log_level.set(level);
        Ok(())
    }
}

/// The `notifications/message` of a call's log entry, when `level` admits it.
#[allow(deprecated)]
pub(crate) fn notification(
    level: &SessionLevel,
    message: LogMessage,
) -> Option<LoggingMessageNotificationParam> {
    if !level.admits(&message.level) {
        return None;
    }
    let mut param = LoggingMessageNotificationParam::new(level_of(&message.level)?, message.data);
    param.logger = message.logger;
    Some(param)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn message(level: &str) -> LogMessage {
        LogMessage { level: level.to_owned(), logger: Some("db".to_owned()), data: json!({"rows": 3}) }
    }

    #[test]
    fn messages_at_or_above_the_sessions_level_are_sent() {
        let level = SessionLevel::default();
        assert!(notification(&level, message("debug")).is_some(), "before setLevel, every message");
        level.set(severity("warning").unwrap());
        assert!(notification(&level, message("info")).is_none());
        let sent = notification(&level, message("error")).unwrap();
        assert_eq!(
            serde_json::to_value(&sent).unwrap(),
            json!({"level": "error", "logger": "db", "data": {"rows": 3}})
        );
        assert!(level.admits("made-up"), "an unknown level counts as an error");
        assert!(notification(&level, message("made-up")).is_none(), "but has no MCP form");
    }
}
