//! Checked at start, not learnt at the first call: a root daemon runs commands and stdio MCP
//! servers as another user (`nobody` by default), and that user must be able to enter
//! `[tools.terminal] sandbox_cwd` and each configured working directory, and run each hosted
//! program. What it cannot reach is a configuration error naming the path, the user and the fix
//! (`check-config` exits 64, `serve` does not start): a tool that fails every call with
//! `Permission denied` is better refused before the first call than found by it.

use std::path::Path;

use toolhost_tools::terminal::access::{Access, problem, program_on_path};
use toolhost_tools::terminal::{DEFAULT_RUN_AS, FIXED_PATH};

use toolhost_settings::KeyError;

use super::Settings;

/// Every path the children's user cannot reach, one error per key; none when the children run
/// as the daemon itself.
pub(crate) fn problems(settings: &Settings) -> Vec<KeyError> {
    let Some(identity) = settings.terminal_identity else { return Vec::new() };
    let terminal = &settings.tools.terminal;
    let user =
        terminal.run_as.as_deref().map(str::trim).filter(|name| !name.is_empty()).unwrap_or(DEFAULT_RUN_AS);
    let mut res = Vec::new();
    let mut check = |key: String, path: &Path, access: Access| {
        if let Some(message) = problem(path, identity, user, access) {
            res.push(KeyError { key, message });
        }
    };
    if let Some(root) = &terminal.sandbox_cwd {
        check("tools.terminal.sandbox_cwd".to_owned(), root, Access::Enter);
    }
    for (index, command) in settings.sections.commands.iter().enumerate() {
        if let Some(cwd) = &command.cwd {
            check(format!("commands[{index}].cwd"), cwd, Access::Enter);
        }
        if let Some(program) = command.argv.first().and_then(|program| program_on_path(program, FIXED_PATH)) {
            check(format!("commands[{index}].argv[0]"), &program, Access::Execute);
        }
    }
    // Hosted servers are started with the daemon's PATH (see `toolhost_mcp`'s children).
    let path_var = settings.env.get("PATH").unwrap_or_default();
    for (index, server) in settings.sections.mcp_servers.iter().enumerate() {
        let Some(command) = &server.command else { continue };
        if let Some(cwd) = &server.cwd {
            check(format!("mcp_servers[{index}].cwd"), cwd, Access::Enter);
        }
        if let Some(program) = program_on_path(command, path_var) {
            check(format!("mcp_servers[{index}].command"), &program, Access::Execute);
        }
    }
    res
}
