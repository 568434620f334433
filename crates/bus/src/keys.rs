//! Every Redis key and stream name toolhost uses, built in one place.
//!
//! A configured prefix (default none) is put in front of every key, topics included.
//!
//! On a Redis Cluster ([`Keys::for_cluster`]) the ledger keys of a request carry a hash tag that
//! puts them in the slot of their requests stream, so the ledger's scripts can run there:
//! `<prefix>{<tag>}toolhost:ledger:<stream>:...`. Every other name is the same as on one server.

use crate::slots;

/// Builds key and topic names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
    cluster: bool,
}

impl Keys {
    /// Keys with `prefix` in front of every name (`""` for none).
    pub fn new(prefix: impl Into<String>) -> Keys {
        Keys { prefix: prefix.into(), cluster: false }
    }

    /// Keys for a Redis Cluster: as [`Keys::new`], with the ledger keys of a stream's requests
    /// placed in the stream's slot.
    pub fn for_cluster(prefix: impl Into<String>) -> Keys {
        Keys { prefix: prefix.into(), cluster: true }
    }

    /// Why `prefix` cannot be used on a Redis Cluster, if it cannot: it must hold no braces, or
    /// be a hash tag itself (`{name}` then text without braces), which puts every key in one slot.
    pub fn cluster_prefix_problem(prefix: &str) -> Option<String> {
        (!slots::prefix_is_valid(prefix)).then(|| {
            format!(
                "'{prefix}' cannot be used on a Redis Cluster: use no braces, or one hash tag at its start \
                 (e.g. \"{{toolhost}}:\", which keeps every key in one slot)"
            )
        })
    }

    /// Whether the names are a cluster's.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// A ledger key of `stream` (bare name): `toolhost:ledger:<stream>:<kind>:<id>` under the
    /// prefix, in the stream's slot on a cluster. Built by appending: three of these are made per
    /// request, and `format!` cost more than the rest of the key handling.
    fn ledger(&self, stream: &str, kind: &str, id: &str) -> String {
        let parts = ["toolhost:ledger:", stream, ":", kind, ":", id];
        if self.cluster {
            let at = slots::slot(self.topic(stream).as_bytes());
            return slots::place(&self.prefix, at, "", &parts.concat());
        }
        let mut key =
            String::with_capacity(self.prefix.len() + parts.iter().map(|part| part.len()).sum::<usize>());
        key.push_str(&self.prefix);
        for part in parts {
            key.push_str(part);
        }
        key
    }

    /// The configured prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A topic (stream) by its bare name, e.g. `action-requests`.
    pub fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The dead-letter topic of a toolbox or agent: `dlq:<name>`.
    pub fn dead_letters(&self, name: &str) -> String {
        format!("{}dlq:{name}", self.prefix)
    }

    /// A chat topic: `chat:<name>` (a conversation id or an agent name).
    pub fn chat(&self, name: &str) -> String {
        format!("{}chat:{name}", self.prefix)
    }

    /// A conversation's progress topic: `stream:<conversation_id>`.
    pub fn conversation_stream(&self, conversation_id: &str) -> String {
        format!("{}stream:{conversation_id}", self.prefix)
    }

    /// Marks a request of `stream` (its bare name) as answered for good, for the idempotency
    /// window. The ledger is the stream's, not a toolbox's: every toolbox reading the stream
    /// shares it, so a request is answered once across the fleet.
    ///
    /// On a cluster this is the request's claim in the stream's slot (a hash: the response topic
    /// that gets the answer, and whether it was published); the answered mark itself lives next
    /// to the response topic (see `docs/CONTRACTS.md`).
    pub fn answered(&self, stream: &str, request_id: &str) -> String {
        self.ledger(stream, "answered", request_id)
    }

    /// The answered mark of a request of `stream` (its bare name) whose final answer goes to
    /// `topic` (a full key). On a cluster it lives next to that topic, in its slot, apart from the
    /// request's claim ([`Keys::answered`]); on one server it is [`Keys::answered`] itself.
    /// `toolhost dlq replay` deletes it, so a replayed request is answered again.
    pub fn answered_mark(&self, stream: &str, request_id: &str, topic: &str) -> String {
        let claim = self.answered(stream, request_id);
        if !self.cluster {
            return claim;
        }
        let tail = slots::tail(&self.prefix, &claim);
        slots::place(&self.prefix, slots::slot(topic.as_bytes()), slots::ROLE_ANSWER, tail)
    }

    /// Marks one entry of `stream` as answered by a refusal (an answer that is not final), so no
    /// other toolbox reading the stream answers the same entry again.
    pub fn answered_entry(&self, stream: &str, entry_id: &str) -> String {
        self.ledger(stream, "entry", entry_id)
    }

    /// The mark of the move of entry `entry_id` of the shard `from` (bare name) to its home
    /// shard `stream` (bare name), in the home shard's slot on a cluster.
    pub fn moved(&self, stream: &str, from: &str, entry_id: &str) -> String {
        self.ledger(stream, "moved", &format!("{from}:{entry_id}"))
    }

    /// The record of a call in progress: owner, lease and entry.
    pub fn call(&self, stream: &str, request_id: &str) -> String {
        self.ledger(stream, "call", request_id)
    }

    /// The hash of a toolbox's tool descriptions, one field per tool.
    pub fn registry(&self, toolbox_id: &str) -> String {
        format!("{}toolhost:registry:{toolbox_id}", self.prefix)
    }

    /// The hash of a toolbox's hosted MCP servers' resources, resource templates and prompts:
    /// fields `resource:<uri>`, `template:<uriTemplate>` and `prompt:<name>`, each with its MCP
    /// object as JSON.
    pub fn catalog(&self, toolbox_id: &str) -> String {
        format!("{}toolhost:catalog:{toolbox_id}", self.prefix)
    }

    /// The fleet stream of hosted MCP servers' resource updates (`{"uri", "toolbox_id",
    /// "source"}` payloads), which every MCP door reads to relay
    /// `notifications/resources/updated` to its subscribed clients. Capped.
    pub fn resource_updates(&self) -> String {
        format!("{}toolhost:mcp:resource-updated", self.prefix)
    }

    /// A replica's heartbeat, expiring unless refreshed.
    pub fn heartbeat(&self, toolbox_id: &str, consumer: &str) -> String {
        format!("{}toolhost:heartbeat:{toolbox_id}:{consumer}", self.prefix)
    }

    /// The set of every heartbeat key written, so the fleet is found without walking the
    /// keyspace: a member whose key has expired is a replica that died, and is removed by the
    /// next reader.
    pub fn fleet(&self) -> String {
        format!("{}toolhost:fleet", self.prefix)
    }

    /// A replica's control stream: calls to cancel, forwarded by the replica that read the
    /// `tool.cancel`, and the replies to its own forwards. Deleted when the replica stops.
    pub fn control(&self, toolbox_id: &str, consumer: &str) -> String {
        format!("{}toolhost:control:{toolbox_id}:{consumer}", self.prefix)
    }

    /// The heartbeat key of a toolbox's replica without its consumer name, for scripts that
    /// complete it with names they find.
    pub fn heartbeat_prefix(&self, toolbox_id: &str) -> String {
        format!("{}toolhost:heartbeat:{toolbox_id}:", self.prefix)
    }

    /// The bare name of a fleet client's private response stream (`results:<client id>`), as
    /// written into a request's `response_topic`; the default response topics allow it.
    pub fn private_results(client_id: &str) -> String {
        format!("results:{client_id}")
    }

    /// The record of a durable MCP task: the call's request id, tool, answer stream and
    /// deadline, expiring with the answered mark.
    pub fn mcp_task(&self, task_id: &str) -> String {
        format!("{}toolhost:mcp:task:{task_id}", self.prefix)
    }

    /// The set of keys the MCP door seals the 2026-07-28 `requestState` with, shared by its
    /// replicas (each member `<key id>:<hex key>`).
    pub fn mcp_request_state_keys(&self) -> String {
        format!("{}toolhost:mcp:request-state-keys", self.prefix)
    }

    /// A toolbox's audit stream, `audit:<toolbox_id>`: refusals by authentication or policy,
    /// and calls of destructive tools (capped).
    pub fn audit(&self, toolbox_id: &str) -> String {
        format!("{}audit:{toolbox_id}", self.prefix)
    }

    /// A replica's recent history for the console's charts,
    /// `toolhost:history:<toolbox_id>:<consumer>`: a capped stream of one point every few
    /// seconds, expiring when the replica stops writing.
    pub fn history(&self, toolbox_id: &str, consumer: &str) -> String {
        format!("{}toolhost:history:{toolbox_id}:{consumer}", self.prefix)
    }

    /// A toolbox's call log, `calls:<toolbox_id>`: one entry per handled request, for the
    /// console (capped).
    pub fn calls(&self, toolbox_id: &str) -> String {
        format!("{}calls:{toolbox_id}", self.prefix)
    }

    /// The token bucket of a tenant's rate limit shared by a toolbox's replicas
    /// (`[auth] shared_limits`).
    pub fn rate_bucket(&self, toolbox_id: &str, tenant: &str) -> String {
        format!("{}toolhost:rate:{toolbox_id}:{tenant}", self.prefix)
    }

    /// The bare name of a durable MCP task's answer stream, where the call's progress entries
    /// and its answer are written.
    pub fn mcp_task_results(task_id: &str) -> String {
        format!("results:mcp-task:{task_id}")
    }
}

/// The bare names the key patterns of toolhost's Redis user ([`Keys::acl_patterns`]) are made
/// from: what the configuration names.
#[derive(Debug, Clone, Copy)]
pub struct AclNames<'a> {
    /// `[daemon] toolbox_id`: its dead letters.
    pub toolbox_id: &'a str,
    /// `[daemon] agent_name`: the chat door's dead letters.
    pub agent_name: &'a str,
    /// `[streams] requests`.
    pub requests: &'a str,
    /// `[streams] results`.
    pub results: &'a str,
    /// `[streams] response_topics`, glob patterns already.
    pub response_topics: &'a [String],
    /// Whether every toolbox's dead letters are reached (`dlq:*`): the console shows, replays
    /// and deletes them.
    pub every_dead_letter: bool,
}

impl Keys {
    /// The key patterns (Redis ACL `~` globs, without the `~`) of every key toolhost reads or
    /// writes under `names`: its streams and the response topics callers may name, chat
    /// inboxes and conversation streams, its dead letters, `audit:*`, `calls:*`, and its own `toolhost:`
    /// keys (ledger, registries, heartbeats, fleet set, control streams, MCP tasks, the resource updates stream); on a
    /// cluster also the ledger keys and marks placed in other slots.
    pub fn acl_patterns(&self, names: &AclNames<'_>) -> Vec<String> {
        let prefix = glob_escape(&self.prefix);
        let literal = |name: &str| format!("{prefix}{}", glob_escape(name));
        // The requests stream and its shards, `<requests>:{<tag>}` (braces are plain in ACL globs).
        let mut res = vec![
            literal(names.requests),
            format!("{}:{{*}}", literal(names.requests)),
            literal(names.results),
        ];
        res.extend(names.response_topics.iter().map(|pattern| format!("{prefix}{pattern}")));
        res.extend([
            format!("{prefix}chat:*"),
            format!("{prefix}stream:*"),
            literal(&format!("dlq:{}", names.toolbox_id)),
            literal(&format!("dlq:{}", names.agent_name)),
            if names.every_dead_letter {
                format!("{prefix}dlq:*")
            } else {
                literal(&format!("dlq:{}", names.toolbox_id))
            },
            format!("{prefix}audit:*"),
            format!("{prefix}calls:*"),
            format!("{prefix}toolhost:ledger:*"),
            format!("{prefix}toolhost:registry:*"),
            format!("{prefix}toolhost:catalog:*"),
            format!("{prefix}toolhost:heartbeat:*"),
            format!("{prefix}toolhost:history:*"),
            literal("toolhost:fleet"),
            format!("{prefix}toolhost:control:*"),
            format!("{prefix}toolhost:mcp:task:*"),
            literal("toolhost:mcp:resource-updated"),
            literal("toolhost:mcp:request-state-keys"),
        ]);
        if self.cluster {
            // Ledger keys and marks carry a hash tag after the prefix, unless the prefix is one.
            let tag = if slots::prefix_is_tag(&self.prefix) { "" } else { "{*}" };
            res.push(format!("{prefix}{tag}toolhost:ledger:*"));
            res.extend(slots::MARK_ROLES.iter().map(|role| format!("{prefix}{tag}{role}*")));
        }
        let mut seen = std::collections::HashSet::new();
        res.retain(|pattern| seen.insert(pattern.clone()));
        res
    }
}

/// `text` as a Redis glob that matches only itself.
fn glob_escape(text: &str) -> String {
    let mut res = String::with_capacity(text.len());
    for char in text.chars() {
        if matches!(char, '*' | '?' | '[' | ']' | '\\') {
            res.push('\\');
        }
        res.push(char);
    }
    res
}

/// The prefixes of toolhost's own keys. A caller never names one of these as a response topic,
/// whatever the configured patterns say: an answer published there would inject messages into an
/// agent's inbox, forge dead letters, or break the exactly-once ledger.
pub const RESERVED_TOPIC_PREFIXES: &[&str] = &["toolhost:", "dlq:", "audit:", "chat:", "stream:"];

/// The response topics callers may name, as glob patterns over bare topic names (before the key
/// prefix).
#[derive(Debug, Clone)]
pub struct ResponseTopics {
    patterns: Vec<glob::Pattern>,
    /// Bare name of the default results topic: always allowed.
    default_topic: String,
    /// Bare name of the requests topic: never allowed.
    requests_topic: String,
}

/// Why a response topic is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TopicRefusal {
    /// The topic is the empty string.
    Empty,
    /// One of toolhost's own keys, or the requests stream.
    Reserved(String),
    /// No configured pattern matches it.
    NotAllowed(String),
}

impl std::fmt::Display for TopicRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TopicRefusal::Empty => f.write_str("response_topic is empty"),
            TopicRefusal::Reserved(topic) => {
                write!(f, "response_topic '{topic}' is reserved by the tool host and cannot receive answers")
            }
            TopicRefusal::NotAllowed(topic) => write!(
                f,
                "response_topic '{topic}' matches none of the allowed response topics ([streams] response_topics)"
            ),
        }
    }
}

impl ResponseTopics {
    /// The policy for `patterns` (globs: `*`, `?`, `[...]`), with the default results topic always
    /// allowed and the requests topic never.
    ///
    /// # Errors
    /// A pattern is not a valid glob; the message names it.
    pub fn new(
        patterns: &[String],
        default_topic: &str,
        requests_topic: &str,
    ) -> Result<ResponseTopics, String> {
        let patterns = patterns
            .iter()
            .map(|pattern| glob::Pattern::new(pattern).map_err(|err| format!("'{pattern}': {err}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ResponseTopics {
            patterns,
            default_topic: default_topic.to_owned(),
            requests_topic: requests_topic.to_owned(),
        })
    }

    /// The bare default results topic.
    pub fn default_topic(&self) -> &str {
        &self.default_topic
    }

    /// Checks a caller-named bare topic.
    ///
    /// # Errors
    /// The topic is empty, reserved, or matches no pattern.
    pub fn check(&self, topic: &str) -> Result<(), TopicRefusal> {
        if topic.is_empty() {
            return Err(TopicRefusal::Empty);
        }
        // The requests stream, and its shards (`<requests>:{<tag>}`).
        let shard =
            topic.strip_prefix(self.requests_topic.as_str()).is_some_and(|rest| rest.starts_with(":{"));
        if topic == self.requests_topic
            || shard
            || RESERVED_TOPIC_PREFIXES.iter().any(|prefix| topic.starts_with(prefix))
        {
            return Err(TopicRefusal::Reserved(topic.to_owned()));
        }
        if topic == self.default_topic || self.patterns.iter().any(|pattern| pattern.matches(topic)) {
            return Ok(());
        }
        Err(TopicRefusal::NotAllowed(topic.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_topics_follow_the_patterns_and_never_reach_reserved_keys() {
        let patterns: Vec<String> = ["action-results", "action-results:*", "results:*", "*"]
            .iter()
            .map(|p| (*p).to_owned())
            .collect();
        let policy = ResponseTopics::new(&patterns[..3], "action-results", "action-requests").unwrap();
        for allowed in ["action-results", "action-results:worker-7", "results:me"] {
            assert_eq!(policy.check(allowed), Ok(()), "{allowed}");
        }
        assert_eq!(policy.check(""), Err(TopicRefusal::Empty));
        assert!(matches!(policy.check("other-tenant"), Err(TopicRefusal::NotAllowed(_))));
        // Even a pattern that matches everything leaves toolhost's own keys alone.
        let open = ResponseTopics::new(&patterns, "action-results", "action-requests").unwrap();
        for reserved in [
            "chat:ToolHost",
            "dlq:toolhost",
            "toolhost:tb:answered:r-1",
            "audit:x",
            "stream:c1",
            "action-requests",
        ] {
            assert!(matches!(open.check(reserved), Err(TopicRefusal::Reserved(_))), "{reserved}");
        }
        assert_eq!(open.check("anything"), Ok(()));
        // The configured default topic is always allowed, even when no pattern names it.
        let custom = ResponseTopics::new(&[], "my-results", "my-requests").unwrap();
        assert_eq!(custom.check("my-results"), Ok(()));
        assert!(ResponseTopics::new(&["[".to_owned()], "a", "b").is_err());
    }

    #[test]
    fn names_carry_the_prefix() {
        let keys = Keys::new("");
        assert_eq!(keys.topic("action-requests"), "action-requests");
        assert_eq!(keys.dead_letters("toolhost"), "dlq:toolhost");
        assert_eq!(keys.chat("conv1"), "chat:conv1");
        assert_eq!(keys.conversation_stream("conv1"), "stream:conv1");
        let keys = Keys::new("prod:");
        assert_eq!(keys.topic("action-requests"), "prod:action-requests");
        assert_eq!(
            keys.answered("action-requests", "r-1"),
            "prod:toolhost:ledger:action-requests:answered:r-1"
        );
        assert_eq!(
            keys.answered_entry("action-requests", "1-0"),
            "prod:toolhost:ledger:action-requests:entry:1-0"
        );
        assert_eq!(keys.call("action-requests", "r-1"), "prod:toolhost:ledger:action-requests:call:r-1");
        assert_eq!(keys.registry("tb"), "prod:toolhost:registry:tb");
        assert_eq!(keys.heartbeat("tb", "c1"), "prod:toolhost:heartbeat:tb:c1");
        assert_eq!(keys.heartbeat_prefix("tb") + "c1", keys.heartbeat("tb", "c1"));
    }

    #[test]
    fn cluster_ledger_keys_share_their_streams_slot() {
        for prefix in ["", "prod:", "{prod}:"] {
            let keys = Keys::for_cluster(prefix);
            for stream in ["action-requests", "requests:7", "a", "req{x}", "}{"] {
                let at = slots::slot(keys.topic(stream).as_bytes());
                for request_id in ["r-1", "{r}", "}{", "x{y}z", ""] {
                    for key in [
                        keys.answered(stream, request_id),
                        keys.call(stream, request_id),
                        keys.answered_entry(stream, "1-0"),
                    ] {
                        assert_eq!(slots::slot(key.as_bytes()), at, "{key}");
                        assert!(key.starts_with(prefix), "{key}");
                        // The bus reads the logical name back to place the request's other
                        // keys next to a response topic.
                        let tail = slots::tail(prefix, &key);
                        assert!(tail.starts_with(&format!("toolhost:ledger:{stream}:")), "{key} -> {tail}");
                        let elsewhere = slots::place(prefix, 42, "answer:", tail);
                        if !prefix.starts_with('{') {
                            assert_eq!(slots::slot(elsewhere.as_bytes()), 42, "{elsewhere}");
                        }
                    }
                }
            }
            assert_eq!(keys.topic("action-requests"), format!("{prefix}action-requests"));
            assert_ne!(keys.answered("s", "r"), keys.call("s", "r"));
        }
        // One server: unchanged names.
        assert_eq!(Keys::new("p:").answered("s", "r"), "p:toolhost:ledger:s:answered:r");
        // The answered mark is the claim itself on one server, and next to the topic on a cluster.
        assert_eq!(Keys::new("p:").answered_mark("s", "r", "p:results:1"), "p:toolhost:ledger:s:answered:r");
        let keys = Keys::for_cluster("p:");
        let mark = keys.answered_mark("s", "r", "p:results:1");
        assert_eq!(slots::slot(mark.as_bytes()), slots::slot(b"p:results:1"));
        assert!(mark.starts_with("p:{") && mark.ends_with("}answer:toolhost:ledger:s:answered:r"), "{mark}");
    }
}
