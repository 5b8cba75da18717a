//! `toolwarden`: the command line (docs/CLI.md) and the wiring of every crate.
//!
//! The key design choice: **a command either runs the engine here or talks to a running
//! `toolwarden serve`, never both.** `serve`, `call` and `check` build an engine from the config
//! in this process (its breakers, cache and sessions live and die with it); `tools`, `turns`
//! and `abort` — and `call --url` — are clients of a server's HTTP API, where that state is
//! shared. Every path out of a local command goes through [`stack::Stack::shutdown`], so no
//! call, `exec` process group or MCP server outlives the process.

// mimalloc, built without transparent huge pages (`no_thp` in the workspace's Cargo.toml): what
// a long-running `serve` frees after a burst goes back to the system by the 4 KiB page
// (ARCHITECTURE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod audit;
mod call;
mod check;
mod cli;
mod client;
mod exit;
mod hooks;
mod mcp;
mod progress;
mod prompt;
mod say;
mod serve;
mod signals;
mod stack;
mod table;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser as _;
use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Command, LogFormat};
use crate::exit::{Exit, UsageError};
use crate::say::say;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with 0; usage errors to stderr with 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    if let Err(e) = init_logging(&cli) {
        say!("error: {e}");
        return Exit::Usage.into();
    }
    // `mcp` serves one client, one message at a time in the common case: on one thread no message
    // waits for a wake-up across threads (a gateway hop costs several). Everything else serves
    // many callers at once and wants every core.
    // `TOOLWARDEN_RUNTIME=multi|current` overrides the choice (for measurements and odd hosts).
    let forced = std::env::var("TOOLWARDEN_RUNTIME").ok();
    let multi = match forced.as_deref() {
        Some("multi") => true,
        Some("current") => false,
        _ => !matches!(cli.command, Command::Mcp(_)),
    };
    let mut builder = if multi {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            say!("error: cannot start the async runtime: {e}");
            return Exit::Error.into();
        }
    };
    let result = runtime.block_on(run(cli));
    // A terminal prompt may still block a thread on stdin; nothing else is left to wait for.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(exit) => exit.into(),
        Err(e) => {
            if e.downcast_ref::<UsageError>().is_some() {
                say!("error: {e}");
                Exit::Usage.into()
            } else {
                say!("error: {e:#}");
                Exit::Error.into()
            }
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<Exit> {
    let config = cli.global.config.as_deref();
    match cli.command {
        Command::Serve(args) => serve::run(config, args).await,
        Command::Mcp(args) => mcp::run(config, args).await,
        Command::Call(args) => call::run(config, args).await,
        Command::Check(args) => check::run(config, args).await,
        Command::Tools(args) => match args.action {
            None => client::tools(config, args.client).await,
            Some(cli::ToolsAction::Accept { name, url, digest }) => {
                // `--url` may come before `accept` or after it.
                let url = url.or(args.client.url);
                client::accept(config, &name, url.as_deref(), digest.as_deref()).await
            }
        },
        Command::Turns(args) => client::turns(config, args).await,
        Command::Abort(args) => client::abort(config, args).await,
        Command::Audit(args) => audit::run(config, args).await,
    }
}

/// Logs go to stderr: `--log-level`, else `$RUST_LOG`, else `info` for `serve` (server start-ups,
/// their stderr; rmcp's own chatter only from `warn`) and `warn` for the rest (a one-off call's
/// output stays readable).
fn init_logging(cli: &Cli) -> Result<(), String> {
    // A one-off command reports its servers' failures itself; the backend's own warnings
    // (a server going down as it is shut down) would only repeat them.
    let default = match cli.command {
        Command::Serve(_) | Command::Mcp(_) => "info,rmcp=warn",
        _ => "warn,toolwarden_mcp=error",
    };
    let filter = match cli.global.log_level.as_deref() {
        Some(f) => EnvFilter::try_new(f).map_err(|e| format!("--log-level {f:?}: {e}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)),
    };
    // Colours only for a person at a terminal: a file, a pipe or a journal gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter);
    let _ = match cli.global.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    Ok(())
}
