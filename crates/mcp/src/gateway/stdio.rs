//! One client over a byte-stream pair (newline-delimited JSON-RPC): `toolwarden mcp` on its
//! stdin and stdout, or any reader and writer. The connection is one session, and it ends the
//! moment the client closes its side — noticed here at EOF, where rmcp itself would only cancel
//! its handlers after draining for up to 5 s.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::ServiceExt as _;
use rmcp::service::ServerInitializeError;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;
use toolwarden_protocol::CancelReason;

use super::handler::GatewayConnection;
use super::state::GatewayState;
use super::stdio_frames;

/// Why serving a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The client's `initialize` failed (anything but closing the connection).
    #[error("the MCP client's initialize failed: {0}")]
    Initialize(String),
    /// The connection's service loop failed.
    #[error("the MCP connection failed: {0}")]
    Connection(String),
}

/// Serves one client until it closes `read`, rmcp's loop ends, or `shutdown` fires (see
/// [`Gateway::serve_io`](super::Gateway::serve_io)).
pub(crate) async fn serve(
    gateway: &Arc<GatewayState>,
    read: impl AsyncRead + Send + Unpin + 'static,
    write: impl AsyncWrite + Send + Unpin + 'static,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    let connection = GatewayConnection::new(gateway.clone(), shutdown.clone());
    let session = connection.session().clone();
    let eof = CancellationToken::new();
    // The 2025-11-25 experimental tasks, which rmcp drops, are seen in the frames.
    let (read, write) = stdio_frames::wrap(read, write, gateway, &session, &shutdown);
    let read = EofWatch::new(read, eof.clone());
    let ct = CancellationToken::new();
    let running = tokio::select! {
        running = connection.serve_with_ct((read, write), ct.clone()) => match running {
            Ok(running) => running,
            Err(ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
            Err(e) => return Err(GatewayError::Initialize(e.to_string())),
        },
        _ = shutdown.cancelled() => {
            ct.cancel();
            return Ok(());
        }
    };
    let mut waiting = std::pin::pin!(running.waiting());
    let (reason, finished) = tokio::select! {
        quit = &mut waiting => {
            if let Err(e) = quit {
                gateway.end_session(&session, CancelReason::ClientDisconnect);
                return Err(GatewayError::Connection(e.to_string()));
            }
            (CancelReason::ClientDisconnect, true)
        }
        _ = eof.cancelled() => (CancelReason::ClientDisconnect, false),
        _ = shutdown.cancelled() => (CancelReason::Shutdown, false),
    };
    // Calls end at once; rmcp then drains their answers (to a client that may be gone).
    gateway.end_session(&session, reason);
    if !finished {
        if reason == CancelReason::Shutdown {
            ct.cancel();
        }
        if tokio::time::timeout(Duration::from_secs(10), &mut waiting)
            .await
            .is_err()
        {
            tracing::warn!(session = %session.id, "the MCP connection did not close within 10s");
            ct.cancel();
        }
    }
    Ok(())
}

/// Reads like `R` and fires `eof` when `R` ends or fails: the client closed its side.
struct EofWatch<R> {
    inner: R,
    eof: CancellationToken,
}

impl<R> EofWatch<R> {
    fn new(inner: R, eof: CancellationToken) -> Self {
        Self { inner, eof }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for EofWatch<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                self.eof.cancel()
            }
            Poll::Ready(Err(_)) => self.eof.cancel(),
            _ => {}
        }
        polled
    }
}
