//! Installs the tracing subscriber: JSON lines on stdout, or a human format on a terminal.

use std::io::{IsTerminal, Write};

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
    let filter = filter(level, rust_log);
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(|| LogStdout(std::io::stdout()));
    let res = if resolve_format(format, std::io::stdout().is_terminal()) == "pretty" {
        builder.with_target(false).try_init()
    } else {
        builder.json().flatten_event(true).with_current_span(false).with_span_list(false).try_init()
    };
    res.map_err(|err| err.to_string())
}

/// The filter of `level` (or `RUST_LOG`). rmcp logs every MCP session's start and every error
/// answer it sends; those are the MCP door's ordinary traffic, so it logs only its own errors
/// unless the directives name it.
fn filter(level: &str, rust_log: Option<&str>) -> EnvFilter {
    let directives = rust_log.filter(|directives| EnvFilter::try_new(directives).is_ok()).unwrap_or(level);
    if directives.contains("rmcp") {
        EnvFilter::new(directives)
    } else {
        EnvFilter::new(format!("{directives},rmcp=error"))
    }
}

/// Installs JSON log lines on stderr, for `toolhost mcp`, whose stdout is the MCP protocol.
///
/// # Errors
/// A subscriber was installed before.
pub fn install_stderr(level: &str, rust_log: Option<&str>) -> Result<(), String> {
    let filter = filter(level, rust_log);
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .try_init()
        .map_err(|err| err.to_string())
}

/// Stdout for log lines. When its reader has gone (`toolhost serve | head`), the lines are lost
/// quietly instead of each adding a complaint on stderr; the daemon serves on.
struct LogStdout(std::io::Stdout);

impl Write for LogStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.0.write(buf) {
            Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(buf.len()),
            res => res,
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self.0.flush() {
            Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            res => res,
        }
    }
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
