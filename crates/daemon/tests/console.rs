//! The web console over plain HTTP against a real daemon and Redis: who may use it, that what
//! tools and callers wrote is escaped, the call log, a call from the console, and a dead letter
//! replayed. (The pages' script is driven by a real browser in `tests/tests/console.rs`.)

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Daemon, RedisServer, payloads, request, temp_dir, wait_for, xadd};

const TOKEN: &str = "console-token-0123456789";
const REQUESTS: &str = "action-requests";
const GROUP: &str = "toolhost";
const WAIT: Duration = Duration::from_secs(20);

/// An HTTP answer: status, headers (lower-case names) and body.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|err| panic!("{err}: {}", self.body))
    }
}

/// One HTTP/1.0 request with `headers` and a JSON `body` for `POST`.
fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&Value>) -> Reply {
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect to the console");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut head = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n", body.len());
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let mut lines = head.lines();
    let status =
        lines.next().and_then(|line| line.get(9..12)).and_then(|code| code.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Reply { status, headers, body: body.to_owned() }
}

/// The console's address, from its `console listening` log line.
fn console_addr(daemon: &Daemon) -> SocketAddr {
    daemon.wait_for_log("console listening", Duration::from_secs(10));
    daemon
        .log()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["message"] == "console listening")
        .and_then(|line| line["address"].as_str()?.parse().ok())
        .expect("the console's address")
}

/// A daemon with the console on, a token, and a command tool whose description holds markup.
fn start(redis: &RedisServer, extra: &[(&str, &str)]) -> Daemon {
    let dir = temp_dir("console-config");
    let config = dir.join("toolhost.toml");
    std::fs::write(
        &config,
        r#"
[console]
listen = "127.0.0.1:0"
token_env = "CONSOLE_TOKEN"

[[commands]]
name = "shout"
description = "<script>document.title='pwned'</script><img src=x onerror=alert(1)> says it loud"
argv = ["echo", "loud"]
argument_schema = { type = "object", properties = {} }
"#,
    )
    .unwrap();
    let mut env = vec![("CONSOLE_TOKEN", TOKEN)];
    env.extend_from_slice(extra);
    Daemon::start_args(redis, &env, &["--config", config.to_str().unwrap()])
}

fn bearer() -> (&'static str, String) {
    ("Authorization", format!("Bearer {TOKEN}"))
}

/// The CSRF token a page carries.
fn csrf(page: &str) -> String {
    let start = page.find("name=\"csrf-token\" content=\"").expect("a csrf meta") + 27;
    page[start..].split('"').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_wants_its_token_and_a_csrf_token_and_sets_its_policy() {
    let redis = RedisServer::start();
    let daemon = start(&redis, &[]);
    let addr = console_addr(&daemon);
    let (auth, token) = bearer();

    let anonymous = http(addr, "GET", "/fleet", &[], None);
    assert_eq!(anonymous.status, 401, "{}", anonymous.body);
    assert!(anonymous.header("content-security-policy").is_some_and(|csp| csp.contains("script-src 'self'")));
    assert_eq!(
        http(addr, "GET", "/api/fleet", &[("Authorization", "Bearer wrong-token-000000")], None).status,
        401
    );
    assert_eq!(http(addr, "GET", "/?token=wrong-token-000000", &[], None).status, 401);

    // The login link sets a cookie that is not the token, and sends the browser on.
    let login = http(addr, "GET", &format!("/?token={TOKEN}"), &[], None);
    assert_eq!(login.status, 303);
    assert_eq!(login.header("location"), Some("/"));
    let cookie = login.header("set-cookie").expect("a cookie").to_owned();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    assert!(!cookie.contains(TOKEN), "{cookie}");
    let session = cookie.split(';').next().unwrap().to_owned();
    let fleet = http(addr, "GET", "/fleet", &[("Cookie", &session)], None);
    assert_eq!(fleet.status, 200, "{}", fleet.body);
    assert!(fleet.body.contains("data-toolbox=\"toolhost\""), "{}", fleet.body);
    assert_eq!(fleet.header("x-frame-options"), Some("DENY"));

    // A mutating request needs the page's CSRF token, with the cookie or the bearer token alike.
    let call = json!({"tool": "echo", "arguments": {"message": "hi"}, "request_id": "console-csrf-1"});
    let refused = http(addr, "POST", "/api/call", &[("Cookie", &session)], Some(&call));
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(refused.json()["error"], "missing or wrong CSRF token");
    let wrong = http(addr, "POST", "/api/call", &[(auth, &token), ("X-CSRF-Token", "nope")], Some(&call));
    assert_eq!(wrong.status, 403);
    let csrf = csrf(&fleet.body);
    let sent = http(addr, "POST", "/api/call", &[("Cookie", &session), ("X-CSRF-Token", &csrf)], Some(&call));
    assert_eq!(sent.status, 202, "{}", sent.body);
    assert_eq!(sent.json()["request_id"], "console-csrf-1");

    // The answer comes on the call's event stream.
    let events = http(addr, "GET", "/api/calls/console-csrf-1/events", &[(auth, &token)], None);
    assert!(events.body.contains("event: answer"), "{}", events.body);
    assert!(events.body.contains("\"success\":true"), "{}", events.body);

    // What the console did is audited as its tenant; refused requests ran nothing.
    let mut connection = redis.connection().await;
    let audit: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg("audit:toolhost")
        .arg("-")
        .arg("+")
        .query_async(&mut connection)
        .await
        .unwrap();
    let console_entries: Vec<_> = audit
        .iter()
        .filter(|(_, fields)| fields.iter().any(|(key, value)| key == "door" && value == "console"))
        .collect();
    assert_eq!(console_entries.len(), 1, "{audit:?}");
    let fields = &console_entries[0].1;
    assert!(fields.contains(&("tenant".to_owned(), "console".to_owned())), "{fields:?}");
    assert!(fields.contains(&("request_id".to_owned(), "console-csrf-1".to_owned())), "{fields:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markup_from_a_tool_is_shown_as_text() {
    let redis = RedisServer::start();
    let daemon = start(&redis, &[]);
    let addr = console_addr(&daemon);
    let (auth, token) = bearer();
    let deadline = Instant::now() + Duration::from_secs(10);
    let tools = loop {
        let tools = http(addr, "GET", "/tools", &[(auth, &token)], None);
        if tools.body.contains("data-tool=\"shout\"") || Instant::now() > deadline {
            break tools;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(tools.body.contains("data-tool=\"shout\""), "{}", tools.body);
    assert!(
        tools.body.contains("&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;&lt;img src=x"),
        "{}",
        tools.body
    );
    assert!(!tools.body.contains("<script>document"), "{}", tools.body);
    assert!(!tools.body.contains("<img src=x"), "{}", tools.body);
    let page = http(addr, "GET", "/tools/shout", &[(auth, &token)], None);
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<p id=\"tool-description\">&lt;script&gt;"), "{}", page.body);
    // The only script a page loads is the console's own file.
    assert_eq!(page.body.matches("<script").count(), 1, "{}", page.body);
    assert!(page.body.contains("<script src=\"/static/console.js\" defer></script>"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_logged_and_their_page_shows_the_request_and_the_answer() {
    let redis = RedisServer::start();
    let daemon = start(&redis, &[]);
    let addr = console_addr(&daemon);
    let (auth, token) = bearer();
    let mut connection = redis.connection().await;
    let payload = request("echo.requested", "logged-1", json!({"message": "<b>bold</b>"}));
    let entry_id = xadd(&mut connection, REQUESTS, &payload.to_string()).await;
    let logged = wait_for(&mut connection, "calls:toolhost", 1, WAIT).await;
    let logged = logged.first().expect("a logged call");
    assert_eq!(logged["request_id"], "logged-1", "{logged}");
    assert_eq!(logged["outcome"], "success");
    assert_eq!(logged["entry_id"], entry_id.as_str());
    assert_eq!(logged["door"], "requests");

    let calls = http(addr, "GET", "/calls", &[(auth, &token)], None);
    assert!(calls.body.contains("data-request-id=\"logged-1\""), "{}", calls.body);
    let link =
        calls.body.split("href=\"/calls/toolhost/").nth(1).and_then(|rest| rest.split('"').next()).unwrap();
    let page = http(addr, "GET", &format!("/calls/toolhost/{link}"), &[(auth, &token)], None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("<span id=\"call-outcome\">success</span>"), "{}", page.body);
    // The request from the stream and the kept answer, escaped.
    assert!(page.body.contains("&quot;request_id&quot;: &quot;logged-1&quot;"), "{}", page.body);
    assert!(page.body.contains("&lt;b&gt;bold&lt;/b&gt;"), "{}", page.body);
    assert!(!page.body.contains("<b>bold"), "{}", page.body);
    let answer = page.body.split("<pre id=\"call-answer\">").nth(1).unwrap();
    assert!(answer.contains("&quot;success&quot;: true"), "{answer}");
    assert_eq!(http(addr, "GET", "/calls/toolhost/1-0", &[(auth, &token)], None).status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_replayed_from_the_console_and_answered() {
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let _: redis::Value = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(REQUESTS)
        .arg(GROUP)
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut connection)
        .await
        .unwrap();
    let payload = request("echo.requested", "poison-1", json!({"message": "again"}));
    let entry_id = xadd(&mut connection, REQUESTS, &payload.to_string()).await;
    // Two consumers take the entry and crash without acking: past max_deliveries = 2 it is poison.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("crashed-1")
        .arg("STREAMS")
        .arg(REQUESTS)
        .arg(">")
        .query_async(&mut connection)
        .await
        .unwrap();
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg(REQUESTS)
        .arg(GROUP)
        .arg("crashed-2")
        .arg(0)
        .arg(&entry_id)
        .query_async(&mut connection)
        .await
        .unwrap();
    let daemon = start(
        &redis,
        &[("TOOLHOST__DISPATCH__MAX_DELIVERIES", "2"), ("TOOLHOST__DISPATCH__CLAIM_IDLE_MS", "1000")],
    );
    let addr = console_addr(&daemon);
    let (auth, token) = bearer();
    assert_eq!(wait_for(&mut connection, "dlq:toolhost", 1, WAIT).await.len(), 1);

    let page = http(addr, "GET", "/dlq", &[(auth, &token)], None);
    assert!(page.body.contains("<td class=\"request-id\">poison-1</td>"), "{}", page.body);
    let dlq_id =
        page.body.split("data-dlq-id=\"").nth(1).and_then(|rest| rest.split('"').next()).unwrap().to_owned();
    let letter = http(addr, "GET", &format!("/dlq/toolhost/{dlq_id}"), &[(auth, &token)], None);
    assert!(letter.body.contains("<pre id=\"letter\">"), "{}", letter.body);
    let csrf = csrf(&page.body);
    let path = format!("/api/dlq/toolhost/{dlq_id}/replay");
    assert_eq!(http(addr, "POST", &path, &[(auth, &token)], None).status, 403);
    let replayed = http(addr, "POST", &path, &[(auth, &token), ("X-CSRF-Token", &csrf)], None);
    assert_eq!(replayed.status, 200, "{}", replayed.body);
    assert_eq!(replayed.json()["request_id"], "poison-1");

    // The replayed request runs and is answered with the tool's result.
    // The poison entry was answered `internal` when it was dead-lettered; the replay is answered
    // with the tool's result.
    let deadline = Instant::now() + WAIT;
    let answers = loop {
        let answers = payloads(&mut connection, "action-results").await;
        let replayed = answers
            .iter()
            .any(|answer| answer["data"]["request_id"] == "poison-1" && answer["data"]["success"] == true);
        if replayed || Instant::now() > deadline {
            break answers;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(answers.iter().any(|answer| answer["data"]["result"]["message"] == "again"), "{answers:#?}");
    let after = http(addr, "GET", "/dlq", &[(auth, &token)], None);
    assert!(!after.body.contains(&format!("data-dlq-id=\"{dlq_id}\"")), "{}", after.body);
    assert_eq!(http(addr, "POST", &path, &[(auth, &token), ("X-CSRF-Token", &csrf)], None).status, 404);
}

#[test]
fn without_a_token_the_console_refuses_to_listen_beyond_loopback() {
    let dir = temp_dir("console-open");
    let config = dir.join("toolhost.toml");
    std::fs::write(&config, "[console]\nlisten = \"0.0.0.0:0\"\n").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .env_clear()
        .env("REDIS_URL", "redis://127.0.0.1:1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // It stops before it touches Redis or binds anything; a daemon that served would run on.
    let deadline = Instant::now() + WAIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("toolhost serve kept running with an open console and no token");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("console.listen") && stderr.contains("loopback"), "{stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("console listening"));
    let _ = std::fs::remove_dir_all(dir);
}
