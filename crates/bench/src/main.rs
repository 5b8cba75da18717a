//! The gateway benchmark: `tools/call` to an echo tool, direct to the server versus through
//! toolwarden, over stdio and over HTTP, at concurrency 1 and 32.
//!
//! ```sh
//! cargo build --release -p toolwarden -p toolwarden-testkit -p toolwarden-bench
//! "${CARGO_TARGET_DIR:-target}/release/gateway-bench" [CALLS]
//! ```
//!
//! The stateless row (`stateless.rs`) calls through `/mcp` from a handshake client and from a
//! stateless 2026-07-28 client side by side.
//!
//! The last rows (`everything.rs`) put the official reference server,
//! `@modelcontextprotocol/server-everything` (`scripts/setup-test-deps.sh` installs it), behind
//! `toolwarden serve` and call it with rmcp's client on a pooled connection, side by side with the
//! same client straight to the server over stdio, at concurrency 1 and 16, and end with a
//! second table: each of those paths alone at concurrency 16, and the CPU every process spent
//! per call meanwhile. Those rows run on a one-worker runtime of their own, each path alone in
//! turns of half a second, so that the direct row is as fast as rmcp's client goes (the other
//! rows keep the two-worker runtime below, and call inline at concurrency 1).
//!
//! It finds `toolwarden` and `tw-test-server` next to itself, writes a temporary config, starts
//! every process it measures, and prints one markdown table: p50 and p99 latency seen by the
//! client and calls per second. Each row warms up first. The machine is what it is: compare rows
//! of one run, not runs of different days.
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a benchmark measures wall time"
)]

mod cpu;
mod echo_serve;
mod everything;
mod plain;
mod stateless;
mod support;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{Map, Value, json};
use tokio::process::{Child, Command};

use echo_serve::{echo_config, sibling};
use plain::PlainMcp;
use support::{
    Client, Row, paired, ready, run, spawn_printing_addr, start_serve, stdio_client, stop,
};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let calls: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20_000);
    // An optional second argument keeps only the rows whose path contains it (e.g. `stdio`).
    let only = std::env::args().nth(2).unwrap_or_default();
    let wanted = |path: &str| path.contains(only.as_str());
    let dir = std::env::current_exe()?
        .parent()
        .context("the benchmark's directory")?
        .to_path_buf();
    let toolwarden = sibling(&dir, "toolwarden")?;
    let server = sibling(&dir, "tw-test-server")?;
    let tmp = std::env::temp_dir().join(format!("toolwarden-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let config = tmp.join("toolwarden.toml");
    // The gateway's own cost; the audit trail's is measured by store-bench.
    std::fs::write(&config, echo_config(&server, "enabled = false"))?;

    let mut rows = Vec::new();
    for concurrency in [1, 32] {
        let n = if concurrency == 1 { calls / 4 } else { calls };
        // stdio, direct and through `toolwarden mcp`.
        if wanted("stdio: direct") {
            let direct = stdio_client(Command::new(&server)).await?;
            rows.push(measure_mcp("stdio: direct", &direct, concurrency, n).await?);
            direct.cancel().await?;
        }
        if wanted("stdio: through toolwarden mcp") {
            let gateway = gateway_stdio(&toolwarden, &config).await?;
            rows.push(
                measure_mcp("stdio: through toolwarden mcp", &gateway, concurrency, n).await?,
            );
            gateway.cancel().await?;
        }
        // Streamable HTTP, direct and through `toolwarden serve` at /mcp.
        if wanted("HTTP: direct") {
            let (mut child, addr) = start_http_server(&server).await?;
            let direct = http_client(&format!("http://{addr}/mcp")).await?;
            rows.push(measure_mcp("HTTP: direct", &direct, concurrency, n).await?);
            direct.cancel().await?;
            let plain = PlainMcp::open(&format!("http://{addr}/mcp")).await?;
            rows.push(run("HTTP: direct, plain client", concurrency, n, plain.caller()).await?);
            stop(&mut child).await;
        }
        let through_mcp = wanted("HTTP: through toolwarden /mcp");
        let through_api = wanted("HTTP: through toolwarden POST /v1/turns");
        if through_mcp || through_api {
            let (mut serve, addr) = start_serve(&toolwarden, &config).await?;
            if through_mcp {
                let gateway = http_client(&format!("http://{addr}/mcp")).await?;
                rows.push(
                    measure_mcp("HTTP: through toolwarden /mcp", &gateway, concurrency, n).await?,
                );
                gateway.cancel().await?;
                let plain = PlainMcp::open(&format!("http://{addr}/mcp")).await?;
                rows.push(
                    run(
                        "HTTP: through toolwarden /mcp, plain client",
                        concurrency,
                        n,
                        plain.caller(),
                    )
                    .await?,
                );
            }
            if through_api {
                rows.push(
                    measure_api(
                        "HTTP: through toolwarden POST /v1/turns",
                        &addr,
                        concurrency,
                        n,
                    )
                    .await?,
                );
            }
            stop(&mut serve).await;
        }
    }
    // Direct and through toolwarden side by side, one call each in turn: both see the same
    // machine, which on a shared one drifts by tens of percent within minutes.
    let mut added = Vec::new();
    if wanted("paired") {
        let pairs = paired_rows(&toolwarden, &server, &config, calls / 4).await?;
        for pair in pairs.chunks(2) {
            added.push((pair[1].path, micros(pair[1].p50) - micros(pair[0].p50)));
        }
        rows.extend(pairs);
    }
    // A handshake client and a stateless (2026-07-28) one through `/mcp`, side by side
    // (`stateless.rs`).
    if wanted("stateless") {
        let pairs = stateless::rows(&toolwarden, &config, calls / 4).await?;
        for pair in pairs.chunks(2) {
            added.push((pair[1].path, micros(pair[1].p50) - micros(pair[0].p50)));
        }
        rows.extend(pairs);
    }
    // The official reference server behind toolwarden, with rmcp's client on a pooled
    // connection (`everything.rs`).
    let mut cpu_split = None;
    if wanted("everything") {
        let (everything, split) =
            everything::rows_on_one_worker(toolwarden.clone(), tmp.clone(), calls).await?;
        rows.extend(everything);
        cpu_split = Some(split);
    }
    let _ = std::fs::remove_dir_all(&tmp);

    println!("| path | concurrency | p50 | p99 | calls/s |");
    println!("|---|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} µs | {:.0} µs | {:.0} |",
            r.path,
            r.concurrency,
            r.p50.as_secs_f64() * 1e6,
            r.p99.as_secs_f64() * 1e6,
            r.per_second
        );
    }
    for (path, by) in added {
        println!("\nadded at p50 ({path}): {by:.0} µs");
    }
    if let Some(split) = cpu_split {
        println!("\nCPU per call, each path alone at concurrency 16:\n\n{split}");
    }
    Ok(())
}

/// One `echo` call through an rmcp client.
fn echo_call(
    client: &Client,
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    let peer = client.peer().clone();
    move || {
        let peer = peer.clone();
        Box::pin(async move {
            let r = peer
                .call_tool(CallToolRequestParams::new("echo").with_arguments(echo_args()))
                .await?;
            if r.is_error == Some(true) {
                bail!("echo failed: {r:?}");
            }
            Ok(())
        })
    }
}

/// The paired rows: stdio, HTTP with rmcp's client, HTTP with a plain client; each pair
/// `[direct, through toolwarden]` at concurrency 1.
async fn paired_rows(
    toolwarden: &Path,
    server: &Path,
    config: &Path,
    n: usize,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let direct = stdio_client(Command::new(server)).await?;
    let gateway = gateway_stdio(toolwarden, config).await?;
    rows.extend(
        paired(
            [
                "stdio paired: direct",
                "stdio paired: through toolwarden mcp",
            ],
            n,
            echo_call(&direct),
            echo_call(&gateway),
        )
        .await?,
    );
    direct.cancel().await?;
    gateway.cancel().await?;

    let (mut child, addr) = start_http_server(server).await?;
    let (mut serve, gw_addr) = start_serve(toolwarden, config).await?;
    let direct = http_client(&format!("http://{addr}/mcp")).await?;
    let gateway = http_client(&format!("http://{gw_addr}/mcp")).await?;
    rows.extend(
        paired(
            [
                "HTTP paired: direct",
                "HTTP paired: through toolwarden /mcp",
            ],
            n,
            echo_call(&direct),
            echo_call(&gateway),
        )
        .await?,
    );
    direct.cancel().await?;
    gateway.cancel().await?;
    let direct = PlainMcp::open(&format!("http://{addr}/mcp")).await?;
    let gateway = PlainMcp::open(&format!("http://{gw_addr}/mcp")).await?;
    rows.extend(
        paired(
            [
                "HTTP paired: direct, plain client",
                "HTTP paired: through toolwarden /mcp, plain client",
            ],
            n,
            || direct.call(),
            || gateway.call(),
        )
        .await?,
    );
    stop(&mut serve).await;
    stop(&mut child).await;
    Ok(rows)
}

/// A duration in microseconds, for differences that may be negative.
fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// An rmcp client of `toolwarden mcp` (over stdio) with `config`.
async fn gateway_stdio(toolwarden: &Path, config: &Path) -> Result<Client> {
    let mut cmd = Command::new(toolwarden);
    cmd.arg("mcp")
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "warn");
    stdio_client(cmd).await
}

/// `tw-test-server --http` on a free port, and its address.
async fn start_http_server(server: &Path) -> Result<(Child, String)> {
    spawn_printing_addr(Command::new(server).arg("--http").arg("127.0.0.1:0"), false).await
}

async fn http_client(url: &str) -> Result<Client> {
    ready(
        ().serve(StreamableHttpClientTransport::from_uri(url.to_owned()))
            .await?,
    )
    .await
}

fn echo_args() -> Map<String, Value> {
    let mut args = Map::new();
    args.insert("text".into(), json!("hello"));
    args
}

async fn measure_mcp(
    path: &'static str,
    client: &Client,
    concurrency: usize,
    n: usize,
) -> Result<Row> {
    run(path, concurrency, n, echo_call(client)).await
}

async fn measure_api(path: &'static str, addr: &str, concurrency: usize, n: usize) -> Result<Row> {
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/v1/turns");
    let body =
        json!({"calls": [{"id": "c1", "name": "echo", "input": {"text": "hello"}}]}).to_string();
    let one = move || {
        let (http, url, body) = (http.clone(), url.clone(), body.clone());
        async move {
            let r = http
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await?;
            let v: Value = r.json().await?;
            if v["results"][0]["is_error"] != json!(false) {
                bail!("echo failed: {v}");
            }
            Ok(())
        }
    };
    run(path, concurrency, n, one).await
}
