//! SPEC §2.1 `loop`: identical calls (same tool, same canonical input) in one session are
//! annotated from the 3rd and denied from the 5th; `0` turns the detector off.

mod common;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

/// Makes `n` calls of `echo` with `input` in `session`; their outcomes and texts.
async fn repeat(h: &mut Harness, session: &str, n: usize, input: Value) -> Vec<(Value, String)> {
    let mut out = Vec::new();
    for i in 1..=n {
        let r = h
            .run_in(session, call(&format!("c{i}"), "echo", input.clone()))
            .await;
        let mut o = outcome(&r);
        if let Some(o) = o.as_object_mut() {
            o.remove("provenance");
        }
        out.push((o, r.text()));
    }
    out
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
async fn the_third_identical_call_is_annotated_and_the_fifth_denied() {
    let mut h = Harness::new("");
    let results = repeat(&mut h, SESSION, 6, json!({"q": "same"})).await;
    let note = |nth: &str, more: &str| {
        format!(
            "{ANSWER}\n[NOTE] This is the {nth} identical call to \"echo\" in this session. If it keeps giving the same result, try a different approach.{more}"
        )
    };
    let denied = |id: &str, count: u32| {
        (
            json!({"status": "denied", "decider": "loop_detector", "reason": "loop", "attempts": 0,
                   "call_id": id, "tool": "echo", "duration_ms": 0,
                   "detail": format!("{count} identical calls")}),
            format!(
                "[DENIED] Tool \"echo\" was called with identical input too many times in this session ({count} identical calls); this call was blocked to break a loop. Try a different approach or different input."
            ),
        )
    };
    assert_eq!(
        results,
        vec![
            (ok("c1", None), ANSWER.to_owned()),
            (ok("c2", None), ANSWER.to_owned()),
            (
                ok("c3", Some(3)),
                note(
                    "3rd",
                    " From the 5th identical call on, calls will be denied."
                )
            ),
            (
                ok("c4", Some(4)),
                note(
                    "4th",
                    " From the 5th identical call on, calls will be denied."
                )
            ),
            denied("c5", 5),
            denied("c6", 6),
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
async fn a_different_input_is_a_different_call() {
    let mut h = Harness::new("");
    for i in 0..3 {
        // Key order and formatting do not make inputs different (canonical JSON)...
        let same: Value = serde_json::from_str(r#"{ "q" : "a" }"#).unwrap();
        repeat(&mut h, SESSION, 1, same).await;
        // ...a different value does.
        repeat(&mut h, SESSION, 1, json!({"q": format!("b{i}")})).await;
    }
    let counts: Vec<Value> = shapes(&h.drain(), "tool_result")
        .iter()
        .map(|e| e["outcome"]["repeat_count"].clone())
        .collect();
    assert_eq!(
        counts,
        vec![
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            json!(3),
            Value::Null
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn identical_calls_in_another_session_are_not_counted() {
    let mut h = Harness::new("");
    repeat(&mut h, "s1", 4, json!({"q": "same"})).await;
    let other = repeat(&mut h, "s2", 1, json!({"q": "same"})).await;
    assert_eq!(other, vec![(ok("c1", None), ANSWER.to_owned())]);
}

#[tokio::test(start_paused = true)]
async fn zero_turns_the_detector_off() {
    let mut h = Harness::new(
        r#"
        [tools.echo]
        loop = { warn_after = 0, block_after = 0 }
        "#,
    );
    let results = repeat(&mut h, SESSION, 10, json!({"q": "same"})).await;
    assert!(
        results.iter().all(|(o, text)| o["status"] == "ok"
            && o.get("repeat_count").is_none()
            && text == ANSWER),
        "{results:?}"
    );
    assert_eq!(h.log.runs("echo"), 10);
}
