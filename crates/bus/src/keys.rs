//! Every Redis key and stream name toolhost uses, built in one place.
//!
//! A configured prefix (default none) is put in front of every key, topics included.

/// Builds key and topic names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys with `prefix` in front of every name (`""` for none).
    pub fn new(prefix: impl Into<String>) -> Keys {
        Keys { prefix: prefix.into() }
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

    /// Marks a request as answered, for the idempotency window.
    pub fn answered(&self, toolbox_id: &str, request_id: &str) -> String {
        format!("{}toolhost:{toolbox_id}:answered:{request_id}", self.prefix)
    }

    /// The record of a call in progress: owner, lease and entry.
    pub fn call(&self, toolbox_id: &str, request_id: &str) -> String {
        format!("{}toolhost:{toolbox_id}:call:{request_id}", self.prefix)
    }

    /// The hash of a toolbox's tool descriptions, one field per tool.
    pub fn registry(&self, toolbox_id: &str) -> String {
        format!("{}toolhost:registry:{toolbox_id}", self.prefix)
    }

    /// A replica's heartbeat, expiring unless refreshed.
    pub fn heartbeat(&self, toolbox_id: &str, consumer: &str) -> String {
        format!("{}toolhost:heartbeat:{toolbox_id}:{consumer}", self.prefix)
    }

    /// The heartbeat key of a toolbox's replica without its consumer name, for scripts that
    /// complete it with names they find.
    pub fn heartbeat_prefix(&self, toolbox_id: &str) -> String {
        format!("{}toolhost:heartbeat:{toolbox_id}:", self.prefix)
    }

    /// The pattern matching every heartbeat of a toolbox.
    pub fn heartbeat_pattern(&self, toolbox_id: &str) -> String {
        format!("{}toolhost:heartbeat:{toolbox_id}:*", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix() {
        let keys = Keys::new("");
        assert_eq!(keys.topic("action-requests"), "action-requests");
        assert_eq!(keys.dead_letters("toolhost"), "dlq:toolhost");
        assert_eq!(keys.chat("conv1"), "chat:conv1");
        assert_eq!(keys.conversation_stream("conv1"), "stream:conv1");
        let keys = Keys::new("prod:");
        assert_eq!(keys.topic("action-requests"), "prod:action-requests");
        assert_eq!(keys.answered("tb", "r-1"), "prod:toolhost:tb:answered:r-1");
        assert_eq!(keys.call("tb", "r-1"), "prod:toolhost:tb:call:r-1");
        assert_eq!(keys.registry("tb"), "prod:toolhost:registry:tb");
        assert_eq!(keys.heartbeat("tb", "c1"), "prod:toolhost:heartbeat:tb:c1");
        assert_eq!(keys.heartbeat_prefix("tb") + "c1", keys.heartbeat("tb", "c1"));
    }
}
