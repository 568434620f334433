//! TLS to Redis with a private CA, end to end: a real `redis-server` with a TLS port and
//! certificates the test makes, and the built binary pointed at it with `[redis] ca_file` (and a
//! client certificate for mutual TLS), on one server, a one-node cluster and a master found
//! through a TLS sentinel. A server whose certificate is not trusted, or one that refuses
//! toolhost's client certificate, stops start-up at once with a message that says so.

use std::time::{Duration, Instant};

use toolhost_e2e::Toolhost;
use toolhost_e2e::tls::{Pki, TlsRedis, TlsSentinel, run_toolhost};

/// How long a start-up that must fail may take: far less than the retry loop would run.
const FAIL_FAST: Duration = Duration::from_secs(10);

/// Calls echo through `toolhost call` with `env`, asserting the answer.
fn call_echo(env: &[(&str, &str)]) {
    let (code, out) =
        run_toolhost(&["call", "echo", "--args", r#"{"message":"over tls"}"#], env, Duration::from_secs(30));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("over tls"), "{out}");
}

#[test]
fn a_private_ca_is_trusted_and_group_reads_stream_over_tls() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, "server", false);
    let url = redis.url();
    let ca = pki.file("ca.pem");
    let env = [("REDIS_URL", url.as_str()), ("TOOLHOST__REDIS__CA_FILE", ca.as_str())];
    let _daemon = Toolhost::start(&env);
    // The group reader is the streaming one: plain XREADGROUP for as many entries as it has
    // slots, never the read script (whose XREADGROUP runs in Lua, and whose blocking read asks
    // for one entry). And it is on the TLS port.
    let reads = redis.group_reads_during(|| call_echo(&env));
    assert!(reads.iter().all(|read| !read.contains(" lua]")), "{reads:#?}");
    assert!(
        reads.iter().any(|read| read.contains("\"COUNT\"") && !read.contains("\"COUNT\" \"1\"")),
        "{reads:#?}"
    );
    redis.wait_for_group_read_over_tls();
}

#[test]
fn mutual_tls_serves_with_a_client_certificate_and_stops_start_up_without_one() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, "server", true);
    let url = redis.url();
    let (ca, cert, key) = (pki.file("ca.pem"), pki.file("client.pem"), pki.file("client.key"));
    let env = [
        ("REDIS_URL", url.as_str()),
        ("TOOLHOST__REDIS__CA_FILE", ca.as_str()),
        ("TOOLHOST__REDIS__CLIENT_CERT_FILE", cert.as_str()),
        ("TOOLHOST__REDIS__CLIENT_KEY_FILE", key.as_str()),
    ];
    let _daemon = Toolhost::start(&env);
    call_echo(&env);

    let started = Instant::now();
    let (code, out) = run_toolhost(&["serve"], &env[..2], FAIL_FAST * 2);
    assert_eq!(code, Some(1), "{out}");
    assert!(started.elapsed() < FAIL_FAST, "took {:?}", started.elapsed());
    assert!(out.contains("TLS handshake failed") && out.contains("client_cert_file"), "{out}");
}

#[test]
fn an_untrusted_server_certificate_stops_start_up_at_once_and_says_why() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, "rogue-server", false);
    let url = redis.url();
    let ca = pki.file("ca.pem");
    for env in [
        vec![("REDIS_URL", url.as_str()), ("TOOLHOST__REDIS__CA_FILE", ca.as_str())],
        // Without a CA file the Mozilla roots are trusted, and they do not know this CA either.
        vec![("REDIS_URL", url.as_str())],
    ] {
        let started = Instant::now();
        let (code, out) = run_toolhost(&["serve"], &env, FAIL_FAST * 2);
        assert_eq!(code, Some(1), "{out}");
        assert!(started.elapsed() < FAIL_FAST, "took {:?}", started.elapsed());
        assert!(out.contains("UnknownIssuer") && out.contains("set [redis] ca_file"), "{out}");
        assert!(out.contains(&format!("cannot reach {url}")), "{out}");
        // The client commands say the same.
        let (code, out) = run_toolhost(&["call", "echo"], &env, FAIL_FAST * 2);
        assert_ne!(code, Some(0), "{out}");
        assert!(out.contains("UnknownIssuer"), "{out}");
    }
}

#[test]
fn insecure_skips_verification_for_every_connection_the_streaming_reader_included() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, "rogue-server", false);
    let url = format!("{}#insecure", redis.url());
    let env = [("REDIS_URL", url.as_str())];
    let _daemon = Toolhost::start(&env);
    call_echo(&env);
    redis.wait_for_group_read_over_tls();
}

#[test]
fn bad_tls_files_are_configuration_errors_naming_the_key() {
    let pki = Pki::new();
    let not_pem = pki.file("ca.ext");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let missing = pki.file("missing.pem");
    let cert = pki.file("client.pem");
    let cases: [(Vec<(&str, &str)>, &str); 4] = [
        (
            vec![("REDIS_URL", "rediss://127.0.0.1:1"), ("TOOLHOST__REDIS__CA_FILE", not_pem.as_str())],
            "redis.ca_file",
        ),
        (
            vec![("REDIS_URL", "rediss://127.0.0.1:1"), ("TOOLHOST__REDIS__CA_FILE", missing.as_str())],
            "cannot read",
        ),
        (
            vec![("REDIS_URL", "rediss://127.0.0.1:1"), ("TOOLHOST__REDIS__CLIENT_CERT_FILE", cert.as_str())],
            "set both or neither",
        ),
        (
            vec![("REDIS_URL", "redis://127.0.0.1:1"), ("TOOLHOST__REDIS__CA_FILE", cert.as_str())],
            "rediss://",
        ),
    ];
    for (env, expected) in cases {
        let (code, out) = run_toolhost(&["check-config"], &env, Duration::from_secs(20));
        assert_eq!(code, Some(64), "{env:?}: {out}");
        assert!(out.contains(expected), "{env:?}: {out}");
    }
}

#[test]
fn a_master_found_through_tls_sentinels_is_reached_with_the_private_ca() {
    let pki = Pki::new();
    let master = TlsRedis::start(&pki, "server", false);
    let sentinel = TlsSentinel::start(&pki, master.tls_port);
    let sentinels = sentinel.url();
    let ca = pki.file("ca.pem");
    let env = [
        // With sentinels the URL gives only credentials, database and TLS.
        ("REDIS_URL", "rediss://ignored:1"),
        ("TOOLHOST__REDIS__SENTINELS", sentinels.as_str()),
        ("TOOLHOST__REDIS__CA_FILE", ca.as_str()),
    ];
    let daemon = Toolhost::start(&env);
    call_echo(&env);
    master.wait_for_group_read_over_tls();
    assert!(daemon.log().contains("redis master found through the sentinels"), "{}", daemon.log());
}

#[test]
fn a_tls_cluster_is_reached_with_the_private_ca() {
    let pki = Pki::new();
    let node = TlsRedis::start_cluster(&pki);
    let nodes = format!("127.0.0.1:{}", node.tls_port);
    let ca = pki.file("ca.pem");
    let env = [
        // Bare nodes take the URL's scheme: TLS.
        ("REDIS_URL", "rediss://127.0.0.1:1"),
        ("TOOLHOST__REDIS__CLUSTER_NODES", nodes.as_str()),
        ("TOOLHOST__REDIS__CA_FILE", ca.as_str()),
    ];
    let _daemon = Toolhost::start(&env);
    call_echo(&env);
    node.wait_for_group_read_over_tls();
}

#[test]
fn an_untrusted_cluster_or_sentinel_stops_start_up_at_once_too() {
    let pki = Pki::new();
    let node = TlsRedis::start_cluster(&pki);
    let nodes = format!("127.0.0.1:{}", node.tls_port);
    let master = TlsRedis::start(&pki, "server", false);
    let sentinel = TlsSentinel::start(&pki, master.tls_port);
    let sentinels = sentinel.url();
    // No ca_file: the Mozilla roots do not know the test CA.
    for env in [
        [("REDIS_URL", "rediss://127.0.0.1:1"), ("TOOLHOST__REDIS__CLUSTER_NODES", nodes.as_str())],
        [("REDIS_URL", "rediss://127.0.0.1:1"), ("TOOLHOST__REDIS__SENTINELS", sentinels.as_str())],
    ] {
        let started = Instant::now();
        let (code, out) = run_toolhost(&["serve"], &env, FAIL_FAST * 2);
        assert_eq!(code, Some(1), "{env:?}: {out}");
        assert!(started.elapsed() < FAIL_FAST, "took {:?}", started.elapsed());
        assert!(out.contains("UnknownIssuer") && out.contains("set [redis] ca_file"), "{env:?}: {out}");
    }
}
