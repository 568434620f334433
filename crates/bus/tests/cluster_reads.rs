//! Group reads on a Redis Cluster go through the streaming reader (`raw_read`) connected to the
//! master of the stream's slot, not through the read script: large values arrive cut to their
//! defect, and a read after the stream's slot moved to another master (`CLUSTER SETSLOT`)
//! follows it, through the script while the slot is migrating (`ASK`) and raw again once it
//! moved (`MOVED`), reading every entry once. `script_reads` still forces the script.

use std::collections::HashMap;
use std::time::Duration;

use toolhost_bus::{Groups as _, RedisBus, RedisOptions, Streams as _, Topology};
use toolhost_envelope::{DEFECT_HEAD_BYTES, Entry};

use crate::support::Server;

const GROUP: &str = "toolbox";
const CONSUMER: &str = "reader-1";
/// Values longer than this arrive as their defect.
const LIMIT: usize = 4096;

/// A bus on the cluster whose seed is `seed`.
fn cluster_bus(seed: &Server, script_reads: bool) -> RedisBus {
    let mut options = RedisOptions::new(seed.url());
    options.topology = Topology::Cluster { nodes: vec![seed.address()] };
    options.max_field_bytes = LIMIT;
    options.script_reads = script_reads;
    RedisBus::new(options).unwrap()
}

/// The slot of `key`, as the cluster computes it.
fn slot(server: &Server, key: &str) -> u16 {
    redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut server.connection()).unwrap()
}

/// The read script's calls on `servers`, counted as Redis counts them.
fn script_calls(servers: &[&Server]) -> u64 {
    servers.iter().map(|server| server.calls("evalsha") + server.calls("eval")).sum()
}

/// Reads until a read comes back empty, and returns every entry read.
async fn read_all(bus: &RedisBus, topic: &str) -> Vec<Entry> {
    let mut entries = Vec::new();
    loop {
        let read = bus.read_group(topic, GROUP, CONSUMER, 4, Duration::from_millis(50)).await.unwrap();
        if read.is_empty() {
            return entries;
        }
        entries.extend(read);
    }
}

/// Publishes `count` messages named `<name>-<n>`.
async fn publish(bus: &RedisBus, topic: &str, name: &str, count: usize) {
    for n in 0..count {
        bus.publish(topic, &format!("{name}-{n}"), "{}").await.unwrap();
    }
}

#[tokio::test]
async fn a_cluster_reads_raw_from_the_streams_master_and_cuts_large_values() {
    let (first, second) = Server::cluster_of_two();
    // Seeded with the node that does not hold the stream: the reader must find its master.
    let topic = "requests:{raw-read}";
    let (owner, other) = if slot(&first, topic) <= 8191 { (&first, &second) } else { (&second, &first) };
    let bus = cluster_bus(other, false);
    bus.ensure_group_at(topic, GROUP, "0").await.unwrap();
    let large = "z".repeat(DEFECT_HEAD_BYTES * 2 + 7);
    bus.publish(topic, "m-1", "{}").await.unwrap();
    bus.publish(topic, "m-2", &large).await.unwrap();
    bus.publish(topic, "m-3", "{\"ok\":true}").await.unwrap();
    let reads_before = owner.calls("xreadgroup");

    let entries = read_all(&bus, topic).await;

    let ids: Vec<&str> = entries.iter().map(|entry| entry.id.as_str()).collect();
    assert_eq!(ids, ["m-1", "m-2", "m-3"]);
    assert_eq!(entries[0].payload.as_deref(), Some("{}"));
    let defect = entries[1].defect.as_ref().unwrap();
    assert_eq!((defect.field.as_str(), defect.size), ("payload", large.len() as u64));
    assert_eq!(defect.head, large.as_bytes()[..DEFECT_HEAD_BYTES]);
    assert_eq!(defect.sha1, sha1_smol::Sha1::from(&large).digest().to_string());
    assert!(entries[2].defect.is_none());
    assert_eq!(script_calls(&[&first, &second]), 0, "no read went through the script");
    assert!(owner.calls("xreadgroup") > reads_before);
    assert_eq!(other.calls("xreadgroup"), 0);

    // `script_reads` still reads through the script, and cuts alike.
    let scripted = cluster_bus(other, true);
    scripted.publish(topic, "m-4", &large).await.unwrap();
    let entries = read_all(&scripted, topic).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].defect.as_ref().unwrap().sha1, defect.sha1);
    assert!(script_calls(&[&first, &second]) > 0);
}

#[tokio::test]
async fn a_read_after_the_streams_slot_moved_reads_every_entry_once() {
    let (first, second) = Server::cluster_of_two();
    let topic = "requests:{moving}";
    let at = slot(&first, topic);
    let (source, target) = if at <= 8191 { (&first, &second) } else { (&second, &first) };
    let bus = cluster_bus(source, false);
    bus.ensure_group_at(topic, GROUP, "0").await.unwrap();
    publish(&bus, topic, "before", 5).await;
    let mut read = read_all(&bus, topic).await;
    assert_eq!(read.len(), 5);
    assert_eq!(script_calls(&[&first, &second]), 0);

    // The slot migrates: the stream leaves the source, which answers reads of it with ASK, and
    // such a read goes through the script on the cluster connection, which follows ASK.
    let (source_id, target_id) = (source.cluster_id(), target.cluster_id());
    let setslot = |server: &Server, state: &str, node: &str| {
        let () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(at)
            .arg(state)
            .arg(node)
            .query(&mut server.connection())
            .unwrap();
    };
    setslot(target, "IMPORTING", &source_id);
    setslot(source, "MIGRATING", &target_id);
    let () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(target.port())
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(topic)
        .query(&mut source.connection())
        .unwrap();
    publish(&bus, topic, "migrating", 5).await;
    let scripts_before = script_calls(&[&first, &second]);
    let migrating = read_all(&bus, topic).await;
    assert_eq!(migrating.len(), 5);
    assert!(script_calls(&[&first, &second]) > scripts_before, "read through the script during ASK");
    read.extend(migrating);

    // The slot has moved: the source answers MOVED, and the reader learns the slots again and
    // reads raw from the target.
    setslot(target, "NODE", &target_id);
    setslot(source, "NODE", &target_id);
    publish(&bus, topic, "after", 5).await;
    let (scripts_before, target_reads) = (script_calls(&[&first, &second]), target.calls("xreadgroup"));
    let moved = read_all(&bus, topic).await;
    assert_eq!(moved.len(), 5);
    assert_eq!(script_calls(&[&first, &second]), scripts_before, "read raw once the slot moved");
    assert!(target.calls("xreadgroup") > target_reads);
    read.extend(moved);

    // Every entry read once, and none left pending unread.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for entry in &read {
        *seen.entry(entry.id.clone()).or_default() += 1;
        assert_eq!(entry.deliveries, 1, "{}", entry.id);
    }
    assert_eq!(seen.len(), 15);
    assert!(seen.values().all(|&times| times == 1), "{seen:?}");
    for name in ["before", "migrating", "after"] {
        for n in 0..5 {
            assert_eq!(seen.get(&format!("{name}-{n}")), Some(&1));
        }
    }
    let pending: redis::streams::StreamPendingReply =
        redis::cmd("XPENDING").arg(topic).arg(GROUP).query(&mut target.connection()).unwrap();
    assert_eq!(pending.count(), 15);
}
