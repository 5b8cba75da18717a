//! The loop detector (`loop` policy key): the same call (same tool, same canonical input) giving
//! the same result **in a row** within one session is annotated from the 3rd such call and
//! denied from the 5th. Another call of the session or a different result ends the run; calls
//! that never reached their tool do not count; `0` turns the detector off.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use common::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use toolwarden_core::{InProcessTool, ToolContext, ToolError};

/// Makes `n` calls of `tool` with `input` in `session`; their outcomes and texts.
async fn repeat(
    h: &mut Harness,
    session: &str,
    tool: &str,
    n: usize,
    input: Value,
) -> Vec<(Value, String)> {
    let mut out = Vec::new();
    for _ in 1..=n {
        h.calls += 1;
        let id = format!("c{}", h.calls);
        let r = h.run_in(session, call(&id, tool, input.clone())).await;
        let mut o = outcome(&r);
        if let Some(o) = o.as_object_mut() {
            o.remove("provenance");
        }
        out.push((o, r.text()));
    }
    out
}

/// The statuses of `results`, with the repeat count of an annotated one (`ok 3`).
fn statuses(results: &[(Value, String)]) -> Vec<String> {
    results
        .iter()
        .map(|(o, _)| match o.get("repeat_count") {
            Some(n) => format!("{} {n}", o["status"].as_str().unwrap_or("?")),
            None => o["status"].as_str().unwrap_or("?").to_owned(),
        })
        .collect()
}

fn ok(id: &str, repeat_count: Option<u32>) -> Value {
    let mut v =
        json!({"status": "ok", "attempts": 1, "call_id": id, "tool": "echo", "duration_ms": 0});
    if let Some(n) = repeat_count {
        v["repeat_count"] = json!(n);
    }
    v
}

const ANSWER: &str = r#"{"q":"same"}"#;

#[tokio::test(start_paused = true)]
async fn the_same_result_in_a_row_is_annotated_from_the_third_and_denied_from_the_fifth() {
    let mut h = Harness::new("");
    let results = repeat(&mut h, SESSION, "echo", 6, json!({"q": "same"})).await;
    let note = |nth: &str| {
        format!(
            "{ANSWER}\n[NOTE] This is the {nth} call in a row to \"echo\" with this input that gave the same result. If it keeps giving the same result, try a different approach. From the 5th such call on, calls will be denied."
        )
    };
    let denied = |id: &str| {
        (
            json!({"status": "denied", "decider": "loop_detector", "reason": "loop", "attempts": 0,
                   "call_id": id, "tool": "echo", "duration_ms": 0,
                   "detail": "the last 4 identical calls in a row gave the same result"}),
            "[DENIED] Tool \"echo\" was called with identical input too many times in a row in this session (the last 4 identical calls in a row gave the same result); this call was blocked to break a loop. Try a different approach or different input.".to_owned(),
        )
    };
    assert_eq!(
        results,
        vec![
            (ok("c1", None), ANSWER.to_owned()),
            (ok("c2", None), ANSWER.to_owned()),
            (ok("c3", Some(3)), note("3rd")),
            (ok("c4", Some(4)), note("4th")),
            denied("c5"),
            denied("c6"),
        ]
    );
    assert_eq!(h.log.runs("echo"), 4, "denied calls never ran");
    assert_eq!(
        shapes(&h.drain(), "tool_call_denied"),
        vec![
            json!({"type": "tool_call_denied", "turn_id": "t5", "call_id": "c5", "tool": "echo",
                   "decider": "loop_detector", "reason": "loop"}),
            json!({"type": "tool_call_denied", "turn_id": "t6", "call_id": "c6", "tool": "echo",
                   "decider": "loop_detector", "reason": "loop"}),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn polling_with_changing_results_is_never_denied() {
    let mut h = Harness::new("");
    let polls = Arc::new(AtomicU32::new(0));
    h.engine.register(InProcessTool::new(
        "poll",
        "How far a job is: a different answer every time",
        object_schema(json!({"job": {"type": "string"}})),
        move |_input, _ctx: ToolContext| {
            let n = polls.fetch_add(1, Ordering::Relaxed) + 1;
            async move { Ok::<_, ToolError>(format!("{n}% done")) }
        },
    ));
    let results = repeat(&mut h, SESSION, "poll", 20, json!({"job": "build"})).await;
    assert_eq!(statuses(&results), vec!["ok"; 20]);
    assert_eq!(results[19].1, "20% done");
}

#[tokio::test(start_paused = true)]
async fn a_different_call_in_between_ends_the_run() {
    let mut h = Harness::new("");
    let mut results = Vec::new();
    for i in 0..3 {
        // Key order and formatting do not make inputs different (canonical JSON)...
        let same: Value = serde_json::from_str(r#"{ "q" : "a" }"#).unwrap();
        results.extend(repeat(&mut h, SESSION, "echo", 2, same).await);
        // ...a different value does, and it ends the run.
        results.extend(repeat(&mut h, SESSION, "echo", 1, json!({"q": format!("b{i}")})).await);
    }
    assert_eq!(statuses(&results), vec!["ok"; 9]);
    // Without a different call in between, the third in a row is annotated.
    let more = repeat(&mut h, SESSION, "echo", 3, json!({"q": "a"})).await;
    assert_eq!(statuses(&more), vec!["ok", "ok", "ok 3"]);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_ends_the_run() {
    let mut h = Harness::new(
        r#"
        [tools.sleep]
        timeout = "1s"
        "#,
    );
    let mut results = repeat(&mut h, SESSION, "sleep", 2, json!({"ms": 10})).await;
    results.extend(repeat(&mut h, SESSION, "sleep", 1, json!({"ms": 5000})).await);
    results.extend(repeat(&mut h, SESSION, "sleep", 3, json!({"ms": 10})).await);
    assert_eq!(
        statuses(&results),
        vec!["ok", "ok", "timeout", "ok", "ok", "ok 3"]
    );
}

#[tokio::test(start_paused = true)]
async fn denied_and_unreachable_calls_do_not_count() {
    let mut h = Harness::new(
        r#"
        [tools.fail]
        approval = "deny"
        [tools.srv__flaky]
        retries = 0
        "#,
    );
    // Three calls that never reached the server (transport errors), then its answers.
    let flaky = repeat(&mut h, SESSION, "srv__flaky", 8, json!({"fail": 3})).await;
    assert_eq!(
        statuses(&flaky),
        vec![
            "error", "error", "error", "ok", "ok", "ok 3", "ok 4", "denied"
        ],
        "the transport errors neither counted nor ended the run"
    );
    // A denied call of another tool in between does not end a run either.
    let mut results = repeat(&mut h, SESSION, "echo", 2, json!({"q": "x"})).await;
    results.extend(repeat(&mut h, SESSION, "fail", 1, json!({})).await);
    results.extend(repeat(&mut h, SESSION, "echo", 1, json!({"q": "x"})).await);
    assert_eq!(statuses(&results), vec!["ok", "ok", "denied", "ok 3"]);
}

#[tokio::test(start_paused = true)]
async fn identical_calls_in_another_session_are_not_counted() {
    let mut h = Harness::new("");
    repeat(&mut h, "s1", "echo", 4, json!({"q": "same"})).await;
    let other = repeat(&mut h, "s2", "echo", 1, json!({"q": "same"})).await;
    assert_eq!(other, vec![(ok("c5", None), ANSWER.to_owned())]);
}

#[tokio::test(start_paused = true)]
async fn zero_turns_the_detector_off() {
    let mut h = Harness::new(
        r#"
        [tools.echo]
        loop = { warn_after = 0, block_after = 0 }
        "#,
    );
    let results = repeat(&mut h, SESSION, "echo", 10, json!({"q": "same"})).await;
    assert!(
        results.iter().all(|(o, text)| o["status"] == "ok"
            && o.get("repeat_count").is_none()
            && text == ANSWER),
        "{results:?}"
    );
    assert_eq!(h.log.runs("echo"), 10);
}
