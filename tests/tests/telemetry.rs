//! Telemetry end to end (`just test-telemetry`): W3C trace context and OTLP spans across a
//! caller, the MCP door, a toolbox, a hosted MCP server and an HTTP service.
//!
//! Parts, all real and started here on free loopback ports: a `redis-server`; an OTLP/HTTP
//! receiver on the official `opentelemetry-proto` definitions (`tests/telemetry/receiver.py`,
//! which also serves the HTTP tool's endpoint); a toolbox `hosts` hosting an MCP server on the
//! official Python SDK with the OpenTelemetry SDK (`traced_server.py`) and an `[[http_tools]]`
//! tool; a toolbox `door` serving the MCP door; and two callers with the OpenTelemetry SDK
//! (`callers.py`): the MCP Python SDK's client through the door, and toolhost's Python client
//! over Redis. Everything exports to the receiver. The venv is `scripts/ensure-telemetry-venv.sh`'s.
//! The OVOS door's test adds the real `ovos-messagebus` and a persona on `MessageBusClient`
//! (`ovos_caller.py`), from `scripts/ensure-ovos-venv.sh`'s venv; the console's calls are plain
//! HTTP.

// A failed unwrap is a test failure with a clear message; that is what tests want.
#![allow(clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost_e2e::{RedisProcess, Toolhost, free_port, temp_dir, user};

const WAIT: Duration = Duration::from_secs(30);

fn venv() -> PathBuf {
    toolhost_e2e::venv(
        "TOOLHOST_TELEMETRY_VENV",
        "venv-telemetry",
        "ensure-telemetry-venv.sh",
        "test-telemetry",
    )
}

fn fixture(name: &str) -> PathBuf {
    toolhost_e2e::fixture("telemetry", name)
}

/// The OTLP receiver, a child process.
struct Receiver {
    child: Option<Child>,
    port: u16,
}

impl Receiver {
    fn start() -> Receiver {
        let mut child = Command::new(venv().join("bin/python"))
            .arg(fixture("receiver.py"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the OTLP receiver");
        let mut line = Vec::new();
        let mut stdout = child.stdout.take().unwrap();
        let mut byte = [0u8; 1];
        while stdout.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        let line = String::from_utf8(line).unwrap();
        let port = line.strip_prefix("listening ").and_then(|port| port.trim().parse().ok());
        Receiver { child: Some(child), port: port.unwrap_or_else(|| panic!("the receiver said {line:?}")) }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Value> {
        get(self.port, "/spans").as_array().cloned().unwrap_or_default()
    }

    /// The spans of `trace_id`, once `check` is satisfied by them (they arrive in batches).
    fn trace(&self, trace_id: &str, check: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + WAIT;
        loop {
            let spans: Vec<Value> =
                self.spans().into_iter().filter(|span| span["trace_id"] == trace_id).collect();
            if check(&spans) {
                return spans;
            }
            assert!(Instant::now() < deadline, "trace {trace_id} never became complete: {spans:#?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the receiver: the collector is down.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

fn get(port: u16, path: &str) -> Value {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or(Value::Null)
}

/// The Prometheus text of a toolbox's `/metrics`.
fn metrics(toolhost: &Toolhost) -> String {
    let log = toolhost.log();
    let ready = log.lines().find(|line| line.contains("\"message\":\"ready\"")).unwrap();
    let ready: Value = serde_json::from_str(ready).unwrap();
    let port: u16 = ready["http"].as_str().unwrap().rsplit(':').next().unwrap().parse().unwrap();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// The value of one sample line of `text`, 0 when absent.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|line| line.starts_with(name) && line[name.len()..].starts_with(' '))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

/// Redis, the receiver, the toolbox hosting the tools and the door.
struct Fleet {
    redis: RedisProcess,
    receiver: Receiver,
    hosts: Toolhost,
    door: Toolhost,
    door_port: u16,
    _dir: PathBuf,
}

impl Fleet {
    fn start() -> Fleet {
        Fleet::start_with("")
    }

    /// The fleet, with `door_doors` (more doors' sections) in the door's configuration.
    fn start_with(door_doors: &str) -> Fleet {
        let redis = RedisProcess::start(&[]);
        let receiver = Receiver::start();
        let dir = temp_dir("telemetry");
        // Fast batches, so the spans reach the receiver soon after each call.
        let telemetry = format!(
            "[telemetry]\notlp_endpoint = \"{}\"\nschedule_delay_ms = 50\nexport_timeout_ms = 2000\n\
             metrics_interval_ms = 200\n",
            receiver.url()
        );
        let hosts_config = dir.join("hosts.toml");
        std::fs::write(
            &hosts_config,
            format!(
                "[daemon]\ntoolbox_id = \"hosts\"\n[tools.terminal]\nrun_as = \"{user}\"\n{telemetry}\n\
                 [[mcp_servers]]\nname = \"traced\"\ncommand = \"{python}\"\nargs = [\"{server}\"]\n\
                 env = {{ OTEL_EXPORTER_OTLP_ENDPOINT = \"{collector}\" }}\n\n\
                 [[http_tools]]\nname = \"echo_headers\"\ndescription = \"Answers with the trace headers it got.\"\n\
                 method = \"GET\"\nurl = \"{collector}/echo\"\nannotations = {{ read_only = true }}\n\n\
                 [[commands]]\nname = \"print_traceparent\"\ndescription = \"Prints the TRACEPARENT it got.\"\n\
                 argv = [\"printenv\", \"TRACEPARENT\"]\ntimeout_ms = 20000\n",
                user = user(),
                python = venv().join("bin/python").display(),
                server = fixture("traced_server.py").display(),
                collector = receiver.url(),
            ),
        )
        .unwrap();
        let hosts = Toolhost::start(&[
            ("REDIS_URL", &redis.url()),
            ("TOOLHOST_CONFIG", hosts_config.to_str().unwrap()),
        ]);
        hosts.wait_for_log("traced__meta_echo", WAIT);
        let door_port = toolhost_e2e::free_port();
        let door_config = dir.join("door.toml");
        std::fs::write(
            &door_config,
            // The door hosts no tool of its own, so `hosts` answers every call.
            format!(
                "[daemon]\ntoolbox_id = \"door\"\n[mcp]\nlisten = \"127.0.0.1:{door_port}\"\n{telemetry}\n\
                 [tools]\ndisabled = [\"echo\", \"terminal_run\", \"chat_send\"]\n{door_doors}\n"
            ),
        )
        .unwrap();
        let door = Toolhost::start(&[
            ("REDIS_URL", &redis.url()),
            ("TOOLHOST_CONFIG", door_config.to_str().unwrap()),
        ]);
        door.wait_for_log("MCP door listening at /mcp", WAIT);
        Fleet { redis, receiver, hosts, door, door_port, _dir: dir }
    }

    fn mcp_url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.door_port)
    }

    /// Runs `callers.py <args>` and returns the JSON line it prints.
    fn caller(&self, args: &[&str]) -> Value {
        let python_client = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/python/src");
        let output = Command::new(venv().join("bin/python"))
            .arg(fixture("callers.py"))
            .args(args)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", self.receiver.url())
            .env("PYTHONPATH", python_client)
            .output()
            .expect("run a caller");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "caller {args:?} failed: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
    }
}

/// The one span named `name` of `service` among `spans`.
fn one<'a>(spans: &'a [Value], service: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> =
        spans.iter().filter(|span| span["service"] == service && span["name"] == name).collect();
    assert_eq!(found.len(), 1, "one {service} span {name:?} expected: {spans:#?}");
    found[0]
}

fn has(spans: &[Value], service: &str, name: &str) -> bool {
    spans.iter().any(|span| span["service"] == service && span["name"] == name)
}

/// Checks the toolbox's part of a call whose `process` span's parent is `parent`: one CONSUMER
/// `process action-requests` (the ack-only toolbox makes none), its children admit, the run and
/// settle; returns the run span.
fn check_toolbox_part<'a>(spans: &'a [Value], parent: &Value, run: &str, run_kind: &str) -> &'a Value {
    let process = one(spans, "toolhost", "process action-requests");
    assert_eq!(process["kind"], "CONSUMER");
    assert_eq!(process["parent_span_id"], parent["span_id"], "process is the child of {parent:#}");
    assert_eq!(process["links"], json!([{"trace_id": parent["trace_id"], "span_id": parent["span_id"]}]));
    let attributes = &process["attributes"];
    assert_eq!(attributes["messaging.system"], "redis_streams");
    assert_eq!(attributes["messaging.operation.type"], "process");
    assert_eq!(attributes["messaging.destination.name"], "action-requests");
    assert_eq!(attributes["messaging.consumer.group.name"], "hosts");
    assert_eq!(attributes["toolhost.outcome"], "success");
    for child in ["admit", run, "settle action-requests"] {
        assert_eq!(one(spans, "toolhost", child)["parent_span_id"], process["span_id"], "{child}");
    }
    let run = one(spans, "toolhost", run);
    assert_eq!(run["kind"], run_kind);
    assert_eq!(run["attributes"]["gen_ai.operation.name"], "execute_tool");
    run
}

#[test]
fn a_call_through_the_mcp_door_and_one_over_redis_share_the_callers_trace_down_to_the_hosted_server() {
    let fleet = Fleet::start();

    // The MCP Python SDK's client, through the door, to the hosted MCP server.
    let report = fleet.caller(&["mcp", &fleet.mcp_url(), "traced__meta_echo", "{}"]);
    assert_eq!(report["error"], false, "{report}");
    let trace_id = report["trace_id"].as_str().unwrap();
    let spans = fleet.receiver.trace(trace_id, |spans| {
        has(spans, "traced-mcp-server", "tools/call meta_echo")
            && has(spans, "toolhost", "settle action-requests")
            && has(spans, "toolhost", "process action-requests")
    });
    let caller = one(&spans, "caller", "caller");
    let send = one(&spans, "caller", "MCP send tools/call traced__meta_echo");
    assert_eq!(send["parent_span_id"], caller["span_id"]);
    let door = one(&spans, "toolhost", "tools/call traced__meta_echo");
    assert_eq!(door["kind"], "SERVER");
    assert_eq!(door["parent_span_id"], send["span_id"], "the door's span is the child of the client's");
    assert_eq!(door["attributes"]["mcp.method.name"], "tools/call");
    assert_eq!(door["attributes"]["gen_ai.tool.name"], "traced__meta_echo");
    // The SDK's default mode speaks 2026-07-28, where a request has no session: no
    // `mcp.session.id` (an `initialize` session's id is named by the conventions' attribute).
    assert!(door["attributes"].get("mcp.session.id").is_none(), "{door:#}");
    let run = check_toolbox_part(&spans, door, "tools/call meta_echo", "CLIENT");
    assert_eq!(run["attributes"]["mcp.method.name"], "tools/call");
    assert_eq!(run["attributes"]["gen_ai.tool.name"], "meta_echo");
    let server = one(&spans, "traced-mcp-server", "tools/call meta_echo");
    assert_eq!(server["kind"], "SERVER");
    assert_eq!(server["parent_span_id"], run["span_id"], "the server's span is the child of toolhost's run");
    // What the server found in `_meta`: the run span's context.
    let received = report["result"]["traceparent"].as_str().unwrap();
    let run_id = run["span_id"].as_str().unwrap();
    assert!(received.starts_with(&format!("00-{trace_id}-{run_id}-")), "{received}");
    assert!(spans.iter().all(|span| span["trace_id"] == trace_id));
    // docs/trace.png is this trace, drawn by scripts/trace-waterfall.py (docs/OPERATIONS.md).
    if let Some(out) = std::env::var_os("TOOLHOST_TELEMETRY_TRACE_OUT") {
        std::fs::write(out, serde_json::to_string_pretty(&spans).unwrap()).unwrap();
    }

    // The same door to the HTTP tool: the `traceparent` header is the run span's.
    let report = fleet.caller(&["mcp", &fleet.mcp_url(), "echo_headers", "{}"]);
    let trace_id = report["trace_id"].as_str().unwrap();
    let spans = fleet.receiver.trace(trace_id, |spans| has(spans, "toolhost", "settle action-requests"));
    let door = one(&spans, "toolhost", "tools/call echo_headers");
    let run = check_toolbox_part(&spans, door, "execute_tool echo_headers", "CLIENT");
    let header = report["result"]["traceparent"].as_str().unwrap();
    assert!(header.starts_with(&format!("00-{trace_id}-{}-", run["span_id"].as_str().unwrap())), "{header}");

    // toolhost's Python client over Redis: its PRODUCER span is the process span's parent.
    let redis_url = fleet.redis.url();
    let report = fleet.caller(&["redis", &redis_url, "traced__meta_echo", "{}"]);
    let trace_id = report["trace_id"].as_str().unwrap();
    let spans = fleet.receiver.trace(trace_id, |spans| {
        has(spans, "traced-mcp-server", "tools/call meta_echo")
            && has(spans, "toolhost", "settle action-requests")
    });
    let caller = one(&spans, "caller", "caller");
    let send = one(&spans, "caller", "send action-requests");
    assert_eq!(send["kind"], "PRODUCER");
    assert_eq!(send["parent_span_id"], caller["span_id"]);
    assert_eq!(send["attributes"]["messaging.system"], "redis_streams");
    let run = check_toolbox_part(&spans, send, "tools/call meta_echo", "CLIENT");
    let server = one(&spans, "traced-mcp-server", "tools/call meta_echo");
    assert_eq!(server["parent_span_id"], run["span_id"]);
    let received = report["result"]["traceparent"].as_str().unwrap();
    assert!(received.starts_with(&format!("00-{trace_id}-{}-", run["span_id"].as_str().unwrap())));
    // The call's log line names the trace.
    fleet.hosts.wait_for_log(&format!("\"trace_id\":\"{trace_id}\""), WAIT);

    // The same calls as OTLP metrics, beside Prometheus: per-tool counts and durations from the
    // toolbox, in-flight, and the MCP conventions' operation duration from the door.
    let deadline = Instant::now() + WAIT;
    loop {
        let points = get(fleet.receiver.port, "/metrics").as_array().cloned().unwrap_or_default();
        let found = |name: &str, check: &dyn Fn(&Value) -> bool| {
            points.iter().any(|point| point["service"] == "toolhost" && point["name"] == name && check(point))
        };
        let tool_is =
            |tool: &'static str| move |point: &Value| point["attributes"]["gen_ai.tool.name"] == tool;
        let counted = found("toolhost.invocations", &|point| {
            tool_is("traced__meta_echo")(point)
                && point["attributes"]["toolhost.outcome"] == "success"
                && point["value"].as_i64() >= Some(2)
        });
        let timed = found("toolhost.invocation.duration", &|point| {
            tool_is("echo_headers")(point) && point["value"]["count"].as_i64() >= Some(1)
        });
        let in_flight = found("toolhost.in_flight", &|point| point["value"].as_i64() == Some(0));
        let mcp = found("mcp.server.operation.duration", &|point| {
            tool_is("traced__meta_echo")(point)
                && point["attributes"]["mcp.method.name"] == "tools/call"
                && point["unit"] == "s"
                && point["value"]["count"].as_i64() >= Some(1)
        });
        if counted && timed && in_flight && mcp {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "OTLP metrics incomplete (counts {counted}, durations {timed}, in flight {in_flight}, mcp {mcp}): {points:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An `echo` request over Redis with `traceparent` set to `traceparent` (a JSON value).
fn echo_request(request_id: &str, traceparent: Value) -> String {
    json!({
        "id": uuid::Uuid::new_v4().to_string(), "type": "tool.invoke", "traceparent": traceparent,
        "tracestate": "vendor=kept-only-with-a-valid-traceparent",
        "data": {"request_id": request_id, "tool": "echo", "arguments": {"message": request_id}},
    })
    .to_string()
}

/// The answer to `request_id` on `action-results`.
fn answer(connection: &mut redis::Connection, request_id: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let entries: Vec<(String, Vec<(String, String)>)> =
            redis::cmd("XRANGE").arg("action-results").arg("-").arg("+").query(connection).unwrap();
        for (_, fields) in entries {
            let Some((_, payload)) = fields.iter().find(|(name, _)| name == "payload") else { continue };
            let answer: Value = serde_json::from_str(payload).unwrap();
            if answer["data"]["request_id"] == request_id {
                return answer;
            }
        }
        assert!(Instant::now() < deadline, "no answer to {request_id}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn garbage_in_a_traceparent_starts_a_new_trace_is_never_copied_on_and_never_fails_the_call() {
    let fleet = Fleet::start();
    let garbage = [
        ("short", json!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1")),
        ("bad-hex", json!("00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01")),
        ("zero-trace", json!("00-00000000000000000000000000000000-00f067aa0ba902b7-01")),
        ("zero-span", json!("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01")),
        ("not-a-string", json!(42)),
    ];
    let mut connection = fleet.redis.connection();
    for (name, traceparent) in &garbage {
        let _: String = redis::cmd("XADD")
            .arg("action-requests")
            .arg("*")
            .arg("id")
            .arg(name)
            .arg("payload")
            .arg(echo_request(name, traceparent.clone()))
            .query(&mut connection)
            .unwrap();
    }
    for (name, traceparent) in &garbage {
        let answer = answer(&mut connection, name);
        assert_eq!(answer["data"]["success"], true, "{name}: {answer:#}");
        let sent = traceparent.as_str().unwrap_or_default();
        let new = answer["traceparent"].as_str().unwrap();
        assert_ne!(new, sent, "{name}");
        assert!(!new.contains("4bf92f3577b34da6a3ce929d0e0e4736"), "{name}: {new}");
        assert!(!new.contains("00000000000000000000000000000000"), "{name}: {new}");
        assert_eq!(new.len(), 55, "{name}: {new}");
        assert!(answer.get("tracestate").is_none(), "{name}: the tracestate goes with its traceparent");
        let trace_id = &new[3..35];
        // A new trace, exported as such: a root process span.
        let spans = fleet.receiver.trace(trace_id, |spans| has(spans, "toolhost", "process action-requests"));
        let process = one(&spans, "toolhost", "process action-requests");
        assert_eq!(process["parent_span_id"], "", "{name}");
        assert_eq!(process["links"], json!([]), "{name}");
    }
    let log = fleet.hosts.log();
    let rejected = log.lines().filter(|line| line.contains("\"trace_rejected\":true")).count();
    assert_eq!(rejected, garbage.len() - 1, "a value that is not a string reads as absent, not rejected");

    // Through the MCP door: `_meta.traceparent` all zero, and the call is answered in a new trace.
    let report =
        fleet.caller(&["raw-mcp", &fleet.mcp_url(), "traced__meta_echo", garbage[2].1.as_str().unwrap()]);
    let result = &report["answer"]["result"];
    assert_eq!(result["isError"], false, "{report}");
    let received = result["structuredContent"]["traceparent"].as_str().unwrap();
    assert!(!received.contains("00000000000000000000000000000000"), "{received}");
    assert_eq!(received.len(), 55, "{received}");
}

#[test]
fn with_the_collector_down_every_call_is_answered_and_the_drop_counter_rises() {
    let mut fleet = Fleet::start();
    let mut connection = fleet.redis.connection();
    let dropped = r#"toolhost_telemetry_spans_dropped_total{reason="export_failed"}"#;
    let before = sample(&metrics(&fleet.hosts), dropped);
    fleet.receiver.stop();
    let sampled = |i: usize| json!(format!("00-{:032x}-{:016x}-01", i + 1, i + 1));
    let count = 20;
    for i in 0..count {
        let _: String = redis::cmd("XADD")
            .arg("action-requests")
            .arg("*")
            .arg("id")
            .arg(format!("down-{i}"))
            .arg("payload")
            .arg(echo_request(&format!("down-{i}"), sampled(i)))
            .query(&mut connection)
            .unwrap();
    }
    for i in 0..count {
        let answer = answer(&mut connection, &format!("down-{i}"));
        assert_eq!(answer["data"]["success"], true, "{answer:#}");
        // The caller's trace, sampled, with the call's own span.
        let traceparent = answer["traceparent"].as_str().unwrap();
        assert!(traceparent.starts_with(&format!("00-{:032x}-", i + 1)), "{traceparent}");
    }
    // Each call's four spans are dropped once their batch's export fails.
    let deadline = Instant::now() + WAIT;
    loop {
        let now = sample(&metrics(&fleet.hosts), dropped);
        if now >= before + (count * 4) as f64 {
            break;
        }
        assert!(Instant::now() < deadline, "the drop counter stayed at {now} (from {before})");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(fleet.hosts.log().contains("cannot export spans; dropped"), "the outage is logged once");
}

/// A sampled W3C context of a new trace: the trace id, the caller's span id and the header.
fn new_context() -> (String, String, String) {
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let span_id = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
    let traceparent = format!("00-{trace_id}-{span_id}-01");
    (trace_id, span_id, traceparent)
}

/// One HTTP/1.1 request to the console; the status and the body.
fn console_request(port: u16, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split(' ').nth(1).and_then(|status| status.parse().ok()).unwrap_or(0);
    (status, response.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned())
}

#[test]
fn the_ovos_door_and_the_console_make_their_spans_and_pass_the_callers_context_on() {
    let bus = toolhost_e2e::ovos::Bus::start();
    let console_port = free_port();
    let fleet = Fleet::start_with(&format!(
        "[ovos]\nurl = \"{}\"\n[console]\nlisten = \"127.0.0.1:{console_port}\"\n",
        bus.url()
    ));
    fleet.door.wait_for_log("connected to the OVOS messagebus", WAIT);
    fleet.door.wait_for_log("console listening", WAIT);

    // A persona's call on the bus, its message context holding a sampled `traceparent`: the
    // door's CONSUMER span is the child of the persona's span and linked to it, and the
    // toolbox's `process` span is the door span's child.
    let (trace_id, persona_span, traceparent) = new_context();
    let output = toolhost_e2e::ovos::python(&bus.dir)
        .arg(fixture("ovos_caller.py"))
        .args([&bus.port.to_string(), "door", "echo", r#"{"message": "from the bus"}"#, &traceparent])
        .stderr(Stdio::inherit())
        .output()
        .expect("run ovos_caller.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|_| panic!("ovos_caller.py said {stdout}"));
    assert_eq!(report["replies"][0]["result"]["message"], "from the bus", "{report}");
    let door_span = "process ovos.persona.tools.door.call";
    let spans = fleet.receiver.trace(&trace_id, |spans| {
        has(spans, "toolhost", door_span) && has(spans, "toolhost", "settle action-requests")
    });
    let door = one(&spans, "toolhost", door_span);
    assert_eq!(door["kind"], "CONSUMER");
    assert_eq!(door["parent_span_id"], persona_span.as_str(), "the door's span is the persona's child");
    assert_eq!(door["links"], json!([{"trace_id": trace_id, "span_id": persona_span}]));
    assert_eq!(door["attributes"]["messaging.system"], "ovos_messagebus");
    assert_eq!(door["attributes"]["messaging.operation.type"], "process");
    assert_eq!(door["attributes"]["messaging.destination.name"], "ovos.persona.tools.door.call");
    assert_eq!(door["attributes"]["gen_ai.tool.name"], "echo");
    check_toolbox_part(&spans, door, "execute_tool echo", "INTERNAL");
    assert!(spans.iter().all(|span| span["trace_id"] == trace_id.as_str()));

    // A call from the console's page with its `traceparent`: the console's SERVER span is the
    // page's child, and the toolbox's `process` span is the console span's child.
    let page =
        console_request(console_port, "GET /tools HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .1;
    let csrf = page
        .split("<meta name=\"csrf-token\" content=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no CSRF token in the console's page: {page}"))
        .to_owned();
    let (trace_id, page_span, traceparent) = new_context();
    let body = json!({"tool": "echo", "arguments": {"message": "from the page"}, "traceparent": traceparent})
        .to_string();
    let (status, answer) = console_request(
        console_port,
        &format!(
            "POST /api/call HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
             Content-Type: application/json\r\nX-CSRF-Token: {csrf}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert_eq!(status, 202, "{answer}");
    let spans = fleet.receiver.trace(&trace_id, |spans| {
        has(spans, "toolhost", "POST /api/call") && has(spans, "toolhost", "settle action-requests")
    });
    let console = one(&spans, "toolhost", "POST /api/call");
    assert_eq!(console["kind"], "SERVER");
    assert_eq!(console["parent_span_id"], page_span.as_str(), "the console's span is the page's child");
    assert_eq!(console["attributes"]["http.route"], "/api/call");
    assert_eq!(console["attributes"]["gen_ai.tool.name"], "echo");
    assert_eq!(console["attributes"]["toolhost.door"], "console");
    // The answer is published by the commit the settle span covers, so the console, which ends
    // its span when the answer reaches it, ends after the settle began (not necessarily after
    // the toolbox's process span, which ends once the commit returns to the toolbox).
    let settle = one(&spans, "toolhost", "settle action-requests");
    assert!(
        console["end_ns"].as_u64() >= settle["start_ns"].as_u64(),
        "the console's span lasts until the answer: {console:#} {settle:#}"
    );
    check_toolbox_part(&spans, console, "execute_tool echo", "INTERNAL");
}

#[test]
fn a_call_the_mcp_door_makes_a_task_carries_the_callers_trace_to_the_toolbox() {
    let fleet = Fleet::start();
    fleet.hosts.wait_for_log("print_traceparent", WAIT);
    // A client that takes tasks calls a tool whose timeout (20 s) is above the door's task
    // threshold (10 s): the door answers with a task and writes the request itself.
    let (trace_id, client_span, traceparent) = new_context();
    let report = fleet.caller(&["raw-mcp", &fleet.mcp_url(), "print_traceparent", &traceparent, "task"]);
    let task = &report["answer"]["result"];
    assert_eq!(task["resultType"], "task", "the door made a task: {report}");
    assert!(task["taskId"].is_string(), "{report}");
    // The toolbox ran the command (`printenv` fails without TRACEPARENT, which the outcome
    // `success` of check_toolbox_part rules out) in the caller's trace, under the door's span.
    let spans = fleet.receiver.trace(&trace_id, |spans| {
        has(spans, "toolhost", "tools/call print_traceparent")
            && has(spans, "toolhost", "settle action-requests")
    });
    let door = one(&spans, "toolhost", "tools/call print_traceparent");
    assert_eq!(door["kind"], "SERVER");
    assert_eq!(door["parent_span_id"], client_span.as_str(), "the door's span is the client's child");
    check_toolbox_part(&spans, door, "execute_tool print_traceparent", "INTERNAL");
    // The request the task path wrote carries the door span's context.
    let mut connection = fleet.redis.connection();
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg("action-requests").arg("-").arg("+").query(&mut connection).unwrap();
    let request = entries
        .iter()
        .filter_map(|(_, fields)| fields.iter().find(|(name, _)| name == "payload"))
        .map(|(_, payload)| serde_json::from_str::<Value>(payload).unwrap())
        .find(|request| request["data"]["tool"] == "print_traceparent")
        .expect("the task's request on action-requests");
    let door_id = door["span_id"].as_str().unwrap();
    assert_eq!(request["traceparent"], format!("00-{trace_id}-{door_id}-01"), "{request:#}");
}
