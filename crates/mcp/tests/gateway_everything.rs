//! The official reference server `@modelcontextprotocol/server-everything` (pinned in
//! `package.json`, installed by `scripts/setup-test-deps.sh`) proxied through the gateway
//! with `prefix = false`, as the conformance suite will run it: what a client sees should be
//! what the server offers, with tool calls governed.
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use pretty_assertions::assert_eq;
use rmcp::model::{
    ArgumentInfo, CompleteRequestParams, GetPromptRequestParams, ReadResourceRequestParams,
    Reference,
};
use serde_json::{Value, json};
use support::{TestClient, call, connect, outcome, start_call, text};
use toolwarden_core::protocol::ServerConfig;
use toolwarden_core::{Config, Engine};
use toolwarden_mcp::{Gateway, GatewayOptions, McpServer};
use toolwarden_testkit::everything_bin;

#[tokio::test]
async fn server_everything_through_the_gateway_looks_like_itself_with_governed_calls() {
    let config = Config::parse("[gateway]\nprefix = false\n", "t.toml", &|_| None).unwrap();
    let engine = Engine::builder().policies(Arc::new(config)).build();
    let server = McpServer::start(
        "everything".into(),
        ServerConfig {
            command: Some(everything_bin().display().to_string()),
            args: vec!["stdio".into()],
            ..Default::default()
        },
        engine.host(false),
        std::env::temp_dir(),
    );
    server
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("server-everything comes up");
    let gateway = Gateway::new(
        engine.clone(),
        vec![server.clone()],
        GatewayOptions {
            prefix: false,
            ..Default::default()
        },
    );
    let handler = TestClient::new();
    let (client, _serving, _shutdown) = connect(&gateway, handler.clone()).await;
    let peer = client.peer();

    // Its tools, unprefixed, including those it offers only to clients that can sample.
    support::wait_for(|| async {
        let tools = peer.list_all_tools().await.unwrap();
        tools.iter().any(|t| t.name == "trigger-sampling-request")
    })
    .await;
    let tools = peer.list_all_tools().await.unwrap();
    let long = tools
        .iter()
        .find(|t| t.name == "trigger-long-running-operation")
        .unwrap();
    assert_eq!(
        long.title.as_deref(),
        Some("Trigger Long Running Operation Tool")
    );
    assert_eq!(
        long.annotations.as_ref().and_then(|a| a.read_only_hint),
        Some(true)
    );
    let info = peer.peer_info().unwrap();
    assert!(info.instructions.is_some(), "its instructions pass through");

    let r = call(&client, "echo", json!({"message": "hello"})).await;
    assert_eq!(text(&r), "Echo: hello");
    assert_eq!(outcome(&r)["status"], json!("ok"));

    // Its sampling request reaches this client and the answer goes back.
    let r = call(&client, "trigger-sampling-request", json!({"prompt": "hi"})).await;
    assert!(
        text(&r).contains("sampled: Resource trigger-sampling-request context: hi"),
        "{}",
        text(&r)
    );

    // Its progress reaches this client under this client's token.
    let handle = start_call(
        &client,
        "trigger-long-running-operation",
        json!({"duration": 1, "steps": 3}),
        json!({}),
    )
    .await;
    let token = handle.progress_token.clone();
    let r = serde_json::to_value(handle.await_response().await.unwrap()).unwrap();
    assert_eq!(r["isError"], json!(false));
    handler
        .wait("its progress", |s| {
            s.progress
                .iter()
                .filter(|p| p.progress_token == token)
                .count()
                == 3
        })
        .await;

    // Resources, templates, prompts and completion pass through.
    let resources = peer.list_all_resources().await.unwrap();
    assert!(!resources.is_empty());
    let first = resources[0].uri.clone();
    let read = peer
        .read_resource(ReadResourceRequestParams::new(first.clone()))
        .await
        .unwrap();
    let read = serde_json::to_value(read).unwrap();
    assert_eq!(read["contents"][0]["uri"], Value::from(first));
    let read = peer
        .read_resource(ReadResourceRequestParams::new(
            "demo://resource/dynamic/text/1",
        ))
        .await
        .unwrap();
    assert!(serde_json::to_value(read).unwrap()["contents"][0]["text"].is_string());
    let prompts = peer.list_all_prompts().await.unwrap();
    assert!(prompts.iter().any(|p| p.name == "simple-prompt"));
    let got = peer
        .get_prompt(GetPromptRequestParams::new("simple-prompt"))
        .await
        .unwrap();
    assert!(!got.messages.is_empty());
    let done = peer
        .complete(CompleteRequestParams::new(
            Reference::for_prompt("completable-prompt"),
            ArgumentInfo::new("department", "Eng"),
        ))
        .await
        .unwrap();
    assert_eq!(done.completion.values, vec!["Engineering"]);

    drop(client);
    server.shutdown().await;
    engine.shutdown(Duration::from_secs(5)).await;
}
