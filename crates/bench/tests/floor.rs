//! The exactly-once floor (`toolhost-refworker --exactly-once`) really answers each request id
//! once: across a crash with entries pending, across a copy of a request, and across the same
//! entries delivered to two workers. Each test starts its own `redis-server` on a free
//! loopback port and runs the worker binary as a process, so a crash is a real `SIGKILL`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap is a failed test.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::Commands as _;
use redis::streams::{StreamPendingReply, StreamRangeReply};
use toolhost_bench::envelope::{
    self, AnswerSummary, DEFAULT_GROUP, REQUESTS_STREAM, RESULTS_STREAM, RequestKind,
};
use toolhost_bench::redis_server::RedisServer;

const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// A worker process, killed when dropped.
struct Worker {
    child: Child,
}

impl Worker {
    /// Starts `toolhost-refworker --exactly-once` as consumer `consumer`, with a short reclaim
    /// idle time, small batches and short blocking reads.
    fn start(redis: &RedisServer, consumer: &str, count: usize) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_toolhost-refworker"))
            .args(["--redis-url", &redis.url(), "--exactly-once", "--consumer", consumer])
            .args(["--count", &count.to_string(), "--block-ms", "100", "--claim-idle-ms", "200"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting toolhost-refworker");
        Worker { child }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill {signal} failed");
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Already gone after `kill`; that is fine.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connect(redis: &RedisServer) -> redis::Connection {
    redis::Client::open(redis.url()).unwrap().get_connection().unwrap()
}

/// Waits until the group exists: entries added before would be skipped (it starts at `$`).
fn wait_for_group(connection: &mut redis::Connection) {
    let started = Instant::now();
    loop {
        let groups: redis::RedisResult<redis::streams::StreamInfoGroupsReply> =
            connection.xinfo_groups(REQUESTS_STREAM);
        if groups.is_ok_and(|groups| !groups.groups.is_empty()) {
            return;
        }
        assert!(started.elapsed() < WAIT_LIMIT, "the worker never created its group");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Adds `requests` (payload text) as entries, pipelined; returns their entry ids.
fn add_requests(connection: &mut redis::Connection, payloads: &[String]) -> Vec<String> {
    let mut ids = Vec::new();
    for chunk in payloads.chunks(1000) {
        let mut pipeline = redis::pipe();
        for payload in chunk {
            pipeline.xadd(REQUESTS_STREAM, "*", &[("id", "e"), ("payload", payload.as_str())]);
        }
        let added: Vec<String> = pipeline.query(connection).unwrap();
        ids.extend(added);
    }
    ids
}

fn echo_requests(n: usize) -> Vec<envelope::Request> {
    (0..n).map(|_| envelope::request(&RequestKind::echo(100)).unwrap()).collect()
}

fn pending_count(connection: &mut redis::Connection) -> usize {
    let pending: StreamPendingReply = connection.xpending(REQUESTS_STREAM, DEFAULT_GROUP).unwrap();
    pending.count()
}

fn pending_of(connection: &mut redis::Connection, consumer: &str) -> usize {
    match connection.xpending::<_, _, StreamPendingReply>(REQUESTS_STREAM, DEFAULT_GROUP).unwrap() {
        StreamPendingReply::Data(data) => {
            data.consumers.iter().filter(|info| info.name == consumer).map(|info| info.pending).sum()
        }
        _ => 0,
    }
}

/// Waits until every entry of the stream was delivered to the group and acked: then no
/// worker has anything left to answer.
fn wait_until_all_acked(connection: &mut redis::Connection) {
    let started = Instant::now();
    loop {
        let last: StreamRangeReply = connection.xrevrange_count(REQUESTS_STREAM, "+", "-", 1).unwrap();
        let last_id = last.ids.first().map(|entry| entry.id.clone()).unwrap_or_default();
        let groups: redis::streams::StreamInfoGroupsReply = connection.xinfo_groups(REQUESTS_STREAM).unwrap();
        let delivered = groups.groups.iter().any(|group| group.last_delivered_id == last_id);
        if delivered && pending_count(connection) == 0 {
            return;
        }
        assert!(
            started.elapsed() < WAIT_LIMIT,
            "entries still unanswered after {} s: {} pending",
            WAIT_LIMIT.as_secs(),
            pending_count(connection)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How many answers each request id got on the results stream.
fn answers_per_request(connection: &mut redis::Connection) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    let mut start = "-".to_owned();
    loop {
        let page: StreamRangeReply = connection.xrange_count(RESULTS_STREAM, &start, "+", 1000).unwrap();
        let Some(last) = page.ids.last() else { return counts };
        let next = format!("({}", last.id);
        for entry in &page.ids {
            let payload: Vec<u8> = entry.get("payload").unwrap();
            let summary: AnswerSummary = serde_json::from_slice(&payload).unwrap();
            assert_eq!(summary.data.success, Some(true), "an echo answer failed");
            *counts.entry(summary.data.request_id.unwrap()).or_insert(0) += 1;
        }
        start = next;
    }
}

fn answered_count(connection: &mut redis::Connection) -> usize {
    connection.xlen(RESULTS_STREAM).unwrap()
}

/// Asserts that exactly the request ids in `expected` were answered, each once.
fn assert_each_answered_once(connection: &mut redis::Connection, expected: &[&str]) {
    let counts = answers_per_request(connection);
    let twice: Vec<(&String, &usize)> = counts.iter().filter(|&(_, &n)| n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} request ids answered more than once, e.g. {:?}",
        twice.len(),
        twice.first()
    );
    let missing: Vec<&&str> = expected.iter().filter(|id| !counts.contains_key(**id)).collect();
    assert!(missing.is_empty(), "{} request ids never answered, e.g. {:?}", missing.len(), missing.first());
    assert_eq!(counts.len(), expected.len(), "answers to request ids that were never sent");
}

/// Stops `worker` with `SIGSTOP` at a moment it holds delivered, unacked entries (retrying
/// until it does) and returns how many it holds. Panics if it answers everything first.
fn stop_while_holding(
    connection: &mut redis::Connection,
    worker: &Worker,
    consumer: &str,
    total: usize,
) -> usize {
    let started = Instant::now();
    loop {
        worker.signal("-STOP");
        let held = pending_of(connection, consumer);
        if held > 0 {
            return held;
        }
        worker.signal("-CONT");
        assert!(
            answered_count(connection) < total && started.elapsed() < WAIT_LIMIT,
            "the worker was never caught holding pending entries"
        );
        std::thread::sleep(Duration::from_micros(300));
    }
}

#[test]
fn a_worker_killed_with_entries_pending_is_replaced_and_each_request_is_answered_once() {
    let redis = RedisServer::start().unwrap();
    let mut connection = connect(&redis);
    let mut first = Worker::start(&redis, "first", 16);
    wait_for_group(&mut connection);
    let requests = echo_requests(20_000);
    let payloads: Vec<String> = requests.iter().map(|request| request.payload.clone()).collect();
    add_requests(&mut connection, &payloads);

    // Let it answer some, then kill it while it holds a batch it has read and not acked.
    while answered_count(&mut connection) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let held = stop_while_holding(&mut connection, &first, "first", requests.len());
    first.kill();
    let answered_before = answered_count(&mut connection);
    assert!(answered_before < requests.len(), "the crash came after the last answer");
    assert_eq!(pending_of(&mut connection, "first"), held, "a dead worker's entries stay pending");

    // A new consumer (another name, so only XAUTOCLAIM gives it the dead one's entries) takes
    // over once they have been idle past --claim-idle-ms.
    std::thread::sleep(Duration::from_millis(300));
    let _second = Worker::start(&redis, "second", 16);
    wait_until_all_acked(&mut connection);
    assert_eq!(pending_of(&mut connection, "first"), 0, "the dead worker's entries were reclaimed");

    let expected: Vec<&str> = requests.iter().map(|request| request.request_id.as_str()).collect();
    assert_each_answered_once(&mut connection, &expected);
    // Every answered request left exactly one answered mark.
    let marks: usize = redis::cmd("DBSIZE").query::<usize>(&mut connection).unwrap() - 2;
    assert_eq!(marks, requests.len(), "one answered mark per request, beside the two streams");
}

#[test]
fn the_same_request_id_sent_twice_is_answered_once() {
    let redis = RedisServer::start().unwrap();
    let mut connection = connect(&redis);
    let _worker = Worker::start(&redis, "only", 64);
    wait_for_group(&mut connection);
    let requests = echo_requests(200);
    // Every request twice in a row, so most copies land in the same batch as their original.
    let doubled: Vec<String> =
        requests.iter().flat_map(|request| [request.payload.clone(), request.payload.clone()]).collect();
    add_requests(&mut connection, &doubled);
    wait_until_all_acked(&mut connection);
    let expected: Vec<&str> = requests.iter().map(|request| request.request_id.as_str()).collect();
    assert_each_answered_once(&mut connection, &expected);

    // And a third copy of each, sent after the first was answered, gets no answer either.
    add_requests(&mut connection, &doubled[..requests.len()]);
    let third: Vec<String> = requests.iter().map(|request| request.payload.clone()).collect();
    add_requests(&mut connection, &third);
    wait_until_all_acked(&mut connection);
    assert_each_answered_once(&mut connection, &expected);
    assert_eq!(answered_count(&mut connection), requests.len());
}

#[test]
fn entries_delivered_to_a_paused_worker_and_reclaimed_by_another_are_answered_once() {
    let redis = RedisServer::start().unwrap();
    let mut connection = connect(&redis);
    let paused = Worker::start(&redis, "paused", 16);
    wait_for_group(&mut connection);
    let requests = echo_requests(20_000);
    let payloads: Vec<String> = requests.iter().map(|request| request.payload.clone()).collect();
    add_requests(&mut connection, &payloads);
    while answered_count(&mut connection) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    stop_while_holding(&mut connection, &paused, "paused", requests.len());

    // Another worker reclaims the paused one's batch and answers it ...
    std::thread::sleep(Duration::from_millis(300));
    let _other = Worker::start(&redis, "other", 16);
    let started = Instant::now();
    while pending_of(&mut connection, "paused") > 0 {
        assert!(started.elapsed() < WAIT_LIMIT, "the paused worker's entries were never reclaimed");
        std::thread::sleep(Duration::from_millis(5));
    }
    // ... then the paused one resumes and answers the same entries, which it still holds in
    // memory: its script finds the marks and publishes nothing.
    paused.signal("-CONT");
    wait_until_all_acked(&mut connection);
    let expected: Vec<&str> = requests.iter().map(|request| request.request_id.as_str()).collect();
    assert_each_answered_once(&mut connection, &expected);
}
