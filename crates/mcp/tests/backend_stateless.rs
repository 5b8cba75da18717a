//! The MCP client backend against `tw-test-server` speaking only 2026-07-28 (no `initialize`,
//! no sessions), over stdio and Streamable HTTP: it must work exactly as with a handshake
//! server — tools listed, progress as heartbeats, cancels that reach the server, restarts.
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "test helpers")]

mod backend_support;

use backend_support::*;

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use toolwarden_core::protocol::{CancelReason, OnStuck, ServerStateKind, StopHow};
use toolwarden_core::{AttemptEnd, AttemptError, Backend};
use toolwarden_mcp::McpServer;
use toolwarden_testkit::{AttemptKit, wait_until};

/// Lists, calls, relays progress as heartbeats, and cancels a sleeping call; returns the
/// cancels the server saw.
async fn serves_calls_progress_and_cancels(server: &McpServer) -> Vec<Value> {
    assert_eq!(text(call(server, "version", json!({})).await), "2026-07-28");
    assert_eq!(
        text(call(server, "echo", json!({"text": "hi"})).await),
        "hi"
    );
    let (kit, attempt) = AttemptKit::new(
        "progress",
        json!({"every_ms": 20, "count": 3}),
        "p",
        OnStuck::Abandon,
    );
    assert_eq!(text(server.start(attempt).await), "done after 3 steps");
    // Over HTTP the server first says "started" (progress 0), to open the response stream.
    let steps: Vec<Option<f64>> = kit
        .progress()
        .iter()
        .map(|p| p.progress)
        .filter(|p| *p != Some(0.0))
        .collect();
    assert_eq!(steps, vec![Some(1.0), Some(2.0), Some(3.0)]);

    cancels_a_sleep(server, "S").await;
    // The server notes a closed stream on its own task: give it a moment.
    let mut seen = Vec::new();
    for _ in 0..50 {
        seen = cancels(server).await;
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["arguments"], json!({"ms": 30000, "tag": "S"}));
    seen
}

#[tokio::test]
async fn a_2026_only_stdio_server_is_discovered_and_works_like_a_handshake_server() {
    let (host, server) = up("new", stdio(&["--era", "2026-07-28"])).await;
    let record = host.record();
    assert_eq!(
        record.states_of("new"),
        vec![ServerStateKind::Starting, ServerStateKind::Up]
    );
    assert!(record.tool_names("new").contains(&"echo".to_owned()));
    let seen = serves_calls_progress_and_cancels(&server).await;
    // On stdio the cancel is `notifications/cancelled`, with the engine's reason.
    assert_eq!(seen[0]["reason"], json!("user"));
    server.shutdown().await;
}

#[tokio::test]
async fn a_2026_only_http_server_is_cancelled_by_closing_the_stream() {
    let (process, url) = http_server(&["--era", "2026-07-28"]).await;
    let (host, server) = up("web", http(&url)).await;
    assert!(host.record().tool_names("web").contains(&"echo".to_owned()));
    let seen = serves_calls_progress_and_cancels(&server).await;
    // Over HTTP the cancel is the closing of the request's response stream.
    assert_eq!(seen[0]["reason"], json!("stream closed"));
    server.shutdown().await;
    reap(process).await;
}

/// `protocol = "auto"`: the handshake for a server that takes it (one of both eras too: it
/// loses nothing for handshake clients), 2026-07-28 for a server of that revision alone; a
/// pinned revision is spoken whatever the server also speaks. The revision reached is reported.
#[tokio::test]
async fn a_server_is_spoken_to_in_its_protocol_and_auto_prefers_the_handshake() {
    let pinned = |args: &[&str], protocol: &str| {
        let mut cfg = stdio(args);
        cfg.protocol = Some(protocol.to_owned());
        cfg
    };
    for (name, cfg, expected) in [
        ("both", stdio(&["--era", "both"]), "2025-11-25"),
        ("old", stdio(&[]), "2025-11-25"),
        ("new", stdio(&["--era", "2026-07-28"]), "2026-07-28"),
        (
            "both-pinned",
            pinned(&["--era", "both"], "2026-07-28"),
            "2026-07-28",
        ),
        ("old-pinned", pinned(&[], "2025-06-18"), "2025-06-18"),
    ] {
        let (host, server) = up(name, cfg).await;
        assert_eq!(
            text(call(&server, "version", json!({})).await),
            expected,
            "{name}"
        );
        assert_eq!(
            host.record().protocols_of(name),
            vec![expected.to_owned()],
            "{name}"
        );
        // One start only, even for the 2026-07-28 server that refused the handshake first.
        assert_eq!(
            host.record().states_of(name),
            vec![ServerStateKind::Starting, ServerStateKind::Up],
            "{name}"
        );
        server.shutdown().await;
    }
    // A pinned revision the server does not speak: it does not come up, saying why.
    let (_host, server) = launch("refuses", pinned(&["--era", "2026-07-28"], "2025-11-25"));
    let err = server.wait_ready(READY).await.unwrap_err();
    assert!(err.to_string().contains("initialize failed"), "{err}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_2026_only_http_server_that_runs_a_call_with_progress_past_a_cancel_is_stopped() {
    // `hang` ignores cancels and keeps sending progress: over HTTP the closed stream cuts it
    // off, so nothing more can arrive and the attempt ends at once, cooperatively.
    let (process, url) = http_server(&["--era", "2026-07-28"]).await;
    let (_host, server) = up("web", http(&url)).await;
    let (kit, attempt) = AttemptKit::new(
        "hang",
        json!({"progress_every_ms": 50}),
        "h",
        OnStuck::Abandon,
    );
    let running = tokio::spawn(server.start(attempt));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while kit.progress().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "no progress came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kit.cancel(CancelReason::Timeout);
    // No forced stop ever comes here: an attempt that waited for one would never end; the limit
    // only guards against that hang.
    let end = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the attempt ends without waiting for the forced stop")
        .unwrap();
    assert!(matches!(end, AttemptEnd::Stopped(StopHow::Cooperative)));
    assert_eq!(server.abandoned(), 0);
    server.shutdown().await;
    reap(process).await;
}

#[tokio::test]
async fn a_2026_only_server_that_crashes_is_restarted_and_rediscovered() {
    let (host, server) = up("new", stdio(&["--era", "2026-07-28"])).await;
    let end = call(&server, "crash", json!({"after_ms": 0})).await;
    assert!(
        matches!(end, AttemptEnd::Done(Err(AttemptError::Crashed(_)))),
        "{end:?}"
    );
    host.wait_for(Duration::from_secs(20), "restarted and up", |r| {
        r.states_of("new")
            .ends_with(&[ServerStateKind::Restarted, ServerStateKind::Up])
    })
    .await;
    assert_eq!(
        text(call(&server, "version", json!({})).await),
        "2026-07-28"
    );
    server.shutdown().await;
}

/// A call answered with a task: followed to its result, its status messages as progress.
async fn follows_a_task_to_its_result(server: &McpServer) {
    let (kit, attempt) = AttemptKit::new(
        "task",
        json!({"ms": 300, "steps": 3, "poll_ms": 20}),
        "k",
        OnStuck::Abandon,
    );
    assert_eq!(text(server.start(attempt).await), "task done");
    // Polling samples the task: each status it saw change is a beat, in order, the last one
    // "completed" (a step may fall between two polls).
    let messages: Vec<String> = kit
        .progress()
        .iter()
        .filter_map(|p| p.message.clone())
        .collect();
    assert_eq!(
        messages.last().map(String::as_str),
        Some("completed"),
        "{messages:?}"
    );
    let steps: Vec<&String> = messages.iter().filter(|m| m.starts_with("step")).collect();
    assert!(!steps.is_empty(), "{messages:?}");
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{messages:?}");
}

/// A task cancelled by the engine: `tasks/cancel` reaches the server, which stops it.
async fn cancels_a_task(server: &McpServer) {
    let (kit, attempt) = AttemptKit::new(
        "task",
        json!({"ms": 30000, "steps": 300, "poll_ms": 20}),
        "k",
        OnStuck::Abandon,
    );
    let running = tokio::spawn(server.start(attempt));
    tokio::time::sleep(Duration::from_millis(400)).await;
    kit.cancel(CancelReason::Timeout);
    let end = tokio::time::timeout(GRACE, running)
        .await
        .expect("the task is seen cancelled within the grace period")
        .unwrap();
    assert!(
        matches!(end, AttemptEnd::Stopped(StopHow::Cooperative)),
        "{end:?}"
    );
    let seen = cancels(server).await;
    let task_cancels: Vec<&Value> = seen
        .iter()
        .filter(|c| c["reason"] == json!("tasks/cancel"))
        .collect();
    assert_eq!(task_cancels.len(), 1, "{seen:?}");
    assert_eq!(task_cancels[0]["tool"], json!("task"));
}

#[tokio::test]
async fn a_task_from_a_2026_server_is_polled_to_its_result_and_cancelled_with_tasks_cancel() {
    let (_host, server) = up("new", stdio(&["--era", "2026-07-28"])).await;
    follows_a_task_to_its_result(&server).await;
    cancels_a_task(&server).await;
    server.shutdown().await;
    let (process, url) = http_server(&["--era", "2026-07-28"]).await;
    let (_host, server) = up("web", http(&url)).await;
    follows_a_task_to_its_result(&server).await;
    cancels_a_task(&server).await;
    server.shutdown().await;
    reap(process).await;
}

#[tokio::test]
async fn a_task_that_ignores_tasks_cancel_is_abandoned_until_it_ends() {
    let (_host, server) = up("new", stdio(&["--era", "2026-07-28"])).await;
    let (kit, attempt) = AttemptKit::new(
        "task",
        json!({"ms": 2500, "steps": 5, "poll_ms": 20, "ignore_cancel": true}),
        "k",
        OnStuck::Abandon,
    );
    let running = tokio::spawn(server.start(attempt));
    tokio::time::sleep(Duration::from_millis(200)).await;
    kit.cancel(CancelReason::User);
    tokio::time::sleep(GRACE).await;
    kit.force();
    assert!(matches!(
        running.await.unwrap(),
        AttemptEnd::Stopped(StopHow::Abandoned)
    ));
    assert_eq!(server.abandoned(), 1);
    // Counted until the task reaches a final status on the server.
    wait_until(Duration::from_secs(10), "the abandoned task to end", || {
        server.abandoned() == 0
    })
    .await;
    server.shutdown().await;
}
