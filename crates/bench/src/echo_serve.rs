//! What both benchmark binaries (`gateway-bench`, `store-bench`) need to put `toolwarden serve`
//! in front of the echo server: the programs beside the benchmark, the config, and stopping
//! the process. Each binary includes this file as a module of its own (as it does `cpu.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::Value;
use tokio::process::{Child, Command};

/// `name` in `dir` (the benchmark's own directory), which must have been built.
pub(crate) fn sibling(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{} is missing: build it first with `cargo build --release -p toolwarden -p toolwarden-testkit -p toolwarden-bench`",
            path.display()
        );
    }
    Ok(path)
}

/// A config serving the echo server at `server` unprefixed, with a 30 s timeout, no loop
/// detector, and `store` as the body of its `[store]` table.
pub(crate) fn echo_config(server: &Path, store: &str) -> String {
    format!(
        "[servers.echo]\ncommand = {:?}\n\n[gateway]\nprefix = false\n\n[defaults]\ntimeout = \"30s\"\n\n[defaults.loop]\nwarn_after = 0\nblock_after = 0\n\n[store]\n{store}\n",
        server.display().to_string()
    )
}

/// Waits (up to a minute) until `toolwarden serve` at `addr` lists the echo tool.
pub(crate) async fn wait_for_tools(addr: &str) -> Result<()> {
    let http = reqwest::Client::new();
    for _ in 0..600 {
        if let Ok(r) = http.get(format!("http://{addr}/v1/tools")).send().await
            && let Ok(v) = r.json::<Value>().await
            && v["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == "echo"))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("toolwarden serve did not list the echo tool")
}

/// Stops `child`: SIGTERM first (toolwarden shuts its servers down on it), killed if it has not
/// exited within `grace`.
pub(crate) async fn stop(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .await;
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}
