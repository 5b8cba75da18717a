//! The dashboard's files at the router level: what is served, with which headers, to whom.
//! (The page itself is tested in a real browser: `tests/browser`.)

// clippy's allow-unwrap-in-tests covers #[test] functions only, not this file's helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use pretty_assertions::assert_eq;
use support::{engine, get, send};
use toolwarden_http::{HttpOptions, router};

const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                      connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page and every file it loads, with their types.
const FILES: &[(&str, &str)] = &[
    ("/", "text/html; charset=utf-8"),
    ("/dashboard/app.css", "text/css; charset=utf-8"),
    ("/dashboard/app.js", "text/javascript; charset=utf-8"),
    ("/dashboard/api.js", "text/javascript; charset=utf-8"),
    ("/dashboard/sse.js", "text/javascript; charset=utf-8"),
    ("/dashboard/model.js", "text/javascript; charset=utf-8"),
    ("/dashboard/format.js", "text/javascript; charset=utf-8"),
    ("/dashboard/view.js", "text/javascript; charset=utf-8"),
    ("/dashboard/audit.js", "text/javascript; charset=utf-8"),
    ("/dashboard/icon.svg", "image/svg+xml"),
];

fn app() -> Router {
    router(engine(), HttpOptions::default())
}

async fn text(app: &Router, path: &str) -> (StatusCode, HeaderMap, String) {
    let (status, headers, body) = send(app, get(path)).await;
    let text = body["text"].as_str().unwrap_or_default().to_owned();
    (status, headers, text)
}

#[tokio::test(start_paused = true)]
async fn every_file_is_served_with_its_type_revalidation_and_a_strict_policy() {
    let app = app();
    for (path, content_type) in FILES {
        let (status, headers, body) = text(&app, path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(!body.is_empty(), "{path}");
        assert_eq!(headers[header::CONTENT_TYPE], *content_type, "{path}");
        assert_eq!(headers[header::CONTENT_SECURITY_POLICY], POLICY, "{path}");
        assert_eq!(headers[header::CACHE_CONTROL], "no-cache", "{path}");
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
        assert_eq!(headers[header::REFERRER_POLICY], "no-referrer", "{path}");
        let etag = headers[header::ETAG].to_str().unwrap();
        assert!(etag.starts_with('"') && etag.len() == 34, "{path}: {etag}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_file_the_browser_has_is_answered_304() {
    let app = app();
    let (_, headers, _) = text(&app, "/dashboard/app.js").await;
    let etag = headers[header::ETAG].clone();
    let request = Request::get("/dashboard/app.js")
        .header(header::IF_NONE_MATCH, etag.clone())
        .body(Body::empty())
        .unwrap();
    let (status, again, body) = send(&app, request).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert_eq!(again[header::ETAG], etag);
    assert_eq!(body, serde_json::Value::Null);
    let request = Request::get("/")
        .header(header::IF_NONE_MATCH, etag)
        .body(Body::empty())
        .unwrap();
    let (status, _, _) = send(&app, request).await;
    assert_eq!(status, StatusCode::OK, "another file's tag does not match");
}

#[tokio::test(start_paused = true)]
async fn the_page_loads_only_files_that_are_served() {
    let app = app();
    let mut wanted = Vec::new();
    for (path, content_type) in FILES {
        let (_, _, body) = text(&app, path).await;
        // `src="/…"`, `href="/…"` in the page; `from "./x.js"` in the modules.
        for marker in ["src=\"", "href=\"", "from \"./"] {
            for (at, _) in body.match_indices(marker) {
                let rest = &body[at + marker.len()..];
                let target = &rest[..rest.find('"').unwrap()];
                if content_type.starts_with("text/javascript") {
                    wanted.push(format!("/dashboard/{target}"));
                } else if target.starts_with('/') {
                    wanted.push(target.to_owned());
                }
            }
        }
    }
    assert!(wanted.len() > 10, "{wanted:?}");
    for path in wanted {
        let (status, _, _) = text(&app, &path).await;
        assert_eq!(status, StatusCode::OK, "{path} is loaded by the page");
    }
}

#[tokio::test(start_paused = true)]
async fn with_a_token_the_page_is_open_and_everything_else_is_not() {
    let app = router(
        engine(),
        HttpOptions {
            token: Some("s3cret".into()),
            ..HttpOptions::default()
        },
    );
    for (path, _) in FILES {
        let (status, _, _) = text(&app, path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    for path in [
        "/dashboard/",
        "/dashboard/secret.js",
        "/index.html",
        "/v1/events",
    ] {
        let (status, _, answer) = send(&app, get(path)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(answer["error"]["code"], "unauthorized");
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_token_the_page_is_served_to_loopback_hosts_only_and_only_read() {
    let app = app();
    let request = Request::get("/")
        .header(header::HOST, "evil.example:7420")
        .body(Body::empty())
        .unwrap();
    let (status, _, answer) = send(&app, request).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(answer["error"]["code"], "forbidden");
    let request = Request::post("/").body(Body::empty()).unwrap();
    let (status, headers, _) = send(&app, request).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers[header::ALLOW], "GET,HEAD");
}
