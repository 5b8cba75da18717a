//! The frame guard: a filter between a stdio server's stdout and rmcp.
//!
//! rmcp's stdio transport never closes the connection over a bad line — which is good — but it
//! drops the line silently: text that is not JSON is ignored, an oversized line is discarded, and
//! JSON of the wrong shape gets an `Invalid Request` reply. When the bad line was the *answer* to
//! one of our calls, that call would wait for an answer that will never come. The guard reads
//! every line first, forwards only well-formed ones, and for a bad one reports which request it
//! touched (the top-level `"id"`, scanned even from a truncated or oversized frame), so that call
//! ends at once with a clear transport error. Lines that touch no call are only logged.
//!
//! It also takes the hot path off rmcp's parser: an answer to one of our `tools/call` requests
//! (the guard is told their ids as they go out) is parsed straight into a `CallToolResult` and
//! handed over as a message, where rmcp would try every kind of result in turn.
//!
//! And it writes the server's stdin in batches (`writer`): messages sent while a write is under
//! way go out together, so a busy server reads several per wake-up.
//!
//! On a connection that speaks a session-based revision, a call does not go through rmcp at
//! all ([`Direct`]): it queues its request on the batched writer itself, and the guard hands
//! the answer straight back to it — no trip through rmcp's service loop, which took three
//! wake-ups of that task and a task of its own for every request. The guard also delivers a
//! progress report for a call in flight as it reads it (`on_progress`), so whatever the server
//! sent before an answer reaches the call before the answer does. Everything else (a cancel,
//! `tools/list`, a server's own requests) still goes through rmcp.
//!
//! This file is the guard's read loop and the transport rmcp talks through. What a line is
//! (`check`), which request a broken line names (`id_scanner`), which ids are our unanswered
//! calls (`pending`) and the batching writer (`writer`) each have a module below it.

mod check;
mod id_scanner;
mod pending;
mod writer;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use rmcp::RoleClient;
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, NumberOrString, ProgressNotificationParam,
    ProgressToken, RequestId, ServerJsonRpcMessage,
};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader, DuplexStream,
};
use tokio::sync::mpsc;

pub(crate) use check::BadFrame;
use check::{LineAction, check};
use id_scanner::IdScanner;
pub(crate) use pending::DirectAnswer;
use pending::PendingCalls;
use writer::{BatchedWriter, Queue};

/// Receives the bad frames of one connection.
pub(crate) type OnBadFrame = Arc<dyn Fn(BadFrame) + Send + Sync>;

/// Delivers a progress report to its call now; `false` when no call in flight has its token
/// (the report then goes on to rmcp).
pub(crate) type OnProgress = Arc<dyn Fn(&ProgressNotificationParam) -> bool + Send + Sync>;

/// The first id (and progress token) of the requests sent past rmcp: rmcp numbers its own
/// from 0, so the two never meet, and JavaScript servers still read it exactly.
const DIRECT_IDS: i64 = 1 << 32;

/// What a guarded line goes to besides rmcp.
pub(crate) struct Hooks {
    pub(crate) on_bad: OnBadFrame,
    pub(crate) on_progress: OnProgress,
}

/// Starts guarding `src` (a server's stdout) and returns the transport rmcp talks to the server
/// through: it writes to `stdin` (in batches) and reads what the guard lets through. rmcp sees
/// the server close its pipe when `src` ends (or fails).
pub(crate) fn guard(
    src: impl AsyncRead + Unpin + Send + 'static,
    stdin: impl AsyncWrite + Unpin + Send + 'static,
    max_line: usize,
    hooks: Hooks,
) -> Guarded {
    let (for_rmcp, to_rmcp) = tokio::io::duplex(256 * 1024);
    let (answers_tx, answers) = mpsc::unbounded_channel();
    let calls = Arc::new(PendingCalls::default());
    tokio::spawn(run(
        src,
        to_rmcp,
        answers_tx,
        calls.clone(),
        max_line,
        hooks,
    ));
    let writer = BatchedWriter::spawn(stdin);
    Guarded {
        direct: Direct {
            queue: writer.queue(),
            calls: calls.clone(),
            next: Arc::new(AtomicI64::new(DIRECT_IDS)),
        },
        inner: AsyncRwTransport::new(for_rmcp, writer),
        answers,
        calls,
    }
}

/// rmcp's stdio transport behind the guard, plus the answers the guard parsed itself.
pub(crate) struct Guarded {
    inner: AsyncRwTransport<RoleClient, DuplexStream, BatchedWriter>,
    answers: mpsc::UnboundedReceiver<ServerJsonRpcMessage>,
    calls: Arc<PendingCalls>,
    direct: Direct,
}

impl Guarded {
    /// The way past rmcp for this connection's calls.
    pub(crate) fn direct(&self) -> Direct {
        self.direct.clone()
    }
}

/// Sends our `tools/call` requests on a guarded connection past rmcp (see the module docs).
#[derive(Clone)]
pub(crate) struct Direct {
    queue: Queue,
    calls: Arc<PendingCalls>,
    next: Arc<AtomicI64>,
}

impl Direct {
    /// A fresh request id, and the progress token that goes with it.
    pub(crate) fn next_id(&self) -> (RequestId, ProgressToken) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        (
            NumberOrString::Number(n),
            ProgressToken(NumberOrString::Number(n)),
        )
    }

    /// Queues `request` under `id` (from [`next_id`](Self::next_id)); its answer comes through
    /// the returned [`DirectAnswer`]. Fails as a write to the server's stdin would: when the
    /// server has closed it, or its output has ended.
    pub(crate) async fn send(
        &self,
        id: RequestId,
        request: ClientRequest,
    ) -> io::Result<DirectAnswer> {
        let mut line = serde_json::to_vec(&ClientJsonRpcMessage::request(request, id.clone()))?;
        line.push(b'\n');
        let answer = self.calls.expect(id).ok_or_else(|| {
            io::Error::new(io::ErrorKind::BrokenPipe, "the server's output has ended")
        })?;
        self.queue.push(&line).await?;
        Ok(answer)
    }
}

impl Transport<RoleClient> for Guarded {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let JsonRpcMessage::Request(request) = &item
            && matches!(request.request, ClientRequest::CallToolRequest(_))
        {
            self.calls.insert(request.id.clone());
        }
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        // What rmcp reads first when both are ready, so that a call's progress, read before
        // its answer, is handled before it too.
        tokio::select! {
            biased;
            message = self.inner.receive() => match message {
                Some(message) => Some(message),
                // The guard sends every answer it parsed before it closes rmcp's stream.
                None => self.answers.try_recv().ok(),
            },
            Some(answer) = self.answers.recv() => Some(answer),
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

async fn run(
    src: impl AsyncRead + Unpin,
    mut dst: DuplexStream,
    answers: mpsc::UnboundedSender<ServerJsonRpcMessage>,
    calls: Arc<PendingCalls>,
    max_line: usize,
    hooks: Hooks,
) {
    let Hooks {
        on_bad,
        on_progress,
    } = hooks;
    let mut src = BufReader::with_capacity(64 * 1024, src);
    let mut line: Vec<u8> = Vec::new();
    // Set while skipping the rest of an oversized line: its id scanner and size so far.
    let mut oversized: Option<(IdScanner, usize)> = None;
    loop {
        let (take, complete) = {
            let buf = match src.fill_buf().await {
                Ok(buf) => buf,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the server's stdout failed");
                    break;
                }
            };
            if buf.is_empty() {
                break;
            }
            let newline = buf.iter().position(|b| *b == b'\n');
            let take = newline.map_or(buf.len(), |i| i + 1);
            let chunk = &buf[..take];
            if let Some((scanner, size)) = oversized.as_mut() {
                scanner.feed(chunk);
                *size += take;
            } else if line.len() + take > max_line {
                let mut scanner = IdScanner::default();
                scanner.feed(&line);
                scanner.feed(chunk);
                oversized = Some((scanner, line.len() + take));
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
            (take, newline.is_some())
        };
        src.consume(take);
        if !complete {
            continue;
        }
        if let Some((scanner, size)) = oversized.take() {
            on_bad(BadFrame {
                id: scanner.finish(),
                problem: format!(
                    "the server sent a message of {size} bytes, over the {max_line}-byte limit"
                ),
            });
            continue;
        }
        match check(&line, &|id| calls.take(id)) {
            LineAction::Forward => {
                if dst.write_all(&line).await.is_err() {
                    break;
                }
            }
            LineAction::Answer(answer) => {
                if answers.send(*answer).is_err() {
                    break;
                }
            }
            LineAction::Direct(waiter, answer) => {
                // Its call may have stopped waiting: then the answer goes nowhere.
                let _ = waiter.send(*answer);
            }
            LineAction::Progress(progress) => {
                if !on_progress(&progress) && dst.write_all(&line).await.is_err() {
                    break;
                }
            }
            LineAction::Skip => {}
            LineAction::Bad(bad) => on_bad(bad),
            LineAction::BadAnswer(waiter, bad) => {
                on_bad(bad);
                drop(waiter);
            }
        }
        line.clear();
        if line.capacity() > 1 << 20 {
            line.shrink_to(64 * 1024);
        }
    }
    // An unterminated last line is dropped, as rmcp would. Dropping `dst` ends rmcp's input;
    // the calls sent past rmcp learn it here.
    calls.close();
}
