//! A `tw-test-server` that speaks only 2026-07-28 behind the gateway, used by a handshake
//! client: what the server asks through `input_required` (elicitation, sampling, roots)
//! reaches the calling client as the requests a handshake server would have sent, and the
//! call is sent again with the answers.
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

mod support;

use pretty_assertions::assert_eq;
use serde_json::json;
use support::{TestClient, call, connect, setup_with, text};

const STATELESS: &[&str] = &["--era", "2026-07-28"];

#[tokio::test]
async fn input_required_from_a_2026_server_is_asked_of_a_handshake_client() {
    let s = setup_with(&[("t", STATELESS)], true, "").await;
    let client_handler = TestClient::new();
    let (client, _serving, _shutdown) = connect(&s.gateway, client_handler.clone()).await;
    let r = call(&client, "t__version", json!({})).await;
    assert_eq!(text(&r), "2026-07-28");
    let r = call(&client, "t__elicit", json!({"message": "Your answer?"})).await;
    assert_eq!(
        r["structuredContent"],
        json!({"action": "accept", "content": {"answer": "42", "approve": true}})
    );
    let seen = client_handler.seen();
    assert_eq!(seen.elicitations.len(), 1);
    assert_eq!(seen.elicitations[0]["message"], json!("Your answer?"));
    let r = call(&client, "t__sample", json!({"prompt": "what is 6*7?"})).await;
    assert_eq!(text(&r), "sampled: what is 6*7?");
    let r = call(&client, "t__roots", json!({})).await;
    assert_eq!(
        r["structuredContent"]["roots"],
        json!([{"uri": "file:///work", "name": "work"}])
    );
    // A client that cannot answer: the call fails, saying why.
    let (bare, _serving2, _shutdown2) = connect(&s.gateway, TestClient::bare()).await;
    let r = call(&bare, "t__elicit", json!({"message": "x"})).await;
    assert_eq!(r["isError"], json!(true));
    assert!(text(&r).contains("does not support"), "{}", text(&r));
    drop(client);
    drop(bare);
    s.shutdown().await;
}

#[tokio::test]
async fn a_tasks_input_required_is_asked_of_the_calling_client_and_answered_with_tasks_update() {
    let s = setup_with(&[("t", STATELESS)], true, "").await;
    let client_handler = TestClient::new();
    let (client, _serving, _shutdown) = connect(&s.gateway, client_handler.clone()).await;
    let r = call(
        &client,
        "t__task",
        json!({"ms": 300, "steps": 3, "poll_ms": 20, "ask": true}),
    )
    .await;
    assert_eq!(
        r["structuredContent"],
        json!({"action": "accept", "content": {"answer": "42", "approve": true}})
    );
    assert_eq!(
        client_handler.seen().elicitations[0]["message"],
        json!("Go on?")
    );
    drop(client);
    s.shutdown().await;
}
