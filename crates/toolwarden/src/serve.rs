//! `toolwarden serve`: the engine, its servers and `exec`, behind the HTTP API (docs/HTTP-API.md).
//!
//! Shutdown (SIGTERM or SIGINT) runs in this order: stop accepting connections; end every
//! running call `cancelled{shutdown}` at once and wait for its work to stop (`exec` groups
//! killed after `cancel_grace`); shut every MCP server down (process groups killed and reaped);
//! give answers still being written a moment; exit 0. A second signal exits at once.

use std::net::{SocketAddr, ToSocketAddrs as _};
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;
use toolwarden_http::{HttpOptions, listen_allowed};
use toolwarden_mcp::{Gateway, GatewayOptions};

use crate::cli::ServeArgs;
use crate::exit::{Exit, usage};
use crate::say::{Lines, say};
use crate::signals::Signals;
use crate::stack::{self, Stack};

/// After the engine and servers are down, how long answers still in flight get to be written
/// before the remaining connections (event streams never end by themselves) are dropped.
const DRAIN_CONNECTIONS: Duration = Duration::from_secs(2);

/// How many connections the kernel may hold for `serve` before it accepts them (capped by
/// `net.core.somaxconn`). The usual 1,024 overflows when a burst of agents' calls opens
/// connections faster than a busy machine schedules the accept loop: the kernel then drops the
/// handshakes and the clients see their connections reset.
const LISTEN_BACKLOG: u32 = 4096;

pub(crate) async fn run(config_path: Option<&Path>, args: ServeArgs) -> anyhow::Result<Exit> {
    // Installed first, so that a signal during start-up also shuts down in order.
    let mut signals = Signals::new().context("cannot install signal handlers")?;
    let config = stack::load_config(config_path)?;
    let written = args
        .listen
        .clone()
        .unwrap_or_else(|| stack::listen(&config).to_owned());
    let addr = resolve_listen(&written, args.listen.is_some())?;
    let token = stack::token(&config);
    let tokens = stack::token_principals(&config)?;
    // Every `token_env` is set (or the line above stopped): what is left is short tokens.
    for w in config.token_warnings(stack::token_env(&config), |var| std::env::var(var).ok()) {
        say!("warning: {w}");
    }
    let oauth_wanted = config.file.auth.oauth.is_some();
    let authenticated =
        token.as_deref().is_some_and(|t| !t.is_empty()) || !tokens.is_empty() || oauth_wanted;
    if let Err(e) = listen_allowed(&addr, authenticated) {
        usage!("{e}");
    }
    let listener = listen(addr).with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    // OAuth reads the issuer's keys now; when it cannot, it says so and refuses tokens until
    // it can (the issuer may be down for a moment; toolwarden still serves its token
    // principals and its probes).
    let oauth = match stack::oauth_settings(&config, &bound.to_string())? {
        Some(settings) => {
            let (oauth, warning) = toolwarden_http::oauth::OAuth::start(settings).await;
            if let Some(warning) = warning {
                say!(
                    "warning: [auth.oauth]: {warning}; access tokens are refused (401) until the keys can be read"
                );
            }
            Some(oauth)
        }
        None => None,
    };
    let mut stack = Stack::build(config, args.headless, stack::RecordCalls::Yes)
        .map_err(|e| stack::trail_in_use(e, "stop it, or give this one its own [store] path"))?;
    let mut opts = HttpOptions::from_config(&stack.config.file.http, token);
    opts.headless = args.headless;
    opts.tokens = tokens;
    opts.oauth = oauth;
    let auth_note = auth_note(&stack, &opts);
    let shutdown = CancellationToken::new();

    // Started before the servers, so that every state they report is printed.
    let reporter = stack::report_servers(&stack.engine);
    stack.start_servers(|_| true).await;
    // The MCP gateway's Streamable HTTP endpoint, behind the API's bearer check and always
    // behind the Host/Origin guard.
    let gateway = Gateway::new(
        stack.engine.clone(),
        stack.servers.clone(),
        gateway_options(&stack),
    );
    let mcp = axum::Router::new().route_service("/mcp", gateway.http_service(shutdown.clone()));
    let app = toolwarden_http::router_with(stack.engine.clone(), opts, Some(mcp));
    // Events and progress go out as small writes on long-lived responses: without
    // `TCP_NODELAY` each could wait for the client's delayed acknowledgement (40 ms on Linux).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY on a connection: {e}");
        }
    });
    let mut server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.clone().cancelled_owned())
            .into_future(),
    );
    announce(&stack, bound, args.headless, auth_note.as_deref());

    let failed = tokio::select! {
        stop = signals.recv() => {
            say!("toolwarden: {}: shutting down", stop.name());
            None
        }
        ended = &mut server => Some(match ended {
            Ok(Ok(())) => "the HTTP server stopped".to_owned(),
            Ok(Err(e)) => format!("the HTTP server failed: {e}"),
            Err(e) => format!("the HTTP server failed: {e}"),
        }),
    };
    tokio::spawn(async move {
        let again = signals.recv().await;
        say!("toolwarden: {} again: exiting at once", again.name());
        std::process::exit(again.exit_code());
    });

    shutdown.cancel();
    let stopped = stack.shutdown().await;
    reporter.abort();
    if !stopped {
        say!(
            "toolwarden: some work had not stopped within {:?}; its processes were killed with their servers",
            stack.shutdown_wait()
        );
    }
    if let Some(why) = failed {
        anyhow::bail!("{why}");
    }
    if tokio::time::timeout(DRAIN_CONNECTIONS, &mut server)
        .await
        .is_err()
    {
        server.abort();
    }
    say!("toolwarden: stopped");
    Ok(Exit::Ok)
}

/// A listening socket on `addr` with a backlog of `LISTEN_BACKLOG`; like `TcpListener::bind`, it
/// may reuse an address whose old connections are still in TIME_WAIT.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The gateway's options from the config: the same naming the engine's host uses.
pub(crate) fn gateway_options(stack: &Stack) -> GatewayOptions {
    GatewayOptions {
        prefix: stack.config.prefixed(),
        allowed_hosts: stack.config.file.http.allowed_hosts.clone(),
        // The same limit as the HTTP API's: `http.max_body` holds on every door.
        max_body: stack
            .config
            .file
            .http
            .max_body
            .map_or(toolwarden_http::DEFAULT_MAX_BODY, |s| {
                usize::try_from(s.bytes()).unwrap_or(usize::MAX)
            }),
        request_timeout: stack
            .config
            .file
            .gateway
            .request_timeout
            .map_or(toolwarden_mcp::DEFAULT_REQUEST_TIMEOUT, |d| d.duration()),
        ..GatewayOptions::default()
    }
}

/// Parses a listen address: `IP:PORT`, or `HOST:PORT` resolved (`localhost:7420`).
fn resolve_listen(written: &str, from_flag: bool) -> anyhow::Result<SocketAddr> {
    let source = if from_flag { "--listen" } else { "http.listen" };
    if let Ok(addr) = written.parse::<SocketAddr>() {
        return Ok(addr);
    }
    match written.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(addr)) => Ok(addr),
        _ => usage!(
            "{source}: invalid address {written:?}: expected IP:PORT or HOST:PORT, e.g. \"127.0.0.1:7420\""
        ),
    }
}

/// How requests authenticate, for the start-up lines (`None`: they do not).
fn auth_note(stack: &Stack, opts: &HttpOptions) -> Option<String> {
    let single = opts.token.is_some();
    let principals = opts.tokens.len();
    let oauth = opts.oauth.as_ref().map(|o| o.settings().issuer.clone());
    if !single && principals == 0 && oauth.is_none() {
        return None;
    }
    if principals == 0 && oauth.is_none() {
        return Some(format!(
            "bearer token from ${} required",
            stack::token_env(&stack.config)
        ));
    }
    let mut ways = Vec::new();
    if principals > 0 {
        ways.push(format!(
            "{principals} token principal{}",
            if principals == 1 { "" } else { "s" }
        ));
    }
    if single {
        ways.push(format!("${}", stack::token_env(&stack.config)));
    }
    if let Some(issuer) = oauth {
        ways.push(format!("OAuth access tokens of {issuer}"));
    }
    Some(format!("a bearer token is required ({})", ways.join(", ")))
}

/// Says on stderr where it listens and what it serves.
fn announce(stack: &Stack, bound: SocketAddr, headless: bool, auth_note: Option<&str>) {
    let base = format!("http://{bound}");
    // One write for the whole announcement: a script polling the log reads all of it or none.
    let mut out = Lines::default();
    out.push(format_args!(
        "toolwarden: config: {}",
        stack::describe_origin(&stack.config)
    ));
    out.push(format_args!("toolwarden: listening on {base}"));
    out.push(format_args!("toolwarden: dashboard at {base}/"));
    out.push(format_args!(
        "toolwarden: HTTP API at {base}/v1 (turns: POST {base}/v1/turns, events: {base}/v1/events, health: {base}/healthz, metrics: {base}/metrics){}",
        auth_note.map(|n| format!("; {n}")).unwrap_or_default()
    ));
    out.push(format_args!(
        "toolwarden: MCP gateway at {base}/mcp (Streamable HTTP; tools as {})",
        if stack.config.prefixed() {
            "SERVER__TOOL"
        } else {
            "their own names"
        }
    ));
    out.push(format_args!("toolwarden: {}", stack::describe_store(stack)));
    let tools = stack.engine.tools();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    out.push(format_args!(
        "toolwarden: tools: {}{}",
        names.len(),
        if names.is_empty() {
            String::new()
        } else {
            format!(" ({})", names.join(", "))
        }
    ));
    let servers: Vec<String> = stack
        .servers
        .iter()
        .map(|s| s.server_name().to_owned())
        .collect();
    if servers.is_empty() {
        out.push(format_args!("toolwarden: servers: none configured"));
    } else {
        out.push(format_args!(
            "toolwarden: servers starting: {}",
            servers.join(", ")
        ));
    }
    if headless {
        out.push(format_args!(
            "toolwarden: approvals: headless; calls that need an approval are denied at once"
        ));
    } else {
        out.push(format_args!(
            "toolwarden: approvals: answered at POST {base}/v1/interactions/{{id}} (listed at GET {base}/v1/interactions); unanswered ones are denied at their deadline"
        ));
    }
    out.write();
}
