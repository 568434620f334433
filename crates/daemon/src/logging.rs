//! Installs the tracing subscriber: JSON lines on stdout, or a human format on a terminal.

use std::fmt;
use std::io::{IsTerminal, Write};

use serde::ser::{SerializeMap, Serializer as _};
use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_serde::{AsSerde, SerdeMapVisitor};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::registry::LookupSpan;

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
        builder.with_ansi(false).fmt_fields(JsonFields::new()).event_format(JsonLines).try_init()
    };
    res.map_err(|err| err.to_string())
}

/// JSON lines: one object per event, `timestamp`, `level`, the event's fields in order and
/// `target`, no spans. The bytes are those of tracing-subscriber's `json()` format with
/// `flatten_event(true)` and without spans, made by the same serializer and field visitor
/// (`tracing_serde`); what differs is where they go. That format hands each of serde_json's
/// small writes (a quote, a colon, a key) through a UTF-8 check to a `fmt::Write`, which cost
/// about 27,000 instructions for a call's `invocation` line, a fifth of an echo call at `info`;
/// here the line is serialized into bytes and handed over once.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        json_line(event, &mut writer)
    }
}

/// Writes `event` as one JSON line (see [`JsonLines`]).
fn json_line(event: &Event<'_>, writer: &mut impl fmt::Write) -> fmt::Result {
    let mut timestamp = String::with_capacity(32);
    SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
    // A `log` record's own target, where the event carries it as fields.
    let normalized = event.normalized_metadata();
    let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
    let mut line = Vec::with_capacity(384);
    json_object(&mut line, &timestamp, meta, event).map_err(|_| fmt::Error)?;
    line.push(b'\n');
    writer.write_str(std::str::from_utf8(&line).map_err(|_| fmt::Error)?)
}

/// The JSON object of a line, into `line`.
fn json_object(
    line: &mut Vec<u8>,
    timestamp: &str,
    meta: &tracing::Metadata<'_>,
    event: &Event<'_>,
) -> Result<(), serde_json::Error> {
    let mut serializer = serde_json::Serializer::new(line);
    let mut map = serializer.serialize_map(None)?;
    map.serialize_entry("timestamp", timestamp)?;
    map.serialize_entry("level", &meta.level().as_serde())?;
    let mut visitor = SerdeMapVisitor::new(map);
    event.record(&mut visitor);
    let mut map = visitor.take_serializer()?;
    map.serialize_entry("target", meta.target())?;
    map.end()
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
        .with_ansi(false)
        .fmt_fields(JsonFields::new())
        .event_format(JsonLines)
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
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A log sink the tests read back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Events of every kind of field, in a span, and a `log` record.
    fn emit() {
        let span = tracing::info_span!("call", request_id = "r-1");
        let _entered = span.enter();
        let error = std::io::Error::other("boom \"quoted\"");
        tracing::info!(
            request_id = "a\"b\\c\n\t\u{1}\u{1F600}",
            negative = -3_i64,
            count = 7_u64,
            duration_ms = 201.796_515,
            not_a_number = f64::NAN,
            ok = true,
            shown = %"dis\"play",
            debugged = ?vec!["x", "y"],
            absent = Option::<&str>::None,
            present = Some("here"),
            "invocation {}", 1
        );
        tracing::warn!(target: "custom::target", error = &error as &dyn std::error::Error, "failed");
        tracing::error!(message = "an explicit message", "attempt" = 2);
        tracing::debug!("no fields");
        tracing_log::format_trace(
            &log::Record::builder()
                .args(format_args!("from log: {}", "quoted \""))
                .level(log::Level::Warn)
                .target("dep::module")
                .module_path(Some("dep::module"))
                .file(Some("dep/module.rs"))
                .line(Some(42))
                .build(),
        )
        .unwrap();
    }

    /// The lines `emit` writes under `subscriber`, each without its timestamp (`"level"` on).
    fn lines(subscriber: impl Subscriber + Send + Sync + 'static, sink: &Sink) -> Vec<String> {
        tracing::subscriber::with_default(subscriber, emit);
        let written = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        written
            .lines()
            .map(|line| {
                assert!(line.starts_with("{\"timestamp\":\""), "{line}");
                let level = line.find(",\"level\"").unwrap();
                line[level..].to_owned()
            })
            .collect()
    }

    #[test]
    fn json_lines_are_tracing_subscribers_json_lines() {
        let (theirs, ours) = (Sink::default(), Sink::default());
        // Every level, each line into its sink.
        let to = |sink: &Sink| {
            let sink = sink.clone();
            tracing_subscriber::fmt().with_max_level(tracing::Level::TRACE).with_writer(move || sink.clone())
        };
        let reference =
            to(&theirs).json().flatten_event(true).with_current_span(false).with_span_list(false).finish();
        let subscriber =
            to(&ours).with_ansi(false).fmt_fields(JsonFields::new()).event_format(JsonLines).finish();
        let expected = lines(reference, &theirs);
        assert_eq!(expected.len(), 5, "{expected:#?}");
        assert!(expected[4].contains("\"target\":\"dep::module\""), "{}", expected[4]);
        assert_eq!(lines(subscriber, &ours), expected);
    }

    #[test]
    fn auto_is_pretty_on_a_terminal_and_json_elsewhere() {
        assert_eq!(resolve_format("auto", true), "pretty");
        assert_eq!(resolve_format("auto", false), "json");
        assert_eq!(resolve_format("json", true), "json");
        assert_eq!(resolve_format("pretty", false), "pretty");
    }
}
