//! The audit trail over HTTP: `GET /v1/audit` (events), `GET /v1/audit/calls` (one row per call),
//! `GET /v1/turns/{id}` (a turn's state and results), and detached turns
//! (`POST /v1/turns` with `"detach": true`).
//!
//! Reads first wait (briefly) until the store has committed every event emitted so far, so that a
//! client reads what it has just seen happen.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use toolwarden_core::{AuditStore, ResultRenderer, TurnRequest};
use toolwarden_protocol::{
    AUDIT_MAX_LIMIT, AuditPage, AuditQuery, CallsPage, Principal, Scope, Timestamp, TraceParent,
    TurnId, parse_calls_cursor,
};

use crate::app::App;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorCode};
use crate::format::TurnBody;
use crate::request::{path, turn_error};

/// How long a read waits for the store to commit what was emitted before it.
const CATCH_UP: Duration = Duration::from_secs(2);

/// The outcome statuses the status filter accepts, and `running` (calls without an outcome yet).
const STATUSES: &[&str] = toolwarden_protocol::STATUS_FILTERS;

/// The event types `type` accepts.
const TYPES: &[&str] = toolwarden_protocol::EVENT_TYPES;

/// Which listing a query is for: events page by `after`, calls by `cursor`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Listing {
    Events,
    Calls,
}

/// Reads the filters of `GET /v1/audit` and `GET /v1/audit/calls`; a bad value is a 400 naming
/// its parameter.
fn parse_query(pairs: &[(String, String)], listing: Listing) -> Result<AuditQuery, ApiError> {
    let mut q = AuditQuery::default();
    for (key, value) in pairs {
        let nonempty = || {
            if value.is_empty() {
                Err(ApiError::invalid(format!("{key}: must not be empty")))
            } else {
                Ok(value.clone())
            }
        };
        match key.as_str() {
            "principal" => q.principal = Some(nonempty()?),
            "session" | "session_id" => q.session = Some(nonempty()?.into()),
            "turn" | "turn_id" => q.turn = Some(nonempty()?.into()),
            "call" | "call_id" => q.call = Some(nonempty()?.into()),
            "tool" => q.tool = Some(nonempty()?),
            "status" => {
                if !STATUSES.contains(&value.as_str()) {
                    return Err(ApiError::invalid(format!(
                        "status: expected one of {}, got {value:?}",
                        STATUSES.join(", ")
                    )));
                }
                q.status = Some(value.clone());
            }
            "type" => {
                if !TYPES.contains(&value.as_str()) {
                    return Err(ApiError::invalid(format!(
                        "type: expected an event type ({}), got {value:?}",
                        TYPES.join(", ")
                    )));
                }
                q.kind = Some(value.clone());
            }
            "since" => {
                q.since = Some(Timestamp::parse(value).ok_or_else(|| {
                    ApiError::invalid(format!(
                        "since: expected an RFC 3339 time such as 2026-11-22T10:00:00Z, got {value:?}"
                    ))
                })?);
            }
            "after" => {
                q.after = Some(value.parse().map_err(|_| {
                    ApiError::invalid(format!(
                        "after: expected an event seq (a non-negative integer), got {value:?}"
                    ))
                })?);
            }
            "cursor" if listing == Listing::Calls => {
                q.cursor = Some(
                    parse_calls_cursor(value)
                        .map_err(|e| ApiError::invalid(format!("cursor: {e}")))?,
                );
            }
            "limit" => {
                q.limit = match value.parse::<u32>() {
                    Ok(n) if (1..=AUDIT_MAX_LIMIT).contains(&n) => n,
                    _ => {
                        return Err(ApiError::invalid(format!(
                            "limit: expected a number from 1 to {AUDIT_MAX_LIMIT}, got {value:?}"
                        )));
                    }
                }
            }
            other => {
                let known = match listing {
                    Listing::Events => {
                        "principal, session, turn, call, tool, status, type, since, after, limit"
                    }
                    Listing::Calls => {
                        "principal, session, turn, call, tool, status, type, since, after, \
                         cursor, limit"
                    }
                };
                return Err(ApiError::invalid(format!(
                    "{other}: unknown parameter; expected one of {known}"
                )));
            }
        }
    }
    Ok(q)
}

/// The engine's store, or a 503 when it runs without one.
fn store(app: &App) -> Result<&Arc<dyn AuditStore>, ApiError> {
    app.engine.store().ok_or_else(|| {
        ApiError::new(
            ErrorCode::Unavailable,
            "the audit trail is off in this server ([store] enabled = false)",
        )
    })
}

fn query_pairs(
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Vec<(String, String)>, ApiError> {
    query
        .map(|Query(pairs)| pairs)
        .map_err(|e| ApiError::invalid(format!("query: {e}")))
}

/// Limits a query to what the caller may read: without `read`, its own records only (asking
/// for another principal's is a 403 naming `read`).
fn scoped(caller: &Caller, mut q: AuditQuery) -> Result<AuditQuery, ApiError> {
    if caller.may(Scope::Read) {
        return Ok(q);
    }
    match &q.principal {
        Some(other) if other != caller.name() => {
            return Err(ApiError::lacks(
                &caller.0,
                Scope::Read,
                &format!("read principal {other:?}'s records"),
            ));
        }
        _ => q.principal = Some(caller.name().to_owned()),
    }
    Ok(q)
}

/// `GET /v1/audit`: events, ascending `seq`, filtered and paged.
pub(crate) async fn events(
    State(app): State<App>,
    caller: Caller,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<AuditPage>, ApiError> {
    let q = scoped(&caller, parse_query(&query_pairs(query)?, Listing::Events)?)?;
    let store = store(&app)?;
    let _ = app.engine.store_caught_up(CATCH_UP).await;
    let page = store
        .events(q)
        .await
        .map_err(|e| ApiError::new(ErrorCode::Unavailable, e.to_string()))?;
    Ok(Json(page))
}

/// `GET /v1/audit/calls`: calls, newest first, each with its events.
pub(crate) async fn calls(
    State(app): State<App>,
    caller: Caller,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<CallsPage>, ApiError> {
    let q = scoped(&caller, parse_query(&query_pairs(query)?, Listing::Calls)?)?;
    let store = store(&app)?;
    let _ = app.engine.store_caught_up(CATCH_UP).await;
    let page = store
        .calls(q)
        .await
        .map_err(|e| ApiError::new(ErrorCode::Unavailable, e.to_string()))?;
    Ok(Json(page))
}

/// `GET /v1/turns/{id}`: a running turn's state from the engine; an ended one's results from the
/// trail.
pub(crate) async fn turn(
    State(app): State<App>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let turn_id = TurnId::from(path(id)?);
    let not_yours = |owner: &str| {
        ApiError::lacks(
            &caller.0,
            Scope::Read,
            &format!("read turn {turn_id}, which is principal {owner:?}'s"),
        )
    };
    if let Some(active) = app
        .engine
        .active_turns()
        .into_iter()
        .find(|t| t.turn_id == turn_id)
    {
        if !caller.sees(&active.principal) {
            return Err(not_yours(&active.principal));
        }
        let mut v = json!(active);
        if let Value::Object(obj) = &mut v {
            obj.insert("state".into(), json!("running"));
        }
        return Ok(Json(v));
    }
    let not_found = || ApiError::not_found(format!("turn {turn_id} is unknown"));
    let Some(store) = app.engine.store() else {
        return Err(not_found());
    };
    let _ = app.engine.store_caught_up(CATCH_UP).await;
    let record = store
        .turn(turn_id.clone())
        .await
        .map_err(|e| ApiError::new(ErrorCode::Unavailable, e.to_string()))?
        .ok_or_else(not_found)?;
    if !caller.sees(&record.principal) {
        return Err(not_yours(&record.principal));
    }
    Ok(Json(json!(record)))
}

/// `POST /v1/turns` with `"detach": true`: starts the turn and answers 202 with its id at once;
/// the turn runs on, recorded in the trail, and `GET /v1/turns/{id}` gives its results.
pub(crate) fn detach(
    app: &App,
    principal: Principal,
    turn: TurnBody,
    render: ResultRenderer,
    traceparent: Option<TraceParent>,
) -> Result<Response, ApiError> {
    if app.engine.store().is_none() {
        return Err(ApiError::invalid(
            "detach: a detached turn's results are kept in the audit trail, which is off in this server ([store] enabled = false)",
        ));
    }
    let request = TurnRequest {
        principal,
        session_id: turn.session_id,
        parent_turn_id: turn.parent_turn_id,
        calls: turn.calls,
        render: Some(render),
        traceparent,
        ..TurnRequest::default()
    };
    let handle = app.engine.start_turn(request).map_err(turn_error)?;
    let body = json!({"turn_id": handle.turn_id(), "session_id": handle.session_id()});
    handle.detach();
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn filters_are_read_with_their_aliases_and_bad_values_name_their_parameter() {
        let q = parse_query(
            &pairs(&[
                ("session_id", "s1"),
                ("turn", "t_1"),
                ("call_id", "c1"),
                ("status", "interrupted"),
                ("type", "tool_start"),
                ("since", "2026-11-22T10:00:00Z"),
                ("after", "7"),
                ("limit", "5"),
            ]),
            Listing::Events,
        )
        .unwrap();
        assert_eq!(q.session.as_ref().map(|s| s.as_str()), Some("s1"));
        assert_eq!((q.after, q.limit), (Some(7), 5));
        for (bad, names) in [
            (("status", "fine"), "status:"),
            (("type", "nope"), "type:"),
            (("since", "yesterday"), "since:"),
            (("after", "-1"), "after:"),
            (("limit", "1001"), "limit:"),
            (("limit", "0"), "limit:"),
            (("cursor", "c1"), "cursor:"),
            (("tool", ""), "tool:"),
        ] {
            let e = parse_query(&pairs(&[bad]), Listing::Events).unwrap_err();
            assert!(e.message.starts_with(names), "{}", e.message);
        }
        let q = parse_query(&pairs(&[("cursor", "c9")]), Listing::Calls).unwrap();
        assert_eq!(q.cursor, Some(9));
        let e = parse_query(&pairs(&[("cursor", "9")]), Listing::Calls).unwrap_err();
        assert!(e.message.starts_with("cursor:"), "{}", e.message);
    }
}
