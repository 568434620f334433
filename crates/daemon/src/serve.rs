//! `toolhost serve`: builds the daemon from a validated [`Config`] and runs it until shutdown.
//!
//! Start-up order: the HTTP endpoint first (so `/healthz` answers and `/readyz` explains what is
//! missing while Redis is still out of reach), then the readiness probe, then the consumer group,
//! then the loops. Shutdown runs the other way round; the HTTP endpoint answers until the end.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use toolhost_bus::{Bus, Keys, RedisBus, RedisOptions};
use toolhost_tools::Registry;
use toolhost_tools::builtin::{Echo, Synthetic, TerminalRun};
use toolhost_tools::terminal::TerminalPolicy;
use tracing::{info, warn};

use crate::config::{Config, ConfigError, KeyError, mask_url};
use crate::dispatch::{DispatchSettings, Dispatcher};
use crate::http::HttpServer;
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

/// Builds the registry of built-in tools (plus synthetic ones) as configured.
///
/// # Errors
/// A tool cannot be registered, or a disabled tool name is unknown (a [`ConfigError`] naming
/// `tools.disabled`, so `main` exits 64 for it).
pub fn build_registry(config: &Config, options: &ServeOptions) -> anyhow::Result<Registry> {
    let mut registry = Registry::new();
    registry.register(Arc::new(Echo))?;
    let (policy, warnings) = TerminalPolicy::new(&config.raw.tools.terminal);
    for warning in warnings {
        warn!(warning = %warning, "terminal policy");
    }
    registry.register(Arc::new(TerminalRun::new(policy)))?;
    for index in 0..options.synthetic_tools {
        registry.register(Arc::new(Synthetic::new(index)))?;
    }
    let unknown = registry.disable(&config.raw.tools.disabled);
    if !unknown.is_empty() {
        return Err(ConfigError(vec![KeyError {
            key: "tools.disabled".to_owned(),
            message: format!("names unknown tools: {}", unknown.join(", ")),
        }])
        .into());
    }
    Ok(registry)
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
    let registry = build_registry(&config, &options)?;
    run_with_registry(config, registry, signal).await
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
    let raw = &config.raw;
    let mut redis_options = RedisOptions::new(raw.redis.url.clone());
    redis_options.maxlen = raw.streams.maxlen;
    redis_options.response_timeout = std::time::Duration::from_millis(raw.redis.response_timeout_ms);
    let bus: Arc<dyn Bus> = Arc::new(RedisBus::new(redis_options).context("redis.url")?);
    let keys = Keys::new(raw.redis.key_prefix.clone());
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
    };
    let services = Services {
        bus: bus.clone(),
        registry: registry.clone(),
        keys: keys.clone(),
        stats,
        telemetry: telemetry.clone(),
        shutdown: shutdown.clone(),
    };
    let dispatcher = Arc::new(Dispatcher::new(services, settings, raw.dispatch.max_in_flight));
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
        bus: bus.clone(),
        telemetry: telemetry.clone(),
        groups: vec![WatchedGroup {
            stream: dispatcher.requests_key().to_owned(),
            group: raw.daemon.toolbox_id.clone(),
        }],
    };
    let probing = tokio::spawn(probe.run(shutdown.stopping().clone()));

    tokio::pin!(signal);
    let ready = tokio::select! {
        ready = dispatcher.ensure_group() => ready,
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
        warn!(error = %err, "cannot publish the tool registry yet; will retry");
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
        dead_letters = %keys.dead_letters(&raw.daemon.toolbox_id),
        tools = %registry.names().join(","),
        http = %http.local_addr(),
        "ready"
    );
    let reader = tokio::spawn(dispatcher.clone().run_reader());
    let reclaimer = tokio::spawn(dispatcher.clone().run_reclaimer());
    let beating = tokio::spawn(publisher.clone().run(fields, shutdown.clone()));

    signal.await;
    telemetry.set_draining();
    info!(
        grace_ms = config.shutdown_grace.as_millis() as u64,
        "shutting down: no new requests, finishing in-flight calls"
    );
    shutdown.stopping().cancel();
    let _ = reader.await;
    let _ = reclaimer.await;
    let _ = probing.await;
    let finished = shutdown.drain(config.shutdown_grace).await;
    if !finished {
        warn!("grace period over; unfinished calls are left pending for another replica");
    }
    let _ = beating.await;
    if let Err(err) = publisher.withdraw().await {
        warn!(error = %err, "cannot remove the registry heartbeat");
    }
    match bus.delete_consumer(dispatcher.requests_key(), &raw.daemon.toolbox_id, &consumer).await {
        Ok(true) => {}
        Ok(false) => info!("consumer keeps pending entries; left for a replica to reclaim"),
        Err(err) => warn!(error = %err, "cannot delete this consumer"),
    }
    info!("stopped");
    drop(http);
    Ok(())
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
