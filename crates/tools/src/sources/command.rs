//! `[[commands]]`: a program run with an argv template, on the terminal engine (its own process
//! group, the terminal's rlimits and `run_as` user, a replaced environment, capped output,
//! redaction of the daemon's secrets, a kill of the whole group at the deadline). Never a shell.
//!
//! How arguments fill the argv (`argv = ["wc", "-w", "{file}"]`):
//!
//! - `argv[0]` is the program, literal: a bare name is looked up on the terminal's fixed `PATH`
//!   at load, an absolute path is used as is; it must be an executable file when the
//!   configuration loads.
//! - An element that is exactly one placeholder (`"{file}"`) becomes one element holding the
//!   value: a string as is, a number as its JSON text, a boolean as `true`/`false`. An array
//!   value becomes one element per item, in order (none for `[]`); items must be scalars.
//! - An element with a placeholder among literal text (`"--lines={n}"`) becomes one element with
//!   each placeholder replaced; arrays and objects are refused there.
//! - An optional argument that is absent (or `null`) drops every element that names it, whole:
//!   `"--lines={n}"` disappears when `n` is absent. Write a flag and its value as one element
//!   (`--lines={n}`) so they go together; a separate `"-n", "{n}"` would leave `-n` behind.
//! - A value that would start an element with `-` is refused (`invalid_arguments`), so an
//!   argument cannot become an option, unless the argument's property in the schema says
//!   `"x-toolhost-allow-dash": true` (for an array, on the array's property). An element whose
//!   literal text starts with `-` (`--lines={n}`) is an option by design and never refused.
//! - A value holding a NUL byte is refused: no argv element can carry one.
//!
//! `stdin = "{text}"` is a template too: scalars become text, arrays and objects their JSON
//! text, an absent argument the empty string. Without `stdin` the program reads `/dev/null`.
//!
//! The program's stdout is the result: `output = "text"` (default) answers it as a string,
//! `output = "json"` parses it and answers the value (validated against `output_schema` by the
//! registry), `output = "mcp"` reads it as an MCP `CallToolResult`, whose images, audio and
//! resources become the answer's content blocks (checked by the registry). Stderr is kept apart; a non-zero exit answers `tool_failed` with the exit code and
//! the last lines of stderr. Stdout past `max_output_bytes` answers `tool_failed` rather than a
//! cut result.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::template::{Template, scalar_text};
use super::{AnnotationSettings, FieldError, argument_schema, check_common, dash_allowed};
use crate::terminal::Redactor;
use crate::terminal::TerminalPolicy;
use crate::terminal::exec::{self, Spec};
use crate::terminal::parse::{ParsedCommand, resolve_cwd, resolve_program};
use crate::terminal::{Refusal, TerminalSettings};
use crate::{CallResultError, Context, Output, Tool, ToolError, ToolSpec, from_call_result};

/// Bytes of stderr kept (the last ones) for a failure's message.
const STDERR_TAIL_BYTES: usize = 4096;
/// Lines of stderr a failure's message quotes.
const STDERR_TAIL_LINES: usize = 10;
/// How long the registry waits past `timeout_ms` before it drops a call the engine should have
/// ended itself.
const TIMEOUT_MARGIN: Duration = Duration::from_secs(1);

/// What a command's stdout is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandOutput {
    /// The result is stdout as a string.
    #[default]
    Text,
    /// The result is stdout parsed as JSON.
    Json,
    /// Stdout is an MCP `CallToolResult` (`{"content": [...], "structuredContent"?, "isError"?}`):
    /// images, audio and resources become the answer's content blocks, `isError` is
    /// `tool_failed` (docs/CONTRACTS.md, "Content blocks").
    Mcp,
}

/// One `[[commands]]` table as configured.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CommandSettings {
    /// The tool name.
    pub name: String,
    /// What the tool does, for a model to read.
    pub description: String,
    /// The program and its arguments, `{name}` placeholders filled from the arguments.
    pub argv: Vec<String>,
    /// What the program reads on stdin, a template; unset: `/dev/null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// The working directory (absolute). Unset: `[tools.terminal] sandbox_cwd` when set, else
    /// the daemon's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// What stdout is: `text` (default) or `json`.
    #[serde(default)]
    pub output: CommandOutput,
    /// JSON Schema of the arguments, inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argument_schema: Option<Value>,
    /// JSON Schema of the arguments, from a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argument_schema_file: Option<PathBuf>,
    /// JSON Schema of the result; unset: a string for `text`, anything for `json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// How long one run may take before its process group is killed (default 10000).
    #[serde(default = "super::default_timeout_ms")]
    pub timeout_ms: u64,
    /// Most bytes of stdout (default 1 MiB).
    #[serde(default = "super::default_max_bytes")]
    pub max_output_bytes: usize,
    /// Runs at once (unset: only `[dispatch] max_in_flight` limits it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<usize>,
    /// Behaviour hints.
    #[serde(default)]
    pub annotations: AnnotationSettings,
}

/// A command tool, compiled from its settings.
#[derive(Debug, Clone)]
pub struct CommandTool {
    spec: ToolSpec,
    /// Absolute path of the program.
    program: PathBuf,
    /// The name the program gets as `argv[0]`.
    program_name: String,
    /// `argv[1..]`.
    args: Vec<Template>,
    stdin: Option<Template>,
    cwd: Option<PathBuf>,
    output: CommandOutput,
    timeout: Duration,
    max_output_bytes: usize,
    /// Arguments whose values may start with `-`.
    dash_allowed: HashSet<String>,
    policy: TerminalPolicy,
}

impl CommandTool {
    /// Checks and compiles `settings`; the command runs under `policy` (its rlimits, `run_as`
    /// user, redaction and sandbox root).
    ///
    /// # Errors
    /// Every bad key, each named inside the table (`argv[0]`, `stdin`, `argument_schema`, ...).
    pub fn new(settings: &CommandSettings, policy: &TerminalPolicy) -> Result<CommandTool, Vec<FieldError>> {
        let mut errors = Vec::new();
        check_common(
            &settings.name,
            &[("timeout_ms", settings.timeout_ms), ("max_output_bytes", settings.max_output_bytes as u64)],
            &mut errors,
        );
        if settings.max_concurrent == Some(0) {
            errors.push(FieldError::new("max_concurrent", "must be greater than 0"));
        }
        let mut templates = Vec::new();
        for (index, element) in settings.argv.iter().enumerate() {
            match Template::parse(element) {
                Ok(template) => templates.push(template),
                Err(message) => errors.push(FieldError::new(format!("argv[{index}]"), message)),
            }
        }
        let stdin = settings.stdin.as_deref().map(Template::parse).transpose().unwrap_or_else(|message| {
            errors.push(FieldError::new("stdin", message));
            None
        });
        let program = match (settings.argv.first(), templates.first()) {
            (None, _) => {
                errors.push(FieldError::new("argv", "must name a program"));
                None
            }
            (Some(_), Some(first)) if !first.is_literal() => {
                errors.push(FieldError::new("argv[0]", "the program cannot be a placeholder"));
                None
            }
            (Some(first), _) => {
                find_program(first).map_err(|message| errors.push(FieldError::new("argv[0]", message))).ok()
            }
        };
        if let Some(cwd) = &settings.cwd
            && !cwd.is_absolute()
        {
            errors.push(FieldError::new("cwd", "must be an absolute path"));
        }
        if settings.output == CommandOutput::Text
            && let Some(schema) = &settings.output_schema
            && schema.get("type").is_some_and(|kind| kind != "string")
        {
            errors.push(FieldError::new("output_schema", "output = \"text\" answers a string"));
        }
        let names = templates.iter().skip(1).chain(&stdin).flat_map(Template::names);
        let arguments = argument_schema(
            settings.argument_schema.as_ref(),
            settings.argument_schema_file.as_deref(),
            names,
            &mut errors,
        );
        let Some(program) = program.filter(|_| errors.is_empty()) else { return Err(errors) };
        let output_schema = settings.output_schema.clone().unwrap_or_else(|| match settings.output {
            CommandOutput::Text => json!({"type": "string"}),
            CommandOutput::Json => json!({}),
            CommandOutput::Mcp => json!({"type": ["object", "string"]}),
        });
        let mut spec = ToolSpec::new(&settings.name, &settings.description, arguments, output_schema);
        let timeout = Duration::from_millis(settings.timeout_ms);
        spec.timeout = timeout + TIMEOUT_MARGIN;
        spec.annotations = settings.annotations.resolve();
        spec.max_concurrent = settings.max_concurrent;
        let program_name = Path::new(&settings.argv[0])
            .file_name()
            .map_or_else(|| settings.argv[0].clone(), |name| name.to_string_lossy().into_owned());
        Ok(CommandTool {
            dash_allowed: dash_allowed(&spec.argument_schema).into_iter().collect(),
            spec,
            program,
            program_name,
            args: templates.into_iter().skip(1).collect(),
            stdin,
            cwd: settings.cwd.clone(),
            output: settings.output,
            timeout,
            max_output_bytes: settings.max_output_bytes,
            policy: policy.clone(),
        })
    }

    /// The argv after `argv[0]`, filled from `arguments` (see the module documentation).
    ///
    /// # Errors
    /// A sentence for the caller (`invalid_arguments`).
    pub fn fill_argv(&self, arguments: &Map<String, Value>) -> Result<Vec<String>, String> {
        fill_argv(&self.args, arguments, &self.dash_allowed)
    }
}

/// Finds the program of `argv[0]`: an absolute path as is, a bare name on the fixed `PATH`.
fn find_program(program: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt as _;
    if !program.contains('/') {
        return resolve_program(program).map_err(|refusal| match refusal {
            Refusal::SpawnFailed(_) => format!("no program '{program}' on {}", crate::terminal::FIXED_PATH),
            other => other.to_string(),
        });
    }
    let path = Path::new(program);
    if !path.is_absolute() {
        return Err("a program path must be absolute".to_owned());
    }
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_file() && metadata.permissions().mode() & 0o111 != 0 => {
            Ok(path.to_owned())
        }
        Ok(_) => Err(format!("{program} is not an executable file")),
        Err(err) => Err(format!("{program}: {err}")),
    }
}

/// Fills `templates` from `arguments`; see the module documentation for the rules.
fn fill_argv(
    templates: &[Template],
    arguments: &Map<String, Value>,
    dash_allowed: &HashSet<String>,
) -> Result<Vec<String>, String> {
    let present = |name: &str| arguments.get(name).filter(|value| !value.is_null());
    let checked = |name: &str, text: String| -> Result<String, String> {
        if text.contains('\0') {
            return Err(format!("argument '{name}' contains a NUL byte"));
        }
        Ok(text)
    };
    let mut argv = Vec::new();
    for template in templates {
        if let Some(name) = template.whole() {
            let values = match present(name) {
                None => continue,
                Some(Value::Array(items)) => items.iter().collect(),
                Some(value) => vec![value],
            };
            for value in values {
                let text = scalar_text(value).ok_or_else(|| {
                    format!("argument '{name}' must be a string, number or boolean (or an array of them)")
                })?;
                if text.starts_with('-') && !dash_allowed.contains(name) {
                    return Err(dash_refusal(name));
                }
                argv.push(checked(name, text)?);
            }
            continue;
        }
        let rendered = template.render(|name| match present(name) {
            None => Ok(None),
            Some(value) => {
                scalar_text(value).map(|text| checked(name, text).map(Some)).unwrap_or_else(|| {
                    Err(format!("argument '{name}' must be a string, number or boolean here"))
                })
            }
        })?;
        let Some(element) = rendered else { continue };
        if element.starts_with('-')
            && !template.literal_starts_with('-')
            && !template.names().all(|name| dash_allowed.contains(name))
        {
            let name = template.names().next().unwrap_or_default();
            return Err(dash_refusal(name));
        }
        argv.push(element);
    }
    Ok(argv)
}

fn dash_refusal(name: &str) -> String {
    format!("argument '{name}' may not start with '-': the program would read it as an option")
}

/// The text of stdin: scalars as text, arrays and objects as JSON, absent arguments as "".
fn fill_stdin(template: &Template, arguments: &Map<String, Value>) -> String {
    let rendered = template.render(|name| {
        Ok::<_, ()>(Some(match arguments.get(name) {
            None | Some(Value::Null) => String::new(),
            Some(value) => scalar_text(value).unwrap_or_else(|| value.to_string()),
        }))
    });
    rendered.ok().flatten().unwrap_or_default()
}

/// The call's trace context as the environment-carrier convention of OpenTelemetry names it:
/// `TRACEPARENT`, and `TRACESTATE` when the caller gave one.
fn trace_env(context: &Context) -> Vec<(&'static str, String)> {
    let Some((traceparent, tracestate)) = context.trace_headers() else {
        return Vec::new();
    };
    let mut env = vec![("TRACEPARENT", traceparent)];
    if let Some(tracestate) = tracestate {
        env.push(("TRACESTATE", tracestate.to_owned()));
    }
    env
}

/// A `CallToolResult` with its texts redacted (text blocks, embedded text resources,
/// `structuredContent`); base64 is left alone, since a redaction would corrupt it.
fn redact_call_result(redactor: &Redactor, mut value: Value) -> Value {
    if let Some(blocks) = value.get_mut("content").and_then(Value::as_array_mut) {
        for block in blocks {
            for pointer in ["/text", "/resource/text"] {
                if let Some(Value::String(text)) = block.pointer_mut(pointer) {
                    *text = redactor.redact(text);
                }
            }
        }
    }
    if let Some(structured) = value.get_mut("structuredContent") {
        *structured = redactor.redact_json(structured.take());
    }
    value
}

/// The last [`STDERR_TAIL_LINES`] non-empty lines of `text`.
fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].join("\n")
}

#[async_trait]
impl Tool for CommandTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    async fn call(&self, arguments: Value, context: &Context) -> Result<Value, ToolError> {
        self.call_output(arguments, context).await.map(|output| output.result)
    }

    async fn call_output(&self, arguments: Value, context: &Context) -> Result<Output, ToolError> {
        let empty = Map::new();
        let arguments = arguments.as_object().unwrap_or(&empty);
        let args = self.fill_argv(arguments).map_err(ToolError::InvalidArguments)?;
        let stdin = self.stdin.as_ref().map(|template| fill_stdin(template, arguments).into_bytes());
        // An explicit directory is the operator's choice, checked (not confined) at each run; the
        // default is the terminal's sandbox root.
        let cwd = match &self.cwd {
            Some(cwd) => resolve_cwd(&TerminalSettings::default(), cwd.to_str()),
            None => resolve_cwd(self.policy.settings(), None),
        }
        .map_err(|refusal| ToolError::Failed(refusal.to_string()))?;
        let spec = Spec {
            program: self.program.clone(),
            parsed: ParsedCommand { name: self.program_name.clone(), args },
            cwd,
            limits: self.policy.limits(),
            timeout: self.timeout,
            output_cap_bytes: self.max_output_bytes,
            identity: self.policy.identity(),
            stdin,
            stderr_tail_bytes: Some(STDERR_TAIL_BYTES),
            env: trace_env(context),
        };
        let execution =
            exec::execute(&spec).await.map_err(|refusal| ToolError::Failed(refusal.to_string()))?;
        let redactor = self.policy.redactor();
        let stderr = last_lines(&redactor.redact(&String::from_utf8_lossy(&execution.stderr)));
        let with_stderr =
            |head: String| if stderr.is_empty() { head } else { format!("{head}; stderr:\n{stderr}") };
        if execution.timeout {
            return Err(ToolError::Timeout(with_stderr(format!(
                "{} did not finish within {} ms; its process group was killed",
                self.program_name,
                self.timeout.as_millis()
            ))));
        }
        match execution.exit_code {
            Some(0) => {}
            Some(code) => {
                return Err(ToolError::Failed(with_stderr(format!(
                    "{} exited with code {code}",
                    self.program_name
                ))));
            }
            None => {
                return Err(ToolError::Failed(with_stderr(format!(
                    "{} was ended by a signal",
                    self.program_name
                ))));
            }
        }
        if execution.truncated {
            return Err(ToolError::Failed(format!(
                "{} printed more than max_output_bytes ({}) on stdout",
                self.program_name, self.max_output_bytes
            )));
        }
        let stdout = String::from_utf8_lossy(&execution.output);
        let parsed = || {
            serde_json::from_str::<Value>(&stdout)
                .map_err(|err| ToolError::Failed(format!("{} printed no JSON: {err}", self.program_name)))
        };
        match self.output {
            CommandOutput::Text => Ok(Value::String(redactor.redact(&stdout)).into()),
            CommandOutput::Json => parsed().map(|value| redactor.redact_json(value).into()),
            CommandOutput::Mcp => {
                let value = redact_call_result(redactor, parsed()?);
                from_call_result(value).map_err(|err| match err {
                    CallResultError::IsError(text) => ToolError::Failed(text),
                    other => ToolError::Failed(format!(
                        "{} printed no MCP CallToolResult: {other}",
                        self.program_name
                    )),
                })
            }
        }
    }
}

#[cfg(test)]
// A failed unwrap is a test failure with a clear message; that is what tests want.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn settings(argv: &[&str], schema: Value) -> CommandSettings {
        let text = json!({"name": "t", "description": "d", "argv": argv, "argument_schema": schema});
        serde_json::from_value(text).unwrap()
    }

    fn tool(argv: &[&str], schema: Value) -> CommandTool {
        CommandTool::new(&settings(argv, schema), &TerminalPolicy::new(&TerminalSettings::default()).0)
            .unwrap()
    }

    fn fill(tool: &CommandTool, arguments: Value) -> Result<Vec<String>, String> {
        tool.fill_argv(arguments.as_object().unwrap())
    }

    #[test]
    fn elements_are_filled_one_value_each_and_absent_ones_dropped() {
        let schema = json!({"type": "object", "properties": {
            "file": {"type": "string"}, "n": {"type": "integer"}, "files": {"type": "array"}, "on": {"type": "boolean"}}});
        let tool = tool(&["wc", "-w", "{file}", "--lines={n}", "{files}", "--flag={on}"], schema);
        assert_eq!(
            fill(&tool, json!({"file": "a b; rm -rf /", "n": 3, "files": ["x", 2, true], "on": false}))
                .unwrap(),
            ["-w", "a b; rm -rf /", "--lines=3", "x", "2", "true", "--flag=false"]
        );
        assert_eq!(fill(&tool, json!({"file": "f", "files": []})).unwrap(), ["-w", "f"]);
        assert_eq!(fill(&tool, json!({"n": null})).unwrap(), ["-w"]);
        let err = fill(&tool, json!({"files": [{"a": 1}]})).unwrap_err();
        assert!(err.contains("'files' must be a string, number or boolean"), "{err}");
        let err = fill(&tool, json!({"n": [1]})).unwrap_err();
        assert!(err.contains("'n' must be a string, number or boolean here"), "{err}");
        assert!(fill(&tool, json!({"file": "a\0b"})).unwrap_err().contains("NUL"));
    }

    #[test]
    fn values_that_would_become_options_are_refused_unless_allowed() {
        let schema = json!({"type": "object", "properties": {
            "file": {"type": "string"}, "files": {"type": "array"}, "pattern": {"type": "string", "x-toolhost-allow-dash": true},
            "suffix": {"type": "string"}}});
        let tool =
            tool(&["grep", "-e", "{pattern}", "{file}", "{files}", "{suffix}.txt", "--x={suffix}"], schema);
        for hostile in [json!({"file": "--delete"}), json!({"files": ["ok", "-rf"]}), json!({"suffix": "-n"})]
        {
            let err = fill(&tool, hostile.clone()).unwrap_err();
            assert!(err.contains("may not start with '-'"), "{hostile}: {err}");
        }
        // Allowed by the schema, or after literal text, or in an element that is an option anyway.
        assert_eq!(fill(&tool, json!({"pattern": "-v"})).unwrap(), ["-e", "-v"]);
        assert_eq!(fill(&tool, json!({"file": "a-b"})).unwrap(), ["-e", "a-b"]);
        let tool_with_option =
            super::tests::tool(&["echo", "--x={v}"], json!({"type": "object", "properties": {"v": {}}}));
        assert_eq!(fill(&tool_with_option, json!({"v": "-1"})).unwrap(), ["--x=-1"]);
    }

    #[tokio::test]
    async fn a_command_gets_the_calls_trace_context_in_traceparent_and_nothing_else_new() {
        let tool = tool(&["/usr/bin/env"], json!({"type": "object", "properties": {}}));
        let trace = toolhost_envelope::CallTrace::of(
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("vendor=x"),
            None,
            toolhost_envelope::CallTrace::parent_only,
        );
        let context = Context { trace: Some(trace.clone()), ..Context::default() };
        let output = tool.call(json!({}), &context).await.unwrap();
        let mut lines: Vec<&str> = output.as_str().unwrap().lines().collect();
        lines.sort_unstable();
        let traceparent = format!("TRACEPARENT={}", trace.traceparent());
        assert_eq!(
            lines,
            ["LC_ALL=C", "PATH=/usr/bin:/bin:/usr/local/bin", traceparent.as_str(), "TRACESTATE=vendor=x"]
        );
        // Outside a traced call, only the two fixed variables.
        let output = tool.call(json!({}), &Context::default()).await.unwrap();
        assert_eq!(output.as_str().unwrap().lines().count(), 2);
    }

    #[test]
    fn stdin_takes_json_text_for_structures_and_nothing_for_absent_arguments() {
        let template = Template::parse("{text}|{obj}|{gone}").unwrap();
        let arguments = json!({"text": "hi", "obj": {"a": [1]}});
        assert_eq!(fill_stdin(&template, arguments.as_object().unwrap()), "hi|{\"a\":[1]}|");
    }

    #[test]
    fn bad_settings_name_their_keys() {
        let policy = TerminalPolicy::new(&TerminalSettings::default()).0;
        let mut bad = settings(&["{prog}", "{x", "{y}"], json!({"type": "object", "properties": {}}));
        bad.name = "bad name!".to_owned();
        bad.timeout_ms = 0;
        bad.cwd = Some(PathBuf::from("relative"));
        bad.stdin = Some("}".to_owned());
        let errors = CommandTool::new(&bad, &policy).unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|error| error.field.as_str()).collect();
        assert_eq!(
            fields,
            ["name", "timeout_ms", "argv[1]", "stdin", "argv[0]", "cwd", "argument_schema"],
            "{errors:?}"
        );
        for (program, message) in [
            ("toolhost-no-such-program", "no program"),
            ("relative/x", "must be absolute"),
            ("/etc", "not an executable"),
        ] {
            let errors = CommandTool::new(&settings(&[program], json!({})), &policy).unwrap_err();
            assert!(errors[0].message.contains(message), "{program}: {errors:?}");
        }
        let errors = CommandTool::new(&settings(&[], json!({})), &policy).unwrap_err();
        assert_eq!(errors[0].field, "argv");
    }

    #[test]
    fn the_spec_follows_the_settings() {
        let mut settings = settings(
            &["/bin/echo", "{word}"],
            json!({"type": "object", "properties": {"word": {"type": "string"}}}),
        );
        settings.output = CommandOutput::Json;
        settings.timeout_ms = 250;
        settings.annotations.read_only = Some(true);
        let tool = CommandTool::new(&settings, &TerminalPolicy::new(&TerminalSettings::default()).0).unwrap();
        let spec = tool.spec();
        assert_eq!(spec.output_schema, json!({}));
        assert_eq!(spec.timeout, Duration::from_millis(250) + TIMEOUT_MARGIN);
        assert!(spec.annotations.read_only && !spec.annotations.destructive);
        assert_eq!(tool.program, PathBuf::from("/bin/echo"));
        assert_eq!(tool.program_name, "echo");
        assert_eq!(last_lines("a\n\nb\n"), "a\nb");
    }
}
