//! MCP servers as tool sources (`[[mcp_servers]]`), on the official Rust SDK `rmcp`.
//!
//! Each configured server becomes a source: a stdio child (own process group, the terminal
//! tool's rlimits, only its `env` plus `PATH`, `HOME` and `LANG`) or a streamable HTTP session.
//! The session opens in the generation `protocol` names (`initialize`, or 2026-07-28 where the
//! server offers it; see [`config::Protocol`]).
//! toolhost declares the elicitation and sampling client capabilities and asks a server's
//! questions of the call's caller ([`toolhost_tools::Input`]); it offers no roots. A server that
//! offers the tasks extension (SEP-2663) may answer a call with a task of its own, which the
//! call follows to its end. The server's tools become [`toolhost_tools::Tool`]s
//! named `<prefix><tool>` (see [`names`]), with their schemas and hints mapped as [`mapping`]
//! describes; the registry validates arguments and output as for every tool.
//!
//! # Entry point
//!
//! ```ignore
//! let children = Children { limits: Limits::from_settings(&terminal), run_as: terminal_identity };
//! let started = McpSources::start(&configs, &env, children, shutdown.clone()).await?;
//! for tool in started.sources.tools() { registry.register(tool)?; }
//! // on started.events: McpEvent::ToolsChanged → rebuild the registry from sources.tools()
//! // and republish it; CatalogChanged → republish sources.catalog(); ResourceUpdated → relay it
//! // (after sources.subscribe(uri)); Up/Down → log; sources.status() → /status and toolhost_source_up{source}
//! // on shutdown: shutdown.cancel(); started.sources.stopped().await;
//! ```
//!
//! - `configs` are the `[[mcp_servers]]` entries ([`McpServerConfig`], serde, unknown keys
//!   refused), `env` the daemon's environment (for `${VAR}` and the children's `PATH`, `HOME`,
//!   `LANG`), `children` the terminal tool's rlimits
//!   ([`toolhost_tools::terminal::Limits::from_settings`]) and resolved `run_as` identity (the
//!   one `terminal_run` uses), `shutdown` the token that stops every source.
//! - [`McpSources::start`] checks every entry (all errors, each naming its key), starts one
//!   supervisor per server and waits for each first attempt. A server that cannot be reached
//!   is not an error: it has no tools yet, keeps being retried, and announces its tools with
//!   [`McpEvent::ToolsChanged`] when it comes up (fail open). Two servers serving the same final
//!   tool name are a configuration error naming both.
//! - The tools of a server that goes down stay listed and answer `overloaded` with
//!   `retry_after_ms` until it is back; calls already running on it answer `tool_failed`.
//! - After `shutdown` is cancelled, [`McpSources::stopped`] resolves once every child's process
//!   group was killed and every child was waited for.
//!
//! TLS for HTTP servers is rustls with ring, the workspace's one crypto provider: `start`
//! installs it as the process default if none is installed yet.

pub mod catalog;
mod child;
pub mod config;
mod input;
mod lifecycle;
mod logging;
pub mod mapping;
mod mrtr;
pub mod names;
mod source;
mod subscriptions;
mod task;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use toolhost_tools::{Tool, ToolError};

pub use catalog::{Catalog, Operation, Target};
pub use config::{ConfigError, ConfigErrors, McpServerConfig, Protocol, Secret, ServerSpec, Transport};
pub use source::{Children, LIST_CHANGED_DEBOUNCE, MAX_BACKOFF, McpEvent, SourceStatus};

use source::{Common, FirstAttempt, Shared};

/// Why [`McpSources::start`] refused the configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The entries break the rules; every problem is listed with its key.
    #[error(transparent)]
    Config(#[from] ConfigErrors),
    /// Two servers serve a tool of the same name.
    #[error("{0}")]
    Collision(String),
}

/// The running MCP sources of a toolbox. Cloning shares them.
#[derive(Clone)]
pub struct McpSources {
    sources: Vec<Arc<Shared>>,
    tasks: Arc<tokio::sync::Mutex<JoinSet<()>>>,
}

/// What [`McpSources::start`] gives the daemon.
pub struct Started {
    /// The sources: their tools and states.
    pub sources: McpSources,
    /// Tools changed, sources up and down.
    pub events: mpsc::UnboundedReceiver<McpEvent>,
}

impl McpSources {
    /// Checks `configs`, starts every source and waits for each one's first attempt.
    ///
    /// # Errors
    /// [`StartError::Config`] with every problem of the entries, or [`StartError::Collision`]
    /// when two servers serve the same tool name (nothing is left running then).
    pub async fn start(
        configs: &[McpServerConfig],
        env: &BTreeMap<String, String>,
        children: Children,
        shutdown: CancellationToken,
    ) -> Result<Started, StartError> {
        let specs = config::resolve(configs, env)?;
        // Only ring is compiled in; installing it fails harmlessly when it already is.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (events, receiver) = mpsc::unbounded_channel();
        let stop = shutdown.child_token();
        let common = Arc::new(Common {
            base_env: env.clone(),
            children,
            names: std::sync::Mutex::new(BTreeMap::new()),
            events,
            shutdown: stop.clone(),
        });
        let mut tasks = JoinSet::new();
        let mut firsts = Vec::new();
        let mut sources = Vec::new();
        for spec in specs {
            let shared = Shared::new(spec);
            let (first, heard) = oneshot::channel();
            tasks.spawn(source::supervise(shared.clone(), common.clone(), first));
            firsts.push(heard);
            sources.push(shared);
        }
        let mut collision = None;
        for heard in firsts {
            match heard.await {
                Ok(FirstAttempt::Collision(error)) => collision = Some(error),
                Ok(FirstAttempt::Down(error)) => {
                    tracing::warn!(error = %error, "MCP server not reached at start; its tools come when it does");
                }
                Ok(FirstAttempt::Up) | Err(_) => {}
            }
        }
        if let Some(error) = collision {
            stop.cancel();
            while tasks.join_next().await.is_some() {}
            return Err(StartError::Collision(error));
        }
        let sources = McpSources { sources, tasks: Arc::new(tokio::sync::Mutex::new(tasks)) };
        Ok(Started { sources, events: receiver })
    }

    /// Every tool of every source, for the registry. A source that never came up has none yet.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.sources.iter().flat_map(|source| source.tools()).collect()
    }

    /// Every source's resources, resource templates and prompts, by source name, in
    /// configuration order. A source that never came up lists nothing yet.
    pub fn catalog(&self) -> Vec<(String, Catalog)> {
        self.sources.iter().map(|source| (source.spec.name.clone(), source.catalog())).collect()
    }

    /// The first source, in configuration order, whose catalog lists `target`.
    fn serving(&self, target: &Target) -> Option<&Arc<Shared>> {
        self.sources.iter().find(|source| source.serves(target))
    }

    /// Whether a source lists what `operation`'s `params` name; `Err` when the params name
    /// nothing (see [`catalog::target`]).
    ///
    /// # Errors
    /// A sentence naming the missing or mistyped field.
    pub fn serves(&self, operation: Operation, params: &Value) -> Result<bool, String> {
        let target = catalog::target(operation, params)?;
        Ok(self.serving(&target).is_some())
    }

    /// Whether a source lists `target` (see [`Catalog::serves`]).
    pub fn serves_target(&self, target: &Target) -> bool {
        self.serving(target).is_some()
    }

    /// Sends `operation` to the first source, in configuration order, that lists what `params`
    /// names (a prompt's prefixed name is taken back to the server's own); the MCP result.
    ///
    /// # Errors
    /// Params that name nothing, or name what no source lists: `InvalidArguments`; else as the
    /// server answers (`Unavailable` while it is down, `Timeout`, `TooLarge`, `Failed`).
    pub async fn request(&self, operation: Operation, params: Value) -> Result<Value, ToolError> {
        let target = catalog::target(operation, &params).map_err(ToolError::InvalidArguments)?;
        let Some(source) = self.serving(&target) else {
            return Err(ToolError::InvalidArguments(format!("no hosted MCP server lists {target}")));
        };
        source.request(operation, params).await
    }

    /// Subscribes to the resource `uri` at the first source, in configuration order, that
    /// lists it; its `notifications/resources/updated` come as [`McpEvent::ResourceUpdated`].
    ///
    /// # Errors
    /// No source lists it, or it does not offer subscriptions: `InvalidArguments`; else as the
    /// server answers.
    pub async fn subscribe(&self, uri: &str) -> Result<(), ToolError> {
        let target = Target::Resource(uri.to_owned());
        match self.serving(&target) {
            Some(source) => source.subscribe(uri).await,
            None => Err(ToolError::InvalidArguments(format!("no hosted MCP server lists {target}"))),
        }
    }

    /// Unsubscribes from `uri` at every source subscribed to it.
    pub async fn unsubscribe(&self, uri: &str) {
        for source in &self.sources {
            source.unsubscribe(uri).await;
        }
    }

    /// The state of every source, in configuration order.
    pub fn status(&self) -> Vec<SourceStatus> {
        self.sources.iter().map(|source| source.status()).collect()
    }

    /// Resolves when every source has stopped after the shutdown token was cancelled: every
    /// child's group killed and every child waited for.
    pub async fn stopped(&self) {
        let mut tasks = self.tasks.lock().await;
        while let Some(ended) = tasks.join_next().await {
            if let Err(err) = ended {
                tracing::error!(error = %err, "an MCP source supervisor failed");
            }
        }
    }
}
