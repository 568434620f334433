//! The tool sources of a running daemon, and how their registry is kept current.
//!
//! The registry is built from the configuration (built-ins, `[[agents]]`, `[[commands]]`,
//! `[[http_tools]]`) plus the tools of the hosted MCP servers (`[[mcp_servers]]`) and of the
//! hosted OVOS toolboxes (`[ovos] host_toolboxes`, [`ovos`]), and swapped whole
//! ([`SharedRegistry`]) when:
//!
//! - an MCP server's or an OVOS toolbox's tools change (`list_changed`, a restart, a new
//!   discovery response);
//! - the configuration is reloaded (SIGHUP): MCP servers that were added, removed or changed
//!   are started, stopped or restarted, the others keep running; a configuration that does not
//!   load, or a registry that does not build, is refused whole and the old one keeps serving.
//!
//! Calls that started before a swap finish on the tools they started with: a removed or changed
//! server is stopped only once no call holds the snapshot it served in (or the shutdown grace
//! has passed). Limits and statistics live outside the snapshot, so a swap never resets them.

mod ovos;
mod settings;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolhost_bus::{Bus, Keys};
use toolhost_mcp::{Children, McpEvent, McpServerConfig, McpSources};
use toolhost_tools::terminal::Limits;
use toolhost_tools::{Registry, SharedRegistry, Tool, ToolLimits};

pub use settings::{ExpandedHeaders, SourceSections, ToolsSection};
use tracing::{error, info, warn};

use crate::config::{Config, RawConfig};
use crate::publish::Publisher;
use crate::serve::{ServeOptions, build_registry_with, limit_settings};
use crate::telemetry::Telemetry;

/// How often the sources' states are copied to `/status` and the metrics.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// The daemon's tool sources and its registry.
pub(crate) struct Sources {
    options: ServeOptions,
    bus: Arc<dyn Bus>,
    keys: Keys,
    registry: Arc<SharedRegistry>,
    limits: Arc<ToolLimits>,
    publisher: Arc<Publisher>,
    telemetry: Telemetry,
    /// The configuration the registry is built from (the last one loaded successfully).
    config: Mutex<Config>,
    /// The running MCP servers, by name.
    hosted: tokio::sync::Mutex<BTreeMap<String, Hosted>>,
    /// The hosted OVOS toolboxes, when `[ovos] host_toolboxes` names any (started once; the
    /// `[ovos]` section applies after a restart).
    ovos: Mutex<Option<Arc<ovos::OvosSource>>>,
    /// Where every server's events go.
    events: mpsc::UnboundedSender<McpEvent>,
    /// Parent of every server's stop token.
    stop: CancellationToken,
    /// How long a removed server waits for the calls still using it.
    grace: Duration,
}

/// One running MCP server.
struct Hosted {
    config: McpServerConfig,
    sources: McpSources,
    stop: CancellationToken,
}

/// What a reload did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Reloaded {
    /// Settings that changed but only apply after a restart, by key.
    pub needs_restart: Vec<String>,
}

impl Sources {
    /// The sources of `config`, publishing through `publisher`; the receiver gets every MCP
    /// server's events, for [`Sources::run`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: Config,
        options: ServeOptions,
        bus: Arc<dyn Bus>,
        keys: Keys,
        registry: Arc<SharedRegistry>,
        limits: Arc<ToolLimits>,
        publisher: Arc<Publisher>,
        telemetry: Telemetry,
    ) -> (Arc<Sources>, mpsc::UnboundedReceiver<McpEvent>) {
        let (events, receiver) = mpsc::unbounded_channel();
        let grace = config.shutdown_grace;
        let sources = Sources {
            options,
            bus,
            keys,
            registry,
            limits,
            publisher,
            telemetry,
            config: Mutex::new(config),
            hosted: tokio::sync::Mutex::new(BTreeMap::new()),
            ovos: Mutex::new(None),
            events,
            stop: CancellationToken::new(),
            grace,
        };
        (Arc::new(sources), receiver)
    }

    fn config(&self) -> Config {
        self.config.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Starts the configured MCP servers and builds the registry with their tools.
    ///
    /// # Errors
    /// Two servers (or a server and another tool) serve the same tool name.
    pub(crate) async fn start(&self) -> anyhow::Result<()> {
        let config = self.config();
        let ovos = ovos::OvosSource::start(
            &config.raw.doors.ovos,
            &config.raw.daemon.toolbox_id,
            self.events.clone(),
            self.stop.child_token(),
        )
        .await;
        *self.ovos.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = ovos.map(Arc::new);
        let stopped = self.reconcile(&config).await?;
        self.rebuild(&config).await?;
        self.retire(stopped, None);
        Ok(())
    }

    /// Starts, stops or restarts MCP servers so the running ones are `config`'s. Returns the
    /// servers taken out, to stop once no call uses them ([`Sources::retire`]).
    async fn reconcile(&self, config: &Config) -> anyhow::Result<Vec<Hosted>> {
        let mut hosted = self.hosted.lock().await;
        let retired = take_stale(&mut hosted, config);
        for old in &retired {
            info!(source = %old.config.name, "MCP server removed or changed; stopping it once its calls end");
        }
        let children = Children {
            limits: Limits::from_settings(&config.raw.tools.terminal),
            run_as: config.terminal_identity,
        };
        for server in &config.raw.sources.mcp_servers {
            if hosted.contains_key(&server.name) {
                continue;
            }
            let stop = self.stop.child_token();
            let started =
                McpSources::start(std::slice::from_ref(server), &config.mcp_env.0, children, stop.clone())
                    .await;
            let started = match started {
                Ok(started) => started,
                Err(err) => {
                    stop.cancel();
                    self.restore(&mut hosted, retired);
                    return Err(anyhow::anyhow!("mcp_servers: {err}"));
                }
            };
            let (events, mut receiver) = (self.events.clone(), started.events);
            tokio::spawn(async move {
                while let Some(event) = receiver.recv().await {
                    if events.send(event).is_err() {
                        return;
                    }
                }
            });
            info!(source = %server.name, tools = started.sources.tools().len(), "MCP server hosted");
            hosted.insert(
                server.name.clone(),
                Hosted { config: server.clone(), sources: started.sources, stop },
            );
        }
        Ok(retired)
    }

    /// Undoes a [`Sources::reconcile`] whose configuration is refused: the servers it started
    /// are stopped, and the `retired` ones it took out (still running) serve again, as the
    /// configuration in force has them.
    fn restore(&self, hosted: &mut BTreeMap<String, Hosted>, retired: Vec<Hosted>) {
        let started = take_stale(hosted, &self.config());
        for old in retired {
            hosted.insert(old.config.name.clone(), old);
        }
        self.retire(started, None);
    }

    /// Builds the registry from `config` and every hosted server's tools, swaps it in, updates
    /// the limits and republishes the registry. Returns the snapshot it replaced.
    async fn rebuild(&self, config: &Config) -> anyhow::Result<Arc<Registry>> {
        let mut hosted_tools: Vec<Arc<dyn Tool>> =
            self.hosted.lock().await.values().flat_map(|hosted| hosted.sources.tools()).collect();
        if let Some(ovos) = self.ovos() {
            hosted_tools.extend(ovos.tools());
        }
        let registry = build_registry_with(config, &self.options, &self.bus, &self.keys, &hosted_tools)?;
        self.limits.update(limit_settings(config, &registry));
        let old = self.registry.replace(registry);
        if let Err(err) = self.publisher.publish_once(&self.publisher.fields()).await {
            warn!(error = %err, "cannot republish the tool registry yet; the heartbeat will");
        }
        info!(tools = %self.registry.snapshot().names().join(","), "tool registry replaced");
        Ok(old)
    }

    /// Stops `retired` servers once no call holds `snapshot` (the registry they served in), or
    /// after the grace period; children are killed and waited for.
    fn retire(&self, retired: Vec<Hosted>, snapshot: Option<Arc<Registry>>) {
        if retired.is_empty() {
            return;
        }
        let grace = self.grace;
        tokio::spawn(async move {
            if let Some(snapshot) = snapshot {
                let deadline = tokio::time::Instant::now() + grace;
                while Arc::strong_count(&snapshot) > 1 && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            for old in retired {
                old.stop.cancel();
                old.sources.stopped().await;
                info!(source = %old.config.name, "MCP server stopped");
            }
        });
    }

    /// Applies a newly loaded configuration: the tool settings live, the others reported as
    /// needing a restart.
    ///
    /// # Errors
    /// The new MCP servers collide, or the registry does not build; nothing changed then.
    pub(crate) async fn reload(&self, new: Config) -> anyhow::Result<Reloaded> {
        let old = self.config();
        let needs_restart = restart_only_changes(&old.raw, &new.raw);
        let retired = self.reconcile(&new).await?;
        let replaced = match self.rebuild(&new).await {
            Ok(replaced) => replaced,
            Err(err) => {
                self.restore(&mut *self.hosted.lock().await, retired);
                return Err(err);
            }
        };
        self.retire(retired, Some(replaced));
        *self.config.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = new;
        Ok(Reloaded { needs_restart })
    }

    /// Follows the MCP servers' events (rebuilding the registry when tools change) and copies
    /// their states to `/status` and the metrics, until `stopping` fires.
    pub(crate) async fn run(
        self: Arc<Self>,
        mut events: mpsc::UnboundedReceiver<McpEvent>,
        stopping: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(STATUS_EVERY);
        loop {
            tokio::select! {
                () = stopping.cancelled() => return,
                _ = tick.tick() => self.report().await,
                event = events.recv() => match event {
                    Some(McpEvent::ToolsChanged { source }) => {
                        info!(source = %source, "a hosted source's tools changed; rebuilding the registry");
                        let config = self.config();
                        if let Err(err) = self.rebuild(&config).await {
                            error!(error = %format!("{err:#}"), source = %source, "new tool list refused; the old registry keeps serving");
                            self.telemetry.reloaded(false);
                        }
                    }
                    Some(McpEvent::Up { source }) => info!(source = %source, "hosted source up"),
                    Some(McpEvent::Down { source, error }) => {
                        warn!(source = %source, error = %error, "hosted source down; its tools answer overloaded");
                    }
                    None => return,
                },
            }
        }
    }

    /// Copies every hosted server's state to the telemetry.
    async fn report(&self) {
        let hosted = self.hosted.lock().await;
        let mut states: Vec<toolhost_mcp::SourceStatus> =
            hosted.values().flat_map(|hosted| hosted.sources.status()).collect();
        drop(hosted);
        if let Some(ovos) = self.ovos() {
            states.extend(ovos.status());
        }
        let up: Vec<(String, bool)> = states.iter().map(|state| (state.name.clone(), state.up)).collect();
        let details = serde_json::to_value(&states).unwrap_or_else(|_| json!([]));
        self.telemetry.set_sources(&up, details);
    }

    /// The hosted OVOS toolboxes, if any.
    fn ovos(&self) -> Option<Arc<ovos::OvosSource>> {
        self.ovos.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Stops every MCP server (children killed and waited for) and the OVOS source.
    pub(crate) async fn stop(&self) {
        self.stop.cancel();
        if let Some(ovos) = self.ovos() {
            ovos.stop();
        }
        let hosted = std::mem::take(&mut *self.hosted.lock().await);
        for (_, hosted) in hosted {
            hosted.sources.stopped().await;
        }
    }
}

/// Takes out of `hosted` every server that `config` does not have as it runs: removed, or
/// with other settings.
fn take_stale(hosted: &mut BTreeMap<String, Hosted>, config: &Config) -> Vec<Hosted> {
    let wanted: BTreeMap<&str, &McpServerConfig> =
        config.raw.sources.mcp_servers.iter().map(|server| (server.name.as_str(), server)).collect();
    let stale: Vec<String> = hosted
        .iter()
        .filter(|(name, running)| wanted.get(name.as_str()).is_none_or(|server| **server != running.config))
        .map(|(name, _)| name.clone())
        .collect();
    stale.into_iter().filter_map(|name| hosted.remove(&name)).collect()
}

/// The keys of the settings that changed between `old` and `new` but apply only after a
/// restart: everything but the tools (`[tools]`, `[[agents]]`, `[[commands]]`,
/// `[[http_tools]]`, `[[mcp_servers]]`) and `daemon.chat_conversation_id`.
fn restart_only_changes(old: &RawConfig, new: &RawConfig) -> Vec<String> {
    let flat = |raw: &RawConfig| -> BTreeMap<String, Value> {
        let mut value = serde_json::to_value(raw).unwrap_or(Value::Null);
        if let Value::Object(sections) = &mut value {
            for live in ["tools", "agents", "commands", "http_tools", "mcp_servers"] {
                sections.remove(live);
            }
            if let Some(Value::Object(daemon)) = sections.get_mut("daemon") {
                daemon.remove("chat_conversation_id");
            }
        }
        let mut flat = BTreeMap::new();
        if let Value::Object(sections) = value {
            for (section, keys) in sections {
                match keys {
                    Value::Object(keys) => {
                        for (key, value) in keys {
                            flat.insert(format!("{section}.{key}"), value);
                        }
                    }
                    other => {
                        flat.insert(section, other);
                    }
                }
            }
        }
        flat
    };
    let (old, new) = (flat(old), flat(new));
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    keys.into_iter().filter(|key| old.get(*key) != new.get(*key)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn raw(env: &[(&str, &str)]) -> RawConfig {
        let env: HashMap<String, String> =
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Config::load(None, &env).unwrap().raw
    }

    #[test]
    fn tool_settings_apply_live_and_the_others_need_a_restart() {
        let old = raw(&[]);
        let new = raw(&[
            ("TOOLHOST__TOOLS__DISABLED", "echo"),
            ("TERMINAL_ALLOWED_COMMANDS", "ls"),
            ("CHAT_TOOL_CONVERSATION_ID", "c-9"),
            ("REDIS_URL", "redis://127.0.0.1:7000"),
            ("TOOLHOST__DISPATCH__MAX_IN_FLIGHT", "8"),
        ]);
        assert_eq!(restart_only_changes(&old, &new), ["dispatch.max_in_flight", "redis.url"]);
        assert!(restart_only_changes(&old, &old).is_empty());
    }
}
