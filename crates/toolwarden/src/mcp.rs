//! `toolwarden mcp`: the MCP gateway over stdio (SPEC §7.1), for Claude Desktop, Claude Code,
//! Cursor or any MCP client that starts its servers as child processes.
//!
//! stdout carries MCP and nothing else; logs go to stderr. The client's session lasts as long as
//! its connection: when stdin closes, its running calls end `cancelled{client_disconnect}`. On
//! SIGTERM or SIGINT running calls end `cancelled{shutdown}`; either way every server is shut
//! down (process groups killed and reaped) before the process exits. Approvals are asked of the
//! client through elicitation when it supports it; otherwise they fail fast (headless). The
//! client is served once every server is up or has failed its start (bounded by each server's
//! `startup_timeout`), so that its first `tools/list` is complete.

use std::path::Path;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use toolwarden_mcp::Gateway;

use crate::exit::Exit;
use crate::serve::gateway_options;
use crate::signals::Signals;
use crate::stack::{self, Stack};

pub(crate) async fn run(config_path: Option<&Path>) -> anyhow::Result<Exit> {
    let mut signals = Signals::new().context("cannot install signal handlers")?;
    let config = stack::load_config(config_path)?;
    let mut stack = Stack::build(config, false)?;
    stack.start_servers(|_| true);
    // MCP clients list tools once, right after they connect: wait for the servers (each at most
    // its startup_timeout) so that list is whole. A server that fails to start is reported and
    // keeps being retried; its tools appear later with a tools/list_changed notification.
    for (name, ready) in stack.wait_ready().await {
        if let Err(e) = ready {
            tracing::warn!(server = %name, "{e}; serving without its tools for now");
        }
    }
    let gateway = Gateway::new(
        stack.engine.clone(),
        stack.servers.clone(),
        gateway_options(&stack),
    );
    let shutdown = CancellationToken::new();
    tracing::info!(
        config = %stack::describe_origin(&stack.config),
        servers = stack.servers.len(),
        "toolwarden mcp: serving the MCP gateway on stdio"
    );
    let served = tokio::select! {
        served = gateway.serve_stdio(shutdown.clone()) => Some(served),
        stop = signals.recv() => {
            tracing::info!("{}: shutting down", stop.name());
            shutdown.cancel();
            None
        }
    };
    tokio::spawn(async move {
        let again = signals.recv().await;
        eprintln!("toolwarden: {} again: exiting at once", again.name());
        std::process::exit(again.exit_code());
    });
    stack.shutdown().await;
    match served {
        Some(Err(e)) => Err(e).context("the MCP client connection failed"),
        _ => Ok(Exit::Ok),
    }
}
