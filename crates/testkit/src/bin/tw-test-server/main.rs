//! `tw-test-server`: an MCP server whose tools misbehave on purpose.
//!
//! Serves MCP over stdio by default, or over Streamable HTTP at `/mcp` with `--http ADDR`
//! (the bound address is printed on stdout as the first line). Its tools hang, ignore cancels,
//! crash, flood, write garbage to stdout, answer after a cancel, and spawn grandchildren — the
//! behaviours a governing client must survive. See `tools.rs` for the list.
//!
//! `--era` picks the revisions it speaks: `handshake` (the default) is a server written before
//! 2026-07-28, which knows no `server/discover`; `2026-07-28` speaks only that revision (no
//! `initialize`: `server/discover` and a `_meta` envelope on every request; over HTTP, no
//! sessions); `both` answers either. In 2026-07-28, `elicit`, `sample` and `roots` ask through
//! `input_required` instead of a request to the client (see `mrtr.rs`). Over HTTP in 2026-07-28,
//! every call first sends a progress of 0 ("started"): rmcp holds a response's head until the
//! handler's first message, and only an open stream can be closed (the cancel).
//!
//! On stdio, everything rmcp writes goes through a *pump* that also accepts raw lines from the
//! tools, so a tool can put garbage or a hand-made frame on stdout between two whole messages.

mod handler;
mod mrtr;
mod state;
mod task_table;
mod tasks;
mod tools;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use rmcp::ServiceExt as _;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::sync::{mpsc, oneshot};

use state::{Era, Injector, TestServer};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "tw-test-server",
    about = "An MCP server whose tools misbehave on purpose"
)]
struct Args {
    /// Serve Streamable HTTP at `/mcp` on this address (e.g. `127.0.0.1:0`) instead of stdio.
    #[arg(long)]
    http: Option<SocketAddr>,
    /// Answer `initialize` only after this many milliseconds.
    #[arg(long, default_value_t = 0)]
    startup_delay_ms: u64,
    /// Read nothing for this many milliseconds after start (stdio): a server that is slow to
    /// start (a package download, a JVM), whose client's first requests wait in the pipe.
    #[arg(long, default_value_t = 0)]
    silent_ms: u64,
    /// Exit with status 2 before serving anything.
    #[arg(long)]
    fail_startup: bool,
    /// Write this line to stderr at start (to check that stderr is captured).
    #[arg(long)]
    stderr_line: Option<String>,
    /// Which revisions of MCP to speak.
    #[arg(long, value_enum, default_value_t = Era::Handshake)]
    era: Era,
    /// Tell this instance apart: it also serves `test://TAG/mine`, and its greeting ends with
    /// ` (TAG)` (for routing tests with several servers).
    #[arg(long)]
    tag: Option<String>,
    /// List `echo` with this description instead of its own (a server that changes a tool's
    /// definition between two starts, for tool pins).
    #[arg(long)]
    echo_description: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    if let Some(tag) = &args.tag {
        state::set_tag(tag.clone());
    }
    if let Some(description) = &args.echo_description {
        let _ = state::ECHO_DESCRIPTION.set(description.clone());
    }
    if let Some(line) = &args.stderr_line {
        eprintln!("{line}");
    }
    if args.fail_startup {
        eprintln!("tw-test-server: failing start-up on purpose (--fail-startup)");
        std::process::exit(2);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        tokio::time::sleep(Duration::from_millis(args.silent_ms)).await;
        let startup_delay = Duration::from_millis(args.startup_delay_ms);
        match args.http {
            Some(addr) => serve_http(addr, startup_delay, args.era).await,
            None => serve_stdio(startup_delay, args.era).await,
        }
    })
}

async fn serve_stdio(startup_delay: Duration, era: Era) -> anyhow::Result<()> {
    let (to_pump, from_rmcp) = tokio::io::duplex(64 * 1024);
    let (inject_tx, inject_rx) = mpsc::channel(16);
    let server = TestServer::new(startup_delay, Some(Injector::new(inject_tx)), era);
    // Pipes through the event loop (as toolwarden's own stdio), else tokio's blocking stdio.
    let (pump, running) = match toolwarden_process::stdio_pipes() {
        Some((stdin, stdout)) => (
            tokio::spawn(pump(from_rmcp, stdout, inject_rx)),
            server.serve((stdin, to_pump)).await,
        ),
        None => (
            tokio::spawn(pump(from_rmcp, tokio::io::stdout(), inject_rx)),
            server.serve((tokio::io::stdin(), to_pump)).await,
        ),
    };
    let running = running.context("initialize failed")?;
    running.waiting().await?;
    // The client closed stdin: let the pump write what is left, then leave.
    let _ = tokio::time::timeout(Duration::from_secs(1), pump).await;
    Ok(())
}

/// Copies rmcp's output to stdout line by line, and writes injected raw lines between two
/// whole lines so that they never split a message.
async fn pump(
    from_rmcp: tokio::io::DuplexStream,
    mut stdout: impl tokio::io::AsyncWrite + Unpin,
    mut inject: mpsc::Receiver<(Vec<u8>, oneshot::Sender<()>)>,
) {
    let mut reader = BufReader::new(from_rmcp);
    let mut line = Vec::new();
    loop {
        tokio::select! {
            // `read_until` keeps partial reads in `line`, so being interrupted by an
            // injection loses nothing: the next call continues the same line.
            read = reader.read_until(b'\n', &mut line) => {
                match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) if line.ends_with(b"\n") => {
                        if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                            break;
                        }
                        line.clear();
                    }
                    Ok(_) => {}
                }
            }
            Some((raw, done)) = inject.recv() => {
                if raw.is_empty() {
                    // Asked to close stdout: the writer goes with this task.
                    drop(stdout);
                    let _ = done.send(());
                    return;
                }
                if stdout.write_all(&raw).await.is_err() || stdout.flush().await.is_err() {
                    break;
                }
                let _ = done.send(());
            }
        }
    }
}

async fn serve_http(addr: SocketAddr, startup_delay: Duration, era: Era) -> anyhow::Result<()> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    // The first line on stdout is the bound address; tests read it to find the port.
    println!("{bound}");
    let shared = TestServer::new(startup_delay, None, era);
    let service = StreamableHttpService::new(
        move || Ok(shared.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default()
            // In 2026-07-28 a closed response stream is a cancel; rmcp's server notices it
            // when it writes, so a quiet call's stream gets a keep-alive to write.
            .with_sse_keep_alive((era == Era::Stateless).then_some(Duration::from_millis(100)))
            // A 2026-07-28-only server keeps no sessions.
            .with_legacy_session_mode(era != Era::Stateless),
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    // Without `TCP_NODELAY` an event written after the response's head waits for the client's
    // delayed acknowledgement (40 ms) whenever a client reuses its connection.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await?;
    Ok(())
}
