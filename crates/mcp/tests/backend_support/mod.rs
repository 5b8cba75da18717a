//! What the tests of the MCP client backend share (`backend.rs`, `backend_stateless.rs`):
//! `tw-test-server` over stdio or Streamable HTTP, one backend up in front of it, an attempt
//! run to its end, and what it answered.
#![allow(dead_code, reason = "each test file uses part of it")]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use toolwarden_core::protocol::{CancelReason, OnStuck, ServerConfig, StopHow};
use toolwarden_core::{AttemptEnd, AttemptError, Backend as _, ToolOutput};
use toolwarden_mcp::{McpOptions, McpServer};
use toolwarden_testkit::{AttemptKit, RecordingHost, group_members, test_server_path, wait_until};

pub(crate) const READY: Duration = Duration::from_secs(20);
/// The grace period the tests give a cancelled call before forcing the stop.
pub(crate) const GRACE: Duration = Duration::from_millis(600);

/// `tw-test-server` over stdio, with `args`.
pub(crate) fn stdio(args: &[&str]) -> ServerConfig {
    ServerConfig {
        command: Some(test_server_path().display().to_string()),
        args: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// A server at `url`, over Streamable HTTP.
pub(crate) fn http(url: &str) -> ServerConfig {
    ServerConfig {
        url: Some(url.to_owned()),
        ..Default::default()
    }
}

pub(crate) fn opts() -> McpOptions {
    McpOptions {
        restart_backoff_initial: Duration::from_millis(100),
        restart_backoff_max: Duration::from_secs(1),
        max_message_bytes: 256 * 1024,
        ..Default::default()
    }
}

/// Starts the backend `name` without waiting for it.
pub(crate) fn launch(name: &str, cfg: ServerConfig) -> (Arc<RecordingHost>, Arc<McpServer>) {
    let host = RecordingHost::new();
    let server = McpServer::start_with(
        name.to_owned(),
        cfg,
        host.clone(),
        std::env::temp_dir(),
        opts(),
    );
    (host, server)
}

/// Starts the backend `name` and waits until its server is up.
pub(crate) async fn up(name: &str, cfg: ServerConfig) -> (Arc<RecordingHost>, Arc<McpServer>) {
    let (host, server) = launch(name, cfg);
    server.wait_ready(READY).await.expect("server comes up");
    (host, server)
}

/// Runs one attempt to its end with nobody stopping it.
pub(crate) async fn call(server: &McpServer, tool: &str, input: Value) -> AttemptEnd {
    let (_kit, attempt) = AttemptKit::new(tool, input, "c", OnStuck::Abandon);
    server.start(attempt).await
}

pub(crate) fn output(end: AttemptEnd) -> ToolOutput {
    match end {
        AttemptEnd::Done(Ok(out)) => out,
        other => panic!("expected an answer, got {other:?}"),
    }
}

pub(crate) fn text(end: AttemptEnd) -> String {
    output(end).content[0]
        .as_text()
        .expect("a text block")
        .to_owned()
}

pub(crate) fn error(end: AttemptEnd) -> AttemptError {
    match end {
        AttemptEnd::Done(Err(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// The `notifications/cancelled` the server has received so far.
pub(crate) async fn cancels(server: &McpServer) -> Vec<Value> {
    let out = output(call(server, "cancels", json!({})).await);
    out.structured_content.expect("structured")["cancels"]
        .as_array()
        .expect("a list")
        .clone()
}

/// Runs the test server over Streamable HTTP with `args`; returns it and its `/mcp` URL.
pub(crate) async fn http_server(args: &[&str]) -> (toolwarden_process::GroupChild, String) {
    use tokio::io::AsyncBufReadExt as _;
    let mut cmd = tokio::process::Command::new(test_server_path());
    cmd.args(["--http", "127.0.0.1:0"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped());
    let mut child = toolwarden_process::GroupChild::spawn(cmd).expect("spawn");
    let stdout = child.take_stdout().expect("stdout");
    let mut line = String::new();
    tokio::io::BufReader::new(stdout)
        .read_line(&mut line)
        .await
        .expect("the address line");
    (child, format!("http://{}/mcp", line.trim()))
}

/// Kills an HTTP test server and waits until its process group is gone.
pub(crate) async fn reap(mut process: toolwarden_process::GroupChild) {
    let pgid = process.pgid();
    process.kill().expect("kill");
    process.wait().await.expect("reap");
    wait_until(Duration::from_secs(5), "the HTTP server gone", || {
        group_members(pgid).is_empty()
    })
    .await;
}

/// Starts a 30 s `sleep` (its arguments carry `tag`), cancels it after 300 ms and forces the
/// stop after [`GRACE`]: the server honours the cancel, so the attempt ends cooperatively.
pub(crate) async fn cancels_a_sleep(server: &McpServer, tag: &str) {
    let (kit, attempt) = AttemptKit::new(
        "sleep",
        json!({"ms": 30000, "tag": tag}),
        &tag.to_lowercase(),
        OnStuck::Abandon,
    );
    let running = tokio::spawn(server.start(attempt));
    tokio::time::sleep(Duration::from_millis(300)).await;
    kit.cancel(CancelReason::User);
    tokio::time::sleep(GRACE).await;
    kit.force();
    assert!(matches!(
        running.await.unwrap(),
        AttemptEnd::Stopped(StopHow::Cooperative)
    ));
}
