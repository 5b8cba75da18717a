//! DNS-rebinding protection: only loopback `Host`s and `Origin`s (plus configured extras) pass.
//!
//! A web page on `evil.example` can make its own name resolve to 127.0.0.1 and then talk to a
//! local server "same-origin". What it cannot forge is the `Host` its browser sends (its own
//! name) or the `Origin` (its own origin). So a local server that answers only loopback hosts
//! and origins cannot be driven by such a page. Non-browser clients that send no `Origin` pass
//! the origin check; a request without any `Host` (HTTP/1.0) passes the host check, since every
//! browser sends one.

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{HeaderMap, Request, Uri, header};
use axum::response::{IntoResponse, Response};
use futures::future::{Either, Ready, ready};
use toolwarden_hosts::{AllowedHosts, Origin};
use tower::{Layer, Service};

use crate::error::{ApiError, ErrorCode};

/// Loopback and the allowed extras, as configured (hosts parsed once, by the one parser of
/// `toolwarden-hosts`; origins when compared).
#[derive(Debug)]
struct Allowed {
    hosts: AllowedHosts,
    origins: Vec<String>,
}

/// A layer that answers 403 to requests whose `Host` or `Origin` is neither loopback nor
/// configured. Made by [`host_origin_guard`].
#[derive(Clone, Debug)]
pub struct HostOriginLayer {
    allowed: Arc<Allowed>,
}

/// The guard: loopback `Host`/`Origin` (`localhost`, `127.0.0.0/8`, `[::1]`) plus
/// `allowed_hosts` (matched against `host:port` or the bare host, case-insensitively) and
/// `allowed_origins` (matched exactly, e.g. `https://app.example.com`, case-insensitively).
pub fn host_origin_guard<H, O>(allowed_hosts: H, allowed_origins: O) -> HostOriginLayer
where
    H: IntoIterator,
    H::Item: AsRef<str>,
    O: IntoIterator,
    O::Item: AsRef<str>,
{
    let norm = |s: &str| s.trim().trim_end_matches('/').to_ascii_lowercase();
    HostOriginLayer {
        allowed: Arc::new(Allowed {
            hosts: AllowedHosts::new(true, allowed_hosts.into_iter().map(|h| norm(h.as_ref()))),
            origins: allowed_origins
                .into_iter()
                .map(|o| norm(o.as_ref()))
                .collect(),
        }),
    }
}

impl<S> Layer<S> for HostOriginLayer {
    type Service = HostOriginService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HostOriginService {
            inner,
            allowed: self.allowed.clone(),
        }
    }
}

/// The service of [`HostOriginLayer`].
#[derive(Clone, Debug)]
pub struct HostOriginService<S> {
    inner: S,
    allowed: Arc<Allowed>,
}

impl<S, B> Service<Request<B>> for HostOriginService<S>
where
    S: Service<Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match self.allowed.check(request.uri(), request.headers()) {
            Ok(()) => Either::Right(self.inner.call(request)),
            Err(e) => Either::Left(ready(Ok(e.into_response()))),
        }
    }
}

impl Allowed {
    fn check(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), ApiError> {
        // HTTP/2 carries the host as the URI's authority; HTTP/1.1 as the Host header.
        let host = uri
            .authority()
            .map(|a| a.as_str().as_bytes())
            .or_else(|| headers.get(header::HOST).map(|h| h.as_bytes()));
        if let Some(host) = host
            && !self.hosts.allows_value(host)
        {
            let host = String::from_utf8_lossy(host);
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "Host {host:?} is not allowed (DNS-rebinding protection); add it to http.allowed_hosts to accept it"
                ),
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
            let ok = Origin::parse(&origin)
                .is_some_and(|o| o.is_loopback_web() || self.origins.iter().any(|a| o.is(a)));
            if !ok {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    format!(
                        "Origin {origin:?} is not allowed (DNS-rebinding protection); add it to http.allowed_origins to accept it"
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn check(host: Option<&'static str>, origin: Option<&'static str>) -> Result<(), String> {
        let allowed = host_origin_guard(["tw.example:8443", "box.lan"], ["https://app.example"]);
        let mut headers = HeaderMap::new();
        if let Some(h) = host {
            headers.insert(header::HOST, HeaderValue::from_static(h));
        }
        if let Some(o) = origin {
            headers.insert(header::ORIGIN, HeaderValue::from_static(o));
        }
        allowed
            .allowed
            .check(&Uri::from_static("/mcp"), &headers)
            .map_err(|e| e.message)
    }

    #[test]
    fn loopback_hosts_pass_others_do_not() {
        for ok in [
            "127.0.0.1:7420",
            "127.0.0.1",
            "localhost:7420",
            "LOCALHOST",
            "[::1]:7420",
            "127.9.9.9:1",
        ] {
            assert_eq!(check(Some(ok), None), Ok(()), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:7420",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "10.0.0.1:7420",
        ] {
            assert!(check(Some(bad), None).is_err(), "{bad}");
        }
        assert_eq!(check(None, None), Ok(()), "no Host at all passes");
    }

    #[test]
    fn configured_hosts_pass_by_host_and_port_or_bare_host() {
        assert_eq!(check(Some("tw.example:8443"), None), Ok(()));
        assert!(check(Some("tw.example:9999"), None).is_err());
        assert_eq!(check(Some("box.lan:7420"), None), Ok(()));
        assert_eq!(check(Some("BOX.LAN"), None), Ok(()));
    }

    #[test]
    fn origins_must_be_loopback_or_configured() {
        let host = Some("127.0.0.1:7420");
        for ok in [
            "http://127.0.0.1:7420",
            "http://localhost:3000",
            "https://[::1]:7420",
            "https://app.example",
            "https://APP.example/",
        ] {
            assert_eq!(check(host, Some(ok)), Ok(()), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "null",
            "file://localhost",
            "http://localhost.evil.example",
            "https://app.example:444",
        ] {
            assert_eq!(
                check(host, Some(bad)),
                Err(format!(
                    "Origin {bad:?} is not allowed (DNS-rebinding protection); add it to http.allowed_origins to accept it"
                )),
                "{bad}"
            );
        }
    }
}
