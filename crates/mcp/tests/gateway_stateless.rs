//! The MCP gateway to stateless clients (protocol 2026-07-28): no `initialize`, no sessions;
//! every request carries its own `_meta` envelope (protocol version, client capabilities) and,
//! over Streamable HTTP, the `Mcp-Method`/`Mcp-Name` headers. Driven with raw JSON-RPC so that
//! each rule of the revision is seen on the wire.
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

mod support;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use support::{WAIT, messages, serve_http as serve, setup};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio_util::sync::CancellationToken;
use toolwarden_core::protocol::EventKind;

const V: &str = "2026-07-28";

/// A request of the stateless revision: `_meta` with the envelope, plus `meta`.
fn request(id: u64, method: &str, mut params: Value, meta: Value, capabilities: Value) -> Value {
    let mut m = json!({
        "io.modelcontextprotocol/protocolVersion": V,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "stateless-test", "version": "0"},
    });
    if let Value::Object(extra) = meta {
        m.as_object_mut().unwrap().extend(extra);
    }
    params["_meta"] = m;
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// A stateless HTTP client: every request stands alone.
struct Http {
    http: reqwest::Client,
    url: String,
    bearer: Option<String>,
}

impl Http {
    fn new(url: &str) -> Http {
        Http {
            http: reqwest::Client::new(),
            url: url.to_owned(),
            bearer: None,
        }
    }

    /// POSTs `body` with the headers the revision asks for (`Mcp-Name` from the body).
    async fn post(&self, body: &Value) -> reqwest::Response {
        let method = body["method"].as_str().unwrap().to_owned();
        let mut req = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", V)
            .header("mcp-method", &method);
        if let Some(name) = body["params"]["name"].as_str() {
            req = req.header("mcp-name", name);
        }
        if let Some(token) = &self.bearer {
            req = req.bearer_auth(token);
        }
        req.json(body).send().await.unwrap()
    }

    async fn call(&self, id: u64, tool: &str, args: Value, meta: Value) -> Value {
        let body = request(
            id,
            "tools/call",
            json!({"name": tool, "arguments": args}),
            meta,
            json!({}),
        );
        let resp = self.post(&body).await;
        assert!(resp.status().is_success(), "{}", resp.status());
        messages(resp).await.pop().unwrap()
    }
}

#[tokio::test]
async fn a_stateless_client_discovers_lists_with_cache_hints_and_calls_over_http() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let c = Http::new(&url);

    let resp = c
        .post(&request(
            1,
            "server/discover",
            json!({}),
            json!({}),
            json!({}),
        ))
        .await;
    assert!(resp.status().is_success());
    assert!(resp.headers().get("mcp-session-id").is_none(), "no session");
    let d = messages(resp).await.pop().unwrap();
    let versions = d["result"]["supportedVersions"].as_array().unwrap().clone();
    assert!(versions.contains(&json!(V)), "{d}");
    assert!(versions.contains(&json!("2025-11-25")), "{d}");
    assert_eq!(
        d["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        json!("toolwarden")
    );
    // What `subscriptions/listen` delivers is offered, as the servers offer it: the gateway
    // serves the stream to stateless clients.
    let caps = &d["result"]["capabilities"];
    assert!(caps["tools"].is_object(), "{d}");
    assert_eq!(caps["tools"]["listChanged"], json!(true), "{d}");
    for kind in ["prompts", "resources"] {
        assert_eq!(caps[kind]["listChanged"], json!(true), "{d}");
    }
    assert_eq!(caps["resources"]["subscribe"], json!(true), "{d}");

    let resp = c
        .post(&request(2, "tools/list", json!({}), json!({}), json!({})))
        .await;
    let l = messages(resp).await.pop().unwrap();
    let tools = l["result"]["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t["name"] == json!("t__echo")), "{l}");
    assert!(
        tools
            .iter()
            .any(|t| t["name"] == json!("toolwarden__status"))
    );
    assert_eq!(l["result"]["ttlMs"], json!(10_000));
    assert_eq!(l["result"]["cacheScope"], json!("private"));

    let r = c
        .call(3, "t__echo", json!({"text": "stateless"}), json!({}))
        .await;
    assert_eq!(r["id"], json!(3));
    assert_eq!(r["result"]["content"][0]["text"], json!("stateless"));
    assert_eq!(
        r["result"]["_meta"]["toolwarden/outcome"]["status"],
        json!("ok")
    );
    // A plain call is answered by the gateway's own path: one JSON body. The same call with a
    // log level in its envelope goes through rmcp's, as an event stream; both answer alike.
    let plain = request(
        5,
        "tools/call",
        json!({"name": "t__echo", "arguments": {"text": "json"}}),
        json!({}),
        json!({}),
    );
    let resp = c.post(&plain).await;
    assert_eq!(resp.headers()["content-type"], "application/json");
    let answer = messages(resp).await.pop().unwrap();
    assert_eq!(answer["id"], json!(5));
    assert_eq!(answer["result"]["content"][0]["text"], json!("json"));
    assert_eq!(
        answer["result"]["resultType"],
        json!("complete"),
        "{answer}"
    );
    let logged = request(
        6,
        "tools/call",
        json!({"name": "t__echo", "arguments": {"text": "sse"}}),
        json!({"io.modelcontextprotocol/logLevel": "error"}),
        json!({}),
    );
    let resp = c.post(&logged).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let other = messages(resp).await.pop().unwrap();
    assert_eq!(other["result"]["content"][0]["text"], json!("sse"));
    assert_eq!(
        other["result"]["_meta"]["toolwarden/outcome"]["status"],
        answer["result"]["_meta"]["toolwarden/outcome"]["status"]
    );
    // toolwarden__status answers for the request's session.
    let st = c.call(4, "toolwarden__status", json!({}), json!({})).await;
    assert!(st["result"]["structuredContent"].is_object(), "{st}");
    assert_eq!(s.gateway.clients(), 1, "one stateless session, registered");
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn an_input_response_that_is_not_an_object_is_refused() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let c = Http::new(&url);
    let body = request(
        1,
        "tools/call",
        json!({"name": "t__echo", "arguments": {"text": "x"}, "inputResponses": {"ask": 12345}}),
        json!({}),
        json!({}),
    );
    let answer = messages(c.post(&body).await).await.pop().unwrap();
    assert_eq!(answer["error"]["code"], json!(-32602), "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("inputResponses[\"ask\"]"),
        "{answer}"
    );
    // Extra keys holding results are ignored: the call runs.
    let body = request(
        2,
        "tools/call",
        json!({"name": "t__echo", "arguments": {"text": "x"},
               "inputResponses": {"unasked": {"action": "accept", "content": {}}}}),
        json!({}),
        json!({}),
    );
    let answer = messages(c.post(&body).await).await.pop().unwrap();
    assert_eq!(
        answer["result"]["content"][0]["text"],
        json!("x"),
        "{answer}"
    );
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn header_mismatches_and_a_missing_envelope_are_refused() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let http = reqwest::Client::new();
    let body = request(
        1,
        "tools/call",
        json!({"name": "t__echo", "arguments": {"text": "x"}}),
        json!({}),
        json!({}),
    );
    let send = |method: &'static str, name: &'static str, version: &'static str| {
        http.post(&url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", version)
            .header("mcp-method", method)
            .header("mcp-name", name)
            .json(&body)
            .send()
    };
    // Mcp-Method that is not the body's method.
    let resp = send("tools/list", "t__echo", V).await.unwrap();
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], json!(-32020), "{e}");
    // Mcp-Name that is not the tool called.
    let resp = send("tools/call", "t__sleep", V).await.unwrap();
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], json!(-32020), "{e}");
    // A protocol-version header that is not the envelope's.
    let resp = send("tools/call", "t__echo", "2025-11-25").await.unwrap();
    assert_eq!(resp.status(), 400);
    // An envelope without client capabilities.
    let mut bare = body.clone();
    bare["params"]["_meta"]
        .as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/clientCapabilities");
    let resp = http
        .post(&url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", V)
        .header("mcp-method", "tools/call")
        .header("mcp-name", "t__echo")
        .json(&bare)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], json!(-32602), "{e}");
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn progress_deadlines_and_a_closed_stream_govern_stateless_calls() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let c = Http::new(&url);

    // Progress under the client's own token, before the answer, on the request's stream.
    let body = request(
        1,
        "tools/call",
        json!({"name": "t__progress", "arguments": {"every_ms": 20, "count": 3}}),
        json!({"progressToken": "mine"}),
        json!({}),
    );
    let seen = messages(c.post(&body).await).await;
    let progress: Vec<&Value> = seen
        .iter()
        .filter(|m| m["method"] == json!("notifications/progress"))
        .collect();
    assert_eq!(progress.len(), 3, "{seen:?}");
    assert!(
        progress
            .iter()
            .all(|p| p["params"]["progressToken"] == json!("mine"))
    );
    assert_eq!(seen.last().unwrap()["id"], json!(1));
    // The last progress comes right before the answer, and still goes out before it.
    for id in 100..120 {
        let body = request(
            id,
            "tools/call",
            json!({"name": "t__progress", "arguments": {"every_ms": 0, "count": 3}}),
            json!({"progressToken": "mine"}),
            json!({}),
        );
        let seen = messages(c.post(&body).await).await;
        let progress = seen
            .iter()
            .filter(|m| m["method"] == json!("notifications/progress"))
            .count();
        assert_eq!(progress, 3, "{seen:?}");
        assert_eq!(seen.last().unwrap()["id"], json!(id));
    }

    // A deadline is a result with isError and the outcome.
    let r = c
        .call(
            2,
            "t__sleep",
            json!({"ms": 30_000}),
            json!({"timeout_ms": 200}),
        )
        .await;
    assert_eq!(r["result"]["isError"], json!(true), "{r}");
    let o = &r["result"]["_meta"]["toolwarden/outcome"];
    assert_eq!(
        (o["status"].clone(), o["kind"].clone()),
        (json!("timeout"), json!("total"))
    );

    // Closing the request's response stream cancels the call, down to the server.
    let body = request(
        3,
        "tools/call",
        json!({"name": "t__sleep", "arguments": {"ms": 30_000}}),
        json!({}),
        json!({}),
    );
    // (The answer's headers come with its first message: the client gives up before.)
    let waiting = {
        let c = Http::new(&c.url);
        tokio::spawn(async move { c.post(&body).await })
    };
    s.event("the call started", |e| {
        matches!(e.kind, EventKind::ToolStart { .. })
            && e.scope.call_id.as_ref().map(|c| c.as_str()) == Some("3")
    })
    .await;
    waiting.abort();
    let ended = s
        .event("the call ended", |e| {
            matches!(e.kind, EventKind::ToolResult { .. })
                && e.scope.call_id.as_ref().map(|c| c.as_str()) == Some("3")
        })
        .await;
    let EventKind::ToolResult { result, .. } = &ended.kind else {
        unreachable!()
    };
    let o = serde_json::to_value(&result.outcome).unwrap();
    assert_eq!(
        (o["status"].clone(), o["reason"].clone()),
        (json!("cancelled"), json!("client_disconnect"))
    );
    let mut id = 10;
    support::wait_for(|| {
        id += 1;
        let c = &c;
        async move {
            let r = c.call(id, "t__cancels", json!({}), json!({})).await;
            r["result"]["structuredContent"]["cancels"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        }
    })
    .await;
    shutdown.cancel();
    s.shutdown().await;
}

/// The session each of a client's calls ran in, by call id.
async fn session_of_call(s: &support::Setup, call: &str) -> String {
    let e = s
        .event("the call started", |e| {
            matches!(e.kind, EventKind::ToolStart { .. })
                && e.scope.call_id.as_ref().map(|c| c.as_str()) == Some(call)
        })
        .await;
    e.scope.session_id.as_ref().unwrap().to_string()
}

#[tokio::test]
async fn a_stateless_requests_session_is_named_or_one_per_identity_and_client() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let mut alice = Http::new(&url);
    alice.bearer = Some("alice-token".into());
    let mut bob = Http::new(&url);
    bob.bearer = Some("bob-token".into());

    alice
        .call(1, "add", json!({"a": 1, "b": 1}), json!({}))
        .await;
    alice
        .call(2, "add", json!({"a": 1, "b": 2}), json!({}))
        .await;
    bob.call(3, "add", json!({"a": 1, "b": 3}), json!({})).await;
    alice
        .call(
            4,
            "add",
            json!({"a": 1, "b": 4}),
            json!({"toolwarden/session": "agent-7"}),
        )
        .await;
    bob.call(
        5,
        "add",
        json!({"a": 1, "b": 5}),
        json!({"toolwarden/session": "agent-7"}),
    )
    .await;
    let a1 = session_of_call(&s, "1").await;
    assert!(a1.starts_with("mcp_"), "{a1}");
    assert!(!a1.contains("alice"), "the token never shows: {a1}");
    assert_eq!(
        session_of_call(&s, "2").await,
        a1,
        "one session per identity"
    );
    assert_ne!(session_of_call(&s, "3").await, a1, "another identity");
    assert_eq!(session_of_call(&s, "4").await, "agent-7");
    assert_eq!(session_of_call(&s, "5").await, "agent-7");
    // toolwarden__status reports the named session.
    let st = alice
        .call(
            6,
            "toolwarden__status",
            json!({}),
            json!({"toolwarden/session": "agent-7"}),
        )
        .await;
    assert_eq!(
        st["result"]["structuredContent"]["session_id"],
        json!("agent-7"),
        "{st}"
    );
    shutdown.cancel();
    s.shutdown().await;
}

#[tokio::test]
async fn an_approval_reaches_a_stateless_client_as_input_required() {
    let s = setup(&["t"], true, "").await;
    let (url, shutdown) = serve(&s.gateway).await;
    let c = Http::new(&url);
    let elicit = json!({"elicitation": {"form": {}}});
    let first = request(
        1,
        "tools/call",
        json!({"name": "guarded", "arguments": {"what": "deploy"}}),
        json!({}),
        elicit.clone(),
    );
    let r = messages(c.post(&first).await).await.pop().unwrap();
    let result = &r["result"];
    assert_eq!(result["resultType"], json!("input_required"), "{r}");
    let state = result["requestState"].as_str().unwrap().to_owned();
    let requests = result["inputRequests"].as_object().unwrap();
    assert_eq!(requests.len(), 1, "{r}");
    let (key, asked) = requests.iter().next().unwrap();
    assert_eq!(asked["method"], json!("elicitation/create"));
    assert!(
        asked["params"]["message"]
            .as_str()
            .unwrap()
            .contains("guarded")
    );
    // The retry answers it: approved, the call runs.
    let retry = request(
        2,
        "tools/call",
        json!({"name": "guarded", "arguments": {"what": "deploy"},
               "inputResponses": {key.clone(): {"action": "accept", "content": {"approve": true}}},
               "requestState": state}),
        json!({}),
        elicit.clone(),
    );
    let r = messages(c.post(&retry).await).await.pop().unwrap();
    assert_eq!(r["result"]["content"][0]["text"], json!("done"), "{r}");
    assert_eq!(
        r["result"]["_meta"]["toolwarden/outcome"]["status"],
        json!("ok")
    );
    // Declined: the call is denied, as a person's denial.
    let r = messages(
        c.post(&request(
            3,
            "tools/call",
            json!({"name": "guarded", "arguments": {}}),
            json!({}),
            elicit.clone(),
        ))
        .await,
    )
    .await
    .pop()
    .unwrap();
    let state = r["result"]["requestState"].as_str().unwrap().to_owned();
    let key = r["result"]["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let retry = request(
        4,
        "tools/call",
        json!({"name": "guarded", "arguments": {},
               "inputResponses": {key: {"action": "decline"}}, "requestState": state}),
        json!({}),
        elicit.clone(),
    );
    let r = messages(c.post(&retry).await).await.pop().unwrap();
    assert_eq!(r["result"]["isError"], json!(true), "{r}");
    assert_eq!(
        r["result"]["_meta"]["toolwarden/outcome"]["status"],
        json!("denied")
    );
    // A requestState nobody knows is an error.
    let stale = request(
        5,
        "tools/call",
        json!({"name": "guarded", "arguments": {}, "inputResponses": {}, "requestState": "nope"}),
        json!({}),
        elicit,
    );
    let r = messages(c.post(&stale).await).await.pop().unwrap();
    assert_eq!(r["error"]["code"], json!(-32602), "{r}");
    shutdown.cancel();
    s.shutdown().await;
}

/// A stateless client over a byte-stream pair (as on stdio).
struct Stdio {
    write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    read: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
}

impl Stdio {
    async fn send(&mut self, msg: &Value) {
        let mut line = msg.to_string();
        line.push('\n');
        self.write.write_all(line.as_bytes()).await.unwrap();
    }

    /// Messages up to the answer to `id`.
    async fn until_answer(&mut self, id: u64) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let line = tokio::time::timeout(WAIT, self.read.next_line())
                .await
                .expect("a message in time")
                .unwrap()
                .expect("the gateway keeps the pipe open");
            let v: Value = serde_json::from_str(&line).unwrap();
            let done = v["id"] == json!(id) && v.get("method").is_none();
            seen.push(v);
            if done {
                return seen;
            }
        }
    }
}

#[tokio::test]
async fn a_stateless_client_on_stdio_discovers_calls_and_cancels() {
    let s = setup(&["t"], true, "").await;
    let (client_io, gateway_io) = tokio::io::duplex(1 << 20);
    let (gr, gw) = tokio::io::split(gateway_io);
    let stop = CancellationToken::new();
    let serving = {
        let gateway = s.gateway.clone();
        let stop = stop.clone();
        tokio::spawn(async move { gateway.serve_io(gr, gw, stop).await })
    };
    let (cr, cw) = tokio::io::split(client_io);
    let mut c = Stdio {
        write: cw,
        read: BufReader::new(cr).lines(),
    };
    c.send(&request(
        1,
        "server/discover",
        json!({}),
        json!({}),
        json!({}),
    ))
    .await;
    let d = c.until_answer(1).await.pop().unwrap();
    assert!(
        d["result"]["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!(V)),
        "{d}"
    );
    c.send(&request(2, "tools/list", json!({}), json!({}), json!({})))
        .await;
    let l = c.until_answer(2).await.pop().unwrap();
    assert_eq!(l["result"]["ttlMs"], json!(10_000), "{l}");
    c.send(&request(
        3,
        "tools/call",
        json!({"name": "counter", "arguments": {"count": 2}}),
        json!({"progressToken": 42}),
        json!({}),
    ))
    .await;
    let seen = c.until_answer(3).await;
    assert_eq!(
        seen.len(),
        3,
        "two progress reports, then the answer: {seen:?}"
    );
    assert_eq!(seen[0]["params"]["progressToken"], json!(42));
    assert_eq!(
        seen[2]["result"]["content"][0]["text"],
        json!("counted to 2")
    );
    // The connection is the session (no name given): status answers for it.
    let session = session_of_call(&s, "3").await;
    assert!(
        s.gateway
            .client_sessions()
            .iter()
            .any(|id| id.to_string() == session)
    );
    // notifications/cancelled cancels a call, as for every stdio client.
    c.send(&request(
        4,
        "tools/call",
        json!({"name": "t__sleep", "arguments": {"ms": 30_000}}),
        json!({}),
        json!({}),
    ))
    .await;
    session_of_call(&s, "4").await;
    c.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 4, "reason": "changed my mind"}}),
    )
    .await;
    let o = s.outcome_of("t__sleep").await;
    assert_eq!(
        (o["status"].clone(), o["reason"].clone()),
        (json!("cancelled"), json!("user"))
    );
    drop(c);
    tokio::time::timeout(WAIT, serving)
        .await
        .expect("the connection ends with its client")
        .unwrap()
        .unwrap();
    s.shutdown().await;
}
