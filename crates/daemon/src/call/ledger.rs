//! The call-ledger steps of the lifecycle: record a call's start, keep its lease alive while it
//! runs, and commit its end, each retried while Redis is unavailable. The rules themselves (who
//! owns a call, when a lease lapses, what a commit does atomically) are the bus crate's.

use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolhost_bus::{CallKeys, CallStart, Committed, EntryRef, Finish, KeptAnswer, Ledger};
use toolhost_envelope::ErrorCode;
use toolhost_tools::Failure;
use tracing::{debug, error, warn};

use crate::backoff::Backoff;
use crate::outage::redis_warn;
use crate::telemetry::Telemetry;

/// Whether request `request_id` was answered in the ledger `ledger` (a bare stream name): the
/// ledger of the previous shard count while the count changes. `None`: not answered there;
/// `Some(None)`: answered, its answer not kept; `Some(Some(kept))`: answered with `kept`. On one
/// server the answered mark is read, on a cluster the request's claim once it says `answered`.
///
/// # Errors
/// Redis failed.
pub(crate) async fn former_answer(
    bus: &dyn toolhost_bus::Directory,
    keys: &toolhost_bus::Keys,
    ledger: &str,
    request_id: &str,
) -> Result<Option<Option<KeptAnswer>>, toolhost_bus::Error> {
    let key = keys.answered(ledger, request_id);
    if keys.is_cluster() {
        // A hash (ledger formats 1 and 2) or a string (format 3).
        let claim = toolhost_bus::read_claim(bus, &key).await?;
        return Ok(claim.filter(toolhost_bus::Claim::is_answered).map(|claim| claim.kept_answer()));
    }
    // The placeholder of ledger format 2 (refused entries, no answer) is not answered.
    let mark = bus.values(std::slice::from_ref(&key)).await?.into_iter().next().flatten();
    Ok(mark.filter(|mark| toolhost_bus::is_answer_mark(mark)).map(|mark| KeptAnswer::from_mark(&mark)))
}

/// Whether entry `entry_id` of the stream `stream` (bare name) is the copy moved there of entry
/// `source` of the stream `from` (bare name): the move's mark (`move_once.lua`) names the entry
/// it added.
///
/// # Errors
/// Redis failed.
pub(crate) async fn moved_from(
    bus: &dyn toolhost_bus::Directory,
    keys: &toolhost_bus::Keys,
    (stream, entry_id): (&str, &str),
    (from, source): (&str, &str),
) -> Result<bool, toolhost_bus::Error> {
    let mark = keys.moved(stream, from, source);
    let added = bus.values(std::slice::from_ref(&mark)).await?.into_iter().next().flatten();
    Ok(added.as_deref() == Some(entry_id))
}

/// Records that `owner` starts the call under `call`, retrying while Redis is unavailable.
/// `None` when it cannot be recorded (Redis refused, or `forced` fired): leave the entry pending.
pub(crate) async fn begin(
    bus: &dyn Ledger,
    call: &CallKeys<'_>,
    owner: &str,
    entry_id: &str,
    request_id: &str,
    forced: &CancellationToken,
) -> Option<CallStart> {
    let mut backoff = Backoff::new();
    loop {
        match bus.begin_call(call, owner, entry_id).await {
            Ok(start) => return Some(start),
            Err(err) if err.is_retryable() => {
                redis_warn!(&err, error = %err, request_id, "cannot record call start; retrying");
                if !backoff.wait(forced).await {
                    return None;
                }
            }
            Err(err) => {
                error!(error = %err, request_id, "cannot record call start");
                return None;
            }
        }
    }
}

/// Extends `owner`'s lease on a running call every `period`, so the entry is not reclaimed while
/// the call runs. A renewal that fails while Redis is unavailable is retried with backoff at
/// once rather than a period later, so a lease outlives a Redis outage shorter than about two
/// thirds of it (renewal itself works while Redis is out of memory). Never returns (its type
/// says so): select it against the call.
///
/// A call without an `owner` (a read-only, idempotent tool, run without a call record) has no
/// lease to extend: only its entry's idle time is reset, so no replica reclaims and reruns it
/// while it runs.
pub(crate) async fn renew(
    bus: &dyn Ledger,
    call: &CallKeys<'_>,
    owner: Option<&str>,
    entry: &EntryRef<'_>,
    consumer: &str,
    request_id: &str,
) -> std::convert::Infallible {
    let (tracked, owner) = (owner.is_some(), owner.unwrap_or_default());
    let mut tick = tokio::time::interval(call.renew_period());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    // Never cancelled: the caller drops this future when the call ends.
    let never = CancellationToken::new();
    loop {
        tick.tick().await;
        let mut backoff = Backoff::new();
        loop {
            match bus.renew_call(call, owner, entry, consumer, tracked).await {
                Ok(true) => break,
                Ok(false) if tracked => {
                    warn!(request_id, "lost the lease of a running call");
                    break;
                }
                Ok(false) => {
                    debug!(request_id, "the entry of a running untracked call is no longer ours");
                    break;
                }
                Err(err) if err.is_retryable() => {
                    redis_warn!(&err, error = %err, request_id, "cannot renew lease; retrying");
                    backoff.wait(&never).await;
                }
                Err(err) => {
                    warn!(error = %err, request_id, "cannot renew lease");
                    break;
                }
            }
        }
    }
}

/// Runs [`Bus::finish`] until it succeeds, Redis refuses it, or `forced` fires. Returns what was
/// committed, or `None` when nothing could be committed and the entry stays pending.
pub(crate) async fn finish(
    bus: &dyn Ledger,
    finish: &Finish<'_>,
    forced: &CancellationToken,
    telemetry: &Telemetry,
) -> Option<Committed> {
    let entry_id = finish.entry.entry_id;
    let mut backoff = Backoff::new();
    loop {
        match bus.finish(finish).await {
            Ok(published) => return Some(published),
            Err(err) if err.is_retryable() => {
                telemetry.set_redis_up(false);
                redis_warn!(&err, error = %err, entry_id, "cannot commit answer; retrying");
                if !backoff.wait(forced).await {
                    return None;
                }
            }
            Err(err) => {
                error!(error = %err, entry_id, "cannot commit answer; leaving the entry pending");
                return None;
            }
        }
    }
}

/// The answer to a call whose record fewer than `wanted` replicas acknowledged within `timeout`
/// (`[redis] replica_acks`): `overloaded`, with a hint to retry after about that long, when the
/// replicas may be back.
pub(crate) fn unreplicated(tool: &str, acked: u32, wanted: u32, timeout: Duration) -> Failure {
    let retry_after = timeout.clamp(Duration::from_millis(100), Duration::from_secs(30));
    Failure {
        code: ErrorCode::Overloaded,
        message: format!(
            "'{tool}' was not run: {acked} of the {wanted} Redis replicas it needs acknowledged the \
             call's record within {} ms; retry later with the same request_id",
            timeout.as_millis()
        ),
        details: Some(json!({
            "retry_after_ms": retry_after.as_millis() as u64,
            "replicas_acknowledged": acked,
            "replicas_required": wanted,
        })),
    }
}

/// The answer to a call whose earlier holder stopped mid-run, when the tool is not idempotent.
pub(crate) fn interrupted(tool: &str) -> Failure {
    Failure::new(
        ErrorCode::Interrupted,
        format!(
            "the tool host stopped while '{tool}' was running; the call was not repeated because \
             '{tool}' is not idempotent, so check its effects before calling it again"
        ),
    )
}
