//! `[redis]`: where Redis is (one server, a Cluster or the master Sentinel names), its TLS files,
//! and how it is printed with its secrets masked.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolhost_settings::{mask_secret, mask_url};

/// The most replicas `[redis] replica_acks` may ask for: more than any deployment runs per
/// master, so a larger value is a typo (`WAIT` would time out on every call).
const MAX_REPLICA_ACKS: u32 = 16;
/// The longest `[redis] replica_ack_timeout_ms`: a call waits this long before it runs.
const MAX_REPLICA_ACK_TIMEOUT_MS: u64 = 60_000;

/// `[redis]`
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct RedisSection {
    pub url: String,
    /// Seed nodes of a Redis Cluster; non-empty means cluster mode (`url` then only lends its
    /// scheme, credentials and database to nodes written bare).
    #[serde(default)]
    pub cluster_nodes: Vec<String>,
    pub key_prefix: String,
    pub response_timeout_ms: u64,
    /// Sentinel URLs; when any is set, the master is found through them and `url` gives only its
    /// credentials, database and TLS.
    pub sentinels: Vec<String>,
    pub sentinel_master: String,
    /// For the sentinels whose URL names none; empty: none.
    pub sentinel_username: String,
    pub sentinel_password: String,
    /// How often the sentinels are asked for the master when nothing fails; 0: only on failures.
    pub sentinel_check_ms: u64,
    /// PEM file of the CA that signed the servers' certificates, for every `rediss://`
    /// connection; empty: the Mozilla roots.
    pub ca_file: String,
    /// PEM files of the client certificate and its key, for mutual TLS; empty: none.
    pub client_cert_file: String,
    pub client_key_file: String,
    /// How many replicas must acknowledge a call record before its tool runs (`WAIT`); 0: none.
    pub replica_acks: u32,
    /// How long they are waited for before the call is answered `overloaded`.
    pub replica_ack_timeout_ms: u64,
}

/// Masks the passwords, so a configuration printed with `{:?}` leaks nothing.
impl std::fmt::Debug for RedisSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sentinels: Vec<String> = self.sentinels.iter().map(|url| mask_url(url)).collect();
        f.debug_struct("RedisSection")
            .field("url", &mask_url(&self.url))
            .field("cluster_nodes", &self.cluster_nodes.iter().map(|node| mask_url(node)).collect::<Vec<_>>())
            .field("key_prefix", &self.key_prefix)
            .field("response_timeout_ms", &self.response_timeout_ms)
            .field("sentinels", &sentinels)
            .field("sentinel_master", &self.sentinel_master)
            .field("sentinel_username", &self.sentinel_username)
            .field("sentinel_password", &mask_secret(&self.sentinel_password))
            .field("sentinel_check_ms", &self.sentinel_check_ms)
            .field("ca_file", &self.ca_file)
            .field("client_cert_file", &self.client_cert_file)
            .field("client_key_file", &self.client_key_file)
            .field("replica_acks", &self.replica_acks)
            .field("replica_ack_timeout_ms", &self.replica_ack_timeout_ms)
            .finish()
    }
}

impl RedisSection {
    /// Where Redis is, for logs and messages, passwords masked: the URL, the cluster's nodes, or
    /// the sentinels and the master's name.
    pub fn describe(&self) -> String {
        if !self.cluster_nodes.is_empty() {
            let nodes: Vec<String> = self.cluster_nodes.iter().map(|node| mask_url(node)).collect();
            format!("cluster {}", nodes.join(","))
        } else if self.sentinels.is_empty() {
            mask_url(&self.url)
        } else {
            let sentinels: Vec<String> = self.sentinels.iter().map(|url| mask_url(url)).collect();
            format!("master {} via sentinels {}", self.sentinel_master, sentinels.join(","))
        }
    }

    /// Trims the lists: `TOOLHOST__REDIS__SENTINELS=""` (an unset compose variable) means no
    /// Sentinel, and `TOOLHOST__REDIS__CLUSTER_NODES=""` no cluster; items are trimmed
    /// (`"a:1, b:2"`).
    pub(super) fn normalize(&mut self) {
        self.sentinels =
            self.sentinels.iter().map(|url| url.trim().to_owned()).filter(|url| !url.is_empty()).collect();
        self.cluster_nodes = self
            .cluster_nodes
            .iter()
            .map(|node| node.trim().to_owned())
            .filter(|node| !node.is_empty())
            .collect();
    }

    /// Every bad key of the section but its TLS files ([`RedisSection::tls`]).
    pub(super) fn validate(&self, bad: &mut impl FnMut(&str, &str)) {
        if redis::parse_redis_url(&self.url).is_none() && !self.url.starts_with("unix://") {
            bad("redis.url", "expected a redis://, rediss:// or unix:// URL");
        }
        if !self.cluster_nodes.is_empty() {
            for (index, node) in self.cluster_nodes.iter().enumerate() {
                if !node.contains("://") && (node.contains('@') || node.contains('/')) {
                    bad(
                        &format!("redis.cluster_nodes[{index}]"),
                        &format!(
                            "'{}' is not host:port: write a node with credentials or a database as a redis:// or \
                             rediss:// URL (or give them in redis.url)",
                            mask_url(node)
                        ),
                    );
                } else if !valid_cluster_node(node) {
                    bad(
                        &format!("redis.cluster_nodes[{index}]"),
                        &format!(
                            "expected host:port or a redis:// or rediss:// URL, got '{}'",
                            mask_url(node)
                        ),
                    );
                }
            }
            if let Some(problem) = toolhost_bus::Keys::cluster_prefix_problem(&self.key_prefix) {
                bad("redis.key_prefix", &problem);
            }
            // A cluster has database 0 only; `url` lends its database to bare nodes.
            let database = |url: &str| {
                redis::parse_redis_url(url)
                    .map(|url| url.path().trim_matches('/').to_owned())
                    .filter(|db| !db.is_empty() && db != "0")
            };
            if let Some(db) = database(&self.url) {
                bad("redis.url", &format!("names database {db}, but a Redis Cluster has database 0 only"));
            }
        }
        if !self.cluster_nodes.is_empty() && !self.sentinels.is_empty() {
            bad(
                "redis.sentinels",
                "a Redis Cluster is not watched by Sentinel: set redis.cluster_nodes or redis.sentinels, not both",
            );
        }
        for (index, url) in self.sentinels.iter().enumerate() {
            let key = format!("redis.sentinels[{index}]");
            match redis::parse_redis_url(url) {
                None => bad(&key, "expected a redis:// or rediss:// URL of a sentinel"),
                Some(parsed) if !matches!(parsed.scheme(), "redis" | "rediss") => bad(
                    &key,
                    &format!(
                        "sentinels are reached over TCP: expected a redis:// or rediss:// URL, not {}://",
                        parsed.scheme()
                    ),
                ),
                // Sentinels have no databases: redis-rs would send SELECT, which they refuse.
                Some(parsed) if !matches!(parsed.path(), "" | "/" | "/0") => {
                    bad(&key, "a sentinel URL names no database (no /<db>)")
                }
                Some(_) => {}
            }
        }
        if !self.sentinels.is_empty() {
            if self.url.starts_with("unix://") {
                bad(
                    "redis.url",
                    "with redis.sentinels the master is reached over TCP: expected redis:// or rediss://",
                );
            }
            if self.sentinel_master.is_empty() || self.sentinel_master.chars().any(char::is_whitespace) {
                bad("redis.sentinel_master", "must be non-empty and without spaces");
            }
        }
        if self.replica_acks > MAX_REPLICA_ACKS {
            bad(
                "redis.replica_acks",
                &format!("must be between 0 and {MAX_REPLICA_ACKS} (replicas per master)"),
            );
        }
        if !(1..=MAX_REPLICA_ACK_TIMEOUT_MS).contains(&self.replica_ack_timeout_ms) {
            bad(
                "redis.replica_ack_timeout_ms",
                &format!("must be between 1 and {MAX_REPLICA_ACK_TIMEOUT_MS} (WAIT takes 0 as for ever)"),
            );
        }
    }

    /// The TLS files, read and checked; every problem goes to `bad`, and then the settings are
    /// left empty (the configuration is refused anyway).
    pub(super) fn tls(&self, bad: &mut impl FnMut(&str, &str)) -> toolhost_bus::Tls {
        tls_of(self, bad)
    }

    /// The topology: a cluster when `cluster_nodes` is set, the master the sentinels name when
    /// `sentinels` is, else one server.
    pub(super) fn topology(&self) -> toolhost_bus::Topology {
        if !self.cluster_nodes.is_empty() {
            return toolhost_bus::Topology::Cluster { nodes: self.cluster_nodes.clone() };
        }
        if self.sentinels.is_empty() {
            return toolhost_bus::Topology::Single;
        }
        let given = |value: &str| (!value.is_empty()).then(|| value.to_owned());
        toolhost_bus::Topology::Sentinel(toolhost_bus::Sentinels {
            urls: self.sentinels.clone(),
            master_name: self.sentinel_master.clone(),
            username: given(&self.sentinel_username),
            password: given(&self.sentinel_password),
            check_interval: (self.sentinel_check_ms > 0)
                .then(|| Duration::from_millis(self.sentinel_check_ms)),
        })
    }

    /// The secrets of the URLs: the password of the Redis URL and of every sentinel URL and
    /// cluster node (or the whole user information when it has no `:`), a `pass`/`password`
    /// query parameter, and `sentinel_password`, as written.
    pub(super) fn secrets(&self) -> Vec<String> {
        let mut res = Vec::new();
        res.push(self.sentinel_password.clone());
        for url in std::iter::once(&self.url).chain(&self.sentinels).chain(&self.cluster_nodes) {
            if let Some(scheme_end) = url.find("://") {
                let rest = &url[scheme_end + 3..];
                if let Some(at) = rest.rfind('@') {
                    let userinfo = &rest[..at];
                    res.push(userinfo.split_once(':').map_or(userinfo, |(_, password)| password).to_owned());
                }
            }
            if let Some((_, query)) = url.split_once('?') {
                for pair in query.split('&') {
                    if let Some(("pass" | "password", value)) = pair.split_once('=') {
                        res.push(value.to_owned());
                    }
                }
            }
        }
        res
    }

    /// Where Redis is, for messages about its failures.
    pub fn place(&self) -> crate::outage::RedisPlace {
        let master = (!self.sentinels.is_empty()).then(|| self.sentinel_master.clone());
        crate::outage::RedisPlace::new(self.describe(), master)
    }
}

/// The TLS files of `[redis]`, read and checked; every problem goes to `bad`, and then the
/// settings are left empty (the configuration is refused anyway).
fn tls_of(redis: &RedisSection, bad: &mut impl FnMut(&str, &str)) -> toolhost_bus::Tls {
    let mut read = |key: &str, path: &str| -> Option<Vec<u8>> {
        if path.is_empty() {
            return None;
        }
        std::fs::read(path).map_err(|err| bad(key, &format!("cannot read {path}: {err}"))).ok()
    };
    let ca = read("redis.ca_file", &redis.ca_file);
    let cert = read("redis.client_cert_file", &redis.client_cert_file);
    let key = read("redis.client_key_file", &redis.client_key_file);
    if redis.client_cert_file.is_empty() != redis.client_key_file.is_empty() {
        bad("redis.client_key_file", "client_cert_file and client_key_file go together: set both or neither");
        return toolhost_bus::Tls::default();
    }
    let set = [&redis.ca_file, &redis.client_cert_file].iter().any(|path| !path.is_empty());
    let tls_url = |url: &str| url.starts_with("rediss://");
    let uses_tls = tls_url(&redis.url)
        || redis.cluster_nodes.iter().any(|node| tls_url(node))
        || redis.sentinels.iter().any(|url| tls_url(url));
    if set && !uses_tls {
        bad(
            if redis.ca_file.is_empty() { "redis.client_cert_file" } else { "redis.ca_file" },
            "is set, but no connection uses TLS: write redis.url (or the sentinels or cluster nodes) as rediss://",
        );
        return toolhost_bus::Tls::default();
    }
    let ca_checked = match toolhost_bus::Tls::new(ca.clone(), None) {
        Ok(_) => true,
        Err(message) => {
            bad("redis.ca_file", &format!("{}: {message}", redis.ca_file));
            false
        }
    };
    let identity = cert.zip(key);
    match toolhost_bus::Tls::new(ca, identity) {
        Ok(tls) => tls,
        Err(message) => {
            if ca_checked {
                bad(
                    "redis.client_cert_file",
                    &format!("{} with {}: {message}", redis.client_cert_file, redis.client_key_file),
                );
            }
            toolhost_bus::Tls::default()
        }
    }
}

/// Whether `node` names a cluster node: `host:port` (no credentials, no database: those need a
/// URL), or a `redis://` or `rediss://` URL.
pub(super) fn valid_cluster_node(node: &str) -> bool {
    if node.contains("://") {
        return redis::parse_redis_url(node).is_some_and(|url| {
            matches!(url.scheme(), "redis" | "rediss") && url.host_str().is_some_and(|host| !host.is_empty())
        });
    }
    !node.contains(['@', '/'])
        && node.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}
