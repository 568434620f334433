//! x

/// The `terminal_run` execution engine: policy, safe spawning, capped and redacted output.
pub mod terminal;
