//! `writer`: the audit trail's own cost, without HTTP, a test server or a load client around it.
//! The engine runs as a library on two runtime threads with an in-process `echo` tool; one-call
//! turns at concurrency 32, store off / `before_execution` / `async` in a rotating order, round
//! after round. It prints calls per second and the CPU a call costs — the whole process's and
//! the writer thread's alone (from `/proc/self/task/*/schedstat`) — so a change to the writer can
//! be weighed in a few seconds, with little of the machine's noise.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a benchmark measures wall time"
)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use toolwarden_core::protocol::{StoreDurability, ToolCall};
use toolwarden_core::{AuditStore, Engine, InProcessTool, ToolError};
use toolwarden_store::{SqliteStore, StoreOptions};

use crate::common::median;

const CONCURRENCY: usize = 32;

/// Nanoseconds on a CPU so far: every thread of this process, and the store's writer thread.
fn cpu_ns() -> Result<(u64, u64)> {
    let (mut all, mut writer) = (0, 0);
    for task in std::fs::read_dir("/proc/self/task")? {
        let task = task?.path();
        let Ok(stat) = std::fs::read_to_string(task.join("schedstat")) else {
            continue; // the thread ended meanwhile
        };
        let ns: u64 = stat
            .split_whitespace()
            .next()
            .context("schedstat")?
            .parse()?;
        all += ns;
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if comm.trim_end().starts_with("toolwarden-stor") {
            writer += ns;
        }
    }
    Ok((all, writer))
}

struct Round {
    calls_per_s: f64,
    cpu_us: f64,
    writer_us: f64,
    events_per_commit: f64,
}

async fn round(tmp: &Path, durability: Option<StoreDurability>, calls: usize) -> Result<Round> {
    let path = tmp.join("writer.db");
    for suffix in ["", "-wal", "-shm", ".lock"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let store = durability
        .map(|durability| {
            SqliteStore::open(StoreOptions {
                durability,
                ..StoreOptions::new(&path)
            })
            .map(Arc::new)
        })
        .transpose()?;
    let mut builder = Engine::builder();
    if let Some(store) = &store {
        builder = builder.store(store.clone());
    }
    let engine = builder.build();
    engine.register(InProcessTool::new(
        "echo",
        "Answers its input",
        json!({"type": "object"}),
        |input, _ctx| async move { Ok::<_, ToolError>(input.to_string()) },
    ));
    // Warm-up: the tables' first pages, the runtime's threads.
    for i in 0..200 {
        engine
            .call(
                "s1",
                ToolCall::new(format!("w{i}"), "echo", json!({"text": "hello"})),
            )
            .await;
    }
    engine.store_caught_up(Duration::from_secs(60)).await?;
    let commits_before = store.as_ref().map(|s| s.commits());
    let (cpu0, writer0) = cpu_ns()?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..CONCURRENCY {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            for n in (w..calls).step_by(CONCURRENCY) {
                engine
                    .call(
                        "s1",
                        ToolCall::new(format!("c{n}"), "echo", json!({"text": "hello"})),
                    )
                    .await;
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    engine.store_caught_up(Duration::from_secs(60)).await?;
    let elapsed = started.elapsed().as_secs_f64();
    let (cpu1, writer1) = cpu_ns()?;
    let events_per_commit = match (store.as_ref().map(|s| s.commits()), commits_before) {
        (Some(after), Some(before)) if after.commits > before.commits => {
            (after.events - before.events) as f64 / (after.commits - before.commits) as f64
        }
        _ => 0.0,
    };
    if let Some(store) = store {
        store.close().await;
    }
    Ok(Round {
        calls_per_s: calls as f64 / elapsed,
        cpu_us: (cpu1 - cpu0) as f64 / 1000.0 / calls as f64,
        writer_us: (writer1 - writer0) as f64 / 1000.0 / calls as f64,
        events_per_commit,
    })
}

pub(crate) async fn writer(tmp: &Path, rounds: usize, calls: usize) -> Result<()> {
    let modes: [(&str, Option<StoreDurability>); 3] = [
        ("off", None),
        ("before_execution", Some(StoreDurability::BeforeExecution)),
        ("async", Some(StoreDurability::Async)),
    ];
    let mut results: Vec<Vec<Round>> = modes.iter().map(|_| Vec::new()).collect();
    for r in 0..rounds {
        for k in 0..modes.len() {
            let m = (r + k) % modes.len();
            results[m].push(round(tmp, modes[m].1, calls).await?);
        }
    }
    println!(
        "writer: {rounds} rounds of {calls} one-call turns at concurrency {CONCURRENCY}, in process (medians)"
    );
    println!("| store | calls/s | × off | CPU µs/call | writer µs/call | events/commit |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (m, (name, _)) in modes.iter().enumerate() {
        let ratio = median(
            (0..rounds)
                .map(|r| results[m][r].calls_per_s / results[0][r].calls_per_s)
                .collect(),
        );
        let rs = &results[m];
        println!(
            "| {name} | {:.0} | {ratio:.2} | {:.1} | {:.1} | {:.1} |",
            median(rs.iter().map(|r| r.calls_per_s).collect()),
            median(rs.iter().map(|r| r.cpu_us).collect()),
            median(rs.iter().map(|r| r.writer_us).collect()),
            median(rs.iter().map(|r| r.events_per_commit).collect()),
        );
    }
    Ok(())
}
