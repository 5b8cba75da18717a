//! `http.max_body` holds on every door of `serve`: `POST /v1/turns`, and `/mcp` whichever path a
//! request would take there (rmcp's, or the gateway's own for a plain `tools/call` in a session).
//! Too large is 413 — a JSON error on the API, a JSON-RPC error on `/mcp` — and the next small
//! request works.

use std::time::Duration;

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::serve::{config, serve};
use crate::util::{Dir, assert_no_process, http, marker};

const BIG: usize = 300 * 1024;

fn mcp_post(url: &str, session: Option<&str>, body: &Value) -> reqwest::RequestBuilder {
    let mut req = http()
        .post(format!("{url}/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(id) = session {
        req = req
            .header("mcp-session-id", id)
            .header("mcp-protocol-version", "2025-06-18");
    }
    req
}

fn echo_call(id: u64, text: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "test__echo", "arguments": {"text": text}}})
}

/// A handshake session on `/mcp`, initialized: its `Mcp-Session-Id`.
async fn open_session(url: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "limits-test", "version": "1"}}});
    let resp = mcp_post(url, None, &init).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let session = resp.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    message(resp).await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let resp = mcp_post(url, Some(&session), &initialized)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    session
}

/// The JSON-RPC message of a response: its body, or the first non-empty `data:` of an event
/// stream.
async fn message(resp: reqwest::Response) -> Value {
    let text = resp.text().await.unwrap();
    let json = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:").map(str::trim))
        .find(|d| !d.is_empty())
        .unwrap_or(text.as_str());
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test]
async fn a_body_over_max_body_is_413_on_every_door_and_the_next_call_works() {
    let dir = Dir::new();
    let mark = marker("limits");
    dir.create(
        "toolwarden.toml",
        &config(&mark, "[http]\nmax_body = \"64KiB\"\n"),
    );
    let (mut server, url) = serve(&dir, &[]).await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    let big = "x".repeat(BIG);

    // The HTTP API.
    let resp = http()
        .post(format!("{url}/v1/turns"))
        .json(&json!({"calls": [{"id": "c1", "name": "test__echo", "input": {"text": big}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let error: Value = resp.json().await.unwrap();
    assert_eq!(error["error"]["code"], "payload_too_large");
    let small = http()
        .post(format!("{url}/v1/turns"))
        .json(&json!({"calls": [{"id": "c2", "name": "test__echo", "input": {"text": "small"}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(small.status(), 200);

    // /mcp, rmcp's path: a request outside any session.
    let resp = mcp_post(&url, None, &echo_call(1, &big))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let error = message(resp).await;
    assert_eq!(error["error"]["code"], -32600, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit of 65536 bytes (http.max_body)"),
        "{error}"
    );

    // /mcp, the gateway's own path: a plain tools/call in a session.
    let session = open_session(&url).await;
    let resp = mcp_post(&url, Some(&session), &echo_call(2, &big))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(message(resp).await["error"]["code"], -32600);
    let resp = mcp_post(&url, Some(&session), &echo_call(3, "small"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answer = message(resp).await;
    assert_eq!(answer["result"]["content"][0]["text"], "small", "{answer}");

    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(15)).await.expect_code(0);
    assert_no_process(&mark, Duration::from_secs(2)).await;
}

/// A body that is not JSON, or JSON that is not a JSON-RPC message, is 400 with JSON-RPC's own
/// error (`-32700` parse error, `-32600` invalid request) on `/mcp`, outside a session and in
/// one; a wrong `Content-Type` stays 415; the session goes on.
#[tokio::test]
async fn a_body_that_is_no_message_is_a_json_rpc_error_and_the_session_goes_on() {
    let dir = Dir::new();
    let mark = marker("unreadable");
    dir.create("toolwarden.toml", &config(&mark, ""));
    let (mut server, url) = serve(&dir, &[]).await;
    let raw = |session: Option<&str>, body: &str| {
        let mut req = mcp_post(&url, session, &Value::Null);
        req = req.body(body.to_owned());
        req
    };
    let truncated = r#"{"jsonrpc":"2.0","id":99,"method":"tools/call","#;
    for session in [None, Some("made below")] {
        let session = match session {
            None => None,
            Some(_) => Some(open_session(&url).await),
        };
        let resp = raw(session.as_deref(), truncated).send().await.unwrap();
        assert_eq!(resp.status(), 400, "in a session: {}", session.is_some());
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "application/json"
        );
        let error = message(resp).await;
        assert_eq!(error["error"]["code"], -32700, "{error}");
        assert_eq!(error["id"], Value::Null, "{error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("not JSON: EOF while parsing"),
            "{error}"
        );
        let resp = raw(session.as_deref(), r#"{"hello": "world"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400);
        let error = message(resp).await;
        assert_eq!(error["error"]["code"], -32600, "{error}");
        if let Some(id) = &session {
            let resp = mcp_post(&url, Some(id), &echo_call(3, "still here"))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let answer = message(resp).await;
            assert_eq!(
                answer["result"]["content"][0]["text"], "still here",
                "{answer}"
            );
        }
    }
    let resp = http()
        .post(format!("{url}/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "text/plain")
        .body(echo_call(4, "x").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);

    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(15)).await.expect_code(0);
    assert_no_process(&mark, Duration::from_secs(2)).await;
}
