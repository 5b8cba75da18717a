//! `--help` on every command, and usage errors.

use crate::util::Dir;

const COMMANDS: &[&str] = &["serve", "mcp", "call", "check", "tools", "turns", "abort"];

#[tokio::test]
async fn every_command_has_help() {
    let dir = Dir::new();
    let out = dir.command(&["--help"]).run().await;
    out.expect_code(0);
    for command in COMMANDS {
        assert!(
            out.stdout.contains(command),
            "{command} in:\n{}",
            out.stdout
        );
    }
    assert!(out.stdout.contains("Exit codes"), "{}", out.stdout);
    for command in COMMANDS {
        let out = dir.command(&[command, "--help"]).run().await;
        out.expect_code(0);
        assert!(
            out.stdout.contains(&format!("Usage: toolwarden {command}")),
            "{command}: {}",
            out.stdout
        );
        assert!(
            out.stdout.contains("--config <FILE>"),
            "{command}: {}",
            out.stdout
        );
    }
}

#[tokio::test]
async fn call_help_lists_its_flags() {
    let out = Dir::new().command(&["call", "--help"]).run().await;
    out.expect_code(0);
    for flag in [
        "--input",
        "--timeout",
        "--idle-timeout",
        "--headless",
        "--json",
        "--session",
        "--url",
    ] {
        assert!(out.stdout.contains(flag), "{flag}: {}", out.stdout);
    }
}

#[tokio::test]
async fn usage_errors_exit_2() {
    let dir = Dir::new();
    for args in [
        &["frobnicate"][..],
        &["check", "--no-such-flag"],
        &["call"],
        &["abort"],
        &["serve", "--log-format", "xml"],
        &["check", "--log-level", "=[oops"],
    ] {
        let out = dir.command(args).run().await;
        out.expect_code(2);
        assert!(!out.stderr.is_empty(), "{args:?} says why");
    }
}

#[tokio::test]
async fn mcp_with_a_bad_config_exits_2() {
    let dir = Dir::new();
    dir.create("toolwarden.toml", "[defaults]\ntimeout = \"soon\"\n");
    let out = dir
        .command(&["mcp", "--config", "toolwarden.toml"])
        .run()
        .await;
    out.expect_code(2);
    assert!(
        out.stderr.contains("toolwarden.toml:2: defaults.timeout"),
        "{}",
        out.stderr
    );
}
