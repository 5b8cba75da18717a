//! Errors as every endpoint answers them: `{"error": {"code", "message"}}` with a fitting status.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use toolwarden_protocol::{Principal, Scope};

/// What went wrong, as a machine-readable `code` with its HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// 400: the request is malformed (body, header, parameter); the message says what and where.
    InvalidRequest,
    /// 401: authentication is configured and the request carried no token it accepts.
    Unauthorized,
    /// 403: the request's principal lacks a scope (`missing_scope` names it), or the `Host` or
    /// `Origin` is not allowed (DNS-rebinding protection).
    Forbidden,
    /// 404: no such route, or the turn, call, interaction or session is not there (any more).
    NotFound,
    /// 405: the route exists but not with this method.
    MethodNotAllowed,
    /// 409: the request does not fit the state it meets (accepting a tool that has no change).
    Conflict,
    /// 413: the body is larger than the limit.
    PayloadTooLarge,
    /// 415: the body is not `application/json`.
    UnsupportedMediaType,
    /// 500: a bug.
    Internal,
    /// 503: the audit trail is off or cannot be read.
    Unavailable,
}

impl ErrorCode {
    /// The wire name of the code.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Conflict => "conflict",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::Internal => "internal_error",
            ErrorCode::Unavailable => "unavailable",
        }
    }

    /// The HTTP status it is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::Conflict => StatusCode::CONFLICT,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// An error answer of the API.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ApiError {
    /// What kind of error.
    pub code: ErrorCode,
    /// What exactly, for a person (and where, for a bad body: `calls[2].id: ...`).
    pub message: String,
    /// For a 403 of a missing scope: that scope (`error.missing_scope` on the wire).
    pub missing_scope: Option<Scope>,
    /// For a 401: the `WWW-Authenticate` value (default `Bearer realm="toolwarden"`).
    pub challenge: Option<String>,
}

impl ApiError {
    /// An error of `code` saying `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            missing_scope: None,
            challenge: None,
        }
    }

    /// A 403: `principal` lacks `scope`, which it needs `to` do what it asked.
    pub fn lacks(principal: &Principal, scope: Scope, to: &str) -> Self {
        Self {
            missing_scope: Some(scope),
            ..Self::new(
                ErrorCode::Forbidden,
                format!(
                    "principal {:?} lacks scope `{scope}`, which it needs to {to}",
                    principal.name
                ),
            )
        }
    }

    /// `self` with this `WWW-Authenticate` value (for a 401).
    pub fn with_challenge(mut self, challenge: String) -> Self {
        self.challenge = Some(challenge);
        self
    }

    /// A 400.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    /// A 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.missing_scope {
            Some(scope) => json!({"error": {"code": self.code.as_str(), "message": self.message,
                "missing_scope": scope.as_str()}}),
            None => json!({"error": {"code": self.code.as_str(), "message": self.message}}),
        };
        let mut response = (self.code.status(), axum::Json(body)).into_response();
        if self.code == ErrorCode::Unauthorized {
            let challenge = self
                .challenge
                .and_then(|c| HeaderValue::from_str(&c).ok())
                .unwrap_or(HeaderValue::from_static("Bearer realm=\"toolwarden\""));
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, challenge);
        }
        response
    }
}

/// The answer for a path no route matches.
pub(crate) async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no endpoint at {}", uri.path()))
}

/// The answer for a route that exists, called with another method (axum keeps its `Allow`
/// header).
pub(crate) async fn method_not_allowed(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        format!("{} does not accept {method}", uri.path()),
    )
}

/// The answer when a handler panicked.
pub(crate) fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    tracing::error!(panic = %what, "an HTTP handler panicked");
    ApiError::new(
        ErrorCode::Internal,
        "the server failed while answering this request",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;

    #[tokio::test]
    async fn a_panic_is_a_json_500() {
        let response = panicked(Box::new("boom"));
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = to_bytes(response.into_body(), 1024).await.unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            json!({"error": {"code": "internal_error", "message": "the server failed while answering this request"}})
        );
    }
}
