//! docs/GOVERNANCE.md, "Events": the events of a call and a turn, in order, `seq` +1 each;
//! `tool_progress` paced.

mod common;

use std::sync::Arc;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use toolwarden_core::protocol::Event;

/// Checks `seq` goes up by one per event and every event names session `s1`.
fn check_sequenced(events: &[Arc<Event>]) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let first = seqs.first().copied().unwrap_or(0);
    assert_eq!(seqs, (first..first + seqs.len() as u64).collect::<Vec<_>>());
    assert!(
        events.iter().all(|e| e
            .scope
            .session_id
            .as_ref()
            .is_some_and(|s| s.as_str() == SESSION)),
        "every event names its session"
    );
}

#[tokio::test(start_paused = true)]
async fn a_simple_call() {
    let mut h = Harness::new("");
    let r = h.call("c1", "echo", json!({"q": "hi"})).await;
    let events = h.drain();
    check_sequenced(&events);
    let result = serde_json::to_value(&r).unwrap();
    assert_eq!(
        events.iter().map(|e| shape(e)).collect::<Vec<Value>>(),
        vec![
            json!({"type": "turn_start", "turn_id": "t1",
                   "calls": [{"call_id": "c1", "tool": "echo"}]}),
            json!({"type": "tool_start", "turn_id": "t1", "call_id": "c1", "tool": "echo",
                   "input": {"q": "hi"}, "timeout_ms": 120_000, "idle_timeout_ms": 0}),
            json!({"type": "tool_result", "turn_id": "t1", "call_id": "c1", "tool": "echo",
                   "outcome": result["outcome"], "duration_ms": 0, "is_error": false,
                   "content": result["content"], "structured_content": result["structured_content"]}),
            json!({"type": "turn_end", "turn_id": "t1", "outcome": "completed",
                   "results": [result]}),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_that_times_out() {
    let mut h = Harness::new(
        r#"
        [tools.sleep]
        timeout = "1s"
        "#,
    );
    h.call("c1", "sleep", json!({"ms": 5000})).await;
    let events = h.until("tool_stopped").await;
    check_sequenced(&events);
    assert_eq!(
        types(&events),
        vec![
            "turn_start",
            "tool_start",
            "tool_timeout",
            "tool_result",
            "turn_end",
            "tool_stopped"
        ]
    );
    assert_eq!(
        shapes(&events, "tool_timeout"),
        vec![
            json!({"type": "tool_timeout", "turn_id": "t1", "call_id": "c1", "tool": "sleep",
                    "kind": "total", "after_ms": 1000})
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_that_is_retried() {
    let mut h = Harness::new(
        r#"
        [tools."srv__flaky"]
        idempotent = true
        retries = 1
        "#,
    );
    h.call("c1", "srv__flaky", json!({"fail": 1})).await;
    let events = h.drain();
    check_sequenced(&events);
    assert_eq!(
        types(&events),
        vec![
            "turn_start",
            "tool_start",
            "tool_retry",
            "tool_result",
            "turn_end"
        ],
        "one tool_start per call, not per attempt"
    );
}

#[tokio::test(start_paused = true)]
async fn a_turn_ends_with_its_results_in_call_order() {
    let mut h = Harness::new("");
    let req = h.turn(vec![
        call("c1", "sleep", json!({"ms": 300})),
        call("c2", "sleep", json!({"ms": 100})),
        call("c3", "fail", json!({})),
    ]);
    let out = h.engine.run_turn(req).await.unwrap();
    let events = h.drain();
    check_sequenced(&events);
    assert_eq!(
        of_type(&events, "tool_result")
            .iter()
            .map(|e| e.scope.call_id.clone().unwrap().to_string())
            .collect::<Vec<_>>(),
        vec!["c3", "c2", "c1"],
        "tool_result as they complete"
    );
    let end = shapes(&events, "turn_end").remove(0);
    assert_eq!(
        end,
        json!({"type": "turn_end", "turn_id": "t1", "outcome": "partial",
               "results": serde_json::to_value(&out.results).unwrap()}),
        "turn_end in call order"
    );
    assert_eq!(
        out.results
            .iter()
            .map(|r| r.outcome.call_id.to_string())
            .collect::<Vec<_>>(),
        vec!["c1", "c2", "c3"]
    );
}

#[tokio::test(start_paused = true)]
async fn turn_end_carries_the_results_as_the_front_door_renders_them() {
    let mut h = Harness::new("");
    let mut req = h.turn(vec![call("toolu_1", "echo", json!({"q": "hi"}))]);
    req.render = Some(Arc::new(|call, result| {
        json!({"type": "tool_result", "tool_use_id": call.id, "content": result.text(),
               "is_error": result.is_error})
    }));
    h.engine.run_turn(req).await.unwrap();
    assert_eq!(
        shapes(&h.drain(), "turn_end")[0]["results"],
        json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "{\"q\":\"hi\"}",
                "is_error": false}])
    );
}

/// The `elapsed_ms` of each `tool_progress`.
fn progress_times(events: &[Arc<Event>]) -> Vec<u64> {
    shapes(events, "tool_progress")
        .iter()
        .map(|e| e["elapsed_ms"].as_u64().unwrap_or(u64::MAX))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_progress_becomes_at_most_four_events_a_second() {
    let mut h = Harness::new("");
    // Progress every 10ms for two seconds: 199 reports.
    h.call("c1", "ticker", json!({"every_ms": 10, "ms": 2000}))
        .await;
    let events = h.drain();
    let times = progress_times(&events);
    assert_eq!(
        times,
        vec![10, 260, 510, 760, 1010, 1260, 1510, 1760],
        "the first at once, then one every 250ms carrying the latest report"
    );
    for window in times.windows(5) {
        assert!(
            window[4] - window[0] >= 1000,
            "at most 4 in any second: {times:?}"
        );
    }
    assert_eq!(
        shapes(&events, "tool_progress")[0],
        json!({"type": "tool_progress", "turn_id": "t1", "call_id": "c1", "tool": "ticker",
               "elapsed_ms": 10, "progress": 1.0, "message": "tick 1"})
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_running_call_reports_every_five_seconds() {
    let mut h = Harness::new("");
    h.call("c1", "sleep", json!({"ms": 12_000})).await;
    let events = h.drain();
    assert_eq!(progress_times(&events), vec![5000, 10_000]);
    assert_eq!(
        shapes(&events, "tool_progress")[1],
        json!({"type": "tool_progress", "turn_id": "t1", "call_id": "c1", "tool": "sleep",
               "elapsed_ms": 10_000})
    );
}

/// Runs the `ticker` tool (a report every `every_ms` for `ms`) and gives each `tool_progress`
/// as (`elapsed_ms`, `progress`).
async fn ticker_progress(h: &mut Harness, every_ms: u64, ms: u64) -> Vec<(Value, Value)> {
    h.call("c1", "ticker", json!({"every_ms": every_ms, "ms": ms}))
        .await;
    shapes(&h.drain(), "tool_progress")
        .iter()
        .map(|e| (e["elapsed_ms"].clone(), e["progress"].clone()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn occasional_progress_is_reported_when_it_comes() {
    let mut h = Harness::new("");
    // A report every 2s; and the every-5s beat carries the latest.
    assert_eq!(
        ticker_progress(&mut h, 2000, 9000).await,
        vec![
            (json!(2000), json!(1.0)),
            (json!(4000), json!(2.0)),
            (json!(6000), json!(3.0)),
            (json!(8000), json!(4.0)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_report_that_comes_with_the_five_second_beat_goes_out_once() {
    let mut h = Harness::new("");
    // Reports at 5s and 10s, just when the every-5s beat is due: one event each.
    assert_eq!(
        ticker_progress(&mut h, 5000, 12_000).await,
        vec![(json!(5000), json!(1.0)), (json!(10_000), json!(2.0))]
    );
}
