//! `toolhost dlq list|replay|purge`: the dead-letter stream `dlq:<toolbox_id>`, for operators
//! (the letters' rules are in [`crate::dead_letters`]).

use std::sync::Arc;

use serde_json::json;
use toolhost_bus::{Directory, Error as BusError, RedisBus, Streams};

use crate::cli::DlqAction;
use crate::client::{EXIT_TOOL_ERROR, EXIT_TRANSPORT};
use crate::config::Config;
use crate::dead_letters::DeadLetters;
use crate::output;

/// The dead letters of the configured toolbox, over `streams` and `store`.
fn configured(streams: Arc<dyn Streams>, store: Arc<dyn Directory>, config: &Config) -> DeadLetters {
    let raw = &config.raw;
    DeadLetters::of(streams, store, config.keys(), &raw.daemon.toolbox_id, &raw.streams.requests)
        .with_shards(config.shards())
        .with_results(&raw.streams.results)
}

/// `toolhost dlq ...`: prints JSON lines and returns the exit code: 0, 1 when a named letter was
/// not found or could not be replayed, 2 when Redis failed.
pub async fn run_dlq(config: &Config, action: &DlqAction) -> i32 {
    let bus = match RedisBus::new(config.redis_options()) {
        Ok(bus) => Arc::new(bus),
        Err(err) => {
            eprintln!("toolhost: {}", config.raw.redis.place().failure(&err));
            return EXIT_TRANSPORT;
        }
    };
    let letters = configured(bus.clone(), bus, config);
    let res = match action {
        DlqAction::List { limit } => list(&letters, *limit).await,
        DlqAction::Replay { dlq_ids, all } => replay(&letters, dlq_ids, *all).await,
        DlqAction::Purge { dlq_ids, all } => purge(&letters, dlq_ids, *all).await,
    };
    res.unwrap_or_else(|err| {
        eprintln!(
            "toolhost: cannot read the dead letters of {}: {}",
            letters.topic(),
            config.raw.redis.place().failure(&err)
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
                "stream": letter.stream.as_deref().unwrap_or(letters.requests_topic()),
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

    use serde_json::Value;
    use toolhost_bus::{Directory, MemoryBus, Server, Streams};
    use toolhost_envelope::new_message_id;

    use super::*;
    use toolhost_bus::Keys;

    use crate::dead_letters::{EXCERPT_CHARS, Letter};

    fn setup() -> (Arc<MemoryBus>, DeadLetters) {
        let bus = Arc::new(MemoryBus::new());
        let config = Config::load(None, &HashMap::new()).unwrap();
        let letters = configured(bus.clone(), bus.clone(), &config);
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
    /// claim's topic, the payload's, the default results topic), and no other request's; the
    /// claim a hash (ledger formats 1 and 2) or a string (format 3).
    #[tokio::test]
    async fn replay_on_a_cluster_forgets_the_marks_next_to_every_answer_topic() {
        replay_on_a_cluster_forgets_the_marks(false).await;
        replay_on_a_cluster_forgets_the_marks(true).await;
    }

    async fn replay_on_a_cluster_forgets_the_marks(claim_is_a_string: bool) {
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
        let held =
            [("topic".to_owned(), "p:results:9".to_owned()), ("state".to_owned(), "answered".to_owned())];
        if claim_is_a_string {
            let value = toolhost_bus::Claim::from_fields(held.to_vec()).unwrap().to_value();
            bus.set_expiring(&claim, &value, Duration::from_secs(60)).await.unwrap();
        } else {
            bus.replace_hash(&claim, &held).await.unwrap();
        }
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
        assert_eq!(bus.values(std::slice::from_ref(&claim)).await.unwrap(), [None]);
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
