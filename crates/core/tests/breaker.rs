//! docs/GOVERNANCE.md, "The circuit breaker": one breaker per tool, counting infrastructure
//! failures only; open, half-open with exactly one probe, closed again; `breaker_state` events;
//! cache hits served while open.

mod common;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::time::sleep;

const BREAKER: &str = r#"
[tools."srv__flaky"]
breaker = { failures = 3, window = "60s", open_for = "30s" }
"#;

/// A cached tool whose breaker opens at the first failure, retries off: for single flight around
/// the breaker.
const CACHED_BREAKER: &str = r#"
[tools."srv__flaky"]
idempotent = true
cache_ttl = "5m"
retries = 0
breaker = { failures = 1, window = "60s", open_for = "30s" }
"#;

/// The states of the `breaker_state` events so far.
fn breaker_states(h: &mut Harness) -> Vec<Value> {
    shapes(&h.drain(), "breaker_state")
        .into_iter()
        .map(|e| e["state"].clone())
        .collect()
}

fn breaker_metric(h: &Harness) -> Vec<String> {
    metric_lines(
        &h.engine.metrics_text(),
        "toolwarden_breaker_state{tool=\"srv__flaky\"}",
    )
}

/// Fails `n` calls of `srv__flaky` (each its own input, so the loop detector stays out of it).
async fn fail_calls(h: &mut Harness, n: u32) {
    for _ in 0..n {
        let unique = format!("fail{}", h.log.runs("srv__flaky"));
        let r = h
            .call("c1", "srv__flaky", json!({"fail": 1, "n": unique}))
            .await;
        assert_eq!(
            status(&r),
            json!({"status": "error", "reason": "transport", "call_id": "c1"})
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_gauge_reads_half_open_once_open_for_has_passed_without_a_call() {
    let mut h = Harness::new(BREAKER);
    fail_calls(&mut h, 3).await;
    assert_eq!(
        breaker_metric(&h),
        vec!["toolwarden_breaker_state{tool=\"srv__flaky\"} 2"]
    );
    sleep(secs(30)).await;
    assert_eq!(
        breaker_metric(&h),
        vec!["toolwarden_breaker_state{tool=\"srv__flaky\"} 1"]
    );
}

#[tokio::test(start_paused = true)]
async fn failures_within_the_window_open_it() {
    let mut h = Harness::new(BREAKER);
    fail_calls(&mut h, 3).await;
    assert_eq!(breaker_states(&mut h), vec![json!("open")]);
    assert_eq!(
        breaker_metric(&h),
        vec!["toolwarden_breaker_state{tool=\"srv__flaky\"} 2"]
    );
    sleep(secs(10)).await;
    let r = h.call("c4", "srv__flaky", json!({})).await;
    check(
        &r,
        json!({"status": "circuit_open", "retry_after_ms": 20_000, "attempts": 0,
               "call_id": "c4", "tool": "srv__flaky", "duration_ms": 0}),
        "[CIRCUIT OPEN] Tool \"srv__flaky\" has failed repeatedly and is paused; it was not run. Try again in 20s or use another approach.",
    );
    assert_eq!(h.log.runs("srv__flaky"), 3, "the open breaker ran nothing");
}

#[tokio::test(start_paused = true)]
async fn failures_outside_the_window_do_not_count() {
    let mut h = Harness::new(
        r#"
        [tools."srv__flaky"]
        breaker = { failures = 2, window = "10s", open_for = "30s" }
        "#,
    );
    fail_calls(&mut h, 1).await;
    sleep(secs(11)).await;
    fail_calls(&mut h, 1).await;
    let r = h.call("c3", "srv__flaky", json!({})).await;
    assert_eq!(status(&r), json!({"status": "ok", "call_id": "c3"}));
    assert_eq!(breaker_states(&mut h), Vec::<Value>::new());
}

#[tokio::test(start_paused = true)]
async fn timeouts_are_failures() {
    let mut h = Harness::new(
        r#"
        [tools.sleep]
        timeout = "1s"
        breaker = { failures = 2, window = "60s", open_for = "30s" }
        "#,
    );
    for n in [5000, 6000] {
        let r = h.call("c1", "sleep", json!({"ms": n})).await;
        assert_eq!(status(&r)["status"], "timeout");
    }
    let r = h.call("c3", "sleep", json!({"ms": 1})).await;
    assert_eq!(status(&r)["status"], "circuit_open");
}

#[tokio::test(start_paused = true)]
async fn a_tools_own_errors_do_not_count_unless_configured() {
    for (counts, expected_runs) in [(false, 4), (true, 1)] {
        let mut h = Harness::new(&format!(
            r#"
            [tools.fail]
            breaker = {{ failures = 1, window = "60s", open_for = "30s" }}
            breaker_counts_tool_errors = {counts}
            loop = {{ warn_after = 0, block_after = 0 }}
            "#
        ));
        for _ in 0..4 {
            h.call("c1", "fail", json!({})).await;
        }
        assert_eq!(
            h.log.runs("fail"),
            expected_runs,
            "breaker_counts_tool_errors = {counts}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_exactly_one_probe_whose_success_closes_it() {
    let mut h = Harness::new(BREAKER);
    fail_calls(&mut h, 3).await;
    sleep(secs(30)).await;
    // The probe takes a second; two calls arrive while it runs.
    let req = h.turn(vec![call("probe", "srv__flaky", json!({"ms": 1000}))]);
    let probe = h.engine.start_turn(req).unwrap();
    sleep(ms(100)).await;
    let req = h.turn(vec![
        call("c2", "srv__flaky", json!({"n": 2})),
        call("c3", "srv__flaky", json!({"n": 3})),
    ]);
    let during = h.engine.run_turn(req).await.unwrap();
    assert_eq!(
        during.results.iter().map(|r| status(r)).collect::<Vec<_>>(),
        vec![
            json!({"status": "circuit_open", "retry_after_ms": 1000, "call_id": "c2"}),
            json!({"status": "circuit_open", "retry_after_ms": 1000, "call_id": "c3"}),
        ]
    );
    assert_eq!(
        breaker_metric(&h),
        vec!["toolwarden_breaker_state{tool=\"srv__flaky\"} 1"]
    );
    let probe = probe.finish().await;
    assert_eq!(
        status(&probe.results[0]),
        json!({"status": "ok", "call_id": "probe"})
    );
    let r = h.call("c4", "srv__flaky", json!({})).await;
    assert_eq!(status(&r), json!({"status": "ok", "call_id": "c4"}));
    assert_eq!(
        breaker_states(&mut h),
        vec![json!("open"), json!("half_open"), json!("closed")]
    );
    assert_eq!(
        breaker_metric(&h),
        vec!["toolwarden_breaker_state{tool=\"srv__flaky\"} 0"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_opens_it_again() {
    let mut h = Harness::new(BREAKER);
    fail_calls(&mut h, 3).await;
    sleep(secs(30)).await;
    let r = h
        .call("probe", "srv__flaky", json!({"fail": 1, "n": "probe"}))
        .await;
    assert_eq!(status(&r)["status"], "error");
    let r = h.call("c2", "srv__flaky", json!({})).await;
    assert_eq!(
        status(&r),
        json!({"status": "circuit_open", "retry_after_ms": 30_000, "call_id": "c2"}),
        "open for another full open_for"
    );
    assert_eq!(
        breaker_states(&mut h),
        vec![json!("open"), json!("half_open"), json!("open")]
    );
}

#[tokio::test(start_paused = true)]
async fn a_cache_hit_is_served_while_the_breaker_is_open() {
    let mut h = Harness::new(
        r#"
        [tools."srv__flaky"]
        idempotent = true
        cache_ttl = "5m"
        breaker = { failures = 1, window = "60s", open_for = "30s" }
        "#,
    );
    let first = h.call("c1", "srv__flaky", json!({"q": "cached"})).await;
    assert_eq!(status(&first), json!({"status": "ok", "call_id": "c1"}));
    fail_calls(&mut h, 1).await;
    let hit = h.call("c2", "srv__flaky", json!({"q": "cached"})).await;
    assert_eq!(status(&hit), json!({"status": "ok", "call_id": "c2"}));
    assert_eq!(
        hit.outcome.provenance.as_ref().map(|p| p.cache_hit),
        Some(true)
    );
    let miss = h.call("c3", "srv__flaky", json!({"q": "other"})).await;
    assert_eq!(status(&miss)["status"], "circuit_open");
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_is_cancelled_hands_its_place_to_the_next_call() {
    let mut h = Harness::new(BREAKER);
    fail_calls(&mut h, 3).await;
    sleep(secs(30)).await;
    let probe = h.start(vec![call("probe", "srv__flaky", json!({"ms": 10_000}))]);
    sleep(secs(1)).await;
    h.engine
        .abort_turn(
            probe.turn_id(),
            toolwarden_core::protocol::CancelReason::User,
        )
        .unwrap();
    assert_eq!(
        status(&probe.finish().await.results[0]),
        json!({"status": "cancelled", "reason": "user", "call_id": "probe"})
    );
    // Neither a success nor a failure: still half-open, and the next call is the probe.
    let r = h.call("c2", "srv__flaky", json!({})).await;
    assert_eq!(status(&r), json!({"status": "ok", "call_id": "c2"}));
    assert_eq!(
        breaker_states(&mut h),
        vec![json!("open"), json!("half_open"), json!("closed")]
    );
}

/// Identical calls share the probe's execution: joining a running call is part of the cache
/// lookup, before the breaker, so the calls that arrive while the probe runs get its result
/// (as a hit) instead of `circuit_open`; different calls are still turned away.
#[tokio::test(start_paused = true)]
async fn identical_calls_share_the_half_open_probe() {
    let mut h = Harness::new(CACHED_BREAKER);
    fail_calls(&mut h, 1).await;
    sleep(secs(30)).await;
    let runs_before = h.log.runs("srv__flaky");
    let req = h.turn(vec![
        call("probe", "srv__flaky", json!({"ms": 1000})),
        call("same", "srv__flaky", json!({"ms": 1000})),
        call("other", "srv__flaky", json!({"ms": 1000, "n": 2})),
    ]);
    let out = h.engine.run_turn(req).await.unwrap();
    assert_eq!(
        out.results.iter().map(|r| status(r)).collect::<Vec<_>>(),
        vec![
            json!({"status": "ok", "call_id": "probe"}),
            json!({"status": "ok", "call_id": "same"}),
            json!({"status": "circuit_open", "retry_after_ms": 1000, "call_id": "other"}),
        ]
    );
    assert_eq!(
        out.results[1]
            .outcome
            .provenance
            .as_ref()
            .map(|p| p.cache_hit),
        Some(true),
        "shared, not run"
    );
    assert_eq!(h.log.runs("srv__flaky") - runs_before, 1, "one execution");
}

/// A call that leads an execution and is then turned away by the open breaker lets the
/// identical calls waiting on it look again: each ends `circuit_open` on its own, none waits
/// forever, nothing runs.
#[tokio::test(start_paused = true)]
async fn a_leader_turned_away_by_the_breaker_releases_its_followers() {
    let mut h = Harness::new(CACHED_BREAKER);
    fail_calls(&mut h, 1).await;
    let runs_before = h.log.runs("srv__flaky");
    let req = h.turn(vec![
        call("c1", "srv__flaky", json!({"q": 1})),
        call("c2", "srv__flaky", json!({"q": 1})),
    ]);
    let out = h.engine.run_turn(req).await.unwrap();
    assert_eq!(
        out.results
            .iter()
            .map(|r| status(r)["status"].clone())
            .collect::<Vec<_>>(),
        vec![json!("circuit_open"), json!("circuit_open")]
    );
    assert_eq!(h.log.runs("srv__flaky"), runs_before);
}
