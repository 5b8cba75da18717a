//! `soak`: calls at a steady rate, then every call's four events counted in the database.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a benchmark measures wall time"
)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::common::{file_size, one_turn, start_serve, stop, write_config};

pub(crate) async fn soak(dir: &Path, tmp: &Path, rate: u64, seconds: u64) -> Result<()> {
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
