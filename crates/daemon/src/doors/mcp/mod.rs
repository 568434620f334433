//! The MCP door: every tool of every live toolbox, served to MCP clients.
//!
//! Two ways in, one handler ([`handler::Session`]):
//!
//! - `toolhost mcp`: a stdio MCP server, the form desktop and IDE clients launch
//!   ([`serve_stdio`]);
//! - `[mcp] listen` in `toolhost serve`: streamable HTTP at `/mcp` on its own port
//!   ([`http::serve`], started by [`start`]).
//!
//! Both are clients of the fleet ([`crate::fleet_client`]): they host no tool, and each call is
//! a request on the requests stream, answered by whichever toolbox hosts the tool. A call of a
//! tool whose timeout is above `[mcp] task_threshold_ms` becomes a durable task ([`tasks`]) for
//! clients that declare the tasks extension.
//!
//! The door owns `[mcp]` ([`Settings`]).

mod handler;
mod http;
mod settings;
mod tasks;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rmcp::ServiceExt;
use sha2::Digest as _;
use tokio_util::sync::CancellationToken;
use toolhost_bus::{FleetAccess, RedisBus};
use tracing::info;

pub use settings::Settings;

use crate::config::Config;
use crate::fleet_client::{ClientSettings, FleetClient};
use handler::{Door, Session};

/// How long a fleet client's private stream outlives a door that died without closing it.
const STREAM_TTL: Duration = Duration::from_secs(60);

/// Opens the fleet client and builds the door shared by every session.
async fn door(
    config: &Config,
    bus: Arc<dyn FleetAccess>,
    transport: &'static str,
) -> anyhow::Result<Arc<Door>> {
    let settings = &config.raw.doors.mcp;
    let tenant = Some(settings.tenant.clone()).filter(|tenant| !tenant.is_empty());
    let client = ClientSettings {
        requests_topic: config.raw.streams.requests.clone(),
        source: format!("toolhost:mcp:{transport}"),
        stream_ttl: STREAM_TTL,
        watch_period: Some(settings.watch_period()),
        signing: config.auth.door_key().cloned(),
        tenant: tenant.clone(),
    };
    let fleet = FleetClient::open(bus, config.keys(), client)
        .await
        .map_err(|err| anyhow::anyhow!(crate::client::redis_failure(&config.raw.redis, &err)))?;
    // Validated when the configuration was loaded.
    let tools = settings.tools.iter().filter_map(|pattern| glob::Pattern::new(pattern).ok()).collect();
    Ok(Arc::new(Door {
        fleet,
        tools,
        page_size: settings.page_size,
        task_threshold: settings.task_threshold(),
        tasks: tasks::Tasks { retention: config.answered_retention },
        transport,
        auth: config.auth.clone(),
        tenant,
    }))
}

/// `toolhost mcp`: serves one MCP client over stdin and stdout until it closes them.
///
/// # Errors
/// Redis cannot be reached, or the client broke the protocol before initializing.
pub async fn serve_stdio(config: &Config) -> anyhow::Result<()> {
    let bus: Arc<dyn FleetAccess> = Arc::new(
        RedisBus::new(config.redis_options())
            .map_err(|err| anyhow::anyhow!(crate::client::redis_failure(&config.raw.redis, &err)))?,
    );
    let door = door(config, bus, "stdio").await?;
    info!(tools = door.fleet.tools().len(), "MCP door serving over stdio");
    let running = Session::new(door.clone())
        .serve(rmcp::transport::io::stdio())
        .await
        .context("the MCP client did not initialize")?;
    let res = running.waiting().await;
    door.fleet.close().await;
    res.map(|_| ()).context("the MCP session ended with an error")
}

/// Starts the HTTP door when `[mcp] listen` is set; it stops when `stop` is cancelled.
///
/// # Errors
/// Redis cannot be reached, or the address cannot be bound.
pub(crate) async fn start(
    config: &Config,
    bus: Arc<dyn FleetAccess>,
    stop: CancellationToken,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let settings = &config.raw.doors.mcp;
    let Some(addr) = settings.listen_addr() else { return Ok(None) };
    let tokens = (!settings.tokens.is_empty()).then(|| http::Tokens {
        known: settings
            .tokens
            .iter()
            .filter_map(|token| {
                // Checked when the configuration was loaded.
                let secret = config.mcp_env.0.get(&token.secret_env)?;
                let digest: [u8; 32] = sha2::Sha256::digest(secret.as_bytes()).into();
                Some((digest, token.id.clone(), token.tenant.clone()))
            })
            .collect(),
        bus: bus.clone(),
        audit_topic: config.keys().audit(&config.raw.daemon.toolbox_id),
        audit_max_len: config.auth.audit_max_len(),
    });
    let door = door(config, bus, "http").await?;
    let server = http::serve(door.clone(), settings, tokens, addr, stop.clone()).await?;
    Ok(Some(tokio::spawn(async move {
        stop.cancelled().await;
        let _ = server.await;
        door.fleet.close().await;
    })))
}
