//! The reference worker: the least work a correct at-least-once worker must do.
//!
//! One multiplexed connection; a loop of `XREADGROUP ... COUNT n BLOCK ms`, then for the
//! whole batch one pipeline holding an `XADD` per answer and a single `XACK`, so one round
//! trip per batch. The ack follows the answer in the same pipeline, which Redis runs in
//! order, so a crash never acks an unanswered request. It deliberately has no tool
//! registry, no schema validation, no metrics and no reclaim of other consumers' entries:
//! it is the floor toolhost is compared with, not a daemon.

use std::time::Duration;

use anyhow::Context as _;
use redis::AsyncCommands as _;
use redis::streams::{
    StreamAddOptions, StreamReadOptions, StreamReadReply, StreamTrimStrategy, StreamTrimmingMode,
};

use crate::envelope::{self, DEFAULT_MAXLEN, REQUESTS_STREAM};

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

    let read_options = StreamReadOptions::default()
        .group(&config.group, &config.consumer)
        .count(config.count)
        .block(config.block_ms);
    let add_options = StreamAddOptions::default()
        .trim(StreamTrimStrategy::maxlen(StreamTrimmingMode::Approx, DEFAULT_MAXLEN));
    loop {
        let reply: Option<StreamReadReply> = connection
            .xread_options(&[REQUESTS_STREAM], &[">"], &read_options)
            .await
            .context("reading requests")?;
        let Some(reply) = reply else { continue };
        let mut pipeline = redis::pipe();
        let mut acked_ids = Vec::new();
        for stream_key in reply.keys {
            for entry in stream_key.ids {
                let payload = match entry.map.get("payload") {
                    Some(redis::Value::BulkString(bytes)) => bytes.as_slice(),
                    _ => &[][..],
                };
                match envelope::echo_answer(payload, &config.group) {
                    Ok(answer) => {
                        pipeline
                            .xadd_options(
                                &answer.topic,
                                "*",
                                &[("id", &answer.id), ("payload", &answer.payload)],
                                &add_options,
                            )
                            .ignore();
                    }
                    // Bad input never stops the loop. A real worker dead-letters it; the
                    // benchmark never sends any, so logging and acking is enough here.
                    Err(err) => eprintln!("refworker: entry {} is not a JSON object: {err}", entry.id),
                }
                acked_ids.push(entry.id);
            }
        }
        if acked_ids.is_empty() {
            continue;
        }
        pipeline.xack(REQUESTS_STREAM, &config.group, &acked_ids).ignore();
        pipeline.exec_async(&mut connection).await.context("publishing answers")?;
    }
}

/// The default consumer name: unique per process.
pub fn default_consumer() -> String {
    format!("refworker-{}", std::process::id())
}

/// Default `BLOCK` for the reads.
pub const DEFAULT_BLOCK: Duration = Duration::from_millis(1000);
