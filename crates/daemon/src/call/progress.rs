//! Progress (and log messages) of a running call, relayed to its caller at a bounded rate.
//!
//! A tool reports through the [`Progress`] handle in its context; reporting only stores the
//! report as the latest and wakes the relay, so a tool is never held up by Redis. The relay
//! ([`Relay::run`]) writes at most one entry per `1 / progress_per_second`: reports that come
//! faster replace each other, and the latest is written when the rate allows. It runs beside the
//! call and stops when the call ends: a write under way is finished first, then a report still
//! waiting is written at once (the call's last step, such as 100 of 100, is never lost to the
//! rate), and only then is the answer committed, so no progress entry follows the answer.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolhost_tools::{Log, LogReport, Progress, ProgressReport};

/// The relay of one call's progress reports (`T` = [`ProgressReport`]) or log messages
/// ([`LogReport`]), each kind with a relay and a rate of its own.
pub(crate) struct Relay<T> {
    latest: Arc<Latest<T>>,
    /// The shortest time between two entries.
    interval: Duration,
}

/// The report waiting to be written, and the relay's wake-up.
struct Latest<T> {
    report: Mutex<Option<T>>,
    notify: Notify,
}

impl<T: Send + 'static> Relay<T> {
    /// A relay writing at most `per_second` entries a second (at least one).
    pub(crate) fn new(per_second: u64) -> Relay<T> {
        let interval = Duration::from_secs(1) / u32::try_from(per_second.max(1)).unwrap_or(u32::MAX);
        Relay { latest: Arc::new(Latest { report: Mutex::new(None), notify: Notify::new() }), interval }
    }

    /// What a report is handed to: it becomes the latest, and wakes the relay.
    fn sink(&self) -> impl Fn(T) + Send + Sync + 'static {
        let latest = self.latest.clone();
        move |report| {
            *lock(&latest.report) = Some(report);
            latest.notify.notify_one();
        }
    }

    /// Writes reports with `write` until `stop` fires; a write under way when it fires is
    /// finished, then a report waiting for its turn is written without waiting for it.
    pub(crate) async fn run<F, W>(&self, stop: &CancellationToken, mut write: W)
    where
        W: FnMut(T) -> F,
        F: Future<Output = ()>,
    {
        let mut next_slot: Option<Instant> = None;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                () = self.latest.notify.notified() => {}
            }
            if let Some(at) = next_slot {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            let Some(report) = lock(&self.latest.report).take() else { continue };
            next_slot = Some(Instant::now() + self.interval);
            write(report).await;
        }
        let last = lock(&self.latest.report).take();
        if let Some(report) = last {
            write(report).await;
        }
    }
}

impl Relay<ProgressReport> {
    /// The handle the tool reports its progress through.
    pub(crate) fn handle(&self) -> Progress {
        Progress::new(self.sink())
    }
}

impl Relay<LogReport> {
    /// The handle the tool sends its log messages through.
    pub(crate) fn log_handle(&self) -> Log {
        Log::new(self.sink())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    fn report(progress: f64) -> ProgressReport {
        ProgressReport { progress, total: Some(100.0), message: None }
    }

    // Real time: tokio's paused clock needs its `test-util` feature, which this workspace does
    // not build. Every assertion holds however slow the machine is.
    #[tokio::test]
    async fn reports_are_written_at_most_at_the_rate_keeping_the_latest_and_the_last_at_stop() {
        let relay = Relay::<ProgressReport>::new(50);
        let progress = relay.handle();
        let stop = CancellationToken::new();
        let written = RefCell::new(Vec::<(Instant, f64)>::new());
        let start = Instant::now();
        let tool = async {
            // A tool reporting far faster than 50 a second.
            for step in 1..=300 {
                progress.report(report(f64::from(step)));
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // One last report, then the call ends before the rate allows it.
            progress.report(report(1000.0));
            stop.cancel();
        };
        let write = |report: ProgressReport| {
            written.borrow_mut().push((Instant::now(), report.progress));
            std::future::ready(())
        };
        tokio::join!(tool, relay.run(&stop, write));
        let elapsed = start.elapsed();
        let written = written.into_inner();
        assert!(written.len() >= 3, "{written:?}");
        // The report made as the call ended is written as it stops, the last, past the rate.
        let (last, during) = written.split_last().unwrap();
        assert_eq!(last.1, 1000.0, "{written:?}");
        // Before it, never two entries within 20 ms, so never more than one per 20 ms of the call.
        assert!(during.len() as u128 <= elapsed.as_millis() / 20 + 1, "{} in {elapsed:?}", during.len());
        for pair in during.windows(2) {
            assert!(pair[1].0 - pair[0].0 >= Duration::from_millis(20), "{written:?}");
            // Always the latest report at the time of writing: progress only grows.
            assert!(pair[1].1 > pair[0].1, "{written:?}");
        }
        // The first report is written at once.
        assert_eq!(written[0].1, 1.0);
        assert!(during.iter().all(|(_, progress)| *progress < 1000.0), "{written:?}");
    }

    #[test]
    fn a_report_with_nobody_relaying_goes_nowhere() {
        let progress = Progress::default();
        assert!(!progress.is_relayed());
        progress.report(report(1.0));
        assert!(Relay::<ProgressReport>::new(1).handle().is_relayed());
        assert!(Relay::<LogReport>::new(1).log_handle().is_relayed());
        assert_eq!(Relay::<LogReport>::new(0).interval, Duration::from_secs(1));
        assert_eq!(Relay::<ProgressReport>::new(10).interval, Duration::from_millis(100));
    }
}
