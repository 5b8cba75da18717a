//! `toolwarden mcp`: the MCP gateway on stdio, as MCP clients start it (the protocol itself is
//! proven with the official Python SDK in `tests/e2e`; these are the process-level cases).

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use nix::sys::signal::Signal;

use crate::util::{
    Dir, Running, assert_group_gone, assert_no_process, marker, test_server, toml_str,
    wait_for_process,
};

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

/// A config in `dir` with the test server as `name`, started with `args` (and `extra` lines in
/// its table).
fn with_test_server(dir: &Dir, name: &str, args: &[&str], extra: &str) {
    let args: Vec<String> = args.iter().map(|a| toml_str(a)).collect();
    dir.create(
        "toolwarden.toml",
        &format!(
            "[servers.{name}]\ncommand = {}\nargs = [{}]\n{extra}",
            toml_str(&test_server()),
            args.join(", ")
        ),
    );
}

/// `toolwarden mcp` started in `dir`, its handshake made: the process, its stdin, and the
/// `initialize` answer's line.
async fn handshake(dir: &Dir) -> (Running, tokio::process::ChildStdin, String) {
    let mut gateway = dir
        .command(&["mcp"])
        .stdio(Stdio::piped(), Stdio::piped())
        .spawn();
    let mut stdin = gateway.take_stdin();
    send(&mut stdin, &initialize()).await;
    let init = gateway
        .wait_stdout(r#""id":1,"result""#, Duration::from_secs(20))
        .await;
    (gateway, stdin, init)
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

/// MCP's stdio shutdown is stdin closed, then SIGTERM (the official SDKs send it 2 s later),
/// then SIGKILL. A SIGTERM while toolwarden is still stopping a call after the client left is
/// that escalation: the servers are shut down at once — their process groups killed, so a
/// server's own children die too — and toolwarden exits 0 instead of leaving them behind.
#[tokio::test]
async fn a_signal_after_the_client_left_shuts_the_servers_down_at_once() {
    let dir = Dir::new();
    let mark = marker("mcp-eof-term");
    with_test_server(&dir, "test", &["--stderr-line", &mark], "");
    let (mut gateway, mut stdin, _) = handshake(&dir).await;
    // A call whose server ignores the cancel, and which started a child of the server.
    send(
        &mut stdin,
        &[
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "test__spawn_grandchild", "arguments": {"progress_every_ms": 100}}}),
        ],
    )
    .await;
    let server = wait_for_process(gateway.pid(), &mark, Duration::from_secs(10)).await[0];
    let _cleanup = KillGroupOnDrop(server);
    // Its `sleep 600` (command lines hold NULs between arguments).
    let grandchild = wait_for_process(server, "sleep\u{0}600", Duration::from_secs(10)).await[0];

    drop(stdin);
    tokio::time::sleep(Duration::from_millis(200)).await;
    gateway.signal(Signal::SIGTERM);
    let started = tokio::time::Instant::now();
    let done = gateway.wait(Duration::from_secs(10)).await;
    done.expect_code(0);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "exit took {:?}; stderr:\n{}",
        started.elapsed(),
        done.stderr
    );
    assert!(!done.stderr.contains("again"), "{}", done.stderr);
    assert!(!toolwarden_testkit::pid_alive(grandchild));
    assert_group_gone(server, Duration::from_secs(1)).await;
    assert_no_process(&mark, Duration::from_secs(1)).await;
}

/// Kills a process group when the test ends, passed or not (its processes would otherwise
/// outlive a failed test).
struct KillGroupOnDrop(u32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        let _ =
            nix::sys::signal::killpg(nix::unistd::Pid::from_raw(self.0 as i32), Signal::SIGKILL);
    }
}

/// An MCP client gives up on a server whose handshake takes long, so `initialize` waits 10 s at
/// most for a server that still starts; the first `tools/list` waits for that start and holds
/// the server's tools.
#[tokio::test]
async fn initialize_waits_for_a_slow_server_ten_seconds_at_most_and_the_first_list_holds_its_tools()
{
    let dir = Dir::new();
    let mark = marker("mcp-slow-start");
    with_test_server(
        &dir,
        "slow",
        &["--startup-delay-ms", "13000", "--stderr-line", &mark],
        "startup_timeout = \"60s\"\n",
    );
    let (mut gateway, mut stdin, init) = handshake(&dir).await;
    // Answered with what is up: no server offers prompts yet.
    assert!(!init.contains(r#""prompts""#), "{init}");
    assert!(
        !gateway.stderr().contains(r#"server "slow" is up"#),
        "initialize was answered only once the server was up:\n{}",
        gateway.stderr()
    );
    let names = |line: &str| -> Vec<String> {
        let listed: Value = serde_json::from_str(line).unwrap();
        listed["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{listed}"))
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect()
    };
    // A list waits within its own deadline: past it, it says what is up.
    send(
        &mut stdin,
        &[
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": {"timeout_ms": 300}}}),
        ],
    )
    .await;
    let hurried = gateway
        .wait_stdout(r#""id":2"#, Duration::from_secs(10))
        .await;
    assert!(
        !names(&hurried).contains(&"slow__echo".to_owned()),
        "{hurried}"
    );
    send(
        &mut stdin,
        &[json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})],
    )
    .await;
    let listed = gateway
        .wait_stdout(r#""id":3"#, Duration::from_secs(30))
        .await;
    assert!(
        names(&listed).contains(&"slow__echo".to_owned()),
        "{listed}"
    );
    drop(stdin);
    gateway.wait(Duration::from_secs(10)).await.expect_code(0);
    assert_no_process(&mark, Duration::from_secs(2)).await;
}

/// A line that is not JSON is ignored, as the official SDKs do (an answer could start an error
/// storm with a client that echoes what it cannot read); JSON that is not a message is
/// answered `-32600`; either way the session goes on.
#[tokio::test]
async fn a_line_that_is_no_message_does_not_end_the_session() {
    let dir = Dir::new();
    let (mut gateway, mut stdin, _) = handshake(&dir).await;
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":99,\"method\":\"tools/call\",\n")
        .await
        .unwrap();
    send(&mut stdin, &[json!({"hello": "world"})]).await;
    let refused = gateway.wait_stdout("-32600", Duration::from_secs(10)).await;
    let refused: Value = serde_json::from_str(&refused).unwrap();
    assert_eq!(refused["id"], Value::Null, "{refused}");
    send(
        &mut stdin,
        &[json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})],
    )
    .await;
    gateway
        .wait_stdout(r#""id":2,"result""#, Duration::from_secs(10))
        .await;
    assert!(
        !gateway.stdout().contains(r#""id":99"#),
        "{}",
        gateway.stdout()
    );
    drop(stdin);
    gateway.wait(Duration::from_secs(10)).await.expect_code(0);
}

/// A server that starts in seconds is waited for by `initialize`, so the capabilities it
/// announces are the server's too (prompts, resources).
#[tokio::test]
async fn initialize_announces_the_capabilities_of_a_server_that_starts_in_seconds() {
    let dir = Dir::new();
    with_test_server(&dir, "quick", &["--startup-delay-ms", "1500"], "");
    let (mut gateway, stdin, init) = handshake(&dir).await;
    let init: Value = serde_json::from_str(&init).unwrap();
    let capabilities = &init["result"]["capabilities"];
    assert!(capabilities["prompts"].is_object(), "{init}");
    assert!(capabilities["resources"].is_object(), "{init}");
    drop(stdin);
    gateway.wait(Duration::from_secs(10)).await.expect_code(0);
}
