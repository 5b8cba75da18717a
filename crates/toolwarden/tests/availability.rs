//! Calls wait for their server, end to end: `toolwarden serve` with `tw-test-server` that starts
//! slowly, crashes, or never comes up; `/readyz` follows the server.

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::serve::{config, serve, turn};
use crate::util::{Dir, Running, http, marker, toml_str};

/// `serve` with the test server started with `server_args`, and `extra` config; answers at once
/// (the server may still be starting).
async fn start(
    name: &str,
    server_args: &[&str],
    server_table: &str,
    extra: &str,
) -> (Dir, Running, String, String) {
    let dir = Dir::new();
    let mark = marker(name);
    let args: Vec<String> = server_args.iter().map(|a| toml_str(a)).collect();
    let conf = config(&mark, extra).replacen(
        "args = [",
        &format!(
            "{server_table}args = [{}",
            args.iter().map(|a| format!("{a}, ")).collect::<String>()
        ),
        1,
    );
    dir.create("toolwarden.toml", &conf);
    let (server, url) = serve(&dir, &[]).await;
    (dir, server, url, mark)
}

async fn stop(server: Running, mark: &str) {
    // Logs to a pipe are plain text: no terminal colours.
    assert!(!server.stderr().contains('\u{1b}'), "{}", server.stderr());
    crate::util::stop_clean(server, mark).await;
}

/// `GET /readyz`: its status code and body.
async fn readyz(url: &str) -> (u16, Value) {
    let resp = http().get(format!("{url}/readyz")).send().await.unwrap();
    let code = resp.status().as_u16();
    (code, resp.json().await.unwrap())
}

fn echo(id: &str, text: &str) -> Value {
    json!([{"id": id, "name": "test__echo", "input": {"text": text}}])
}

#[tokio::test]
async fn a_call_posted_the_moment_serve_listens_waits_for_a_slow_server() {
    let (_dir, server, url, mark) =
        start("avail-slow", &["--startup-delay-ms", "3000"], "", "").await;
    let (code, body) = readyz(&url).await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["status"], "not_ready");
    assert_eq!(body["servers"]["test"]["state"], "starting");

    let started = tokio::time::Instant::now();
    let answer = turn(&url, echo("c1", "hello")).await;
    let result = &answer["results"][0];
    assert_eq!(result["toolwarden"]["status"], "ok", "{answer:#}");
    assert_eq!(result["content"][0]["text"], "hello");
    assert!(
        started.elapsed() >= Duration::from_millis(2500),
        "it waited for the server: {:?}",
        started.elapsed()
    );

    let (code, body) = readyz(&url).await;
    assert_eq!((code, &body["status"]), (200, &json!("ready")), "{body}");
    assert_eq!(body["servers"]["test"]["state"], "up");
    // The revision it was reached in, on /healthz and /v1/tools too.
    assert_eq!(body["servers"]["test"]["protocol"], "2025-11-25", "{body}");
    let health: Value = http()
        .get(format!("{url}/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        health["servers"]["test"]["protocol"], "2025-11-25",
        "{health}"
    );
    let tools: Value = http()
        .get(format!("{url}/v1/tools"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let echo = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "test__echo")
        .unwrap();
    assert_eq!(echo["backend_protocol"], "2025-11-25", "{echo}");
    stop(server, &mark).await;
}

#[tokio::test]
async fn a_call_right_after_a_crash_ends_ok() {
    let (_dir, server, url, mark) = start("avail-crash", &[], "", "").await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    let crashed = turn(
        &url,
        json!([{"id": "c1", "name": "test__crash", "input": {}}]),
    )
    .await;
    assert_eq!(
        crashed["results"][0]["toolwarden"]["status"], "error",
        "{crashed:#}"
    );
    // At once, while the server restarts.
    let answer = turn(&url, echo("c2", "after the crash")).await;
    let result = &answer["results"][0];
    assert_eq!(result["toolwarden"]["status"], "ok", "{answer:#}");
    assert_eq!(result["content"][0]["text"], "after the crash");
    stop(server, &mark).await;
}

#[tokio::test]
async fn a_server_that_never_comes_up_ends_the_call_after_its_startup_timeout() {
    let (_dir, server, url, mark) = start(
        "avail-never",
        &["--startup-delay-ms", "600000"],
        "startup_timeout = \"2s\"\n",
        "",
    )
    .await;
    let started = tokio::time::Instant::now();
    let answer = turn(&url, echo("c1", "anyone?")).await;
    let waited = started.elapsed();
    let outcome = &answer["results"][0]["toolwarden"];
    assert_eq!(
        (&outcome["status"], &outcome["reason"]),
        (&json!("error"), &json!("transport")),
        "{answer:#}"
    );
    let detail = outcome["detail"].as_str().unwrap();
    assert!(
        detail.contains("MCP server \"test\" was not up within 2s"),
        "{detail}"
    );
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(10),
        "not before startup_timeout: {waited:?}"
    );
    assert_eq!(readyz(&url).await.0, 503);
    stop(server, &mark).await;
}

/// A server whose command does not exist, and one that exits before its handshake, cannot start
/// by retrying: they are `failed` with why, their tools' calls end at once naming the cause,
/// `/readyz` says so, and so does `toolwarden__status` (to the model).
#[tokio::test]
async fn a_server_that_cannot_start_is_failed_and_its_calls_end_at_once() {
    let extra = format!(
        "[servers.gone]\ncommand = \"tw-no-such-command-anywhere\"\n\n\
         [servers.quits]\ncommand = {}\nargs = [\"--fail-startup\"]\nstartup_timeout = \"60s\"\n",
        toml_str(&crate::util::test_server())
    );
    let (_dir, server, url, mark) = start("avail-failed", &[], "", &extra).await;
    server
        .wait_stderr(
            "server \"gone\" cannot start: cannot run tw-no-such-command-anywhere",
            Duration::from_secs(30),
        )
        .await;
    server
        .wait_stderr("server \"quits\" cannot start", Duration::from_secs(30))
        .await;

    let (code, body) = readyz(&url).await;
    assert_eq!(
        (code, &body["status"]),
        (503, &json!("not_ready")),
        "{body}"
    );
    for name in ["gone", "quits"] {
        assert_eq!(body["servers"][name]["state"], "failed", "{body}");
    }
    let detail = body["servers"]["gone"]["detail"].as_str().unwrap();
    assert!(detail.contains("No such file or directory"), "{detail}");
    let detail = body["servers"]["quits"]["detail"].as_str().unwrap();
    assert!(detail.contains("exited with status 2"), "{detail}");

    // Calls end at once, not after startup_timeout, saying why.
    let started = tokio::time::Instant::now();
    let answer = turn(
        &url,
        json!([{"id": "c1", "name": "gone__anything", "input": {}},
               {"id": "c2", "name": "quits__echo", "input": {"text": "x"}}]),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    for (result, needle) in answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .zip(["tw-no-such-command-anywhere", "exited with status 2"])
    {
        let outcome = &result["toolwarden"];
        assert_eq!(
            (&outcome["status"], &outcome["reason"], &outcome["attempts"]),
            (&json!("error"), &json!("transport"), &json!(0)),
            "{answer:#}"
        );
        let detail = outcome["detail"].as_str().unwrap();
        assert!(
            detail.contains("cannot start") && detail.contains(needle),
            "{detail}"
        );
        let text = result["content"][0]["text"].as_str().unwrap();
        assert!(
            text.contains("It did not run. Its server cannot start until that is fixed"),
            "{text}"
        );
    }

    // The model sees it in toolwarden__status.
    let status =
        crate::util::mcp(&url, 1, "tools/call", json!({"name": "toolwarden__status"})).await;
    let structured = &status["result"]["structuredContent"];
    assert_eq!(
        structured["servers_not_up"]["gone"]["state"], "failed",
        "{status:#}"
    );
    assert_eq!(
        structured["servers_not_up"]["quits"]["state"], "failed",
        "{status:#}"
    );
    let text = status["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("- gone: cannot start (its tools fail at once until it is fixed): cannot run tw-no-such-command-anywhere"),
        "{text}"
    );
    // The good server is up and is not listed.
    assert!(
        structured["servers_not_up"].get("test").is_none(),
        "{status:#}"
    );
    stop(server, &mark).await;
}
