//! The reference workers: the least work a correct worker must do, at least once or exactly once.
//!
//! Both use one multiplexed connection and a loop of `XREADGROUP ... COUNT n BLOCK ms`, and
//! answer `echo.requested` with the same result envelope toolhost writes. They deliberately
//! have no tool registry, no schema validation, no metrics: they are the floors toolhost is
//! compared with, not daemons.
//!
//! - [`Mode::AtLeastOnce`]: for the whole batch one pipeline holding an `XADD` per answer and
//!   a single `XACK`, so one round trip per batch. The ack follows the answer in the same
//!   pipeline, which Redis runs in order, so a crash never acks an unanswered request; but a
//!   crash between the two, or a copy of a request, is answered twice. No reclaim.
//! - [`Mode::ExactlyOnce`]: one Lua script call per batch (`scripts/floor_answer.lua`) that,
//!   per entry, sets the request's answered mark with `SET NX PX` and publishes the answer only
//!   if that set it, then acks the batch; atomically, so a request id is answered once across
//!   a crash, a redelivery and a copy sent again within the retention. On start it reclaims the
//!   group's entries idle for `claim_idle_ms` with `XAUTOCLAIM` (those of a crashed worker) and
//!   answers them the same way before it reads new ones.

use std::time::Duration;

use anyhow::Context as _;
use redis::AsyncCommands as _;
use redis::aio::MultiplexedConnection;
use redis::streams::{
    StreamAddOptions, StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamReadOptions,
    StreamReadReply, StreamTrimStrategy, StreamTrimmingMode,
};

use crate::envelope::{self, DEFAULT_MAXLEN, REQUESTS_STREAM};

/// Which promise the worker keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Answer, then ack, pipelined: every request is answered at least once.
    AtLeastOnce,
    /// Mark, answer and ack in one script: every request id is answered exactly once while
    /// its mark lives.
    ExactlyOnce,
}

/// How the reference worker runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Redis URL.
    pub redis_url: String,
    /// Consumer group to read with; also the toolbox id in `source`.
    pub group: String,
    /// Consumer name inside the group.
    pub consumer: String,
    /// Entries per `XREADGROUP`.
    pub count: usize,
    /// `BLOCK` milliseconds per `XREADGROUP`.
    pub block_ms: usize,
    /// At least once or exactly once.
    pub mode: Mode,
    /// Exactly once: how long an answered mark lives, ms.
    pub retention_ms: u64,
    /// Exactly once: entries pending this long at start are reclaimed, ms.
    pub claim_idle_ms: u64,
}

/// The answered mark of `request_id` on `stream`, in the shape of toolhost's own
/// (`toolhost:ledger:<stream>:answered:<request_id>`), so their memory compares.
pub fn answered_mark(stream: &str, request_id: &str) -> String {
    format!("refworker:ledger:{stream}:answered:{request_id}")
}

/// Runs the worker until the connection fails.
///
/// # Errors
///
/// When Redis cannot be reached, the group cannot be created, or a command fails.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let client = redis::Client::open(config.redis_url.as_str()).context("parsing the Redis URL")?;
    // A blocking read may legitimately take `block_ms`, so the response timeout must not
    // be shorter than that; none at all is simplest for a benchmark worker.
    let connection_config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut connection = client
        .get_multiplexed_async_connection_with_config(&connection_config)
        .await
        .context("connecting to Redis")?;

    let created: redis::RedisResult<()> =
        connection.xgroup_create_mkstream(REQUESTS_STREAM, &config.group, "$").await;
    match created {
        Ok(()) => {}
        Err(err) if err.code() == Some("BUSYGROUP") => {}
        Err(err) => return Err(err).context("creating the consumer group"),
    }

    let mut worker = Worker {
        add_options: StreamAddOptions::default()
            .trim(StreamTrimStrategy::maxlen(StreamTrimmingMode::Approx, DEFAULT_MAXLEN)),
        script: redis::Script::new(include_str!("scripts/floor_answer.lua")),
        config: &config,
        connection,
    };
    if config.mode == Mode::ExactlyOnce {
        worker.reclaim().await?;
    }
    let read_options = StreamReadOptions::default()
        .group(&config.group, &config.consumer)
        .count(config.count)
        .block(config.block_ms);
    loop {
        let reply: Option<StreamReadReply> = worker
            .connection
            .xread_options(&[REQUESTS_STREAM], &[">"], &read_options)
            .await
            .context("reading requests")?;
        let Some(reply) = reply else { continue };
        let entries: Vec<StreamId> = reply.keys.into_iter().flat_map(|key| key.ids).collect();
        worker.answer(&entries).await?;
    }
}

/// The default consumer name: unique per process.
pub fn default_consumer() -> String {
    format!("refworker-{}", std::process::id())
}

/// Default `BLOCK` for the reads.
pub const DEFAULT_BLOCK: Duration = Duration::from_millis(1000);
/// Default lifetime of an answered mark: toolhost's default `answered_retention_ms`.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Default idle time after which a pending entry is reclaimed: toolhost's `claim_idle_ms`.
pub const DEFAULT_CLAIM_IDLE: Duration = Duration::from_secs(30);

struct Worker<'a> {
    config: &'a Config,
    connection: MultiplexedConnection,
    add_options: StreamAddOptions,
    script: redis::Script,
}

impl Worker<'_> {
    /// Takes over every entry of the group idle for `claim_idle_ms` and answers it.
    async fn reclaim(&mut self) -> anyhow::Result<()> {
        let mut cursor = "0-0".to_owned();
        loop {
            let reply: StreamAutoClaimReply = self
                .connection
                .xautoclaim_options(
                    REQUESTS_STREAM,
                    &self.config.group,
                    &self.config.consumer,
                    self.config.claim_idle_ms,
                    &cursor,
                    StreamAutoClaimOptions::default().count(self.config.count),
                )
                .await
                .context("reclaiming pending entries")?;
            // Entries trimmed from the stream come back as deleted ids, and Redis 7 drops them
            // from the pending list itself: there is nothing left to answer them with.
            self.answer(&reply.claimed).await?;
            if reply.next_stream_id == "0-0" {
                return Ok(());
            }
            cursor = reply.next_stream_id;
        }
    }

    /// Answers and acks one batch of entries, in one round trip.
    async fn answer(&mut self, entries: &[StreamId]) -> anyhow::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        match self.config.mode {
            Mode::AtLeastOnce => self.answer_at_least_once(entries).await,
            Mode::ExactlyOnce => self.answer_exactly_once(entries).await,
        }
    }

    async fn answer_at_least_once(&mut self, entries: &[StreamId]) -> anyhow::Result<()> {
        let mut pipeline = redis::pipe();
        for entry in entries {
            if let Some(answer) = answer_of(entry, &self.config.group) {
                pipeline
                    .xadd_options(
                        &answer.topic,
                        "*",
                        &[("id", &answer.id), ("payload", &answer.payload)],
                        &self.add_options,
                    )
                    .ignore();
            }
        }
        let acked_ids: Vec<&str> = entries.iter().map(|entry| entry.id.as_str()).collect();
        pipeline.xack(REQUESTS_STREAM, &self.config.group, &acked_ids).ignore();
        pipeline.exec_async(&mut self.connection).await.context("publishing answers")?;
        Ok(())
    }

    async fn answer_exactly_once(&mut self, entries: &[StreamId]) -> anyhow::Result<()> {
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(REQUESTS_STREAM)
            .arg(&self.config.group)
            .arg(self.config.retention_ms)
            .arg(DEFAULT_MAXLEN);
        for entry in entries {
            match answer_of(entry, &self.config.group) {
                Some(answer) => {
                    let mark = answer.request_id.as_deref().map_or_else(
                        || answered_mark(REQUESTS_STREAM, ""),
                        |id| answered_mark(REQUESTS_STREAM, id),
                    );
                    let marked = if answer.request_id.is_some() { "1" } else { "0" };
                    invocation
                        .key(mark)
                        .key(answer.topic)
                        .arg(&entry.id)
                        .arg(answer.id)
                        .arg(answer.payload)
                        .arg(marked);
                }
                // Bad input is acked without an answer; the benchmark never sends any.
                None => {
                    invocation
                        .key(answered_mark(REQUESTS_STREAM, ""))
                        .key(REQUESTS_STREAM)
                        .arg(&entry.id)
                        .arg("")
                        .arg("")
                        .arg("0");
                }
            }
        }
        let _published: u64 =
            invocation.invoke_async(&mut self.connection).await.context("answering a batch")?;
        Ok(())
    }
}

/// The echo answer to `entry`, or `None` (logged) when its payload is not a JSON object.
fn answer_of(entry: &StreamId, group: &str) -> Option<envelope::Answer> {
    let payload = match entry.map.get("payload") {
        Some(redis::Value::BulkString(bytes)) => bytes.as_slice(),
        _ => &[][..],
    };
    match envelope::echo_answer(payload, group) {
        Ok(answer) => Some(answer),
        // Bad input never stops the loop. A real worker dead-letters it; the benchmark never
        // sends any, so logging and acking is enough here.
        Err(err) => {
            eprintln!("refworker: entry {} is not a JSON object: {err}", entry.id);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_have_the_shape_of_toolhosts() {
        assert_eq!(answered_mark("action-requests", "r-1"), "refworker:ledger:action-requests:answered:r-1");
    }
}
