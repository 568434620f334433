//! The web console (`[console]`) in a real headless Chromium: a redis-server, a toolbox `main`
//! serving the console (with a token) and hosting the MCP server `server-everything` over stdio,
//! a slow command, a tool whose description holds a `<script>` and one whose schema has an
//! argument of every kind the try-it form makes (`form_probe`), and a second toolbox `second` on
//! the same Redis. The browser is driven by Selenium from
//! `tests/console/scenarios.py`, under the venv `just test-console` makes
//! (`scripts/ensure-console-deps.sh`, which installs Debian's `chromium` and `chromium-driver`
//! too; `TOOLHOST_CONSOLE_VENV` names another venv). The server-everything install is
//! `scripts/ensure-mcp-servers.sh`'s.
//!
//! Each scenario reports what the pages showed; these tests check the report and what Redis
//! holds afterwards (the answers, the dead letters, the audit stream). Screenshots of every page
//! are saved under `target/console-artifacts/`.

// Test code: a failed step is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost_e2e::{RedisProcess, Toolhost, temp_dir, user};

/// One browser and one fleet at a time: Chromium and Node are heavy on a shared machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// How long a wait on Redis may take.
const WAIT: Duration = Duration::from_secs(60);

/// The seconds the slow call sleeps: a number no other process on the machine is likely to
/// sleep, since the browser scenario looks for the `sleep` process by it, and short enough that
/// a `sleep` left behind by a failed run (its daemon killed) does not linger long.
const SLOW_SECONDS: &str = "127";

/// The description of `html_note` (which echoes its `text`): each part would set
/// `window.__consoleXss` if the page ran it.
const HTML_DESCRIPTION: &str = r#"Notes. <script>window.__consoleXss = 1</script><img src="x" onerror="window.__consoleXss = 2"> & more"#;

/// The argument schema of `form_probe` (a `cat` of its arguments): an enum, a boolean, a nested
/// object with a required string and a bounded integer, and an array, the kinds the try-it form
/// generates controls for beside plain strings and numbers.
fn probe_schema() -> Value {
    json!({
        "type": "object",
        "required": ["level", "target"],
        "properties": {
            "level": {"type": "string", "enum": ["low", "high"]},
            "urgent": {"type": "boolean"},
            "target": {
                "type": "object",
                "required": ["host"],
                "properties": {
                    "host": {"type": "string"},
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                },
            },
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    })
}

/// The command `shared_note`, which both toolboxes serve, each with its own `description`.
fn shared_note(description: &str) -> String {
    format!(
        "\n[[commands]]\nname = \"shared_note\"\ndescription = {}\nargv = [\"echo\", \"{{text}}\"]\n",
        toml_string(description)
    )
}

/// The venv with Selenium, as `scripts/ensure-console-deps.sh` lays it out.
fn venv() -> PathBuf {
    toolhost_e2e::venv("TOOLHOST_CONSOLE_VENV", "venv-console", "ensure-console-deps.sh", "test-console")
}

/// The installed server-everything entry script, as `scripts/ensure-mcp-servers.sh` lays it out.
fn everything_server() -> PathBuf {
    let cache = std::env::var_os("TOOLHOST_MCP_SERVERS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/toolhost/mcp-servers")
    });
    let script = cache.join("everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        script.exists(),
        "{} is missing: run scripts/ensure-mcp-servers.sh (`just test-console` does)",
        script.display()
    );
    script
}

/// `target/console-artifacts/`, where the screenshots go.
fn artifacts() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), PathBuf::from);
    target.join("console-artifacts")
}

/// A TOML string (basic, escaped).
fn toml_string(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

/// The Redis, the toolbox `main` with the console, and the toolbox `second`.
struct Fleet {
    redis: RedisProcess,
    main: Toolhost,
    _second: Toolhost,
    token: String,
    url: String,
    _dir: PathBuf,
}

impl Fleet {
    fn start() -> Fleet {
        let redis = RedisProcess::start(&[]);
        let dir = temp_dir("console");
        let token = format!("console-{}", uuid::Uuid::new_v4().simple());
        let main_config = dir.join("main.toml");
        let probe_path = dir.join("form_probe.json");
        std::fs::write(&probe_path, probe_schema().to_string()).unwrap();
        std::fs::write(
            &main_config,
            format!(
                "[daemon]\ntoolbox_id = \"main\"\n\n\
                 [console]\nlisten = \"127.0.0.1:0\"\ntoken_env = \"CONSOLE_TOKEN\"\n\n\
                 [tools.terminal]\nrun_as = {user}\n\n\
                 [[mcp_servers]]\nname = \"everything\"\ncommand = \"node\"\nargs = [{everything}, \"stdio\"]\n\n\
                 [[commands]]\nname = \"slow_sleep\"\ndescription = \"Sleep for the given number of seconds.\"\n\
                 argv = [\"sleep\", \"{{seconds}}\"]\ntimeout_ms = 180000\n\n\
                 [[commands]]\nname = \"html_note\"\ndescription = {html}\nargv = [\"echo\", \"{{text}}\"]\n\n\
                 [[commands]]\nname = \"form_probe\"\ndescription = \"Says back an argument of every kind the form makes.\"\n\
                 argv = [\"cat\"]\nstdin = \"{{level}} {{urgent}} {{target}} {{tags}}\"\nargument_schema_file = {probe}\n\
                 {shared}",
                user = toml_string(&user()),
                everything = toml_string(everything_server().to_str().unwrap()),
                html = toml_string(HTML_DESCRIPTION),
                probe = toml_string(probe_path.to_str().unwrap()),
                shared = shared_note("Main's note."),
            ),
        )
        .unwrap();
        let main = Toolhost::start(&[
            ("REDIS_URL", &redis.url()),
            ("TOOLHOST_CONFIG", main_config.to_str().unwrap()),
            ("CONSOLE_TOKEN", &token),
        ]);
        main.wait_for_log("console listening", WAIT);
        let address = main
            .log()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|line| line["message"] == "console listening")
            .and_then(|line| line["address"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("no `console listening` line with an address:\n{}", main.log()));
        let second_config = dir.join("second.toml");
        // `second` writes its call log too, so the console shows the calls it runs, and serves
        // `shared_note` with another description than `main`'s: a conflict.
        std::fs::write(
            &second_config,
            format!(
                "[daemon]\ntoolbox_id = \"second\"\n[console]\nrecord_calls = true\n\
                 [tools.terminal]\nrun_as = {user}\n{shared}",
                user = toml_string(&user()),
                shared = shared_note("Second's note."),
            ),
        )
        .unwrap();
        let second = Toolhost::start(&[
            ("REDIS_URL", &redis.url()),
            ("TOOLHOST_CONFIG", second_config.to_str().unwrap()),
        ]);
        Fleet { redis, main, _second: second, token, url: format!("http://{address}"), _dir: dir }
    }

    /// Runs a scenario of `scenarios.py` to its end and returns its report (the last line).
    fn scenario(&self, name: &str, args: &[&str]) -> Value {
        let output = Command::new(venv().join("bin/python"))
            .arg(toolhost_e2e::fixture("console", "scenarios.py"))
            .arg(name)
            .arg(&self.url)
            .arg(artifacts())
            .args(args)
            .env("CONSOLE_TOKEN", &self.token)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .output()
            .expect("run scenarios.py");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let last = stdout.lines().rev().find(|line| line.starts_with('{')).unwrap_or_default();
        serde_json::from_str(last).unwrap_or_else(|_| {
            panic!(
                "scenario {name} failed ({}) and reported nothing:\n{stdout}\nthe console's log:\n{}",
                output.status,
                self.main.log()
            )
        })
    }

    /// Every entry of a stream, as (entry id, fields).
    fn entries(&self, stream: &str) -> Vec<(String, HashMap<String, String>)> {
        redis::cmd("XRANGE").arg(stream).arg("-").arg("+").query(&mut self.redis.connection()).unwrap()
    }

    /// The answers (`data`) on a results stream.
    fn answers(&self, stream: &str) -> Vec<Value> {
        self.entries(stream)
            .into_iter()
            .filter_map(|(_, fields)| serde_json::from_str::<Value>(fields.get("payload")?).ok())
            .map(|payload| payload["data"].clone())
            .collect()
    }

    /// Every entry of every `audit:*` stream.
    fn audit(&self) -> Vec<HashMap<String, String>> {
        let keys: Vec<String> =
            redis::cmd("KEYS").arg("audit:*").query(&mut self.redis.connection()).unwrap();
        keys.iter().flat_map(|key| self.entries(key)).map(|(_, fields)| fields).collect()
    }

    /// The dead letters of both toolboxes that mention `request_id`.
    fn letters_of(&self, request_id: &str) -> Vec<String> {
        ["dlq:main", "dlq:second"]
            .iter()
            .flat_map(|stream| self.entries(stream))
            .filter(|(_, fields)| fields.values().any(|value| value.contains(request_id)))
            .map(|(id, _)| id)
            .collect()
    }

    /// Publishes a request of `html_note` (which only `main` hosts, so only `main` handles it)
    /// whose answer goes to `topic`.
    fn request_note(&self, request_id: &str, text: &str, topic: &str) {
        let payload = json!({
            "id": uuid::Uuid::new_v4().to_string(),
            "source": "agent:console-test",
            "specversion": "1.0",
            "type": "html_note.requested",
            "topic": "action-requests",
            "response_topic": topic,
            "data": {"request_id": request_id, "text": text},
        });
        let _: String = redis::cmd("XADD")
            .arg("action-requests")
            .arg("*")
            .arg("id")
            .arg(uuid::Uuid::new_v4().to_string())
            .arg("payload")
            .arg(payload.to_string())
            .query(&mut self.redis.connection())
            .unwrap();
    }
}

/// Waits until `check` gives a value, panicking with `what` after [`WAIT`].
fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn lock() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether the audit holds the console's `action` (its `reason`: `call`, `cancel`, `replay ...`,
/// `delete ...`) on `request_id`, for the console's tenant.
fn audited(audit: &[HashMap<String, String>], request_id: &str, action: &str) -> bool {
    audit.iter().any(|entry| {
        let field = |name: &str| entry.get(name).map_or("", String::as_str);
        field("door") == "console"
            && field("tenant") == "console"
            && field("request_id") == request_id
            && field("reason").starts_with(action)
    })
}

/// A screenshot the scenario says it saved is a PNG file.
fn check_screenshot(report: &Value, key: &str) {
    let path = report[key].as_str().unwrap_or_else(|| panic!("no {key} in {report}"));
    let bytes = std::fs::read(path).unwrap_or_else(|error| panic!("{path}: {error}"));
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 1000, "{path} is no screenshot");
}

#[test]
fn the_fleet_page_lists_the_second_toolbox_and_the_hosted_servers_state() {
    let _one = lock();
    let fleet = Fleet::start();
    let report = fleet.scenario("pages", &[]);
    assert!(
        report["before_login"].as_str().unwrap().contains("Unauthorized"),
        "a page before the login: {report}"
    );
    let rows = &report["fleet"];
    let tools_of = |toolbox: &str| -> u64 {
        rows["toolboxes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["toolbox"] == toolbox)
            .unwrap_or_else(|| panic!("no replica of {toolbox} on the fleet page: {rows}"))["tools"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    // `second` hosts the built-in tools; `main` those and server-everything's and its commands.
    assert!(tools_of("second") > 0, "{rows}");
    assert!(tools_of("main") > tools_of("second") + 2, "{rows}");
    let everything: Vec<&Value> =
        rows["sources"].as_array().unwrap().iter().filter(|row| row["source"] == "everything").collect();
    assert_eq!(everything.len(), 1, "one source `everything`: {rows}");
    assert_eq!(everything[0]["toolbox"], "main", "{rows}");
    assert_eq!(everything[0]["state"], "up", "{rows}");
    // The spec's example kind is `mcp`; the console shows a hosted MCP server's transport.
    assert!(["mcp", "stdio"].contains(&everything[0]["kind"].as_str().unwrap()), "{rows}");
    assert_eq!(rows["redis_topology"], "single", "{rows}");
    assert_eq!(rows["redis_health"], "up", "{rows}");
    // Each toolbox's group on every stream its replicas read: the requests stream and the chat
    // inbox (both toolboxes keep the default agent name, so they share `chat:ToolHost`).
    let groups: Vec<(&str, &str)> = rows["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|row| Some((row["stream"].as_str()?, row["group"].as_str()?)))
        .collect();
    for stream in ["action-requests", "chat:ToolHost"] {
        for group in ["main", "second"] {
            assert!(groups.contains(&(stream, group)), "{group}'s group on {stream}: {rows}");
        }
    }
    assert!(
        rows["groups"].as_array().unwrap().iter().all(|row| row["pending"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .is_ok()
            && !row["lag"].as_str().unwrap().is_empty()),
        "{rows}"
    );

    // `shared_note`, served by both toolboxes with different descriptions, is listed as a
    // conflict: one row per description, each naming its toolbox.
    let conflicts = rows["conflicts"].as_array().unwrap();
    let shared: Vec<&Value> = conflicts.iter().filter(|row| row["tool"] == "shared_note").collect();
    assert_eq!(shared.len(), 2, "{rows}");
    let mut toolboxes: Vec<&str> = shared.iter().filter_map(|row| row["toolboxes"].as_str()).collect();
    toolboxes.sort_unstable();
    assert_eq!(toolboxes, ["main", "second"], "{rows}");
    assert_ne!(shared[0]["hash"], shared[1]["hash"], "{rows}");
    assert!(conflicts.iter().all(|row| row["tool"] == "shared_note"), "no other conflict: {rows}");

    let tools: Vec<&str> = report["tools"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for name in ["echo", "slow_sleep", "html_note", "everything__echo"] {
        assert!(tools.contains(&name), "{name} on the tools page: {tools:?}");
    }
    let found: Vec<&str> =
        report["search_everything"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(found.contains(&"everything__echo") && !found.contains(&"echo"), "the search: {found:?}");
    check_screenshot(&report, "screenshot_fleet");
    check_screenshot(&report, "screenshot_tools");
}

#[test]
fn the_try_it_form_refuses_a_wrong_type_then_calls_and_a_slow_call_is_cancelled() {
    let _one = lock();
    let fleet = Fleet::start();
    let report = fleet.scenario("try-it", &[SLOW_SECONDS]);
    assert_eq!(report["input_schema"]["properties"]["message"]["type"], "string", "{report}");

    // The wrong type was caught in the browser: an error at /message, and nothing sent.
    assert!(!report["wrong_type_error"].as_str().unwrap().is_empty(), "{report}");
    assert_eq!(report["wrong_type_request_id"], "", "no call was sent: {report}");
    assert_ne!(report["wrong_type_state"], "running", "{report}");

    let echo_id = report["echo_request_id"].as_str().unwrap();
    assert!(!echo_id.is_empty(), "{report}");
    assert_eq!(report["echo_result"]["success"], true, "{report}");
    assert_eq!(report["echo_result"]["result"], json!({"message": "hello from the console"}), "{report}");
    assert_eq!(report["echo_errors_left"], 0, "the errors are gone once the call is valid: {report}");

    // server-everything's long-running operation: number fields, where text is refused in the
    // browser; then 4 steps in 2 s, each a progress entry.
    for pointer in ["/duration", "/steps"] {
        assert_eq!(report["number_fields"][pointer]["data_type"], "number", "{report}");
    }
    assert!(!report["text_in_number_error"].as_str().unwrap().is_empty(), "{report}");
    assert_eq!(report["text_in_number_request_id"], "", "no call was sent: {report}");
    let progress = report["progress"].as_array().unwrap();
    assert!(progress.len() >= 2, "progress entries listed: {report}");
    assert_eq!(report["progress_result"]["success"], true, "{report}");
    // An image a hosted MCP tool answers is shown as an image, its texts as text.
    let image = &report["image_answer"];
    assert_eq!(image["content"][1]["type"], "image", "{image}");
    assert_eq!(
        image["result"], "Here's the image you requested:\nThe image above is the MCP logo.",
        "{image}"
    );
    assert_eq!(report["image_block"]["src_prefix"], "data:image/png;base64,", "{report}");
    assert_eq!(report["image_block"]["natural_width"], 20, "the 20x20 MCP logo decoded: {report}");
    assert_eq!(
        report["image_block"]["texts"],
        json!(["Here's the image you requested:", "The image above is the MCP logo."]),
        "{report}"
    );

    let slow_id = report["slow_request_id"].as_str().unwrap();
    assert!(!slow_id.is_empty() && slow_id != echo_id, "{report}");
    assert_eq!(report["slow_result"]["success"], false, "{report}");
    assert_eq!(report["slow_result"]["error_code"], "cancelled", "{report}");
    assert_eq!(report["slow_cancel_enabled_after"], false, "Cancel is off once the call ended: {report}");

    // The tools' statistics, from `tools.stats` of each toolbox hosting the tool: echo (hosted
    // by both) counted its call with p50 and p99 where it ran; slow_sleep (main's) its cancel.
    let echo_stats = report["echo_stats"].as_array().unwrap();
    let toolboxes: Vec<&str> = echo_stats.iter().filter_map(|row| row["toolbox"].as_str()).collect();
    assert_eq!(toolboxes, ["main", "second"], "{report}");
    let ran = echo_stats.iter().find(|row| row["calls"] != "0").unwrap();
    for key in ["p50", "p99"] {
        assert!(ran[key].as_str().unwrap().parse::<f64>().is_ok(), "{key}: {report}");
    }
    let slow_stats = report["slow_stats"].as_array().unwrap();
    assert_eq!(slow_stats.len(), 1, "{report}");
    assert_eq!(slow_stats[0]["toolbox"], "main", "{report}");
    assert!(slow_stats[0]["errors"].as_str().unwrap().contains("cancelled: 1"), "{report}");

    // The calls page: both calls, made for the console's tenant, and their outcomes. The
    // toolbox that ran a call logs its outcome; another toolbox hosting the same tool logs
    // `duplicate` for its acked copy, and one that does not host it logs nothing.
    let calls = report["calls"].as_array().unwrap();
    let rows = |id: &str| -> Vec<&Value> { calls.iter().filter(|row| row["request_id"] == id).collect() };
    for (id, tool, outcome) in [(echo_id, "echo", "success"), (slow_id, "slow_sleep", "cancelled")] {
        let ran: Vec<&Value> = rows(id).into_iter().filter(|row| row["outcome"] != "duplicate").collect();
        assert_eq!(ran.len(), 1, "{id}: one toolbox ran it: {calls:?}");
        assert_eq!(ran[0]["tool"], tool, "{calls:?}");
        assert_eq!(ran[0]["outcome"], outcome, "{calls:?}");
        for row in rows(id) {
            assert_eq!(row["tenant"], "console", "{calls:?}");
        }
    }
    let first = |id: &str| calls.iter().position(|row| row["request_id"] == id).unwrap();
    assert!(first(slow_id) < first(echo_id), "newest first: {calls:?}");
    let filtered: Vec<&str> =
        report["calls_filtered"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(filtered.contains(&slow_id) && !filtered.contains(&echo_id), "the filter: {filtered:?}");
    // A call made while the calls page was open came in live, hidden by the filter it fails.
    assert!(!report["live_request_id"].as_str().unwrap().is_empty(), "{report}");
    assert_eq!(report["live_same_page"], true, "no reload: {report}");
    let live = report["live_rows"].as_array().unwrap();
    assert!(!live.is_empty() && live.iter().all(|row| row["displayed"] == "false"), "{report}");
    assert!(live.iter().all(|row| row["tool"] == "echo" && row["tenant"] == "console"), "{report}");

    // The detail page: the request as sent, the answer, the timings and the deliveries.
    assert_eq!(report["detail_outcome"], "success", "{report}");
    assert!(report["detail_answer"].as_str().unwrap().contains("hello from the console"), "{report}");
    let request = report["detail_request"].as_str().unwrap();
    assert!(request.contains("tool.invoke") && request.contains("hello from the console"), "{report}");
    assert_eq!(report["detail_deliveries"], "1", "{report}");
    let timings = report["detail_timings"].as_str().unwrap();
    assert!(timings.contains("duration") && timings.contains("µs"), "{report}");

    // The calls and the cancel were audited as the console's, for its tenant, before they were
    // carried out.
    let audit = fleet.audit();
    for (id, action) in [(echo_id, "call"), (slow_id, "call"), (slow_id, "cancel")] {
        assert!(audited(&audit, id, action), "{id}'s {action} audited: {audit:?}");
    }
    for key in [
        "screenshot_try_it",
        "screenshot_image",
        "screenshot_progress",
        "screenshot_cancelled",
        "screenshot_calls",
        "screenshot_call_detail",
    ] {
        check_screenshot(&report, key);
    }
}

#[test]
fn the_try_it_form_makes_enums_booleans_nested_objects_and_arrays_and_marks_nested_errors() {
    let _one = lock();
    let fleet = Fleet::start();
    let report = fleet.scenario("form", &[]);
    let controls = &report["controls"];
    let kind = |pointer: &str| (controls[pointer]["tag"].as_str(), controls[pointer]["data_type"].as_str());
    assert_eq!(kind("/level"), (Some("select"), Some("enum")), "{controls}");
    assert_eq!(kind("/urgent"), (Some("input"), Some("boolean")), "{controls}");
    assert_eq!(controls["/urgent"]["type"], "checkbox", "{controls}");
    assert_eq!(kind("/target"), (Some("fieldset"), Some("object")), "{controls}");
    assert_eq!(kind("/target/host"), (Some("input"), Some("string")), "{controls}");
    assert_eq!(kind("/target/port"), (Some("input"), Some("integer")), "{controls}");
    assert_eq!(kind("/tags"), (Some("div"), Some("array")), "{controls}");
    // A required enum offers its values only.
    assert_eq!(report["level_options"], json!(["\"low\"", "\"high\""]), "{report}");
    assert_eq!(report["tags_after_remove"], json!(["x", "y"]), "the items renumbered: {report}");
    assert_eq!(report["tag_labels_after_remove"], json!(["#0 *", "#1 *"]), "{report}");

    // The nested object's errors, at their pointers, listed and beside their fields; nothing sent.
    let errors = report["errors"].as_object().unwrap();
    assert_eq!(errors.len(), 2, "{report}");
    assert!(errors["/target/host"].as_str().unwrap().contains("required"), "{report}");
    assert!(errors["/target/port"].as_str().unwrap().contains("number"), "{report}");
    for pointer in ["/target/host", "/target/port"] {
        assert_eq!(report["marked"][pointer]["invalid"], "true", "{pointer} marked: {report}");
        assert!(!report["marked"][pointer]["note"].as_str().unwrap().is_empty(), "{pointer}: {report}");
    }
    assert_eq!(report["errors_request_id"], "", "no call was sent: {report}");
    assert!(report["bound_error"].as_str().unwrap().contains("at most 65535"), "{report}");
    assert_eq!(report["bound_request_id"], "", "no call was sent: {report}");

    // The call carried the values the controls made, and `cat` said them back.
    let request_id = report["request_id"].as_str().unwrap();
    assert!(!request_id.is_empty(), "{report}");
    assert_eq!(report["result"]["success"], true, "{report}");
    assert_eq!(
        report["result"]["result"], r#"high true {"host":"db.internal","port":5432} ["x","y"]"#,
        "{report}"
    );
    assert_eq!((report["errors_left"].as_u64(), report["invalid_left"].as_u64()), (Some(0), Some(0)));
    let sent: Vec<Value> = fleet
        .entries("action-requests")
        .into_iter()
        .filter_map(|(_, fields)| serde_json::from_str::<Value>(fields.get("payload")?).ok())
        .filter(|payload| payload["data"]["request_id"] == request_id)
        .collect();
    assert_eq!(sent.len(), 1, "one request: {sent:?}");
    assert_eq!(
        sent[0]["data"]["arguments"],
        json!({"level": "high", "urgent": true, "target": {"host": "db.internal", "port": 5432}, "tags": ["x", "y"]}),
        "{sent:?}"
    );
    check_screenshot(&report, "screenshot_form_errors");
    check_screenshot(&report, "screenshot_form");
}

#[test]
fn a_dead_letter_is_replayed_and_answered_and_another_deleted_from_the_page() {
    let _one = lock();
    let fleet = Fleet::start();
    // A response topic that holds a key that is not a stream: the daemon answers `internal` on
    // the default topic and dead-letters the request (docs/CONTRACTS.md, "Response topics").
    let topic = "results:console-test";
    let _: () =
        redis::cmd("SET").arg(topic).arg("not a stream").query(&mut fleet.redis.connection()).unwrap();
    let replay_id = format!("replay-{}", uuid::Uuid::new_v4().simple());
    let delete_id = format!("delete-{}", uuid::Uuid::new_v4().simple());
    fleet.request_note(&replay_id, "replayed from the console", topic);
    fleet.request_note(&delete_id, "deleted from the console", topic);
    for id in [&replay_id, &delete_id] {
        wait_for(&format!("the dead letter of {id}"), || (!fleet.letters_of(id).is_empty()).then_some(()));
    }
    // The cause fixed: the topic is free for a stream again.
    let _: () = redis::cmd("DEL").arg(topic).query(&mut fleet.redis.connection()).unwrap();

    let report = fleet.scenario("dlq", &[&replay_id, &delete_id]);
    assert!(report["replay"]["error"].as_str().unwrap().contains(topic), "the letter says why: {report}");
    assert!(report["letter"].to_string().contains(&replay_id), "the letter holds the request: {report}");
    assert!(report["replay"]["flash"].as_str().unwrap().contains("replayed"), "{report}");
    assert!(report["delete"]["flash"].as_str().unwrap().contains("deleted"), "{report}");
    let after: Vec<&str> =
        report["rows_after"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(!after.contains(&replay_id.as_str()) && !after.contains(&delete_id.as_str()), "{after:?}");

    // The replayed request is answered on its own response topic; the deleted one never is.
    let answer = wait_for("the replayed request's answer", || {
        fleet.answers(topic).into_iter().find(|answer| answer["request_id"] == replay_id.as_str())
    });
    assert_eq!(answer["success"], true, "{answer}");
    assert_eq!(answer["result"], "replayed from the console\n", "{answer}");
    assert!(fleet.letters_of(&replay_id).is_empty() && fleet.letters_of(&delete_id).is_empty());
    // The replay put the request on the requests stream again; the delete did not.
    let sent = |id: &str| {
        fleet.entries("action-requests").iter().filter(|(_, fields)| fields["payload"].contains(id)).count()
    };
    assert_eq!(sent(&replay_id), 2, "the request and its replay");
    assert_eq!(sent(&delete_id), 1, "the deleted letter's request only as first sent");
    assert!(
        !fleet.answers(topic).iter().any(|answer| answer["request_id"] == delete_id.as_str()),
        "the deleted letter's request was not answered"
    );

    // Both actions were audited as the console's.
    let audit = fleet.audit();
    assert!(audited(&audit, &replay_id, "replay"), "the replay audited: {audit:?}");
    assert!(audited(&audit, &delete_id, "delete"), "the delete audited: {audit:?}");
    check_screenshot(&report, "screenshot_dlq");
    check_screenshot(&report, "screenshot_letter");
}

#[test]
fn a_tool_description_or_result_holding_a_script_renders_as_text_and_never_runs() {
    let _one = lock();
    let fleet = Fleet::start();
    let report = fleet.scenario("script", &[]);
    for place in ["list", "detail"] {
        let text = report[format!("{place}_text")].as_str().unwrap();
        assert!(
            text.contains("<script>window.__consoleXss = 1</script>"),
            "{place}: shown as text: {report}"
        );
        assert!(text.contains(r#"<img src="x" onerror="#), "{place}: {report}");
        assert_eq!(report[format!("{place}_elements")], 0, "{place}: no element made from it: {report}");
        assert_eq!(report[format!("{place}_flag")], Value::Null, "{place}: nothing of it ran: {report}");
    }
    // A result holding markup, on the try-it page (put there by the script) and on the call's
    // page (by the server): text, no element, nothing run.
    let markup = r#"<img src="y" onerror="window.__consoleXss = 3"><script>window.__consoleXss = 4</script>"#;
    assert_eq!(report["result"]["result"], format!("{markup}\n"), "{report}");
    // The pages show the result and request as JSON: the markup as a JSON string's content.
    let quoted = serde_json::to_string(markup).unwrap();
    let shown = &quoted[1..quoted.len() - 1];
    for place in ["result", "call_request", "call_answer"] {
        assert!(report[format!("{place}_text")].as_str().unwrap().contains(shown), "{place}: {report}");
    }
    for place in ["result", "call"] {
        assert_eq!(report[format!("{place}_elements")], 0, "{place}: no element made from it: {report}");
        assert_eq!(report[format!("{place}_flag")], Value::Null, "{place}: nothing of it ran: {report}");
    }
    assert_eq!(report["alert"], Value::Null, "{report}");
    let scripts: Vec<&str> =
        report["page_scripts"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(
        !scripts.is_empty() && scripts.iter().all(|src| src.ends_with("/static/console.js")),
        "only the console's own script: {scripts:?}"
    );
    check_screenshot(&report, "screenshot_script");
    check_screenshot(&report, "screenshot_script_result");
}

/// The spec's Content-Security-Policy directives, each with its value.
const CSP: [(&str, &str); 7] = [
    ("default-src", "'self'"),
    ("script-src", "'self'"),
    ("style-src", "'self'"),
    ("object-src", "'none'"),
    ("frame-ancestors", "'none'"),
    ("base-uri", "'none'"),
    ("form-action", "'self'"),
];

/// A response's Content-Security-Policy holds every directive of [`CSP`] with its value, and
/// nothing that would let an inline or evaluated script run; other directives may be added.
fn check_csp(key: &str, csp: &str) {
    let directives: HashMap<&str, &str> = csp
        .split(';')
        .filter_map(|directive| directive.trim().split_once(' '))
        .map(|(name, value)| (name, value.trim()))
        .collect();
    for (name, value) in CSP {
        assert_eq!(
            directives.get(name),
            Some(&value),
            "{key}: {name} in the Content-Security-Policy {csp:?}"
        );
    }
    assert!(!csp.contains("unsafe-") && !csp.contains('*'), "{key}: {csp:?}");
}

#[test]
fn requests_without_the_token_or_the_csrf_token_are_refused() {
    let _one = lock();
    let fleet = Fleet::start();
    let report = fleet.scenario("refusals", &[]);
    let check = |key: &str, status: u16, body: &str| {
        let seen = &report[key];
        assert_eq!(seen["status"], status, "{key}: {seen}");
        assert!(seen["body"].as_str().unwrap().contains(body), "{key}: {body:?} in {seen}");
        check_csp(key, seen["csp"].as_str().unwrap_or_default());
    };
    check("page_no_token", 401, "Unauthorized");
    check("page_wrong_bearer", 401, "Unauthorized");
    check("login_wrong_token", 401, "Unauthorized");
    check("api_no_token", 401, "\"error\"");
    check("api_bearer", 200, "");
    check("post_no_csrf", 403, "CSRF");
    check("post_wrong_csrf", 403, "CSRF");
    check("cancel_no_csrf", 403, "CSRF");
    check("dlq_no_csrf", 403, "CSRF");
    // The same POST with the page's CSRF token is accepted: the refusals above were the CSRF's.
    assert!(report["csrf_found"].as_bool().unwrap(), "{report}");
    check("post_with_csrf", 202, "request_id");

    let login = &report["login"];
    assert_eq!(login["status"], 303, "{login}");
    assert_eq!(login["location"], "/", "{login}");
    let cookie = login["set_cookie"].as_str().unwrap_or_default();
    for part in ["toolhost_console=", "HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(part), "{part} in the login cookie: {cookie}");
    }

    assert!(report["browser_no_token"].as_str().unwrap().contains("Unauthorized"), "{report}");
    assert_eq!(report["browser_post_no_csrf"]["status"], 403, "{report}");
    assert_eq!(report["browser_post_with_csrf"]["status"], 202, "{report}");
    check_screenshot(&report, "screenshot_fleet_after_login");
}

/// A tool name holding markup, as a history point written by anyone with Redis access carries it:
/// it would set `window.__consoleXss` if the page ran it.
const MARKUP_TOOL: &str = r#"<img src="z" id="injected" onerror="window.__consoleXss = 5">"#;

#[test]
fn the_charts_of_the_last_hour_render_update_and_keep_markup_in_a_tool_name_as_text() {
    let _one = lock();
    let fleet = Fleet::start();
    // `main`'s consumer, whose history stream the console reads.
    let ready =
        fleet.main.log().lines().find(|line| line.contains("\"message\":\"ready\"")).map(str::to_owned);
    let ready: Value = serde_json::from_str(&ready.unwrap()).unwrap();
    let consumer = ready["consumer"].as_str().unwrap().to_owned();
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let mut buckets = vec![0u64; 16];
    buckets[3] = 2;
    let point = json!({"t": now_ms - 10_000, "in_flight": 0, "pending": 0, "lag": 0,
        "tools": {MARKUP_TOOL: {"calls": 2, "errors": 1, "buckets": buckets}}});
    let _: String = redis::cmd("XADD")
        .arg(format!("toolhost:history:main:{consumer}"))
        .arg("*")
        .arg("id")
        .arg("forged")
        .arg("payload")
        .arg(point.to_string())
        .query(&mut fleet.redis.connection())
        .unwrap();
    // Calls of html_note (only `main` hosts it) all along, so every new point has some.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|scope| {
        let caller = scope.spawn(|| {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                fleet.request_note(&format!("chart-{i}"), "charted", "action-results");
                i += 1;
                std::thread::sleep(Duration::from_millis(400));
            }
        });
        let report = fleet.scenario("charts", &["html_note", MARKUP_TOOL]);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        caller.join().unwrap();
        assert_eq!(report["captions"], json!(["calls per second", "latency"]), "{report}");
        assert_eq!(report["series"], json!(["calls/s", "errors/s", "p50", "p95", "p99"]), "{report}");
        assert!(report["points_first"].as_u64() >= Some(1), "{report}");
        assert!(
            report["points_later"].as_u64() > report["points_first"].as_u64(),
            "the chart updates: {report}"
        );
        assert!(report["updates_later"].as_u64() > report["updates_first"].as_u64(), "{report}");
        assert_eq!(report["markup_heading"], MARKUP_TOOL, "the name is shown as it is, as text");
        assert_eq!(report["markup_elements"], 0, "{report}");
        assert_eq!(report["markup_flag"], Value::Null, "{report}");
        assert_eq!(report["empty_hidden"], true, "{report}");
        let replicas = report["replicas"].as_array().unwrap();
        assert!(replicas.iter().any(|replica| replica == &json!(format!("main/{consumer}"))), "{report}");
        assert_eq!(report["replica_series"], json!(["in flight", "pending", "lag"]), "{report}");
        check_screenshot(&report, "screenshot_tools_charts");
        check_screenshot(&report, "screenshot_fleet_charts");
    });
}
