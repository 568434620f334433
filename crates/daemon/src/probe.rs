//! The readiness probe: every [`PERIOD`] it pings Redis and reads the consumer groups
//! (`XINFO GROUPS`) through the bus, so `/readyz` and the group metrics tell the truth even while
//! no request arrives.
//!
//! It only observes: re-creating a vanished group is the dispatcher's job (on `NOGROUP`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use toolhost_bus::Server;

use crate::outage::{OutageLog, redis_warn};
use crate::telemetry::Telemetry;

/// How often the probe runs.
pub const PERIOD: Duration = Duration::from_millis(500);
/// How long one probe may wait for Redis before it counts as not answering.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Histograms are folded into their buckets every this many probes.
const UPKEEP_EVERY: u32 = 10;

/// A consumer group the daemon reads through, and must exist for it to be ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedGroup {
    /// Full key of the stream.
    pub stream: String,
    /// The group's name.
    pub group: String,
}

/// Probes Redis and the watched groups, recording what it finds in [`Telemetry`].
pub struct Probe {
    /// The Redis URL, password masked, for the outage lines.
    pub redis: String,
    /// The transport.
    pub bus: Arc<dyn Server>,
    /// Where readiness and group metrics go.
    pub telemetry: Telemetry,
    /// The groups that must exist.
    pub groups: Vec<WatchedGroup>,
}

impl Probe {
    /// Probes every [`PERIOD`] until `stop` fires.
    pub async fn run(self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut outage = OutageLog::new(self.redis.clone());
        let mut n_probes: u32 = 0;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            let res = self.probe().await;
            outage.log(res.is_ok(), res.err().as_deref(), Instant::now());
            n_probes = n_probes.wrapping_add(1);
            if n_probes.is_multiple_of(UPKEEP_EVERY) {
                self.telemetry.run_upkeep();
            }
        }
    }

    /// One probe. Returns whether Redis answered.
    #[cfg(test)]
    pub async fn once(&self) -> bool {
        self.probe().await.is_ok()
    }

    /// One probe. Returns why Redis did not answer, if it did not.
    async fn probe(&self) -> Result<(), String> {
        let ping = match tokio::time::timeout(TIMEOUT, self.bus.ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_elapsed) => Err(format!("no answer to PING within {} ms", TIMEOUT.as_millis())),
        };
        let up = ping.is_ok();
        let mut groups_ready = up;
        if up {
            for watched in &self.groups {
                groups_ready &= self.check_group(watched).await;
            }
        }
        self.telemetry.set_redis_up(up);
        self.telemetry.set_groups_ready(groups_ready);
        self.telemetry.probed();
        ping
    }

    /// Records the group's pending count and lag; returns whether it exists.
    async fn check_group(&self, watched: &WatchedGroup) -> bool {
        let groups = match tokio::time::timeout(TIMEOUT, self.bus.group_info(&watched.stream)).await {
            Ok(Ok(groups)) => groups,
            Ok(Err(err)) => {
                redis_warn!(&err, error = %err, stream = %watched.stream, "cannot read the consumer groups");
                return false;
            }
            Err(_elapsed) => return false,
        };
        match groups.iter().find(|info| info.name == watched.group) {
            Some(info) => {
                self.telemetry.set_group(&watched.stream, &watched.group, info.pending, info.lag);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use toolhost_bus::{MemoryBus, Streams};

    use super::*;

    #[tokio::test]
    async fn groups_must_exist_and_their_counts_are_recorded() {
        let bus = Arc::new(MemoryBus::new());
        let telemetry = Telemetry::new();
        let watched = WatchedGroup { stream: "action-requests".to_owned(), group: "toolhost".to_owned() };
        let probe = Probe {
            redis: String::new(),
            bus: bus.clone(),
            telemetry: telemetry.clone(),
            groups: vec![watched],
        };
        assert!(probe.once().await);
        assert_eq!(telemetry.readiness().reasons, ["the consumer groups do not exist"]);
        bus.create_group("action-requests", "toolhost");
        bus.publish("action-requests", "m1", "{}").await.unwrap();
        probe.once().await;
        assert!(telemetry.readiness().is_ready());
        let text = telemetry.render();
        assert!(
            text.contains(r#"toolhost_group_lag{stream="action-requests",group="toolhost"} 1"#),
            "{text}"
        );
    }
}
