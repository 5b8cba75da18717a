//! `POST /v1/turns`, `GET /v1/turns/active`, and the two aborts.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use toolwarden_core::{AbortError, TurnRequest};
use toolwarden_protocol::{CallId, CancelReason, Scope, SessionId, TurnId};

use crate::app::App;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::request::{body_bytes, path, require_json, traceparent, turn_error, wants_events};
use crate::{format, sse};

/// `POST /v1/turns`: runs a turn; answers JSON, or streams its events.
pub(crate) async fn create(
    State(app): State<App>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    caller.needs(Scope::Call, "run tools")?;
    require_json(&headers)?;
    let body = body_bytes(body)?;
    let turn = format::parse_turn(&body)?;
    let render = format::renderer(turn.family);
    let traceparent = traceparent(&headers);
    if turn.detach {
        return crate::audit::detach(&app, caller.0, turn, render, traceparent);
    }
    let calls = turn.calls.clone();
    let request = TurnRequest {
        principal: caller.0,
        session_id: turn.session_id,
        parent_turn_id: turn.parent_turn_id,
        calls: turn.calls,
        render: Some(render.clone()),
        traceparent,
        ..TurnRequest::default()
    };
    if wants_events(&headers) {
        // Subscribe before the turn starts so that its `turn_start` is not missed.
        let sub = app.engine.subscribe();
        let handle = app.engine.start_turn(request).map_err(turn_error)?;
        let stream = sse::turn_events(sub, handle, calls, render);
        return Ok(sse::response(stream, app.keep_alive));
    }
    let handle = app.engine.start_turn(request).map_err(turn_error)?;
    // If the client goes away, this future — and the handle it owns — is dropped, which aborts
    // the turn as a client disconnect.
    let output = handle.finish().await;
    // The list `turn_end` carried, rendered once (none only when the turn had no results).
    let results = output.rendered.unwrap_or_default();
    // Serialized straight from the shared list, not copied into a new JSON value first.
    #[derive(serde::Serialize)]
    struct TurnAnswer<'a> {
        turn_id: &'a TurnId,
        session_id: &'a SessionId,
        results: &'a [Value],
    }
    Ok(Json(TurnAnswer {
        turn_id: &output.turn_id,
        session_id: &output.session_id,
        results: &results,
    })
    .into_response())
}

/// `GET /v1/turns/active`: this replica's running turns, and with Redis those of every replica
/// that answers, each marked with its `replica` — the caller's own, or everyone's with `read`.
pub(crate) async fn active(State(app): State<App>, caller: Caller) -> Json<Value> {
    if app.engine.replica().is_none() {
        let mut turns = app.engine.active_turns();
        turns.retain(|t| caller.sees(&t.principal));
        return Json(json!({"turns": turns}));
    }
    let mut all: Vec<_> = app
        .engine
        .turns_everywhere()
        .await
        .into_iter()
        .flat_map(|group| {
            let replica = group.replica;
            group.turns.into_iter().map(move |t| (t, replica.clone()))
        })
        .filter(|(t, _)| caller.sees(&t.principal))
        .collect();
    // Oldest first, as one replica lists them.
    all.sort_by(|(a, _), (b, _)| {
        a.started_at
            .cmp(&b.started_at)
            .then_with(|| a.turn_id.cmp(&b.turn_id))
    });
    let turns: Vec<Value> = all
        .into_iter()
        .map(|(turn, replica)| {
            let mut turn = serde_json::to_value(turn).unwrap_or(Value::Null);
            if let Value::Object(fields) = &mut turn {
                fields.insert("replica".to_owned(), Value::String(replica));
            }
            turn
        })
        .collect();
    Json(json!({"turns": turns}))
}

/// `POST /v1/turns/{id}/abort`: here, or on the replica that runs the turn.
pub(crate) async fn abort(
    State(app): State<App>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let turn_id = TurnId::from(path(id)?);
    app.engine
        .abort_anywhere(&turn_id, None, CancelReason::User, only_of(&caller))
        .await
        .map_err(|e| abort_error(&caller, e))?;
    Ok(Json(json!({"ok": true, "turn_id": turn_id})))
}

/// `POST /v1/turns/{id}/calls/{call_id}/abort`.
pub(crate) async fn abort_call(
    State(app): State<App>,
    caller: Caller,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let (turn_id, call_id) = path(ids)?;
    let (turn_id, call_id) = (TurnId::from(turn_id), CallId::from(call_id));
    app.engine
        .abort_anywhere(
            &turn_id,
            Some(&call_id),
            CancelReason::User,
            only_of(&caller),
        )
        .await
        .map_err(|e| abort_error(&caller, e))?;
    Ok(Json(
        json!({"ok": true, "turn_id": turn_id, "call_id": call_id}),
    ))
}

/// Whose turns the caller may abort: its own, or (with `abort`) anyone's.
fn only_of(caller: &Caller) -> Option<&str> {
    (!caller.may(Scope::Abort)).then(|| caller.name())
}

/// An abort that was not carried out, as the API answers it.
fn abort_error(caller: &Caller, e: AbortError) -> ApiError {
    match e {
        AbortError::NotFound(e) => ApiError::not_found(e.to_string()),
        AbortError::NotYours(turn) => ApiError::lacks(
            &caller.0,
            Scope::Abort,
            &format!("abort turn {turn}, which is another principal's"),
        ),
    }
}
