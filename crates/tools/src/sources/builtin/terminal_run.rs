//! `terminal_run`: one allowed command, without a shell, under the terminal policy.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use toolhost_envelope::Annotations;

use crate::terminal::{Refusal, TerminalPolicy, run};
use crate::{Context, Tool, ToolError, ToolSpec};

/// Runs commands under a [`TerminalPolicy`].
#[derive(Debug, Clone)]
pub struct TerminalRun {
    policy: TerminalPolicy,
}

impl TerminalRun {
    /// The tool under `policy`.
    pub fn new(policy: TerminalPolicy) -> TerminalRun {
        TerminalRun { policy }
    }
}

#[async_trait]
impl Tool for TerminalRun {
    fn spec(&self) -> ToolSpec {
        let settings = self.policy.settings();
        let allowed = if settings.allowed_commands.is_empty() {
            "No command is allowed on this host.".to_owned()
        } else {
            format!("Allowed programs: {}.", settings.allowed_commands.join(", "))
        };
        let mut spec = ToolSpec::new(
            "terminal_run",
            &format!(
                "Run one command on the host without a shell (no pipes, redirection or variables) and \
                 return its combined output. {allowed}"
            ),
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "minLength": 1, "description": "The command line, split like a shell would (quotes respected)."},
                    "cwd": {"type": "string", "description": "Working directory, relative to the sandbox root."},
                },
                "required": ["command"],
                "additionalProperties": false,
            }),
            json!({
                "type": "object",
                "properties": {
                    "ok": {"type": "boolean"},
                    "exit_code": {"type": ["integer", "null"]},
                    "timeout": {"type": "boolean"},
                    "truncated": {"type": "boolean"},
                    "duration_ms": {"type": "integer", "minimum": 0},
                    "output": {"type": "string"},
                    "summary": {"type": "string"},
                },
                "required": ["ok", "exit_code", "timeout", "truncated", "duration_ms", "output", "summary"],
                "additionalProperties": false,
            }),
        );
        spec.annotations = Annotations { read_only: false, idempotent: false, destructive: true };
        // The engine enforces the policy timeout itself and reports `timeout: true`; this outer
        // limit only backs it up.
        spec.timeout = Duration::from_secs_f64(settings.timeout_seconds) + Duration::from_secs(5);
        spec.max_concurrent = Some(settings.max_concurrent);
        spec
    }

    async fn call(&self, arguments: Value, _context: &Context) -> Result<Value, ToolError> {
        let command = arguments.get("command").and_then(Value::as_str).unwrap_or_default();
        let cwd = arguments.get("cwd").and_then(Value::as_str);
        match run(&self.policy, command, cwd).await {
            Ok(outcome) => serde_json::to_value(outcome).map_err(|err| ToolError::Failed(err.to_string())),
            Err(refusal) => Err(refusal_error(refusal)),
        }
    }
}

fn refusal_error(refusal: Refusal) -> ToolError {
    let message = refusal.to_string();
    if refusal.is_forbidden() {
        ToolError::Forbidden(message)
    } else if matches!(refusal, Refusal::SpawnFailed(_)) {
        ToolError::Failed(message)
    } else {
        ToolError::InvalidArguments(message)
    }
}
