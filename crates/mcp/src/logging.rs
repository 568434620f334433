//! A server's `notifications/message`, given to the call it belongs to.
//!
//! MCP does not say which request a log message is about, and rmcp hands a client none of what
//! could tell (the stream it came on, over streamable HTTP); over stdio nothing could. So a
//! message goes to the server's one call in flight, when it has exactly one: it then becomes
//! that call's `<answer type>.log` entry. With none or several it goes to toolhost's own log,
//! naming the source, rather than to a caller it may not be about.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use toolhost_tools::{Log, LogReport};
use tracing::info;

/// The calls in flight on one server that relay log messages.
#[derive(Default)]
pub(crate) struct LogRoutes {
    calls: Mutex<HashMap<u64, Log>>,
    next: AtomicU64,
}

/// Keeps a call among the server's calls in flight until dropped.
pub(crate) struct LogRoute<'a> {
    routes: &'a LogRoutes,
    id: u64,
}

impl LogRoutes {
    /// Counts a call in flight, its messages going to `log`, until the guard is dropped.
    pub(crate) fn add(&self, log: Log) -> LogRoute<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.calls).insert(id, log);
        LogRoute { routes: self, id }
    }

    /// Gives `message` of server `source` to its one call in flight, else to toolhost's log.
    // Logging is deprecated in MCP 2026-07-28 (SEP-2577); servers of the `initialize`
    // generations still send it.
    #[allow(deprecated)]
    pub(crate) fn deliver(&self, source: &str, message: LoggingMessageNotificationParam) {
        let report = report_of(message);
        let only = {
            let calls = lock(&self.calls);
            if calls.len() == 1 { calls.values().next().cloned() } else { None }
        };
        match only {
            Some(log) if log.is_relayed() => log.report(report),
            _ => info!(
                source,
                level = %report.level,
                logger = report.logger.as_deref().unwrap_or_default(),
                data = %report.data,
                "MCP server log message, not tied to one call"
            ),
        }
    }
}

impl Drop for LogRoute<'_> {
    fn drop(&mut self) {
        lock(&self.routes.calls).remove(&self.id);
    }
}

#[allow(deprecated)]
fn report_of(message: LoggingMessageNotificationParam) -> LogReport {
    LogReport { level: level_name(message.level).to_owned(), logger: message.logger, data: message.data }
}

/// MCP's name of a level.
#[allow(deprecated)]
pub(crate) fn level_name(level: LoggingLevel) -> &'static str {
    match level {
        LoggingLevel::Debug => "debug",
        LoggingLevel::Info => "info",
        LoggingLevel::Notice => "notice",
        LoggingLevel::Warning => "warning",
        LoggingLevel::Error => "error",
        LoggingLevel::Critical => "critical",
        LoggingLevel::Alert => "alert",
        LoggingLevel::Emergency => "emergency",
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, deprecated)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    #[test]
    fn a_message_goes_to_the_one_call_in_flight_and_to_no_call_of_several() {
        let routes = LogRoutes::default();
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = |got: &Arc<Mutex<Vec<LogReport>>>| {
            let got = got.clone();
            Log::new(move |report| got.lock().unwrap().push(report))
        };
        let message = |text: &str| LoggingMessageNotificationParam::new(LoggingLevel::Warning, json!(text));
        routes.deliver("s", message("nobody"));
        let first = routes.add(sink(&got));
        routes.deliver("s", message("one"));
        let second = routes.add(sink(&got));
        routes.deliver("s", message("two calls"));
        drop(first);
        routes.deliver("s", message("the second alone"));
        drop(second);
        let got = got.lock().unwrap();
        let texts: Vec<_> = got.iter().map(|report| report.data.clone()).collect();
        assert_eq!(texts, [json!("one"), json!("the second alone")]);
        assert_eq!(got[0].level, "warning");
    }
}
