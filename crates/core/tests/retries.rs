//! docs/GOVERNANCE.md, "Retries": retries only for idempotent tools and retryable failures, with
//! capped exponential backoff and full jitter, never past the total deadline.

mod common;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::time::Instant;

/// The `(attempt, delay_ms, cause)` of each `tool_retry`.
fn retries(h: &mut Harness) -> Vec<(u64, u64, String)> {
    shapes(&h.drain(), "tool_retry")
        .into_iter()
        .map(|e| {
            (
                e["attempt"].as_u64().unwrap_or_default(),
                e["delay_ms"].as_u64().unwrap_or_default(),
                e["cause"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

const FLAKY: &str = r#"
[tools."srv__flaky"]
idempotent = true
retries = 3
backoff = { initial = "200ms", max = "5s", multiplier = 2.0 }
"#;

#[tokio::test(start_paused = true)]
async fn transport_errors_are_retried_with_jittered_backoff() {
    let mut h = Harness::new(FLAKY);
    let t0 = Instant::now();
    let r = h.call("c1", "srv__flaky", json!({"fail": 2})).await;
    assert_eq!(r.text(), "ok on attempt 3");
    assert_eq!(r.outcome.attempts, 3);
    let retries = retries(&mut h);
    assert_eq!(
        retries
            .iter()
            .map(|(attempt, _, cause)| (*attempt, cause.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (2, "transport: run 1 failed"),
            (3, "transport: run 2 failed")
        ]
    );
    let delays: Vec<u64> = retries.iter().map(|r| r.1).collect();
    assert!(
        delays[0] <= 200 && delays[1] <= 400,
        "within the caps: {delays:?}"
    );
    assert_eq!(
        t0.elapsed(),
        ms(delays.iter().sum()),
        "the backoff is slept"
    );
    assert_eq!(h.log.runs("srv__flaky"), 3);
}

#[tokio::test(start_paused = true)]
async fn each_delay_stays_within_its_full_jitter_cap() {
    let mut h = Harness::new(
        r#"
        [tools."srv__flaky"]
        idempotent = true
        retries = 6
        backoff = { initial = "100ms", max = "1s", multiplier = 3.0 }
        "#,
    );
    let t0 = Instant::now();
    let r = h.call("c1", "srv__flaky", json!({"fail": 6})).await;
    assert_eq!(r.outcome.attempts, 7);
    let delays: Vec<u64> = retries(&mut h).iter().map(|r| r.1).collect();
    // min(max, initial · multiplier^n)
    let caps = [100, 300, 900, 1000, 1000, 1000];
    assert_eq!(delays.len(), caps.len());
    for (delay, cap) in delays.iter().zip(caps) {
        assert!(*delay <= cap, "{delays:?} within {caps:?}");
    }
    assert!(
        delays.windows(2).any(|w| w[0] != w[1]),
        "jittered: {delays:?}"
    );
    assert_eq!(t0.elapsed(), ms(delays.iter().sum()));
}

#[tokio::test(start_paused = true)]
async fn crashes_are_retried() {
    let mut h = Harness::new(FLAKY);
    let r = h
        .call("c1", "srv__flaky", json!({"fail": 1, "error": "crashed"}))
        .await;
    assert_eq!(
        (r.text(), r.outcome.attempts),
        ("ok on attempt 2".into(), 2)
    );
    assert_eq!(retries(&mut h)[0].2, "crashed: run 1 failed");
}

#[tokio::test(start_paused = true)]
async fn a_tool_that_is_not_idempotent_is_never_retried() {
    let mut h = Harness::new(
        r#"
        [tools."srv__flaky"]
        retries = 3
        "#,
    );
    let r = h.call("c1", "srv__flaky", json!({"fail": 1})).await;
    check(
        &r,
        json!({"status": "error", "reason": "transport", "attempts": 1, "call_id": "c1",
               "tool": "srv__flaky", "duration_ms": 0, "detail": "run 1 failed"}),
        "[ERROR] Tool \"srv__flaky\" could not be reached. run 1 failed. It may not have run; try again later.",
    );
    assert_eq!(retries(&mut h), vec![]);
}

#[tokio::test(start_paused = true)]
async fn retries_end_with_the_last_failure() {
    let mut h = Harness::new(FLAKY);
    let r = h.call("c1", "srv__flaky", json!({"fail": 10})).await;
    assert_eq!(
        (status(&r), r.outcome.attempts, r.outcome.detail.clone()),
        (
            json!({"status": "error", "reason": "transport", "call_id": "c1"}),
            4,
            Some("run 4 failed".into())
        )
    );
}

#[tokio::test(start_paused = true)]
async fn a_tools_own_error_is_retried_only_with_retry_on_tool_error() {
    for (retry_on_tool_error, attempts) in [(false, 1), (true, 3)] {
        let mut h = Harness::new(&format!(
            r#"
            [tools.fail]
            idempotent = true
            retries = 2
            retry_on_tool_error = {retry_on_tool_error}
            "#
        ));
        let r = h.call("c1", "fail", json!({})).await;
        let expected: Value = json!({"status": "error", "reason": "tool_error", "call_id": "c1"});
        assert_eq!(
            (status(&r), r.text(), r.outcome.attempts),
            (expected, "disk full".into(), attempts),
            "retry_on_tool_error = {retry_on_tool_error}"
        );
        assert_eq!(h.log.runs("fail"), attempts);
    }
}

#[tokio::test(start_paused = true)]
async fn the_total_and_idle_deadlines_are_never_retried() {
    let mut h = Harness::new(
        r#"
        [tools.ticker]
        idempotent = true
        retries = 3
        idle_timeout = "1s"

        [tools.sleep]
        idempotent = true
        retries = 3
        timeout = "1s"
        "#,
    );
    let r = h
        .call("c1", "ticker", json!({"every_ms": 5000, "ms": 10_000}))
        .await;
    assert_eq!(
        (status(&r), r.outcome.attempts),
        (
            json!({"status": "timeout", "kind": "idle", "after_ms": 1000, "call_id": "c1"}),
            1
        )
    );
    let r = h.call("c2", "sleep", json!({"ms": 10_000})).await;
    assert_eq!(
        (status(&r), r.outcome.attempts),
        (
            json!({"status": "timeout", "kind": "total", "after_ms": 1000, "call_id": "c2"}),
            1
        )
    );
    assert_eq!(retries(&mut h), vec![]);
}

#[tokio::test(start_paused = true)]
async fn no_retry_starts_if_its_backoff_would_end_past_the_total_deadline() {
    let mut h = Harness::new(
        r#"
        [tools."srv__flaky"]
        idempotent = true
        retries = 3
        timeout = "1s"
        backoff = { initial = "60s", max = "60s" }
        "#,
    );
    // The first attempt fails 10ms before the deadline; any backoff above 10ms ends past it.
    let r = h
        .call("c1", "srv__flaky", json!({"fail": 1, "ms": 990}))
        .await;
    assert_eq!(
        (status(&r), r.outcome.attempts, r.outcome.duration_ms),
        (
            json!({"status": "error", "reason": "transport", "call_id": "c1"}),
            1,
            990
        )
    );
    assert_eq!(retries(&mut h), vec![]);
}

#[tokio::test(start_paused = true)]
async fn a_call_cancelled_during_its_backoff_is_not_retried() {
    let mut h = Harness::new(
        r#"
        [tools."srv__flaky"]
        idempotent = true
        retries = 3
        backoff = { initial = "10s", max = "10s", multiplier = 1.0 }
        "#,
    );
    let turn = h.start(vec![call("c1", "srv__flaky", json!({"fail": 3}))]);
    h.until("tool_retry").await;
    h.engine
        .abort_turn(
            turn.turn_id(),
            toolwarden_core::protocol::CancelReason::User,
        )
        .unwrap();
    let r = &turn.finish().await.results[0];
    assert_eq!(
        (status(r), r.outcome.attempts),
        (
            json!({"status": "cancelled", "reason": "user", "call_id": "c1"}),
            1
        )
    );
    assert_eq!(h.log.runs("srv__flaky"), 1);
}
