//! Issue 25: signed requests, tenant policy, rate and in-flight limits, and the audit stream,
//! through the real daemon and a real Redis.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use hmac::{Hmac, Mac};
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};
use sha2::Sha256;

use crate::support::{Daemon, RedisServer, answer, answers_to, payloads, request, settled, temp_dir};

const SECRET: &str = "acme-secret-0123456789";
const OTHER_SECRET: &str = "rotation-secret-98765";

/// A payload and the `sig` fields sent with it.
type Sent = (String, Vec<String>);

/// The `sig` field of `payload` under `secret`, computed here independently of the daemon.
fn sig(key_id: &str, secret: &str, payload: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(payload.as_bytes());
    let hex: String = mac.finalize().into_bytes().iter().map(|byte| format!("{byte:02x}")).collect();
    format!("v1={key_id}:{hex}")
}

/// XADDs an entry with exactly `fields`.
async fn add(connection: &mut MultiplexedConnection, fields: &[(&str, &str)]) -> String {
    let mut command = redis::cmd("XADD");
    command.arg("action-requests").arg("*");
    for (name, value) in fields {
        command.arg(*name).arg(*value);
    }
    command.query_async(connection).await.unwrap()
}

/// Every entry of the audit stream, as field maps.
async fn audit(connection: &mut MultiplexedConnection) -> Vec<HashMap<String, String>> {
    let entries: Vec<(String, HashMap<String, String>)> =
        redis::cmd("XRANGE").arg("audit:toolhost").arg("-").arg("+").query_async(connection).await.unwrap();
    entries.into_iter().map(|(_, fields)| fields).collect()
}

fn daemon(redis: &RedisServer, dir: &Path, config: &str) -> Daemon {
    let path = dir.join("toolhost.toml");
    std::fs::write(&path, config).unwrap();
    let env = [("ACME_KEY", SECRET), ("OLD_KEY", OTHER_SECRET)];
    Daemon::start_args(redis, &env, &["--config", path.to_str().unwrap()])
}

/// A destructive command tool that leaves a file behind, so a test sees whether it ran.
fn mark_tool(dir: &Path) -> String {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    format!(
        r#"
[[commands]]
name = "mark"
description = "Leave a file named after the argument."
argv = ["touch", "{{name}}"]
cwd = "{dir}"
argument_schema = {{ type = "object", properties = {{ name = {{ type = "string", pattern = "^[a-z0-9-]+$" }} }}, required = ["name"] }}
"#,
        dir = dir.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_correctly_signed_fresh_requests_run_and_every_refusal_is_answered_on_the_default_topic_and_audited()
 {
    let redis = RedisServer::start();
    let dir = temp_dir("auth-signed");
    let config = format!(
        r#"
[streams]
response_topics = ["results:*"]
max_payload_bytes = 65536

[auth]
require_signature = true
max_skew_ms = 60000

[[auth.keys]]
id = "acme-1"
secret_env = "ACME_KEY"
tenants = ["acme"]

[[auth.keys]]
id = "old"
secret_env = "OLD_KEY"
{}"#,
        mark_tool(&dir)
    );
    let daemon = daemon(&redis, &dir, &config);
    let mut connection = redis.connection().await;
    // Each call asks its answer on results:me, which only a verified request may choose.
    let envelope = |request_id: &str| {
        let mut envelope = request("mark.requested", request_id, json!({"name": request_id}));
        envelope["response_topic"] = json!("results:me");
        envelope.to_string()
    };
    let good = envelope("good");
    let with_time = |request_id: &str, time: chrono::DateTime<chrono::Utc>| {
        let mut envelope: Value = serde_json::from_str(&envelope(request_id)).unwrap();
        envelope["time"] = json!(time.to_rfc3339());
        envelope.to_string()
    };
    let globex = {
        let mut globex: Value = serde_json::from_str(&envelope("globex")).unwrap();
        globex["tenant_id"] = json!("globex");
        globex.to_string()
    };
    let hex = "ab".repeat(32);
    // (request id, the payload sent, its sig fields, what the refusal says)
    let signed = |key: &str, secret: &str, payload: String| {
        let sig = sig(key, secret, &payload);
        (payload, vec![sig])
    };
    let changed = {
        let before = envelope("changed");
        let sig = sig("acme-1", SECRET, &before);
        (before.replace("\"u-7\"", "\"u-8\""), vec![sig])
    };
    assert!(changed.0.contains("\"u-8\""), "{}", changed.0);
    let refused: Vec<(&str, Sent, &str)> = vec![
        ("unsigned", (envelope("unsigned"), vec![]), "unsigned request"),
        ("forged", signed("acme-1", "not-the-secret-at-all", envelope("forged")), "does not match"),
        ("unknown", signed("nobody", SECRET, envelope("unknown")), "unknown key id 'nobody'"),
        ("changed", changed, "does not match"),
        (
            "stale",
            signed("acme-1", SECRET, with_time("stale", chrono::Utc::now() - chrono::Duration::minutes(5))),
            "more than max_skew_ms",
        ),
        (
            "future",
            signed("acme-1", SECRET, with_time("future", chrono::Utc::now() + chrono::Duration::minutes(5))),
            "more than max_skew_ms",
        ),
        ("globex", signed("acme-1", SECRET, globex), "may not sign for tenant 'globex'"),
        (
            "truncated",
            {
                let (payload, sigs) = signed("acme-1", SECRET, envelope("truncated"));
                (payload, vec![sigs[0][..50].to_owned()])
            },
            "64 hex digits",
        ),
        ("scheme", (envelope("scheme"), vec![format!("v2=acme-1:{hex}")]), "not a v1 signature"),
        (
            "oversized",
            (envelope("oversized"), vec![format!("v1=acme-1:{}", "a".repeat(40_000))]),
            "longer than any signature",
        ),
        (
            "duplicated",
            {
                let (payload, sigs) = signed("acme-1", SECRET, envelope("duplicated"));
                (payload, vec![sigs[0].clone(), sigs[0].clone()])
            },
            "more than one sig",
        ),
    ];
    for (request_id, (payload, sigs), _) in &refused {
        let mut fields = vec![("id", *request_id), ("payload", payload.as_str())];
        fields.extend(sigs.iter().map(|sig| ("sig", sig.as_str())));
        add(&mut connection, &fields).await;
    }
    // A sig over the reader's field limit is dead-lettered like any unreadable field.
    add(&mut connection, &[("id", "huge"), ("payload", &envelope("huge")), ("sig", &"x".repeat(70_000))])
        .await;
    // The good one, signed by the acme key, and again by the other key during a rotation.
    let good_sig = sig("acme-1", SECRET, &good);
    let good_entry = [("id", "good"), ("payload", good.as_str()), ("sig", good_sig.as_str())];
    add(&mut connection, &good_entry).await;
    let rotated = envelope("rotated");
    add(
        &mut connection,
        &[("id", "rotated"), ("payload", &rotated), ("sig", &sig("old", OTHER_SECRET, &rotated))],
    )
    .await;

    for (request_id, _, why) in &refused {
        let refusal = answer(&mut connection, "action-results", request_id).await;
        assert_eq!(refusal["data"]["error_code"], "forbidden", "{request_id}: {refusal}");
        let message = refusal["data"]["error"].as_str().unwrap();
        assert!(message.contains(why), "{request_id}: {message}");
        assert_eq!(refusal["topic"], "action-results", "never the topic the payload names");
    }
    assert_eq!(answer(&mut connection, "results:me", "good").await["data"]["success"], true);
    assert_eq!(answer(&mut connection, "results:me", "rotated").await["data"]["success"], true);

    // A replayed entry, byte for byte, is not run again: the ledger knows its request id, and
    // answers the copy with the original answer (CONTRACTS, "A retry gets the original answer").
    let good_answer = answer(&mut connection, "results:me", "good").await;
    std::fs::remove_file(dir.join("good")).unwrap_or_else(|err| {
        panic!("{err}: {good_answer} {:?}", std::fs::read_dir(&dir).unwrap().collect::<Vec<_>>())
    });
    add(&mut connection, &good_entry).await;
    settled(&mut connection, "action-requests", "toolhost").await;
    assert!(!dir.join("good").exists(), "the replay ran the tool again");
    let mine = payloads(&mut connection, "results:me").await;
    let good = answers_to(&mine, "good");
    assert_eq!(good.len(), 2, "{mine:#?}");
    assert_eq!(good[0]["data"], good[1]["data"], "{mine:#?}");
    // No refused request ran, and none was answered on its own topic.
    for (request_id, _, _) in &refused {
        assert!(!dir.join(request_id).exists(), "{request_id} ran");
        assert!(answers_to(&mine, request_id).is_empty(), "{request_id} answered on results:me");
    }
    let letters = payloads(&mut connection, "dlq:toolhost").await;
    assert_eq!(letters.len(), 1, "{letters:#?}");
    assert_eq!(letters[0]["defect"]["field"], "sig");

    // No refusal is final: the unsigned request, sent again signed, runs.
    let retry = envelope("unsigned");
    add(
        &mut connection,
        &[("id", "unsigned-2"), ("payload", &retry), ("sig", &sig("acme-1", SECRET, &retry))],
    )
    .await;
    assert_eq!(answer(&mut connection, "results:me", "unsigned").await["data"]["success"], true);
    assert!(dir.join("unsigned").exists());

    // Every refusal is audited, with the key it named; the destructive calls that ran too.
    let entries = audit(&mut connection).await;
    for (request_id, _, why) in &refused {
        let found: Vec<_> = entries
            .iter()
            .filter(|entry| entry["request_id"] == *request_id && entry["decision"] == "refused")
            .collect();
        assert_eq!(found.len(), 1, "{request_id}: {entries:#?}");
        let entry = found[0];
        assert_eq!(
            (entry["decision"].as_str(), entry["door"].as_str(), entry["tool"].as_str()),
            ("refused", "requests", "mark"),
            "{entry:?}"
        );
        assert!(entry["reason"].contains(why), "{entry:?}");
        assert!(!entry["time"].is_empty());
        assert!(!entry.contains_key("arguments"), "arguments are left out unless asked for");
    }
    let by = |request_id: &str| entries.iter().find(|entry| entry["request_id"] == request_id).unwrap();
    let refusal_of = |request_id: &str| {
        entries
            .iter()
            .find(|entry| entry["request_id"] == request_id && entry["decision"] == "refused")
            .unwrap()
    };
    assert_eq!(by("forged")["principal"], "key:acme-1");
    assert_eq!(by("globex")["tenant"], "globex");
    assert_eq!(refusal_of("unsigned")["principal"], "");
    let mut allowed: Vec<&str> = entries
        .iter()
        .filter(|entry| entry["decision"] == "allowed")
        .map(|entry| entry["request_id"].as_str())
        .collect();
    allowed.sort_unstable();
    assert_eq!(allowed, ["good", "rotated", "unsigned"], "{entries:#?}");
    assert_eq!(by("rotated")["principal"], "key:old");
    // No secret anywhere: not in the audit stream, not in the log.
    let everything = format!("{entries:?}{}", daemon.log());
    for secret in [SECRET, OTHER_SECRET] {
        assert!(!everything.contains(secret), "a secret leaked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_limit_what_and_how_fast_each_tenant_calls_and_discovery_lists_what_it_may_call() {
    let redis = RedisServer::start();
    let dir = temp_dir("auth-policy");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let config = format!(
        r#"
[auth]
audit_arguments = true

[[policy]]
tenant = "acme"
allow = ["echo", "nap", "ma*"]
deny = ["mark"]
max_in_flight = 2

[[policy]]
tenant = "bursty"
allow = ["echo"]
rate = "2/s"

[[policy]]
tenant = "*"
allow = ["echo"]

[[commands]]
name = "nap"
description = "Sleep a while."
argv = ["sleep", "2"]
argument_schema = {{ type = "object", properties = {{}} }}
{}"#,
        mark_tool(&dir)
    );
    let _daemon = daemon(&redis, &dir, &config);
    let mut connection = redis.connection().await;
    let send = |tenant: &str, event: &str, request_id: &str, data: Value| {
        let mut envelope = request(event, request_id, data);
        envelope["tenant_id"] = json!(tenant);
        envelope.to_string()
    };
    let mut add_request = async |tenant: &str, event: &str, request_id: &str, data: Value| {
        let payload = send(tenant, event, request_id, data);
        add(&mut connection, &[("id", request_id), ("payload", &payload)]).await;
    };
    add_request("acme", "mark.requested", "denied", json!({"name": "denied", "password": "hunter22"})).await;
    add_request("acme", "terminal_run.requested", "unlisted", json!({"command": "true"})).await;
    add_request("globex", "nap.requested", "default-rule", json!({})).await;
    add_request("globex", "echo.requested", "default-echo", json!({"message": "hi"})).await;
    add_request("acme", "tools.discover", "discover-acme", json!({})).await;
    add_request("globex", "tools.discover", "discover-globex", json!({})).await;
    // Three naps at once: the third is over acme's in-flight limit of 2.
    for nap in ["nap-1", "nap-2", "nap-3"] {
        add_request("acme", "nap.requested", nap, json!({})).await;
    }
    // Five calls at once at 2/s: the burst of 2 runs, the rest wait for their turn.
    for n in 0..5 {
        add_request("bursty", "echo.requested", &format!("burst-{n}"), json!({"message": "x"})).await;
    }
    let mut connection = redis.connection().await;
    let code = |answer: &Value| answer["data"]["error_code"].as_str().unwrap_or("ok").to_owned();

    let denied = answer(&mut connection, "action-results", "denied").await;
    assert_eq!(code(&denied), "forbidden");
    assert!(denied["data"]["error"].as_str().unwrap().contains("'mark' is denied by the tenant's policy"));
    let unlisted = answer(&mut connection, "action-results", "unlisted").await;
    assert_eq!(code(&unlisted), "forbidden");
    assert!(unlisted["data"]["error"].as_str().unwrap().contains("not allowed"));
    assert_eq!(code(&answer(&mut connection, "action-results", "default-rule").await), "forbidden");
    assert_eq!(code(&answer(&mut connection, "action-results", "default-echo").await), "ok");
    assert!(!dir.join("denied").exists());

    let listed = |answer: &Value| -> Vec<String> {
        answer["data"]["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let acme = answer(&mut connection, "action-results", "discover-acme").await;
    assert_eq!(listed(&acme), ["echo", "nap"], "deny wins over the allow glob ma*");
    let globex = answer(&mut connection, "action-results", "discover-globex").await;
    assert_eq!(listed(&globex), ["echo"]);

    let naps: Vec<String> = {
        let mut codes = Vec::new();
        for nap in ["nap-1", "nap-2", "nap-3"] {
            codes.push(code(&answer(&mut connection, "action-results", nap).await));
        }
        codes
    };
    assert_eq!(naps.iter().filter(|code| *code == "ok").count(), 2, "{naps:?}");
    let over = ["nap-1", "nap-2", "nap-3"]
        .iter()
        .zip(&naps)
        .find(|(_, code)| *code == "overloaded")
        .map(|(id, _)| *id)
        .unwrap_or_else(|| panic!("no nap was refused: {naps:?}"));
    let refusal = answer(&mut connection, "action-results", over).await;
    assert!(refusal["data"]["error"].as_str().unwrap().contains("calls in flight"), "{refusal}");
    assert!(refusal["data"]["details"]["retry_after_ms"].as_u64().unwrap() > 0);

    let mut bursts = Vec::new();
    for n in 0..5 {
        bursts.push(answer(&mut connection, "action-results", &format!("burst-{n}")).await);
    }
    let ran = bursts.iter().filter(|answer| code(answer) == "ok").count();
    // The five arrive within well under a second: the burst of two, perhaps one refilled token.
    assert!((2..=3).contains(&ran), "{bursts:#?}");
    for limited in bursts.iter().filter(|answer| code(answer) != "ok") {
        assert_eq!(code(limited), "overloaded");
        let retry_after = limited["data"]["details"]["retry_after_ms"].as_u64().unwrap();
        assert!((1..=500).contains(&retry_after), "{limited}");
    }
    // The limit is a rate, not a ban: after a second, the tenant calls again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let payload = send("bursty", "echo.requested", "burst-later", json!({"message": "x"}));
    add(&mut connection, &[("id", "burst-later"), ("payload", &payload)]).await;
    assert_eq!(code(&answer(&mut connection, "action-results", "burst-later").await), "ok");

    settled(&mut connection, "action-requests", "toolhost").await;
    let entries = audit(&mut connection).await;
    let denied = entries.iter().find(|entry| entry["request_id"] == "denied").unwrap();
    assert_eq!((denied["decision"].as_str(), denied["tenant"].as_str()), ("refused", "acme"));
    // Arguments, when asked for, are redacted.
    let arguments: Value = serde_json::from_str(&denied["arguments"]).unwrap();
    assert_eq!(arguments["name"], "denied");
    assert_ne!(arguments["password"], "hunter22", "{arguments}");
    let reasons: Vec<&str> = entries
        .iter()
        .filter(|entry| entry["tenant"] == "bursty")
        .map(|entry| entry["reason"].as_str())
        .collect();
    assert_eq!(reasons.len(), 5 - ran, "{entries:#?}");
    assert!(reasons.iter().all(|reason| reason.contains("over its rate limit")));
    // The naps are destructive (a command's default): each one that ran is audited as allowed.
    let allowed =
        entries.iter().filter(|entry| entry["decision"] == "allowed" && entry["tool"] == "nap").count();
    assert_eq!(allowed, 2, "{entries:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_limits_hold_one_rate_across_replicas() {
    let redis = RedisServer::start();
    let dir = temp_dir("auth-shared");
    let config = r#"
[auth]
shared_limits = true

[[policy]]
tenant = "*"
rate = "3/m"
burst = 3
"#;
    let _first = daemon(&redis, &dir, config);
    let _second = daemon(&redis, &dir, config);
    let mut connection = redis.connection().await;
    for n in 0..8 {
        let request_id = format!("shared-{n}");
        let payload = request("echo.requested", &request_id, json!({"message": "x"})).to_string();
        add(&mut connection, &[("id", &request_id), ("payload", &payload)]).await;
    }
    settled(&mut connection, "action-requests", "toolhost").await;
    let results = payloads(&mut connection, "action-results").await;
    let ok = results.iter().filter(|answer| answer["data"]["success"] == true).count();
    // One bucket of three for the whole toolbox, however the entries were shared out.
    assert_eq!(ok, 3, "{results:#?}");
    let bucket: HashMap<String, String> =
        redis::cmd("HGETALL").arg("toolhost:rate:toolhost:acme").query_async(&mut connection).await.unwrap();
    assert!(bucket.contains_key("tokens"), "{bucket:?}");
    let ttl: i64 =
        redis::cmd("PTTL").arg("toolhost:rate:toolhost:acme").query_async(&mut connection).await.unwrap();
    assert!(ttl > 0, "an idle bucket expires");
}
