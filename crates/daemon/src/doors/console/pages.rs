//! The console's pages, rendered on the server. Every string that came from a tool, a caller or
//! Redis goes through [`escape`] (or into a `<pre>` as escaped JSON): a tool's description or a
//! result may hold HTML, and it must show as text.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde_json::Value;

use super::{Console, read};
use crate::heartbeat::Heartbeat;

/// How many calls the Calls page starts with.
const RECENT_CALLS: usize = 200;

/// How many letters of each toolbox the dead-letters page lists.
const LETTERS: usize = 500;

/// `text` with the characters HTML gives a meaning escaped, for text and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for char in text.chars() {
        match char {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            char => out.push(char),
        }
    }
    out
}

/// `value` as indented JSON, escaped for a `<pre>`.
fn pretty(value: &Value) -> String {
    escape(&serde_json::to_string_pretty(value).unwrap_or_default())
}

/// A path segment with the characters a URL path reserves escaped.
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~' | b':') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// A whole page around `body`.
fn page(console: &Console, title: &str, active: &str, body: &str) -> Response {
    let nav = [
        ("fleet", "/fleet", "Fleet"),
        ("tools", "/tools", "Tools"),
        ("calls", "/calls", "Calls"),
        ("dlq", "/dlq", "Dead letters"),
    ]
    .iter()
    .map(|(id, href, label)| {
        let class = if *id == active { " class=\"active\"" } else { "" };
        format!("<a id=\"nav-{id}\" href=\"{href}\"{class}>{label}</a>")
    })
    .collect::<String>();
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"csrf-token\" content=\"{csrf}\">\
         <title>{title} · toolhost</title>\
         <link rel=\"stylesheet\" href=\"/static/console.css\">\
         <script src=\"/static/console.js\" defer></script></head>\
         <body><header><span class=\"brand\">toolhost</span><nav>{nav}</nav>\
         <span class=\"who\">toolbox {toolbox} · tenant {tenant}</span></header>\
         <div id=\"flash\" role=\"status\"></div><main>{body}</main></body></html>",
        csrf = escape(console.access.csrf()),
        title = escape(title),
        toolbox = escape(&console.toolbox_id),
        tenant = escape(console.tenant.as_deref().unwrap_or("-")),
    );
    Html(html).into_response()
}

/// A page saying what was not found.
fn not_found(console: &Console, what: &str) -> Response {
    let mut response = page(console, "Not found", "", &format!("<h1>Not found</h1><p>{}</p>", escape(what)));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

/// `GET /`: the fleet.
/// Where the fleet page's charts go: in-flight calls and queue depth per replica over the last
/// hour, drawn by the script from `/api/history`.
const CHARTS_REPLICAS: &str = "<section id=\"charts-replicas\" class=\"charts\" data-charts=\"replicas\">\
     <h2>Last hour, per replica</h2><p class=\"charts-empty\">No history yet: each replica writes a point every \
     5 seconds (toolhost:history:&lt;toolbox&gt;:&lt;consumer&gt;).</p></section>";

/// Where the tools page's charts go: calls per second, p50/p95/p99 latency and errors per tool
/// over the last hour, drawn by the script from `/api/history`.
const CHARTS_TOOLS: &str = "<section id=\"charts-tools\" class=\"charts\" data-charts=\"tools\">\
     <h2>Last hour, per tool</h2><p class=\"charts-empty\">No calls in the last hour: a tool's charts appear \
     with its first call.</p></section>";

pub(crate) async fn index() -> Redirect {
    Redirect::to("/fleet")
}

/// `GET /static/console.js`.
pub(crate) async fn script() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], include_str!("assets/console.js"))
        .into_response()
}

/// `GET /static/console.css`.
pub(crate) async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], include_str!("assets/console.css")).into_response()
}

/// `GET /fleet`: the live replicas and their sources, Redis, the groups, the conflicts.
pub(crate) async fn fleet(State(console): State<Arc<Console>>) -> Response {
    let view = read::fleet(&console).await;
    let mut body = String::from("<h1>Fleet</h1>");
    body.push_str(CHARTS_REPLICAS);
    let _ = write!(
        body,
        "<section id=\"redis\"><h2>Redis</h2><p>Topology <span id=\"redis-topology\">{}</span> at {} · \
         health <span id=\"redis-health\" class=\"{health}\">{health}</span> {detail}</p></section>",
        console.topology,
        escape(&console.redis),
        health = if view.redis.is_ok() { "up" } else { "down" },
        detail = match &view.redis {
            Ok(micros) => format!("(PING {micros} µs)"),
            Err(err) => escape(err),
        },
    );
    body.push_str(
        "<h2>Replicas</h2><table id=\"toolboxes\"><thead><tr><th>toolbox</th><th>replica</th>\
         <th>version</th><th>tools</th><th>last heartbeat</th></tr></thead><tbody>",
    );
    for replica in &view.replicas {
        let _ = write!(
            body,
            "<tr data-toolbox=\"{toolbox}\" data-replica=\"{consumer}\"><td>{toolbox}</td><td>{consumer}</td>\
             <td>{version}</td><td class=\"tools\" title=\"{names}\">{count}</td><td>{at}</td></tr>",
            toolbox = escape(&replica.toolbox_id),
            consumer = escape(&replica.consumer),
            version = escape(&replica.version),
            names = escape(&replica.hosted.keys().cloned().collect::<Vec<_>>().join(", ")),
            count = replica.hosted.len(),
            at = escape(&replica.at),
        );
    }
    body.push_str("</tbody></table>");
    body.push_str(&sources_table(&view.replicas));
    body.push_str(
        "<h2>Consumer groups</h2><table id=\"groups\"><thead><tr><th>stream</th><th>group</th>\
         <th>pending</th><th>lag</th></tr></thead><tbody>",
    );
    for (stream, groups) in &view.groups {
        match groups {
            Ok(groups) => {
                for group in groups {
                    let _ = write!(
                        body,
                        "<tr data-stream=\"{stream}\" data-group=\"{name}\"><td>{stream}</td><td>{name}</td>\
                         <td class=\"pending\">{pending}</td><td class=\"lag\">{lag}</td></tr>",
                        stream = escape(stream),
                        name = escape(&group.name),
                        pending = group.pending,
                        lag = group.lag.map_or_else(|| "unknown".to_owned(), |lag| lag.to_string()),
                    );
                }
            }
            Err(err) => {
                let _ = write!(
                    body,
                    "<tr data-stream=\"{stream}\"><td>{stream}</td><td colspan=\"3\">cannot read the groups: {err}</td></tr>",
                    stream = escape(stream),
                    err = escape(err),
                );
            }
        }
    }
    body.push_str("</tbody></table>");
    body.push_str(&conflicts_table(&view.conflicts));
    page(&console, "Fleet", "fleet", &body)
}

/// The fleet page's table of tool sources, one row per source of each live replica; one row
/// saying what to add when there is none.
fn sources_table(replicas: &[Heartbeat]) -> String {
    let mut res = String::new();
    res.push_str(
        "<h2>Tool sources</h2><table id=\"sources\"><thead><tr><th>source</th><th>toolbox</th>\
         <th>replica</th><th>kind</th><th>state</th><th>since</th><th>tools</th><th>restarts</th>\
         <th>last error</th></tr></thead><tbody>",
    );
    if replicas.iter().all(|replica| replica.sources.is_empty()) {
        res.push_str(&empty_row(
            9,
            "No tool sources: no live replica hosts an MCP server or OVOS toolboxes. Add a \
             <code>[[mcp_servers]]</code> entry (a stdio command or a streamable HTTP url) or \
             <code>[ovos] host_toolboxes</code> to a toolbox's configuration, then restart it or send it SIGHUP.",
        ));
    }
    for replica in replicas {
        for source in &replica.sources {
            let state = source.state();
            let _ = write!(
                res,
                "<tr data-source=\"{name}\" data-toolbox=\"{toolbox}\"><td>{name}</td><td>{toolbox}</td>\
                 <td>{consumer}</td><td class=\"kind\">{kind}</td><td class=\"state {state}\">{state}</td>\
                 <td class=\"since\">{since}</td><td>{tools}</td><td>{restarts}</td><td>{error}</td></tr>",
                name = escape(&source.name),
                toolbox = escape(&replica.toolbox_id),
                consumer = escape(&replica.consumer),
                kind = escape(&source.transport),
                since = escape(source.since.as_deref().unwrap_or("")),
                tools = source.tools,
                restarts = source.restarts,
                error = escape(source.last_error.as_deref().unwrap_or("")),
            );
        }
    }
    res.push_str("</tbody></table>");
    res
}

/// The fleet page's table of tool names served with different descriptions; one row saying so
/// when there is none.
fn conflicts_table(conflicts: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>) -> String {
    let mut res = String::new();
    res.push_str(
        "<h2>Conflicting descriptions</h2><table id=\"conflicts\"><thead><tr><th>tool</th><th>description hash</th>\
         <th>toolboxes</th></tr></thead><tbody>",
    );
    if conflicts.is_empty() {
        res.push_str(&empty_row(
            3,
            "No conflicting descriptions: every tool name the live toolboxes share has one description. \
             A row here means two toolboxes serve one name with different descriptions; give one of them \
             another name or the same description.",
        ));
    }
    for (tool, versions) in conflicts {
        for (hash, toolboxes) in versions {
            let _ = write!(
                res,
                "<tr data-tool=\"{tool}\"><td>{tool}</td><td>{hash}</td><td>{toolboxes}</td></tr>",
                tool = escape(tool),
                hash = escape(hash),
                toolboxes = escape(&toolboxes.iter().cloned().collect::<Vec<_>>().join(", ")),
            );
        }
    }
    res.push_str("</tbody></table>");
    res
}

/// The one row of an empty table (`columns` wide), saying what is missing and how to add it.
/// `message` is the console's own text (it may hold markup), never a caller's.
fn empty_row(columns: usize, message: &str) -> String {
    format!("<tr class=\"empty\"><td colspan=\"{columns}\">{message}</td></tr>")
}

/// `GET /tools`: every fleet tool, searchable.
pub(crate) async fn tools(State(console): State<Arc<Console>>) -> Response {
    let tools = console.fleet.tools();
    let mut body = format!(
        "<h1>Tools</h1><p>{} tools hosted by the live toolboxes.</p>\
         <input id=\"tool-search\" type=\"search\" placeholder=\"Search by name or description\" autocomplete=\"off\">\
         <table id=\"tools\"><thead><tr><th>tool</th><th>description</th><th>annotations</th></tr></thead><tbody>",
        tools.len()
    );
    for tool in tools.iter() {
        let annotations = serde_json::to_value(tool.annotations).unwrap_or_default();
        let hints: Vec<String> = annotations
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, value)| value.as_bool() == Some(true))
            .map(|(name, _)| name.clone())
            .collect();
        let _ = write!(
            body,
            "<tr data-tool=\"{name}\"><td><a class=\"tool-link\" href=\"/tools/{href}\">{name}</a></td>\
             <td class=\"description\">{description}</td><td>{hints}</td></tr>",
            name = escape(&tool.name),
            href = segment(&tool.name),
            description = escape(&tool.description),
            hints = escape(&hints.join(", ")),
        );
    }
    body.push_str("</tbody></table>");
    body.push_str(CHARTS_TOOLS);
    page(&console, "Tools", "tools", &body)
}

/// `GET /tools/<name>`: a tool's description, schemas, statistics and try-it form.
pub(crate) async fn tool(State(console): State<Arc<Console>>, Path(name): Path<String>) -> Response {
    let tools = console.fleet.tools();
    let Some(tool) = tools.get(&name) else {
        return not_found(&console, &format!("no live toolbox hosts a tool named '{name}'"));
    };
    let mut body = format!(
        "<h1 id=\"tool-name\">{name}</h1><p id=\"tool-description\">{description}</p>\
         <p>Annotations: <code>{annotations}</code> · timeout {timeout} ms</p>",
        name = escape(&tool.name),
        description = escape(&tool.description),
        annotations = escape(&serde_json::to_string(&tool.annotations).unwrap_or_default()),
        timeout = tool.timeout_ms,
    );
    body.push_str(&stats_table(&console, &tool.name).await);
    let _ = write!(
        body,
        "<h2>Try it</h2><form id=\"try-it\" data-tool=\"{name}\" novalidate>\
         <div id=\"fields\"></div>\
         <label><input id=\"use-raw\" type=\"checkbox\"> raw JSON</label>\
         <textarea id=\"raw-args\" rows=\"8\" hidden>{{}}</textarea>\
         <ul id=\"errors\"></ul>\
         <button id=\"call\" type=\"submit\">Call</button> <button id=\"cancel\" type=\"button\" disabled>Cancel</button>\
         </form>\
         <p>Request <span id=\"request-id\"></span> · state <span id=\"call-state\">idle</span></p>\
         <h3>Progress</h3><ol id=\"progress\"></ol><h3>Answer</h3><div id=\"blocks\"></div><pre id=\"result\"></pre>\
         <h2>Schemas</h2><h3>Arguments</h3><pre id=\"input-schema\">{input}</pre>\
         <h3>Output</h3><pre id=\"output-schema\">{output}</pre>",
        name = escape(&tool.name),
        input = pretty(&tool.argument_schema),
        output = pretty(&tool.output_schema),
    );
    page(&console, &tool.name, "tools", &body)
}

/// The statistics of `tool` from each live toolbox hosting it (`tools.stats`, each answered by
/// one replica of the toolbox, since that replica started).
async fn stats_table(console: &Console, tool: &str) -> String {
    let view = read::fleet(console).await;
    let hosting: std::collections::BTreeSet<String> = view
        .replicas
        .iter()
        .filter(|replica| replica.hosted.contains_key(tool))
        .map(|replica| replica.toolbox_id.clone())
        .collect();
    let mut table = String::from(
        "<h2>Statistics</h2><table id=\"tool-stats\"><thead><tr><th>toolbox</th><th>calls</th><th>errors</th>\
         <th>p50 ms</th><th>p99 ms</th><th>mean ms</th></tr></thead><tbody>",
    );
    let asks = hosting.iter().map(|toolbox| {
        let mut data = serde_json::Map::new();
        data.insert("toolbox_id".to_owned(), Value::String(toolbox.clone()));
        console.fleet.ask("tools.stats", data, std::time::Duration::from_secs(2))
    });
    let answers = futures::future::join_all(asks).await;
    for (toolbox, answer) in hosting.iter().zip(answers) {
        let stats = answer
            .ok()
            .filter(|answer| answer.success)
            .and_then(|answer| answer.result)
            .and_then(|result| result.get("tools").and_then(|tools| tools.get(tool)).cloned());
        match stats {
            Some(stats) => {
                let number = |key: &str| {
                    stats.get(key).and_then(Value::as_f64).map_or_else(String::new, |n| format!("{n:.2}"))
                };
                let errors: Vec<String> = stats
                    .get("errors")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                    .map(|(code, count)| format!("{code}: {count}"))
                    .collect();
                let _ = write!(
                    table,
                    "<tr data-toolbox=\"{toolbox}\"><td>{toolbox}</td><td class=\"calls\">{calls}</td><td class=\"errors\">{errors}</td>\
                     <td class=\"p50\">{p50}</td><td class=\"p99\">{p99}</td><td class=\"mean\">{mean}</td></tr>",
                    toolbox = escape(toolbox),
                    calls = stats.get("requests").and_then(Value::as_u64).unwrap_or(0),
                    errors = escape(&errors.join(", ")),
                    p50 = number("p50_ms"),
                    p99 = number("p99_ms"),
                    mean = number("mean_ms"),
                );
            }
            None => {
                let _ = write!(
                    table,
                    "<tr data-toolbox=\"{toolbox}\"><td>{toolbox}</td><td class=\"calls\">0</td><td colspan=\"4\">no calls yet, or no answer</td></tr>",
                    toolbox = escape(toolbox),
                );
            }
        }
    }
    table.push_str("</tbody></table>");
    table
}

/// One row of the calls table (the live view adds the same from the script).
fn call_row(call: &read::LoggedCall) -> String {
    format!(
        "<tr data-request-id=\"{id}\"><td class=\"time\">{time}</td>\
         <td><a class=\"call-link\" href=\"/calls/{toolbox_href}/{log_href}\">{id}</a></td>\
         <td class=\"tool\">{tool}</td><td class=\"tenant\">{tenant}</td><td class=\"door\">{door}</td>\
         <td class=\"outcome\">{outcome}</td><td class=\"duration\">{duration}</td><td class=\"toolbox\">{toolbox}</td></tr>",
        id = escape(&call.text("request_id")),
        time = escape(&call.text("time")),
        toolbox_href = segment(&call.toolbox_id),
        log_href = segment(&call.log_id),
        tool = escape(&call.text("tool")),
        tenant = escape(&call.text("tenant")),
        door = escape(&call.text("door")),
        outcome = escape(&call.text("outcome")),
        duration = call
            .fields
            .get("duration_us")
            .and_then(Value::as_u64)
            .map_or_else(String::new, |us| format!("{:.1} ms", us as f64 / 1000.0)),
        toolbox = escape(&call.toolbox_id),
    )
}

/// `GET /calls`: the latest calls of every toolbox, then live.
pub(crate) async fn calls(State(console): State<Arc<Console>>) -> Response {
    let toolboxes = read::toolboxes(&console).await;
    let calls = read::recent_calls(&console, &toolboxes, RECENT_CALLS).await;
    let mut body = String::from(
        "<h1>Calls</h1><p>The latest calls logged by the toolboxes (<code>calls:&lt;toolbox_id&gt;</code>, \
         written by toolboxes with <code>[console] record_calls</code>), newest first, live.</p>\
         <input id=\"calls-filter\" type=\"search\" placeholder=\"Filter by any column\" autocomplete=\"off\">\
         <table id=\"calls\"><thead><tr><th>time</th><th>request id</th><th>tool</th><th>tenant</th><th>door</th>\
         <th>outcome</th><th>duration</th><th>toolbox</th></tr></thead><tbody>",
    );
    for call in &calls {
        body.push_str(&call_row(call));
    }
    body.push_str("</tbody></table>");
    page(&console, "Calls", "calls", &body)
}

/// `GET /calls/<toolbox>/<log id>`: one call: the request, the answer, timings, deliveries.
/// A call's trace id, linked to `[console] trace_url` when it is set; `(none)` for a call logged
/// without one. The id must be 32 hex digits to be linked (the call log is a stream anyone with
/// Redis access could write).
fn trace_link(template: &str, trace_id: &str) -> String {
    let is_trace_id = trace_id.len() == 32 && trace_id.bytes().all(|b| b.is_ascii_hexdigit());
    match (template.is_empty(), is_trace_id) {
        (_, false) if trace_id.is_empty() => "(none)".to_owned(),
        (true, _) | (_, false) => escape(trace_id),
        (false, true) => format!(
            "<a id=\"call-trace-link\" href=\"{}\" rel=\"noreferrer\">{}</a>",
            escape(&template.replace("{trace_id}", trace_id)),
            escape(trace_id)
        ),
    }
}

pub(crate) async fn call(
    State(console): State<Arc<Console>>,
    Path((toolbox, log_id)): Path<(String, String)>,
) -> Response {
    let call = match read::call(&console, &toolbox, &log_id).await {
        Ok(Some(call)) => call,
        Ok(None) => return not_found(&console, &format!("no entry {log_id} in calls:{toolbox}")),
        Err(err) => return not_found(&console, &format!("cannot read calls:{toolbox}: {err}")),
    };
    let request_id = call.text("request_id");
    let entry_id = call.text("entry_id");
    let from_requests = call.text("door") == "requests";
    let request = match read::request_entry(&console, &request_id, &entry_id).await {
        Ok(Some(entry)) if from_requests => match entry.payload.as_deref().map(serde_json::from_str::<Value>)
        {
            Some(Ok(envelope)) => pretty(&envelope),
            _ => escape(entry.payload.as_deref().unwrap_or("(no payload)")),
        },
        Ok(_) if !from_requests => {
            "(the request came in by another door; its entry is in that door's stream)".to_owned()
        }
        Ok(_) => "(the requests stream no longer holds the entry: it was trimmed)".to_owned(),
        Err(err) => escape(&format!("cannot read the requests stream: {err}")),
    };
    let answer = match read::kept_answer(&console, &request_id).await {
        Ok(Some(kept)) => {
            let mut text = format!("answer message id {}", kept.answer_id);
            if let Some(entry) = &kept.entry_id {
                let _ = write!(text, ", for entry {entry}");
            }
            match &kept.data {
                Some(data) => format!("{}\n{}", escape(&text), pretty(data)),
                None => escape(&format!(
                    "{text} (its data was not kept: over [dispatch] kept_answer_max_bytes, or kept answers are off)"
                )),
            }
        }
        Ok(None) => "(no answered mark: the answer was not final, or the mark expired)".to_owned(),
        Err(err) => escape(&format!("cannot read the ledger: {err}")),
    };
    let body = format!(
        "<h1>Call {id}</h1><p>Outcome <span id=\"call-outcome\">{outcome}</span> · tool {tool} · tenant {tenant} · \
         door {door} · source {source}</p>\
         <dl id=\"call-timings\"><dt>logged</dt><dd>{time}</dd><dt>duration</dt><dd>{duration} µs</dd>\
         <dt>request entry</dt><dd>{entry}</dd><dt>handled by</dt><dd>{toolbox} / {consumer}</dd></dl>\
         <p>Deliveries of the entry: <span id=\"call-deliveries\">{deliveries}</span></p>\
         <p>Trace: <span id=\"call-trace\">{trace}</span></p>\
         <h2>Request</h2><pre id=\"call-request\">{request}</pre><h2>Answer</h2><pre id=\"call-answer\">{answer}</pre>",
        id = escape(&request_id),
        outcome = escape(&call.text("outcome")),
        tool = escape(&call.text("tool")),
        tenant = escape(&call.text("tenant")),
        door = escape(&call.text("door")),
        source = escape(&call.text("source")),
        time = escape(&call.text("time")),
        duration = escape(&call.text("duration_us")),
        entry = escape(&entry_id),
        toolbox = escape(&call.text("toolbox_id")),
        consumer = escape(&call.text("consumer")),
        deliveries = escape(&call.text("deliveries")),
        trace = trace_link(&console.trace_url, &call.text("trace_id")),
    );
    page(&console, &format!("Call {request_id}"), "calls", &body)
}

/// `GET /dlq`: the dead letters of every toolbox, with replay and delete.
pub(crate) async fn dead_letters(State(console): State<Arc<Console>>) -> Response {
    let toolboxes = read::toolboxes(&console).await;
    let mut body = String::from(
        "<h1>Dead letters</h1><table id=\"dead-letters\"><thead><tr><th>toolbox</th><th>letter</th><th>request id</th>\
         <th>error</th><th>deliveries</th><th>dead-lettered</th><th></th></tr></thead><tbody>",
    );
    for (toolbox, letters) in read::letters(&console, &toolboxes, LETTERS).await {
        let letters = match letters {
            Ok(letters) => letters,
            Err(err) => {
                let _ = write!(
                    body,
                    "<tr><td>{}</td><td colspan=\"6\">cannot read: {}</td></tr>",
                    escape(&toolbox),
                    escape(&err)
                );
                continue;
            }
        };
        for letter in letters {
            let replayable = letter.payload.is_some();
            let _ = write!(
                body,
                "<tr data-dlq-id=\"{id}\" data-toolbox=\"{toolbox}\"><td>{toolbox}</td>\
                 <td><a class=\"letter-link\" href=\"/dlq/{toolbox_href}/{id_href}\">{id}</a></td>\
                 <td class=\"request-id\">{request_id}</td><td class=\"error\">{error}</td><td>{deliveries}</td><td>{at}</td>\
                 <td><button class=\"replay\" type=\"button\"{disabled}>Replay</button> \
                 <button class=\"delete\" type=\"button\">Delete</button></td></tr>",
                id = escape(&letter.dlq_id),
                toolbox = escape(&toolbox),
                toolbox_href = segment(&toolbox),
                id_href = segment(&letter.dlq_id),
                request_id = escape(&letter.request_id().unwrap_or_default()),
                error = escape(&letter.error),
                deliveries = letter.deliveries,
                at = escape(letter.dead_lettered_at.as_deref().unwrap_or("")),
                disabled = if replayable { "" } else { " disabled title=\"no request payload to replay\"" },
            );
        }
    }
    body.push_str("</tbody></table>");
    page(&console, "Dead letters", "dlq", &body)
}

/// `GET /dlq/<toolbox>/<dlq id>`: one letter, whole.
pub(crate) async fn letter(
    State(console): State<Arc<Console>>,
    Path((toolbox, dlq_id)): Path<(String, String)>,
) -> Response {
    let letter = match read::dead_letters(&console, &toolbox).get(&dlq_id).await {
        Ok(Some(letter)) => letter,
        Ok(None) => return not_found(&console, &format!("no dead letter {dlq_id} in dlq:{toolbox}")),
        Err(err) => return not_found(&console, &format!("cannot read dlq:{toolbox}: {err}")),
    };
    let mut summary = letter.summary();
    if let Some(payload) = letter.payload.as_deref() {
        summary["payload"] =
            serde_json::from_str(payload).unwrap_or_else(|_| Value::String(payload.to_owned()));
    }
    let body = format!(
        "<h1>Dead letter {id}</h1><p>Toolbox {toolbox}</p>\
         <table id=\"dead-letters\"><tbody><tr data-dlq-id=\"{id}\" data-toolbox=\"{toolbox}\"><td class=\"error\">{error}</td>\
         <td><button class=\"replay\" type=\"button\">Replay</button> <button class=\"delete\" type=\"button\">Delete</button></td></tr></tbody></table>\
         <pre id=\"letter\">{letter}</pre>",
        id = escape(&letter.dlq_id),
        toolbox = escape(&toolbox),
        error = escape(&letter.error),
        letter = pretty(&summary),
    );
    page(&console, &format!("Dead letter {dlq_id}"), "dlq", &body)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_trace_id_is_linked_only_with_a_template_and_only_when_it_is_one() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(super::trace_link("", id), id);
        assert_eq!(
            super::trace_link("http://jaeger:16686/trace/{trace_id}?x=1&y=2", id),
            format!(
                "<a id=\"call-trace-link\" href=\"http://jaeger:16686/trace/{id}?x=1&amp;y=2\" rel=\"noreferrer\">{id}</a>"
            )
        );
        assert_eq!(super::trace_link("http://j/{trace_id}", "<script>"), "&lt;script&gt;");
        assert_eq!(super::trace_link("http://j/{trace_id}", ""), "(none)");
    }

    use super::*;

    #[test]
    fn markup_is_escaped_in_text_and_attributes() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(
            pretty(&serde_json::json!({"d": "</pre><b>"})),
            "{\n  &quot;d&quot;: &quot;&lt;/pre&gt;&lt;b&gt;&quot;\n}"
        );
    }

    #[test]
    fn empty_fleet_tables_say_what_is_missing_and_full_ones_do_not() {
        let beat = |sources: &str| {
            Heartbeat::parse(&format!(r#"{{"toolbox_id":"tb","consumer":"tb-1","sources":{sources}}}"#))
                .unwrap()
        };
        let empty = sources_table(&[beat("[]")]);
        assert!(empty.contains("<tr class=\"empty\">") && empty.contains("[[mcp_servers]]"), "{empty}");
        let hosted = sources_table(&[beat(r#"[{"name":"<b>time</b>","up":true}]"#)]);
        assert!(!hosted.contains("class=\"empty\""), "{hosted}");
        assert!(
            hosted.contains("data-source=\"&lt;b&gt;time&lt;/b&gt;\""),
            "a source's name stays text: {hosted}"
        );

        let none = conflicts_table(&BTreeMap::new());
        assert!(
            none.contains("<tr class=\"empty\">") && none.contains("No conflicting descriptions"),
            "{none}"
        );
        let versions = BTreeMap::from([("h1".to_owned(), BTreeSet::from(["a".to_owned()]))]);
        let some = conflicts_table(&BTreeMap::from([("shared".to_owned(), versions)]));
        assert!(!some.contains("class=\"empty\"") && some.contains("data-tool=\"shared\""), "{some}");
    }

    #[test]
    fn path_segments_keep_ids_and_escape_the_rest() {
        assert_eq!(segment("1700000000000-0"), "1700000000000-0");
        assert_eq!(segment("a/b c?<"), "a%2Fb%20c%3F%3C");
    }
}
