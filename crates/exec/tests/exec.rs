//! The exec tool against real processes: each test gets a temp dir as its only allowed root and
//! drives `ExecBackend::start` with stop signals and a heartbeat it controls, as the engine would.
//! Tests that start long-running processes learn the group id (`$$` of the shell, its leader)
//! and the pids of its children from files the command writes, and check that none survives.

// clippy's allow-unwrap-in-tests covers #[test] functions only, not this file's helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use toolwarden_core::{
    Attempt, AttemptEnd, AttemptMeta, Backend, Heartbeat, StopSignals, ToolOutput,
};
use toolwarden_exec::{ExecBackend, ExecSettings};
use toolwarden_process::{descendants, group_members};
use toolwarden_protocol::{CancelReason, OnStuck, StopHow};

/// A temp dir that is the only allowed root and the base dir.
struct Sandbox {
    dir: tempfile::TempDir,
    settings: ExecSettings,
}

impl Sandbox {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap().join("root");
        std::fs::create_dir(&root).unwrap();
        let settings = ExecSettings {
            allowed_roots: vec![root.clone()],
            base_dir: root,
            output_limit: 1024 * 1024,
            shell: "sh".to_owned(),
            drain_timeout: Duration::from_secs(2),
            env_remove: vec![],
        };
        Self { dir, settings }
    }

    /// The allowed root (also the base dir).
    fn root(&self) -> PathBuf {
        self.settings.base_dir.clone()
    }

    /// The temp dir holding the root: outside it.
    fn outside(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.path()).unwrap()
    }

    fn start(&self, input: Value) -> Running {
        let stop = StopSignals::new();
        let heartbeat = Heartbeat::new(None);
        let backend = ExecBackend::new(self.settings.clone());
        let end = tokio::spawn(backend.start(attempt("exec", input, &stop, &heartbeat)));
        Running {
            stop,
            heartbeat,
            end,
        }
    }

    async fn run(&self, input: Value) -> ToolOutput {
        done(self.start(input).end.await.unwrap())
    }

    /// Waits until the command wrote its shell's pid (the group id) to `pid` in the root.
    async fn pgid(&self) -> u32 {
        let path = self.root().join("pid");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(text) = std::fs::read_to_string(&path)
                && text.ends_with('\n')
            {
                return text.trim().parse().unwrap();
            }
            assert!(Instant::now() < deadline, "the command never wrote its pid");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The pids the command listed in `kids` in the root, once it listed `n` of them.
    async fn kids(&self, n: usize) -> Vec<u32> {
        let path = self.root().join("kids");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let pids: Vec<u32> = std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            if pids.len() >= n {
                return pids;
            }
            assert!(
                Instant::now() < deadline,
                "the command never listed its children"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn attempt(tool: &str, input: Value, stop: &StopSignals, heartbeat: &Heartbeat) -> Attempt {
    Attempt {
        tool: Arc::from(tool),
        input: Arc::new(input),
        meta: AttemptMeta {
            principal: "local".into(),
            session_id: "s".into(),
            turn_id: "t".into(),
            call_id: "c".into(),
            attempt: 1,
            traceparent: None,
        },
        stop: stop.clone(),
        heartbeat: heartbeat.clone(),
        on_stuck: OnStuck::default(),
        deadline: None,
    }
}

/// An attempt in flight, with the engine's side of its signals.
struct Running {
    stop: StopSignals,
    heartbeat: Heartbeat,
    end: JoinHandle<AttemptEnd>,
}

fn done(end: AttemptEnd) -> ToolOutput {
    match end {
        AttemptEnd::Done(Ok(out)) => out,
        other => panic!("expected a tool answer, got {other:?}"),
    }
}

fn text(out: &ToolOutput) -> &str {
    assert_eq!(out.content.len(), 1, "one text block");
    out.content[0].as_text().unwrap()
}

fn structured<'a>(out: &'a ToolOutput, key: &str) -> &'a Value {
    &out.structured_content.as_ref().unwrap()[key]
}

/// The structured content without `duration_ms` (checked to be there), to compare whole.
fn without_duration(out: &ToolOutput) -> Value {
    let mut value = out.structured_content.clone().unwrap();
    let duration = value.as_object_mut().unwrap().remove("duration_ms");
    assert!(
        duration.is_some_and(|d| d.is_u64()),
        "duration_ms is a number"
    );
    value
}

/// Whether `pid` is a live process (zombies count as gone: they run nothing).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().next().map(|st| st != "Z")
        })
        .unwrap_or(false)
}

/// Nothing of group `pgid` is alive, nor any of `kids`.
fn assert_nothing_left(pgid: u32, kids: &[u32]) {
    assert_eq!(
        group_members(pgid),
        Vec::<u32>::new(),
        "group {pgid} left members"
    );
    assert_eq!(
        descendants(pgid),
        Vec::<u32>::new(),
        "leader {pgid} left descendants"
    );
    for &kid in kids {
        assert!(!alive(kid), "child {kid} of group {pgid} survived");
    }
}

/// Waits for the attempt's end, failing the test if it takes longer than `limit` (a hang).
async fn end_within(running: Running, limit: Duration) -> AttemptEnd {
    tokio::time::timeout(limit, running.end)
        .await
        .expect("the attempt did not end")
        .unwrap()
}

#[tokio::test]
async fn echo_exits_zero_and_is_ok() {
    let sb = Sandbox::new();
    let out = sb.run(json!({"command": "echo hello"})).await;
    assert!(!out.is_error);
    assert_eq!(text(&out), "exit code 0\n--- stdout ---\nhello");
    assert_eq!(
        without_duration(&out),
        json!({
            "exit_code": 0, "signal": null, "signal_name": null,
            "stdout": "hello\n", "stderr": "", "stdout_bytes": 6, "stderr_bytes": 0,
            "truncated_bytes": 0, "output_unfinished": false, "background_killed": false,
        })
    );
}

#[tokio::test]
async fn a_non_zero_exit_is_an_error_with_its_code() {
    let sb = Sandbox::new();
    let out = sb
        .run(json!({"command": "echo partial; echo 'no such file' >&2; exit 3"}))
        .await;
    assert!(out.is_error);
    assert_eq!(
        text(&out),
        "exit code 3\n--- stdout ---\npartial\n--- stderr ---\nno such file"
    );
    assert_eq!(
        without_duration(&out),
        json!({
            "exit_code": 3, "signal": null, "signal_name": null,
            "stdout": "partial\n", "stderr": "no such file\n", "stdout_bytes": 8, "stderr_bytes": 13,
            "truncated_bytes": 0, "output_unfinished": false, "background_killed": false,
        })
    );
}

#[tokio::test]
async fn death_by_signal_is_an_error_naming_the_signal() {
    let sb = Sandbox::new();
    let out = sb.run(json!({"command": "kill -KILL $$"})).await;
    assert!(out.is_error);
    assert_eq!(text(&out), "killed by signal 9 (SIGKILL)\n(no output)");
    assert_eq!(structured(&out, "exit_code"), &Value::Null);
    assert_eq!(structured(&out, "signal"), &json!(9));
}

#[tokio::test]
async fn cwd_resolves_against_the_base_dir_and_must_stay_under_a_root() {
    let sb = Sandbox::new();
    let root = sb.root();
    std::fs::create_dir(root.join("sub")).unwrap();
    let pwd = |cwd: Value| sb.run(json!({"command": "pwd -P", "cwd": cwd}));

    let out = pwd(json!("sub")).await;
    assert_eq!(
        structured(&out, "stdout"),
        &json!(format!("{}/sub\n", root.display()))
    );
    let out = pwd(json!(root.join("sub/..").display().to_string())).await;
    assert_eq!(
        structured(&out, "stdout"),
        &json!(format!("{}\n", root.display()))
    );
    let out = sb.run(json!({"command": "pwd -P"})).await;
    assert_eq!(
        structured(&out, "stdout"),
        &json!(format!("{}\n", root.display()))
    );

    // Escapes: `..`, a symlink pointing out, a sibling whose name merely starts like the root.
    let evil = sb.outside().join("root-evil");
    std::fs::create_dir(&evil).unwrap();
    std::os::unix::fs::symlink(sb.outside(), root.join("out")).unwrap();
    for cwd in [
        json!(".."),
        json!("sub/../.."),
        json!("out"),
        json!(evil.display().to_string()),
        json!("/"),
    ] {
        let out = pwd(cwd.clone()).await;
        assert!(out.is_error, "{cwd} was allowed");
        assert!(out.structured_content.is_none());
        let msg = text(&out);
        assert!(msg.contains("is outside the allowed roots"), "{cwd}: {msg}");
        assert!(
            msg.contains(&format!("allowed: {}", root.display())),
            "{msg}"
        );
    }

    let out = pwd(json!("missing")).await;
    assert!(out.is_error);
    assert!(
        text(&out).starts_with("exec: cwd \"missing\" cannot be used:"),
        "{}",
        text(&out)
    );
    std::fs::write(root.join("file"), b"").unwrap();
    let out = pwd(json!("file")).await;
    assert!(out.is_error);
    assert_eq!(text(&out), "exec: cwd \"file\" is not a directory");
}

#[tokio::test]
async fn env_and_stdin_reach_the_command() {
    let mut sb = Sandbox::new();
    sb.settings.env_remove = vec!["HOME".to_owned()];
    let out = sb
        .run(json!({
            "command": "printf '%s|%s|' \"$GREETING\" \"${HOME-unset}\"; cat",
            "env": {"GREETING": "hi there"},
            "stdin": "from stdin",
        }))
        .await;
    assert!(!out.is_error, "{}", text(&out));
    assert_eq!(
        structured(&out, "stdout"),
        &json!("hi there|unset|from stdin")
    );

    // Without `stdin`, the command reads an empty input rather than waiting.
    let out = sb.run(json!({"command": "cat; echo eof"})).await;
    assert_eq!(structured(&out, "stdout"), &json!("eof\n"));

    // A large stdin the command never reads does not block the call.
    let big = "x".repeat(4 * 1024 * 1024);
    let out = end_within(
        sb.start(json!({"command": "echo ignored", "stdin": big})),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(structured(&done(out), "stdout"), &json!("ignored\n"));
}

#[tokio::test]
async fn output_over_the_limit_is_cut_in_the_middle_with_a_note() {
    let mut sb = Sandbox::new();
    sb.settings.output_limit = 1000;
    let out = sb
        .run(json!({"command": "printf 'first line\\n'; head -c 5000 /dev/zero | tr '\\0' a; printf '\\nlast line\\n'"}))
        .await;
    assert!(!out.is_error);
    let total = 11 + 5000 + 11;
    assert_eq!(structured(&out, "stdout_bytes"), &json!(total));
    assert_eq!(structured(&out, "truncated_bytes"), &json!(total - 1000));
    let stdout = structured(&out, "stdout").as_str().unwrap();
    assert!(stdout.starts_with("first line\naaa"), "{stdout}");
    assert!(stdout.ends_with("aaa\nlast line\n"), "{stdout}");
    assert!(stdout.contains(&format!("[... {} bytes cut ...]", total - 1000)));
    assert!(text(&out).ends_with(&format!(
        "note: output was {total} bytes, over the limit of 1000 bytes; {} bytes from the middle were cut",
        total - 1000
    )));
}

#[tokio::test]
async fn a_flood_of_output_neither_hangs_nor_fills_memory() {
    let sb = Sandbox::new();
    let out = end_within(
        sb.start(json!({"command": "yes | head -c 50000000; echo done >&2"})),
        Duration::from_secs(30),
    )
    .await;
    let out = done(out);
    assert!(!out.is_error);
    assert_eq!(structured(&out, "stdout_bytes"), &json!(50_000_000));
    assert_eq!(
        structured(&out, "truncated_bytes"),
        &json!(50_000_000 - 1024 * 1024 + 5)
    );
    assert_eq!(structured(&out, "stderr"), &json!("done\n"));
    assert!(text(&out).len() < 1024 * 1024 + 1024);
}

#[tokio::test]
async fn output_is_a_heartbeat_and_its_last_line_is_progress() {
    let sb = Sandbox::new();
    let running = sb.start(json!({"command": "echo started; sleep 0.3; echo working; sleep 30"}));
    let before = running.heartbeat.last_beat();
    // A beat arrives while the command still runs, not only at its end.
    let deadline = Instant::now() + Duration::from_secs(5);
    while running.heartbeat.last_beat() == before {
        assert!(Instant::now() < deadline, "no heartbeat from output");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = running.heartbeat.last_beat();
    assert!(!running.end.is_finished());
    let progress = running.heartbeat.take_progress().unwrap();
    assert_eq!(progress.message.as_deref(), Some("started"));
    // The second line moves the heartbeat again and becomes the next progress message.
    while running
        .heartbeat
        .take_progress()
        .and_then(|p| p.message)
        .as_deref()
        != Some("working")
    {
        assert!(Instant::now() < deadline, "no progress for the second line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(running.heartbeat.last_beat() > first);
    running.stop.request_stop(CancelReason::User);
    let end = end_within(running, Duration::from_secs(5)).await;
    assert!(
        matches!(end, AttemptEnd::Stopped(StopHow::Cooperative)),
        "{end:?}"
    );
}

#[tokio::test]
async fn cancel_terminates_the_group_cooperatively_grandchildren_included() {
    let sb = Sandbox::new();
    let running = sb.start(json!({
        "command": "echo $$ > pid; sleep 100 & echo $! > kids; sleep 100 & echo $! >> kids; sleep 100",
    }));
    let pgid = sb.pgid().await;
    let kids = sb.kids(2).await;
    running.stop.request_stop(CancelReason::User);
    let end = end_within(running, Duration::from_secs(5)).await;
    assert!(
        matches!(end, AttemptEnd::Stopped(StopHow::Cooperative)),
        "{end:?}"
    );
    assert_nothing_left(pgid, &kids);
}

#[tokio::test]
async fn a_stopped_child_still_ends_cooperatively_on_cancel() {
    let sb = Sandbox::new();
    // A stopped process that handles SIGTERM runs its handler only once it is continued; here
    // the shell, handling SIGTERM too, waits for it to end. (Were the shell to die, its group
    // would be orphaned and the kernel itself would continue the stopped child.) The shell waits
    // in short sleeps, not one long one: a SIGTERM that lands between the fork of a `sleep` and
    // its exec is taken by the forked shell's trap and lost, and that `sleep` runs to its end
    // (with `sleep 100` the test hung about once in twenty runs).
    let running = sb.start(json!({
        "command": "trap 'wait; exit 0' TERM; sh -c 'trap \"exit 0\" TERM; echo $$ > kids; while :; do sleep 1; done' & \
                    while [ ! -s kids ]; do sleep 0.01; done; kill -STOP $!; echo $$ > pid; while :; do sleep 0.1; done",
    }));
    let pgid = sb.pgid().await;
    let kids = sb.kids(1).await;
    running.stop.request_stop(CancelReason::User);
    // No force follows: only a cooperative end can come. The child's trap runs once its current
    // `sleep 1` ends, which a loaded machine can stretch; the limit only guards against a hang.
    let end = end_within(running, Duration::from_secs(30)).await;
    assert!(
        matches!(end, AttemptEnd::Stopped(StopHow::Cooperative)),
        "{end:?}"
    );
    assert_nothing_left(pgid, &kids);
}

#[tokio::test]
async fn a_command_ignoring_sigterm_is_killed_when_forced() {
    let sb = Sandbox::new();
    // The trap makes the shell and (inherited) its children ignore SIGTERM.
    let running = sb.start(json!({
        "command": "trap '' TERM; echo $$ > pid; sleep 100 & echo $! > kids; sleep 30",
    }));
    let pgid = sb.pgid().await;
    let kids = sb.kids(1).await;
    running.stop.request_stop(CancelReason::Timeout);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!running.end.is_finished(), "the command ignores SIGTERM");
    assert!(!group_members(pgid).is_empty());
    running.stop.force();
    let end = end_within(running, Duration::from_secs(5)).await;
    assert!(
        matches!(end, AttemptEnd::Stopped(StopHow::Killed)),
        "{end:?}"
    );
    assert_nothing_left(pgid, &kids);
}

#[tokio::test]
async fn a_child_that_ignores_sigterm_keeps_the_stop_from_being_cooperative() {
    let sb = Sandbox::new();
    // The shell dies on SIGTERM at once; its background child does not. The stop is only
    // cooperative when the whole group is gone, so this one ends killed, with nothing left.
    // The child lists itself once it ignores SIGTERM (on a loaded machine the stop could
    // otherwise come before its trap is set).
    let running = sb.start(json!({
        "command": "echo $$ > pid; sh -c 'trap \"\" TERM; echo $$ > kids; exec sleep 100' & sleep 100",
    }));
    let pgid = sb.pgid().await;
    let kids = sb.kids(1).await;
    running.stop.request_stop(CancelReason::User);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!running.end.is_finished(), "a group member ignores SIGTERM");
    running.stop.force();
    let end = end_within(running, Duration::from_secs(5)).await;
    assert!(
        matches!(end, AttemptEnd::Stopped(StopHow::Killed)),
        "{end:?}"
    );
    assert_nothing_left(pgid, &kids);
}

#[tokio::test]
async fn a_grandchild_holding_the_pipes_does_not_hold_the_call_past_the_drain_deadline() {
    let mut sb = Sandbox::new();
    sb.settings.drain_timeout = Duration::from_millis(300);
    let running = sb.start(json!({
        "command": "echo $$ > pid; sleep 100 & echo $! > kids; echo done",
    }));
    let pgid = sb.pgid().await;
    let kids = sb.kids(1).await;
    let out = done(end_within(running, Duration::from_secs(5)).await);
    assert!(!out.is_error);
    assert_eq!(structured(&out, "stdout"), &json!("done\n"));
    assert_eq!(structured(&out, "output_unfinished"), &json!(true));
    assert_eq!(structured(&out, "background_killed"), &json!(true));
    assert!(text(&out).contains("note: background processes still held the output open 300ms"));
    assert_nothing_left(pgid, &kids);
}

#[tokio::test]
async fn background_processes_are_killed_when_the_command_finishes() {
    let sb = Sandbox::new();
    // The background sleep does not hold the pipes, so the call ends at once.
    let out = sb
        .run(json!({
            "command": "echo $$ > pid; sleep 100 >/dev/null 2>&1 & echo $! > kids; echo done",
        }))
        .await;
    let pgid = sb.pgid().await;
    let kids = sb.kids(1).await;
    assert!(!out.is_error);
    assert_eq!(structured(&out, "output_unfinished"), &json!(false));
    assert_eq!(structured(&out, "background_killed"), &json!(true));
    assert!(
        text(&out)
            .ends_with("note: processes the command left running in the background were killed")
    );
    assert_nothing_left(pgid, &kids);
}

#[tokio::test]
async fn dropping_the_attempt_kills_the_group() {
    let sb = Sandbox::new();
    let running =
        sb.start(json!({"command": "echo $$ > pid; sleep 100 & echo $! > kids; sleep 100"}));
    let pgid = sb.pgid().await;
    let kids = sb.kids(1).await;
    running.end.abort();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !group_members(pgid).is_empty() {
        assert!(Instant::now() < deadline, "the group outlived its attempt");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_nothing_left(pgid, &kids);
}

#[tokio::test]
async fn a_stop_requested_before_the_start_runs_nothing() {
    let sb = Sandbox::new();
    let stop = StopSignals::new();
    stop.request_stop(CancelReason::User);
    let heartbeat = Heartbeat::new(None);
    let end = ExecBackend::new(sb.settings.clone())
        .start(attempt(
            "exec",
            json!({"command": "echo $$ > pid"}),
            &stop,
            &heartbeat,
        ))
        .await;
    assert!(
        matches!(end, AttemptEnd::Stopped(StopHow::Cooperative)),
        "{end:?}"
    );
    assert!(!sb.root().join("pid").exists());
}

#[tokio::test]
async fn a_missing_shell_is_a_tool_error() {
    let mut sb = Sandbox::new();
    sb.settings.shell = "/nonexistent/shell".to_owned();
    let out = sb.run(json!({"command": "echo hi"})).await;
    assert!(out.is_error);
    assert!(
        text(&out).starts_with("exec: could not start the shell \"/nonexistent/shell\""),
        "{}",
        text(&out)
    );
}

#[tokio::test]
async fn unexpected_input_is_a_tool_error_not_a_panic() {
    let sb = Sandbox::new();
    for (input, expected) in [
        (
            json!(null),
            "exec: the input must be an object like {\"command\": \"ls\"}, not null",
        ),
        (
            json!({"command": ["ls"]}),
            "exec: \"command\" must be a string, not an array",
        ),
        (
            json!({"command": "ls", "cwd": 7}),
            "exec: \"cwd\" must be a string, not a number",
        ),
        (
            json!({"command": "ls", "env": {"A": null}}),
            "exec: \"env\".A must be a string, not null",
        ),
    ] {
        let out = sb.run(input).await;
        assert!(out.is_error);
        assert_eq!(text(&out), expected);
    }
    let stop = StopSignals::new();
    let heartbeat = Heartbeat::new(None);
    let out = done(
        ExecBackend::new(sb.settings.clone())
            .start(attempt("bash", json!({"command": "ls"}), &stop, &heartbeat))
            .await,
    );
    assert!(out.is_error);
    assert_eq!(
        text(&out),
        "exec: unknown tool \"bash\"; this backend serves only \"exec\""
    );
}

#[test]
fn settings_from_config_default_to_the_base_dir() {
    let dir = tempfile::tempdir().unwrap();
    let settings =
        ExecSettings::from_config(&toolwarden_protocol::ExecConfig::default(), dir.path()).unwrap();
    let base: &Path = &std::fs::canonicalize(dir.path()).unwrap();
    assert_eq!(settings.allowed_roots, vec![base.to_path_buf()]);
    assert_eq!(ExecBackend::tool_spec().name, "exec");
}
