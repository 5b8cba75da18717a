//! The MCP gateway over Streamable HTTP on 127.0.0.1: the Rust rmcp client, and raw HTTP
//! where the test must control the connection (closing one response stream, DELETE).
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

mod support;

use std::time::Duration;

use futures::StreamExt as _;
use pretty_assertions::assert_eq;
use rmcp::ServiceExt as _;
use rmcp::model::CancelledNotificationParam;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{Value, json};
use support::{
    Client, TestClient, WAIT, call, outcome, serve_http as serve, setup, start_call, text,
};
use toolwarden_core::protocol::EventKind;
use toolwarden_mcp::Gateway;

async fn http_client(url: &str, handler: TestClient) -> Client {
    handler
        .serve(StreamableHttpClientTransport::from_uri(url))
        .await
        .expect("initialize over HTTP")
}

#[tokio::test]
async fn calls_progress_and_a_servers_sampling_work_over_streamable_http() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let handler = TestClient::new();
    let client = http_client(&url, handler.clone()).await;
    let tools = client.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "t__echo"));
    let r = call(&client, "t__echo", json!({"text": "over http"})).await;
    assert_eq!(text(&r), "over http");
    assert_eq!(outcome(&r)["status"], json!("ok"));
    let handle = start_call(
        &client,
        "t__progress",
        json!({"every_ms": 20, "count": 3}),
        json!({}),
    )
    .await;
    let token = handle.progress_token.clone();
    handle.await_response().await.unwrap();
    let seen = handler
        .wait("three progress reports", |s| s.progress.len() >= 3)
        .await;
    assert!(seen.progress.iter().all(|p| p.progress_token == token));
    // The server's sampling request, raised during the call, reaches this client.
    let r = call(&client, "t__sample", json!({"prompt": "over http?"})).await;
    assert_eq!(text(&r), "sampled: over http?");
    // So does an approval.
    let r = call(&client, "guarded", json!({})).await;
    assert_eq!(text(&r), "done");
    client.cancel().await.unwrap();
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn a_client_cancel_over_http_aborts_the_call_as_user() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let client = http_client(&url, TestClient::new()).await;
    let handle = start_call(&client, "t__sleep", json!({"ms": 30_000}), json!({})).await;
    s.event("the call started", |e| {
        matches!(e.kind, EventKind::ToolStart { .. })
    })
    .await;
    client
        .peer()
        .notify_cancelled(CancelledNotificationParam::new(
            Some(handle.id.clone()),
            None,
        ))
        .await
        .unwrap();
    let o = s.outcome_of("t__sleep").await;
    assert_eq!(
        (o["status"].clone(), o["reason"].clone()),
        (json!("cancelled"), json!("user"))
    );
    client.cancel().await.unwrap();
    shutdown.cancel();
    s.shutdown().await;
}

/// A raw Streamable HTTP session.
struct Raw {
    http: reqwest::Client,
    url: String,
    session: String,
}

impl Raw {
    async fn open(url: &str) -> Raw {
        Raw::open_with(url, json!({})).await
    }

    async fn open_with(url: &str, capabilities: Value) -> Raw {
        let http = reqwest::Client::new();
        let (session, resp) =
            support::http_initialize(&http, url, "2025-06-18", capabilities, "raw").await;
        let answer = first_message(resp).await;
        assert_eq!(answer["result"]["serverInfo"]["name"], json!("toolwarden"));
        let raw = Raw {
            http,
            url: url.to_owned(),
            session,
        };
        let ack = raw
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert!(ack.status().is_success());
        raw
    }

    async fn post(&self, body: &Value) -> reqwest::Response {
        self.http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", "2025-06-18")
            .json(body)
            .send()
            .await
            .unwrap()
    }

    async fn call(&self, id: u64, tool: &str, args: Value) -> reqwest::Response {
        self.post(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": args}}))
            .await
    }

    async fn delete(&self) -> reqwest::StatusCode {
        self.http
            .delete(&self.url)
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", "2025-06-18")
            .send()
            .await
            .unwrap()
            .status()
    }
}

/// The first JSON-RPC message of an SSE (or JSON) response.
async fn first_message(resp: reqwest::Response) -> Value {
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let read = async {
        while let Some(chunk) = body.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            for line in buf.lines() {
                if let Some(data) = line.strip_prefix("data:")
                    && let Ok(v) = serde_json::from_str::<Value>(data.trim())
                    && v.get("jsonrpc").is_some()
                {
                    return v;
                }
            }
            if let Ok(v) = serde_json::from_str::<Value>(&buf) {
                return v;
            }
        }
        panic!("no message in the response: {buf:?}");
    };
    tokio::time::timeout(WAIT, read)
        .await
        .expect("a message in time")
}

#[tokio::test]
async fn closing_a_calls_response_stream_aborts_it_as_client_disconnect() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let raw = Raw::open(&url).await;
    let resp = raw.call(7, "t__sleep", json!({"ms": 30_000})).await;
    assert!(resp.status().is_success());
    s.event("the call started", |e| {
        matches!(e.kind, EventKind::ToolStart { .. })
    })
    .await;
    // The client stops listening for this call's answer.
    drop(resp);
    let o = s.outcome_of("t__sleep").await;
    assert_eq!(
        (o["status"].clone(), o["reason"].clone()),
        (json!("cancelled"), json!("client_disconnect"))
    );
    // Only that request: the session goes on.
    let r = first_message(raw.call(8, "t__echo", json!({"text": "still here"})).await).await;
    assert_eq!(r["result"]["content"][0]["text"], json!("still here"));
    // And the server was told, for that request.
    let mut id = 9;
    let cancels = loop {
        let r = first_message(raw.call(id, "t__cancels", json!({})).await).await;
        let cancels = r["result"]["structuredContent"]["cancels"].clone();
        if cancels.as_array().is_some_and(|c| !c.is_empty()) {
            break cancels;
        }
        id += 1;
        assert!(id < 200, "the server never heard the cancel");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(cancels[0]["reason"], json!("client_disconnect"));
    assert_eq!(cancels[0]["arguments"], json!({"ms": 30_000}));
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn a_deleted_session_ends_its_calls_as_client_disconnect() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let raw = Raw::open(&url).await;
    let resp = raw.call(1, "t__sleep", json!({"ms": 30_000})).await;
    s.event("the call started", |e| {
        matches!(e.kind, EventKind::ToolStart { .. })
    })
    .await;
    assert_eq!(s.gateway.clients(), 1);
    assert!(raw.delete().await.is_success());
    let o = s.outcome_of("t__sleep").await;
    assert_eq!(o["reason"], json!("client_disconnect"));
    assert_eq!(s.gateway.clients(), 0);
    drop(resp);
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn shutdown_ends_http_sessions_and_their_calls_as_shutdown() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let raw = Raw::open(&url).await;
    let _resp = raw.call(1, "t__sleep", json!({"ms": 30_000})).await;
    s.event("the call started", |e| {
        matches!(e.kind, EventKind::ToolStart { .. })
    })
    .await;
    shutdown.cancel();
    let o = s.outcome_of("t__sleep").await;
    assert_eq!(o["reason"], json!("shutdown"));
    support::wait_for(|| async { s.gateway.clients() == 0 }).await;
    s.shutdown().await;
}

#[tokio::test]
async fn an_idle_session_is_closed_but_not_while_a_call_runs() {
    let s = setup(&["t"], true, "").await;
    // A gateway of its own, with a short idle time.
    let gateway = Gateway::new(
        s.engine.clone(),
        s.servers.clone(),
        toolwarden_mcp::GatewayOptions {
            http_session_idle: Duration::from_millis(400),
            ..Default::default()
        },
    );
    let (url, shutdown) = serve(&gateway).await;
    let raw = Raw::open(&url).await;
    // A call longer than the idle time keeps the session.
    let r = first_message(raw.call(1, "t__sleep", json!({"ms": 1200})).await).await;
    assert_eq!(r["result"]["content"][0]["text"], json!("slept 1200 ms"));
    assert_eq!(gateway.clients(), 1);
    // Then, with nothing running and nothing said, it goes.
    support::wait_for(|| async { gateway.clients() == 0 }).await;
    let gone = raw.call(2, "t__echo", json!({"text": "x"})).await;
    assert_eq!(gone.status(), reqwest::StatusCode::NOT_FOUND);
    shutdown.cancel();
    s.shutdown().await;
}

fn content_type(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// Reads an event stream to its end: the JSON-RPC messages of its `data:` lines, in order.
async fn all_events(resp: reqwest::Response) -> Vec<Value> {
    let text = tokio::time::timeout(WAIT, resp.text())
        .await
        .expect("the stream ends in time")
        .unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .collect()
}

#[tokio::test]
async fn a_quick_call_is_answered_in_json_and_one_with_progress_as_an_event_stream() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let raw = Raw::open(&url).await;
    // Nothing comes before the answer: one JSON body.
    let resp = raw.call(1, "t__echo", json!({"text": "plain"})).await;
    assert_eq!(content_type(&resp), "application/json");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["id"], json!(1));
    assert_eq!(answer["result"]["content"][0]["text"], json!("plain"));
    assert_eq!(
        answer["result"]["_meta"]["toolwarden/outcome"]["status"],
        json!("ok")
    );
    // Progress under the client's token comes first, then the answer, on one event stream.
    let resp = raw
        .post(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "t__progress", "arguments": {"every_ms": 10, "count": 3},
            "_meta": {"progressToken": "p-2"}}}),
        )
        .await;
    assert_eq!(content_type(&resp), "text/event-stream");
    let events = all_events(resp).await;
    let (answer, progress) = events.split_last().expect("events");
    assert_eq!(answer["id"], json!(2));
    assert_eq!(answer["result"]["isError"], json!(false));
    assert_eq!(progress.len(), 3, "{events:?}");
    for (i, p) in progress.iter().enumerate() {
        assert_eq!(p["method"], json!("notifications/progress"));
        assert_eq!(p["params"]["progressToken"], json!("p-2"));
        assert_eq!(p["params"]["progress"], json!(i as f64 + 1.0));
    }
    // A request the gateway leaves to rmcp (here: it carries an `Origin`) is answered as
    // before, on rmcp's event stream.
    let resp = raw
        .http
        .post(&raw.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &raw.session)
        .header("origin", "http://localhost:5173")
        .json(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "t__echo", "arguments": {"text": "via rmcp"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(content_type(&resp), "text/event-stream");
    let answer = first_message(resp).await;
    assert_eq!(answer["result"]["content"][0]["text"], json!("via rmcp"));
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn a_servers_sampling_request_rides_the_calls_response_and_is_answered_by_post() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let raw = Raw::open_with(&url, json!({"sampling": {}})).await;
    let resp = raw.call(1, "t__sample", json!({"prompt": "raw?"})).await;
    assert_eq!(content_type(&resp), "text/event-stream");
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let mut messages: Vec<Value> = Vec::new();
    let mut answered = false;
    let read = async {
        while let Some(chunk) = body.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) {
                    messages.push(serde_json::from_str(data.trim()).unwrap());
                }
            }
            if let Some(request) = messages
                .iter()
                .find(|m| m["method"] == "sampling/createMessage")
                && !answered
            {
                answered = true;
                assert_eq!(
                    request["params"]["messages"][0]["content"]["text"],
                    json!("raw?")
                );
                let id = request["id"].clone();
                assert!(
                    id.as_str().is_some_and(|id| id.starts_with("toolwarden-")),
                    "{id}"
                );
                let ack = raw
                    .post(&json!({"jsonrpc": "2.0", "id": id, "result": {
                        "role": "assistant", "model": "m",
                        "content": {"type": "text", "text": "answered by post"}}}))
                    .await;
                assert_eq!(ack.status(), reqwest::StatusCode::ACCEPTED);
            }
        }
    };
    tokio::time::timeout(WAIT, read)
        .await
        .expect("the call ends");
    let answer = messages.last().expect("an answer");
    assert_eq!(answer["id"], json!(1));
    assert_eq!(
        answer["result"]["content"][0]["text"],
        json!("answered by post")
    );
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn a_client_gone_before_its_answer_started_disconnects_the_call() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let raw = Raw::open(&url).await;
    // The answer is held back (it may yet go out as JSON) when the client gives up.
    let gone = raw
        .http
        .post(&raw.url)
        .timeout(Duration::from_millis(300))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &raw.session)
        .header("mcp-protocol-version", "2025-06-18")
        .json(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "t__sleep", "arguments": {"ms": 30_000}}}))
        .send()
        .await;
    assert!(gone.is_err(), "the request timed out on the client");
    let o = s.outcome_of("t__sleep").await;
    assert_eq!(
        (o["status"].clone(), o["reason"].clone()),
        (json!("cancelled"), json!("client_disconnect"))
    );
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn an_event_stream_is_kept_alive_and_a_quick_json_answer_needs_no_keep_alive() {
    let s = setup(&["t"], true, "").await;
    let gateway = Gateway::new(
        s.engine.clone(),
        s.servers.clone(),
        toolwarden_mcp::GatewayOptions {
            sse_keep_alive: Duration::from_millis(50),
            ..Default::default()
        },
    );
    let (url, shutdown) = serve(&gateway).await;
    let raw = Raw::open(&url).await;
    // Longer than the JSON window (1 s): the answer comes on an event stream, after comments.
    let resp = raw.call(1, "t__sleep", json!({"ms": 1500})).await;
    assert_eq!(content_type(&resp), "text/event-stream");
    let text = tokio::time::timeout(WAIT, resp.text())
        .await
        .expect("the stream ends in time")
        .unwrap();
    let answer_at = text.find("data:").expect("an answer");
    assert!(
        text[..answer_at].contains(":\n\n"),
        "keep-alive comments before the answer: {text:?}"
    );
    let answer: Value = serde_json::from_str(text[answer_at + 5..].trim()).unwrap();
    assert_eq!(
        answer["result"]["content"][0]["text"],
        json!("slept 1500 ms")
    );
    // A quick call: one JSON body, nothing else.
    let resp = raw.call(2, "t__echo", json!({"text": "quick"})).await;
    assert_eq!(content_type(&resp), "application/json");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["result"]["content"][0]["text"], json!("quick"));
    shutdown.cancel();
    s.shutdown().await;
}
