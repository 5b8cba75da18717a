//! Starting `toolwarden serve` in front of the echo server, and driving it with one-call turns.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a benchmark measures wall time"
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub(crate) use crate::echo_serve::sibling;

/// A config with the echo server and the given `[store]` table, in a directory of its own (on
/// PostgreSQL, the config file's path names the replica).
pub(crate) fn write_config(dir: &Path, tmp: &Path, name: &str, store: &str) -> Result<PathBuf> {
    let server = sibling(dir, "tw-test-server")?;
    let home = tmp.join(name);
    std::fs::create_dir_all(&home)?;
    let path = home.join("toolwarden.toml");
    std::fs::write(&path, crate::echo_serve::echo_config(&server, store))?;
    Ok(path)
}

/// `toolwarden serve` with `config` on a free port, once it lists the echo tool; its address.
pub(crate) async fn start_serve(dir: &Path, config: &Path) -> Result<(Child, String)> {
    start_binary(&sibling(dir, "toolwarden")?, config).await
}

/// [`start_serve`] with the `toolwarden` binary at `binary`.
pub(crate) async fn start_binary(binary: &Path, config: &Path) -> Result<(Child, String)> {
    let mut cmd = Command::new(binary);
    cmd.arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .env_remove("TOOLWARDEN_REPLICA")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    toolwarden_process::isolate(&mut cmd);
    let mut child = cmd.spawn()?;
    let mut lines = BufReader::new(child.stderr.take().context("stderr")?).lines();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if let Some((_, rest)) = line.split_once("listening on http://") {
                return Ok::<_, anyhow::Error>(rest.trim().to_owned());
            }
        }
        bail!("toolwarden serve exited before listening")
    })
    .await??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    crate::echo_serve::wait_for_tools(&addr).await?;
    Ok((child, addr))
}

/// Stops `toolwarden serve` (SIGTERM, then a kill after 20 s: a store may be writing).
pub(crate) async fn stop(child: &mut Child) {
    crate::echo_serve::stop(child, Duration::from_secs(20)).await;
}

/// One echo call as a one-call turn; the turn's id.
pub(crate) async fn one_turn(http: &reqwest::Client, url: &str, text: &str) -> Result<String> {
    let body = json!({"calls": [{"id": "c1", "name": "echo", "input": {"text": text}}]});
    let v: Value = http.post(url).json(&body).send().await?.json().await?;
    if v["results"][0]["is_error"] != json!(false) {
        bail!("echo failed: {v}");
    }
    Ok(v["turn_id"].as_str().unwrap_or_default().to_owned())
}

pub(crate) struct Measured {
    pub(crate) per_second: f64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
}

/// `n` calls with `concurrency` workers.
pub(crate) async fn measure(addr: &str, concurrency: usize, n: usize) -> Result<Measured> {
    measure_on(&[addr.to_owned()], concurrency, n).await
}

/// `n` calls with `concurrency` workers, worker `w` calling server `w mod addrs.len()`.
pub(crate) async fn measure_on(addrs: &[String], concurrency: usize, n: usize) -> Result<Measured> {
    let http = reqwest::Client::new();
    let per_worker = n / concurrency;
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..concurrency {
        let http = http.clone();
        let url = format!("http://{}/v1/turns", addrs[w % addrs.len()]);
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_worker);
            for i in 0..per_worker {
                let t = Instant::now();
                one_turn(&http, &url, &format!("w{w}-{i}")).await?;
                lat.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for w in workers {
        all.extend(w.await??);
    }
    let elapsed = started.elapsed();
    all.sort();
    let at = |p: f64| all[((all.len() - 1) as f64 * p) as usize];
    Ok(Measured {
        per_second: all.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.5),
        p99: at(0.99),
    })
}

/// The store's commits and the events they wrote so far, read from the server's `/metrics`
/// (`None` without a store).
pub(crate) async fn store_commits(addr: &str) -> Result<Option<(f64, f64)>> {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await?
        .text()
        .await?;
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
    };
    Ok(value("toolwarden_store_commits_total ")
        .zip(value("toolwarden_store_events_committed_total ")))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn file_size(path: &Path) -> u64 {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(path).map_or(0, |m| m.len()) + std::fs::metadata(wal).map_or(0, |m| m.len())
}
