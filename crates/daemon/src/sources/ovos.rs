//! OVOS toolboxes as a tool source: the tools of `ToolBox`es on the OpenVoiceOS messagebus,
//! hosted as `ovos__<toolbox_id>__<tool>` (`[ovos] host_toolboxes`).
//!
//! The source keeps a connection of its own to the bus (the door's [`Link`]) and sends
//! `ovos.persona.tools.discover` when it connects and every `[ovos] rediscover_ms`. Each
//! `ovos.persona.tools.discover.response` of a hosted toolbox lists its tools; a listing that
//! differs from the last one replaces the toolbox's tools and rebuilds the registry (names mapped
//! to toolhost's rule as for MCP servers; a listing whose names collide, within it or with
//! another toolbox's, is refused whole, and the old tools stay). A toolbox that did not answer a
//! discovery by the next one is marked down: its tools stay listed and answer `overloaded` with
//! `retry_after_ms` until it answers again. So are all of them while the bus is not connected.
//!
//! A call is one `ovos.persona.tools.<toolbox_id>.call` with `{"name", "kwargs"}` and a fresh
//! context holding a `toolhost_call` id; the first reply carrying that id answers it (`result`,
//! validated by the registry against the tool's output schema, or `error`, answered
//! `tool_failed` with its text); later replies with it are counted and dropped. No reply within
//! the tool's timeout (`[ovos] call_timeout_ms`) answers `timeout`, as every tool's timeout does.
//!
//! The toolbox id of this toolhost (`[daemon] toolbox_id`) is never hosted, whatever
//! `host_toolboxes` says, so the door's own tools never come back as tools: no loop.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use toolhost_mcp::{McpEvent, SourceStatus};
use toolhost_tools::{Context, Registry, Tool, ToolError, ToolSpec};
use tracing::{debug, info, warn};

use super::settings::OvosHosting;
use crate::ovos_bus::link::{Link, LinkEvent};
use crate::ovos_bus::message::BusMessage;
use crate::ovos_bus::{DISCOVER, HOSTED_PREFIX, call_topic, valid_toolbox_id};

/// How long start-up waits for the bus and the first discovery responses before it goes on
/// (the tools of toolboxes that answer later come with a registry rebuild).
const FIRST_DISCOVERY: Duration = Duration::from_secs(2);
/// The context key that carries a call's id.
const CALL_KEY: &str = "toolhost_call";

/// Which toolboxes are hosted.
#[derive(Debug, Clone)]
enum Wanted {
    All,
    Some(BTreeSet<String>),
}

/// One hosted toolbox.
#[derive(Default)]
struct Toolbox {
    tools: Vec<Arc<dyn Tool>>,
    /// The listing the tools come from.
    listing: String,
    up: bool,
    /// When it last answered a discovery.
    seen: Option<Instant>,
    /// Times it was marked down.
    downs: u64,
    rejected_lists: u64,
    last_error: Option<String>,
}

struct Inner {
    own_id: String,
    wanted: Wanted,
    link: Arc<Link>,
    toolboxes: Mutex<BTreeMap<String, Toolbox>>,
    /// Calls waiting for their reply, by call id.
    pending: Mutex<HashMap<String, oneshot::Sender<Map<String, Value>>>>,
    /// Replies to calls that had one already (or had ended).
    extra_replies: AtomicU64,
    /// When the previous discovery was sent.
    discovered_at: Mutex<Option<Instant>>,
    rediscover: Duration,
    call_timeout: Duration,
    events: mpsc::UnboundedSender<McpEvent>,
}

/// The running source.
pub(crate) struct OvosSource {
    inner: Arc<Inner>,
    stop: CancellationToken,
}

impl OvosSource {
    /// Starts the source when `[ovos] host_toolboxes` names any toolbox, and waits a moment
    /// for the first listings; `events` hears every change of the tools.
    pub(crate) async fn start(
        settings: &OvosHosting,
        own_id: &str,
        events: mpsc::UnboundedSender<McpEvent>,
        stop: CancellationToken,
    ) -> Option<OvosSource> {
        if settings.url.trim().is_empty() || settings.host_toolboxes.is_empty() {
            return None;
        }
        let (link, mut link_events) =
            Link::start("source", &settings.url, settings.max_frame_bytes, Box::new(|_| {}), stop.clone());
        let inner = Inner::new(
            own_id,
            Wanted::of(&settings.host_toolboxes),
            link,
            (settings.rediscover, settings.call_timeout),
            events,
        );
        // The first connection and the listings that answer its discovery within the window.
        let deadline = tokio::time::Instant::now() + FIRST_DISCOVERY;
        while let Ok(Some(event)) = tokio::time::timeout_at(deadline, link_events.recv()).await {
            inner.handle(event);
        }
        tokio::spawn(run(inner.clone(), link_events, stop.clone()));
        Some(OvosSource { inner, stop })
    }

    /// Every tool of every hosted toolbox.
    pub(crate) fn tools(&self) -> Vec<Arc<dyn Tool>> {
        lock(&self.inner.toolboxes).values().flat_map(|toolbox| toolbox.tools.clone()).collect()
    }

    /// The state of every hosted toolbox, as `/status` shows sources.
    pub(crate) fn status(&self) -> Vec<SourceStatus> {
        let toolboxes = lock(&self.inner.toolboxes);
        toolboxes
            .iter()
            .map(|(id, toolbox)| SourceStatus {
                name: source_name(id),
                transport: "ovos",
                up: toolbox.up && self.inner.link.is_connected(),
                restarts: toolbox.downs,
                tools: toolbox.tools.len(),
                rejected_lists: toolbox.rejected_lists,
                pid: None,
                last_error: toolbox.last_error.clone(),
            })
            .collect()
    }

    /// Stops the source: its connection closes, and calls waiting end `overloaded`.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
        lock(&self.inner.pending).clear();
    }
}

/// The source name of a toolbox, for logs, `/status` and `toolhost_source_up`.
fn source_name(toolbox_id: &str) -> String {
    format!("ovos:{toolbox_id}")
}

/// The prefix of a toolbox's tool names: `ovos__<toolbox_id>__`, `.` mapped to `_`.
fn prefix(toolbox_id: &str) -> String {
    let mapped: String = toolbox_id.chars().map(|c| if c == '.' { '_' } else { c }).collect();
    format!("{HOSTED_PREFIX}{mapped}__")
}

async fn run(inner: Arc<Inner>, mut events: mpsc::Receiver<LinkEvent>, stop: CancellationToken) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + inner.rediscover, inner.rediscover);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            event = events.recv() => match event {
                Some(event) => inner.handle(event),
                None => return,
            },
            _ = tick.tick() => {
                inner.expire();
                inner.discover();
            }
        }
    }
}

impl Wanted {
    /// The toolboxes `host_toolboxes` names; `"*"` among them is all.
    fn of(ids: &[String]) -> Wanted {
        if ids.iter().any(|id| id == "*") { Wanted::All } else { Wanted::Some(ids.iter().cloned().collect()) }
    }
}

impl Inner {
    /// A source of `own_id` over `link`; `periods` is the rediscovery period and the calls'
    /// timeout.
    fn new(
        own_id: &str,
        wanted: Wanted,
        link: Arc<Link>,
        periods: (Duration, Duration),
        events: mpsc::UnboundedSender<McpEvent>,
    ) -> Arc<Inner> {
        // The toolboxes named are shown (down) before they first answer.
        let named = match &wanted {
            Wanted::All => BTreeMap::new(),
            Wanted::Some(ids) => ids
                .iter()
                .map(|id| {
                    let waiting = Toolbox {
                        last_error: Some("it has not answered a discovery yet".to_owned()),
                        ..Toolbox::default()
                    };
                    (id.clone(), waiting)
                })
                .collect(),
        };
        Arc::new(Inner {
            own_id: own_id.to_owned(),
            wanted,
            link,
            toolboxes: Mutex::new(named),
            pending: Mutex::new(HashMap::new()),
            extra_replies: AtomicU64::new(0),
            discovered_at: Mutex::new(None),
            rediscover: periods.0,
            call_timeout: periods.1,
            events,
        })
    }

    fn handle(self: &Arc<Self>, event: LinkEvent) {
        match event {
            LinkEvent::Connected => self.discover(),
            LinkEvent::Message(message) => self.on_message(message),
            // Calls waiting for a reply will not get one on this connection.
            LinkEvent::Disconnected => {
                lock(&self.pending).clear();
                self.expire();
            }
        }
    }

    fn is_up(&self, toolbox_id: &str) -> bool {
        lock(&self.toolboxes).get(toolbox_id).is_some_and(|toolbox| toolbox.up)
    }

    /// The answer of a call that cannot be sent now.
    fn unavailable(&self, toolbox_id: &str) -> ToolError {
        let why = if self.link.is_connected() {
            format!("OVOS toolbox '{toolbox_id}' is down: it did not answer the last discovery")
        } else {
            "the OVOS messagebus is not connected".to_owned()
        };
        ToolError::Unavailable { message: format!("{why}; retry later"), retry_after: self.rediscover }
    }

    fn hosts(&self, toolbox_id: &str) -> bool {
        toolbox_id != self.own_id
            && match &self.wanted {
                Wanted::All => valid_toolbox_id(toolbox_id),
                Wanted::Some(ids) => ids.contains(toolbox_id),
            }
    }

    /// Asks every toolbox for its tools.
    fn discover(&self) {
        let mut context = Map::new();
        context.insert("source".to_owned(), json!(self.own_id));
        if self.link.send(&BusMessage::new(DISCOVER, Map::new(), context)) {
            *lock(&self.discovered_at) = Some(Instant::now());
        }
    }

    /// Marks down every toolbox that did not answer the previous discovery (all of them while
    /// the bus is not connected).
    fn expire(&self) {
        let previous = *lock(&self.discovered_at);
        let connected = self.link.is_connected();
        let mut toolboxes = lock(&self.toolboxes);
        for (id, toolbox) in toolboxes.iter_mut().filter(|(_, toolbox)| toolbox.up) {
            let silent = previous.is_some_and(|sent| toolbox.seen.is_none_or(|seen| seen < sent));
            if connected && !silent {
                continue;
            }
            let error = if connected {
                "it did not answer the last discovery".to_owned()
            } else {
                "the OVOS messagebus is not connected".to_owned()
            };
            toolbox.up = false;
            toolbox.downs += 1;
            toolbox.last_error = Some(error.clone());
            let _ = self.events.send(McpEvent::Down { source: source_name(id), error });
        }
    }

    fn on_message(self: &Arc<Self>, message: BusMessage) {
        if message.msg_type == format!("{DISCOVER}.response") {
            self.listed(&message.data);
        } else if message.msg_type.starts_with("ovos.persona.tools.")
            && message.msg_type.ends_with(".call.response")
            && let Some(call) = message.context.get(CALL_KEY).and_then(Value::as_str)
        {
            match lock(&self.pending).remove(call) {
                Some(waiter) => {
                    let _ = waiter.send(message.data);
                }
                None => {
                    let extra = self.extra_replies.fetch_add(1, Ordering::Relaxed) + 1;
                    // A flood logs its first reply and then one in a thousand.
                    if extra == 1 || extra.is_multiple_of(1000) {
                        warn!(
                            call,
                            extra_replies = extra,
                            "an OVOS toolbox replied again to an answered call; dropped"
                        );
                    }
                }
            }
        }
    }

    /// A discovery response: the toolbox is up, and its tools are replaced when they changed.
    fn listed(self: &Arc<Self>, data: &Map<String, Value>) {
        let Some(toolbox_id) = data.get("toolbox_id").and_then(Value::as_str) else { return };
        if !self.hosts(toolbox_id) {
            return;
        }
        let listing = data.get("tools").cloned().unwrap_or(Value::Null).to_string();
        let mut toolboxes = lock(&self.toolboxes);
        let taken: BTreeMap<String, String> = toolboxes
            .iter()
            .filter(|(id, _)| id.as_str() != toolbox_id)
            .flat_map(|(id, toolbox)| toolbox.tools.iter().map(move |tool| (tool.spec().name, id.clone())))
            .collect();
        let toolbox = toolboxes.entry(toolbox_id.to_owned()).or_default();
        toolbox.seen = Some(Instant::now());
        if !toolbox.up {
            toolbox.up = true;
            toolbox.last_error = None;
            info!(source = %source_name(toolbox_id), "OVOS toolbox up");
            let _ = self.events.send(McpEvent::Up { source: source_name(toolbox_id) });
        }
        if toolbox.listing == listing {
            return;
        }
        match self.tools_of(toolbox_id, data.get("tools"), &taken) {
            Ok(tools) => {
                info!(source = %source_name(toolbox_id), tools = tools.len(), "OVOS toolbox listed its tools");
                toolbox.tools = tools;
                toolbox.listing = listing;
                let _ = self.events.send(McpEvent::ToolsChanged { source: source_name(toolbox_id) });
            }
            Err(error) => {
                toolbox.rejected_lists += 1;
                // Not retried until the listing changes.
                toolbox.listing = listing;
                warn!(source = %source_name(toolbox_id), error = %error, "OVOS toolbox's tool list refused; its old tools stay");
                toolbox.last_error = Some(error);
            }
        }
    }

    /// The tools of a listing. Entries that are not tools, or whose schemas do not compile, are
    /// skipped (logged); names that collide refuse the whole listing.
    fn tools_of(
        self: &Arc<Self>,
        toolbox_id: &str,
        listed: Option<&Value>,
        taken: &BTreeMap<String, String>,
    ) -> Result<Vec<Arc<dyn Tool>>, String> {
        let Some(listed) = listed.and_then(Value::as_array) else {
            return Err("its discovery response has no list of tools".to_owned());
        };
        let prefix = prefix(toolbox_id);
        let mut names: BTreeMap<String, String> = BTreeMap::new();
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        for entry in listed {
            let Some(original) = entry.get("name").and_then(Value::as_str) else {
                debug!(source = %source_name(toolbox_id), "an entry of the tool list has no name; skipped");
                continue;
            };
            let name = toolhost_mcp::names::tool_name(&prefix, original);
            if let Some(other) = names.insert(name.clone(), original.to_owned()) {
                return Err(format!("its tools '{other}' and '{original}' both map to '{name}'"));
            }
            if let Some(other) = taken.get(&name) {
                return Err(format!(
                    "its tool '{original}' maps to '{name}', which toolbox '{other}' serves"
                ));
            }
            let schema = |key: &str| match entry.get(key) {
                Some(schema @ Value::Object(_)) => schema.clone(),
                _ => json!({}),
            };
            let mut spec = ToolSpec::new(
                &name,
                entry.get("description").and_then(Value::as_str).unwrap_or_default(),
                schema("argument_schema"),
                schema("output_schema"),
            );
            spec.timeout = self.call_timeout;
            let tool: Arc<dyn Tool> = Arc::new(OvosTool {
                spec,
                toolbox: toolbox_id.to_owned(),
                original: original.to_owned(),
                source: Arc::downgrade(self),
            });
            // The registry's own compilation decides: a schema it refuses skips the tool alone.
            if let Err(err) = Registry::new().register(tool.clone()) {
                warn!(source = %source_name(toolbox_id), tool = %name, error = %err, "OVOS tool skipped: it does not register");
                continue;
            }
            tools.push(tool);
        }
        Ok(tools)
    }
}

/// One tool of a hosted toolbox.
struct OvosTool {
    spec: ToolSpec,
    toolbox: String,
    /// The toolbox's own name of the tool.
    original: String,
    /// The source (weak: the source owns its tools).
    source: std::sync::Weak<Inner>,
}

#[async_trait]
impl Tool for OvosTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    /// Sends the call and waits for its first reply; the registry's timeout (or a cancel)
    /// ends the wait.
    async fn call(&self, arguments: Value, context: &Context) -> Result<Value, ToolError> {
        let Some(source) = self.source.upgrade() else {
            return Err(ToolError::Unavailable {
                message: "the OVOS source is stopping".to_owned(),
                retry_after: Duration::from_secs(1),
            });
        };
        if !source.link.is_connected() || !source.is_up(&self.toolbox) {
            return Err(source.unavailable(&self.toolbox));
        }
        let call_id = uuid::Uuid::new_v4().simple().to_string();
        let (sender, receiver) = oneshot::channel();
        lock(&source.pending).insert(call_id.clone(), sender);
        let _forget = Forget { source: &source, call_id: &call_id };
        let mut data = Map::new();
        data.insert("name".to_owned(), json!(self.original));
        data.insert("kwargs".to_owned(), arguments);
        let mut message_context = Map::new();
        message_context.insert("source".to_owned(), json!(source.own_id));
        message_context.insert("destination".to_owned(), json!(self.toolbox));
        message_context.insert(CALL_KEY.to_owned(), json!(call_id));
        if !source.link.send(&BusMessage::new(call_topic(&self.toolbox), data, message_context)) {
            return Err(source.unavailable(&self.toolbox));
        }
        let reply = tokio::select! {
            reply = receiver => reply,
            () = context.cancel.cancelled() => {
                return Err(ToolError::Timeout(format!(
                    "the call of '{}' was cancelled; OVOS toolbox '{}' cannot be told (the bus has no cancel)",
                    self.spec.name, self.toolbox
                )));
            }
        };
        let Ok(reply) = reply else {
            return Err(ToolError::Failed(format!(
                "the connection to the OVOS messagebus closed before toolbox '{}' replied; the call may have run",
                self.toolbox
            )));
        };
        if let Some(result) = reply.get("result") {
            return Ok(result.clone());
        }
        match reply.get("error") {
            Some(Value::String(error)) => Err(ToolError::Failed(error.clone())),
            Some(other) => Err(ToolError::Failed(other.to_string())),
            None => Err(ToolError::Failed(format!(
                "OVOS toolbox '{}' replied with neither a result nor an error",
                self.toolbox
            ))),
        }
    }
}

/// Removes a call's waiter however its wait ends.
struct Forget<'a> {
    source: &'a Inner,
    call_id: &'a str,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(&self.source.pending).remove(self.call_id);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source whose link never connects (nothing listens on the port), with `wanted`.
    fn source(wanted: &[&str]) -> (Arc<Inner>, mpsc::UnboundedReceiver<McpEvent>, CancellationToken) {
        let stop = CancellationToken::new();
        let (link, _events) =
            Link::start("source", "ws://127.0.0.1:9/core", 1 << 20, Box::new(|_| {}), stop.clone());
        let (events, receiver) = mpsc::unbounded_channel();
        let wanted: Vec<String> = wanted.iter().map(|id| (*id).to_owned()).collect();
        let periods = (Duration::from_millis(500), Duration::from_secs(3));
        let inner = Inner::new("th", Wanted::of(&wanted), link, periods, events);
        (inner, receiver, stop)
    }

    fn listing(toolbox_id: &str, names: &[&str]) -> Map<String, Value> {
        let tools: Vec<Value> = names
            .iter()
            .map(|name| {
                json!({"name": name, "description": "d", "toolbox_id": toolbox_id,
                       "argument_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
                       "output_schema": {"type": "object"}})
            })
            .collect();
        json!({"toolbox_id": toolbox_id, "tools": tools}).as_object().cloned().unwrap()
    }

    fn names(inner: &Inner) -> Vec<String> {
        let toolboxes = lock(&inner.toolboxes);
        let mut names: Vec<String> = toolboxes
            .values()
            .flat_map(|toolbox| toolbox.tools.iter().map(|tool| tool.spec().name))
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn the_own_toolbox_is_never_hosted_even_for_a_star() {
        let (inner, _events, stop) = source(&["*"]);
        inner.listed(&listing("th", &["echo"]));
        inner.listed(&listing("bad id!", &["echo"]));
        assert!(names(&inner).is_empty());
        inner.listed(&listing("weather", &["forecast"]));
        assert_eq!(names(&inner), ["ovos__weather__forecast"]);
        let (listed_only, _events, stop2) = source(&["weather"]);
        listed_only.listed(&listing("news", &["headlines"]));
        assert!(names(&listed_only).is_empty(), "only the listed toolboxes are hosted");
        // A listed toolbox shows, down, before it first answers.
        let source = OvosSource { inner: listed_only.clone(), stop: stop2.clone() };
        let status = source.status();
        assert_eq!(status.len(), 1);
        assert_eq!((status[0].name.as_str(), status[0].up, status[0].tools), ("ovos:weather", false, 0));
        listed_only.listed(&listing("weather", &["forecast"]));
        assert_eq!(names(&listed_only), ["ovos__weather__forecast"]);
        stop.cancel();
        stop2.cancel();
    }

    #[tokio::test]
    async fn names_follow_the_rule_and_a_colliding_listing_is_refused_whole() {
        let (inner, mut events, stop) = source(&["*"]);
        inner.listed(&listing("home.lights", &["turn on", "status"]));
        assert_eq!(names(&inner), ["ovos__home_lights__status", "ovos__home_lights__turn_on"]);
        assert_eq!(events.try_recv().ok(), Some(McpEvent::Up { source: "ovos:home.lights".to_owned() }));
        assert_eq!(
            events.try_recv().ok(),
            Some(McpEvent::ToolsChanged { source: "ovos:home.lights".to_owned() })
        );
        // Another toolbox whose names map onto the same ones: refused, the first keeps its tools.
        inner.listed(&listing("home_lights", &["status"]));
        // One listing with two names that map to one.
        inner.listed(&listing("twins", &["a b", "a_b"]));
        assert_eq!(names(&inner), ["ovos__home_lights__status", "ovos__home_lights__turn_on"]);
        let toolboxes = lock(&inner.toolboxes);
        assert_eq!(toolboxes["home_lights"].rejected_lists, 1);
        assert!(toolboxes["twins"].last_error.as_deref().unwrap().contains("both map to 'ovos__twins__a_b'"));
        drop(toolboxes);
        // The same listing again changes nothing.
        while events.try_recv().is_ok() {}
        inner.listed(&listing("home.lights", &["turn on", "status"]));
        assert!(events.try_recv().is_err());
        stop.cancel();
    }

    #[tokio::test]
    async fn a_toolbox_that_misses_a_discovery_is_down_and_its_tools_answer_overloaded() {
        let (inner, mut events, stop) = source(&["*"]);
        inner.listed(&listing("weather", &["forecast"]));
        while events.try_recv().is_ok() {}
        *lock(&inner.discovered_at) = Some(Instant::now() + Duration::from_millis(1));
        inner.expire();
        assert!(matches!(events.try_recv(), Ok(McpEvent::Down { .. })));
        assert!(!inner.is_up("weather"));
        let tool = lock(&inner.toolboxes)["weather"].tools[0].clone();
        let context = Context::default();
        match tool.call(json!({"a": 1}), &context).await {
            Err(ToolError::Unavailable { retry_after, .. }) => {
                assert_eq!(retry_after, Duration::from_millis(500))
            }
            other => panic!("expected overloaded, got {other:?}"),
        }
        // It answers a discovery: up again, tools unchanged.
        inner.listed(&listing("weather", &["forecast"]));
        assert!(inner.is_up("weather"));
        assert_eq!(events.try_recv().ok(), Some(McpEvent::Up { source: "ovos:weather".to_owned() }));
        stop.cancel();
    }
}
