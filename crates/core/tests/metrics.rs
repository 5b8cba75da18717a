//! docs/GOVERNANCE.md, "Metrics": after a few calls, `Metrics::encode()` shows every documented
//! name with the right counts.

mod common;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio::time::sleep;
use toolwarden_core::protocol::ServerStateKind;

/// The lines of metric `name` (its samples, not its help) whose labels mention `tool`, if given.
fn lines(h: &Harness, name: &str, tool: Option<&str>) -> Vec<String> {
    metric_lines(&h.engine.metrics().encode(), name)
        .into_iter()
        .filter(|l| tool.is_none_or(|t| l.contains(&format!("tool=\"{t}\""))))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_few_calls_show_in_the_spec_metrics() {
    let mut h = Harness::new(
        r#"
        [tools.echo]
        idempotent = true
        cache_ttl = "60s"

        [tools.sleep]
        timeout = "1500ms"
        "#,
    );
    h.call("c1", "echo", json!({"q": "a"})).await; // ok
    h.call("c2", "echo", json!({"q": "a"})).await; // ok, from the cache
    h.call("c3", "sleep", json!({"ms": 5000})).await; // timeout after 1.5s
    h.call("c4", "fail", json!({})).await; // the tool's own error
    let req = h.turn(vec![
        call("c5", "sleep", json!({"ms": 100})),
        call("c6", "nope", json!({})),
    ]);
    h.engine.run_turn(req).await.unwrap(); // ok and invalid

    assert_eq!(
        lines(&h, "toolwarden_tool_calls_total", None),
        vec![
            "toolwarden_tool_calls_total{tool=\"echo\",outcome=\"ok\"} 2",
            "toolwarden_tool_calls_total{tool=\"fail\",outcome=\"error\"} 1",
            "toolwarden_tool_calls_total{tool=\"sleep\",outcome=\"ok\"} 1",
            "toolwarden_tool_calls_total{tool=\"sleep\",outcome=\"timeout\"} 1",
        ],
        "an unknown tool has no metrics of its own"
    );
    assert_eq!(
        lines(&h, "toolwarden_tool_errors_total", None),
        vec![
            "toolwarden_tool_errors_total{tool=\"fail\",reason=\"tool_error\"} 1",
            "toolwarden_tool_errors_total{tool=\"sleep\",reason=\"timeout_total\"} 1",
        ]
    );
    assert_eq!(
        lines(&h, "toolwarden_tool_call_duration_seconds_", Some("sleep"))
            .into_iter()
            .filter(|l| !l.contains("_bucket"))
            .collect::<Vec<_>>(),
        vec![
            "toolwarden_tool_call_duration_seconds_count{tool=\"sleep\",outcome=\"ok\"} 1",
            "toolwarden_tool_call_duration_seconds_count{tool=\"sleep\",outcome=\"timeout\"} 1",
            "toolwarden_tool_call_duration_seconds_sum{tool=\"sleep\",outcome=\"ok\"} 0.1",
            "toolwarden_tool_call_duration_seconds_sum{tool=\"sleep\",outcome=\"timeout\"} 1.5",
        ]
    );
    assert_eq!(
        lines(&h, "toolwarden_tool_cache_hits_total", Some("echo")),
        vec!["toolwarden_tool_cache_hits_total{tool=\"echo\"} 1"]
    );
    assert_eq!(
        lines(&h, "toolwarden_turns_total", None),
        vec![
            "toolwarden_turns_total{outcome=\"aborted\"} 0",
            "toolwarden_turns_total{outcome=\"completed\"} 2",
            "toolwarden_turns_total{outcome=\"partial\"} 3",
        ]
    );
    assert_eq!(
        lines(&h, "toolwarden_breaker_state", Some("sleep")),
        vec!["toolwarden_breaker_state{tool=\"sleep\"} 0"]
    );
}

#[tokio::test(start_paused = true)]
async fn calls_in_flight_are_counted_while_they_run() {
    let mut h = Harness::new("");
    let turn = h.start(vec![
        call("c1", "sleep", json!({"ms": 1000})),
        call("c2", "sleep", json!({"ms": 2000})),
    ]);
    sleep(ms(500)).await;
    assert_eq!(
        lines(&h, "toolwarden_tool_calls_in_flight", Some("sleep")),
        vec!["toolwarden_tool_calls_in_flight{tool=\"sleep\"} 2"]
    );
    sleep(secs(1)).await;
    assert_eq!(
        lines(&h, "toolwarden_tool_calls_in_flight", Some("sleep")),
        vec!["toolwarden_tool_calls_in_flight{tool=\"sleep\"} 1"]
    );
    turn.finish().await;
    assert_eq!(
        lines(&h, "toolwarden_tool_calls_in_flight", Some("sleep")),
        vec!["toolwarden_tool_calls_in_flight{tool=\"sleep\"} 0"]
    );
}

#[tokio::test(start_paused = true)]
async fn servers_report_whether_they_are_up() {
    let h = Harness::new("");
    let host = h.engine.host(true);
    host.server_state("srv", ServerStateKind::Up, None);
    assert_eq!(
        lines(&h, "toolwarden_server_up", None),
        vec!["toolwarden_server_up{server=\"srv\"} 1"]
    );
    host.server_state("srv", ServerStateKind::Down, Some("exited".into()));
    assert_eq!(
        lines(&h, "toolwarden_server_up", None),
        vec!["toolwarden_server_up{server=\"srv\"} 0"]
    );
}
