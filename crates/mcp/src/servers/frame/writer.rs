//! A stdio server's stdin, written in batches: what is sent while a write is under way goes out
//! together in the next write.
//!
//! rmcp writes and flushes every message on its own, one pipe write each; a server then wakes
//! once per message, reads one line, answers it and sleeps again. With many calls in flight
//! that per-message wake-up was most of what a server like the Node reference server spent per
//! call. Here a message that finds the pipe free and nothing waiting is written at once, by the
//! task that sends it (one non-blocking write: no other task wakes for it); a message that finds
//! a write under way is appended to a buffer, and the writer task writes everything pending at
//! once when the pipe is free again, so the server reads several lines per wake-up. What the
//! pipe does not take at once (it is full: the server is not reading) is left to the writer
//! task too, ahead of anything queued after it.
//!
//! Our own `tools/call` requests, sent past rmcp (`super::Direct`), are queued the same way
//! through a [`Queue`]: rmcp's messages and ours share the one pipe and buffer, in the order
//! they were handed over.
//!
//! A flush returns once the message is handed over, not once it is in the pipe. A write that
//! fails (the server closed its stdin, or died) fails every later write and flush, as the pipe
//! itself would; a call whose request was lost that way ends with its connection, as it does
//! when the server dies after reading it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;
use tokio::io::{AsyncWrite, AsyncWriteExt as _};
use tokio::sync::Notify;

/// Past this many bytes waiting, writers wait for the pipe (the server is not reading).
const MAX_PENDING: usize = 4 * 1024 * 1024;

/// The pipe, behind one type whatever the server's stdin is.
type Pipe = Box<dyn AsyncWrite + Unpin + Send>;

/// The handle rmcp writes to.
pub(super) struct BatchedWriter {
    buffer: Arc<Buffer>,
}

struct Buffer {
    state: Mutex<BufferState>,
    /// Wakes the writer task: something to write, or the end.
    work: Notify,
}

#[derive(Default)]
struct BufferState {
    /// The pipe while nobody writes to it: a write takes it and puts it back after.
    pipe: Option<Pipe>,
    pending: Vec<u8>,
    /// A write from a sender's task left the pipe to flush (the writer task does).
    unflushed: bool,
    /// The first write error; every later write and flush fails with it.
    failed: Option<(io::ErrorKind, String)>,
    /// No more writes: write what is pending, then close the pipe.
    closing: bool,
    /// The pipe is closed (or failed): the writer task is gone.
    done: bool,
    /// Writers waiting for room, or for the close.
    waiting: Vec<Waker>,
}

impl BufferState {
    fn error(&self) -> Option<io::Error> {
        self.failed
            .as_ref()
            .map(|(kind, message)| io::Error::new(*kind, message.clone()))
    }

    fn wake_all(&mut self) {
        for waker in self.waiting.drain(..) {
            waker.wake();
        }
    }
}

/// Another way into the same buffer, for messages sent past rmcp. Unlike the
/// [`BatchedWriter`], dropping it does not close the pipe.
#[derive(Clone)]
pub(super) struct Queue {
    buffer: Arc<Buffer>,
}

impl Queue {
    /// Queues one whole message; fails as a write to the pipe would.
    pub(super) async fn push(&self, message: &[u8]) -> io::Result<()> {
        std::future::poll_fn(|cx| self.buffer.poll_push(cx, message))
            .await
            .map(drop)
    }
}

impl Buffer {
    /// Hands `buf` over whole, or not at all (waiting for room): written at once when the pipe
    /// is free and nothing waits before it, else appended for the writer task.
    fn poll_push(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let mut state = self.state.lock();
        if let Some(e) = state.error() {
            return Poll::Ready(Err(e));
        }
        if state.closing || state.done {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the server's stdin is closed",
            )));
        }
        if state.pending.is_empty()
            && let Some(mut pipe) = state.pipe.take()
        {
            drop(state);
            let (written, flushed) = write_now(&mut pipe, buf);
            let mut state = self.state.lock();
            state.pipe = Some(pipe);
            // What the pipe did not take goes ahead of what was queued meanwhile. A failed
            // write leaves it all to the writer task, which meets the error and records it.
            if written < buf.len() {
                state.pending.splice(0..0, buf[written..].iter().copied());
            }
            state.unflushed |= !flushed;
            let wake = !state.pending.is_empty() || state.unflushed || state.closing;
            drop(state);
            if wake {
                self.work.notify_one();
            }
            return Poll::Ready(Ok(buf.len()));
        }
        if !state.pending.is_empty() && state.pending.len() + buf.len() > MAX_PENDING {
            state.waiting.push(cx.waker().clone());
            return Poll::Pending;
        }
        state.pending.extend_from_slice(buf);
        drop(state);
        self.work.notify_one();
        Poll::Ready(Ok(buf.len()))
    }
}

/// One try at writing `buf` (and flushing it) without waiting: how much the pipe took, and
/// whether it is flushed. Nothing waits for the pipe here, so no waker is left with it that
/// matters: the writer task registers its own when it writes the rest.
fn write_now(pipe: &mut Pipe, buf: &[u8]) -> (usize, bool) {
    let mut cx = Context::from_waker(Waker::noop());
    let written = match Pin::new(&mut *pipe).poll_write(&mut cx, buf) {
        Poll::Ready(Ok(n)) => n,
        Poll::Ready(Err(_)) | Poll::Pending => return (0, true),
    };
    let flushed = matches!(Pin::new(pipe).poll_flush(&mut cx), Poll::Ready(Ok(())));
    (written, flushed)
}

impl BatchedWriter {
    /// A [`Queue`] into this writer's buffer.
    pub(super) fn queue(&self) -> Queue {
        Queue {
            buffer: self.buffer.clone(),
        }
    }

    /// Starts the writer task for `pipe`.
    pub(super) fn spawn<W>(pipe: W) -> BatchedWriter
    where
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let buffer = Arc::new(Buffer {
            state: Mutex::new(BufferState {
                pipe: Some(Box::new(pipe)),
                ..BufferState::default()
            }),
            work: Notify::new(),
        });
        tokio::spawn(write_loop(buffer.clone()));
        BatchedWriter { buffer }
    }
}

/// What the writer task does next.
enum Next {
    /// Wait to be woken: nothing to write, or a sender is writing.
    Wait,
    /// Write the batch to the pipe (taken while it writes).
    Write(Pipe),
    /// Close the pipe: all is written and no more comes.
    Close(Pipe),
}

/// The writer task: writes what is pending whenever the pipe is free, and closes it at the end.
async fn write_loop(buffer: Arc<Buffer>) {
    let mut batch = Vec::new();
    let mut pipe = loop {
        let next = {
            let mut state = buffer.state.lock();
            match state.pipe.take() {
                // A sender is writing; it wakes this task if it leaves anything to do.
                None => Next::Wait,
                Some(pipe) => {
                    std::mem::swap(&mut batch, &mut state.pending);
                    if !batch.is_empty() {
                        // Room again for writers that waited.
                        state.wake_all();
                    }
                    // Something is pending, or a sender's write wants its flush.
                    let flush = std::mem::take(&mut state.unflushed);
                    if !batch.is_empty() || flush {
                        Next::Write(pipe)
                    } else if state.closing {
                        Next::Close(pipe)
                    } else {
                        state.pipe = Some(pipe);
                        Next::Wait
                    }
                }
            }
        };
        let mut pipe = match next {
            Next::Wait => {
                buffer.work.notified().await;
                continue;
            }
            Next::Close(pipe) => break pipe,
            Next::Write(pipe) => pipe,
        };
        let written = match pipe.write_all(&batch).await {
            Ok(()) => pipe.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            let mut state = buffer.state.lock();
            state.failed = Some((e.kind(), e.to_string()));
            state.done = true;
            state.pending = Vec::new();
            state.wake_all();
            return;
        }
        buffer.state.lock().pipe = Some(pipe);
        batch.clear();
        if batch.capacity() > MAX_PENDING {
            batch = Vec::new();
        }
    };
    let closed = pipe.shutdown().await;
    let mut state = buffer.state.lock();
    if let Err(e) = closed
        && state.failed.is_none()
    {
        state.failed = Some((e.kind(), e.to_string()));
    }
    state.done = true;
    state.wake_all();
}

impl AsyncWrite for BatchedWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.buffer.poll_push(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Handed over is as far as a flush goes (see the module docs).
        match self.buffer.state.lock().error() {
            Some(e) => Poll::Ready(Err(e)),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = self.buffer.state.lock();
        if state.done {
            return Poll::Ready(state.error().map_or(Ok(()), Err));
        }
        if !state.closing {
            state.closing = true;
            self.buffer.work.notify_one();
        }
        state.waiting.push(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for BatchedWriter {
    fn drop(&mut self) {
        // What was handed over is still written; then the pipe closes.
        self.buffer.state.lock().closing = true;
        self.buffer.work.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt as _;

    #[tokio::test]
    async fn messages_arrive_whole_and_in_order_then_the_pipe_closes() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut writer = BatchedWriter::spawn(ours);
        let mut expected = Vec::new();
        for n in 0..200 {
            let line = format!("{{\"id\":{n}}}\n");
            writer.write_all(line.as_bytes()).await.unwrap();
            writer.flush().await.unwrap();
            expected.extend_from_slice(line.as_bytes());
        }
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            theirs.read_to_end(&mut got).await.unwrap();
            got
        });
        writer.shutdown().await.unwrap();
        assert_eq!(reader.await.unwrap(), expected);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn messages_from_many_tasks_arrive_whole_and_each_task_in_order() {
        // A pipe that takes little at a time: most messages find a write under way, some are
        // cut short and finished by the writer task.
        let (ours, mut theirs) = tokio::io::duplex(100);
        let writer = BatchedWriter::spawn(ours);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            theirs.read_to_end(&mut got).await.unwrap();
            got
        });
        let senders: Vec<_> = (0..8)
            .map(|task| {
                let queue = writer.queue();
                tokio::spawn(async move {
                    for n in 0..300 {
                        let line = format!(
                            "{{\"task\":{task},\"n\":{n},\"pad\":\"{}\"}}\n",
                            "x".repeat(n % 70)
                        );
                        queue.push(line.as_bytes()).await.unwrap();
                    }
                })
            })
            .collect();
        for sender in senders {
            sender.await.unwrap();
        }
        let mut writer = writer;
        writer.shutdown().await.unwrap();
        let got = String::from_utf8(reader.await.unwrap()).unwrap();
        let mut next = [0_u64; 8];
        for line in got.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("a whole message");
            let task = usize::try_from(v["task"].as_u64().unwrap()).unwrap();
            assert_eq!(
                v["n"].as_u64().unwrap(),
                next[task],
                "task {task} out of order"
            );
            next[task] += 1;
        }
        assert_eq!(next, [300; 8]);
    }

    #[tokio::test]
    async fn a_closed_pipe_fails_later_writes() {
        let (ours, theirs) = tokio::io::duplex(64);
        drop(theirs);
        let mut writer = BatchedWriter::spawn(ours);
        writer.write_all(b"{}\n").await.unwrap();
        // The writer task finds the pipe closed; every write after that fails.
        let mut failed = false;
        for _ in 0..1000 {
            tokio::task::yield_now().await;
            if writer.write_all(b"{}\n").await.is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "writes kept succeeding on a closed pipe");
        assert!(writer.flush().await.is_err());
    }
}
