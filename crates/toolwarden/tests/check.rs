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
    assert!(out.stdout.contains("test: failed: "), "{}", out.stdout);
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
