//! Redis Sentinel: toolhost finds the master through the sentinels (its `REDIS_URL` host and port
//! point nowhere), and follows a failover in the same process, whether the master dies (SIGKILL)
//! or is demoted and keeps accepting connections (`SENTINEL FAILOVER`, where it answers writes
//! with READONLY).

use std::process::Command;
use std::time::Duration;

use serde_json::json;
use toolhost_e2e::sentinel::{MASTER_NAME, Watched, answers, poll, role};
use toolhost_e2e::{RedisProcess, Toolhost, toolhost_bin};

const REQUESTS: &str = "action-requests";
const RESULTS: &str = "action-results";
const GROUP: &str = "toolhost";

/// How to reach Redis through the sentinels of `watched`: the URL's host and port are not used
/// (nothing listens on port 1), so every connection must come from a sentinel's answer. The
/// periodic check is off, so only what a command meets can move toolhost to another master.
fn env(watched: &Watched) -> Vec<(&'static str, String)> {
    vec![
        ("REDIS_URL", "redis://127.0.0.1:1/0".to_owned()),
        ("TOOLHOST__REDIS__SENTINELS", watched.sentinel_urls()),
        ("TOOLHOST__REDIS__SENTINEL_MASTER", MASTER_NAME.to_owned()),
        ("TOOLHOST__REDIS__SENTINEL_CHECK_MS", "0".to_owned()),
        ("TOOLHOST__DISPATCH__BLOCK_MS", "500".to_owned()),
        ("TOOLHOST__DISPATCH__CLAIM_IDLE_MS", "1000".to_owned()),
    ]
}

fn start_toolhost(watched: &Watched) -> Toolhost {
    let mut env = env(watched);
    env.push(("TOOLHOST__LOG__LEVEL", "info,toolhost_bus=debug".to_owned()));
    let pairs: Vec<(&str, &str)> = env.iter().map(|(name, value)| (*name, value.as_str())).collect();
    Toolhost::start(&pairs)
}

/// Sends one `echo` request per id to `server`.
fn send(server: &RedisProcess, ids: &[String]) {
    let mut connection = server.connection();
    for id in ids {
        let message_id = uuid::Uuid::new_v4().to_string();
        let payload = json!({
            "id": message_id,
            "type": "echo.requested",
            "data": {"request_id": id, "message": id},
            "correlation_id": format!("c-{id}"),
        });
        let _: String = redis::cmd("XADD")
            .arg(REQUESTS)
            .arg("*")
            .arg("id")
            .arg(&message_id)
            .arg("payload")
            .arg(payload.to_string())
            .query(&mut connection)
            .expect("XADD");
    }
}

/// The entries delivered to the group and not acked yet.
fn pending(server: &RedisProcess) -> Option<i64> {
    let reply: Vec<redis::Value> =
        redis::cmd("XPENDING").arg(REQUESTS).arg(GROUP).query(&mut server.connection()).ok()?;
    match reply.first()? {
        redis::Value::Int(count) => Some(*count),
        _ => None,
    }
}

/// Waits until every id has an answer on `server` and nothing is pending (an answer commits with
/// its ack, so no later duplicate can come), then checks each id was answered exactly once with
/// its own message.
fn assert_answered_once(server: &RedisProcess, ids: &[String], timeout: Duration) {
    poll("every request to be answered and acked", timeout, || {
        let answers = answers(server, RESULTS);
        (ids.iter().all(|id| answers.contains_key(id)) && pending(server) == Some(0)).then_some(())
    });
    let answers = answers(server, RESULTS);
    for id in ids {
        let found = &answers[id];
        assert_eq!(found.len(), 1, "request {id} answered {} times: {found:#?}", found.len());
        assert_eq!(found[0]["data"]["result"]["message"], *id, "{:#}", found[0]);
    }
}

fn ids(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|index| format!("{prefix}-{index}-{}", uuid::Uuid::new_v4().simple())).collect()
}

/// Whether the process is running (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit(')').next().map(|rest| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

#[test]
fn a_killed_master_is_followed_to_the_promoted_replica_in_the_same_process() {
    let mut watched = Watched::start();
    let first = watched.servers[0].port();
    let second = watched.servers[1].port();
    let toolhost = start_toolhost(&watched);
    let pid = toolhost.pid();
    toolhost.wait_for_log(&format!("127.0.0.1:{first}"), Duration::from_secs(10));
    assert!(toolhost.log().contains("redis master found through the sentinels"), "{}", toolhost.log());

    let before = ids("before", 20);
    send(&watched.servers[0], &before);
    assert_answered_once(&watched.servers[0], &before, Duration::from_secs(20));
    // Everything acknowledged so far is on the replica, so the failover loses none of it (see
    // docs/RELIABILITY.md for what an unreplicated write means).
    watched.replicated(&watched.servers[0]);

    watched.servers[0].kill();
    watched.wait_for_master(second, Duration::from_secs(30));

    let after = ids("after", 20);
    send(watched.server(second), &after);
    assert_answered_once(watched.server(second), &after, Duration::from_secs(30));
    // The answers given before the failover survived it, still once each.
    assert_answered_once(watched.server(second), &before, Duration::from_secs(5));
    assert_eq!(toolhost.pid(), pid);
    assert!(alive(pid), "toolhost exited; log:\n{}", toolhost.log());
    let log = toolhost.log();
    assert!(log.contains("redis master changed") && log.contains(&format!("127.0.0.1:{second}")), "{log}");
}

/// Sends requests, answers them, and waits until they are on the replica.
fn answer_some(watched: &Watched, count: usize) -> Vec<String> {
    let before = ids("before", count);
    send(&watched.servers[0], &before);
    assert_answered_once(&watched.servers[0], &before, Duration::from_secs(20));
    watched.replicated(&watched.servers[0]);
    before
}

/// After the switch: new requests to the new master are answered once each, by the same
/// process, which logged the change.
fn assert_followed(watched: &Watched, toolhost: &Toolhost, pid: u32, new_master: u16) {
    let after = ids("after", 20);
    send(watched.server(new_master), &after);
    assert_answered_once(watched.server(new_master), &after, Duration::from_secs(30));
    assert!(alive(pid) && toolhost.pid() == pid, "toolhost exited; log:\n{}", toolhost.log());
    let log = toolhost.log();
    assert!(
        log.contains("redis master changed") && log.contains(&format!("127.0.0.1:{new_master}")),
        "{log}"
    );
}

#[test]
fn a_graceful_sentinel_failover_moves_toolhost_to_the_promoted_replica() {
    let watched = Watched::start();
    let first = watched.servers[0].port();
    let second = watched.servers[1].port();
    let toolhost = start_toolhost(&watched);
    let pid = toolhost.pid();
    answer_some(&watched, 10);

    // The old master stays up and becomes a replica of the promoted one (the sentinels also
    // close its clients' connections when they reconfigure it).
    let reply: String = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(MASTER_NAME)
        .query(&mut watched.sentinels[0].connection())
        .expect("SENTINEL FAILOVER");
    assert_eq!(reply, "OK");
    watched.wait_for_master(second, Duration::from_secs(30));
    poll("the old master to become a replica", Duration::from_secs(30), || {
        (role(watched.server(first)).as_deref() == Some("slave")).then_some(())
    });
    assert_followed(&watched, &toolhost, pid, second);
}

#[test]
fn a_demoted_master_answering_readonly_makes_toolhost_ask_the_sentinels_again() {
    let watched = Watched::start();
    let first = watched.servers[0].port();
    let second = watched.servers[1].port();
    let toolhost = start_toolhost(&watched);
    let pid = toolhost.pid();
    answer_some(&watched, 10);

    // `FAILOVER TO` on the master itself: it hands over to its replica and turns replica, keeping
    // its clients connected, so toolhost's next write meets READONLY (or its blocked read an
    // UNBLOCKED) while the sentinels still name it; they follow once they see it report as a
    // replica, and toolhost asks them until they name the new master.
    let reply: String = redis::cmd("FAILOVER")
        .arg("TO")
        .arg("127.0.0.1")
        .arg(second)
        .query(&mut watched.server(first).connection())
        .expect("FAILOVER");
    assert_eq!(reply, "OK");
    poll("the old master to become a replica", Duration::from_secs(30), || {
        (role(watched.server(first)).as_deref() == Some("slave")).then_some(())
    });
    let readonly = redis::cmd("XADD")
        .arg(REQUESTS)
        .arg("*")
        .arg("id")
        .arg("x")
        .query::<String>(&mut watched.server(first).connection())
        .unwrap_err();
    assert_eq!(readonly.code(), Some("READONLY"), "{readonly}");
    watched.wait_for_master(second, Duration::from_secs(60));
    assert_followed(&watched, &toolhost, pid, second);
    // With the periodic check off, the first lookup came from a demoted master's answer.
    let log = toolhost.log();
    let asked = log
        .lines()
        .find(|line| line.contains("asking the sentinels for the master after a failure"))
        .unwrap_or_else(|| panic!("no lookup after a failure; log:\n{log}"));
    assert!(asked.contains("READONLY") || asked.contains("UNBLOCKED"), "{asked}");
}

#[test]
fn a_sentinel_that_hangs_does_not_keep_toolhost_from_the_new_master() {
    let mut watched = Watched::start();
    let second = watched.servers[1].port();
    let toolhost = start_toolhost(&watched);
    let pid = toolhost.pid();
    answer_some(&watched, 5);

    // The sentinel toolhost asks first stops answering but keeps accepting connections; the other
    // two still make a majority, elect a leader and promote the replica.
    watched.sentinels[0].stop();
    watched.servers[0].kill();
    watched.wait_for_master(second, Duration::from_secs(30));
    assert_followed(&watched, &toolhost, pid, second);
}

/// The Python client takes the daemon's settings names (here from the same environment) and
/// finds the master through the sentinels, before and after a failover.
#[test]
fn the_python_client_finds_the_master_through_the_sentinels_and_follows_a_failover() {
    let watched = Watched::start();
    let second = watched.servers[1].port();
    let _toolhost = start_toolhost(&watched);
    let script = r#"
import toolhost
with toolhost.Client() as client:
    print(client.call("echo", {"message": "through the sentinels"}, timeout=20))
"#;
    let (code, stdout, stderr) = toolhost_e2e::python_client(script, &env(&watched));
    assert_eq!(
        code, 0,
        "{stdout}
{stderr}"
    );
    assert!(
        stdout.contains("through the sentinels"),
        "{stdout}
{stderr}"
    );
    let reply: String = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(MASTER_NAME)
        .query(&mut watched.sentinels[0].connection())
        .expect("SENTINEL FAILOVER");
    assert_eq!(reply, "OK");
    watched.wait_for_master(second, Duration::from_secs(30));
    // Keyword arguments named as the daemon's settings, and a call after the failover.
    let script = format!(
        r#"
import toolhost
with toolhost.Client("redis://127.0.0.1:1/0", sentinels="{}", sentinel_master="{MASTER_NAME}") as client:
    print(client.call("echo", {{"message": "after the failover"}}, timeout=20))
"#,
        watched.sentinel_urls()
    );
    let (code, stdout, stderr) = toolhost_e2e::python_client(&script, &[]);
    assert_eq!(
        code, 0,
        "{stdout}
{stderr}"
    );
    assert!(
        stdout.contains("after the failover"),
        "{stdout}
{stderr}"
    );
}

#[test]
fn toolhost_call_finds_the_master_through_the_sentinels() {
    let watched = Watched::start();
    let _toolhost = start_toolhost(&watched);
    let output = Command::new(toolhost_bin())
        .args(["call", "echo", "--args", r#"{"message":"via the sentinels"}"#, "--timeout", "20s"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env(&watched))
        .output()
        .expect("run toolhost call");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "toolhost call failed: {stdout}\n{stderr}");
    assert!(stdout.contains("via the sentinels"), "{stdout}\n{stderr}");
}
