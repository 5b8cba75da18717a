//! `GET /` and `/dashboard/*`: the web dashboard, a page a person keeps open beside their agent to
//! see what runs, for how long, how far along, and to stop it or answer its approvals.
//!
//! The key design choice: **the page is static and reads the same API as every other client.**
//! Its files (`crates/http/assets/`) are compiled into the binary, so a user runs no build step and
//! the page always matches the server it comes from. They hold no data, so they are served without
//! the bearer token (the page asks for it and sends it with each API request); everything the page
//! shows comes from `/v1/events`, `/v1/turns/active`, `/v1/interactions`, `/v1/tools`,
//! `/healthz` and, for its audit history, `/v1/audit` and `/v1/audit/calls`. Every answer carries
//! a Content-Security-Policy that lets the page load nothing but its own files and talk to nothing
//! but this server.

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

/// What the page may do: load its own scripts and styles, talk to this server; nothing inline,
/// nothing from elsewhere, never framed.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// One embedded file.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

/// A file of the page, served at `/dashboard/FILE`, embedded from `assets/FILE`.
macro_rules! dashboard_file {
    ($file:literal, $content_type:expr) => {
        Asset {
            path: concat!("/dashboard/", $file),
            content_type: $content_type,
            body: include_bytes!(concat!("../assets/", $file)),
        }
    };
}

const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

/// The page and its files, by the path they are served at.
const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../assets/index.html"),
    },
    dashboard_file!("app.css", CSS),
    dashboard_file!("app.js", JS),
    dashboard_file!("api.js", JS),
    dashboard_file!("sse.js", JS),
    dashboard_file!("model.js", JS),
    dashboard_file!("format.js", JS),
    dashboard_file!("view.js", JS),
    dashboard_file!("audit.js", JS),
    dashboard_file!("icon.svg", "image/svg+xml"),
];

/// Whether `path` is one of the page's files (served without the bearer token: they hold no data).
pub(crate) fn is_asset(path: &str) -> bool {
    ASSETS.iter().any(|a| a.path == path)
}

/// The page's routes. Each file is revalidated on every load (`no-cache` with a strong `ETag`
/// of its bytes), so a browser never runs an old page against a newer server, and a reload
/// that finds nothing changed costs a `304`.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS.iter().fold(Router::new(), |router, asset| {
        let etag = etag(asset.body);
        router.route(
            asset.path,
            get(move |headers: HeaderMap| async move { serve(asset, &etag, &headers) }),
        )
    })
}

/// `"<first 16 bytes of the SHA-256 of body, in hex>"`.
fn etag(body: &[u8]) -> HeaderValue {
    let digest = Sha256::digest(body);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    HeaderValue::try_from(format!("\"{hex}\"")).unwrap_or(HeaderValue::from_static("\"0\""))
}

/// Whether `If-None-Match` names `etag` (or is `*`).
fn not_modified(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let Some(wanted) = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let ours = etag.to_str().unwrap_or("");
    wanted
        .split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == ours)
}

fn serve(asset: &Asset, etag: &HeaderValue, headers: &HeaderMap) -> Response {
    let fresh = not_modified(headers, etag);
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        asset.body.into_response()
    };
    let h = response.headers_mut();
    if !fresh {
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        );
    }
    h.insert(header::ETAG, etag.clone());
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_is_found_by_its_path_and_nothing_else_is() {
        for asset in ASSETS {
            assert!(is_asset(asset.path), "{}", asset.path);
            assert!(!asset.body.is_empty(), "{} is empty", asset.path);
        }
        for other in [
            "/dashboard/",
            "/dashboard/secret.js",
            "/v1/events",
            "/index.html",
            "",
        ] {
            assert!(!is_asset(other), "{other}");
        }
    }

    #[test]
    fn if_none_match_is_compared_with_the_etag() {
        let tag = etag(b"hello");
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::IF_NONE_MATCH, HeaderValue::from_static(v));
            h
        };
        let ours = tag.to_str().unwrap().to_owned();
        let mut h = HeaderMap::new();
        h.insert(
            header::IF_NONE_MATCH,
            HeaderValue::try_from(ours.clone()).unwrap(),
        );
        assert!(not_modified(&h, &tag));
        let mut h = HeaderMap::new();
        h.insert(
            header::IF_NONE_MATCH,
            HeaderValue::try_from(format!("\"other\", W/{ours}")).unwrap(),
        );
        assert!(not_modified(&h, &tag));
        assert!(not_modified(&with("*"), &tag));
        assert!(!not_modified(&with("\"other\""), &tag));
        assert!(!not_modified(&HeaderMap::new(), &tag));
    }
}
