//! Shared by the gateway tests: an engine with `tw-test-server`s and in-process tools, a
//! gateway over it, and a recording Rust rmcp client.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    dead_code,
    unreachable_pub,
    deprecated,
    reason = "test helpers; sampling and roots are SEP-2577-deprecated but still passed through"
)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use parking_lot::Mutex;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientCapabilities, ClientConfig, ClientRequest,
    CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams, ElicitResult,
    Implementation, ListRootsResult, LoggingMessageNotificationParam, ProgressNotificationParam,
    RequestMetaObject, ResourceUpdatedNotificationParam, ServerResult,
};
use rmcp::service::{
    NotificationContext, PeerRequestOptions, RequestContext, RequestHandle, RoleClient,
    RunningService,
};
use rmcp::{ClientHandler, ErrorData, ServiceExt as _};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use toolwarden_core::events::Received;
use toolwarden_core::protocol::{Approval, Event, EventKind};
use toolwarden_core::{Config, Engine, InProcessTool, ToolError};
use toolwarden_mcp::{Gateway, GatewayOptions, McpOptions, McpServer};
use toolwarden_testkit::test_server_path;

pub const READY: Duration = Duration::from_secs(20);
pub const WAIT: Duration = Duration::from_secs(10);

/// An engine over test servers, with a gateway.
pub struct Setup {
    pub engine: Engine,
    pub gateway: Arc<Gateway>,
    pub servers: Vec<Arc<McpServer>>,
    pub events: Arc<Mutex<Vec<Arc<Event>>>>,
    pub events_changed: Arc<Notify>,
}

/// `[servers.NAME]` for a `tw-test-server` (with `--tag NAME`).
pub fn server_toml(name: &str) -> String {
    server_toml_with(name, &[])
}

/// `[servers.NAME]` for a `tw-test-server` with `--tag NAME` and `args`.
pub fn server_toml_with(name: &str, args: &[&str]) -> String {
    let mut all = vec!["--tag", name];
    all.extend_from_slice(args);
    format!(
        "[servers.{name}]\ncommand = {:?}\nargs = {:?}\n",
        test_server_path().display().to_string(),
        all
    )
}

/// An engine with the test servers `names` (tools `NAME__TOOL` unless `prefix` is false),
/// `extra` config, and in-process tools: `add {a, b}`, `guarded` (approval `ask`) and
/// `counter {count}` (reports progress, then answers).
pub async fn setup(names: &[&str], prefix: bool, extra: &str) -> Setup {
    let servers: Vec<(&str, &[&str])> = names.iter().map(|n| (*n, &[][..])).collect();
    setup_with(&servers, prefix, extra).await
}

/// [`setup`] with extra command-line arguments for each test server.
pub async fn setup_with(servers: &[(&str, &[&str])], prefix: bool, extra: &str) -> Setup {
    let opts = GatewayOptions {
        prefix,
        http_session_idle: Duration::from_secs(60),
        ..Default::default()
    };
    setup_opts(servers, extra, opts).await
}

/// [`setup_with`] with the gateway's options (`opts.prefix` names the tools).
pub async fn setup_opts(servers: &[(&str, &[&str])], extra: &str, opts: GatewayOptions) -> Setup {
    let prefix = opts.prefix;
    let names: Vec<&str> = servers.iter().map(|(n, _)| *n).collect();
    let mut toml = String::new();
    toml.push_str(&format!("[gateway]\nprefix = {prefix}\n\n"));
    for (name, args) in servers {
        toml.push_str(&server_toml_with(name, args));
        toml.push('\n');
    }
    toml.push_str(extra);
    let config = Config::parse(&toml, "gateway-test.toml", &|_| None).expect("config");
    let engine = Engine::builder().policies(Arc::new(config.clone())).build();
    register_tools(&engine);
    let events: Arc<Mutex<Vec<Arc<Event>>>> = Arc::default();
    let events_changed = Arc::new(Notify::new());
    {
        let mut sub = engine.subscribe();
        let events = events.clone();
        let changed = events_changed.clone();
        tokio::spawn(async move {
            while let Some(r) = sub.recv().await {
                if let Received::Event(e) = r {
                    events.lock().push(e);
                    changed.notify_waiters();
                }
            }
        });
    }
    let host = engine.host(prefix);
    let mut servers = Vec::new();
    for name in &names {
        let cfg = config.file.servers[*name].clone();
        let server = McpServer::start_with(
            name.to_string(),
            cfg,
            host.clone(),
            std::env::temp_dir(),
            McpOptions {
                restart_backoff_initial: Duration::from_millis(100),
                ..Default::default()
            },
        );
        server
            .wait_ready(READY)
            .await
            .expect("test server comes up");
        servers.push(server);
    }
    let gateway = Gateway::new(engine.clone(), servers.clone(), opts);
    Setup {
        engine,
        gateway,
        servers,
        events,
        events_changed,
    }
}

fn register_tools(engine: &Engine) {
    engine.register(InProcessTool::new(
        "add",
        "Adds two integers",
        json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
               "required": ["a", "b"]}),
        |input, _ctx| async move {
            let sum = input["a"].as_i64().unwrap_or(0) + input["b"].as_i64().unwrap_or(0);
            Ok::<_, ToolError>(sum.to_string())
        },
    ));
    engine.register(
        InProcessTool::new(
            "guarded",
            "Runs only when a person approves",
            json!({"type": "object", "properties": {"what": {"type": "string"}}}),
            |_input, _ctx| async move { Ok::<_, ToolError>("done") },
        )
        .approval(Approval::Ask),
    );
    engine.register(InProcessTool::new(
        "counter",
        "Reports progress, then answers",
        json!({"type": "object", "properties": {"count": {"type": "integer"}}}),
        |input, ctx| async move {
            let count = input["count"].as_u64().unwrap_or(3);
            for i in 1..=count {
                tokio::time::sleep(Duration::from_millis(20)).await;
                ctx.progress(i as f64, Some(count as f64), Some(&format!("step {i}")));
            }
            Ok::<_, ToolError>(format!("counted to {count}"))
        },
    ));
}

impl Setup {
    /// Waits for an event matching `pred`; returns it.
    pub async fn event(&self, what: &str, pred: impl Fn(&Event) -> bool) -> Arc<Event> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let notified = self.events_changed.notified();
            if let Some(e) = self.events.lock().iter().find(|e| pred(e)) {
                return e.clone();
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            assert!(!left.is_zero(), "timed out waiting for the event: {what}");
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    /// The outcome of the first call of `tool` in the events (its `tool_result`).
    pub async fn outcome_of(&self, tool: &str) -> Value {
        let e = self
            .event(&format!("the tool_result of {tool}"), |e| {
                e.scope.tool.as_deref() == Some(tool)
                    && matches!(e.kind, EventKind::ToolResult { .. })
            })
            .await;
        match &e.kind {
            EventKind::ToolResult { result, .. } => serde_json::to_value(&result.outcome).unwrap(),
            _ => unreachable!(),
        }
    }

    pub async fn shutdown(self) {
        for s in &self.servers {
            s.shutdown().await;
        }
        self.engine.shutdown(Duration::from_secs(5)).await;
    }
}

/// What a test client saw.
#[derive(Default, Debug, Clone)]
pub struct Seen {
    pub progress: Vec<ProgressNotificationParam>,
    pub tools_changed: u32,
    pub prompts_changed: u32,
    pub resources_changed: u32,
    pub logs: Vec<LoggingMessageNotificationParam>,
    pub updated: Vec<String>,
    pub elicitations: Vec<Value>,
    pub samplings: Vec<Value>,
    pub cancelled: Vec<Value>,
}

/// A Rust rmcp client that records what it is told and answers sampling, elicitation and
/// roots.
#[derive(Clone)]
pub struct TestClient {
    pub seen: Arc<Mutex<Seen>>,
    pub changed: Arc<Notify>,
    /// How elicitations are answered (`{"action": ..., "content": ...}`); `None`: never.
    pub elicit_answer: Arc<Mutex<Option<Value>>>,
    pub capabilities: ClientCapabilities,
}

impl TestClient {
    /// A client that declares sampling, elicitation and roots.
    pub fn new() -> Self {
        let capabilities: ClientCapabilities = serde_json::from_value(json!({
            "sampling": {}, "elicitation": {"form": {}}, "roots": {"listChanged": true}
        }))
        .unwrap();
        Self::with_capabilities(capabilities)
    }

    /// A client that declares nothing.
    pub fn bare() -> Self {
        Self::with_capabilities(ClientCapabilities::default())
    }

    fn with_capabilities(capabilities: ClientCapabilities) -> Self {
        Self {
            seen: Arc::default(),
            changed: Arc::new(Notify::new()),
            elicit_answer: Arc::new(Mutex::new(Some(
                json!({"action": "accept", "content": {"answer": "42", "approve": true}}),
            ))),
            capabilities,
        }
    }

    fn record(&self, f: impl FnOnce(&mut Seen)) {
        f(&mut self.seen.lock());
        self.changed.notify_waiters();
    }

    pub fn seen(&self) -> Seen {
        self.seen.lock().clone()
    }

    /// Waits until `cond` holds on what the client saw.
    pub async fn wait(&self, what: &str, cond: impl Fn(&Seen) -> bool) -> Seen {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let notified = self.changed.notified();
            {
                let seen = self.seen.lock();
                if cond(&seen) {
                    return seen.clone();
                }
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            assert!(
                !left.is_zero(),
                "timed out waiting for: {what}; seen: {:#?}",
                self.seen.lock()
            );
            let _ = tokio::time::timeout(left, notified).await;
        }
    }
}

impl ClientHandler for TestClient {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.record(|s| s.progress.push(params));
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.record(|s| s.tools_changed += 1);
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.record(|s| s.prompts_changed += 1);
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.record(|s| s.resources_changed += 1);
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.record(|s| s.logs.push(params));
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.record(|s| s.updated.push(params.uri));
    }

    async fn on_cancelled(
        &self,
        params: rmcp::model::CancelledNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let v = serde_json::to_value(&params).unwrap();
        self.record(|s| s.cancelled.push(v));
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let asked = serde_json::to_value(&params).unwrap();
        let prompt = asked
            .pointer("/messages/0/content/text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        self.record(|s| s.samplings.push(asked));
        Ok(serde_json::from_value(json!({
            "role": "assistant", "model": "test-model",
            "content": {"type": "text", "text": format!("sampled: {prompt}")}
        }))
        .unwrap())
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let asked = serde_json::to_value(&request).unwrap();
        self.record(|s| s.elicitations.push(asked));
        let answer = self.elicit_answer.lock().clone();
        match answer {
            Some(answer) => Ok(serde_json::from_value(answer).unwrap()),
            // A person who never answers.
            None => std::future::pending().await,
        }
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        Ok(
            serde_json::from_value(json!({"roots": [{"uri": "file:///work", "name": "work"}]}))
                .unwrap(),
        )
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            self.capabilities.clone(),
            Implementation::new("gateway-test-client", "0.0.0"),
        )
    }
}

pub type Client = RunningService<RoleClient, TestClient>;

/// Connects `client` to the gateway over an in-memory pipe; the gateway serves it like
/// stdio. Returns the client and the serving task (with its shutdown token).
pub async fn connect(
    gateway: &Arc<Gateway>,
    client: TestClient,
) -> (
    Client,
    tokio::task::JoinHandle<Result<(), toolwarden_mcp::GatewayError>>,
    CancellationToken,
) {
    let (client_io, gateway_io) = tokio::io::duplex(1 << 20);
    let (gr, gw_) = tokio::io::split(gateway_io);
    let shutdown = CancellationToken::new();
    let serving = {
        let gateway = gateway.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move { gateway.serve_io(gr, gw_, shutdown).await })
    };
    let (cr, cw) = tokio::io::split(client_io);
    let running = client.serve((cr, cw)).await.expect("initialize");
    (running, serving, shutdown)
}

/// Sends `tools/call` with `_meta` and returns the handle (rmcp puts its own progress token on
/// it: `handle.progress_token`).
pub async fn start_call(
    client: &Client,
    name: &str,
    args: Value,
    meta: Value,
) -> RequestHandle<RoleClient> {
    let mut params = CallToolRequestParams::new(name.to_owned());
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    let mut options = PeerRequestOptions::no_options();
    if let Value::Object(map) = meta {
        let mut m = RequestMetaObject::new();
        for (k, v) in map {
            m.insert(k, v);
        }
        options = options.with_meta(m);
    }
    client
        .peer()
        .send_request_with_option(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            options,
        )
        .await
        .expect("send tools/call")
}

/// A `tools/call` to its result, as JSON.
pub async fn call(client: &Client, name: &str, args: Value) -> Value {
    call_with(client, name, args, json!({})).await
}

pub async fn call_with(client: &Client, name: &str, args: Value, meta: Value) -> Value {
    let handle = start_call(client, name, args, meta).await;
    let result = tokio::time::timeout(WAIT, handle.await_response())
        .await
        .expect("the call answers in time")
        .expect("a result, not a JSON-RPC error");
    match result {
        ServerResult::CallToolResult(r) => serde_json::to_value(r).unwrap(),
        other => panic!("not a CallToolResult: {other:?}"),
    }
}

/// The text of a result's first block.
pub fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A result's structured outcome.
pub fn outcome(result: &Value) -> Value {
    result["_meta"]["toolwarden/outcome"].clone()
}

/// Everything the test server's `cancels` tool says it received.
pub async fn server_cancels(client: &Client, tool: &str) -> Vec<Value> {
    let r = call(client, tool, json!({})).await;
    r["structuredContent"]["cancels"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Polls `check` until it says yes (every 50 ms, at most [`WAIT`]).
pub async fn wait_for<F, Fut>(mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    poll(
        &format!("timed out after {WAIT:?}"),
        async || check().await,
        |yes| *yes,
    )
    .await;
}

/// Fetches with `fetch` every 50 ms until `done` says yes of what it got, and returns that; at
/// most [`WAIT`], then panics with `what` and the last thing fetched.
pub async fn poll<T: std::fmt::Display>(
    what: &str,
    mut fetch: impl AsyncFnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = fetch().await;
        if done(&got) {
            return got;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {got}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Serves the gateway at `http://127.0.0.1:PORT/mcp`; stops at `shutdown`.
pub async fn serve_http(gateway: &Arc<Gateway>) -> (String, CancellationToken) {
    let shutdown = CancellationToken::new();
    let app = axum::Router::new().nest_service("/mcp", gateway.http_service(shutdown.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    });
    (format!("http://{addr}/mcp"), shutdown)
}

/// A raw Streamable HTTP client's `initialize` (revision `protocol`, declaring `capabilities`,
/// as client `name`): the session id the gateway gave, and the response that carries the answer
/// (each test reads it its own way, then sends `notifications/initialized` in the session).
pub async fn http_initialize(
    http: &reqwest::Client,
    url: &str,
    protocol: &str,
    capabilities: Value,
    name: &str,
) -> (String, reqwest::Response) {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": protocol, "capabilities": capabilities,
        "clientInfo": {"name": name, "version": "0"}}});
    let resp = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .json(&init)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let session = resp.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    (session, resp)
}

/// Every JSON-RPC message of an SSE (or JSON) response, up to the answer.
pub async fn messages(resp: reqwest::Response) -> Vec<Value> {
    let json = resp
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("application/json"));
    if json {
        return vec![resp.json().await.unwrap()];
    }
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let read = async {
        let mut seen = Vec::new();
        while let Some(chunk) = body.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                for line in event.lines() {
                    if let Some(data) = line.strip_prefix("data:")
                        && let Ok(v) = serde_json::from_str::<Value>(data.trim())
                    {
                        let done = v.get("id").is_some() && v.get("method").is_none();
                        seen.push(v);
                        if done {
                            return seen;
                        }
                    }
                }
            }
        }
        panic!("no answer in the response: {seen:?}");
    };
    tokio::time::timeout(WAIT, read)
        .await
        .expect("an answer in time")
}

/// The JSON-RPC answer of a JSON or event-stream response.
pub async fn answer(resp: reqwest::Response) -> Value {
    messages(resp).await.pop().expect("an answer")
}

/// The client's side of an in-memory pipe the gateway serves as stdio.
pub struct Pipe {
    pub lines: tokio::io::Lines<tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    pub write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    /// The gateway's shutdown of this connection.
    pub shutdown: CancellationToken,
    /// The gateway serving it, until the client closes its side or `shutdown` fires.
    pub serving: tokio::task::JoinHandle<Result<(), toolwarden_mcp::GatewayError>>,
}

/// Serves one client over an in-memory pipe of `size` bytes each way, as on stdio.
pub fn serve_pipe(gateway: &Arc<Gateway>, size: usize) -> Pipe {
    use tokio::io::AsyncBufReadExt as _;
    let (client_io, gateway_io) = tokio::io::duplex(size);
    let (gr, gw) = tokio::io::split(gateway_io);
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn({
        let (gateway, shutdown) = (gateway.clone(), shutdown.clone());
        async move { gateway.serve_io(gr, gw, shutdown).await }
    });
    let (r, write) = tokio::io::split(client_io);
    Pipe {
        lines: tokio::io::BufReader::new(r).lines(),
        write,
        shutdown,
        serving,
    }
}
