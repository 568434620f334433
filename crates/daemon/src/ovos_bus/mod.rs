//! The OpenVoiceOS messagebus as toolhost speaks it, shared by the OVOS door
//! (`crate::doors::ovos`, toolhost as a `ToolBox`) and the OVOS tool source
//! (`crate::sources::ovos`, other `ToolBox`es hosted as tools): one kept-open websocket
//! connection ([`link`]), the bus's `Message` rules ([`message`]), and the topics and names of
//! the persona tools protocol (OVOS-TOOLS-1).

pub(crate) mod link;
pub(crate) mod message;

/// The discovery broadcast.
pub(crate) const DISCOVER: &str = "ovos.persona.tools.discover";
/// The static call topic (OVOS-TOOLS-1 §4.2).
pub(crate) const STATIC_CALL: &str = "ovos.persona.tools.call";
/// The prefix of the tools of hosted OVOS toolboxes, which the door leaves out: they are on the
/// bus already.
pub(crate) const HOSTED_PREFIX: &str = "ovos__";

/// The per-toolbox call topic of `toolbox_id`.
pub(crate) fn call_topic(toolbox_id: &str) -> String {
    format!("ovos.persona.tools.{toolbox_id}.call")
}

/// Whether `id` can be a toolbox id on the bus that toolhost hosts: it becomes part of tool
/// names and topics.
pub(crate) fn valid_toolbox_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}
