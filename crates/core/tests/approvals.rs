//! docs/GOVERNANCE.md, "Interactions": approvals and confirms. Headless fails at once; a person
//! approves or denies; no answer denies exactly at the deadline and is recorded as a timeout, never
//! as a denial.

mod common;

use std::sync::Arc;

use common::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::time::{Instant, sleep};
use toolwarden_core::protocol::{
    Interaction, InteractionAction, InteractionAnswer, InteractionKind, ToolAnnotations,
};
use toolwarden_core::{AnswerSender, Interactor};

const ASK: &str = r#"
[tools.ask]
approval = "ask"
"#;

fn harness(config: &str) -> Harness {
    let h = Harness::new(config);
    h.add_sleep("ask");
    h
}

/// Starts `c1` on `tool` and waits until its question is pending; returns it.
async fn asked(h: &mut Harness, tool: &str) -> (toolwarden_core::TurnHandle, Interaction) {
    let turn = h.start(vec![call("c1", tool, json!({"ms": 100}))]);
    h.until("interaction_requested").await;
    let mut pending = h.engine.interactions().pending();
    assert_eq!(pending.len(), 1, "one question");
    (turn, pending.remove(0))
}

/// The question as a person sees it, without its id and wall-clock times.
fn question(i: &Interaction) -> Value {
    json!({"kind": i.kind, "message": i.message, "tool": i.scope.tool, "call_id": i.scope.call_id,
           "input": i.input, "timeout_ms": i.timeout_ms})
}

#[tokio::test(start_paused = true)]
async fn headless_an_approval_is_denied_at_once() {
    let text = "[DENIED] Tool \"ask\" needs a person's approval, but nobody can answer in this run (headless); it was not run. Do not retry it; find another way or report that approval is needed.";
    let expected = json!({"status": "denied", "decider": "headless", "reason": "no_interactor",
                          "attempts": 0, "call_id": "c1", "tool": "ask", "duration_ms": 0});
    // Nothing attached that can answer...
    let mut h = harness(ASK);
    check(
        &*h.call("c1", "ask", json!({"ms": 100})).await,
        expected.clone(),
        text,
    );
    // ...or headless although a person is attached.
    let mut h = Harness::with(ASK, |b| b.headless(true));
    h.add_sleep("ask");
    h.attach_person();
    check(
        &*h.call("c1", "ask", json!({"ms": 100})).await,
        expected,
        text,
    );
    assert_eq!(
        shapes(&h.drain(), "tool_call_denied"),
        vec![
            json!({"type": "tool_call_denied", "turn_id": "t1", "call_id": "c1", "tool": "ask",
                    "decider": "headless", "reason": "no_interactor"})
        ]
    );
    assert_eq!(h.log.runs("ask"), 0);
    assert_eq!(
        metric_lines(
            &h.engine.metrics().encode(),
            "toolwarden_interactions_total"
        ),
        vec!["toolwarden_interactions_total{kind=\"approval\",outcome=\"no_interactor\"} 1"]
    );
}

#[tokio::test(start_paused = true)]
async fn an_approved_call_runs_and_its_deadline_starts_when_it_does() {
    let mut h = harness(
        r#"
        [tools.ask]
        approval = "ask"
        timeout = "5s"
        "#,
    );
    h.attach_person();
    let (turn, q) = asked(&mut h, "ask").await;
    assert_eq!(
        question(&q),
        json!({"kind": "approval", "message": "Allow tool \"ask\" to run with this input?",
               "tool": "ask", "call_id": "c1", "input": {"ms": 100}, "timeout_ms": 120_000})
    );
    // The person takes longer than the tool's timeout to answer; that time does not count.
    sleep(secs(10)).await;
    h.engine
        .interactions()
        .answer(&q.id, InteractionAnswer::approve(), "http")
        .unwrap();
    let out = turn.finish().await;
    assert_eq!(
        (status(&out.results[0]), out.results[0].outcome.duration_ms),
        (json!({"status": "ok", "call_id": "c1"}), 10_100)
    );
    assert_eq!(
        shapes(&h.drain(), "interaction_answered"),
        vec![
            json!({"type": "interaction_answered", "turn_id": "t1", "call_id": "c1",
                    "tool": "ask", "interaction_id": q.id, "kind": "approval",
                    "action": "approve", "by": "http"})
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_denied_call_does_not_run() {
    let mut h = harness(ASK);
    h.attach_person();
    let (turn, q) = asked(&mut h, "ask").await;
    let answer = InteractionAnswer {
        reason: Some("not now".into()),
        ..InteractionAnswer::deny()
    };
    h.engine
        .interactions()
        .answer(&q.id, answer, "http")
        .unwrap();
    let out = turn.finish().await;
    check(
        &out.results[0],
        json!({"status": "denied", "decider": "policy", "reason": "user", "attempts": 0,
               "call_id": "c1", "tool": "ask", "duration_ms": 0, "detail": "not now"}),
        "[DENIED] The user denied the call to tool \"ask\"; it was not run. Reason: not now. Do not retry it without asking.",
    );
    assert_eq!(h.log.runs("ask"), 0);
}

#[tokio::test(start_paused = true)]
async fn no_answer_denies_exactly_at_the_deadline_as_a_timeout() {
    for (config, deadline_ms, said) in [
        (ASK.to_owned(), 120_000, "2m"),
        (format!("{ASK}approval_timeout = \"30s\""), 30_000, "30s"),
    ] {
        let mut h = harness(&config);
        h.attach_person();
        let t0 = Instant::now();
        let (turn, q) = asked(&mut h, "ask").await;
        assert_eq!(q.timeout_ms, deadline_ms);
        let out = turn.finish().await;
        assert_eq!(t0.elapsed(), ms(deadline_ms), "{config}");
        check(
            &out.results[0],
            json!({"status": "denied", "decider": "policy", "reason": "timeout", "attempts": 0,
                   "call_id": "c1", "tool": "ask", "duration_ms": deadline_ms,
                   "detail": format!("no answer within {said}")}),
            &format!(
                "[DENIED] Nobody approved the call to tool \"ask\" in time (no answer within {said}); it was not run. Ask the user before trying again."
            ),
        );
        let events = h.drain();
        assert_eq!(
            types(&events),
            vec![
                "interaction_timed_out",
                "tool_call_denied",
                "tool_result",
                "turn_end"
            ]
        );
        assert_eq!(
            shapes(&events, "tool_call_denied")[0]["reason"],
            "timeout",
            "never a user's denial"
        );
        assert!(h.engine.interactions().pending().is_empty());
        assert_eq!(h.log.runs("ask"), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn approval_deny_never_runs() {
    let mut h = Harness::new(
        r#"
        [tools.sleep]
        approval = "deny"
        "#,
    );
    h.attach_person();
    check(
        &*h.call("c1", "sleep", json!({"ms": 1})).await,
        json!({"status": "denied", "decider": "policy", "reason": "rule", "attempts": 0,
               "call_id": "c1", "tool": "sleep", "duration_ms": 0}),
        "[DENIED] Tool \"sleep\" is not allowed by policy; it was not run. Do not retry it.",
    );
    assert_eq!(
        h.engine.interactions().pending(),
        vec![],
        "nobody was asked"
    );
}

#[tokio::test(start_paused = true)]
async fn a_destructive_tool_asks_for_confirmation() {
    let destructive = ToolAnnotations {
        destructive_hint: Some(true),
        ..ToolAnnotations::default()
    };
    let mut h = Harness::new(
        r#"
        [tools.trusted_rm]
        approval = "auto"
        "#,
    );
    h.add_annotated("rm", destructive.clone());
    h.add_annotated("trusted_rm", destructive.clone());
    h.add_annotated(
        "read_only",
        ToolAnnotations {
            read_only_hint: Some(true),
            ..destructive
        },
    );
    h.attach_person();
    let (turn, q) = asked(&mut h, "rm").await;
    assert_eq!(
        question(&q),
        json!({"kind": "confirm", "message": "Tool \"rm\" may be destructive. Run it with this input?",
               "tool": "rm", "call_id": "c1", "input": {"ms": 100}, "timeout_ms": 60_000})
    );
    h.engine
        .interactions()
        .answer(&q.id, InteractionAnswer::approve(), "http")
        .unwrap();
    assert_eq!(
        status(&turn.finish().await.results[0]),
        json!({"status": "ok", "call_id": "c1"})
    );
    // The config wins over the hint; a read-only tool is not destructive.
    for tool in ["trusted_rm", "read_only"] {
        let r = h.call("c2", tool, json!({})).await;
        assert_eq!(
            status(&r),
            json!({"status": "ok", "call_id": "c2"}),
            "{tool}"
        );
    }
    assert_eq!(h.engine.interactions().pending(), vec![]);
}

/// An interactor that answers every question itself, as a terminal prompt or MCP elicitation
/// would.
struct AutoAnswer(InteractionAction);

impl Interactor for AutoAnswer {
    fn name(&self) -> &str {
        "robot"
    }

    fn can_answer(&self, _: &Interaction) -> bool {
        true
    }

    fn present(&self, interaction: &Interaction, answers: AnswerSender) {
        assert_eq!(interaction.kind, InteractionKind::Approval);
        let action = self.0;
        tokio::spawn(async move {
            sleep(secs(1)).await;
            let answer = InteractionAnswer {
                action,
                value: None,
                reason: None,
                answerer: None,
            };
            assert_eq!(answers.answer(answer, "robot"), Ok(()));
        });
    }
}

/// An interactor that cannot put any question before a person (e.g. a client without
/// elicitation).
struct Unable;

impl Interactor for Unable {
    fn name(&self) -> &str {
        "unable"
    }

    fn can_answer(&self, _: &Interaction) -> bool {
        false
    }

    fn present(&self, _: &Interaction, _: AnswerSender) {
        unreachable!("never asked")
    }
}

#[tokio::test(start_paused = true)]
async fn an_active_interactor_answers_through_its_sender() {
    for (action, expected) in [
        (
            InteractionAction::Approve,
            json!({"status": "ok", "call_id": "c1"}),
        ),
        (
            InteractionAction::Deny,
            json!({"status": "denied", "decider": "policy", "reason": "user", "call_id": "c1"}),
        ),
    ] {
        let mut h = harness(ASK);
        h.engine.interactions().attach(Arc::new(AutoAnswer(action)));
        let r = h.call("c1", "ask", json!({"ms": 100})).await;
        assert_eq!(status(&r), expected);
    }
    let mut h = harness(ASK);
    h.engine.interactions().attach(Arc::new(Unable));
    let r = h.call("c1", "ask", json!({"ms": 100})).await;
    assert_eq!(
        status(&r),
        json!({"status": "denied", "decider": "headless", "reason": "no_interactor", "call_id": "c1"})
    );
}
