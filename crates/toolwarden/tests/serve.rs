//! `toolwarden serve` on an ephemeral port, the clients of its API (`tools`, `turns`, `abort`,
//! `call --url`), and its shutdown.

use std::time::Duration;

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::util::{
    Dir, Running, assert_group_gone, assert_no_process, http, marker, test_server, toml_str,
    wait_for_process,
};

/// A config with exec and the test server (its command line carries `mark`).
pub(crate) fn config(mark: &str, extra: &str) -> String {
    format!(
        "[servers.test]\ncommand = {}\nargs = [\"--stderr-line\", {}]\n\n[exec]\nenabled = true\ntimeout = \"60s\"\n{extra}",
        toml_str(&test_server()),
        toml_str(mark),
    )
}

pub(crate) async fn serve(dir: &Dir, args: &[&str]) -> (Running, String) {
    let mut argv = vec!["serve", "--listen", "127.0.0.1:0"];
    argv.extend_from_slice(args);
    let running = dir.command(&argv).spawn();
    let url = running.url().await;
    (running, url)
}

/// Posts a turn and answers its JSON.
pub(crate) async fn turn(url: &str, calls: Value) -> Value {
    let resp = http()
        .post(format!("{url}/v1/turns"))
        .json(&json!({ "calls": calls }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// Waits until `GET /v1/turns/active` lists a turn whose calls are all running; its id.
async fn running_turn(url: &str) -> String {
    for _ in 0..500 {
        let active: Value = http()
            .get(format!("{url}/v1/turns/active"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if let Some(turn) = active["turns"].as_array().and_then(|t| t.first())
            && turn["calls"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["state"] == "running")
        {
            return turn["turn_id"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no running turn");
}

#[tokio::test]
async fn serve_answers_health_turns_and_its_clients() {
    let dir = Dir::new();
    let mark = marker("serve-api");
    dir.create("toolwarden.toml", &config(&mark, ""));
    let (mut server, url) = serve(&dir, &[]).await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    // The tools known when it announced itself: `exec`, and the server's own when it came up
    // first (the servers start before the announcement).
    let stderr = server.stderr();
    let tools = stderr
        .lines()
        .find(|l| l.starts_with("toolwarden: tools: "))
        .unwrap_or_else(|| panic!("no tools line:\n{stderr}"));
    assert!(
        tools == "toolwarden: tools: 1 (exec)"
            || tools.starts_with("toolwarden: tools: 26 (exec, "),
        "{stderr}"
    );
    assert!(
        server.stderr().contains("approvals: answered at POST"),
        "{}",
        server.stderr()
    );

    let health: Value = http()
        .get(format!("{url}/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["servers"]["test"]["state"], "up");

    let answer = turn(
        &url,
        json!([{"type": "tool_use", "id": "c1", "name": "test__echo", "input": {"text": "hello"}}]),
    )
    .await;
    assert_eq!(
        answer["results"][0]["content"],
        json!([{"type": "text", "text": "hello"}])
    );
    assert_eq!(answer["results"][0]["toolwarden"]["status"], "ok");

    // The clients, pointed at the server by --url, or by the config's [http] listen.
    let tools = dir.command(&["tools", "--url", &url]).run().await;
    tools.expect_code(0);
    assert!(tools.stdout.contains("test__echo"), "{}", tools.stdout);
    assert!(
        tools.stdout.lines().any(|l| l.starts_with("exec ")),
        "{}",
        tools.stdout
    );
    let listen = url.trim_start_matches("http://");
    let client = Dir::new();
    client.create(
        "toolwarden.toml",
        &format!("[http]\nlisten = {}\n", toml_str(listen)),
    );
    let tools_json = client.command(&["tools", "--json"]).run().await;
    tools_json.expect_code(0);
    assert!(
        tools_json.json()["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "test__sleep" && t["backend_state"] == "up")
    );
    let idle = client.command(&["turns"]).run().await;
    idle.expect_code(0);
    assert_eq!(idle.stdout, "no running turns\n");

    // A long call: listed by `turns`, aborted by `abort`.
    let long = tokio::spawn({
        let url = url.clone();
        async move {
            turn(
                &url,
                json!([{"id": "slow", "name": "exec", "input": {"command": "sleep 60"}}]),
            )
            .await
        }
    });
    let turn_id = running_turn(&url).await;
    let turns = client.command(&["turns"]).run().await;
    turns.expect_code(0);
    let row = turns
        .stdout
        .lines()
        .find(|l| l.starts_with(&turn_id))
        .unwrap_or_else(|| panic!("{}", turns.stdout));
    assert!(
        row.contains(" slow ") && row.contains(" exec ") && row.contains(" running "),
        "{row}"
    );
    let unknown_call = client.command(&["abort", &turn_id, "nope"]).run().await;
    unknown_call.expect_code(1);
    assert!(
        unknown_call.stderr.contains("is not running"),
        "{}",
        unknown_call.stderr
    );
    let aborted = client.command(&["abort", &turn_id]).run().await;
    aborted.expect_code(0);
    assert_eq!(aborted.stdout, format!("aborted turn {turn_id}\n"));
    let answer = tokio::time::timeout(Duration::from_secs(5), long)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer["results"][0]["toolwarden"]["status"], "cancelled");
    assert_eq!(answer["results"][0]["toolwarden"]["reason"], "user");
    let again = client.command(&["abort", &turn_id]).run().await;
    again.expect_code(1);
    assert!(
        again
            .stderr
            .contains(&format!("turn {turn_id} is not running")),
        "{}",
        again.stderr
    );

    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(15)).await.expect_code(0);
    assert_no_process(&mark, Duration::from_secs(2)).await;

    // Nobody listening any more.
    let gone = client.command(&["turns"]).run().await;
    gone.expect_code(1);
    assert!(
        gone.stderr.contains("cannot reach toolwarden serve"),
        "{}",
        gone.stderr
    );
}

#[tokio::test]
async fn sigterm_cancels_running_calls_and_leaves_nothing_running() {
    let dir = Dir::new();
    let mark = marker("serve-term");
    let exec_mark = marker("serve-term-exec");
    dir.create("toolwarden.toml", &config(&mark, ""));
    let (mut server, url) = serve(&dir, &[]).await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    let server_pids = wait_for_process(server.pid(), &mark, Duration::from_secs(5)).await;

    let pending = tokio::spawn({
        let url = url.clone();
        let cmd = format!("sleep 60; echo {exec_mark}");
        async move {
            turn(
                &url,
                json!([
                    {"id": "shell", "name": "exec", "input": {"command": cmd}},
                    {"id": "mcp", "name": "test__sleep", "input": {"ms": 60000}}
                ]),
            )
            .await
        }
    });
    running_turn(&url).await;
    let shell = wait_for_process(server.pid(), &exec_mark, Duration::from_secs(5)).await[0];

    server.signal(Signal::SIGTERM);
    let answer = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("the turn's answer comes at once")
        .unwrap();
    for i in 0..2 {
        let outcome = &answer["results"][i]["toolwarden"];
        assert_eq!(outcome["status"], "cancelled", "{answer:#}");
        assert_eq!(outcome["reason"], "shutdown", "{answer:#}");
    }
    let out = server.wait(Duration::from_secs(15)).await;
    out.expect_code(0);
    assert!(
        out.stderr.contains("SIGTERM: shutting down"),
        "{}",
        out.stderr
    );
    assert_group_gone(shell, Duration::from_secs(1)).await;
    for pid in server_pids {
        assert_group_gone(pid, Duration::from_secs(1)).await;
    }
    assert_no_process(&mark, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_second_signal_exits_at_once() {
    let dir = Dir::new();
    let mark = marker("serve-twice");
    // A command that ignores SIGTERM, with a long grace: the first signal waits for it.
    dir.create(
        "toolwarden.toml",
        "[exec]\nenabled = true\ncancel_grace = \"30s\"\n",
    );
    let (mut server, url) = serve(&dir, &[]).await;
    let cmd = format!("trap '' TERM; sleep 60; echo {mark}");
    let pending = tokio::spawn({
        let url = url.clone();
        async move {
            turn(
                &url,
                json!([{"id": "stubborn", "name": "exec", "input": {"command": cmd}}]),
            )
            .await
        }
    });
    running_turn(&url).await;
    let shell = wait_for_process(server.pid(), &mark, Duration::from_secs(5)).await[0];
    server.signal(Signal::SIGTERM);
    server
        .wait_stderr("SIGTERM: shutting down", Duration::from_secs(5))
        .await;
    let answer = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer["results"][0]["toolwarden"]["reason"], "shutdown");
    server.signal(Signal::SIGINT);
    let out = server.wait(Duration::from_secs(3)).await;
    out.expect_code(130);
    assert!(
        out.stderr.contains("SIGINT again: exiting at once"),
        "{}",
        out.stderr
    );
    // The shell died with toolwarden (parent-death signal); `sleep`, which ignores SIGTERM
    // and was not signalled, is outside that guarantee: clean it up.
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(shell as i32), Signal::SIGKILL);
    assert_group_gone(shell, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_non_loopback_listen_needs_a_token() {
    let dir = Dir::new();
    let refused = dir.command(&["serve", "--listen", "0.0.0.0:0"]).run().await;
    refused.expect_code(2);
    assert!(
        refused
            .stderr
            .contains("refusing to listen on 0.0.0.0:0 without authentication"),
        "{}",
        refused.stderr
    );

    // With a token it listens, and the API wants it.
    dir.create("toolwarden.toml", "[http]\ntoken_env = \"TW_TEST_TOKEN\"\n");
    let mut server = dir
        .command(&["serve", "--listen", "0.0.0.0:0"])
        .env("TW_TEST_TOKEN", "s3cret")
        .spawn();
    let url = server.url().await.replace("0.0.0.0", "127.0.0.1");
    let denied = dir.command(&["tools", "--url", &url]).run().await;
    denied.expect_code(1);
    assert!(
        denied.stderr.contains("401 Unauthorized"),
        "{}",
        denied.stderr
    );
    let allowed = dir
        .command(&["tools", "--url", &url])
        .env("TW_TEST_TOKEN", "s3cret")
        .run()
        .await;
    allowed.expect_code(0);
    assert_eq!(allowed.stdout, "no tools\n");
    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(10)).await.expect_code(0);
}

#[tokio::test]
async fn headless_serve_denies_approvals_at_once() {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        "[exec]\nenabled = true\n[tools.exec]\napproval = \"ask\"\n",
    );
    let (mut server, url) = serve(&dir, &["--headless"]).await;
    // The start-up lines after "listening on" reach the reader a moment later.
    server
        .wait_stderr("approvals: headless", Duration::from_secs(10))
        .await;
    let answer = turn(
        &url,
        json!([{"id": "c1", "name": "exec", "input": {"command": "true"}}]),
    )
    .await;
    assert_eq!(answer["results"][0]["toolwarden"]["decider"], "headless");
    server.signal(Signal::SIGINT);
    server.wait(Duration::from_secs(10)).await.expect_code(0);
}

/// A breaker is per process: a one-off local call always finds it closed. Through a running
/// server (`call --url`) calls share it, so the second failing call meets it open.
#[tokio::test]
async fn call_url_shares_the_servers_breaker_and_exits_6_when_open() {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        "[exec]\nenabled = true\nbreaker = { failures = 1, window = \"1m\", open_for = \"1m\" }\n",
    );
    let (mut server, url) = serve(&dir, &[]).await;
    let input = json!({"command": "sleep 10"}).to_string();
    let first = dir
        .command(&[
            "call",
            "exec",
            "--url",
            &url,
            "--timeout",
            "200ms",
            "--input",
            &input,
        ])
        .run()
        .await;
    first.expect_code(3);
    let second = dir
        .command(&["call", "exec", "--url", &url, "--json", "--input", &input])
        .run()
        .await;
    second.expect_code(6);
    let result = second.json();
    assert_eq!(result["outcome"]["status"], "circuit_open");
    assert!(result["outcome"]["retry_after_ms"].as_u64().unwrap() > 0);
    // A local call has its own, closed breaker. (It records in an audit trail of its own: the
    // server's is in use by the server.)
    let same_trail = dir
        .command(&[
            "call",
            "exec",
            "--input",
            &json!({"command": "true"}).to_string(),
        ])
        .run()
        .await;
    same_trail.expect_code(1);
    assert!(
        same_trail
            .stderr
            .contains("is in use by another toolwarden process (pid")
            && same_trail
                .stderr
                .contains("run the call through it (`call --url`)"),
        "{}",
        same_trail.stderr
    );
    // `mcp` on the same trail is told what an MCP client can do instead.
    let gateway = dir.command(&["mcp"]).run().await;
    gateway.expect_code(1);
    assert!(
        gateway
            .stderr
            .contains("each MCP client that starts `toolwarden mcp` needs one")
            && !gateway.stderr.contains("call --url"),
        "{}",
        gateway.stderr
    );
    dir.create(
        "local.toml",
        "[exec]\nenabled = true\nbreaker = { failures = 1, window = \"1m\", open_for = \"1m\" }\n[store]\npath = \"local.db\"\n",
    );
    let local = dir
        .command(&[
            "call",
            "exec",
            "--config",
            "local.toml",
            "--input",
            &json!({"command": "true"}).to_string(),
        ])
        .run()
        .await;
    local.expect_code(0);
    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(10)).await.expect_code(0);
}

#[tokio::test]
async fn call_url_is_interrupted_by_ctrl_c() {
    let dir = Dir::new();
    let mark = marker("url-ctrlc");
    dir.create("toolwarden.toml", "[exec]\nenabled = true\n");
    let (mut server, url) = serve(&dir, &[]).await;
    let input = json!({"command": format!("sleep 60; echo {mark}")}).to_string();
    let mut call = dir
        .command(&[
            "call",
            "exec",
            "--url",
            &url,
            "--session",
            "s-remote",
            "--input",
            &input,
        ])
        .spawn();
    let shell = wait_for_process(server.pid(), &mark, Duration::from_secs(10)).await[0];
    call.signal(Signal::SIGINT);
    let out = call.wait(Duration::from_secs(10)).await;
    out.expect_code(130);
    assert!(
        out.stdout.starts_with("[CANCELLED]"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert_group_gone(shell, Duration::from_secs(5)).await;
    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(10)).await.expect_code(0);
}

/// `call --url` without a terminal cannot ask: it says where a person can answer (the
/// dashboard, `POST /v1/interactions/{id}`) and until when, and an answer there lets it run.
#[tokio::test]
async fn call_url_without_a_terminal_says_where_to_answer_its_approval() {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        "[exec]\nenabled = true\n\n[tools.exec]\napproval = \"ask\"\napproval_timeout = \"1m\"\n",
    );
    let (mut server, url) = serve(&dir, &[]).await;
    let input = json!({"command": "echo approved-and-ran"}).to_string();
    let mut call = dir
        .command(&["call", "exec", "--url", &url, "--input", &input])
        .spawn();
    let line = call
        .wait_stderr("needs a person's answer", Duration::from_secs(20))
        .await;
    assert!(
        line.contains("exec needs a person's answer (approval), and this is no terminal to ask on. Answer it within 1m in the dashboard, "),
        "{line}"
    );
    let pending: Value = http()
        .get(format!("{url}/v1/interactions"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = pending["interactions"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    call.wait_stderr(
        &format!("curl -X POST {url}/v1/interactions/{id} -H 'content-type: application/json'"),
        Duration::from_secs(5),
    )
    .await;
    let answered = http()
        .post(format!("{url}/v1/interactions/{id}"))
        .json(&json!({"action": "approve"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    let out = call.wait(Duration::from_secs(20)).await;
    out.expect_code(0);
    assert!(out.stdout.contains("approved-and-ran"), "{}", out.stdout);
    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(10)).await.expect_code(0);
}
