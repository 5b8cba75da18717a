//! Reading a request: its body within the size limit, its declared JSON content type, its path
//! parameters, and a refused turn as a 400 that names the field.

use axum::body::Bytes;
use axum::extract::Path;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::http::{HeaderMap, header};
use toolwarden_core::TurnError;
use toolwarden_protocol::TraceParent;

use crate::error::{ApiError, ErrorCode};

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
/// The client's trace context: one valid `traceparent` header (two, or an invalid value, are
/// none, as W3C Trace Context says).
pub(crate) fn traceparent(headers: &HeaderMap) -> Option<TraceParent> {
    let mut values = headers.get_all("traceparent").iter();
    match (values.next(), values.next()) {
        (Some(value), None) => TraceParent::parse(value.to_str().ok()?),
        _ => None,
    }
}

pub(crate) fn wants_events(headers: &HeaderMap) -> bool {
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
