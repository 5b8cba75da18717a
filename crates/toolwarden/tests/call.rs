//! `toolwarden call`: results, the exit codes (docs/CLI.md), Ctrl-C, the progress line.

use std::time::Duration;

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use serde_json::json;

use crate::util::{
    Dir, assert_group_gone, assert_no_process, marker, test_server, toml_str, wait_for_process,
};

const EXEC: &str = "[exec]\nenabled = true\ntimeout = \"30s\"\n";

fn exec_dir(extra: &str) -> Dir {
    let dir = Dir::new();
    dir.create("toolwarden.toml", &format!("{EXEC}{extra}"));
    dir
}

fn command(cmd: &str) -> String {
    json!({ "command": cmd }).to_string()
}

#[tokio::test]
async fn ok_prints_the_result_and_exits_0() {
    let dir = exec_dir("");
    let out = dir
        .command(&["call", "exec", "--input", &command("echo hello")])
        .run()
        .await;
    out.expect_code(0);
    assert_eq!(out.stdout, "exit code 0\n--- stdout ---\nhello\n");
}

#[tokio::test]
async fn input_comes_from_a_file_or_stdin() {
    let dir = exec_dir("");
    dir.create("input.json", &command("echo from-file"));
    let out = dir
        .command(&["call", "exec", "--input", "@input.json"])
        .run()
        .await;
    out.expect_code(0);
    assert!(out.stdout.contains("from-file"), "{}", out.stdout);
}

#[tokio::test]
async fn errors_and_invalid_calls_exit_1() {
    let dir = exec_dir("");
    let failed = dir
        .command(&["call", "exec", "--input", &command("echo no >&2; exit 3")])
        .run()
        .await;
    failed.expect_code(1);
    assert!(
        failed.stdout.starts_with("exit code 3"),
        "{}",
        failed.stdout
    );
    let unknown = dir.command(&["call", "nope"]).run().await;
    unknown.expect_code(1);
    assert!(
        unknown
            .stdout
            .starts_with("[INVALID] There is no tool named \"nope\""),
        "{}",
        unknown.stdout
    );
    let schema = dir
        .command(&["call", "exec", "--input", r#"{"cmd": "true"}"#])
        .run()
        .await;
    schema.expect_code(1);
    assert!(schema.stdout.starts_with("[INVALID]"), "{}", schema.stdout);
}

#[tokio::test]
async fn a_timeout_exits_3_and_stops_the_command() {
    let dir = exec_dir("");
    let mark = marker("timeout");
    let out = dir
        .command(&[
            "call",
            "exec",
            "--timeout",
            "500ms",
            "--input",
            &command(&format!("sleep 30; echo {mark}")),
        ])
        .run()
        .await;
    out.expect_code(3);
    assert!(
        out.stdout
            .starts_with("[TIMEOUT] Tool \"exec\" exceeded its wall-clock limit of 500ms"),
        "{}",
        out.stdout
    );
    assert_no_process(&mark, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn an_idle_timeout_from_the_command_line_exits_3() {
    let dir = exec_dir("");
    let out = dir
        .command(&[
            "call",
            "exec",
            "--idle-timeout",
            "300ms",
            "--input",
            &command("echo started; sleep 20"),
        ])
        .run()
        .await;
    out.expect_code(3);
    assert!(
        out.stdout.contains("made no progress for 300ms"),
        "{}",
        out.stdout
    );
}

#[tokio::test]
async fn an_approval_when_headless_exits_4_at_once() {
    let dir = exec_dir("[tools.exec]\napproval = \"ask\"\n");
    // --headless, and (stdin is not a terminal here) without it too.
    for args in [&["--headless"][..], &[]] {
        let mut argv = vec!["call", "exec", "--json"];
        argv.extend_from_slice(args);
        let input = command("echo never");
        argv.extend_from_slice(&["--input", &input]);
        let out = dir.command(&argv).run().await;
        out.expect_code(4);
        let result = out.json();
        assert_eq!(result["outcome"]["status"], "denied");
        assert_eq!(result["outcome"]["decider"], "headless");
        assert_eq!(result["outcome"]["reason"], "no_interactor");
    }
}

#[tokio::test]
async fn a_denied_tool_exits_5() {
    let dir = exec_dir("[tools.exec]\napproval = \"deny\"\n");
    let out = dir
        .command(&["call", "exec", "--input", &command("echo never")])
        .run()
        .await;
    out.expect_code(5);
    assert!(out.stdout.starts_with("[DENIED]"), "{}", out.stdout);
}

#[tokio::test]
async fn json_gives_the_whole_result() {
    let dir = exec_dir("");
    let out = dir
        .command(&[
            "call",
            "exec",
            "--json",
            "--session",
            "s-json",
            "--input",
            &command("printf hi"),
        ])
        .run()
        .await;
    out.expect_code(0);
    let result = out.json();
    let mut keys: Vec<&str> = result
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["content", "is_error", "outcome", "structured_content"]
    );
    assert_eq!(result["is_error"], false);
    assert_eq!(
        result["content"],
        json!([{"type": "text", "text": "exit code 0\n--- stdout ---\nhi"}])
    );
    assert_eq!(result["structured_content"]["stdout"], "hi");
    let outcome = &result["outcome"];
    assert_eq!(outcome["status"], "ok");
    assert_eq!(outcome["tool"], "exec");
    assert_eq!(outcome["call_id"], "cli");
    assert_eq!(outcome["attempts"], 1);
    assert!(outcome["turn_id"].as_str().unwrap().starts_with("t_"));
    assert_eq!(outcome["provenance"]["source"], "tool");
}

#[tokio::test]
async fn ctrl_c_cancels_the_call_exits_130_and_kills_the_command() {
    interrupted(Signal::SIGINT, 130, "user").await;
}

#[tokio::test]
async fn sigterm_cancels_the_call_as_a_shutdown_and_exits_143() {
    interrupted(Signal::SIGTERM, 143, "shutdown").await;
}

async fn interrupted(signal: Signal, code: i32, reason: &str) {
    let dir = exec_dir("");
    let mark = marker(&format!("signal-{code}"));
    let mut call = dir
        .command(&[
            "call",
            "exec",
            "--json",
            "--input",
            &command(&format!("sleep 60; echo {mark}")),
        ])
        .spawn();
    // The shell (its command line holds the marker) leads the command's process group.
    let shell = wait_for_process(call.pid(), &mark, Duration::from_secs(20)).await[0];
    call.signal(signal);
    let out = call.wait(Duration::from_secs(10)).await;
    out.expect_code(code);
    let result = out.json();
    assert_eq!(result["outcome"]["status"], "cancelled");
    assert_eq!(result["outcome"]["reason"], reason);
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("[CANCELLED]")
    );
    assert_group_gone(shell, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_long_call_prints_a_progress_line() {
    let dir = exec_dir("");
    let out = dir
        .command(&[
            "call",
            "exec",
            "--input",
            &command("echo step-one; sleep 5.5"),
        ])
        .run()
        .await;
    out.expect_code(0);
    assert!(
        out.stderr
            .contains("toolwarden: exec: running, 5s: step-one"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn an_mcp_tool_starts_its_server_and_stops_it() {
    let dir = Dir::new();
    let mark = marker("mcp-call");
    dir.create(
        "toolwarden.toml",
        &format!(
            "[servers.test]\ncommand = {}\nargs = [\"--stderr-line\", {}]\n\n[servers.unused]\ncommand = \"/nonexistent/never-started\"\n",
            toml_str(&test_server()),
            toml_str(&mark)
        ),
    );
    let out = dir
        .command(&["call", "test__echo", "--input", r#"{"text": "hi there"}"#])
        .run()
        .await;
    out.expect_code(0);
    assert_eq!(out.stdout, "hi there\n");
    assert_no_process(&mark, Duration::from_secs(2)).await;

    let broken = Dir::new();
    broken.create(
        "toolwarden.toml",
        &format!(
            "[servers.test]\ncommand = {}\nargs = [\"--fail-startup\"]\n",
            toml_str(&test_server())
        ),
    );
    let out = broken.command(&["call", "test__echo"]).run().await;
    out.expect_code(1);
    assert!(
        out.stderr.contains("MCP server \"test\" failed to start"),
        "{}",
        out.stderr
    );
}

/// On a terminal, an approval is asked y/N with a countdown; `y` runs the call.
#[tokio::test]
async fn on_a_terminal_an_approval_is_asked_and_yes_runs_the_call() {
    let dir = exec_dir("[tools.exec]\napproval = \"ask\"\n");
    let mut terminal = crate::util::Terminal::open();
    let (stdin, stderr) = terminal.stdio();
    let mut call = dir
        .command(&["call", "exec", "--input", &command("echo approved-run")])
        .stdio(stdin, stderr)
        .spawn();
    terminal
        .wait_for("Allow? [y/N]", Duration::from_secs(20))
        .await;
    let screen = terminal.screen();
    assert!(
        screen.contains("Allow tool \"exec\" to run with this input?"),
        "{screen}"
    );
    assert!(
        screen.contains("left; no answer denies the call"),
        "{screen}"
    );
    terminal.type_text("y\n");
    let out = call.wait(Duration::from_secs(20)).await;
    out.expect_code(0);
    assert!(out.stdout.contains("approved-run"), "{}", out.stdout);
    assert!(terminal.screen().contains("toolwarden: approved"));
}

/// Anything but `y` denies the call (exit 5), recorded as a person's denial.
#[tokio::test]
async fn on_a_terminal_no_denies_the_call() {
    let dir = exec_dir("[tools.exec]\napproval = \"ask\"\n");
    let mut terminal = crate::util::Terminal::open();
    let (stdin, stderr) = terminal.stdio();
    let mut call = dir
        .command(&["call", "exec", "--json", "--input", &command("echo never")])
        .stdio(stdin, stderr)
        .spawn();
    terminal
        .wait_for("Allow? [y/N]", Duration::from_secs(20))
        .await;
    terminal.type_text("n\n");
    let out = call.wait(Duration::from_secs(20)).await;
    out.expect_code(5);
    let result = out.json();
    assert_eq!(result["outcome"]["decider"], "policy");
    assert_eq!(result["outcome"]["reason"], "user");
}
