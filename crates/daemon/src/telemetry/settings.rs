//! `[telemetry]`: where toolhost sends its spans and metrics (OTLP), how it samples, and whether
//! arguments and results become span attributes.
//!
//! The standard OpenTelemetry variables (`OTEL_EXPORTER_OTLP_*`, `OTEL_SERVICE_NAME`,
//! `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`, `OTEL_SDK_DISABLED`, `OTEL_BSP_*`) are read
//! by the configuration module with the rest of the environment and handed to [`Section::resolve`],
//! where they override the section, as `REDIS_URL` overrides `[redis] url`. The exporter is then
//! built from [`Settings`] alone and reads no variable itself.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolhost_settings::KeyError;

/// `[telemetry]` as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct Section {
    /// Off: no span is recorded or exported (trace context is still read and passed on).
    pub enabled: bool,
    /// The OTLP collector's base URL (`http://collector:4318` for HTTP, `http://collector:4317`
    /// for gRPC); empty: nothing is exported.
    pub otlp_endpoint: String,
    /// The full URL of traces, when it is not `<otlp_endpoint>/v1/traces`.
    pub otlp_traces_endpoint: String,
    /// The full URL of metrics, when it is not `<otlp_endpoint>/v1/metrics`.
    pub otlp_metrics_endpoint: String,
    /// `http/protobuf` or `grpc`.
    pub otlp_protocol: String,
    /// Headers of every export request (an API key), values may hold `${VAR}`.
    pub otlp_headers: BTreeMap<String, String>,
    pub export_timeout_ms: u64,
    pub service_name: String,
    /// `parentbased_traceidratio` (default), `traceidratio`, `always_on`, `always_off`,
    /// `parentbased_always_on`, `parentbased_always_off`.
    pub sampler: String,
    /// The ratio of new traces sampled, 0 to 1, for the `*traceidratio` samplers.
    pub sampler_ratio: f64,
    /// Arguments and results as span attributes, redacted like the audit stream.
    pub record_arguments: bool,
    /// Spans waiting for export; a span past it is dropped and counted.
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
    /// How long a span waits, at most, before its batch is exported.
    pub schedule_delay_ms: u64,
    /// How often metrics are exported; 0: no OTLP metrics.
    pub metrics_interval_ms: u64,
}

/// The wire protocol of the exporter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies.
    HttpProtobuf,
    /// OTLP/gRPC (plaintext).
    Grpc,
}

/// How new traces and traces with a parent are sampled: the SDK's sampler and the answer's
/// `sampled` flag follow the same rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// A parent's `sampled` flag decides for its children.
    pub parent_based: bool,
    /// The ratio of traces sampled otherwise, 0 to 1, decided by the trace id as the SDK's
    /// `TraceIdRatioBased` decides.
    pub ratio: f64,
}

impl Sampling {
    /// Nothing recorded: new traces are not sampled; a parent's flag is passed on.
    pub const OFF: Sampling = Sampling { parent_based: true, ratio: 0.0 };

    /// Whether a span of `trace_id` is sampled, its parent's flag being `parent` (`None`: a
    /// root span).
    pub fn sampled(&self, trace_id: &[u8; 16], parent: Option<bool>) -> bool {
        match parent {
            Some(sampled) if self.parent_based => sampled,
            _ => ratio_sampled(self.ratio, trace_id),
        }
    }
}

/// The decision of the SDK's `TraceIdRatioBased` sampler, bit for bit: the low 63 bits of the
/// trace id's last 8 bytes below `ratio * 2^63`.
pub fn ratio_sampled(ratio: f64, trace_id: &[u8; 16]) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    let bound = (ratio.max(0.0) * (1u64 << 63) as f64) as u64;
    let mut low = [0; 8];
    low.copy_from_slice(&trace_id[8..]);
    (u64::from_be_bytes(low) >> 1) < bound
}

/// Where spans and metrics go.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    pub protocol: Protocol,
    /// Full URL of traces (gRPC: the endpoint).
    pub traces_endpoint: String,
    /// Full URL of metrics (gRPC: the endpoint).
    pub metrics_endpoint: String,
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
    pub schedule_delay: Duration,
    /// `None`: no OTLP metrics.
    pub metrics_interval: Option<Duration>,
}

/// `[telemetry]` resolved: what the daemon's telemetry is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `None`: nothing is exported, and no span is made.
    pub export: Option<Export>,
    pub sampling: Sampling,
    pub service_name: String,
    pub record_arguments: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            export: None,
            sampling: Sampling::OFF,
            service_name: "toolhost".to_owned(),
            record_arguments: false,
        }
    }
}

impl Section {
    /// The settings, with the standard variables of `vars` over the section's keys; every bad
    /// value is added to `errors`, named by its key or variable.
    pub fn resolve(&self, vars: &HashMap<String, String>, errors: &mut Vec<KeyError>) -> Settings {
        let mut bad = |key: &str, message: String| errors.push(KeyError { key: key.to_owned(), message });
        let var = |name: &str| vars.get(name).map(String::as_str).filter(|value| !value.trim().is_empty());
        let number = |name: &str, key: &str, fallback: u64, bad: &mut dyn FnMut(&str, String)| match var(name)
        {
            None => fallback,
            Some(text) => text.trim().parse::<u64>().unwrap_or_else(|_| {
                bad(name, format!("must be a whole number (it overrides {key}), not '{text}'"));
                fallback
            }),
        };
        let disabled = match var("OTEL_SDK_DISABLED").map(|text| text.trim().to_ascii_lowercase()) {
            Some(text) if text == "true" => true,
            Some(text) if text == "false" => false,
            Some(text) => {
                bad("OTEL_SDK_DISABLED", format!("must be true or false, not '{text}'"));
                false
            }
            None => false,
        };
        let service_name = var("OTEL_SERVICE_NAME").unwrap_or(&self.service_name).trim().to_owned();
        if service_name.is_empty() {
            bad("telemetry.service_name", "must not be empty".to_owned());
        }
        let protocol_text =
            var("OTEL_EXPORTER_OTLP_PROTOCOL").unwrap_or(&self.otlp_protocol).trim().to_owned();
        let protocol = match protocol_text.as_str() {
            "http/protobuf" => Protocol::HttpProtobuf,
            "grpc" => Protocol::Grpc,
            other => {
                let key = if var("OTEL_EXPORTER_OTLP_PROTOCOL").is_some() {
                    "OTEL_EXPORTER_OTLP_PROTOCOL"
                } else {
                    "telemetry.otlp_protocol"
                };
                bad(
                    key,
                    format!("must be http/protobuf or grpc (http/json is not supported), not '{other}'"),
                );
                Protocol::HttpProtobuf
            }
        };
        let sampler = var("OTEL_TRACES_SAMPLER").unwrap_or(&self.sampler).trim().to_owned();
        let ratio = match var("OTEL_TRACES_SAMPLER_ARG") {
            Some(text) => text.trim().parse::<f64>().unwrap_or(f64::NAN),
            None => self.sampler_ratio,
        };
        let ratio_key = if var("OTEL_TRACES_SAMPLER_ARG").is_some() {
            "OTEL_TRACES_SAMPLER_ARG"
        } else {
            "telemetry.sampler_ratio"
        };
        let ratio = if (0.0..=1.0).contains(&ratio) {
            ratio
        } else {
            bad(ratio_key, "must be a number from 0 to 1".to_owned());
            1.0
        };
        let sampling = match sampler.as_str() {
            "parentbased_traceidratio" => Sampling { parent_based: true, ratio },
            "traceidratio" => Sampling { parent_based: false, ratio },
            "always_on" => Sampling { parent_based: false, ratio: 1.0 },
            "always_off" => Sampling { parent_based: false, ratio: 0.0 },
            "parentbased_always_on" => Sampling { parent_based: true, ratio: 1.0 },
            "parentbased_always_off" => Sampling { parent_based: true, ratio: 0.0 },
            other => {
                let key = if var("OTEL_TRACES_SAMPLER").is_some() {
                    "OTEL_TRACES_SAMPLER"
                } else {
                    "telemetry.sampler"
                };
                bad(
                    key,
                    format!(
                        "must be parentbased_traceidratio, traceidratio, always_on, always_off, \
                         parentbased_always_on or parentbased_always_off, not '{other}'"
                    ),
                );
                Sampling { parent_based: true, ratio }
            }
        };
        let mut headers: Vec<(String, String)> =
            self.otlp_headers.iter().map(|(name, value)| (name.clone(), value.clone())).collect();
        if let Some(text) = var("OTEL_EXPORTER_OTLP_HEADERS") {
            match parse_headers(text) {
                Ok(parsed) => headers = parsed,
                Err(message) => bad("OTEL_EXPORTER_OTLP_HEADERS", message),
            }
        }
        for (name, value) in &mut headers {
            match toolhost_settings::expand_vars(value, |name| vars.get(name).map(String::as_str)) {
                Ok(expanded) => *value = expanded.text,
                Err(message) => bad(&format!("telemetry.otlp_headers.{name}"), message.to_string()),
            }
        }
        let timeout = number(
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "telemetry.export_timeout_ms",
            self.export_timeout_ms,
            &mut bad,
        );
        let max_queue_size = number(
            "OTEL_BSP_MAX_QUEUE_SIZE",
            "telemetry.max_queue_size",
            self.max_queue_size as u64,
            &mut bad,
        );
        let max_export_batch_size = number(
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            "telemetry.max_export_batch_size",
            self.max_export_batch_size as u64,
            &mut bad,
        );
        let schedule_delay = number(
            "OTEL_BSP_SCHEDULE_DELAY",
            "telemetry.schedule_delay_ms",
            self.schedule_delay_ms,
            &mut bad,
        );
        let metrics_interval = number(
            "OTEL_METRIC_EXPORT_INTERVAL",
            "telemetry.metrics_interval_ms",
            self.metrics_interval_ms,
            &mut bad,
        );
        for (key, value) in [
            ("telemetry.export_timeout_ms", timeout),
            ("telemetry.max_queue_size", max_queue_size),
            ("telemetry.max_export_batch_size", max_export_batch_size),
            ("telemetry.schedule_delay_ms", schedule_delay),
        ] {
            if value == 0 {
                bad(key, "must be greater than 0".to_owned());
            }
        }
        let base = var("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or(&self.otlp_endpoint).trim().to_owned();
        let traces =
            var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").unwrap_or(&self.otlp_traces_endpoint).trim().to_owned();
        let metrics = var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
            .unwrap_or(&self.otlp_metrics_endpoint)
            .trim()
            .to_owned();
        for (key, url) in [
            ("telemetry.otlp_endpoint", &base),
            ("telemetry.otlp_traces_endpoint", &traces),
            ("telemetry.otlp_metrics_endpoint", &metrics),
        ] {
            if !url.is_empty() && !url.starts_with("http://") && !url.starts_with("https://") {
                bad(
                    key,
                    format!("must be an http:// or https:// URL, not '{}'", toolhost_settings::mask_url(url)),
                );
            }
        }
        if protocol == Protocol::Grpc
            && [&base, &traces, &metrics].iter().any(|url| url.starts_with("https://"))
        {
            bad(
                "telemetry.otlp_protocol",
                "grpc is plaintext here: use http:// or http/protobuf for https".to_owned(),
            );
        }
        let signal = |specific: &str, path: &str| -> String {
            match (specific.is_empty(), base.is_empty(), protocol) {
                (false, _, _) => specific.to_owned(),
                (true, true, _) => String::new(),
                (true, false, Protocol::Grpc) => base.clone(),
                (true, false, Protocol::HttpProtobuf) => format!("{}/{path}", base.trim_end_matches('/')),
            }
        };
        let traces_endpoint = signal(&traces, "v1/traces");
        let metrics_endpoint = signal(&metrics, "v1/metrics");
        let enabled = self.enabled && !disabled;
        let export = (enabled && !traces_endpoint.is_empty()).then(|| Export {
            protocol,
            traces_endpoint,
            metrics_endpoint,
            headers,
            timeout: Duration::from_millis(timeout),
            max_queue_size: max_queue_size as usize,
            max_export_batch_size: max_export_batch_size as usize,
            schedule_delay: Duration::from_millis(schedule_delay),
            metrics_interval: (metrics_interval > 0).then(|| Duration::from_millis(metrics_interval)),
        });
        Settings {
            // Nothing recorded without an exporter: a new trace is not sampled.
            sampling: if export.is_some() { sampling } else { Sampling::OFF },
            export,
            service_name,
            record_arguments: self.record_arguments,
        }
    }
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `name=value` pairs separated by commas, values percent-decoded.
fn parse_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut headers = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
        let Some((name, value)) = pair.split_once('=') else {
            return Err("must be name=value pairs separated by commas".to_owned());
        };
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| format!("the value of '{}' is not UTF-8 once decoded", name.trim()))?;
        headers.push((name.trim().to_owned(), value.into_owned()));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section() -> Section {
        let defaults: toml::Table = toml::from_str(crate::config::DEFAULT_TOML).unwrap();
        defaults["telemetry"].clone().try_into().unwrap()
    }

    fn resolve(section: &Section, vars: &[(&str, &str)]) -> (Settings, Vec<String>) {
        let vars: HashMap<String, String> =
            vars.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect();
        let mut errors = Vec::new();
        let settings = section.resolve(&vars, &mut errors);
        (settings, errors.into_iter().map(|error| error.key).collect())
    }

    #[test]
    fn by_default_nothing_is_exported_and_new_traces_are_not_sampled() {
        let (settings, errors) = resolve(&section(), &[]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(settings.export, None);
        assert_eq!(settings.sampling, Sampling::OFF);
        assert!(!settings.record_arguments);
    }

    #[test]
    fn the_standard_variables_override_the_section() {
        let (settings, errors) = resolve(
            &section(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                ("OTEL_SERVICE_NAME", "tb-1"),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b,x=1"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000"),
            ],
        );
        assert!(errors.is_empty(), "{errors:?}");
        let export = settings.export.unwrap();
        assert_eq!(export.traces_endpoint, "http://collector:4318/v1/traces");
        assert_eq!(export.metrics_endpoint, "http://collector:4318/v1/metrics");
        assert_eq!(
            export.headers,
            [("api-key".to_owned(), "a b".to_owned()), ("x".to_owned(), "1".to_owned())]
        );
        assert_eq!(export.timeout, Duration::from_secs(2));
        assert_eq!(settings.service_name, "tb-1");
        assert_eq!(settings.sampling, Sampling { parent_based: true, ratio: 0.25 });
        let (settings, _) = resolve(
            &section(),
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
        );
        assert_eq!(settings.export.unwrap().traces_endpoint, "http://c:4317");
        let (settings, _) = resolve(
            &section(),
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_SDK_DISABLED", "true")],
        );
        assert_eq!(settings.export, None);
    }

    #[test]
    fn bad_values_are_named_by_the_key_or_variable_that_set_them() {
        let mut bad = section();
        bad.otlp_endpoint = "collector:4318".to_owned();
        bad.sampler = "sometimes".to_owned();
        bad.max_queue_size = 0;
        let (_, errors) = resolve(
            &bad,
            &[
                ("OTEL_TRACES_SAMPLER_ARG", "2"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
                ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
            ],
        );
        assert_eq!(
            errors,
            [
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                "OTEL_TRACES_SAMPLER_ARG",
                "telemetry.sampler",
                "OTEL_BSP_SCHEDULE_DELAY",
                "telemetry.max_queue_size",
                "telemetry.otlp_endpoint"
            ]
        );
    }

    #[test]
    fn the_ratio_decision_is_the_sdks() {
        use opentelemetry::trace::{SpanKind, TraceId};
        use opentelemetry_sdk::trace::{Sampler, SamplingDecision, ShouldSample};
        for ratio in [0.0, 0.1, 0.5, 0.9, 1.0] {
            let sampler = Sampler::TraceIdRatioBased(ratio);
            for _ in 0..200 {
                let id = toolhost_envelope::new_trace_id();
                let sdk = sampler
                    .should_sample(None, TraceId::from_bytes(id), "x", &SpanKind::Consumer, &[], &[])
                    .decision
                    == SamplingDecision::RecordAndSample;
                assert_eq!(ratio_sampled(ratio, &id), sdk, "{ratio}");
            }
        }
        let parent_based = Sampling { parent_based: true, ratio: 0.0 };
        assert!(parent_based.sampled(&[1; 16], Some(true)));
        assert!(!Sampling { parent_based: false, ratio: 0.0 }.sampled(&[1; 16], Some(true)));
    }
}
