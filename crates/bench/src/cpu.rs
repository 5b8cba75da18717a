//! CPU time from `/proc`, for the benchmarks that say where a run's time went (Linux only):
//! one process's, and the whole machine's busy and idle time. Shared by `gateway-bench` and
//! `store-bench`.
#![allow(dead_code, reason = "each benchmark binary uses a part of it")]

use anyhow::{Context as _, Result, bail};

/// A process's user and system CPU time so far, in seconds (`/proc/PID/stat`, in clock ticks
/// of 1/100 s).
pub(crate) fn process_cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        bail!("unexpected /proc/{pid}/stat: {stat}");
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of the line, the 12th and 13th after the name.
    let ticks =
        |i: usize| -> Result<f64> { Ok(fields.get(i).copied().unwrap_or("").parse::<f64>()?) };
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// The machine's CPU time from `/proc/stat`, in seconds: busy (every state but idle and waiting
/// for the disk), and idle plus waiting.
#[derive(Clone, Copy)]
pub(crate) struct MachineCpu {
    pub(crate) busy_s: f64,
    pub(crate) idle_s: f64,
}

impl MachineCpu {
    pub(crate) fn since(&self, before: &MachineCpu) -> MachineCpu {
        MachineCpu {
            busy_s: self.busy_s - before.busy_s,
            idle_s: self.idle_s - before.idle_s,
        }
    }
}

pub(crate) fn machine_cpu() -> Result<MachineCpu> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .context("no cpu line in /proc/stat")?;
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|t| t.parse::<f64>().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal, in hundredths of a second.
    let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
    let all: f64 = ticks.iter().sum();
    Ok(MachineCpu {
        busy_s: (all - idle) / 100.0,
        idle_s: idle / 100.0,
    })
}
