//! Installs the tracing subscriber: JSON lines on stdout, or a human format on a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The format `auto` stands for: `pretty` when stdout is a terminal (a first `just run`),
/// `json` otherwise (containers, systemd, files). Other formats are returned unchanged.
pub fn resolve_format(format: &str, stdout_is_terminal: bool) -> &str {
    match format {
        "auto" if stdout_is_terminal => "pretty",
        "auto" => "json",
        other => other,
    }
}

/// Installs the global subscriber. `format` is `auto`, `json` or `pretty`; `level` is a tracing
/// filter, overridden by `RUST_LOG` when set (`rust_log`).
///
/// # Errors
/// A subscriber was installed before.
pub fn install(format: &str, level: &str, rust_log: Option<&str>) -> Result<(), String> {
    let filter = rust_log
        .and_then(|directives| EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stdout);
    let res = if resolve_format(format, std::io::stdout().is_terminal()) == "pretty" {
        builder.with_target(false).try_init()
    } else {
        builder.json().flatten_event(true).with_current_span(false).with_span_list(false).try_init()
    };
    res.map_err(|err| err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_pretty_on_a_terminal_and_json_elsewhere() {
        assert_eq!(resolve_format("auto", true), "pretty");
        assert_eq!(resolve_format("auto", false), "json");
        assert_eq!(resolve_format("json", true), "json");
        assert_eq!(resolve_format("pretty", false), "pretty");
    }
}
