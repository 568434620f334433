//! The chat door's settings. The door has no section of its own: `config` reads them from the
//! shared sections (`[daemon]`, `[streams]`), whose keys stay where they are.

/// What the chat door needs to know.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The name toolhost speaks as: reads `chat:<agent_name>`, writes as `agent:<agent_name>`.
    pub agent_name: String,
    /// Larger payloads are dead-lettered.
    pub max_payload_bytes: usize,
    /// The toolbox this replica belongs to.
    pub toolbox_id: String,
}
