//! What every crate's configuration shares, so that the crates below the daemon (`bus`, `mcp`)
//! and the daemon's own sections read, check and print settings by the same rules:
//!
//! - [`KeyError`] and [`ConfigError`]: a bad key, named by its dotted path, and every bad key
//!   of a configuration at once;
//! - [`Env`], [`ProcessEnv`] and [`EnvVars`]: the environment, read once through a trait so
//!   tests pass a map;
//! - [`expand_vars`]: `${VAR}` references in a setting, expanded from the environment;
//! - [`mask_url`] and [`mask_secret`]: URLs and secrets as they may be printed.
//!
//! It does no I/O beyond reading the process environment in [`ProcessEnv`].

mod env;
mod error;
mod expand;
mod mask;

pub use env::{Env, EnvVars, ProcessEnv};
pub use error::{ConfigError, KeyError};
pub use expand::{ExpandError, Expanded, expand_vars, is_variable_name};
pub use mask::{mask_secret, mask_url, percent_decode};
