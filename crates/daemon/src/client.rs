//! The client commands: `toolhost call` and `toolhost tools`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use toolhost_bus::{Bus, CallError, Caller, Error as BusError, RedisBus, Store};
use toolhost_envelope::DiscoveryFormat;

use crate::EXIT_CONFIG;
use crate::config::Config;
use crate::output;

/// Exit code when the tool answered with an error.
pub const EXIT_TOOL_ERROR: i32 = 1;
/// Exit code for transport problems and timeouts.
pub const EXIT_TRANSPORT: i32 = 2;

fn caller(config: &Config) -> Result<(Arc<dyn Bus>, Caller), String> {
    let raw = &config.raw;
    let bus: Arc<dyn Bus> =
        Arc::new(RedisBus::new(config.redis_options()).map_err(|err| redis_failure(&raw.redis, &err))?);
    let keys = config.keys();
    let caller = Caller::new(bus.clone(), &keys, &raw.streams.requests, &raw.streams.results, "toolhost:cli");
    Ok((bus, caller))
}

/// `toolhost call`: prints the result and returns the exit code (0, 1 or 2).
pub async fn run_call(config: &Config, tool: &str, args: &str, timeout: Duration) -> i32 {
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
    let (_bus, caller) = match caller(config) {
        Ok(caller) => caller,
        Err(err) => {
            eprintln!("toolhost: {err}");
            return EXIT_TRANSPORT;
        }
    };
    let mut data = Map::new();
    data.insert("tool".to_owned(), Value::String(tool.to_owned()));
    data.insert("arguments".to_owned(), arguments);
    match caller.call("tool.invoke", data, timeout).await {
        Ok((_, result)) if result.success => {
            output::line(result.result.unwrap_or(Value::Null));
            0
        }
        Ok((_, result)) => {
            let error = serde_json::json!({
                "error": result.error, "error_code": result.error_code, "details": result.details,
            });
            output::line(error);
            eprintln!("toolhost: {} failed: {}", tool, result.error.unwrap_or_default());
            EXIT_TOOL_ERROR
        }
        Err(err) => {
            eprintln!("toolhost: {}", describe(config, &err));
            EXIT_TRANSPORT
        }
    }
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

async fn print_registry(config: &Config, bus: &dyn Store, format: DiscoveryFormat) -> i32 {
    let raw = &config.raw;
    let keys = config.keys();
    let fields = match bus.hash_fields(&keys.registry(&raw.daemon.toolbox_id)).await {
        Ok(fields) => fields,
        Err(err) => {
            eprintln!("toolhost: cannot read the registry: {}", redis_failure(&raw.redis, &err));
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
        CallError::Bus(err) => redis_failure(&raw.redis, err),
        _ => err.to_string(),
    }
}

/// A Redis failure for a person: where Redis is (the URL or the sentinels, passwords masked),
/// what went wrong and, when Redis does not answer, where to look.
pub(crate) fn redis_failure(redis: &crate::config::RedisSection, err: &BusError) -> String {
    let url = redis.describe();
    if err.is_retryable() && !redis.sentinels.is_empty() {
        format!(
            "Redis at {url} does not answer ({err}); are the sentinels reachable, and do they monitor \
             '{}' with a master up? Set [redis] sentinels and sentinel_master (TOOLHOST__REDIS__SENTINELS, \
             TOOLHOST__REDIS__SENTINEL_MASTER)",
            redis.sentinel_master
        )
    } else if err.is_retryable() {
        format!(
            "Redis at {url} does not answer ({err}); is redis-server running there? \
             Set REDIS_URL, or [redis] url in the file given by --config or TOOLHOST_CONFIG"
        )
    } else {
        format!("Redis at {url} refused the command: {err}")
    }
}
