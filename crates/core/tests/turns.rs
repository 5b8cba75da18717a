//! docs/GOVERNANCE.md, "Concurrency within a session": a turn's results come back in call order,
//! one per call, and are streamed as they complete; running turns and a session's state can be seen
//! while they run; malformed turns are refused before anything runs.

mod common;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::time::sleep;
use toolwarden_core::TurnError;
use toolwarden_core::protocol::{CallId, SessionKey, TurnId};

#[tokio::test(start_paused = true)]
async fn results_stream_as_they_complete_and_end_in_call_order() {
    let mut h = Harness::new("");
    let mut turn = h.start(vec![
        call("c1", "sleep", json!({"ms": 300})),
        call("c2", "sleep", json!({"ms": 100})),
        call("c3", "sleep", json!({"ms": 200})),
    ]);
    let mut streamed = Vec::new();
    while let Some((index, result)) = turn.next_completed().await {
        streamed.push((index, result.outcome.call_id.to_string()));
    }
    assert_eq!(
        streamed,
        vec![(1, "c2".into()), (2, "c3".into()), (0, "c1".into())]
    );
    let out = turn.finish().await;
    assert_eq!(
        out.results
            .iter()
            .map(|r| (r.outcome.call_id.to_string(), r.text()))
            .collect::<Vec<_>>(),
        vec![
            ("c1".into(), "slept 300ms".into()),
            ("c2".into(), "slept 100ms".into()),
            ("c3".into(), "slept 200ms".into()),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn running_turns_show_each_call_where_it_is() {
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
    let turn = h.start(vec![
        call("c1", "ticker", json!({"every_ms": 300, "ms": 1000})),
        call("c2", "write", json!({"ms": 100})),
        call("c3", "ask", json!({"ms": 100})),
        call("c4", "echo", json!({"q": "later"})), // held back by c2
    ]);
    sleep(ms(700)).await;
    let active: Vec<Value> = h
        .engine
        .active_turns()
        .into_iter()
        .map(|t| {
            let mut v = serde_json::to_value(t).unwrap();
            v.as_object_mut().unwrap().remove("started_at");
            v
        })
        .collect();
    assert_eq!(
        active,
        vec![json!({
            "turn_id": "t1",
            "principal": "local",
            "session_id": "s1",
            "calls": [
                {"call_id": "c1", "tool": "ticker", "state": "running", "elapsed_ms": 700,
                 "attempt": 1, "progress": {"progress": 2.0, "message": "tick 2"}},
                {"call_id": "c2", "tool": "write", "state": "waiting", "elapsed_ms": 0,
                 "attempt": 0},
                {"call_id": "c3", "tool": "ask", "state": "awaiting_approval", "elapsed_ms": 0,
                 "attempt": 0},
                {"call_id": "c4", "tool": "echo", "state": "waiting", "elapsed_ms": 0,
                 "attempt": 0},
            ]
        })]
    );
    let status = h
        .engine
        .session_status(&SessionKey::local(SESSION))
        .unwrap();
    assert_eq!(
        status
            .running
            .iter()
            .map(|c| (c.turn_id.to_string(), c.call.call_id.to_string()))
            .collect::<Vec<_>>(),
        vec![
            ("t1".into(), "c1".into()),
            ("t1".into(), "c2".into()),
            ("t1".into(), "c3".into()),
            ("t1".into(), "c4".into()),
        ]
    );
    assert_eq!(status.counts, Default::default(), "nothing ended yet");
    drop(turn); // a dropped handle aborts its turn
    sleep(ms(1)).await;
    assert_eq!(h.engine.active_turns(), vec![]);
}

#[tokio::test(start_paused = true)]
async fn a_session_remembers_how_its_calls_ended() {
    let mut h = Harness::new(
        r#"
        [tools.sleep]
        timeout = "1s"
        "#,
    );
    h.call("c1", "sleep", json!({"ms": 5000})).await;
    h.call("c2", "sleep", json!({"ms": 10})).await;
    h.call("c3", "fail", json!({})).await;
    let status = h
        .engine
        .session_status(&SessionKey::local(SESSION))
        .unwrap();
    assert_eq!(
        (
            serde_json::to_value(&status.counts).unwrap(),
            serde_json::to_value(&status.timed_out_tools).unwrap(),
            status
                .recent_failures
                .iter()
                .map(|f| (f.call_id.to_string(), f.status.name()))
                .collect::<Vec<_>>(),
        ),
        (
            json!({"error": 1, "ok": 1, "timeout": 1}),
            json!({"sleep": 1}),
            vec![("c1".into(), "timeout"), ("c3".into(), "error")],
        )
    );
    assert_eq!(
        h.engine.session_status(&SessionKey::local("s_unknown")),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn malformed_turns_are_refused_before_anything_runs() {
    let mut h = Harness::new("");
    let cases = [
        (vec![], TurnError::Empty),
        (
            vec![call("", "sleep", json!({}))],
            TurnError::EmptyCallId(0),
        ),
        (
            vec![
                call("c1", "sleep", json!({})),
                call("c1", "echo", json!({"q": "x"})),
            ],
            TurnError::DuplicateCallId(CallId::from("c1")),
        ),
    ];
    for (calls, expected) in cases {
        let req = h.turn(calls);
        assert_eq!(h.engine.run_turn(req).await.err(), Some(expected));
    }
    // A caller-chosen turn id that is already running.
    let running = h.start(vec![call("c1", "sleep", json!({"ms": 1000}))]);
    let mut again = h.turn(vec![call("c1", "sleep", json!({"ms": 1}))]);
    again.turn_id = Some(running.turn_id().clone());
    assert_eq!(
        h.engine.start_turn(again).err(),
        Some(TurnError::DuplicateTurnId(TurnId::from("t4")))
    );
    running.finish().await;
    assert_eq!(h.log.runs("sleep"), 1);
    assert_eq!(of_type(&h.drain(), "turn_start").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_single_call_runs_as_a_one_call_turn() {
    let h = Harness::new("");
    let r = h
        .engine
        .call("s9", call("c1", "echo", json!({"q": "x"})))
        .await;
    assert_eq!(
        (status(&r), r.outcome.turn_id.as_str().starts_with("t_")),
        (json!({"status": "ok", "call_id": "c1"}), true)
    );
    let r = h
        .engine
        .call("s9", call("", "echo", json!({"q": "x"})))
        .await;
    assert_eq!(
        (status(&r), r.text()),
        (
            json!({"status": "invalid", "reason": "schema", "call_id": ""}),
            "[INVALID] The call was refused: call 0 has an empty id.".into()
        )
    );
}

#[tokio::test(start_paused = true)]
async fn every_progress_report_reaches_the_turns_listener() {
    let mut h = Harness::new("");
    let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut req = h.turn(vec![call(
        "c1",
        "ticker",
        json!({"every_ms": 10, "ms": 50}),
    )]);
    let sink = seen.clone();
    req.progress = Some(std::sync::Arc::new(move |call_id, info| {
        sink.lock()
            .push((call_id.to_string(), info.progress.unwrap_or_default()));
    }));
    h.engine.run_turn(req).await.unwrap();
    assert_eq!(
        *seen.lock(),
        (1..=4)
            .map(|n| ("c1".to_owned(), f64::from(n)))
            .collect::<Vec<_>>(),
        "unpaced, unlike tool_progress"
    );
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_calls_in_flight_all_end_at_their_deadline() {
    let mut h = Harness::new(
        r#"
        [tools.sleep]
        timeout = "1s"
        loop = { warn_after = 0, block_after = 0 }
        "#,
    );
    let calls = (0..10_000)
        .map(|i| call(&format!("c{i}"), "sleep", json!({"ms": 60_000})))
        .collect();
    let req = h.turn(calls);
    let t0 = tokio::time::Instant::now();
    let out = h.engine.run_turn(req).await.unwrap();
    assert_eq!(t0.elapsed(), secs(1));
    assert_eq!(out.results.len(), 10_000);
    assert!(
        out.results
            .iter()
            .all(|r| r.outcome.duration_ms == 1000 && status(r)["kind"] == "total")
    );
}

#[tokio::test(start_paused = true)]
async fn a_turn_without_a_session_leaves_no_session_behind() {
    let h = Harness::new("");
    let calls = vec![toolwarden_core::protocol::ToolCall::new(
        "c1",
        "echo",
        json!({"q": 1}),
    )];
    let req = toolwarden_core::TurnRequest {
        calls,
        ..Default::default()
    };
    let out = h.engine.run_turn(req).await.unwrap();
    assert!(out.session_id.as_str().starts_with("s_"));
    assert_eq!(
        h.engine
            .session_status(&SessionKey::local(out.session_id.clone())),
        None,
        "the generated session is gone"
    );
}

#[tokio::test(start_paused = true)]
async fn a_renderer_runs_once_per_call_for_the_answer_and_turn_end_alike() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use toolwarden_core::protocol::{EventKind, TurnResults};
    let mut h = Harness::new("");
    let renders = Arc::new(AtomicUsize::new(0));
    let counted = renders.clone();
    let mut req = h.turn(vec![
        call("c1", "sleep", json!({"ms": 20})),
        call("c2", "sleep", json!({"ms": 10})),
    ]);
    req.render = Some(Arc::new(move |call, result| {
        counted.fetch_add(1, Ordering::Relaxed);
        json!({"id": call.id, "text": result.text()})
    }));
    let out = h.engine.start_turn(req).unwrap().finish().await;
    let rendered = out.rendered.expect("a rendered list");
    assert_eq!(
        *rendered,
        vec![
            json!({"id": "c1", "text": "slept 20ms"}),
            json!({"id": "c2", "text": "slept 10ms"})
        ]
    );
    let events = h.until("turn_end").await;
    let EventKind::TurnEnd {
        results: TurnResults::Rendered(carried),
        ..
    } = kind(events.last().unwrap())
    else {
        panic!("turn_end carries the rendered list");
    };
    assert!(Arc::ptr_eq(carried, &rendered), "one list, shared");
    assert_eq!(renders.load(Ordering::Relaxed), 2, "one rendering per call");
}
