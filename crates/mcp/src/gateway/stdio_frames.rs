//! The frames of a stdio connection, seen before rmcp: what serves the 2025-11-25 experimental
//! tasks there (`super::handshake_tasks`), which rmcp would drop.
//!
//! [`Lines`] reads the client's side for rmcp. It looks at the first line, the `initialize`:
//! one of 2025-11-25 that declares the `tasks` capability marks the session; any other, and
//! the rest of the stream passes through untouched (no scanning, no copy beyond rmcp's own).
//! In a marked session each line is looked at: a `tools/call` with `params.task`, a
//! `tools/list` and the `tasks/*` requests are taken out and answered by the gateway; every
//! other line goes to rmcp as it came.
//!
//! [`Output`] is the writer rmcp writes to. It writes straight through, unless the session is
//! marked by the time rmcp writes its first line (the `initialize` answer, which is the first
//! thing rmcp writes, and which `Lines` saw the request of): then whole lines — rmcp's, cut at
//! their ends, and the gateway's own answers — go through one channel to a task that owns the
//! real writer, so that no line is ever cut by another; and the `initialize` answer gets
//! `capabilities.tasks` added on its way.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, PollSender};

use super::handshake_tasks;
use super::incoming::{Incoming, handed_to_rmcp, may_be_task_request};
use super::session::ClientSession;
use super::state::GatewayState;

/// How much of a first line is looked at, at most, for an `initialize`.
const FIRST_LINE_MAX: usize = 1 << 20;

/// The lines the gateway writes beside rmcp (its own answers), once the session is marked.
type Answers = mpsc::Sender<Bytes>;

/// How many lines may wait for the writer task: past that, rmcp's writes wait (as they would
/// on the client's pipe).
const QUEUED_LINES: usize = 64;

/// A connection's two sides, watched.
pub(crate) fn wrap<R, W>(
    read: R,
    write: W,
    gw: &Arc<GatewayState>,
    session: &Arc<ClientSession>,
    shutdown: &CancellationToken,
) -> (Lines<R>, Output<W>) {
    let (tx, rx) = mpsc::channel(QUEUED_LINES);
    let lines = Lines {
        inner: read,
        mode: ReadMode::First(Vec::new()),
        gw: gw.clone(),
        session: session.clone(),
        shutdown: shutdown.clone(),
        answers: tx.clone(),
        chunk: Vec::new(),
        ready: Vec::new(),
        ready_at: 0,
        eof: false,
    };
    let output = Output {
        mode: WriteMode::Direct {
            inner: Some(write),
            first_done: false,
        },
        session: session.clone(),
        channel: Some((tx, rx)),
        tasks: gw.tasks.clone(),
        line: Vec::new(),
        rewritten: false,
    };
    (lines, output)
}

enum ReadMode {
    /// Before the end of the first line (what of it came so far).
    First(Vec<u8>),
    /// A session that declared tasks: every line is looked at.
    Scan,
    /// Anything else: straight through.
    Pass,
}

/// The client's side of the connection, as rmcp reads it.
pub(crate) struct Lines<R> {
    inner: R,
    mode: ReadMode,
    gw: Arc<GatewayState>,
    session: Arc<ClientSession>,
    shutdown: CancellationToken,
    answers: Answers,
    /// What was read of a line not ended yet.
    chunk: Vec<u8>,
    /// Lines for rmcp, from `ready_at` on.
    ready: Vec<u8>,
    ready_at: usize,
    eof: bool,
}

impl<R> Lines<R> {
    /// The first line, the client's `initialize`: marks the session when it declares tasks.
    fn first_line(&mut self, line: &[u8]) {
        if handshake_tasks::declares_tasks(line) {
            self.session.declare_handshake_tasks();
            self.mode = ReadMode::Scan;
        } else {
            self.mode = ReadMode::Pass;
        }
    }

    /// Takes the line if the gateway answers it itself (on a task of its own).
    fn divert(&self, line: &[u8]) -> bool {
        if !may_be_task_request(line) {
            return false;
        }
        let Some(message) = Incoming::parse(line) else {
            return false;
        };
        let Some(answer) =
            handshake_tasks::answer_raw(&self.gw, &self.session, message, &self.shutdown)
        else {
            return false;
        };
        let answers = self.answers.clone();
        self.gw.tasks.spawn(async move {
            let mut line = answer.await.to_vec();
            line.push(b'\n');
            let _ = answers.send(line.into()).await;
        });
        true
    }

    /// Splits what was read into lines: the gateway's own taken, the rest for rmcp.
    fn take_lines(&mut self, read: &[u8]) {
        let mut rest = read;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            let (line, after) = rest.split_at(end + 1);
            rest = after;
            let whole: Vec<u8> = if self.chunk.is_empty() {
                line.to_vec()
            } else {
                let mut whole = std::mem::take(&mut self.chunk);
                whole.extend_from_slice(line);
                whole
            };
            if !self.divert(&whole) {
                handed_to_rmcp(1);
                self.ready.extend_from_slice(&whole);
            }
        }
        self.chunk.extend_from_slice(rest);
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Lines<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            match &mut this.mode {
                ReadMode::Pass => {
                    let before = buf.filled().len();
                    let read = Pin::new(&mut this.inner).poll_read(cx, buf);
                    if cfg!(feature = "parse-count") {
                        handed_to_rmcp(memchr::memchr_iter(b'\n', &buf.filled()[before..]).count());
                    }
                    return read;
                }
                ReadMode::First(seen) => {
                    // Straight through, the first line's bytes copied as they pass.
                    let before = buf.filled().len();
                    ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                    let new = &buf.filled()[before..];
                    match new.iter().position(|b| *b == b'\n') {
                        Some(end) => {
                            // What follows the first line in this read passes unlooked-at:
                            // a client sends nothing but `notifications/initialized` before
                            // the answer to its `initialize`.
                            let mut line = std::mem::take(seen);
                            line.extend_from_slice(&new[..end]);
                            if cfg!(feature = "parse-count") {
                                handed_to_rmcp(memchr::memchr_iter(b'\n', new).count());
                            }
                            this.first_line(&line);
                        }
                        None if new.is_empty() || seen.len() + new.len() > FIRST_LINE_MAX => {
                            this.mode = ReadMode::Pass;
                        }
                        None => seen.extend_from_slice(new),
                    }
                    return Poll::Ready(Ok(()));
                }
                ReadMode::Scan => {
                    if this.ready_at < this.ready.len() {
                        let n = buf.remaining().min(this.ready.len() - this.ready_at);
                        buf.put_slice(&this.ready[this.ready_at..this.ready_at + n]);
                        this.ready_at += n;
                        if this.ready_at == this.ready.len() {
                            this.ready.clear();
                            this.ready_at = 0;
                        }
                        return Poll::Ready(Ok(()));
                    }
                    if this.eof {
                        // A last line without its end goes to rmcp as it is; then the end.
                        if !this.chunk.is_empty() {
                            handed_to_rmcp(1);
                            this.ready = std::mem::take(&mut this.chunk);
                            continue;
                        }
                        return Poll::Ready(Ok(()));
                    }
                    let mut space = [0u8; 8192];
                    let mut read = ReadBuf::new(&mut space);
                    ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
                    if read.filled().is_empty() {
                        this.eof = true;
                        continue;
                    }
                    let filled = read.filled().to_vec();
                    this.take_lines(&filled);
                }
            }
        }
    }
}

enum WriteMode<W> {
    /// Straight to the client (until the first line's end, the session may still turn out
    /// to be marked: it is looked at on each write until then).
    Direct { inner: Option<W>, first_done: bool },
    /// Whole lines through the channel to the task that writes them (those cut from rmcp's
    /// writes wait in `queue` for room).
    Lines {
        tx: PollSender<Bytes>,
        queue: VecDeque<Bytes>,
    },
    /// Shut down.
    Closed,
}

/// The writer rmcp writes the gateway's side of the connection to.
pub(crate) struct Output<W> {
    mode: WriteMode<W>,
    session: Arc<ClientSession>,
    /// The channel of lines, until the writer task takes its receiving end.
    channel: Option<(Answers, mpsc::Receiver<Bytes>)>,
    tasks: tokio_util::task::TaskTracker,
    /// rmcp's line not ended yet.
    line: Vec<u8>,
    /// Whether the first line (the `initialize` answer) has been rewritten.
    rewritten: bool,
}

impl<W: AsyncWrite + Send + Unpin + 'static> Output<W> {
    /// Hands the writer to a task of its own that writes whole lines from the channel.
    fn write_by_lines(&mut self) {
        let WriteMode::Direct { inner, .. } = &mut self.mode else {
            return;
        };
        let (Some(mut write), Some((tx, mut rx))) = (inner.take(), self.channel.take()) else {
            self.mode = WriteMode::Closed;
            return;
        };
        self.tasks.spawn(async move {
            while let Some(line) = rx.recv().await {
                if write.write_all(&line).await.is_err() {
                    return;
                }
                if rx.is_empty() && write.flush().await.is_err() {
                    return;
                }
            }
            let _ = write.shutdown().await;
        });
        self.mode = WriteMode::Lines {
            tx: PollSender::new(tx),
            queue: VecDeque::new(),
        };
    }

    /// Sends the queued lines while the channel has room; ready once none is left.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let WriteMode::Lines { tx, queue } = &mut self.mode else {
            return Poll::Ready(Ok(()));
        };
        while !queue.is_empty() {
            ready!(tx.poll_reserve(cx)).map_err(|_| closed())?;
            if let Some(line) = queue.pop_front() {
                tx.send_item(line).map_err(|_| closed())?;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Queues rmcp's complete lines (the first one with the tasks capability).
    fn queue_lines(&mut self, data: &[u8]) {
        let WriteMode::Lines { queue, .. } = &mut self.mode else {
            return;
        };
        let mut rest = data;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            let (part, after) = rest.split_at(end + 1);
            rest = after;
            let mut line = std::mem::take(&mut self.line);
            line.extend_from_slice(part);
            if !self.rewritten {
                self.rewritten = true;
                line = rewrite_initialize(line);
            }
            queue.push_back(line.into());
        }
        self.line.extend_from_slice(rest);
    }
}

fn closed() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client's side closed")
}

/// The `initialize` answer line with `capabilities.tasks` added (when it negotiated 2025-11-25).
fn rewrite_initialize(line: Vec<u8>) -> Vec<u8> {
    let Ok(mut message) = serde_json::from_slice::<Value>(&line) else {
        return line;
    };
    if !handshake_tasks::advertise_in(&mut message) {
        return line;
    }
    let mut out = message.to_string().into_bytes();
    out.push(b'\n');
    out
}

impl<W: AsyncWrite + Send + Unpin + 'static> AsyncWrite for Output<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if let WriteMode::Direct {
            first_done: false, ..
        } = &this.mode
            && this.session.handshake_tasks()
        {
            this.write_by_lines();
        }
        match &mut this.mode {
            WriteMode::Direct { inner, first_done } => {
                let Some(write) = inner.as_mut() else {
                    return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
                };
                let n = ready!(Pin::new(write).poll_write(cx, data))?;
                if !*first_done && data[..n].contains(&b'\n') {
                    *first_done = true;
                }
                Poll::Ready(Ok(n))
            }
            WriteMode::Lines { .. } => {
                // What was queued goes first; new data is taken once it has room.
                ready!(this.poll_drain(cx))?;
                this.queue_lines(data);
                let _ = this.poll_drain(cx)?;
                Poll::Ready(Ok(data.len()))
            }
            WriteMode::Closed => Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.mode {
            WriteMode::Direct {
                inner: Some(write), ..
            } => Pin::new(write).poll_flush(cx),
            // Handed to the writer task, which flushes once it has written what is queued.
            WriteMode::Lines { .. } => self.poll_drain(cx),
            _ => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if let WriteMode::Direct {
            inner: Some(write), ..
        } = &mut self.mode
        {
            return Pin::new(write).poll_shutdown(cx);
        }
        let this = &mut *self;
        if let WriteMode::Lines { queue, .. } = &mut this.mode
            && !this.line.is_empty()
        {
            queue.push_back(std::mem::take(&mut this.line).into());
        }
        ready!(self.poll_drain(cx))?;
        // The writer task shuts the writer down once every sender is gone.
        self.mode = WriteMode::Closed;
        Poll::Ready(Ok(()))
    }
}
