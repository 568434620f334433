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

mod catalog;
mod host_access;
mod ovos;
mod registry;
mod settings;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolhost_bus::{Bus, Keys};
use toolhost_mcp::{Children, McpEvent, McpServerConfig, McpSources};
use toolhost_tools::terminal::Limits;
use toolhost_tools::{Registry, SharedRegistry, Tool, ToolLimits};

pub(crate) use registry::{build_registry, limit_settings};
pub use settings::{ExpandedHeaders, SourceSections, ToolsSection};
pub(crate) use settings::{OvosHosting, Settings};
use tracing::{error, info, warn};

use crate::publish::Publisher;
use crate::telemetry::Telemetry;

/// How often the sources' states are copied to `/status` and the metrics.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// The daemon's tool sources and its registry.
pub(crate) struct Sources {
    bus: Arc<dyn Bus>,
    keys: Keys,
    registry: Arc<SharedRegistry>,
    limits: Arc<ToolLimits>,
    publisher: Arc<Publisher>,
    telemetry: Telemetry,
    /// The settings the registry is built from (the last ones loaded successfully).
    settings: Mutex<Settings>,
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
    /// Who wants which resource's updates, until when (`sources/catalog.rs`).
    leases: catalog::Leases,
}

/// One running MCP server.
struct Hosted {
    config: McpServerConfig,
    sources: McpSources,
    stop: CancellationToken,
}

impl Sources {
    /// The sources of `settings`, publishing through `publisher`; the receiver gets every MCP
    /// server's events, for [`Sources::run`].
    pub(crate) fn new(
        settings: Settings,
        bus: Arc<dyn Bus>,
        keys: Keys,
        registry: Arc<SharedRegistry>,
        limits: Arc<ToolLimits>,
        publisher: Arc<Publisher>,
        telemetry: Telemetry,
    ) -> (Arc<Sources>, mpsc::UnboundedReceiver<McpEvent>) {
        let (events, receiver) = mpsc::unbounded_channel();
        let grace = settings.grace;
        let sources = Sources {
            bus,
            keys,
            registry,
            limits,
            publisher,
            telemetry,
            settings: Mutex::new(settings),
            hosted: tokio::sync::Mutex::new(BTreeMap::new()),
            ovos: Mutex::new(None),
            events,
            stop: CancellationToken::new(),
            grace,
            leases: catalog::Leases::default(),
        };
        (Arc::new(sources), receiver)
    }

    fn settings(&self) -> Settings {
        self.settings.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Starts the configured MCP servers and builds the registry with their tools.
    ///
    /// # Errors
    /// Two servers (or a server and another tool) serve the same tool name.
    pub(crate) async fn start(&self) -> anyhow::Result<()> {
        let settings = self.settings();
        let ovos = ovos::OvosSource::start(
            &settings.ovos,
            &settings.toolbox_id,
            self.events.clone(),
            self.stop.child_token(),
        )
        .await;
        *self.ovos.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = ovos.map(Arc::new);
        let stopped = self.reconcile(&settings).await?;
        self.rebuild(&settings).await?;
        self.retire(stopped, None);
        Ok(())
    }

    /// Starts, stops or restarts MCP servers so the running ones are `settings`'. Returns the
    /// servers taken out, to stop once no call uses them ([`Sources::retire`]).
    async fn reconcile(&self, settings: &Settings) -> anyhow::Result<Vec<Hosted>> {
        let mut hosted = self.hosted.lock().await;
        let retired = take_stale(&mut hosted, settings);
        for old in &retired {
            info!(source = %old.config.name, "MCP server removed or changed; stopping it once its calls end");
        }
        let children = Children {
            limits: Limits::from_settings(&settings.tools.terminal),
            run_as: settings.terminal_identity,
        };
        for server in &settings.sections.mcp_servers {
            if hosted.contains_key(&server.name) {
                continue;
            }
            let stop = self.stop.child_token();
            let started =
                McpSources::start(std::slice::from_ref(server), &settings.env.0, children, stop.clone())
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
        let started = take_stale(hosted, &self.settings());
        for old in retired {
            hosted.insert(old.config.name.clone(), old);
        }
        self.retire(started, None);
    }

    /// Builds the registry from `settings` and every hosted server's tools, swaps it in, updates
    /// the limits and republishes the registry. Returns the snapshot it replaced.
    async fn rebuild(&self, settings: &Settings) -> anyhow::Result<Arc<Registry>> {
        let mut hosted_tools: Vec<Arc<dyn Tool>> =
            self.hosted.lock().await.values().flat_map(|hosted| hosted.sources.tools()).collect();
        if let Some(ovos) = self.ovos() {
            hosted_tools.extend(ovos.tools());
        }
        let registry = build_registry(settings, &self.bus, &self.keys, &hosted_tools)?;
        self.limits.update(limit_settings(settings, &registry));
        let old = self.registry.replace(registry);
        self.publisher.set_catalog(self.catalog_fields().await);
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

    /// Applies newly loaded tool settings, live.
    ///
    /// # Errors
    /// The new MCP servers collide, or the registry does not build; nothing changed then.
    pub(crate) async fn reload(&self, new: Settings) -> anyhow::Result<()> {
        let retired = self.reconcile(&new).await?;
        let replaced = match self.rebuild(&new).await {
            Ok(replaced) => replaced,
            Err(err) => {
                self.restore(&mut *self.hosted.lock().await, retired);
                return Err(err);
            }
        };
        self.retire(retired, Some(replaced));
        *self.settings.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = new;
        Ok(())
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
                _ = tick.tick() => {
                    self.report().await;
                    self.expire_leases().await;
                }
                event = events.recv() => match event {
                    Some(McpEvent::ToolsChanged { source }) => {
                        info!(source = %source, "a hosted source's tools changed; rebuilding the registry");
                        let settings = self.settings();
                        if let Err(err) = self.rebuild(&settings).await {
                            error!(error = %format!("{err:#}"), source = %source, "new tool list refused; the old registry keeps serving");
                            self.telemetry.reloaded(false);
                        }
                    }
                    Some(McpEvent::CatalogChanged { source }) => {
                        info!(source = %source, "a hosted source's resources or prompts changed; republishing them");
                        self.publish_catalog().await;
                    }
                    Some(McpEvent::ResourceUpdated { source, uri }) => self.resource_updated(&source, &uri).await,
                    Some(McpEvent::Up { source }) => info!(source = %source, "hosted source up"),
                    Some(McpEvent::Down { source, error }) => {
                        warn!(source = %source, error = %error, "hosted source down; its tools answer overloaded");
                    }
                    None => return,
                },
            }
        }
    }

    /// The catalog hash's fields from every hosted MCP server, by server name: a URI, template
    /// or prompt name two servers of this toolbox list is served by the first name's server,
    /// with a warning.
    async fn catalog_fields(&self) -> Vec<(String, String)> {
        let hosted = self.hosted.lock().await;
        let mut fields: BTreeMap<String, (String, String)> = BTreeMap::new();
        for (source, catalog) in hosted.values().flat_map(|hosted| hosted.sources.catalog()) {
            for (key, item) in catalog.entries() {
                match fields.get(&key) {
                    Some((first, _)) => {
                        warn!(entry = %key, first = %first, second = %source, "two hosted MCP servers list the same resource or prompt; the first serves it");
                    }
                    None => {
                        fields.insert(key, (source.clone(), item.to_string()));
                    }
                }
            }
        }
        fields.into_iter().map(|(key, (_, item))| (key, item)).collect()
    }

    /// Publishes the hosted servers' catalog again.
    async fn publish_catalog(&self) {
        self.publisher.set_catalog(self.catalog_fields().await);
        if let Err(err) = self.publisher.write_catalog().await {
            warn!(error = %err, "cannot publish the resources and prompts yet; the next republish will");
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

/// Takes out of `hosted` every server that `settings` does not have as it runs: removed, or
/// with other settings.
fn take_stale(hosted: &mut BTreeMap<String, Hosted>, settings: &Settings) -> Vec<Hosted> {
    let wanted: BTreeMap<&str, &McpServerConfig> =
        settings.sections.mcp_servers.iter().map(|server| (server.name.as_str(), server)).collect();
    let stale: Vec<String> = hosted
        .iter()
        .filter(|(name, running)| wanted.get(name.as_str()).is_none_or(|server| **server != running.config))
        .map(|(name, _)| name.clone())
        .collect();
    stale.into_iter().filter_map(|name| hosted.remove(&name)).collect()
}
