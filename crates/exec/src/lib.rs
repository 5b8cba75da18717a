//! The built-in `exec` tool: a shell command as a governed tool call.
//!
//! The key design choice: **a command is its process group, and the call owns the group.** The
//! shell runs as `SHELL -c COMMAND` in a group of its own (with a parent-death SIGKILL, see
//! [`toolwarden_process`]), and every way a call can end acts on that group, never on the shell
//! alone:
//!
//! - a cancel or timeout sends SIGTERM to the group; when the whole group is gone the attempt ends
//!   [`StopHow::Cooperative`](toolwarden_protocol::StopHow); when the engine forces the stop
//!   (after `cancel_grace`) the group gets SIGKILL and the attempt ends `Killed`;
//! - a command that finishes normally still has its group killed: background processes it left
//!   (`sleep 100 &`) are killed, and if they hold stdout or stderr open, output is read for at
//!   most [`ExecSettings::drain_timeout`] after the shell exits, then reading stops. A finished
//!   call leaves nothing running and cannot hang on someone else's pipe.
//!
//! One future owns the group, its pipes and the stdin writer and drives them in a single loop,
//! so nothing it started outlives it; dropping it kills the group too.
//!
//! Output is kept up to [`ExecSettings::output_limit`] bytes (stdout and stderr together): the
//! first half and the last half of it, with the middle cut and counted; past the limit the pipes
//! are still read and discarded, so a flooding command never blocks and memory stays bounded.
//! Every chunk of output is a heartbeat. `docs/EXEC.md` has the details and every decision.
#![deny(missing_docs)]

mod capture;
mod input;
mod report;
mod run;
mod settings;

use std::sync::Arc;

use toolwarden_core::{Attempt, AttemptEnd, Backend, BoxFuture, ToolOutput};
use toolwarden_protocol::{StopHow, ToolSpec};

pub use input::TOOL_NAME;
pub use settings::{
    DEFAULT_DRAIN_TIMEOUT, DEFAULT_ENV_REMOVE, DEFAULT_OUTPUT_LIMIT, DEFAULT_SHELL,
    ExecConfigError, ExecSettings,
};

/// The backend serving the `exec` tool.
#[derive(Clone, Debug)]
pub struct ExecBackend {
    settings: Arc<ExecSettings>,
}

impl ExecBackend {
    /// A backend running commands under `settings`.
    pub fn new(settings: ExecSettings) -> Self {
        Self {
            settings: Arc::new(settings),
        }
    }

    /// The `exec` tool's name, description and input schema.
    pub fn tool_spec() -> ToolSpec {
        input::tool_spec()
    }

    /// The settings in force.
    pub fn settings(&self) -> &ExecSettings {
        &self.settings
    }
}

impl Backend for ExecBackend {
    fn name(&self) -> &str {
        TOOL_NAME
    }

    fn start(&self, attempt: Attempt) -> BoxFuture<AttemptEnd> {
        let settings = Arc::clone(&self.settings);
        Box::pin(async move {
            if attempt.tool.as_ref() != TOOL_NAME {
                return AttemptEnd::Done(Ok(ToolOutput::error(format!(
                    "exec: unknown tool {:?}; this backend serves only \"exec\"",
                    attempt.tool
                ))));
            }
            if attempt.stop.is_cancelled() {
                // Stopped before anything started: nothing to stop.
                return AttemptEnd::Stopped(StopHow::Cooperative);
            }
            let parsed = match input::parse(&attempt.input) {
                Ok(parsed) => parsed,
                Err(msg) => return AttemptEnd::Done(Ok(ToolOutput::error(format!("exec: {msg}")))),
            };
            let cwd = match input::resolve_cwd(&settings, parsed.cwd.as_deref()).await {
                Ok(cwd) => cwd,
                Err(msg) => return AttemptEnd::Done(Ok(ToolOutput::error(format!("exec: {msg}")))),
            };
            if attempt.stop.is_cancelled() {
                return AttemptEnd::Stopped(StopHow::Cooperative);
            }
            let prepared = run::PreparedCommand {
                command: parsed.command,
                cwd,
                env: parsed.env,
                stdin: parsed.stdin,
            };
            run::run(&settings, prepared, attempt.stop, attempt.heartbeat).await
        })
    }
}
