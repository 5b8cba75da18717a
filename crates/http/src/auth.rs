//! Who is calling (docs/AUTH.md). With authentication configured, every path but the probes
//! (`/healthz`, `/readyz`), the OAuth resource metadata and the dashboard's page and files (which
//! hold no data) needs `Authorization: Bearer TOKEN`, and the token names the request's
//! principal: a `[[auth.tokens]]` entry's (or `default`, for `[http] token_env`'s single token),
//! else, with `[auth.oauth]`, the principal a valid JWT access token names. The principal goes
//! into the request's extensions, where the handlers (and the MCP gateway) read it; without any
//! authentication every request is `local`'s, with every scope.
//!
//! Tokens are compared as SHA-256 digests in constant time, each against every entry, so neither
//! where a wrong token differs nor which entry it matched shows in the response time.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use toolwarden_protocol::{Principal, Scope};

use crate::error::{ApiError, ErrorCode};
use crate::oauth::OAuth;

/// The paths open without a token: load balancers, supervisors and orchestrators probe them,
/// and they say no more than which servers are up.
pub(crate) const OPEN_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// Where the OAuth protected-resource metadata is served (RFC 9728), open to everyone.
pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// A bearer token and the principal it stands for, kept as the token's SHA-256.
#[derive(Clone)]
pub struct TokenPrincipal {
    digest: [u8; 32],
    /// Who presents it.
    pub principal: Principal,
}

impl TokenPrincipal {
    /// `token` stands for `principal`.
    pub fn new(token: &str, principal: Principal) -> Self {
        Self {
            digest: Sha256::digest(token.as_bytes()).into(),
            principal,
        }
    }

    /// The token whose SHA-256 is `digest` stands for `principal`.
    pub fn from_digest(digest: [u8; 32], principal: Principal) -> Self {
        Self { digest, principal }
    }

    /// The token's SHA-256.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }
}

impl std::fmt::Debug for TokenPrincipal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenPrincipal")
            .field("principal", &self.principal)
            .finish_non_exhaustive()
    }
}

/// Whether two digests are equal, in time independent of where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The ways in: token principals, and OAuth access tokens.
#[derive(Clone)]
pub(crate) struct Auth(Arc<AuthInner>);

struct AuthInner {
    tokens: Vec<TokenPrincipal>,
    oauth: Option<Arc<OAuth>>,
}

impl Auth {
    /// `None` when nothing is configured (every request is `local`'s).
    pub(crate) fn new(tokens: Vec<TokenPrincipal>, oauth: Option<Arc<OAuth>>) -> Option<Self> {
        (!tokens.is_empty() || oauth.is_some()).then(|| Self(Arc::new(AuthInner { tokens, oauth })))
    }

    /// The principal of a token entry that matches `presented`: compared with every entry.
    fn by_token(&self, presented: &str) -> Option<&Principal> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for entry in &self.0.tokens {
            if same(&entry.digest, &digest) && found.is_none() {
                found = Some(&entry.principal);
            }
        }
        found
    }

    /// A 401 saying `message`, with the OAuth challenge when OAuth is configured.
    fn unauthorized(&self, message: String, refusal: Option<&crate::oauth::Refusal>) -> ApiError {
        let error = ApiError::new(ErrorCode::Unauthorized, message);
        match &self.0.oauth {
            Some(oauth) => error.with_challenge(oauth.challenge(refusal)),
            None => error,
        }
    }
}

/// The bearer credential of a request: `Ok(None)` without an `Authorization` header, `Err`
/// (what is wrong) for one that is not `Bearer TOKEN`.
fn bearer(request: &Request) -> Result<Option<&str>, String> {
    let Some(value) = request.headers().get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| "the Authorization header is not ASCII text".to_owned())?
        .trim();
    let (scheme, credential) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(format!(
            "the Authorization header must be `Bearer TOKEN`; it uses the {:?} scheme",
            scheme
        ));
    }
    let credential = credential.trim();
    if credential.is_empty() || credential.contains(char::is_whitespace) {
        return Err("the Authorization header's bearer token is empty or has spaces in it".into());
    }
    Ok(Some(credential))
}

/// Whether a path is served without a token.
fn is_open(path: &str) -> bool {
    OPEN_PATHS.contains(&path)
        || path == METADATA_PATH
        || path.starts_with("/.well-known/oauth-protected-resource/")
        || crate::dashboard::is_asset(path)
}

/// The middleware: finds the request's principal, or answers 401.
pub(crate) async fn require(
    State(auth): State<Auth>,
    mut request: Request,
    next: Next,
) -> Response {
    if is_open(request.uri().path()) {
        return next.run(request).await;
    }
    let principal = match bearer(&request) {
        Err(what) => return auth.unauthorized(what, None).into_response(),
        Ok(None) => {
            return auth
                .unauthorized(
                    "missing Authorization: Bearer TOKEN (this server requires a token)".into(),
                    None,
                )
                .into_response();
        }
        Ok(Some(presented)) => match auth.by_token(presented) {
            Some(principal) => principal.clone(),
            None => match &auth.0.oauth {
                Some(oauth) => match oauth.verify(presented).await {
                    Ok(principal) => principal,
                    Err(refusal) => {
                        return auth
                            .unauthorized(
                                format!("the bearer token is refused: {refusal}"),
                                Some(&refusal),
                            )
                            .into_response();
                    }
                },
                None => {
                    return auth
                        .unauthorized("the bearer token is wrong".into(), None)
                        .into_response();
                }
            },
        },
    };
    // The MCP endpoint serves the tool list and calls: it needs one of the two scopes.
    let path = request.uri().path();
    if (path == "/mcp" || path.starts_with("/mcp/"))
        && !principal.may(Scope::Call)
        && !principal.may(Scope::Read)
    {
        return ApiError::lacks(&principal, Scope::Call, "use the MCP endpoint").into_response();
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// The principal of a request, as a handler's argument: the one authentication found, else
/// `local` (no authentication configured).
#[derive(Clone, Debug)]
pub(crate) struct Caller(pub(crate) Principal);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Caller(
            parts
                .extensions
                .get::<Principal>()
                .cloned()
                .unwrap_or_else(Principal::local),
        ))
    }
}

impl Caller {
    /// Whether it holds `scope`.
    pub(crate) fn may(&self, scope: Scope) -> bool {
        self.0.may(scope)
    }

    /// `Ok` when it holds `scope`, else the 403 naming it.
    pub(crate) fn needs(&self, scope: Scope, to: &str) -> Result<(), ApiError> {
        if self.may(scope) {
            Ok(())
        } else {
            Err(ApiError::lacks(&self.0, scope, to))
        }
    }

    /// Whether it may see what `owner` made: its own, or anyone's with `read`.
    pub(crate) fn sees(&self, owner: &str) -> bool {
        *self.0.name == *owner || self.may(Scope::Read)
    }

    /// Its name.
    pub(crate) fn name(&self) -> &str {
        &self.0.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolwarden_protocol::Scopes;

    fn auth(entries: &[(&str, &str)]) -> Auth {
        let tokens = entries
            .iter()
            .map(|(token, name)| TokenPrincipal::new(token, Principal::new(*name, Scopes::all())))
            .collect();
        Auth::new(tokens, None).unwrap()
    }

    #[test]
    fn tokens_name_their_principal_and_only_theirs() {
        let a = auth(&[("s3cret-a", "alice"), ("s3cret-b", "bob")]);
        assert_eq!(&*a.by_token("s3cret-a").unwrap().name, "alice");
        assert_eq!(&*a.by_token("s3cret-b").unwrap().name, "bob");
        assert!(a.by_token("s3cret-").is_none());
        assert!(a.by_token("s3cret-a ").is_none());
        assert!(a.by_token("").is_none());
        assert!(Auth::new(Vec::new(), None).is_none());
    }

    #[test]
    fn a_malformed_authorization_header_says_what_is_wrong() {
        let with = |value: &str| {
            Request::builder()
                .header(header::AUTHORIZATION, value)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let basic = with("Basic dXNlcjpwYXNz");
        assert!(bearer(&basic).unwrap_err().contains("\"Basic\" scheme"));
        let empty = with("Bearer ");
        assert!(bearer(&empty).unwrap_err().contains("empty"));
        let spaced = with("Bearer a b");
        assert!(bearer(&spaced).unwrap_err().contains("spaces"));
        let good = with("bearer  tok ");
        assert_eq!(bearer(&good).unwrap(), Some("tok"));
        let none = Request::builder().body(axum::body::Body::empty()).unwrap();
        assert_eq!(bearer(&none).unwrap(), None);
    }
}
