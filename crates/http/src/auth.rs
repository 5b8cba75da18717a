//! Bearer-token authentication: with a token configured, every path but the probes
//! (`/healthz`, `/readyz`) and the dashboard's page and files (which hold no data) needs
//! `Authorization: Bearer TOKEN`.
//!
//! Tokens are compared as SHA-256 digests in constant time, so neither the position of the first
//! wrong byte nor the token's length shows in the response time.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::error::{ApiError, ErrorCode};

/// The paths open without a token: load balancers, supervisors and orchestrators probe them,
/// and they say no more than which servers are up.
pub(crate) const OPEN_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// The expected token, kept as its digest.
#[derive(Clone)]
pub(crate) struct Token(Arc<[u8; 32]>);

impl Token {
    pub(crate) fn new(token: &str) -> Self {
        Self(Arc::new(Sha256::digest(token.as_bytes()).into()))
    }

    /// Whether `presented` is the token, in time independent of where they differ.
    pub(crate) fn matches(&self, presented: &str) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let diff = self
            .0
            .iter()
            .zip(presented.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

/// The bearer credential of a request, if it carries one.
fn bearer(request: &Request) -> Option<&str> {
    let value = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, credential) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credential.trim())
}

/// The middleware.
pub(crate) async fn require(State(token): State<Token>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if OPEN_PATHS.contains(&path) || crate::dashboard::is_asset(path) {
        return next.run(request).await;
    }
    match bearer(&request) {
        Some(presented) if token.matches(presented) => next.run(request).await,
        Some(_) => {
            ApiError::new(ErrorCode::Unauthorized, "the bearer token is wrong").into_response()
        }
        None => ApiError::new(
            ErrorCode::Unauthorized,
            "missing Authorization: Bearer TOKEN (this server requires a token)",
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_themselves() {
        let t = Token::new("s3cret");
        assert!(t.matches("s3cret"));
        assert!(!t.matches("s3cre"));
        assert!(!t.matches("s3cret "));
        assert!(!t.matches(""));
    }
}
