//! The MCP door: every tool of every live toolbox, served to MCP clients.
//!
//! Two ways in, one handler ([`handler::Session`], its tools half in [`tools`]):
//!
//! - `toolhost mcp`: a stdio MCP server, the form desktop and IDE clients launch
//!   ([`serve_stdio`]);
//! - `[mcp] listen` in `toolhost serve`: streamable HTTP at `/mcp` on its own port
//!   ([`http::serve`], started by [`FleetDoor::start`]).
//!
//! Both are clients of the fleet ([`crate::fleet_client`]): they host no tool, and each call is
//! a request on the requests stream, answered by whichever toolbox hosts the tool. A call of a
//! tool whose timeout is above `[mcp] task_threshold_ms` becomes a durable task ([`tasks`]) for
//! clients that declare the tasks extension.
//!
//! A hosted tool's questions (elicitation, sampling) are asked of the door's client when it
//! declared the capability ([`elicit`]), else declined.
//!
//! The door owns `[mcp]` ([`Settings`]).

mod catalog;
mod elicit;
mod generation;
mod handler;
mod http;
mod logging;
mod mrtr;
mod oauth;
mod resource_updates;
mod settings;
mod subscriptions;
mod tasks;
mod tools;
mod trace;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rmcp::ServiceExt;
use sha2::Digest as _;
use tracing::info;

pub use settings::Settings;

use super::context::{Checks, DoorContext, FleetDoor};
use handler::{Door, Session};

/// How long a fleet client's private stream outlives a door that died without closing it.
const STREAM_TTL: Duration = Duration::from_secs(60);

/// Opens the fleet client and builds the door shared by every session.
async fn door(settings: &Settings, cx: &DoorContext, transport: &'static str) -> anyhow::Result<Arc<Door>> {
    let tenant = Some(settings.tenant.clone()).filter(|tenant| !tenant.is_empty());
    let source = format!("toolhost:mcp:{transport}");
    let fleet = cx.open_fleet(&source, STREAM_TTL, settings.watch_period(), tenant.clone()).await?;
    let subscriptions = subscriptions::Subscriptions::new(&fleet);
    // Validated when the configuration was loaded.
    let tools = settings.tools.iter().filter_map(|pattern| glob::Pattern::new(pattern).ok()).collect();
    Ok(Arc::new(Door {
        fleet,
        tools,
        page_size: settings.page_size,
        task_threshold: settings.task_threshold(),
        tasks: tasks::Tasks { retention: cx.answered_retention },
        transport,
        auth: cx.auth.clone(),
        tenant,
        list_ttl_ms: settings.watch_ms,
        subscriptions,
        telemetry: cx.telemetry.clone(),
        request_states: mrtr::RequestStates::default(),
    }))
}

/// `toolhost mcp`: serves one MCP client over stdin and stdout until it closes them.
///
/// # Errors
/// Redis cannot be reached, or the client broke the protocol before initializing.
pub(crate) async fn serve_stdio(settings: &Settings, cx: &DoorContext) -> anyhow::Result<()> {
    let door = door(settings, cx, "stdio").await?;
    info!(tools = door.fleet.tools().len(), "MCP door serving over stdio");
    let running = Session::new(door.clone())
        .serve(rmcp::transport::io::stdio())
        .await
        .context("the MCP client did not initialize")?;
    let res = running.waiting().await;
    door.subscriptions.stop();
    door.fleet.close().await;
    res.map(|_| ()).context("the MCP session ended with an error")
}

impl FleetDoor for Settings {
    fn validate(&self, checks: &Checks<'_>) -> Vec<toolhost_settings::KeyError> {
        Settings::validate(self, checks.vars)
    }

    /// Starts the HTTP door when `[mcp] listen` is set.
    async fn start(&self, cx: &DoorContext) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
        let Some(addr) = self.listen_addr() else { return Ok(None) };
        let oauth = match &self.oauth {
            Some(settings) => Some(Arc::new(oauth::OAuth::new(settings, &self.tenant)?)),
            None => None,
        };
        let tokens = (!self.tokens.is_empty() || oauth.is_some()).then(|| {
            let audit = cx.audit();
            http::Tokens {
                oauth,
                known: self
                    .tokens
                    .iter()
                    .filter_map(|token| {
                        // Checked when the configuration was loaded.
                        let secret = cx.env.get(&token.secret_env)?;
                        let digest: [u8; 32] = sha2::Sha256::digest(secret.as_bytes()).into();
                        Some((digest, token.id.clone(), token.tenant.clone()))
                    })
                    .collect(),
                bus: cx.bus.clone(),
                audit_topic: audit.topic,
                audit_max_len: audit.max_len,
            }
        });
        let door = door(self, cx, "http").await?;
        let stop = cx.stop.clone();
        let server = http::serve(door.clone(), self, tokens, addr, stop.clone()).await?;
        Ok(Some(tokio::spawn(async move {
            stop.cancelled().await;
            let _ = server.await;
            door.subscriptions.stop();
            door.fleet.close().await;
        })))
    }
}
