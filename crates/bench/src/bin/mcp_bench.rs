//! `toolhost-bench-mcp`: the cost of hosting an MCP server behind toolhost.
//!
//! In one run, against the same real `@modelcontextprotocol/server-everything` over stdio
//! (installed by `scripts/ensure-mcp-servers.sh`):
//!
//! 1. **direct**: an rmcp client in this binary calls its `get-sum` tool, over stdio and over
//!    streamable HTTP (the same server started with `streamableHttp`);
//! 2. **toolhost**: the same call goes through `toolhost serve` (hosting the server with
//!    `[[mcp_servers]]`, over stdio and over streamable HTTP) over Redis, as a `tool.invoke`
//!    request answered on a results stream; beside it the built-in `echo` the same way, and the
//!    sum as a `[[commands]]` tool (`expr`);
//! 3. **redis**: sequential `PING`s, the round trip a Redis-borne call cannot avoid;
//! 4. **the MCP door**: the built-in `echo` through the same daemon's `/mcp` (`[mcp] listen`)
//!    by an rmcp streamable HTTP client, and by plain HTTP POSTs (reqwest, no MCP client
//!    library), in an `initialize` session and as MCP 2026-07-28 requests (no session, the
//!    version and capabilities in each request's `_meta`); the rows through the daemon take
//!    turns for five rounds, each row the median of its rounds;
//! 5. **`toolhost mcp`**: the stdio door's start, from spawn to its answer to `initialize` and
//!    to its first `tools/list` (the fleet's tools), the median of five starts;
//! 6. **idle memory**: RSS, anonymous memory and PSS of `toolhost serve` without an MCP server
//!    and with server-everything hosted over stdio;
//! 7. **an image beside text** (issue 33): a small server on the official TypeScript SDK
//!    (`src/servers/picture_server.mjs`, hosted over stdio) answers a short text block or a
//!    100 KiB PNG as an image content block, directly to an rmcp client, over Redis and through
//!    the MCP door (rmcp streamable HTTP client); each call checks that the image's base64 arrived
//!    whole.
//!
//! Each is measured at 1 call in flight (p50, p99) and at 16 (calls/s). The table goes to
//! stdout and `target/bench/mcp.md`.
//!
//! ```text
//! cargo build --release -p toolhost -p toolhost-bench && target/release/toolhost-bench-mcp
//! ```

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use base64::Engine as _;
use hdrhistogram::Histogram;
use redis::aio::MultiplexedConnection;
use rmcp::ServiceExt as _;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};
use toolhost_bench::redis_server::RedisServer;

/// How long each throughput phase runs.
const PHASE: Duration = Duration::from_secs(5);
/// `get-sum` as toolhost names it: the server's prefix in front (its `echo` would otherwise
/// collide with the built-in one).
const HOSTED_TOOL: &str = "everything__get-sum";
/// Calls measured one at a time for the latency rows.
const SEQUENTIAL_CALLS: usize = 2000;
/// Interleaved rounds of the MCP door's rows, and starts of `toolhost mcp`; the medians count.
const ROUNDS: usize = 5;
/// Calls in flight for the throughput rows.
const LANES: usize = 16;
/// The size of the picture server's PNG, KiB.
const IMAGE_KIB: usize = 100;
/// The picture server's tools as toolhost names them.
const TEXT_TOOL: &str = "pictures__text";
const IMAGE_TOOL: &str = "pictures__image";

/// One measured row.
struct Row {
    target: &'static str,
    p50_us: u64,
    p99_us: u64,
    calls_per_s: f64,
    /// CPU per call at 16 in flight of each watched process, µs.
    cpu_us: Vec<(&'static str, f64)>,
}

/// Which processes a watched pid stands for.
#[derive(Clone, Copy)]
enum Scope {
    /// The process alone.
    Own,
    /// The processes below it (a daemon's stdio server and commands), not itself.
    Children,
    /// It and every process below it (a server's wrapper and node).
    Tree,
}

/// Processes whose CPU a row reports per call: (label, pid, scope).
type Watched = Vec<(&'static str, u32, Scope)>;

/// CPU ticks of each watched set of processes.
fn cpu_ticks(watched: &Watched) -> Vec<Option<u64>> {
    let ticks = |pid| toolhost_bench::procfs::cpu_ticks(pid).ok();
    let below = |pid| descendants(pid).into_iter().map(|child| ticks(child).unwrap_or(0)).sum::<u64>();
    watched
        .iter()
        .map(|&(_, pid, scope)| match scope {
            Scope::Own => ticks(pid),
            Scope::Children => Some(below(pid)),
            Scope::Tree => Some(ticks(pid)? + below(pid)),
        })
        .collect()
}

/// Every process below `pid`, from `/proc/<pid>/task/*/children`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut res = Vec::new();
    let mut queue = vec![pid];
    while let Some(parent) = queue.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else { continue };
        for task in tasks.flatten() {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|child| child.parse::<u32>().ok()) {
                res.push(child);
                queue.push(child);
            }
        }
    }
    res
}

fn everything() -> anyhow::Result<PathBuf> {
    let cache = std::env::var_os("TOOLHOST_MCP_SERVERS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/toolhost/mcp-servers")
    });
    let program = cache.join("everything/node_modules/.bin/mcp-server-everything");
    anyhow::ensure!(program.exists(), "{} is missing: run scripts/ensure-mcp-servers.sh", program.display());
    Ok(program)
}

/// The small MCP server of the image rows (`src/servers/picture_server.mjs`), on the TypeScript
/// SDK that server-everything installs beside itself; its script is written to a temporary file.
struct Pictures {
    script: PathBuf,
    sdk: PathBuf,
}

impl Pictures {
    fn new(everything: &Path) -> anyhow::Result<Pictures> {
        let modules =
            everything.parent().and_then(Path::parent).context("server-everything's node_modules")?;
        let sdk = modules.join("@modelcontextprotocol/sdk");
        anyhow::ensure!(sdk.exists(), "{} is missing: run scripts/ensure-mcp-servers.sh", sdk.display());
        let script =
            std::env::temp_dir().join(format!("toolhost-bench-mcp-{}-pictures.mjs", std::process::id()));
        std::fs::write(&script, include_str!("../servers/picture_server.mjs"))?;
        Ok(Pictures { script, sdk })
    }

    /// `node`'s arguments.
    fn args(&self) -> [String; 3] {
        [self.script.display().to_string(), self.sdk.display().to_string(), IMAGE_KIB.to_string()]
    }
}

impl Drop for Pictures {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.script);
    }
}

/// What an answer must hold for a call to count: success, and for the image rows the image's
/// base64 as the server gave it.
#[derive(Clone)]
enum Expect {
    Success,
    Image(Arc<str>),
}

impl Expect {
    /// An rmcp client's result, direct or through the door.
    fn check(&self, tool: &str, result: &rmcp::model::CallToolResult) -> anyhow::Result<()> {
        anyhow::ensure!(result.is_error != Some(true), "{tool} failed: {result:?}");
        if let Expect::Image(data) = self {
            let whole = result.content.iter().any(
                |block| matches!(block, rmcp::model::ContentBlock::Image(image) if *image.data == **data),
            );
            anyhow::ensure!(whole, "{tool} answered no image, or another one");
        }
        Ok(())
    }

    /// The answer's payload over Redis.
    fn check_payload(&self, tool: &str, payload: &str) -> anyhow::Result<()> {
        anyhow::ensure!(payload.contains("\"success\":true"), "{tool} failed: {payload}");
        if let Expect::Image(data) = self {
            anyhow::ensure!(
                payload.contains("\"type\":\"image\"") && payload.contains(&**data),
                "{tool} answered no image, or another one ({} bytes)",
                payload.len()
            );
        }
        Ok(())
    }
}

fn arguments() -> serde_json::Map<String, Value> {
    json!({"a": 2, "b": 3}).as_object().cloned().unwrap_or_default()
}

/// Latency of `SEQUENTIAL_CALLS` calls one at a time, and calls per second with `LANES` in
/// flight for `PHASE`.
async fn measure<F, Fut>(target: &'static str, watched: &Watched, call: F) -> anyhow::Result<Row>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let call = Arc::new(call);
    for warmup in 0..200 {
        call(warmup).await?;
    }
    let mut histogram = Histogram::<u64>::new(3)?;
    for index in 0..SEQUENTIAL_CALLS {
        let started = Instant::now();
        call(index).await?;
        histogram.record(started.elapsed().as_micros() as u64)?;
    }
    let before = cpu_ticks(watched);
    let deadline = Instant::now() + PHASE;
    let mut lanes = Vec::new();
    for lane in 0..LANES {
        let call = Arc::clone(&call);
        lanes.push(tokio::spawn(async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                call(lane).await?;
                done += 1;
            }
            anyhow::Ok(done)
        }));
    }
    let mut total = 0;
    for lane in lanes {
        total += lane.await??;
    }
    let after = cpu_ticks(watched);
    let ticks_per_second = toolhost_bench::procfs::ticks_per_second() as f64;
    let cpu_us = watched
        .iter()
        .zip(before.iter().zip(&after))
        .filter_map(|(&(label, _, _), (before, after))| {
            let spent = after.as_ref()?.checked_sub(*before.as_ref()?)?;
            Some((label, spent as f64 * 1e6 / ticks_per_second / total.max(1) as f64))
        })
        .collect();
    Ok(Row {
        target,
        p50_us: histogram.value_at_quantile(0.5),
        p99_us: histogram.value_at_quantile(0.99),
        calls_per_s: total as f64 / PHASE.as_secs_f64(),
        cpu_us,
    })
}

/// An rmcp client of the stdio server `command` starts (`what` names it in errors): the server's
/// process (killed on drop), the client, and the server's pid.
async fn stdio_client(
    mut command: tokio::process::Command,
    what: &str,
) -> anyhow::Result<(tokio::process::Child, Arc<rmcp::service::RunningService<rmcp::RoleClient, ()>>, u32)> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let (stdin, stdout) = (child.stdin.take().context("stdin")?, child.stdout.take().context("stdout")?);
    let client = Arc::new(().serve((stdout, stdin)).await.with_context(|| format!("initialising {what}"))?);
    let server = child.id().context("the server's pid")?;
    Ok((child, client, server))
}

/// The server spoken to directly by an rmcp client.
async fn direct(program: &Path) -> anyhow::Result<Row> {
    let mut command = tokio::process::Command::new(program);
    command.arg("stdio");
    let (mut child, client, server) = stdio_client(command, "server-everything").await?;
    let row = measure_direct(
        "direct (rmcp client, stdio)",
        client,
        server,
        "get-sum",
        arguments(),
        &Expect::Success,
    )
    .await;
    let _ = child.kill().await;
    row
}

/// The picture server spoken to directly over stdio by an rmcp client: its text row, its image
/// row, and the image's base64 as the server gives it (what the rows through toolhost must
/// deliver).
async fn direct_pictures(pictures: &Pictures) -> anyhow::Result<(Row, Row, Arc<str>)> {
    let mut command = tokio::process::Command::new("node");
    command.args(pictures.args());
    let (mut child, client, server) = stdio_client(command, "the picture server (node)").await?;
    let first = client.call_tool(CallToolRequestParams::new("image")).await?;
    let data: Arc<str> = first
        .content
        .iter()
        .find_map(|block| match block {
            rmcp::model::ContentBlock::Image(image) => Some(image.data.as_str().into()),
            _ => None,
        })
        .context("the picture server answered no image")?;
    let none = serde_json::Map::new();
    let text = measure_direct(
        "text, direct (rmcp client, stdio)",
        Arc::clone(&client),
        server,
        "text",
        none.clone(),
        &Expect::Success,
    )
    .await?;
    let image = measure_direct(
        "image, direct (rmcp client, stdio)",
        client,
        server,
        "image",
        none,
        &Expect::Image(Arc::clone(&data)),
    )
    .await?;
    let _ = child.kill().await;
    Ok((text, image, data))
}

/// `tool` called by `client` directly, with the CPU of this process and of the server's.
async fn measure_direct(
    target: &'static str,
    client: Arc<rmcp::service::RunningService<rmcp::RoleClient, ()>>,
    server: u32,
    tool: &'static str,
    arguments: serde_json::Map<String, Value>,
    expect: &Expect,
) -> anyhow::Result<Row> {
    let watched = vec![("client", std::process::id(), Scope::Own), ("server", server, Scope::Tree)];
    let expect = expect.clone();
    measure(target, &watched, move |_| {
        let (client, arguments, expect) = (Arc::clone(&client), arguments.clone(), expect.clone());
        async move {
            let mut params = CallToolRequestParams::new(tool);
            params.arguments = Some(arguments);
            expect.check(tool, &client.call_tool(params).await?)
        }
    })
    .await
}

/// A connection of each lane's own. Redis serves one connection's commands in order, so a lane's
/// `XREAD BLOCK` on a shared connection holds the commands other lanes queued behind it until its
/// own answer comes.
#[derive(Clone)]
struct Lanes(Arc<Vec<MultiplexedConnection>>);

impl Lanes {
    async fn open(client: &redis::Client) -> anyhow::Result<Lanes> {
        let mut connections = Vec::with_capacity(LANES);
        for _ in 0..LANES {
            connections.push(client.get_multiplexed_async_connection().await?);
        }
        Ok(Lanes(Arc::new(connections)))
    }

    fn get(&self, lane: usize) -> &MultiplexedConnection {
        &self.0[lane % self.0.len()]
    }
}

/// A `tool.invoke` of `tool` over Redis, answered on this lane's results stream.
async fn invoke(
    lanes: &Lanes,
    lane: usize,
    tool: &str,
    arguments: Value,
    expect: &Expect,
) -> anyhow::Result<()> {
    let lane = lane % LANES;
    let mut connection = lanes.get(lane).clone();
    let request_id = uuid::Uuid::new_v4().to_string();
    let topic = format!("results:lane-{lane}");
    let envelope = json!({
        "id": request_id, "type": "tool.invoke", "response_topic": topic,
        "data": {"request_id": request_id, "tool": tool, "arguments": arguments},
    });
    let _: String = redis::cmd("XADD")
        .arg("action-requests")
        .arg("*")
        .arg("id")
        .arg(&request_id)
        .arg("payload")
        .arg(envelope.to_string())
        .query_async(&mut connection)
        .await?;
    let mut cursor = "0-0".to_owned();
    loop {
        let reply: redis::streams::StreamReadReply = redis::cmd("XREAD")
            .arg("BLOCK")
            .arg(10_000)
            .arg("STREAMS")
            .arg(&topic)
            .arg(&cursor)
            .query_async(&mut connection)
            .await?;
        for key in reply.keys {
            for entry in key.ids {
                cursor.clone_from(&entry.id);
                let payload: String = entry.get("payload").unwrap_or_default();
                if payload.contains(&request_id) {
                    // Trimmed as it goes, so each read finds only the answers still awaited.
                    let _: u64 =
                        redis::cmd("XDEL").arg(&topic).arg(&entry.id).query_async(&mut connection).await?;
                    return expect.check_payload(tool, &payload);
                }
            }
        }
    }
}

/// What one daemon run measured: every row the median of its interleaved rounds.
struct Measured {
    hosted: Row,
    hosted_http: Row,
    command: Row,
    floor: Row,
    echo_redis: Row,
    echo_door: Row,
    echo_plain: Row,
    echo_modern: Row,
    /// The picture server's text and image, over Redis and through the door.
    text_redis: Row,
    image_redis: Row,
    text_door: Row,
    image_door: Row,
    /// `toolhost mcp`'s start: to `initialize` answered, to the first `tools/list`, in ms.
    stdio_start: (f64, f64),
}

/// `get-sum` hosted over streamable HTTP, as toolhost names it.
const HOSTED_HTTP_TOOL: &str = "http__get-sum";
/// The same sum as a `[[commands]]` tool: `expr a + b`, a process per call.
const COMMAND_TOOL: &str = "sum_command";

/// The daemon's configuration: the MCP door, server-everything over stdio (`everything__`) and,
/// when `http_url` is given, over streamable HTTP (`http__`), `expr` as a `[[commands]]` tool,
/// and the picture server over stdio (`pictures__`).
fn daemon_config(
    program: &Path,
    door_port: Option<u16>,
    http_url: Option<&str>,
    command: bool,
    pictures: Option<&Pictures>,
) -> String {
    let user =
        std::env::var("USER").ok().filter(|user| !user.is_empty()).unwrap_or_else(|| "root".to_owned());
    let mut config = String::new();
    if let Some(port) = door_port {
        config.push_str(&format!("[mcp]\nlisten = \"127.0.0.1:{port}\"\n"));
    }
    config.push_str(&format!(
        "[tools.terminal]\nrun_as = \"{user}\"\n\n[[mcp_servers]]\nname = \"everything\"\ncommand = \"{}\"\n\
         args = [\"stdio\"]\nmax_concurrent = 64\n",
        program.display()
    ));
    if let Some(url) = http_url {
        config.push_str(&format!(
            "\n[[mcp_servers]]\nname = \"everything-http\"\nprefix = \"http__\"\nurl = \"{url}\"\nmax_concurrent = 64\n"
        ));
    }
    if command {
        config.push_str(&format!(
            "\n[[commands]]\nname = \"{COMMAND_TOOL}\"\ndescription = \"a + b, by expr.\"\nargv = [\"expr\", \"{{a}}\", \"+\", \"{{b}}\"]\n\
             argument_schema = {{ type = \"object\", properties = {{ a = {{ type = \"integer\" }}, b = {{ type = \"integer\" }} }}, required = [\"a\", \"b\"] }}\n"
        ));
    }
    if let Some(pictures) = pictures {
        let args = pictures.args().map(|arg| format!("{arg:?}")).join(", ");
        config.push_str(&format!(
            "\n[[mcp_servers]]\nname = \"pictures\"\ncommand = \"node\"\nargs = [{args}]\nmax_concurrent = 64\n"
        ));
    }
    config
}

/// A started `toolhost serve` against `redis`, killed on drop.
struct Daemon {
    child: tokio::process::Child,
    dir: PathBuf,
}

impl Daemon {
    /// Starts it with `config` and waits until every tool of `tools` is in its registry.
    async fn start(
        toolhost_bin: &Path,
        redis: &RedisServer,
        connection: &MultiplexedConnection,
        config: &str,
        tools: &[&str],
    ) -> anyhow::Result<Daemon> {
        static STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let start = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("toolhost-bench-mcp-{}-{start}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("toolhost.toml");
        std::fs::write(&path, config)?;
        let child = tokio::process::Command::new(toolhost_bin)
            .args(["serve", "--config"])
            .arg(&path)
            .env("REDIS_URL", redis.url())
            .env("TOOLHOST__HTTP__LISTEN", "127.0.0.1:0")
            .env("TOOLHOST__LOG__LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting toolhost")?;
        let daemon = Daemon { child, dir };
        let mut probe = connection.clone();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let fields: Vec<String> = redis::cmd("HKEYS")
                .arg("toolhost:registry:toolhost")
                .query_async(&mut probe)
                .await
                .unwrap_or_default();
            if tools.iter().all(|tool| fields.iter().any(|field| field == tool)) {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "toolhost never listed {tools:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // As `toolhost-bench` measures idle memory: a moment after the start settles.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(daemon)
    }

    fn memory(&self) -> Option<toolhost_bench::procfs::Memory> {
        self.child.id().and_then(|pid| toolhost_bench::procfs::memory(pid).ok())
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// server-everything over streamable HTTP on a free loopback port, killed on drop.
struct HttpServer {
    child: tokio::process::Child,
    url: String,
}

impl HttpServer {
    async fn start(program: &Path) -> anyhow::Result<HttpServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = tokio::process::Command::new(program)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting server-everything over streamable HTTP")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            anyhow::ensure!(Instant::now() < deadline, "server-everything never listened on {port}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(HttpServer { child, url: format!("http://127.0.0.1:{port}/mcp") })
    }
}

/// The same server spoken to directly over streamable HTTP by an rmcp client.
async fn direct_http(url: &str, server: u32) -> anyhow::Result<Row> {
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_owned());
    let client = Arc::new(().serve(transport).await.context("initialising the HTTP MCP session")?);
    measure_direct(
        "direct (rmcp client, streamable HTTP)",
        client,
        server,
        "get-sum",
        arguments(),
        &Expect::Success,
    )
    .await
}

/// Idle memory of `toolhost serve` without an MCP server, and with server-everything hosted over
/// stdio (its session open, no call yet).
async fn idle_memory(
    program: &Path,
    toolhost_bin: &Path,
) -> anyhow::Result<(Option<toolhost_bench::procfs::Memory>, Option<toolhost_bench::procfs::Memory>)> {
    let redis = RedisServer::start()?;
    let connection = redis::Client::open(redis.url())?.get_multiplexed_async_connection().await?;
    let plain = Daemon::start(toolhost_bin, &redis, &connection, "", &["echo"]).await?;
    let without = plain.memory();
    plain.stop().await;
    let config = daemon_config(program, None, None, false, None);
    let hosted = Daemon::start(toolhost_bin, &redis, &connection, &config, &[HOSTED_TOOL]).await?;
    let with = hosted.memory();
    hosted.stop().await;
    Ok((without, with))
}

/// `toolhost serve` hosting server-everything over stdio and over streamable HTTP, `expr` as a
/// command, and its MCP door, driven over Redis. Echo over Redis, the hosted and command sums and
/// the door's rows take turns, round by round; each row is the median of its rounds. The picture
/// server's image must arrive as `image` (its base64).
async fn toolhost(
    program: &Path,
    toolhost_bin: &Path,
    http_server: &HttpServer,
    pictures: &Pictures,
    image: &Arc<str>,
) -> anyhow::Result<Measured> {
    let http_url = http_server.url.as_str();
    let redis = RedisServer::start()?;
    let door_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let client = redis::Client::open(redis.url())?;
    let connection = client.get_multiplexed_async_connection().await?;
    let config = daemon_config(program, Some(door_port), Some(http_url), true, Some(pictures));
    let daemon = Daemon::start(
        toolhost_bin,
        &redis,
        &connection,
        &config,
        &[HOSTED_TOOL, HOSTED_HTTP_TOOL, COMMAND_TOOL, TEXT_TOOL, IMAGE_TOOL],
    )
    .await?;
    let mut watched = vec![
        ("bench", std::process::id(), Scope::Own),
        ("redis", redis.pid(), Scope::Own),
        ("toolhost", daemon.child.id().context("the daemon's pid")?, Scope::Own),
        ("stdio server, commands", daemon.child.id().context("the daemon's pid")?, Scope::Children),
    ];
    if let Some(pid) = http_server.child.id() {
        watched.push(("HTTP server", pid, Scope::Tree));
    }
    let all_lanes = Lanes::open(&client).await?;
    let pings = connection.clone();
    let floor = measure("redis PING round trip", &watched, move |_| {
        let mut pings = pings.clone();
        async move {
            let _: String = redis::cmd("PING").query_async(&mut pings).await?;
            Ok(())
        }
    })
    .await?;
    let transport =
        rmcp::transport::StreamableHttpClientTransport::from_uri(format!("http://127.0.0.1:{door_port}/mcp"));
    let door = Arc::new(().serve(transport).await.context("initialising a session with the MCP door")?);
    let plain = Arc::new(PlainSession::open(door_port).await?);
    let modern = Arc::new(PlainModern::new(door_port)?);
    let mut rounds: [Vec<Row>; 7] = Default::default();
    // The picture server's text and image over Redis, then through the door.
    let mut picture_rounds: [Vec<Row>; 4] = Default::default();
    let image = Expect::Image(Arc::clone(image));
    for round in 0..ROUNDS {
        eprintln!("bench-mcp: round {}/{ROUNDS}", round + 1);
        let success = Expect::Success;
        let over_redis = [
            (
                "echo over Redis (tool.invoke, a results stream per lane)",
                "echo",
                json!({"message": "hi"}),
                &success,
            ),
            ("get-sum over Redis, hosted over stdio", HOSTED_TOOL, Value::Object(arguments()), &success),
            (
                "get-sum over Redis, hosted over streamable HTTP",
                HOSTED_HTTP_TOOL,
                Value::Object(arguments()),
                &success,
            ),
            (
                "sum over Redis, as [[commands]] (expr, a process per call)",
                COMMAND_TOOL,
                Value::Object(arguments()),
                &success,
            ),
        ];
        let pictures_over_redis = [
            ("text over Redis (tool.invoke), hosted over stdio", TEXT_TOOL, json!({}), &success),
            ("image over Redis (tool.invoke), hosted over stdio", IMAGE_TOOL, json!({}), &image),
        ];
        let rows = rounds.iter_mut().take(4).chain(picture_rounds.iter_mut().take(2));
        for (row, (target, tool, arguments, expect)) in
            rows.zip(over_redis.into_iter().chain(pictures_over_redis))
        {
            let (lanes, expect) = (all_lanes.clone(), expect.clone());
            row.push(
                measure(target, &watched, move |lane| {
                    let (lanes, arguments, expect) = (lanes.clone(), arguments.clone(), expect.clone());
                    async move { invoke(&lanes, lane, tool, arguments, &expect).await }
                })
                .await?,
            );
        }
        let door_pictures = [
            ("text through the MCP door (/mcp, rmcp streamable HTTP client)", TEXT_TOOL, &success),
            ("image through the MCP door (/mcp, rmcp streamable HTTP client)", IMAGE_TOOL, &image),
        ];
        for (row, (target, tool, expect)) in picture_rounds.iter_mut().skip(2).zip(door_pictures) {
            let (door, expect) = (Arc::clone(&door), expect.clone());
            row.push(
                measure(target, &watched, move |_| {
                    let (door, expect) = (Arc::clone(&door), expect.clone());
                    async move { expect.check(tool, &door.call_tool(CallToolRequestParams::new(tool)).await?) }
                })
                .await?,
            );
        }
        let door = Arc::clone(&door);
        rounds[4].push(
            measure("echo through the MCP door (/mcp, rmcp streamable HTTP client)", &watched, move |_| {
                let door = Arc::clone(&door);
                async move {
                    let mut params = CallToolRequestParams::new("echo");
                    params.arguments = json!({"message": "hi"}).as_object().cloned();
                    Expect::Success.check("echo", &door.call_tool(params).await?)
                }
            })
            .await?,
        );
        let plain = Arc::clone(&plain);
        rounds[5].push(
            measure("echo through the MCP door (/mcp, one plain HTTP POST per call)", &watched, move |_| {
                let plain = Arc::clone(&plain);
                async move { plain.echo().await }
            })
            .await?,
        );
        let modern = Arc::clone(&modern);
        rounds[6].push(
            measure(
                "echo through the MCP door (/mcp, plain HTTP POSTs, 2026-07-28: no session)",
                &watched,
                move |_| {
                    let modern = Arc::clone(&modern);
                    async move { modern.echo().await }
                },
            )
            .await?,
        );
    }
    let [echo_redis, hosted, hosted_http, command, echo_door, echo_plain, echo_modern] = rounds.map(median);
    let [text_redis, image_redis, text_door, image_door] = picture_rounds.map(median);
    let stdio_start = stdio_start(toolhost_bin, &redis.url(), &daemon.dir).await?;
    daemon.stop().await;
    Ok(Measured {
        hosted,
        hosted_http,
        command,
        floor,
        echo_redis,
        echo_door,
        echo_plain,
        echo_modern,
        text_redis,
        image_redis,
        text_door,
        image_door,
        stdio_start,
    })
}

/// An MCP session on the door driven with plain HTTP POSTs (reqwest, keep-alive): a caller
/// much lighter than the rmcp client, so that the door's own cost shows.
struct PlainSession {
    http: reqwest::Client,
    url: String,
    session: String,
    next_id: std::sync::atomic::AtomicU64,
}

impl PlainSession {
    async fn open(port: u16) -> anyhow::Result<PlainSession> {
        let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
        let url = format!("http://127.0.0.1:{port}/mcp");
        let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}});
        let response = PlainSession::post(&http, &url, None, &initialize).await?;
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|value| value.to_str().ok())
            .context("the door opened no session")?
            .to_owned();
        response.bytes().await?;
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        PlainSession::post(&http, &url, Some(&session), &initialized).await?.bytes().await?;
        Ok(PlainSession { http, url, session, next_id: std::sync::atomic::AtomicU64::new(1) })
    }

    async fn post(
        http: &reqwest::Client,
        url: &str,
        session: Option<&str>,
        body: &Value,
    ) -> anyhow::Result<reqwest::Response> {
        let mut request = http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string());
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        let response = request.send().await?;
        anyhow::ensure!(response.status().is_success(), "the door answered {}", response.status());
        Ok(response)
    }

    /// One `tools/call` of echo, with an id of its own; the SSE body must hold its result.
    async fn echo(&self) -> anyhow::Result<()> {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": "hi"}}});
        let body =
            PlainSession::post(&self.http, &self.url, Some(&self.session), &call).await?.text().await?;
        anyhow::ensure!(body.contains("\"isError\":false"), "echo failed: {body}");
        Ok(())
    }
}

/// MCP 2026-07-28 calls of the door with plain HTTP POSTs (reqwest, keep-alive): no session,
/// each request with its version and capabilities in `_meta` and its `Mcp-Method`/`Mcp-Name`
/// headers, the answer one JSON body.
struct PlainModern {
    http: reqwest::Client,
    url: String,
    next_id: std::sync::atomic::AtomicU64,
}

impl PlainModern {
    fn new(port: u16) -> anyhow::Result<PlainModern> {
        let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
        Ok(PlainModern {
            http,
            url: format!("http://127.0.0.1:{port}/mcp"),
            next_id: std::sync::atomic::AtomicU64::new(1),
        })
    }

    async fn echo(&self) -> anyhow::Result<()> {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "echo", "arguments": {"message": "hi"}, "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}}}});
        let response = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "echo")
            .body(call.to_string())
            .send()
            .await?;
        anyhow::ensure!(response.status().is_success(), "the door answered {}", response.status());
        let body = response.text().await?;
        anyhow::ensure!(body.contains("\"isError\":false"), "echo failed: {body}");
        Ok(())
    }
}

/// A Markdown table of `rows`.
fn rows_table(rows: &[&Row]) -> String {
    let mut table = String::from(
        "| target | p50 µs (1 in flight) | p99 µs (1 in flight) | calls/s (16 in flight) | CPU µs per call at 16 in flight |\n\
         |---|---:|---:|---:|---|\n",
    );
    for row in rows {
        let cpu: Vec<String> = row.cpu_us.iter().map(|(label, us)| format!("{label} {us:.1}")).collect();
        table.push_str(&format!(
            "| {} | {} | {} | {:.0} | {} |\n",
            row.target,
            row.p50_us,
            row.p99_us,
            row.calls_per_s,
            cpu.join(", ")
        ));
    }
    table
}

/// The median of each column over the rounds of one target.
fn median(mut rounds: Vec<Row>) -> Row {
    fn middle<T: Copy + PartialOrd>(mut values: Vec<T>) -> T {
        values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        values[values.len() / 2]
    }
    let p50_us = middle(rounds.iter().map(|row| row.p50_us).collect());
    let p99_us = middle(rounds.iter().map(|row| row.p99_us).collect());
    let calls_per_s = middle(rounds.iter().map(|row| row.calls_per_s).collect());
    let labels: Vec<&'static str> =
        rounds.first().map(|row| row.cpu_us.iter().map(|&(label, _)| label).collect()).unwrap_or_default();
    let cpu_us = labels
        .into_iter()
        .map(|label| {
            let values: Vec<f64> = rounds
                .iter()
                .filter_map(|row| row.cpu_us.iter().find(|(other, _)| *other == label).map(|&(_, us)| us))
                .collect();
            (label, if values.is_empty() { 0.0 } else { middle(values) })
        })
        .collect();
    let target = rounds.pop().map_or("", |row| row.target);
    Row { target, p50_us, p99_us, calls_per_s, cpu_us }
}

/// `toolhost mcp` from spawn to its answer to `initialize`, and to its first `tools/list`: the
/// median of `ROUNDS` starts, in milliseconds.
async fn stdio_start(toolhost_bin: &Path, redis_url: &str, dir: &Path) -> anyhow::Result<(f64, f64)> {
    let config = dir.join("stdio.toml");
    std::fs::write(&config, format!("[redis]\nurl = \"{redis_url}\"\n"))?;
    let (mut initialized, mut listed) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let mut child = tokio::process::Command::new(toolhost_bin)
            .arg("mcp")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting toolhost mcp")?;
        let (stdin, stdout) = (child.stdin.take().context("stdin")?, child.stdout.take().context("stdout")?);
        let client = ().serve((stdout, stdin)).await.context("initialising toolhost mcp")?;
        initialized.push(started.elapsed().as_secs_f64() * 1000.0);
        let tools = client.list_tools(None).await?;
        anyhow::ensure!(tools.tools.iter().any(|tool| tool.name == "echo"), "toolhost mcp listed no echo");
        listed.push(started.elapsed().as_secs_f64() * 1000.0);
        let _ = client.cancel().await;
        let _ = child.kill().await;
    }
    for values in [&mut initialized, &mut listed] {
        values.sort_by(f64::total_cmp);
    }
    Ok((initialized[ROUNDS / 2], listed[ROUNDS / 2]))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let program = everything()?;
    let toolhost_bin = std::env::current_exe()?.with_file_name("toolhost");
    // The HTTP clients are built without a TLS provider of their own.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let direct = direct(&program).await?;
    let pictures = Pictures::new(&program)?;
    let (text_direct, image_direct, image) = direct_pictures(&pictures).await?;
    let http_server = HttpServer::start(&program).await?;
    let direct_http =
        direct_http(&http_server.url, http_server.child.id().context("the HTTP server's pid")?).await?;
    let Measured {
        hosted,
        hosted_http,
        command,
        floor,
        echo_redis,
        echo_door,
        echo_plain,
        echo_modern,
        text_redis,
        image_redis,
        text_door,
        image_door,
        stdio_start,
    } = toolhost(&program, &toolhost_bin, &http_server, &pictures, &image).await?;
    let (without_mcp, with_mcp) = idle_memory(&program, &toolhost_bin).await?;
    let mut table = rows_table(&[
        &direct,
        &direct_http,
        &floor,
        &echo_redis,
        &hosted,
        &hosted_http,
        &command,
        &echo_door,
        &echo_plain,
        &echo_modern,
    ]);
    let above = |row: &Row, base: &Row| row.p50_us as i64 - base.p50_us as i64;
    table.push_str(&format!(
        "\nRows through toolhost are the medians of {ROUNDS} interleaved rounds.\n\
         Hosted over stdio, get-sum costs {:+} µs at p50 over echo through the same daemon (target ≤ +150), {:+} µs over the \
         direct call (the Redis round trip alone is {} µs), and keeps {:.2} of the direct throughput at 16 in flight \
         (target ≥ 0.6; {:.2} of echo's).\n",
        above(&hosted, &echo_redis),
        above(&hosted, &direct),
        floor.p50_us,
        hosted.calls_per_s / direct.calls_per_s,
        hosted.calls_per_s / echo_redis.calls_per_s,
    ));
    table.push_str(&format!(
        "Hosted over streamable HTTP: {:+} µs over echo, {:+} µs over the direct HTTP call, {:.2} of its throughput. \
         As a `[[commands]]` tool (`expr`, a process per call): {:+} µs over echo, {:.0} calls/s.\n",
        above(&hosted_http, &echo_redis),
        above(&hosted_http, &direct_http),
        hosted_http.calls_per_s / direct_http.calls_per_s,
        above(&command, &echo_redis),
        command.calls_per_s,
    ));
    table.push_str(&format!(
        "The MCP door adds {} µs at p50 to echo over Redis and keeps {:.2} of its throughput at 16 in flight with the rmcp client; {} µs and {:.2} with plain HTTP POSTs.\n",
        echo_door.p50_us.saturating_sub(echo_redis.p50_us),
        echo_door.calls_per_s / echo_redis.calls_per_s,
        echo_plain.p50_us.saturating_sub(echo_redis.p50_us),
        echo_plain.calls_per_s / echo_redis.calls_per_s
    ));
    table.push_str(&format!(
        "In MCP 2026-07-28 (plain POSTs, no session), the door adds {} µs at p50 and keeps {:.2} of echo's throughput; beside the initialize session's plain POSTs: {:+} µs at p50, {:.2}× the throughput.\n",
        echo_modern.p50_us.saturating_sub(echo_redis.p50_us),
        echo_modern.calls_per_s / echo_redis.calls_per_s,
        echo_modern.p50_us as i64 - echo_plain.p50_us as i64,
        echo_modern.calls_per_s / echo_plain.calls_per_s
    ));
    table.push_str(&format!(
        "`toolhost mcp` answers initialize {:.1} ms after it is spawned and its first tools/list {:.1} ms after (median of {ROUNDS} starts).\n",
        stdio_start.0, stdio_start.1
    ));
    let mib = |kib: u64| kib as f64 / 1024.0;
    for (what, memory) in [
        ("without an MCP server", without_mcp),
        ("with server-everything hosted over stdio (session open, no call yet)", with_mcp),
    ] {
        if let Some(memory) = memory {
            table.push_str(&format!(
                "toolhost idle {what}: RSS {:.1} MiB, anonymous {:.1} MiB, file-backed {:.1} MiB, PSS {}.\n",
                mib(memory.rss_kib),
                mib(memory.anon_kib),
                mib(memory.file_kib),
                memory.pss_kib.map_or_else(|| "unknown".to_owned(), |kib| format!("{:.1} MiB", mib(kib))),
            ));
        }
    }
    let image_bytes = base64::engine::general_purpose::STANDARD.decode(&*image)?.len();
    table.push_str(&format!(
        "\nA hosted tool answering a {:.1} KiB PNG ({} bytes of base64) beside one answering a short text, the same \
         server (`picture_server.mjs`, TypeScript SDK, hosted over stdio):\n\n",
        image_bytes as f64 / 1024.0,
        image.len()
    ));
    table.push_str(&rows_table(&[
        &text_direct,
        &image_direct,
        &text_redis,
        &image_redis,
        &text_door,
        &image_door,
    ]));
    table.push_str(&format!(
        "\nThe image costs {:+} µs at p50 over text directly, {:+} µs over Redis and {:+} µs through the MCP door; at 16 in \
         flight it keeps {:.2} of text's throughput directly, {:.2} over Redis and {:.2} through the door.\n",
        above(&image_direct, &text_direct),
        above(&image_redis, &text_redis),
        above(&image_door, &text_door),
        image_direct.calls_per_s / text_direct.calls_per_s,
        image_redis.calls_per_s / text_redis.calls_per_s,
        image_door.calls_per_s / text_door.calls_per_s,
    ));
    print!("{table}");
    let out = PathBuf::from("target/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("mcp.md"), &table)?;
    Ok(())
}
