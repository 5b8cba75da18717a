//! The rows with the official reference server, `@modelcontextprotocol/server-everything`
//! (pinned, installed into `node_modules` by `scripts/setup-test-deps.sh`), and rmcp's client
//! as an application would set it up: a pooled HTTP client that keeps its connections.
//!
//! Three ways to reach the server's `echo` tool, measured side by side in one run: straight to
//! the server over stdio; through `toolwarden serve`'s `/mcp` (the server behind it over
//! stdio) in one MCP session; and through it in 16 sessions, the calls spread over them. At
//! concurrency 1 the paths take turns call by call; at concurrency 16 in rounds of a few
//! hundred calls, the order rotating every round, so each path sees the same machine.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Result, bail};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::Peer;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Map, json};
use tokio::process::Command;

use crate::support::{Client, Row, batch, ready, start_serve, stdio_client, stop};

/// One call, as every path of a comparison makes it.
type Caller =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send + Sync + 'static>;

/// The rows: at concurrency 1, direct and through toolwarden; at concurrency 16, direct and
/// through toolwarden in 1 and in 16 sessions. `calls` per row at concurrency 16, a quarter of
/// it at concurrency 1.
pub(crate) async fn rows(toolwarden: &Path, tmp: &Path, calls: usize) -> Result<Vec<Row>> {
    let everything = everything_bin()?;
    let config = tmp.join("everything.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.everything]\ncommand = {:?}\nargs = [\"stdio\"]\n\n[gateway]\nprefix = false\n\n[defaults]\ntimeout = \"30s\"\n\n[defaults.loop]\nwarn_after = 0\nblock_after = 0\n\n[store]\nenabled = false\n",
            everything.display().to_string()
        ),
    )?;
    let mut server = Command::new(&everything);
    server.arg("stdio");
    let direct = stdio_client(server).await?;
    let (mut serve, addr) = start_serve(toolwarden, &config).await?;
    let url = format!("http://{addr}/mcp");
    // One pooled HTTP client for all sessions, as one application would have.
    let http = reqwest::Client::new();
    let one_session = vec![pooled_client(&http, &url).await?];
    let mut sixteen = Vec::new();
    for _ in 0..16 {
        sixteen.push(pooled_client(&http, &url).await?);
    }
    let direct_call = echo(std::slice::from_ref(&direct));
    let through_one = echo(&one_session);
    let through_sixteen = echo(&sixteen);

    let mut rows = alternate(
        [
            "everything: direct stdio",
            "everything: through toolwarden /mcp",
        ],
        1,
        calls / 4,
        1,
        [direct_call.clone(), through_one.clone()],
    )
    .await?;
    rows.extend(
        alternate(
            [
                "everything: direct stdio",
                "everything: through toolwarden /mcp",
                "everything: through toolwarden /mcp, 16 sessions",
            ],
            16,
            calls,
            400,
            [direct_call, through_one, through_sixteen],
        )
        .await?,
    );
    for client in one_session.into_iter().chain(sixteen) {
        client.cancel().await?;
    }
    direct.cancel().await?;
    stop(&mut serve).await;
    Ok(rows)
}

/// The server's launcher in the workspace's `node_modules`.
fn everything_bin() -> Result<PathBuf> {
    let bin =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../node_modules/.bin/mcp-server-everything");
    if !bin.exists() {
        bail!(
            "{} is missing: run scripts/setup-test-deps.sh (it installs the pinned \
             @modelcontextprotocol/server-everything)",
            bin.display()
        );
    }
    Ok(bin)
}

/// An rmcp client of `url` on `http`, a reqwest client that keeps its connections (rmcp's
/// default client opens one per request).
async fn pooled_client(http: &reqwest::Client, url: &str) -> Result<Client> {
    let transport = StreamableHttpClientTransport::with_client(
        http.clone(),
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()),
    );
    ready(().serve(transport).await?).await
}

/// `echo` with a message of its own every call (no two calls alike), through `clients` in
/// turn.
fn echo(clients: &[Client]) -> Caller {
    let peers: Arc<[Peer<rmcp::RoleClient>]> = clients.iter().map(|c| c.peer().clone()).collect();
    let next = Arc::new(AtomicUsize::new(0));
    static MESSAGE: AtomicU64 = AtomicU64::new(0);
    Arc::new(move || {
        let peer = peers[next.fetch_add(1, Ordering::Relaxed) % peers.len()].clone();
        Box::pin(async move {
            let mut args = Map::new();
            let n = MESSAGE.fetch_add(1, Ordering::Relaxed);
            args.insert("message".into(), json!(format!("hello {n}")));
            let r = peer
                .call_tool(CallToolRequestParams::new("echo").with_arguments(args))
                .await?;
            let text = serde_json::to_value(&r.content)?;
            if r.is_error == Some(true) || !text.to_string().contains(&format!("hello {n}")) {
                bail!("echo failed: {r:?}");
            }
            Ok(())
        })
    })
}

/// The paths' rows at `concurrency`: `n` calls each after a warm-up, in rounds of `round`
/// calls, every path once a round, the first path of a round moving one place each round.
async fn alternate<const N: usize>(
    paths: [&'static str; N],
    concurrency: usize,
    n: usize,
    round: usize,
    callers: [Caller; N],
) -> Result<Vec<Row>> {
    for caller in &callers {
        let caller = caller.clone();
        batch(concurrency, (n / 10).max(200), move || caller()).await?;
    }
    let mut lat: [Vec<Duration>; N] = std::array::from_fn(|_| Vec::with_capacity(n));
    let mut elapsed = [Duration::ZERO; N];
    for r in 0..n.div_ceil(round) {
        for k in 0..N {
            let i = (r + k) % N;
            let caller = callers[i].clone();
            let (l, e) = batch(concurrency, round, move || caller()).await?;
            lat[i].extend(l);
            elapsed[i] += e;
        }
    }
    Ok(paths
        .into_iter()
        .zip(lat)
        .zip(elapsed)
        .map(|((path, lat), elapsed)| {
            let row = Row::new(path, concurrency, lat, elapsed);
            eprintln!(
                "{path} c={concurrency}: p50 {:?} p99 {:?} {:.0}/s",
                row.p50, row.p99, row.per_second
            );
            row
        })
        .collect())
}
