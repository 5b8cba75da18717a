//! `scale`: replicas sharing Redis and PostgreSQL beside one node on its own, side by side as
//! [`crate::speed::compare`] measures stores: calls per second at concurrency 32 through
//! `POST /v1/turns` (one-call turns to an echo tool, governed as any call: policy, breaker, loop
//! detector, audit trail with `before_execution`), and the p50 at concurrency 1.
//!
//! - **single node**: one `serve`, the audit trail in SQLite, no Redis;
//! - **1 replica, PostgreSQL**: one `serve`, the trail in PostgreSQL, no Redis;
//! - **1 replica, PostgreSQL + Redis**: the same with `[redis]`;
//! - **3 replicas, PostgreSQL + Redis**: three `serve`s sharing one Redis prefix and one trail,
//!   the 32 clients spread over them (client `i` on replica `i mod 3`).
//!
//! Redis is a `redis-server` of the run's own, so its `INFO` counts the commands of the measured
//! calls alone: commands per call by name, with the server's own time per command, and socket
//! reads per call (each read is one round trip from a client, however many pipelined commands
//! it carries). PostgreSQL is `$TOOLWARDEN_TEST_POSTGRES_URL` in a schema of the run's own.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a benchmark measures wall time"
)]

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::Value;
use tokio::process::Child;

use crate::common::{measure_on, median, start_serve, stop, write_config};
use crate::pg::PgSchema;
use crate::redis_server::{Counts, RedisServer};

/// One configuration: its name, its servers, and whether it uses Redis.
struct Mode {
    name: &'static str,
    servers: Vec<(Child, String)>,
    redis: bool,
}

pub(crate) async fn scale(dir: &Path, tmp: &Path, rounds: usize, calls: usize) -> Result<()> {
    let redis = RedisServer::start().await?;
    let pg = PgSchema::create().await?;
    let result = run(dir, tmp, &redis, &pg.url, rounds, calls).await;
    redis.stop().await;
    result.and(pg.drop().await)
}

async fn run(
    dir: &Path,
    tmp: &Path,
    redis: &RedisServer,
    pg_url: &str,
    rounds: usize,
    calls: usize,
) -> Result<()> {
    let sqlite = format!(
        "path = {:?}\ndurability = \"before_execution\"",
        tmp.join("single.db").display().to_string()
    );
    let pg = format!("url = {pg_url:?}\ndurability = \"before_execution\"");
    let with_redis = |prefix: &str| {
        format!(
            "{pg}\n\n[redis]\nurl = {:?}\nprefix = \"{prefix}\"",
            redis.url()
        )
    };
    let plans: [(&str, String, usize, bool); 4] = [
        ("single node: SQLite, no Redis", sqlite, 1, false),
        ("1 replica: PostgreSQL, no Redis", pg.clone(), 1, false),
        (
            "1 replica: PostgreSQL + Redis",
            with_redis("bench1:"),
            1,
            true,
        ),
        (
            "3 replicas: PostgreSQL + Redis",
            with_redis("bench3:"),
            3,
            true,
        ),
    ];
    let mut modes = Vec::new();
    for (m, (name, store, count, uses_redis)) in plans.into_iter().enumerate() {
        let mut servers = Vec::new();
        for r in 0..count {
            let config = write_config(dir, tmp, &format!("scale{m}-{r}"), &store)?;
            servers.push(start_serve(dir, &config).await?);
        }
        if uses_redis {
            for (_, addr) in &servers {
                wait_redis(addr).await?;
            }
        }
        modes.push(Mode {
            name,
            servers,
            redis: uses_redis,
        });
    }
    let result = measure_modes(&mut modes, redis, rounds, calls).await;
    for mode in &mut modes {
        for (child, _) in &mut mode.servers {
            stop(child).await;
        }
    }
    result
}

async fn measure_modes(
    modes: &mut [Mode],
    redis: &RedisServer,
    rounds: usize,
    calls: usize,
) -> Result<()> {
    let n = modes.len();
    let addrs: Vec<Vec<String>> = modes
        .iter()
        .map(|m| m.servers.iter().map(|(_, a)| a.clone()).collect())
        .collect();
    for a in &addrs {
        measure_on(a, 8, 2000).await?;
    }
    let (mut c32, mut c1, mut ratio, mut p99) = (
        vec![vec![]; n],
        vec![vec![]; n],
        vec![vec![]; n],
        vec![vec![]; n],
    );
    let mut counted = vec![(Counts::default(), 0u64); n];
    for round in 0..rounds {
        let mut tput = vec![0.0; n];
        for k in 0..n {
            let i = (round + k) % n;
            let before = if modes[i].redis {
                settle().await;
                Some(redis.counts().await?)
            } else {
                None
            };
            let m = measure_on(&addrs[i], 32, calls).await?;
            if let Some(before) = before {
                settle().await;
                let delta = redis.counts().await?.since(&before);
                counted[i].0.add(&delta);
                counted[i].1 += (calls / 32 * 32) as u64;
            }
            let l = measure_on(&addrs[i], 1, calls / 8).await?;
            eprintln!(
                "round {round}: {:<34} c32 {:>6.0}/s (p50 {:?} p99 {:?})   c1 p50 {:?}",
                modes[i].name, m.per_second, m.p50, m.p99, l.p50
            );
            tput[i] = m.per_second;
            c1[i].push(l.p50.as_secs_f64() * 1e6);
            p99[i].push(m.p99.as_secs_f64() * 1e3);
        }
        for i in 0..n {
            c32[i].push(tput[i]);
            ratio[i].push(tput[i] / tput[0]);
        }
    }
    println!(
        "| configuration | calls/s at concurrency 32 | × single node | p99 at 32 | p50 at concurrency 1 |"
    );
    println!("|---|---:|---:|---:|---:|");
    for i in 0..n {
        println!(
            "| {} | {:.0} | {:.2} | {:.1} ms | {:.0} µs |",
            modes[i].name,
            median(c32[i].clone()),
            median(ratio[i].clone()),
            median(p99[i].clone()),
            median(c1[i].clone()),
        );
    }
    println!(
        "\n(medians of {rounds} rounds; each round measures {calls} calls at concurrency 32 and {} at concurrency 1 per configuration)",
        calls / 8
    );
    println!(
        "\n| configuration | Redis socket reads per call | commands per call (server time per command) |"
    );
    println!("|---|---:|---|");
    for i in 0..n {
        let (counts, calls) = &counted[i];
        if !modes[i].redis || *calls == 0 {
            continue;
        }
        let per = |v: u64| v as f64 / *calls as f64;
        let commands: Vec<String> = counts
            .commands
            .iter()
            .map(|(name, (c, usec))| {
                format!(
                    "`{}` {:.2} ({:.1} µs)",
                    name.to_uppercase(),
                    per(*c),
                    *usec as f64 / (*c).max(1) as f64
                )
            })
            .collect();
        println!(
            "| {} | {:.3} | {} |",
            modes[i].name,
            per(counts.reads),
            commands.join(", ")
        );
    }
    Ok(())
}

/// Lets what the replicas write behind their calls (events, pipelined) reach Redis.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(700)).await;
}

/// Waits until the replica at `addr` has reached Redis (`/healthz` says `ok`).
pub(crate) async fn wait_redis(addr: &str) -> Result<()> {
    let http = reqwest::Client::new();
    for _ in 0..200 {
        if let Ok(r) = http.get(format!("http://{addr}/healthz")).send().await
            && let Ok(v) = r.json::<Value>().await
            && v["status"] == "ok"
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the replica at {addr} never reached Redis")
}
