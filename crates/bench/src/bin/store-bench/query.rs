//! `query`: a trail of ten-call turns built with the engine and the store as a library, then the
//! reader's queries and `toolwarden audit` timed over it.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a benchmark measures wall time"
)]

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use tokio::process::Command;
use toolwarden_core::protocol::{AuditQuery, StoreDurability, Timestamp, ToolCall};
use toolwarden_core::{AuditStore as _, Engine, InProcessTool, ToolError, TurnRequest};
use toolwarden_store::{AuditReader, SqliteStore, StoreOptions};

use crate::common::{file_size, median, sibling, write_config};

pub(crate) async fn query(dir: &Path, tmp: &Path, turns: usize) -> Result<()> {
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
