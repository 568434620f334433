//! `[redis] replica_acks`: a call record is acknowledged by replicas (`WAIT`) before
//! `begin_call` lets its tool run; one too few replicas acknowledged comes back
//! `Unreplicated`, and the refusal that answers it releases the record.
//!
//! A master with one replica on loopback; the replica is paused with SIGSTOP to hold back its
//! acknowledgements.

use std::time::{Duration, Instant};

use redis::Commands as _;
use toolhost_bus::{
    CallKeys, CallStart, Committed, EntryRef, Finish, Groups as _, Ledger as _, Published, RedisBus,
    RedisOptions, Server as _, Streams as _,
};

use crate::support::Server;

const REQUESTS: &str = "action-requests";
const RESULTS: &str = "action-results";
const GROUP: &str = "toolhost";
const LEASE: Duration = Duration::from_secs(30);

/// The ledger keys of request `id` delivered as entry `entry_id`.
struct Call {
    answered: String,
    record: String,
    entry: String,
}

impl Call {
    fn new(id: &str, entry_id: &str) -> Call {
        Call {
            answered: format!("toolhost:ledger:{REQUESTS}:answered:{id}"),
            record: format!("toolhost:ledger:{REQUESTS}:call:{id}"),
            entry: format!("toolhost:ledger:{REQUESTS}:entry:{entry_id}"),
        }
    }

    fn keys(&self, lease: Duration) -> CallKeys<'_> {
        CallKeys {
            answered: &self.answered,
            call: &self.record,
            entry: &self.entry,
            lease,
            retention: Duration::from_secs(60),
        }
    }
}

/// A bus on `server` that waits for `replicas` replicas (0: does not) for up to `timeout`.
fn bus(server: &Server, replicas: u32, timeout: Duration) -> RedisBus {
    let mut options = RedisOptions::new(server.url());
    options.replica_acks = replicas;
    options.replica_ack_timeout = timeout;
    RedisBus::new(options).unwrap()
}

/// Adds `n` requests and delivers them to consumer `c1`: their entry ids.
async fn deliver(bus: &RedisBus, n: usize) -> Vec<String> {
    bus.ensure_group(REQUESTS, GROUP).await.unwrap();
    for request_idx in 0..n {
        bus.publish(REQUESTS, &format!("m-{request_idx}"), "{}").await.unwrap();
    }
    let entries = bus.read_group(REQUESTS, GROUP, "c1", n, Duration::from_millis(10)).await.unwrap();
    assert_eq!(entries.len(), n);
    entries.into_iter().map(|entry| entry.entry_id).collect()
}

/// The refusal that answers an unreplicated call (`overloaded`, not final, tracked): what the
/// daemon's lifecycle commits.
async fn refuse(bus: &RedisBus, call: &CallKeys<'_>, entry_id: &str, answer_id: &str) -> Committed {
    let finish = Finish {
        entry: EntryRef { topic: REQUESTS, group: GROUP, entry_id },
        call: Some(*call),
        answer: Some(Published { topic: RESULTS, id: answer_id, payload: "{}" }),
        answer_copy: None,
        dead_letter: None,
        final_answer: false,
        tracked: true,
        kept: None,
        replay: false,
    };
    bus.finish(&finish).await.unwrap()
}

#[tokio::test]
async fn a_record_the_replica_has_runs_and_one_wait_covers_a_batch_of_records() {
    let master = Server::master();
    let _replica = Server::replica_of(&master);
    let waiting = bus(&master, 1, Duration::from_secs(5));
    let entries = deliver(&waiting, 40).await;
    let calls: Vec<Call> = entries
        .iter()
        .enumerate()
        .map(|(call_idx, entry_id)| Call::new(&format!("r-{call_idx}"), entry_id))
        .collect();
    let waits_before = master.calls("wait");

    // Forty calls reaching the ledger at once share a few batches, each followed by one WAIT.
    let starts = futures::future::join_all(calls.iter().zip(&entries).map(|(call, entry_id)| {
        let waiting = &waiting;
        async move { waiting.begin_call(&call.keys(LEASE), &format!("owner-{entry_id}"), entry_id).await }
    }))
    .await;
    for start in starts {
        assert_eq!(start.unwrap(), CallStart::Fresh);
    }
    let waits = master.calls("wait") - waits_before;
    assert!((1..40).contains(&waits), "{waits} WAITs for 40 records: they were not batched");

    // Without replica_acks nothing waits.
    let plain = bus(&master, 0, Duration::from_secs(5));
    let call = Call::new("plain", &entries[0]);
    assert_eq!(
        plain.begin_call(&call.keys(LEASE), "owner-plain", &entries[0]).await.unwrap(),
        CallStart::Fresh
    );
    assert_eq!(master.calls("wait") - waits_before, waits);
}

#[tokio::test]
async fn a_record_the_replica_did_not_acknowledge_is_unreplicated_and_its_refusal_releases_it() {
    let master = Server::master();
    let replica = Server::replica_of(&master);
    let timeout = Duration::from_millis(300);
    let waiting = bus(&master, 1, timeout);
    let entries = deliver(&waiting, 2).await;
    let call = Call::new("r-1", &entries[0]);
    let keys = call.keys(LEASE);

    replica.pause();
    let started = Instant::now();
    let start = waiting.begin_call(&keys, "owner-1", &entries[0]).await.unwrap();
    let took = started.elapsed();
    assert_eq!(start, CallStart::Unreplicated { started_before: false, acked: 0, wanted: 1, timeout });
    assert!(took >= timeout && took < timeout + Duration::from_secs(2), "took {took:?}");

    // The multiplexed connection is not held while a record waits for replicas.
    let second = Call::new("r-2", &entries[1]);
    let second_keys = second.keys(LEASE);
    let waited = waiting.begin_call(&second_keys, "owner-2", &entries[1]);
    let others = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        waiting.ping().await.unwrap();
        waiting.publish("other", "m-x", "{}").await.unwrap();
        started.elapsed()
    };
    let (start, other) = tokio::join!(waited, others);
    assert!(matches!(start.unwrap(), CallStart::Unreplicated { started_before: false, .. }));
    assert!(other < Duration::from_millis(200), "a PING and an XADD took {other:?} behind the WAIT");

    // The refusal answers the entry and deletes the record, so a retry of the request is fresh.
    assert_eq!(refuse(&waiting, &keys, &entries[0], "answer-1").await, Committed::Published);
    let exists: bool = master.connection().exists(&call.record).unwrap();
    assert!(!exists, "the unreplicated record was not released");
    replica.resume();
    let retry = deliver(&waiting, 1).await;
    let retried = Call::new("r-1", &retry[0]);
    assert_eq!(
        waiting.begin_call(&retried.keys(LEASE), "owner-3", &retry[0]).await.unwrap(),
        CallStart::Fresh
    );
    let on_replica: bool = replica.connection().exists(&call.record).unwrap();
    assert!(on_replica, "a fresh start said the replica had the record, and it does not");
}

#[tokio::test]
async fn a_call_started_before_is_unreplicated_as_started_before_and_starts_that_stand_are_kept() {
    let master = Server::master();
    let replica = Server::replica_of(&master);
    let timeout = Duration::from_millis(200);
    let waiting = bus(&master, 1, timeout);
    let entries = deliver(&waiting, 3).await;

    // An earlier holder's record with a lapsed lease (it began with a lease of 30 ms and died).
    let crashed = Call::new("r-crashed", &entries[0]);
    let short = crashed.keys(Duration::from_millis(30));
    assert_eq!(waiting.begin_call(&short, "holder-1", &entries[0]).await.unwrap(), CallStart::Fresh);
    tokio::time::sleep(Duration::from_millis(60)).await;
    // A live holder's record.
    let busy = Call::new("r-busy", &entries[1]);
    assert_eq!(
        waiting.begin_call(&busy.keys(LEASE), "holder-2", &entries[1]).await.unwrap(),
        CallStart::Fresh
    );
    let copy = Call::new("r-busy", &entries[2]);

    replica.pause();
    let start = waiting.begin_call(&crashed.keys(LEASE), "holder-3", &entries[0]).await.unwrap();
    assert_eq!(start, CallStart::Unreplicated { started_before: true, acked: 0, wanted: 1, timeout });
    // A copy of a request another holder runs wrote nothing: it stands (the copy is acked).
    let start = waiting.begin_call(&copy.keys(LEASE), "holder-4", &entries[2]).await.unwrap();
    assert_eq!(start, CallStart::Busy { entry_id: entries[1].clone() });
    replica.resume();
}

#[tokio::test]
async fn a_master_without_replicas_never_lets_a_tracked_call_run_and_wait_is_sent_on_its_own_connection() {
    let master = Server::master();
    let timeout = Duration::from_millis(100);
    let waiting = bus(&master, 1, timeout);
    let entries = deliver(&waiting, 1).await;
    let call = Call::new("r-1", &entries[0]);
    let start = waiting.begin_call(&call.keys(LEASE), "owner-1", &entries[0]).await.unwrap();
    assert_eq!(start, CallStart::Unreplicated { started_before: false, acked: 0, wanted: 1, timeout });
    // The records have a connection of their own: besides the shared one (and the group
    // reads'), one more client is connected.
    let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut master.connection()).unwrap();
    let waited: Vec<&str> = clients.lines().filter(|line| line.contains("cmd=wait")).collect();
    assert_eq!(waited.len(), 1, "{clients}");
    let others: Vec<&str> = clients.lines().filter(|line| line.contains("cmd=evalsha")).collect();
    assert!(others.is_empty(), "the shared connection ran the record script: {clients}");
}

#[tokio::test]
async fn a_callers_publish_waits_for_replicas_and_says_when_its_entry_may_be_lost() {
    let master = Server::master();
    let replica = Server::replica_of(&master);
    let mut options = RedisOptions::new(master.url());
    options.publish_acks = 1;
    options.replica_ack_timeout = Duration::from_millis(200);
    let caller = RedisBus::new(options).unwrap();
    let entry_id = caller.publish(REQUESTS, "m-1", "{}").await.unwrap();
    let on_replica: u64 = replica.connection().xlen(REQUESTS).unwrap();
    assert_eq!(on_replica, 1, "{entry_id} was acknowledged but is not on the replica");

    replica.pause();
    let err = caller.append(REQUESTS, &[("id", "m-2"), ("payload", "{}")], None).await.unwrap_err();
    replica.resume();
    let toolhost_bus::Error::Unreplicated { entry_id, acked: 0, wanted: 1, .. } = &err else {
        panic!("expected Unreplicated, got {err:?}");
    };
    // Written on the master all the same: the caller cannot know whether it will survive.
    let on_master: Vec<redis::Value> = master.connection().xrange(REQUESTS, entry_id, entry_id).unwrap();
    assert_eq!(on_master.len(), 1);
    assert!(err.to_string().contains("a failover now could lose it"), "{err}");
    assert!(!err.is_retryable());
}
