//! From an MCP server's tool name to a toolhost tool name (`^[a-zA-Z0-9_-]{1,64}$`).
//!
//! Every character outside `[A-Za-z0-9_-]` becomes `_`, the source's prefix goes in front, and a
//! name still longer than 64 characters keeps its first 55 characters, then `_` and the first 8
//! hex digits of the SHA-256 of the prefixed original name, so that two long names that share a
//! beginning still differ.

use sha2::{Digest, Sha256};

/// Longest tool name toolhost accepts.
pub const MAX_NAME_LEN: usize = 64;
/// Hex digits of the hash suffix of a shortened name.
const HASH_DIGITS: usize = 8;

/// Whether every character of `text` is one of `[A-Za-z0-9_-]` (the empty text is).
pub fn valid_name_part(text: &str) -> bool {
    text.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
}

/// The toolhost name of the MCP tool `original` of a source with `prefix` (itself made only of
/// allowed characters).
pub fn tool_name(prefix: &str, original: &str) -> String {
    let mapped: String = original
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
        .collect();
    let mapped = if mapped.is_empty() { "_".to_owned() } else { mapped };
    let full = format!("{prefix}{mapped}");
    if full.len() <= MAX_NAME_LEN {
        return full;
    }
    let digest = Sha256::digest(format!("{prefix}{original}").as_bytes());
    let hash: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    // `full` is ASCII, so any byte index is a character boundary.
    format!("{}_{}", &full[..MAX_NAME_LEN - HASH_DIGITS - 1], &hash[..HASH_DIGITS])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_characters_become_underscores_after_the_prefix() {
        assert_eq!(tool_name("everything__", "get-sum"), "everything__get-sum");
        assert_eq!(tool_name("", "files.read/all"), "files_read_all");
        assert_eq!(tool_name("p_", "héllo wörld"), "p_h_llo_w_rld");
        assert_eq!(tool_name("p_", ""), "p__");
    }

    #[test]
    fn long_names_are_shortened_to_64_with_a_hash_suffix_that_tells_them_apart() {
        let a = tool_name("server__", &format!("{}_a", "x".repeat(70)));
        let b = tool_name("server__", &format!("{}_b", "x".repeat(70)));
        assert_eq!(a.len(), MAX_NAME_LEN);
        assert_eq!(b.len(), MAX_NAME_LEN);
        assert_ne!(a, b);
        assert!(a.starts_with("server__xxx"), "{a}");
        assert!(valid_name_part(&a));
        // A name of exactly 64 is kept as it is.
        let exact = tool_name("", &"y".repeat(64));
        assert_eq!(exact, "y".repeat(64));
    }
}
