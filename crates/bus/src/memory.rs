//! [`Bus`] in memory, for unit tests of the logic above the transport.
//!
//! It keeps the Redis Streams semantics the daemon relies on (groups, pending entries, delivery
//! counts, idle times, claims) and the call ledger, but not trimming or persistence.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;
use toolhost_envelope::Entry;

use crate::bus::{CallKeys, CallStart, Committed, EntryRef, Finish, GroupInfo, Reclaimed, is_entry_id};
use crate::{Bus, Error};

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
    pending: BTreeMap<(u64, u64), Pending>,
    /// When each consumer last read or claimed.
    consumers: HashMap<String, Instant>,
}

struct Pending {
    consumer: String,
    delivered_at: Instant,
    deliveries: u64,
}

enum Value {
    Text(String),
    Hash(BTreeMap<String, String>),
}

impl MemoryBus {
    /// An empty bus.
    pub fn new() -> MemoryBus {
        MemoryBus::default()
    }

    /// How many entries of `group` on `topic` are pending.
    pub fn pending_count(&self, topic: &str, group: &str) -> usize {
        self.lock()
            .streams
            .get(topic)
            .and_then(|stream| stream.groups.get(group))
            .map_or(0, |g| g.pending.len())
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

    fn text(&mut self, key: &str) -> Option<&str> {
        match self.value(key) {
            Some(Value::Text(text)) => Some(text),
            _ => None,
        }
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

fn no_group(topic: &str, group: &str) -> Error {
    Error::NoGroup(crate::Cause::server("NOGROUP", format!("no group {group} on {topic}")))
}

#[async_trait]
impl Bus for MemoryBus {
    async fn publish(&self, topic: &str, id: &str, payload: &str) -> Result<String, Error> {
        Ok(self.publish_raw(topic, Some(id), Some(payload)))
    }

    async fn ensure_group_at(&self, topic: &str, group: &str, start: &str) -> Result<(), Error> {
        let mut state = self.lock();
        let stream = state.streams.entry(topic.to_owned()).or_default();
        let start = match start {
            "$" => stream.entries.keys().next_back().copied().unwrap_or((0, 0)),
            start => parse_entry_id(start)?,
        };
        stream
            .groups
            .entry(group.to_owned())
            .or_insert_with(|| Group { last_delivered: start, ..Group::default() });
        Ok(())
    }

    async fn read_group(
        &self,
        topic: &str,
        group: &str,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Entry>, Error> {
        let deadline = tokio::time::Instant::now() + block;
        loop {
            let notified = self.published.notified();
            {
                let mut state = self.lock();
                let stream = state.streams.get_mut(topic).ok_or_else(|| no_group(topic, group))?;
                let keys: Vec<(u64, u64)> = {
                    let group_state = stream.groups.get_mut(group).ok_or_else(|| no_group(topic, group))?;
                    group_state.consumers.insert(consumer.to_owned(), Instant::now());
                    stream
                        .entries
                        .range((
                            std::ops::Bound::Excluded(group_state.last_delivered),
                            std::ops::Bound::Unbounded,
                        ))
                        .take(count)
                        .map(|(key, _)| *key)
                        .collect()
                };
                if !keys.is_empty() {
                    let group_state = stream.groups.get_mut(group).ok_or_else(|| no_group(topic, group))?;
                    for key in &keys {
                        group_state.last_delivered = *key;
                        group_state.pending.insert(
                            *key,
                            Pending {
                                consumer: consumer.to_owned(),
                                delivered_at: Instant::now(),
                                deliveries: 1,
                            },
                        );
                    }
                    return Ok(keys.into_iter().filter_map(|key| state.entry(topic, key, 1)).collect());
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }

    async fn ack(&self, topic: &str, group: &str, entry_ids: &[String]) -> Result<(), Error> {
        let mut state = self.lock();
        if let Some(group) = state.streams.get_mut(topic).and_then(|stream| stream.groups.get_mut(group)) {
            for entry_id in entry_ids {
                group.pending.remove(&parse_entry_id(entry_id)?);
            }
        }
        Ok(())
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

    async fn last_entry_id(&self, topic: &str) -> Result<String, Error> {
        let state = self.lock();
        let last = state.streams.get(topic).and_then(|stream| stream.entries.keys().next_back().copied());
        Ok(last.map_or_else(|| "0-0".to_owned(), |key| format!("{}-{}", key.0, key.1)))
    }

    async fn reclaim(
        &self,
        topic: &str,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        start: &str,
        count: usize,
    ) -> Result<Reclaimed, Error> {
        let start = parse_entry_id(start)?;
        let mut state = self.lock();
        let stream = state.streams.get_mut(topic).ok_or_else(|| no_group(topic, group))?;
        let existing: Vec<(u64, u64)> = stream.entries.keys().copied().collect();
        let group_state = stream.groups.get_mut(group).ok_or_else(|| no_group(topic, group))?;
        let now = Instant::now();
        group_state.consumers.insert(consumer.to_owned(), now);
        let mut claimed = Vec::new();
        let mut deleted = Vec::new();
        let mut next_start = (0, 0);
        for (key, pending) in group_state.pending.range_mut(start..) {
            if claimed.len() == count {
                next_start = *key;
                break;
            }
            if now.duration_since(pending.delivered_at) < min_idle {
                continue;
            }
            if existing.binary_search(key).is_err() {
                // Like Redis 7: an entry deleted from the stream leaves the group.
                deleted.push(*key);
                continue;
            }
            pending.consumer = consumer.to_owned();
            pending.delivered_at = now;
            pending.deliveries += 1;
            claimed.push((*key, pending.deliveries));
        }
        for key in &deleted {
            group_state.pending.remove(key);
        }
        let entries =
            claimed.into_iter().filter_map(|(key, deliveries)| state.entry(topic, key, deliveries)).collect();
        let deleted = deleted.into_iter().map(|key| format!("{}-{}", key.0, key.1)).collect();
        Ok(Reclaimed { next_start: format!("{}-{}", next_start.0, next_start.1), entries, deleted })
    }

    async fn delete_consumer(&self, topic: &str, group: &str, consumer: &str) -> Result<bool, Error> {
        let mut state = self.lock();
        let Some(group) = state.streams.get_mut(topic).and_then(|stream| stream.groups.get_mut(group)) else {
            return Ok(true);
        };
        if group.pending.values().any(|pending| pending.consumer == consumer) {
            return Ok(false);
        }
        group.consumers.remove(consumer);
        Ok(true)
    }

    async fn prune_consumers(
        &self,
        topic: &str,
        group: &str,
        keep: &str,
        min_idle: Duration,
        heartbeat_prefix: &str,
    ) -> Result<Vec<String>, Error> {
        let mut state = self.lock();
        let alive: Vec<String> = state
            .values
            .keys()
            .filter_map(|key| key.strip_prefix(heartbeat_prefix).map(str::to_owned))
            .collect();
        let alive: Vec<String> = alive
            .into_iter()
            .filter(|name| state.value(&format!("{heartbeat_prefix}{name}")).is_some())
            .collect();
        let stream = state.streams.get_mut(topic).ok_or_else(|| no_group(topic, group))?;
        let group_state = stream.groups.get_mut(group).ok_or_else(|| no_group(topic, group))?;
        let now = Instant::now();
        let mut deleted: Vec<String> = group_state
            .consumers
            .iter()
            .filter(|(name, seen)| {
                name.as_str() != keep
                    && !alive.contains(name)
                    && now.duration_since(**seen) >= min_idle
                    && group_state.pending.values().all(|pending| &pending.consumer != *name)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in &deleted {
            group_state.consumers.remove(name);
        }
        deleted.sort();
        Ok(deleted)
    }

    async fn begin_call(&self, call: &CallKeys<'_>, owner: &str, entry_id: &str) -> Result<CallStart, Error> {
        let mut state = self.lock();
        if state.value(call.answered).is_some() {
            return Ok(CallStart::Answered);
        }
        let now = Instant::now();
        let mut start = CallStart::Fresh;
        let lease_until = millis_since_boot(now) + call.lease.as_millis();
        if let Some(record) = state.hash(call.call) {
            if record.get("owner").map(String::as_str) == Some(owner) {
                // A retry after a lost reply: the state the first attempt got.
                record.insert("lease_until".to_owned(), lease_until.to_string());
                let fresh = record.get("state").map(String::as_str) == Some("1");
                return Ok(if fresh { CallStart::Fresh } else { CallStart::StartedBefore });
            }
            let held_until = record.get("lease_until").and_then(|at| at.parse::<u128>().ok()).unwrap_or(0);
            // As in Redis: a lease with less than a third left counts as lapsed.
            if held_until.saturating_sub(call.lease.as_millis() / 3) > millis_since_boot(now) {
                return Ok(CallStart::Busy { entry_id: record.get("entry").cloned().unwrap_or_default() });
            }
            start = CallStart::StartedBefore;
        }
        let code = if start == CallStart::Fresh { "1" } else { "2" };
        let record = BTreeMap::from([
            ("owner".to_owned(), owner.to_owned()),
            ("lease_until".to_owned(), lease_until.to_string()),
            ("entry".to_owned(), entry_id.to_owned()),
            ("state".to_owned(), code.to_owned()),
        ]);
        state.values.insert(call.call.to_owned(), (Value::Hash(record), Some(now + call.retention)));
        Ok(start)
    }

    async fn renew_call(
        &self,
        call: &CallKeys<'_>,
        owner: &str,
        entry: &EntryRef<'_>,
        consumer: &str,
    ) -> Result<bool, Error> {
        let mut state = self.lock();
        let now = Instant::now();
        let Some(record) = state.hash(call.call) else { return Ok(false) };
        if record.get("owner").map(String::as_str) != Some(owner) {
            return Ok(false);
        }
        record
            .insert("lease_until".to_owned(), (millis_since_boot(now) + call.lease.as_millis()).to_string());
        let key = parse_entry_id(entry.entry_id)?;
        if let Some(group) =
            state.streams.get_mut(entry.topic).and_then(|stream| stream.groups.get_mut(entry.group))
        {
            group.consumers.insert(consumer.to_owned(), now);
            if let Some(pending) = group.pending.get_mut(&key) {
                pending.consumer = consumer.to_owned();
                pending.delivered_at = now;
            }
        }
        Ok(true)
    }

    async fn finish(&self, finish: &Finish<'_>) -> Result<Committed, Error> {
        // The same steps, in the same order, as `scripts/finish.lua`.
        let published = {
            let mut state = self.lock();
            let entry = finish.entry;
            let key = parse_entry_id(entry.entry_id)?;
            let group = state.streams.get(entry.topic).and_then(|stream| stream.groups.get(entry.group));
            let group_missing = group.is_none();
            let still_pending = group.is_some_and(|group| group.pending.contains_key(&key));
            let mark = finish.call.and_then(|call| state.text(call.answered).map(str::to_owned));
            let answered = mark.is_some();
            let mut published = false;
            if let Some(answer) = finish.answer {
                if !answered && (finish.final_answer || still_pending || group_missing) {
                    state.append(answer.topic, Some(answer.id.to_owned()), Some(answer.payload.to_owned()));
                    if let Some(copy) = finish.answer_copy {
                        state.append(copy, Some(answer.id.to_owned()), Some(answer.payload.to_owned()));
                    }
                    if let Some(call) = finish.call.filter(|_| finish.final_answer) {
                        let expires = Instant::now() + call.retention;
                        state.values.insert(
                            call.answered.to_owned(),
                            (Value::Text(answer.id.to_owned()), Some(expires)),
                        );
                    }
                    published = true;
                } else {
                    published = mark.as_deref() == Some(answer.id);
                }
            }
            if let Some(letter) = finish.dead_letter
                && (still_pending || (group_missing && !answered))
            {
                state.append(letter.topic, Some(letter.id.to_owned()), Some(letter.payload.to_owned()));
            }
            if let Some(call) = finish.call {
                state.values.remove(call.call);
            }
            if let Some(group) =
                state.streams.get_mut(entry.topic).and_then(|stream| stream.groups.get_mut(entry.group))
            {
                group.pending.remove(&key);
            }
            published
        };
        self.published.notify_waiters();
        Ok(if published { Committed::Published } else { Committed::NotPublished })
    }

    async fn ping(&self) -> Result<(), Error> {
        Ok(())
    }

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
                pending: group.pending.len() as u64,
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

/// A monotonic millisecond clock for lease deadlines.
fn millis_since_boot(now: Instant) -> u128 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    now.duration_since(*START.get_or_init(Instant::now)).as_millis()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Published;

    const TOPIC: &str = "action-requests";
    const GROUP: &str = "toolhost";

    fn keys<'a>(answered: &'a str, call: &'a str) -> CallKeys<'a> {
        CallKeys { answered, call, lease: Duration::from_millis(50), retention: Duration::from_secs(60) }
    }

    #[tokio::test]
    async fn group_read_ack_and_reclaim() {
        let bus = MemoryBus::new();
        bus.ensure_group(TOPIC, GROUP).await.unwrap();
        bus.publish(TOPIC, "m1", "{}").await.unwrap();
        bus.publish(TOPIC, "m2", "{}").await.unwrap();
        let read = bus.read_group(TOPIC, GROUP, "c1", 10, Duration::ZERO).await.unwrap();
        assert_eq!(read.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["m1", "m2"]);
        assert_eq!(bus.pending_count(TOPIC, GROUP), 2);
        bus.ack(TOPIC, GROUP, &[read[0].entry_id.clone()]).await.unwrap();
        assert_eq!(bus.pending_count(TOPIC, GROUP), 1);
        let early = bus.reclaim(TOPIC, GROUP, "c2", Duration::from_secs(60), "0-0", 10).await.unwrap();
        assert!(early.entries.is_empty());
        let claimed = bus.reclaim(TOPIC, GROUP, "c2", Duration::ZERO, "0-0", 10).await.unwrap();
        assert_eq!(claimed.entries.len(), 1);
        assert_eq!(claimed.entries[0].id, "m2");
        assert_eq!(claimed.entries[0].deliveries, 2);
    }

    #[tokio::test]
    async fn plain_read_accepts_entry_ids_and_message_ids() {
        let bus = MemoryBus::new();
        let first = bus.publish("t", "m1", "a").await.unwrap();
        bus.publish("t", "m2", "b").await.unwrap();
        let after_entry = bus.read("t", &first, 10, None).await.unwrap();
        let after_message = bus.read("t", "m1", 10, None).await.unwrap();
        assert_eq!(after_entry, after_message);
        assert_eq!(after_entry.len(), 1);
        assert!(matches!(bus.read("t", "missing", 10, None).await, Err(Error::CursorNotFound(_))));
    }

    #[tokio::test]
    async fn ledger_answers_once() {
        let bus = MemoryBus::new();
        bus.ensure_group(TOPIC, GROUP).await.unwrap();
        let entry_id = bus.publish(TOPIC, "m1", "{}").await.unwrap();
        bus.read_group(TOPIC, GROUP, "c1", 10, Duration::ZERO).await.unwrap();
        let call = keys("answered:r1", "call:r1");
        assert_eq!(bus.begin_call(&call, "a", &entry_id).await.unwrap(), CallStart::Fresh);
        // The same owner again (its first reply was lost) is still fresh.
        assert_eq!(bus.begin_call(&call, "a", &entry_id).await.unwrap(), CallStart::Fresh);
        assert_eq!(
            bus.begin_call(&call, "b", &entry_id).await.unwrap(),
            CallStart::Busy { entry_id: entry_id.clone() }
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(bus.begin_call(&call, "b", &entry_id).await.unwrap(), CallStart::StartedBefore);
        assert_eq!(bus.begin_call(&call, "b", &entry_id).await.unwrap(), CallStart::StartedBefore);
        let entry = EntryRef { topic: TOPIC, group: GROUP, entry_id: &entry_id };
        assert!(!bus.renew_call(&call, "a", &entry, "c1").await.unwrap());
        assert!(bus.renew_call(&call, "b", &entry, "c1").await.unwrap());
        let answer = Published { topic: "results", id: "a1", payload: "{}" };
        let finish = Finish {
            entry,
            call: Some(call),
            answer: Some(answer),
            answer_copy: Some("copies"),
            dead_letter: None,
            final_answer: true,
        };
        assert_eq!(bus.finish(&finish).await.unwrap(), Committed::Published);
        // The same finish again (its reply was lost): nothing new, still reported as published.
        assert_eq!(bus.finish(&finish).await.unwrap(), Committed::Published);
        // Another answer to the same request is not published.
        let other = Published { topic: "results", id: "a2", payload: "{}" };
        assert_eq!(
            bus.finish(&Finish { answer: Some(other), ..finish }).await.unwrap(),
            Committed::NotPublished
        );
        assert_eq!(bus.payloads("results").len(), 1);
        assert_eq!(bus.payloads("copies").len(), 1);
        assert_eq!(bus.pending_count(TOPIC, GROUP), 0);
        assert_eq!(bus.begin_call(&call, "c", &entry_id).await.unwrap(), CallStart::Answered);
    }

    #[tokio::test]
    async fn a_retried_finish_dead_letters_once() {
        let bus = MemoryBus::new();
        bus.ensure_group(TOPIC, GROUP).await.unwrap();
        let entry_id = bus.publish(TOPIC, "m1", "not json").await.unwrap();
        bus.read_group(TOPIC, GROUP, "c1", 10, Duration::ZERO).await.unwrap();
        let letter = Published { topic: "dlq", id: "d1", payload: "{}" };
        let entry = EntryRef { topic: TOPIC, group: GROUP, entry_id: &entry_id };
        let finish = Finish {
            entry,
            call: None,
            answer: None,
            answer_copy: None,
            dead_letter: Some(letter),
            final_answer: true,
        };
        bus.finish(&finish).await.unwrap();
        bus.finish(&finish).await.unwrap();
        assert_eq!(bus.payloads("dlq").len(), 1);
    }

    #[tokio::test]
    async fn a_lease_near_its_end_counts_as_lapsed() {
        let bus = MemoryBus::new();
        let call = CallKeys { lease: Duration::from_millis(300), ..keys("answered:r1", "call:r1") };
        assert_eq!(bus.begin_call(&call, "a", "1-0").await.unwrap(), CallStart::Fresh);
        assert_eq!(
            bus.begin_call(&call, "b", "1-0").await.unwrap(),
            CallStart::Busy { entry_id: "1-0".into() }
        );
        // Two thirds of the lease passed without a renewal: the holder is taken for dead.
        tokio::time::sleep(Duration::from_millis(220)).await;
        assert_eq!(bus.begin_call(&call, "b", "1-0").await.unwrap(), CallStart::StartedBefore);
    }

    #[tokio::test]
    async fn a_recreated_group_can_start_at_the_beginning() {
        let bus = MemoryBus::new();
        bus.publish(TOPIC, "m1", "{}").await.unwrap();
        bus.ensure_group_at(TOPIC, GROUP, "0").await.unwrap();
        bus.ensure_group(TOPIC, "late").await.unwrap();
        assert_eq!(bus.read_group(TOPIC, GROUP, "c1", 10, Duration::ZERO).await.unwrap().len(), 1);
        assert!(bus.read_group(TOPIC, "late", "c1", 10, Duration::ZERO).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn deleted_entries_leave_the_group_and_idle_consumers_are_pruned() {
        let bus = MemoryBus::new();
        bus.ensure_group(TOPIC, GROUP).await.unwrap();
        let trimmed = bus.publish(TOPIC, "m1", "{}").await.unwrap();
        bus.read_group(TOPIC, GROUP, "dead", 1, Duration::ZERO).await.unwrap();
        bus.publish(TOPIC, "m2", "{}").await.unwrap();
        bus.read_group(TOPIC, GROUP, "idle", 1, Duration::ZERO).await.unwrap();
        bus.delete_entries(TOPIC, std::slice::from_ref(&trimmed)).await.unwrap();
        let reclaimed = bus.reclaim(TOPIC, GROUP, "me", Duration::ZERO, "0-0", 10).await.unwrap();
        assert_eq!(reclaimed.deleted, [trimmed]);
        assert_eq!(reclaimed.entries.len(), 1);
        assert_eq!(bus.pending_count(TOPIC, GROUP), 1);
        // "dead" and "idle" hold nothing now, but "idle" has a heartbeat; "me" holds m2.
        bus.set_expiring("beat:idle", "{}", Duration::from_secs(60)).await.unwrap();
        let pruned = bus.prune_consumers(TOPIC, GROUP, "me", Duration::ZERO, "beat:").await.unwrap();
        assert_eq!(pruned, ["dead"]);
        assert!(
            bus.prune_consumers(TOPIC, GROUP, "other", Duration::ZERO, "beat:").await.unwrap().is_empty()
        );
    }

    #[tokio::test]
    async fn group_info_counts_pending_and_lag_and_entries_can_be_deleted() {
        let bus = MemoryBus::new();
        assert!(bus.group_info(TOPIC).await.unwrap().is_empty());
        bus.ensure_group(TOPIC, GROUP).await.unwrap();
        let first = bus.publish(TOPIC, "m1", "{}").await.unwrap();
        bus.publish(TOPIC, "m2", "{}").await.unwrap();
        bus.publish(TOPIC, "m3", "{}").await.unwrap();
        bus.read_group(TOPIC, GROUP, "c1", 1, Duration::ZERO).await.unwrap();
        let info = bus.group_info(TOPIC).await.unwrap();
        assert_eq!(info, [GroupInfo { name: GROUP.to_owned(), pending: 1, lag: Some(2) }]);
        let deleted = bus.delete_entries(TOPIC, &[first, "9-9".to_owned()]).await.unwrap();
        assert_eq!(deleted, 1);
        assert_eq!(bus.payloads(TOPIC).len(), 2);
    }
}
