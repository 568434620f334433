//! `toolhost dlq list|replay|purge`: the dead-letter stream `dlq:<toolbox_id>`, for operators.
//!
//! The dispatcher writes a dead letter as a JSON object with `payload` (the request entry's
//! payload as sent, `null` if it had none), `stream` (the requests stream), `request_entry_id`
//! and `id` (the request entry's stream id and message id), `error`, `deliveries`,
//! `dead_lettered_at`, `toolbox_id` and `event`. Letters written before 0.2 name the request
//! entry `entry_id`; they are read the same way.
//!
//! Two ids are easy to mix up, so the commands name them plainly: `dlq_id` is the dead letter's
//! own entry id in `dlq:<toolbox_id>` (what `replay` and `purge` take), `request_entry_id` the
//! id the request had in the requests stream.
//!
//! Replaying a letter deletes the request's ledger records first (its answered mark and call
//! record; on a Redis Cluster also the answered marks next to the response topics, in their own
//! slots), then adds the payload to the requests stream (a fresh entry, keeping the message `id`),
//! then deletes the letter. In that order a crash can leave a letter that was replayed already,
//! but never a replay that the ledger takes for a duplicate and acks unanswered.
//!
//! [`DeadLetters::new`] reads the configured toolbox's letters; [`DeadLetters::of`] those of any
//! toolbox of the fleet (the console's view).

use std::sync::Arc;

use anyhow::Context as _;
use serde_json::{Value, json};
use toolhost_bus::{Directory, Error as BusError, Keys, RedisBus, Streams};
use toolhost_envelope::{Entry, new_message_id};

use crate::cli::DlqAction;
use crate::client::{EXIT_TOOL_ERROR, EXIT_TRANSPORT, redis_failure};
use crate::config::Config;
use crate::output;

/// How many letters one read fetches.
const PAGE: usize = 500;
/// How much of a payload `list` prints.
const EXCERPT_CHARS: usize = 200;

/// The dead letters of one toolbox.
pub struct DeadLetters {
    /// The dead-letter and requests streams.
    streams: Arc<dyn Streams>,
    /// The ledger's marks, forgotten on replay.
    store: Arc<dyn Directory>,
    keys: Keys,
    /// Bare name of the requests stream: the ledger's namespace.
    requests_stream: String,
    /// Full key of `dlq:<toolbox_id>`.
    topic: String,
    /// Full key of the toolbox's requests stream, for letters that do not name theirs.
    requests: String,
    /// Bare name of the toolbox's default results topic, when known: a request naming no
    /// response topic (or a refused one) is answered there.
    results: Option<String>,
}

/// One dead letter as read back.
#[derive(Debug, Clone, PartialEq)]
pub struct Letter {
    /// The letter's own entry id in the dead-letter stream.
    pub dlq_id: String,
    /// The request's entry id in its requests stream, when the letter records it.
    pub request_entry_id: Option<String>,
    /// Why it was dead-lettered.
    pub error: String,
    /// How often the request entry had been delivered.
    pub deliveries: u64,
    /// The requests stream it came from.
    pub stream: Option<String>,
    /// The request entry's `id` field, when it had its own.
    pub message_id: Option<String>,
    /// The request entry's payload as sent.
    pub payload: Option<String>,
    /// When it was dead-lettered (RFC 3339).
    pub dead_lettered_at: Option<String>,
    /// What made a field unreadable (not UTF-8, or over the size limit), without its head:
    /// `{"field", "problem", "size", "sha1"}`.
    pub defect: Option<Value>,
}

impl Letter {
    /// Reads a dead-letter entry; a letter that is not the dispatcher's JSON keeps its raw text
    /// as the error, so `list` still shows it.
    pub fn from_entry(entry: &Entry) -> Letter {
        let value: Value =
            entry.payload.as_deref().and_then(|text| serde_json::from_str(text).ok()).unwrap_or_default();
        let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        let error = text("error").unwrap_or_else(|| {
            format!("unreadable dead letter: {}", entry.payload.as_deref().unwrap_or_default())
        });
        // `entry_id` is the old name of `request_entry_id`. The dispatcher records the entry id
        // as `id` when the entry had no `id` field.
        let request_entry_id = text("request_entry_id").or_else(|| text("entry_id"));
        let message_id = text("id").filter(|id| Some(id) != request_entry_id.as_ref());
        Letter {
            dlq_id: entry.entry_id.clone(),
            request_entry_id,
            error,
            deliveries: value.get("deliveries").and_then(Value::as_u64).unwrap_or(0),
            stream: text("stream").filter(|stream| !stream.is_empty()),
            message_id,
            payload: text("payload"),
            dead_lettered_at: text("dead_lettered_at"),
            defect: value.get("defect").filter(|defect| defect.is_object()).map(|defect| {
                let field = |key: &str| defect.get(key).cloned().unwrap_or(Value::Null);
                json!({"field": field("field"), "problem": field("problem"), "size": field("size"), "sha1": field("sha1")})
            }),
        }
    }

    /// The response topic the request names (bare), read as the dispatcher reads it: the
    /// envelope's `response_topic`, else `data.response_topic`. `None` when it names none (it is
    /// then answered on its toolbox's default results topic).
    pub fn response_topic(&self) -> Option<String> {
        let envelope: Value = self.payload.as_deref().and_then(|text| serde_json::from_str(text).ok())?;
        let named = |value: &Value| value.get("response_topic").and_then(Value::as_str).map(str::to_owned);
        named(&envelope).or_else(|| envelope.get("data").and_then(named)).filter(|topic| !topic.is_empty())
    }

    /// The request id the ledger knows the request by, derived as the dispatcher does:
    /// `data.request_id`, else the envelope's `id`, else the entry's message id.
    pub fn request_id(&self) -> Option<String> {
        let envelope: Value = self.payload.as_deref().and_then(|text| serde_json::from_str(text).ok())?;
        let data = envelope.get("data").unwrap_or(&Value::Null);
        let envelope_id = envelope.get("id").and_then(Value::as_str).unwrap_or_default();
        let message_id = self.message_id.as_deref().unwrap_or_default();
        toolhost_envelope::request_id(data, envelope_id, message_id).ok().filter(|id| !id.is_empty())
    }

    /// The `list` line.
    pub fn summary(&self) -> Value {
        let payload = self.payload.as_deref().unwrap_or_default();
        let mut excerpt: String = payload.chars().take(EXCERPT_CHARS).collect();
        if excerpt.len() < payload.len() {
            excerpt.push('…');
        }
        let mut summary = json!({
            "dlq_id": self.dlq_id,
            "request_entry_id": self.request_entry_id,
            "dead_lettered_at": self.dead_lettered_at,
            "error": self.error,
            "deliveries": self.deliveries,
            "stream": self.stream,
            "request_id": self.request_id(),
            "payload_bytes": payload.len(),
            "payload_excerpt": self.payload.as_ref().map(|_| excerpt),
        });
        if let Some(defect) = &self.defect {
            // The payload's size as sent, not the nothing (or head) the letter kept of it.
            if defect["field"] == toolhost_envelope::FIELD_PAYLOAD {
                summary["payload_bytes"] = defect["size"].clone();
            }
            summary["defect"] = defect.clone();
        }
        summary
    }
}

impl DeadLetters {
    /// The dead letters of the configured toolbox, over `streams` and `store`.
    pub fn new(streams: Arc<dyn Streams>, store: Arc<dyn Directory>, config: &Config) -> DeadLetters {
        let raw = &config.raw;
        DeadLetters::of(streams, store, config.keys(), &raw.daemon.toolbox_id, &raw.streams.requests)
            .with_results(&raw.streams.results)
    }

    /// The dead letters of any toolbox of the fleet: `dlq:<toolbox_id>` under `keys`, whose
    /// requests stream (bare name) is `requests_stream`. Without [`DeadLetters::with_results`]
    /// a replay finds the topic a request naming none was answered on from its claim alone (on a
    /// cluster).
    pub fn of(
        streams: Arc<dyn Streams>,
        store: Arc<dyn Directory>,
        keys: Keys,
        toolbox_id: &str,
        requests_stream: &str,
    ) -> DeadLetters {
        DeadLetters {
            topic: keys.dead_letters(toolbox_id),
            requests: keys.topic(requests_stream),
            requests_stream: requests_stream.to_owned(),
            results: None,
            keys,
            streams,
            store,
        }
    }

    /// Names the toolbox's default results topic (bare name), where a request that names no
    /// response topic, or a refused one, is answered: a replay deletes the answered mark there
    /// too.
    #[must_use]
    pub fn with_results(mut self, results: &str) -> DeadLetters {
        self.results = Some(results.to_owned());
        self
    }

    /// The full key of the dead-letter stream.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Up to `limit` letters (all without one), oldest first.
    ///
    /// # Errors
    /// Redis cannot be read.
    pub async fn list(&self, limit: Option<usize>) -> Result<Vec<Letter>, BusError> {
        let limit = limit.unwrap_or(usize::MAX);
        let mut letters = Vec::new();
        let mut cursor = "0-0".to_owned();
        while letters.len() < limit {
            let entries =
                self.streams.read(&self.topic, &cursor, PAGE.min(limit - letters.len()), None).await?;
            let Some(last) = entries.last() else { break };
            cursor = last.entry_id.clone();
            letters.extend(entries.iter().map(Letter::from_entry));
        }
        Ok(letters)
    }

    /// The letter whose own entry id is `dlq_id`, `None` when there is none (or `dlq_id` is not
    /// an entry id, `<ms>-<seq>`).
    ///
    /// # Errors
    /// Redis cannot be read.
    pub async fn get(&self, dlq_id: &str) -> Result<Option<Letter>, BusError> {
        if !is_entry_id(dlq_id) {
            return Ok(None);
        }
        // Newest first from `dlq_id` inclusive: the first entry is the letter, if it exists.
        let entries = self.streams.read_back(&self.topic, dlq_id, 1).await?;
        Ok(entries.first().filter(|entry| entry.entry_id == dlq_id).map(Letter::from_entry))
    }

    /// The letters named by `dlq_ids` (every letter with `all`), and the ids not found.
    ///
    /// # Errors
    /// Redis cannot be read.
    pub async fn select(
        &self,
        dlq_ids: &[String],
        all: bool,
    ) -> Result<(Vec<Letter>, Vec<String>), BusError> {
        if all {
            return Ok((self.list(None).await?, Vec::new()));
        }
        let (mut chosen, mut missing) = (Vec::new(), Vec::new());
        for dlq_id in dlq_ids {
            match self.get(dlq_id).await? {
                Some(letter) => chosen.push(letter),
                None => missing.push(dlq_id.clone()),
            }
        }
        Ok((chosen, missing))
    }

    /// Puts a letter's request back on its requests stream and deletes the letter. Returns the
    /// new entry's id.
    ///
    /// # Errors
    /// The letter has no payload to replay, or Redis failed.
    pub async fn replay(&self, letter: &Letter) -> anyhow::Result<String> {
        let payload =
            letter.payload.as_deref().context("the dead letter holds no request payload to replay")?;
        let stream = letter.stream.as_deref().unwrap_or(&self.requests);
        if let Some(request_id) = letter.request_id() {
            // The ledger is the stream's, named by its bare name.
            let ledger = stream.strip_prefix(self.keys.prefix()).unwrap_or(&self.requests_stream);
            self.forget(ledger, &request_id, letter.response_topic())
                .await
                .context("cannot delete the request's answered mark")?;
        }
        let message_id = letter.message_id.clone().unwrap_or_else(new_message_id);
        let entry_id = self
            .streams
            .publish(stream, &message_id, payload)
            .await
            .context("cannot re-queue the request")?;
        self.streams
            .delete_entries(&self.topic, std::slice::from_ref(&letter.dlq_id))
            .await
            .context("re-queued, but cannot delete the dead letter")?;
        Ok(entry_id)
    }

    /// Deletes every ledger record of request `request_id` of the stream `ledger` (bare name)
    /// that would make a replay a duplicate: its answered mark and its call record.
    ///
    /// On a cluster the answered mark lives next to the topic the answer went to, in that topic's
    /// slot, and [`Keys::answered`] is the request's claim, a hash naming that topic. So the
    /// marks next to every topic the answer may have gone to are deleted first (the claim's
    /// topic, `named_topic` from the payload, the default results topic), then the claim and the
    /// call record: a crash in between leaves the claim, and a second replay finds the topics
    /// again. Keys are deleted one per command, as a cluster refuses a `DEL` across slots.
    /// The entry's refusal marks are not touched: they are keyed by the old entry's id, and the
    /// replay is a new entry.
    async fn forget(
        &self,
        ledger: &str,
        request_id: &str,
        named_topic: Option<String>,
    ) -> Result<(), BusError> {
        let claim = self.keys.answered(ledger, request_id);
        let mut doomed = Vec::new();
        if self.keys.is_cluster() {
            let held = self.store.hash_fields(&claim).await?;
            let mut topics: Vec<String> =
                held.into_iter().filter(|(field, _)| field == "topic").map(|(_, topic)| topic).collect();
            topics.extend(named_topic.iter().chain(&self.results).map(|bare| self.keys.topic(bare)));
            for topic in topics {
                let mark = self.keys.answered_mark(ledger, request_id, &topic);
                if !doomed.contains(&mark) {
                    doomed.push(mark);
                }
            }
        }
        doomed.push(claim);
        doomed.push(self.keys.call(ledger, request_id));
        for key in &doomed {
            self.store.delete(std::slice::from_ref(key)).await?;
        }
        Ok(())
    }

    /// Deletes letters; returns how many existed.
    ///
    /// # Errors
    /// Redis failed.
    pub async fn purge(&self, letters: &[Letter]) -> Result<u64, BusError> {
        let ids: Vec<String> = letters.iter().map(|letter| letter.dlq_id.clone()).collect();
        self.streams.delete_entries(&self.topic, &ids).await
    }
}

/// `toolhost dlq ...`: prints JSON lines and returns the exit code: 0, 1 when a named letter was
/// not found or could not be replayed, 2 when Redis failed.
pub async fn run_dlq(config: &Config, action: &DlqAction) -> i32 {
    let bus = match RedisBus::new(config.redis_options()) {
        Ok(bus) => Arc::new(bus),
        Err(err) => {
            eprintln!("toolhost: {}", redis_failure(&config.raw.redis, &err));
            return EXIT_TRANSPORT;
        }
    };
    let letters = DeadLetters::new(bus.clone(), bus, config);
    let res = match action {
        DlqAction::List { limit } => list(&letters, *limit).await,
        DlqAction::Replay { dlq_ids, all } => replay(&letters, dlq_ids, *all).await,
        DlqAction::Purge { dlq_ids, all } => purge(&letters, dlq_ids, *all).await,
    };
    res.unwrap_or_else(|err| {
        eprintln!(
            "toolhost: cannot read the dead letters of {}: {}",
            letters.topic(),
            redis_failure(&config.raw.redis, &err)
        );
        EXIT_TRANSPORT
    })
}

async fn list(letters: &DeadLetters, limit: Option<usize>) -> Result<i32, BusError> {
    let found = letters.list(limit).await?;
    // Said on stderr, so stdout stays one JSON object per letter for scripts.
    if found.is_empty() {
        eprintln!("toolhost: no dead letters in {}", letters.topic());
    }
    for letter in found {
        output::line(letter.summary());
    }
    Ok(0)
}

async fn replay(letters: &DeadLetters, dlq_ids: &[String], all: bool) -> Result<i32, BusError> {
    let (chosen, missing) = letters.select(dlq_ids, all).await?;
    let mut code = report_missing(&missing);
    for letter in &chosen {
        match letters.replay(letter).await {
            Ok(entry_id) => output::line(json!({
                "dlq_id": letter.dlq_id,
                "replayed_as": entry_id,
                "stream": letter.stream.as_deref().unwrap_or(&letters.requests),
                "request_id": letter.request_id(),
            })),
            Err(err) => {
                eprintln!("toolhost: cannot replay dead letter {}: {err:#}", letter.dlq_id);
                code = EXIT_TOOL_ERROR;
            }
        }
    }
    Ok(code)
}

async fn purge(letters: &DeadLetters, dlq_ids: &[String], all: bool) -> Result<i32, BusError> {
    let (chosen, missing) = letters.select(dlq_ids, all).await?;
    let code = report_missing(&missing);
    letters.purge(&chosen).await?;
    for letter in &chosen {
        output::line(json!({"dlq_id": letter.dlq_id, "purged": true}));
    }
    Ok(code)
}

/// Whether `id` is a whole stream entry id, `<ms>-<seq>` in decimal.
fn is_entry_id(id: &str) -> bool {
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|byte| byte.is_ascii_digit());
    id.split_once('-').is_some_and(|(ms, seq)| digits(ms) && digits(seq))
}

fn report_missing(missing: &[String]) -> i32 {
    for dlq_id in missing {
        eprintln!("toolhost: no dead letter with dlq_id {dlq_id}");
    }
    if missing.is_empty() { 0 } else { EXIT_TOOL_ERROR }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use toolhost_bus::{Directory, MemoryBus, Server, Streams};

    use super::*;

    fn setup() -> (Arc<MemoryBus>, DeadLetters) {
        let bus = Arc::new(MemoryBus::new());
        let config = Config::load(None, &HashMap::new()).unwrap();
        let letters = DeadLetters::new(bus.clone(), bus.clone(), &config);
        (bus, letters)
    }

    /// A dead letter shaped like the dispatcher's.
    async fn letter(bus: &MemoryBus, payload: Option<&str>, message_id: &str) -> String {
        let letter = json!({
            "event": "dead_letter", "toolbox_id": "toolhost", "stream": "action-requests",
            "entry_id": "1-0", "id": message_id, "payload": payload, "deliveries": 6,
            "error": "delivered 6 times", "dead_lettered_at": "2025-01-01T00:00:00Z",
        });
        bus.publish("dlq:toolhost", &new_message_id(), &letter.to_string()).await.unwrap()
    }

    #[tokio::test]
    async fn replay_requeues_forgets_the_answer_and_deletes_the_letter() {
        let (bus, letters) = setup();
        let request = json!({"id": "env-1", "type": "echo.requested", "data": {"request_id": "r-1"}});
        let entry_id = letter(&bus, Some(&request.to_string()), "msg-1").await;
        bus.set_expiring("toolhost:ledger:action-requests:answered:r-1", "1", Duration::from_secs(60))
            .await
            .unwrap();
        let (chosen, missing) = letters.select(&[entry_id.clone(), "9-9".to_owned()], false).await.unwrap();
        assert_eq!(missing, ["9-9"]);
        assert_eq!(chosen.len(), 1);
        assert_eq!(chosen[0].request_id().as_deref(), Some("r-1"));
        assert_eq!(chosen[0].summary()["deliveries"], 6);
        letters.replay(&chosen[0]).await.unwrap();
        assert_eq!(bus.payloads("action-requests"), [request.to_string()]);
        assert!(bus.keys_matching("toolhost:ledger:action-requests:answered:*").await.unwrap().is_empty());
        assert!(letters.list(None).await.unwrap().is_empty());
    }

    /// On a cluster the claim sits in the requests stream's slot and the answered marks next to
    /// the topics answers went to: a replay of another toolbox's letter deletes them all (the
    /// claim's topic, the payload's, the default results topic), and no other request's.
    #[tokio::test]
    async fn replay_on_a_cluster_forgets_the_marks_next_to_every_answer_topic() {
        let bus = Arc::new(MemoryBus::new());
        let keys = Keys::for_cluster("p:");
        let letters = DeadLetters::of(bus.clone(), bus.clone(), keys.clone(), "tb-2", "reqs-2")
            .with_results("results-2");
        let request = json!({"id": "env-1", "type": "echo.requested", "response_topic": "results:7",
                             "data": {"request_id": "r-1", "message": "hi"}});
        let letter = json!({
            "event": "dead_letter", "toolbox_id": "tb-2", "stream": "p:reqs-2",
            "request_entry_id": "1-0", "id": "msg-1", "payload": request.to_string(), "deliveries": 1,
            "error": "e", "dead_lettered_at": "2025-01-01T00:00:00Z",
        });
        let dlq_id = bus.publish("p:dlq:tb-2", &new_message_id(), &letter.to_string()).await.unwrap();
        let claim = keys.answered("reqs-2", "r-1");
        bus.replace_hash(
            &claim,
            &[("topic".to_owned(), "p:results:9".to_owned()), ("state".to_owned(), "answered".to_owned())],
        )
        .await
        .unwrap();
        let marks: Vec<String> = ["p:results:9", "p:results:7", "p:results-2"]
            .iter()
            .map(|topic| keys.answered_mark("reqs-2", "r-1", topic))
            .collect();
        let record = keys.call("reqs-2", "r-1");
        let other = keys.answered_mark("reqs-2", "r-2", "p:results:7");
        for key in marks.iter().chain([&record, &other]) {
            bus.set_expiring(key, "a-1", Duration::from_secs(60)).await.unwrap();
        }
        // Every mark is its own key, apart from the claim.
        let mut all: Vec<&String> = marks.iter().chain([&claim, &record]).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 5, "{all:?}");

        let found = letters.get(&dlq_id).await.unwrap().expect("the letter by its id");
        assert_eq!(found.response_topic().as_deref(), Some("results:7"));
        assert_eq!(found.request_id().as_deref(), Some("r-1"));
        assert_eq!(letters.get("1-0").await.unwrap(), None);
        assert_eq!(letters.get("+").await.unwrap(), None, "not an entry id");
        let entry_id = letters.replay(&found).await.unwrap();

        assert!(bus.hash_fields(&claim).await.unwrap().is_empty());
        let left = bus.values(&[marks.clone(), vec![record, other]].concat()).await.unwrap();
        assert_eq!(left, [None, None, None, None, Some("a-1".to_owned())]);
        let requeued = bus.read("p:reqs-2", "0-0", 10, None).await.unwrap();
        assert_eq!(requeued.len(), 1);
        assert_eq!((requeued[0].entry_id.as_str(), requeued[0].id.as_str()), (entry_id.as_str(), "msg-1"));
        assert_eq!(requeued[0].payload.as_deref(), Some(request.to_string().as_str()));
        assert_eq!(letters.get(&dlq_id).await.unwrap(), None, "the letter is deleted");
    }

    #[tokio::test]
    async fn letters_of_unreadable_payloads_list_the_size_sent_and_the_defect_without_its_head() {
        let (bus, letters) = setup();
        let defect = json!({"field": "payload", "problem": "too_large", "size": 8_388_608, "sha1": "ab12",
                            "head_base64": "eHh4", "head_bytes": 3, "truncated": true});
        let letter = json!({
            "event": "dead_letter", "toolbox_id": "toolhost", "stream": "action-requests",
            "entry_id": "1-0", "id": "msg-1", "payload": null, "deliveries": 1, "defect": defect,
            "error": "payload of 8388608 bytes exceeds the limit of 1048576 bytes",
        });
        bus.publish("dlq:toolhost", &new_message_id(), &letter.to_string()).await.unwrap();
        let listed = letters.list(None).await.unwrap();
        let summary = listed[0].summary();
        assert_eq!(summary["payload_bytes"], 8_388_608);
        assert_eq!(summary["payload_excerpt"], Value::Null);
        assert_eq!(
            summary["defect"],
            json!({"field": "payload", "problem": "too_large", "size": 8_388_608, "sha1": "ab12"})
        );
        assert!(letters.replay(&listed[0]).await.is_err(), "nothing whole to replay");
    }

    #[tokio::test]
    async fn letters_of_both_forms_name_the_dead_letter_and_the_request_entry() {
        let (bus, letters) = setup();
        // `letter` writes the old form, `entry_id`; the dispatcher now writes `request_entry_id`.
        let old = letter(&bus, Some("{}"), "msg-1").await;
        let new = json!({
            "event": "dead_letter", "toolbox_id": "toolhost", "stream": "action-requests",
            "request_entry_id": "2-0", "id": "msg-2", "payload": "{}", "deliveries": 1,
            "error": "e", "dead_lettered_at": "2025-01-01T00:00:00Z",
        });
        let new = bus.publish("dlq:toolhost", &new_message_id(), &new.to_string()).await.unwrap();
        let listed = letters.list(None).await.unwrap();
        let summaries: Vec<Value> = listed.iter().map(Letter::summary).collect();
        assert_eq!(summaries[0]["dlq_id"], old);
        assert_eq!(summaries[0]["request_entry_id"], "1-0");
        assert_eq!(summaries[1]["dlq_id"], new);
        assert_eq!(summaries[1]["request_entry_id"], "2-0");
        assert_eq!(listed[1].message_id.as_deref(), Some("msg-2"));
        assert!(summaries.iter().all(|summary| summary.get("entry_id").is_none()), "{summaries:?}");
    }

    #[tokio::test]
    async fn letters_without_payload_are_listed_and_purged_but_not_replayed() {
        let (bus, letters) = setup();
        letter(&bus, None, "1-0").await;
        letter(&bus, Some(&"x".repeat(500)), "msg-2").await;
        let listed = letters.list(None).await.unwrap();
        assert_eq!(listed.len(), 2);
        assert!(letters.replay(&listed[0]).await.is_err());
        let summary = listed[1].summary();
        assert_eq!(summary["payload_bytes"], 500);
        assert_eq!(summary["payload_excerpt"].as_str().unwrap().chars().count(), EXCERPT_CHARS + 1);
        assert_eq!(listed[1].request_id().as_deref(), None, "not JSON: no request id");
        assert_eq!(letters.list(Some(1)).await.unwrap().len(), 1);
        let (all, _) = letters.select(&[], true).await.unwrap();
        assert_eq!(letters.purge(&all).await.unwrap(), 2);
        assert!(letters.list(None).await.unwrap().is_empty());
    }
}
