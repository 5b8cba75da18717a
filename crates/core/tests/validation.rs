//! docs/GOVERNANCE.md, "The pipeline of one call": the first step — a known tool, an input that
//! matches its schema and is not too large. An invalid call ends `invalid` saying what is wrong,
//! runs nothing, and leaves the other calls of its turn alone.

mod common;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

/// Checks an invalid call's outcome (reason and detail) and text.
fn check_invalid(
    result: &toolwarden_core::protocol::CallResult,
    reason: &str,
    detail: &str,
    text: &str,
) {
    let id = result.outcome.call_id.as_str();
    check(
        result,
        json!({"status": "invalid", "reason": reason, "attempts": 0, "call_id": id,
               "tool": result.outcome.tool, "duration_ms": 0, "detail": detail}),
        text,
    );
}

#[tokio::test(start_paused = true)]
async fn an_unknown_tool_is_named_with_the_tools_closest_to_it() {
    let mut h = Harness::new("");
    // (called, detail)
    let cases = [
        ("slep", "Did you mean \"sleep\"?"),
        // A server's tool by its own name.
        ("flaky", "Did you mean \"srv__flaky\"?"),
        ("srv__flaxy", "Did you mean \"srv__flaky\"?"),
        ("srb__flaky", "Did you mean \"srv__flaky\"?"),
        ("rsv__flaky", "Did you mean \"srv__flaky\"?"),
        // Sharing the server is no closeness: `nope` is not a typo of `late` or `quiet`.
        (
            "srv__nope",
            "Available tools: blocking, echo, fail, sleep, srv__flaky, srv__late, srv__quiet, stubborn, ticker.",
        ),
        (
            "compile_everything",
            "Available tools: blocking, echo, fail, sleep, srv__flaky, srv__late, srv__quiet, stubborn, ticker.",
        ),
    ];
    for (name, detail) in cases {
        let r = h.call("c1", name, json!({})).await;
        check_invalid(
            &r,
            "unknown_tool",
            detail,
            &format!("[INVALID] There is no tool named \"{name}\". {detail}"),
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_input_that_does_not_match_the_schema_says_where() {
    let mut h = Harness::new("");
    let cases = [
        (json!({"q": 5}), "/q: 5 is not of type \"string\""),
        (json!({}), "(input): \"q\" is a required property"),
        (json!([1]), "(input): [1] is not of type \"object\""),
    ];
    for (input, detail) in cases {
        let r = h.call("c1", "echo", input.clone()).await;
        check_invalid(
            &r,
            "schema",
            detail,
            &format!(
                "[INVALID] The input to tool \"echo\" does not match its schema; it was not run. {detail}. Fix the input and call it again."
            ),
        );
    }
    assert_eq!(h.log.runs("echo"), 0);
}

#[tokio::test(start_paused = true)]
async fn an_input_over_max_input_is_too_large() {
    let mut h = Harness::new(
        r#"
        [tools.echo]
        max_input = "1KiB"
        "#,
    );
    // Canonical JSON {"q":"xx…"}: 2000 + 8 bytes.
    let r = h.call("c1", "echo", json!({"q": "x".repeat(2000)})).await;
    check_invalid(
        &r,
        "too_large",
        "It is 2.0 KiB; the limit is 1.0 KiB.",
        "[INVALID] The input to tool \"echo\" is too large; it was not run. It is 2.0 KiB; the limit is 1.0 KiB.",
    );
    let r = h.call("c2", "echo", json!({"q": "x".repeat(1000)})).await;
    assert_eq!(status(&r), json!({"status": "ok", "call_id": "c2"}));
}

#[tokio::test(start_paused = true)]
async fn invalid_calls_run_nothing_and_the_rest_of_the_turn_runs() {
    let mut h = Harness::new("");
    let req = h.turn(vec![
        call("c1", "nope", json!({})),
        call("c2", "echo", json!({"q": 1})),
        call("c3", "sleep", json!({"ms": 100})),
        call("c4", "echo", json!({"q": "fine"})),
    ]);
    let out = h.engine.run_turn(req).await.unwrap();
    assert_eq!(
        out.results
            .iter()
            .map(|r| status(r))
            .collect::<Vec<Value>>(),
        vec![
            json!({"status": "invalid", "reason": "unknown_tool", "call_id": "c1"}),
            json!({"status": "invalid", "reason": "schema", "call_id": "c2"}),
            json!({"status": "ok", "call_id": "c3"}),
            json!({"status": "ok", "call_id": "c4"}),
        ]
    );
    assert_eq!((h.log.runs("echo"), h.log.runs("sleep")), (1, 1));
    let events = h.drain();
    assert_eq!(
        of_type(&events, "tool_start")
            .iter()
            .map(|e| e.scope.call_id.as_ref().map(|c| c.to_string()))
            .collect::<Vec<_>>(),
        vec![Some("c3".into()), Some("c4".into())],
        "invalid calls never start"
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_input_is_an_empty_object() {
    let mut h = Harness::new("");
    let r = h.call("c1", "sleep", Value::Null).await;
    assert_eq!(
        (status(&r), r.text()),
        (json!({"status": "ok", "call_id": "c1"}), "slept 0ms".into())
    );
}
