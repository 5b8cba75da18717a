//! The engine governing real MCP servers: deadlines, cancels, stuck servers, crashes and load,
//! end to end through `Engine` → `McpServer` → `tw-test-server` processes.
//!
//! Real processes run, so these tests use short real waits; they assert behaviour (outcomes,
//! events, process trees), never how fast something was.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use toolwarden_core::protocol::{
    CancelReason, ErrorReason, EventKind, Status, StopHow, TimeoutKind, ToolCall,
};
use toolwarden_core::{Config, Engine, Received, Subscription, TurnRequest};
use toolwarden_mcp::McpServer;
use toolwarden_testkit::{assert_all_gone, descendants, test_server_path};

/// An engine whose policies come from `policy` (TOML written into `[servers.t]`), with the
/// test server `t` started and ready.
async fn setup(policy: &str) -> (Engine, Arc<McpServer>) {
    let src = format!(
        "[servers.t]\ncommand = {:?}\nstartup_timeout = \"30s\"\n{policy}\n",
        test_server_path().display().to_string()
    );
    let config = Config::parse(&src, "test.toml", &|_| None).expect("config parses");
    let engine = Engine::builder().policies(Arc::new(config.clone())).build();
    let cfg = config.file.servers.get("t").cloned().expect("server t");
    let server = McpServer::start("t".into(), cfg, engine.host(true), std::env::temp_dir());
    server
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("the test server starts");
    (engine, server)
}

fn call(id: &str, tool: &str, input: Value) -> ToolCall {
    ToolCall::new(id, format!("t__{tool}"), input)
}

/// Events of one call until `until` matches one (or the time runs out).
async fn events_until(
    sub: &mut Subscription,
    call_id: &str,
    timeout: Duration,
    until: impl Fn(&EventKind) -> bool,
) -> Vec<EventKind> {
    let mut seen = Vec::new();
    let _ = tokio::time::timeout(timeout, async {
        while let Some(r) = sub.recv().await {
            let Received::Event(e) = r else { continue };
            if e.scope.call_id.as_ref().map(|c| c.as_str()) != Some(call_id) {
                continue;
            }
            let done = until(&e.kind);
            seen.push(e.kind.clone());
            if done {
                break;
            }
        }
    })
    .await;
    seen
}

fn text_of(result: &toolwarden_core::protocol::CallResult) -> String {
    result.text()
}

#[tokio::test]
async fn progress_keeps_a_call_alive_past_its_idle_timeout_but_not_past_its_total() {
    let (engine, server) = setup("idle_timeout = \"400ms\"\ntimeout = \"1500ms\"").await;
    let mut sub = engine.subscribe();
    // Progress every 100 ms for 10 s: alive the whole time, so only the total can stop it.
    let result = engine
        .call(
            "s",
            call("c1", "progress", json!({"every_ms": 100, "count": 100})),
        )
        .await;
    assert_eq!(
        result.outcome.status,
        Status::Timeout {
            kind: TimeoutKind::Total,
            after_ms: 1500
        }
    );
    let events = events_until(&mut sub, "c1", Duration::from_secs(5), |_| false).await;
    let progress = events
        .iter()
        .filter(|k| matches!(k, EventKind::ToolProgress { .. }))
        .count();
    assert!(progress >= 3, "progress events were relayed: {progress}");

    // Without progress, the idle deadline fires.
    let result = engine.call("s", call("c2", "hang", json!({}))).await;
    assert_eq!(
        result.outcome.status,
        Status::Timeout {
            kind: TimeoutKind::Idle,
            after_ms: 400
        }
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_cancel_reaches_the_server_for_that_request_only() {
    let (engine, server) = setup("cancel_grace = \"1s\"").await;
    let mut sub = engine.subscribe();
    let turn = engine
        .start_turn(TurnRequest::new(
            "s",
            vec![
                call("slow", "sleep", json!({"ms": 30_000})),
                call("other", "sleep", json!({"ms": 300})),
            ],
        ))
        .expect("turn starts");
    let turn_id = turn.turn_id().clone();
    tokio::time::sleep(Duration::from_millis(150)).await;
    engine
        .abort_call(&turn_id, &"slow".into(), CancelReason::User)
        .expect("the call is running");
    let done = turn.finish().await;
    assert_eq!(
        done.results[0].outcome.status,
        Status::Cancelled {
            reason: CancelReason::User
        }
    );
    assert_eq!(
        done.results[1].outcome.status,
        Status::Ok,
        "the other call went on"
    );

    // The server stopped cooperatively, and the cancel named that request.
    let events = events_until(&mut sub, "slow", Duration::from_secs(5), |k| {
        matches!(k, EventKind::ToolStopped { .. })
    })
    .await;
    assert!(
        events.iter().any(|k| matches!(
            k,
            EventKind::ToolStopped {
                how: StopHow::Cooperative,
                ..
            }
        )),
        "{events:?}"
    );
    let cancels = engine.call("s", call("q", "cancels", json!({}))).await;
    let listed: Value =
        serde_json::from_str(&text_of(&cancels)).expect("the cancels tool answers JSON");
    let entries = listed.as_array().cloned().unwrap_or_default();
    assert_eq!(
        entries.len(),
        1,
        "exactly one request was cancelled: {listed}"
    );
    assert_eq!(entries[0]["tool"], "sleep", "{listed}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_stuck_server_is_restarted_and_its_whole_process_tree_is_gone() {
    let (engine, server) =
        setup("on_stuck = \"restart\"\ncancel_grace = \"300ms\"\ntimeout = \"1s\"").await;
    let first_pid = text_of(&*engine.call("s", call("p1", "pid", json!({}))).await);
    let mut sub = engine.subscribe();
    // The grandchild reports its pid in progress messages and keeps the call busy past cancels.
    let result = engine
        .call(
            "s",
            call("g", "spawn_grandchild", json!({"progress_every_ms": 100})),
        )
        .await;
    assert_eq!(
        result.outcome.status,
        Status::Timeout {
            kind: TimeoutKind::Total,
            after_ms: 1000
        }
    );
    let events = events_until(&mut sub, "g", Duration::from_secs(10), |k| {
        matches!(k, EventKind::ToolStopped { .. })
    })
    .await;
    assert!(
        events.iter().any(|k| matches!(
            k,
            EventKind::ToolStopped {
                how: StopHow::Restarted,
                ..
            }
        )),
        "{events:?}"
    );
    // The grandchild announced itself in its progress messages: it must be gone too.
    let grandchild: u32 = events
        .iter()
        .find_map(|k| match k {
            EventKind::ToolProgress { progress, .. } => progress
                .message
                .as_deref()?
                .strip_prefix("grandchild pid ")?
                .parse()
                .ok(),
            _ => None,
        })
        .expect("the grandchild's pid was reported");
    let first: u32 = first_pid.trim().parse().expect("a pid");
    assert_all_gone(&[first, grandchild], Duration::from_secs(5)).await;
    assert!(descendants(first).is_empty());
    // The server is back, as a new process.
    server
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("the server is back up");
    let second_pid = text_of(&*engine.call("s", call("p2", "pid", json!({}))).await);
    assert_ne!(first_pid, second_pid);
    server.shutdown().await;
}

#[tokio::test]
async fn a_crash_mid_call_is_an_error_and_the_server_comes_back() {
    let (engine, server) = setup("").await;
    let result = engine
        .call("s", call("c", "crash", json!({"after_ms": 50})))
        .await;
    assert_eq!(
        result.outcome.status,
        Status::Error {
            reason: ErrorReason::Crashed
        }
    );
    assert!(
        text_of(&result).starts_with("[ERROR]"),
        "{}",
        text_of(&result)
    );
    server
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("the server is back up");
    let again = engine
        .call("s", call("e", "echo", json!({"text": "back"})))
        .await;
    assert_eq!(
        (again.outcome.status.clone(), text_of(&again)),
        (Status::Ok, "back".to_owned())
    );
    server.shutdown().await;
}

#[tokio::test]
async fn garbage_on_stdout_is_survived() {
    let (engine, server) = setup("").await;
    for mode in ["lines", "bad_shape"] {
        let _ = engine
            .call("s", call(mode, "garbage", json!({"mode": mode})))
            .await;
        let echo = engine
            .call(
                "s",
                call(&format!("e-{mode}"), "echo", json!({"text": mode})),
            )
            .await;
        assert_eq!(
            (echo.outcome.status.clone(), text_of(&echo)),
            (Status::Ok, mode.to_owned())
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_hundred_concurrent_calls_each_get_their_own_result() {
    let (engine, server) = setup("[servers.t.loop]\nwarn_after = 0\nblock_after = 0").await;
    let calls = (0..100)
        .map(|i| call(&format!("c{i}"), "echo", json!({"text": format!("n{i}")})))
        .collect();
    let out = engine
        .run_turn(TurnRequest::new("s", calls))
        .await
        .expect("turn runs");
    let texts: Vec<String> = out.results.iter().map(|r| text_of(r)).collect();
    let expected: Vec<String> = (0..100).map(|i| format!("n{i}")).collect();
    assert_eq!(texts, expected);
    assert!(out.results.iter().all(|r| r.outcome.status == Status::Ok));
    server.shutdown().await;
}
