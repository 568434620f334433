//! Terminal policy: the raw [`TerminalSettings`] as they come from config and
//! environment, and the validated, compiled [`TerminalPolicy`] that `run` uses.
//!
//! This module reads no environment variables; the daemon fills the settings.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::identity::Identity;
use super::redact::Redactor;

/// Default for [`TerminalSettings::timeout_seconds`].
pub const DEFAULT_TIMEOUT_SECONDS: f64 = 5.0;
/// Default for [`TerminalSettings::output_cap_bytes`].
pub const DEFAULT_OUTPUT_CAP_BYTES: usize = 8192;
/// Default for [`TerminalSettings::function_output_max_chars`].
pub const DEFAULT_FUNCTION_OUTPUT_MAX_CHARS: usize = 1000;
/// Default for [`TerminalSettings::max_concurrent`].
pub const DEFAULT_MAX_CONCURRENT: usize = 4;

/// Raw settings as they come from the config file and environment.
///
/// The daemon fills this; the terminal engine never reads env vars itself.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TerminalSettings {
    /// Program basenames that may run; empty means nothing is allowed.
    pub allowed_commands: Vec<String>,
    /// Program basenames that never run; checked before the allow list.
    pub deny_commands: Vec<String>,
    /// Wall-clock limit for one command, in seconds (default 5.0).
    pub timeout_seconds: f64,
    /// Bytes of combined stdout/stderr kept (default 8192); the rest is discarded.
    pub output_cap_bytes: usize,
    /// Characters of output text in the model-facing summary (default 1000).
    pub function_output_max_chars: usize,
    /// Literal substrings replaced by `[REDACTED]` in the output.
    pub redact_substrings: Vec<String>,
    /// Regular expressions whose matches are replaced by `[REDACTED]`.
    pub redact_patterns: Vec<String>,
    /// Sandbox root: working directories must resolve inside it.
    pub sandbox_cwd: Option<PathBuf>,
    /// `RLIMIT_NPROC` for the command, if set.
    pub max_processes: Option<u64>,
    /// `RLIMIT_CPU` (seconds of CPU time) for the command, if set.
    pub cpu_seconds: Option<u64>,
    /// `RLIMIT_FSIZE` (largest file the command may write) in bytes, if set.
    pub file_size_bytes: Option<u64>,
    /// Commands that may run at once (default 4); the tool wrapper enforces it.
    pub max_concurrent: usize,
    /// The user commands run as: a user name or a numeric uid. Unset, a root daemon runs them as
    /// `nobody`. The daemon resolves it once at start (see `resolve_run_as`) and hands the result
    /// to [`TerminalPolicy::with_identity`].
    pub run_as: Option<String>,
}

impl Default for TerminalSettings {
    fn default() -> Self {
        TerminalSettings {
            allowed_commands: Vec::new(),
            deny_commands: Vec::new(),
            timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
            output_cap_bytes: DEFAULT_OUTPUT_CAP_BYTES,
            function_output_max_chars: DEFAULT_FUNCTION_OUTPUT_MAX_CHARS,
            redact_substrings: Vec::new(),
            redact_patterns: Vec::new(),
            sandbox_cwd: None,
            max_processes: None,
            cpu_seconds: None,
            file_size_bytes: None,
            max_concurrent: DEFAULT_MAX_CONCURRENT,
            run_as: None,
        }
    }
}

/// Validated, compiled terminal policy, built once by [`TerminalPolicy::new`].
#[derive(Debug, Clone)]
pub struct TerminalPolicy {
    /// Effective settings, after the corrections reported as warnings.
    settings: TerminalSettings,
    /// `settings.timeout_seconds` as a duration.
    timeout: Duration,
    /// Configured and built-in redaction rules, compiled.
    redactor: Redactor,
    /// The user and group commands run as; `None` runs them as the host process.
    identity: Option<Identity>,
}

impl TerminalPolicy {
    /// Compiles settings; invalid redact patterns are skipped and returned as
    /// warnings (one string each).
    ///
    /// Other unusable values are corrected and also reported as warnings: a
    /// timeout that is not a positive finite number of seconds falls back to
    /// 5.0, `max_concurrent` of 0 becomes 1, and empty redact substrings or
    /// patterns (which would match everywhere) are skipped.
    pub fn new(settings: &TerminalSettings) -> (TerminalPolicy, Vec<String>) {
        let mut warnings = Vec::new();
        let mut settings = settings.clone();
        let timeout = match Duration::try_from_secs_f64(settings.timeout_seconds) {
            Ok(timeout) if !timeout.is_zero() => timeout,
            _ => {
                warnings.push(format!(
                    "terminal timeout_seconds {} is not a positive number of seconds; using {}",
                    settings.timeout_seconds, DEFAULT_TIMEOUT_SECONDS
                ));
                settings.timeout_seconds = DEFAULT_TIMEOUT_SECONDS;
                Duration::from_secs_f64(DEFAULT_TIMEOUT_SECONDS)
            }
        };
        if settings.max_concurrent == 0 {
            warnings.push("terminal max_concurrent is 0; using 1".to_owned());
            settings.max_concurrent = 1;
        }
        let redactor = Redactor::new(&settings.redact_substrings, &settings.redact_patterns, &mut warnings);
        let policy = TerminalPolicy { settings, timeout, redactor, identity: None };
        (policy, warnings)
    }

    /// The policy with commands run as `identity` (`None`: as the host process). The host
    /// resolves [`TerminalSettings::run_as`] once, with `resolve_run_as`, and passes the result.
    #[must_use]
    pub fn with_identity(mut self, identity: Option<Identity>) -> TerminalPolicy {
        self.identity = identity;
        self
    }

    /// The policy with the host process's own secrets (such as the Redis password) added to the
    /// redaction rules; they are hidden in every output before any other rule runs.
    #[must_use]
    pub fn with_secrets(mut self, secrets: &[String]) -> TerminalPolicy {
        self.redactor.add_secrets(secrets);
        self
    }

    /// The user and group commands run as; `None` runs them as the host process.
    pub fn identity(&self) -> Option<Identity> {
        self.identity
    }

    /// The effective settings (after the corrections reported by [`TerminalPolicy::new`]).
    pub fn settings(&self) -> &TerminalSettings {
        &self.settings
    }

    /// Wall-clock limit for one command.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The rlimits every command of this policy runs under.
    pub(crate) fn limits(&self) -> super::exec::Limits {
        super::exec::Limits {
            max_processes: self.settings.max_processes,
            cpu_seconds: self.settings.cpu_seconds,
            file_size_bytes: self.settings.file_size_bytes,
        }
    }

    /// Compiled redaction rules.
    pub(crate) fn redactor(&self) -> &Redactor {
        &self.redactor
    }
}

#[cfg(test)]
// A failed unwrap is a test failure with a clear message; that is what tests want.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_contract() {
        let settings = TerminalSettings::default();
        assert!(settings.allowed_commands.is_empty());
        assert_eq!(settings.timeout_seconds, 5.0);
        assert_eq!(settings.output_cap_bytes, 8192);
        assert_eq!(settings.function_output_max_chars, 1000);
        assert_eq!(settings.max_concurrent, 4);
        let from_empty_json: TerminalSettings = serde_json::from_str("{}").unwrap();
        assert_eq!(from_empty_json, settings);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let res = serde_json::from_str::<TerminalSettings>(r#"{"allowed": ["ls"]}"#);
        assert!(res.is_err());
    }

    #[test]
    fn bad_numbers_are_corrected_with_warnings() {
        for timeout_seconds in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let settings =
                TerminalSettings { timeout_seconds, max_concurrent: 0, ..TerminalSettings::default() };
            let (policy, warnings) = TerminalPolicy::new(&settings);
            assert_eq!(warnings.len(), 2, "{warnings:?}");
            assert_eq!(policy.settings().timeout_seconds, 5.0);
            assert_eq!(policy.timeout(), Duration::from_secs(5));
            assert_eq!(policy.settings().max_concurrent, 1);
        }
    }

    #[test]
    fn valid_settings_give_no_warnings() {
        let settings = TerminalSettings {
            timeout_seconds: 0.25,
            redact_patterns: vec!["abc[0-9]+".to_owned()],
            ..TerminalSettings::default()
        };
        let (policy, warnings) = TerminalPolicy::new(&settings);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(policy.timeout(), Duration::from_millis(250));
    }
}
