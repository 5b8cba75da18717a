//! The tool's input: its schema, parsing it defensively, and resolving `cwd`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use toolwarden_core::json_type_name;
use toolwarden_protocol::{ToolAnnotations, ToolSpec};

use crate::settings::ExecSettings;

/// The tool's name.
pub const TOOL_NAME: &str = "exec";

const DESCRIPTION: &str = "Run a shell command and return its exit code and output. \
The command string is run by a POSIX shell (`sh -c COMMAND` unless configured otherwise), so pipes, redirections, `&&` and \
quoting work as in a terminal. It starts in `cwd` (default: the configured base directory; it \
must lie under one of the allowed roots), with stdin from the `stdin` field (otherwise empty) \
and toolwarden's environment plus `env`. The result shows the exit code, then stdout and stderr \
in separate sections; a long output is cut in the middle (the note says how many bytes). \
A non-zero exit code or a death by signal is an error result. The command runs in its own \
process group: background processes it starts are killed when it finishes, and everything it \
started is stopped if the call is cancelled or times out, so do not use it to start servers \
or daemons that should keep running. It is not interactive: a command waiting for input that \
never comes runs until its timeout.";

/// The `exec` tool as the engine lists it.
pub(crate) fn tool_spec() -> ToolSpec {
    let input_schema = json!({
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "minLength": 1,
                "description": "The shell command line to run, e.g. \"cargo test 2>&1 | tail -n 50\"."
            },
            "cwd": {
                "type": "string",
                "description": "Working directory, absolute or relative to the base directory. Must lie under an allowed root. Default: the base directory."
            },
            "env": {
                "type": "object",
                "additionalProperties": { "type": "string" },
                "description": "Extra environment variables for the command, e.g. {\"RUST_BACKTRACE\": \"1\"}."
            },
            "stdin": {
                "type": "string",
                "description": "Text written to the command's standard input, which is then closed. Default: empty input."
            }
        },
        "required": ["command"],
        "additionalProperties": false
    });
    let output_schema = json!({
        "type": "object",
        "properties": {
            "exit_code": { "type": ["integer", "null"], "description": "The shell's exit code; null when it died by a signal." },
            "signal": { "type": ["integer", "null"], "description": "The signal that killed the shell, if any." },
            "signal_name": { "type": ["string", "null"], "description": "That signal's name, e.g. SIGKILL." },
            "stdout": { "type": "string", "description": "Standard output (lossy UTF-8; a cut is marked in place)." },
            "stderr": { "type": "string", "description": "Standard error (lossy UTF-8; a cut is marked in place)." },
            "stdout_bytes": { "type": "integer", "description": "Bytes the command wrote to stdout." },
            "stderr_bytes": { "type": "integer", "description": "Bytes the command wrote to stderr." },
            "truncated_bytes": { "type": "integer", "description": "Output bytes not shown, stdout and stderr together." },
            "duration_ms": { "type": "integer", "description": "From start to the end of the call." },
            "output_unfinished": { "type": "boolean", "description": "Background processes still held the output open after the drain deadline; what they wrote after it is missing." },
            "background_killed": { "type": "boolean", "description": "Processes of the command's group were still running when it ended, and were killed." }
        },
        "required": ["exit_code", "signal", "stdout", "stderr", "truncated_bytes", "duration_ms"]
    });
    ToolSpec {
        name: TOOL_NAME.to_owned(),
        description: Some(DESCRIPTION.to_owned()),
        input_schema,
        output_schema: Some(output_schema),
        annotations: ToolAnnotations {
            title: Some("Run a shell command".to_owned()),
            ..ToolAnnotations::default()
        },
    }
}

/// A parsed input.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ExecInput {
    pub(crate) command: String,
    pub(crate) cwd: Option<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) stdin: Option<String>,
}

/// Parses the input without trusting that it matched the schema. The error is for the model.
pub(crate) fn parse(input: &Value) -> Result<ExecInput, String> {
    let Some(obj) = input.as_object() else {
        return Err(format!(
            "the input must be an object like {{\"command\": \"ls\"}}, not {}",
            json_type_name(input)
        ));
    };
    let mut parsed = ExecInput::default();
    let mut command = None;
    for (key, value) in obj {
        match key.as_str() {
            "command" => command = Some(string_field("command", value)?),
            "cwd" if !value.is_null() => parsed.cwd = Some(string_field("cwd", value)?),
            "stdin" if !value.is_null() => parsed.stdin = Some(string_field("stdin", value)?),
            "env" if !value.is_null() => parsed.env = env_field(value)?,
            "cwd" | "stdin" | "env" => {}
            other => {
                return Err(format!(
                    "unknown input field {other:?}; the fields are command, cwd, env and stdin"
                ));
            }
        }
    }
    let Some(command) = command else {
        return Err("the input has no \"command\"".to_owned());
    };
    if command.trim().is_empty() {
        return Err("\"command\" is empty".to_owned());
    }
    if command.contains('\0') {
        return Err("\"command\" contains a NUL character".to_owned());
    }
    if parsed.cwd.as_deref().is_some_and(|c| c.contains('\0')) {
        return Err("\"cwd\" contains a NUL character".to_owned());
    }
    parsed.command = command;
    Ok(parsed)
}

fn string_field(name: &str, value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        other => Err(format!(
            "{name:?} must be a string, not {}",
            json_type_name(other)
        )),
    }
}

fn env_field(value: &Value) -> Result<Vec<(String, String)>, String> {
    let Some(map) = value.as_object() else {
        return Err(format!(
            "\"env\" must be an object of strings, not {}",
            json_type_name(value)
        ));
    };
    let mut env = Vec::with_capacity(map.len());
    for (name, value) in map {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(format!(
                "\"env\" has an invalid variable name {name:?} (empty, or with '=' or NUL)"
            ));
        }
        let Value::String(value) = value else {
            return Err(format!(
                "\"env\".{name} must be a string, not {}",
                json_type_name(value)
            ));
        };
        if value.contains('\0') {
            return Err(format!("\"env\".{name} contains a NUL character"));
        }
        env.push((name.clone(), value.clone()));
    }
    Ok(env)
}

/// Resolves the working directory: relative to the base directory, canonical (symlinks and `..`
/// resolved), a directory, under an allowed root. The error is for the model.
pub(crate) async fn resolve_cwd(
    settings: &ExecSettings,
    cwd: Option<&str>,
) -> Result<PathBuf, String> {
    let wanted = match cwd {
        None => settings.base_dir.clone(),
        Some(c) => settings.base_dir.join(Path::new(c)),
    };
    let shown = cwd.map_or_else(|| wanted.display().to_string(), str::to_owned);
    let canonical = tokio::fs::canonicalize(&wanted)
        .await
        .map_err(|e| format!("cwd {shown:?} cannot be used: {e}"))?;
    let is_dir = tokio::fs::metadata(&canonical)
        .await
        .map(|m| m.is_dir())
        .unwrap_or(false);
    if !is_dir {
        return Err(format!("cwd {shown:?} is not a directory"));
    }
    // `Path::starts_with` compares whole components: /tmp/root-evil is not under /tmp/root.
    if !settings
        .allowed_roots
        .iter()
        .any(|root| canonical.starts_with(root))
    {
        return Err(format!(
            "cwd {shown:?} (resolved to {}) is outside the allowed roots; allowed: {}",
            canonical.display(),
            settings.roots_list()
        ));
    }
    Ok(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn check(input: Value, expected: Result<ExecInput, &str>) {
        assert_eq!(parse(&input), expected.map_err(str::to_owned));
    }

    #[test]
    fn parses_every_field() {
        check(
            json!({"command": "ls", "cwd": "sub", "env": {"A": "1"}, "stdin": "x"}),
            Ok(ExecInput {
                command: "ls".to_owned(),
                cwd: Some("sub".to_owned()),
                env: vec![("A".to_owned(), "1".to_owned())],
                stdin: Some("x".to_owned()),
            }),
        );
        check(
            json!({"command": "ls", "cwd": null, "env": null, "stdin": null}),
            Ok(ExecInput {
                command: "ls".to_owned(),
                ..ExecInput::default()
            }),
        );
    }

    #[test]
    fn refuses_what_the_schema_would() {
        check(
            json!("ls"),
            Err("the input must be an object like {\"command\": \"ls\"}, not a string"),
        );
        check(json!({}), Err("the input has no \"command\""));
        check(json!({"command": " "}), Err("\"command\" is empty"));
        check(
            json!({"command": 5}),
            Err("\"command\" must be a string, not a number"),
        );
        check(
            json!({"command": "ls", "timeout": 5}),
            Err("unknown input field \"timeout\"; the fields are command, cwd, env and stdin"),
        );
        check(
            json!({"command": "ls", "env": ["A=1"]}),
            Err("\"env\" must be an object of strings, not an array"),
        );
        check(
            json!({"command": "ls", "env": {"A": 1}}),
            Err("\"env\".A must be a string, not a number"),
        );
        check(
            json!({"command": "ls", "env": {"A=B": "1"}}),
            Err("\"env\" has an invalid variable name \"A=B\" (empty, or with '=' or NUL)"),
        );
        check(
            json!({"command": "ls\u{0}"}),
            Err("\"command\" contains a NUL character"),
        );
    }

    #[test]
    fn the_schema_names_the_tool_and_requires_a_command() {
        let spec = tool_spec();
        assert_eq!(spec.name, "exec");
        assert_eq!(spec.input_schema["required"], json!(["command"]));
        assert!(spec.description.is_some_and(|d| d.contains("sh -c")));
    }
}
