//! `toolwarden__status`: how the session's calls are doing, for the model. The gateway answers
//! it itself, ungoverned (it cannot hang), from the engine's view of the session.

use std::fmt::Write as _;

use rmcp::model::{CallToolResult, ContentBlock};
use toolwarden_core::Engine;
use toolwarden_protocol::{
    BreakerStateKind, CallState, ServerStateKind, SessionKey, SessionStatus, Status,
    format_duration,
};

/// The status tool's answer: text the model can use, and the [`SessionStatus`] as structured
/// content.
pub(crate) fn result(engine: &Engine, session: &SessionKey) -> CallToolResult {
    let status = engine
        .session_status(session)
        .unwrap_or_else(|| SessionStatus {
            session_id: session.id.clone(),
            running: Vec::new(),
            counts: Default::default(),
            timed_out_tools: Default::default(),
            recent_failures: Vec::new(),
            open_breakers: engine.open_breakers(),
            servers_not_up: engine.servers_not_up(),
        });
    let mut r = CallToolResult::success(vec![ContentBlock::text(text(&status))]);
    r.structured_content = serde_json::to_value(&status).ok();
    r
}

fn ms(ms: u64) -> String {
    format_duration(std::time::Duration::from_millis(ms))
}

/// The status in words.
pub(crate) fn text(s: &SessionStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "toolwarden status of this session ({}).", s.session_id);
    if s.running.is_empty() {
        out.push_str("Running now: nothing.\n");
    } else {
        let _ = writeln!(out, "Running now ({}):", s.running.len());
        for r in &s.running {
            let c = &r.call;
            let state = match c.state {
                CallState::Queued => "queued".to_owned(),
                CallState::AwaitingApproval => "waiting for a person's approval".to_owned(),
                CallState::Waiting => "waiting for its turn".to_owned(),
                CallState::Running => format!(
                    "running for {}{}",
                    ms(c.elapsed_ms),
                    if c.attempt > 1 {
                        format!(" (attempt {})", c.attempt)
                    } else {
                        String::new()
                    }
                ),
                CallState::Backoff => format!("waiting to retry (attempt {} failed)", c.attempt),
                CallState::Done => "finishing".to_owned(),
            };
            let _ = write!(out, "- {} (call {}): {state}", c.tool, c.call_id);
            if let Some(p) = &c.progress {
                let mut parts = Vec::new();
                match (p.progress, p.total) {
                    (Some(done), Some(total)) => parts.push(format!("{done}/{total}")),
                    (Some(done), None) => parts.push(format!("{done}")),
                    _ => {}
                }
                if let Some(m) = &p.message {
                    parts.push(format!("{m:?}"));
                }
                if !parts.is_empty() {
                    let _ = write!(out, "; last progress {}", parts.join(" "));
                }
            }
            out.push('\n');
        }
    }
    let finished: u64 = s.counts.values().sum();
    if finished == 0 {
        out.push_str("Finished calls: none yet.\n");
    } else {
        let counts: Vec<String> = s.counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
        let _ = writeln!(out, "Finished calls: {}.", counts.join(", "));
    }
    if !s.timed_out_tools.is_empty() {
        let tools: Vec<String> = s
            .timed_out_tools
            .iter()
            .map(|(tool, n)| format!("{tool} ({n}×)"))
            .collect();
        let _ = writeln!(
            out,
            "Tools that timed out: {}. Before calling one again, check what it did, and pass a \
             larger timeout_ms in _meta if it needs longer.",
            tools.join(", ")
        );
    }
    if !s.recent_failures.is_empty() {
        out.push_str("Recent failures (newest last):\n");
        for f in &s.recent_failures {
            let what = match &f.status {
                Status::Ok => "ok".to_owned(),
                Status::Error { reason } => format!("error ({})", reason.as_str()),
                Status::Timeout { kind, after_ms } => {
                    format!("timeout ({}, after {})", kind.as_str(), ms(*after_ms))
                }
                Status::Cancelled { reason } => format!("cancelled ({})", reason.as_str()),
                Status::Denied {
                    decider,
                    reason,
                    retry_after_ms,
                } => match retry_after_ms {
                    Some(after) => format!(
                        "denied ({}, {}, retry after {})",
                        decider.as_str(),
                        reason.as_str(),
                        ms(*after)
                    ),
                    None => format!("denied ({}, {})", decider.as_str(), reason.as_str()),
                },
                Status::CircuitOpen { retry_after_ms } => {
                    format!("circuit open (retry after {})", ms(*retry_after_ms))
                }
                Status::Invalid { reason } => format!("invalid ({})", reason.as_str()),
                Status::Interrupted => "interrupted".to_owned(),
            };
            let _ = writeln!(
                out,
                "- {} (call {}): {what}, at {}",
                f.tool, f.call_id, f.at
            );
        }
    }
    if !s.servers_not_up.is_empty() {
        out.push_str("Servers not up:\n");
        for (name, server) in &s.servers_not_up {
            let what = match server.state {
                ServerStateKind::Failed => {
                    "cannot start (its tools fail at once until it is fixed)"
                }
                ServerStateKind::Starting => "starting (calls of its tools wait for it)",
                _ => "down (calls of its tools wait for it to come back)",
            };
            let why = server
                .detail
                .as_deref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default();
            let _ = writeln!(out, "- {name}: {what}{why}");
        }
    }
    if s.open_breakers.is_empty() {
        out.push_str("Circuit breakers: all closed.\n");
    } else {
        out.push_str("Circuit breakers not closed (calls to these tools fail fast):\n");
        for b in &s.open_breakers {
            match (b.state, b.retry_after_ms) {
                (BreakerStateKind::Open, Some(left)) => {
                    let _ = writeln!(out, "- {}: open for {} more", b.tool, ms(left));
                }
                (BreakerStateKind::HalfOpen, _) => {
                    let _ = writeln!(out, "- {}: half-open (the next call is a probe)", b.tool);
                }
                _ => {
                    let _ = writeln!(out, "- {}: open", b.tool);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use toolwarden_protocol::{
        ActiveCall, BreakerInfo, ProgressInfo, RecentCall, RunningCall, TimeoutKind, Timestamp,
    };

    #[test]
    fn an_empty_session_says_so() {
        let s = SessionStatus {
            session_id: "mcp_1".into(),
            running: Vec::new(),
            counts: Default::default(),
            timed_out_tools: Default::default(),
            recent_failures: Vec::new(),
            open_breakers: Vec::new(),
            servers_not_up: Default::default(),
        };
        assert_eq!(
            text(&s),
            "toolwarden status of this session (mcp_1).\nRunning now: nothing.\n\
             Finished calls: none yet.\nCircuit breakers: all closed.\n"
        );
    }

    #[test]
    fn a_busy_session_names_calls_timeouts_failures_and_breakers() {
        let at = Timestamp::now();
        let s = SessionStatus {
            session_id: "mcp_1".into(),
            running: vec![RunningCall {
                turn_id: "t_1".into(),
                call: ActiveCall {
                    call_id: "3".into(),
                    tool: "s__build".into(),
                    state: CallState::Running,
                    elapsed_ms: 12_000,
                    attempt: 1,
                    progress: Some(ProgressInfo {
                        progress: Some(3.0),
                        total: Some(10.0),
                        message: Some("step 3".into()),
                    }),
                    status: None,
                },
            }],
            counts: [("ok".to_owned(), 2), ("timeout".to_owned(), 1)]
                .into_iter()
                .collect(),
            timed_out_tools: [("s__slow".to_owned(), 1)].into_iter().collect(),
            recent_failures: vec![
                RecentCall {
                    call_id: "1".into(),
                    turn_id: "t_0".into(),
                    tool: "s__slow".into(),
                    status: Status::Timeout {
                        kind: TimeoutKind::Total,
                        after_ms: 30_000,
                    },
                    at,
                },
                RecentCall {
                    call_id: "2".into(),
                    turn_id: "t_0".into(),
                    tool: "t__nope".into(),
                    status: Status::Invalid {
                        reason: toolwarden_protocol::InvalidReason::UnknownTool,
                    },
                    at,
                },
            ],
            open_breakers: vec![BreakerInfo {
                tool: "s__flaky".into(),
                state: BreakerStateKind::Open,
                retry_after_ms: Some(5_000),
            }],
            servers_not_up: [(
                "t".to_owned(),
                toolwarden_protocol::ServerNotUp {
                    state: ServerStateKind::Failed,
                    detail: Some("cannot run nope: No such file or directory".into()),
                },
            )]
            .into_iter()
            .collect(),
        };
        let t = text(&s);
        for needle in [
            "Running now (1):",
            "- s__build (call 3): running for 12s; last progress 3/10 \"step 3\"",
            "Finished calls: 2 ok, 1 timeout.",
            "Tools that timed out: s__slow (1×).",
            "- s__slow (call 1): timeout (total, after 30s)",
            "- s__flaky: open for 5s more",
            "- t__nope (call 2): invalid (unknown_tool)",
            "- t: cannot start (its tools fail at once until it is fixed): cannot run nope: No such file or directory",
        ] {
            assert!(t.contains(needle), "{needle:?} is missing from:\n{t}");
        }
    }
}
