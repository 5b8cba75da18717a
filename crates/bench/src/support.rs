//! What the gateway benchmark's rows share: starting and stopping the processes measured,
//! rmcp clients of them, and running calls at a concurrency into a row.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub(crate) type Client = RunningService<RoleClient, ()>;

/// One row of the table.
pub(crate) struct Row {
    pub(crate) path: &'static str,
    pub(crate) concurrency: usize,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) per_second: f64,
}

pub(crate) async fn stdio_client(mut cmd: Command) -> Result<Client> {
    cmd.stderr(Stdio::null()).kill_on_drop(true);
    // Dies with the benchmark, even when the benchmark is killed.
    toolwarden_process::isolate(&mut cmd);
    ready(().serve(TokioChildProcess::new(cmd)?).await?).await
}

/// `toolwarden serve` with `config` on a free port, once it lists the echo tool; its address.
pub(crate) async fn start_serve(toolwarden: &Path, config: &Path) -> Result<(Child, String)> {
    let mut cmd = Command::new(toolwarden);
    cmd.arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .env("RUST_LOG", "warn");
    let (serve, addr) = spawn_printing_addr(&mut cmd, true).await?;
    wait_for_tools(&addr).await?;
    Ok((serve, addr))
}

/// Waits until the client sees the echo tool.
pub(crate) async fn ready(client: Client) -> Result<Client> {
    for _ in 0..600 {
        if client
            .peer()
            .list_all_tools()
            .await?
            .iter()
            .any(|t| t.name == "echo")
        {
            return Ok(client);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the echo tool never appeared")
}

/// Starts a process that announces its bound address (`tw-test-server --http` on its first stdout
/// line; `toolwarden serve` in a `listening on http://ADDR` line on stderr).
pub(crate) async fn spawn_printing_addr(
    cmd: &mut Command,
    on_stderr: bool,
) -> Result<(Child, String)> {
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    toolwarden_process::isolate(cmd);
    if on_stderr {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    }
    let mut child = cmd.spawn()?;
    let pipe: Box<dyn tokio::io::AsyncRead + Unpin + Send> = if on_stderr {
        Box::new(child.stderr.take().context("stderr")?)
    } else {
        Box::new(child.stdout.take().context("stdout")?)
    };
    let mut lines = BufReader::new(pipe).lines();
    let addr = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await? {
            let found = match line.split_once("http://") {
                Some((_, rest)) => rest.split(['/', ' ']).next().map(str::to_owned),
                None if !on_stderr => Some(line.trim().trim_start_matches("http://").to_owned()),
                None => None,
            };
            if let Some(addr) = found.filter(|a| a.contains(':')) {
                return Ok::<_, anyhow::Error>(addr);
            }
        }
        bail!("the process exited before saying where it listens")
    })
    .await??;
    // Keep draining so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, addr))
}

/// Stops a process the benchmark started (SIGTERM, then a kill after 10 s).
pub(crate) async fn stop(child: &mut Child) {
    crate::echo_serve::stop(child, Duration::from_secs(10)).await;
}

pub(crate) use crate::echo_serve::wait_for_tools;

/// Runs `n` calls (after a warm-up) with `concurrency` workers; latencies are per call.
pub(crate) async fn run<F, Fut>(
    path: &'static str,
    concurrency: usize,
    n: usize,
    one: F,
) -> Result<Row>
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    for _ in 0..(n / 10).max(200) {
        one().await?;
    }
    let (lat, elapsed) = batch(concurrency, n, one).await?;
    let row = Row::new(path, concurrency, lat, elapsed);
    eprintln!(
        "{path} c={concurrency}: p50 {:?} p99 {:?} {:.0}/s",
        row.p50, row.p99, row.per_second
    );
    Ok(row)
}

/// Runs `n` calls with `concurrency` workers (inline at concurrency 1): each call's latency,
/// and the wall time of the whole batch.
pub(crate) async fn batch<F, Fut>(
    concurrency: usize,
    n: usize,
    one: F,
) -> Result<(Vec<Duration>, Duration)>
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let started = Instant::now();
    if concurrency == 1 {
        let mut lat = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            one().await?;
            lat.push(t.elapsed());
        }
        return Ok((lat, started.elapsed()));
    }
    let per_worker = n / concurrency;
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let one = one.clone();
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_worker);
            for _ in 0..per_worker {
                let t = Instant::now();
                one().await?;
                lat.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for w in workers {
        all.extend(w.await??);
    }
    Ok((all, started.elapsed()))
}

impl Row {
    /// A row from every call's latency and the wall time they took together (summed over
    /// batches when a row is measured in several).
    pub(crate) fn new(
        path: &'static str,
        concurrency: usize,
        mut lat: Vec<Duration>,
        elapsed: Duration,
    ) -> Row {
        lat.sort();
        let at = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
        Row {
            path,
            concurrency,
            p50: at(0.5),
            p99: at(0.99),
            per_second: lat.len() as f64 / elapsed.as_secs_f64(),
        }
    }
}

/// Calls `a` and `b` one after the other (`a` first on even rounds, `b` on odd ones), `n`
/// times each after a warm-up; one row each.
pub(crate) async fn paired<A, FA, B, FB>(
    paths: [&'static str; 2],
    n: usize,
    a: A,
    b: B,
) -> Result<Vec<Row>>
where
    A: Fn() -> FA,
    FA: std::future::Future<Output = Result<()>>,
    B: Fn() -> FB,
    FB: std::future::Future<Output = Result<()>>,
{
    for _ in 0..(n / 10).max(200) {
        a().await?;
        b().await?;
    }
    let (mut la, mut lb) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        for first in [i % 2 == 0, i % 2 != 0] {
            let t = Instant::now();
            if first {
                a().await?;
                la.push(t.elapsed());
            } else {
                b().await?;
                lb.push(t.elapsed());
            }
        }
    }
    Ok([(paths[0], la), (paths[1], lb)]
        .into_iter()
        .map(|(path, lat)| {
            let total: Duration = lat.iter().sum();
            let row = Row::new(path, 1, lat, total);
            eprintln!("{path}: p50 {:?} p99 {:?}", row.p50, row.p99);
            row
        })
        .collect())
}
