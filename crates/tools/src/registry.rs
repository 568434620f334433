//! The [`Registry`] of a toolbox and the one path every call takes through it.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use jsonschema::Validator;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use toolhost_envelope::{Annotations, DiscoveryFormat, ErrorCode, ToolDescription};

use crate::schema::{SchemaError, compile, describe_errors};
use crate::{Context, Output, Tool, ToolSpec, check_blocks};

/// Every tool of a toolbox, looked up by name or by the event it consumes.
#[derive(Default)]
pub struct Registry {
    /// Sorted by name, so listings are deterministic.
    tools: Vec<Registered>,
    /// The maps a call looks up (several times a call) hash with foldhash, seeded per process,
    /// rather than std's SipHash, which cost about 150 instructions a lookup. Their keys are
    /// tool names and event types of the configuration and the hosted servers' catalogs.
    by_name: foldhash::HashMap<String, usize>,
    by_event: foldhash::HashMap<String, usize>,
    disabled: foldhash::HashSet<String>,
    /// Schemas by canonical text: tools with the same schema share its value and validator.
    schemas: HashMap<String, Schema>,
}

/// One registered tool with everything compiled once.
///
/// The schemas live only in `arguments` and `output`, shared between tools with equal schemas;
/// `spec` and `description` hold `null` in their place. A schema as a JSON value with its compiled
/// validator costs tens of KiB, which adds up with hundreds of generated tools.
struct Registered {
    tool: Arc<dyn Tool>,
    spec: ToolSpec,
    description: ToolDescription,
    arguments: Schema,
    output: Schema,
    /// Top-level arguments that may be left out; `null` for them means absent.
    optional: Vec<String>,
}

/// A schema and its compiled validator.
#[derive(Clone)]
struct Schema {
    value: Arc<Value>,
    validator: Arc<Validator>,
}

/// Why a tool cannot be registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The name breaks the naming rule.
    #[error("tool name '{0}' is invalid: use 1-64 of [a-zA-Z0-9_-]")]
    InvalidName(String),
    /// Two tools share a name.
    #[error("tool name '{0}' is registered twice")]
    DuplicateName(String),
    /// Two tools consume the same event.
    #[error("event '{event}' is consumed by both '{first}' and '{second}'")]
    DuplicateEvent {
        /// The event.
        event: String,
        /// The tool registered first.
        first: String,
        /// The tool registered second.
        second: String,
    },
    /// A schema does not compile.
    #[error(transparent)]
    Schema(#[from] SchemaError),
}

/// Why a call did not produce a valid result.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The wire code.
    pub code: ErrorCode,
    /// One readable sentence.
    pub message: String,
    /// Structure for the caller to act on (validation failures).
    pub details: Option<Value>,
}

impl Failure {
    /// A failure without details.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into(), details: None }
    }

    /// The failure with `details`.
    #[must_use]
    pub fn with_details(mut self, details: Value) -> Failure {
        self.details = Some(details);
        self
    }
}

/// Whether `name` is a valid tool name: `^[a-zA-Z0-9_-]{1,64}$`, what OpenAI accepts.
pub fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds a tool, compiling its schemas.
    ///
    /// # Errors
    /// The name is invalid or taken, its event is taken, or a schema does not compile.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let mut spec = tool.spec();
        if !valid_tool_name(&spec.name) {
            return Err(RegistryError::InvalidName(spec.name));
        }
        if self.by_name.contains_key(&spec.name) {
            return Err(RegistryError::DuplicateName(spec.name));
        }
        let mut description = describe(&spec);
        if let Some(&other) = self.by_event.get(&description.consumed_event) {
            return Err(RegistryError::DuplicateEvent {
                event: description.consumed_event,
                first: self.tools[other].spec.name.clone(),
                second: spec.name,
            });
        }
        let arguments = self.schema(&spec.name, "argument", std::mem::take(&mut spec.argument_schema))?;
        let output = self.schema(&spec.name, "output", std::mem::take(&mut spec.output_schema))?;
        description.argument_schema = Value::Null;
        description.output_schema = Value::Null;
        let optional = optional_properties(&arguments.value);
        self.tools.push(Registered { tool, spec, description, arguments, output, optional });
        self.tools.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        self.reindex();
        Ok(())
    }

    /// The shared, compiled form of `schema`, compiled once per distinct schema.
    fn schema(&mut self, tool: &str, which: &'static str, schema: Value) -> Result<Schema, SchemaError> {
        // serde_json's map is ordered by key, so this text is canonical.
        let canonical = schema.to_string();
        if let Some(shared) = self.schemas.get(&canonical) {
            return Ok(shared.clone());
        }
        let validator = Arc::new(compile(tool, which, &schema)?);
        let shared = Schema { value: Arc::new(schema), validator };
        self.schemas.insert(canonical, shared.clone());
        Ok(shared)
    }

    fn reindex(&mut self) {
        self.by_name = self.tools.iter().enumerate().map(|(i, t)| (t.spec.name.clone(), i)).collect();
        self.by_event =
            self.tools.iter().enumerate().map(|(i, t)| (t.description.consumed_event.clone(), i)).collect();
    }

    /// Marks tools long-running (their descriptions say so, and hash anew); unknown names are
    /// ignored.
    pub fn mark_long_running(&mut self, names: &[String]) {
        for registered in self.tools.iter_mut().filter(|registered| names.contains(&registered.spec.name)) {
            // The stored description holds no schemas; hash the whole one, as `describe` did.
            let mut full = registered.description.clone();
            full.argument_schema = (*registered.arguments.value).clone();
            full.output_schema = (*registered.output.value).clone();
            full.long_running = true;
            rehash(&mut full);
            registered.description.long_running = true;
            registered.description.hash = full.hash;
        }
    }

    /// Disables tools by name; calls to them answer `tool_disabled`. Unknown names are returned.
    pub fn disable(&mut self, names: &[String]) -> Vec<String> {
        let mut unknown = Vec::new();
        for name in names {
            if self.by_name.contains_key(name) {
                self.disabled.insert(name.clone());
            } else {
                unknown.push(name.clone());
            }
        }
        unknown
    }

    /// The tool consuming `event`, by name.
    pub fn by_event(&self, event: &str) -> Option<&str> {
        self.by_event.get(event).map(|&i| self.tools[i].spec.name.as_str())
    }

    /// Whether a tool of that name exists and is not disabled.
    pub fn is_enabled(&self, name: &str) -> bool {
        self.by_name.contains_key(name) && !self.disabled.contains(name)
    }

    /// Whether a tool of that name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Where a run of the tool `name` goes outside the process ([`Tool::remote`]).
    pub fn remote(&self, name: &str) -> Option<crate::Remote> {
        self.by_name.get(name).and_then(|&i| self.tools[i].tool.remote())
    }

    /// The full description of a tool.
    pub fn description(&self, name: &str) -> Option<ToolDescription> {
        self.by_name.get(name).map(|&i| self.tools[i].full_description())
    }

    /// A tool's time limit, without copying its description (which holds its schemas): every
    /// call reads it.
    pub fn timeout(&self, name: &str) -> Option<Duration> {
        self.by_name.get(name).map(|&i| Duration::from_millis(self.tools[i].description.timeout_ms))
    }

    /// The annotations of a tool.
    pub fn annotations(&self, name: &str) -> Option<Annotations> {
        self.by_name.get(name).map(|&i| self.tools[i].description.annotations)
    }

    /// Names of every tool, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|tool| tool.spec.name.as_str()).collect()
    }

    /// Names of the tools that are not disabled, sorted.
    pub fn enabled_names(&self) -> Vec<&str> {
        self.tools
            .iter()
            .map(|tool| tool.spec.name.as_str())
            .filter(|name| !self.disabled.contains(*name))
            .collect()
    }

    /// Every enabled tool in `format`, sorted by name.
    pub fn export(&self, format: DiscoveryFormat, requests_topic: &str, results_topic: &str) -> Vec<Value> {
        self.export_where(format, requests_topic, results_topic, |_| true)
    }

    /// Every enabled tool `keep` keeps, by name, in `format`, sorted by name.
    pub fn export_where(
        &self,
        format: DiscoveryFormat,
        requests_topic: &str,
        results_topic: &str,
        keep: impl Fn(&str) -> bool,
    ) -> Vec<Value> {
        self.tools
            .iter()
            .filter(|tool| !self.disabled.contains(&tool.spec.name) && keep(&tool.spec.name))
            .map(|tool| tool.full_description().export(format, requests_topic, results_topic))
            .collect()
    }

    /// The concurrency limit each tool's spec asks for (`max_concurrent`), by name. The limits
    /// themselves live in a `ToolLimits` outside the registry.
    pub fn spec_limits(&self) -> Vec<(String, usize)> {
        self.tools
            .iter()
            .filter_map(|tool| tool.spec.max_concurrent.map(|n| (tool.spec.name.clone(), n)))
            .collect()
    }

    /// Calls tool `name`: [`Registry::prepare`]s the arguments, then [`Registry::run`]s it, and
    /// gives its result (without content blocks, which [`Registry::run`] gives).
    pub async fn invoke(
        &self,
        name: &str,
        arguments: Value,
        context: &Context,
        deadline: Option<Duration>,
    ) -> Result<Value, Failure> {
        let arguments = self.prepare(name, arguments)?;
        self.run(name, arguments, context, deadline).await.map(|output| output.result)
    }

    /// Checks that tool `name` exists and is enabled, drops `null` optional arguments and
    /// validates the rest against the tool's argument schema.
    ///
    /// # Errors
    /// `unknown_tool`, `tool_disabled` or `invalid_arguments`.
    pub fn prepare(&self, name: &str, arguments: Value) -> Result<Value, Failure> {
        let Some(&index) = self.by_name.get(name) else {
            return Err(Failure::new(ErrorCode::UnknownTool, format!("no tool named '{name}'")));
        };
        if self.disabled.contains(name) {
            return Err(Failure::new(ErrorCode::ToolDisabled, format!("tool '{name}' is disabled")));
        }
        self.tools[index].prepare_arguments(arguments)
    }

    /// Runs tool `name` with arguments from [`Registry::prepare`], under its timeout (shortened
    /// to `deadline` when that comes first), catching panics and validating the output.
    /// Concurrency limits are the caller's (see `ToolLimits`).
    pub async fn run(
        &self,
        name: &str,
        arguments: Value,
        context: &Context,
        deadline: Option<Duration>,
    ) -> Result<Output, Failure> {
        let Some(&index) = self.by_name.get(name) else {
            return Err(Failure::new(ErrorCode::UnknownTool, format!("no tool named '{name}'")));
        };
        let tool = &self.tools[index];
        let timeout = deadline.map_or(tool.spec.timeout, |left| left.min(tool.spec.timeout));
        let call = AssertUnwindSafe(tool.tool.call_output(arguments, context)).catch_unwind();
        let output = match tokio::time::timeout(timeout, call).await {
            Err(_elapsed) => {
                context.cancel.cancel();
                return Err(Failure::new(
                    ErrorCode::Timeout,
                    format!(
                        "tool '{name}' did not finish within {} ms and was cancelled",
                        timeout.as_millis()
                    ),
                ));
            }
            Ok(Err(panic)) => {
                return Err(Failure::new(
                    ErrorCode::ToolFailed,
                    format!("tool '{name}' crashed: {}", panic_message(&panic)),
                ));
            }
            Ok(Ok(Err(err))) => {
                return Err(Failure { code: err.code(), message: err.to_string(), details: err.details() });
            }
            Ok(Ok(Ok(output))) => output,
        };
        if !tool.output.validator.is_valid(&output.result) {
            let failures = describe_errors(&tool.output.validator, &tool.output.value, &output.result);
            return Err(Failure {
                code: ErrorCode::InvalidOutput,
                message: format!("tool '{name}' returned output that breaks its output schema"),
                details: Some(json!({ "errors": failures })),
            });
        }
        if let Some(blocks) = &output.content
            && let Err(reason) = check_blocks(blocks)
        {
            return Err(Failure {
                code: ErrorCode::InvalidOutput,
                message: format!("tool '{name}' returned a content block MCP does not define: {reason}"),
                details: Some(json!({ "content_error": reason })),
            });
        }
        Ok(output)
    }
}

impl Registered {
    /// The description with its schemas filled in.
    fn full_description(&self) -> ToolDescription {
        ToolDescription {
            argument_schema: Value::clone(&self.arguments.value),
            output_schema: Value::clone(&self.output.value),
            ..self.description.clone()
        }
    }

    /// Drops `null` optional arguments (models send them for arguments they leave out in strict
    /// mode), then checks the argument schema.
    fn prepare_arguments(&self, mut arguments: Value) -> Result<Value, Failure> {
        if let Value::Object(map) = &mut arguments {
            map.retain(|key, value| !(value.is_null() && self.optional.iter().any(|name| name == key)));
        }
        if self.arguments.validator.is_valid(&arguments) {
            return Ok(arguments);
        }
        let failures = describe_errors(&self.arguments.validator, &self.arguments.value, &arguments);
        let summary =
            failures.iter().filter_map(|failure| failure["message"].as_str()).collect::<Vec<_>>().join("; ");
        Err(Failure {
            code: ErrorCode::InvalidArguments,
            message: format!("invalid arguments for tool '{}': {summary}", self.spec.name),
            details: Some(json!({ "errors": failures })),
        })
    }
}

/// The wire description of a spec, with its content hash.
fn describe(spec: &ToolSpec) -> ToolDescription {
    let mut description = ToolDescription {
        name: spec.name.clone(),
        description: spec.description.clone(),
        argument_schema: spec.argument_schema.clone(),
        output_schema: spec.output_schema.clone(),
        consumed_event: spec.consumed_event.clone().unwrap_or_else(|| format!("{}.requested", spec.name)),
        produced_event: spec.produced_event.clone().unwrap_or_else(|| format!("{}.completed", spec.name)),
        annotations: spec.annotations,
        timeout_ms: spec.timeout.as_millis() as u64,
        long_running: false,
        hash: String::new(),
    };
    rehash(&mut description);
    description
}

/// Sets a description's hash from the rest of it.
fn rehash(description: &mut ToolDescription) {
    description.hash = String::new();
    // serde_json's map is ordered by key, so this serialisation is canonical.
    let canonical = serde_json::to_vec(&*description).unwrap_or_default();
    description.hash = Sha256::digest(&canonical).iter().map(|byte| format!("{byte:02x}")).collect();
}

fn optional_properties(schema: &Value) -> Vec<String> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|properties| {
            properties.keys().filter(|name| !required.contains(&name.as_str())).cloned().collect()
        })
        .unwrap_or_default()
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use crate::ToolError;
    use crate::builtin::Echo;

    struct Misbehaving(&'static str);

    #[async_trait]
    impl Tool for Misbehaving {
        fn spec(&self) -> ToolSpec {
            let mut spec = ToolSpec::new(
                self.0,
                "test tool",
                json!({"type": "object"}),
                json!({"type": "object", "required": ["ok"]}),
            );
            spec.timeout = Duration::from_millis(50);
            spec
        }
        async fn call(&self, _arguments: Value, _context: &Context) -> Result<Value, ToolError> {
            match self.0 {
                "panics" => panic!("boom"),
                "sleeps" => {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok(json!({"ok": true}))
                }
                "refuses" => Err(ToolError::Forbidden("no".into())),
                "unavailable" => Err(ToolError::Unavailable {
                    message: "the server is restarting".into(),
                    retry_after: Duration::from_millis(1500),
                }),
                _ => Ok(json!({"wrong": true})),
            }
        }
    }

    fn registry() -> Registry {
        let mut registry = Registry::new();
        registry.register(Arc::new(Echo)).unwrap();
        for name in ["panics", "sleeps", "refuses", "unavailable", "broken_output"] {
            registry.register(Arc::new(Misbehaving(name))).unwrap();
        }
        registry
    }

    async fn check(name: &str, arguments: Value, expected: Result<Value, ErrorCode>) -> Option<Value> {
        let res = registry().invoke(name, arguments, &Context::default(), None).await;
        match (res, expected) {
            (Ok(value), Ok(expected)) => {
                assert_eq!(value, expected);
                None
            }
            (Err(failure), Err(code)) => {
                assert_eq!(failure.code, code, "{failure:?}");
                failure.details
            }
            (res, expected) => panic!("got {res:?}, expected {expected:?}"),
        }
    }

    #[tokio::test]
    async fn echo_returns_its_message() {
        check("echo", json!({"message": "hi"}), Ok(json!({"message": "hi"}))).await;
    }

    #[tokio::test]
    async fn bad_arguments_list_pointers() {
        let details = check("echo", json!({"message": 5}), Err(ErrorCode::InvalidArguments)).await.unwrap();
        assert_eq!(details["errors"][0]["pointer"], "/message");
        let details = check("echo", json!({}), Err(ErrorCode::InvalidArguments)).await.unwrap();
        assert_eq!(details["errors"][0]["rule"], "required");
    }

    #[tokio::test]
    async fn misbehaving_tools_get_their_codes() {
        check("panics", json!({}), Err(ErrorCode::ToolFailed)).await;
        check("sleeps", json!({}), Err(ErrorCode::Timeout)).await;
        check("refuses", json!({}), Err(ErrorCode::Forbidden)).await;
        let details = check("broken_output", json!({}), Err(ErrorCode::InvalidOutput)).await.unwrap();
        assert_eq!(details["errors"][0]["rule"], "required");
        check("missing", json!({}), Err(ErrorCode::UnknownTool)).await;
    }

    #[tokio::test]
    async fn an_unavailable_tool_answers_overloaded_with_retry_after_in_details() {
        let failure =
            registry().invoke("unavailable", json!({}), &Context::default(), None).await.unwrap_err();
        assert_eq!(failure.code, ErrorCode::Overloaded);
        assert_eq!(failure.message, "the server is restarting");
        assert_eq!(failure.details, Some(json!({"retry_after_ms": 1500})));
        // Errors without structure carry no details.
        assert_eq!(check("refuses", json!({}), Err(ErrorCode::Forbidden)).await, None);
    }

    #[test]
    fn tool_names_are_1_to_64_of_letters_digits_underscore_and_hyphen() {
        for good in ["get-sum", "Get_Sum2", "a", "time__get_current_time", &"x".repeat(64)] {
            assert!(valid_tool_name(good), "{good}");
        }
        for bad in ["", "a.b", "a/b", "a b", "é", &"x".repeat(65)] {
            assert!(!valid_tool_name(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn disabled_tools_answer_tool_disabled() {
        let mut registry = registry();
        assert_eq!(registry.disable(&["echo".into(), "nope".into()]), ["nope"]);
        let failure =
            registry.invoke("echo", json!({"message": "x"}), &Context::default(), None).await.unwrap_err();
        assert_eq!(failure.code, ErrorCode::ToolDisabled);
        assert!(registry.export(DiscoveryFormat::Native, "a", "b").iter().all(|tool| tool["name"] != "echo"));
    }

    #[test]
    fn long_running_tools_say_so_and_hash_anew_as_a_fresh_description_would() {
        let mut registry = registry();
        let before = registry.description("echo").unwrap();
        assert!(!before.long_running);
        registry.mark_long_running(&["echo".into(), "nope".into()]);
        let after = registry.description("echo").unwrap();
        assert!(after.long_running);
        assert_ne!(after.hash, before.hash);
        // The hash is the one of the whole description, schemas included.
        let mut full = after.clone();
        full.hash = String::new();
        rehash(&mut full);
        assert_eq!(full.hash, after.hash);
        let native = registry.export(DiscoveryFormat::Native, "a", "b");
        let echo = native.iter().find(|tool| tool["name"] == "echo").unwrap();
        assert_eq!(echo["long_running"], true);
        assert!(
            native
                .iter()
                .filter(|tool| tool["name"] != "echo")
                .all(|tool| tool.get("long_running").is_none())
        );
    }

    #[test]
    fn a_tools_time_limit_is_its_descriptions() {
        let registry = registry();
        assert_eq!(registry.timeout("sleeps"), Some(Duration::from_millis(50)));
        let echo = registry.description("echo").unwrap();
        assert_eq!(registry.timeout("echo"), Some(Duration::from_millis(echo.timeout_ms)));
        assert_eq!(registry.timeout("missing"), None);
    }

    #[test]
    fn registration_rules() {
        let mut registry = registry();
        assert!(matches!(registry.register(Arc::new(Echo)), Err(RegistryError::DuplicateName(_))));
        assert!(matches!(
            registry.register(Arc::new(Misbehaving("bad.name"))),
            Err(RegistryError::InvalidName(_))
        ));
        assert_eq!(registry.names(), ["broken_output", "echo", "panics", "refuses", "sleeps", "unavailable"]);
        assert_eq!(registry.by_event("echo.requested"), Some("echo"));
        let hash = &registry.description("echo").unwrap().hash;
        assert_eq!(hash.len(), 64);
        assert_eq!(hash, &describe(&Echo.spec()).hash);
    }

    #[tokio::test]
    async fn null_optional_arguments_count_as_absent() {
        struct Optional;
        #[async_trait]
        impl Tool for Optional {
            fn spec(&self) -> ToolSpec {
                ToolSpec::new(
                    "optional",
                    "t",
                    json!({"type": "object", "properties": {
                    "a": {"type": "string"}, "b": {"type": "string"}}, "required": ["a"],
                    "additionalProperties": false}),
                    json!({}),
                )
            }
            async fn call(&self, arguments: Value, _context: &Context) -> Result<Value, ToolError> {
                Ok(arguments)
            }
        }
        let mut registry = Registry::new();
        registry.register(Arc::new(Optional)).unwrap();
        let res = registry.invoke("optional", json!({"a": "x", "b": null}), &Context::default(), None).await;
        assert_eq!(res.unwrap(), json!({"a": "x"}));
        let res = registry.invoke("optional", json!({"a": null}), &Context::default(), None).await;
        assert_eq!(res.unwrap_err().code, ErrorCode::InvalidArguments);
    }
}
