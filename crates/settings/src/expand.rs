//! `${VAR}` references in a setting, expanded from the environment.

/// Why a template does not expand. The messages name the variable, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExpandError {
    /// A `${` without its `}`.
    #[error("a '${{' is never closed")]
    Unclosed,
    /// `${...}` holds something that is not a variable name.
    #[error("'${{{0}}}' is not a variable name")]
    NotAName(String),
    /// The variable is not set.
    #[error("the environment variable {0} is not set")]
    Unset(String),
}

/// A template with its references expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expanded {
    /// The text.
    pub text: String,
    /// What the references expanded to, in order: secrets, as a rule.
    pub values: Vec<String>,
}

/// Expands each `${NAME}` in `template` with `lookup(NAME)`; a `$` not followed by `{` is kept.
///
/// # Errors
/// The first reference that is not closed, not a variable name, or not set.
pub fn expand_vars<'a>(
    template: &str,
    lookup: impl Fn(&str) -> Option<&'a str>,
) -> Result<Expanded, ExpandError> {
    let mut text = String::with_capacity(template.len());
    let mut values = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        text.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { return Err(ExpandError::Unclosed) };
        let name = &after[..end];
        if !is_variable_name(name) {
            return Err(ExpandError::NotAName(name.to_owned()));
        }
        let value = lookup(name).ok_or_else(|| ExpandError::Unset(name.to_owned()))?;
        text.push_str(value);
        values.push(value.to_owned());
        rest = &after[end + 1..];
    }
    text.push_str(rest);
    Ok(Expanded { text, values })
}

/// Whether `name` is a variable name: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_variable_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|first| first.is_ascii_alphabetic() || first == b'_')
        && bytes.all(|byte| byte.is_ascii_alphanumeric() || byte == b'_')
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn vars() -> HashMap<String, String> {
        HashMap::from([("TOKEN".to_owned(), "s3cret".to_owned()), ("EMPTY".to_owned(), String::new())])
    }

    fn expand(template: &str) -> Result<Expanded, ExpandError> {
        let vars = vars();
        expand_vars(template, |name| vars.get(name).map(String::as_str))
    }

    #[test]
    fn references_expand_and_plain_dollars_stay() {
        let expanded = expand("Bearer $x ${TOKEN}!").unwrap();
        assert_eq!(expanded.text, "Bearer $x s3cret!");
        assert_eq!(expanded.values, ["s3cret"]);
        assert_eq!(expand("$5 ${EMPTY}x${TOKEN}").unwrap().text, "$5 xs3cret");
    }

    #[test]
    fn bad_references_name_the_variable_and_never_a_value() {
        assert_eq!(expand("${TOKEN").unwrap_err().to_string(), "a '${' is never closed");
        assert_eq!(expand("${1A}").unwrap_err().to_string(), "'${1A}' is not a variable name");
        assert_eq!(
            expand("${MISSING}").unwrap_err().to_string(),
            "the environment variable MISSING is not set"
        );
    }
}
