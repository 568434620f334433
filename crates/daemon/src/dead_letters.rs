//! The dead-letter stream `dlq:<toolbox_id>`: read, replayed and purged by `toolhost dlq`
//! (`crate::dlq`) and the console.
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
//! [`DeadLetters::of`] reads the letters of any toolbox of the fleet.

use std::sync::Arc;

use anyhow::Context as _;
use serde_json::{Value, json};
use toolhost_bus::{Directory, Error as BusError, Keys, Streams};
use toolhost_envelope::{Entry, new_message_id};

/// How many letters one read fetches.
const PAGE: usize = 500;
/// How much of a payload a summary shows.
pub(crate) const EXCERPT_CHARS: usize = 200;

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
    /// The requests stream's shards: a replayed request goes to its home shard.
    shards: Option<toolhost_bus::Shards>,
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
            shards: None,
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

    /// Names the requests stream's shards (`[streams] shards`): a letter of one of them is
    /// replayed on the home shard of its request id, by the shard rule.
    #[must_use]
    pub fn with_shards(mut self, shards: toolhost_bus::Shards) -> DeadLetters {
        self.shards = Some(shards);
        self
    }

    /// The shard (full key) a letter of `stream` (full key) with `request_id` is replayed on:
    /// the request id's home shard when `stream` is one of the requests stream's shards, else
    /// `stream` itself.
    fn home_of(&self, stream: &str, request_id: Option<&str>) -> String {
        let bare = stream.strip_prefix(self.keys.prefix()).unwrap_or(stream);
        match (&self.shards, request_id) {
            (Some(shards), Some(id)) if shards.count() > 1 && shards.index_of(bare).is_some() => {
                self.keys.topic(&shards.stream(shards.of_id(id)))
            }
            _ => stream.to_owned(),
        }
    }

    /// The full key of the requests stream.
    pub fn requests_topic(&self) -> &str {
        &self.requests
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
        let request_id = letter.request_id();
        let stream = self.home_of(letter.stream.as_deref().unwrap_or(&self.requests), request_id.as_deref());
        let stream = stream.as_str();
        if let Some(request_id) = request_id {
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
    /// slot, and [`Keys::answered`] is the request's claim, a hash (a string in ledger format 3)
    /// naming that topic. So the marks next to every topic the answer may have gone to are deleted first (the claim's
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
            // A hash (ledger formats 1 and 2) or a string (format 3).
            let held = toolhost_bus::read_claim(self.store.as_ref(), &claim).await?;
            let mut topics: Vec<String> = held.and_then(|claim| claim.topic).into_iter().collect();
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

/// Whether `id` is a whole stream entry id, `<ms>-<seq>` in decimal.
fn is_entry_id(id: &str) -> bool {
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|byte| byte.is_ascii_digit());
    id.split_once('-').is_some_and(|(ms, seq)| digits(ms) && digits(seq))
}
