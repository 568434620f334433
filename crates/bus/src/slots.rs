//! Redis Cluster slots: which slot a key lives in, and how to name a key so that it lives in a
//! chosen slot.
//!
//! A cluster runs a script only when every key it names hashes to one slot. The ledger's keys
//! must therefore sit next to keys whose names toolhost does not choose (the requests stream, a
//! caller's response topic). A key is put into slot `s` by a hash tag: `{t}` where `t` is a short
//! string whose own slot is `s`. [`tag`] finds one such string for every slot once (by trying
//! short strings in order until every slot has one), so any name at all, with braces or not, can
//! be given a neighbour.
//!
//! Names placed this way are `<prefix>{<tag>}<role><tail>`: the configured key prefix first (so
//! ACL rules over the prefix still cover them), then the tag, then a role word that tells apart
//! keys of one logical record living in different slots, then the logical name. When the prefix
//! is itself a hash tag (`{toolhost}:`), every key toolhost writes already shares one slot, and no
//! tag is added.

use std::sync::OnceLock;

/// How many slots a cluster has.
pub(crate) const SLOTS: u16 = 16384;

/// The slot of `key`, by the cluster's rule: CRC16 (XMODEM) of the hash tag (the text between the
/// first `{` and the first `}` after it, when not empty) or else of the whole key, modulo 16384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// The hash tag of `key`, if it has one.
pub(crate) fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|byte| *byte == b'{')?;
    let close = key[open + 1..].iter().position(|byte| *byte == b'}')?;
    let tag = &key[open + 1..open + 1 + close];
    (!tag.is_empty()).then_some(tag)
}

/// Whether `prefix` is usable on a cluster: without braces, or a hash tag itself (`{name}`
/// followed by text without braces), which puts every key in the tag's slot.
pub(crate) fn prefix_is_valid(prefix: &str) -> bool {
    if !prefix.contains(['{', '}']) {
        return true;
    }
    prefix_is_tag(prefix)
}

/// Whether `prefix` starts with a non-empty hash tag and holds no other brace.
pub(crate) fn prefix_is_tag(prefix: &str) -> bool {
    let Some(rest) = prefix.strip_prefix('{') else { return false };
    let Some((tag, after)) = rest.split_once('}') else { return false };
    !tag.is_empty() && !tag.contains('{') && !after.contains(['{', '}'])
}

/// Every string over `0`-`9`, `a`-`z`, `A`-`Z`, shortest first, then by the order of those
/// characters (bijective base 62): the order in which tags are tried.
pub(crate) fn candidates() -> impl Iterator<Item = String> {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    (0_usize..).map(|mut n| {
        let mut candidate = Vec::with_capacity(4);
        loop {
            candidate.push(ALPHABET[n % ALPHABET.len()]);
            n /= ALPHABET.len();
            if n == 0 {
                break;
            }
            n -= 1;
        }
        String::from_utf8_lossy(&candidate).into_owned()
    })
}

/// A short string whose slot is `slot` (taken modulo 16384).
pub(crate) fn tag(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags: Vec<Option<String>> = vec![None; usize::from(SLOTS)];
        let mut missing = usize::from(SLOTS);
        let mut candidates = candidates();
        while missing > 0 {
            let Some(candidate) = candidates.next() else { break };
            let at = usize::from(crc16(candidate.as_bytes()) % SLOTS);
            if tags[at].is_none() {
                tags[at] = Some(candidate);
                missing -= 1;
            }
        }
        tags.into_iter().map(Option::unwrap_or_default).collect()
    });
    &tags[usize::from(slot % SLOTS)]
}

/// The answered mark of a request, next to its response topic.
pub(crate) const ROLE_ANSWER: &str = "answer:";
/// The refusal mark of an entry, next to its response topic.
pub(crate) const ROLE_REFUSAL: &str = "refusal:";
/// The mark of an answer's copy, next to the copy's topic.
pub(crate) const ROLE_COPY: &str = "copy:";
/// The mark of an entry's dead letter, next to the dead-letter topic.
pub(crate) const ROLE_LETTER: &str = "letter:";
/// Every role of a mark [`place`] names on a cluster.
pub(crate) const MARK_ROLES: &[&str] = &[ROLE_ANSWER, ROLE_REFUSAL, ROLE_COPY, ROLE_LETTER];

/// `tail` named as a key in slot `slot`, under `prefix`, with `role` in front of `tail` (see the
/// module documentation). A prefix that is a hash tag keeps every key in its own slot, so then
/// no tag is added (and `slot` must be the prefix's: callers pass slots of keys under it).
pub(crate) fn place(prefix: &str, slot: u16, role: &str, tail: &str) -> String {
    if prefix_is_tag(prefix) {
        format!("{prefix}{role}{tail}")
    } else {
        format!("{prefix}{{{}}}{role}{tail}", tag(slot))
    }
}

/// The logical name of a key made by [`place`] (or by [`crate::Keys`] on a cluster): `key`
/// without `prefix` and without the tag [`place`] added.
pub(crate) fn tail<'a>(prefix: &str, key: &'a str) -> &'a str {
    let rest = key.strip_prefix(prefix).unwrap_or(key);
    if prefix_is_tag(prefix) {
        return rest;
    }
    match rest.strip_prefix('{').and_then(|rest| rest.split_once('}')) {
        Some((_, tail)) => tail,
        None => rest,
    }
}

/// CRC16/XMODEM (polynomial 0x1021, initial 0), as Redis Cluster computes it.
pub(crate) fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in bytes {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_rule() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
        assert_eq!(hash_tag(b"a{}b"), None);
        assert_eq!(hash_tag(b"a{b"), None);
    }

    #[test]
    fn every_slot_has_a_short_tag() {
        for at in 0..SLOTS {
            let tag = tag(at);
            assert!(!tag.is_empty() && tag.len() <= 4, "{at}: {tag:?}");
            assert!(!tag.contains(['{', '}']));
            assert_eq!(slot(tag.as_bytes()), at);
        }
    }

    #[test]
    fn placed_names_land_in_their_slot_and_keep_their_prefix() {
        for prefix in ["", "prod:", "{tenant}:"] {
            for topic in ["action-results", "results:{weird", "x}{y}", "{}", "résultats:7", ""] {
                let key = format!("{prefix}{topic}");
                let at = slot(key.as_bytes());
                let placed = place(prefix, at, "answer:", "toolhost:ledger:action-requests:answered:r{1}");
                assert_eq!(slot(placed.as_bytes()), at, "{placed}");
                assert!(placed.starts_with(prefix));
                assert_eq!(tail(prefix, &placed), "answer:toolhost:ledger:action-requests:answered:r{1}");
            }
        }
        assert!(prefix_is_valid("") && prefix_is_valid("prod:") && prefix_is_valid("{prod}:"));
        assert!(!prefix_is_valid("a{b}:") && !prefix_is_valid("{}:") && !prefix_is_valid("{a}{b}"));
        assert!(!prefix_is_valid("{a"));
    }
}
