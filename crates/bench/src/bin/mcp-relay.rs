//! `mcp-relay`: the least a gateway from Streamable HTTP to a stdio MCP server can do, as a
//! yardstick for `/mcp` (docs/PERFORMANCE.md, "A relay that does nothing").
//!
//! It listens on HTTP with the stack `toolwarden serve` uses (tokio's multi-thread runtime with a
//! worker per core, axum, hyper, `TCP_NODELAY`, mimalloc), spawns one stdio server and passes
//! each POSTed JSON-RPC message to it as one line, unchanged. A request's answer goes back as the
//! body of its POST (`application/json`); anything else gets `202 Accepted` at once. It reads
//! only each message's `id` and whether it has a `method`, to pair an answer with its request.
//! A message is written to the server's stdin by the request's own task, at once, when the pipe
//! takes it and nothing is queued; what the pipe does not take waits, in order, for a task that
//! writes it when the pipe has room (no worker ever blocks on the pipe). It keeps no session,
//! governs nothing and records nothing; the server's notifications and requests are dropped, and
//! so is an answer whose id is `null` (it names no request). So the same three processes in the
//! same chain, with nothing between them but the transport, show how much of the path through
//! `/mcp` is the chain itself.
//!
//! Ids must be unique among the requests in flight (one client session, as `mcp-load` makes);
//! a request whose id is already waiting is refused with `409`. A request whose client goes away
//! stops waiting; one the server never answers waits as long as its client does.
//!
//! usage: mcp-relay [--listen ADDR] -- COMMAND [ARGS...]   (ADDR default 127.0.0.1:0; prints
//! `mcp-relay: listening on http://ADDR` on stderr; SIGTERM or SIGINT stops its server, which
//! fails what is still waiting with `502`, then the relay)

use std::collections::HashMap;
use std::future::IntoFuture as _;
use std::io::Write as _;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, bail};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::IgnoredAny;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::net::unix::pipe;
use tokio::process::{ChildStdout, Command};
use tokio::sync::oneshot;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A JSON-RPC id: what pairs an answer with its request.
#[derive(Clone, Debug, Deserialize, Hash, PartialEq, Eq)]
#[serde(untagged)]
enum Id {
    Number(i64),
    Text(String),
}

/// All the relay reads of a message.
#[derive(Deserialize)]
struct Head {
    id: Option<Id>,
    method: Option<IgnoredAny>,
}

struct Relay {
    /// The server's stdin (non-blocking).
    stdin: pipe::Sender,
    /// What the pipe has not taken yet, in order; written by [`flush`] while `flushing`.
    queue: parking_lot::Mutex<Queue>,
    waiting: parking_lot::Mutex<HashMap<Id, oneshot::Sender<Bytes>>>,
    /// The server's stdout ended: nothing will be answered any more.
    closed: AtomicBool,
}

#[derive(Default)]
struct Queue {
    bytes: Vec<u8>,
    flushing: bool,
}

impl Relay {
    /// Sends one message to the server as one line: written at once as far as the pipe takes it
    /// when nothing is queued, the rest queued for [`flush`].
    fn send(self: &Arc<Self>, message: &[u8]) -> std::io::Result<()> {
        let mut line = Vec::with_capacity(message.len() + 1);
        if memchr::memchr(b'\n', message).is_some() {
            // Pretty-printed JSON: a line must hold the whole message.
            let value: serde_json::Value = serde_json::from_slice(message)?;
            serde_json::to_writer(&mut line, &value)?;
        } else {
            line.extend_from_slice(message);
        }
        line.push(b'\n');
        let mut queue = self.queue.lock();
        if queue.flushing {
            queue.bytes.extend_from_slice(&line);
            return Ok(());
        }
        let mut at = 0;
        while at < line.len() {
            match self.stdin.try_write(&line[at..]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        if at < line.len() {
            queue.bytes.extend_from_slice(&line[at..]);
            queue.flushing = true;
            tokio::spawn(flush(self.clone()));
        }
        Ok(())
    }
}

/// Writes the queue as the pipe makes room, until it is empty.
async fn flush(relay: Arc<Relay>) {
    loop {
        let room = relay.stdin.writable().await;
        let mut queue = relay.queue.lock();
        // Done when the queue is written, or when the pipe fails (the server is gone; its
        // stdout's end fails what is waiting). `flushing` ends under the lock senders take, so
        // a line is never queued with no one left to write it.
        let done = room.is_err()
            || loop {
                match relay.stdin.try_write(&queue.bytes) {
                    Ok(n) => {
                        queue.bytes.drain(..n);
                        if queue.bytes.is_empty() {
                            break true;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                    Err(_) => break true,
                }
            };
        if done {
            queue.bytes.clear();
            queue.flushing = false;
            return;
        }
    }
}

/// A request's place among those waiting, given up when its handler ends without an answer
/// (its client went away).
struct Place<'a> {
    relay: &'a Relay,
    id: Option<Id>,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.relay.waiting.lock().remove(&id);
        }
    }
}

/// `POST /mcp`.
async fn post(State(relay): State<Arc<Relay>>, body: Bytes) -> Response {
    let gone = || (StatusCode::BAD_GATEWAY, "the server is gone").into_response();
    if relay.closed.load(Ordering::Acquire) {
        return gone();
    }
    let head: Head = match serde_json::from_slice(&body) {
        Ok(head) => head,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("not one JSON-RPC message: {e}"),
            )
                .into_response();
        }
    };
    let request = match (head.id, head.method) {
        (Some(id), Some(_)) => id,
        // An `"id": null` reads as no id: not a request the relay can pair.
        // A notification, or the client's answer to the server: nothing comes back.
        _ => {
            return match relay.send(&body) {
                Ok(()) => StatusCode::ACCEPTED.into_response(),
                Err(e) => {
                    (StatusCode::BAD_GATEWAY, format!("the server is gone: {e}")).into_response()
                }
            };
        }
    };
    let (tx, rx) = oneshot::channel();
    {
        let mut waiting = relay.waiting.lock();
        if waiting.contains_key(&request) {
            return (
                StatusCode::CONFLICT,
                format!("a request with id {request:?} is already waiting"),
            )
                .into_response();
        }
        waiting.insert(request.clone(), tx);
    }
    let mut place = Place {
        relay: &relay,
        id: Some(request),
    };
    if let Err(e) = relay.send(&body) {
        return (StatusCode::BAD_GATEWAY, format!("the server is gone: {e}")).into_response();
    }
    // The server may have ended between the check above and the insertion.
    if relay.closed.load(Ordering::Acquire) {
        return gone();
    }
    let answer = rx.await;
    // Answered or failed, the place is no longer this request's: it must not take another's.
    place.id = None;
    match answer {
        Ok(answer) => ([(header::CONTENT_TYPE, "application/json")], answer).into_response(),
        Err(_) => (
            StatusCode::BAD_GATEWAY,
            "the server ended before it answered",
        )
            .into_response(),
    }
}

/// Reads the server's lines and hands each answer to the request waiting for it.
async fn read_answers(relay: Arc<Relay>, stdout: ChildStdout) {
    let mut lines = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        match lines.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Ok(Head {
            id: Some(id),
            method: None,
        }) = serde_json::from_slice(&line)
        else {
            continue; // a notification or a request of the server's, or not JSON
        };
        if let Some(tx) = relay.waiting.lock().remove(&id) {
            let end = line.len() - usize::from(line.last() == Some(&b'\n'));
            let _ = tx.send(Bytes::copy_from_slice(&line[..end]));
        }
    }
    // The server is gone: every waiting request fails, and every later one at once.
    relay.closed.store(true, Ordering::Release);
    relay.waiting.lock().clear();
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:0".to_owned();
    let mut command = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().context("--listen needs an address")?,
            "--" => command.extend(args.by_ref()),
            other => bail!(
                "mcp-relay: unknown argument {other:?} (usage: mcp-relay [--listen ADDR] -- COMMAND [ARGS...])"
            ),
        }
    }
    let Some((program, program_args)) = command.split_first() else {
        bail!(
            "mcp-relay: no server command (usage: mcp-relay [--listen ADDR] -- COMMAND [ARGS...])"
        );
    };
    // The server's stdin: its end blocking, as a child expects; ours non-blocking.
    let (stdin_read, stdin) = std::io::pipe().context("mcp-relay: a pipe")?;
    let mut child = Command::new(program)
        .args(program_args)
        .stdin(Stdio::from(stdin_read))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("mcp-relay: cannot start {program}"))?;
    let stdout = child.stdout.take().context("the server's stdout")?;
    let relay = Arc::new(Relay {
        stdin: pipe::Sender::from_owned_fd(stdin.into())?,
        queue: parking_lot::Mutex::new(Queue::default()),
        waiting: parking_lot::Mutex::new(HashMap::new()),
        closed: AtomicBool::new(false),
    });
    tokio::spawn(read_answers(relay.clone(), stdout));

    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("mcp-relay: cannot listen on {listen}"))?;
    // One write: `eprintln!` writes its pieces one by one, and a script polling the log for
    // this line could read the address cut short.
    let announce = format!(
        "mcp-relay: listening on http://{}\n",
        listener.local_addr()?
    );
    std::io::stderr().write_all(announce.as_bytes())?;
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let app = axum::Router::new()
        .route("/mcp", axum::routing::post(post))
        .with_state(relay);
    // The server ends first on a signal: the requests still waiting fail at once (its stdout
    // ends), so the graceful shutdown waits for nothing.
    let (stop_server, stopped) = oneshot::channel::<()>();
    let mut server = tokio::spawn(async move {
        tokio::select! {
            status = child.wait() => Some(status),
            _ = stopped => {
                let _ = child.kill().await;
                None
            }
        }
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        let _ = stop_server.send(());
    };
    let mut serving = std::pin::pin!(
        axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .into_future()
    );
    tokio::select! {
        served = &mut serving => {
            served?;
            server.await?;
        }
        ended = &mut server => match ended? {
            Some(status) => bail!("mcp-relay: the server exited: {}", status?),
            None => serving.await?,
        },
    }
    Ok(())
}
