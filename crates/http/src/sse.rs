//! Server-sent events: the framing of engine events, the lost-events notice, and the two streams
//! — one turn's events (`POST /v1/turns` with `Accept: text/event-stream`) and every event
//! (`GET /v1/events`).
//!
//! Each engine event is one SSE event: `id:` its `seq`, `event:` its `type`, `data:` the event as
//! JSON. When events cannot be delivered — the client fell behind the bus, or asked to resume
//! from a `seq` the replay ring no longer holds — the stream says so with a `lost` event (no
//! `id:`, so a client's `Last-Event-ID` stays on the last real event).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use toolwarden_core::shared::RemoteEvent;
use toolwarden_core::{AuditStore, Received, ResultRenderer, Subscription, TurnHandle, TurnOutput};
use toolwarden_protocol::{
    AUDIT_MAX_LIMIT, AuditEvent, AuditQuery, Event, EventKind, SessionId, Status, ToolCall, TurnId,
};

/// An SSE response that sends a keep-alive comment after `keep_alive` without an event.
pub(crate) fn response<S>(stream: S, keep_alive: Duration) -> Response
where
    S: Stream<Item = Result<SseEvent, Infallible>> + Send + 'static,
{
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(keep_alive).text("keep-alive"))
        .into_response();
    // Ask reverse proxies (nginx) not to buffer the stream.
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// One engine event as an SSE event.
pub(crate) fn event_frame(event: &Event) -> SseEvent {
    let data = serde_json::to_string(event).unwrap_or_else(|_| "{}".to_owned());
    SseEvent::default()
        .id(event.seq.to_string())
        .event(event.kind.name())
        .data(data)
}

/// Why events were not delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lost {
    /// The client fell behind the bus by more than its capacity; `missed` events (of every
    /// session) were dropped.
    Lagged { missed: u64 },
    /// The `Last-Event-ID` to resume after is older than the replay ring: events after it up to
    /// `resumed_at` (exclusive) are gone.
    ResumeGap { after_seq: u64, resumed_at: u64 },
    /// The `Last-Event-ID` is ahead of this process's sequence: it came from an earlier run of
    /// the server (sequences restart at 1). Nothing is replayed.
    UnknownSeq { after_seq: u64, last_seq: u64 },
}

/// The `lost` notice.
pub(crate) fn lost_frame(lost: Lost) -> SseEvent {
    let data = match lost {
        Lost::Lagged { missed } => json!({"type": "lost", "reason": "lagged", "missed": missed}),
        Lost::ResumeGap {
            after_seq,
            resumed_at,
        } => json!({
            "type": "lost",
            "reason": "resume_gap",
            "after_seq": after_seq,
            "resumed_at_seq": resumed_at,
            "missed": resumed_at.saturating_sub(after_seq + 1),
        }),
        Lost::UnknownSeq {
            after_seq,
            last_seq,
        } => json!({
            "type": "lost",
            "reason": "unknown_seq",
            "after_seq": after_seq,
            "last_seq": last_seq,
        }),
    };
    SseEvent::default().event("lost").data(data.to_string())
}

/// One stored event as an SSE event: the same framing as a live one.
pub(crate) fn stored_frame(event: &AuditEvent) -> SseEvent {
    SseEvent::default()
        .id(event.seq.to_string())
        .event(event.kind.as_str())
        .data(event.body.get())
}

/// Events after `after` and before `until` (exclusive), read from the audit trail: what a
/// resuming client missed and the replay ring no longer holds.
pub(crate) struct StoredRange {
    pub(crate) store: Arc<dyn AuditStore>,
    pub(crate) after: u64,
    pub(crate) until: u64,
    pub(crate) session: Option<SessionId>,
    pub(crate) principal: Option<String>,
    /// With `principal`, the events about no turn too.
    pub(crate) with_unattributed: bool,
}

/// How long a resume waits for the trail to commit the events it must read.
const STORED_WAIT: Duration = Duration::from_secs(5);

impl StoredRange {
    /// The range's events, a page at a time; a `lost{resume_gap}` for what cannot be read.
    fn frames(self) -> impl Stream<Item = SseEvent> + Send + 'static {
        futures::stream::unfold(Some(self), |state| async move {
            let mut range = state?;
            if range.after + 1 >= range.until {
                return None;
            }
            let committed =
                tokio::time::timeout(STORED_WAIT, range.store.readable(Some(range.until - 1)))
                    .await;
            let page = match committed {
                Ok(Ok(())) => {
                    range
                        .store
                        .events(AuditQuery {
                            session: range.session.clone(),
                            principal: range.principal.clone(),
                            with_unattributed: range.with_unattributed,
                            after: Some(range.after),
                            own: true,
                            limit: AUDIT_MAX_LIMIT,
                            ..AuditQuery::default()
                        })
                        .await
                }
                _ => Err(toolwarden_core::StoreReadError("not committed".into())),
            };
            let gap = |after: u64, until: u64| {
                lost_frame(Lost::ResumeGap {
                    after_seq: after,
                    resumed_at: until,
                })
            };
            let frames: Vec<SseEvent> = match page {
                Ok(page) => {
                    let done = page.next.is_none()
                        || page.events.last().is_none_or(|e| e.seq + 1 >= range.until);
                    let frames = page
                        .events
                        .iter()
                        .filter(|e| e.seq < range.until)
                        .map(stored_frame)
                        .collect();
                    range.after = if done {
                        range.until
                    } else {
                        page.events.last().map_or(range.until, |e| e.seq)
                    };
                    frames
                }
                Err(_) => {
                    let frame = gap(range.after, range.until);
                    range.after = range.until;
                    vec![frame]
                }
            };
            Some((futures::stream::iter(frames), Some(range)))
        })
        .flatten()
    }
}

/// Which events a stream carries.
#[derive(Clone, Debug, Default)]
pub(crate) struct EventFilter {
    /// Only those of this session id.
    pub(crate) session: Option<SessionId>,
    /// Only those of this principal's turns…
    pub(crate) principal: Option<Arc<str>>,
    /// …and, when set, also those about no call (server states, breakers).
    pub(crate) with_unattributed: bool,
}

impl EventFilter {
    fn keeps(&self, e: &Event) -> bool {
        let session = self
            .session
            .as_ref()
            .is_none_or(|s| e.scope.session_id.as_ref() == Some(s));
        let principal = match (&self.principal, &e.scope.principal) {
            (None, _) => true,
            (Some(_), None) => self.with_unattributed,
            (Some(want), Some(is)) => want == is,
        };
        session && principal
    }
}

/// Every event the filter keeps, after what a resuming client missed: first from the audit
/// trail (`stored`), then from the replay ring, then live.
pub(crate) fn all_events(
    notice: Option<Lost>,
    stored: Option<StoredRange>,
    replay: Vec<Arc<Event>>,
    sub: Subscription,
    remote: Option<broadcast::Receiver<RemoteEvent>>,
    filter: EventFilter,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    let filter = Arc::new(filter);
    let keep = move |e: &Event| filter.keeps(e);
    let keep_remote = keep.clone();
    let first: Vec<SseEvent> = notice
        .map(lost_frame)
        .into_iter()
        .chain(replay.iter().filter(|e| keep(e)).map(|e| event_frame(e)))
        .collect();
    let live = futures::stream::unfold(sub, move |mut sub| {
        let keep = keep.clone();
        async move {
            loop {
                match sub.recv().await? {
                    Received::Event(e) if keep(&e) => return Some((event_frame(&e), sub)),
                    Received::Event(_) => {}
                    Received::Lagged(missed) => {
                        return Some((lost_frame(Lost::Lagged { missed }), sub));
                    }
                }
            }
        }
    });
    let others = futures::stream::unfold(remote, move |remote| {
        let keep = keep_remote.clone();
        async move {
            let mut remote = remote?;
            loop {
                match remote.recv().await {
                    Ok(e) if keep(&e.event) => return Some((remote_frame(&e), Some(remote))),
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        return Some((lost_frame(Lost::Lagged { missed }), Some(remote)));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    });
    let stored = futures::stream::iter(stored)
        .map(StoredRange::frames)
        .flatten();
    let live = futures::stream::select(live, others);
    futures::StreamExt::map(stored.chain(futures::stream::iter(first)).chain(live), Ok)
}

/// Another replica's event: `event:` its type, `data:` the event as JSON with `replica` beside
/// its fields, and no `id:` — its `seq` is that replica's, so a client's `Last-Event-ID` stays on
/// this replica's last event.
pub(crate) fn remote_frame(remote: &RemoteEvent) -> SseEvent {
    let mut data = serde_json::to_value(&*remote.event).unwrap_or_else(|_| json!({}));
    if let Value::Object(obj) = &mut data {
        obj.insert("replica".into(), Value::from(&*remote.replica));
    }
    SseEvent::default()
        .event(remote.event.kind.name())
        .data(data.to_string())
}

type Finish = Pin<Box<dyn Future<Output = TurnOutput> + Send>>;

/// The state of one turn's stream. It owns the turn's handle (inside `finish`): when the client
/// goes away, the body and with it this state are dropped, and so the turn is aborted as a
/// `client_disconnect`.
struct TurnStream {
    sub: Subscription,
    finish: Option<Finish>,
    output: Option<TurnOutput>,
    turn_id: TurnId,
    session_id: SessionId,
    calls: Vec<ToolCall>,
    render: ResultRenderer,
    done: bool,
}

enum SseStep {
    Frame(SseEvent),
    End,
}

impl TurnStream {
    /// Frames one received item; `None` when it is another turn's event.
    fn take(&mut self, received: Received) -> Option<SseEvent> {
        match received {
            Received::Event(e) if e.scope.turn_id.as_ref() == Some(&self.turn_id) => {
                if matches!(e.kind, EventKind::TurnEnd { .. }) {
                    self.done = true;
                }
                Some(event_frame(&e))
            }
            Received::Event(_) => None,
            Received::Lagged(missed) => Some(lost_frame(Lost::Lagged { missed })),
        }
    }

    async fn step(&mut self) -> SseStep {
        loop {
            if self.done {
                return SseStep::End;
            }
            if let Some(finish) = self.finish.as_mut() {
                tokio::select! {
                    biased;
                    received = self.sub.recv() => match received {
                        Some(r) => if let Some(frame) = self.take(r) {
                            return SseStep::Frame(frame);
                        },
                        None => return SseStep::End,
                    },
                    output = finish => {
                        self.finish = None;
                        self.output = Some(output);
                    }
                }
                continue;
            }
            // The turn has ended, so its `turn_end` is already on the bus: deliver what is
            // left of it, or — when it was lost to lag — say how it ended from its results.
            match self.sub.try_recv() {
                Some(r) => {
                    if let Some(frame) = self.take(r) {
                        return SseStep::Frame(frame);
                    }
                }
                None => {
                    self.done = true;
                    return SseStep::Frame(self.synthetic_end());
                }
            }
        }
    }

    /// A `turn_end` rebuilt from the turn's output (only when the real one was lost to lag; it
    /// has no `seq`).
    fn synthetic_end(&self) -> SseEvent {
        let results: Vec<Value> = self
            .output
            .iter()
            .flat_map(|o| o.results.iter().zip(&self.calls))
            .map(|(r, c)| (self.render)(c, r))
            .collect();
        let outcome = match &self.output {
            Some(o) if o.results.iter().all(|r| r.outcome.status == Status::Ok) => "completed",
            _ => "partial",
        };
        let data = json!({
            "seq": null,
            "ts": toolwarden_protocol::Timestamp::now(),
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "type": "turn_end",
            "outcome": outcome,
            "results": results,
        });
        SseEvent::default().event("turn_end").data(data.to_string())
    }
}

/// One turn's events, from `turn_start` to `turn_end`. `sub` must have been taken before the turn
/// started, so that nothing of it is missed.
pub(crate) fn turn_events(
    sub: Subscription,
    handle: TurnHandle,
    calls: Vec<ToolCall>,
    render: ResultRenderer,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    let state = TurnStream {
        sub,
        turn_id: handle.turn_id().clone(),
        session_id: handle.session_id().clone(),
        finish: Some(Box::pin(handle.finish())),
        output: None,
        calls,
        render,
        done: false,
    };
    futures::stream::unfold(state, |mut state| async move {
        match state.step().await {
            SseStep::Frame(frame) => Some((Ok(frame), state)),
            SseStep::End => None,
        }
    })
}
