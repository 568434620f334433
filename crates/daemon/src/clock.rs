//! The wall clock, as the wire's times are counted: time since the UNIX epoch.

use std::time::Duration;

/// Now, as time since the UNIX epoch (zero if the clock is set before it).
pub(crate) fn now_since_epoch() -> Duration {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
}
