//! What the model and programs see of a finished command.
//!
//! One text block: a status line (`exit code 2` or `killed by signal 9 (SIGKILL)`), then
//! `--- stdout ---` and `--- stderr ---` sections (each only when not empty, or `(no output)`),
//! then notes about cut output and killed background processes. Streams are sectioned rather than
//! interleaved: two pipes give no reliable order between them, and a model reads "what went to
//! stderr" better as its own section. The same facts are in `structured_content`.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;
use toolwarden_core::ToolOutput;
use toolwarden_protocol::{Content, format_duration};

use crate::capture::{Capture, Stream};
use crate::settings::ExecSettings;

/// A command that ran to its end.
pub(crate) struct FinishedCommand {
    pub(crate) status: ExitStatus,
    pub(crate) capture: Capture,
    pub(crate) duration: Duration,
    /// Background processes still held the pipes at the drain deadline.
    pub(crate) output_unfinished: bool,
    /// Processes of the group were still running when the shell was done, and were killed.
    pub(crate) background_killed: bool,
    pub(crate) drain_timeout: Duration,
    pub(crate) output_limit: u64,
}

impl FinishedCommand {
    pub(crate) fn into_output(self) -> ToolOutput {
        let exit_code = self.status.code();
        let signal = self.status.signal();
        let signal_name = signal.map(signal_name);
        let stdout = self.capture.shown(Stream::Stdout);
        let stderr = self.capture.shown(Stream::Stderr);
        let truncated = self.capture.cut();

        let mut text = match (exit_code, signal) {
            (Some(code), _) => format!("exit code {code}\n"),
            (None, Some(sig)) => format!(
                "killed by signal {sig} ({}){}\n",
                signal_name.as_deref().unwrap_or("unknown"),
                if self.status.core_dumped() {
                    ", core dumped"
                } else {
                    ""
                }
            ),
            (None, None) => "ended without an exit code\n".to_owned(),
        };
        for (name, shown) in [("stdout", &stdout), ("stderr", &stderr)] {
            if shown.bytes > 0 {
                text.push_str(&format!("--- {name} ---\n{}", shown.text));
                if !shown.text.ends_with('\n') {
                    text.push('\n');
                }
            }
        }
        if stdout.bytes == 0 && stderr.bytes == 0 {
            text.push_str("(no output)\n");
        }
        if truncated > 0 {
            text.push_str(&format!(
                "note: output was {} bytes, over the limit of {} bytes; {truncated} bytes from the middle were cut\n",
                stdout.bytes + stderr.bytes,
                self.output_limit
            ));
        }
        if self.output_unfinished {
            text.push_str(&format!(
                "note: background processes still held the output open {} after the command exited; output after that is missing\n",
                format_duration(self.drain_timeout)
            ));
        }
        if self.background_killed {
            text.push_str(
                "note: processes the command left running in the background were killed\n",
            );
        }
        if text.ends_with('\n') {
            text.pop();
        }

        let structured = json!({
            "exit_code": exit_code,
            "signal": signal,
            "signal_name": signal_name,
            "stdout": stdout.text,
            "stderr": stderr.text,
            "stdout_bytes": stdout.bytes,
            "stderr_bytes": stderr.bytes,
            "truncated_bytes": truncated,
            "duration_ms": u64::try_from(self.duration.as_millis()).unwrap_or(u64::MAX),
            "output_unfinished": self.output_unfinished,
            "background_killed": self.background_killed,
        });
        ToolOutput {
            content: vec![Content::text(text)],
            structured_content: Some(structured),
            is_error: exit_code != Some(0),
        }
    }
}

fn signal_name(sig: i32) -> String {
    Signal::try_from(sig).map_or_else(|_| format!("signal {sig}"), |s| s.as_str().to_owned())
}

/// The shell could not be started.
pub(crate) fn spawn_failed(settings: &ExecSettings, cwd: &Path, e: &io::Error) -> ToolOutput {
    let hint = if e.kind() == io::ErrorKind::NotFound {
        " (is the configured shell installed and on PATH, and does cwd still exist?)"
    } else {
        ""
    };
    ToolOutput::error(format!(
        "exec: could not start the shell {:?} in {}: {e}{hint}",
        settings.shell,
        cwd.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn finished(raw_status: i32, out: &[u8], err: &[u8], limit: u64) -> FinishedCommand {
        let mut capture = Capture::new(limit);
        capture.push(Stream::Stdout, out);
        capture.push(Stream::Stderr, err);
        FinishedCommand {
            status: ExitStatus::from_raw(raw_status),
            capture,
            duration: Duration::from_millis(12),
            output_unfinished: false,
            background_killed: false,
            drain_timeout: Duration::from_secs(2),
            output_limit: limit,
        }
    }

    fn text(out: &ToolOutput) -> &str {
        out.content[0].as_text().unwrap()
    }

    #[test]
    fn success_shows_the_code_and_the_sections() {
        let out = finished(0, b"hello\n", b"warn\n", 100).into_output();
        assert!(!out.is_error);
        assert_eq!(
            text(&out),
            "exit code 0\n--- stdout ---\nhello\n--- stderr ---\nwarn"
        );
        assert_eq!(
            out.structured_content.unwrap(),
            json!({
                "exit_code": 0, "signal": null, "signal_name": null,
                "stdout": "hello\n", "stderr": "warn\n", "stdout_bytes": 6, "stderr_bytes": 5,
                "truncated_bytes": 0, "duration_ms": 12,
                "output_unfinished": false, "background_killed": false,
            })
        );
    }

    #[test]
    fn failure_and_signals_are_errors() {
        let out = finished(3 << 8, b"", b"", 100).into_output();
        assert!(out.is_error);
        assert_eq!(text(&out), "exit code 3\n(no output)");
        let out = finished(9, b"partial", b"", 100).into_output();
        assert!(out.is_error);
        assert_eq!(
            text(&out),
            "killed by signal 9 (SIGKILL)\n--- stdout ---\npartial"
        );
        assert_eq!(out.structured_content.unwrap()["signal_name"], "SIGKILL");
    }

    #[test]
    fn notes_say_what_was_cut_and_killed() {
        let mut f = finished(0, b"0123456789", b"", 4);
        f.output_unfinished = true;
        f.background_killed = true;
        let out = f.into_output();
        assert_eq!(
            text(&out),
            "exit code 0\n--- stdout ---\n01\n[... 6 bytes cut ...]\n89\n\
             note: output was 10 bytes, over the limit of 4 bytes; 6 bytes from the middle were cut\n\
             note: background processes still held the output open 2s after the command exited; output after that is missing\n\
             note: processes the command left running in the background were killed"
        );
    }
}
