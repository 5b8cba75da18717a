//! The toolwarden HTTP turn API (docs/HTTP-API.md): an agent posts the tool calls of one model
//! turn — Anthropic `tool_use` blocks or OpenAI tool calls — and gets one result per call in the
//! same family, as JSON or as a live SSE stream of the turn's events; a person lists running turns,
//! aborts turns and calls, answers approvals, and watches every event — with any client, or with
//! the dashboard this crate serves at `/`, a page that reads the same API.
//!
//! The key design choice: **the HTTP request is the turn's owner.** A turn is started with
//! [`Engine::start_turn`] and its [`toolwarden_core::TurnHandle`] lives inside the handler's
//! future (JSON) or the response body's stream (SSE). When a client goes away, the server drops
//! that future or body, the handle drops with it, and the engine aborts the turn as
//! `client_disconnect` — no polling for closed sockets, no turn left running for nobody. The
//! same renderer makes the JSON answer and `turn_end.results`, so both are the same list.
//!
//! ```no_run
//! use toolwarden_core::Engine;
//! use toolwarden_http::{HttpOptions, listen_allowed, router};
//!
//! # async fn serve() -> std::io::Result<()> {
//! let engine = Engine::new();
//! let addr: std::net::SocketAddr = "127.0.0.1:7420".parse().unwrap();
//! let opts = HttpOptions::default();
//! listen_allowed(&addr, opts.authenticates()).expect("loopback needs no token");
//! let listener = tokio::net::TcpListener::bind(addr).await?;
//! axum::serve(listener, router(engine, opts)).await
//! # }
//! ```
#![deny(missing_docs)]

mod app;
mod audit;
mod auth;
mod dashboard;
mod error;
mod events;
mod format;
mod guard;
mod interactions;
mod listen;
pub mod oauth;
mod request;
mod sse;
mod status;
mod turns;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use toolwarden_core::Engine;
use toolwarden_protocol::HttpConfig;
use tower_http::catch_panic::CatchPanicLayer;

pub use auth::TokenPrincipal;
pub use error::{ApiError, ErrorCode};
pub use guard::{HostOriginLayer, HostOriginService, host_origin_guard};
pub use interactions::INTERACTOR;
pub use listen::{ListenError, listen_allowed};
pub use status::METRICS_CONTENT_TYPE;

/// The default largest request body: 4 MiB.
pub const DEFAULT_MAX_BODY: usize = 4 * 1024 * 1024;
/// The default interval of SSE keep-alive comments: 15 s.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The default number of recent events kept for `Last-Event-ID` resume.
pub const DEFAULT_REPLAY_EVENTS: usize = 4096;

/// Settings of the HTTP API. Its `Debug` form never shows the token.
#[derive(Clone)]
pub struct HttpOptions {
    /// The single bearer token of `[http] token_env`: principal `default`, with every scope.
    /// With no token, no token principals and no OAuth, there is no authentication: every
    /// request is `local`'s, and only loopback `Host`/`Origin` are accepted (see
    /// [`host_origin_guard`]).
    pub token: Option<String>,
    /// `[[auth.tokens]]`: a principal per token.
    pub tokens: Vec<TokenPrincipal>,
    /// `[auth.oauth]`: JWT access tokens of an OAuth 2.1 authorization server.
    pub oauth: Option<Arc<oauth::OAuth>>,
    /// The largest accepted request body, in bytes (default 4 MiB); larger ones get 413.
    pub max_body: usize,
    /// SSE streams send a keep-alive comment after this long without an event (default 15 s).
    pub keep_alive: Duration,
    /// Headless: do not attach the `http` interactor, so approvals fail fast
    /// (`denied{headless, no_interactor}`) instead of waiting for an answer here.
    pub headless: bool,
    /// How many recent events the engine keeps for `Last-Event-ID` resume (default 4096).
    pub replay_events: usize,
    /// Extra `Host`s accepted without a token besides loopback ones (`http.allowed_hosts`).
    pub allowed_hosts: Vec<String>,
    /// Extra `Origin`s accepted without a token besides loopback ones (`http.allowed_origins`).
    pub allowed_origins: Vec<String>,
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tokens", &self.tokens)
            .field("oauth", &self.oauth)
            .field("max_body", &self.max_body)
            .field("keep_alive", &self.keep_alive)
            .field("headless", &self.headless)
            .field("replay_events", &self.replay_events)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("allowed_origins", &self.allowed_origins)
            .finish()
    }
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            token: None,
            tokens: Vec::new(),
            oauth: None,
            max_body: DEFAULT_MAX_BODY,
            keep_alive: DEFAULT_KEEP_ALIVE,
            headless: false,
            replay_events: DEFAULT_REPLAY_EVENTS,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}

impl HttpOptions {
    /// Whether requests must carry a token (a single token, token principals or OAuth).
    pub fn authenticates(&self) -> bool {
        self.token.as_deref().is_some_and(|t| !t.is_empty())
            || !self.tokens.is_empty()
            || self.oauth.is_some()
    }

    /// The options of a config file's `[http]` table, with the token read from its `token_env`
    /// by the caller (an empty token counts as none).
    pub fn from_config(config: &HttpConfig, token: Option<String>) -> Self {
        Self {
            token: token.filter(|t| !t.is_empty()),
            max_body: config.max_body.map_or(DEFAULT_MAX_BODY, |s| {
                usize::try_from(s.bytes()).unwrap_or(usize::MAX)
            }),
            allowed_hosts: config.allowed_hosts.clone(),
            allowed_origins: config.allowed_origins.clone(),
            ..Self::default()
        }
    }
}

/// The API's routes (`/v1/*`, `/metrics`, `/healthz`, `/readyz`) and the dashboard (`/`) over
/// `engine`, with authentication, the body limit, and JSON errors for everything (unknown paths,
/// wrong methods, panics).
///
/// Building it turns on the engine's replay ring (`opts.replay_events`) and, unless
/// `opts.headless`, attaches the passive `http` interactor (replacing an earlier one).
pub fn router(engine: Engine, opts: HttpOptions) -> Router {
    router_with(engine, opts, None)
}

/// [`router`], plus another service mounted beside the API — the MCP gateway's `/mcp` — under
/// the same bearer check, and always behind the Host/Origin guard (DNS-rebinding protection is
/// required of MCP's Streamable HTTP endpoints whatever the token) and the body limit.
pub fn router_with(engine: Engine, opts: HttpOptions, mcp: Option<Router>) -> Router {
    engine.events().keep_recent(opts.replay_events);
    let interactions = engine.interactions();
    interactions.detach(INTERACTOR);
    if !opts.headless {
        interactions.attach(Arc::new(interactions::HttpInteractor));
    }
    let app = app::App {
        engine,
        keep_alive: opts.keep_alive,
        oauth: opts.oauth.clone(),
    };
    let routes = Router::new()
        .route("/v1/turns", post(turns::create))
        .route("/v1/turns/active", get(turns::active))
        .route("/v1/turns/{id}", get(audit::turn))
        .route("/v1/audit", get(audit::events))
        .route("/v1/audit/calls", get(audit::calls))
        .route("/v1/turns/{id}/abort", post(turns::abort))
        .route(
            "/v1/turns/{id}/calls/{call_id}/abort",
            post(turns::abort_call),
        )
        .route("/v1/events", get(events::stream))
        .route("/v1/interactions", get(interactions::list))
        .route("/v1/interactions/{id}", post(interactions::answer))
        .route("/v1/sessions/{id}/status", get(status::session))
        .route("/v1/replicas", get(status::replicas))
        .route("/v1/tools", get(status::tools))
        .route("/v1/tools/{name}/explain", get(status::explain))
        .route("/v1/tools/{name}/accept", post(status::accept))
        .route("/v1/me", get(status::me))
        .route("/metrics", get(status::metrics))
        .route("/healthz", get(status::healthz))
        .route("/readyz", get(status::readyz))
        .route(auth::METADATA_PATH, get(status::resource_metadata))
        .route(
            "/.well-known/oauth-protected-resource/{*resource}",
            get(status::resource_metadata),
        )
        .merge(dashboard::routes())
        .method_not_allowed_fallback(error::method_not_allowed)
        .fallback(error::not_found)
        .layer(DefaultBodyLimit::max(opts.max_body))
        .with_state(app);
    let mut tokens = opts.tokens.clone();
    if let Some(token) = opts.token.as_deref().filter(|t| !t.is_empty()) {
        tokens.push(TokenPrincipal::new(
            token,
            toolwarden_protocol::Principal::new(
                toolwarden_protocol::DEFAULT_PRINCIPAL,
                toolwarden_protocol::Scopes::all(),
            ),
        ));
    }
    let auth = auth::Auth::new(tokens, opts.oauth.clone());
    // The MCP endpoint is always behind the Host/Origin guard: its own when the API is behind
    // its bearer check, the API's (below) when it is not, never both.
    let routes = match mcp {
        Some(mcp) => {
            let mcp = mcp.layer(DefaultBodyLimit::max(opts.max_body));
            routes.merge(match auth {
                Some(_) => mcp.layer(host_origin_guard(
                    &opts.allowed_hosts,
                    &opts.allowed_origins,
                )),
                None => mcp,
            })
        }
        None => routes,
    };
    let routes = match auth {
        Some(auth) => routes.layer(axum::middleware::from_fn_with_state(auth, auth::require)),
        // Without a token, a web page that rebinds its name to 127.0.0.1 could drive the API;
        // the guard refuses its Host and Origin.
        None => routes.layer(host_origin_guard(
            &opts.allowed_hosts,
            &opts.allowed_origins,
        )),
    };
    routes.layer(CatchPanicLayer::custom(error::panicked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_never_show_the_token() {
        let opts = HttpOptions {
            token: Some("s3cret".into()),
            ..HttpOptions::default()
        };
        let shown = format!("{opts:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn options_follow_the_config_file() {
        let config = HttpConfig {
            max_body: Some(toolwarden_protocol::SizeValue(1024)),
            allowed_hosts: vec!["box.lan".into()],
            ..HttpConfig::default()
        };
        let opts = HttpOptions::from_config(&config, Some(String::new()));
        assert_eq!(opts.token, None, "an empty token is no token");
        assert_eq!(opts.max_body, 1024);
        assert_eq!(opts.allowed_hosts, vec!["box.lan".to_owned()]);
        assert_eq!(opts.keep_alive, DEFAULT_KEEP_ALIVE);
        assert_eq!(
            HttpOptions::from_config(&HttpConfig::default(), None).max_body,
            DEFAULT_MAX_BODY
        );
    }
}
