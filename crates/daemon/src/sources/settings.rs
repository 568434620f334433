//! The tool sources' configuration sections, owned by the sources: `[[agents]]`,
//! `[[commands]]`, `[[http_tools]]` and `[[mcp_servers]]`.
//!
//! Read apart from the rest of the configuration (as the doors' sections are), and checked here
//! the way the registry will build them, so `config` names none of their keys.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolhost_settings::{EnvVars, KeyError, expand_vars};
use toolhost_tools::sources::command::{CommandSettings, CommandTool};
use toolhost_tools::sources::http::{HttpTool, HttpToolSettings};
use toolhost_tools::terminal::{Identity, TerminalPolicy, TerminalSettings};

/// The sources' sections.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSections {
    /// `[[agents]]`: specialist agents exposed as tools.
    #[serde(default)]
    pub agents: Vec<AgentSection>,
    /// `[[commands]]`: command-line programs hosted as tools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<CommandSettings>,
    /// `[[http_tools]]`: HTTP endpoints hosted as tools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_tools: Vec<HttpToolSettings>,
    /// `[[mcp_servers]]`: MCP servers hosted as tool sources (`env` and `headers` values print
    /// masked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<toolhost_mcp::McpServerConfig>,
}

/// One `[[agents]]` entry: a specialist agent exposed as a tool.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct AgentSection {
    pub name: String,
    pub description: String,
    #[serde(default = "default_agent_parameter")]
    pub parameter: String,
    #[serde(default = "default_agent_timeout")]
    pub timeout_s: f64,
}

fn default_agent_parameter() -> String {
    "message".to_owned()
}

fn default_agent_timeout() -> f64 {
    30.0
}

impl SourceSections {
    /// The top-level keys of the sections, as written in the configuration.
    pub const NAMES: &[&str] = &["agents", "commands", "http_tools", "mcp_servers"];

    /// Makes relative schema files relative to `dir`, the directory of the configuration file
    /// that names them.
    pub(crate) fn resolve_relative_paths(&mut self, dir: &Path) {
        let schema_files = self.commands.iter_mut().map(|command| &mut command.argument_schema_file);
        let schema_files =
            schema_files.chain(self.http_tools.iter_mut().map(|tool| &mut tool.argument_schema_file));
        for path in schema_files.flatten().filter(|path| path.is_relative()) {
            *path = dir.join(&*path);
        }
    }

    /// Checks every entry the way the registry will build it, adding each bad key to `errors`,
    /// and expands the HTTP tools' headers from `vars`.
    pub(crate) fn validate(
        &self,
        tools: &ToolsSection,
        vars: &HashMap<String, String>,
        errors: &mut Vec<KeyError>,
    ) -> ExpandedHeaders {
        self.validate_agents(errors);
        let env: std::collections::BTreeMap<String, String> =
            vars.iter().map(|(name, value)| (name.clone(), value.clone())).collect();
        if let Err(found) = toolhost_mcp::config::resolve(&self.mcp_servers, &env) {
            errors
                .extend(found.0.into_iter().map(|error| KeyError { key: error.key, message: error.message }));
        }
        let mut bad = |key: String, message: String| errors.push(KeyError { key, message });
        let (policy, _) = TerminalPolicy::new(&tools.terminal);
        for (index, command) in self.commands.iter().enumerate() {
            for error in CommandTool::new(command, &policy).err().unwrap_or_default() {
                bad(format!("commands[{index}].{}", error.field), error.message);
            }
        }
        let mut expanded = ExpandedHeaders::default();
        let client = (!self.http_tools.is_empty()).then(toolhost_tools::sources::http::client);
        for (index, tool) in self.http_tools.iter().enumerate() {
            let mut headers = Vec::new();
            for (name, template) in &tool.headers {
                match expand_vars(template, |name| vars.get(name).map(String::as_str)) {
                    Ok(value) => {
                        headers.push((name.clone(), value.text));
                        expanded.secrets.extend(value.values);
                    }
                    Err(err) => bad(format!("http_tools[{index}].headers.{name}"), err.to_string()),
                }
            }
            match &client {
                None => {}
                Some(Ok(client)) => {
                    for error in HttpTool::new(tool, &headers, client.clone(), &[]).err().unwrap_or_default()
                    {
                        bad(format!("http_tools[{index}].{}", error.field), error.message);
                    }
                }
                Some(Err(message)) => {
                    bad(format!("http_tools[{index}]"), format!("cannot build an HTTP client: {message}"))
                }
            }
            expanded.per_tool.push(headers);
        }
        expanded.secrets.retain(|secret| !secret.is_empty());
        expanded
    }

    fn validate_agents(&self, errors: &mut Vec<KeyError>) {
        let mut bad = |key: String, message: &str| errors.push(KeyError { key, message: message.to_owned() });
        for (index, agent) in self.agents.iter().enumerate() {
            // The agent becomes a tool of that name, so it follows the tool naming rule.
            if !toolhost_tools::valid_tool_name(&agent.name) {
                bad(
                    format!("agents[{index}].name"),
                    "must be 1-64 of [a-zA-Z0-9_-] (it becomes a tool name)",
                );
            }
            if agent.parameter.is_empty() || agent.parameter == toolhost_tools::builtin::CONVERSATION_ID {
                bad(format!("agents[{index}].parameter"), "must be non-empty and not conversation_id");
            }
            if !(agent.timeout_s.is_finite() && agent.timeout_s > 0.0) {
                bad(format!("agents[{index}].timeout_s"), "must be a positive number");
            }
        }
    }
}

/// `[tools]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ToolsSection {
    #[serde(default)]
    pub disabled: Vec<String>,
    #[serde(default)]
    pub terminal: TerminalSettings,
    /// `[tools.limits."<tool name>"]`: per-tool concurrency limits and wait queues.
    #[serde(default)]
    pub limits: std::collections::BTreeMap<String, ToolLimitSection>,
}

/// One `[tools.limits."<tool name>"]` table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ToolLimitSection {
    /// Calls of the tool running at once; unset keeps the tool's own limit (if any).
    pub max_concurrent: Option<usize>,
    /// Calls waiting for a run slot before more are answered `overloaded`.
    pub max_queue: Option<usize>,
    /// The tool's calls may run long: the MCP door answers them as durable tasks whatever the
    /// tool's timeout (for clients that declare the tasks extension).
    #[serde(default)]
    pub long_running: bool,
}

/// The headers of every `[[http_tools]]` entry after `${VAR}` expansion, and the values the
/// variables gave, which are secrets: `{:?}` prints header names only.
#[derive(Clone, Default)]
pub struct ExpandedHeaders {
    /// Name and expanded value of each header, one list per `[[http_tools]]` entry.
    pub(crate) per_tool: Vec<Vec<(String, String)>>,
    /// What the `${VAR}` references expanded to.
    pub(crate) secrets: Vec<String>,
}

impl ExpandedHeaders {
    /// The headers of `[[http_tools]]` entry `index`.
    pub fn of(&self, index: usize) -> &[(String, String)] {
        self.per_tool.get(index).map_or(&[], Vec::as_slice)
    }
}

impl std::fmt::Debug for ExpandedHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<Vec<&str>> = self
            .per_tool
            .iter()
            .map(|headers| headers.iter().map(|(name, _)| name.as_str()).collect())
            .collect();
        f.debug_struct("ExpandedHeaders").field("names", &names).field("values", &"***").finish()
    }
}

/// What the OVOS tool source needs of `[ovos]` (a section the OVOS door owns): where the bus
/// is and which of its toolboxes to host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OvosHosting {
    /// `[ovos] url`; empty: no bus.
    pub url: String,
    /// `[ovos] max_frame_bytes`.
    pub max_frame_bytes: usize,
    /// `[ovos] host_toolboxes`.
    pub host_toolboxes: Vec<String>,
    /// `[ovos] rediscover_ms`.
    pub rediscover: Duration,
    /// `[ovos] call_timeout_ms`.
    pub call_timeout: Duration,
}

/// What the tool sources and the registry are built from: the tool settings of the
/// configuration, resolved once when it was loaded.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// `[[agents]]`, `[[commands]]`, `[[http_tools]]` and `[[mcp_servers]]`.
    pub sections: SourceSections,
    /// `[tools]`: disabled tools, the terminal, per-tool limits.
    pub tools: ToolsSection,
    /// The name the chat tools speak as (`[daemon] agent_name`).
    pub agent_name: String,
    /// The conversation `chat_send` posts to by default (`[daemon] chat_conversation_id`).
    pub chat_conversation_id: String,
    /// This daemon's toolbox id (never hosted from the OVOS bus).
    pub toolbox_id: String,
    /// Whom terminal commands and stdio MCP servers run as (`None`: the daemon's own user).
    pub terminal_identity: Option<Identity>,
    /// `[[http_tools]] headers`, expanded.
    pub http_headers: ExpandedHeaders,
    /// The daemon's own secrets, kept out of tool output.
    pub secrets: Vec<String>,
    /// The environment hosted MCP servers start from.
    pub env: EnvVars,
    /// How many synthetic benchmark tools to register.
    pub synthetic_tools: usize,
    /// The hosted OVOS toolboxes.
    pub ovos: OvosHosting,
    /// How long a removed MCP server waits for the calls still using it.
    pub grace: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_names_are_the_fields() {
        let sections = SourceSections {
            commands: vec![
                serde_json::from_value(serde_json::json!({"name": "n", "description": "d", "argv": ["x"]}))
                    .unwrap(),
            ],
            ..SourceSections::default()
        };
        let mut names: Vec<String> =
            serde_json::to_value(&sections).unwrap().as_object().unwrap().keys().cloned().collect();
        names.extend(["http_tools".to_owned(), "mcp_servers".to_owned()]);
        names.sort();
        assert_eq!(names, SourceSections::NAMES);
    }
}
