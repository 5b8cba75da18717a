//! The HTTP API over a real socket on 127.0.0.1 with `reqwest`: streams as a client sees them,
//! and clients that really go away. Real time here, so every wait is short and bounded.

// clippy's allow-unwrap-in-tests covers #[test] functions only, not this file's helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use support::{Frame, SseReader, engine, normalized};
use toolwarden_core::Engine;
use toolwarden_http::{HttpOptions, router};

/// The longest any wait here may take before the test fails.
const BOUND: Duration = Duration::from_secs(5);

/// A server on an ephemeral loopback port; stopped when dropped.
struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(engine: &Engine, opts: HttpOptions) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(engine.clone(), opts);
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, task }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

/// Opens an event stream.
async fn events(
    server: &Server,
    path: &str,
) -> SseReader<impl futures::Stream<Item = Result<axum::body::Bytes, reqwest::Error>> + Unpin + use<>>
{
    let response = client().get(server.url(path)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    SseReader::new(response.bytes_stream())
}

/// Reads frames until `done` says so; fails after [`BOUND`].
async fn read_until<S, E>(reader: &mut SseReader<S>, done: impl Fn(&Frame) -> bool) -> Vec<Frame>
where
    S: futures::Stream<Item = Result<axum::body::Bytes, E>> + Unpin,
    E: std::fmt::Debug,
{
    tokio::time::timeout(BOUND, async {
        let mut frames = Vec::new();
        loop {
            let frame = reader.next_event().await.expect("the stream ended early");
            let stop = done(&frame);
            frames.push(frame);
            if stop {
                return frames;
            }
        }
    })
    .await
    .expect("waited too long for an event")
}

/// Waits until `engine` runs a turn whose calls are all `running`; its id.
async fn until_running(engine: &Engine) -> String {
    tokio::time::timeout(BOUND, async {
        loop {
            if let Some(turn) = engine.active_turns().first()
                && turn
                    .calls
                    .iter()
                    .all(|c| c.state == toolwarden_protocol::CallState::Running)
            {
                return turn.turn_id.to_string();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the turn never ran")
}

/// The `tool_result` of `turn_id`'s call, as `/v1/events` shows it.
fn is_result_of(turn_id: &str) -> impl Fn(&Frame) -> bool {
    let turn_id = turn_id.to_owned();
    move |f| f.event.as_deref() == Some("tool_result") && f.data["turn_id"] == turn_id.as_str()
}

fn hang_turn() -> Value {
    json!({"session_id": "live", "calls": [{"type": "tool_use", "id": "h", "name": "hang", "input": {}}]})
}

#[tokio::test]
async fn a_streamed_turn_arrives_as_sse_and_ends_with_the_json_results() {
    let engine = engine();
    let server = Server::start(&engine, HttpOptions::default()).await;
    let body = json!({"session_id": "live", "calls": [
        {"type": "tool_use", "id": "c1", "name": "echo", "input": {"text": "one"}},
        {"type": "tool_use", "id": "c2", "name": "hang", "input": {}, "timeout_ms": 200},
    ]});
    let response = client()
        .post(server.url("/v1/turns"))
        .header("accept", "text/event-stream")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["cache-control"], "no-cache");
    let mut reader = SseReader::new(response.bytes_stream());
    let frames = read_until(&mut reader, |f| f.event.as_deref() == Some("turn_end")).await;
    assert_eq!(frames[0].event.as_deref(), Some("turn_start"));
    assert!(
        tokio::time::timeout(BOUND, reader.next())
            .await
            .unwrap()
            .is_none(),
        "the stream ends after turn_end"
    );

    let json_answer: Value = client()
        .post(server.url("/v1/turns"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Real time: durations differ between the two runs.
    let without_durations = |results: &Value| {
        let mut results = normalized(results.clone());
        for r in results.as_array_mut().unwrap() {
            r["toolwarden"]["duration_ms"] = json!(0);
        }
        results
    };
    let streamed = without_durations(&frames.last().unwrap().data["results"]);
    let answered = without_durations(&json_answer["results"]);
    assert_eq!(streamed, answered);
    assert_eq!(streamed[1]["toolwarden"]["status"], "timeout");
}

#[tokio::test]
async fn a_json_client_that_disconnects_aborts_its_turn() {
    let engine = engine();
    let server = Server::start(&engine, HttpOptions::default()).await;
    let mut watch = events(&server, "/v1/events?session_id=live").await;
    let request = tokio::spawn(
        client()
            .post(server.url("/v1/turns"))
            .json(&hang_turn())
            .send(),
    );
    let turn_id = until_running(&engine).await;
    request.abort();
    let frames = read_until(&mut watch, is_result_of(&turn_id)).await;
    let abort = frames
        .iter()
        .find(|f| f.event.as_deref() == Some("turn_abort"))
        .expect("a turn_abort event");
    assert_eq!(abort.data["reason"], "client_disconnect");
    let result = &frames.last().unwrap().data["outcome"];
    assert_eq!(
        (&result["status"], &result["reason"], &result["call_id"]),
        (
            &json!("cancelled"),
            &json!("client_disconnect"),
            &json!("h")
        )
    );
}

#[tokio::test]
async fn an_sse_client_that_disconnects_aborts_its_turn() {
    let engine = engine();
    let server = Server::start(&engine, HttpOptions::default()).await;
    let mut watch = events(&server, "/v1/events?session_id=live").await;
    let response = client()
        .post(server.url("/v1/turns"))
        .header("accept", "text/event-stream")
        .json(&hang_turn())
        .send()
        .await
        .unwrap();
    let mut reader = SseReader::new(response.bytes_stream());
    let start = read_until(&mut reader, |_| true).await;
    assert_eq!(start[0].event.as_deref(), Some("turn_start"));
    let turn_id = until_running(&engine).await;
    drop(reader);
    let frames = read_until(&mut watch, is_result_of(&turn_id)).await;
    let result = &frames.last().unwrap().data["outcome"];
    assert_eq!(
        (&result["status"], &result["reason"]),
        (&json!("cancelled"), &json!("client_disconnect"))
    );
    tokio::time::timeout(BOUND, async {
        while !engine.active_turns().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the turn ended");
}

#[tokio::test]
async fn streams_carry_keep_alive_comments_over_the_wire() {
    let engine = engine();
    let opts = HttpOptions {
        keep_alive: Duration::from_millis(100),
        ..HttpOptions::default()
    };
    let server = Server::start(&engine, opts).await;
    let mut watch = events(&server, "/v1/events").await;
    let frame = tokio::time::timeout(BOUND, watch.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(frame.comment.as_deref(), Some("keep-alive"));
}

#[tokio::test]
async fn healthz_answers_over_the_wire_and_the_token_guards_the_rest() {
    let engine = engine();
    let opts = HttpOptions {
        token: Some("t0ken".into()),
        ..HttpOptions::default()
    };
    let server = Server::start(&engine, opts).await;
    let health = client().get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(
        health.json::<Value>().await.unwrap(),
        json!({"status": "ok", "store": "skipped", "redis": "skipped", "servers": {}})
    );
    let denied = client().get(server.url("/v1/tools")).send().await.unwrap();
    assert_eq!(denied.status(), 401);
    let allowed = client()
        .get(server.url("/v1/tools"))
        .bearer_auth("t0ken")
        .send()
        .await
        .unwrap();
    assert_eq!(allowed.status(), 200);
}
