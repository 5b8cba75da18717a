//! The HTTP response of a request the gateway answers itself (a `tools/call`, a 2025-11-25
//! task request): JSON when the answer comes first and quickly, else an event
//! stream of everything the work sends, its answer last.
//!
//! Below `dispatch` and `handshake_tasks`, which both answer this way.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use http::Response;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::state::GatewayState;

/// The body of every response of the gateway's HTTP service.
pub(crate) type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// What a call served here sends towards its HTTP response.
pub(crate) enum Out {
    /// A JSON-RPC message that must reach the client before the answer.
    Message(Bytes),
    /// The answer: the last thing sent.
    Answer(Bytes),
    /// Nothing to say yet: an event-stream comment that keeps the response alive (made by the
    /// response itself).
    KeepAlive,
}

/// What the gateway's own answers over HTTP need of its service.
pub(crate) struct Answering {
    /// `Host` names (or `name:port`) rmcp is configured to accept.
    pub(crate) hosts: toolwarden_hosts::AllowedHosts,
    /// How long an answer is waited for before the response starts as an event stream.
    pub(crate) json_window: Duration,
    pub(crate) keep_alive: Duration,
    /// The server's shutdown (a stateless call's `Door::Stream`).
    pub(crate) shutdown: CancellationToken,
}

/// Runs the call (a future that sends what it has for its client to `rx`'s sender, its answer
/// last) and answers: JSON if the answer comes first and within the window, else an event
/// stream of everything the call sends.
///
/// The call is driven by this request's own task until its answer, its first message or the
/// window's end: a quick call then costs no task of its own and no wake-up between two tasks
/// (the spawn and the hand-over were a good part of a call's cost at high rates). When its
/// response turns into an event stream, or this request is dropped before the answer, the call
/// goes on on a task of its own, exactly as if it had started there ([`Detach`]).
pub(crate) async fn respond(
    gw: &Arc<GatewayState>,
    call: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    mut rx: mpsc::UnboundedReceiver<Out>,
    answering: &Answering,
) -> Response<BoxBody> {
    let mut call = Detach {
        call: Some(call),
        tasks: gw.tasks.clone(),
    };
    let window = tokio::time::sleep(answering.json_window);
    tokio::pin!(window);
    let first = loop {
        // The call's task sends its answer (or ends the channel) before it ends: once it has
        // ended, only the channel is left to read.
        let Some(running) = call.call.as_mut() else {
            break tokio::select! {
                biased;
                first = rx.recv() => first,
                () = &mut window => None,
            };
        };
        tokio::select! {
            biased;
            first = rx.recv() => break first,
            () = running => call.call = None,
            () = &mut window => break None,
        }
    };
    if let Some(Out::Answer(answer)) = first {
        let mut response = Response::new(BoxBody::new(http_body_util::Full::new(answer)));
        response.headers_mut().insert(
            CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        return response;
    }
    call.detach();
    // An event stream keeps itself alive: a comment every `keep_alive` while nothing comes (a
    // quick answer, sent as JSON, never starts a timer for it).
    let mut first = first;
    let mut ticks = tokio::time::interval_at(
        tokio::time::Instant::now() + answering.keep_alive,
        answering.keep_alive,
    );
    // A reader that fell behind gets one comment, not the ticks it missed.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let events = futures::stream::poll_fn(move |cx| {
        if let Some(out) = first.take() {
            return Poll::Ready(Some(out));
        }
        match rx.poll_recv(cx) {
            Poll::Pending => ticks.poll_tick(cx).map(|_| Some(Out::KeepAlive)),
            ready => ready,
        }
    })
    .map(|out| Ok(http_body::Frame::data(event(out))));
    let mut response = Response::new(BoxBody::new(http_body_util::StreamBody::new(events)));
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(CACHE_CONTROL, http::HeaderValue::from_static("no-cache"));
    response
}

/// A call's task ([`run`]) while the request's own task drives it: whenever it leaves that
/// task unfinished — its response became an event stream, or the request was dropped — it is
/// spawned, and goes on to its end (it sees its response closed, if it was, and stops the call
/// as a client disconnect).
struct Detach {
    call: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>,
    tasks: tokio_util::task::TaskTracker,
}

impl Detach {
    fn detach(&mut self) {
        // Outside a runtime (it is shutting down) the call is dropped instead, which records its
        // outcome as any dropped call does.
        if let Some(call) = self.call.take()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            self.tasks.spawn(call);
        }
    }
}

impl Drop for Detach {
    fn drop(&mut self) {
        self.detach();
    }
}

/// One event-stream event.
fn event(out: Out) -> Bytes {
    match out {
        Out::Message(json) | Out::Answer(json) => {
            let mut event = Vec::with_capacity(json.len() + 8);
            event.extend_from_slice(b"data: ");
            event.extend_from_slice(&json);
            event.extend_from_slice(b"\n\n");
            event.into()
        }
        Out::KeepAlive => Bytes::from_static(b":\n\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_data_lines() {
        assert_eq!(
            event(Out::Message(Bytes::from_static(b"{\"a\":1}"))),
            Bytes::from_static(b"data: {\"a\":1}\n\n")
        );
        assert_eq!(event(Out::KeepAlive), Bytes::from_static(b":\n\n"));
    }
}
