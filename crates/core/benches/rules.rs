//! What `[[rules]]` cost a call: the rules' verdict alone, as the pipeline asks for it.
//!
//! `cargo bench -p toolwarden-core --bench rules`
//!
//! Targets (docs/PERFORMANCE.md): with 50 rules configured, a call of a tool no rule names pays
//! ≤ 0.2 µs; a call whose tool 3 rules match, each with a `when`, ≤ 5 µs; an exec line judged
//! command by command is measured beside them.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use divan::Bencher;
use serde_json::json;
use toolwarden_core::protocol::{Principal, RuleConfig, RuleDecision, Scopes};
use toolwarden_core::rules::{Facts, Rules};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    divan::main();
}

/// 47 rules about other tools, and 3 with a `when` about `fs__write`.
fn fifty() -> Rules {
    let mut configs: Vec<RuleConfig> = (0..47)
        .map(|i| RuleConfig {
            tools: vec![format!("server{i}__*")],
            principals: Some(vec!["ci-*".into()]),
            when: Some("has(args.path) && args.path.startsWith(\"/etc\")".into()),
            decision: Some(RuleDecision::Deny),
            reason: None,
        })
        .collect();
    for (when, decision) in [
        (
            "has(args.path) && args.path.startsWith(\"/etc\")",
            RuleDecision::Deny,
        ),
        ("size(args.content) > 100000", RuleDecision::Confirm),
        (
            "principal.startsWith(\"agent-\") && !(\"approve\" in scopes)",
            RuleDecision::Ask,
        ),
    ] {
        configs.push(RuleConfig {
            tools: vec!["fs__write".into()],
            principals: None,
            when: Some(when.into()),
            decision: Some(decision),
            reason: None,
        });
    }
    configs.push(RuleConfig {
        tools: vec!["exec".into()],
        principals: None,
        when: Some(
            "args.commands.all(c, c.name in [\"ls\", \"cat\", \"grep\"] || (c.name == \"git\" && c.argv[1] in [\"status\", \"log\"]))"
                .into(),
        ),
        decision: Some(RuleDecision::Allow),
        reason: None,
    });
    Rules::compile(&configs).unwrap().unwrap()
}

fn facts<'a>(tool: &'a str, args: &'a serde_json::Value, who: &'a Principal) -> Facts<'a> {
    Facts {
        tool,
        args,
        principal: who,
        session_id: Some("s1"),
        annotations: None,
        server: None,
    }
}

#[divan::bench]
fn fifty_rules_none_names_the_tool(b: Bencher) {
    let rules = fifty();
    let who = Principal::new("agent-7", Scopes::all());
    let args = json!({"path": "/tmp/x", "content": "hello"});
    b.bench_local(|| rules.decide(&facts("github__create_issue", &args, &who)));
}

#[divan::bench]
fn three_rules_with_when_match_the_tool(b: Bencher) {
    let rules = fifty();
    let who = Principal::new("agent-7", Scopes::all());
    let args = json!({"path": "/tmp/x", "content": "hello"});
    b.bench_local(|| {
        // Each of the three is evaluated; none holds.
        assert!(rules.decide(&facts("fs__write", &args, &who)).is_none());
    });
}

#[divan::bench]
fn an_exec_line_judged_command_by_command(b: Bencher) {
    let rules = fifty();
    let who = Principal::new("agent-7", Scopes::all());
    let args = json!({"command": "git status && ls -la | grep foo"});
    b.bench_local(|| {
        let v = rules.decide(&facts("exec", &args, &who)).unwrap();
        assert_eq!(v.decision, RuleDecision::Allow);
    });
}
