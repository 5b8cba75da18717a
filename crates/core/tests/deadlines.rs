//! docs/GOVERNANCE.md, "Deadlines": total, idle and attempt deadlines, `0` disables, per-call
//! hints, and an outcome that is final at its deadline.

mod common;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio::time::Instant;

const MAY_HAVE_RUN: &str = "It may have partly run; check its effects before calling it again, or pass a larger timeout_ms.";
const MAY_HAVE_RUN_IDLE: &str = "It may have partly run; check its effects before calling it again, or pass a larger idle_timeout_ms (--idle-timeout on the command line).";

#[tokio::test(start_paused = true)]
async fn the_total_timeout_ends_the_call_at_its_deadline() {
    let mut h = Harness::new(
        r#"
        [tools.sleep]
        timeout = "5s"
        "#,
    );
    let t0 = Instant::now();
    let r = h.call("c1", "sleep", json!({"ms": 60_000})).await;
    assert_eq!(t0.elapsed(), secs(5));
    check(
        &r,
        json!({"status": "timeout", "kind": "total", "after_ms": 5000, "attempts": 1,
               "call_id": "c1", "tool": "sleep", "duration_ms": 5000}),
        &format!(
            "[TIMEOUT] Tool \"sleep\" exceeded its wall-clock limit of 5s and was cancelled. {MAY_HAVE_RUN}"
        ),
    );
    h.until("tool_stopped").await;
    assert_eq!(
        h.log.timeline(),
        vec![(0, "c1 start".into()), (5000, "c1 end".into())],
        "the tool was stopped at the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn heartbeats_push_the_idle_deadline_forward() {
    let mut h = Harness::new(
        r#"
        [tools.ticker]
        idle_timeout = "3s"
        "#,
    );
    // Progress every second outlives ten seconds of work.
    let r = h
        .call("c1", "ticker", json!({"every_ms": 1000, "ms": 10_000}))
        .await;
    check(
        &r,
        json!({"status": "ok", "attempts": 1, "call_id": "c1", "tool": "ticker",
               "duration_ms": 10_000, "provenance": {"source": "tool", "cache_hit": false,
               "digest": r.outcome.provenance.as_ref().unwrap().digest}}),
        "ticked 9 times",
    );
    // So do bare heartbeats (no progress numbers).
    let r = h
        .call(
            "c2",
            "ticker",
            json!({"every_ms": 2500, "ms": 10_000, "beat": true}),
        )
        .await;
    assert_eq!(status(&r), json!({"status": "ok", "call_id": "c2"}));
}

#[tokio::test(start_paused = true)]
async fn a_silent_call_times_out_idle() {
    let mut h = Harness::new(
        r#"
        [tools.ticker]
        idle_timeout = "3s"
        "#,
    );
    let t0 = Instant::now();
    // Two ticks, then nothing for five seconds.
    let r = h
        .call("c1", "ticker", json!({"every_ms": 1000, "ms": 2000}))
        .await;
    assert_eq!(status(&r), json!({"status": "ok", "call_id": "c1"}));
    let r = h
        .call("c2", "ticker", json!({"every_ms": 5000, "ms": 10_000}))
        .await;
    assert_eq!(t0.elapsed(), secs(2 + 3));
    check(
        &r,
        json!({"status": "timeout", "kind": "idle", "after_ms": 3000, "attempts": 1,
               "call_id": "c2", "tool": "ticker", "duration_ms": 3000}),
        &format!(
            "[TIMEOUT] Tool \"ticker\" made no progress for 3s (idle timeout) and was cancelled. {MAY_HAVE_RUN_IDLE}"
        ),
    );
}

#[tokio::test(start_paused = true)]
async fn heartbeats_do_not_outlive_the_total_timeout() {
    let mut h = Harness::new(
        r#"
        [tools.ticker]
        idle_timeout = "3s"
        timeout = "6s"
        "#,
    );
    let r = h
        .call("c1", "ticker", json!({"every_ms": 1000, "ms": 10_000}))
        .await;
    assert_eq!(
        status(&r),
        json!({"status": "timeout", "kind": "total", "after_ms": 6000, "call_id": "c1"})
    );
    assert_eq!(r.outcome.duration_ms, 6000);
}

#[tokio::test(start_paused = true)]
async fn zero_disables_each_deadline() {
    let mut h = Harness::new(
        r#"
        [tools.sleep]
        timeout = "0s"

        [tools.ticker]
        timeout = "0s"
        idle_timeout = "0s"
        "#,
    );
    // No total cap: three hours of work end ok.
    let r = h.call("c1", "sleep", json!({"ms": 3 * 3600 * 1000})).await;
    assert_eq!(status(&r), json!({"status": "ok", "call_id": "c1"}));
    assert_eq!(r.outcome.duration_ms, 3 * 3600 * 1000);
    // No idle cap: an hour without a heartbeat ends ok.
    let r = h
        .call(
            "c2",
            "ticker",
            json!({"every_ms": 3_600_000, "ms": 3_600_000}),
        )
        .await;
    assert_eq!(status(&r), json!({"status": "ok", "call_id": "c2"}));
}

#[tokio::test(start_paused = true)]
async fn a_timeout_ms_hint_replaces_the_timeout_clamped_to_max_timeout() {
    let mut h = Harness::new(
        r#"
        [tools.sleep]
        timeout = "10s"
        max_timeout = "20s"
        "#,
    );
    // (hint, work, expected status)
    let cases = [
        (
            2_000,
            60_000,
            json!({"status": "timeout", "kind": "total", "after_ms": 2000}),
        ),
        (
            15_000,
            12_000,
            json!({"status": "ok"}), // longer than the policy's 10s: the hint replaces it
        ),
        (
            60_000,
            60_000,
            json!({"status": "timeout", "kind": "total", "after_ms": 20_000}),
        ),
    ];
    for (i, (hint, work, mut expected)) in cases.into_iter().enumerate() {
        let id = format!("c{i}");
        let t0 = Instant::now();
        let r = h
            .run(call(&id, "sleep", json!({"ms": work})).with_timeout_ms(hint))
            .await;
        expected["call_id"] = json!(id);
        assert_eq!(status(&r), expected, "hint {hint}ms, work {work}ms");
        let took = if expected["status"] == "ok" {
            work
        } else {
            expected["after_ms"].as_u64().unwrap()
        };
        assert_eq!(t0.elapsed(), ms(took), "hint {hint}ms, work {work}ms");
    }
}

#[tokio::test(start_paused = true)]
async fn an_attempt_timeout_is_retried_for_idempotent_tools() {
    let mut h = Harness::new(
        r#"
        [tools."srv__flaky"]
        attempt_timeout = "1s"
        idempotent = true
        retries = 2
        backoff = { initial = "100ms", max = "100ms" }
        "#,
    );
    // The first attempt never answers; the second answers at once.
    let t0 = Instant::now();
    let r = h.call("c1", "srv__flaky", json!({"hang": 1})).await;
    check(
        &r,
        json!({"status": "ok", "attempts": 2, "call_id": "c1", "tool": "srv__flaky",
               "duration_ms": t0.elapsed().as_millis() as u64,
               "provenance": {"source": "tool", "cache_hit": false,
               "digest": r.outcome.provenance.as_ref().unwrap().digest}}),
        "ok on attempt 2",
    );
    let events = h.drain();
    let retry = shapes(&events, "tool_retry");
    let delay = retry[0]["delay_ms"].as_u64().unwrap();
    assert!(delay <= 100, "full jitter within the cap: {delay}");
    assert_eq!(t0.elapsed(), ms(1000 + delay));
    assert_eq!(
        shapes(&events, "tool_timeout"),
        vec![
            json!({"type": "tool_timeout", "turn_id": "t1", "call_id": "c1",
                    "tool": "srv__flaky", "kind": "attempt", "after_ms": 1000})
        ]
    );
    assert_eq!(
        retry,
        vec![
            json!({"type": "tool_retry", "turn_id": "t1", "call_id": "c1", "tool": "srv__flaky",
                    "attempt": 2, "delay_ms": delay, "cause": "attempt timeout after 1s"})
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_attempt_timeout_of_a_tool_that_is_not_idempotent_ends_the_call() {
    let mut h = Harness::new(
        r#"
        [tools."srv__flaky"]
        attempt_timeout = "1s"
        retries = 2
        "#,
    );
    let r = h.call("c1", "srv__flaky", json!({"hang": 1})).await;
    check(
        &r,
        json!({"status": "timeout", "kind": "attempt", "after_ms": 1000, "attempts": 1,
               "call_id": "c1", "tool": "srv__flaky", "duration_ms": 1000}),
        &format!(
            "[TIMEOUT] Tool \"srv__flaky\" did not finish an attempt within 1s (attempt timeout) and was cancelled. {MAY_HAVE_RUN}"
        ),
    );
}

#[tokio::test(start_paused = true)]
async fn the_outcome_comes_at_the_deadline_not_after_cancel_grace() {
    let mut h = Harness::new(
        r#"
        [tools.stubborn]
        timeout = "5s"
        cancel_grace = "2s"
        "#,
    );
    let t0 = Instant::now();
    let r = h.call("c1", "stubborn", json!({})).await;
    assert_eq!(
        t0.elapsed(),
        secs(5),
        "the caller does not wait for the stop"
    );
    assert_eq!(
        status(&r),
        json!({"status": "timeout", "kind": "total", "after_ms": 5000, "call_id": "c1"})
    );
    let events = h.until("tool_stopped").await;
    assert_eq!(t0.elapsed(), secs(5 + 2), "forced after cancel_grace");
    assert_eq!(
        shapes(&events, "tool_stopped"),
        vec![
            json!({"type": "tool_stopped", "turn_id": "t1", "call_id": "c1", "tool": "stubborn",
                    "how": "killed", "after_ms": 2000})
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_late_result_is_recorded_and_discarded() {
    let mut h = Harness::new(
        r#"
        [tools."srv__late"]
        timeout = "5s"
        cancel_grace = "2s"
        "#,
    );
    // The server ignores the cancel and answers a second after the deadline.
    let t0 = Instant::now();
    let r = h.call("c1", "srv__late", json!({"ms": 6000})).await;
    assert_eq!(t0.elapsed(), secs(5));
    let decided = r.clone();
    assert_eq!(
        status(&r),
        json!({"status": "timeout", "kind": "total", "after_ms": 5000, "call_id": "c1"})
    );
    let events = h.until("tool_stopped").await;
    assert_eq!(t0.elapsed(), secs(6));
    assert_eq!(
        types(&events),
        vec![
            "turn_start",
            "tool_start",
            "tool_timeout",
            "tool_result",
            "turn_end",
            "tool_late_result",
            "tool_stopped"
        ]
    );
    assert_eq!(
        shapes(&events, "tool_late_result"),
        vec![
            json!({"type": "tool_late_result", "turn_id": "t1", "call_id": "c1",
                    "tool": "srv__late", "is_error": false, "after_ms": 1000})
        ]
    );
    assert_eq!(
        shapes(&events, "tool_stopped"),
        vec![
            json!({"type": "tool_stopped", "turn_id": "t1", "call_id": "c1", "tool": "srv__late",
                    "how": "cooperative", "after_ms": 1000})
        ]
    );
    // Nothing changed the outcome: one result, the one the caller got.
    let results = of_type(&events, "tool_result");
    assert_eq!(results.len(), 1);
    match &results[0].kind {
        toolwarden_core::protocol::EventKind::ToolResult { result, .. } => {
            assert_eq!(&result.outcome, &decided.outcome)
        }
        other => panic!("{other:?}"),
    }
    let status = h
        .engine
        .session_status(&toolwarden_core::protocol::SessionKey::local(SESSION))
        .expect("the session is known");
    assert_eq!(
        status.counts,
        [("timeout".to_owned(), 1)].into_iter().collect()
    );
}
