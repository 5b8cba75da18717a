//! `POST /v1/turns`, `GET /v1/turns/active`, and the two aborts.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use toolwarden_core::{TurnError, TurnRequest};
use toolwarden_protocol::{CallId, CancelReason, SessionId, TurnId};

use crate::app::App;
use crate::error::{ApiError, ErrorCode};
use crate::{format, sse};

/// The body's bytes, or the fitting error (413 past the limit).
pub(crate) fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                "body: larger than the server's limit (max_body)",
            )
        } else {
            ApiError::invalid(format!("body: could not be read: {rejection}"))
        }
    })
}

/// Refuses a body that is not declared as JSON (`application/json`, or `application/*+json`).
pub(crate) fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let declared = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = declared
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    if json {
        Ok(())
    } else if declared.is_empty() {
        Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "Content-Type: missing; expected application/json",
        ))
    } else {
        Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            format!("Content-Type: expected application/json, got {declared}"),
        ))
    }
}

/// Whether the client asked for an event stream.
fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mut parts = range.split(';');
            let essence = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                let p = p.trim();
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            essence.eq_ignore_ascii_case("text/event-stream") && !refused
        })
}

/// Path parameters, or a JSON 400.
pub(crate) fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(t)| t)
        .map_err(|e| ApiError::invalid(format!("path: {e}")))
}

pub(crate) fn turn_error(e: TurnError) -> ApiError {
    ApiError::invalid(match e {
        TurnError::Empty => "calls: empty; a turn needs at least one call".to_owned(),
        TurnError::EmptyCallId(i) => format!("calls[{i}].id: must not be empty"),
        other => other.to_string(),
    })
}

/// `POST /v1/turns`: runs a turn; answers JSON, or streams its events.
pub(crate) async fn create(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    require_json(&headers)?;
    let body = body_bytes(body)?;
    let turn = format::parse_turn(&body)?;
    let render = format::renderer(turn.family);
    if turn.detach {
        return crate::audit::detach(&app, turn, render);
    }
    let calls = turn.calls.clone();
    let request = TurnRequest {
        session_id: turn.session_id,
        parent_turn_id: turn.parent_turn_id,
        calls: turn.calls,
        render: Some(render.clone()),
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
    struct Answer<'a> {
        turn_id: &'a TurnId,
        session_id: &'a SessionId,
        results: &'a [Value],
    }
    Ok(Json(Answer {
        turn_id: &output.turn_id,
        session_id: &output.session_id,
        results: &results,
    })
    .into_response())
}

/// `GET /v1/turns/active`.
pub(crate) async fn active(State(app): State<App>) -> Json<Value> {
    Json(json!({"turns": app.engine.active_turns()}))
}

/// `POST /v1/turns/{id}/abort`.
pub(crate) async fn abort(
    State(app): State<App>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let turn_id = TurnId::from(path(id)?);
    app.engine
        .abort_turn(&turn_id, CancelReason::User)
        .map_err(|e| ApiError::not_found(e.to_string()))?;
    Ok(Json(json!({"ok": true, "turn_id": turn_id})))
}

/// `POST /v1/turns/{id}/calls/{call_id}/abort`.
pub(crate) async fn abort_call(
    State(app): State<App>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let (turn_id, call_id) = path(ids)?;
    let (turn_id, call_id) = (TurnId::from(turn_id), CallId::from(call_id));
    app.engine
        .abort_call(&turn_id, &call_id, CancelReason::User)
        .map_err(|e| ApiError::not_found(e.to_string()))?;
    Ok(Json(
        json!({"ok": true, "turn_id": turn_id, "call_id": call_id}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn accept(v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_static(v));
        h
    }

    #[test]
    fn event_streams_are_asked_for_by_accept() {
        assert!(wants_events(&accept("text/event-stream")));
        assert!(wants_events(&accept(
            "application/json, Text/Event-Stream;q=0.5"
        )));
        assert!(!wants_events(&accept("text/event-stream;q=0")));
        assert!(!wants_events(&accept("application/json")));
        assert!(!wants_events(&HeaderMap::new()));
    }
}
