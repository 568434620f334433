//! The benchmark report: rows of numbers, rendered as a Markdown table and as JSON.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use crate::procfs::MachineInfo;

/// Everything one run of the harness measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Where the numbers come from.
    pub machine: MachineInfo,
    /// How the run was configured (reps, durations).
    pub settings: Settings,
    /// Throughput and latency rows.
    pub rows: Vec<Row>,
    /// Start-up time per target.
    pub ready: Vec<ReadyTime>,
    /// The soak run, when asked for.
    pub soak: Vec<Soak>,
}

/// How the run was configured.
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    /// Whether `--quick` was given.
    pub quick: bool,
    /// Repetitions per row; the median one (by throughput) is reported.
    pub reps: usize,
    /// Seconds per repetition.
    pub duration_s: f64,
    /// Seconds of warm-up before the first repetition.
    pub warmup_s: f64,
    /// Starts per ready-time measurement.
    pub ready_starts: usize,
}

/// One measured configuration.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    /// `redis`, `reference` or `toolhost`.
    pub target: String,
    /// What was asked, e.g. `echo`, `terminal_run`, `ping (floor)`.
    pub scenario: String,
    /// The reference scenario this row compares with, if any.
    #[serde(skip)]
    pub baseline: Option<String>,
    /// Requests in flight.
    pub in_flight: usize,
    /// Size of the echo message, in bytes.
    pub payload_bytes: usize,
    /// Answered requests per second.
    pub rps: f64,
    /// Latency percentiles and maximum, in microseconds.
    pub p50_us: u64,
    /// 90th percentile, µs.
    pub p90_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// Maximum, µs.
    pub max_us: u64,
    /// CPU time of the target per answered request, µs.
    pub cpu_us_per_request: Option<f64>,
    /// CPU time of redis-server per answered request, µs.
    pub redis_cpu_us_per_request: Option<f64>,
    /// CPU time of the harness itself (load generator) per answered request, µs; it shares
    /// the machine with the target, so this is CPU the target could not use.
    pub harness_cpu_us_per_request: Option<f64>,
    /// RSS of the target after start, before load, KiB.
    pub rss_idle_kib: Option<u64>,
    /// Highest RSS of the target under load (sampled every 100 ms), KiB.
    pub rss_peak_kib: Option<u64>,
    /// Answers in the reported repetition.
    pub n_answered: u64,
    /// Answers with `success: false`.
    pub n_failed: u64,
    /// Requests without an answer within 10 s.
    pub n_timeouts: u64,
    /// toolhost throughput divided by the reference's in the same configuration.
    pub ratio_rps: Option<f64>,
    /// toolhost p50 divided by the reference's in the same configuration.
    pub ratio_p50: Option<f64>,
    /// Why the row has no numbers, or the first failure seen.
    pub error: Option<String>,
}

/// Start-up time of a target.
#[derive(Clone, Debug, Serialize)]
pub struct ReadyTime {
    /// `reference` or `toolhost`.
    pub target: String,
    /// Median over the starts, ms.
    pub median_ms: Option<f64>,
    /// Every start, ms.
    pub samples_ms: Vec<f64>,
    /// Why it could not be measured.
    pub error: Option<String>,
}

/// A long run that watches memory.
#[derive(Clone, Debug, Serialize)]
pub struct Soak {
    /// `reference` or `toolhost`.
    pub target: String,
    /// Requests sent.
    pub requests: u64,
    /// Requests answered.
    pub n_answered: u64,
    /// Requests without an answer.
    pub n_timeouts: u64,
    /// Answered per second over the whole run.
    pub rps: f64,
    /// RSS at the first sample, KiB.
    pub rss_first_kib: u64,
    /// RSS at the last sample, KiB.
    pub rss_last_kib: u64,
    /// Highest RSS, KiB.
    pub rss_max_kib: u64,
    /// One sample a second: (seconds since start, KiB).
    pub rss_samples: Vec<(f64, u64)>,
    /// Why it could not be run, or the first failure seen.
    pub error: Option<String>,
}

impl Report {
    /// Fills `ratio_rps` and `ratio_p50` of every toolhost row that has a reference row
    /// with the same baseline scenario, in-flight count and payload size.
    pub fn compute_ratios(&mut self) {
        let reference: Vec<Row> = self.rows.iter().filter(|row| row.target == "reference").cloned().collect();
        for row in self.rows.iter_mut().filter(|row| row.target == "toolhost" && row.error.is_none()) {
            let Some(baseline) = &row.baseline else { continue };
            let matching = reference.iter().find(|other| {
                &other.scenario == baseline
                    && other.in_flight == row.in_flight
                    && other.payload_bytes == row.payload_bytes
                    && other.rps > 0.0
            });
            if let Some(other) = matching {
                row.ratio_rps = Some(row.rps / other.rps);
                if other.p50_us > 0 {
                    row.ratio_p50 = Some(row.p50_us as f64 / other.p50_us as f64);
                }
            }
        }
    }

    /// The report as Markdown: machine, settings, the main table, ready times and soak.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let machine = &self.machine;
        let settings = &self.settings;
        // Writing to a String cannot fail, so the results of writeln! are ignored.
        let _ = writeln!(out, "# toolhost benchmark\n");
        let _ = writeln!(
            out,
            "Machine: {} ({} cores), kernel {}, {}, {}.  ",
            machine.cpu_model, machine.cores, machine.kernel, machine.redis_version, machine.date
        );
        // A soak-only run has no repetitions, so the settings line would only mislead.
        if !self.rows.is_empty() {
            let _ = writeln!(
                out,
                "Settings: {} reps of {:.1} s after {:.1} s warm-up (median rep reported){}.\n",
                settings.reps,
                settings.duration_s,
                settings.warmup_s,
                if settings.quick { ", quick mode" } else { "" }
            );
        }
        if !self.rows.is_empty() {
            out.push_str(
                "| target | scenario | in-flight | payload | req/s | p50 µs | p90 µs | p99 µs | max µs \
                 | CPU µs/req | Redis CPU µs/req | RSS idle MiB | RSS peak MiB | failed/timeouts \
                 | ×ref req/s | ×ref p50 | error |\n",
            );
            out.push_str(
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
            );
            for row in &self.rows {
                // A row without answers has no latency; dashes say so better than zeros.
                let measured = |value: String| if row.n_answered > 0 { value } else { "-".to_owned() };
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} | {} | {} | {} |",
                    row.target,
                    row.scenario,
                    row.in_flight,
                    format_bytes(row.payload_bytes),
                    measured(format!("{:.0}", row.rps)),
                    measured(row.p50_us.to_string()),
                    measured(row.p90_us.to_string()),
                    measured(row.p99_us.to_string()),
                    measured(row.max_us.to_string()),
                    format_option(row.cpu_us_per_request, 1),
                    format_option(row.redis_cpu_us_per_request, 1),
                    format_option(row.rss_idle_kib.map(kib_to_mib), 1),
                    format_option(row.rss_peak_kib.map(kib_to_mib), 1),
                    row.n_failed,
                    row.n_timeouts,
                    format_option(row.ratio_rps, 2),
                    format_option(row.ratio_p50, 2),
                    row.error.as_deref().map(escape_cell).unwrap_or_default(),
                );
            }
        }
        if !self.ready.is_empty() {
            out.push_str("\n| target | ready ms (median) | samples ms | error |\n|---|---:|---|---|\n");
            for ready in &self.ready {
                let samples: Vec<String> = ready.samples_ms.iter().map(|ms| format!("{ms:.1}")).collect();
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} |",
                    ready.target,
                    format_option(ready.median_ms, 1),
                    samples.join(", "),
                    ready.error.as_deref().map(escape_cell).unwrap_or_default()
                );
            }
        }
        if !self.soak.is_empty() {
            out.push_str(
                "\n| soak target | requests | answered | timeouts | req/s | RSS first MiB | RSS last MiB \
                 | RSS max MiB | error |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
            );
            for soak in &self.soak {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {} |",
                    soak.target,
                    soak.requests,
                    soak.n_answered,
                    soak.n_timeouts,
                    soak.rps,
                    kib_to_mib(soak.rss_first_kib),
                    kib_to_mib(soak.rss_last_kib),
                    kib_to_mib(soak.rss_max_kib),
                    soak.error.as_deref().map(escape_cell).unwrap_or_default()
                );
            }
        }
        out
    }

    /// Writes `report.json` and `report.md` into `dir`.
    ///
    /// # Errors
    ///
    /// When the directory or a file cannot be written.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let json = serde_json::to_string_pretty(self).context("serializing the report")?;
        std::fs::write(dir.join("report.json"), json).context("writing report.json")?;
        std::fs::write(dir.join("report.md"), self.to_markdown()).context("writing report.md")?;
        Ok(())
    }
}

fn format_bytes(bytes: usize) -> String {
    match bytes {
        0 => "-".to_owned(),
        b if b >= 1024 && b % 1024 == 0 => format!("{} KiB", b / 1024),
        b => format!("{b} B"),
    }
}

fn format_option(value: Option<f64>, decimals: usize) -> String {
    value.map(|value| format!("{value:.decimals$}")).unwrap_or_else(|| "-".to_owned())
}

fn kib_to_mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn escape_cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A failed unwrap is a failed test, which is what we want.
mod tests {
    use super::*;

    fn row(target: &str, rps: f64, p50_us: u64) -> Row {
        Row {
            target: target.to_owned(),
            scenario: "echo".to_owned(),
            baseline: Some("echo".to_owned()),
            in_flight: 8,
            payload_bytes: 100,
            rps,
            p50_us,
            n_answered: 1000,
            ..Row::default()
        }
    }

    #[test]
    fn toolhost_rows_get_ratios_against_the_reference() {
        let mut report = Report {
            machine: MachineInfo {
                cpu_model: "cpu".to_owned(),
                cores: 2,
                kernel: "k".to_owned(),
                date: "d".to_owned(),
                redis_version: "r".to_owned(),
            },
            settings: Settings { quick: true, reps: 1, duration_s: 1.0, warmup_s: 0.5, ready_starts: 3 },
            rows: vec![row("reference", 1000.0, 200), row("toolhost", 500.0, 400)],
            ready: Vec::new(),
            soak: Vec::new(),
        };
        report.compute_ratios();
        assert_eq!(report.rows[1].ratio_rps, Some(0.5));
        assert_eq!(report.rows[1].ratio_p50, Some(2.0));
        assert_eq!(report.rows[0].ratio_rps, None);
        let markdown = report.to_markdown();
        assert!(markdown.contains("| toolhost | echo | 8 | 100 B | 500 | 400 |"), "{markdown}");
    }

    #[test]
    fn payload_sizes_read_naturally() {
        assert_eq!(format_bytes(100), "100 B");
        assert_eq!(format_bytes(10 * 1024), "10 KiB");
        assert_eq!(format_bytes(500 * 1024), "500 KiB");
        assert_eq!(format_bytes(0), "-");
    }
}
