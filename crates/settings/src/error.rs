//! Configuration errors: one bad key, and all of them.

/// One bad key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    /// Dotted key, e.g. `dispatch.max_in_flight`.
    pub key: String,
    /// What is wrong with it.
    pub message: String,
}

impl KeyError {
    /// The error `message` for `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> KeyError {
        KeyError { key: key.into(), message: message.into() }
    }
}

/// Configuration that cannot be used; names every bad key.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n{}", .0.iter().map(|e| format!("  {}: {}", e.key, e.message)).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError(pub Vec<KeyError>);

impl ConfigError {
    /// The error of one key.
    pub fn single(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError(vec![KeyError::new(key, message)])
    }
}
