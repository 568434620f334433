//! The web console (`[console] listen`): the fleet, its tools with a try-it form, the call log
//! and the dead letters, for operators.
//!
//! It is a door like the MCP door: a client of the fleet ([`FleetClient`]), so a call from its
//! try-it form is a `tool.invoke` on the requests stream, signed with `[auth] door_key`, made for
//! `[console] tenant`, and gets the whole lifecycle (policy, limits, ledger) from whichever
//! toolbox hosts the tool. What it shows it reads from Redis: the heartbeats and registries
//! (fleet, tools, sources), the consumer groups, the call logs `calls:<toolbox_id>`, the dead
//! letters `dlq:<toolbox_id>` and the ledger's kept answers.
//!
//! - [`access`]: the bearer token (header or login cookie), the CSRF token of mutating requests,
//!   and the security headers of every response.
//! - [`pages`]: the server-rendered HTML; every string that came from a tool or a caller is
//!   escaped there.
//! - [`api`]: the JSON and SSE endpoints the pages' script uses.
//! - [`read`]: what the pages show, read from Redis.
//!
//! The front end is two static files embedded in the binary (`assets/`), with no build step.

mod access;
mod api;
mod pages;
mod read;
pub(crate) mod settings;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use toolhost_bus::{Bus, Keys};
use tracing::info;

use super::context::{Checks, DoorContext, FleetDoor};
use crate::fleet_client::FleetClient;

pub use settings::Settings;

/// How long the console's private response stream outlives it when it dies without closing.
const STREAM_TTL: Duration = Duration::from_secs(600);

/// How often the console reads the fleet's tools again.
const WATCH_PERIOD: Duration = Duration::from_secs(2);

/// What every handler shares.
pub(crate) struct Console {
    fleet: FleetClient,
    bus: Arc<dyn Bus>,
    keys: Keys,
    /// Bare name of the requests stream.
    requests_stream: String,
    /// Its shards: a request's ledger is its home shard's.
    shards: toolhost_bus::Shards,
    /// Bare name of the default results stream.
    results_stream: String,
    /// This daemon's toolbox id (its audit stream is the console's).
    toolbox_id: String,
    tenant: Option<String>,
    call_timeout: Duration,
    audit_topic: String,
    audit_max_len: u64,
    /// `single`, `cluster` or `sentinel`, and the address as the configuration describes it.
    topology: &'static str,
    redis: String,
    access: access::Access,
    /// Calls made from the try-it form, by request id, while their pages may follow them.
    calls: Mutex<HashMap<String, Arc<api::Followed>>>,
    /// `[console] trace_url`: a call's trace in a trace viewer, `{trace_id}` in it; empty: none.
    trace_url: String,
    /// Makes the console's span of each call.
    telemetry: crate::telemetry::Telemetry,
}

impl Console {
    /// The calls followed by pages, by request id.
    fn lock_calls(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<api::Followed>>> {
        self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl FleetDoor for Settings {
    fn validate(&self, checks: &Checks<'_>) -> Vec<toolhost_settings::KeyError> {
        Settings::validate(self, checks.vars)
    }

    /// Starts the console when `[console] listen` is set.
    async fn start(&self, cx: &DoorContext) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
        start(self, cx).await
    }
}

/// Starts the console when `[console] listen` is set; it stops when the context's `stop` is
/// cancelled.
///
/// # Errors
/// Redis cannot be reached, or the address cannot be bound.
async fn start(settings: &Settings, cx: &DoorContext) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(addr) = settings.listen_addr() else { return Ok(None) };
    // Checked when the configuration was loaded.
    let token =
        Some(settings.token_env.trim()).filter(|name| !name.is_empty()).and_then(|name| cx.env.get(name));
    let fleet = cx.open_fleet("toolhost:console", STREAM_TTL, WATCH_PERIOD, settings.tenant()).await?;
    let audit = cx.audit();
    let console = Arc::new(Console {
        fleet,
        bus: cx.bus.clone(),
        keys: cx.keys.clone(),
        requests_stream: cx.requests_stream.clone(),
        shards: cx.shards.clone(),
        results_stream: cx.results_stream.clone(),
        toolbox_id: cx.toolbox_id.clone(),
        tenant: settings.tenant(),
        call_timeout: Duration::from_millis(settings.call_timeout_ms),
        audit_topic: audit.topic,
        audit_max_len: audit.max_len,
        topology: cx.topology,
        redis: cx.redis.described().to_owned(),
        access: access::Access::new(token),
        calls: Mutex::new(HashMap::new()),
        trace_url: settings.trace_url.trim().to_owned(),
        telemetry: cx.telemetry.clone(),
    });
    let stop = cx.stop.clone();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|err| anyhow::anyhow!("console.listen: cannot listen on {addr}: {err}"))?;
    let bound: SocketAddr = listener.local_addr()?;
    info!(address = %bound, "console listening");
    let app = router(console.clone());
    let server_stop = stop.clone();
    let server = tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(async move {
            server_stop.cancelled().await;
        });
        if let Err(err) = served.await {
            tracing::warn!(error = %err, "the console stopped serving");
        }
    });
    Ok(Some(tokio::spawn(async move {
        stop.cancelled().await;
        // Live views (SSE) end with the process; the server is not waited for past a moment.
        let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
        console.fleet.close().await;
    })))
}

/// The console's routes, behind its access checks.
fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/", get(pages::index))
        .route("/fleet", get(pages::fleet))
        .route("/tools", get(pages::tools))
        .route("/tools/{name}", get(pages::tool))
        .route("/calls", get(pages::calls))
        .route("/calls/{toolbox}/{log_id}", get(pages::call))
        .route("/dlq", get(pages::dead_letters))
        .route("/dlq/{toolbox}/{dlq_id}", get(pages::letter))
        .route("/static/console.js", get(pages::script))
        .route("/static/console.css", get(pages::style))
        .route("/api/fleet", get(api::fleet))
        .route("/api/history", get(api::history))
        .route("/api/call", post(api::call))
        .route("/api/cancel", post(api::cancel))
        .route("/api/calls/stream", get(api::call_log))
        .route("/api/calls/{request_id}/events", get(api::events))
        .route("/api/dlq/{toolbox}/{dlq_id}/replay", post(api::replay))
        .route("/api/dlq/{toolbox}/{dlq_id}/delete", post(api::delete))
        .layer(axum::middleware::from_fn_with_state(console.clone(), access::check))
        .with_state(console)
}
