//! docs/GOVERNANCE.md, "The cache and single flight": the cache keeps `ok` results of idempotent
//! tools with `cache_ttl > 0`, serves them with provenance, expires them, and lets identical
//! concurrent calls share one execution.

mod common;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio::time::{Instant, sleep};
use toolwarden_core::protocol::{CancelReason, ToolAnnotations};

const CACHED_ECHO: &str = r#"
[tools.echo]
idempotent = true
cache_ttl = "60s"
"#;

#[tokio::test(start_paused = true)]
async fn a_hit_carries_the_provenance_of_the_original() {
    let mut h = Harness::new(CACHED_ECHO);
    let first = h.call("c1", "echo", json!({"q": "weather"})).await;
    let original = first.outcome.provenance.clone().unwrap();
    sleep(secs(5)).await;
    let hit = h.call("c2", "echo", json!({"q": "weather"})).await;
    check(
        &hit,
        json!({"status": "ok", "attempts": 0, "call_id": "c2", "tool": "echo", "duration_ms": 0,
               "provenance": {"source": "cache", "cache_hit": true, "digest": original.digest,
                              "origin_call_id": "c1"}}),
        r#"{"q":"weather"}"#,
    );
    let provenance = hit.outcome.provenance.clone().unwrap();
    assert_eq!(
        provenance.fetched_at, original.fetched_at,
        "the original's time"
    );
    assert_eq!(hit.structured_content, first.structured_content);
    assert_eq!(h.log.runs("echo"), 1);
    let events = h.drain();
    assert_eq!(
        shapes(&events, "cache_hit"),
        vec![
            json!({"type": "cache_hit", "turn_id": "t2", "call_id": "c2", "tool": "echo",
                    "origin_call_id": "c1", "fetched_at": original.fetched_at})
        ]
    );
    assert_eq!(
        metric_lines(
            &h.engine.metrics().encode(),
            "toolwarden_tool_cache_hits_total{tool=\"echo\"}"
        ),
        vec!["toolwarden_tool_cache_hits_total{tool=\"echo\"} 1"]
    );
}

#[tokio::test(start_paused = true)]
async fn only_ok_results_of_idempotent_tools_with_a_ttl_are_kept() {
    // (config, tool, runs after two identical calls)
    let cases = [
        (
            "[tools.echo]\nidempotent = true\ncache_ttl = \"60s\"",
            "echo",
            1,
        ),
        ("[tools.echo]\ncache_ttl = \"60s\"", "echo", 2), // not idempotent
        ("[tools.echo]\nidempotent = true", "echo", 2),   // no ttl
        (
            "[tools.fail]\nidempotent = true\ncache_ttl = \"60s\"",
            "fail",
            2, // its own error is not kept
        ),
        (
            "[tools.lookup]\ncache_ttl = \"60s\"", // idempotent from readOnlyHint
            "lookup",
            1,
        ),
    ];
    for (config, tool, runs) in cases {
        let mut h = Harness::new(config);
        h.add_annotated(
            "lookup",
            ToolAnnotations {
                read_only_hint: Some(true),
                ..ToolAnnotations::default()
            },
        );
        let input = if tool == "echo" {
            json!({"q": "same"})
        } else {
            json!({})
        };
        h.call("c1", tool, input.clone()).await;
        h.call("c2", tool, input).await;
        assert_eq!(h.log.runs(tool), runs, "{config}");
    }
}

#[tokio::test(start_paused = true)]
async fn entries_expire_after_their_ttl() {
    let mut h = Harness::new(
        r#"
        [tools.echo]
        idempotent = true
        cache_ttl = "10s"
        "#,
    );
    let t0 = Instant::now();
    let q = json!({"q": "news"});
    h.call("c1", "echo", q.clone()).await;
    sleep(t0 + ms(9_999) - Instant::now()).await;
    let hit = h.call("c2", "echo", q.clone()).await;
    assert_eq!(
        hit.outcome.provenance.as_ref().map(|p| p.cache_hit),
        Some(true)
    );
    sleep(t0 + secs(10) - Instant::now()).await;
    let fresh = h.call("c3", "echo", q).await;
    assert_eq!(
        fresh.outcome.provenance.as_ref().map(|p| p.cache_hit),
        Some(false)
    );
    assert_eq!(h.log.runs("echo"), 2);
}

#[tokio::test(start_paused = true)]
async fn identical_calls_at_the_same_time_share_one_execution() {
    let mut h = Harness::new(
        r#"
        [tools.sleep]
        idempotent = true
        cache_ttl = "60s"
        "#,
    );
    // Two in one turn, one in another session (whose task runs after this one started).
    let other = h.turn_in("s2", vec![call("o1", "sleep", json!({"ms": 1000}))]);
    let other = h.engine.start_turn(other).unwrap();
    let req = h.turn(vec![
        call("c1", "sleep", json!({"ms": 1000})),
        call("c2", "sleep", json!({"ms": 1000})),
    ]);
    let t0 = Instant::now();
    let out = h.engine.run_turn(req).await.unwrap();
    assert_eq!(t0.elapsed(), secs(1));
    let other = other.finish().await;
    let sources: Vec<_> = out
        .results
        .iter()
        .chain(&other.results)
        .map(|r| {
            let p = r.outcome.provenance.clone().unwrap();
            (
                r.outcome.call_id.to_string(),
                r.text(),
                p.cache_hit,
                p.origin_call_id,
            )
        })
        .collect();
    assert_eq!(
        sources,
        vec![
            ("c1".into(), "slept 1000ms".into(), false, None),
            ("c2".into(), "slept 1000ms".into(), true, Some("c1".into())),
            ("o1".into(), "slept 1000ms".into(), true, Some("c1".into())),
        ]
    );
    assert_eq!(h.log.runs("sleep"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_leader_lets_a_follower_run() {
    let mut h = Harness::new(
        r#"
        [tools."srv__flaky"]
        idempotent = true
        cache_ttl = "60s"
        "#,
    );
    // The first run with this input fails after 500ms; the next succeeds.
    let input = json!({"fail": 1, "ms": 500});
    let req = h.turn(vec![
        call("c1", "srv__flaky", input.clone()),
        call("c2", "srv__flaky", input),
    ]);
    let out = h.engine.run_turn(req).await.unwrap();
    assert_eq!(
        out.results
            .iter()
            .map(|r| (status(r), r.outcome.duration_ms))
            .collect::<Vec<_>>(),
        vec![
            (
                json!({"status": "error", "reason": "transport", "call_id": "c1"}),
                500
            ),
            (json!({"status": "ok", "call_id": "c2"}), 1000),
        ]
    );
    assert_eq!(
        out.results[1]
            .outcome
            .provenance
            .as_ref()
            .map(|p| p.cache_hit),
        Some(false),
        "it ran itself"
    );
    assert_eq!(h.log.runs("srv__flaky"), 2);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_leader_lets_a_follower_run() {
    let mut h = Harness::new(
        r#"
        [tools.sleep]
        idempotent = true
        cache_ttl = "60s"
        "#,
    );
    let req = h.turn(vec![
        call("c1", "sleep", json!({"ms": 1000})),
        call("c2", "sleep", json!({"ms": 1000})),
    ]);
    let turn = h.engine.start_turn(req).unwrap();
    sleep(ms(200)).await;
    h.engine
        .abort_call(turn.turn_id(), &"c1".into(), CancelReason::User)
        .unwrap();
    let out = turn.finish().await;
    assert_eq!(
        out.results
            .iter()
            .map(|r| (status(r), r.outcome.duration_ms))
            .collect::<Vec<_>>(),
        vec![
            (
                json!({"status": "cancelled", "reason": "user", "call_id": "c1"}),
                200
            ),
            (json!({"status": "ok", "call_id": "c2"}), 1200),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_identical_call_waiting_for_its_place_in_the_session_does_not_deadlock() {
    let mut h = Harness::new(
        r#"
        [tools.write]
        concurrency = "exclusive"
        idempotent = true
        cache_ttl = "60s"
        "#,
    );
    h.add_sleep("write");
    // c1 takes its place in the session first, but its task runs only after c2 was looked up:
    // c2 must wait for c1 to run (exclusive), so c1 must not wait for c2's execution.
    let first = h.turn(vec![call("c1", "write", json!({"ms": 100}))]);
    let first = h.engine.start_turn(first).unwrap();
    let second = h.turn(vec![call("c2", "write", json!({"ms": 100}))]);
    let both = async {
        let second = h.engine.run_turn(second).await.unwrap();
        (first.finish().await, second)
    };
    let (first, second) = tokio::time::timeout(secs(3600), both)
        .await
        .expect("the two calls waited for each other");
    let provenance = |r: &toolwarden_core::protocol::CallResult| {
        let p = r.outcome.provenance.clone().unwrap();
        (r.outcome.duration_ms, p.cache_hit, p.origin_call_id)
    };
    assert_eq!(provenance(&first.results[0]), (100, false, None));
    assert_eq!(
        provenance(&second.results[0]),
        (100, true, Some("c1".into()))
    );
    assert_eq!(h.log.runs("write"), 1);
}
