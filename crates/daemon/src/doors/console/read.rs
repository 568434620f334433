//! What the console shows, read from Redis: the replicas' heartbeats, the consumer groups of the
//! streams they read, the call logs, the ledger's kept answers and the dead letters.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use toolhost_bus::{Error as BusError, GroupInfo};
use toolhost_envelope::Entry;

use super::Console;
use crate::dead_letters::{DeadLetters, Letter};
use crate::heartbeat::Heartbeat;

/// What the fleet page shows.
#[derive(Debug)]
pub(crate) struct FleetView {
    pub replicas: Vec<Heartbeat>,
    /// Tool name to its versions: description hash and the toolboxes serving it.
    pub conflicts: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// Each stream the live replicas read (bare name; the requests stream always), with its
    /// consumer groups or why they could not be read.
    pub groups: BTreeMap<String, Result<Vec<GroupInfo>, String>>,
    /// Whether Redis answered a `PING`, and in how many microseconds.
    pub redis: Result<u128, String>,
}

impl FleetView {
    /// The view as JSON (`/api/fleet`).
    pub(crate) fn to_json(&self, console: &Console) -> Value {
        let replicas: Vec<Value> = self
            .replicas
            .iter()
            .map(|replica| {
                json!({
                    "toolbox_id": replica.toolbox_id,
                    "consumer": replica.consumer,
                    "version": replica.version,
                    "at": replica.at,
                    "tools": replica.hosted.keys().collect::<Vec<_>>(),
                    "sources": replica.sources.iter().map(|source| json!({
                        "name": source.name,
                        "transport": source.transport,
                        "state": source.state(),
                        "since": source.since,
                        "restarts": source.restarts,
                        "tools": source.tools,
                        "last_error": source.last_error,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "replicas": replicas,
            "conflicts": self.conflicts,
            "groups": self.groups.iter().flat_map(|(stream, groups)| match groups {
                Ok(groups) => groups.iter().map(|group| json!({
                    "stream": stream, "name": group.name, "pending": group.pending, "lag": group.lag,
                })).collect::<Vec<_>>(),
                Err(err) => vec![json!({"stream": stream, "error": err})],
            }).collect::<Vec<_>>(),
            "redis": {
                "topology": console.topology,
                "address": console.redis,
                "up": self.redis.is_ok(),
                "ping_us": self.redis.as_ref().ok(),
                "error": self.redis.as_ref().err(),
            },
        })
    }
}

/// Reads the live replicas, the conflicts among their tools, the groups and Redis's health.
pub(crate) async fn fleet(console: &Console) -> FleetView {
    let bus = &console.bus;
    let started = Instant::now();
    let redis = bus.ping().await.map(|()| started.elapsed().as_micros()).map_err(|err| err.to_string());
    let replicas = replicas(console).await.unwrap_or_default();
    let mut conflicts: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for replica in &replicas {
        for (name, hosted) in &replica.hosted {
            conflicts
                .entry(name.clone())
                .or_default()
                .entry(hosted.hash.clone())
                .or_default()
                .insert(replica.toolbox_id.clone());
        }
    }
    conflicts.retain(|_, versions| versions.len() > 1);
    let mut streams: BTreeSet<String> =
        console.shards.streams().iter().map(|stream| console.keys.topic(stream)).collect();
    streams.extend(replicas.iter().flat_map(|replica| replica.groups.iter().map(|read| read.stream.clone())));
    let mut groups = BTreeMap::new();
    for stream in streams {
        let info = bus.group_info(&stream).await.map_err(|err| err.to_string());
        let bare = stream.strip_prefix(console.keys.prefix()).unwrap_or(&stream).to_owned();
        groups.insert(bare, info);
    }
    FleetView { replicas, conflicts, groups, redis }
}

/// The live replicas, sorted by toolbox and consumer.
async fn replicas(console: &Console) -> Result<Vec<Heartbeat>, BusError> {
    let bus = &console.bus;
    let keys = bus.members(&console.keys.fleet()).await?;
    let values = bus.values(&keys).await?;
    let mut replicas: Vec<Heartbeat> =
        values.into_iter().flatten().filter_map(|text| Heartbeat::parse(&text)).collect();
    replicas.sort_by(|a, b| (&a.toolbox_id, &a.consumer).cmp(&(&b.toolbox_id, &b.consumer)));
    Ok(replicas)
}

/// The recent history of every live replica (`toolhost:history:<toolbox>:<consumer>`, see
/// `telemetry::history`), oldest point first: `{"every_ms", "buckets_ms", "replicas": [{"toolbox_id",
/// "consumer", "points": [...]}]}`. A point that is not JSON is skipped.
pub(crate) async fn history(console: &Console) -> Value {
    use crate::telemetry::history::{BUCKETS_MS, POINT_EVERY, POINTS};
    let mut replicas_history = Vec::new();
    for replica in replicas(console).await.unwrap_or_default() {
        let key = console.keys.history(&replica.toolbox_id, &replica.consumer);
        let entries = console.bus.read_back(&key, "+", POINTS as usize).await.unwrap_or_default();
        let mut points: Vec<Value> = entries
            .iter()
            .filter_map(|entry| entry.payload.as_deref())
            .filter_map(|payload| serde_json::from_str::<Value>(payload).ok())
            .filter(Value::is_object)
            .collect();
        points.reverse();
        replicas_history.push(json!({
            "toolbox_id": replica.toolbox_id,
            "consumer": replica.consumer,
            "points": points,
        }));
    }
    json!({
        "every_ms": POINT_EVERY.as_millis() as u64,
        "buckets_ms": BUCKETS_MS,
        "replicas": replicas_history,
    })
}

/// One entry of a call log, with where it is.
#[derive(Debug, Clone)]
pub(crate) struct LoggedCall {
    /// The toolbox whose log holds it.
    pub toolbox_id: String,
    /// Its id in that log.
    pub log_id: String,
    /// What the log says (see `call_log`).
    pub fields: Value,
}

impl LoggedCall {
    fn from_entry(toolbox_id: &str, entry: &Entry) -> Option<LoggedCall> {
        let fields: Value = serde_json::from_str(entry.payload.as_deref()?).ok()?;
        Some(LoggedCall { toolbox_id: toolbox_id.to_owned(), log_id: entry.entry_id.clone(), fields })
    }

    /// A field as text (`""` when absent).
    pub(crate) fn text(&self, name: &str) -> String {
        match self.fields.get(name) {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        }
    }

    /// The entry as the live view sends it.
    pub(crate) fn to_json(&self) -> Value {
        let mut value = self.fields.clone();
        value["log_id"] = json!(self.log_id);
        value["log_toolbox_id"] = json!(self.toolbox_id);
        value
    }
}

/// The newest `count` calls of every toolbox's log, newest first.
pub(crate) async fn recent_calls(
    console: &Console,
    toolboxes: &BTreeSet<String>,
    count: usize,
) -> Vec<LoggedCall> {
    let mut calls = Vec::new();
    for toolbox in toolboxes {
        let topic = console.keys.calls(toolbox);
        let Ok(entries) = console.bus.read_back(&topic, "+", count).await else { continue };
        calls.extend(entries.iter().filter_map(|entry| LoggedCall::from_entry(toolbox, entry)));
    }
    // Entry ids are milliseconds first: newest first across the logs.
    calls.sort_by_key(|call| std::cmp::Reverse(entry_order(&call.log_id)));
    calls.truncate(count);
    calls
}

/// The calls logged after `cursors` (toolbox to last entry id seen), oldest first; the cursors
/// move past them.
pub(crate) async fn calls_after(
    console: &Console,
    cursors: &mut BTreeMap<String, String>,
) -> Vec<LoggedCall> {
    let mut calls = Vec::new();
    for (toolbox, cursor) in cursors.iter_mut() {
        let topic = console.keys.calls(toolbox);
        let Ok(entries) = console.bus.read(&topic, cursor, 200, None).await else { continue };
        if let Some(last) = entries.last() {
            cursor.clone_from(&last.entry_id);
        }
        calls.extend(entries.iter().filter_map(|entry| LoggedCall::from_entry(toolbox, entry)));
    }
    calls.sort_by_key(|call| entry_order(&call.log_id));
    calls
}

/// The newest entry id of a toolbox's call log (`0-0` when empty).
pub(crate) async fn last_call_id(console: &Console, toolbox: &str) -> String {
    console.bus.last_entry_id(&console.keys.calls(toolbox)).await.unwrap_or_else(|_| "0-0".to_owned())
}

/// One logged call, by toolbox and log id.
pub(crate) async fn call(
    console: &Console,
    toolbox: &str,
    log_id: &str,
) -> Result<Option<LoggedCall>, BusError> {
    let entries = console.bus.read_back(&console.keys.calls(toolbox), log_id, 1).await?;
    Ok(entries
        .iter()
        .filter(|entry| entry.entry_id == log_id)
        .find_map(|entry| LoggedCall::from_entry(toolbox, entry)))
}

/// The request entry of a logged call, if its stream (the home shard of `request_id`) still
/// holds it.
pub(crate) async fn request_entry(
    console: &Console,
    request_id: &str,
    entry_id: &str,
) -> Result<Option<Entry>, BusError> {
    let topic = console.keys.topic(&console.shards.stream(console.shards.of_id(request_id)));
    let entries = console.bus.read_back(&topic, entry_id, 1).await?;
    Ok(entries.into_iter().find(|entry| entry.entry_id == entry_id))
}

/// What the ledger keeps of a request's answer: the answer's message id, the entry it answered,
/// and its `data` when kept (`[dispatch] kept_answer_max_bytes`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeptAnswer {
    pub answer_id: String,
    pub entry_id: Option<String>,
    pub data: Option<Value>,
}

/// The answered mark of a request of the requests stream, if it is there and readable: on one
/// server the mark itself, on a Redis Cluster the request's claim beside the stream, once it
/// says `answered` (its fields `answer`, `entry` and `kept` hold what the mark holds).
pub(crate) async fn kept_answer(console: &Console, request_id: &str) -> Result<Option<KeptAnswer>, BusError> {
    // The ledger of the request id's home shard (the requests stream itself without shards).
    let home = console.shards.stream(console.shards.of_id(request_id));
    let key = console.keys.answered(&home, request_id);
    if console.keys.is_cluster() {
        // A hash (ledger formats 1 and 2) or a string (format 3).
        let claim = toolhost_bus::read_claim(console.bus.as_ref(), &key).await?;
        return Ok(claim.and_then(|claim| claim_answer(&claim)));
    }
    let values = console.bus.values(std::slice::from_ref(&key)).await?;
    // The placeholder of ledger format 2 (refused entries, no answer) is no answer.
    Ok(values
        .into_iter()
        .next()
        .flatten()
        .filter(|mark| toolhost_bus::is_answer_mark(mark))
        .map(|mark| parse_mark(&mark)))
}

/// What a cluster claim says of the answer; `None` until it is `answered`.
fn claim_answer(claim: &toolhost_bus::Claim) -> Option<KeptAnswer> {
    if !claim.is_answered() {
        return None;
    }
    Some(KeptAnswer {
        answer_id: claim.answer.clone().unwrap_or_default(),
        entry_id: claim.entry.clone().filter(|id| !id.is_empty()),
        data: claim.kept.as_deref().and_then(|data| serde_json::from_str(data).ok()),
    })
}

/// Reads an answered mark: `<answer id>`, or `<answer id>\n<entry id>\n<data>`.
fn parse_mark(mark: &str) -> KeptAnswer {
    let mut parts = mark.splitn(3, '\n');
    let answer_id = parts.next().unwrap_or_default().to_owned();
    let entry_id = parts.next().filter(|id| !id.is_empty()).map(str::to_owned);
    let data = parts.next().and_then(|data| serde_json::from_str(data).ok());
    KeptAnswer { answer_id, entry_id, data }
}

/// The dead letters of a toolbox (whose requests default to this daemon's results stream, where
/// a replay looks for the request's answered mark on a Redis Cluster).
pub(crate) fn dead_letters(console: &Console, toolbox: &str) -> DeadLetters {
    let bus = console.bus.clone();
    DeadLetters::of(bus.clone(), bus, console.keys.clone(), toolbox, &console.requests_stream)
        .with_shards(console.shards.clone())
        .with_results(&console.results_stream)
}

/// Up to `count` letters of each toolbox, with the toolbox.
pub(crate) async fn letters(
    console: &Console,
    toolboxes: &BTreeSet<String>,
    count: usize,
) -> Vec<(String, Result<Vec<Letter>, String>)> {
    let mut all = Vec::new();
    for toolbox in toolboxes {
        let letters = dead_letters(console, toolbox).list(Some(count)).await.map_err(|err| err.to_string());
        all.push((toolbox.clone(), letters));
    }
    all
}

/// Every toolbox the console knows of: the live ones and its own.
pub(crate) async fn toolboxes(console: &Arc<Console>) -> BTreeSet<String> {
    let mut toolboxes: BTreeSet<String> =
        replicas(console).await.unwrap_or_default().into_iter().map(|replica| replica.toolbox_id).collect();
    toolboxes.insert(console.toolbox_id.clone());
    toolboxes
}

/// An entry id as numbers, for ordering (`0-0` for an unreadable one).
fn entry_order(entry_id: &str) -> (u64, u64) {
    let (ms, seq) = entry_id.split_once('-').unwrap_or((entry_id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_claims_are_read_once_answered() {
        // A hash's fields (ledger formats 1 and 2), read back through the claim's string (format
        // 3): both shapes say the same.
        let claim = |pairs: &[(&str, &str)]| -> toolhost_bus::Claim {
            let fields =
                pairs.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect();
            let from_hash = toolhost_bus::Claim::from_fields(fields).unwrap();
            let from_string = toolhost_bus::Claim::from_value(&from_hash.to_value()).unwrap();
            assert_eq!(from_string, from_hash);
            from_string
        };
        assert_eq!(claim_answer(&claim(&[("topic", "t"), ("state", "claimed")])), None);
        assert_eq!(
            claim_answer(&claim(&[
                ("topic", "t"),
                ("state", "answered"),
                ("answer", "a1"),
                ("entry", "5-0"),
                ("kept", "{\"success\":true}")
            ])),
            Some(KeptAnswer {
                answer_id: "a1".to_owned(),
                entry_id: Some("5-0".to_owned()),
                data: Some(serde_json::json!({"success": true}))
            })
        );
        let bare = claim_answer(&claim(&[("state", "answered"), ("answer", "a2")])).unwrap();
        assert_eq!((bare.entry_id, bare.data), (None, None));
    }

    #[test]
    fn marks_with_and_without_kept_data_are_read() {
        assert_eq!(
            parse_mark("a1\n5-0\n{\"success\":true}"),
            KeptAnswer {
                answer_id: "a1".to_owned(),
                entry_id: Some("5-0".to_owned()),
                data: Some(json!({"success": true}))
            }
        );
        assert_eq!(parse_mark("a1"), KeptAnswer { answer_id: "a1".to_owned(), entry_id: None, data: None });
        assert_eq!(parse_mark("a1\n5-0\nnot json").data, None);
    }

    #[test]
    fn entry_ids_order_by_time_then_sequence() {
        let mut ids = vec!["10-1", "9-5", "10-0", "bad"];
        ids.sort_by_key(|id| entry_order(id));
        assert_eq!(ids, ["bad", "9-5", "10-0", "10-1"]);
    }
}
