//! The rows with the official reference server, `@modelcontextprotocol/server-everything`
//! (pinned, installed into `node_modules` by `scripts/setup-test-deps.sh`), and rmcp's client
//! as an application would set it up: a pooled HTTP client that keeps its connections.
//!
//! Three ways to reach the server's `echo` tool, measured side by side in one run: straight to
//! the server over stdio; through `toolwarden serve`'s `/mcp` (the server behind it over
//! stdio) in one MCP session; and through it in 16 sessions, the calls spread over them.
//!
//! The direct row is the floor the others are read against, so it is measured the way the load
//! generator `mcp-load` measures a server, and no slower than rmcp's client can go:
//!
//! - the rows run on a runtime of their own with one worker thread ([`rows_on_one_worker`]),
//!   and every call is made from a task on that worker, never from the thread that blocks on
//!   the runtime, so a call and rmcp's service loop hand over on one thread;
//! - each path runs alone in a closed loop for a slice of time, the paths taking turns slice by
//!   slice (the first path moving one place each round), so each path sees the same machine
//!   but none waits, between two of its calls, for another path's call: a process that sleeps
//!   between calls pays for waking up on every one of them;
//! - a call is counted when it completes inside its slice's measured window, after a short
//!   settling time, as `mcp-load` counts it; no round waits for its slowest worker.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::Peer;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Map, json};
use tokio::process::Command;
use tokio::time::Instant;

use crate::cpu::{machine_cpu, process_cpu_seconds};
use crate::support::{Client, Row, batch, ready, start_serve, stdio_client, stop};

/// One call, as every path of a comparison makes it.
type Caller =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send + Sync + 'static>;

/// How long each path runs alone before the next takes its turn, and how much of the start of
/// each turn is not counted (the path's processes have slept through the other paths' turns).
const SLICE: Duration = Duration::from_millis(500);
const SETTLE: Duration = Duration::from_millis(50);

/// [`rows`] on a tokio runtime of their own, multi-threaded with one worker (as `mcp-load`
/// runs by default), the whole measurement a task on that worker. The runtime lives on a
/// blocking thread of the caller's runtime, whose own workers sleep meanwhile.
pub(crate) async fn rows_on_one_worker(
    toolwarden: PathBuf,
    tmp: PathBuf,
    calls: usize,
) -> Result<(Vec<Row>, String)> {
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        runtime.block_on(async move { tokio::spawn(rows(toolwarden, tmp, calls)).await? })
    })
    .await?
}

/// The rows: at concurrency 1, direct and through toolwarden; at concurrency 16, direct and
/// through toolwarden in 1 and in 16 sessions. At least `calls` per row at concurrency 16, a
/// quarter of it at concurrency 1 ([`alternate`]). Then, for each path at concurrency 16, where
/// its CPU went (a markdown table, [`cpu_split`]).
async fn rows(toolwarden: PathBuf, tmp: PathBuf, calls: usize) -> Result<(Vec<Row>, String)> {
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
    let (mut serve, addr) = start_serve(&toolwarden, &config).await?;
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
            [
                direct_call.clone(),
                through_one.clone(),
                through_sixteen.clone(),
            ],
        )
        .await?,
    );
    let serve_pid = serve.id().context("toolwarden serve has exited")?;
    let mut split = String::from(
        "| path (concurrency 16, one path at a time) | calls/s | benchmark (its rmcp clients) | toolwarden | Node server behind toolwarden | Node server, direct | idle (both cores) |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (path, caller) in [
        ("everything: direct stdio", direct_call),
        ("everything: through toolwarden /mcp", through_one),
        (
            "everything: through toolwarden /mcp, 16 sessions",
            through_sixteen,
        ),
    ] {
        split.push_str(&cpu_split(path, serve_pid, calls, caller).await?);
    }
    for client in one_session.into_iter().chain(sixteen) {
        client.cancel().await?;
    }
    direct.cancel().await?;
    stop(&mut serve).await;
    Ok((rows, split))
}

/// One path alone at concurrency 16 for `n` calls (after a warm-up), and the CPU each process
/// spent per call meanwhile, from `/proc` (user and system time): the benchmark's own (its rmcp
/// clients), `toolwarden serve`'s, the Node server's behind it, the direct Node server's, and
/// the machine's idle time. One markdown row, in µs per call. The rows with paths side by side
/// are the fair comparison; this says where one path's time goes.
async fn cpu_split(path: &str, serve: u32, n: usize, caller: Caller) -> Result<String> {
    let warm = caller.clone();
    batch(16, (n / 10).max(200), move || warm()).await?;
    let before = Processes::now(serve)?;
    let (_, elapsed) = batch(16, n, move || caller()).await?;
    let after = Processes::now(serve)?;
    let per_call = |a: f64, b: f64| (a - b) / n as f64 * 1e6;
    Ok(format!(
        "| {path} | {:.0} | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} µs |\n",
        n as f64 / elapsed.as_secs_f64(),
        per_call(after.bench, before.bench),
        per_call(after.toolwarden, before.toolwarden),
        per_call(after.behind, before.behind),
        per_call(after.direct, before.direct),
        per_call(after.idle, before.idle),
    ))
}

/// CPU seconds so far of the processes of a run, and the machine's idle seconds.
struct Processes {
    bench: f64,
    toolwarden: f64,
    /// Everything `toolwarden serve` started (the Node server).
    behind: f64,
    /// The benchmark's other children (the direct Node server).
    direct: f64,
    idle: f64,
}

impl Processes {
    fn now(serve: u32) -> Result<Self> {
        let me = std::process::id();
        let children = children()?;
        let tree = |root: u32| {
            let mut all = vec![root];
            let mut i = 0;
            while let Some(&pid) = all.get(i) {
                all.extend(children.iter().filter(|c| c.1 == pid).map(|c| c.0));
                i += 1;
            }
            all
        };
        let behind = tree(serve);
        let sum = |pids: &[u32]| -> f64 {
            // A process that has just exited counts nothing.
            pids.iter()
                .map(|&p| process_cpu_seconds(p).unwrap_or(0.0))
                .sum()
        };
        let direct: Vec<u32> = tree(me)
            .into_iter()
            .filter(|p| *p != me && !behind.contains(p))
            .collect();
        Ok(Processes {
            bench: process_cpu_seconds(me)?,
            toolwarden: process_cpu_seconds(serve)?,
            behind: sum(&behind[1..]),
            direct: sum(&direct),
            idle: machine_cpu()?.idle_s,
        })
    }
}

/// Every process as (pid, parent pid), from `/proc`.
fn children() -> Result<Vec<(u32, u32)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok());
        if let Some(parent) = parent {
            out.push((pid, parent));
        }
    }
    Ok(out)
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
/// turn. The answer is checked where it is, without copying it.
fn echo(clients: &[Client]) -> Caller {
    let peers: Arc<[Peer<rmcp::RoleClient>]> = clients.iter().map(|c| c.peer().clone()).collect();
    let next = Arc::new(AtomicUsize::new(0));
    static MESSAGE: AtomicU64 = AtomicU64::new(0);
    Arc::new(move || {
        let peer = peers[next.fetch_add(1, Ordering::Relaxed) % peers.len()].clone();
        Box::pin(async move {
            let message = format!("hello {}", MESSAGE.fetch_add(1, Ordering::Relaxed));
            let mut args = Map::new();
            args.insert("message".into(), json!(message));
            let r = peer
                .call_tool(CallToolRequestParams::new("echo").with_arguments(args))
                .await?;
            let echoed = r
                .content
                .first()
                .and_then(|c| c.as_text())
                .is_some_and(|t| t.text.contains(message.as_str()));
            if r.is_error == Some(true) || !echoed {
                bail!("echo failed: {r:?}");
            }
            Ok(())
        })
    })
}

/// The paths' rows at `concurrency`: after a warm-up of each, the paths take turns, each alone
/// for a [`SLICE`] in a closed loop ([`slice`]), the first path of a round moving one place
/// each round, until every path has at least `n` calls counted (and at least three rounds).
async fn alternate<const N: usize>(
    paths: [&'static str; N],
    concurrency: usize,
    n: usize,
    callers: [Caller; N],
) -> Result<Vec<Row>> {
    for caller in &callers {
        slice(concurrency, Duration::from_secs(1), Duration::ZERO, caller).await?;
    }
    let mut lat: [Vec<Duration>; N] = std::array::from_fn(|_| Vec::with_capacity(n));
    let mut elapsed = [Duration::ZERO; N];
    let mut round = 0;
    while round < 3 || lat.iter().any(|l| l.len() < n) {
        for k in 0..N {
            let i = (round + k) % N;
            let (l, e) = slice(concurrency, SETTLE, SLICE, &callers[i]).await?;
            lat[i].extend(l);
            elapsed[i] += e;
        }
        round += 1;
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

/// `concurrency` tasks calling `caller` in a closed loop (each call as soon as its last one
/// ends) for `settle` + `measure`. A call counts when it completes inside the measured window
/// (the last `measure`); no task starts a call after it. Each counted call's latency, and the
/// window's length.
async fn slice(
    concurrency: usize,
    settle: Duration,
    measure: Duration,
    caller: &Caller,
) -> Result<(Vec<Duration>, Duration)> {
    let from = Instant::now() + settle;
    let to = from + measure;
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let caller = caller.clone();
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let start = Instant::now();
                if start >= to {
                    break;
                }
                caller().await?;
                let end = Instant::now();
                if end >= from && end <= to {
                    lat.push(end - start);
                }
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await??);
    }
    Ok((all, measure))
}
