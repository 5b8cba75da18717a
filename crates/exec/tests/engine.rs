//! The `exec` tool governed by the engine: a deadline ends the call at once, and the command's
//! whole process tree is stopped behind it.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers")]

use std::sync::Arc;
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::json;
use toolwarden_core::protocol::{
    CancelReason, EventKind, ExecConfig, Status, StopHow, TimeoutKind, ToolCall,
};
use toolwarden_core::{Config, Engine, Received, ToolOrigin, TurnRequest};
use toolwarden_exec::{ExecBackend, ExecSettings};
use toolwarden_process::{descendants, group_members};

fn engine(dir: &std::path::Path, policy: &str) -> Engine {
    let config = Config::parse(
        &format!("[exec]\nenabled = true\n{policy}\n"),
        "test.toml",
        &|_| None,
    )
    .unwrap();
    let engine = Engine::builder().policies(Arc::new(config)).build();
    let settings = ExecSettings::from_config(
        &ExecConfig {
            enabled: true,
            ..Default::default()
        },
        dir,
    )
    .unwrap();
    engine.add_tools(
        ToolOrigin::Exec,
        Arc::new(ExecBackend::new(settings)),
        vec![ExecBackend::tool_spec()],
    );
    engine
}

/// Waits for the call's `tool_stopped` and returns how it stopped.
async fn stopped(sub: &mut toolwarden_core::Subscription, call_id: &str) -> StopHow {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(Received::Event(e)) = sub.recv().await
                && e.scope
                    .call_id
                    .as_ref()
                    .is_some_and(|c| c.as_str() == call_id)
                && let EventKind::ToolStopped { how, .. } = e.kind
            {
                return how;
            }
        }
    })
    .await
    .expect("tool_stopped arrives")
}

/// Reads the pids a command wrote to `file` (one per line).
fn pids(file: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

async fn all_gone(pids: &[u32]) {
    for _ in 0..200 {
        if pids
            .iter()
            .all(|p| group_members(*p).is_empty() && descendants(*p).is_empty() && !alive(*p))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("processes still running: {pids:?}");
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn a_timeout_ends_the_call_at_once_and_stops_the_whole_tree() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path(), "timeout = \"500ms\"\ncancel_grace = \"300ms\"");
    let mut sub = engine.subscribe();
    let pidfile = dir.path().join("pids");
    // A shell with two grandchildren; one ignores SIGTERM.
    let command = format!(
        "echo $$ >> {p}; (trap '' TERM; sleep 60) & echo $! >> {p}; sleep 60 & echo $! >> {p}; wait",
        p = pidfile.display()
    );
    let result = engine
        .call(
            "s",
            ToolCall::new("c1", "exec", json!({"command": command})),
        )
        .await;
    assert_eq!(
        result.outcome.status,
        Status::Timeout {
            kind: TimeoutKind::Total,
            after_ms: 500
        }
    );
    let how = stopped(&mut sub, "c1").await;
    assert_eq!(
        how,
        StopHow::Killed,
        "a grandchild ignored SIGTERM, so the group was killed"
    );
    let started = pids(&pidfile);
    assert_eq!(
        started.len(),
        3,
        "the shell and its two grandchildren ran: {started:?}"
    );
    all_gone(&started).await;
}

#[tokio::test]
async fn an_abort_stops_a_command_cooperatively() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path(), "cancel_grace = \"2s\"");
    let mut sub = engine.subscribe();
    let pidfile = dir.path().join("pids");
    let command = format!(
        "echo $$ >> {p}; sleep 60 & echo $! >> {p}; wait",
        p = pidfile.display()
    );
    let turn = engine
        .start_turn(TurnRequest::new(
            "s",
            vec![ToolCall::new("c1", "exec", json!({"command": command}))],
        ))
        .unwrap();
    for _ in 0..200 {
        if pids(&pidfile).len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    engine
        .abort_turn(turn.turn_id(), CancelReason::User)
        .unwrap();
    let out = turn.finish().await;
    assert_eq!(
        out.results[0].outcome.status,
        Status::Cancelled {
            reason: CancelReason::User
        }
    );
    assert_eq!(stopped(&mut sub, "c1").await, StopHow::Cooperative);
    all_gone(&pids(&pidfile)).await;
}

#[tokio::test]
async fn output_keeps_a_command_alive_past_its_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path(), "idle_timeout = \"300ms\"\ntimeout = \"10s\"");
    // Prints every 100 ms for ~1 s: never idle for 300 ms.
    let result = engine
        .call(
            "s",
            ToolCall::new(
                "c1",
                "exec",
                json!({"command": "for i in 1 2 3 4 5 6 7 8 9 10; do echo $i; sleep 0.1; done"}),
            ),
        )
        .await;
    assert_eq!(result.outcome.status, Status::Ok, "{}", result.text());
    // Silent for longer than the idle timeout: stopped.
    let result = engine
        .call(
            "s",
            ToolCall::new("c2", "exec", json!({"command": "sleep 5"})),
        )
        .await;
    assert_eq!(
        result.outcome.status,
        Status::Timeout {
            kind: TimeoutKind::Idle,
            after_ms: 300
        }
    );
}
