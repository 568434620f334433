//! Installs the tracing subscriber: JSON lines on stdout by default, or a human format.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `level` is a tracing filter, overridden by `RUST_LOG` when
/// set (`rust_log`). Returns an error if a subscriber is installed already.
///
/// # Errors
/// A subscriber was installed before.
pub fn install(format: &str, level: &str, rust_log: Option<&str>) -> Result<(), String> {
    let filter = rust_log
        .and_then(|directives| EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stdout);
    let res = if format == "pretty" {
        builder.with_target(false).try_init()
    } else {
        builder.json().flatten_event(true).with_current_span(false).with_span_list(false).try_init()
    };
    res.map_err(|err| err.to_string())
}
