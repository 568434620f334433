//! `{name}` templates: the argv elements and stdin of `[[commands]]`, the URL path segments and
//! query pairs of `[[http_tools]]`.
//!
//! A template is literal text with placeholders `{name}` (`name` of `[A-Za-z0-9_]`); `{{` and
//! `}}` stand for literal braces. Argument values become text by [`scalar_text`].

use serde_json::Value;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// Literal text.
    Text(String),
    /// A placeholder, by argument name.
    Arg(String),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    /// Parses `text`.
    ///
    /// # Errors
    /// A sentence for the operator: an unclosed or empty `{`, a stray `}`, a bad name.
    pub(crate) fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) if c.is_ascii_alphanumeric() || c == '_' => name.push(c),
                            Some(c) => {
                                return Err(format!(
                                    "'{c}' in a placeholder: names are [A-Za-z0-9_] (write {{{{ for a literal brace)"
                                ));
                            }
                            None => {
                                return Err("a '{' is never closed (write {{ for a literal brace)".to_owned());
                            }
                        }
                    }
                    if name.is_empty() {
                        return Err("'{}' names no argument".to_owned());
                    }
                    if !literal.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut literal)));
                    }
                    pieces.push(Piece::Arg(name));
                }
                '}' => return Err("a '}' closes nothing (write }} for a literal brace)".to_owned()),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        Ok(Template { pieces })
    }

    /// The argument names it uses, in order.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|piece| match piece {
            Piece::Arg(name) => Some(name.as_str()),
            Piece::Text(_) => None,
        })
    }

    /// The name when the template is one placeholder and nothing else.
    pub(crate) fn whole(&self) -> Option<&str> {
        match self.pieces.as_slice() {
            [Piece::Arg(name)] => Some(name),
            _ => None,
        }
    }

    /// Whether it uses no argument.
    pub(crate) fn is_literal(&self) -> bool {
        self.names().next().is_none()
    }

    /// Whether its literal text starts with `prefix` (`false` when it starts with a placeholder).
    pub(crate) fn literal_starts_with(&self, prefix: char) -> bool {
        matches!(self.pieces.first(), Some(Piece::Text(text)) if text.starts_with(prefix))
    }

    /// The text with each placeholder replaced by `fill(name)`; `Ok(None)` when `fill` gives
    /// `None` for any of them (the argument is absent).
    pub(crate) fn render<E>(
        &self,
        mut fill: impl FnMut(&str) -> Result<Option<String>, E>,
    ) -> Result<Option<String>, E> {
        let mut res = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => res.push_str(text),
                Piece::Arg(name) => match fill(name)? {
                    Some(value) => res.push_str(&value),
                    None => return Ok(None),
                },
            }
        }
        Ok(Some(res))
    }
}

/// The text of a scalar argument: a string as is, a number as its JSON text, a boolean as
/// `true` or `false`. `None` for `null`, arrays and objects.
pub(crate) fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

#[cfg(test)]
// A failed unwrap is a test failure with a clear message; that is what tests want.
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn render(template: &str, args: &Value) -> Option<String> {
        Template::parse(template)
            .unwrap()
            .render(|name| Ok::<_, ()>(args.get(name).and_then(scalar_text)))
            .unwrap()
    }

    #[test]
    fn placeholders_escapes_and_absent_arguments() {
        let args = json!({"file": "a b.txt", "n": 3, "on": true});
        assert_eq!(render("{file}", &args).as_deref(), Some("a b.txt"));
        assert_eq!(render("--lines={n}", &args).as_deref(), Some("--lines=3"));
        assert_eq!(render("{{{on}}}", &args).as_deref(), Some("{true}"));
        assert_eq!(render("plain", &args).as_deref(), Some("plain"));
        assert_eq!(render("--x={missing}", &args), None);
        let template = Template::parse("a{b}c{d_1}").unwrap();
        assert_eq!(template.names().collect::<Vec<_>>(), ["b", "d_1"]);
        assert_eq!(template.whole(), None);
        assert_eq!(Template::parse("{file}").unwrap().whole(), Some("file"));
        assert!(Template::parse("-{x}").unwrap().literal_starts_with('-'));
        assert!(!Template::parse("{x}-").unwrap().literal_starts_with('-'));
    }

    #[test]
    fn malformed_templates_are_refused() {
        for bad in ["{", "{}", "a}b", "{a-b}", "{a", "{ a }"] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }
}
