//! The least privilege of toolhost's Redis user: every command the bus sends, as a Redis ACL.
//!
//! [`commands`] lists what this crate sends, by topology: directly, inside its Lua scripts
//! (Redis checks a script's calls against the caller's ACL too), and what redis-rs sends for it
//! (`SCRIPT LOAD` after `NOSCRIPT`, `MULTI`/`EXEC` of an atomic pipeline, `CLUSTER SLOTS`, the `ROLE` check of a master the sentinels name). A test
//! reads the scripts and the sources and fails when a command is sent that is not listed.
//!
//! Deliberately left out: `CONFIG GET` (it reads every setting, `requirepass` and `masterauth`
//! included; the start-up check of `maxmemory-policy` notes a refusal and goes on), `SCAN` and
//! `KEYS` (nothing in the daemon walks the keyspace), and every `@dangerous` command.
//! [`setuser`] writes the `ACL SETUSER` line with key patterns from
//! [`crate::Keys::acl_patterns`].

use crate::Topology;

/// Every command toolhost sends on any topology, in Redis ACL syntax (`command|subcommand`).
const COMMON: &[&str] = &[
    // Connections; the start-up check reads the version. (redis-rs also sends `CLIENT SETINFO`
    // when it connects and ignores its answer: not granted, since Redis before 7.2 does not know
    // the command, so an ACL naming it could not be applied there.)
    "ping",
    "info",
    // Streams.
    "xadd",
    "xread",
    "xreadgroup",
    "xack",
    "xclaim",
    "xautoclaim",
    "xpending",
    "xdel",
    "xrevrange",
    "xgroup|create",
    "xgroup|delconsumer",
    "xinfo|groups",
    "xinfo|consumers",
    // The ledger, the registry, heartbeats and the fleet set.
    "get",
    "mget",
    "set",
    "psetex",
    "pexpire",
    "del",
    "exists",
    "type",
    "hset",
    // A cluster claim given back keeps ledger format 2's `refused` field.
    "hdel",
    // redis-rs writes a hash of several fields (the registry) with HMSET.
    "hmset",
    "hget",
    "hmget",
    "hgetall",
    "sadd",
    "smembers",
    "srem",
    "multi",
    "exec",
    // Scripts: loaded once (again after a restart of Redis), then called by digest.
    "evalsha",
    "script|load",
    "time",
];

/// The commands toolhost sends on `topology`; `selects_db` when the URL names a database other
/// than 0 (`SELECT` on every connection), `waits_for_replicas` when call records wait for
/// replicas (`[redis] replica_acks` above 0: `WAIT` after each batch of them).
pub fn commands(topology: &Topology, selects_db: bool, waits_for_replicas: bool) -> Vec<&'static str> {
    let mut res = COMMON.to_vec();
    if waits_for_replicas {
        res.push("wait");
    }
    match topology {
        Topology::Cluster { .. } => res.push("cluster|slots"),
        Topology::Sentinel(_) => res.push("role"),
        Topology::Single => {}
    }
    if selects_db {
        res.push("select");
    }
    res
}

/// The `ACL SETUSER` line for `user` with these key patterns and commands; the password is the
/// placeholder `<password>`. The user starts from nothing (`reset`), so applying the line again
/// takes away what an older line granted.
pub fn setuser(user: &str, patterns: &[String], commands: &[&str]) -> String {
    let mut res = format!("ACL SETUSER {user} reset on ><password> resetchannels resetkeys");
    for pattern in patterns {
        res.push_str(" ~");
        res.push_str(pattern);
    }
    res.push_str(" -@all");
    for command in commands {
        res.push_str(" +");
        res.push_str(command);
    }
    res
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A failed unwrap is a failed test, which is what we want.
mod tests {
    use std::path::Path;

    use super::*;

    /// Every file under `dir` whose name ends in `ext`, with its text.
    fn sources(dir: &Path, ext: &str, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, ext, out);
            } else if path.to_string_lossy().ends_with(ext) {
                out.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap()));
            }
        }
    }

    /// The quoted words after each `marker` in `text`, lower case: `redis.call('XADD'` gives
    /// `xadd`; a second quoted word in upper case is taken as a subcommand.
    fn called(text: &str, marker: &str) -> Vec<String> {
        let mut res = Vec::new();
        for (at, _) in text.match_indices(marker) {
            let rest = &text[at + marker.len()..];
            let words: Vec<&str> = rest
                .split(['\'', '"'])
                .skip(1)
                .step_by(2)
                .take(2)
                .filter(|word| !word.is_empty() && word.chars().all(|c| c.is_ascii_uppercase()))
                .collect();
            let Some(command) = words.first() else { continue };
            let has_subcommands =
                ["XGROUP", "XINFO", "CLIENT", "CLUSTER", "SCRIPT", "CONFIG", "FUNCTION", "OBJECT"]
                    .contains(command);
            let subcommand = words.get(1).filter(|sub| {
                has_subcommands
                    && (rest.starts_with(&format!("'{command}', '{sub}'"))
                        || rest.starts_with(&format!("\"{command}\", \"{sub}\""))
                        || rest.starts_with(&format!("\"{command}\").arg(\"{sub}\")")))
            });
            res.push(match subcommand {
                Some(sub) => format!("{}|{}", command.to_lowercase(), sub.to_lowercase()),
                None => command.to_lowercase(),
            });
        }
        res
    }

    fn allowed(command: &str, list: &[&str]) -> bool {
        list.contains(&command)
            || list.iter().any(|listed| listed.split('|').next() == Some(command) && listed.contains('|'))
    }

    #[test]
    fn every_command_of_the_scripts_and_the_sources_is_granted() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut scripts = Vec::new();
        sources(&root.join("scripts"), ".lua", &mut scripts);
        assert!(scripts.len() > 5, "the scripts were not found");
        let granted = commands(&Topology::Cluster { nodes: Vec::new() }, true, true);
        for (path, text) in &scripts {
            for marker in ["redis.call(", "redis.pcall("] {
                for command in called(text, marker) {
                    assert!(
                        allowed(&command, &granted),
                        "{path} calls {command}, which redis-acl does not grant"
                    );
                }
            }
        }
        let mut rust = Vec::new();
        sources(&root, ".rs", &mut rust);
        for (path, text) in &rust {
            if path.ends_with("acl.rs") {
                continue;
            }
            for command in called(text, "cmd(") {
                // SCAN serves only tests (keys_matching); nothing else is sent in the daemon.
                if command == "scan" || command == "config" {
                    continue;
                }
                assert!(
                    allowed(&command, &granted),
                    "{path} sends {command}, which redis-acl does not grant"
                );
            }
        }
    }

    #[test]
    fn the_line_starts_from_nothing_and_grants_by_topology() {
        let line = setuser("toolhost", &["a:*".to_owned()], &commands(&Topology::Single, false, false));
        assert!(line.starts_with(
            "ACL SETUSER toolhost reset on ><password> resetchannels resetkeys ~a:* -@all +ping"
        ));
        assert!(!line.contains("+select") && !line.contains("+role") && !line.contains("+cluster"));
        assert!(!line.contains("config") && !line.contains("+scan") && !line.contains("+keys"));
        assert!(!line.contains("+wait"), "WAIT is granted only where call records wait for replicas");
        assert!(commands(&Topology::Sentinel(crate::Sentinels::default()), true, false).contains(&"role"));
        assert!(commands(&Topology::Single, false, true).contains(&"wait"));
    }
}
