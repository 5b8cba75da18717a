//! What the model reads: the text of every outcome but `ok`, starting with its tag and saying what
//! happened and what to try (docs/GOVERNANCE.md, "Outcomes").

use std::time::Duration;

use serde_json::Value;
use toolwarden_protocol::{
    CancelReason, Decider, DenyReason, ErrorReason, InvalidReason, Status, TimeoutKind,
    format_duration,
};

fn dur(ms: u64) -> String {
    format_duration(Duration::from_millis(ms))
}

const MAY_HAVE_RUN: &str = "It may have partly run; check its effects before calling it again, or pass a larger timeout_ms.";
/// An idle timeout is raised by its own hint: `idle_timeout_ms` (HTTP API, MCP `_meta`), or
/// `--idle-timeout` on the command line.
const MAY_HAVE_RUN_IDLE: &str = "It may have partly run; check its effects before calling it again, or pass a larger idle_timeout_ms (--idle-timeout on the command line).";

/// The model-facing text of a status. `detail` adds what the engine knows (an error message, the
/// schema violations, the names of similar tools).
pub fn outcome_text(tool: &str, status: &Status, detail: Option<&str>) -> String {
    // Details are often bare messages ("connection refused"); the text goes on after them, so
    // each ends as a sentence.
    let detail_sentence = |prefix: &str| match detail {
        Some(d) if !d.is_empty() => {
            let end = if d.ends_with(['.', '?', '!']) {
                ""
            } else {
                "."
            };
            format!(" {prefix}{d}{end}")
        }
        _ => String::new(),
    };
    // Or, inside a sentence, in brackets.
    let detail_aside = || detail.map(|d| format!(" ({d})")).unwrap_or_default();
    // The cancels the call itself did not ask for: `why` it was cancelled, and what `then`.
    let cancelled_because = |why: &str, then: &str| {
        format!(
            "[CANCELLED] Tool \"{tool}\" was cancelled because {why}. It may have partly run{then}."
        )
    };
    // The call's server could not be reached, or failed while running it.
    let unreachable = |then: &str| {
        format!(
            "[ERROR] Tool \"{tool}\" could not be reached.{} {then}",
            detail_sentence("")
        )
    };
    let server_failed = |what: &str| {
        format!(
            "[ERROR] The server of tool \"{tool}\" {what} while running it.{} It may have partly run.",
            detail_sentence("")
        )
    };
    match status {
        Status::Ok => String::new(),
        Status::Timeout {
            kind: TimeoutKind::Total,
            after_ms,
        } => format!(
            "[TIMEOUT] Tool \"{tool}\" exceeded its wall-clock limit of {} and was cancelled. {MAY_HAVE_RUN}",
            dur(*after_ms)
        ),
        Status::Timeout {
            kind: TimeoutKind::Idle,
            after_ms,
        } => format!(
            "[TIMEOUT] Tool \"{tool}\" made no progress for {} (idle timeout) and was cancelled. {MAY_HAVE_RUN_IDLE}",
            dur(*after_ms)
        ),
        Status::Timeout {
            kind: TimeoutKind::Attempt,
            after_ms,
        } => format!(
            "[TIMEOUT] Tool \"{tool}\" did not finish an attempt within {} (attempt timeout) and was cancelled.{} {MAY_HAVE_RUN}",
            dur(*after_ms),
            detail_sentence("")
        ),
        Status::Cancelled { reason } => match reason {
            CancelReason::NotStarted => format!(
                "[CANCELLED] Tool \"{tool}\" was not started because its turn was aborted. It had no effect; call it again if it is still needed."
            ),
            CancelReason::User => format!(
                "[CANCELLED] Tool \"{tool}\" was stopped by the user before it finished. It may have partly run; do not call it again unless the user asks."
            ),
            CancelReason::ClientDisconnect => {
                cancelled_because("the client that asked for it disconnected", "")
            }
            CancelReason::Parent => {
                cancelled_because("the turn that started this one was aborted", "")
            }
            CancelReason::Timeout => cancelled_because("an enclosing deadline passed", ""),
            CancelReason::Shutdown => {
                cancelled_because("toolwarden is shutting down", "; call it again later")
            }
            CancelReason::ServerRestart => cancelled_because("its server restarted", ""),
        },
        Status::Denied {
            decider,
            reason,
            retry_after_ms,
        } => match (decider, reason) {
            (Decider::LoopDetector, _) => format!(
                "[DENIED] Tool \"{tool}\" was called with identical input too many times in a row in this session{}; this call was blocked to break a loop. Try a different approach or different input.",
                detail_aside()
            ),
            (Decider::Headless, _) | (_, DenyReason::NoInteractor) => format!(
                "[DENIED] Tool \"{tool}\" needs a person's approval, but nobody can answer in this run (headless); it was not run. Do not retry it; find another way or report that approval is needed."
            ),
            (_, DenyReason::Timeout) => format!(
                "[DENIED] Nobody approved the call to tool \"{tool}\" in time{}; it was not run. Ask the user before trying again.",
                detail_aside()
            ),
            (_, DenyReason::User) => format!(
                "[DENIED] The user denied the call to tool \"{tool}\"; it was not run.{} Do not retry it without asking.",
                detail_sentence("Reason: ")
            ),
            (Decider::Quota, DenyReason::Concurrency) => format!(
                "[DENIED] Tool \"{tool}\" has as many calls running as its quota allows{}; this one was not run. Wait for a running call to finish, or try again in {}.",
                detail_aside(),
                dur(retry_after_ms.unwrap_or(1000).max(1))
            ),
            (Decider::Quota, _) => format!(
                "[DENIED] Tool \"{tool}\" has been called as often as its quota allows for now{}; this call was not run. Try again in {} or do without it.",
                detail_aside(),
                dur(retry_after_ms.unwrap_or(1000).max(1))
            ),
            (Decider::Pin, _) => format!(
                "[DENIED] Tool \"{tool}\" was not run: its server changed the tool's definition since it was trusted, and a person must accept the new one first. Do not retry it until they have; report the change."
            ),
            (Decider::Hook, DenyReason::HookError) => format!(
                "[DENIED] Tool \"{tool}\" was not run: the policy check that must allow it failed{}. Try again later.",
                detail_aside()
            ),
            (Decider::Hook, _) => format!(
                "[DENIED] Tool \"{tool}\" is not allowed with this input by a policy check; it was not run.{} Do not retry it as it is; a different approach or input may be allowed.",
                detail_sentence("Reason: ")
            ),
            (Decider::Rule, _) => format!(
                "[DENIED] Tool \"{tool}\" is not allowed with this input by a rule; it was not run.{} Do not retry it as it is; a different approach or input may be allowed.",
                detail_sentence("Reason: ")
            ),
            (_, DenyReason::Rule) => format!(
                "[DENIED] Tool \"{tool}\" is not allowed by policy; it was not run. Do not retry it."
            ),
            (_, DenyReason::Loop) => format!(
                "[DENIED] Tool \"{tool}\" was blocked as a loop; it was not run. Try a different approach."
            ),
            (_, _) => format!(
                "[DENIED] Tool \"{tool}\" was not allowed to run.{} Do not retry it as it is.",
                detail_sentence("Reason: ")
            ),
        },
        Status::Interrupted => format!(
            "[INTERRUPTED] toolwarden stopped while tool \"{tool}\" was running, so its result is unknown.{} It may have partly run; check its effects before calling it again.",
            detail_sentence("")
        ),
        Status::CircuitOpen { retry_after_ms } => format!(
            "[CIRCUIT OPEN] Tool \"{tool}\" has failed repeatedly and is paused; it was not run. Try again in {} or use another approach.",
            dur((*retry_after_ms).max(1))
        ),
        Status::Invalid {
            reason: InvalidReason::UnknownTool,
        } => format!(
            "[INVALID] There is no tool named \"{tool}\".{}",
            detail_sentence("")
        ),
        Status::Invalid {
            reason: InvalidReason::Schema,
        } => format!(
            "[INVALID] The input to tool \"{tool}\" does not match its schema; it was not run.{} Fix the input and call it again.",
            detail_sentence("")
        ),
        Status::Invalid {
            reason: InvalidReason::TooLarge,
        } => format!(
            "[INVALID] The input to tool \"{tool}\" is too large; it was not run.{}",
            detail_sentence("")
        ),
        Status::Error { reason } => match reason {
            ErrorReason::ToolError => {
                format!("[ERROR] Tool \"{tool}\" failed.{}", detail_sentence(""))
            }
            ErrorReason::Transport if detail.is_some_and(is_cannot_start) => unreachable(
                "It did not run. Its server cannot start until that is fixed, so calling it again now fails the same way; tell the user, or use another tool.",
            ),
            ErrorReason::Transport => unreachable("It may not have run; try again later."),
            ErrorReason::Crashed => server_failed("crashed"),
            ErrorReason::ServerRestart => server_failed("was restarted"),
            ErrorReason::Store => format!(
                "[ERROR] Tool \"{tool}\" was not started: its call could not be recorded in the audit trail.{} It did not run; try again once the trail is back.",
                detail_sentence("Reason: ")
            ),
        },
    }
}

/// A JSON value's type as messages to the model name it: `null`, `a boolean`, `a number`,
/// `a string`, `an array`, `an object`.
pub fn json_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The detail of a call whose server cannot start (state `failed`): `MCP server "x" cannot
/// start: WHY`. Backends use it too, so that the model's text can tell such a server from one
/// that is only slow or restarting.
pub fn cannot_start(server: &str, why: &str) -> String {
    format!("MCP server {server:?} {CANNOT_START}{why}")
}

const CANNOT_START: &str = "cannot start: ";

/// Whether a transport error's detail is [`cannot_start`]'s.
fn is_cannot_start(detail: &str) -> bool {
    detail.starts_with("MCP server ") && detail.contains(CANNOT_START)
}

/// The note appended to a result the loop detector flagged.
pub(crate) fn loop_note(tool: &str, count: u32, block_after: u32) -> String {
    let block = if block_after > count {
        format!(
            " From the {} such call on, calls will be denied.",
            ordinal(block_after)
        )
    } else {
        String::new()
    };
    format!(
        "[NOTE] This is the {} call in a row to \"{tool}\" with this input that gave the same result. If it keeps giving the same result, try a different approach.{block}",
        ordinal(count)
    )
}

fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// A size for people (`1.5 MiB`).
pub(crate) fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["bytes", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_examples() {
        assert_eq!(
            outcome_text(
                "build",
                &Status::Timeout {
                    kind: TimeoutKind::Idle,
                    after_ms: 10_000
                },
                None
            ),
            "[TIMEOUT] Tool \"build\" made no progress for 10s (idle timeout) and was cancelled. It may have partly run; check its effects before calling it again, or pass a larger idle_timeout_ms (--idle-timeout on the command line)."
        );
        assert!(
            outcome_text(
                "build",
                &Status::Timeout {
                    kind: TimeoutKind::Total,
                    after_ms: 30_000
                },
                None
            )
            .starts_with(
                "[TIMEOUT] Tool \"build\" exceeded its wall-clock limit of 30s and was cancelled. "
            )
        );
    }

    #[test]
    fn every_status_starts_with_its_tag() {
        let cases = [
            (
                Status::Cancelled {
                    reason: CancelReason::NotStarted,
                },
                "[CANCELLED]",
            ),
            (
                Status::Denied {
                    decider: Decider::Policy,
                    reason: DenyReason::Timeout,
                    retry_after_ms: None,
                },
                "[DENIED]",
            ),
            (
                Status::CircuitOpen {
                    retry_after_ms: 1200,
                },
                "[CIRCUIT OPEN]",
            ),
            (
                Status::Invalid {
                    reason: InvalidReason::Schema,
                },
                "[INVALID]",
            ),
            (
                Status::Error {
                    reason: ErrorReason::Crashed,
                },
                "[ERROR]",
            ),
        ];
        for (status, tag) in cases {
            assert!(
                outcome_text("t", &status, Some("x")).starts_with(tag),
                "{status:?}"
            );
        }
    }

    #[test]
    fn a_bare_detail_ends_as_a_sentence() {
        assert_eq!(
            outcome_text(
                "t",
                &Status::Error {
                    reason: ErrorReason::Transport
                },
                Some("connection refused")
            ),
            "[ERROR] Tool \"t\" could not be reached. connection refused. It may not have run; try again later."
        );
        assert_eq!(
            outcome_text(
                "t",
                &Status::Invalid {
                    reason: InvalidReason::UnknownTool
                },
                Some("Did you mean \"u\"?")
            ),
            "[INVALID] There is no tool named \"t\". Did you mean \"u\"?"
        );
    }

    #[test]
    fn ordinals_and_sizes() {
        assert_eq!(ordinal(3), "3rd");
        assert_eq!(ordinal(11), "11th");
        assert_eq!(ordinal(22), "22nd");
        assert_eq!(human_size(1536 * 1024), "1.5 MiB");
        assert_eq!(human_size(12), "12 bytes");
    }
}
