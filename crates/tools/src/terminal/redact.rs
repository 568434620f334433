//! Output redaction: the daemon's own secrets, configured substrings, configured
//! regex patterns, then built-in rules for common secrets, each match replaced by
//! `[REDACTED]`.
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
/// Rules that keep a prefix (an assignment's key and separator, the word `Bearer`, a URL's
/// scheme and user) capture it as group 1 (and 2) and hide only the rest.
static BUILT_INS: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    const KEY_CHARS: &str = r"[A-Za-z0-9_.\-]*";
    let rules = [
        // PEM private keys (RSA, EC, OPENSSH, ENCRYPTED, plain PKCS#8): the whole block. A block
        // whose end was cut off by the output cap is hidden up to the end of the text.
        (
            r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)"
                .to_owned(),
            REDACTED,
        ),
        // Credentials in a URL: `scheme://user:password@host` keeps the scheme and user. The
        // password runs to the last `@` before white space, so one with an unescaped `/` is
        // still hidden whole.
        (r"(?i)(\b[a-z][a-z0-9+.\-]*://[^\s:/@]*:)[^\s@]+@".to_owned(), "${1}[REDACTED]@"),
        // AWS access key ids: long-term (AKIA) and temporary (ASIA) ones, and the rarer kinds.
        (r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|ANPA|ANVA|APKA)[A-Z0-9]{16}\b".to_owned(), REDACTED),
        // GitHub tokens: personal (ghp_), OAuth (gho_), user-to-server (ghu_), server-to-server
        // (ghs_), refresh (ghr_) and fine-grained personal tokens (github_pat_).
        (r"\b(?:gh[pousr]_[A-Za-z0-9]{30,255}|github_pat_[A-Za-z0-9_]{22,255})\b".to_owned(), REDACTED),
        // Slack tokens: bot, user, app-level, refresh and workspace ones.
        (r"\bxox[abprs]-[A-Za-z0-9\-]{10,}".to_owned(), REDACTED),
        // API keys in the `sk-...` style (OpenAI, Anthropic and imitators).
        (r"\bsk-[A-Za-z0-9_\-]{16,}".to_owned(), REDACTED),
        // `Authorization: <scheme> <credentials>`: the whole rest of the line is secret.
        (r#"(?i)(\b(?:proxy-)?authorization"?)(\s*[:=]\s*)[^\r\n]+"#.to_owned(), "${1}${2}[REDACTED]"),
        // `api_key=`, `apikey:`, `token=`, `password=`, `secret=` and names
        // containing them (`ACCESS_TOKEN=`, `"db_password": "..."`, `aws_secret_access_key = `).
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

/// Compiled redaction rules: the host's secrets, configured substrings and patterns plus the
/// built-ins.
#[derive(Clone, Default)]
pub struct Redactor {
    /// Secrets of the host process (the Redis password), non-empty, longest first.
    secrets: Vec<String>,
    /// Configured literal substrings, non-empty.
    substrings: Vec<String>,
    /// Configured patterns that compiled and cannot match the empty string.
    patterns: Vec<Regex>,
    /// Whether only the host's secrets are hidden, without the built-in rules.
    secrets_only: bool,
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

    /// Rules that hide only `secrets`, literally: for answers from services the operator chose
    /// (HTTP tools), whose own fields named `token` or `password` are data, not leaks.
    pub fn secrets_only(secrets: &[String]) -> Self {
        let mut res = Redactor { secrets_only: true, ..Redactor::default() };
        res.add_secrets(secrets);
        res
    }

    /// `value` with every string in it redacted. A member whose key names a secret (as in
    /// `"password": "..."`) has its whole value hidden, as the built-in rules hide `password=...`
    /// in text; redacting the JSON text itself could break its syntax.
    pub fn redact_json(&self, value: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::String(text) => Value::String(self.redact(&text)),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|item| self.redact_json(item)).collect())
            }
            Value::Object(members) => Value::Object(
                members
                    .into_iter()
                    .map(|(key, value)| {
                        let value = match value {
                            Value::String(text) if self.hides_value_of(&key, &text) => REDACTED.into(),
                            other => self.redact_json(other),
                        };
                        (self.redact(&key), value)
                    })
                    .collect(),
            ),
            other => other,
        }
    }

    /// Whether the rules hide `text` when it is written as `key=text`, more than they hide it
    /// alone: the key names a secret.
    fn hides_value_of(&self, key: &str, text: &str) -> bool {
        !text.is_empty() && !self.redact(&format!("{key}={text}")).ends_with(&self.redact(text))
    }

    /// Adds literal secrets of the host process, such as the Redis password, hidden before
    /// any other rule runs. Empty strings are skipped.
    pub fn add_secrets(&mut self, secrets: &[String]) {
        for secret in secrets {
            if !secret.is_empty() && !self.secrets.contains(secret) {
                self.secrets.push(secret.clone());
            }
        }
        // A secret that contains another must be replaced first, or only its middle would go.
        self.secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    }

    /// Returns `text` with every host, configured and built-in secret replaced.
    pub fn redact(&self, text: &str) -> String {
        let mut res = text.to_owned();
        for substring in self.secrets.iter().chain(&self.substrings) {
            if res.contains(substring.as_str()) {
                res = res.replace(substring.as_str(), REDACTED);
            }
        }
        if self.secrets_only {
            return res;
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

/// Hides the host's secrets: a derived `Debug` would print them.
impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.secrets.len())
            .field("substrings", &self.substrings.len())
            .field("patterns", &self.patterns.len())
            .finish()
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
    fn aws_access_key_ids() {
        check("id AKIAIOSFODNN7EXAMPLE end", "id [REDACTED] end");
        check("ASIAY34FZKBOKMUTVV7A,", "[REDACTED],");
        // Too short, lower case, or part of a longer word: not a key id.
        check("AKIAIOSFODNN7EXAMP", "AKIAIOSFODNN7EXAMP");
        check("akiaiosfodnn7example", "akiaiosfodnn7example");
        check("XAKIAIOSFODNN7EXAMPLE", "XAKIAIOSFODNN7EXAMPLE");
        check("AKIAIOSFODNN7EXAMPLEX", "AKIAIOSFODNN7EXAMPLEX");
    }

    #[test]
    fn aws_secret_key_assignments() {
        let key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
        check(&format!("aws_secret_access_key = {key}"), "aws_secret_access_key = [REDACTED]");
        check(&format!("AWS_SECRET_ACCESS_KEY={key}"), "AWS_SECRET_ACCESS_KEY=[REDACTED]");
        check(&format!(r#""SecretAccessKey": "{key}","#), r#""SecretAccessKey": [REDACTED],"#);
        // The key alone, without an assignment, cannot be told from other base64 text.
        check("aws_region = eu-west-1", "aws_region = eu-west-1");
    }

    #[test]
    fn github_tokens() {
        let body = "abcdefghijklmnopqrstuvwxyzABCDEF0123";
        for prefix in ["ghp_", "gho_", "ghu_", "ghs_", "ghr_"] {
            check(&format!("tok {prefix}{body} end"), "tok [REDACTED] end");
        }
        check("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "[REDACTED]");
        // Too short, an unknown kind, or a word that only starts like one.
        check("ghp_short", "ghp_short");
        check(&format!("ghx_{body}"), &format!("ghx_{body}"));
        check("github_pat_", "github_pat_");
        check(&format!("xghp_{body}"), &format!("xghp_{body}"));
    }

    #[test]
    fn slack_tokens() {
        for kind in ['a', 'b', 'p', 'r', 's'] {
            check(&format!("slack xox{kind}-1234567890-abcdefABCDEF end"), "slack [REDACTED] end");
        }
        check("xoxz-1234567890-abcdef", "xoxz-1234567890-abcdef");
        check("xoxb-short", "xoxb-short");
        check("noxoxb-1234567890-abcdef", "noxoxb-1234567890-abcdef");
    }

    #[test]
    fn private_key_blocks() {
        for kind in [
            "RSA PRIVATE KEY",
            "PRIVATE KEY",
            "OPENSSH PRIVATE KEY",
            "EC PRIVATE KEY",
            "ENCRYPTED PRIVATE KEY",
        ] {
            let block = format!("-----BEGIN {kind}-----\nMIIEow\nIBAAKC\n-----END {kind}-----");
            check(&format!("before\n{block}\nafter"), "before\n[REDACTED]\nafter");
        }
        // A block cut short by the output cap is hidden to the end of the text.
        check("key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nIBAA", "key:\n[REDACTED]");
        // Public keys and certificates are not secret.
        let public = "-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----";
        check(public, public);
        let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----";
        check(cert, cert);
    }

    #[test]
    fn url_credentials() {
        check("redis://:hunter2@10.0.0.1:6379/0", "redis://:[REDACTED]@10.0.0.1:6379/0");
        check(
            "REDIS_URL=rediss://ops:s3cr3t@redis.example:6380",
            "REDIS_URL=rediss://ops:[REDACTED]@redis.example:6380",
        );
        check("get https://bob:pa/ss@example.com/x ok", "get https://bob:[REDACTED]@example.com/x ok");
        // No password, no credentials, or no URL at all.
        check("https://example.com:8443/path", "https://example.com:8443/path");
        check("ssh git@github.com:org/repo.git", "ssh git@github.com:org/repo.git");
        check("mailto:bob@example.com", "mailto:bob@example.com");
        check("https://example.com/@user", "https://example.com/@user");
    }

    #[test]
    fn json_values_are_redacted_without_breaking_their_syntax() {
        let mut redactor = Redactor::default();
        redactor.add_secrets(&["pw-42".to_owned()]);
        let value = serde_json::json!({
            "password": "hunter2", "name": "bob", "count": 3,
            "notes": ["the pw-42 leaked", "Bearer abc.def"], "nested": {"api_key": "k-1", "empty": ""},
        });
        assert_eq!(
            redactor.redact_json(value),
            serde_json::json!({
                "password": "[REDACTED]", "name": "bob", "count": 3,
                "notes": ["the [REDACTED] leaked", "Bearer [REDACTED]"],
                "nested": {"api_key": "[REDACTED]", "empty": ""},
            })
        );
    }

    #[test]
    fn a_secrets_only_redactor_hides_only_the_secrets() {
        let redactor = Redactor::secrets_only(&["tok-9f".to_owned()]);
        assert_eq!(redactor.redact("token=abc and tok-9f"), "token=abc and [REDACTED]");
        let value = serde_json::json!({"token": "abc", "echo": "Bearer tok-9f"});
        assert_eq!(
            redactor.redact_json(value),
            serde_json::json!({"token": "abc", "echo": "Bearer [REDACTED]"})
        );
    }

    #[test]
    fn host_secrets_are_hidden_first_and_whole() {
        let mut redactor = Redactor::default();
        redactor.add_secrets(&["pw".to_owned(), String::new(), "long-pw-9".to_owned()]);
        assert_eq!(redactor.redact("a long-pw-9 b pw c"), "a [REDACTED] b [REDACTED] c");
        assert_eq!(redactor.redact("nothing here"), "nothing here");
        assert!(!format!("{redactor:?}").contains("long-pw-9"));
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
