//! A throwaway `redis-server` of the benchmark's own, on a free port: its `INFO` counts this run's
//! commands and nothing else (the machine's Redis serves the test suites too).

use std::net::TcpListener;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};

pub(crate) struct RedisServer {
    child: Child,
    pub(crate) port: u16,
}

impl RedisServer {
    pub(crate) async fn start() -> Result<RedisServer> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        toolwarden_process::isolate(&mut cmd);
        let child = cmd
            .spawn()
            .context("redis-server (scripts/setup-test-deps.sh installs it)")?;
        let server = RedisServer { child, port };
        for _ in 0..100 {
            if server.cli(&["PING"]).await.is_ok_and(|s| s == "PONG") {
                return Ok(server);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("redis-server on port {port} did not answer")
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `redis-cli` against this server; its output.
    pub(crate) async fn cli(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .await
            .context("redis-cli")?;
        if !out.status.success() {
            bail!(
                "redis-cli {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// What the server has done so far: commands by name (calls, microseconds), the watchers'
    /// `PING`s and the benchmark's own `INFO` left out, and its socket reads.
    pub(crate) async fn counts(&self) -> Result<Counts> {
        let stats = self.cli(&["INFO", "commandstats"]).await?;
        let mut commands = std::collections::BTreeMap::new();
        for line in stats.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            if matches!(
                name,
                "ping" | "info" | "subscribe" | "hello" | "client|setinfo"
            ) {
                continue;
            }
            let field = |key: &str| -> u64 {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
                    .unwrap_or(0)
            };
            commands.insert(name.to_owned(), (field("calls"), field("usec")));
        }
        let info = self.cli(&["INFO", "stats"]).await?;
        let reads = info
            .lines()
            .find_map(|l| {
                l.strip_prefix("total_reads_processed:")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0);
        Ok(Counts { commands, reads })
    }

    pub(crate) async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Commands by name — (calls, microseconds spent in them) — and socket reads.
#[derive(Default, Clone)]
pub(crate) struct Counts {
    pub(crate) commands: std::collections::BTreeMap<String, (u64, u64)>,
    pub(crate) reads: u64,
}

impl Counts {
    /// What happened between `before` and `self`.
    pub(crate) fn since(&self, before: &Counts) -> Counts {
        let mut commands = std::collections::BTreeMap::new();
        for (name, (calls, usec)) in &self.commands {
            let (c0, u0) = before.commands.get(name).copied().unwrap_or((0, 0));
            if calls > &c0 {
                commands.insert(name.clone(), (calls - c0, usec - u0));
            }
        }
        Counts {
            commands,
            reads: self.reads - before.reads,
        }
    }

    /// Adds `other` to `self`.
    pub(crate) fn add(&mut self, other: &Counts) {
        for (name, (calls, usec)) in &other.commands {
            let e = self.commands.entry(name.clone()).or_default();
            e.0 += calls;
            e.1 += usec;
        }
        self.reads += other.reads;
    }
}
