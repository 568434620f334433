//! A test double of [`Streams`], [`Directory`] and [`Server`] in memory, for unit tests of callers, chat tools,
//! probes and the dead-letter commands.
//!
//! It keeps plain streams (append, read after a cursor, blocking reads), keys and hashes with
//! expiry, and the lag of groups created with [`MemoryBus::create_group`]. It has no consumer
//! groups to read through and no call ledger: those are tested against a real Redis only, so
//! there is one implementation of their semantics to keep right.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;
use toolhost_envelope::Entry;

use crate::Error;
use crate::bus::{Directory, GroupInfo, Server, Streams, is_entry_id};

/// The in-memory implementation of [`Bus`].
#[derive(Default)]
pub struct MemoryBus {
    state: Mutex<State>,
    /// Wakes blocked readers when anything is published.
    published: Notify,
}

#[derive(Default)]
struct State {
    streams: HashMap<String, Stream>,
    values: HashMap<String, (Value, Option<Instant>)>,
    last_ms: u64,
}

#[derive(Default)]
struct Stream {
    /// Entries by (ms, seq).
    entries: BTreeMap<(u64, u64), (String, Option<String>)>,
    groups: HashMap<String, Group>,
}

#[derive(Default)]
struct Group {
    last_delivered: (u64, u64),
}

enum Value {
    /// A plain value.
    Text(String),
    Hash(BTreeMap<String, String>),
    Set(std::collections::BTreeSet<String>),
}

impl MemoryBus {
    /// An empty bus.
    pub fn new() -> MemoryBus {
        MemoryBus::default()
    }

    /// Creates `group` on `topic` at the topic's end (`$`), as `XGROUP CREATE ... MKSTREAM`.
    pub fn create_group(&self, topic: &str, group: &str) {
        let mut state = self.lock();
        let stream = state.streams.entry(topic.to_owned()).or_default();
        let last_delivered = stream.entries.keys().next_back().copied().unwrap_or((0, 0));
        stream.groups.entry(group.to_owned()).or_insert(Group { last_delivered });
    }

    /// Every payload published to `topic`, oldest first.
    pub fn payloads(&self, topic: &str) -> Vec<String> {
        self.lock()
            .streams
            .get(topic)
            .map(|stream| stream.entries.values().filter_map(|(_, payload)| payload.clone()).collect())
            .unwrap_or_default()
    }

    /// Appends an entry with arbitrary fields, for tests of malformed input.
    pub fn publish_raw(&self, topic: &str, id: Option<&str>, payload: Option<&str>) -> String {
        let entry_id = self.lock().append(topic, id.map(str::to_owned), payload.map(str::to_owned));
        self.published.notify_waiters();
        entry_id
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    fn append(&mut self, topic: &str, id: Option<String>, payload: Option<String>) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        let stream = self.streams.entry(topic.to_owned()).or_default();
        let last = stream.entries.keys().next_back().copied().unwrap_or((0, 0));
        let key = if now > last.0 && now > self.last_ms {
            (now, 0)
        } else {
            (last.0.max(self.last_ms), last.1 + 1)
        };
        self.last_ms = key.0;
        let entry_id = format!("{}-{}", key.0, key.1);
        let id = id.unwrap_or_else(|| entry_id.clone());
        stream.entries.insert(key, (id, payload));
        entry_id
    }

    fn value(&mut self, key: &str) -> Option<&mut Value> {
        let expired = matches!(self.values.get(key), Some((_, Some(at))) if *at <= Instant::now());
        if expired {
            self.values.remove(key);
        }
        self.values.get_mut(key).map(|(value, _)| value)
    }

    fn hash(&mut self, key: &str) -> Option<&mut BTreeMap<String, String>> {
        match self.value(key) {
            Some(Value::Hash(hash)) => Some(hash),
            _ => None,
        }
    }

    fn entry(&self, topic: &str, key: (u64, u64), deliveries: u64) -> Option<Entry> {
        let (id, payload) = self.streams.get(topic)?.entries.get(&key)?;
        let mut fields = vec![("id", id.clone())];
        if let Some(payload) = payload {
            fields.push(("payload", payload.clone()));
        }
        let mut entry = Entry::from_fields(&format!("{}-{}", key.0, key.1), fields);
        entry.deliveries = deliveries;
        Some(entry)
    }
}

fn parse_entry_id(entry_id: &str) -> Result<(u64, u64), Error> {
    let bad = || Error::Protocol(format!("invalid entry id {entry_id}"));
    let mut parts = entry_id.splitn(2, '-');
    let ms = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let seq = parts.next().map_or(Ok(0), str::parse).map_err(|_| bad())?;
    Ok((ms, seq))
}

#[async_trait]
impl Streams for MemoryBus {
    async fn publish(&self, topic: &str, id: &str, payload: &str) -> Result<String, Error> {
        Ok(self.publish_raw(topic, Some(id), Some(payload)))
    }

    /// The double keeps an entry's `id` and `payload` only, and does not trim.
    async fn append(
        &self,
        topic: &str,
        fields: &[(&str, &str)],
        _maxlen: Option<u64>,
    ) -> Result<String, Error> {
        let field =
            |name: &str| fields.iter().rev().find(|(field, _)| *field == name).map(|(_, value)| *value);
        Ok(self.publish_raw(topic, field("id"), field("payload")))
    }

    async fn read(
        &self,
        topic: &str,
        cursor: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<Entry>, Error> {
        let deadline = tokio::time::Instant::now() + block.unwrap_or_default();
        let after = if is_entry_id(cursor) {
            parse_entry_id(cursor)?
        } else {
            let state = self.lock();
            let stream = state.streams.get(topic).ok_or_else(|| Error::CursorNotFound(cursor.to_owned()))?;
            stream
                .entries
                .iter()
                .rev()
                .find(|(_, (id, _))| id == cursor)
                .map(|(key, _)| *key)
                .ok_or_else(|| Error::CursorNotFound(cursor.to_owned()))?
        };
        loop {
            let notified = self.published.notified();
            {
                let state = self.lock();
                let keys: Vec<(u64, u64)> = state.streams.get(topic).map_or_else(Vec::new, |stream| {
                    stream
                        .entries
                        .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
                        .take(count)
                        .map(|(key, _)| *key)
                        .collect()
                });
                if !keys.is_empty() || block.is_none() {
                    return Ok(keys.into_iter().filter_map(|key| state.entry(topic, key, 0)).collect());
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }

    async fn read_back(&self, topic: &str, end: &str, count: usize) -> Result<Vec<Entry>, Error> {
        let end = if end == "+" { (u64::MAX, u64::MAX) } else { parse_entry_id(end)? };
        let state = self.lock();
        let keys: Vec<(u64, u64)> = state.streams.get(topic).map_or_else(Vec::new, |stream| {
            stream.entries.range(..=end).rev().take(count).map(|(key, _)| *key).collect()
        });
        Ok(keys.into_iter().filter_map(|key| state.entry(topic, key, 0)).collect())
    }

    async fn last_entry_id(&self, topic: &str) -> Result<String, Error> {
        let state = self.lock();
        let last = state.streams.get(topic).and_then(|stream| stream.entries.keys().next_back().copied());
        Ok(last.map_or_else(|| "0-0".to_owned(), |key| format!("{}-{}", key.0, key.1)))
    }

    async fn delete_entries(&self, topic: &str, entry_ids: &[String]) -> Result<u64, Error> {
        let mut state = self.lock();
        let Some(stream) = state.streams.get_mut(topic) else { return Ok(0) };
        let mut deleted = 0;
        for entry_id in entry_ids {
            if stream.entries.remove(&parse_entry_id(entry_id)?).is_some() {
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

#[async_trait]
impl Directory for MemoryBus {
    async fn replace_hash(&self, key: &str, fields: &[(String, String)]) -> Result<(), Error> {
        let hash = fields.iter().cloned().collect();
        self.lock().values.insert(key.to_owned(), (Value::Hash(hash), None));
        Ok(())
    }

    async fn hash_fields(&self, key: &str) -> Result<Vec<(String, String)>, Error> {
        let mut state = self.lock();
        Ok(state
            .hash(key)
            .map(|hash| hash.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default())
    }

    async fn values(&self, keys: &[String]) -> Result<Vec<Option<String>>, Error> {
        let mut state = self.lock();
        Ok(keys
            .iter()
            .map(|key| match state.value(key) {
                Some(Value::Text(text)) => Some(text.clone()),
                _ => None,
            })
            .collect())
    }

    async fn set_expiring(&self, key: &str, value: &str, ttl: Duration) -> Result<(), Error> {
        self.lock()
            .values
            .insert(key.to_owned(), (Value::Text(value.to_owned()), Some(Instant::now() + ttl)));
        Ok(())
    }

    async fn delete(&self, keys: &[String]) -> Result<(), Error> {
        let mut state = self.lock();
        for key in keys {
            state.values.remove(key);
            state.streams.remove(key);
        }
        Ok(())
    }

    async fn add_member(&self, key: &str, member: &str) -> Result<bool, Error> {
        let mut state = self.lock();
        if !matches!(state.value(key), Some(Value::Set(_))) {
            state.values.insert(key.to_owned(), (Value::Set(std::collections::BTreeSet::new()), None));
        }
        match state.value(key) {
            Some(Value::Set(set)) => Ok(set.insert(member.to_owned())),
            _ => Ok(false),
        }
    }

    async fn members(&self, key: &str) -> Result<Vec<String>, Error> {
        match self.lock().value(key) {
            Some(Value::Set(set)) => Ok(set.iter().cloned().collect()),
            _ => Ok(Vec::new()),
        }
    }

    async fn remove_members(&self, key: &str, members: &[String]) -> Result<(), Error> {
        let mut state = self.lock();
        if let Some(Value::Set(set)) = state.value(key) {
            for member in members {
                set.remove(member);
            }
            if set.is_empty() {
                state.values.remove(key);
            }
        }
        Ok(())
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool, Error> {
        // Only plain values expire in the double; its streams live until it is dropped.
        let mut state = self.lock();
        match state.values.get_mut(key) {
            Some((_, expiry)) => {
                *expiry = Some(Instant::now() + ttl);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

#[async_trait]
impl Server for MemoryBus {
    async fn ping(&self) -> Result<(), Error> {
        Ok(())
    }

    async fn keys_matching(&self, pattern: &str) -> Result<Vec<String>, Error> {
        // Only the trailing-`*` globs the daemon uses are supported.
        let prefix = pattern.trim_end_matches('*');
        let mut state = self.lock();
        let names: Vec<String> = state.values.keys().filter(|key| key.starts_with(prefix)).cloned().collect();
        let mut keys: Vec<String> = names.into_iter().filter(|key| state.value(key).is_some()).collect();
        keys.sort();
        Ok(keys)
    }

    async fn group_info(&self, topic: &str) -> Result<Vec<GroupInfo>, Error> {
        let state = self.lock();
        let Some(stream) = state.streams.get(topic) else { return Ok(Vec::new()) };
        let mut groups: Vec<GroupInfo> = stream
            .groups
            .iter()
            .map(|(name, group)| GroupInfo {
                name: name.clone(),
                pending: 0,
                lag: Some(
                    stream
                        .entries
                        .range((std::ops::Bound::Excluded(group.last_delivered), std::ops::Bound::Unbounded))
                        .count() as u64,
                ),
            })
            .collect();
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn plain_reads_accept_entry_ids_and_message_ids_and_wait_for_new_entries() {
        let bus = MemoryBus::new();
        let first = bus.publish("t", "m1", "{}").await.unwrap();
        bus.publish("t", "m2", "{\"n\":2}").await.unwrap();
        let by_entry = bus.read("t", &first, 10, None).await.unwrap();
        let by_message = bus.read("t", "m1", 10, None).await.unwrap();
        assert_eq!(by_entry, by_message);
        assert_eq!(by_entry.iter().map(|entry| entry.id.as_str()).collect::<Vec<_>>(), ["m2"]);
        assert!(matches!(bus.read("t", "nope", 10, None).await, Err(Error::CursorNotFound(_))));
        let last = bus.last_entry_id("t").await.unwrap();
        let waiting = bus.read("t", &last, 10, Some(Duration::from_secs(5)));
        let (read, _) = tokio::join!(waiting, async { bus.publish("t", "m3", "{}").await.unwrap() });
        assert_eq!(read.unwrap()[0].id, "m3");
    }

    #[tokio::test]
    async fn groups_report_their_lag_and_values_expire() {
        let bus = MemoryBus::new();
        bus.publish("t", "m1", "{}").await.unwrap();
        bus.create_group("t", "g");
        bus.publish("t", "m2", "{}").await.unwrap();
        let groups = bus.group_info("t").await.unwrap();
        assert_eq!(groups, [GroupInfo { name: "g".to_owned(), pending: 0, lag: Some(1) }]);
        bus.set_expiring("k:1", "v", Duration::from_millis(1)).await.unwrap();
        bus.set_expiring("k:2", "v", Duration::from_secs(60)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(bus.keys_matching("k:*").await.unwrap(), ["k:2"]);
    }
}
