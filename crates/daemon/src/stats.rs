//! Per-tool call statistics since start, answered by `tools.stats`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};

/// How many recent durations per tool feed the p99.
const WINDOW: usize = 2048;

/// Counts and durations of calls, by tool.
#[derive(Default)]
pub struct Stats {
    tools: Mutex<HashMap<String, ToolStats>>,
}

#[derive(Default)]
struct ToolStats {
    requests: u64,
    errors: BTreeMap<&'static str, u64>,
    total: Duration,
    /// The most recent durations in microseconds, a ring of at most [`WINDOW`].
    recent: Vec<u64>,
    next: usize,
}

impl Stats {
    /// Records one call of `tool`: its error code (`None` on success) and duration.
    pub fn record(&self, tool: &str, error: Option<&'static str>, duration: Duration) {
        // A poisoned lock only means a panic elsewhere mid-update of plain counters.
        let mut tools = self.tools.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let stats = match tools.get_mut(tool) {
            Some(stats) => stats,
            None => tools.entry(tool.to_owned()).or_default(),
        };
        stats.requests += 1;
        if let Some(code) = error {
            *stats.errors.entry(code).or_default() += 1;
        }
        stats.total += duration;
        let micros = duration.as_micros() as u64;
        if stats.recent.len() < WINDOW {
            stats.recent.push(micros);
        } else {
            stats.recent[stats.next] = micros;
            stats.next = (stats.next + 1) % WINDOW;
        }
    }

    /// The mean duration of `tool`'s calls so far, if it had any.
    pub fn mean(&self, tool: &str) -> Option<Duration> {
        let tools = self.tools.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let stats = tools.get(tool).filter(|stats| stats.requests > 0)?;
        Some(stats.total / u32::try_from(stats.requests).unwrap_or(u32::MAX))
    }

    /// `{"tools": {"<name>": {"requests", "errors": {"<code>": n}, "mean_ms", "p50_ms",
    /// "p99_ms"}}}`, the percentiles over the most recent 2048 calls of each tool.
    pub fn snapshot(&self) -> Value {
        let tools = self.tools.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut names: Vec<&String> = tools.keys().collect();
        names.sort();
        let mut out = serde_json::Map::new();
        for name in names {
            let stats = &tools[name];
            let mut sorted = stats.recent.clone();
            sorted.sort_unstable();
            let rank = |percent: usize| {
                sorted.get((sorted.len() * percent).div_ceil(100).saturating_sub(1)).copied().unwrap_or(0)
            };
            let (p50, p99) = (rank(50), rank(99));
            let mean = if stats.requests == 0 {
                0.0
            } else {
                stats.total.as_secs_f64() * 1000.0 / stats.requests as f64
            };
            out.insert(
                name.clone(),
                json!({
                    "requests": stats.requests,
                    "errors": stats.errors,
                    "mean_ms": mean,
                    "p50_ms": p50 as f64 / 1000.0,
                    "p99_ms": p99 as f64 / 1000.0,
                }),
            );
        }
        json!({ "tools": out })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_errors_mean_and_p99() {
        let stats = Stats::default();
        for ms in 1..=100 {
            stats.record("echo", (ms % 10 == 0).then_some("timeout"), Duration::from_millis(ms));
        }
        let snapshot = stats.snapshot();
        let echo = &snapshot["tools"]["echo"];
        assert_eq!(echo["requests"], 100);
        assert_eq!(echo["errors"]["timeout"], 10);
        assert_eq!(echo["mean_ms"], 50.5);
        assert_eq!(echo["p50_ms"], 50.0);
        assert_eq!(echo["p99_ms"], 99.0);
    }
}
