//! The model-facing summary of a run or a refusal.
//!
//! Only the text part (output or error reason) is cut to
//! `function_output_max_chars` characters; the status line is always complete,
//! so a model can rely on reading `ok=`, `exit=`, `timeout=` and `truncated=`.

/// Builds `ok=<bool> exit=<code|None> timeout=<bool> truncated=<bool>\n<label>:\n<text>`,
/// with `text` cut to `max_chars` characters.
pub fn summary(
    ok: bool,
    exit_code: Option<i32>,
    timeout: bool,
    truncated: bool,
    label: &str,
    text: &str,
    max_chars: usize,
) -> String {
    let exit = match exit_code {
        Some(code) => code.to_string(),
        None => "None".to_owned(),
    };
    format!(
        "ok={ok} exit={exit} timeout={timeout} truncated={truncated}\n{label}:\n{}",
        cut_chars(text, max_chars)
    )
}

/// The first `max_chars` characters of `text`, cut on a char boundary.
pub fn cut_chars(text: &str, max_chars: usize) -> &str {
    match text.char_indices().nth(max_chars) {
        Some((byte_idx, _)) => &text[..byte_idx],
        None => text,
    }
}

#[cfg(test)]
// A failed unwrap is a test failure with a clear message; that is what tests want.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn exact_format() {
        assert_eq!(
            summary(true, Some(0), false, false, "output", "hi\n", 1000),
            "ok=true exit=0 timeout=false truncated=false\noutput:\nhi\n"
        );
        assert_eq!(
            summary(false, None, true, true, "output", "", 1000),
            "ok=false exit=None timeout=true truncated=true\noutput:\n"
        );
        assert_eq!(
            summary(false, Some(-1), false, false, "error", "why", 1000),
            "ok=false exit=-1 timeout=false truncated=false\nerror:\nwhy"
        );
    }

    #[test]
    fn cut_counts_chars_not_bytes() {
        assert_eq!(cut_chars("héllo wörld", 7), "héllo w");
        assert_eq!(cut_chars("日本語テキスト", 3), "日本語");
        assert_eq!(cut_chars("🦀🦀", 1), "🦀");
        assert_eq!(cut_chars("abc", 3), "abc");
        assert_eq!(cut_chars("abc", 0), "");
        assert_eq!(
            summary(true, Some(0), false, false, "output", "ééé", 2),
            "ok=true exit=0 timeout=false truncated=false\noutput:\néé"
        );
    }
}
