//! The tools toolhost ships, one file each.

mod echo;
mod synthetic;
mod terminal_run;

pub use echo::Echo;
pub use synthetic::Synthetic;
pub use terminal_run::TerminalRun;
