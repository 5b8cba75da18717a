//! `GET /v1/events`: every event as SSE, optionally of one session, resumable by `Last-Event-ID`.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use std::sync::Arc;

use toolwarden_protocol::{Scope, SessionId};

use crate::app::App;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::sse::{self, EventFilter, Lost};

/// The query of `GET /v1/events`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsQuery {
    session_id: Option<String>,
    principal: Option<String>,
}

/// The `Last-Event-ID` to resume after, if any.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("").trim();
    if text.is_empty() {
        // An empty id is what a browser sends after an event that reset it: start live.
        return Ok(None);
    }
    text.parse::<u64>().map(Some).map_err(|_| {
        ApiError::invalid(format!(
            "Last-Event-ID: expected an event seq (a non-negative integer), got {text:?}"
        ))
    })
}

/// `GET /v1/events`.
pub(crate) async fn stream(
    State(app): State<App>,
    caller: Caller,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid(format!("query: {e}")))?;
    let session = match query.session_id {
        Some(s) if s.is_empty() => {
            return Err(ApiError::invalid("session_id: must not be empty"));
        }
        other => other.map(SessionId::from),
    };
    // Without `read`, the caller's own events (and those about no call); `principal=` narrows
    // a reader's stream to one principal.
    let filter = match query.principal {
        Some(p) if p.is_empty() => return Err(ApiError::invalid("principal: must not be empty")),
        Some(p) if p != caller.name() && !caller.may(Scope::Read) => {
            return Err(ApiError::lacks(
                &caller.0,
                Scope::Read,
                &format!("follow principal {p:?}'s events"),
            ));
        }
        Some(p) => EventFilter {
            session: session.clone(),
            principal: Some(Arc::from(p)),
            with_unattributed: false,
        },
        None if caller.may(Scope::Read) => EventFilter {
            session: session.clone(),
            ..EventFilter::default()
        },
        None => EventFilter {
            session: session.clone(),
            principal: Some(caller.0.name.clone()),
            with_unattributed: true,
        },
    };
    let bus = app.engine.events();
    // With replicas sharing state, every replica's events (live only: a resume replays this
    // replica's own).
    let remote = app
        .engine
        .shared_health()
        .is_some()
        .then(|| app.engine.remote_events());
    let mut stored = None;
    let (notice, replay, sub) = match last_event_id(&headers)? {
        None => (None, Vec::new(), bus.subscribe()),
        Some(after) => {
            let last = bus.last_seq();
            let (replay, complete, sub) = bus.subscribe_since(after);
            let notice = if after > last {
                Some(Lost::UnknownSeq {
                    after_seq: after,
                    last_seq: last,
                })
            } else {
                let resumed_at = replay.first().map_or(last + 1, |e| e.seq);
                let gap = !complete || resumed_at > after + 1;
                match app.engine.store() {
                    // What the ring no longer holds (or never held: an earlier run's events)
                    // comes from the audit trail.
                    Some(store) if gap => {
                        stored = Some(sse::StoredRange {
                            store: store.clone(),
                            after,
                            until: resumed_at,
                            session: session.clone(),
                            principal: filter.principal.as_deref().map(str::to_owned),
                            with_unattributed: filter.with_unattributed,
                        });
                        None
                    }
                    _ => gap.then_some(Lost::ResumeGap {
                        after_seq: after,
                        resumed_at,
                    }),
                }
            };
            (notice, replay, sub)
        }
    };
    Ok(sse::response(
        sse::all_events(notice, stored, replay, sub, remote, filter),
        app.keep_alive,
    ))
}
