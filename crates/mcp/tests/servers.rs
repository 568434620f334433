//! toolhost-mcp against real, unmodified MCP servers: `mcp-server-time` (PyPI, stdio) and
//! `@modelcontextprotocol/server-everything` (npm, stdio and streamable HTTP), installed by
//! `scripts/ensure-mcp-servers.sh`. Ignored by a plain `cargo test`; `just test-mcp` runs them.

#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use support::*;
use tokio_util::sync::CancellationToken;
use toolhost_envelope::{Annotations, DiscoveryFormat, ErrorCode};
use toolhost_mcp::{Children, McpEvent, McpSources, StartError, mapping};
use toolhost_tools::{Context, Input, InputKind, InputReply, InputRequest, Progress, ProgressReport};

fn time_config() -> String {
    format!(
        "[[mcp_servers]]\nname = \"time\"\ncommand = \"{}\"\nargs = [\"--local-timezone\", \"UTC\"]\n",
        time_server()
    )
}

fn everything_config(name: &str, extra: &str) -> String {
    format!(
        "[[mcp_servers]]\nname = \"{name}\"\ncommand = \"node\"\nargs = [\"{}\", \"stdio\"]\n{extra}",
        everything()
    )
}

async fn next_event(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<McpEvent>,
    limit: Duration,
) -> McpEvent {
    tokio::time::timeout(limit, events.recv())
        .await
        .unwrap_or_else(|_| panic!("no MCP event within {limit:?}"))
        .expect("the event channel closed")
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn stdio_time_server_tools_are_prefixed_mapped_and_answer_structured_content() {
    let sources = Sources::start(&time_config(), &env(&[])).await;
    let registry = sources.registry();
    assert_eq!(registry.names(), ["time__convert_time", "time__get_current_time"]);
    let description = registry.description("time__get_current_time").unwrap();
    // readOnlyHint: true from the server; a read-only tool is never destructive.
    assert_eq!(
        description.annotations,
        Annotations { read_only: true, idempotent: true, destructive: false }
    );
    assert_eq!(description.output_schema["title"], "TimeResult", "outputSchema is the output schema");
    assert_eq!(
        description.argument_schema["required"],
        json!(["timezone"]),
        "inputSchema is the argument schema"
    );
    assert_eq!(description.timeout_ms, 60_000);

    // structuredContent is the answer, and it passed the output schema in the registry.
    let now = call(&registry, "time__get_current_time", json!({"timezone": "UTC"})).await.unwrap();
    assert_eq!(now["timezone"], "UTC");
    assert!(now["datetime"].as_str().unwrap().ends_with("+00:00"), "{now}");
    let exported = registry.export(DiscoveryFormat::Openai, "requests", "results");
    assert!(exported.iter().any(|tool| tool["function"]["name"] == "time__get_current_time"), "{exported:?}");
    sources.stop().await;
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn an_is_error_result_answers_tool_failed_with_the_servers_text() {
    let sources = Sources::start(&time_config(), &env(&[])).await;
    let registry = sources.registry();
    let failure = call(&registry, "time__get_current_time", json!({"timezone": "Mars/Olympus_Mons"}))
        .await
        .unwrap_err();
    assert_eq!(failure.code, ErrorCode::ToolFailed);
    assert!(failure.message.contains("Invalid timezone"), "{failure:?}");
    assert!(failure.message.contains("Mars/Olympus_Mons"), "{failure:?}");
    sources.stop().await;
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn everything_tools_keep_hyphens_and_answer_text_structured_content_and_content_lists() {
    let sources = Sources::start(&everything_config("everything", ""), &env(&[])).await;
    let registry = sources.registry();
    for name in ["everything__get-sum", "everything__get-tiny-image", "everything__get-structured-content"] {
        assert!(registry.contains(name), "{name} missing from {:?}", registry.names());
    }
    // No outputSchema: the documented permissive schema.
    let sum = registry.description("everything__get-sum").unwrap();
    assert_eq!(sum.output_schema, mapping::permissive_output_schema());
    // The server's hints, as given (absent ones would take MCP's defaults; see the mapping's
    // unit tests, since every tool of these servers has hints).
    assert_eq!(sum.annotations, Annotations { read_only: true, idempotent: true, destructive: false });

    // Text-only content: the text.
    let text = call(&registry, "everything__get-sum", json!({"a": 2, "b": 3})).await.unwrap();
    assert_eq!(text, json!("The sum of 2 and 3 is 5."));
    // structuredContent, validated against the declared outputSchema.
    let weather =
        call(&registry, "everything__get-structured-content", json!({"location": "Chicago"})).await.unwrap();
    for key in ["temperature", "conditions", "humidity"] {
        assert!(weather.get(key).is_some(), "{weather}");
    }
    // Other content: the texts as the result, the blocks as the server gave them beside it.
    let image = call_output(&registry, "everything__get-tiny-image", json!({})).await.unwrap();
    assert_eq!(image.result, json!("Here's the image you requested:\nThe image above is the MCP logo."));
    let blocks = image.content.expect("content blocks");
    let picture = blocks.iter().find(|block| block["type"] == "image").expect("an image block");
    assert_eq!(picture["mimeType"], "image/png");
    assert!(picture["data"].as_str().unwrap().starts_with("iVBOR"), "base64 PNG data");
    assert!(blocks.iter().any(|block| block["type"] == "text"));
    sources.stop().await;
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn an_answer_over_max_response_bytes_is_refused_naming_the_limit_and_smaller_ones_pass() {
    // The tiny image's answer is about 2 KiB of JSON; get-sum's is a few dozen bytes.
    let sources =
        Sources::start(&everything_config("everything", "max_response_bytes = 1024\n"), &env(&[])).await;
    let registry = sources.registry();
    let refused = call_output(&registry, "everything__get-tiny-image", json!({})).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::ToolFailed);
    assert!(refused.message.contains("over the server's max_response_bytes (1024)"), "{}", refused.message);
    let details = refused.details.unwrap();
    assert_eq!(details["limit_bytes"], 1024);
    assert_eq!(details["setting"], "max_response_bytes");
    assert!(details["size_bytes"].as_u64().unwrap() > 1024, "{details}");
    let sum = call_output(&registry, "everything__get-sum", json!({"a": 2, "b": 3})).await.unwrap();
    assert_eq!(sum.result, json!("The sum of 2 and 3 is 5."));
    sources.stop().await;
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn toolhost_declares_elicitation_and_sampling_asks_the_calls_caller_and_says_so_when_a_tool_needs_more()
{
    let dir = temp_dir("capabilities");
    let tap = dir.join("stdin.jsonl");
    let config = format!(
        "[[mcp_servers]]\nname = \"everything\"\n{}",
        tapped(&tap, "node", &[&everything(), "stdio"])
    );
    let sources = Sources::start(&config, &env(&[])).await;
    let initialize = tap_lines(&tap).into_iter().find(|line| line["method"] == "initialize").unwrap();
    assert_eq!(
        initialize["params"]["capabilities"],
        json!({"elicitation": {"form": {}}, "sampling": {}}),
        "{initialize}"
    );
    assert_eq!(initialize["params"]["clientInfo"]["name"], "toolhost");
    // server-everything registers these only for clients that declare sampling, elicitation or
    // roots: toolhost declares the first two.
    let registry = sources.registry();
    for name in ["trigger-sampling-request", "trigger-elicitation-request"] {
        assert!(registry.contains(&format!("everything__{name}")), "{name} missing: {:?}", registry.names());
    }
    assert!(!registry.contains("everything__get-roots-list"), "roots offered: {:?}", registry.names());
    // Over stdio a question names no call: it goes to the server's one call in flight, whose
    // input answers it.
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let input = {
        let asked = asked.clone();
        Input::new(move |question: InputRequest| {
            asked.lock().unwrap().push(question);
            Box::pin(async { InputReply::Answered(json!({"action": "accept", "content": {"name": "Ada"}})) })
        })
    };
    let context = Context { request_id: "asks".into(), input, ..Context::default() };
    let answered =
        registry.invoke("everything__trigger-elicitation-request", json!({}), &context, None).await.unwrap();
    assert!(answered.to_string().contains("- Name: Ada"), "{answered}");
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!((asked[0].kind, asked[0].method.as_str()), (InputKind::Elicitation, "elicitation/create"));
    assert_eq!(asked[0].params["requestedSchema"]["required"], json!(["name"]), "{asked:?}");
    // Without an input to ask, the question is declined and the tool decides.
    let declined = call(&registry, "everything__trigger-elicitation-request", json!({})).await.unwrap();
    assert!(declined.to_string().contains("User declined"), "{declined}");
    // A tool that must run as an MCP task (which toolhost does not offer) fails with the
    // server's sentence.
    let failure =
        call(&registry, "everything__simulate-research-query", json!({"topic": "tides"})).await.unwrap_err();
    assert_eq!(failure.code, ErrorCode::ToolFailed);
    assert!(failure.message.contains("requires task augmentation"), "{failure:?}");
    sources.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn the_servers_list_changed_makes_toolhost_list_again() {
    // server-everything registers simulate-research-query once initialised and then sends
    // notifications/tools/list_changed.
    let dir = temp_dir("list-changed");
    let tap = dir.join("stdin.jsonl");
    let config = format!(
        "[[mcp_servers]]\nname = \"everything\"\n{}",
        tapped(&tap, "node", &[&everything(), "stdio"])
    );
    let mut sources = Sources::start(&config, &env(&[])).await;
    eventually("a second tools/list on the wire", Duration::from_secs(10), || {
        (tap_lines(&tap).iter().filter(|line| line["method"] == "tools/list").count() == 2).then_some(())
    })
    .await;
    // The new list is taken in: the late tool is there, announced if the first list lacked it.
    let names = eventually("the late tool in the list", Duration::from_secs(10), || {
        let names: Vec<String> = sources.sources().tools().iter().map(|tool| tool.spec().name).collect();
        names.iter().any(|name| name == "everything__simulate-research-query").then_some(names)
    })
    .await;
    assert!(names.contains(&"everything__get-sum".to_owned()), "{names:?}");
    if let Ok(event) = sources.started.events.try_recv() {
        assert_eq!(event, McpEvent::ToolsChanged { source: "everything".into() });
    }
    assert_eq!(sources.sources().status()[0].restarts, 0, "listed again without a restart");
    sources.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn the_allow_list_takes_original_names_and_an_empty_prefix_is_allowed() {
    let config =
        everything_config("everything", "prefix = \"\"\ntools = [\"get-sum\", \"echo\", \"no-such-tool\"]\n");
    let sources = Sources::start(&config, &env(&[])).await;
    assert_eq!(sources.registry().names(), ["echo", "get-sum"]);
    assert_eq!(sources.sources().status()[0].tools, 2);
    sources.stop().await;
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn arguments_the_schema_refuses_never_reach_the_server() {
    let dir = temp_dir("validation");
    let tap = dir.join("stdin.jsonl");
    let config = format!(
        "[[mcp_servers]]\nname = \"everything\"\n{}",
        tapped(&tap, "node", &[&everything(), "stdio"])
    );
    let sources = Sources::start(&config, &env(&[])).await;
    let registry = sources.registry();
    let failure = call(&registry, "everything__get-sum", json!({"a": "two", "b": 3})).await.unwrap_err();
    assert_eq!(failure.code, ErrorCode::InvalidArguments);
    assert_eq!(failure.details.unwrap()["errors"][0]["pointer"], "/a");
    // A valid call afterwards is on the wire, the refused one is not.
    call(&registry, "everything__get-sum", json!({"a": 1, "b": 3})).await.unwrap();
    let calls: Vec<Value> = eventually("the valid call on the wire", Duration::from_secs(10), || {
        let calls: Vec<Value> =
            tap_lines(&tap).into_iter().filter(|line| line["method"] == "tools/call").collect();
        (!calls.is_empty()).then_some(calls)
    })
    .await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["params"]["arguments"], json!({"a": 1, "b": 3}));
    sources.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn children_get_only_their_env_plus_path_home_lang_and_the_terminal_rlimits() {
    let config = everything_config("everything", "env = { GREETING = \"hello ${WHO}\" }\n");
    let sources = Sources::start(&config, &env(&[("WHO", "world")])).await;
    let registry = sources.registry();
    let text = call(&registry, "everything__get-env", json!({})).await.unwrap();
    let child_env: serde_json::Map<String, Value> = serde_json::from_str(text.as_str().unwrap()).unwrap();
    let names: BTreeSet<&str> = child_env.keys().map(String::as_str).collect();
    assert_eq!(names, BTreeSet::from(["GREETING", "HOME", "LANG", "PATH"]), "{child_env:?}");
    assert_eq!(child_env["GREETING"], "hello world", "${{VAR}} is expanded from the daemon's environment");
    assert_eq!(child_env["PATH"], std::env::var("PATH").unwrap());

    let pid = sources.sources().status()[0].pid.unwrap();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let file_size = limits.lines().find(|line| line.starts_with("Max file size")).unwrap();
    assert!(file_size.contains(&FILE_SIZE_LIMIT.to_string()), "{file_size}");
    // Its own process group and session: the child leads its group.
    assert!(group_members(pid).iter().any(|(member, _)| *member == pid));
    sources.stop().await;
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn a_call_cut_by_its_deadline_or_cancelled_sends_notifications_cancelled_to_the_server() {
    let dir = temp_dir("cancel");
    let tap = dir.join("stdin.jsonl");
    let config = format!(
        "[[mcp_servers]]\nname = \"everything\"\n{}",
        tapped(&tap, "node", &[&everything(), "stdio"])
    );
    let sources = Sources::start(&config, &env(&[])).await;
    let registry = sources.registry();
    let long = json!({"duration": 30, "steps": 30});

    // Cut by the request's deadline (the registry drops the call).
    let context = Context { request_id: "deadline".into(), ..Context::default() };
    let cut = registry
        .invoke(
            "everything__trigger-long-running-operation",
            long.clone(),
            &context,
            Some(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert_eq!(cut.code, ErrorCode::Timeout, "{cut:?}");

    // Cancelled through the context (shutdown or a timeout elsewhere).
    let cancel = CancellationToken::new();
    let context = Context { request_id: "cancelled".into(), cancel: cancel.clone(), ..Context::default() };
    let registry = std::sync::Arc::new(registry);
    let running = {
        let registry = registry.clone();
        tokio::spawn(async move {
            registry.invoke("everything__trigger-long-running-operation", long, &context, None).await
        })
    };
    eventually("the second call on the wire", Duration::from_secs(10), || {
        (tap_lines(&tap).iter().filter(|line| line["method"] == "tools/call").count() == 2).then_some(())
    })
    .await;
    cancel.cancel();
    let cancelled =
        tokio::time::timeout(Duration::from_secs(10), running).await.unwrap().unwrap().unwrap_err();
    assert_eq!(cancelled.code, ErrorCode::Timeout, "{cancelled:?}");

    // Both requests were cancelled on the wire, by their JSON-RPC ids.
    let (calls, cancellations) =
        eventually("two notifications/cancelled on the wire", Duration::from_secs(10), || {
            let lines = tap_lines(&tap);
            let calls: Vec<Value> = lines
                .iter()
                .filter(|line| line["method"] == "tools/call")
                .map(|line| line["id"].clone())
                .collect();
            let cancelled: Vec<Value> = lines
                .iter()
                .filter(|line| line["method"] == "notifications/cancelled")
                .map(|line| line["params"]["requestId"].clone())
                .collect();
            (cancelled.len() == 2).then_some((calls, cancelled))
        })
        .await;
    assert_eq!(calls, cancellations);
    // The server is still up and answers after the cancellations.
    call(&registry, "everything__get-sum", json!({"a": 1, "b": 1})).await.unwrap();
    sources.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn a_killed_child_is_restarted_and_its_tools_answer_overloaded_meanwhile() {
    let dir = temp_dir("restart");
    // The server starts only while the gate file exists, so the test holds it down at will; its
    // stdin is tapped, so the test sees when a call has reached it.
    let tap = dir.join("stdin.jsonl");
    let gate = dir.join("stdin.jsonl.gate");
    std::fs::write(&gate, "open").unwrap();
    let config = format!(
        "[[mcp_servers]]\nname = \"everything\"\ncommand = \"/bin/sh\"\nargs = {}\n",
        serde_json::to_string(&json!([
            "-c",
            r#"test -e "$0.gate" || exit 3; tee -a "$0" | exec "$@""#,
            tap.display().to_string(),
            "node",
            everything(),
            "stdio"
        ]))
        .unwrap()
    );
    let mut sources = Sources::start(&config, &env(&[])).await;
    let registry = std::sync::Arc::new(sources.registry());
    let first_pid = sources.sources().status()[0].pid.unwrap();
    call(&registry, "everything__get-sum", json!({"a": 1, "b": 2})).await.unwrap();

    // A call running when the child dies answers tool_failed (and is not run again).
    let running = {
        let registry = registry.clone();
        tokio::spawn(async move {
            call(
                &registry,
                "everything__trigger-long-running-operation",
                json!({"duration": 30, "steps": 30}),
            )
            .await
        })
    };
    eventually("the long call on the wire", Duration::from_secs(10), || {
        tap_lines(&tap)
            .iter()
            .any(|line| line["params"]["name"] == "trigger-long-running-operation")
            .then_some(())
    })
    .await;
    std::fs::remove_file(&gate).unwrap();
    let killed =
        std::process::Command::new("kill").args(["-KILL", "--", &format!("-{first_pid}")]).status().unwrap();
    assert!(killed.success());
    let died = tokio::time::timeout(Duration::from_secs(10), running).await.unwrap().unwrap().unwrap_err();
    assert_eq!(died.code, ErrorCode::ToolFailed, "{died:?}");
    assert!(died.message.contains("went away"), "{died:?}");
    let down = next_event(&mut sources.started.events, Duration::from_secs(10)).await;
    assert!(matches!(&down, McpEvent::Down { source, .. } if source == "everything"), "{down:?}");

    // Down: its tools stay listed and answer at once, overloaded, with a retry hint.
    assert!(sources.sources().tools().iter().any(|tool| tool.spec().name == "everything__get-sum"));
    let started = std::time::Instant::now();
    let failure = call(&registry, "everything__get-sum", json!({"a": 1, "b": 2})).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1), "answered at once");
    assert_eq!(failure.code, ErrorCode::Overloaded, "{failure:?}");
    assert!(failure.details.unwrap()["retry_after_ms"].as_u64().unwrap() >= 100);
    let status = eventually("a failed restart", Duration::from_secs(20), || {
        let status = sources.sources().status().remove(0);
        (status.restarts >= 1 && !status.up).then_some(status)
    })
    .await;
    assert!(status.last_error.is_some(), "{status:?}");
    // The killed group is dead and what is ours of it was reaped. tee and node, orphaned when
    // sh died, belong to init (tests/shutdown.rs shows them reaped when they come to us).
    let me = std::process::id();
    let left = group_members_with_parents(first_pid);
    assert!(left.iter().all(|&(_, state, parent)| state == 'Z' && parent != me), "{left:?}");
    assert!(!process_exists(first_pid), "the leader was waited for");

    std::fs::write(&gate, "open").unwrap();
    let up = next_event(&mut sources.started.events, Duration::from_secs(45)).await;
    assert_eq!(up, McpEvent::Up { source: "everything".into() });
    let status = sources.sources().status().remove(0);
    assert!(status.up && status.restarts >= 1 && status.pid != Some(first_pid), "{status:?}");
    let sum = call(&registry, "everything__get-sum", json!({"a": 1, "b": 2})).await.unwrap();
    assert_eq!(sum, json!("The sum of 1 and 2 is 3."));
    sources.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn two_servers_serving_the_same_tool_name_are_refused_naming_both() {
    let config = format!(
        "{}\n{}",
        everything_config("first", "prefix = \"\"\ntools = [\"get-sum\"]\n"),
        everything_config("second", "prefix = \"\"\ntools = [\"get-sum\", \"echo\"]\n")
    );
    let shutdown = CancellationToken::new();
    let refused = McpSources::start(&configs(&config), &env(&[]), Children::default(), shutdown).await;
    let Err(StartError::Collision(message)) = refused else { panic!("a collision is a configuration error") };
    assert!(
        message.contains("'get-sum'") && message.contains("'first'") && message.contains("'second'"),
        "{message}"
    );
}

/// A server-everything over streamable HTTP on a free port, killed on drop.
struct HttpServer {
    child: tokio::process::Child,
    port: u16,
}

impl HttpServer {
    async fn start(port: u16) -> HttpServer {
        let child = tokio::process::Command::new("node")
            .args([everything().as_str(), "streamableHttp"])
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(tokio::time::Instant::now() < deadline, "server-everything did not listen on {port}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        HttpServer { child, port }
    }

    async fn stop(mut self) {
        self.child.kill().await.unwrap();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn a_streamable_http_server_is_called_fails_open_while_down_and_comes_back() {
    let server = HttpServer::start(free_port()).await;
    let port = server.port;
    let config = format!(
        "[[mcp_servers]]\nname = \"remote\"\nurl = \"http://127.0.0.1:{port}/mcp\"\nheaders = {{ X-Toolhost-Test = \"${{TOKEN}}\" }}\n"
    );
    let mut sources = Sources::start(&config, &env(&[("TOKEN", "t0ken")])).await;
    assert_eq!(sources.sources().status()[0].transport, "http");
    let registry = sources.registry();
    assert!(registry.contains("remote__get-sum"), "{:?}", registry.names());
    let sum = call(&registry, "remote__get-sum", json!({"a": 20, "b": 22})).await.unwrap();
    assert_eq!(sum, json!("The sum of 20 and 22 is 42."));

    // The server goes away: the next call fails, the source goes down, and its tools answer
    // overloaded (fail open: they stay listed).
    server.stop().await;
    let lost = call(&registry, "remote__get-sum", json!({"a": 1, "b": 1})).await.unwrap_err();
    assert!(matches!(lost.code, ErrorCode::ToolFailed | ErrorCode::Overloaded), "{lost:?}");
    let down = next_event(&mut sources.started.events, Duration::from_secs(20)).await;
    assert!(matches!(down, McpEvent::Down { .. }), "{down:?}");
    let failure = call(&registry, "remote__get-sum", json!({"a": 1, "b": 1})).await.unwrap_err();
    assert_eq!(failure.code, ErrorCode::Overloaded, "{failure:?}");

    // Back on the same port: the source reconnects and answers again.
    let server = HttpServer::start(port).await;
    let up = next_event(&mut sources.started.events, Duration::from_secs(45)).await;
    assert_eq!(up, McpEvent::Up { source: "remote".into() });
    let sum = call(&registry, "remote__get-sum", json!({"a": 2, "b": 2})).await.unwrap();
    assert_eq!(sum, json!("The sum of 2 and 2 is 4."));
    sources.stop().await;
    server.stop().await;
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn a_servers_progress_notifications_reach_the_calls_progress_handle_in_order() {
    let sources = Sources::start(&everything_config("everything", ""), &env(&[])).await;
    let registry = sources.registry();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let progress = {
        let seen = seen.clone();
        Progress::new(move |report: ProgressReport| seen.lock().unwrap().push(report))
    };
    let context = Context { request_id: "progress".into(), progress, ..Context::default() };
    let done = registry
        .invoke(
            "everything__trigger-long-running-operation",
            json!({"duration": 2, "steps": 4}),
            &context,
            None,
        )
        .await
        .unwrap();
    assert!(done.as_str().unwrap().contains("completed"), "{done}");
    let seen = seen.lock().unwrap().clone();
    let steps: Vec<f64> = seen.iter().map(|report| report.progress).collect();
    // rmcp handles each notification on a task of its own, so the last one may lose the race
    // with the answer; the others come, in order, each with the total.
    assert!(steps == [1.0, 2.0, 3.0] || steps == [1.0, 2.0, 3.0, 4.0], "{seen:?}");
    assert!(seen.iter().all(|report| report.total == Some(4.0)), "{seen:?}");
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn resources_templates_and_prompts_are_kept_prompts_prefixed_and_listed_again_on_list_changed() {
    let mut sources = Sources::start(&everything_config("everything", ""), &env(&[])).await;
    let catalogs = sources.sources().catalog();
    assert_eq!(catalogs.len(), 1);
    let (source, catalog) = &catalogs[0];
    assert_eq!(source, "everything");
    let uris: Vec<&str> = catalog.resources.iter().filter_map(|r| r["uri"].as_str()).collect();
    assert!(uris.iter().any(|uri| uri.starts_with("demo://resource/static/document/")), "{uris:?}");
    let templates: Vec<&str> = catalog.templates.iter().filter_map(|t| t["uriTemplate"].as_str()).collect();
    assert!(templates.contains(&"demo://resource/dynamic/text/{resourceId}"), "{templates:?}");
    let prompts: Vec<&str> = catalog.prompts.iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(prompts.contains(&"everything__simple-prompt"), "{prompts:?}");
    assert!(prompts.iter().all(|name| name.starts_with("everything__")), "{prompts:?}");
    let args = catalog.prompts.iter().find(|p| p["name"] == "everything__args-prompt").unwrap();
    assert!(args["arguments"].as_array().is_some_and(|a| !a.is_empty()), "{args}");
    let keys: Vec<String> = catalog.entries().into_iter().map(|(key, _)| key).collect();
    assert!(keys.contains(&"prompt:everything__simple-prompt".to_owned()), "{keys:?}");

    // The tool registers a session resource, and the server sends resources/list_changed.
    let registry = sources.registry();
    let data = "data:text/plain;base64,aGVsbG8gdG9vbGhvc3Q=";
    call_output(&registry, "everything__gzip-file-as-resource", json!({"name": "hello.gz", "data": data}))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match next_event(&mut sources.started.events, left).await {
            McpEvent::CatalogChanged { source } => {
                assert_eq!(source, "everything");
                break;
            }
            McpEvent::ToolsChanged { .. } => {}
            other => panic!("unexpected event {other:?}"),
        }
    }
    let catalog = &sources.sources().catalog()[0].1;
    assert!(
        catalog.resources.iter().any(|r| r["uri"] == "demo://resource/session/hello.gz"),
        "{:?}",
        catalog.resources
    );
    assert_eq!(sources.sources().status()[0].restarts, 0);
    sources.stop().await;
}

#[tokio::test]
#[ignore = "needs the MCP servers of scripts/ensure-mcp-servers.sh; run `just test-mcp`"]
async fn resources_are_read_prompts_got_and_arguments_completed_on_the_server_that_lists_them() {
    use toolhost_mcp::Operation;
    let started = Sources::start(&everything_config("everything", ""), &env(&[])).await;
    let sources = started.sources().clone();
    // A listed resource, read by its URI as the server wrote it.
    let catalog = sources.catalog().remove(0).1;
    let listed = catalog.resources[0]["uri"].as_str().unwrap().to_owned();
    let read = sources.request(Operation::ReadResource, json!({"uri": listed})).await.unwrap();
    assert_eq!(read["contents"][0]["uri"], listed, "{read}");
    // A URI one of its templates matches, though no listing names it.
    let uri = "demo://resource/dynamic/text/7";
    assert!(sources.serves(Operation::ReadResource, &json!({"uri": uri})).unwrap());
    let read = sources.request(Operation::ReadResource, json!({"uri": uri})).await.unwrap();
    assert_eq!(read["contents"][0]["uri"], uri, "{read}");
    assert!(read["contents"][0]["text"].as_str().is_some_and(|text| text.contains('7')), "{read}");
    // A prompt by its prefixed name, with arguments; the server sees its own name.
    let prompt = sources
        .request(
            Operation::GetPrompt,
            json!({"name": "everything__args-prompt", "arguments": {"city": "Lyon"}}),
        )
        .await
        .unwrap();
    let text = prompt["messages"][0]["content"]["text"].as_str().unwrap();
    assert!(text.contains("Lyon"), "{prompt}");
    // Completion of a prompt argument, routed by the prompt's prefixed name.
    let completed = sources
        .request(
            Operation::Complete,
            json!({"ref": {"type": "ref/prompt", "name": "everything__completable-prompt"},
                   "argument": {"name": "department", "value": "S"}}),
        )
        .await
        .unwrap();
    let values: Vec<&str> =
        completed["completion"]["values"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(values, ["Sales", "Support"], "{completed}");

    // What no source lists, params that name nothing, and params MCP refuses: clear errors.
    let unlisted =
        sources.request(Operation::ReadResource, json!({"uri": "demo://nowhere"})).await.unwrap_err();
    assert_eq!(unlisted.code(), ErrorCode::InvalidArguments);
    assert!(
        unlisted.to_string().contains("no hosted MCP server lists resource 'demo://nowhere'"),
        "{unlisted}"
    );
    let unprefixed = sources.request(Operation::GetPrompt, json!({"name": "args-prompt"})).await.unwrap_err();
    assert!(unprefixed.to_string().contains("prompt 'args-prompt'"), "{unprefixed}");
    let nameless = sources.request(Operation::GetPrompt, json!({"arguments": {}})).await.unwrap_err();
    assert!(nameless.to_string().contains("prompts/get needs 'name'"), "{nameless}");
    let refused = sources
        .request(
            Operation::Complete,
            json!({"ref": {"type": "ref/prompt", "name": "everything__completable-prompt"}}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::InvalidArguments, "{refused}");
    assert!(refused.to_string().contains("completion/complete"), "{refused}");
    // The server itself refusing: a prompt argument it requires is missing.
    let missing =
        sources.request(Operation::GetPrompt, json!({"name": "everything__args-prompt"})).await.unwrap_err();
    assert!(matches!(missing.code(), ErrorCode::InvalidArguments | ErrorCode::ToolFailed), "{missing}");
    started.stop().await;
}
