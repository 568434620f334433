//! The tools toolhost ships, one file each.

mod echo;
mod synthetic;

pub use echo::Echo;
pub use synthetic::Synthetic;
