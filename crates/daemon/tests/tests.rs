//! Integration tests of the `toolhost` binary and daemon against real redis-server processes.

// A failed unwrap in a test is a test failure with its message; that is what tests want.
#![allow(clippy::unwrap_used)]

/// Shared harness: redis-server and toolhost processes.
mod support;

/// The walking skeleton: requests in, exactly one answer out, bad input dead-lettered.
mod skeleton;

/// Chat: chat_send, tool calls by chat message on `chat:<AGENT_NAME>`, specialist agents as tools.
mod chat;

/// Tools as contracts: validation, misbehaving tools, discovery formats, the CLI client.
mod contract;

/// Operating it: health, readiness, metrics, configuration errors, secrets, dead letters, deploy files.
mod ops;

/// House rules over the workspace's source files.
mod tidy;

/// Issue 6: exactly one answer per request under kills, pauses, restarts and duplicate deliveries.
mod reliability;

/// Golden samples of the wire output, metric names and log fields, to hold refactorings to them.
mod golden;

/// Issue 12: response topics, per-tool queues, refusals and retries, hostile names and ids.
mod hardening;

/// terminal_run through the daemon: policy, sandbox, environment, redaction, floods, timeouts.
mod terminal;

/// Issue 12: the HTTP endpoint's connection cap and idle timeout.
mod http_limits;

/// Issue 12, items 1, 3 and 4: undecodable and oversized entries, Redis out of memory.
mod read_faults;

/// Issue 15: `[[commands]]` and `[[http_tools]]` hosted as tools, through the daemon.
mod sources;

/// Issue 13: the caller's first hour: usage errors, closed stdout, TOOLHOST_CONFIG, outages.
mod firsthour;

/// Issue 15: SIGHUP reloads the tool sources live and refuses a configuration that does not load.
mod reload;

/// Issue 15: a real MCP server hosted by the daemon (run by `just test-mcp`).
mod mcp_hosted;

/// Issue 16: toolboxes sharing one requests stream answer every request once.
mod fleet;

/// `tool.cancel`: running and queued calls stopped and answered once, wherever the cancel is read.
mod cancel;

/// Issue 25: signed requests, tenant policy, rate and in-flight limits, the audit stream.
mod auth;

/// Issue 26: the web console over HTTP: access, escaping, the call log, dead-letter replay.
mod console;
