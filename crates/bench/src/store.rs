//! The audit trail's benchmarks, on the real binary (figures in docs/PERFORMANCE.md):
//!
//! ```sh
//! cargo build --release -p toolwarden -p toolwarden-testkit -p toolwarden-bench
//! B="${CARGO_TARGET_DIR:-target}/release"
//! $B/store-bench speed [ROUNDS] [CALLS]     # store off / before_execution / async, side by side
//! $B/store-bench soak [RATE] [SECONDS]      # calls at RATE/s through POST /v1/turns; every event counted
//! $B/store-bench query [TURNS]              # toolwarden audit over a trail of TURNS ten-call turns
//! ```
//!
//! `speed` starts three `toolwarden serve`s — without a store, with `before_execution`, with
//! `async` — each in front of `tw-test-server`, and measures them in turn, round after round, in
//! a rotating order (the machine is noisy: alternating spreads its noise over all three): calls
//! per second at concurrency 32, and the median latency at concurrency 1, through
//! `POST /v1/turns` to an echo tool. It then reports each store's size per 1,000 calls.
//! `soak` checks that nothing is lost at a steady rate: after the run it counts every call's four
//! events in the database. `query` builds a trail of TURNS turns (ten calls each: about 2.2 events
//! per call) with the engine and the store as a library, then times `toolwarden audit` and the
//! reader's queries over it. Nothing here asserts a timing; it prints figures.
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a benchmark measures wall time"
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use toolwarden_core::protocol::{AuditQuery, StoreDurability, Timestamp, ToolCall};
use toolwarden_core::{AuditStore as _, Engine, InProcessTool, ToolError, TurnRequest};
use toolwarden_store::{AuditReader, SqliteStore, StoreOptions};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: u64| -> Result<u64> {
        args.get(i)
            .map(|s| s.parse().context("a number"))
            .transpose()
            .map(|v| v.unwrap_or(default))
    };
    let dir = std::env::current_exe()?
        .parent()
        .context("the benchmark's directory")?
        .to_path_buf();
    let tmp = std::env::temp_dir().join(format!("toolwarden-store-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = match args.first().map(String::as_str) {
        Some("speed") => speed(&dir, &tmp, arg(1, 5)? as usize, arg(2, 20_000)? as usize).await,
        Some("soak") => soak(&dir, &tmp, arg(1, 1000)?, arg(2, 60)?).await,
        Some("query") => query(&dir, &tmp, arg(1, 50_000)? as usize).await,
        _ => bail!(
            "usage: store-bench speed [ROUNDS] [CALLS] | soak [RATE] [SECONDS] | query [TURNS]"
        ),
    };
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn sibling(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{} is missing: build it first with `cargo build --release -p toolwarden -p toolwarden-testkit -p toolwarden-bench`",
            path.display()
        );
    }
    Ok(path)
}

/// A config with the echo server and the given `[store]` table.
fn write_config(dir: &Path, tmp: &Path, name: &str, store: &str) -> Result<PathBuf> {
    let server = sibling(dir, "tw-test-server")?;
    let path = tmp.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[servers.echo]\ncommand = {:?}\n\n[gateway]\nprefix = false\n\n[defaults]\ntimeout = \"30s\"\n\n[defaults.loop]\nwarn_after = 0\nblock_after = 0\n\n[store]\n{store}\n",
            server.display().to_string()
        ),
    )?;
    Ok(path)
}

/// `toolwarden serve` with `config` on a free port, once it lists the echo tool; its address.
async fn start_serve(dir: &Path, config: &Path) -> Result<(Child, String)> {
    let mut cmd = Command::new(sibling(dir, "toolwarden")?);
    cmd.arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .env("RUST_LOG", "warn")
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
    let http = reqwest::Client::new();
    for _ in 0..600 {
        if let Ok(r) = http.get(format!("http://{addr}/v1/tools")).send().await
            && let Ok(v) = r.json::<Value>().await
            && v["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == "echo"))
        {
            return Ok((child, addr));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("toolwarden serve did not list the echo tool")
}

async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .await;
    }
    if tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// One echo call as a one-call turn; the turn's id.
async fn one_turn(http: &reqwest::Client, url: &str, text: &str) -> Result<String> {
    let body = json!({"calls": [{"id": "c1", "name": "echo", "input": {"text": text}}]});
    let v: Value = http.post(url).json(&body).send().await?.json().await?;
    if v["results"][0]["is_error"] != json!(false) {
        bail!("echo failed: {v}");
    }
    Ok(v["turn_id"].as_str().unwrap_or_default().to_owned())
}

struct Measured {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

/// `n` calls with `concurrency` workers.
async fn measure(addr: &str, concurrency: usize, n: usize) -> Result<Measured> {
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/v1/turns");
    let per_worker = n / concurrency;
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..concurrency {
        let (http, url) = (http.clone(), url.clone());
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn file_size(path: &Path) -> u64 {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(path).map_or(0, |m| m.len()) + std::fs::metadata(wal).map_or(0, |m| m.len())
}

async fn speed(dir: &Path, tmp: &Path, rounds: usize, calls: usize) -> Result<()> {
    let modes = [
        ("store off", "enabled = false".to_owned()),
        (
            "before_execution",
            format!(
                "path = {:?}\ndurability = \"before_execution\"",
                tmp.join("before.db").display().to_string()
            ),
        ),
        (
            "async",
            format!(
                "path = {:?}\ndurability = \"async\"",
                tmp.join("async.db").display().to_string()
            ),
        ),
    ];
    let mut servers = Vec::new();
    for (name, store) in &modes {
        let config = write_config(dir, tmp, &name.replace(' ', "_"), store)?;
        servers.push(start_serve(dir, &config).await?);
    }
    // Warm-up: connections, the servers' first calls, SQLite's caches.
    for (_, addr) in &servers {
        measure(addr, 8, 2000).await?;
    }
    let mut c32: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let mut c1: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let mut c1_p99: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let mut added: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let mut ratio: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for round in 0..rounds {
        let mut tput = [0.0; 3];
        let mut lat = [0.0; 3];
        for k in 0..3 {
            let i = (round + k) % 3;
            let addr = &servers[i].1;
            let m = measure(addr, 32, calls).await?;
            tput[i] = m.per_second;
            let l = measure(addr, 1, calls / 8).await?;
            lat[i] = l.p50.as_secs_f64() * 1e6;
            c1_p99[i].push(l.p99.as_secs_f64() * 1e6);
            eprintln!(
                "round {round}: {:<16} c32 {:>7.0}/s (p50 {:?} p99 {:?})   c1 p50 {:>4.0} µs p99 {:>5.0} µs",
                modes[i].0,
                m.per_second,
                m.p50,
                m.p99,
                lat[i],
                l.p99.as_secs_f64() * 1e6
            );
        }
        for i in 0..3 {
            c32[i].push(tput[i]);
            c1[i].push(lat[i]);
            added[i].push(lat[i] - lat[0]);
            ratio[i].push(tput[i] / tput[0]);
        }
    }
    let mut sizes = Vec::new();
    for (i, (child, _)) in servers.iter_mut().enumerate() {
        stop(child).await;
        if i > 0 {
            let path = tmp.join(if i == 1 { "before.db" } else { "async.db" });
            let db = rusqlite::Connection::open(&path)?;
            let calls: i64 = db.query_row("SELECT count(*) FROM calls", [], |r| r.get(0))?;
            let events: i64 = db.query_row("SELECT count(*) FROM events", [], |r| r.get(0))?;
            drop(db);
            sizes.push((modes[i].0, calls, events, file_size(&path)));
        }
    }
    println!(
        "| store | calls/s at concurrency 32 | × store off | p50 at concurrency 1 | added p50 | p99 at concurrency 1 |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for i in 0..3 {
        println!(
            "| {} | {:.0} | {:.2} | {:.0} µs | {:+.0} µs | {:.0} µs |",
            modes[i].0,
            median(c32[i].clone()),
            median(ratio[i].clone()),
            median(c1[i].clone()),
            median(added[i].clone()),
            median(c1_p99[i].clone()),
        );
    }
    println!(
        "\n(medians of {rounds} rounds; each round measures {calls} calls at concurrency 32 and {} at concurrency 1 per store)",
        calls / 8
    );
    println!("\n| store | calls recorded | events | file size | per 1,000 calls |");
    println!("|---|---:|---:|---:|---:|");
    for (name, calls, events, size) in sizes {
        println!(
            "| {name} | {calls} | {events} | {:.1} MiB | {:.0} KiB |",
            size as f64 / 1048576.0,
            size as f64 / 1024.0 / (calls.max(1) as f64 / 1000.0)
        );
    }
    Ok(())
}

async fn soak(dir: &Path, tmp: &Path, rate: u64, seconds: u64) -> Result<()> {
    let db_path = tmp.join("soak.db");
    let config = write_config(
        dir,
        tmp,
        "soak",
        &format!("path = {:?}", db_path.display().to_string()),
    )?;
    let (mut child, addr) = start_serve(dir, &config).await?;
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/v1/turns");
    let in_flight = Arc::new(tokio::sync::Semaphore::new(512));
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity((rate * seconds) as usize);
    for i in 0..rate * seconds {
        tick.tick().await;
        let permit = in_flight.clone().acquire_owned().await?;
        let (http, url) = (http.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let id = one_turn(&http, &url, &format!("soak-{i}")).await;
            drop(permit);
            id.map(|id| (id, t.elapsed()))
        }));
    }
    let sent = started.elapsed();
    let mut turns = Vec::with_capacity(tasks.len());
    let mut lat = Vec::with_capacity(tasks.len());
    for t in tasks {
        let (id, l) = t.await??;
        turns.push(id);
        lat.push(l);
    }
    let took = started.elapsed();
    let metrics = http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let waits: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("toolwarden_store_queue"))
        .collect();
    stop(&mut child).await;
    lat.sort();
    let db = rusqlite::Connection::open(&db_path)?;
    let (count, max): (i64, i64) =
        db.query_row("SELECT count(*), max(seq) FROM events", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    let mut per_turn = db.prepare(
        "SELECT count(*) FROM events e JOIN turns t ON t.id = e.turn_row WHERE t.turn_id = ?1",
    )?;
    let mut short = 0;
    for id in &turns {
        let n: i64 = per_turn.query_row([id], |r| r.get(0))?;
        if n != 4 {
            short += 1;
        }
    }
    println!(
        "soak: {} calls sent in {:.1} s ({:.0}/s; all answered after {:.1} s), latency p50 {:?} p99 {:?}",
        turns.len(),
        sent.as_secs_f64(),
        turns.len() as f64 / sent.as_secs_f64(),
        took.as_secs_f64(),
        lat[lat.len() / 2],
        lat[(lat.len() - 1) * 99 / 100]
    );
    println!(
        "soak: {count} events stored, max seq {max} (holes: {}), turns without their 4 events: {short}; file {:.1} MiB",
        max - count,
        file_size(&db_path) as f64 / 1048576.0
    );
    for w in waits {
        println!("soak: {w}");
    }
    if short > 0 || max != count {
        bail!("events were lost");
    }
    Ok(())
}

async fn query(dir: &Path, tmp: &Path, turns: usize) -> Result<()> {
    let path = tmp.join("query.db");
    let built = Instant::now();
    {
        let store = Arc::new(SqliteStore::open(StoreOptions {
            durability: StoreDurability::Async,
            queue_capacity: 65_536,
            ..StoreOptions::new(&path)
        })?);
        let engine = Engine::builder().store(store.clone()).build();
        for t in 0..10 {
            engine.register(InProcessTool::new(
                format!("tool{t}"),
                "A tool",
                json!({"type": "object"}),
                move |input, _ctx| async move {
                    if t == 9 {
                        Err(ToolError::new("tool9 always fails"))
                    } else {
                        Ok::<_, ToolError>(input.to_string())
                    }
                },
            ));
        }
        let workers = 8;
        let mut tasks = Vec::new();
        for w in 0..workers {
            let engine = engine.clone();
            tasks.push(tokio::spawn(async move {
                for n in (w..turns).step_by(workers) {
                    let calls = (0..10)
                        .map(|c| {
                            ToolCall::new(
                                format!("c{c}"),
                                format!("tool{c}"),
                                json!({"turn": n, "path": format!("/srv/data/{n}/{c}.txt")}),
                            )
                        })
                        .collect();
                    let req = TurnRequest::new(format!("s{}", n % 1000), calls);
                    engine.run_turn(req).await?;
                }
                Ok::<_, anyhow::Error>(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        engine.store_caught_up(Duration::from_secs(600)).await?;
        store.close().await;
    }
    let reader = AuditReader::open(&path)?;
    let events = reader.last_seq()?;
    println!(
        "query: a trail of {turns} turns, {} calls, {events} events, {:.0} MiB, built in {:.0} s",
        turns * 10,
        file_size(&path) as f64 / 1048576.0,
        built.elapsed().as_secs_f64()
    );
    let some_turn = reader
        .calls(&AuditQuery {
            limit: 1,
            ..AuditQuery::default()
        })?
        .calls
        .first()
        .map(|c| c.turn_id.clone())
        .context("a turn")?;
    let hour_ago = Timestamp::from_unix_millis(Timestamp::now().unix_millis() - 60_000);
    let cases: Vec<(&str, AuditQuery, bool)> = vec![
        (
            "calls, no filter (newest 50)",
            AuditQuery {
                limit: 50,
                ..AuditQuery::default()
            },
            true,
        ),
        (
            "calls of a tool",
            AuditQuery {
                tool: Some("tool3".into()),
                limit: 50,
                ..AuditQuery::default()
            },
            true,
        ),
        (
            "calls with a status (error)",
            AuditQuery {
                status: Some("error".into()),
                limit: 50,
                ..AuditQuery::default()
            },
            true,
        ),
        (
            "calls of a session",
            AuditQuery {
                session: Some("s42".into()),
                limit: 50,
                ..AuditQuery::default()
            },
            true,
        ),
        (
            "calls of a turn",
            AuditQuery {
                turn: Some(some_turn.clone()),
                limit: 50,
                ..AuditQuery::default()
            },
            true,
        ),
        (
            "calls with an id (c7)",
            AuditQuery {
                call: Some("c7".into()),
                limit: 50,
                ..AuditQuery::default()
            },
            true,
        ),
        (
            "calls since a minute ago",
            AuditQuery {
                since: Some(hour_ago),
                limit: 50,
                ..AuditQuery::default()
            },
            true,
        ),
        (
            "events of a turn",
            AuditQuery {
                turn: Some(some_turn),
                limit: 100,
                ..AuditQuery::default()
            },
            false,
        ),
        (
            "events of a session",
            AuditQuery {
                session: Some("s42".into()),
                limit: 100,
                ..AuditQuery::default()
            },
            false,
        ),
        (
            "events of a tool",
            AuditQuery {
                tool: Some("tool3".into()),
                limit: 100,
                ..AuditQuery::default()
            },
            false,
        ),
        (
            "events with a status (error)",
            AuditQuery {
                status: Some("error".into()),
                limit: 100,
                ..AuditQuery::default()
            },
            false,
        ),
        (
            "events of a type (tool_start)",
            AuditQuery {
                kind: Some("tool_start".into()),
                limit: 100,
                ..AuditQuery::default()
            },
            false,
        ),
        (
            "events since a minute ago",
            AuditQuery {
                since: Some(hour_ago),
                limit: 100,
                ..AuditQuery::default()
            },
            false,
        ),
    ];
    println!("\n| query | median | slowest of 20 |");
    println!("|---|---:|---:|");
    for (name, q, calls) in cases {
        let mut times = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            if calls {
                reader.calls(&q)?;
            } else {
                reader.events(&q)?;
            }
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let slowest = times.iter().copied().fold(0.0, f64::max);
        println!("| {name} | {:.2} ms | {:.2} ms |", median(times), slowest);
    }
    // The command itself, start to exit (process start, config, opening the file, the query,
    // the table).
    let config = write_config(
        dir,
        tmp,
        "query",
        &format!("path = {:?}", path.display().to_string()),
    )?;
    let toolwarden = sibling(dir, "toolwarden")?;
    println!("\n| `toolwarden audit` | median of 10 runs |");
    println!("|---|---:|");
    for flags in [
        vec!["--tool", "tool3"],
        vec!["--status", "error"],
        vec!["--session", "s42"],
        vec!["--since", "1h", "--limit", "1000"],
    ] {
        let mut times = Vec::new();
        for _ in 0..10 {
            let t = Instant::now();
            let out = Command::new(&toolwarden)
                .arg("audit")
                .arg("--config")
                .arg(&config)
                .args(&flags)
                .stdout(Stdio::null())
                .status()
                .await?;
            if !out.success() {
                bail!("toolwarden audit {flags:?} failed");
            }
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        println!("| `audit {}` | {:.1} ms |", flags.join(" "), median(times));
    }
    Ok(())
}
