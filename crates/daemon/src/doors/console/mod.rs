//! The web console (`[console] listen`): the fleet, its tools with a try-it form, the call log
//! and the dead letters, for operators. See `docs/OPERATIONS.md`, "The console".

pub(crate) mod settings;

pub use settings::Settings;
