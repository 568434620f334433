//! The OpenVoiceOS door and source against the real bus: `ovos-messagebus` started on a free
//! loopback port, personas and toolboxes on `ovos-bus-client`'s `MessageBusClient`, and the
//! `ToolBox` template of `ovos-plugin-manager` 3.1.0a1 as the reference, all from the venv `just
//! test-ovos` makes (`scripts/ensure-ovos-venv.sh`; `TOOLHOST_OVOS_VENV` names another).
//!
//! The door: the same checks (`tests/ovos/scenarios.py`) run against toolhost and against a
//! reference `ToolBox` (`tests/ovos/reference_toolbox.py`), and their replies are compared.

// Test code: a failed step is a failed test.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost_e2e::ovos::{Bus, python};
use toolhost_e2e::{RedisProcess, Toolhost, temp_dir, user};

fn fixture(name: &str) -> PathBuf {
    toolhost_e2e::fixture("ovos", name)
}

/// A reference `ToolBox` on the bus.
struct Reference {
    child: Child,
}

impl Reference {
    fn start(bus: &Bus, toolbox_id: &str, extra: &[&str]) -> Reference {
        Reference::spawn(bus, toolbox_id, extra, None)
    }

    /// A reference whose `nap` tool writes a line to `mark` when it starts.
    fn marked(bus: &Bus, toolbox_id: &str, mark: &Path) -> Reference {
        Reference::spawn(bus, toolbox_id, &[], Some(mark))
    }

    fn spawn(bus: &Bus, toolbox_id: &str, extra: &[&str], mark: Option<&Path>) -> Reference {
        let mut command = python(&bus.dir);
        if let Some(mark) = mark {
            command.env("NAP_MARK", mark);
        }
        let mut child = command
            .arg(fixture("reference_toolbox.py"))
            .arg(bus.port.to_string())
            .arg(toolbox_id)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the reference toolbox");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the reference toolbox did not bind");
        Reference { child }
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a scenario to its end and returns its report (the last line).
fn scenario(bus: &Bus, args: &[&str]) -> Value {
    let output = python(&bus.dir)
        .arg(fixture("scenarios.py"))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scenarios.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().find(|line| line.starts_with('{')).unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|_| panic!("scenario {args:?} reported nothing:\n{stdout}"))
}

/// A toolhost with the door on `bus` (calls cut at `call_timeout_ms`), a `nap` command, and
/// `extra` keys of `[ovos]`.
fn toolhost(
    redis: &RedisProcess,
    bus: &Bus,
    dir: &Path,
    toolbox_id: &str,
    call_timeout_ms: u64,
    extra: &str,
) -> Toolhost {
    let config = dir.join(format!("{toolbox_id}.toml"));
    std::fs::write(
        &config,
        format!(
            "[daemon]\ntoolbox_id = \"{toolbox_id}\"\n[tools.terminal]\nrun_as = \"{}\"\n\
             [ovos]\nurl = \"{}\"\nmax_frame_bytes = 1048576\ncall_timeout_ms = {call_timeout_ms}\n{extra}\n\
             [[commands]]\nname = \"nap\"\ndescription = \"Sleep a while.\"\nargv = [\"sleep\", \"{{seconds}}\"]\n\
             argument_schema = {{ type = \"object\", properties = {{ seconds = {{ type = \"string\", pattern = \"^[0-9]+$\" }} }}, required = [\"seconds\"] }}\n\
             timeout_ms = 20000\n",
            user(),
            bus.url()
        ),
    )
    .unwrap();
    Toolhost::start(&[("REDIS_URL", &redis.url()), ("TOOLHOST_CONFIG", config.to_str().unwrap())])
}

/// The requests on `action-requests`, by tool.
fn requests(redis: &RedisProcess) -> Vec<Value> {
    let mut connection = redis.connection();
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg("action-requests").arg("-").arg("+").query(&mut connection).unwrap();
    entries
        .into_iter()
        .flat_map(|(_, fields)| fields)
        .filter(|(field, _)| field == "payload")
        .filter_map(|(_, payload)| serde_json::from_str(&payload).ok())
        .collect()
}

fn requests_of(redis: &RedisProcess, tool: &str) -> usize {
    requests(redis).iter().filter(|request| request["data"]["tool"] == tool).count()
}

/// The HTTP address toolhost logged in its `ready` line.
fn http_port(toolhost: &Toolhost) -> u16 {
    let log = toolhost.log();
    let ready = log.lines().find(|line| line.contains("\"message\":\"ready\"")).unwrap();
    let ready: Value = serde_json::from_str(ready).unwrap();
    ready["http"].as_str().unwrap().rsplit(':').next().unwrap().parse().unwrap()
}

fn get(port: u16, path: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split(' ').nth(1).unwrap().parse().unwrap();
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} within {timeout:?}");
}

/// A persona on the bus waiting (up to 30 s) for `th` to announce a discovery response that
/// lists `tool` unasked; returns once it listens. Its report is the last line of its output.
fn listen_for_announcement(bus: &Bus, tool: &str) -> (Child, Lines) {
    let mut listener = python(&bus.dir)
        .arg(fixture("scenarios.py"))
        .args(["announced", &bus.port.to_string(), "th", tool, "30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Lines(BufReader::new(listener.stdout.take().unwrap()));
    assert_eq!(lines.next_report_line(), "listening");
    (listener, lines)
}

/// The output of a scenario, line by line.
struct Lines(BufReader<std::process::ChildStdout>);

impl Lines {
    /// The next line that is not a log line of the OVOS libraries.
    fn next_report_line(&mut self) -> String {
        loop {
            let mut line = String::new();
            assert!(self.0.read_line(&mut line).unwrap() > 0, "the scenario ended early");
            let line = line.trim();
            if line == "listening" || line.starts_with('{') {
                return line.to_owned();
            }
        }
    }
}

/// A report with the toolbox id replaced by `<id>`, so two toolboxes' reports compare.
fn normalized(report: &Value, toolbox_id: &str) -> Value {
    let text = report
        .to_string()
        .replace(&format!("'{toolbox_id}'"), "'<id>'")
        .replace(&format!("\"{toolbox_id}\""), "\"<id>\"")
        .replace(&format!(".{toolbox_id}."), ".<id>.");
    serde_json::from_str(&text).unwrap()
}

/// What every toolbox must answer, toolhost or the reference.
fn check_alone(report: &Value, who: &str) {
    let calls = &report["calls"];
    for (label, call) in calls.as_object().unwrap() {
        assert_eq!(call["count"], 1, "{who}: exactly one reply to {label}: {call}");
    }
    assert_eq!(calls["echo"]["type"], "ovos.persona.tools.<id>.call.response", "{who}");
    assert_eq!(calls["echo"]["data"]["result"], json!({"message": "hi"}), "{who}");
    assert_eq!(calls["echo"]["data"]["toolbox_id"], "<id>", "{who}");
    assert_eq!(calls["echo_static"]["type"], "ovos.persona.tools.call.response", "{who}");
    assert_eq!(calls["echo_static"]["data"]["result"], json!({"message": "static"}), "{who}");
    assert_eq!(
        calls["unknown"]["data"]["error"], "ValueError: Unknown tool 'nope' for ToolBox '<id>'.",
        "{who}"
    );
    assert_eq!(
        calls["kwargs_list"]["data"]["error"],
        "RuntimeError: Tool 'echo' called with unexpected type arguments: list. Must be Dict[str, Any] or ToolArguments.",
        "{who}"
    );
    let discover = &report["discover"];
    assert_eq!(discover["count"], 1, "{who}: one discovery response: {discover}");
    assert_eq!(discover["data_keys"], json!(["toolbox_id", "tools"]), "{who}");
    assert_eq!(
        discover["tools"]["echo"],
        json!({"keys": ["argument_schema", "description", "name", "output_schema", "toolbox_id"], "toolbox_id": "<id>"}),
        "{who}"
    );
    assert_eq!(report["silent"], json!({"other_toolbox": 0, "no_toolbox": 0}), "{who}: silence");
    let context = &report["context"];
    assert_eq!(context["count"], 1, "{who}");
    let mut expected = context["sent"].clone();
    expected["source"] = json!("<id>");
    expected["destination"] = json!("persona.test");
    assert_eq!(context["received"], expected, "{who}: the whole context, source and destination swapped");
}

#[test]
fn a_persona_discovers_and_calls_toolhost_on_both_topics_as_the_reference_toolbox_answers() {
    let redis = RedisProcess::start(&[]);
    let bus = Bus::start();
    let dir = temp_dir("ovos");
    let _reference = Reference::start(&bus, "ref", &[]);
    let th = toolhost(&redis, &bus, &dir, "th", 3_000, "");
    th.wait_for_log("connected to the OVOS messagebus", Duration::from_secs(20));

    let reference = normalized(&scenario(&bus, &["check", &bus.port.to_string(), "ref"]), "ref");
    let before = requests(&redis).len();
    let ours = normalized(&scenario(&bus, &["check", &bus.port.to_string(), "th"]), "th");
    check_alone(&reference, "reference");
    check_alone(&ours, "toolhost");

    // The same replies, call by call: toolhost adds the call's `name`, and its validation
    // errors add pointer details after the reference's text.
    for (label, theirs) in reference["calls"].as_object().unwrap() {
        let mine = &ours["calls"][label];
        assert_eq!(mine["type"], theirs["type"], "{label}");
        let mut data = mine["data"].clone();
        let name = data.as_object_mut().unwrap().remove("name");
        assert!(name.is_some(), "{label}: toolhost names the tool: {mine}");
        if label.starts_with("invalid") || label == "missing_kwargs" {
            let (mine, theirs) = (data["error"].as_str().unwrap(), theirs["data"]["error"].as_str().unwrap());
            assert_eq!(theirs, "ValueError: Tool input validation failed for 'echo' in ToolBox '<id>'");
            assert!(mine.starts_with(&format!("{theirs}: ")), "{label}: {mine}");
            assert!(mine.contains("message") && mine.contains("(rule "), "{label}: the details: {mine}");
        } else {
            assert_eq!(data, theirs["data"], "{label}: toolhost and the reference answer alike");
        }
    }
    let mut context = ours["context"]["received"].clone();
    let mut theirs = reference["context"]["received"].clone();
    context.as_object_mut().unwrap().remove("call_id");
    theirs.as_object_mut().unwrap().remove("call_id");
    assert_eq!(context, theirs, "the same reply context");

    // The calls with a tool and an object of kwargs reached Redis, each exactly once; the
    // others were answered by the door.
    let host_calls = ours["host_calls"].as_u64().unwrap() as usize;
    wait_for("the requests on Redis", Duration::from_secs(5), || {
        requests(&redis).len() >= before + host_calls
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(requests(&redis).len() - before, host_calls, "one request per call that reaches a host");

    // A tool past [ovos] call_timeout_ms (3 s) answers timeout.
    let slow = scenario(&bus, &["call", &bus.port.to_string(), "th", "nap", r#"{"seconds": "10"}"#]);
    assert_eq!(slow["count"], 1, "{slow}");
    let error = slow["data"]["error"].as_str().unwrap();
    assert!(error.starts_with("RuntimeError: timeout: "), "{error}");

    // The whole fleet: a second toolbox's tool is announced to a listening persona and called
    // through toolhost's door (over Redis).
    let (mut listener, mut lines) = listen_for_announcement(&bus, "stamp");
    let config = dir.join("other.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\ntoolbox_id = \"other\"\n[tools.terminal]\nrun_as = \"{}\"\n[[commands]]\nname = \"stamp\"\n\
             description = \"Print a word.\"\nargv = [\"echo\", \"{{word}}\"]\ntimeout_ms = 5000\n",
            user()
        ),
    )
    .unwrap();
    let _other =
        Toolhost::start(&[("REDIS_URL", &redis.url()), ("TOOLHOST_CONFIG", config.to_str().unwrap())]);
    let announced: Value = serde_json::from_str(&lines.next_report_line()).unwrap();
    let _ = listener.wait();
    assert_eq!(announced["announced"], true, "the fleet's change was announced: {announced}");
    // `th`'s own consumer group answers a tool no toolbox it knows of hosts (`unknown_tool`);
    // it learns of `other` from the heartbeats, shown in `/status`.
    let port = http_port(&th);
    wait_for("th to know the other toolbox", Duration::from_secs(10), || {
        get(port, "/status").1["fleet"]["toolboxes"]["other"].is_array()
    });
    let stamp = scenario(&bus, &["call", &bus.port.to_string(), "th", "stamp", r#"{"word": "fleet"}"#]);
    assert_eq!(stamp["count"], 1, "{stamp}");
    assert_eq!(stamp["data"]["result"], "fleet\n", "a tool of the other toolbox, through toolhost: {stamp}");
}

#[test]
fn frames_that_are_not_messages_are_skipped_and_the_door_keeps_serving() {
    let redis = RedisProcess::start(&[]);
    let bus = Bus::start();
    let dir = temp_dir("ovos");
    let th = toolhost(&redis, &bus, &dir, "th", 3_000, "");
    th.wait_for_log("connected to the OVOS messagebus", Duration::from_secs(20));

    let before = requests(&redis).len();
    let report = scenario(&bus, &["bad-input", &bus.port.to_string(), "th"]);
    // No type, a type that is not a string, data that is not an object: no reply.
    for label in ["no-type", "type-int", "data-list"] {
        assert_eq!(report[label], 0, "{label}: {report}");
    }
    assert_eq!(
        report["probe"],
        json!([{"toolbox_id": "th", "name": "echo", "result": {"message": "after bad frames"}}])
    );
    assert_eq!(
        report["after_big_frame"]["result"],
        json!({"message": "after the big frame"}),
        "serves after a 10 MiB frame: {report}"
    );
    th.wait_for_log("skipped a frame of the OVOS messagebus that is not a message", Duration::from_secs(5));
    th.wait_for_log("over ovos.max_frame_bytes", Duration::from_secs(5));
    // Every answered call reached Redis once; nothing else did.
    let answered = report["answered_probes"].as_u64().unwrap() as usize;
    assert_eq!(requests(&redis).len() - before, answered, "{report}");
    let (_, status) = get(http_port(&th), "/status");
    let door = &status["doors"]["ovos"];
    assert_eq!(door["connected"], true, "{status}");
    assert!(door["reconnects"].as_u64().unwrap() >= 1, "the big frame cost one connection: {status}");
    assert!(door["defective_frames"].as_u64().unwrap() >= 7, "{status}");
}

#[test]
fn the_door_reconnects_after_the_bus_restarts_and_a_call_cut_by_it_reached_redis_once() {
    let redis = RedisProcess::start(&[]);
    let mut bus = Bus::start();
    let dir = temp_dir("ovos");
    // A persona already on the bus hears toolhost announce its tools when it connects.
    let (mut listener, mut lines) = listen_for_announcement(&bus, "echo");
    let th = toolhost(&redis, &bus, &dir, "th", 20_000, "tenant = \"house-1\"\nmax_concurrent_calls = 1");
    th.wait_for_log("connected to the OVOS messagebus", Duration::from_secs(20));
    let announced: Value = serde_json::from_str(&lines.next_report_line()).unwrap();
    let _ = listener.wait();
    assert_eq!(announced["announced"], true, "announced on connect: {announced}");
    assert_eq!(announced["context"]["source"], "th", "{announced}");
    let port = http_port(&th);
    assert_eq!(get(port, "/readyz").0, 200);

    // A call under way when the bus goes away: it runs to its end on Redis, once; its reply has
    // nowhere to go and is dropped (logged).
    let fired = scenario(&bus, &["fire", &bus.port.to_string(), "th", "nap", r#"{"seconds": "6"}"#]);
    assert!(fired["sent"].is_string(), "{fired}");
    wait_for("the nap request on Redis", Duration::from_secs(10), || requests_of(&redis, "nap") == 1);
    // One call waits for its answer, [ovos] max_concurrent_calls = 1: the next is refused at once.
    let refused = scenario(&bus, &["call", &bus.port.to_string(), "th", "echo", r#"{"message": "x"}"#]);
    assert_eq!(
        refused["data"]["error"],
        "RuntimeError: overloaded: the OVOS door has 1 calls in flight; retry later",
        "{refused}"
    );
    assert_eq!(requests_of(&redis, "echo"), 0, "a refused call never reaches Redis");
    bus.kill();
    wait_for("readiness to see the bus gone", Duration::from_secs(10), || {
        let (status, body) = get(port, "/readyz");
        status == 503
            && body["reasons"].as_array().unwrap().contains(&json!("the OVOS messagebus is not connected"))
    });
    let (_, status) = get(port, "/status");
    assert_eq!(status["doors"]["ovos"]["connected"], false, "{status}");
    assert!(status["doors"]["ovos"]["last_error"].is_string(), "{status}");
    th.wait_for_log("message dropped", Duration::from_secs(15));
    assert_eq!(requests_of(&redis, "nap"), 1, "the cut call reached Redis once");

    bus.restart();
    th.wait_for_log("\"reconnect\":true", Duration::from_secs(20));
    wait_for("readiness after the reconnect", Duration::from_secs(10), || get(port, "/readyz").0 == 200);
    let report = normalized(&scenario(&bus, &["check", &bus.port.to_string(), "th"]), "th");
    check_alone(&report, "toolhost after the bus restarted");
    let (_, status) = get(port, "/status");
    assert_eq!(status["doors"]["ovos"]["reconnects"], 1, "{status}");
    assert_eq!(requests_of(&redis, "nap"), 1, "nothing was sent twice");
    // Every request of a bus call carries [ovos] tenant.
    let all = requests(&redis);
    assert!(!all.is_empty() && all.iter().all(|request| request["tenant_id"] == "house-1"), "{all:?}");
}

/// Runs the toolhost CLI with `config`; returns its exit code and stdout (stderr after it when
/// stdout is empty).
fn cli(redis: &RedisProcess, config: &Path, args: &[&str]) -> (i32, String) {
    let output = Command::new(toolhost_e2e::toolhost_bin())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("REDIS_URL", redis.url())
        .env("TOOLHOST_CONFIG", config)
        .output()
        .expect("run the toolhost CLI");
    let mut stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if stdout.trim().is_empty() {
        stdout = String::from_utf8_lossy(&output.stderr).into_owned();
    }
    (output.status.code().unwrap_or(-1), stdout)
}

/// `toolhost call`: the result, or the error object.
fn call(redis: &RedisProcess, config: &Path, tool: &str, arguments: Value) -> Value {
    let (_, stdout) =
        cli(redis, config, &["call", tool, "--args", &arguments.to_string(), "--timeout", "20s"]);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| json!({"unparsed": stdout}))
}

#[test]
fn a_reference_toolboxs_tools_are_hosted_called_over_redis_and_answer_overloaded_while_it_is_gone() {
    let redis = RedisProcess::start(&[]);
    let bus = Bus::start();
    let dir = temp_dir("ovos");
    let mut reference = Some(Reference::start(&bus, "ref", &[]));
    // A toolbox that answers every call and every discovery 50 times.
    let _flood = Reference::start(&bus, "flood", &["--flood", "50"]);
    let th = toolhost(&redis, &bus, &dir, "th", 3_000, "host_toolboxes = [\"*\"]\nrediscover_ms = 500");
    let config = dir.join("th.toml");

    wait_for("the hosted toolboxes' tools in `toolhost tools`", Duration::from_secs(20), || {
        let (_, listed) = cli(&redis, &config, &["tools"]);
        listed.contains("ovos__ref__echo") && listed.contains("ovos__flood__echo")
    });
    let (code, listed) = cli(&redis, &config, &["tools"]);
    assert_eq!(code, 0);
    for name in ["ovos__ref__add", "ovos__ref__divide", "ovos__ref__nap", "ovos__ref__broken"] {
        assert!(listed.contains(name), "{name} listed: {listed}");
    }
    // toolhost never hosts its own toolbox: its door answered the source's discovery as `th`,
    // and no `ovos__th__*` tool came of it.
    assert!(!listed.contains("ovos__th__"), "no loop: {listed}");
    th.wait_for_log("OVOS toolbox listed its tools", Duration::from_secs(5));

    // Called over Redis, answered by the Python toolbox on the bus.
    assert_eq!(call(&redis, &config, "ovos__ref__add", json!({"a": 2, "b": 3})), json!({"sum": 5}));
    assert_eq!(call(&redis, &config, "ovos__ref__echo", json!({"message": "hi"})), json!({"message": "hi"}));
    // toolhost validates strictly against the toolbox's JSON Schema: "5" is not an integer here,
    // though the toolbox's pydantic would take it.
    let strict = call(&redis, &config, "ovos__ref__add", json!({"a": "5", "b": 3}));
    assert_eq!(strict["error_code"], "invalid_arguments", "{strict}");
    // A rule only the toolbox knows: its validation error is tool_failed, with its text.
    let refused = call(&redis, &config, "ovos__ref__divide", json!({"a": 1, "b": 0}));
    assert_eq!(refused["error_code"], "tool_failed", "{refused}");
    assert_eq!(
        refused["error"], "ValueError: Tool input validation failed for 'divide' in ToolBox 'ref'",
        "{refused}"
    );
    let broken = call(&redis, &config, "ovos__ref__broken", json!({"message": "x"}));
    assert_eq!(broken["error_code"], "tool_failed", "{broken}");
    assert!(
        broken["error"].as_str().unwrap().starts_with("RuntimeError: Tool output validation failed"),
        "{broken}"
    );
    // No reply within the tool's timeout ([ovos] call_timeout_ms, 3 s).
    let slow = call(&redis, &config, "ovos__ref__nap", json!({"seconds": 10}));
    assert_eq!(slow["error_code"], "timeout", "{slow}");

    // A flood of replies: the call is answered once, the rest dropped and counted.
    assert_eq!(
        call(&redis, &config, "ovos__flood__echo", json!({"message": "once"})),
        json!({"message": "once"})
    );
    th.wait_for_log("replied again to an answered call", Duration::from_secs(5));
    assert_eq!(
        call(&redis, &config, "ovos__ref__echo", json!({"message": "still"})),
        json!({"message": "still"})
    );

    // The door does not show the hosted tools on the bus again (they are there already).
    let door =
        scenario(&bus, &["call", &bus.port.to_string(), "th", "ovos__ref__echo", r#"{"message": "x"}"#]);
    assert_eq!(
        door["data"]["error"], "ValueError: Unknown tool 'ovos__ref__echo' for ToolBox 'th'.",
        "{door}"
    );

    // The toolbox dies: after a discovery it does not answer, its tools answer overloaded.
    drop(reference.take());
    let mut gone = Value::Null;
    wait_for("overloaded while the toolbox is gone", Duration::from_secs(15), || {
        gone = call(&redis, &config, "ovos__ref__echo", json!({"message": "gone"}));
        gone["error_code"] == "overloaded"
    });
    assert!(gone["details"]["retry_after_ms"].as_u64().is_some(), "{gone}");
    // `/status` is copied from the sources every second.
    let port = http_port(&th);
    wait_for("/status to show the toolbox down", Duration::from_secs(5), || {
        let (_, status) = get(port, "/status");
        status["sources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|source| source["name"] == "ovos:ref" && source["up"] == false)
    });

    // It comes back: it serves again.
    reference = Some(Reference::start(&bus, "ref", &[]));
    wait_for("the toolbox serving again", Duration::from_secs(15), || {
        call(&redis, &config, "ovos__ref__echo", json!({"message": "back"})) == json!({"message": "back"})
    });
    drop(reference);
}

#[test]
fn a_hosted_call_cut_by_the_bus_is_answered_once_and_the_toolbox_serves_when_the_bus_is_back() {
    let redis = RedisProcess::start(&[]);
    let mut bus = Bus::start();
    let dir = temp_dir("ovos");
    let mark = dir.join("nap.mark");
    let _reference = Reference::marked(&bus, "ref", &mark);
    let th = toolhost(&redis, &bus, &dir, "th", 20_000, "host_toolboxes = [\"ref\"]\nrediscover_ms = 500");
    let config = dir.join("th.toml");
    wait_for("the hosted tools", Duration::from_secs(20), || {
        call(&redis, &config, "ovos__ref__echo", json!({"message": "up"})) == json!({"message": "up"})
    });

    // A call under way on the toolbox when the bus goes away.
    let (redis_url, config_path) = (redis.url(), config.clone());
    let cut = std::thread::spawn(move || {
        let output = Command::new(toolhost_e2e::toolhost_bin())
            .args(["call", "ovos__ref__nap", "--args", r#"{"seconds": 5}"#, "--timeout", "30s"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("REDIS_URL", redis_url)
            .env("TOOLHOST_CONFIG", config_path)
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&output.stdout).unwrap_or(Value::Null)
    });
    wait_for("the nap to start on the toolbox", Duration::from_secs(10), || mark.exists());
    bus.kill();
    let answer = cut.join().unwrap();
    assert_eq!(answer["error_code"], "tool_failed", "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("the call may have run"), "{answer}");
    assert_eq!(requests_of(&redis, "ovos__ref__nap"), 1, "one request, answered once");
    th.wait_for_log("OVOS messagebus connection lost", Duration::from_secs(5));
    // While the bus is gone the toolbox's tools answer overloaded.
    let gone = call(&redis, &config, "ovos__ref__echo", json!({"message": "gone"}));
    assert_eq!(gone["error_code"], "overloaded", "{gone}");

    bus.restart();
    wait_for("the toolbox serving again over the restarted bus", Duration::from_secs(30), || {
        call(&redis, &config, "ovos__ref__echo", json!({"message": "back"})) == json!({"message": "back"})
    });
}
