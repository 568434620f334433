//! The client commands: `toolhost call` and `toolhost tools`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use toolhost_bus::{Bus, CallError, Caller, Directory, Error as BusError, FleetAccess, RedisBus};
use toolhost_envelope::DiscoveryFormat;

use crate::EXIT_CONFIG;
use crate::auth::SigningKey;
use crate::config::Config;
use crate::fleet_client::{
    CallEvent, CallFailure, ClientSettings, FleetClient, InputState, Progress, Request,
};
use crate::output;

/// Exit code when the tool answered with an error.
pub const EXIT_TOOL_ERROR: i32 = 1;
/// Exit code for transport problems and timeouts.
pub const EXIT_TRANSPORT: i32 = 2;
/// How long `toolhost call` waits for the `cancelled` answer after Ctrl-C.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

fn caller(config: &Config) -> Result<(Arc<dyn Bus>, Caller), String> {
    let raw = &config.raw;
    let bus: Arc<dyn Bus> =
        Arc::new(RedisBus::new(config.redis_options()).map_err(|err| raw.redis.place().failure(&err))?);
    let keys = config.keys();
    let caller = Caller::new(bus.clone(), &keys, &raw.streams.requests, &raw.streams.results, "toolhost:cli");
    Ok((bus, caller))
}

/// `toolhost call`: calls the tool through the fleet client (a private response stream, the
/// call's progress and log messages on stderr), prints the result and returns the exit code (0,
/// 1 or 2). A question of the call is asked on the terminal (`prompt`: an elicitation's form),
/// or declined when stdin is not one. Ctrl-C sends `tool.cancel` for the call and prints its
/// `cancelled` answer.
pub async fn run_call(
    config: &Config,
    tool: &str,
    args: &str,
    timeout: Duration,
    identity: &CallIdentity,
) -> i32 {
    let arguments: Value = match serde_json::from_str(args) {
        Ok(Value::Object(arguments)) => Value::Object(arguments),
        Ok(_) => {
            eprintln!("toolhost: --args must be a JSON object");
            return EXIT_CONFIG;
        }
        Err(err) => {
            eprintln!("toolhost: --args is not JSON: {err}");
            return EXIT_CONFIG;
        }
    };
    // Listening before the call is sent, so a Ctrl-C at any moment after that cancels it.
    let mut interrupt = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()) {
        Ok(interrupt) => interrupt,
        Err(err) => {
            eprintln!("toolhost: cannot listen for Ctrl-C: {err}");
            return EXIT_TRANSPORT;
        }
    };
    let signing = match &identity.key_id {
        Some(key_id) => match signing_key(config, key_id) {
            Ok(key) => Some(key),
            Err(err) => {
                eprintln!("toolhost: {err}");
                return EXIT_CONFIG;
            }
        },
        None => None,
    };
    let raw = &config.raw;
    let fleet = match fleet_client(config, signing, identity).await {
        Ok(fleet) => fleet,
        Err(err) => {
            eprintln!("toolhost: {err}");
            return EXIT_TRANSPORT;
        }
    };
    let request = Request {
        tool: tool.to_owned(),
        arguments,
        request_id: toolhost_envelope::new_message_id(),
        timeout,
        response_topic: None,
        tenant: None,
        via: None,
        trace: None,
    };
    let (events, mut reports) = tokio::sync::mpsc::unbounded_channel::<CallEvent>();
    let call = fleet.call_with_events(&request, events);
    tokio::pin!(call);
    let answer = loop {
        tokio::select! {
            answer = &mut call => break answer,
            Some(event) = reports.recv() => match event {
                CallEvent::Progress(report) => print_progress(&report),
                CallEvent::Log(message) => {
                    eprintln!("toolhost: log {}: {}", message.level, message.data);
                }
                // Asked on a task of its own, so the call's answer and Ctrl-C are not held up.
                CallEvent::InputRequired { input_id, kind, request: question, .. } => {
                    let (fleet, request_id) = (fleet.clone(), request.request_id.clone());
                    tokio::spawn(async move {
                        let response = tokio::task::spawn_blocking(move || crate::prompt::answer(kind, &question))
                            .await
                            .unwrap_or_else(|_| crate::prompt::declined(kind));
                        match fleet.answer_input(&request_id, &input_id, response).await {
                            Ok(InputState::Accepted) => {}
                            Ok(state) => eprintln!("toolhost: the answer to the tool's question was not taken: {state:?}"),
                            Err(err) => eprintln!("toolhost: cannot send the answer to the tool's question: {err}"),
                        }
                    });
                }
            },
            // Ctrl-C: ask the host to stop the call, then wait briefly for its `cancelled` answer.
            _ = interrupt.recv() => {
                eprintln!("toolhost: interrupted; cancelling call {}", request.request_id);
                if let Err(err) = fleet.cancel(&request.request_id).await {
                    eprintln!("toolhost: cannot send tool.cancel: {err}");
                }
                let waited = tokio::time::timeout(CANCEL_WAIT, &mut call).await;
                break waited.unwrap_or(Err(CallFailure::NoAnswer(CANCEL_WAIT)));
            }
        }
    };
    fleet.close().await;
    match answer {
        Ok(result) if result.success => {
            output::line(result.result.unwrap_or(Value::Null));
            0
        }
        Ok(result) => {
            let error = serde_json::json!({
                "error": result.error, "error_code": result.error_code, "details": result.details,
            });
            output::line(error);
            eprintln!("toolhost: {} failed: {}", tool, result.error.unwrap_or_default());
            EXIT_TOOL_ERROR
        }
        Err(CallFailure::NoAnswer(_)) => {
            eprintln!("toolhost: {}", no_answer(config, timeout));
            EXIT_TRANSPORT
        }
        Err(CallFailure::Bus(err @ BusError::Unreplicated { .. })) => {
            eprintln!(
                "toolhost: request {} may not survive a Redis failover: {err}; a daemon may still run \
                 and answer it, or it may be lost, and sending it again with the same request_id is safe",
                request.request_id
            );
            EXIT_TRANSPORT
        }
        Err(CallFailure::Bus(err)) => {
            eprintln!("toolhost: {}", raw.redis.place().failure(&err));
            EXIT_TRANSPORT
        }
        Err(err) => {
            eprintln!("toolhost: {err}");
            EXIT_TRANSPORT
        }
    }
}

/// Who `toolhost call` calls as.
#[derive(Debug, Clone, Default)]
pub struct CallIdentity {
    /// The key to sign with (`--key-id`).
    pub key_id: Option<String>,
    /// The tenant (`--tenant`).
    pub tenant: Option<String>,
    /// How many replicas must have the request before the call waits for its answer
    /// (`--replica-acks`); 0: none.
    pub replica_acks: u32,
}

/// The key `key_id` with its secret: the configured key's, else `TOOLHOST_SIGNING_SECRET`.
fn signing_key(config: &Config, key_id: &str) -> Result<SigningKey, String> {
    if let Some(key) = config.auth.key(key_id) {
        return Ok(key.clone());
    }
    match config.mcp_env.0.get(crate::config::ENV_SIGNING_SECRET) {
        Some(secret) if !secret.is_empty() => Ok(SigningKey::new(key_id, secret.as_bytes())),
        _ => Err(format!(
            "--key-id {key_id}: no [[auth.keys]] entry has this id and {} is not set",
            crate::config::ENV_SIGNING_SECRET
        )),
    }
}

/// A fleet client for one command: no fleet watch, a private stream that expires soon after.
async fn fleet_client(
    config: &Config,
    signing: Option<SigningKey>,
    identity: &CallIdentity,
) -> Result<FleetClient, String> {
    let raw = &config.raw;
    let tenant = identity.tenant.clone();
    let mut options = config.redis_options();
    // The request's XADD is followed by WAIT: a request too few replicas have fails the call.
    options.publish_acks = identity.replica_acks;
    let bus: Arc<dyn FleetAccess> =
        Arc::new(RedisBus::new(options).map_err(|err| raw.redis.place().failure(&err))?);
    let settings = ClientSettings {
        shards: config.shards(),
        source: "toolhost:cli".to_owned(),
        stream_ttl: Duration::from_secs(60),
        watch_period: None,
        signing,
        tenant,
    };
    FleetClient::open(bus, config.keys(), settings).await.map_err(|err| raw.redis.place().failure(&err))
}

fn print_progress(report: &Progress) {
    let amount = match report.total {
        Some(total) => format!("{}/{total}", report.progress),
        None => report.progress.to_string(),
    };
    match &report.message {
        Some(message) => eprintln!("toolhost: progress {amount}: {message}"),
        None => eprintln!("toolhost: progress {amount}"),
    }
}

/// Why no answer came, for a person: the wait, and where a daemon should be.
fn no_answer(config: &Config, timeout: Duration) -> String {
    let raw = &config.raw;
    format!(
        "no answer within {} ms; is a toolhost daemon serving {} (key prefix '{}', requests stream {}) with a toolbox that hosts the tool?",
        timeout.as_millis(),
        raw.redis.describe(),
        raw.redis.key_prefix,
        raw.streams.requests,
    )
}

/// `toolhost tools`: prints the discovery answer in `format`, exactly as a caller on the bus
/// gets it (`{"toolbox_id", "format", "tools"}`), and returns the exit code.
pub async fn run_tools(config: &Config, format: &str, from_registry: bool, timeout: Duration) -> i32 {
    let Some(format) = DiscoveryFormat::parse(format) else {
        eprintln!("toolhost: unknown format '{format}'; use native, openai, mcp, toolbox or capabilities");
        return EXIT_CONFIG;
    };
    let (bus, caller) = match caller(config) {
        Ok(caller) => caller,
        Err(err) => {
            eprintln!("toolhost: {err}");
            return EXIT_TRANSPORT;
        }
    };
    if from_registry {
        return print_registry(config, bus.as_ref(), format).await;
    }
    let mut data = Map::new();
    data.insert("format".to_owned(), Value::String(format.as_str().to_owned()));
    match caller.call("tools.discover", data, timeout).await {
        Ok((_, result)) if result.success => {
            let answer = result.result.unwrap_or(Value::Null);
            output::line(serde_json::to_string_pretty(&answer).unwrap_or_default());
            0
        }
        Ok((_, result)) => {
            eprintln!("toolhost: discovery failed: {}", result.error.unwrap_or_default());
            EXIT_TOOL_ERROR
        }
        Err(err) => {
            eprintln!("toolhost: {}", describe(config, &err));
            EXIT_TRANSPORT
        }
    }
}

async fn print_registry(config: &Config, bus: &dyn Directory, format: DiscoveryFormat) -> i32 {
    let raw = &config.raw;
    let keys = config.keys();
    let fields = match bus.hash_fields(&keys.registry(&raw.daemon.toolbox_id)).await {
        Ok(fields) => fields,
        Err(err) => {
            eprintln!("toolhost: cannot read the registry: {}", raw.redis.place().failure(&err));
            return EXIT_TRANSPORT;
        }
    };
    let mut tools: Vec<toolhost_envelope::ToolDescription> =
        fields.iter().filter_map(|(_, json)| serde_json::from_str(json).ok()).collect();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    let requests = keys.topic(&raw.streams.requests);
    let results = keys.topic(&raw.streams.results);
    let exported: Vec<Value> = tools.iter().map(|tool| tool.export(format, &requests, &results)).collect();
    // The shape of the discovery answer, so scripts need not care where the list came from.
    let answer = serde_json::json!({"toolbox_id": raw.daemon.toolbox_id, "format": format.as_str(), "tools": exported});
    output::line(serde_json::to_string_pretty(&answer).unwrap_or_default());
    0
}

fn describe(config: &Config, err: &CallError) -> String {
    let raw = &config.raw;
    match err {
        CallError::Timeout(_) => format!(
            "{err}; is a toolhost daemon with toolbox_id '{}' serving {} (key prefix '{}', streams {} and {})?",
            raw.daemon.toolbox_id,
            raw.redis.describe(),
            raw.redis.key_prefix,
            raw.streams.requests,
            raw.streams.results,
        ),
        CallError::Bus(err) => raw.redis.place().failure(err),
        _ => err.to_string(),
    }
}
