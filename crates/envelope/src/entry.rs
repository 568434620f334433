//! One stream entry as read from the bus: its stream id, its message id and its raw payload.

/// Name of the field that carries the writer-chosen message id.
pub const FIELD_ID: &str = "id";
/// Name of the field that carries the JSON payload.
pub const FIELD_PAYLOAD: &str = "payload";

/// An entry read from a topic.
///
/// The payload is kept raw: deciding whether it is a JSON object is the reader's job, and a reader
/// that dead-letters bad input needs the original bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The Redis stream entry id (`1700000000000-0`).
    pub entry_id: String,
    /// The `id` field, falling back to the entry id when the writer left it out.
    pub id: String,
    /// The `payload` field as sent; `None` when the entry has no such field.
    pub payload: Option<String>,
    /// How many times this entry has been delivered to a consumer group (1 on first read).
    pub deliveries: u64,
}

impl Entry {
    /// Builds an entry from its stream id and raw field pairs, applying the id fallback.
    pub fn from_fields<S: AsRef<str>>(
        entry_id: &str,
        fields: impl IntoIterator<Item = (S, String)>,
    ) -> Entry {
        let mut id = None;
        let mut payload = None;
        for (name, value) in fields {
            match name.as_ref() {
                FIELD_ID => id = Some(value),
                FIELD_PAYLOAD => payload = Some(value),
                _ => {}
            }
        }
        Entry {
            entry_id: entry_id.to_owned(),
            id: id.unwrap_or_else(|| entry_id.to_owned()),
            payload,
            deliveries: 1,
        }
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
}
