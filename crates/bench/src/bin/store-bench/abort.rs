//! `abort`: an abort posted to one replica stopping a call that runs on another. Three `serve`
//! replicas (each with its own SQLite trail) share a `redis-server` of the run's own; replica A
//! runs detached turns of one `exec` call (`sleep 30`); each is aborted through
//! `POST /v1/turns/{id}/abort`, alternately posted to replica C (forwarded through Redis) and to
//! A itself, and timed from sending the abort to its answer — which comes once A has aborted the
//! call, so the remote figure is the whole path: C's `PUBLISH`, A's abort, A's answer back.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a benchmark measures wall time"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::common::{start_serve, stop, write_config};
use crate::redis_server::RedisServer;
use crate::scale::wait_redis;

pub(crate) async fn abort(dir: &Path, tmp: &Path, aborts: usize) -> Result<()> {
    let redis = RedisServer::start().await?;
    let store = format!(
        "path = \"toolwarden.db\"\n\n[redis]\nurl = {:?}\nprefix = \"abort:\"\n\n[exec]\nenabled = true\ntimeout = \"60s\"",
        redis.url()
    );
    let mut servers = Vec::new();
    let mut started = Ok(());
    for name in ["abort-a", "abort-b", "abort-c"] {
        match write_config(dir, tmp, name, &store) {
            Ok(config) => match start_serve(dir, &config).await {
                Ok(server) => servers.push(server),
                Err(e) => started = Err(e),
            },
            Err(e) => started = Err(e),
        }
        if started.is_err() {
            break;
        }
    }
    let result = match started {
        Ok(()) => measure(&servers[0].1, &servers[2].1, aborts).await,
        Err(e) => Err(e),
    };
    for (child, _) in &mut servers {
        stop(child).await;
    }
    redis.stop().await;
    result
}

async fn measure(a: &str, c: &str, aborts: usize) -> Result<()> {
    wait_redis(a).await?;
    wait_redis(c).await?;
    let http = reqwest::Client::new();
    let (mut remote, mut local) = (Vec::with_capacity(aborts), Vec::with_capacity(aborts));
    // A few to warm up: connections, the first `exec`s.
    for i in 0..(2 * aborts + 10) {
        let turn_id = detached(&http, a).await?;
        let via = if i % 2 == 0 { c } else { a };
        let t = Instant::now();
        let resp = http
            .post(format!("http://{via}/v1/turns/{turn_id}/abort"))
            .send()
            .await?;
        let took = t.elapsed();
        if resp.status() != 200 {
            bail!("abort of {turn_id} through {via}: {}", resp.status());
        }
        if i < 10 {
            continue;
        }
        if i % 2 == 0 {
            remote.push(took);
        } else {
            local.push(took);
        }
    }
    // Every call was stopped: A runs none of them any more.
    let mut left = Value::Null;
    for _ in 0..100 {
        left = http
            .get(format!("http://{a}/v1/turns/active"))
            .send()
            .await?
            .json()
            .await?;
        if left["turns"].as_array().is_some_and(Vec::is_empty) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !left["turns"].as_array().is_some_and(Vec::is_empty) {
        bail!("aborted turns still run on A: {left}");
    }
    println!("| abort | aborts | p50 | p99 | max |");
    println!("|---|---:|---:|---:|---:|");
    for (name, took) in [
        ("posted to C, running on A (through Redis)", &mut remote),
        ("posted to A itself (local)", &mut local),
    ] {
        took.sort();
        let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {name} | {} | {:.2} ms | {:.2} ms | {:.2} ms |",
            took.len(),
            ms(at(0.5)),
            ms(at(0.99)),
            ms(took[took.len() - 1])
        );
    }
    Ok(())
}

/// Starts a detached turn of one long `exec` call on `addr`; its id.
async fn detached(http: &reqwest::Client, addr: &str) -> Result<String> {
    let body = json!({"detach": true, "calls": [{"type": "tool_use", "id": "long", "name": "exec", "input": {"command": "sleep 30"}}]});
    let resp = http
        .post(format!("http://{addr}/v1/turns"))
        .json(&body)
        .send()
        .await?;
    if resp.status() != 202 {
        bail!("detached turn: {}", resp.status());
    }
    let v: Value = resp.json().await?;
    Ok(v["turn_id"].as_str().unwrap_or_default().to_owned())
}
