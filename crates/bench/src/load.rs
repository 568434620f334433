//! The closed-loop load generator: L lanes, each with one request in flight at a time.
//!
//! A lane registers a oneshot sender under its `request_id`, then `XADD`s the request
//! and waits for the answer. One dispatcher task reads `action-results` with
//! `XREAD BLOCK` after the last id it saw and routes each answer to its lane. Publishing
//! and reading use separate connections so a blocked read never delays a publish.
//! Latency runs from just before the `XADD` to the moment the dispatcher read the answer.
//!
//! Two shapes of the same loop ([`Generator`]): the harness's own, and the independent
//! generator of issue 27, which differs in the envelope, in trimming nothing and in reading
//! answers without a `COUNT`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use redis::AsyncCommands as _;
use redis::aio::MultiplexedConnection;
use redis::streams::{
    StreamAddOptions, StreamRangeReply, StreamReadOptions, StreamReadReply, StreamTrimStrategy,
    StreamTrimmingMode,
};
use tokio::sync::oneshot;

use crate::envelope::{self, AnswerSummary, DEFAULT_MAXLEN, REQUESTS_STREAM, RESULTS_STREAM, RequestKind};

/// How long a lane waits for an answer before counting a timeout.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Entries kept per stream are capped at this many bytes of payload, so 500 KiB messages
/// cannot fill the machine's memory within one repetition.
const STREAM_BYTES_BUDGET: usize = 128 * 1024 * 1024;

/// The shape of the requests and of the answer reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Generator {
    /// The harness's own: fresh ids for the event and the request, `source` `bench:loadgen`,
    /// `time` in milliseconds, `XADD ... MAXLEN ~`, answers read with `XREAD COUNT 1024`.
    #[default]
    Harness,
    /// Issue 27's independent generator: one UUID for every id, `source` `loadgen`, `time` in
    /// microseconds, `response_topic` given, message `ping`, `XADD` without `MAXLEN`, answers
    /// read with `XREAD BLOCK` without `COUNT`; [`LoadSpec::kind`] is ignored.
    Independent,
}

impl Generator {
    /// The name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Generator::Harness => "harness",
            Generator::Independent => "independent",
        }
    }
}

/// One run of the load generator.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// The request and read shape.
    pub generator: Generator,
    /// Lanes, i.e. requests in flight.
    pub in_flight: usize,
    /// What each request asks.
    pub kind: RequestKind,
    /// Lanes stop sending new requests after this long.
    pub duration: Duration,
    /// Lanes also stop after this many requests in total, if set.
    pub max_requests: Option<u64>,
}

/// What one run measured.
#[derive(Debug)]
pub struct LoadResult {
    /// Answers with `success: true`.
    pub n_ok: u64,
    /// Answers with `success: false`.
    pub n_failed: u64,
    /// Requests with no answer within [`ANSWER_TIMEOUT`].
    pub n_timeouts: u64,
    /// Requests that could not be published.
    pub n_send_errors: u64,
    /// The first failure seen, for the report.
    pub first_error: Option<String>,
    /// From the first send to the last lane finishing.
    pub elapsed: Duration,
    /// Latency of answered requests, in microseconds.
    pub histogram: Histogram<u64>,
}

impl LoadResult {
    /// Requests answered (successfully or not).
    pub fn n_answered(&self) -> u64 {
        self.n_ok + self.n_failed
    }

    /// Answered requests per second.
    pub fn rps(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 { self.n_answered() as f64 / seconds } else { 0.0 }
    }
}

/// Runs the closed loop against whatever worker consumes `action-requests` on `redis_url`.
///
/// # Errors
///
/// When Redis cannot be reached. Unanswered requests are counted, not errors.
pub async fn run(redis_url: &str, spec: &LoadSpec) -> anyhow::Result<LoadResult> {
    run_split(redis_url, redis_url, spec).await
}

/// [`run`] with requests published through `publish_url` and answers read through `read_url`:
/// on a Redis Cluster, the nodes that hold `action-requests` and `action-results`.
///
/// # Errors
///
/// When Redis cannot be reached. Unanswered requests are counted, not errors.
pub async fn run_split(publish_url: &str, read_url: &str, spec: &LoadSpec) -> anyhow::Result<LoadResult> {
    let reads = [(RESULTS_STREAM.to_owned(), read_url.to_owned())];
    run_sharded(&[(REQUESTS_STREAM.to_owned(), publish_url.to_owned())], &reads, spec).await
}

/// [`run_split`] over a sharded requests stream: `shards` names each shard's stream and the URL
/// of the node holding it, in shard order; each request goes to the shard of its request id by
/// the rule of docs/CONTRACTS.md ([`crate::shards`]). `reads` names the results topics read and
/// the URL of each one's node: the default results topic alone (requests then name none), or one
/// per shard, each request naming its shard's as `response_topic`, as a caller with private
/// results streams does.
///
/// # Errors
///
/// When Redis cannot be reached. Unanswered requests are counted, not errors.
pub async fn run_sharded(
    shards: &[(String, String)],
    reads: &[(String, String)],
    spec: &LoadSpec,
) -> anyhow::Result<LoadResult> {
    let private = !(reads.len() == 1 && reads[0].0 == RESULTS_STREAM);
    anyhow::ensure!(
        !private || reads.len() == shards.len(),
        "one results topic per shard, or the default one"
    );
    let publish_config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(ANSWER_TIMEOUT));
    // One connection per node, shared by the shards it holds.
    let mut by_url: HashMap<String, MultiplexedConnection> = HashMap::new();
    let mut publishers = Vec::with_capacity(shards.len());
    for (stream, url) in shards {
        if !by_url.contains_key(url) {
            let connection = redis::Client::open(url.as_str())
                .context("parsing the Redis URL")?
                .get_multiplexed_async_connection_with_config(&publish_config)
                .await
                .context("connecting the publisher")?;
            by_url.insert(url.clone(), connection);
        }
        publishers.push((stream.clone(), by_url[url].clone()));
    }
    let publishers = Arc::new(publishers);
    let topics: Option<Arc<Vec<String>>> =
        private.then(|| Arc::new(reads.iter().map(|(topic, _)| topic.clone()).collect()));
    let read_config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let stream_cap = stream_cap(spec.kind.payload_bytes());
    let pending: Pending = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut dispatchers = Vec::with_capacity(reads.len());
    for (topic, url) in reads {
        let mut reader = redis::Client::open(url.as_str())
            .context("parsing the Redis URL")?
            .get_multiplexed_async_connection_with_config(&read_config)
            .await
            .context("connecting the dispatcher")?;
        let last_id = last_entry_id(&mut reader, topic).await?;
        dispatchers.push(tokio::spawn(dispatch(
            reader,
            topic.clone(),
            last_id,
            Arc::clone(&pending),
            Arc::clone(&stop),
            stream_cap,
            spec.generator,
        )));
    }

    let started = Instant::now();
    let deadline = started + spec.duration;
    let issued = Arc::new(AtomicU64::new(0));
    let mut lanes = Vec::with_capacity(spec.in_flight);
    for _ in 0..spec.in_flight {
        let lane = Lane {
            publishers: Arc::clone(&publishers),
            topics: topics.clone(),
            pending: Arc::clone(&pending),
            issued: Arc::clone(&issued),
            kind: spec.kind.clone(),
            generator: spec.generator,
            deadline,
            max_requests: spec.max_requests,
            add_options: match spec.generator {
                Generator::Harness => StreamAddOptions::default()
                    .trim(StreamTrimStrategy::maxlen(StreamTrimmingMode::Approx, stream_cap)),
                Generator::Independent => StreamAddOptions::default(),
            },
        };
        lanes.push(tokio::spawn(lane.run()));
    }
    let mut res = LoadResult {
        n_ok: 0,
        n_failed: 0,
        n_timeouts: 0,
        n_send_errors: 0,
        first_error: None,
        elapsed: Duration::ZERO,
        histogram: new_histogram(),
    };
    for lane in lanes {
        let tally = lane.await.context("a load lane panicked")?;
        res.n_ok += tally.n_ok;
        res.n_failed += tally.n_failed;
        res.n_timeouts += tally.n_timeouts;
        res.n_send_errors += tally.n_send_errors;
        if res.first_error.is_none() {
            res.first_error = tally.first_error;
        }
        res.histogram.add(&tally.histogram).context("merging histograms")?;
    }
    res.elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    // The dispatcher notices `stop` within one BLOCK period; its own errors were already
    // reported to the lanes as timeouts.
    for dispatcher in dispatchers {
        let _ = dispatcher.await;
    }
    Ok(res)
}

/// An empty latency histogram: 1 µs to 100 s at 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts (low >= 1, high >= 2 * low).
    #[allow(clippy::unwrap_used)]
    Histogram::new_with_bounds(1, 100_000_000, 3).unwrap()
}

/// The `MAXLEN ~` for streams carrying payloads of `payload_bytes`.
pub fn stream_cap(payload_bytes: usize) -> usize {
    (STREAM_BYTES_BUDGET / payload_bytes.max(1)).clamp(256, DEFAULT_MAXLEN)
}

/// The id of the newest entry of `stream`, or `0-0` when it is empty or missing.
///
/// # Errors
///
/// When Redis fails.
pub async fn last_entry_id(connection: &mut MultiplexedConnection, stream: &str) -> anyhow::Result<String> {
    let newest: StreamRangeReply = connection.xrevrange_count(stream, "+", "-", 1).await?;
    Ok(newest.ids.into_iter().next().map(|entry| entry.id).unwrap_or_else(|| "0-0".to_owned()))
}

/// What the dispatcher tells a lane: when its answer was read and what it said.
#[derive(Debug)]
struct Answered {
    at: Instant,
    success: bool,
    error: Option<String>,
}

type Pending = Arc<Mutex<HashMap<String, oneshot::Sender<Answered>>>>;

struct Lane {
    /// Each shard's stream and a connection to its node.
    publishers: Arc<Vec<(String, MultiplexedConnection)>>,
    /// Each shard's results topic, when requests name one.
    topics: Option<Arc<Vec<String>>>,
    pending: Pending,
    issued: Arc<AtomicU64>,
    kind: RequestKind,
    generator: Generator,
    deadline: Instant,
    max_requests: Option<u64>,
    add_options: StreamAddOptions,
}

struct Tally {
    n_ok: u64,
    n_failed: u64,
    n_timeouts: u64,
    n_send_errors: u64,
    first_error: Option<String>,
    histogram: Histogram<u64>,
}

impl Lane {
    async fn run(self) -> Tally {
        let mut tally = Tally {
            n_ok: 0,
            n_failed: 0,
            n_timeouts: 0,
            n_send_errors: 0,
            first_error: None,
            histogram: new_histogram(),
        };
        while Instant::now() < self.deadline {
            if let Some(max_requests) = self.max_requests
                && self.issued.fetch_add(1, Ordering::Relaxed) >= max_requests
            {
                break;
            }
            let built = match self.generator {
                Generator::Harness => envelope::request_to(&self.kind, &|request_id| {
                    let topics = self.topics.as_ref()?;
                    topics.get(crate::shards::of(request_id, topics.len())).cloned()
                }),
                Generator::Independent => envelope::independent_request(),
            };
            let request = match built {
                Ok(request) => request,
                Err(err) => {
                    tally.n_send_errors += 1;
                    tally.first_error.get_or_insert_with(|| format!("building a request: {err}"));
                    break;
                }
            };
            let (answer_tx, answer_rx) = oneshot::channel();
            self.lock_pending().insert(request.request_id.clone(), answer_tx);
            let sent_at = Instant::now();
            let mut fields = vec![("id", request.id.as_str()), ("payload", request.payload.as_str())];
            if let Some(sig) = &request.sig {
                fields.push(("sig", sig.as_str()));
            }
            let shard = crate::shards::of(&request.request_id, self.publishers.len());
            let (stream, publisher) = &self.publishers[shard];
            let added: redis::RedisResult<String> =
                publisher.clone().xadd_options(stream.as_str(), "*", &fields, &self.add_options).await;
            if let Err(err) = added {
                self.lock_pending().remove(&request.request_id);
                tally.n_send_errors += 1;
                tally.first_error.get_or_insert_with(|| format!("XADD failed: {err}"));
                // A failing Redis would otherwise turn this lane into a busy loop.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            match tokio::time::timeout(ANSWER_TIMEOUT, answer_rx).await {
                Ok(Ok(answered)) => {
                    let micros = answered.at.saturating_duration_since(sent_at).as_micros();
                    tally.histogram.saturating_record(u64::try_from(micros).unwrap_or(u64::MAX).max(1));
                    if answered.success {
                        tally.n_ok += 1;
                    } else {
                        tally.n_failed += 1;
                        if tally.first_error.is_none() {
                            tally.first_error = answered.error;
                        }
                    }
                }
                // The sender is dropped only if the dispatcher died; both count as no answer.
                Ok(Err(_)) | Err(_) => {
                    self.lock_pending().remove(&request.request_id);
                    tally.n_timeouts += 1;
                    tally
                        .first_error
                        .get_or_insert_with(|| format!("no answer within {} s", ANSWER_TIMEOUT.as_secs()));
                }
            }
        }
        tally
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<Answered>>> {
        // A poisoned map only means another lane panicked; its entries are still valid.
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Reads answers after `last_id` and hands each to the lane waiting for it.
async fn dispatch(
    mut reader: MultiplexedConnection,
    topic: String,
    mut last_id: String,
    pending: Pending,
    stop: Arc<AtomicBool>,
    stream_cap: usize,
    generator: Generator,
) {
    let options = match generator {
        Generator::Harness => StreamReadOptions::default().count(1024).block(100),
        Generator::Independent => StreamReadOptions::default().block(100),
    };
    let mut n_since_trim = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let reply: redis::RedisResult<Option<StreamReadReply>> =
            reader.xread_options(&[topic.as_str()], &[last_id.as_str()], &options).await;
        let reply = match reply {
            Ok(Some(reply)) => reply,
            Ok(None) => continue,
            Err(err) => {
                eprintln!("bench: dispatcher read failed: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let read_at = Instant::now();
        for stream_key in reply.keys {
            for entry in stream_key.ids {
                if let Some(redis::Value::BulkString(payload)) = entry.map.get("payload")
                    && let Ok(summary) = serde_json::from_slice::<AnswerSummary>(payload)
                    && let Some(request_id) = summary.data.request_id
                {
                    let waiting =
                        pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&request_id);
                    if let Some(answer_tx) = waiting {
                        let error = match (summary.data.error_code, summary.data.error) {
                            (None, None) => None,
                            (code, sentence) => Some(format!(
                                "{}: {}",
                                code.unwrap_or_default(),
                                sentence.unwrap_or_default()
                            )),
                        };
                        // The lane may have timed out meanwhile; then nobody wants this.
                        let _ = answer_tx.send(Answered {
                            at: read_at,
                            success: summary.data.success == Some(true),
                            error,
                        });
                    }
                }
                last_id = entry.id;
                n_since_trim += 1;
            }
        }
        // Large answers are trimmed here as well, since the worker under test chooses its
        // own MAXLEN for the results stream.
        if generator == Generator::Harness && stream_cap < DEFAULT_MAXLEN && n_since_trim >= stream_cap / 4 {
            n_since_trim = 0;
            let trimmed: redis::RedisResult<usize> = reader
                .xtrim_options(
                    topic.as_str(),
                    &redis::streams::StreamTrimOptions::maxlen(StreamTrimmingMode::Approx, stream_cap),
                )
                .await;
            if let Err(err) = trimmed {
                eprintln!("bench: trimming results failed: {err}");
            }
        }
    }
}
