//! The ledger's formats (`[dispatch] ledger_format`): format 2 notes refusals in the request's
//! answered mark (on a cluster, the field `refused` of its claim), so a request answered for the
//! first time is answered without looking its entry's refusal mark up; a forged entry that
//! borrows a victim's request id still cannot use it up; and replicas of format 1 and 2 side by
//! side during the roll (format 1 with `Rolling`, `Rolling` with `Two`) answer each entry once.
//! Each test runs on one server and on a cluster (of one node, which holds every slot: the
//! cluster scripts and keys, not the spreading, are what is tested here).

use std::time::Duration;

use toolhost_bus::{
    CallKeys, CallStart, Claim, Committed, EntryRef, Finish, Groups as _, Keys, Ledger as _, LedgerFormat,
    Published, REFUSED_MARK, RedisBus, RedisOptions, Streams as _, Topology,
};

use redis::Value;

use crate::support::Server;

const REQUESTS: &str = "action-requests";
const RESULTS: &str = "action-results";
/// A results topic in the slot of `action-requests`.
const LOCAL_RESULTS: &str = "results:{action-requests}";
/// Two toolboxes reading the same stream, each in its group.
const GROUPS: [&str; 2] = ["toolbox-a", "toolbox-b"];
const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(60);

/// A Redis (one server, or a cluster of one node) and the keys the ledger uses there.
struct Redis {
    server: Server,
    keys: Keys,
    /// The results topic (bare name).
    results: &'static str,
}

impl Redis {
    fn one_server() -> Redis {
        Redis { server: Server::master(), keys: Keys::new(""), results: RESULTS }
    }

    fn cluster() -> Redis {
        Redis { server: Server::cluster_of_one(), keys: Keys::for_cluster(""), results: RESULTS }
    }

    /// A cluster whose results topic shares the requests stream's slot (a results topic per
    /// shard): final answers take the one-script path (`cluster/answer_local.lua`), refusals and
    /// replays the three steps.
    fn cluster_with_local_results() -> Redis {
        Redis { results: LOCAL_RESULTS, ..Redis::cluster() }
    }

    /// A replica's bus writing and reading the ledger in `format`.
    fn bus(&self, format: LedgerFormat) -> RedisBus {
        let mut options = RedisOptions::new(self.server.url());
        if self.keys.is_cluster() {
            options.topology = Topology::Cluster { nodes: vec![self.server.address()] };
        }
        options.ledger_format = format;
        RedisBus::new(options).unwrap()
    }

    /// Adds one request entry per id and delivers each to both groups: the entry ids.
    async fn deliver(&self, bus: &RedisBus, count: usize) -> Vec<String> {
        let stream = self.keys.topic(REQUESTS);
        for group in GROUPS {
            bus.ensure_group(&stream, group).await.unwrap();
        }
        let mut ids = Vec::new();
        for index in 0..count {
            ids.push(
                bus.publish(&stream, &format!("m-{}", uuid::Uuid::new_v4()), &format!("{{\"n\":{index}}}"))
                    .await
                    .unwrap(),
            );
        }
        for group in GROUPS {
            let read = bus.read_group(&stream, group, "c1", count, Duration::from_millis(10)).await.unwrap();
            assert_eq!(read.len(), count);
        }
        ids
    }

    /// The value of a request's answered mark on one server; on a cluster, its claim's fields
    /// written as `field=value` pairs, whether the claim is a hash (formats 1 and 2) or a string
    /// (format 3).
    fn mark(&self, request_id: &str) -> Option<String> {
        let key = self.keys.answered(REQUESTS, request_id);
        let mut connection = self.server.connection();
        if self.keys.is_cluster() {
            let fields: Vec<(String, String)> = match self.claim_shape(request_id).as_str() {
                "string" => {
                    let value: String = redis::cmd("GET").arg(&key).query(&mut connection).unwrap();
                    let claim = Claim::from_value(&value).unwrap_or_else(|| panic!("not a claim: {value:?}"));
                    let named = [
                        ("topic", claim.topic),
                        ("state", claim.state),
                        ("answer", claim.answer),
                        ("entry", claim.entry),
                        ("kept", claim.kept),
                        (REFUSED_MARK, claim.refused.then(|| "1".to_owned())),
                    ];
                    named.into_iter().filter_map(|(field, value)| Some((field.to_owned(), value?))).collect()
                }
                _ => redis::cmd("HGETALL").arg(&key).query(&mut connection).unwrap(),
            };
            let pairs: Vec<String> = fields.iter().map(|(field, value)| format!("{field}={value}")).collect();
            return (!pairs.is_empty()).then(|| pairs.join(","));
        }
        redis::cmd("GET").arg(&key).query(&mut connection).unwrap()
    }

    /// The Redis type of a request's claim (or mark): `hash`, `string` or `none`.
    fn claim_shape(&self, request_id: &str) -> String {
        let key = self.keys.answered(REQUESTS, request_id);
        redis::cmd("TYPE").arg(&key).query(&mut self.server.connection()).unwrap()
    }

    /// How many answers the results topic holds.
    fn answers(&self) -> usize {
        redis::cmd("XLEN").arg(self.keys.topic(self.results)).query(&mut self.server.connection()).unwrap()
    }
}

/// The ledger keys of request `request_id` delivered as entry `entry_id`.
struct Call {
    answered: String,
    record: String,
    entry: String,
}

impl Call {
    fn new(redis: &Redis, request_id: &str, entry_id: &str) -> Call {
        Call {
            answered: redis.keys.answered(REQUESTS, request_id),
            record: redis.keys.call(REQUESTS, request_id),
            entry: redis.keys.answered_entry(REQUESTS, entry_id),
        }
    }

    fn keys(&self) -> CallKeys<'_> {
        CallKeys {
            answered: &self.answered,
            call: &self.record,
            entry: &self.entry,
            lease: LEASE,
            retention: RETENTION,
        }
    }
}

/// How an entry is ended.
#[derive(Clone, Copy, PartialEq)]
enum End<'a> {
    /// A refusal (`forbidden`, `unknown_tool`, ...): not final.
    Refusal,
    /// A final answer, keeping this `data` for retries when given.
    Final(Option<&'a str>),
    /// The kept answer replayed for a retry.
    Replay,
}

/// Ends entry `entry_id` of request `request_id` as group `group` would: the answer's payload
/// is `<what>:<entry id>`.
async fn end(
    redis: &Redis,
    bus: &RedisBus,
    group: &str,
    request_id: &str,
    entry_id: &str,
    how: End<'_>,
) -> Committed {
    let stream = redis.keys.topic(REQUESTS);
    let results = redis.keys.topic(redis.results);
    let call = Call::new(redis, request_id, entry_id);
    let answer_id = uuid::Uuid::new_v4().to_string();
    let payload = format!("{}:{entry_id}", if how == End::Refusal { "refused" } else { "answer" });
    let finish = Finish {
        entry: EntryRef { topic: &stream, group, entry_id },
        call: Some(call.keys()),
        answer: Some(Published { topic: &results, id: &answer_id, payload: &payload }),
        answer_copy: None,
        dead_letter: None,
        final_answer: matches!(how, End::Final(_)),
        tracked: false,
        kept: match how {
            End::Final(kept) => kept,
            _ => None,
        },
        replay: how == End::Replay,
    };
    bus.finish(&finish).await.unwrap()
}

async fn begin(redis: &Redis, bus: &RedisBus, request_id: &str, entry_id: &str) -> CallStart {
    let call = Call::new(redis, request_id, entry_id);
    bus.begin_call(&call.keys(), &format!("owner-{entry_id}"), entry_id).await.unwrap()
}

/// How often the server ran `command` since `before` (`INFO commandstats` counts the commands
/// scripts run).
fn ran(redis: &Redis, command: &str, before: u64) -> u64 {
    redis.server.calls(command) - before
}

/// The command that looks an entry's refusal mark up: `EXISTS` in one server's answer script,
/// `GET` in the cluster's claim step.
fn refusal_lookup(redis: &Redis) -> &'static str {
    if redis.keys.is_cluster() { "get" } else { "exists" }
}

/// The `GET`s of a first answer that read the claim rather than a refusal mark: in format 3 the
/// three-step finish reads its claim (a string) with `GET` in the claim step and in the settle;
/// the one-script answer takes it with `SET NX GET`, and formats 1 and 2 read hashes.
fn claim_reads(redis: &Redis, format: LedgerFormat) -> u64 {
    let three_steps = redis.keys.is_cluster() && redis.results != LOCAL_RESULTS;
    if three_steps && format == LedgerFormat::Three { 2 } else { 0 }
}

async fn first_answers_skip_the_refusal_mark_only_in_format_2(redis: &Redis) {
    let lookup = refusal_lookup(redis);
    for (format, lookups) in [
        (LedgerFormat::One, 1),
        (LedgerFormat::Rolling, 1),
        (LedgerFormat::Two, 0),
        (LedgerFormat::RollingToThree, 0),
        (LedgerFormat::Three, 0),
    ] {
        let bus = redis.bus(format);
        let entries = redis.deliver(&bus, 1).await;
        let request_id = format!("first-{format:?}");
        let before = redis.server.calls(lookup);
        assert_eq!(
            end(redis, &bus, GROUPS[0], &request_id, &entries[0], End::Final(None)).await,
            Committed::Published
        );
        assert_eq!(
            ran(redis, lookup, before),
            lookups + claim_reads(redis, format),
            "{format:?}: refusal mark lookups of a first answer"
        );
        // The other toolbox's copy of the entry: answered once.
        assert_eq!(
            end(redis, &bus, GROUPS[1], &request_id, &entries[0], End::Final(None)).await,
            Committed::NotPublished
        );
    }
}

async fn a_refusal_in_format_2_does_not_use_the_request_id_up(redis: &Redis) {
    use LedgerFormat::{One, Rolling, RollingToThree, Three, Two};
    // Every writer of refusal notes beside every replica it runs beside during a roll (from 1 to
    // 2 through `Rolling`, from 2 to 3 through `RollingToThree`), in both roles.
    let pairs = [
        (Rolling, One),
        (Rolling, Rolling),
        (Rolling, Two),
        (Two, Rolling),
        (Two, Two),
        (Two, RollingToThree),
        (RollingToThree, Two),
        (RollingToThree, RollingToThree),
        (RollingToThree, Three),
        (Three, RollingToThree),
        (Three, Three),
    ];
    for (writer, reader) in pairs {
        let (writes, reads) = (redis.bus(writer), redis.bus(reader));
        let request_id = format!("victim-{writer:?}-{reader:?}");
        let entries = redis.deliver(&writes, 3).await;
        let (forged, real, retry) = (&entries[0], &entries[1], &entries[2]);
        let answers = redis.answers();

        // A forged entry borrowing the id is refused: the mark notes a refusal, no answer.
        assert_eq!(
            end(redis, &writes, GROUPS[0], &request_id, forged, End::Refusal).await,
            Committed::Published
        );
        let mark = redis.mark(&request_id).unwrap();
        assert!(mark.contains(REFUSED_MARK) && !mark.contains("answered"), "{mark}");
        if redis.keys.is_cluster() {
            // Only format 3 creates strings: replicas of earlier releases read hashes only.
            let shape = if writer == Three { "string" } else { "hash" };
            assert_eq!(redis.claim_shape(&request_id), shape, "{writer:?}");
        }

        // The victim's own request runs and is answered, and its answer kept.
        assert_eq!(begin(redis, &reads, &request_id, real).await, CallStart::Fresh);
        assert_eq!(
            end(redis, &reads, GROUPS[0], &request_id, real, End::Final(Some("{\"kept\":1}"))).await,
            Committed::Published
        );
        // The forged entry, read by the other toolbox: its refusal stays its one answer,
        // whether it finds it as a first answer or as a retry with a kept answer.
        assert_eq!(begin(redis, &reads, &request_id, forged).await, CallStart::Answered);
        assert_eq!(
            end(redis, &reads, GROUPS[1], &request_id, forged, End::Final(Some("{\"kept\":2}"))).await,
            Committed::NotPublished
        );
        // A retry gets the original answer, once across both toolboxes.
        let CallStart::AnsweredKept(kept) = begin(redis, &reads, &request_id, retry).await else {
            panic!("{writer:?} → {reader:?}: the retry did not find the kept answer")
        };
        assert_eq!(kept.data, "{\"kept\":1}");
        assert_eq!(
            end(redis, &reads, GROUPS[0], &request_id, retry, End::Replay).await,
            Committed::Published
        );
        assert_eq!(
            end(redis, &writes, GROUPS[1], &request_id, retry, End::Replay).await,
            Committed::NotPublished
        );
        assert_eq!(redis.answers() - answers, 3, "{writer:?} → {reader:?}: refusal, answer, replay");
    }
}

async fn a_format_1_refusal_is_seen_by_a_rolling_replica(redis: &Redis) {
    let (old, rolling) = (redis.bus(LedgerFormat::One), redis.bus(LedgerFormat::Rolling));
    let entries = redis.deliver(&old, 2).await;
    let answers = redis.answers();
    assert_eq!(
        end(redis, &old, GROUPS[0], "old-refused", &entries[0], End::Refusal).await,
        Committed::Published
    );
    assert_eq!(redis.mark("old-refused"), None, "format 1 notes no refusal in the request's mark");
    assert_eq!(begin(redis, &rolling, "old-refused", &entries[0]).await, CallStart::Answered);
    assert_eq!(
        end(redis, &rolling, GROUPS[1], "old-refused", &entries[0], End::Final(None)).await,
        Committed::NotPublished
    );
    // The request itself is not used up: its next entry runs.
    assert_eq!(begin(redis, &rolling, "old-refused", &entries[1]).await, CallStart::Fresh);
    assert_eq!(
        end(redis, &rolling, GROUPS[0], "old-refused", &entries[1], End::Final(None)).await,
        Committed::Published
    );
    assert_eq!(redis.answers() - answers, 2);
}

async fn a_refusal_after_the_answer_keeps_the_mark_as_long_as_itself(redis: &Redis) {
    let bus = redis.bus(LedgerFormat::Two);
    let entries = redis.deliver(&bus, 2).await;
    assert_eq!(
        end(redis, &bus, GROUPS[0], "lasting", &entries[0], End::Final(Some("{}"))).await,
        Committed::Published
    );
    let key = redis.keys.answered(REQUESTS, "lasting");
    let mut connection = redis.server.connection();
    let () = redis::cmd("PEXPIRE").arg(&key).arg(1000).query(&mut connection).unwrap();
    assert_eq!(end(redis, &bus, GROUPS[0], "lasting", &entries[1], End::Replay).await, Committed::Published);
    let left: i64 = redis::cmd("PTTL").arg(&key).query(&mut connection).unwrap();
    assert!(left > 1000, "the mark expires before the refusal mark it vouches for ({left} ms left)");
}

#[tokio::test]
async fn on_one_server_first_answers_skip_the_refusal_mark_only_in_format_2() {
    first_answers_skip_the_refusal_mark_only_in_format_2(&Redis::one_server()).await;
}

#[tokio::test]
async fn on_a_cluster_first_answers_skip_the_refusal_mark_only_in_format_2() {
    first_answers_skip_the_refusal_mark_only_in_format_2(&Redis::cluster()).await;
}

#[tokio::test]
async fn on_one_server_a_refusal_in_format_2_does_not_use_the_request_id_up() {
    a_refusal_in_format_2_does_not_use_the_request_id_up(&Redis::one_server()).await;
}

#[tokio::test]
async fn on_a_cluster_a_refusal_in_format_2_does_not_use_the_request_id_up() {
    a_refusal_in_format_2_does_not_use_the_request_id_up(&Redis::cluster()).await;
}

#[tokio::test]
async fn on_one_server_a_format_1_refusal_is_seen_by_a_rolling_replica() {
    a_format_1_refusal_is_seen_by_a_rolling_replica(&Redis::one_server()).await;
}

#[tokio::test]
async fn on_a_cluster_a_format_1_refusal_is_seen_by_a_rolling_replica() {
    a_format_1_refusal_is_seen_by_a_rolling_replica(&Redis::cluster()).await;
}

#[tokio::test]
async fn on_one_server_a_refusal_after_the_answer_keeps_the_mark_as_long_as_itself() {
    a_refusal_after_the_answer_keeps_the_mark_as_long_as_itself(&Redis::one_server()).await;
}

#[tokio::test]
async fn on_a_cluster_a_refusal_after_the_answer_keeps_the_mark_as_long_as_itself() {
    a_refusal_after_the_answer_keeps_the_mark_as_long_as_itself(&Redis::cluster()).await;
}

#[tokio::test]
async fn on_a_cluster_with_results_in_the_streams_slot_first_answers_skip_the_refusal_mark_only_in_format_2()
{
    first_answers_skip_the_refusal_mark_only_in_format_2(&Redis::cluster_with_local_results()).await;
}

#[tokio::test]
async fn on_a_cluster_with_results_in_the_streams_slot_a_refusal_does_not_use_the_request_id_up() {
    a_refusal_in_format_2_does_not_use_the_request_id_up(&Redis::cluster_with_local_results()).await;
}

#[tokio::test]
async fn on_a_cluster_with_results_in_the_streams_slot_a_format_1_refusal_is_seen_by_a_rolling_replica() {
    a_format_1_refusal_is_seen_by_a_rolling_replica(&Redis::cluster_with_local_results()).await;
}

/// The one-script answer: one script call per answer, and a topic that is not a stream leaves
/// nothing written and the entry pending.
#[tokio::test]
async fn on_a_cluster_an_answer_in_the_streams_slot_is_one_script_and_writes_nothing_on_a_wrong_topic() {
    let redis = Redis::cluster_with_local_results();
    let bus = redis.bus(LedgerFormat::Two);
    let entries = redis.deliver(&bus, 3).await;
    // The first call of a script loads it (`NOSCRIPT`, then `SCRIPT LOAD`): count the second.
    assert_eq!(
        end(&redis, &bus, GROUPS[0], "warm", &entries[2], End::Final(None)).await,
        Committed::Published
    );
    let scripts = redis.server.calls("evalsha");
    assert_eq!(
        end(&redis, &bus, GROUPS[0], "local", &entries[0], End::Final(None)).await,
        Committed::Published
    );
    assert_eq!(ran(&redis, "evalsha", scripts), 1, "claim, publish and settle in one script");
    assert!(redis.mark("local").unwrap().contains("state=answered"));
    let mut connection = redis.server.connection();
    let topic = redis.keys.topic(LOCAL_RESULTS);
    let () = redis::cmd("DEL").arg(&topic).query(&mut connection).unwrap();
    let () = redis::cmd("SET").arg(&topic).arg("not a stream").query(&mut connection).unwrap();
    assert_eq!(
        end(&redis, &bus, GROUPS[0], "wrong", &entries[1], End::Final(None)).await,
        Committed::WrongType
    );
    assert_eq!(redis.mark("wrong"), None);
    let pending: Vec<Value> = redis::cmd("XPENDING")
        .arg(redis.keys.topic(REQUESTS))
        .arg(GROUPS[0])
        .arg("-")
        .arg("+")
        .arg(10)
        .query(&mut connection)
        .unwrap();
    assert_eq!(pending.len(), 1, "the entry stays pending");
}

/// The one-script answer is written for batches: the answers of a stream and group that end
/// together are one script call with one `XACK`, and in format 2 a request with an empty claim
/// is answered without reading the marks next to the topic or writing one (the claim is its
/// answered mark there).
#[tokio::test]
async fn on_a_cluster_answers_in_the_streams_slot_are_one_call_and_one_ack_per_batch() {
    const N_ANSWERS: usize = 8;
    let redis = Redis::cluster_with_local_results();
    let bus = redis.bus(LedgerFormat::Two);
    let entries = redis.deliver(&bus, N_ANSWERS + 1).await;
    // The first call of a script loads it (`NOSCRIPT`, then `SCRIPT LOAD`): count the next ones.
    assert_eq!(
        end(&redis, &bus, GROUPS[0], "warm-batch", &entries[N_ANSWERS], End::Final(None)).await,
        Committed::Published
    );
    let counted = ["evalsha", "xack", "mget", "set", "xadd"];
    let before: Vec<u64> = counted.iter().map(|command| redis.server.calls(command)).collect();
    let answers = redis.answers();
    let ends =
        entries[..N_ANSWERS].iter().enumerate().map(|(call_idx, entry_id)| {
            let (redis, bus) = (&redis, &bus);
            async move {
                end(redis, bus, GROUPS[0], &format!("batch-{call_idx}"), entry_id, End::Final(None)).await
            }
        });
    for committed in futures::future::join_all(ends).await {
        assert_eq!(committed, Committed::Published);
    }
    let ran: Vec<u64> =
        counted.iter().zip(&before).map(|(command, before)| ran(&redis, command, *before)).collect();
    assert_eq!(ran, [1, 1, 0, 0, N_ANSWERS as u64], "{counted:?}");
    assert_eq!(redis.answers() - answers, N_ANSWERS);
    let mut connection = redis.server.connection();
    let pending: Vec<Value> = redis::cmd("XPENDING")
        .arg(redis.keys.topic(REQUESTS))
        .arg(GROUPS[0])
        .arg("-")
        .arg("+")
        .arg(100)
        .query(&mut connection)
        .unwrap();
    assert!(pending.is_empty(), "every entry of the batch is acked: {pending:?}");
    let topic = redis.keys.topic(LOCAL_RESULTS);
    for (call_idx, entry_id) in entries[..N_ANSWERS].iter().enumerate() {
        let request_id = format!("batch-{call_idx}");
        assert!(redis.mark(&request_id).unwrap().contains("state=answered"));
        let mark_by_the_topic = redis.keys.answered_mark(REQUESTS, &request_id, &topic);
        let found: Option<String> = redis::cmd("GET").arg(&mark_by_the_topic).query(&mut connection).unwrap();
        assert_eq!(found, None, "the claim is the answered mark when the topic is in its slot");
        // Another toolbox's copy of the entry finds the claim: answered once.
        assert_eq!(
            end(&redis, &bus, GROUPS[1], &request_id, entry_id, End::Final(None)).await,
            Committed::NotPublished
        );
    }
    assert_eq!(redis.answers() - answers, N_ANSWERS);
}

/// A refusal notes itself in the claim before it is published next to its topic (format 2), so
/// a one-script answer that finds the claim empty may skip the marks by the topic: a refusal
/// whose publish wrote nothing (its topic not a stream) has left the note, and a refusal on the
/// topic whose settle never ran (its copy in the stream's slot missing) is still its entry's one
/// answer.
#[tokio::test]
async fn on_a_cluster_a_refusal_is_noted_in_the_claim_before_it_is_published() {
    let redis = Redis::cluster_with_local_results();
    let bus = redis.bus(LedgerFormat::Two);
    let entries = redis.deliver(&bus, 2).await;
    let mut connection = redis.server.connection();

    // The refusal's topic is not a stream: nothing is published, and the note is there.
    let topic = redis.keys.topic(LOCAL_RESULTS);
    let () = redis::cmd("DEL").arg(&topic).query(&mut connection).unwrap();
    let () = redis::cmd("SET").arg(&topic).arg("not a stream").query(&mut connection).unwrap();
    assert_eq!(end(&redis, &bus, GROUPS[0], "noted", &entries[0], End::Refusal).await, Committed::WrongType);
    assert_eq!(redis.mark("noted").as_deref(), Some("refused=1"));
    let () = redis::cmd("DEL").arg(&topic).query(&mut connection).unwrap();

    // A refusal published, then its settle lost: the refusal mark's copy in the stream's slot
    // is gone, as if its holder had stopped between the publish and the settle.
    assert_eq!(
        end(&redis, &bus, GROUPS[0], "unsettled", &entries[1], End::Refusal).await,
        Committed::Published
    );
    let copy = redis.keys.answered_entry(REQUESTS, &entries[1]);
    let () = redis::cmd("DEL").arg(&copy).query(&mut connection).unwrap();
    let answers = redis.answers();
    let mgets = redis.server.calls("mget");
    assert_eq!(
        end(&redis, &bus, GROUPS[1], "unsettled", &entries[1], End::Final(None)).await,
        Committed::NotPublished
    );
    assert_eq!(ran(&redis, "mget", mgets), 1, "the note sends the answer to the marks by the topic");
    assert_eq!(redis.answers(), answers, "the entry's refusal stays its one answer");
}

/// A five-step finish that stopped after its publish (the claim `claimed`, the answer and its
/// mark on the topic) is completed by a one-script answer of the same request without a second
/// answer.
#[tokio::test]
async fn on_a_cluster_a_one_script_answer_completes_a_claim_left_claimed() {
    let redis = Redis::cluster_with_local_results();
    let bus = redis.bus(LedgerFormat::Two);
    let entries = redis.deliver(&bus, 1).await;
    let topic = redis.keys.topic(LOCAL_RESULTS);
    let claim = redis.keys.answered(REQUESTS, "half");
    let mark_by_the_topic = redis.keys.answered_mark(REQUESTS, "half", &topic);
    let mut connection = redis.server.connection();
    let () = redis::cmd("HSET")
        .arg(&claim)
        .arg("topic")
        .arg(&topic)
        .arg("state")
        .arg("claimed")
        .query(&mut connection)
        .unwrap();
    let () = redis::cmd("XADD").arg(&topic).arg("*").arg("id").arg("first").query(&mut connection).unwrap();
    let () = redis::cmd("SET").arg(&mark_by_the_topic).arg("first").query(&mut connection).unwrap();
    let answers = redis.answers();
    assert_eq!(
        end(&redis, &bus, GROUPS[0], "half", &entries[0], End::Final(None)).await,
        Committed::NotPublished
    );
    assert_eq!(redis.answers(), answers, "the first answer stays the only one");
    let held = redis.mark("half").unwrap();
    assert!(held.contains("state=answered") && !held.contains("answer="), "{held}");
}

/// Ledger format 3's common answer on a cluster is one server's: one script call for the batch,
/// each claim taken with one `SET NX GET` of a string, the answer's `XADD`, and one shared `XACK`;
/// no hash command and no `PEXPIRE`.
#[tokio::test]
async fn on_a_cluster_format_3_answers_in_the_streams_slot_with_one_set_per_answer() {
    const N_ANSWERS: usize = 8;
    let redis = Redis::cluster_with_local_results();
    let bus = redis.bus(LedgerFormat::Three);
    let entries = redis.deliver(&bus, N_ANSWERS + 1).await;
    // The first call of a script loads it (`NOSCRIPT`, then `SCRIPT LOAD`): count the next ones.
    assert_eq!(
        end(&redis, &bus, GROUPS[0], "warm-three", &entries[N_ANSWERS], End::Final(None)).await,
        Committed::Published
    );
    let counted = ["evalsha", "xack", "set", "xadd", "get", "mget", "hmget", "hset", "pexpire", "del"];
    let before: Vec<u64> = counted.iter().map(|command| redis.server.calls(command)).collect();
    let answers = redis.answers();
    let ends = entries[..N_ANSWERS].iter().enumerate().map(|(call_idx, entry_id)| {
        let (redis, bus) = (&redis, &bus);
        async move {
            let kept = (call_idx % 2 == 0).then_some("{\"kept\":\"a\\nb:c\"}");
            end(redis, bus, GROUPS[0], &format!("three-{call_idx}"), entry_id, End::Final(kept)).await
        }
    });
    for committed in futures::future::join_all(ends).await {
        assert_eq!(committed, Committed::Published);
    }
    let ran: Vec<u64> =
        counted.iter().zip(&before).map(|(command, before)| ran(&redis, command, *before)).collect();
    let n = N_ANSWERS as u64;
    assert_eq!(ran, [1, 1, n, n, 0, 0, 0, 0, 0, 0], "{counted:?}");
    assert_eq!(redis.answers() - answers, N_ANSWERS);
    for (call_idx, entry_id) in entries[..N_ANSWERS].iter().enumerate() {
        let request_id = format!("three-{call_idx}");
        assert_eq!(redis.claim_shape(&request_id), "string");
        let held = redis.mark(&request_id).unwrap();
        assert!(held.contains("state=answered") && held.contains(&format!("entry={entry_id}")), "{held}");
        // Another toolbox's copy of the entry finds the claim: answered once.
        assert_eq!(
            end(&redis, &bus, GROUPS[1], &request_id, entry_id, End::Final(None)).await,
            Committed::NotPublished
        );
    }
    // A retry of a request whose answer was kept (payload with a newline and a colon) gets it.
    let retry = redis.deliver(&bus, 1).await;
    let CallStart::AnsweredKept(kept) = begin(&redis, &bus, "three-0", &retry[0]).await else {
        panic!("the retry did not find the kept answer")
    };
    assert_eq!(kept.data, "{\"kept\":\"a\\nb:c\"}");
    assert_eq!(redis.answers() - answers, N_ANSWERS);
}

/// A claim left by format 2 (a hash) is honoured by format 3 until it expires, and keeps its
/// shape: the request is answered once, a retry gets the kept answer, a refusal noted in it
/// still keeps its entry answered once.
async fn a_format_2_claim_is_honoured_by_format_3(redis: &Redis) {
    let (two, three) = (redis.bus(LedgerFormat::Two), redis.bus(LedgerFormat::Three));
    let entries = redis.deliver(&two, 4).await;
    let answers = redis.answers();
    assert_eq!(
        end(redis, &two, GROUPS[0], "older", &entries[0], End::Final(Some("{\"kept\":2}"))).await,
        Committed::Published
    );
    assert_eq!(redis.claim_shape("older"), "hash");
    // The other toolbox, of format 3, reads the same entry: answered once.
    assert_eq!(
        end(redis, &three, GROUPS[1], "older", &entries[0], End::Final(Some("{\"kept\":3}"))).await,
        Committed::NotPublished
    );
    // A retry, begun and ended by format 3, gets the original answer, once.
    let CallStart::AnsweredKept(kept) = begin(redis, &three, "older", &entries[1]).await else {
        panic!("the retry did not find the kept answer in format 2's claim")
    };
    assert_eq!(kept.data, "{\"kept\":2}");
    assert_eq!(end(redis, &three, GROUPS[0], "older", &entries[1], End::Replay).await, Committed::Published);
    assert_eq!(
        end(redis, &three, GROUPS[1], "older", &entries[1], End::Replay).await,
        Committed::NotPublished
    );
    assert_eq!(redis.claim_shape("older"), "hash", "a claim keeps its shape");

    // A refusal noted by format 2, then the victim's request answered by format 3.
    assert_eq!(
        end(redis, &two, GROUPS[0], "noted-by-two", &entries[2], End::Refusal).await,
        Committed::Published
    );
    assert_eq!(redis.mark("noted-by-two").as_deref(), Some("refused=1"));
    assert_eq!(begin(redis, &three, "noted-by-two", &entries[3]).await, CallStart::Fresh);
    assert_eq!(
        end(redis, &three, GROUPS[0], "noted-by-two", &entries[3], End::Final(None)).await,
        Committed::Published
    );
    assert_eq!(redis.claim_shape("noted-by-two"), "hash");
    assert_eq!(begin(redis, &three, "noted-by-two", &entries[2]).await, CallStart::Answered);
    assert_eq!(
        end(redis, &three, GROUPS[1], "noted-by-two", &entries[2], End::Final(None)).await,
        Committed::NotPublished
    );
    assert_eq!(redis.answers() - answers, 4, "answer, replay, refusal, answer");
}

#[tokio::test]
async fn on_a_cluster_a_format_2_claim_is_honoured_by_format_3() {
    a_format_2_claim_is_honoured_by_format_3(&Redis::cluster()).await;
}

#[tokio::test]
async fn on_a_cluster_with_results_in_the_streams_slot_a_format_2_claim_is_honoured_by_format_3() {
    a_format_2_claim_is_honoured_by_format_3(&Redis::cluster_with_local_results()).await;
}

/// The roll from format 2 to 3, each stage's two kinds of replica side by side on the same
/// stream (one per toolbox, both answering every entry at once): every request is answered
/// exactly once, refused entries stay refused, and retries get the kept answer once.
async fn rolling_from_2_to_3_answers_every_request_once(redis: &Redis) {
    use LedgerFormat::{RollingToThree, Three, Two};
    const N_REQUESTS: usize = 12;
    for (first, second) in [(Two, RollingToThree), (RollingToThree, Three), (Three, RollingToThree)] {
        let (a, b) = (redis.bus(first), redis.bus(second));
        // Per request: an entry, a retry of it, and every third request a forged entry first.
        let entries = redis.deliver(&a, N_REQUESTS * 3).await;
        let answers = redis.answers();
        let mut expected = 0;
        for request_idx in 0..N_REQUESTS {
            let request_id = format!("roll-{first:?}-{second:?}-{request_idx}");
            let [entry, retry, forged] = [0, 1, 2].map(|offset| &entries[request_idx * 3 + offset]);
            // The replica refusing a forged entry alternates between the two kinds.
            let refuser = if request_idx % 2 == 0 { &a } else { &b };
            if request_idx % 3 == 0 {
                assert_eq!(
                    end(redis, refuser, GROUPS[0], &request_id, forged, End::Refusal).await,
                    Committed::Published
                );
                expected += 1;
            }
            let kept = "{\"kept\":1}";
            let (one, other) = futures::future::join(
                end(redis, &a, GROUPS[0], &request_id, entry, End::Final(Some(kept))),
                end(redis, &b, GROUPS[1], &request_id, entry, End::Final(Some(kept))),
            )
            .await;
            let published =
                [&one, &other].iter().filter(|committed| ***committed == Committed::Published).count();
            assert_eq!(published, 1, "{request_id}: {one:?}, {other:?}");
            expected += 1;
            if request_idx % 3 == 0 {
                // The forged entry, read by the other toolbox: its refusal is its one answer.
                let other = if request_idx % 2 == 0 { &b } else { &a };
                assert_eq!(
                    end(redis, other, GROUPS[1], &request_id, forged, End::Final(None)).await,
                    Committed::NotPublished,
                    "{request_id}"
                );
            }
            // A retry, begun by one kind and replayed by both: the kept answer once.
            let CallStart::AnsweredKept(found) = begin(redis, &b, &request_id, retry).await else {
                panic!("{request_id}: the retry did not find the kept answer")
            };
            assert_eq!(found.data, kept);
            let (one, other) = futures::future::join(
                end(redis, &a, GROUPS[0], &request_id, retry, End::Replay),
                end(redis, &b, GROUPS[1], &request_id, retry, End::Replay),
            )
            .await;
            let published =
                [&one, &other].iter().filter(|committed| ***committed == Committed::Published).count();
            assert_eq!(published, 1, "{request_id} retry: {one:?}, {other:?}");
            expected += 1;
        }
        assert_eq!(redis.answers() - answers, expected, "{first:?} beside {second:?}");
    }
}

#[tokio::test]
async fn on_a_cluster_rolling_from_2_to_3_answers_every_request_once() {
    rolling_from_2_to_3_answers_every_request_once(&Redis::cluster()).await;
}

#[tokio::test]
async fn on_a_cluster_with_results_in_the_streams_slot_rolling_from_2_to_3_answers_every_request_once() {
    rolling_from_2_to_3_answers_every_request_once(&Redis::cluster_with_local_results()).await;
}

#[tokio::test]
async fn on_one_server_rolling_from_2_to_3_answers_every_request_once() {
    rolling_from_2_to_3_answers_every_request_once(&Redis::one_server()).await;
}
