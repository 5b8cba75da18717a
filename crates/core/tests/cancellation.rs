//! docs/GOVERNANCE.md, "Cancellation": the cancellation tree. Aborts of turns and calls, parents
//! and children, client disconnects and shutdown all end calls `cancelled` with a reason, at once,
//! one result per call in order.

mod common;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::time::{Instant, sleep, timeout};
use toolwarden_core::NotFound;
use toolwarden_core::protocol::{BreakerStateKind, CancelReason, TurnId};

fn statuses(results: &[Arc<toolwarden_core::protocol::CallResult>]) -> Vec<Value> {
    results.iter().map(|r| status(r)).collect()
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_call_is_never_retried_nor_counted_by_the_breaker() {
    let mut h = Harness::new(
        r#"
        [tools."srv__flaky"]
        idempotent = true
        retries = 3
        breaker = { failures = 1, window = "60s", open_for = "30s" }
        "#,
    );
    for n in 1..=3 {
        let req = h.turn(vec![call(
            "c1",
            "srv__flaky",
            json!({"ms": 10_000, "n": n}),
        )]);
        let turn = h.engine.start_turn(req).unwrap();
        sleep(secs(1)).await;
        h.engine
            .abort_turn(turn.turn_id(), CancelReason::User)
            .unwrap();
        let out = turn.finish().await;
        check(
            &out.results[0],
            json!({"status": "cancelled", "reason": "user", "attempts": 1, "call_id": "c1",
                   "tool": "srv__flaky", "duration_ms": 1000}),
            "[CANCELLED] Tool \"srv__flaky\" was stopped by the user before it finished. It may have partly run; do not call it again unless the user asks.",
        );
    }
    let events = h.drain();
    assert_eq!(of_type(&events, "tool_retry").len(), 0, "never retried");
    assert_eq!(of_type(&events, "breaker_state").len(), 0, "never counted");
    let breaker = h
        .engine
        .tools()
        .into_iter()
        .find(|t| t.name == "srv__flaky")
        .unwrap()
        .breaker;
    assert_eq!(breaker, BreakerStateKind::Closed);
    let r = h.call("c1", "srv__flaky", json!({})).await;
    assert_eq!(status(&r), json!({"status": "ok", "call_id": "c1"}));
}

#[tokio::test(start_paused = true)]
async fn aborting_a_turn_mid_way_gives_one_result_per_call_in_order() {
    let mut h = Harness::new(
        r#"
        [tools.write]
        concurrency = "exclusive"

        [tools.ask]
        approval = "ask"
        "#,
    );
    h.add_sleep("write");
    h.add_sleep("ask");
    h.attach_person();
    let req = h.turn(vec![
        call("c1", "sleep", json!({"ms": 100})), // finishes before the abort
        call("c2", "sleep", json!({"ms": 10_000})), // running at the abort
        call("c3", "write", json!({"ms": 100})), // exclusive: waits for c1 and c2
        call("c4", "sleep", json!({"ms": 100})), // held back by c3
        call("c5", "ask", json!({"ms": 100})),   // waits for a person's approval
    ]);
    let t0 = Instant::now();
    let turn = h.engine.start_turn(req).unwrap();
    sleep(secs(1)).await;
    h.engine
        .abort_turn(turn.turn_id(), CancelReason::User)
        .unwrap();
    let out = turn.finish().await;
    assert_eq!(t0.elapsed(), secs(1), "at once");
    assert_eq!(
        statuses(&out.results),
        vec![
            json!({"status": "ok", "call_id": "c1"}),
            json!({"status": "cancelled", "reason": "user", "call_id": "c2"}),
            json!({"status": "cancelled", "reason": "not_started", "call_id": "c3"}),
            json!({"status": "cancelled", "reason": "not_started", "call_id": "c4"}),
            json!({"status": "cancelled", "reason": "not_started", "call_id": "c5"}),
        ]
    );
    check(
        &out.results[2],
        json!({"status": "cancelled", "reason": "not_started", "attempts": 0, "call_id": "c3",
               "tool": "write", "duration_ms": 1000}),
        "[CANCELLED] Tool \"write\" was not started because its turn was aborted. It had no effect; call it again if it is still needed.",
    );
    assert_eq!(
        h.log.timeline(),
        vec![
            (0, "c1 start".into()),
            (0, "c2 start".into()),
            (100, "c1 end".into()),
            (1000, "c2 end".into()),
        ],
        "the calls that had not started never ran"
    );
    let events = h.drain();
    let ended: Vec<Value> = of_type(&events, "tool_result")
        .iter()
        .map(|e| json!(e.scope.call_id))
        .collect();
    assert_eq!(ended.len(), 5, "one tool_result per call: {ended:?}");
    assert!(
        h.engine.interactions().pending().is_empty(),
        "the approval was withdrawn"
    );
}

#[tokio::test(start_paused = true)]
async fn a_turn_aborted_before_its_calls_ran_runs_none_of_them() {
    let mut h = Harness::new(
        r#"
        [tools.ask]
        approval = "ask"
        "#,
    );
    h.add_sleep("ask");
    h.attach_person();
    let req = h.turn(vec![
        call("c1", "sleep", json!({"ms": 100})),
        call("c2", "ask", json!({"ms": 200})),
    ]);
    let turn = h.engine.start_turn(req).unwrap();
    h.engine
        .abort_turn(turn.turn_id(), CancelReason::User)
        .unwrap();
    let out = turn.finish().await;
    assert_eq!(
        statuses(&out.results),
        vec![
            json!({"status": "cancelled", "reason": "not_started", "call_id": "c1"}),
            json!({"status": "cancelled", "reason": "not_started", "call_id": "c2"}),
        ]
    );
    assert_eq!((h.log.runs("sleep"), h.log.runs("ask")), (0, 0));
    let events = h.drain();
    assert_eq!(
        types(&events),
        vec![
            "turn_start",
            "turn_abort",
            "tool_result",
            "tool_result",
            "turn_end"
        ],
        "nobody was asked to approve it"
    );
}

#[tokio::test(start_paused = true)]
async fn aborts_are_idempotent_and_a_finished_or_unknown_turn_is_not_found() {
    let mut h = Harness::new("");
    let req = h.turn(vec![call("c1", "sleep", json!({"ms": 10_000}))]);
    let turn = h.engine.start_turn(req).unwrap();
    let id = turn.turn_id().clone();
    sleep(secs(1)).await;
    assert_eq!(h.engine.abort_turn(&id, CancelReason::User), Ok(()));
    assert_eq!(h.engine.abort_turn(&id, CancelReason::User), Ok(()));
    let out = turn.finish().await;
    assert_eq!(
        statuses(&out.results),
        vec![json!({"status": "cancelled", "reason": "user", "call_id": "c1"})]
    );
    assert_eq!(
        shapes(&h.drain(), "turn_abort"),
        vec![json!({"type": "turn_abort", "turn_id": "t1", "reason": "user"})],
        "one turn_abort"
    );
    assert_eq!(
        h.engine.abort_turn(&id, CancelReason::User),
        Err(NotFound("turn t1".into()))
    );
    assert_eq!(
        h.engine.abort_call(&id, &"c1".into(), CancelReason::User),
        Err(NotFound("turn t1".into()))
    );
    assert_eq!(
        h.engine
            .abort_turn(&TurnId::from("t_nope"), CancelReason::User),
        Err(NotFound("turn t_nope".into()))
    );
}

#[tokio::test(start_paused = true)]
async fn aborting_one_call_leaves_the_others_running() {
    let mut h = Harness::new("");
    let req = h.turn(vec![
        call("c1", "sleep", json!({"ms": 2000})),
        call("c2", "sleep", json!({"ms": 5000})),
        call("c3", "sleep", json!({"ms": 3000})),
    ]);
    let mut turn = h.engine.start_turn(req).unwrap();
    let id = turn.turn_id().clone();
    sleep(secs(1)).await;
    h.engine
        .abort_call(&id, &"c2".into(), CancelReason::User)
        .unwrap();
    let (index, first) = turn.next_completed().await.unwrap();
    assert_eq!(
        (index, status(&first)),
        (
            1,
            json!({"status": "cancelled", "reason": "user", "call_id": "c2"})
        )
    );
    assert_eq!(
        h.engine.abort_call(&id, &"c2".into(), CancelReason::User),
        Err(NotFound("call c2 of turn t1".into())),
        "it is done"
    );
    let out = turn.finish().await;
    assert_eq!(
        statuses(&out.results),
        vec![
            json!({"status": "ok", "call_id": "c1"}),
            json!({"status": "cancelled", "reason": "user", "call_id": "c2"}),
            json!({"status": "ok", "call_id": "c3"}),
        ]
    );
    let events = h.drain();
    assert_eq!(of_type(&events, "turn_abort").len(), 0);
    let end = shapes(&events, "turn_end");
    assert_eq!(end[0]["outcome"], "partial");
}

#[tokio::test(start_paused = true)]
async fn a_parent_turns_abort_reaches_its_child_turn() {
    let mut h = Harness::new("");
    let req = h.turn(vec![call("p1", "sleep", json!({"ms": 10_000}))]);
    let parent = h.engine.start_turn(req).unwrap();
    let mut child_req = h.turn(vec![call("k1", "sleep", json!({"ms": 10_000}))]);
    child_req.session_id = None; // a child turn lives in its parent's session
    child_req.parent_turn_id = Some(parent.turn_id().clone());
    let child = h.engine.start_turn(child_req).unwrap();
    assert_eq!(child.session_id().as_str(), SESSION);
    sleep(secs(1)).await;
    h.engine
        .abort_turn(parent.turn_id(), CancelReason::User)
        .unwrap();
    let parent = parent.finish().await;
    let child = child.finish().await;
    assert_eq!(
        statuses(&parent.results),
        vec![json!({"status": "cancelled", "reason": "user", "call_id": "p1"})]
    );
    check(
        &child.results[0],
        json!({"status": "cancelled", "reason": "parent", "attempts": 1, "call_id": "k1",
               "tool": "sleep", "duration_ms": 1000}),
        "[CANCELLED] Tool \"sleep\" was cancelled because the turn that started this one was aborted. It may have partly run.",
    );
    // Both turns end aborted; which of the two ends first is not specified.
    let ends = shapes(&h.drain(), "turn_end");
    let mut ended: Vec<(String, Value)> = ends
        .iter()
        .map(|e| {
            (
                e["turn_id"].as_str().unwrap_or_default().to_owned(),
                e["outcome"].clone(),
            )
        })
        .collect();
    ended.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        ended,
        vec![
            ("t1".to_owned(), json!("aborted")),
            ("t2".to_owned(), json!("aborted"))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_that_goes_away_still_gets_every_call_recorded_and_stopped() {
    let mut h = Harness::new(
        r#"
        [tools.write]
        concurrency = "exclusive"
        "#,
    );
    h.add_sleep("write");
    let req = h.turn(vec![
        call("c1", "sleep", json!({"ms": 10_000})),
        call("c2", "write", json!({"ms": 100})),
    ]);
    // The client disconnects after a second: its future is dropped.
    let gone = timeout(secs(1), h.engine.run_turn(req)).await;
    assert!(gone.is_err());
    let events = h.until("tool_stopped").await;
    let mut results = shapes(&events, "tool_result")
        .into_iter()
        .map(|e| {
            json!({"call_id": e["call_id"], "status": e["outcome"]["status"],
                        "reason": e["outcome"]["reason"]})
        })
        .collect::<Vec<_>>();
    results.sort_by_key(|r| r["call_id"].to_string());
    assert_eq!(
        results,
        vec![
            json!({"call_id": "c1", "status": "cancelled", "reason": "client_disconnect"}),
            json!({"call_id": "c2", "status": "cancelled", "reason": "not_started"}),
        ]
    );
    assert_eq!(
        shapes(&events, "turn_abort"),
        vec![json!({"type": "turn_abort", "turn_id": "t1", "reason": "client_disconnect"})]
    );
    assert_eq!(shapes(&events, "turn_end")[0]["outcome"], "aborted");
    assert_eq!(
        shapes(&events, "tool_stopped"),
        vec![
            json!({"type": "tool_stopped", "turn_id": "t1", "call_id": "c1", "tool": "sleep",
                    "how": "cooperative", "after_ms": 0})
        ]
    );
    assert_eq!(
        h.log.timeline(),
        vec![(0, "c1 start".into()), (1000, "c1 end".into())],
        "the backend was stopped"
    );
    assert_eq!(h.engine.active_turns(), vec![]);
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_running_calls_cancelled_and_waits_for_their_stop() {
    let mut h = Harness::new(
        r#"
        [tools.stubborn]
        cancel_grace = "2s"
        "#,
    );
    let req = h.turn(vec![
        call("c1", "sleep", json!({"ms": 10_000})),
        call("c2", "stubborn", json!({})),
    ]);
    let turn = h.engine.start_turn(req).unwrap();
    sleep(secs(1)).await;
    let t0 = Instant::now();
    let engine = h.engine.clone();
    let shutdown = tokio::spawn(async move { engine.shutdown(secs(5)).await });
    let out = turn.finish().await;
    assert_eq!(
        t0.elapsed(),
        secs(0),
        "the callers get their outcome at once"
    );
    assert_eq!(
        statuses(&out.results),
        vec![
            json!({"status": "cancelled", "reason": "shutdown", "call_id": "c1"}),
            json!({"status": "cancelled", "reason": "shutdown", "call_id": "c2"}),
        ]
    );
    assert!(shutdown.await.unwrap(), "everything stopped");
    assert_eq!(
        t0.elapsed(),
        secs(2),
        "the stubborn tool was forced after cancel_grace"
    );
    let stopped: Vec<Value> = shapes(&h.drain(), "tool_stopped")
        .into_iter()
        .map(|e| json!([e["call_id"], e["how"]]))
        .collect();
    assert_eq!(
        stopped,
        vec![json!(["c1", "cooperative"]), json!(["c2", "killed"])]
    );

    // A call after shutdown never reaches its tool.
    let r = h.call("c3", "sleep", json!({"ms": 10})).await;
    assert_eq!(
        status(&r),
        json!({"status": "cancelled", "reason": "not_started", "call_id": "c3"})
    );
    assert_eq!(h.log.runs("sleep"), 1);
}

#[tokio::test(start_paused = true)]
async fn ending_a_session_cancels_its_running_calls() {
    let mut h = Harness::new("");
    let mine = h.start(vec![call("c1", "sleep", json!({"ms": 10_000}))]);
    let req = h.turn_in("s2", vec![call("o1", "sleep", json!({"ms": 2000}))]);
    let theirs = h.engine.start_turn(req).unwrap();
    sleep(secs(1)).await;
    h.engine.end_session(
        &toolwarden_core::protocol::SessionKey::local(SESSION),
        CancelReason::ClientDisconnect,
    );
    assert_eq!(
        statuses(&mine.finish().await.results),
        vec![json!({"status": "cancelled", "reason": "client_disconnect", "call_id": "c1"})]
    );
    assert_eq!(
        statuses(&theirs.finish().await.results),
        vec![json!({"status": "ok", "call_id": "o1"})],
        "other sessions go on"
    );
    // The session can start again.
    let r = h.call("c2", "sleep", json!({"ms": 10})).await;
    assert_eq!(status(&r), json!({"status": "ok", "call_id": "c2"}));
}
