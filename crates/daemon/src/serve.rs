//! `toolhost serve`: builds the daemon from a validated [`Config`] and runs it until shutdown.
//!
//! Start-up order: the HTTP endpoint first (so `/healthz` answers and `/readyz` explains what is
//! missing while Redis is still out of reach), then the readiness probe, then the consumer group,
//! then the loops. Shutdown runs the other way round; the HTTP endpoint answers until the end.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::sync::{Semaphore, mpsc};
use toolhost_bus::{Bus, Keys, RedisBus};
use toolhost_mcp::McpEvent;
use toolhost_tools::{Registry, SharedRegistry, ToolLimits};
use tracing::{debug, error, info, warn};

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
        results_stream: raw.streams.results.clone(),
        toolbox_id: raw.daemon.toolbox_id.clone(),
        auth: Arc::new(arc_swap::ArcSwap::new(config.auth.clone())),
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
    let cx = door_context(config, bus, Telemetry::new(), tokio_util::sync::CancellationToken::new());
    crate::doors::mcp::serve_stdio(&config.raw.doors.mcp, &cx).await
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
    bus: Arc<dyn Bus>,
    keys: Keys,
    registry: Arc<SharedRegistry>,
    consumer: String,
    shutdown: Shutdown,
    telemetry: Telemetry,
    http: HttpServer,
    /// The requests door's reader.
    requests: Arc<GroupReader<Lifecycle<Requests>>>,
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
        let raw = &config.raw;
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
        let telemetry = Telemetry::new();
        let http_limits =
            HttpLimits { max_connections: raw.http.max_connections, idle_timeout: config.http_idle_timeout };
        let http = HttpServer::start(config.http_listen, telemetry.clone(), http_limits)
            .map_err(|err| {
                errors.push(KeyError { key: "http.listen".to_owned(), message: format!("{err:#}") })
            })
            .ok();
        let (Some(registry), Some(http), true) = (registry, http, errors.is_empty()) else {
            return Err(ConfigError(errors).into());
        };

        let synthetic_tools = options.as_ref().map_or(0, |options| options.synthetic_tools);
        let limits = Arc::new(ToolLimits::new(crate::sources::limit_settings(
            &config.sources(synthetic_tools),
            &registry,
        )));
        let registry = Arc::new(SharedRegistry::new(registry));
        let consumer = consumer_name();
        let shutdown = Shutdown::new();
        let fleet = Arc::new(Fleet::default());
        let services = Services {
            fleet: fleet.clone(),
            bus: bus.clone(),
            registry: registry.clone(),
            limits: limits.clone(),
            keys: keys.clone(),
            stats: Arc::new(Stats::default()),
            telemetry: telemetry.clone(),
            shutdown: shutdown.clone(),
            calls: Arc::new(Calls::new(
                bus.clone(),
                keys.clone(),
                fleet.clone(),
                &raw.daemon.toolbox_id,
                &consumer,
            )),
            progress_per_second: raw.dispatch.progress_per_second,
            gate: Arc::new(crate::auth::Gate::new(
                config.auth.clone(),
                bus.clone(),
                keys.clone(),
                &raw.daemon.toolbox_id,
                &config.secrets(),
            )),
            call_log: raw.doors.console.records_calls().then(|| {
                crate::call_log::CallLog::start(
                    bus.clone(),
                    crate::call_log::Target {
                        topic: keys.calls(&raw.daemon.toolbox_id),
                        max_len: raw.doors.console.calls_max_len,
                        toolbox_id: raw.daemon.toolbox_id.clone(),
                        consumer: consumer.clone(),
                    },
                )
            }),
        };
        // One budget of `max_in_flight` slots over every door, so the configured limit is the
        // process's limit however many doors there are.
        let budget = Arc::new(Semaphore::new(raw.dispatch.max_in_flight.max(1)));
        let doors = StreamContext { services, budget, consumer: consumer.clone(), reading: config.reading() };
        let inbox = crate::doors::chat::start(config.chat_door(), &doors);
        let requests = crate::doors::requests::start(config.requests_door(), &doors);
        let services = doors.services;
        let publisher = Arc::new(Publisher {
            bus: bus.clone(),
            registry: registry.clone(),
            keys: keys.clone(),
            toolbox_id: raw.daemon.toolbox_id.clone(),
            consumer: consumer.clone(),
            period: config.heartbeat,
            requests_topic: keys.topic(&raw.streams.requests),
            results_topic: keys.topic(&raw.streams.results),
            inbox_topic: inbox.topic().to_owned(),
            fleet,
            telemetry: telemetry.clone(),
        });
        let sources = options.as_ref().map(|options| {
            Sources::new(
                config.sources(options.synthetic_tools),
                bus.clone(),
                keys.clone(),
                registry.clone(),
                limits.clone(),
                publisher.clone(),
                telemetry.clone(),
            )
        });
        Ok(App {
            calls: services.calls.clone(),
            config,
            bus,
            keys,
            registry,
            consumer,
            shutdown,
            telemetry,
            http,
            requests,
            inbox,
            publisher,
            sources,
            options: options.unwrap_or_default(),
        })
    }

    /// Runs until `signal` resolves, then drains within the grace period. Every loop is spawned
    /// on the shutdown's one task tracker, so the drain waits for all of them.
    ///
    /// # Errors
    /// None today: Redis faults are waited out, never returned.
    pub async fn run(self, signal: impl Future<Output = ()>) -> anyhow::Result<()> {
        let App {
            config,
            bus,
            keys,
            registry,
            consumer,
            shutdown,
            telemetry,
            http,
            requests,
            inbox,
            publisher,
            sources,
            options,
            calls,
        } = self;
        let requests_key = requests.topic().to_owned();
        let raw = &config.raw;
        info!(addr = %http.local_addr(), "http listening");
        if !raw.dispatch.answer_unknown_tools {
            warn!(
                key = "dispatch.answer_unknown_tools",
                "deprecated: toolboxes sharing a stream now route requests among themselves and answer a tool \
                 nobody hosts once; this setting only keeps this toolbox from ever answering unknown_tool"
            );
        }
        let tasks = shutdown.tasks();
        let probe = Probe {
            redis: raw.redis.describe(),
            bus: bus.clone(),
            telemetry: telemetry.clone(),
            groups: vec![
                WatchedGroup { stream: requests_key.clone(), group: raw.daemon.toolbox_id.clone() },
                WatchedGroup { stream: inbox.topic().to_owned(), group: raw.daemon.toolbox_id.clone() },
            ],
        };
        tasks.spawn(probe.run(shutdown.stopping().clone()));

        tokio::pin!(signal);
        let ready: Result<bool, toolhost_bus::Error> = tokio::select! {
            ready = async { Ok(requests.ensure_group().await? && inbox.ensure_group().await?) } => ready,
            () = &mut signal => Ok(false),
        };
        let ready = match ready {
            Ok(ready) => ready,
            Err(err) => {
                error!(error = %err, redis = %raw.redis.describe(), "refusing to serve");
                shutdown.drain(config.shutdown_grace).await;
                return Err(anyhow::Error::new(err).context(format!("cannot reach {}", raw.redis.describe())));
            }
        };
        if !ready {
            info!("stopped before the consumer group could be created");
            shutdown.drain(config.shutdown_grace).await;
            return Ok(());
        }
        // The first moment Redis is known to answer: one too old would fail every final answer.
        if let Err(err) = check_redis_version(&*bus).await {
            error!(error = %err, "refusing to serve");
            shutdown.drain(config.shutdown_grace).await;
            return Err(err);
        }
        // Hosted MCP servers start before the doors read, so their tools are listed from the
        // first request on; one that cannot be reached comes later (fail open).
        if let Some((sources, _)) = &sources
            && let Err(err) = sources.start().await
        {
            shutdown.drain(config.shutdown_grace).await;
            sources.stop().await;
            return Err(ConfigError(vec![KeyError {
                key: "mcp_servers".to_owned(),
                message: format!("{err:#}"),
            }])
            .into());
        }
        telemetry.set_groups_ready(true);
        telemetry.set_redis_up(true);
        check_eviction_policy(&*bus).await;
        // Before `ready`, so whoever waits for that line finds the tools listed in Redis.
        let fields = publisher.fields();
        if let Err(err) = publisher.publish_once(&fields).await {
            redis_warn!(&err, error = %err, "cannot publish the tool registry yet; will retry");
        }
        // The doors that are clients of the fleet (MCP over HTTP); they stop after the drain, so
        // the calls in flight through them get their answers.
        let doors_stop = tokio_util::sync::CancellationToken::new();
        let door_context = door_context(&config, bus.clone(), telemetry.clone(), doors_stop.clone());
        let doors = match raw.doors.start(&door_context).await {
            Ok(doors) => doors,
            Err(err) => {
                error!(error = %format!("{err:#}"), "a door cannot start");
                shutdown.drain(config.shutdown_grace).await;
                if let Some((sources, _)) = &sources {
                    sources.stop().await;
                }
                return Err(err);
            }
        };
        info!(
            version = env!("CARGO_PKG_VERSION"),
            toolbox_id = %raw.daemon.toolbox_id,
            agent_name = %raw.daemon.agent_name,
            consumer = %consumer,
            redis = %raw.redis.describe(),
            requests = %requests_key,
            group = %raw.daemon.toolbox_id,
            results = %keys.topic(&raw.streams.results),
            inbox = %inbox.topic(),
            dead_letters = %keys.dead_letters(&raw.daemon.toolbox_id),
            tools = %registry.snapshot().names().join(","),
            http = %http.local_addr(),
            "ready"
        );
        tasks.spawn(requests.clone().run_reader());
        tasks.spawn(requests.clone().run_reclaimer());
        tasks.spawn(publisher.clone().run(shutdown.clone()));
        tasks.spawn(calls.clone().run(shutdown.stopping().clone()));
        tasks.spawn(inbox.clone().run_reader());
        tasks.spawn(inbox.clone().run_reclaimer());
        let sources = sources.map(|(sources, events)| {
            tasks.spawn(sources.clone().run(events, shutdown.stopping().clone()));
            tasks.spawn(crate::reload::reload_on_hangup(
                sources.clone(),
                config.clone(),
                options,
                telemetry.clone(),
                shutdown.stopping().clone(),
            ));
            sources
        });

        signal.await;
        telemetry.set_draining();
        info!(
            grace_ms = config.shutdown_grace.as_millis() as u64,
            "shutting down: no new requests, finishing in-flight calls"
        );
        // The grace counts from the signal: in-flight calls run on while the readers' last
        // blocking reads return (what they delivered is handled, not left pending).
        if !shutdown.drain(config.shutdown_grace).await {
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
        if let Err(err) = publisher.withdraw().await {
            warn!(error = %err, "cannot remove the registry heartbeat");
        }
        for stream in [requests_key.as_str(), inbox.topic()] {
            match bus.delete_consumer(stream, &raw.daemon.toolbox_id, &consumer).await {
                Ok(true) => {}
                Ok(false) => info!(stream, "consumer keeps pending entries; left for a replica to reclaim"),
                Err(err) => warn!(error = %err, stream, "cannot delete this consumer"),
            }
        }
        info!("stopped");
        drop(http);
        Ok(())
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
