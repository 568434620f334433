//! The call log: one entry per handled request in `calls:<toolbox_id>`, a capped stream that the
//! console's live view and call pages read (`[console] record_calls`).
//!
//! The hot path only hands a record to a bounded queue ([`CallLog::record`] never waits and never
//! fails a call); one writer task takes what queued and appends it, each record one `XADD` with
//! an approximate `MAXLEN`, sent together so the multiplexed connection pipelines them. When
//! Redis is slower than the calls, records past the queue's room are dropped and counted: the log
//! is for people, and losing a line of it must never slow or fail a call.
//!
//! An entry has the two fields every toolhost stream entry has: `id` (the request id) and
//! `payload`, a JSON object with `time` (RFC 3339), `request_id`, `tool`, `tenant`, `door`,
//! `source`, `outcome` (the label of metrics and logs: `success`, an error code, `duplicate`,
//! …), `duration_us`, `entry_id` (the request's entry in its stream), `deliveries`,
//! `toolbox_id` and `consumer`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;
use toolhost_bus::Streams;
use tracing::warn;

/// How many records may wait for the writer.
const QUEUE: usize = 4096;

/// How many records the writer appends at once.
const BATCH: usize = 256;

/// One handled request, as logged.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub request_id: String,
    pub tool: String,
    pub tenant: String,
    /// The door it came in by (`requests`, `chat`).
    pub door: &'static str,
    pub source: String,
    pub outcome: &'static str,
    pub duration_us: u64,
    pub entry_id: String,
    pub deliveries: u64,
    /// The W3C trace id the call ran under (32 hex digits); empty for an entry not admitted.
    pub trace_id: String,
}

impl Record {
    /// The entry's payload.
    fn to_json(&self, time: &str, target: &Target) -> serde_json::Value {
        serde_json::json!({
            "time": time,
            "request_id": self.request_id,
            "tool": self.tool,
            "tenant": self.tenant,
            "door": self.door,
            "source": self.source,
            "outcome": self.outcome,
            "duration_us": self.duration_us,
            "entry_id": self.entry_id,
            "deliveries": self.deliveries,
            "trace_id": self.trace_id,
            "toolbox_id": target.toolbox_id,
            "consumer": target.consumer,
        })
    }
}

/// The queue to the call log's writer.
#[derive(Debug)]
pub(crate) struct CallLog {
    queue: mpsc::Sender<(String, Record)>,
    dropped: AtomicU64,
}

/// Where and how much the writer keeps.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// Full key of the stream, `calls:<toolbox_id>`.
    pub topic: String,
    /// About how many entries are kept.
    pub max_len: u64,
    pub toolbox_id: String,
    pub consumer: String,
}

impl CallLog {
    /// Starts the writer; it ends when the last handle is dropped, after writing what queued.
    pub(crate) fn start(bus: Arc<dyn Streams>, target: Target) -> Arc<CallLog> {
        let (queue, receiver) = mpsc::channel(QUEUE);
        tokio::spawn(write(bus, target, receiver));
        Arc::new(CallLog { queue, dropped: AtomicU64::new(0) })
    }

    /// Queues a record; when the queue is full it is dropped and counted.
    pub(crate) fn record(&self, record: Record) {
        let time = toolhost_envelope::now_rfc3339();
        if self.queue.try_send((time, record)).is_err() {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                warn!(dropped, "the call log cannot keep up with the calls; records dropped");
            }
        }
    }
}

async fn write(bus: Arc<dyn Streams>, target: Target, mut receiver: mpsc::Receiver<(String, Record)>) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut failures: u64 = 0;
    while receiver.recv_many(&mut batch, BATCH).await > 0 {
        let appends = batch.iter().map(|(time, record)| {
            let payload = record.to_json(time, &target).to_string();
            let (bus, target) = (&bus, &target);
            async move {
                let fields = [("id", record.request_id.as_str()), ("payload", payload.as_str())];
                bus.append(&target.topic, &fields, Some(target.max_len)).await
            }
        });
        for res in futures::future::join_all(appends).await {
            if let Err(err) = res {
                failures += 1;
                if failures.is_power_of_two() {
                    warn!(error = %err, failures, topic = %target.topic, "cannot write the call log");
                }
            }
        }
        batch.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolhost_bus::MemoryBus;

    fn record(request_id: &str) -> Record {
        Record {
            request_id: request_id.to_owned(),
            tool: "echo".to_owned(),
            tenant: "acme".to_owned(),
            door: "requests",
            source: "tests".to_owned(),
            outcome: "success",
            duration_us: 1234,
            entry_id: "1-0".to_owned(),
            deliveries: 1,
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".to_owned(),
        }
    }

    #[tokio::test]
    async fn records_are_appended_in_order_with_every_field() {
        let bus = Arc::new(MemoryBus::new());
        let target = Target {
            topic: "calls:tb".to_owned(),
            max_len: 1000,
            toolbox_id: "tb".to_owned(),
            consumer: "c1".to_owned(),
        };
        let log = CallLog::start(bus.clone(), target);
        for index in 0..5 {
            log.record(record(&format!("r{index}")));
        }
        let mut entries = Vec::new();
        for _ in 0..100 {
            entries = bus.read("calls:tb", "0-0", 10, None).await.unwrap();
            if entries.len() == 5 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(entries.len(), 5);
        let ids: Vec<&str> = entries.iter().map(|entry| entry.id.as_str()).collect();
        assert_eq!(ids, ["r0", "r1", "r2", "r3", "r4"]);
        let first: serde_json::Value = serde_json::from_str(entries[0].payload.as_deref().unwrap()).unwrap();
        let expected = serde_json::json!({
            "time": first["time"],
            "request_id": "r0",
            "tool": "echo",
            "tenant": "acme",
            "door": "requests",
            "source": "tests",
            "outcome": "success",
            "duration_us": 1234,
            "entry_id": "1-0",
            "deliveries": 1,
            "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
            "toolbox_id": "tb",
            "consumer": "c1",
        });
        assert_eq!(first, expected);
        assert!(first["time"].as_str().is_some_and(|time| time.ends_with('Z')));
    }
}
