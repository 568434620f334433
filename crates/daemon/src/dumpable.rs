//! Keeps other processes of the daemon's user out of its memory and environment.
//!
//! A non-dumpable process writes no core dump, cannot be attached to with ptrace by processes
//! of the same user, and its `/proc/<pid>/` files that expose memory or secrets (`environ`,
//! `mem`, `maps`, ...) belong to root. So a command the daemon runs as its own user (a
//! non-root daemon's terminal commands) cannot `cat /proc/<daemon pid>/environ` to read
//! `REDIS_URL`. Root, or anything holding `CAP_SYS_PTRACE`, still can: a root daemon relies on
//! running its commands as another user (`[tools.terminal] run_as`).

use std::io;

use nix::sys::prctl;

/// Marks this process non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`). Children get the flag
/// reset when they exec another program, so their own behaviour does not change.
///
/// # Errors
/// The kernel refused the call.
pub fn forbid_dumps() -> io::Result<()> {
    prctl::set_dumpable(false).map_err(io::Error::from)
}

/// Whether this process is dumpable (`prctl(PR_GET_DUMPABLE)`).
pub fn is_dumpable() -> bool {
    prctl::get_dumpable().unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forbidden_process_is_not_dumpable() {
        // Run in a child process, so the test runner itself keeps its flag.
        let exe = std::env::current_exe().unwrap();
        if std::env::var_os("TOOLHOST_DUMPABLE_CHILD").is_some() {
            forbid_dumps().unwrap();
            assert!(!is_dumpable());
            return;
        }
        assert!(is_dumpable());
        let status = std::process::Command::new(exe)
            .args(["--exact", "dumpable::tests::a_forbidden_process_is_not_dumpable", "--nocapture"])
            .env("TOOLHOST_DUMPABLE_CHILD", "1")
            .status()
            .unwrap();
        assert!(status.success());
    }
}
