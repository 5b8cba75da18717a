//! `[[rules]]` on the real binary (docs/RULES.md): by tool, principal and arguments, the most
//! restrictive decision winning whatever the order; shell lines judged command by command; what a
//! principal may never call is not listed to it; `check --explain` and
//! `GET /v1/tools/{name}/explain`; bad rules named by file, line and key.

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::serve::config;
use crate::util::{Dir, Running, http, marker};

const ALICE: &str = "alice-rules-0123456789abcdef0123456789ab";
const AGENT: &str = "agent-rules-0123456789abcdef0123456789ab";

const RULES: &str = r#"
[tools.exec]
approval = "ask"

# Read-only commands run without asking.
[[rules]]
tools = ["exec"]
when = 'args.commands.all(c, c.name in ["ls", "echo", "cat"] || (c.name == "git" && size(c.argv) > 1 && c.argv[1] == "status"))'
decision = "allow"
reason = "a read-only command"

# Nobody deletes with rm -rf.
[[rules]]
tools = ["exec"]
when = 'args.commands.exists(c, c.name == "rm" && c.argv.exists(a, a.startsWith("-") && a.contains("r")))'
decision = "deny"
reason = "no recursive deletes"

# Agents never reach the test server's slow tools.
[[rules]]
tools = ["test__sleep", "test__progress"]
principals = ["agent-*"]
decision = "deny"
reason = "agents may not run slow tools"

# Echo of a secret-looking text is confirmed.
[[rules]]
tools = ["test__echo"]
when = 'has(args.text) && args.text.contains("secret")'
decision = "confirm"
reason = "it looks like a secret"

# The same tool, allowed: the confirm rule still wins where it matches (most restrictive).
[[rules]]
tools = ["test__*"]
decision = "allow"

[[auth.tokens]]
principal = "alice"
token_env = "TW_RULES_ALICE"
scopes = ["call", "read"]

[[auth.tokens]]
principal = "agent-7"
token_env = "TW_RULES_AGENT"
scopes = ["call"]
"#;

async fn start(name: &str) -> (Dir, Running, String, String) {
    let dir = Dir::new();
    let mark = marker(name);
    dir.create("toolwarden.toml", &config(&mark, RULES));
    let server = dir
        .command(&["serve", "--listen", "127.0.0.1:0", "--headless"])
        .env("TW_RULES_ALICE", ALICE)
        .env("TW_RULES_AGENT", AGENT)
        .spawn();
    let url = server.url().await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    (dir, server, url, mark)
}

async fn stop(server: Running, mark: &str) {
    crate::util::stop_clean(server, mark).await;
}

/// One call as `token`'s principal; its result.
async fn call(url: &str, token: &str, name: &str, input: Value) -> Value {
    crate::util::call_one(url, Some(token), name, input).await
}

use crate::util::{outcome_of as outcome, text_of as text};

#[tokio::test]
async fn rules_decide_by_tool_principal_and_arguments() {
    let (_dir, server, url, mark) = start("rules").await;

    // Read-only lines run without the approval `[tools.exec]` asks for (headless: it would be
    // denied at once).
    for line in ["ls", "echo hi && git status", "cat /dev/null | cat"] {
        let r = call(&url, ALICE, "exec", json!({"command": line})).await;
        // It ran (git says it is not in a repository: a tool error, not a denial).
        assert!(
            r["toolwarden"]["status"] == "ok" || r["toolwarden"]["reason"] == "tool_error",
            "{line}: {r}"
        );
    }
    // A line with one command no rule allows falls to the tool's approval (ask → headless deny);
    // so does an opaque one, whatever its commands.
    for line in [
        "ls && touch x",
        "git $(echo status)",
        "ls > listing.txt",
        "echo hi; sh",
    ] {
        let r = call(&url, ALICE, "exec", json!({"command": line})).await;
        assert_eq!(
            outcome(&r),
            ("denied".into(), "headless".into(), "no_interactor".into()),
            "{line}: {r}"
        );
    }
    // A deny rule wins over the allow rule, whatever their order; the model reads why.
    let r = call(&url, ALICE, "exec", json!({"command": "ls; rm -rf ./x"})).await;
    assert_eq!(
        outcome(&r),
        ("denied".into(), "rule".into(), "rule".into()),
        "{r}"
    );
    assert!(text(&r).contains("no recursive deletes (rules[1])"), "{r}");

    // By principal: an agent may not run the slow tools, alice may.
    let r = call(&url, AGENT, "test__sleep", json!({"ms": 1})).await;
    assert_eq!(outcome(&r).1, "rule", "{r}");
    assert!(text(&r).contains("agents may not run slow tools"), "{r}");
    let r = call(&url, ALICE, "test__sleep", json!({"ms": 1})).await;
    assert_eq!(r["toolwarden"]["status"], "ok", "{r}");

    // By argument: confirm beats allow where both match.
    let r = call(&url, ALICE, "test__echo", json!({"text": "plain"})).await;
    assert_eq!(r["toolwarden"]["status"], "ok", "{r}");
    let r = call(&url, ALICE, "test__echo", json!({"text": "my secret"})).await;
    assert_eq!(
        outcome(&r).1,
        "headless",
        "confirm asks, and headless nobody answers: {r}"
    );

    // What a principal may never call is not listed to it, over HTTP and MCP.
    let listed = |token: &'static str| {
        let url = url.clone();
        async move {
            let body: Value = http()
                .get(format!("{url}/v1/tools"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            body["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let alices = listed(ALICE).await;
    let agents = listed(AGENT).await;
    assert!(alices.contains(&"test__sleep".to_owned()), "{alices:?}");
    assert!(!agents.contains(&"test__sleep".to_owned()), "{agents:?}");
    assert!(!agents.contains(&"test__progress".to_owned()), "{agents:?}");
    assert!(agents.contains(&"test__echo".to_owned()), "{agents:?}");
    let mcp_list = crate::util::mcp_as(&url, Some(AGENT), 1, "tools/list", json!({})).await;
    let names: Vec<&str> = mcp_list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"test__sleep"), "{names:?}");
    assert!(names.contains(&"test__echo"), "{names:?}");

    // The trail has each decision before the outcome.
    let events: Value = http()
        .get(format!("{url}/v1/audit?type=rule_decision"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let decisions: Vec<&Value> = events["events"].as_array().unwrap().iter().collect();
    assert!(
        decisions.iter().any(|e| e["decision"] == "deny"
            && e["rules"] == json!([1])
            && e["reason"] == "no recursive deletes"),
        "{events}"
    );

    // Explain, over HTTP (scope read).
    let explained: Value = http()
        .get(format!(
            "{url}/v1/tools/exec/explain?input={}",
            urlencode(r#"{"command": "git status && rm -rf /"}"#)
        ))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        explained,
        json!({"decision": "deny", "fallback": false, "hooks": [], "quotas": [],
               "rules": [{"index": 1, "decision": "deny", "reason": "no recursive deletes"}],
               "line": {"commands": [{"name": "git", "argv": ["git", "status"]},
                                     {"name": "rm", "argv": ["rm", "-rf", "/"]}],
                        "opaque": false}})
    );
    let resp = http()
        .get(format!("{url}/v1/tools/exec/explain"))
        .bearer_auth(AGENT)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403, "explain needs read");

    // Denials are counted by what decided them.
    let metrics = http()
        .get(format!("{url}/metrics"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "toolwarden_denied_total{tool=\"exec\",decider=\"rule\"} 1",
        "toolwarden_denied_total{tool=\"test__sleep\",decider=\"rule\"} 1",
        "toolwarden_denied_total{tool=\"exec\",decider=\"headless\"} 4",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    stop(server, &mark).await;
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn check_explains_and_bad_rules_are_named_by_file_line_and_key() {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        &format!("[exec]\nenabled = true\n{RULES}"),
    );
    let out = dir
        .command(&[
            "check",
            "--explain",
            "exec",
            "--input",
            r#"{"command": "ls -la && git status"}"#,
        ])
        .run()
        .await;
    out.expect_code(0);
    assert!(
        out.stdout.contains("rules[0] allow — a read-only command"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.trim_end().ends_with("decision: allow"),
        "{}",
        out.stdout
    );
    let out = dir
        .command(&[
            "check",
            "--explain",
            "exec",
            "--input",
            r#"{"command": "make"}"#,
            "--json",
        ])
        .run()
        .await;
    out.expect_code(0);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        v,
        json!({"decision": "ask", "fallback": true, "rules": [], "hooks": [], "quotas": [],
               "line": {"commands": [{"name": "make", "argv": ["make"]}], "opaque": false}})
    );
    // An opaque line says why.
    let out = dir
        .command(&[
            "check",
            "--explain",
            "exec",
            "--input",
            r#"{"command": "ls $(id)"}"#,
        ])
        .run()
        .await;
    assert!(
        out.stdout.contains("the line's commands: `ls $(id)`"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("the line is opaque: a command substitution"),
        "{}",
        out.stdout
    );
    let out = dir
        .command(&[
            "check",
            "--explain",
            "test__sleep",
            "--principal",
            "agent-7",
            "--json",
        ])
        .env("TW_RULES_ALICE", ALICE)
        .env("TW_RULES_AGENT", AGENT)
        .run()
        .await;
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["decision"], "deny", "{v}");

    for (rule, key, words) in [
        (
            "[[rules]]\ndecision = \"deny\"\n",
            "rules[0].tools",
            "a rule needs tools",
        ),
        (
            "[[rules]]\ntools = [\"x\"]\ndecision = \"maybe\"\n",
            "rules[0].decision",
            "\"maybe\"",
        ),
        (
            "[[rules]]\ntools = [\"x\"]\ndecision = \"deny\"\nwhen = 'args.x ==='\n",
            "rules[0].when",
            "does not compile",
        ),
        (
            "[[rules]]\ntools = [\"x\"]\ndecision = \"deny\"\nwhen = 'argz.x == 1'\n",
            "rules[0].when",
            "unknown variable \"argz\"",
        ),
        (
            "[[rules]]\ntools = [\"x\"]\n",
            "rules[0].decision",
            "a rule needs decision",
        ),
    ] {
        dir.create("bad.toml", rule);
        let out = dir
            .command(&["check", "--config", "bad.toml", "--offline"])
            .run()
            .await;
        assert_eq!(out.code, Some(2), "{rule}: {}", out.stderr);
        assert!(out.stderr.contains("bad.toml:"), "{rule}: {}", out.stderr);
        assert!(out.stderr.contains(key), "{rule}: {}", out.stderr);
        assert!(out.stderr.contains(words), "{rule}: {}", out.stderr);
    }
}
