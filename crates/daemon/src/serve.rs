//! `toolhost serve`: builds the daemon from a validated [`Config`] and runs it until shutdown.
//!
//! Start-up order: the HTTP endpoint first (so `/healthz` answers and `/readyz` explains what is
//! missing while Redis is still out of reach), then the readiness probe, then the consumer group,
//! then the loops. Shutdown runs the other way round; the HTTP endpoint answers until the end.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use toolhost_bus::{Bus, Keys, RedisBus, RedisOptions, ResponseTopics};
use toolhost_tools::builtin::{AgentSettings, AgentTool, ChatSend, Echo, Synthetic, TerminalRun};
use toolhost_tools::terminal::TerminalPolicy;
use toolhost_tools::{DEFAULT_MAX_QUEUE, LimitSettings, Registry, ToolLimits};
use tracing::{info, warn};

use crate::config::{Config, ConfigError, KeyError, mask_url};
use crate::dispatch::{DispatchSettings, Dispatcher};
use crate::group::{GroupReader, GroupSettings};
use crate::http::HttpServer;
use crate::inbox::{Inbox, InboxSettings};
use crate::outage::redis_warn;
use crate::probe::{Probe, WatchedGroup};
use crate::publish::Publisher;
use crate::services::Services;
use crate::shutdown::Shutdown;
use crate::stats::Stats;
use crate::telemetry::Telemetry;

/// Options of `serve` that are not configuration.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// How many synthetic benchmark tools to register.
    pub synthetic_tools: usize,
}

/// Builds the registry of built-in tools (plus synthetic ones and the configured specialist
/// agents) as configured; `bus` and `keys` serve the chat tools.
///
/// # Errors
/// A tool cannot be registered, or a disabled tool name is unknown (a [`ConfigError`] naming
/// `tools.disabled`, so `main` exits 64 for it).
pub fn build_registry(
    config: &Config,
    options: &ServeOptions,
    bus: &Arc<dyn Bus>,
    keys: &Keys,
) -> anyhow::Result<Registry> {
    let daemon = &config.raw.daemon;
    let mut registry = Registry::new();
    registry.register(Arc::new(Echo))?;
    let (policy, warnings) = TerminalPolicy::new(&config.raw.tools.terminal);
    for warning in warnings {
        warn!(warning = %warning, "terminal policy");
    }
    registry.register(Arc::new(TerminalRun::new(policy)))?;
    let chat_send =
        ChatSend::new(bus.clone(), keys.clone(), &daemon.agent_name, &daemon.chat_conversation_id);
    registry.register(Arc::new(chat_send))?;
    for (index, agent) in config.raw.agents.iter().enumerate() {
        let settings = AgentSettings {
            name: agent.name.clone(),
            description: agent.description.clone(),
            parameter: agent.parameter.clone(),
            timeout: std::time::Duration::from_secs_f64(agent.timeout_s),
        };
        let tool = AgentTool::new(bus.clone(), keys.clone(), &daemon.agent_name, settings);
        registry.register(Arc::new(tool)).with_context(|| format!("agents[{index}]"))?;
    }
    for index in 0..options.synthetic_tools {
        registry.register(Arc::new(Synthetic::new(index)))?;
    }
    let mut errors = Vec::new();
    let unknown = registry.disable(&config.raw.tools.disabled);
    if !unknown.is_empty() {
        errors.push(KeyError {
            key: "tools.disabled".to_owned(),
            message: format!("names unknown tools: {}", unknown.join(", ")),
        });
    }
    for name in config.raw.tools.limits.keys().filter(|name| !registry.contains(name)) {
        errors.push(KeyError {
            key: format!("tools.limits.{name}"),
            message: "no tool has this name".to_owned(),
        });
    }
    if !errors.is_empty() {
        return Err(ConfigError(errors).into());
    }
    Ok(registry)
}

/// The per-tool limits: each tool's own `max_concurrent` (the terminal's setting, for one),
/// overridden by `[tools.limits."<name>"]`, with a queue of [`DEFAULT_MAX_QUEUE`] unless set.
pub fn tool_limits(config: &Config, registry: &Registry) -> ToolLimits {
    let configured = &config.raw.tools.limits;
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
    ToolLimits::new(limits)
}

/// The bus and key names `config` asks for.
///
/// # Errors
/// The Redis URL is unusable.
pub fn connect(config: &Config) -> anyhow::Result<(Arc<dyn Bus>, Keys)> {
    let raw = &config.raw;
    let mut redis_options = RedisOptions::new(raw.redis.url.clone());
    redis_options.maxlen = raw.streams.maxlen;
    redis_options.response_timeout = std::time::Duration::from_millis(raw.redis.response_timeout_ms);
    let bus: Arc<dyn Bus> = Arc::new(RedisBus::new(redis_options).context("redis.url")?);
    Ok((bus, Keys::new(raw.redis.key_prefix.clone())))
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
/// Redis URL unusable or a tool cannot be registered.
pub async fn run(
    config: Config,
    options: ServeOptions,
    signal: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let (bus, keys) = connect(&config)?;
    let registry = build_registry(&config, &options, &bus, &keys)?;
    run_with_bus(config, bus, keys, registry, signal).await
}

/// Runs the daemon with a registry built by the caller (tests register their own tools).
///
/// # Errors
/// Redis URL unusable, or `[http] listen` cannot be bound.
pub async fn run_with_registry(
    config: Config,
    registry: Registry,
    signal: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let (bus, keys) = connect(&config)?;
    run_with_bus(config, bus, keys, registry, signal).await
}

/// Runs the daemon over `bus` with a registry built for it.
async fn run_with_bus(
    config: Config,
    bus: Arc<dyn Bus>,
    keys: Keys,
    registry: Registry,
    signal: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let raw = &config.raw;
    let limits = Arc::new(tool_limits(&config, &registry));
    let registry = Arc::new(registry);
    let consumer = consumer_name();
    let shutdown = Shutdown::new();
    let telemetry = Telemetry::new();
    let http = HttpServer::start(config.http_listen, telemetry.clone()).context("http.listen")?;
    info!(addr = %http.local_addr(), "http listening");
    let stats = Arc::new(Stats::default());
    let settings = DispatchSettings {
        toolbox_id: raw.daemon.toolbox_id.clone(),
        consumer: consumer.clone(),
        requests_topic: raw.streams.requests.clone(),
        results_topic: raw.streams.results.clone(),
        max_payload_bytes: raw.streams.max_payload_bytes,
        read_batch: raw.dispatch.read_batch,
        block: config.block,
        claim_idle: config.claim_idle,
        max_deliveries: raw.dispatch.max_deliveries,
        answered_retention: config.answered_retention,
        max_request_age: config.max_request_age,
        answer_unknown_tools: raw.dispatch.answer_unknown_tools,
        response_topics: ResponseTopics::new(
            &raw.streams.response_topics,
            &raw.streams.results,
            &raw.streams.requests,
        )
        .map_err(|err| {
            ConfigError(vec![KeyError { key: "streams.response_topics".to_owned(), message: err }])
        })?,
    };
    let services = Services {
        bus: bus.clone(),
        registry: registry.clone(),
        limits,
        keys: keys.clone(),
        stats,
        telemetry: telemetry.clone(),
        shutdown: shutdown.clone(),
    };
    let inbox = chat_inbox(&config, services.clone(), &consumer);
    let dispatcher = Arc::new(Dispatcher::new(services, settings));
    let requests = Arc::new(GroupReader::new(
        bus.clone(),
        dispatcher.group_settings(),
        dispatcher.clone(),
        raw.dispatch.max_in_flight,
        shutdown.clone(),
        telemetry.clone(),
    ));
    let publisher = Arc::new(Publisher {
        bus: bus.clone(),
        registry: registry.clone(),
        keys: keys.clone(),
        toolbox_id: raw.daemon.toolbox_id.clone(),
        consumer: consumer.clone(),
        period: config.heartbeat,
        requests_topic: keys.topic(&raw.streams.requests),
        results_topic: keys.topic(&raw.streams.results),
    });

    let probe = Probe {
        redis: mask_url(&raw.redis.url),
        bus: bus.clone(),
        telemetry: telemetry.clone(),
        groups: vec![
            WatchedGroup {
                stream: dispatcher.requests_key().to_owned(),
                group: raw.daemon.toolbox_id.clone(),
            },
            WatchedGroup { stream: inbox.topic().to_owned(), group: raw.daemon.toolbox_id.clone() },
        ],
    };
    let probing = tokio::spawn(probe.run(shutdown.stopping().clone()));

    tokio::pin!(signal);
    let ready = tokio::select! {
        ready = async { requests.ensure_group().await && inbox.ensure_group().await } => ready,
        () = &mut signal => false,
    };
    if !ready {
        info!("stopped before the consumer group could be created");
        shutdown.stopping().cancel();
        let _ = probing.await;
        return Ok(());
    }
    telemetry.set_groups_ready(true);
    telemetry.set_redis_up(true);
    // Before `ready`, so whoever waits for that line finds the tools listed in Redis.
    let fields = publisher.fields();
    if let Err(err) = publisher.publish_once(&fields).await {
        redis_warn!(&err, error = %err, "cannot publish the tool registry yet; will retry");
    }
    info!(
        version = env!("CARGO_PKG_VERSION"),
        toolbox_id = %raw.daemon.toolbox_id,
        agent_name = %raw.daemon.agent_name,
        consumer = %consumer,
        redis = %mask_url(&raw.redis.url),
        requests = %dispatcher.requests_key(),
        group = %raw.daemon.toolbox_id,
        results = %keys.topic(&raw.streams.results),
        inbox = %inbox.topic(),
        dead_letters = %keys.dead_letters(&raw.daemon.toolbox_id),
        tools = %registry.names().join(","),
        http = %http.local_addr(),
        "ready"
    );
    let reader = tokio::spawn(requests.clone().run_reader());
    let reclaimer = tokio::spawn(requests.clone().run_reclaimer());
    let beating = tokio::spawn(publisher.clone().run(fields, shutdown.clone()));
    // Tracked, so the drain waits for them; both stop taking work when `stopping` fires.
    shutdown.tasks().spawn(inbox.clone().run_reader());
    shutdown.tasks().spawn(inbox.clone().run_reclaimer());

    signal.await;
    telemetry.set_draining();
    info!(
        grace_ms = config.shutdown_grace.as_millis() as u64,
        "shutting down: no new requests, finishing in-flight calls"
    );
    // The grace counts from the signal: in-flight calls run on while the reader's last blocking
    // read returns (what it delivered is handled, not left pending).
    let grace_ends = tokio::time::Instant::now() + config.shutdown_grace;
    shutdown.stopping().cancel();
    let _ = reader.await;
    let _ = reclaimer.await;
    let _ = probing.await;
    let finished = shutdown.drain(grace_ends.saturating_duration_since(tokio::time::Instant::now())).await;
    if !finished {
        warn!("grace period over; unfinished calls are left pending for another replica");
    }
    let _ = beating.await;
    if let Err(err) = publisher.withdraw().await {
        warn!(error = %err, "cannot remove the registry heartbeat");
    }
    for stream in [dispatcher.requests_key(), inbox.topic()] {
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

/// The chat inbox of `[daemon] agent_name`, read through the toolbox's group.
fn chat_inbox(config: &Config, services: Services, consumer: &str) -> Arc<GroupReader<Inbox>> {
    let raw = &config.raw;
    let (bus, shutdown, telemetry) =
        (services.bus.clone(), services.shutdown.clone(), services.telemetry.clone());
    let heartbeat_prefix = services.keys.heartbeat_prefix(&raw.daemon.toolbox_id);
    let inbox = Inbox::new(
        services,
        InboxSettings {
            agent_name: raw.daemon.agent_name.clone(),
            toolbox_id: raw.daemon.toolbox_id.clone(),
            consumer: consumer.to_owned(),
            max_payload_bytes: raw.streams.max_payload_bytes,
            claim_idle: config.claim_idle,
            max_deliveries: raw.dispatch.max_deliveries,
            answered_retention: config.answered_retention,
        },
    );
    let settings = GroupSettings {
        topic: inbox.topic().to_owned(),
        group: raw.daemon.toolbox_id.clone(),
        consumer: consumer.to_owned(),
        read_batch: raw.dispatch.read_batch,
        block: config.block,
        claim_idle: config.claim_idle,
        heartbeat_prefix,
    };
    Arc::new(GroupReader::new(
        bus,
        settings,
        Arc::new(inbox),
        raw.dispatch.max_in_flight,
        shutdown,
        telemetry,
    ))
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
