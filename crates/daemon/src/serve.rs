//! `toolhost serve`: builds the daemon from a validated [`Config`] and runs it until shutdown.
//!
//! Start-up order: the HTTP endpoint first (so `/healthz` answers and `/readyz` explains what is
//! missing while Redis is still out of reach), then the readiness probe, then the consumer group,
//! then the loops. Shutdown runs the other way round; the HTTP endpoint answers until the end.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use toolhost_bus::{Bus, Keys, RedisBus};
use toolhost_mcp::McpEvent;
use toolhost_tools::{Registry, SharedRegistry, ToolLimits};
use tracing::{debug, error, info, warn};

use crate::auth::AuthHandle;
use crate::call::Lifecycle;
use crate::call::cancel::Calls;
use crate::config::{Config, ConfigError, KeyError};
use crate::doors::chat::Inbox;
use crate::doors::context::{DoorContext, StreamContext};
use crate::doors::requests::Requests;
use crate::fleet::Fleet;
use crate::group::GroupReader;
use crate::http::{HttpLimits, HttpServer};
use crate::outage::redis_warn;
use crate::probe::{Probe, WatchedGroup};
use crate::publish::Publisher;
use crate::reload::reload_on_hangup;
use crate::services::Services;
use crate::shutdown::Shutdown;
use crate::sources::Sources;
use crate::stats::Stats;
use crate::telemetry::Telemetry;

/// Options of `serve` that are not configuration.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// How many synthetic benchmark tools to register.
    pub synthetic_tools: usize,
    /// The configuration file, read again on SIGHUP (`None`: defaults and environment only).
    pub config_path: Option<std::path::PathBuf>,
}

/// Builds the registry of `config`'s tools (built-ins, synthetic ones, the configured specialist
/// agents, the `[[commands]]` and `[[http_tools]]` sources), without the hosted MCP servers';
/// `bus` and `keys` serve the chat tools.
///
/// # Errors
/// A tool cannot be registered, or a disabled tool name is unknown, or two tools share a name
/// (a [`ConfigError`] naming every such key, so `main` exits 64 for it).
pub fn build_registry(
    config: &Config,
    options: &ServeOptions,
    bus: &Arc<dyn Bus>,
    keys: &Keys,
) -> anyhow::Result<Registry> {
    crate::sources::build_registry(&config.sources(options.synthetic_tools), bus, keys, &[])
}

/// The bus and key names `config` asks for.
///
/// # Errors
/// The Redis URL is unusable.
pub fn connect(config: &Config) -> anyhow::Result<(Arc<dyn Bus>, Keys)> {
    let bus: Arc<dyn Bus> = Arc::new(RedisBus::new(config.redis_options()).context("redis.url")?);
    Ok((bus, config.keys()))
}

/// What the doors see of `config`, with the bus, telemetry and stop token they share.
pub(crate) fn door_context(
    config: &Config,
    auth: AuthHandle,
    bus: Arc<dyn Bus>,
    telemetry: Telemetry,
    stop: tokio_util::sync::CancellationToken,
) -> DoorContext {
    let raw = &config.raw;
    let topology = match config.redis_options().topology {
        toolhost_bus::Topology::Single => "single",
        toolhost_bus::Topology::Cluster { .. } => "cluster",
        toolhost_bus::Topology::Sentinel(_) => "sentinel",
        _ => "other",
    };
    DoorContext {
        bus,
        keys: config.keys(),
        requests_stream: raw.streams.requests.clone(),
        shards: config.shards(),
        results_stream: raw.streams.results.clone(),
        toolbox_id: raw.daemon.toolbox_id.clone(),
        auth,
        env: config.mcp_env.clone(),
        telemetry,
        stop,
        redis: raw.redis.place(),
        topology,
        answered_retention: config.answered_retention,
    }
}

/// `toolhost mcp`: the MCP door over stdin and stdout, until the client closes them.
///
/// # Errors
/// Redis cannot be reached, or the client broke the protocol before initializing.
pub async fn serve_mcp_stdio(config: &Config) -> anyhow::Result<()> {
    let bus: Arc<dyn Bus> = Arc::new(
        RedisBus::new(config.redis_options())
            .map_err(|err| anyhow::anyhow!(config.raw.redis.place().failure(&err)))?,
    );
    let auth = Arc::new(arc_swap::ArcSwap::new(config.auth.clone()));
    let telemetry = Telemetry::with_settings(config.telemetry.clone());
    telemetry.start_export()?;
    let cx = door_context(config, auth, bus, telemetry.clone(), CancellationToken::new());
    let served = crate::doors::mcp::serve_stdio(&config.raw.doors.mcp, &cx).await;
    telemetry.stop_export(std::time::Duration::from_secs(1)).await;
    served
}

/// A consumer name unique to this process: host, pid and a random suffix.
pub fn consumer_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    format!("{}-{}-{suffix}", if host.is_empty() { "host" } else { host }, std::process::id())
}

/// Runs the daemon until `signal` resolves, then drains within the grace period.
///
/// # Errors
/// The configuration cannot be built into a daemon (see [`App::build`]).
pub async fn run(
    config: Config,
    options: ServeOptions,
    signal: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    App::build(config, &options)?.run(signal).await
}

/// Runs the daemon with a registry built by the caller (tests register their own tools).
///
/// # Errors
/// As [`App::build`].
pub async fn run_with_registry(
    config: Config,
    registry: Registry,
    signal: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let (bus, keys) = connect(&config)?;
    App::assemble(config, None, bus, keys, Ok(registry))?.run(signal).await
}

/// The daemon, built and not yet running: every part made from the configuration, the HTTP
/// endpoint bound, nothing sent to Redis.
///
/// Building and running are apart (as in linkerd2-proxy): [`App::build`] finds every problem of
/// the configuration before anything runs, and works while Redis is down; only [`App::run`]
/// talks to Redis.
pub struct App {
    config: Config,
    /// `[auth]` as in force, shared by the gate and the doors.
    auth: AuthHandle,
    bus: Arc<dyn Bus>,
    keys: Keys,
    registry: Arc<SharedRegistry>,
    consumer: String,
    shutdown: Shutdown,
    telemetry: Telemetry,
    http: HttpServer,
    /// The requests door's reader.
    /// The readers of the requests stream's shards this replica reads (one without shards).
    requests: Vec<Arc<GroupReader<Lifecycle<Requests>>>>,
    /// The chat door's reader.
    inbox: Arc<GroupReader<Lifecycle<Inbox>>>,
    publisher: Arc<Publisher>,
    /// The tool sources, with their event stream; `None` for a registry built by the caller,
    /// which is never rebuilt.
    sources: Option<(Arc<Sources>, mpsc::UnboundedReceiver<McpEvent>)>,
    /// How `serve` was asked to run; its configuration file is read again on SIGHUP.
    options: ServeOptions,
    /// The calls running here; its loop reads this replica's control stream.
    calls: Arc<Calls>,
}

impl App {
    /// Builds every part of the daemon from `config`.
    ///
    /// # Errors
    /// Every problem found, together, as one [`ConfigError`] naming the keys: unknown disabled or
    /// limited tools, bad response-topic patterns, an HTTP address that cannot be bound; or a tool
    /// that cannot be registered.
    pub fn build(config: Config, options: &ServeOptions) -> anyhow::Result<App> {
        let (bus, keys) = connect(&config)?;
        let registry = build_registry(&config, options, &bus, &keys);
        App::assemble(config, Some(options.clone()), bus, keys, registry)
    }

    /// Builds the parts around a registry (or the error building it), collecting every error.
    fn assemble(
        config: Config,
        options: Option<ServeOptions>,
        bus: Arc<dyn Bus>,
        keys: Keys,
        registry: anyhow::Result<Registry>,
    ) -> anyhow::Result<App> {
        let telemetry = Telemetry::with_settings(config.telemetry.clone());
        let (registry, http) = checked_parts(&config, registry, &telemetry)?;
        let raw = &config.raw;
        let synthetic_tools = options.as_ref().map_or(0, |options| options.synthetic_tools);
        let source_settings = config.sources(synthetic_tools);
        let limits = crate::sources::limit_settings(&source_settings, &registry);
        let registry = Arc::new(SharedRegistry::new(registry));
        let consumer = consumer_name();
        let parts = Parts {
            auth: Arc::new(arc_swap::ArcSwap::new(config.auth.clone())),
            bus: bus.clone(),
            keys: keys.clone(),
            registry: registry.clone(),
            limits: Arc::new(ToolLimits::new(limits)),
            telemetry: telemetry.clone(),
            shutdown: Shutdown::new(),
            consumer: consumer.clone(),
        };
        let services = services(&config, &parts);
        // One budget of `max_in_flight` slots over every door, so the configured limit is the
        // process's limit however many doors there are.
        let budget = Arc::new(Semaphore::new(raw.dispatch.max_in_flight.max(1)));
        let doors = StreamContext { services, budget, consumer: consumer.clone(), reading: config.reading() };
        let inbox = crate::doors::chat::start(config.chat_door(), &doors);
        let requests = crate::doors::requests::start(config.requests_door(), &doors);
        let publisher = Arc::new(Publisher {
            bus: bus.clone(),
            registry: registry.clone(),
            keys: keys.clone(),
            toolbox_id: raw.daemon.toolbox_id.clone(),
            consumer: consumer.clone(),
            period: config.heartbeat,
            requests_topic: keys.topic(&raw.streams.requests),
            results_topic: keys.topic(&raw.streams.results),
            read_topics: requests.iter().map(|reader| reader.topic().to_owned()).collect(),
            inbox_topic: inbox.topic().to_owned(),
            fleet: doors.services.fleet.clone(),
            telemetry: telemetry.clone(),
            catalog: std::sync::Mutex::default(),
        });
        let sources = options.as_ref().map(|_| {
            let (registry, limits) = (parts.registry.clone(), parts.limits.clone());
            let (sources, events) = Sources::new(
                source_settings,
                bus,
                keys,
                registry,
                limits,
                publisher.clone(),
                telemetry.clone(),
            );
            doors.services.hosted.set(sources.clone());
            (sources, events)
        });
        Ok(App {
            auth: parts.auth.clone(),
            calls: doors.services.calls.clone(),
            config,
            registry,
            shutdown: parts.shutdown,
            consumer,
            telemetry,
            http,
            requests,
            inbox,
            publisher,
            sources,
            options: options.unwrap_or_default(),
            bus: parts.bus,
            keys: parts.keys,
        })
    }

    /// Runs until `signal` resolves, then drains within the grace period. Every loop is spawned
    /// on the shutdown's one task tracker, so the drain waits for all of them.
    ///
    /// # Errors
    /// Redis cannot be reached or is too old, a hosted MCP server's tools collide, or a door
    /// cannot start; Redis faults once serving are waited out, never returned.
    pub async fn run(mut self, signal: impl Future<Output = ()>) -> anyhow::Result<()> {
        info!(addr = %self.http.local_addr(), "http listening");
        if !self.config.raw.dispatch.answer_unknown_tools {
            warn!(
                key = "dispatch.answer_unknown_tools",
                "deprecated: toolboxes sharing a stream now route requests among themselves and answer a tool \
                 nobody hosts once; this setting only keeps this toolbox from ever answering unknown_tool"
            );
        }
        self.shutdown.tasks().spawn(self.probe().run(self.shutdown.stopping().clone()));
        tokio::pin!(signal);
        // Spans are exported from the first call on; the export never holds one.
        self.telemetry.start_export()?;
        if !self.prepare(&mut signal).await? {
            return Ok(());
        }
        // The doors that are clients of the fleet; they stop after the drain, so the calls in
        // flight through them get their answers.
        let doors_stop = CancellationToken::new();
        let (bus, telemetry) = (self.bus.clone(), self.telemetry.clone());
        let cx = door_context(&self.config, self.auth.clone(), bus, telemetry, doors_stop.clone());
        let doors = match self.config.raw.doors.start(&cx).await {
            Ok(doors) => doors,
            Err(err) => {
                error!(error = %format!("{err:#}"), "a door cannot start");
                self.abort().await;
                return Err(err);
            }
        };
        self.log_ready();
        let sources = self.spawn_loops();
        signal.await;
        self.stop(doors_stop, doors, sources).await;
        Ok(())
    }

    /// The readiness probe: Redis and both doors' groups.
    fn probe(&self) -> Probe {
        let group = &self.config.raw.daemon.toolbox_id;
        Probe {
            redis: self.config.raw.redis.describe(),
            bus: self.bus.clone(),
            telemetry: self.telemetry.clone(),
            groups: self
                .read_topics()
                .map(|stream| WatchedGroup { stream: stream.to_owned(), group: group.clone() })
                .collect(),
        }
    }

    /// The full keys of every stream this replica reads as a consumer group: the requests
    /// stream's shards it reads, and the chat inbox.
    fn read_topics(&self) -> impl Iterator<Item = &str> {
        self.requests.iter().map(|reader| reader.topic()).chain([self.inbox.topic()])
    }

    /// Everything before the doors read: the consumer groups, Redis's version, the hosted MCP
    /// servers, readiness, and the registry published. `false` when `signal` came first.
    ///
    /// # Errors
    /// Redis refuses to serve, is too old, or the hosted servers' tools collide.
    async fn prepare(&self, signal: &mut (impl Future<Output = ()> + Unpin)) -> anyhow::Result<bool> {
        let redis = self.config.raw.redis.describe();
        let (requests, inbox) = (&self.requests, &self.inbox);
        let groups = async {
            for reader in requests {
                if !reader.ensure_group().await? {
                    return Ok(false);
                }
            }
            inbox.ensure_group().await
        };
        let ready: Result<bool, toolhost_bus::Error> = tokio::select! {
            ready = groups => ready,
            () = &mut *signal => Ok(false),
        };
        let ready = match ready {
            Ok(ready) => ready,
            Err(err) => {
                error!(error = %err, redis = %redis, "refusing to serve");
                self.abort().await;
                return Err(anyhow::Error::new(err).context(format!("cannot reach {redis}")));
            }
        };
        if !ready {
            info!("stopped before the consumer group could be created");
            self.abort().await;
            return Ok(false);
        }
        // The first moment Redis is known to answer: one too old would fail every final answer.
        if let Err(err) = check_redis_version(&*self.bus).await {
            error!(error = %err, "refusing to serve");
            self.abort().await;
            return Err(err);
        }
        // Hosted MCP servers start before the doors read, so their tools are listed from the
        // first request on; one that cannot be reached comes later (fail open).
        if let Some((sources, _)) = &self.sources
            && let Err(err) = sources.start().await
        {
            self.abort().await;
            let message = format!("{err:#}");
            return Err(ConfigError(vec![KeyError { key: "mcp_servers".to_owned(), message }]).into());
        }
        self.telemetry.set_groups_ready(true);
        self.telemetry.set_redis_up(true);
        check_eviction_policy(&*self.bus).await;
        // Before `ready`, so whoever waits for that line finds the tools listed in Redis; and
        // before the first read, so that no other toolbox answers `unknown_tool` for a tool of
        // this one in a request added after this heartbeat (`fleet::Fleet::read_after`): retried
        // until it is written.
        let fields = self.publisher.fields();
        let mut backoff = crate::backoff::Backoff::new();
        loop {
            let attempt = async {
                let Err(err) = self.publisher.publish_once(&fields).await else { return true };
                redis_warn!(&err, error = %err, "cannot write the first heartbeat and the tool registry yet; retrying before reading");
                backoff.wait(self.shutdown.stopping()).await;
                false
            };
            let published = tokio::select! {
                published = attempt => published,
                () = &mut *signal => {
                    info!("stopped before the first heartbeat could be written");
                    self.abort().await;
                    return Ok(false);
                }
            };
            if published {
                return Ok(true);
            }
        }
    }

    /// Stops what started before serving began: the loops so far, and the hosted servers.
    async fn abort(&self) {
        self.shutdown.drain(self.config.shutdown_grace).await;
        if let Some((sources, _)) = &self.sources {
            sources.stop().await;
        }
    }

    /// The `ready` line, with where everything is.
    fn log_ready(&self) {
        let raw = &self.config.raw;
        info!(
            version = env!("CARGO_PKG_VERSION"),
            toolbox_id = %raw.daemon.toolbox_id,
            agent_name = %raw.daemon.agent_name,
            consumer = %self.consumer,
            redis = %raw.redis.describe(),
            requests = %self.requests.iter().map(|reader| reader.topic()).collect::<Vec<_>>().join(","),
            group = %raw.daemon.toolbox_id,
            results = %self.keys.topic(&raw.streams.results),
            inbox = %self.inbox.topic(),
            dead_letters = %self.keys.dead_letters(&raw.daemon.toolbox_id),
            tools = %self.registry.snapshot().names().join(","),
            http = %self.http.local_addr(),
            "ready"
        );
    }

    /// Spawns every loop on the shutdown's task tracker; returns the sources, if any.
    fn spawn_loops(&mut self) -> Option<Arc<Sources>> {
        let (tasks, stopping) = (self.shutdown.tasks(), self.shutdown.stopping().clone());
        for reader in &self.requests {
            tasks.spawn(reader.clone().run_reader());
            tasks.spawn(reader.clone().run_reclaimer());
        }
        tasks.spawn(self.publisher.clone().run(self.shutdown.clone()));
        tasks.spawn(self.calls.clone().run(stopping.clone()));
        tasks.spawn(self.inbox.clone().run_reader());
        tasks.spawn(self.inbox.clone().run_reclaimer());
        // The console's charts: a point of this replica's recent history every few seconds.
        let history = self.keys.history(&self.config.raw.daemon.toolbox_id, &self.consumer);
        let streams: Arc<dyn toolhost_bus::FleetAccess> = self.bus.clone();
        tasks.spawn(crate::telemetry::history::run(
            self.telemetry.clone(),
            streams,
            history,
            stopping.clone(),
        ));
        let (sources, events) = self.sources.take()?;
        tasks.spawn(sources.clone().run(events, stopping.clone()));
        let (config, telemetry) = (self.config.clone(), self.telemetry.clone());
        let (config_path, synthetic_tools) = (self.options.config_path.clone(), self.options.synthetic_tools);
        let reload =
            reload_on_hangup(sources.clone(), config, config_path, synthetic_tools, telemetry, stopping);
        tasks.spawn(reload);
        Some(sources)
    }

    /// The drain after the signal: no new reads, the calls in flight finished within the grace,
    /// then the doors, the hosted servers, the heartbeat and this replica's consumers.
    async fn stop(
        &self,
        doors_stop: CancellationToken,
        doors: Vec<JoinHandle<()>>,
        sources: Option<Arc<Sources>>,
    ) {
        self.telemetry.set_draining();
        let grace = self.config.shutdown_grace;
        info!(
            grace_ms = grace.as_millis() as u64,
            "shutting down: no new requests, finishing in-flight calls"
        );
        // The grace counts from the signal: in-flight calls run on while the readers' last
        // blocking reads return (what they delivered is handled, not left pending).
        if !self.shutdown.drain(grace).await {
            warn!("grace period over; unfinished calls are left pending for another replica");
        }
        doors_stop.cancel();
        for door in doors {
            let _ = door.await;
        }
        // After the calls that used them: every MCP child is killed and waited for.
        if let Some(sources) = &sources {
            sources.stop().await;
        }
        if let Err(err) = self.publisher.withdraw().await {
            warn!(error = %err, "cannot remove the registry heartbeat");
        }
        let group = &self.config.raw.daemon.toolbox_id;
        for stream in self.read_topics() {
            match self.bus.delete_consumer(stream, group, &self.consumer).await {
                Ok(true) => {}
                Ok(false) => info!(stream, "consumer keeps pending entries; left for a replica to reclaim"),
                Err(err) => warn!(error = %err, stream, "cannot delete this consumer"),
            }
        }
        // The spans of the last calls, for at most a second.
        self.telemetry.stop_export(std::time::Duration::from_secs(1)).await;
        info!("stopped");
    }
}

/// The registry, or every key error building it, and the HTTP endpoint bound; every problem of
/// both together.
fn checked_parts(
    config: &Config,
    registry: anyhow::Result<Registry>,
    telemetry: &Telemetry,
) -> anyhow::Result<(Registry, HttpServer)> {
    let mut errors = Vec::new();
    let registry = match registry {
        Ok(registry) => Some(registry),
        Err(err) => match err.downcast::<ConfigError>() {
            Ok(ConfigError(found)) => {
                errors.extend(found);
                None
            }
            Err(err) => return Err(err),
        },
    };
    let limits = HttpLimits {
        max_connections: config.raw.http.max_connections,
        idle_timeout: config.http_idle_timeout,
    };
    let http = HttpServer::start(config.http_listen, telemetry.clone(), limits)
        .map_err(|err| errors.push(KeyError { key: "http.listen".to_owned(), message: format!("{err:#}") }))
        .ok();
    match (registry, http, errors.is_empty()) {
        (Some(registry), Some(http), true) => Ok((registry, http)),
        _ => Err(ConfigError(errors).into()),
    }
}

/// What [`services`] is made of, besides the configuration.
struct Parts {
    /// `[auth]` as in force, shared by the gate and the doors.
    auth: AuthHandle,
    bus: Arc<dyn Bus>,
    keys: Keys,
    registry: Arc<SharedRegistry>,
    limits: Arc<ToolLimits>,
    telemetry: Telemetry,
    shutdown: Shutdown,
    consumer: String,
}

/// What every call's lifecycle uses, whichever door it came in by.
fn services(config: &Config, parts: &Parts) -> Services {
    let raw = &config.raw;
    let toolbox_id = &raw.daemon.toolbox_id;
    let (bus, keys) = (&parts.bus, &parts.keys);
    let fleet = Arc::new(Fleet::reading(bus.clone(), keys.fleet()));
    let calls = Calls::new(bus.clone(), keys.clone(), fleet.clone(), toolbox_id, &parts.consumer);
    let gate =
        crate::auth::Gate::new(parts.auth.clone(), bus.clone(), keys.clone(), toolbox_id, &config.secrets());
    let call_log = raw.doors.console.records_calls().then(|| {
        let target = crate::call_log::Target {
            topic: keys.calls(toolbox_id),
            max_len: raw.doors.console.calls_max_len,
            toolbox_id: toolbox_id.clone(),
            consumer: parts.consumer.clone(),
        };
        crate::call_log::CallLog::start(bus.clone(), target)
    });
    Services {
        fleet,
        bus: bus.clone(),
        registry: parts.registry.clone(),
        limits: parts.limits.clone(),
        keys: keys.clone(),
        stats: Arc::new(Stats::default()),
        telemetry: parts.telemetry.clone(),
        shutdown: parts.shutdown.clone(),
        calls: Arc::new(calls),
        progress_per_second: raw.dispatch.progress_per_second,
        gate: Arc::new(gate),
        hosted: Arc::default(),
        call_log,
    }
}

/// The oldest Redis toolhost serves on: the call ledger's `SET ... NX GET` needs 7.0.
const MIN_REDIS_VERSION: (u64, u64) = (7, 0);

/// Whether Redis `version` (`7.0.15`) is [`MIN_REDIS_VERSION`] or later; `None` when it does not
/// read as `major.minor[...]`.
fn redis_version_supported(version: &str) -> Option<bool> {
    let mut parts = version.trim().split('.');
    let major: u64 = parts.next()?.parse().ok()?;
    let minor: u64 = parts.next()?.parse().ok()?;
    Some((major, minor) >= MIN_REDIS_VERSION)
}

/// Refuses a Redis older than [`MIN_REDIS_VERSION`], naming its version. A version that cannot
/// be read (`INFO` refused, or an unusual text) is logged and let through.
async fn check_redis_version(bus: &dyn Bus) -> anyhow::Result<()> {
    let (major, minor) = MIN_REDIS_VERSION;
    match bus.server_version().await {
        Ok(Some(version)) => match redis_version_supported(&version) {
            Some(true) => {
                debug!(redis_version = %version, "Redis version supported");
                Ok(())
            }
            Some(false) => Err(anyhow::anyhow!(
                "Redis {version} is too old: toolhost needs Redis {major}.{minor} or later (the call ledger \
                 uses SET ... NX GET); upgrade Redis"
            )),
            None => {
                warn!(redis_version = %version, "cannot read the Redis version; not checked (needs {major}.{minor} or later)");
                Ok(())
            }
        },
        Ok(None) => Ok(()),
        Err(err) => {
            warn!(error = %err, "cannot read the Redis version (INFO refused?); not checked (needs {major}.{minor} or later)");
            Ok(())
        }
    }
}

/// Warns when Redis may evict keys: eviction silently drops answered marks and call records, so
/// a request could be answered twice. Managed services often refuse `CONFIG`; that is only noted.
async fn check_eviction_policy(bus: &dyn Bus) {
    match bus.eviction_policy().await {
        Ok(Some(policy)) if policy != "noeviction" => warn!(
            maxmemory_policy = %policy,
            "Redis may evict keys (maxmemory-policy is not noeviction): evicted answered marks and call \
             records let a request be answered twice; set maxmemory-policy noeviction"
        ),
        Ok(_) => {}
        // A least-privilege user (`toolhost redis-acl`) may not run CONFIG GET, which reads every
        // setting, passwords included: said once at start, and serving goes on.
        Err(err) => info!(
            error = %err,
            "cannot read maxmemory-policy (CONFIG GET refused?); eviction not checked: make sure it is noeviction"
        ),
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(terminate) => terminate,
        Err(err) => {
            warn!(error = %err, "cannot listen for SIGTERM; only SIGINT stops the daemon");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(file: &str, env: &[(&str, &str)]) -> Config {
        let path = std::env::temp_dir().join(format!("toolhost-app-{}.toml", uuid::Uuid::new_v4().simple()));
        std::fs::write(&path, file).unwrap();
        let env: HashMap<String, String> =
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let config = Config::load(Some(&path), &env).unwrap();
        let _ = std::fs::remove_file(&path);
        config
    }

    #[test]
    fn redis_before_7_0_is_not_supported() {
        for (version, supported) in [
            ("7.0.0", Some(true)),
            ("7.0.15", Some(true)),
            ("7.2.4", Some(true)),
            ("8.0.2", Some(true)),
            ("10.0.0", Some(true)),
            ("6.2.14", Some(false)),
            ("6.0.0", Some(false)),
            ("5.0.14", Some(false)),
            (" 7.0.11 ", Some(true)),
            ("7", None),
            ("", None),
            ("unstable", None),
        ] {
            assert_eq!(redis_version_supported(version), supported, "{version}");
        }
    }

    #[tokio::test]
    async fn the_app_builds_while_redis_is_down() {
        // Nothing listens on port 1: building must not need Redis.
        let config =
            config("", &[("REDIS_URL", "redis://127.0.0.1:1"), ("TOOLHOST__HTTP__LISTEN", "127.0.0.1:0")]);
        let app = App::build(config, &ServeOptions::default()).unwrap();
        assert_eq!(app.registry.snapshot().names(), ["chat_send", "echo", "terminal_run"]);
    }

    #[tokio::test]
    async fn two_tools_of_one_name_are_refused_naming_both() {
        let config = config(
            "[[agents]]\nname = \"coder\"\ndescription = \"d\"\n\n\
             [[commands]]\nname = \"echo\"\ndescription = \"d\"\nargv = [\"echo\"]\n\n\
             [[commands]]\nname = \"coder\"\ndescription = \"d\"\nargv = [\"echo\"]\n\n\
             [[commands]]\nname = \"words\"\ndescription = \"d\"\nargv = [\"wc\", \"-w\"]\n\n\
             [[http_tools]]\nname = \"words\"\ndescription = \"d\"\nurl = \"http://127.0.0.1:9/x\"\n",
            &[("REDIS_URL", "redis://127.0.0.1:1"), ("TOOLHOST__HTTP__LISTEN", "127.0.0.1:0")],
        );
        let Err(err) = App::build(config, &ServeOptions::default()) else {
            panic!("built with duplicate names")
        };
        let text = format!("{err:#}");
        for line in [
            "commands[0].name: tool 'echo' is also defined by a built-in tool",
            "commands[1].name: tool 'coder' is also defined by agents[0]",
            "http_tools[0].name: tool 'words' is also defined by commands[2]",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
        assert!(err.downcast_ref::<ConfigError>().is_some(), "{text}");
    }

    #[tokio::test]
    async fn building_reports_every_problem_at_once() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listen = taken.local_addr().unwrap().to_string();
        let config = config(
            "[tools]\ndisabled = [\"nope\"]\n[tools.limits.\"ghost\"]\nmax_concurrent = 1\n",
            &[("REDIS_URL", "redis://127.0.0.1:1"), ("TOOLHOST__HTTP__LISTEN", &listen)],
        );
        let Err(err) = App::build(config, &ServeOptions::default()) else {
            panic!("built with bad settings")
        };
        let text = format!("{err:#}");
        for key in ["tools.disabled", "tools.limits.ghost", "http.listen"] {
            assert!(text.contains(key), "{key} missing from {text}");
        }
        assert!(err.downcast_ref::<ConfigError>().is_some(), "exit 64 needs a ConfigError: {text}");
    }
}
