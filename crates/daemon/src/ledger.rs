//! The call-ledger steps every consumer-group reader shares: record a call's start, keep its
//! lease alive while it runs, and commit its end, each retried while Redis is unavailable.
//!
//! The dispatcher (`action-requests`) and the chat inbox (`chat:<agent>`) both answer each
//! delivered entry exactly once through these steps; what they answer differs, how they commit it
//! does not.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use toolhost_bus::{Bus, CallKeys, CallStart, Committed, EntryRef, Finish};
use toolhost_envelope::ErrorCode;
use toolhost_tools::Failure;
use tracing::{error, warn};

use crate::backoff::Backoff;
use crate::outage::redis_warn;
use crate::telemetry::Telemetry;

/// The owner of one handling of one entry: consumer, entry id and a random token.
///
/// [`Bus::begin_call`] gives the same owner the same answer again (so a retry after a lost reply
/// is safe), so each handling needs its own: an entry handled again by the same process, after
/// an earlier handling left it pending, must find that handling's record "started before".
pub(crate) fn owner(consumer: &str, entry_id: &str) -> String {
    let token = uuid::Uuid::new_v4().simple().to_string();
    format!("{consumer}/{entry_id}/{}", &token[..8])
}

/// Records that `owner` starts the call under `call`, retrying while Redis is unavailable.
/// `None` when it cannot be recorded (Redis refused, or `forced` fired): leave the entry pending.
pub(crate) async fn begin(
    bus: &dyn Bus,
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
/// the call runs. Never returns: select it against the call.
pub(crate) async fn renew(
    bus: &dyn Bus,
    call: &CallKeys<'_>,
    owner: &str,
    entry: &EntryRef<'_>,
    consumer: &str,
    request_id: &str,
    period: Duration,
) {
    let mut tick = tokio::time::interval(period);
    tick.tick().await;
    loop {
        tick.tick().await;
        match bus.renew_call(call, owner, entry, consumer).await {
            Ok(true) => {}
            Ok(false) => warn!(request_id, "lost the lease of a running call"),
            Err(err) => redis_warn!(&err, error = %err, request_id, "cannot renew lease"),
        }
    }
}

/// Runs [`Bus::finish`] until it succeeds, Redis refuses it, or `forced` fires. Returns what was
/// committed, or `None` when nothing could be committed and the entry stays pending.
pub(crate) async fn finish(
    bus: &dyn Bus,
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
