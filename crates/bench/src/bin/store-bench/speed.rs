//! `speed`: store off, `before_execution` and `async` side by side (calls/s at concurrency 32,
//! latency at concurrency 1, size per 1,000 calls); [`compare`] measures any list of stores so.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a benchmark measures wall time"
)]

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::common::{
    file_size, measure, median, start_binary, start_serve, stop, store_commits, write_config,
};
use crate::cpu::{MachineCpu, machine_cpu};

/// A configuration measured: its name, its `[store]` table, and the `toolwarden` binary to run
/// (the one beside the benchmark unless another build's is named).
pub(crate) struct Mode {
    pub(crate) name: String,
    pub(crate) store: String,
    pub(crate) binary: Option<PathBuf>,
}

impl Mode {
    pub(crate) fn new(name: &str, store: String) -> Mode {
        Mode {
            name: name.to_owned(),
            store,
            binary: None,
        }
    }
}

pub(crate) async fn speed(dir: &Path, tmp: &Path, rounds: usize, calls: usize) -> Result<()> {
    let store = |file: &str, durability: &str| {
        format!(
            "path = {:?}\ndurability = \"{durability}\"",
            tmp.join(file).display().to_string()
        )
    };
    let mut modes = vec![
        Mode::new("store off", "enabled = false".into()),
        Mode::new("before_execution", store("before.db", "before_execution")),
        Mode::new("async", store("async.db", "async")),
    ];
    // A before/after comparison: another build's `toolwarden`, measured in the same rounds.
    if let Some(baseline) = std::env::var_os("STORE_BENCH_BASELINE") {
        for (name, file, durability) in [
            (
                "baseline build: before_execution",
                "base-before.db",
                "before_execution",
            ),
            ("baseline build: async", "base-async.db", "async"),
        ] {
            let mut mode = Mode::new(name, store(file, durability));
            mode.binary = Some(PathBuf::from(&baseline));
            modes.push(mode);
        }
    }
    compare(dir, tmp, &modes, rounds, calls).await?;
    println!("\n| store | calls recorded | events | file size | per 1,000 calls |");
    println!("|---|---:|---:|---:|---:|");
    for (name, file) in [("before_execution", "before.db"), ("async", "async.db")] {
        let path = tmp.join(file);
        let db = rusqlite::Connection::open(&path)?;
        let calls: i64 = db.query_row("SELECT count(*) FROM calls", [], |r| r.get(0))?;
        let events: i64 = db.query_row("SELECT count(*) FROM events", [], |r| r.get(0))?;
        drop(db);
        let size = file_size(&path);
        println!(
            "| {name} | {calls} | {events} | {:.1} MiB | {:.0} KiB |",
            size as f64 / 1048576.0,
            size as f64 / 1024.0 / (calls.max(1) as f64 / 1000.0)
        );
    }
    Ok(())
}

/// Starts one `serve` per mode (a name and its `[store]` table), measures them in turn, round
/// after round, in a rotating order, stops them and prints the table (the first mode is the
/// baseline of "× store off" and "added p50").
pub(crate) async fn compare(
    dir: &Path,
    tmp: &Path,
    modes: &[Mode],
    rounds: usize,
    calls: usize,
) -> Result<()> {
    let m_count = modes.len();
    let mut servers = Vec::new();
    for (i, mode) in modes.iter().enumerate() {
        let config = write_config(dir, tmp, &format!("mode{i}"), &mode.store)?;
        servers.push(match &mode.binary {
            Some(binary) => start_binary(binary, &config).await?,
            None => start_serve(dir, &config).await?,
        });
    }
    // Warm-up: connections, the servers' first calls, SQLite's caches.
    for (_, addr) in &servers {
        measure(addr, 8, 2000).await?;
    }
    let mut c32: Vec<Vec<f64>> = vec![Vec::new(); m_count];
    let mut c1: Vec<Vec<f64>> = vec![Vec::new(); m_count];
    let mut c1_p99: Vec<Vec<f64>> = vec![Vec::new(); m_count];
    let mut added: Vec<Vec<f64>> = vec![Vec::new(); m_count];
    let mut ratio: Vec<Vec<f64>> = vec![Vec::new(); m_count];
    // Commits and events committed during the runs at concurrency 32, per store.
    let mut batching = vec![(0.0, 0.0); m_count];
    // The machine's CPU busy per call, and its idle share, during the runs at concurrency 32.
    let mut busy_us: Vec<Vec<f64>> = vec![Vec::new(); m_count];
    let mut idle: Vec<Vec<f64>> = vec![Vec::new(); m_count];
    for round in 0..rounds {
        let mut tput = vec![0.0; m_count];
        let mut lat = vec![0.0; m_count];
        for k in 0..m_count {
            let i = (round + k) % m_count;
            let addr = &servers[i].1;
            let before = store_commits(addr).await?;
            let cpu_before = machine_cpu()?;
            let m = measure(addr, 32, calls).await?;
            let cpu = machine_cpu()?.since(&cpu_before);
            busy_us[i].push(cpu.busy_s * 1e6 / calls as f64);
            idle[i].push(idle_share(&cpu));
            if let (Some((c0, e0)), Some((c1, e1))) = (before, store_commits(addr).await?) {
                batching[i].0 += c1 - c0;
                batching[i].1 += e1 - e0;
            }
            tput[i] = m.per_second;
            let l = measure(addr, 1, calls / 8).await?;
            lat[i] = l.p50.as_secs_f64() * 1e6;
            c1_p99[i].push(l.p99.as_secs_f64() * 1e6);
            eprintln!(
                "round {round}: {:<16} c32 {:>7.0}/s (p50 {:?} p99 {:?}, machine {:.0} µs/call, {:.0}% idle)   c1 p50 {:>4.0} µs p99 {:>5.0} µs",
                modes[i].name,
                m.per_second,
                m.p50,
                m.p99,
                busy_us[i][round],
                idle[i][round] * 100.0,
                lat[i],
                l.p99.as_secs_f64() * 1e6
            );
        }
        for i in 0..m_count {
            c32[i].push(tput[i]);
            c1[i].push(lat[i]);
            added[i].push(lat[i] - lat[0]);
            ratio[i].push(tput[i] / tput[0]);
        }
    }
    for (child, _) in &mut servers {
        stop(child).await;
    }
    println!(
        "| store | calls/s at concurrency 32 | × store off | events per commit at 32 | machine CPU per call at 32 | idle at 32 | p50 at concurrency 1 | added p50 | p99 at concurrency 1 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for i in 0..m_count {
        let (commits, events) = batching[i];
        let per_commit = if commits > 0.0 {
            format!("{:.1}", events / commits)
        } else {
            "—".to_owned()
        };
        println!(
            "| {} | {:.0} | {:.2} | {per_commit} | {:.0} µs | {:.0} % | {:.0} µs | {:+.0} µs | {:.0} µs |",
            modes[i].name,
            median(c32[i].clone()),
            median(ratio[i].clone()),
            median(busy_us[i].clone()),
            median(idle[i].clone()) * 100.0,
            median(c1[i].clone()),
            median(added[i].clone()),
            median(c1_p99[i].clone()),
        );
    }
    println!(
        "\n(medians of {rounds} rounds; each round measures {calls} calls at concurrency 32 and {} at concurrency 1 per store)",
        calls / 8
    );
    Ok(())
}

/// The share of the machine's CPU time that was idle.
fn idle_share(cpu: &MachineCpu) -> f64 {
    cpu.idle_s / (cpu.busy_s + cpu.idle_s).max(f64::MIN_POSITIVE)
}
