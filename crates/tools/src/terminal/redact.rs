//! Output redaction: configured substrings, configured regex patterns, then
//! built-in rules for common secrets, each match replaced by `[REDACTED]`.
//!
//! Redaction is best effort and errs towards hiding too much: a false positive
//! costs the model a few characters, a false negative leaks a secret.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

/// The text every redacted secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// Built-in rules, in the order they are applied: a pattern and its replacement.
///
/// Assignment rules keep the key and separator (groups 1 and 2) and hide the value.
static BUILT_INS: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    const KEY_CHARS: &str = r"[A-Za-z0-9_.\-]*";
    let rules = [
        // API keys in the `sk-...` style (OpenAI, Anthropic and imitators).
        (r"\bsk-[A-Za-z0-9_\-]{16,}".to_owned(), REDACTED),
        // `Authorization: <scheme> <credentials>`: the whole rest of the line is secret.
        (r#"(?i)(\b(?:proxy-)?authorization"?)(\s*[:=]\s*)[^\r\n]+"#.to_owned(), "${1}${2}[REDACTED]"),
        // `api_key=`, `apikey:`, `token=`, `password=`, `secret=` and names
        // containing them (`ACCESS_TOKEN=`, `"db_password": "..."`).
        (
            format!(
                r#"(?i)({KEY_CHARS}(?:api[_\-]?key|token|passw(?:or)?d|secret){KEY_CHARS}"?)(\s*[:=]\s*)(?:"[^"\r\n]*"|'[^'\r\n]*'|[^\s"',;&]+)"#
            ),
            "${1}${2}[REDACTED]",
        ),
        // Bearer tokens anywhere, keeping the word `Bearer`.
        (r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=\-]+".to_owned(), "${1}[REDACTED]"),
        // JWTs: three base64url segments, the header starting `eyJ` (`{"`).
        (r"\beyJ[A-Za-z0-9_\-]*\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*".to_owned(), REDACTED),
    ];
    rules
        .into_iter()
        // The built-in patterns are constants covered by tests, so they compile.
        .map(|(pattern, replacement)| (Regex::new(&pattern).expect("built-in pattern"), replacement))
        .collect()
});

/// Compiled redaction rules: configured substrings and patterns plus the built-ins.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Configured literal substrings, non-empty.
    substrings: Vec<String>,
    /// Configured patterns that compiled and cannot match the empty string.
    patterns: Vec<Regex>,
}

impl Redactor {
    /// Compiles the configured rules, pushing one warning per rule skipped.
    pub fn new(substrings: &[String], patterns: &[String], warnings: &mut Vec<String>) -> Self {
        let mut res = Redactor::default();
        for substring in substrings {
            if substring.is_empty() {
                warnings.push("empty terminal redact substring ignored".to_owned());
            } else {
                res.substrings.push(substring.clone());
            }
        }
        for pattern in patterns {
            match Regex::new(pattern) {
                // A pattern matching "" would put [REDACTED] between every character.
                Ok(regex) if regex.is_match("") => warnings.push(format!(
                    "terminal redact pattern {pattern:?} ignored: it matches the empty string"
                )),
                Ok(regex) => res.patterns.push(regex),
                Err(err) => warnings.push(format!("terminal redact pattern {pattern:?} ignored: {err}")),
            }
        }
        res
    }

    /// Returns `text` with every configured and built-in secret replaced.
    pub fn redact(&self, text: &str) -> String {
        let mut res = text.to_owned();
        for substring in &self.substrings {
            if res.contains(substring.as_str()) {
                res = res.replace(substring.as_str(), REDACTED);
            }
        }
        for regex in &self.patterns {
            if let Cow::Owned(replaced) = regex.replace_all(&res, REDACTED) {
                res = replaced;
            }
        }
        for (regex, replacement) in BUILT_INS.iter() {
            if let Cow::Owned(replaced) = regex.replace_all(&res, *replacement) {
                res = replaced;
            }
        }
        res
    }
}

#[cfg(test)]
// A failed unwrap is a test failure with a clear message; that is what tests want.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn check(input: &str, expected: &str) {
        let redactor = Redactor::default();
        assert_eq!(redactor.redact(input), expected, "input: {input:?}");
    }

    #[test]
    fn sk_keys() {
        check("key is sk-proj-abcdefghij0123456789 ok", "key is [REDACTED] ok");
        check("sk-short stays", "sk-short stays");
        check("task-abcdefghijklmnopqrstuvwxyz", "task-abcdefghijklmnopqrstuvwxyz");
    }

    #[test]
    fn assignments_keep_the_key() {
        check("api_key=abc123 next", "api_key=[REDACTED] next");
        check("APIKEY: abc123", "APIKEY: [REDACTED]");
        check("api-key=abc123", "api-key=[REDACTED]");
        check("token=abc&x=1", "token=[REDACTED]&x=1");
        check("GITHUB_TOKEN=ghp_xyz", "GITHUB_TOKEN=[REDACTED]");
        check("Password = hunter2", "Password = [REDACTED]");
        check("client_secret='s e c'", "client_secret=[REDACTED]");
        check(
            r#"{"db_password": "hunter2", "user": "bob"}"#,
            r#"{"db_password": [REDACTED], "user": "bob"}"#,
        );
        check("no secrets here", "no secrets here");
    }

    #[test]
    fn authorization_hides_the_rest_of_the_line() {
        check("Authorization: Basic dXNlcjpwYXNz\nnext line", "Authorization: [REDACTED]\nnext line");
        check("authorization: Bearer abc.def", "authorization: [REDACTED]");
    }

    #[test]
    fn bearer_tokens() {
        check("curl -H 'X: Bearer abcDEF123._-~+/=' done", "curl -H 'X: Bearer [REDACTED]' done");
        check("bearer  xyz", "bearer  [REDACTED]");
    }

    #[test]
    fn jwts() {
        check("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig_-nature end", "jwt [REDACTED] end");
        check("eyJhbGciOiJub25lIn0.eyJzdWIiOiIxIn0.", "[REDACTED]");
    }

    #[test]
    fn configured_substrings_and_patterns() {
        let mut warnings = Vec::new();
        let redactor = Redactor::new(
            &["hunter2".to_owned(), String::new()],
            &["acct-[0-9]{4}".to_owned(), "(".to_owned(), "x*".to_owned()],
            &mut warnings,
        );
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[1].contains("\"(\""), "{warnings:?}");
        assert_eq!(redactor.redact("pw hunter2 acct-1234 acct-12"), "pw [REDACTED] [REDACTED] acct-12");
    }
}
