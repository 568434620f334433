//! Redis outages, reported once. Every loop that talks to Redis meets an outage at the same
//! time, and each used to log a warning per retry: about 40 lines every 10 s. Now the probe alone
//! reports it ([`OutageLog`]): once when it starts, again at a falling rate while it lasts, and
//! once when it ends, with its length. The loops log their own retries at `debug` while Redis
//! merely does not answer ([`redis_warn!`]), and at `warn` for anything else.

use std::time::{Duration, Instant};

use toolhost_bus::Error as BusError;
use tracing::{info, warn};

/// When a continuing outage is reported again, counted from its start; then every last step.
const REMINDERS: [Duration; 6] = [
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(60),
    Duration::from_secs(120),
    Duration::from_secs(300),
    Duration::from_secs(600),
];

/// What the start line suggests.
const HINT: &str = "is redis-server running and reachable at this URL? set REDIS_URL or [redis] url";
/// The same for a Redis Cluster.
const CLUSTER_HINT: &str = "are the cluster's nodes running and reachable, with the cluster state ok? set [redis] cluster_nodes (TOOLHOST__REDIS__CLUSTER_NODES)";
/// The same for a master found through Redis Sentinel.
const SENTINEL_HINT: &str = "are the sentinels reachable, and do they monitor the master with one up? set [redis] sentinels and sentinel_master";

/// Where Redis is, as a person reads it (the URL, the cluster's nodes or the sentinels, passwords
/// masked), and how to say what went wrong there: what a door or a command shows when Redis
/// fails.
#[derive(Debug, Clone, Default)]
pub struct RedisPlace {
    /// The description, e.g. `redis://127.0.0.1:6379` or `master m via sentinels ...`.
    described: String,
    /// The master's name when Redis is found through Sentinel.
    sentinel_master: Option<String>,
}

impl RedisPlace {
    /// The place `described`, found through the sentinels that watch `sentinel_master`, if any.
    pub fn new(described: String, sentinel_master: Option<String>) -> RedisPlace {
        RedisPlace { described, sentinel_master }
    }

    /// The description, passwords masked.
    pub fn described(&self) -> &str {
        &self.described
    }

    /// A Redis failure for a person: where Redis is, what went wrong and, when Redis does not
    /// answer, where to look.
    pub fn failure(&self, err: &BusError) -> String {
        let url = &self.described;
        if let BusError::Unreplicated { .. } = err {
            // Only with --replica-acks: the client's own writes wait for replicas too.
            return format!(
                "Redis at {url}: {err}; too few replicas acknowledge writes, so a request sent now may not \
                 survive a Redis failover: check the replicas, or call without --replica-acks"
            );
        }
        match &self.sentinel_master {
            Some(master) if err.is_retryable() => format!(
                "Redis at {url} does not answer ({err}); are the sentinels reachable, and do they monitor \
                 '{master}' with a master up? Set [redis] sentinels and sentinel_master (TOOLHOST__REDIS__SENTINELS, \
                 TOOLHOST__REDIS__SENTINEL_MASTER)"
            ),
            None if err.is_retryable() => format!(
                "Redis at {url} does not answer ({err}); is redis-server running there? \
                 Set REDIS_URL, or [redis] url in the file given by --config or TOOLHOST_CONFIG"
            ),
            _ => format!("Redis at {url} refused the command: {err}"),
        }
    }
}

/// The hint for a Redis described as [`RedisPlace::described`] is.
fn hint(described: &str) -> &'static str {
    if described.starts_with("cluster ") {
        CLUSTER_HINT
    } else if described.contains(" via sentinels ") {
        SENTINEL_HINT
    } else {
        HINT
    }
}

/// Whether `err` only says that Redis does not answer, which the probe reports as an outage.
///
/// A server that answers with an error of its own (`OOM`, `MISCONF`, `BUSY`, ...) is not an
/// outage the probe sees, since it still answers `PING`: those retries stay at `warn`.
pub fn is_outage(err: &BusError) -> bool {
    matches!(err, BusError::Unavailable(cause) if cause.code().is_none())
}

/// `warn!` for a failed Redis command, or `debug!` when Redis merely does not answer (see the
/// module doc). The first argument is the `toolhost_bus::Error`; the rest is as for `warn!`.
macro_rules! redis_warn {
    ($err:expr, $($rest:tt)+) => {
        if $crate::outage::is_outage($err) {
            tracing::debug!($($rest)+)
        } else {
            tracing::warn!($($rest)+)
        }
    };
}
pub(crate) use redis_warn;

/// A line the outage log writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// Redis stopped answering (or never answered since start).
    Started,
    /// Redis still does not answer, for this long.
    Continuing(Duration),
    /// Redis answers again after an outage this long.
    Ended(Duration),
}

/// The outage state of one Redis, fed by every probe.
#[derive(Debug)]
pub struct OutageLog {
    /// The URL, password masked, named on every line.
    redis: String,
    /// When the current outage started; `None` while Redis answers.
    down_since: Option<Instant>,
    /// How many reminders of the current outage were written.
    n_reminders: usize,
}

impl OutageLog {
    /// An outage log for the Redis at `masked_url` (or the cluster or sentinels described so).
    pub fn new(masked_url: String) -> OutageLog {
        OutageLog { redis: masked_url, down_since: None, n_reminders: 0 }
    }

    /// Records one probe at `now`; returns the line due, if any.
    pub fn observe(&mut self, up: bool, now: Instant) -> Option<Report> {
        match (self.down_since, up) {
            (None, true) => None,
            (None, false) => {
                self.down_since = Some(now);
                self.n_reminders = 0;
                Some(Report::Started)
            }
            (Some(since), true) => {
                self.down_since = None;
                Some(Report::Ended(now.saturating_duration_since(since)))
            }
            (Some(since), false) => {
                let down_for = now.saturating_duration_since(since);
                if down_for >= self.next_reminder() {
                    self.n_reminders += 1;
                    Some(Report::Continuing(down_for))
                } else {
                    None
                }
            }
        }
    }

    /// How long into the outage the next reminder is due.
    fn next_reminder(&self) -> Duration {
        let last = REMINDERS[REMINDERS.len() - 1];
        match REMINDERS.get(self.n_reminders) {
            Some(due) => *due,
            None => last * (self.n_reminders + 2 - REMINDERS.len()) as u32,
        }
    }

    /// Records one probe and logs the line due, if any; `error` is why the probe failed.
    pub fn log(&mut self, up: bool, error: Option<&str>, now: Instant) {
        let error = error.unwrap_or("-");
        match self.observe(up, now) {
            None => {}
            Some(Report::Started) => {
                warn!(redis = %self.redis, error, hint = hint(&self.redis), "redis does not answer; not ready");
            }
            Some(Report::Continuing(down_for)) => {
                warn!(redis = %self.redis, error, down_for_s = down_for.as_secs(), "redis still does not answer");
            }
            Some(Report::Ended(outage)) => {
                info!(redis = %self.redis, outage_ms = outage.as_millis() as u64, "redis answers again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_names_what_the_topology_is_configured_with() {
        let section = |cluster_nodes: &[&str], sentinels: &[&str]| crate::config::RedisSection {
            url: "redis://:pw@10.0.0.1:6379".to_owned(),
            cluster_nodes: cluster_nodes.iter().map(|node| (*node).to_owned()).collect(),
            key_prefix: String::new(),
            response_timeout_ms: 5000,
            sentinels: sentinels.iter().map(|url| (*url).to_owned()).collect(),
            sentinel_master: "mymaster".to_owned(),
            sentinel_username: String::new(),
            sentinel_password: String::new(),
            sentinel_check_ms: 5000,
            ca_file: String::new(),
            client_cert_file: String::new(),
            client_key_file: String::new(),
            replica_acks: 0,
            replica_ack_timeout_ms: 1000,
        };
        assert_eq!(hint(&section(&[], &[]).describe()), HINT);
        assert_eq!(hint(&section(&["10.0.0.1:7000"], &[]).describe()), CLUSTER_HINT);
        assert_eq!(hint(&section(&[], &["redis://10.0.0.2:26379"]).describe()), SENTINEL_HINT);
    }

    #[test]
    fn an_outage_is_reported_at_start_at_a_falling_rate_and_at_end() {
        let mut log = OutageLog::new("redis://127.0.0.1:6379".to_owned());
        let start = Instant::now();
        assert_eq!(log.observe(true, start), None);
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut lines = Vec::new();
        // One probe every 500 ms for 25 minutes.
        for tick in 0..(25 * 60 * 2) {
            let now = start + Duration::from_millis(500 * tick);
            if let Some(report) = log.observe(false, now) {
                lines.push((now - start, report));
            }
        }
        let reminders: Vec<u64> = lines
            .iter()
            .filter(|(_, report)| matches!(report, Report::Continuing(_)))
            .map(|(since, _)| since.as_secs())
            .collect();
        assert_eq!(lines[0], (Duration::ZERO, Report::Started));
        assert_eq!(reminders, [10, 30, 60, 120, 300, 600, 1200]);
        assert_eq!(log.observe(true, at(1500)), Some(Report::Ended(Duration::from_secs(1500))));
        assert_eq!(log.observe(true, at(1501)), None);
        // A second outage starts the schedule again.
        assert_eq!(log.observe(false, at(1600)), Some(Report::Started));
        assert_eq!(log.observe(false, at(1605)), None);
        assert_eq!(log.observe(false, at(1610)), Some(Report::Continuing(Duration::from_secs(10))));
    }
}
