//! One stream entry as read from the bus: its stream id, its message id and its raw payload, or
//! what made one of its fields unreadable.

use base64::Engine as _;
use serde_json::{Value, json};

/// Name of the field that carries the writer-chosen message id.
pub const FIELD_ID: &str = "id";
/// Name of the field that carries the JSON payload.
pub const FIELD_PAYLOAD: &str = "payload";
/// Name of the field that carries a signed entry's signature (`v1=<key id>:<hex HMAC>`).
pub const FIELD_SIG: &str = "sig";
/// Most raw bytes of an unreadable field kept for a dead letter: its first 64 KiB.
pub const DEFECT_HEAD_BYTES: usize = 64 * 1024;

/// An entry read from a topic.
///
/// The payload is kept raw: deciding whether it is a JSON object is the reader's job, and a reader
/// that dead-letters bad input needs the original bytes. A field that could not be read as sent
/// (not UTF-8, or longer than the reader's limit) is described by [`Entry::defect`]; such an entry
/// must be dead-lettered, never answered from what was left of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The Redis stream entry id (`1700000000000-0`).
    pub entry_id: String,
    /// The `id` field, falling back to the entry id when the writer left it out (or it is
    /// unreadable).
    pub id: String,
    /// The `payload` field as sent; `None` when the entry has no such field or it is unreadable.
    pub payload: Option<String>,
    /// The `sig` field as sent: absent, one, or given more than once (which no signer writes,
    /// so such an entry is refused, never verified against one of its copies).
    pub sig: Sig,
    /// How many times this entry has been delivered to a consumer group (1 on first read).
    pub deliveries: u64,
    /// The first field of the entry that could not be read, if any.
    pub defect: Option<EntryDefect>,
}

/// The `sig` field of an entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Sig {
    /// The entry has no `sig` field: it is unsigned.
    #[default]
    Absent,
    /// One `sig` field, as sent.
    One(String),
    /// More than one `sig` field.
    Duplicated,
}

/// Why a field of an entry could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefectKind {
    /// The value is not UTF-8 text.
    NotUtf8,
    /// The value is longer than the reader's limit; only its head was read.
    TooLarge,
}

impl DefectKind {
    /// The name written in dead letters: `not_utf8`, `too_large`.
    pub fn as_str(self) -> &'static str {
        match self {
            DefectKind::NotUtf8 => "not_utf8",
            DefectKind::TooLarge => "too_large",
        }
    }
}

/// A field of an entry that could not be read, with enough of it kept to find and judge it: its
/// first [`DEFECT_HEAD_BYTES`] bytes as sent, its full size and the SHA-1 of the whole value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryDefect {
    /// The field's name (`payload`, `id`).
    pub field: String,
    /// What is wrong with it.
    pub kind: DefectKind,
    /// The full length of the value in bytes.
    pub size: u64,
    /// Hex SHA-1 of the whole value (Redis's `redis.sha1hex` for values cut on the server).
    pub sha1: String,
    /// The first [`DEFECT_HEAD_BYTES`] bytes of the value, raw.
    pub head: Vec<u8>,
}

impl EntryDefect {
    /// The defect of a whole value: its head is cut here and its digest computed here.
    pub fn of_value(field: &str, kind: DefectKind, value: &[u8]) -> EntryDefect {
        EntryDefect {
            field: field.to_owned(),
            kind,
            size: value.len() as u64,
            sha1: sha1_smol::Sha1::from(value).digest().to_string(),
            head: value[..value.len().min(DEFECT_HEAD_BYTES)].to_vec(),
        }
    }

    /// The defect of a value cut elsewhere (by the server), of which only `head` arrived.
    pub fn of_head(field: &str, mut head: Vec<u8>, size: u64, sha1: String) -> EntryDefect {
        head.truncate(DEFECT_HEAD_BYTES);
        EntryDefect { field: field.to_owned(), kind: DefectKind::TooLarge, size, sha1, head }
    }

    /// The whole value as text, when the head is all of it and it is UTF-8 (a value over a
    /// limit below [`DEFECT_HEAD_BYTES`]), so a dead letter can keep it replayable.
    pub fn whole_text(&self) -> Option<&str> {
        if self.head.len() as u64 != self.size {
            return None;
        }
        std::str::from_utf8(&self.head).ok()
    }

    /// A sentence for logs and the dead letter's `error`.
    pub fn describe(&self, limit: usize) -> String {
        match self.kind {
            DefectKind::NotUtf8 => format!("field '{}' is not UTF-8 ({} bytes)", self.field, self.size),
            DefectKind::TooLarge => {
                format!("{} of {} bytes exceeds the limit of {limit} bytes", self.field, self.size)
            }
        }
    }

    /// The defect as dead letters carry it: `{"field", "problem", "size", "sha1", "head_base64",
    /// "head_bytes", "truncated"}`.
    pub fn to_json(&self) -> Value {
        json!({
            "field": self.field,
            "problem": self.kind.as_str(),
            "size": self.size,
            "sha1": self.sha1,
            "head_base64": base64::engine::general_purpose::STANDARD.encode(&self.head),
            "head_bytes": self.head.len(),
            "truncated": (self.head.len() as u64) < self.size,
        })
    }
}

impl Entry {
    /// Builds an entry from its stream id and raw field pairs, applying the id fallback.
    pub fn from_fields<S: AsRef<str>>(
        entry_id: &str,
        fields: impl IntoIterator<Item = (S, String)>,
    ) -> Entry {
        let mut id = None;
        let mut payload = None;
        let mut sig = Sig::Absent;
        for (name, value) in fields {
            match name.as_ref() {
                FIELD_ID => id = Some(value),
                FIELD_PAYLOAD => payload = Some(value),
                FIELD_SIG => {
                    sig = match sig {
                        Sig::Absent => Sig::One(value),
                        Sig::One(_) | Sig::Duplicated => Sig::Duplicated,
                    }
                }
                _ => {}
            }
        }
        Entry {
            entry_id: entry_id.to_owned(),
            id: id.unwrap_or_else(|| entry_id.to_owned()),
            payload,
            sig,
            deliveries: 1,
            defect: None,
        }
    }

    /// Builds an entry from raw field values, each read on its own: a value that is not UTF-8,
    /// or longer than `limit` bytes, becomes the entry's defect instead of a field. `cut` names
    /// the values the server already cut to their head, with their full size and SHA-1.
    pub fn from_raw_fields(
        entry_id: &str,
        fields: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
        limit: usize,
        mut cut: impl FnMut(&[u8]) -> Option<(u64, String)>,
    ) -> Entry {
        let mut defect = None;
        let mut named = Vec::with_capacity(3);
        for (name, value) in fields {
            // Only the three known names matter, and all are ASCII.
            let name = String::from_utf8_lossy(&name).into_owned();
            if name != FIELD_ID && name != FIELD_PAYLOAD && name != FIELD_SIG {
                continue;
            }
            let problem = if let Some((size, sha1)) = cut(name.as_bytes()) {
                Some(EntryDefect::of_head(&name, value, size, sha1))
            } else if value.len() > limit {
                Some(EntryDefect::of_value(&name, DefectKind::TooLarge, &value))
            } else {
                match String::from_utf8(value) {
                    Ok(text) => {
                        named.push((name, text));
                        None
                    }
                    Err(err) => Some(EntryDefect::of_value(&name, DefectKind::NotUtf8, err.as_bytes())),
                }
            };
            if defect.is_none() {
                defect = problem;
            }
        }
        let mut entry = Entry::from_fields(entry_id, named);
        entry.defect = defect;
        entry
    }

    /// What keeps the payload from being read within `limit` bytes: the entry's defect, or a
    /// payload that arrived whole but is longer than `limit` (described here, head and digest
    /// included, so a dead letter never copies it whole).
    pub fn unreadable(&self, limit: usize) -> Option<EntryDefect> {
        if let Some(defect) = &self.defect {
            return Some(defect.clone());
        }
        let payload = self.payload.as_deref().filter(|payload| payload.len() > limit)?;
        Some(EntryDefect::of_value(FIELD_PAYLOAD, DefectKind::TooLarge, payload.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_falls_back_to_entry_id() {
        let entry = Entry::from_fields("1-0", [("payload", "{}".to_owned())]);
        assert_eq!(entry.id, "1-0");
        assert_eq!(entry.payload.as_deref(), Some("{}"));
        let entry = Entry::from_fields("1-0", [("id", "abc".to_owned()), ("other", "x".to_owned())]);
        assert_eq!(entry.id, "abc");
        assert_eq!(entry.payload, None);
    }

    fn raw(pairs: &[(&str, &[u8])]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs.iter().map(|(name, value)| (name.as_bytes().to_vec(), value.to_vec())).collect()
    }

    #[test]
    fn the_sig_field_is_kept_and_a_second_one_marks_it_duplicated() {
        let entry = Entry::from_fields("1-0", [("payload", "{}".to_owned())]);
        assert_eq!(entry.sig, Sig::Absent);
        let fields = raw(&[("id", b"m-1"), ("sig", b"v1=k:00"), ("payload", b"{}")]);
        let entry = Entry::from_raw_fields("1-0", fields, 1024, |_| None);
        assert_eq!(entry.sig, Sig::One("v1=k:00".to_owned()));
        let fields = raw(&[("sig", b"v1=k:00"), ("payload", b"{}"), ("sig", b"v1=k:00")]);
        assert_eq!(Entry::from_raw_fields("1-0", fields, 1024, |_| None).sig, Sig::Duplicated);
        // A sig over the reader's limit is the entry's defect, like any other field.
        let long = vec![b'a'; 2048];
        let entry = Entry::from_raw_fields("1-0", raw(&[("sig", &long), ("payload", b"{}")]), 1024, |_| None);
        assert_eq!(entry.sig, Sig::Absent);
        assert_eq!(entry.defect.unwrap().field, "sig");
    }

    #[test]
    fn a_field_that_is_not_utf8_becomes_the_defect_with_its_raw_bytes() {
        let fields = raw(&[("id", b"m-1"), ("payload", b"{\"x\":\"\xff\xfe\"}")]);
        let entry = Entry::from_raw_fields("1-0", fields, 1024, |_| None);
        assert_eq!(entry.id, "m-1");
        assert_eq!(entry.payload, None);
        let defect = entry.defect.unwrap();
        assert_eq!((defect.field.as_str(), defect.kind, defect.size), ("payload", DefectKind::NotUtf8, 10));
        assert_eq!(defect.head, b"{\"x\":\"\xff\xfe\"}");
        assert_eq!(defect.whole_text(), None);
        let letter = defect.to_json();
        assert_eq!(letter["head_base64"], "eyJ4Ijoi//4ifQ==");
        assert_eq!(letter["truncated"], false);
        assert_eq!(letter["sha1"].as_str().unwrap().len(), 40);
    }

    #[test]
    fn values_over_the_limit_keep_their_head_size_and_digest() {
        let big = vec![b'a'; DEFECT_HEAD_BYTES * 2];
        let entry = Entry::from_raw_fields("1-0", raw(&[("payload", &big)]), 1024, |_| None);
        let defect = entry.defect.unwrap();
        assert_eq!(
            (defect.kind, defect.size, defect.head.len()),
            (DefectKind::TooLarge, big.len() as u64, DEFECT_HEAD_BYTES)
        );
        assert_eq!(defect.sha1, sha1_smol::Sha1::from(&big).digest().to_string());
        assert_eq!(defect.to_json()["truncated"], true);
        // Cut by the server: the head as sent, the size and digest it reported.
        let entry = Entry::from_raw_fields("1-0", raw(&[("payload", b"abc")]), 1024, |name| {
            (name == b"payload").then(|| (9_000_000, "ab".repeat(20)))
        });
        let defect = entry.defect.unwrap();
        assert_eq!((defect.size, defect.head.as_slice()), (9_000_000, b"abc".as_slice()));
        // A whole payload over the limit is described the same way.
        let entry = Entry::from_fields("1-0", [("payload", "x".repeat(2000))]);
        let defect = entry.unreadable(1024).unwrap();
        assert_eq!((defect.kind, defect.size, defect.head.len()), (DefectKind::TooLarge, 2000, 2000));
        assert_eq!(defect.whole_text(), entry.payload.as_deref(), "small enough to keep whole");
        assert!(entry.unreadable(4096).is_none());
    }
}
