//! Every message that reaches the gateway is read once: by the gateway itself when it answers
//! it, by rmcp when rmcp does — never both, never twice (docs/GATEWAY.md, "One way in").
//!
//! A build with the `parse-count` feature counts both (`toolwarden_mcp::reads`: the messages the
//! gateway parsed, and those it handed to rmcp, which reads each once). Each message below is
//! sent alone and the counts are read before and after it. The one exception, counted as such:
//! an `initialize` that declares the 2025-11-25 tasks, whose capability rmcp drops — the
//! gateway reads it to learn that, then rmcp reads it again to answer it (one message per such
//! session).
//!
//! The counters are the process's own: this file holds one test, and nextest runs each test in
//! a process of its own.
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

mod support;

use serde_json::{Value, json};
use support::{WAIT, serve_http, setup};
use tokio::io::AsyncWriteExt as _;

const STATELESS: &str = "2026-07-28";

/// The reads a step made: (the gateway's, rmcp's).
async fn reads_of<F: Future<Output = Value>>(step: F) -> ((u64, u64), Value) {
    let before = toolwarden_mcp::reads();
    let answer = step.await;
    // rmcp reads what it was handed on its own tasks: wait until the answer is in (it is, once
    // `step` returns) — the counts are taken when the message is handed over, before that.
    let after = toolwarden_mcp::reads();
    ((after.0 - before.0, after.1 - before.1), answer)
}

/// The JSON-RPC answer of a JSON or event-stream response (`Null` for a 202).
async fn answer(resp: reqwest::Response) -> Value {
    assert!(resp.status().is_success(), "{}", resp.status());
    if resp.status() == reqwest::StatusCode::ACCEPTED {
        return Value::Null;
    }
    support::answer(resp).await
}

/// A raw Streamable HTTP client.
struct Http {
    http: reqwest::Client,
    url: String,
    session: Option<String>,
    version: &'static str,
}

impl Http {
    async fn post(&mut self, body: Value, headers: &[(&str, &str)]) -> Value {
        let mut req = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", self.version)
            .json(&body);
        if let Some(session) = &self.session {
            req = req.header("mcp-session-id", session);
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = req.send().await.unwrap();
        if let Some(id) = resp.headers().get("mcp-session-id") {
            self.session = Some(id.to_str().unwrap().to_owned());
        }
        answer(resp).await
    }
}

fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn initialize(version: &str, capabilities: Value) -> Value {
    request(
        0,
        "initialize",
        json!({"protocolVersion": version, "capabilities": capabilities,
               "clientInfo": {"name": "reads", "version": "0"}}),
    )
}

fn initialized() -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
}

/// Asserts each message of a flow was read exactly once.
fn once(what: &str, reads: (u64, u64), answer: &Value) {
    assert_eq!(
        reads.0 + reads.1,
        1,
        "{what}: read {reads:?} times (gateway, rmcp); {answer}"
    );
}

#[tokio::test]
async fn every_message_is_read_once() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve_http(&s.gateway).await;
    let echo = || json!({"name": "t__echo", "arguments": {"text": "hi"}});

    // A handshake client over Streamable HTTP: rmcp reads all but the call.
    let mut c = Http {
        http: reqwest::Client::new(),
        url: url.clone(),
        session: None,
        version: "2025-06-18",
    };
    let (reads, a) = reads_of(c.post(initialize("2025-06-18", json!({})), &[])).await;
    once("initialize", reads, &a);
    assert_eq!(reads, (0, 1));
    let (reads, a) = reads_of(c.post(initialized(), &[])).await;
    once("notifications/initialized", reads, &a);
    let (reads, a) = reads_of(c.post(request(1, "tools/list", json!({})), &[])).await;
    once("tools/list", reads, &a);
    assert_eq!(reads, (0, 1));
    let (reads, a) = reads_of(c.post(request(2, "tools/call", echo()), &[])).await;
    once("tools/call", reads, &a);
    assert_eq!(reads, (1, 0), "the gateway answers a call itself");
    assert_eq!(a["result"]["content"][0]["text"], json!("hi"), "{a}");
    let (reads, a) = reads_of(c.post(request(3, "ping", json!({})), &[])).await;
    once("ping", reads, &a);
    // rmcp's own client lists the event stream first in `Accept`: its call is the gateway's too.
    let sse_first = c
        .http
        .post(&url)
        .header("accept", "text/event-stream, application/json")
        .header("mcp-protocol-version", c.version)
        .header("mcp-session-id", c.session.clone().unwrap())
        .json(&request(4, "tools/call", echo()))
        .send();
    let (reads, a) = reads_of(async { answer(sse_first.await.unwrap()).await }).await;
    once("tools/call, event stream listed first", reads, &a);
    assert_eq!(reads, (1, 0), "the gateway answers it itself");
    assert_eq!(a["result"]["content"][0]["text"], json!("hi"), "{a}");

    // A stateless (2026-07-28) client: the gateway reads its call; rmcp its other requests.
    let mut st = Http {
        http: reqwest::Client::new(),
        url: url.clone(),
        session: None,
        version: STATELESS,
    };
    let envelope = json!({
        "io.modelcontextprotocol/protocolVersion": STATELESS,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "reads", "version": "0"},
    });
    let mut call = echo();
    call["_meta"] = envelope.clone();
    let (reads, a) = reads_of(st.post(
        request(1, "tools/call", call),
        &[("mcp-method", "tools/call"), ("mcp-name", "t__echo")],
    ))
    .await;
    once("stateless tools/call", reads, &a);
    assert_eq!(reads, (1, 0), "{a}");
    assert_eq!(a["result"]["content"][0]["text"], json!("hi"), "{a}");
    let (reads, a) = reads_of(st.post(
        request(2, "tools/list", json!({"_meta": envelope})),
        &[("mcp-method", "tools/list")],
    ))
    .await;
    once("stateless tools/list", reads, &a);
    assert_eq!(reads, (0, 1), "{a}");

    // A handshake client that declares the 2025-11-25 tasks: its `initialize` is the one
    // message read twice; the gateway reads its task requests and `tools/list` itself.
    let mut t = Http {
        http: reqwest::Client::new(),
        url: url.clone(),
        session: None,
        version: "2025-11-25",
    };
    let (reads, a) = reads_of(t.post(initialize("2025-11-25", json!({"tasks": {}})), &[])).await;
    assert_eq!(reads, (1, 1), "initialize with tasks: {a}");
    assert!(a["result"]["capabilities"]["tasks"].is_object(), "{a}");
    let (reads, a) = reads_of(t.post(initialized(), &[])).await;
    once("notifications/initialized", reads, &a);
    let (reads, a) = reads_of(t.post(request(1, "tools/list", json!({})), &[])).await;
    once("tools/list with tasks", reads, &a);
    assert_eq!(reads, (1, 0), "{a}");
    let mut call = echo();
    call["task"] = json!({"ttl": 60_000});
    let (reads, a) = reads_of(t.post(request(2, "tools/call", call), &[])).await;
    once("tools/call with a task", reads, &a);
    let task = a["result"]["task"]["taskId"].as_str().unwrap().to_owned();
    let (reads, a) =
        reads_of(t.post(request(3, "tasks/result", json!({"taskId": task})), &[])).await;
    once("tasks/result", reads, &a);
    assert_eq!(a["result"]["content"][0]["text"], json!("hi"), "{a}");

    // A handshake client on stdio: rmcp reads every line; the gateway reads none.
    let support::Pipe {
        mut lines,
        write: mut w,
        shutdown: stop,
        serving,
    } = support::serve_pipe(&s.gateway, 1 << 16);
    let mut line = async |message: Value, answered: bool| {
        w.write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
        if !answered {
            return Value::Null;
        }
        loop {
            let line = tokio::time::timeout(WAIT, lines.next_line())
                .await
                .expect("a line in time")
                .unwrap()
                .expect("the gateway is still there");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v.get("method").is_none() {
                return v;
            }
        }
    };
    let (reads, a) = reads_of(line(initialize("2025-06-18", json!({})), true)).await;
    once("stdio initialize", reads, &a);
    // A notification has no answer: it is counted with the call after it, whose answer comes
    // once rmcp has read both lines (they are read in order).
    let (reads, a) = reads_of(async {
        line(initialized(), false).await;
        line(request(1, "tools/call", echo()), true).await
    })
    .await;
    assert_eq!(
        reads,
        (0, 2),
        "stdio notifications/initialized and tools/call: {a}"
    );
    assert_eq!(a["result"]["content"][0]["text"], json!("hi"), "{a}");
    stop.cancel();
    let _ = serving.await;
    shutdown.cancel();
    s.shutdown().await;
}
