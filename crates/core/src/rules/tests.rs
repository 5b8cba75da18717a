use serde_json::json;
use toolwarden_protocol::{Principal, RuleConfig, RuleDecision, Scope, Scopes};

use super::*;

fn rule(tools: &[&str], when: Option<&str>, decision: RuleDecision) -> RuleConfig {
    RuleConfig {
        tools: tools.iter().map(|t| (*t).to_owned()).collect(),
        principals: None,
        when: when.map(str::to_owned),
        decision: Some(decision),
        reason: Some(format!("{decision:?}")),
    }
}

fn compiled(configs: &[RuleConfig]) -> Rules {
    Rules::compile(configs).unwrap().unwrap()
}

fn decide(rules: &Rules, tool: &str, args: serde_json::Value, who: &str) -> Option<RuleDecision> {
    let principal = Principal::new(who, Scopes::NONE.with(Scope::Call));
    rules
        .decide(&Facts {
            tool,
            args: &args,
            principal: &principal,
            session_id: Some("s1"),
            annotations: None,
            server: None,
        })
        .map(|v| v.decision)
}

#[test]
fn globs_match_whole_names() {
    assert!(glob("exec", "exec"));
    assert!(!glob("exec", "exec2"));
    assert!(glob("github__*", "github__create_issue"));
    assert!(!glob("github__*", "gitlab__x"));
    assert!(glob("*", ""));
    assert!(glob("a*b*c", "a-b-b-c"));
    assert!(glob("ci-?", "ci-1"));
    assert!(!glob("ci-?", "ci-12"));
}

#[test]
fn the_most_restrictive_decision_wins_whatever_the_order() {
    use RuleDecision::*;
    let configs = [
        rule(&["fs__*"], None, Allow),
        rule(&["fs__write"], None, Confirm),
        rule(
            &["*"],
            Some("has(args.path) && args.path.startsWith(\"/etc\")"),
            Deny,
        ),
        rule(&["fs__read"], None, Ask),
    ];
    for order in [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]] {
        let rules = compiled(&order.map(|i| configs[i].clone()));
        assert_eq!(decide(&rules, "fs__list", json!({}), "a"), Some(Allow));
        assert_eq!(
            decide(&rules, "fs__write", json!({"path": "/tmp/x"}), "a"),
            Some(Confirm)
        );
        assert_eq!(
            decide(&rules, "fs__read", json!({"path": "/tmp/x"}), "a"),
            Some(Ask)
        );
        assert_eq!(
            decide(&rules, "fs__read", json!({"path": "/etc/passwd"}), "a"),
            Some(Deny)
        );
        assert_eq!(
            decide(&rules, "other", json!({}), "a"),
            None,
            "no rule: approval decides"
        );
    }
}

#[test]
fn principals_and_scopes_narrow_a_rule() {
    let rules = compiled(&[
        RuleConfig {
            principals: Some(vec!["ci-*".into()]),
            ..rule(&["deploy"], None, RuleDecision::Allow)
        },
        rule(
            &["deploy"],
            Some("!(\"approve\" in scopes)"),
            RuleDecision::Ask,
        ),
    ]);
    assert_eq!(
        decide(&rules, "deploy", json!({}), "ci-1"),
        Some(RuleDecision::Ask),
        "the ask rule also matches ci-1, which lacks approve: most restrictive"
    );
    assert_eq!(
        decide(&rules, "deploy", json!({}), "bob"),
        Some(RuleDecision::Ask)
    );
    let rules = compiled(&[RuleConfig {
        principals: Some(vec!["ci-*".into()]),
        ..rule(
            &["deploy"],
            Some("principal.startsWith(\"ci-\") && tool == \"deploy\""),
            RuleDecision::Allow,
        )
    }]);
    assert_eq!(
        decide(&rules, "deploy", json!({}), "ci-1"),
        Some(RuleDecision::Allow)
    );
    assert_eq!(decide(&rules, "deploy", json!({}), "bob"), None);
}

#[test]
fn a_condition_that_fails_never_opens_a_door() {
    let rules = compiled(&[
        rule(
            &["t"],
            Some("args.path.startsWith(\"/tmp\")"),
            RuleDecision::Allow,
        ),
        rule(
            &["u"],
            Some("args.path.startsWith(\"/etc\")"),
            RuleDecision::Deny,
        ),
        rule(&["v"], Some("args.n + 1"), RuleDecision::Deny),
    ]);
    assert_eq!(
        decide(&rules, "t", json!({}), "a"),
        None,
        "allow does not apply"
    );
    assert_eq!(
        decide(&rules, "t", json!({"path": "/tmp/x"}), "a"),
        Some(RuleDecision::Allow)
    );
    let principal = Principal::local();
    let verdict = rules
        .decide(&Facts {
            tool: "u",
            args: &json!({}),
            principal: &principal,
            session_id: None,
            annotations: None,
            server: None,
        })
        .unwrap();
    assert_eq!(verdict.decision, RuleDecision::Deny, "deny applies");
    assert_eq!(
        decide(&rules, "v", json!({"n": 1}), "a"),
        Some(RuleDecision::Deny),
        "not a bool"
    );
}

#[test]
fn exec_lines_are_judged_command_by_command() {
    let rules = compiled(&[
        rule(
            &["exec"],
            Some("args.commands.all(c, c.name in [\"ls\", \"git\", \"cat\"])"),
            RuleDecision::Allow,
        ),
        rule(&["exec"], None, RuleDecision::Ask),
    ]);
    // Ask applies to every line; allow only adds nothing restrictive. With ask present, the
    // verdict is ask: allow-rules loosen only what no restrictive rule matches.
    assert_eq!(
        decide(&rules, "exec", json!({"command": "ls -la"}), "a"),
        Some(RuleDecision::Ask)
    );
    let rules = compiled(&[rule(
        &["exec"],
        Some("args.commands.all(c, c.name in [\"ls\", \"git\", \"cat\"])"),
        RuleDecision::Allow,
    )]);
    let exec = |line: &str| decide(&rules, "exec", json!({"command": line}), "a");
    assert_eq!(exec("ls -la"), Some(RuleDecision::Allow));
    assert_eq!(
        exec("git status && cat README.md"),
        Some(RuleDecision::Allow)
    );
    assert_eq!(exec("git status && rm -rf ~"), None);
    assert_eq!(exec("echo hi; sh"), None);
    // An opaque line: the allow rule does not mention opaque, so it does not apply.
    assert_eq!(exec("git $(curl evil)"), None);
    assert_eq!(exec("ls > out.txt"), None);
    // Variables set by the call change what runs: opaque too.
    assert_eq!(
        decide(
            &rules,
            "exec",
            json!({"command": "git diff", "env": {"GIT_EXTERNAL_DIFF": "x"}}),
            "a"
        ),
        None
    );
    assert_eq!(
        decide(&rules, "exec", json!({"command": "ls", "env": {}}), "a"),
        Some(RuleDecision::Allow)
    );
    // "opaque" inside a string is not a mention of args.opaque.
    let sly = compiled(&[rule(
        &["exec"],
        Some("args.commands.all(c, c.name == \"ls\") && args.command != \"args.opaque\""),
        RuleDecision::Allow,
    )]);
    assert_eq!(
        decide(&sly, "exec", json!({"command": "ls > /tmp/x"}), "a"),
        None
    );
    let rules = compiled(&[rule(
        &["exec"],
        Some("args.opaque || args.commands.all(c, c.name == \"ls\")"),
        RuleDecision::Allow,
    )]);
    assert_eq!(
        decide(&rules, "exec", json!({"command": "ls > out"}), "a"),
        Some(RuleDecision::Allow),
        "a rule that mentions opaque decides about opaque lines itself"
    );
}

#[test]
fn hidden_tools_are_those_denied_without_a_condition() {
    let rules = compiled(&[
        RuleConfig {
            principals: Some(vec!["agent-*".into()]),
            ..rule(&["admin__*"], None, RuleDecision::Deny)
        },
        rule(
            &["fs__write"],
            Some("args.path == \"/\""),
            RuleDecision::Deny,
        ),
    ]);
    assert!(rules.hides("admin__reset", "agent-7"));
    assert!(!rules.hides("admin__reset", "alice"));
    assert!(
        !rules.hides("fs__write", "agent-7"),
        "a conditional deny hides nothing"
    );
}

#[test]
fn bad_rules_are_refused_with_their_key() {
    let err =
        |c: RuleConfig| Rules::compile(&[rule(&["x"], None, RuleDecision::Allow), c]).unwrap_err();
    let e = err(RuleConfig {
        tools: vec![],
        ..rule(&["x"], None, RuleDecision::Deny)
    });
    assert_eq!((e.index, e.key), (1, "tools"));
    let e = err(RuleConfig {
        decision: None,
        ..rule(&["x"], None, RuleDecision::Deny)
    });
    assert_eq!((e.index, e.key), (1, "decision"));
    let e = err(rule(
        &["x"],
        Some("args.path.startsWith("),
        RuleDecision::Deny,
    ));
    assert_eq!(e.key, "when");
    assert!(e.message.contains("does not compile"), "{}", e.message);
    let e = err(rule(&["x"], Some("argz.path == 1"), RuleDecision::Deny));
    assert!(
        e.message.contains("unknown variable \"argz\""),
        "{}",
        e.message
    );
    let e = err(RuleConfig {
        principals: Some(vec![]),
        ..rule(&["x"], None, RuleDecision::Deny)
    });
    assert_eq!(e.key, "principals");
    assert!(Rules::compile(&[]).unwrap().is_none());
}
