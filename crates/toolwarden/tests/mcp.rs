//! `toolwarden mcp`: the MCP gateway on stdio, as MCP clients start it (the protocol itself is
//! proven with the official Python SDK in `tests/e2e`; these are the process-level cases).

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use crate::util::Dir;

/// Writes JSON-RPC messages, one per line.
async fn send(stdin: &mut tokio::process::ChildStdin, messages: &[Value]) {
    for message in messages {
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
    }
    stdin.flush().await.unwrap();
}

fn initialize() -> [Value; 2] {
    [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "e2e", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ]
}

/// Waits until `path` holds a line with `needle`.
async fn wait_for_line(path: &std::path::Path, needle: &str, timeout: Duration) -> String {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains(needle)) {
            return line.to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no line with {needle:?} within {timeout:?}; got:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// stdin a pipe, stdout a file (or a socket, or a terminal): the gateway must not make stdin
/// non-blocking and then read it blocking — every pause of the client would end the session.
#[tokio::test]
async fn mcp_serves_a_pipe_on_stdin_with_stdout_a_file() {
    let dir = Dir::new();
    let out = dir.path().join("stdout.jsonl");
    let mut server = dir
        .command(&["mcp"])
        .stdio(Stdio::piped(), Stdio::piped())
        .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
        .spawn();
    let mut stdin = server.take_stdin();
    send(&mut stdin, &initialize()).await;
    wait_for_line(&out, r#""id":1,"result""#, Duration::from_secs(20)).await;
    // The client pauses, as clients do between requests.
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(
        &mut stdin,
        &[json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})],
    )
    .await;
    let listed = wait_for_line(&out, r#""id":2"#, Duration::from_secs(10)).await;
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(
        listed["result"]["tools"][0]["name"], "toolwarden__status",
        "{listed}"
    );
    drop(stdin);
    let done = server.wait(Duration::from_secs(10)).await;
    done.expect_code(0);
    assert!(!done.stderr.contains("Error reading"), "{}", done.stderr);
}
