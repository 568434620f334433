//! A replica's heartbeat as the readers of the fleet read it: the fleet view (`fleet`), the
//! clients of the fleet (`fleet_client`) and the console. `publish` writes it
//! (`toolhost:heartbeat:<toolbox_id>:<consumer>`, listed in the fleet set).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A replica's heartbeat, as every reader of the fleet reads it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Heartbeat {
    pub toolbox_id: String,
    pub consumer: String,
    #[serde(default)]
    pub version: String,
    /// When it last beat (RFC 3339).
    #[serde(default)]
    pub at: String,
    /// Its enabled tools, with the events they consume and their description hashes.
    #[serde(default)]
    pub hosted: BTreeMap<String, Hosted>,
    /// Its tool sources (hosted MCP servers, the OVOS source) and their states.
    #[serde(default)]
    pub sources: Vec<Source>,
    /// The streams it reads as a consumer group (the requests stream, its chat inbox).
    #[serde(default)]
    pub groups: Vec<ReadGroup>,
}

/// A stream a replica reads as a consumer group.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ReadGroup {
    /// The stream's full key.
    pub stream: String,
}

/// One hosted tool of a heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Hosted {
    /// The event the tool consumes.
    #[serde(default)]
    pub event: String,
    /// The hash of its native description.
    #[serde(default)]
    pub hash: String,
}

/// One tool source of a replica.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Source {
    pub name: String,
    #[serde(default)]
    pub transport: String,
    #[serde(default)]
    pub up: bool,
    #[serde(default)]
    pub restarts: u64,
    #[serde(default)]
    pub tools: u64,
    #[serde(default)]
    pub last_error: Option<String>,
    /// Since when it has been up or down.
    #[serde(default)]
    pub since: Option<String>,
}

impl Source {
    /// `up`; `starting` before its first connection; `down` while it fails and is retried.
    pub(crate) fn state(&self) -> &'static str {
        match (self.up, self.restarts, &self.last_error) {
            (true, _, _) => "up",
            (false, 0, None) => "starting",
            (false, _, _) => "down",
        }
    }
}

impl Heartbeat {
    /// The heartbeat `text` holds; `None` for text that is not one (a reader skips it).
    pub(crate) fn parse(text: &str) -> Option<Heartbeat> {
        serde_json::from_str(text).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_states_follow_up_restarts_and_errors() {
        let source = |up, restarts, last_error: Option<&str>| Source {
            name: "s".to_owned(),
            transport: "stdio".to_owned(),
            up,
            restarts,
            tools: 0,
            last_error: last_error.map(str::to_owned),
            since: None,
        };
        assert_eq!(source(true, 3, Some("old")).state(), "up");
        assert_eq!(source(false, 0, None).state(), "starting");
        assert_eq!(source(false, 0, Some("refused")).state(), "down");
        assert_eq!(source(false, 2, None).state(), "down");
    }

    #[test]
    fn a_heartbeat_is_read_with_its_defaults_and_anything_else_is_skipped() {
        let beat = Heartbeat::parse(r#"{"toolbox_id":"a","consumer":"a-1","hosted":{"echo":{"hash":"h"}}}"#)
            .unwrap();
        assert_eq!((beat.toolbox_id.as_str(), beat.consumer.as_str()), ("a", "a-1"));
        assert_eq!(beat.hosted["echo"], Hosted { event: String::new(), hash: "h".to_owned() });
        assert!(beat.sources.is_empty() && beat.groups.is_empty() && beat.version.is_empty());
        assert!(Heartbeat::parse(r#"{"toolbox_id":"a"}"#).is_none(), "a consumer is required");
        assert!(Heartbeat::parse("not json").is_none());
    }
}
