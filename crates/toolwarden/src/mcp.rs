//! `toolwarden mcp`: the MCP gateway over stdio (docs/GATEWAY.md), for Claude Desktop, Claude Code,
//! Cursor or any MCP client that starts its servers as child processes.
//!
//! stdout carries MCP and nothing else; logs go to stderr. The client's session lasts as long as
//! its connection: when stdin closes, its running calls end `cancelled{client_disconnect}`. On
//! SIGTERM or SIGINT running calls end `cancelled{shutdown}`; either way every server is shut
//! down (process groups killed and reaped) before the process exits. A signal after stdin
//! closed is the client's escalation (MCP's stdio shutdown), and hurries that shutdown. Approvals are asked of the
//! client through elicitation when it supports it; otherwise they fail fast (headless). The
//! client is served once every server is up or has failed its start, or after 10 s at most (a
//! client gives up on a server whose handshake takes long), and a `tools/list` asked for
//! before every server's first start has ended waits for it (within the request's deadline),
//! so that the client's first list is whole.

use std::path::Path;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use toolwarden_mcp::{Gateway, GatewayOptions};

use crate::cli::McpArgs;
use crate::exit::Exit;
use crate::say::say;
use crate::serve::gateway_options;
use crate::signals::Signals;
use crate::stack::{self, Stack};

pub(crate) async fn run(config_path: Option<&Path>, args: McpArgs) -> anyhow::Result<Exit> {
    let mut signals = Signals::new().context("cannot install signal handlers")?;
    let config = stack::load_config(config_path)?;
    let principal = stack::cli_principal(&config, args.principal.as_deref())?;
    let mut stack = Stack::build(config, false, stack::RecordCalls::Yes)
        .map_err(|e| stack::trail_in_use(e, "stop it, or give this one a config with its own [store] path (one process writes a trail file at a time, so each MCP client that starts `toolwarden mcp` needs one); a client that speaks Streamable HTTP can use a running `serve`'s gateway at /mcp instead"))?;
    let reporter = stack::report_servers(&stack.engine);
    stack.start_servers(|_| true).await;
    let options = GatewayOptions {
        principal,
        ..gateway_options(&stack)
    };
    let gateway = Gateway::new(stack.engine.clone(), stack.servers.clone(), options);
    // The client is served once every server's first start has ended, or 10 s after the
    // gateway was made, as its `initialize` would wait: its first calls then find their tools'
    // policies (whether a call may become a task is judged from them, before the call waits for
    // its server), and a server that starts in minutes does not cost the client its handshake.
    // Lists wait for the rest of a first start, within their deadline. A server that fails to
    // start is reported (`reporter`) and keeps being retried; its tools appear later with a
    // tools/list_changed notification.
    gateway.first_starts().await;
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
            say!("toolwarden: {} again: exiting at once", again.name());
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
