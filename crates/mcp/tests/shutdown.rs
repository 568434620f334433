//! Shutdown leaves nothing behind: every child's process group is killed and every process of
//! it that is ours to reap is reaped. A test binary of its own, because it makes the test
//! process a child subreaper, as toolhost is when it runs as PID 1 in a container: orphaned
//! grandchildren of the servers then become its children, and must not stay zombies.

#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use support::*;

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn shutdown_kills_every_child_group_and_leaves_no_zombies() {
    nix::sys::prctl::set_child_subreaper(true).expect("could not become a subreaper");
    let dir = temp_dir("shutdown");
    // The tapped server is a group of three processes: sh, tee and node; tee and node are
    // sh's children, so they are orphaned when the group dies.
    let config = format!(
        "[[mcp_servers]]\nname = \"time\"\ncommand = \"{}\"\n\n\
         [[mcp_servers]]\nname = \"everything\"\ncommand = \"node\"\nargs = [\"{}\", \"stdio\"]\n\n\
         [[mcp_servers]]\nname = \"tapped\"\n{}",
        time_server(),
        everything(),
        tapped(&dir.join("tap.jsonl"), "node", &[&everything(), "stdio"])
    );
    let sources = Sources::start(&config, &env(&[])).await;
    let pids: Vec<u32> = sources.sources().status().iter().map(|status| status.pid.unwrap()).collect();
    assert_eq!(pids.len(), 3);
    let tapped_group = group_members(pids[2]);
    assert!(tapped_group.len() >= 3, "sh, tee and node share the group: {tapped_group:?}");
    sources.stop().await;
    for pid in pids {
        assert_eq!(group_members(pid), [], "group {pid} is gone, zombies included");
        assert!(!process_exists(pid), "{pid} was waited for");
    }
    let _ = std::fs::remove_dir_all(dir);
}
