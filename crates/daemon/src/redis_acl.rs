//! `toolhost redis-acl`: the `ACL SETUSER` line of the least privilege the configuration needs.
//!
//! The key patterns come from [`toolhost_bus::Keys::acl_patterns`] (the streams, response
//! topics, chat, dead letters, audit and toolhost's own keys under the configured prefix), the
//! commands from [`toolhost_bus::acl::commands`] (by topology; `SELECT` only for a database other
//! than 0, `WAIT` only with `[redis] replica_acks` above 0). The password is the placeholder `<password>`: the operator puts the real one in.

use redis::IntoConnectionInfo as _;

use crate::config::Config;

/// The user name when none is given.
pub const DEFAULT_USER: &str = "toolhost";

/// The line for `user` under `config`.
///
/// # Errors
/// `user` is empty or holds white space or characters an ACL rule would read differently.
pub fn setuser_line(config: &Config, user: &str) -> Result<String, String> {
    if user.is_empty()
        || user.chars().any(|char| char.is_whitespace() || matches!(char, '>' | '<' | '~' | '"' | '\''))
    {
        return Err(format!("'{user}' cannot be a Redis user name: use letters, digits, '-', '_' or ':'"));
    }
    let raw = &config.raw;
    let names = toolhost_bus::AclNames {
        toolbox_id: &raw.daemon.toolbox_id,
        agent_name: &raw.daemon.agent_name,
        requests: &raw.streams.requests,
        results: &raw.streams.results,
        response_topics: &raw.streams.response_topics,
        every_dead_letter: raw.doors.console.listen_addr().is_some(),
    };
    let patterns = config.keys().acl_patterns(&names);
    let selects_db =
        raw.redis.url.as_str().into_connection_info().is_ok_and(|info| info.redis_settings().db() != 0);
    let options = config.redis_options();
    let commands = toolhost_bus::acl::commands(&options.topology, selects_db, options.replica_acks > 0);
    Ok(toolhost_bus::acl::setuser(user, &patterns, &commands))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A failed unwrap is a failed test, which is what we want.
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(vars: &[(&str, &str)]) -> Config {
        let vars: HashMap<String, String> =
            vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Config::load(None, &vars).unwrap()
    }

    #[test]
    fn the_line_follows_the_prefix_the_streams_and_the_topology() {
        let line = setuser_line(
            &config(&[
                ("TOOLHOST__REDIS__KEY_PREFIX", "prod:"),
                ("TOOLHOST__DAEMON__TOOLBOX_ID", "box*1"),
                ("REDIS_URL", "redis://127.0.0.1:6379/2"),
            ]),
            "agents",
        )
        .unwrap();
        assert!(line.starts_with("ACL SETUSER agents reset on ><password> "), "{line}");
        for expected in [
            " ~prod:action-requests ",
            " ~prod:action-results ",
            " ~prod:results:* ",
            " ~prod:chat:* ",
            " ~prod:dlq:box\\*1 ",
            " ~prod:audit:* ",
            " ~prod:calls:* ",
            " ~prod:toolhost:ledger:* ",
            " ~prod:toolhost:fleet ",
            " +select",
            " +evalsha ",
        ] {
            assert!(line.contains(expected), "{expected} missing from {line}");
        }
        assert!(!line.contains("+cluster") && !line.contains("+config"), "{line}");
        let cluster =
            setuser_line(&config(&[("TOOLHOST__REDIS__CLUSTER_NODES", "127.0.0.1:7000")]), "t").unwrap();
        assert!(cluster.contains(" ~{*}answer:* ") && cluster.contains(" +cluster|slots"), "{cluster}");
        assert!(!cluster.contains("+select"), "{cluster}");
        assert!(setuser_line(&config(&[]), "two words").is_err());
        assert!(!setuser_line(&config(&[]), "t").unwrap().contains("+wait"));
        let waits = setuser_line(&config(&[("TOOLHOST__REDIS__REPLICA_ACKS", "1")]), "t").unwrap();
        assert!(waits.contains(" +wait"), "{waits}");
    }

    #[test]
    fn a_console_reaches_every_toolboxs_dead_letters() {
        let plain = setuser_line(&config(&[]), "toolhost").unwrap();
        assert!(plain.contains(" ~dlq:toolhost ") && !plain.contains("~dlq:*"), "{plain}");
        let console =
            setuser_line(&config(&[("TOOLHOST__CONSOLE__LISTEN", "127.0.0.1:8930")]), "toolhost").unwrap();
        assert!(console.contains(" ~dlq:* "), "{console}");
    }
}
