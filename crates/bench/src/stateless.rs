//! The stateless rows: the same `tools/call` through `toolwarden serve` at `/mcp` from a client of
//! the handshake era (`initialize`, then calls in its session) and from a stateless client of
//! 2026-07-28 (no session: every request carries its `_meta` envelope and the `Mcp-Method` and
//! `Mcp-Name` headers), side by side, one call each in turn. All are plain clients (reqwest with
//! its connection pool, no MCP SDK), so the difference is the gateway's own.
//!
//! A second pair puts the stateless call beside the same call carrying a log level in its
//! envelope (`io.modelcontextprotocol/logLevel`), which the gateway leaves to rmcp's path: what
//! the gateway's own stateless path saves.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};
use serde_json::json;

use crate::cpu::process_cpu_seconds;
use crate::plain::PlainMcp;
use crate::support::{Row, paired, start_serve, stop};

/// The protocol version of the stateless client.
const V: &str = "2026-07-28";

/// `[handshake, stateless]`, each `n` calls at concurrency 1, alternating.
pub(crate) async fn rows(toolwarden: &Path, config: &Path, n: usize) -> Result<Vec<Row>> {
    let (mut serve, addr) = start_serve(toolwarden, config).await?;
    let url = format!("http://{addr}/mcp");
    let handshake = PlainMcp::open(&url).await?;
    let stateless = PlainStateless::new(&url, None);
    let on_rmcp = PlainStateless::new(&url, Some("emergency"));
    let mut rows = paired(
        [
            "HTTP paired: handshake client, through toolwarden /mcp",
            "HTTP paired: stateless 2026-07-28 client, through toolwarden /mcp",
        ],
        n,
        || handshake.call(),
        || stateless.call(),
    )
    .await;
    if let Ok(rows) = rows.as_mut() {
        match paired(
            [
                "HTTP paired: stateless client with a log level (rmcp's path), through toolwarden /mcp",
                "HTTP paired: stateless client (the gateway's path), through toolwarden /mcp",
            ],
            n,
            || on_rmcp.call(),
            || stateless.call(),
        )
        .await
        {
            Ok(more) => rows.extend(more),
            Err(e) => {
                stop(&mut serve).await;
                return Err(e);
            }
        }
    }
    if rows.is_ok()
        && let Some(pid) = serve.id()
        && let Err(e) = cpu_per_call(pid, n, &handshake, &stateless).await
    {
        stop(&mut serve).await;
        return Err(e);
    }
    stop(&mut serve).await;
    rows
}

/// What a call costs toolwarden itself, apart from the client: the CPU time of the `serve`
/// process (user and system, from `/proc`) over blocks of handshake calls and of stateless
/// calls, alternating, five blocks of `n` calls each; printed in µs per call.
async fn cpu_per_call(
    pid: u32,
    n: usize,
    handshake: &PlainMcp,
    stateless: &PlainStateless,
) -> Result<()> {
    let mut spent = [0.0f64; 2];
    for _ in 0..5 {
        for (kind, slot) in spent.iter_mut().enumerate() {
            let before = process_cpu_seconds(pid)?;
            for _ in 0..n {
                if kind == 0 {
                    handshake.call().await?;
                } else {
                    stateless.call().await?;
                }
            }
            *slot += process_cpu_seconds(pid)? - before;
        }
    }
    let per_call = |s: f64| s * 1e6 / (5 * n) as f64;
    println!(
        "toolwarden's CPU per call (5 × {n} calls of each, alternating): handshake {:.1} µs, stateless {:.1} µs",
        per_call(spent[0]),
        per_call(spent[1])
    );
    Ok(())
}

/// A stateless client of 2026-07-28 over Streamable HTTP: one POST per call, no session.
struct PlainStateless {
    http: reqwest::Client,
    url: String,
    next: Arc<AtomicU64>,
    /// `io.modelcontextprotocol/logLevel` in the envelope.
    log_level: Option<&'static str>,
}

impl PlainStateless {
    fn new(url: &str, log_level: Option<&'static str>) -> PlainStateless {
        PlainStateless {
            http: reqwest::Client::new(),
            url: url.to_owned(),
            next: Arc::default(),
            log_level,
        }
    }

    async fn call(&self) -> Result<()> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "echo",
            "arguments": {"text": "hello"},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": V,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "gateway-bench", "version": "1"},
            },
        }});
        if let Some(level) = self.log_level {
            body["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = json!(level);
        }
        let text = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", V)
            .header("mcp-method", "tools/call")
            .header("mcp-name", "echo")
            .body(body.to_string())
            .send()
            .await?
            .text()
            .await?;
        if !text.contains("\"isError\":false") {
            bail!("echo failed: {text}");
        }
        Ok(())
    }
}
