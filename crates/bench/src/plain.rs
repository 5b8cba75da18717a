//! A plain client of a Streamable HTTP session: reqwest with its connection pool, no MCP SDK.

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// A Streamable HTTP session from a plain HTTP client (reqwest with its connection pool, no MCP
/// SDK): one POST per call, the whole response read (JSON or an event stream). What it measures
/// is the server's side without an SDK client's own machinery.
#[derive(Clone)]
pub(crate) struct PlainMcp {
    http: reqwest::Client,
    url: String,
    session: String,
    next: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl PlainMcp {
    pub(crate) async fn open(url: &str) -> Result<PlainMcp> {
        let http = reqwest::Client::new();
        let init = http
            .post(url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "gateway-bench", "version": "1"}}})
                .to_string(),
            )
            .send()
            .await?;
        let session = init
            .headers()
            .get("mcp-session-id")
            .context("no mcp-session-id on the initialize response")?
            .to_str()?
            .to_owned();
        init.bytes().await?;
        let plain = PlainMcp {
            http,
            url: url.to_owned(),
            session,
            next: std::sync::Arc::default(),
        };
        plain
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        Ok(plain)
    }

    async fn post(&self, body: Value) -> Result<String> {
        let r = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", "2025-06-18")
            .body(body.to_string())
            .send()
            .await?;
        Ok(r.text().await?)
    }

    /// [`call`](Self::call) as a closure for [`run`].
    pub(crate) fn caller(
        self,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>
    + Clone
    + Send
    + Sync
    + 'static {
        move || {
            let plain = self.clone();
            Box::pin(async move { plain.call().await })
        }
    }

    pub(crate) async fn call(&self) -> Result<()> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let text = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "hello"}}}))
            .await?;
        if !text.contains("\"isError\":false") {
            bail!("echo failed: {text}");
        }
        Ok(())
    }
}
