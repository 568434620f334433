//! The registry built from the tool settings: built-in tools, synthetic ones, the configured
//! specialist agents, `[[commands]]`, `[[http_tools]]`, and the hosted sources' tools; and the
//! per-tool limits beside it.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context as _;
use toolhost_bus::{Bus, Keys};
use toolhost_settings::{ConfigError, KeyError};
use toolhost_tools::builtin::{AgentSettings, AgentTool, ChatSend, Echo, Synthetic, TerminalRun};
use toolhost_tools::sources::FieldError;
use toolhost_tools::sources::command::CommandTool;
use toolhost_tools::sources::http::HttpTool;
use toolhost_tools::terminal::TerminalPolicy;
use toolhost_tools::{DEFAULT_MAX_QUEUE, LimitSettings, Registry, Tool};
use tracing::{info, warn};

use super::Settings;
use super::host_access;

/// The registry of `settings`' tools (built-ins, synthetic ones, the configured specialist
/// agents, the `[[commands]]` and `[[http_tools]]` sources) and of the hosted sources'
/// (`hosted`); `bus` and `keys` serve the chat tools.
///
/// `tools.disabled` and `tools.limits` may name tools of an MCP server: while MCP servers are
/// configured, a name no tool has yet is logged rather than refused, since the server may be
/// down or not yet listed.
///
/// # Errors
/// A tool cannot be registered, or a disabled tool name is unknown, or two tools share a name
/// (a [`ConfigError`] naming every such key, so `main` exits 64 for it).
pub(crate) fn build_registry(
    settings: &Settings,
    bus: &Arc<dyn Bus>,
    keys: &Keys,
    hosted: &[Arc<dyn Tool>],
) -> anyhow::Result<Registry> {
    let mut registry = Registry::new();
    registry.register(Arc::new(Echo))?;
    let (policy, warnings) = TerminalPolicy::new(&settings.tools.terminal);
    for warning in warnings {
        warn!(warning = %warning, "terminal policy");
    }
    // Commands must not print the daemon's own secrets, and a root daemon's commands run as an
    // unprivileged user (resolved once, when the configuration was loaded).
    let policy = policy.with_secrets(&settings.secrets).with_identity(settings.terminal_identity);
    match settings.terminal_identity {
        Some(identity) => info!(uid = identity.uid, gid = identity.gid, "terminal commands run as"),
        None => info!("terminal commands run as the daemon's own user"),
    }
    registry.register(Arc::new(TerminalRun::new(policy.clone())))?;
    let chat_send =
        ChatSend::new(bus.clone(), keys.clone(), &settings.agent_name, &settings.chat_conversation_id);
    registry.register(Arc::new(chat_send))?;
    for (index, agent) in settings.sections.agents.iter().enumerate() {
        let agent_settings = AgentSettings {
            name: agent.name.clone(),
            description: agent.description.clone(),
            parameter: agent.parameter.clone(),
            timeout: std::time::Duration::from_secs_f64(agent.timeout_s),
        };
        let tool = AgentTool::new(bus.clone(), keys.clone(), &settings.agent_name, agent_settings);
        registry.register(Arc::new(tool)).with_context(|| format!("agents[{index}]"))?;
    }
    for index in 0..settings.synthetic_tools {
        registry.register(Arc::new(Synthetic::new(index)))?;
    }
    let mut errors = Vec::new();
    register_sources(settings, &policy, &mut registry, &mut errors);
    for tool in hosted {
        if let Err(err) = registry.register(tool.clone()) {
            errors.push(KeyError { key: "mcp_servers".to_owned(), message: err.to_string() });
        }
    }
    let lenient = !settings.sections.mcp_servers.is_empty();
    let mut unknown_name = |key: String, message: String| {
        if lenient {
            warn!(key = %key, "{message}; an MCP server may list it later");
        } else {
            errors.push(KeyError { key, message });
        }
    };
    let long_running: Vec<String> = settings
        .tools
        .limits
        .iter()
        .filter(|(_, section)| section.long_running)
        .map(|(name, _)| name.clone())
        .collect();
    registry.mark_long_running(&long_running);
    let unknown = registry.disable(&settings.tools.disabled);
    if !unknown.is_empty() {
        unknown_name("tools.disabled".to_owned(), format!("names unknown tools: {}", unknown.join(", ")));
    }
    for name in settings.tools.limits.keys().filter(|name| !registry.contains(name)) {
        unknown_name(format!("tools.limits.{name}"), "no tool has this name".to_owned());
    }
    errors.extend(host_access::problems(settings));
    if !errors.is_empty() {
        return Err(ConfigError(errors).into());
    }
    Ok(registry)
}

/// Registers the `[[commands]]` and `[[http_tools]]` tools. A name that another tool has is an
/// error naming both places; so is a source that does not build (the configuration checked it
/// already, so that only happens if a schema file changed in between).
fn register_sources(
    settings: &Settings,
    policy: &TerminalPolicy,
    registry: &mut Registry,
    errors: &mut Vec<KeyError>,
) {
    let mut origins: BTreeMap<String, String> =
        registry.names().into_iter().map(|name| (name.to_owned(), "a built-in tool".to_owned())).collect();
    for (index, agent) in settings.sections.agents.iter().enumerate() {
        origins.insert(agent.name.clone(), format!("agents[{index}]"));
    }
    let mut tools: Vec<(String, Arc<dyn Tool>)> = Vec::new();
    let mut add = |place: String, tool: Result<Arc<dyn Tool>, Vec<FieldError>>| match tool {
        Ok(tool) => tools.push((place, tool)),
        Err(found) => errors.extend(
            found
                .into_iter()
                .map(|error| KeyError { key: format!("{place}.{}", error.field), message: error.message }),
        ),
    };
    for (index, command) in settings.sections.commands.iter().enumerate() {
        let tool = CommandTool::new(command, policy).map(|tool| Arc::new(tool) as Arc<dyn Tool>);
        add(format!("commands[{index}]"), tool);
    }
    let secrets = &settings.secrets;
    match toolhost_tools::sources::http::client() {
        Ok(client) => {
            for (index, tool_settings) in settings.sections.http_tools.iter().enumerate() {
                let headers = settings.http_headers.of(index);
                let tool = HttpTool::new(tool_settings, headers, client.clone(), secrets)
                    .map(|tool| Arc::new(tool) as Arc<dyn Tool>);
                add(format!("http_tools[{index}]"), tool);
            }
        }
        Err(message) if !settings.sections.http_tools.is_empty() => add(
            "http_tools".to_owned(),
            Err(vec![FieldError {
                field: "client".to_owned(),
                message: format!("cannot build an HTTP client: {message}"),
            }]),
        ),
        Err(_) => {}
    }
    for (place, tool) in tools {
        let name = tool.spec().name;
        if let Some(other) = origins.get(&name) {
            errors.push(KeyError {
                key: format!("{place}.name"),
                message: format!("tool '{name}' is also defined by {other}"),
            });
            continue;
        }
        origins.insert(name, place.clone());
        if let Err(err) = registry.register(tool) {
            errors.push(KeyError { key: place, message: err.to_string() });
        }
    }
}

/// The per-tool limits: each tool's own `max_concurrent` (the terminal's setting, for one),
/// overridden by `[tools.limits."<name>"]`, with a queue of [`DEFAULT_MAX_QUEUE`] unless set.
pub(crate) fn limit_settings(settings: &Settings, registry: &Registry) -> BTreeMap<String, LimitSettings> {
    let configured = &settings.tools.limits;
    let mut limits: BTreeMap<String, LimitSettings> = registry
        .spec_limits()
        .into_iter()
        .map(|(name, max_concurrent)| (name, LimitSettings { max_concurrent, max_queue: DEFAULT_MAX_QUEUE }))
        .collect();
    for (name, section) in configured {
        let spec = limits.get(name).copied();
        let Some(max_concurrent) = section.max_concurrent.or(spec.map(|limit| limit.max_concurrent)) else {
            // A queue length alone limits nothing: the tool runs unlimited.
            continue;
        };
        let max_queue = section.max_queue.unwrap_or(DEFAULT_MAX_QUEUE);
        limits.insert(name.clone(), LimitSettings { max_concurrent, max_queue });
    }
    limits
}
