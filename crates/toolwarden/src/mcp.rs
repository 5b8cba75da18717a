//! `toolwarden mcp`: the MCP gateway over stdio (docs/GATEWAY.md), for Claude Desktop, Claude Code,
//! Cursor or any MCP client that starts its servers as child processes.
//!
//! stdout carries MCP and nothing else; logs go to stderr. The client's session lasts as long as
//! its connection: when stdin closes, its running calls end `cancelled{client_disconnect}`. On
//! SIGTERM or SIGINT running calls end `cancelled{shutdown}`; either way every server is shut
//! down (process groups killed and reaped) before the process exits. A signal after stdin
//! closed is the client's escalation (MCP's stdio shutdown), and hurries that shutdown. Approvals are asked of the
//! client through elicitation when it supports it; otherwise they fail fast (headless). The
//! client is served once every server is up or has failed its start (bounded by each server's
//! `startup_timeout`), so that its first `tools/list` is complete.

use std::path::Path;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use toolwarden_mcp::{Gateway, GatewayOptions};

use crate::cli::McpArgs;
use crate::exit::Exit;
use crate::serve::gateway_options;
use crate::signals::Signals;
use crate::stack::{self, Stack};

pub(crate) async fn run(config_path: Option<&Path>, args: McpArgs) -> anyhow::Result<Exit> {
    let mut signals = Signals::new().context("cannot install signal handlers")?;
    let config = stack::load_config(config_path)?;
    let principal = stack::cli_principal(&config, args.principal.as_deref())?;
    let mut stack = Stack::build(config, false, stack::RecordCalls::Yes)?;
    let reporter = stack::report_servers(&stack.engine);
    stack.start_servers(|_| true).await;
    // MCP clients list tools once, right after they connect: wait for the servers (each at most
    // its startup_timeout) so that list is whole. A server that fails to start is reported and
    // keeps being retried; its tools appear later with a tools/list_changed notification.
    for (name, ready) in stack.wait_ready().await {
        if let Err(e) = ready {
            tracing::warn!(server = %name, "{e}; serving without its tools for now");
        }
    }
    let options = GatewayOptions {
        principal,
        ..gateway_options(&stack)
    };
    let gateway = Gateway::new(stack.engine.clone(), stack.servers.clone(), options);
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
    // MCP's stdio shutdown: the client closes stdin, sends SIGTERM if the server has not
    // exited within "a reasonable time" (the official SDKs wait 2 s), then SIGKILL. So when
    // the client left first, its signal is that escalation, not a second Ctrl-C: stop waiting
    // for running calls to stop and shut the servers down at once, process groups killed
    // (exiting at once would leave their children to outlive us). A further signal exits.
    let client_left = served.is_some();
    let hurry = CancellationToken::new();
    tokio::spawn({
        let hurry = hurry.clone();
        async move {
            if client_left {
                let first = signals.recv().await;
                tracing::info!("{}: shutting down now", first.name());
                hurry.cancel();
            }
            let again = signals.recv().await;
            eprintln!("toolwarden: {} again: exiting at once", again.name());
            std::process::exit(again.exit_code());
        }
    });
    tokio::select! {
        _ = stack.shutdown() => {}
        _ = hurry.cancelled() => {
            stack.shutdown_servers().await;
            stack.close_store().await;
        }
    }
    reporter.abort();
    match served {
        Some(Err(e)) => Err(e).context("the MCP client connection failed"),
        _ => Ok(Exit::Ok),
    }
}
