//! Readers for `/proc`: CPU time and resident memory of a process, and what machine this is.
//!
//! Linux only, on purpose: the numbers are the kernel's own accounting, not an estimate.

use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// CPU time (user plus system) a process has used so far, in clock ticks.
///
/// # Errors
///
/// When the process is gone or `/proc/<pid>/stat` has an unexpected shape.
pub fn cpu_ticks(pid: u32) -> std::io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_cpu_ticks(&stat).ok_or_else(|| std::io::Error::other(format!("unexpected /proc/{pid}/stat")))
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`), 100 when it cannot be asked.
pub fn ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .filter(|&ticks| ticks > 0)
        .unwrap_or(100)
}

/// The resident set size of a process (`VmRSS`), in KiB.
///
/// # Errors
///
/// When the process is gone or has no `VmRSS` line (a zombie).
pub fn rss_kib(pid: u32) -> std::io::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_rss_kib(&status).ok_or_else(|| std::io::Error::other(format!("no VmRSS in /proc/{pid}/status")))
}

/// A process's memory: resident, of it anonymous and file-backed, and its proportional share.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// `VmRSS`, KiB.
    pub rss_kib: u64,
    /// `RssAnon`: heap, stacks, the runtime; what this process alone costs, KiB.
    pub anon_kib: u64,
    /// `RssFile`: mapped file pages, mostly the executable's text, shared page cache, KiB.
    pub file_kib: u64,
    /// `Pss` from `smaps_rollup`: resident pages, each shared one divided by its sharers, KiB;
    /// `None` when the kernel does not let this process read it.
    pub pss_kib: Option<u64>,
}

/// The memory of a process, from `/proc/<pid>/status` and `/proc/<pid>/smaps_rollup`.
///
/// # Errors
///
/// When the process is gone or its status has no `VmRSS` line (a zombie).
pub fn memory(pid: u32) -> std::io::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kib = parse_rss_kib(&status)
        .ok_or_else(|| std::io::Error::other(format!("no VmRSS in /proc/{pid}/status")))?;
    let pss_kib = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|rollup| kib_field(&rollup, "Pss:"));
    Ok(Memory {
        rss_kib,
        anon_kib: kib_field(&status, "RssAnon:").unwrap_or(0),
        file_kib: kib_field(&status, "RssFile:").unwrap_or(0),
        pss_kib,
    })
}

/// The KiB value of the line starting with `field` (`Name:   123 kB`).
fn kib_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|line| line.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Samples a process's RSS on a fixed period until stopped.
///
/// Dropping it stops the sampling task.
#[derive(Debug)]
pub struct RssSampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<(Duration, u64)>>,
}

impl RssSampler {
    /// Starts sampling `pid` every `period`, with a first sample right away.
    pub fn start(pid: u32, period: Duration) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let mut samples = Vec::new();
            let mut ticker = tokio::time::interval(period);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {
                        if let Ok(kib) = rss_kib(pid) {
                            samples.push((started.elapsed(), kib));
                        }
                    }
                    _ = stopped.changed() => break,
                }
            }
            if let Ok(kib) = rss_kib(pid) {
                samples.push((started.elapsed(), kib));
            }
            samples
        });
        RssSampler { stop, task }
    }

    /// Stops sampling and returns every sample as (time since start, KiB).
    pub async fn finish(self) -> Vec<(Duration, u64)> {
        // The receiver lives in the task; if the task already ended, there is no one to tell.
        let _ = self.stop.send(true);
        let task = self.task;
        task.await.unwrap_or_default()
    }
}

/// What machine the numbers come from.
#[derive(Clone, Debug, Serialize)]
pub struct MachineInfo {
    /// `model name` from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// Logical CPUs this process may run on.
    pub cores: usize,
    /// `/proc/sys/kernel/osrelease`.
    pub kernel: String,
    /// When the run started, RFC 3339.
    pub date: String,
    /// `redis-server --version`.
    pub redis_version: String,
}

impl MachineInfo {
    /// Collects the machine description; unknown parts read "unknown".
    pub fn collect() -> Self {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|line| line.starts_with("model name"))
                    .and_then(|line| line.split_once(':'))
                    .map(|(_, model)| model.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|text| text.trim().to_owned())
            .unwrap_or_else(|_| "unknown".to_owned());
        let redis_version = std::process::Command::new("redis-server")
            .arg("--version")
            .output()
            .ok()
            .and_then(|output| String::from_utf8(output.stdout).ok())
            .map(|text| text.trim().to_owned())
            .unwrap_or_else(|| "unknown".to_owned());
        MachineInfo {
            cpu_model,
            cores,
            kernel,
            date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            redis_version,
        }
    }
}

/// utime + stime: fields 14 and 15 of `stat`, counted after the `(comm)` which may hold spaces.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, after_comm) = stat.rsplit_once(')')?;
    // After the comm, field 3 (state) is the first; utime is field 14, so index 11 here.
    let mut fields = after_comm.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn parse_rss_kib(status: &str) -> Option<u64> {
    kib_field(status, "VmRSS:")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A failed unwrap is a failed test, which is what we want.
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_comm() {
        let stat = "1234 (tool host) S 1 1234 1234 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 4 0 99 1000 200";
        assert_eq!(parse_cpu_ticks(stat), Some(22));
    }

    #[test]
    fn rss_is_read_from_vmrss() {
        let status = "Name:\tredis\nVmPeak:\t  9000 kB\nVmRSS:\t    4321 kB\nThreads: 4\n";
        assert_eq!(parse_rss_kib(status), Some(4321));
    }

    #[test]
    fn own_process_is_readable() {
        let pid = std::process::id();
        assert!(cpu_ticks(pid).is_ok());
        assert!(rss_kib(pid).unwrap() > 0);
        let memory = memory(pid).unwrap();
        assert!(memory.anon_kib > 0 && memory.file_kib > 0, "{memory:?}");
        assert!(memory.anon_kib + memory.file_kib <= memory.rss_kib, "{memory:?}");
        // Our own smaps_rollup is always readable; PSS never exceeds RSS.
        assert!(memory.pss_kib.is_some_and(|pss| pss > 0 && pss <= memory.rss_kib), "{memory:?}");
    }

    #[test]
    fn memory_fields_are_read_by_name() {
        let status = "VmRSS:\t  16000 kB\nRssAnon:\t    2600 kB\nRssFile:\t   13300 kB\nRssShmem:\t 0 kB\n";
        assert_eq!(kib_field(status, "RssAnon:"), Some(2600));
        assert_eq!(kib_field(status, "RssFile:"), Some(13300));
        assert_eq!(kib_field(status, "Pss:"), None);
        assert_eq!(kib_field("Rss: 10 kB\nPss:   7 kB\nPss_Anon: 3 kB\n", "Pss:"), Some(7));
    }
}
