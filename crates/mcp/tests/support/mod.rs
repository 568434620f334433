//! Shared helpers of the MCP server tests: where the real servers are installed, sources built
//! from TOML, a registry over their tools, condition waits with deadlines, and /proc lookups.
//!
//! The servers are installed by `scripts/ensure-mcp-servers.sh` (`just test-mcp` runs it), into
//! `TOOLHOST_MCP_SERVERS` or `~/.cache/toolhost/mcp-servers`.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use toolhost_mcp::{Children, McpServerConfig, McpSources, Started};
use toolhost_tools::terminal::Limits;
use toolhost_tools::{Context, Failure, Output, Registry};

/// Why the tests are ignored by `cargo test`.
pub const NEEDS_SERVERS: &str = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`";

/// The cache directory of installed servers; panics with the fix when they are missing.
pub fn servers() -> PathBuf {
    let dir = std::env::var_os("TOOLHOST_MCP_SERVERS").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| "/root".into());
        home.join(".cache/toolhost/mcp-servers")
    });
    assert!(
        everything_bin_in(&dir).exists() && dir.join("time/bin/mcp-server-time").exists(),
        "the MCP servers are not installed in {}: run scripts/ensure-mcp-servers.sh (or `just test-mcp`)",
        dir.display()
    );
    dir
}

fn everything_bin_in(dir: &Path) -> PathBuf {
    dir.join("everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
}

/// The server-everything entry script.
pub fn everything() -> String {
    everything_bin_in(&servers()).display().to_string()
}

/// The mcp-server-time program in its venv.
pub fn time_server() -> String {
    servers().join("time/bin/mcp-server-time").display().to_string()
}

/// A directory of its own for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("toolhost-mcp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The daemon environment handed to the sources: this process's PATH, HOME and LANG, a
/// variable that must not reach children, and whatever `extra` adds.
pub fn env(extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for name in ["PATH", "HOME", "LANG"] {
        if let Ok(value) = std::env::var(name) {
            env.insert(name.to_owned(), value);
        }
    }
    env.entry("LANG".to_owned()).or_insert_with(|| "C.UTF-8".to_owned());
    env.insert("DAEMON_ONLY_SECRET".to_owned(), "must-not-leak".to_owned());
    for (name, value) in extra {
        env.insert((*name).to_owned(), (*value).to_owned());
    }
    env
}

/// `[[mcp_servers]]` entries from TOML.
pub fn configs(toml_text: &str) -> Vec<McpServerConfig> {
    #[derive(Deserialize)]
    struct File {
        mcp_servers: Vec<McpServerConfig>,
    }
    toml::from_str::<File>(toml_text).unwrap().mcp_servers
}

/// Started sources with their shutdown token.
pub struct Sources {
    pub started: Started,
    pub shutdown: CancellationToken,
}

impl Sources {
    /// Starts the sources of `toml_text` with `env`, under a file-size rlimit (to check rlimits
    /// reach the child).
    pub async fn start(toml_text: &str, env: &BTreeMap<String, String>) -> Sources {
        init_logging();
        let shutdown = CancellationToken::new();
        let limits = Limits { file_size_bytes: Some(FILE_SIZE_LIMIT), ..Limits::default() };
        let children = Children { limits, run_as: None };
        let started = McpSources::start(&configs(toml_text), env, children, shutdown.clone()).await.unwrap();
        Sources { started, shutdown }
    }

    pub fn sources(&self) -> &McpSources {
        &self.started.sources
    }

    /// A registry of every current tool.
    pub fn registry(&self) -> Registry {
        let mut registry = Registry::new();
        for tool in self.sources().tools() {
            registry.register(tool).unwrap();
        }
        registry
    }

    /// Stops every source and waits until they have stopped.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.started.sources.stopped())
            .await
            .expect("the sources did not stop within 30 s");
    }
}

/// The `RLIMIT_FSIZE` the tests give children.
pub const FILE_SIZE_LIMIT: u64 = 123 * 1024 * 1024;

/// Calls `tool` through the registry, as the daemon does.
pub async fn call(registry: &Registry, tool: &str, arguments: Value) -> Result<Value, Failure> {
    registry.invoke(tool, arguments, &Context { request_id: "t".into(), ..Context::default() }, None).await
}

/// Calls `tool` and gives its whole answer: the result and its content blocks.
pub async fn call_output(registry: &Registry, tool: &str, arguments: Value) -> Result<Output, Failure> {
    let arguments = registry.prepare(tool, arguments)?;
    registry.run(tool, arguments, &Context { request_id: "t".into(), ..Context::default() }, None).await
}

/// Waits until `check` returns `Some`, failing with `what` after `limit`.
pub async fn eventually<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether process `pid` exists (a zombie counts: it still has a /proc entry).
pub fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Every process whose process group is `pgid`, with its state letter (`Z` for a zombie).
pub fn group_members(pgid: u32) -> Vec<(u32, char)> {
    group_members_with_parents(pgid).into_iter().map(|(pid, state, _)| (pid, state)).collect()
}

/// Every process whose process group is `pgid`: pid, state letter and parent pid.
pub fn group_members_with_parents(pgid: u32) -> Vec<(u32, char, u32)> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // Fields after the parenthesised command: state ppid pgrp ...
        let Some(after) = stat.rfind(')').map(|end| &stat[end + 2..]) else { continue };
        let fields: Vec<&str> = after.split_whitespace().collect();
        if fields.get(2).and_then(|group| group.parse::<u32>().ok()) == Some(pgid) {
            let parent = fields.get(1).and_then(|parent| parent.parse::<u32>().ok()).unwrap_or(0);
            members.push((pid, fields[0].chars().next().unwrap_or('?'), parent));
        }
    }
    members
}

/// A JSON line log of what a wrapped child read on stdin, written by `tee` (see [`tapped`]).
pub fn tap_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// A TOML `command`/`args` pair that runs `program args...` with its stdin recorded into `tap`
/// by `tee`, unmodified otherwise: `sh -c 'tee -a "$0" | exec "$@"' tap program args...`.
pub fn tapped(tap: &Path, program: &str, args: &[&str]) -> String {
    let mut all = vec![
        "-c".to_owned(),
        r#"tee -a "$0" | exec "$@""#.to_owned(),
        tap.display().to_string(),
        program.to_owned(),
    ];
    all.extend(args.iter().map(|arg| (*arg).to_owned()));
    format!("command = \"/bin/sh\"\nargs = {}\n", serde_json::to_string(&all).unwrap())
}

fn init_logging() {
    let _ = tracing_subscriber::fmt().with_env_filter("toolhost_mcp=info").with_test_writer().try_init();
}

/// Shares a value across tasks in tests.
pub type Shared<T> = Arc<std::sync::Mutex<T>>;
