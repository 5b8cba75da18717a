//! Interop with the official reference server `@modelcontextprotocol/server-everything`
//! (pinned in the repository's `package.json`, installed by `scripts/setup-test-deps.sh`).
//!
//! Its `trigger-long-running-operation` tool sends progress for the request's token and ignores
//! cancels: after the cancel and the grace period the call is stuck, so it is abandoned and
//! counted. Its SDK (TypeScript) never answers a cancelled request, so the count only drops when
//! the server exits.
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "test helpers")]

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::json;
use toolwarden_core::protocol::{CancelReason, OnStuck, ServerConfig, ServerStateKind, StopHow};
use toolwarden_core::{AttemptEnd, Backend};
use toolwarden_mcp::McpServer;
use toolwarden_testkit::{AttemptKit, RecordingHost, everything_bin, group_members, wait_until};

#[tokio::test]
async fn server_everything_long_running_operation_is_abandoned_after_its_ignored_cancel() {
    let host = RecordingHost::new();
    let server = McpServer::start(
        "everything".into(),
        ServerConfig {
            command: Some(everything_bin().display().to_string()),
            args: vec!["stdio".into()],
            ..Default::default()
        },
        host.clone(),
        std::env::temp_dir(),
    );
    server
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("server-everything comes up");
    let record = host.record();
    let long = record
        .tools_of("everything")
        .and_then(|tools| {
            tools
                .iter()
                .find(|t| t.name == "trigger-long-running-operation")
        })
        .expect("trigger-long-running-operation is listed")
        .clone();
    assert_eq!(long.annotations.read_only_hint, Some(true));
    assert_eq!(long.annotations.destructive_hint, Some(false));
    assert!(long.input_schema["properties"]["duration"].is_object());

    // A plain call works.
    let (_kit, attempt) =
        AttemptKit::new("echo", json!({"message": "hello"}), "e", OnStuck::Abandon);
    match server.start(attempt).await {
        AttemptEnd::Done(Ok(out)) => {
            assert!(!out.is_error);
            assert!(
                out.content[0]
                    .as_text()
                    .is_some_and(|t| t.contains("hello")),
                "{out:?}"
            );
        }
        other => panic!("echo failed: {other:?}"),
    }

    // The long operation: progress arrives as heartbeats...
    let (kit, attempt) = AttemptKit::new(
        "trigger-long-running-operation",
        json!({"duration": 30, "steps": 100}),
        "long",
        OnStuck::Abandon,
    );
    let running = tokio::spawn(server.start(attempt));
    wait_until(Duration::from_secs(10), "two progress heartbeats", || {
        kit.progress().len() >= 2
    })
    .await;
    let progress = kit.progress();
    assert_eq!(progress[0].progress, Some(1.0));
    assert_eq!(progress[0].total, Some(100.0));
    // ...and the cancel is ignored: progress goes on past the grace period.
    kit.cancel(CancelReason::User);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    kit.force();
    assert!(matches!(
        running.await.unwrap(),
        AttemptEnd::Stopped(StopHow::Abandoned)
    ));
    assert_eq!(host.record().abandoned_now("everything"), 1);
    assert_eq!(server.state(), ServerStateKind::Up);

    // Counted until the server exits.
    let pgid = {
        let children = toolwarden_testkit::descendants(std::process::id());
        children
            .into_iter()
            .find(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).contains("mcp-server-everything"))
                    .unwrap_or(false)
            })
            .expect("the server process")
    };
    server.shutdown().await;
    assert_eq!(host.record().abandoned_now("everything"), 0);
    wait_until(Duration::from_secs(5), "server-everything gone", || {
        group_members(pgid).is_empty()
    })
    .await;
}

/// The same tool governed by the engine: its progress keeps it alive past its idle timeout, its
/// total timeout ends the call at once, the cancel goes out, and since the server ignores it the
/// call is `abandoned` and counted in `toolwarden_abandoned_calls`.
#[tokio::test]
async fn server_everything_under_the_engine_idle_kept_alive_total_enforced_stuck_accounted() {
    use std::sync::Arc;
    use toolwarden_core::protocol::{EventKind, Status, TimeoutKind, ToolCall};
    use toolwarden_core::{Config, Engine, Received};

    let src = format!(
        r#"
        [servers.everything]
        command = {:?}
        args = ["stdio"]
        startup_timeout = "60s"
        [tools."everything__trigger-long-running-operation"]
        idle_timeout = "2s"
        timeout = "4s"
        cancel_grace = "1s"
        "#,
        everything_bin().display().to_string()
    );
    let config = Config::parse(&src, "test.toml", &|_| None).unwrap();
    let engine = Engine::builder().policies(Arc::new(config.clone())).build();
    let server = McpServer::start(
        "everything".into(),
        config.file.servers["everything"].clone(),
        engine.host(true),
        std::env::temp_dir(),
    );
    server
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("server-everything comes up");
    let mut sub = engine.subscribe();

    // 100 steps over 30 s: progress every 300 ms, so the 2 s idle deadline never fires.
    let result = engine
        .call(
            "s",
            ToolCall::new(
                "long",
                "everything__trigger-long-running-operation",
                json!({"duration": 30, "steps": 100}),
            ),
        )
        .await;
    assert_eq!(
        result.outcome.status,
        Status::Timeout {
            kind: TimeoutKind::Total,
            after_ms: 4000
        }
    );

    let mut progress = 0;
    let mut result_seq = None;
    let mut stopped = None;
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Received::Event(e)) = sub.recv().await {
            match e.kind {
                EventKind::ToolProgress { .. } => progress += 1,
                EventKind::ToolResult { .. } => result_seq = Some(e.seq),
                EventKind::ToolStopped { how, after_ms, .. } => {
                    stopped = Some((e.seq, how, after_ms));
                    break;
                }
                _ => {}
            }
        }
    })
    .await;
    assert!(
        progress >= 4,
        "progress was relayed as tool_progress: {progress}"
    );
    let (stopped_seq, how, after_ms) = stopped.expect("tool_stopped");
    assert_eq!(how, StopHow::Abandoned, "the server ignored the cancel");
    // The outcome went out first; the stop took at least the grace period behind it.
    assert!(result_seq.expect("tool_result") < stopped_seq);
    assert!(
        after_ms >= 1000,
        "stopping waited for cancel_grace: {after_ms} ms"
    );
    let metrics = engine.metrics().encode();
    assert!(
        metrics.contains("toolwarden_abandoned_calls{server=\"everything\"} 1"),
        "the stuck call is counted:\n{metrics}"
    );
    server.shutdown().await;
}
