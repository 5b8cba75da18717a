//! The MCP client backend against real `tw-test-server` processes. Each test plays the engine:
//! it starts attempts, requests stops, forces them after a grace period, and checks what the
//! backend reported and that no process was left behind.
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "test helpers")]

mod backend_support;

use backend_support::*;

use std::sync::Arc;
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::json;
use toolwarden_core::protocol::{
    CancelReason, Content, DurationValue, OnStuck, ServerConfig, ServerStateKind, StopHow,
};
use toolwarden_core::{AttemptEnd, AttemptError, Backend, ToolOutput};
use toolwarden_mcp::{McpServer, ReadyError};
use toolwarden_testkit::{AttemptKit, assert_all_gone, group_members, pid_alive, wait_until};

/// The server's process id (its process group id, as the group's leader).
async fn server_pid(server: &McpServer) -> u32 {
    text(call(server, "pid", json!({})).await)
        .parse()
        .expect("a pid")
}

/// Shuts the server down and checks that its whole process group is gone.
async fn finish(server: Arc<McpServer>, pgids: &[u32]) {
    server.shutdown().await;
    assert_eq!(server.state(), ServerStateKind::Down);
    for &pgid in pgids {
        wait_until(
            Duration::from_secs(5),
            "the server's group to be gone",
            || group_members(pgid).is_empty(),
        )
        .await;
    }
}

#[tokio::test]
async fn lists_tools_with_only_the_hints_the_server_set() {
    let (host, server) = up("t", stdio(&[])).await;
    let record = host.record();
    assert_eq!(
        record.states_of("t"),
        vec![ServerStateKind::Starting, ServerStateKind::Up]
    );
    let tools = record.tools_of("t").expect("tools were set");
    let hints = |name: &str| {
        tools
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.annotations.clone())
            .expect("tool listed")
    };
    assert_eq!(hints("echo").read_only_hint, Some(true));
    assert_eq!(hints("echo").destructive_hint, None);
    assert_eq!(hints("wipe").destructive_hint, Some(true));
    assert_eq!(hints("progress"), Default::default());
    let echo = tools.iter().find(|t| t.name == "echo").expect("echo");
    assert_eq!(
        echo.input_schema["properties"]["text"],
        json!({"type": "string"})
    );
    assert!(host.backend("t").is_some());
    let pid = server_pid(&server).await;
    finish(server, &[pid]).await;
}

#[tokio::test]
async fn answers_pass_through_and_errors_are_classified() {
    let (_host, server) = up("t", stdio(&[])).await;
    assert_eq!(
        output(call(&server, "echo", json!({"text": "hi", "structured": true})).await),
        ToolOutput {
            content: vec![Content::from_value(json!({"type": "text", "text": "hi"}))],
            structured_content: Some(json!({"text": "hi"})),
            is_error: false,
        }
    );
    let failed = output(call(&server, "fail", json!({})).await);
    assert!(failed.is_error);
    assert_eq!(failed.content[0].as_text(), Some("failed on purpose"));
    let rejected = error(call(&server, "reject", json!({})).await);
    assert!(
        matches!(&rejected, AttemptError::Rejected(m) if m.contains("rejected on purpose")),
        "{rejected:?}"
    );
    let not_object = error(call(&server, "echo", json!([1, 2])).await);
    assert!(matches!(not_object, AttemptError::Rejected(_)));
    let pid = server_pid(&server).await;
    finish(server, &[pid]).await;
}

#[tokio::test]
async fn progress_becomes_heartbeats() {
    let (_host, server) = up("t", stdio(&[])).await;
    let (kit, attempt) = AttemptKit::new(
        "progress",
        json!({"every_ms": 20, "count": 5}),
        "c",
        OnStuck::Abandon,
    );
    let before = kit.heartbeat.last_beat();
    let out = text(server.start(attempt).await);
    assert_eq!(out, "done after 5 steps");
    let progress = kit.progress();
    assert_eq!(
        progress
            .iter()
            .map(|p| (p.progress, p.total, p.message.clone()))
            .collect::<Vec<_>>(),
        (1..=5)
            .map(|i| (Some(i as f64), Some(5.0), Some(format!("step {i}"))))
            .collect::<Vec<_>>()
    );
    assert!(
        kit.heartbeat.last_beat() > before,
        "progress pushed the heartbeat"
    );
    let pid = server_pid(&server).await;
    finish(server, &[pid]).await;
}

#[tokio::test]
async fn a_cancel_reaches_the_server_for_that_request_only() {
    let (host, server) = up("t", stdio(&[])).await;
    let (kit, attempt) = AttemptKit::new(
        "sleep",
        json!({"ms": 30000, "tag": "A"}),
        "a",
        OnStuck::Abandon,
    );
    let cancelled = tokio::spawn(server.start(attempt));
    let other = tokio::spawn(
        server.start(
            AttemptKit::new(
                "sleep",
                json!({"ms": 800, "tag": "B"}),
                "b",
                OnStuck::Abandon,
            )
            .1,
        ),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    kit.cancel(CancelReason::User);
    tokio::time::sleep(GRACE).await;
    kit.force();
    assert!(matches!(
        cancelled.await.unwrap(),
        AttemptEnd::Stopped(StopHow::Cooperative)
    ));
    assert_eq!(text(other.await.unwrap()), "slept 800 ms");
    let seen = cancels(&server).await;
    assert_eq!(seen.len(), 1, "exactly one cancel: {seen:?}");
    assert_eq!(seen[0]["reason"], json!("user"));
    assert_eq!(seen[0]["tool"], json!("sleep"));
    assert_eq!(seen[0]["arguments"], json!({"ms": 30000, "tag": "A"}));
    assert!(host.record().late.is_empty());
    assert_eq!(host.record().abandoned_now("t"), 0);
    let pid = server_pid(&server).await;
    finish(server, &[pid]).await;
}

#[tokio::test]
async fn a_server_quiet_after_the_cancel_stopped_cooperatively() {
    let (host, server) = up("t", stdio(&[])).await;
    let (kit, attempt) = AttemptKit::new(
        "progress",
        json!({"every_ms": 30, "count": 1000}),
        "c",
        OnStuck::Restart,
    );
    let running = tokio::spawn(server.start(attempt));
    wait_until(Duration::from_secs(5), "progress", || {
        kit.progress().len() >= 2
    })
    .await;
    kit.cancel(CancelReason::Timeout);
    tokio::time::sleep(GRACE).await;
    kit.force();
    assert!(matches!(
        running.await.unwrap(),
        AttemptEnd::Stopped(StopHow::Cooperative)
    ));
    assert_eq!(cancels(&server).await[0]["reason"], json!("timeout"));
    // Not stuck, so no restart happened.
    assert_eq!(
        host.record().states_of("t"),
        vec![ServerStateKind::Starting, ServerStateKind::Up]
    );
    let pid = server_pid(&server).await;
    finish(server, &[pid]).await;
}

#[tokio::test]
async fn a_stuck_call_is_abandoned_and_counted_until_its_late_answer() {
    let (host, server) = up("t", stdio(&[])).await;
    let (kit, attempt) = AttemptKit::new(
        "hang",
        json!({"progress_every_ms": 40, "answer_after_ms": 2000}),
        "stuck",
        OnStuck::Abandon,
    );
    let running = tokio::spawn(server.start(attempt));
    wait_until(Duration::from_secs(5), "progress", || {
        !kit.progress().is_empty()
    })
    .await;
    kit.cancel(CancelReason::User);
    tokio::time::sleep(GRACE).await;
    kit.force();
    assert!(matches!(
        running.await.unwrap(),
        AttemptEnd::Stopped(StopHow::Abandoned)
    ));
    assert_eq!(host.record().abandoned_now("t"), 1);
    assert_eq!(server.abandoned(), 1);
    let record = host
        .wait_for(Duration::from_secs(10), "the late answer", |r| {
            !r.late.is_empty() && r.abandoned_now("t") == 0
        })
        .await;
    assert_eq!(record.late[0].call_id, "stuck");
    assert_eq!(record.late[0].tool, "hang");
    assert!(!record.late[0].is_error);
    assert_eq!(
        record.abandoned.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
        vec![1, 0]
    );
    let pid = server_pid(&server).await;
    finish(server, &[pid]).await;
}

#[tokio::test]
async fn an_abandoned_call_is_uncounted_when_its_server_exits() {
    let (host, server) = up("t", stdio(&[])).await;
    let pid = server_pid(&server).await;
    let (kit, attempt) = AttemptKit::new(
        "hang",
        json!({"progress_every_ms": 40}),
        "stuck",
        OnStuck::Abandon,
    );
    let running = tokio::spawn(server.start(attempt));
    wait_until(Duration::from_secs(5), "progress", || {
        !kit.progress().is_empty()
    })
    .await;
    kit.cancel(CancelReason::User);
    tokio::time::sleep(GRACE).await;
    kit.force();
    assert!(matches!(
        running.await.unwrap(),
        AttemptEnd::Stopped(StopHow::Abandoned)
    ));
    assert_eq!(host.record().abandoned_now("t"), 1);
    // The server exits (crash): nothing can answer any more.
    let crashed = error(call(&server, "crash", json!({})).await);
    assert!(matches!(crashed, AttemptError::Crashed(_)), "{crashed:?}");
    host.wait_for(Duration::from_secs(5), "uncounted", |r| {
        r.abandoned_now("t") == 0
    })
    .await;
    assert!(host.record().late.is_empty());
    server.wait_ready(READY).await.expect("back up");
    let new_pid = server_pid(&server).await;
    assert_ne!(new_pid, pid);
    finish(server, &[pid, new_pid]).await;
}

#[tokio::test]
async fn an_answer_after_the_cancel_within_the_grace_is_late_and_cooperative() {
    let (host, server) = up("t", stdio(&[])).await;
    let (kit, attempt) = AttemptKit::new(
        "hang",
        json!({"answer_after_ms": 300}),
        "late",
        OnStuck::Abandon,
    );
    let running = tokio::spawn(server.start(attempt));
    tokio::time::sleep(Duration::from_millis(100)).await;
    kit.cancel(CancelReason::User);
    // No force needed: the answer ends the attempt.
    let end = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("ends before any force")
        .unwrap();
    assert!(matches!(end, AttemptEnd::Stopped(StopHow::Cooperative)));
    let record = host.record();
    assert_eq!(record.late.len(), 1);
    assert_eq!(record.late[0].call_id, "late");
    assert!(record.late[0].after < Duration::from_secs(5));
    assert_eq!(record.abandoned_now("t"), 0);
    let pid = server_pid(&server).await;
    finish(server, &[pid]).await;
}

#[tokio::test]
async fn restart_on_stuck_kills_the_whole_tree_and_the_server_comes_back() {
    let (host, server) = up("t", stdio(&[])).await;
    let pid = server_pid(&server).await;
    let (kit, attempt) = AttemptKit::new(
        "spawn_grandchild",
        json!({"progress_every_ms": 40}),
        "stuck",
        OnStuck::Restart,
    );
    let running = tokio::spawn(server.start(attempt));
    let bystander = tokio::spawn(
        server.start(AttemptKit::new("sleep", json!({"ms": 30000}), "b", OnStuck::Abandon).1),
    );
    wait_until(Duration::from_secs(5), "the grandchild's pid", || {
        !kit.progress().is_empty()
    })
    .await;
    let message = kit.progress()[0].message.clone().expect("a message");
    let grandchild: u32 = message
        .strip_prefix("grandchild pid ")
        .expect("pid message")
        .parse()
        .expect("a pid");
    assert!(pid_alive(grandchild));
    assert!(group_members(pid).contains(&grandchild));
    kit.cancel(CancelReason::User);
    tokio::time::sleep(GRACE).await;
    kit.force();
    assert!(matches!(
        running.await.unwrap(),
        AttemptEnd::Stopped(StopHow::Restarted)
    ));
    // Killed with its whole group, grandchild included.
    assert_all_gone(&[pid, grandchild], Duration::from_secs(5)).await;
    assert!(group_members(pid).is_empty());
    let other = error(bystander.await.unwrap());
    assert!(matches!(other, AttemptError::ServerRestart(_)), "{other:?}");
    server.wait_ready(READY).await.expect("back up");
    let states = host.record().states_of("t");
    assert_eq!(
        states,
        vec![
            ServerStateKind::Starting,
            ServerStateKind::Up,
            ServerStateKind::Down,
            ServerStateKind::Starting,
            ServerStateKind::Restarted,
            ServerStateKind::Up,
        ]
    );
    let new_pid = server_pid(&server).await;
    assert_ne!(new_pid, pid);
    finish(server, &[new_pid]).await;
}

#[tokio::test]
async fn a_crash_mid_call_is_crashed_and_the_server_is_restarted() {
    let (host, server) = up("t", stdio(&[])).await;
    let pid = server_pid(&server).await;
    let crashed = error(call(&server, "crash", json!({"after_ms": 100})).await);
    match &crashed {
        AttemptError::Crashed(detail) => {
            assert!(detail.contains("exited with status 3"), "{detail}");
            assert!(detail.contains("crashing on purpose"), "{detail}");
        }
        other => panic!("expected Crashed, got {other:?}"),
    }
    server.wait_ready(READY).await.expect("back up");
    let record = host.record();
    let (down, detail) = record
        .states
        .iter()
        .find(|(_, k, _)| *k == ServerStateKind::Down)
        .map(|(_, k, d)| (*k, d.clone()))
        .expect("went down");
    assert_eq!(down, ServerStateKind::Down);
    assert!(detail.unwrap_or_default().contains("status 3"));
    assert!(record.states_of("t").contains(&ServerStateKind::Restarted));
    assert_eq!(
        text(call(&server, "echo", json!({"text": "again"})).await),
        "again"
    );
    let new_pid = server_pid(&server).await;
    finish(server, &[pid, new_pid]).await;
}

#[tokio::test]
async fn a_server_that_closes_its_stdout_is_treated_as_crashed_and_replaced() {
    let (host, server) = up("t", stdio(&[])).await;
    let pid = server_pid(&server).await;
    let closed = error(call(&server, "close_stdout", json!({})).await);
    match &closed {
        AttemptError::Crashed(detail) => assert!(detail.contains("closed its stdout"), "{detail}"),
        other => panic!("expected Crashed, got {other:?}"),
    }
    // The process that lived on was killed, and a new one serves.
    assert_all_gone(&[pid], Duration::from_secs(5)).await;
    server.wait_ready(READY).await.expect("back up");
    assert!(
        host.record()
            .states_of("t")
            .contains(&ServerStateKind::Restarted)
    );
    let new_pid = server_pid(&server).await;
    finish(server, &[pid, new_pid]).await;
}

#[tokio::test]
async fn garbage_on_stdout_is_survived_and_fails_only_the_call_it_touches() {
    let (_host, server) = up("t", stdio(&[])).await;
    let pid = server_pid(&server).await;
    // Junk lines between messages touch no call.
    assert_eq!(
        text(call(&server, "garbage", json!({"mode": "lines"})).await),
        "survived"
    );
    // A broken frame for a call fails that call at once instead of leaving it waiting.
    let broken = error(call(&server, "garbage", json!({"mode": "broken_frame"})).await);
    assert!(
        matches!(&broken, AttemptError::Transport(m) if m.contains("not JSON")),
        "{broken:?}"
    );
    let shape = error(call(&server, "garbage", json!({"mode": "bad_shape"})).await);
    assert!(
        matches!(&shape, AttemptError::Transport(m) if m.contains("malformed response")),
        "{shape:?}"
    );
    // An oversized answer fails its call; one under the limit passes.
    let flood = error(call(&server, "flood", json!({"bytes": 300_000})).await);
    assert!(
        matches!(&flood, AttemptError::Transport(m) if m.contains("over the 262144-byte limit")),
        "{flood:?}"
    );
    let big = text(call(&server, "flood", json!({"bytes": 200_000})).await);
    assert_eq!(big.len(), 200_000);
    // Same process, still serving.
    assert_eq!(server.state(), ServerStateKind::Up);
    assert_eq!(server_pid(&server).await, pid);
    assert_eq!(
        text(call(&server, "echo", json!({"text": "ok"})).await),
        "ok"
    );
    finish(server, &[pid]).await;
}

#[tokio::test]
async fn a_hundred_concurrent_calls_each_get_their_own_answer() {
    let (_host, server) = up("t", stdio(&[])).await;
    let calls = (0..100).map(|i| {
        let server = server.clone();
        tokio::spawn(async move {
            let tool = if i % 2 == 0 { "echo" } else { "progress" };
            let input = if i % 2 == 0 {
                json!({"text": format!("call {i}")})
            } else {
                json!({"every_ms": 5, "count": 3})
            };
            let (kit, attempt) = AttemptKit::new(tool, input, &format!("c{i}"), OnStuck::Abandon);
            let out = text(server.start(attempt).await);
            (i, out, kit.progress().len())
        })
    });
    for handle in futures::future::join_all(calls).await {
        let (i, out, progress) = handle.unwrap();
        if i % 2 == 0 {
            assert_eq!(out, format!("call {i}"));
            assert_eq!(progress, 0);
        } else {
            assert_eq!(out, "done after 3 steps");
            assert_eq!(progress, 3, "call {i} got its own progress");
        }
    }
    let pid = server_pid(&server).await;
    finish(server, &[pid]).await;
}

#[tokio::test]
async fn a_slow_start_within_the_startup_timeout_comes_up_and_calls_wait_for_it() {
    let mut cfg = stdio(&["--startup-delay-ms", "700"]);
    cfg.startup_timeout = Some(DurationValue::from_duration(Duration::from_secs(10)));
    let (host, server) = launch("t", cfg);
    // A call made while it starts waits for it.
    assert_eq!(
        text(call(&server, "echo", json!({"text": "early"})).await),
        "early"
    );
    assert_eq!(
        host.record().states_of("t"),
        vec![ServerStateKind::Starting, ServerStateKind::Up]
    );
    let pid = server_pid(&server).await;
    finish(server, &[pid]).await;
}

/// rmcp probes with `server/discover` and falls back to `initialize` after 10 s; a server that
/// reads nothing for 15 s (a package download, a JVM) then answers the probe late. Its first
/// start must still succeed, whichever eras it speaks.
#[tokio::test]
async fn a_server_that_reads_its_first_requests_15s_late_starts_on_its_first_try() {
    let slow = |era: &str| {
        let mut cfg = stdio(&["--silent-ms", "15000", "--era", era]);
        cfg.startup_timeout = Some(DurationValue::from_duration(Duration::from_secs(40)));
        launch(&format!("slow-{era}"), cfg)
    };
    let (handshake_host, handshake) = slow("handshake");
    let (both_host, both) = slow("both");
    for (host, server) in [(&handshake_host, &handshake), (&both_host, &both)] {
        server
            .wait_ready(Duration::from_secs(40))
            .await
            .expect("it comes up on its first start");
        let name = server.server_name().to_owned();
        assert_eq!(
            host.record().states_of(&name),
            vec![ServerStateKind::Starting, ServerStateKind::Up],
            "{name}: one start, no failure"
        );
        assert_eq!(
            text(call(server, "echo", json!({"text": "late but fine"})).await),
            "late but fine"
        );
    }
    let pids = [server_pid(&handshake).await, server_pid(&both).await];
    finish(handshake, &pids[..1]).await;
    finish(both, &pids[1..]).await;
}

/// `first_start` (what the gateway's first lists wait for) ends with the first attempt: when
/// the server is up, when its start times out (not at the next attempt's end), and at once for
/// a server whose start ended before.
#[tokio::test]
async fn first_start_ends_with_the_first_attempt_up_or_not() {
    let mut cfg = stdio(&["--startup-delay-ms", "700"]);
    cfg.startup_timeout = Some(DurationValue::from_duration(Duration::from_secs(10)));
    let (_host, slow) = launch("slow", cfg);
    slow.first_start().await;
    assert_eq!(slow.state(), ServerStateKind::Up);

    let mut cfg = stdio(&["--startup-delay-ms", "60000"]);
    cfg.startup_timeout = Some(DurationValue::from_duration(Duration::from_millis(300)));
    let (_host, stuck) = launch("stuck", cfg);
    stuck.first_start().await;
    // Down: the attempt ended (the wait's own bound, 1.3 s, would find it still starting).
    assert_eq!(stuck.state(), ServerStateKind::Down);
    // Ended before: at once, whatever the server does now.
    tokio::time::timeout(Duration::from_millis(100), stuck.first_start())
        .await
        .expect("a first start that ended is not waited for again");

    let pid = server_pid(&slow).await;
    finish(slow, &[pid]).await;
    finish(stuck, &[]).await;
}

#[tokio::test]
async fn a_start_over_the_startup_timeout_is_down_and_retried() {
    let mut cfg = stdio(&["--startup-delay-ms", "5000"]);
    cfg.startup_timeout = Some(DurationValue::from_duration(Duration::from_millis(300)));
    let (host, server) = launch("t", cfg);
    let err = server.wait_ready(READY).await.unwrap_err();
    match &err {
        ReadyError::Down { detail, .. } => {
            assert!(detail.contains("did not start within 300ms"), "{detail}")
        }
        other => panic!("expected Down, got {other:?}"),
    }
    // A call waits for it to come back, at most its startup_timeout, then fails saying why.
    let down = error(call(&server, "echo", json!({"text": "x"})).await);
    assert!(
        matches!(&down, AttemptError::Transport(m)
            if m.contains("was not up within 300ms") && m.contains("did not start within 300ms")),
        "{down:?}"
    );
    // It is retried with backoff.
    host.wait_for(Duration::from_secs(10), "a second start attempt", |r| {
        r.states_of("t")
            .iter()
            .filter(|k| **k == ServerStateKind::Starting)
            .count()
            >= 2
    })
    .await;
    finish(server, &[]).await;
    assert!(
        toolwarden_testkit::own_children_running("tw-test-server")
            .iter()
            .all(|p| !std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .contains("5000"))
    );
}

#[tokio::test]
async fn a_server_that_fails_to_start_says_why() {
    let (host, server) = launch("t", stdio(&["--fail-startup"]));
    let err = server.wait_ready(READY).await.unwrap_err();
    let ReadyError::Down { detail, .. } = &err else {
        panic!("expected Down, got {err:?}")
    };
    assert!(detail.contains("exited with status 2"), "{detail}");
    assert!(detail.contains("failing start-up on purpose"), "{detail}");
    // An exit before the handshake is `failed`: its calls fail at once, saying why.
    assert_eq!(
        host.record().last_state("t").map(|s| s.0),
        Some(ServerStateKind::Failed)
    );
    let started = tokio::time::Instant::now();
    let failed = error(call(&server, "echo", json!({"text": "x"})).await);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        matches!(&failed, AttemptError::Unavailable(m)
            if m.starts_with("MCP server \"t\" cannot start: ") && m.contains("exited with status 2")),
        "{failed:?}"
    );
    finish(server, &[]).await;

    let (_host, server) = launch(
        "t",
        ServerConfig {
            command: Some("/nonexistent/tw-nothing".into()),
            ..Default::default()
        },
    );
    let err = server.wait_ready(READY).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot run /nonexistent/tw-nothing"),
        "{err}"
    );
    finish(server, &[]).await;

    let (_host, server) = launch("t", ServerConfig::default());
    let err = server.wait_ready(READY).await.unwrap_err();
    assert!(
        err.to_string().contains("neither `command` nor `url`"),
        "{err}"
    );
    finish(server, &[]).await;
}

/// A failed server is tried again on the backoff, quietly (no `starting` for those tries, no
/// second `failed` while it fails the same way), and comes up once its command exists.
#[tokio::test]
async fn a_failed_server_is_retried_and_comes_up_once_its_command_exists() {
    let dir = std::env::temp_dir().join(format!("tw-failed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("late-server");
    let _ = std::fs::remove_file(&script);
    let (host, server) = launch(
        "t",
        ServerConfig {
            command: Some(script.display().to_string()),
            ..Default::default()
        },
    );
    host.wait_for(Duration::from_secs(10), "failed", |r| {
        r.states_of("t") == vec![ServerStateKind::Starting, ServerStateKind::Failed]
    })
    .await;
    // Several quiet tries later (the test backoff starts at 100 ms), still the same two states.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        host.record().states_of("t"),
        vec![ServerStateKind::Starting, ServerStateKind::Failed]
    );
    // The command appears (installed): the next try brings it up.
    let tmp = dir.join("late-server.tmp");
    std::fs::write(
        &tmp,
        format!(
            "#!/bin/sh\nexec {} \"$@\"\n",
            toolwarden_testkit::test_server_path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::rename(&tmp, &script).unwrap();
    host.wait_for(Duration::from_secs(10), "up once the command exists", |r| {
        r.states_of("t").contains(&ServerStateKind::Up)
    })
    .await;
    assert_eq!(
        host.record().states_of("t"),
        vec![
            ServerStateKind::Starting,
            ServerStateKind::Failed,
            ServerStateKind::Up
        ]
    );
    assert_eq!(
        text(call(&server, "echo", json!({"text": "at last"})).await),
        "at last"
    );
    let pid = server_pid(&server).await;
    finish(server, &[pid]).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn tools_list_changed_refreshes_the_tools() {
    let (host, server) = up("t", stdio(&[])).await;
    assert!(!host.record().tool_names("t").contains(&"bonus".to_owned()));
    assert_eq!(
        text(call(&server, "toggle_tools", json!({})).await),
        "bonus tool added"
    );
    host.wait_for(Duration::from_secs(5), "the bonus tool", |r| {
        r.tool_names("t").contains(&"bonus".to_owned())
    })
    .await;
    let pid = server_pid(&server).await;
    finish(server, &[pid]).await;
}

#[tokio::test]
async fn a_streamable_http_server_serves_calls_progress_and_cancels() {
    let (mut process, url) = http_server(&[]).await;
    let (_host, server) = up(
        "web",
        ServerConfig {
            url: Some(url),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        text(call(&server, "echo", json!({"text": "over http"})).await),
        "over http"
    );
    let (kit, attempt) = AttemptKit::new(
        "progress",
        json!({"every_ms": 20, "count": 3}),
        "p",
        OnStuck::Abandon,
    );
    assert_eq!(text(server.start(attempt).await), "done after 3 steps");
    assert_eq!(kit.progress().len(), 3);

    cancels_a_sleep(&server, "H").await;
    let seen = cancels(&server).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["arguments"], json!({"ms": 30000, "tag": "H"}));
    assert_eq!(seen[0]["reason"], json!("user"));
    server.shutdown().await;
    let pid = process.pgid();
    process.kill().expect("kill");
    process.wait().await.expect("reap");
    wait_until(Duration::from_secs(5), "the HTTP server gone", || {
        group_members(pid).is_empty()
    })
    .await;
}

#[tokio::test]
async fn an_http_server_that_dies_mid_call_fails_the_call_and_goes_down() {
    let (mut process, url) = http_server(&[]).await;
    let (host, server) = up(
        "web",
        ServerConfig {
            url: Some(url),
            ..Default::default()
        },
    )
    .await;
    let running = tokio::spawn(
        server.start(AttemptKit::new("sleep", json!({"ms": 30000}), "s", OnStuck::Abandon).1),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    process.kill().expect("kill");
    process.wait().await.expect("reap");
    let end = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the call ends")
        .unwrap();
    let e = error(end);
    assert!(matches!(e, AttemptError::Transport(_)), "{e:?}");
    // A liveness probe found it gone: down, and retried in the background.
    host.wait_for(Duration::from_secs(20), "down", |r| {
        r.last_state("web").is_some_and(|(k, d)| {
            k == ServerStateKind::Down && d.is_some_and(|d| d.contains("stopped answering"))
        })
    })
    .await;
    let down = error(call(&server, "echo", json!({"text": "x"})).await);
    assert!(matches!(down, AttemptError::Transport(_)), "{down:?}");
    finish(server, &[]).await;
}
