//! docs/GOVERNANCE.md, "Concurrency within a session": an exclusive call runs alone within its
//! session — it waits for the session's running calls and holds back the ones after it — while
//! parallel calls share the session and other sessions are never blocked. Observed through when
//! each tool started and ended.

mod common;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::json;

const EXCLUSIVE_WRITE: &str = r#"
[tools.write]
concurrency = "exclusive"
"#;

fn harness() -> Harness {
    let h = Harness::new(EXCLUSIVE_WRITE);
    h.add_sleep("write");
    h
}

fn sleep_call(id: &str, tool: &str, ms: u64) -> toolwarden_core::protocol::ToolCall {
    call(id, tool, json!({"ms": ms}))
}

/// Checks the whole timeline, and that no other call ran while `exclusive` did.
#[allow(clippy::unwrap_used)] // a test helper
fn check_timeline(h: &Harness, exclusive: &[&str], expected: Vec<(u64, &str)>) {
    let timeline = h.log.timeline();
    assert_eq!(
        timeline,
        expected
            .into_iter()
            .map(|(at, line)| (at, line.to_owned()))
            .collect::<Vec<_>>()
    );
    let span = |call: &str| {
        let at = |what: &str| {
            timeline
                .iter()
                .find(|(_, l)| *l == format!("{call} {what}"))
                .map(|(at, _)| *at)
                .unwrap()
        };
        (at("start"), at("end"))
    };
    for x in exclusive {
        let (start, end) = span(x);
        for (_, line) in &timeline {
            let other = line.split(' ').next().unwrap();
            if other != *x {
                let (s, e) = span(other);
                assert!(
                    e <= start || s >= end,
                    "{other} ({s}..{e}) overlaps exclusive {x} ({start}..{end})"
                );
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_exclusive_call_runs_alone_between_the_parallel_calls_of_its_turn() {
    let mut h = harness();
    let req = h.turn(vec![
        sleep_call("a", "sleep", 100),
        sleep_call("b", "sleep", 300),
        sleep_call("x", "write", 200),
        sleep_call("c", "sleep", 100),
        sleep_call("d", "sleep", 150),
    ]);
    let out = h.engine.run_turn(req).await.unwrap();
    assert!(out.results.iter().all(|r| !r.is_error));
    check_timeline(
        &h,
        &["x"],
        vec![
            (0, "a start"),
            (0, "b start"),
            (100, "a end"),
            (300, "b end"),
            (300, "x start"),
            (500, "x end"),
            (500, "c start"),
            (500, "d start"),
            (600, "c end"),
            (650, "d end"),
        ],
    );
}

#[tokio::test(start_paused = true)]
async fn exclusive_calls_run_one_after_another() {
    let mut h = harness();
    let req = h.turn(vec![
        sleep_call("x1", "write", 100),
        sleep_call("x2", "write", 100),
    ]);
    h.engine.run_turn(req).await.unwrap();
    check_timeline(
        &h,
        &["x1", "x2"],
        vec![
            (0, "x1 start"),
            (100, "x1 end"),
            (100, "x2 start"),
            (200, "x2 end"),
        ],
    );
}

#[tokio::test(start_paused = true)]
async fn exclusivity_holds_across_the_turns_of_a_session() {
    let mut h = harness();
    let t1 = h.turn(vec![sleep_call("a", "sleep", 300)]);
    let t2 = h.turn(vec![sleep_call("x", "write", 200)]);
    let t3 = h.turn(vec![sleep_call("c", "sleep", 100)]);
    let turns = [t1, t2, t3].map(|t| h.engine.start_turn(t).unwrap());
    for t in turns {
        t.finish().await;
    }
    check_timeline(
        &h,
        &["x"],
        vec![
            (0, "a start"),
            (300, "a end"),
            (300, "x start"),
            (500, "x end"),
            (500, "c start"),
            (600, "c end"),
        ],
    );
}

#[tokio::test(start_paused = true)]
async fn other_sessions_are_not_blocked() {
    let mut h = harness();
    let mine = h.turn(vec![sleep_call("x", "write", 1000)]);
    let theirs = h.turn_in("s2", vec![sleep_call("o", "sleep", 100)]);
    let later = h.turn(vec![sleep_call("b", "sleep", 100)]);
    let turns = [mine, theirs, later].map(|t| h.engine.start_turn(t).unwrap());
    for t in turns {
        t.finish().await;
    }
    assert_eq!(
        h.log.timeline(),
        vec![
            (0, "o start".into()),
            (0, "x start".into()),
            (100, "o end".into()),
            (1000, "x end".into()),
            (1000, "b start".into()),
            (1100, "b end".into()),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_exclusive_call_no_longer_holds_back_the_calls_after_it() {
    let mut h = harness();
    let a = h.start(vec![sleep_call("a", "sleep", 1000)]);
    let x = h.start(vec![sleep_call("x", "write", 100)]);
    let b = h.start(vec![sleep_call("b", "sleep", 100)]);
    tokio::time::sleep(ms(500)).await;
    h.engine
        .abort_turn(x.turn_id(), toolwarden_core::protocol::CancelReason::User)
        .unwrap();
    for t in [a, x, b] {
        t.finish().await;
    }
    assert_eq!(
        h.log.timeline(),
        vec![
            (0, "a start".into()),
            (500, "b start".into()),
            (600, "b end".into()),
            (1000, "a end".into()),
        ]
    );
}
