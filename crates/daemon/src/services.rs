//! The handles every loop of the daemon shares, created once by `serve::run`.

use std::sync::Arc;

use toolhost_bus::{Bus, Keys};
use toolhost_tools::{SharedRegistry, ToolLimits};

use crate::shutdown::Shutdown;
use crate::stats::Stats;
use crate::telemetry::Telemetry;

/// Shared handles: transport, tools, key names, statistics, telemetry and shutdown.
#[derive(Clone)]
pub struct Services {
    /// The transport.
    pub bus: Arc<dyn Bus>,
    /// The tools of this toolbox: the current snapshot, swapped whole on reload.
    pub registry: Arc<SharedRegistry>,
    /// Per-tool concurrency limits and wait queues, outside the registry.
    pub limits: Arc<ToolLimits>,
    /// What the other live replicas host.
    pub(crate) fleet: Arc<crate::fleet::Fleet>,
    /// Key and topic names.
    pub keys: Keys,
    /// Per-tool statistics for `tools.stats`.
    pub stats: Arc<Stats>,
    /// Metrics and readiness.
    pub telemetry: Telemetry,
    /// The shutdown signal and task tracker.
    pub shutdown: Shutdown,
    /// The calls running here, and the routing of `tool.cancel` between replicas.
    pub(crate) calls: Arc<crate::call::cancel::Calls>,
    /// `[dispatch] progress_per_second`: most progress entries per call and second.
    pub progress_per_second: u64,
    /// Signatures, tenant policy, rate limits and the audit stream.
    pub gate: Arc<crate::auth::Gate>,
    /// This toolbox's hosted MCP servers, for catalog requests (`call/catalog.rs`).
    pub(crate) hosted: Arc<crate::call::catalog::HostedCatalog>,
    /// The call log the console reads (`[console] record_calls`); `None`: off.
    pub(crate) call_log: Option<Arc<crate::call_log::CallLog>>,
}
