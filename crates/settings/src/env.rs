//! The environment, read through a trait so tests can pass a map.

use std::collections::{BTreeMap, HashMap};

/// Where the environment's variables come from.
pub trait Env {
    /// Every variable, as name and value.
    fn vars(&self) -> Vec<(String, String)>;
}

/// The process's own environment (variables that are not UTF-8 are skipped).
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn vars(&self) -> Vec<(String, String)> {
        std::env::vars_os()
            .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
            .collect()
    }
}

impl Env for HashMap<String, String> {
    fn vars(&self) -> Vec<(String, String)> {
        self.iter().map(|(name, value)| (name.clone(), value.clone())).collect()
    }
}

/// A snapshot of the environment. `{:?}` prints the names only: values may be secrets.
#[derive(Clone, Default)]
pub struct EnvVars(pub BTreeMap<String, String>);

impl EnvVars {
    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

impl std::fmt::Debug for EnvVars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}
