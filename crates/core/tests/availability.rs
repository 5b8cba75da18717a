//! Calls wait for their server: a call for a server that is starting (or restarting) waits for
//! it, within the server's `startup_timeout` (and the call's own deadline hint, when it gives
//! one; the configured `timeout` counts from the first attempt); it is never answered "no such
//! tool" because the tool list is not loaded yet. A server that stays down past that ends the
//! call `error{transport}`; one that comes up without the tool ends it `invalid{unknown_tool}`;
//! one that cannot start (`failed`) ends it at once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio::time::Instant;
use toolwarden_core::protocol::{ServerStateKind, ToolSpec};
use toolwarden_core::{Attempt, AttemptEnd, Backend, BackendHost, BoxFuture, ToolOutput};

/// A server that answers every call with `ok from NAME`, after `ms` of its input (if any).
struct Answering;

impl Backend for Answering {
    fn name(&self) -> &str {
        "slow"
    }

    fn start(&self, attempt: Attempt) -> BoxFuture<AttemptEnd> {
        Box::pin(async move {
            let ms = attempt.input["ms"].as_u64().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            AttemptEnd::Done(Ok(ToolOutput::text(format!("ok from {}", attempt.tool))))
        })
    }
}

/// Declares server `slow` (tools prefixed) with a 20 s `startup_timeout`, and lists `tool` on it
/// `after` (then says it is up) — or never, for `None`.
fn slow_server(h: &Harness, after: Option<Duration>, tool: &'static str) -> Arc<dyn BackendHost> {
    let host = h.engine.host(true);
    host.server_declared("slow", Some(secs(20)));
    host.server_state("slow", ServerStateKind::Starting, None);
    if let Some(after) = after {
        let host = host.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let spec = ToolSpec::new(tool, "A slow server's tool", json!({"type": "object"}));
            host.set_tools("slow", Arc::new(Answering), vec![spec]);
            host.server_state("slow", ServerStateKind::Up, None);
        });
    }
    host
}

#[tokio::test(start_paused = true)]
async fn a_call_made_while_its_server_starts_waits_and_runs() {
    let mut h = Harness::new("");
    let _host = slow_server(&h, Some(secs(3)), "work");
    let start = Instant::now();
    let r = h.call("c1", "slow__work", json!({})).await;
    assert_eq!(r.text(), "ok from work");
    assert_eq!(status(&r), json!({"status": "ok", "call_id": "c1"}));
    assert_eq!(
        start.elapsed(),
        secs(3),
        "it ran as soon as the server was up"
    );
}

#[tokio::test(start_paused = true)]
async fn a_server_that_never_comes_up_ends_the_call_after_its_startup_timeout() {
    let mut h = Harness::new("");
    let host = slow_server(&h, None, "work");
    host.server_state(
        "slow",
        ServerStateKind::Down,
        Some("exited with status 1".into()),
    );
    let start = Instant::now();
    let r = h.call("c1", "slow__work", json!({})).await;
    assert_eq!(start.elapsed(), secs(20), "not before startup_timeout");
    check(
        &r,
        json!({"status": "error", "reason": "transport", "attempts": 0, "call_id": "c1",
               "tool": "slow__work", "duration_ms": 20_000,
               "detail": "MCP server \"slow\" was not up within 20s: exited with status 1"}),
        "[ERROR] Tool \"slow__work\" could not be reached. MCP server \"slow\" was not up within 20s: exited with status 1. It may not have run; try again later.",
    );
}

#[tokio::test(start_paused = true)]
async fn the_calls_own_deadline_bounds_the_wait() {
    let mut h = Harness::new("");
    let _host = slow_server(&h, None, "work");
    let start = Instant::now();
    let mut call = call("c1", "slow__work", json!({}));
    call.timeout_ms = Some(2000);
    let r = h.run(call).await;
    assert_eq!(start.elapsed(), secs(2));
    assert_eq!(
        status(&r),
        json!({"status": "error", "reason": "transport", "call_id": "c1"})
    );
}

#[tokio::test(start_paused = true)]
async fn a_configured_timeout_does_not_bound_the_wait_for_a_first_start() {
    // A server compiled or downloaded on first use takes longer than a call may run.
    let mut h = Harness::new("[defaults]\ntimeout = \"5s\"\n");
    let _host = slow_server(&h, Some(secs(12)), "work");
    let start = Instant::now();
    let r = h.call("c1", "slow__work", json!({})).await;
    assert_eq!(r.text(), "ok from work");
    assert_eq!(start.elapsed(), secs(12));
}

#[tokio::test(start_paused = true)]
async fn a_calls_deadlines_start_when_it_runs_not_while_it_waits_for_its_server() {
    // Its server takes 12 s to start; the call then runs 2 s, within every one of its
    // deadlines counted from its start — none counted from its arrival.
    let mut h = Harness::new(
        "[defaults]\ntimeout = \"5s\"\nidle_timeout = \"3s\"\nattempt_timeout = \"4s\"\n",
    );
    let _host = slow_server(&h, Some(secs(12)), "work");
    let start = Instant::now();
    let r = h.call("c1", "slow__work", json!({"ms": 2000})).await;
    assert_eq!(status(&r), json!({"status": "ok", "call_id": "c1"}));
    assert_eq!(start.elapsed(), secs(14));
    assert_eq!(
        r.outcome.duration_ms, 14_000,
        "the outcome's duration counts from arrival"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_for_a_server_that_cannot_start_ends_at_once() {
    let mut h = Harness::new("");
    let host = slow_server(&h, None, "work");
    host.server_state(
        "slow",
        ServerStateKind::Failed,
        Some("cannot run slowd: No such file or directory".into()),
    );
    let start = Instant::now();
    let r = h.call("c1", "slow__work", json!({})).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    check(
        &r,
        json!({"status": "error", "reason": "transport", "attempts": 0, "call_id": "c1",
               "tool": "slow__work", "duration_ms": 0,
               "detail": "MCP server \"slow\" cannot start: cannot run slowd: No such file or directory"}),
        "[ERROR] Tool \"slow__work\" could not be reached. MCP server \"slow\" cannot start: cannot run slowd: No such file or directory. It did not run. Its server cannot start until that is fixed, so calling it again now fails the same way; tell the user, or use another tool.",
    );
    // And one that is waiting when the server fails ends then.
    let host2 = slow_server(&h, None, "work");
    let handle = h.start(vec![call("c2", "slow__work", json!({}))]);
    tokio::time::sleep(secs(3)).await;
    host2.server_state("slow", ServerStateKind::Failed, Some("exited".into()));
    let out = handle.finish().await;
    assert_eq!(
        status(&out.results[0]),
        json!({"status": "error", "reason": "transport", "call_id": "c2"})
    );
    assert_eq!(start.elapsed(), secs(3));
}

#[tokio::test(start_paused = true)]
async fn a_server_that_comes_up_without_the_tool_makes_it_unknown() {
    let mut h = Harness::new("");
    let _host = slow_server(&h, Some(secs(1)), "other");
    let r = h.call("c1", "slow__work", json!({})).await;
    assert_eq!(
        status(&r),
        json!({"status": "invalid", "reason": "unknown_tool", "call_id": "c1"})
    );
    let detail = r.outcome.detail.as_deref().unwrap_or_default();
    assert!(detail.contains("slow__other"), "{detail}");
}

#[tokio::test(start_paused = true)]
async fn a_call_cancelled_while_it_waits_never_started() {
    let mut h = Harness::new("");
    let _host = slow_server(&h, None, "work");
    let handle = h.start(vec![call("c1", "slow__work", json!({}))]);
    tokio::time::sleep(secs(1)).await;
    h.engine
        .abort_turn(
            handle.turn_id(),
            toolwarden_core::protocol::CancelReason::User,
        )
        .unwrap();
    let out = handle.finish().await;
    assert_eq!(
        status(&out.results[0]),
        json!({"status": "cancelled", "reason": "not_started", "call_id": "c1"})
    );
}

#[tokio::test(start_paused = true)]
async fn a_name_no_declared_server_could_own_is_unknown_at_once() {
    let mut h = Harness::new("");
    let _host = slow_server(&h, None, "work");
    let start = Instant::now();
    let r = h.call("c1", "nosuch", json!({})).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(
        status(&r),
        json!({"status": "invalid", "reason": "unknown_tool", "call_id": "c1"})
    );
}
