//! docs/GOVERNANCE.md, "Cancellation": the caller's outcome comes at once; stopping the work
//! continues behind it and ends in one `tool_stopped` saying how (`cooperative`, `killed`,
//! `abandoned`).

mod common;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::time::{Instant, advance, sleep};
use toolwarden_core::protocol::CancelReason;

/// Starts a one-call turn, aborts it after `abort_after`, and returns its result and when it
/// came (from the start).
#[allow(clippy::unwrap_used)] // a test helper
async fn abort_after(
    h: &mut Harness,
    tool: &str,
    abort_after: std::time::Duration,
) -> (Value, std::time::Duration) {
    let t0 = Instant::now();
    let req = h.turn(vec![call("c1", tool, json!({"ms": 60_000}))]);
    let turn = h.engine.start_turn(req).unwrap();
    sleep(abort_after).await;
    h.engine
        .abort_turn(turn.turn_id(), CancelReason::User)
        .unwrap();
    let out = turn.finish().await;
    (status(&out.results[0]), t0.elapsed())
}

#[tokio::test(start_paused = true)]
async fn a_tool_that_honours_the_cancel_stops_cooperatively() {
    let mut h = Harness::new("");
    let (result, at) = abort_after(&mut h, "sleep", secs(1)).await;
    assert_eq!(
        result,
        json!({"status": "cancelled", "reason": "user", "call_id": "c1"})
    );
    assert_eq!(at, secs(1));
    let events = h.until("tool_stopped").await;
    assert_eq!(
        shapes(&events, "tool_stopped"),
        vec![
            json!({"type": "tool_stopped", "turn_id": "t1", "call_id": "c1", "tool": "sleep",
                    "how": "cooperative", "after_ms": 0})
        ]
    );
    assert_eq!(
        h.log.timeline(),
        vec![(0, "c1 start".into()), (1000, "c1 end".into())]
    );
}

#[tokio::test(start_paused = true)]
async fn an_async_tool_that_ignores_the_cancel_is_killed_after_cancel_grace() {
    let mut h = Harness::new(
        r#"
        [tools.stubborn]
        cancel_grace = "2s"
        "#,
    );
    let (result, at) = abort_after(&mut h, "stubborn", secs(1)).await;
    assert_eq!(
        result,
        json!({"status": "cancelled", "reason": "user", "call_id": "c1"})
    );
    assert_eq!(
        at,
        secs(1),
        "the caller's outcome does not wait for the stop"
    );
    let events = h.until("tool_stopped").await;
    assert_eq!(
        types(&events),
        vec![
            "turn_start",
            "tool_start",
            "turn_abort",
            "tool_result",
            "turn_end",
            "tool_stopped"
        ]
    );
    assert_eq!(
        shapes(&events, "tool_stopped"),
        vec![
            json!({"type": "tool_stopped", "turn_id": "t1", "call_id": "c1", "tool": "stubborn",
                    "how": "killed", "after_ms": 2000})
        ]
    );
    assert_eq!(
        h.log.timeline(),
        vec![(0, "c1 start".into()), (3000, "c1 end".into())],
        "its future was dropped when forced"
    );
}

#[tokio::test(start_paused = true)]
async fn a_blocking_tool_that_ignores_the_cancel_is_abandoned_until_it_returns() {
    let mut h = Harness::new(
        r#"
        [tools.blocking]
        timeout = "1s"
        cancel_grace = "2s"
        "#,
    );
    let abandoned =
        |h: &Harness| metric_lines(&h.engine.metrics().encode(), "toolwarden_abandoned_calls");
    let engine = h.engine.clone();
    let req = h.turn(vec![call("c1", "blocking", json!({}))]);
    let t0 = Instant::now();
    let turn = tokio::spawn(async move { engine.run_turn(req).await.unwrap() });
    h.blocking_started().await;
    // A running blocking task keeps tokio from advancing paused time by itself: move it by hand.
    advance(secs(1)).await;
    let out = turn.await.unwrap();
    assert_eq!(
        t0.elapsed(),
        secs(1),
        "the outcome does not wait for the thread"
    );
    assert_eq!(
        status(&out.results[0]),
        json!({"status": "timeout", "kind": "total", "after_ms": 1000, "call_id": "c1"})
    );
    advance(secs(2)).await;
    let events = h.until("tool_stopped").await;
    assert_eq!(
        shapes(&events, "tool_stopped"),
        vec![
            json!({"type": "tool_stopped", "turn_id": "t1", "call_id": "c1", "tool": "blocking",
                    "how": "abandoned", "after_ms": 2000})
        ]
    );
    assert_eq!(
        abandoned(&h),
        vec!["toolwarden_abandoned_calls{server=\"inprocess\"} 1"]
    );

    h.release_blocking();
    // Paused time cannot move until the thread has returned, so this sleep ends after it.
    sleep(ms(1)).await;
    assert_eq!(
        abandoned(&h),
        vec!["toolwarden_abandoned_calls{server=\"inprocess\"} 0"]
    );
    assert_eq!(
        h.log.timeline(),
        vec![(0, "c1 start".into()), (3000, "c1 end".into())],
        "the thread returned when released"
    );
    assert_eq!(types(&h.drain()), Vec::<&str>::new(), "nothing more to say");
}

/// How a `srv__late` call that times out at 5s (cancel_grace 2s) and answers at `answer_ms`
/// ends: `(tool_late_result after_ms, tool_stopped how, tool_stopped after_ms)`.
#[allow(clippy::unwrap_used)] // a test helper
async fn late_answer(answer_ms: u64) -> (Option<u64>, Value, u64) {
    let mut h = Harness::new(
        r#"
        [tools."srv__late"]
        timeout = "5s"
        cancel_grace = "2s"
        "#,
    );
    let r = h.call("c1", "srv__late", json!({"ms": answer_ms})).await;
    assert_eq!(
        status(&r),
        json!({"status": "timeout", "kind": "total", "after_ms": 5000, "call_id": "c1"})
    );
    let events = h.until("tool_stopped").await;
    let late = shapes(&events, "tool_late_result")
        .first()
        .map(|e| e["after_ms"].as_u64().unwrap());
    let stopped = shapes(&events, "tool_stopped").remove(0);
    (
        late,
        stopped["how"].clone(),
        stopped["after_ms"].as_u64().unwrap(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_answers_within_cancel_grace_stopped_cooperatively() {
    assert_eq!(
        late_answer(6000).await,
        (Some(1000), json!("cooperative"), 1000)
    );
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_answers_past_cancel_grace_was_still_working_and_is_abandoned() {
    // One that answers past cancel_grace was still working: it is abandoned.
    assert_eq!(
        late_answer(9000).await,
        (Some(4000), json!("abandoned"), 4000)
    );
}

#[tokio::test(start_paused = true)]
async fn a_backend_deaf_to_the_forced_stop_is_abandoned_after_waiting_for_it() {
    // Forced at 7s; the engine waits 5s more for the backend to say how it stopped.
    assert_eq!(late_answer(60_000).await, (None, json!("abandoned"), 7000));
}

/// A backend that cannot see the work stop (an MCP server that honours a cancel goes quiet) is
/// judged when the grace runs out: `cooperative`, `found_quiet`, `after_ms` the grace.
#[tokio::test(start_paused = true)]
async fn a_stop_found_quiet_at_the_grace_says_so() {
    let mut h = Harness::new(
        r#"
        [tools."srv__quiet"]
        timeout = "1s"
        cancel_grace = "2s"
        "#,
    );
    let r = h.call("c1", "srv__quiet", json!({})).await;
    assert_eq!(
        status(&r),
        json!({"status": "timeout", "kind": "total", "after_ms": 1000, "call_id": "c1"})
    );
    let events = h.until("tool_stopped").await;
    let stopped = shapes(&events, "tool_stopped").remove(0);
    assert_eq!(
        (
            &stopped["how"],
            &stopped["after_ms"],
            &stopped["found_quiet"]
        ),
        (&json!("cooperative"), &json!(2000), &json!(true))
    );
}

/// A tool that panics — in its function, in its future, or on its blocking thread — has crashed:
/// the call ends `error{crashed}` saying so, and the engine goes on.
#[tokio::test(start_paused = true)]
async fn a_panicking_tool_has_crashed_and_the_engine_goes_on() {
    use toolwarden_core::{InProcessTool, ToolError};
    let mut h = Harness::new("");
    let schema = || json!({"type": "object"});
    h.engine.register(InProcessTool::new(
        "panics_at_once",
        "Panics before returning its future",
        schema(),
        |_input, _ctx| -> std::future::Ready<Result<Value, ToolError>> {
            panic!("no future for you")
        },
    ));
    h.engine.register(InProcessTool::new(
        "panics_later",
        "Panics while it runs",
        schema(),
        |_input, _ctx| async move {
            sleep(ms(5)).await;
            if true {
                panic!("mid-way");
            }
            Ok::<Value, ToolError>(json!({}))
        },
    ));
    h.engine.register(InProcessTool::blocking(
        "panics_blocking",
        "Panics on its thread",
        schema(),
        |_input, _ctx| -> Result<Value, ToolError> { panic!("on the pool") },
    ));
    for (tool, message) in [
        ("panics_at_once", "no future for you"),
        ("panics_later", "mid-way"),
        ("panics_blocking", "on the pool"),
    ] {
        let result = h.call("c1", tool, json!({})).await;
        assert_eq!(
            status(&result),
            json!({"status": "error", "reason": "crashed", "call_id": "c1"}),
            "{tool}"
        );
        let text = serde_json::to_string(&result.content).unwrap();
        assert!(text.contains(message), "{tool}: {text}");
    }
    let after = h.call("c2", "sleep", json!({"ms": 1})).await;
    assert_eq!(status(&after)["status"], "ok");
}
