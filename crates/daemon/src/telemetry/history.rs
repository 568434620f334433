//! The recent history of one replica, for the console's charts: every [`POINT_EVERY`] the
//! replica appends one point to its stream `toolhost:history:<toolbox_id>:<consumer>` (capped at
//! [`POINTS`], an hour; the key expires [`KEEP_FOR`] after the last point, so a replica that is
//! gone leaves nothing behind).
//!
//! A point is `{"t", "in_flight", "pending", "lag", "tools": {<tool>: {"calls", "errors",
//! "buckets"}}}`: the calls answered during the interval, by tool label (bounded, as the metrics'
//! labels are), those answered with an error, and their durations counted in the buckets of
//! [`BUCKETS_MS`] (the last count is above the last bound), so the console can merge replicas
//! and read percentiles; in-flight calls, and the pending count and lag of the requests stream's
//! group, at the point's time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use toolhost_bus::FleetAccess;

/// One point this often.
pub const POINT_EVERY: Duration = Duration::from_secs(5);
/// Points kept per replica: an hour.
pub const POINTS: u64 = 720;
/// A replica's history expires this long after its last point.
pub const KEEP_FOR: Duration = Duration::from_secs(2 * 3600);
/// Upper bounds of the duration buckets, in milliseconds.
pub const BUCKETS_MS: &[f64] = &[
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10_000.0, 30_000.0,
    60_000.0,
];

/// One tool's calls during the current interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ToolInterval {
    pub calls: u64,
    pub errors: u64,
    /// Counts by [`BUCKETS_MS`], plus one above the last bound.
    pub buckets: Vec<u64>,
}

impl ToolInterval {
    /// Counts one answered call.
    pub(crate) fn record(&mut self, error: bool, duration: Duration) {
        if self.buckets.is_empty() {
            self.buckets = vec![0; BUCKETS_MS.len() + 1];
        }
        self.calls += 1;
        self.errors += u64::from(error);
        let millis = duration.as_secs_f64() * 1000.0;
        let bucket = BUCKETS_MS.iter().position(|bound| millis <= *bound).unwrap_or(BUCKETS_MS.len());
        self.buckets[bucket] += 1;
    }
}

/// Which outcomes are answered calls, and which of those are errors: duplicates, acks, hand-overs
/// and entries left pending are not calls of this replica.
pub(crate) fn classify(outcome: &str) -> Option<bool> {
    match outcome {
        "success" | "help" | "replayed" => Some(false),
        "ignored" | "duplicate" | "left_pending" | "handed_over" => None,
        _ => Some(true),
    }
}

/// A point of the history, as JSON text.
pub(crate) fn point(
    time_ms: u64,
    in_flight: i64,
    (pending, lag): (u64, u64),
    tools: &BTreeMap<String, ToolInterval>,
) -> String {
    let tools: serde_json::Map<String, Value> = tools
        .iter()
        .filter(|(_, interval)| interval.calls > 0)
        .map(|(tool, interval)| {
            (
                tool.clone(),
                json!({"calls": interval.calls, "errors": interval.errors, "buckets": interval.buckets}),
            )
        })
        .collect();
    json!({"t": time_ms, "in_flight": in_flight.max(0), "pending": pending, "lag": lag, "tools": tools})
        .to_string()
}

/// Appends a point every [`POINT_EVERY`] until `stop` fires; a failed write is skipped (the
/// chart has a gap), never retried.
pub(crate) async fn run(
    telemetry: super::Telemetry,
    bus: Arc<dyn FleetAccess>,
    key: String,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut ticks = tokio::time::interval(POINT_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let payload = telemetry.history_point();
        let id = toolhost_envelope::new_message_id();
        let fields = [("id", id.as_str()), ("payload", payload.as_str())];
        match bus.append(&key, &fields, Some(POINTS)).await {
            Ok(_) => {
                let _ = bus.expire(&key, KEEP_FOR).await;
            }
            Err(err) => tracing::debug!(error = %err, "cannot write a history point; skipped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_fall_in_their_buckets_and_points_keep_only_tools_that_were_called() {
        let mut interval = ToolInterval::default();
        interval.record(false, Duration::from_micros(800));
        interval.record(true, Duration::from_millis(30));
        interval.record(false, Duration::from_secs(100));
        assert_eq!((interval.calls, interval.errors), (3, 1));
        assert_eq!(interval.buckets[0], 1);
        assert_eq!(interval.buckets[5], 1);
        assert_eq!(interval.buckets[BUCKETS_MS.len()], 1);
        let tools =
            BTreeMap::from([("echo".to_owned(), interval), ("idle".to_owned(), ToolInterval::default())]);
        let point: Value = serde_json::from_str(&point(1000, 2, (3, 4), &tools)).unwrap();
        assert_eq!(point["t"], 1000);
        assert_eq!(
            (point["in_flight"].as_u64(), point["pending"].as_u64(), point["lag"].as_u64()),
            (Some(2), Some(3), Some(4))
        );
        assert_eq!(point["tools"].as_object().unwrap().keys().collect::<Vec<_>>(), ["echo"]);
        assert_eq!(point["tools"]["echo"]["calls"], 3);
        assert_eq!(classify("success"), Some(false));
        assert_eq!(classify("timeout"), Some(true));
        assert_eq!(classify("duplicate"), None);
    }
}
