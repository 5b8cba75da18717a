//! `toolwarden check`: warnings, effective policies, servers that do not start.

use std::time::Duration;

use crate::util::{Dir, assert_no_process, marker, test_server, toml_str};

fn config(server_args: &[&str]) -> String {
    let args: Vec<String> = server_args.iter().map(|a| toml_str(a)).collect();
    format!(
        r#"[servers.test]
command = {server}
args = [{args}]
startup_timeout = "20s"

[tools."test__sleep"]
timeout = "5s"
idle_timeout = "1m"

[tools."test__slepe"]
retries = 2

[exec]
enabled = true
timeout = "30s"
approval = "ask"
"#,
        server = toml_str(&test_server()),
        args = args.join(", "),
    )
}

#[tokio::test]
async fn check_prints_every_policy_and_warning() {
    let dir = Dir::new();
    let mark = marker("check-table");
    dir.create("toolwarden.toml", &config(&["--stderr-line", &mark]));
    let out = dir.command(&["check"]).run().await;
    out.expect_code(0);
    // A warning from loading, and one once the server's tools are known.
    assert!(
        out.stderr.contains(
            "warning: toolwarden.toml:8: tools.test__sleep.idle_timeout: idle_timeout 1m is longer than timeout 5s"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "warning: toolwarden.toml:10: tools.test__slepe: server \"test\" does not list a tool \"slepe\""
        ),
        "{}",
        out.stderr
    );
    assert!(out.stdout.contains("test: up, "), "{}", out.stdout);
    assert!(out.stdout.contains("2 warnings"), "{}", out.stdout);
    let row = |name: &str| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{}", out.stdout))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    // TOOL BACKEND STATE MCP BREAKER TIMEOUT IDLE ATTEMPT RETRIES IDEMPOTENT CACHE APPROVAL...
    assert_eq!(
        row("test__sleep")[..11],
        [
            "test__sleep",
            "test",
            "up",
            "2025-11-25",
            "closed",
            "5s",
            "5s",
            "off",
            "0",
            "yes",
            "off"
        ]
    );
    assert_eq!(
        row("exec")[..6],
        ["exec", "exec", "up", "-", "closed", "30s"]
    );
    assert_eq!(row("exec")[11], "ask");
    assert_eq!(row("test__wipe")[11], "confirm", "destructive hint");
    assert!(
        out.stdout.contains("test: up, 25 tools, MCP 2025-11-25"),
        "{}",
        out.stdout
    );
    assert_no_process(&mark, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn check_json_is_for_machines() {
    let dir = Dir::new();
    dir.create("toolwarden.toml", &config(&[]));
    let out = dir.command(&["check", "--json"]).run().await;
    out.expect_code(0);
    let report = out.json();
    assert_eq!(report["ok"], true);
    assert_eq!(report["servers"]["test"]["state"], "up");
    assert_eq!(report["servers"]["test"]["protocol"], "2025-11-25");
    let warnings = report["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 2, "{warnings:#?}");
    assert_eq!(warnings[1]["key"], "tools.test__slepe");
    assert_eq!(warnings[1]["line"], 10);
    let tools = report["tools"].as_array().unwrap();
    let sleep = tools.iter().find(|t| t["name"] == "test__sleep").unwrap();
    assert_eq!(sleep["policy"]["timeout"], "5s");
    assert_eq!(sleep["policy"]["idempotent"], true);
    assert!(tools.iter().any(|t| t["name"] == "exec"));
}

#[tokio::test]
async fn a_server_that_does_not_start_is_reported_and_fails_the_check() {
    let dir = Dir::new();
    dir.create("toolwarden.toml", &config(&["--fail-startup"]));
    let out = dir.command(&["check"]).run().await;
    out.expect_code(1);
    // `failed` once its start attempts are spent, `down` while it is between two of them: the
    // check reports what the server last said when its first start failed.
    assert!(
        out.stdout.contains("test: failed: ") || out.stdout.contains("test: down: "),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("its tools are unknown"),
        "{}",
        out.stdout
    );
    assert!(
        out.stderr.contains("a server did not start"),
        "{}",
        out.stderr
    );
    // --offline checks the file alone.
    let offline = dir.command(&["check", "--offline"]).run().await;
    offline.expect_code(0);
    assert!(
        offline.stdout.contains("not started (--offline)"),
        "{}",
        offline.stdout
    );
}

#[tokio::test]
async fn the_example_config_is_valid() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/toolwarden.toml"
    );
    let out = Dir::new()
        .command(&["check", "--offline", "--config", example])
        .run()
        .await;
    out.expect_code(0);
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
    assert!(out.stdout.contains("exec "), "{}", out.stdout);
}

/// What a newcomer gets wrong in a config: a `[tools]` key without its server's name (a
/// warning: its keys would apply to nothing), a negative duration (an error: it would turn a
/// limit off), a unit spelled out (accepted).
#[tokio::test]
async fn check_warns_about_keys_that_apply_to_nothing_and_refuses_negative_durations() {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        "[servers.test]\ncommand = \"tw-test\"\n\n[tools.\"sleep\"]\ntimeout = \"5 seconds\"\n",
    );
    let out = dir.command(&["check", "--offline"]).run().await;
    assert!(
        out.stderr.contains(
            "warning: toolwarden.toml:4: tools.sleep: applies to no tool, so these keys are ignored: MCP tools are named SERVER__TOOL, the shell tool exec; did you mean [tools.test__sleep]?"
        ),
        "{}",
        out.stderr
    );

    dir.create(
        "toolwarden.toml",
        "[servers.test]\ncommand = \"tw-test\"\n\n[tools.\"test__sleep\"]\ntimeout = \"-5s\"\n",
    );
    let out = dir.command(&["check", "--offline"]).run().await;
    out.expect_code(2);
    assert!(
        out.stderr.contains(
            "toolwarden.toml:5: tools.test__sleep.timeout: negative duration -5s: a duration cannot be negative"
        ),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn check_lists_the_principals_and_warns_about_short_tokens_and_unreadable_keys() {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        r#"[[auth.tokens]]
principal = "ci"
token_env = "TW_CHECK_CI"

[[auth.tokens]]
principal = "alice"
token_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
scopes = ["call", "read"]

[[auth.tokens]]
principal = "ops"
token_env = "TW_CHECK_UNSET"
scopes = ["admin"]

[auth.oauth]
issuer = "https://login.example.com/realms/agents"
audience = "tw"
jwks_file = "missing-keys.json"
"#,
    );
    let out = dir
        .command(&["check"])
        .env("TW_CHECK_CI", "short")
        .run()
        .await;
    out.expect_code(0);
    for line in [
        "principals:",
        "  ci: call; token from $TW_CHECK_CI",
        "  alice: call, read; token by its SHA-256",
        "  ops: admin; token from $TW_CHECK_UNSET (not set)",
        "  OAuth access tokens of https://login.example.com/realms/agents for tw (keys: cannot be read)",
    ] {
        assert!(out.stdout.contains(line), "{line}\n{}", out.stdout);
    }
    for warning in [
        "warning: toolwarden.toml:3: auth.tokens[0].token_env: principal \"ci\"'s token is 5 bytes long: a token shorter than 32 bytes could be guessed",
        "warning: toolwarden.toml:12: auth.tokens[2].token_env: the variable TW_CHECK_UNSET (principal \"ops\"'s token) is not set",
        "auth.oauth: cannot read the issuer's keys (jwks_file ",
    ] {
        assert!(out.stderr.contains(warning), "{warning}\n{}", out.stderr);
    }
    let json = dir
        .command(&["check", "--json", "--offline"])
        .env("TW_CHECK_CI", "a-token-long-enough-to-be-fine-0123456789")
        .run()
        .await;
    let report = json.json();
    assert_eq!(report["principals"][0]["principal"], "ci");
    assert_eq!(
        report["principals"][0]["scopes"],
        serde_json::json!(["call"])
    );
    assert_eq!(report["principals"][0]["token"]["set"], true);
    assert_eq!(report["oauth"]["keys"], "not read (--offline)");
    assert_eq!(report["oauth"]["resource"], "http://127.0.0.1:7420/mcp");
}
