//! What the gateway passes through rather than governs: resources, templates, subscriptions,
//! prompts, completion, logging and list-changed notifications, routed among several servers.
#![allow(clippy::expect_used, clippy::unwrap_used, deprecated, reason = "tests")]

mod support;

use pretty_assertions::assert_eq;
use rmcp::model::{
    ArgumentInfo, CompleteRequestParams, GetPromptRequestParams, LoggingLevel, Reference,
    SetLevelRequestParams, SubscribeRequestParams, UnsubscribeRequestParams,
};
use serde_json::{Value, json};
use support::{Client, TestClient, call, connect, setup};

fn uris(resources: &[rmcp::model::Resource]) -> Vec<String> {
    let mut v: Vec<String> = resources.iter().map(|r| r.uri.clone()).collect();
    v.sort();
    v
}

async fn read(client: &Client, uri: &str) -> Result<String, String> {
    client
        .peer()
        .read_resource(rmcp::model::ReadResourceRequestParams::new(uri))
        .await
        .map(|r| {
            let v = serde_json::to_value(r).unwrap();
            v["contents"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .map_err(|e| e.to_string())
}

async fn greet(client: &Client, prompt: &str, name: &str) -> String {
    let mut params = GetPromptRequestParams::new(prompt);
    params.arguments = Some(serde_json::from_value(json!({ "name": name })).unwrap());
    let r = client.peer().get_prompt(params).await.unwrap();
    let v = serde_json::to_value(r).unwrap();
    v["messages"][0]["content"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn complete(client: &Client, reference: Reference, arg: &str, value: &str) -> Vec<String> {
    let params = CompleteRequestParams::new(reference, ArgumentInfo::new(arg, value));
    let r = client.peer().complete(params).await.unwrap();
    r.completion.values
}

#[tokio::test]
async fn one_server_passes_resources_prompts_completion_and_logging_through() {
    let s = setup(&["t"], true, "").await;
    let handler = TestClient::new();
    let (client, _serving, _shutdown) = connect(&s.gateway, handler.clone()).await;
    let peer = client.peer();

    let resources = peer.list_all_resources().await.unwrap();
    assert_eq!(
        uris(&resources),
        vec!["test://static/hello", "test://t/mine"]
    );
    assert_eq!(read(&client, "test://static/hello").await.unwrap(), "hello");
    let templates = peer.list_all_resource_templates().await.unwrap();
    assert_eq!(templates[0].uri_template, "test://items/{id}");
    assert_eq!(read(&client, "test://items/7").await.unwrap(), "item 7");
    // The server's own JSON-RPC error comes back unchanged.
    let err = read(&client, "test://nothing").await.unwrap_err();
    assert!(err.contains("no resource test://nothing"), "{err}");

    let prompts = peer.list_all_prompts().await.unwrap();
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, vec!["t__greet"]);
    assert_eq!(
        greet(&client, "t__greet", "alice").await,
        "Hello, alice! (t)"
    );

    assert_eq!(
        complete(&client, Reference::for_prompt("t__greet"), "name", "al").await,
        vec!["alice", "albert"]
    );
    assert_eq!(
        complete(
            &client,
            Reference::for_resource("test://items/{id}"),
            "id",
            ""
        )
        .await,
        vec!["1", "2", "3"]
    );

    peer.set_level(SetLevelRequestParams::new(LoggingLevel::Warning))
        .await
        .unwrap();
    call(
        &client,
        "t__log",
        json!({"message": "written by the server"}),
    )
    .await;
    let seen = handler.wait("a log message", |s| !s.logs.is_empty()).await;
    assert_eq!(seen.logs[0].data, json!("written by the server"));
    assert_eq!(seen.logs[0].logger.as_deref(), Some("tw-test-server"));
    let seen_by_server = call(&client, "t__seen", json!({})).await;
    assert_eq!(
        seen_by_server["structuredContent"]["log_level"],
        json!("warning")
    );

    call(&client, "t__lists_changed", json!({})).await;
    handler
        .wait("prompts and resources list_changed", |s| {
            s.prompts_changed >= 1 && s.resources_changed >= 1
        })
        .await;
    drop(client);
    s.shutdown().await;
}

#[tokio::test]
async fn subscriptions_are_counted_and_updates_reach_only_the_subscribers() {
    let s = setup(&["t"], true, "").await;
    let first = TestClient::new();
    let second = TestClient::new();
    let (a, _sa, _ka) = connect(&s.gateway, first.clone()).await;
    let (b, _sb, _kb) = connect(&s.gateway, second.clone()).await;
    let uri = "test://static/hello";
    a.peer()
        .subscribe(SubscribeRequestParams::new(uri))
        .await
        .unwrap();
    b.peer()
        .subscribe(SubscribeRequestParams::new(uri))
        .await
        .unwrap();
    let seen = call(&a, "t__seen", json!({})).await;
    // One subscription at the server for both clients.
    assert_eq!(seen["structuredContent"]["subscriptions"], json!([uri]));
    call(&a, "t__touch", json!({"uri": uri})).await;
    first
        .wait("the update", |s| s.updated == vec![uri.to_owned()])
        .await;
    second
        .wait("the update", |s| s.updated == vec![uri.to_owned()])
        .await;
    // The first leaves; the server keeps the subscription for the second.
    a.peer()
        .unsubscribe(UnsubscribeRequestParams::new(uri))
        .await
        .unwrap();
    let seen = call(&a, "t__seen", json!({})).await;
    assert_eq!(seen["structuredContent"]["subscriptions"], json!([uri]));
    call(&a, "t__touch", json!({"uri": uri})).await;
    second
        .wait("the second update", |s| s.updated.len() == 2)
        .await;
    assert_eq!(first.seen().updated.len(), 1);
    // The second disconnects: the last subscriber is gone, so is the server's subscription.
    b.cancel().await.unwrap();
    support::wait_for(|| async {
        call(&a, "t__seen", json!({})).await["structuredContent"]["subscriptions"] == json!([])
    })
    .await;
    drop(a);
    s.shutdown().await;
}

#[tokio::test]
async fn several_servers_each_get_their_own_prompts_and_resources() {
    let s = setup(&["a", "b"], true, "").await;
    let (client, _serving, _shutdown) = connect(&s.gateway, TestClient::new()).await;
    let peer = client.peer();
    // Before anything was listed: the gateway reads the lists to find the URI's server.
    assert_eq!(read(&client, "test://b/mine").await.unwrap(), "mine of b");
    // Item URIs match both servers' template: the first that answers serves it.
    assert_eq!(read(&client, "test://items/3").await.unwrap(), "item 3");
    let mut names: Vec<String> = peer
        .list_all_prompts()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect();
    names.sort();
    assert_eq!(names, vec!["a__greet", "b__greet"]);
    assert_eq!(greet(&client, "a__greet", "x").await, "Hello, x! (a)");
    assert_eq!(greet(&client, "b__greet", "x").await, "Hello, x! (b)");
    // Both lists in one page.
    let resources = peer.list_all_resources().await.unwrap();
    let listed = uris(&resources);
    assert!(listed.contains(&"test://a/mine".to_owned()), "{listed:?}");
    assert!(listed.contains(&"test://b/mine".to_owned()), "{listed:?}");
    // Each URI goes to the server that listed it.
    assert_eq!(read(&client, "test://a/mine").await.unwrap(), "mine of a");
    assert_eq!(read(&client, "test://b/mine").await.unwrap(), "mine of b");
    // Completion of a prompt goes to its server, under the server's own name.
    assert_eq!(
        complete(&client, Reference::for_prompt("b__greet"), "name", "b").await,
        vec!["bob"]
    );
    drop(client);
    s.shutdown().await;
}

#[tokio::test]
async fn unprefixed_with_one_server_it_looks_like_the_server() {
    let s = setup(&["t"], false, "").await;
    let (client, _serving, _shutdown) = connect(&s.gateway, TestClient::new()).await;
    let info = client.peer().peer_info().unwrap();
    assert_eq!(
        info.instructions.as_deref(),
        Some("tw-test-server misbehaves on purpose.")
    );
    let tools = client.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "echo"));
    let prompts = client.peer().list_all_prompts().await.unwrap();
    assert_eq!(prompts[0].name, "greet");
    assert_eq!(greet(&client, "greet", "bob").await, "Hello, bob! (t)");
    let r = call(&client, "echo", json!({"text": "plain"})).await;
    assert_eq!(r["content"][0]["text"], Value::from("plain"));
    drop(client);
    s.shutdown().await;
}
