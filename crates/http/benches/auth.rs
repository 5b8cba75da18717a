//! What authentication costs a request: the bearer middleware in front of `GET /v1/me`, on the
//! real router, with no authentication, with the single-token check as it was before principals
//! (reproduced here), with one and with ten token principals, with a JWT already accepted, and
//! a new JWT's validation alone (RS256, ES256, EdDSA; the issuer's keys already read).
//!
//! `cargo bench -p toolwarden-http --bench auth`
//!
//! Targets (docs/PERFORMANCE.md): a token already seen costs ≤ 2 µs more than the single-token
//! check did; a new JWT's validation ≤ 100 µs with the keys cached. Every request variant runs
//! the same way (one `block_on` per request on a current-thread runtime, `oneshot` on a clone
//! of the router), so differences are the middleware's.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use divan::Bencher;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;
use sha2::{Digest, Sha256};
use toolwarden_core::Engine;
use toolwarden_core::protocol::{Principal, Scopes, Timestamp};
use toolwarden_http::oauth::{JwksSource, OAuth, OAuthSettings};
use toolwarden_http::{HttpOptions, TokenPrincipal, router};
use tower::ServiceExt as _;

const TOKEN: &str = "bench-token-0123456789abcdef0123456789abcdef";
const ISSUER: &str = "https://issuer.example";
const AUDIENCE: &str = "toolwarden-bench";

fn main() {
    divan::main();
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

/// The single-token check before principals: the token's SHA-256 compared in constant time.
#[derive(Clone)]
struct OldToken(Arc<[u8; 32]>);

async fn old_require(State(token): State<OldToken>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .and_then(|(scheme, credential)| {
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| credential.trim())
        });
    match presented {
        Some(presented) => {
            let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
            let diff = token
                .0
                .iter()
                .zip(digest.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if std::hint::black_box(diff) == 0 {
                next.run(request).await
            } else {
                (axum::http::StatusCode::UNAUTHORIZED, "wrong").into_response()
            }
        }
        None => (axum::http::StatusCode::UNAUTHORIZED, "missing").into_response(),
    }
}

fn app(opts: HttpOptions) -> Router {
    router(Engine::builder().build(), opts)
}

/// `GET /v1/me` with `bearer`, through `app`; asserts 200.
fn request(app: &Router, bearer: Option<&str>) {
    let mut req = Request::get("/v1/me").header(header::HOST, "127.0.0.1");
    if let Some(token) = bearer {
        req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let req = req.body(Body::empty()).unwrap();
    let resp = runtime().block_on(app.clone().oneshot(req)).unwrap();
    assert_eq!(resp.status(), 200);
}

fn principals(n: usize) -> Vec<TokenPrincipal> {
    (0..n)
        .map(|i| {
            let token = if i + 1 == n {
                TOKEN.to_owned()
            } else {
                format!("other-token-{i}-0123456789abcdef0123456789")
            };
            TokenPrincipal::new(&token, Principal::new(format!("p{i}"), Scopes::all()))
        })
        .collect()
}

#[divan::bench]
fn no_auth(b: Bencher) {
    let app = app(HttpOptions::default());
    b.bench_local(|| request(&app, None));
}

#[divan::bench]
fn single_token_before_principals(b: Bencher) {
    let token = OldToken(Arc::new(Sha256::digest(TOKEN.as_bytes()).into()));
    // The router without authentication, and the old check in front of it.
    let app =
        app(HttpOptions::default()).layer(axum::middleware::from_fn_with_state(token, old_require));
    b.bench_local(|| request(&app, Some(TOKEN)));
}

#[divan::bench]
fn single_token(b: Bencher) {
    let app = app(HttpOptions {
        token: Some(TOKEN.to_owned()),
        ..HttpOptions::default()
    });
    b.bench_local(|| request(&app, Some(TOKEN)));
}

#[divan::bench(args = [1, 10])]
fn token_principals(b: Bencher, n: usize) {
    let app = app(HttpOptions {
        tokens: principals(n),
        ..HttpOptions::default()
    });
    b.bench_local(|| request(&app, Some(TOKEN)));
}

/// A signing key (made by `openssl genpkey`) and its public JWK.
struct SigningKey {
    alg: Algorithm,
    kid: String,
    encoding: EncodingKey,
    jwk: Jwk,
}

fn signing_key(dir: &std::path::Path, alg: Algorithm) -> SigningKey {
    let args: &[&str] = match alg {
        Algorithm::ES256 => &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        Algorithm::EdDSA => &["-algorithm", "ed25519"],
        _ => &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    };
    let kid = format!("{alg:?}");
    let path = dir.join(format!("{kid}.pem"));
    let status = std::process::Command::new("openssl")
        .arg("genpkey")
        .args(args)
        .arg("-out")
        .arg(&path)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl makes the bench's keys");
    assert!(status.success());
    let pem = std::fs::read(&path).unwrap();
    let encoding = match alg {
        Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
        Algorithm::EdDSA => EncodingKey::from_ed_pem(&pem),
        _ => EncodingKey::from_rsa_pem(&pem),
    }
    .unwrap();
    let mut jwk = Jwk::from_encoding_key(&encoding, alg).unwrap();
    jwk.common.key_id = Some(kid.clone());
    SigningKey {
        alg,
        kid,
        encoding,
        jwk,
    }
}

/// The three keys and a verifier that has read them (from a JWKS file).
struct Issuer {
    keys: Vec<SigningKey>,
    oauth: Arc<OAuth>,
    _dir: tempfile::TempDir,
}

fn issuer() -> &'static Issuer {
    static ISSUER_: OnceLock<Issuer> = OnceLock::new();
    ISSUER_.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<SigningKey> = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA]
            .into_iter()
            .map(|alg| signing_key(dir.path(), alg))
            .collect();
        let jwks = JwkSet {
            keys: keys.iter().map(|k| k.jwk.clone()).collect(),
        };
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, serde_json::to_vec(&jwks).unwrap()).unwrap();
        let (oauth, warning) = runtime().block_on(OAuth::start(OAuthSettings {
            issuer: ISSUER.to_owned(),
            audience: AUDIENCE.to_owned(),
            jwks: JwksSource::File(path),
            resource: "http://127.0.0.1:1/mcp".to_owned(),
            principal_claim: "sub".to_owned(),
            scopes_claim: "scope".to_owned(),
            leeway: Duration::from_secs(60),
        }));
        assert!(warning.is_none(), "{warning:?}");
        Issuer {
            keys,
            oauth,
            _dir: dir,
        }
    })
}

/// A token of `key`, unlike every other one this process made.
fn token(key: &SigningKey) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = Timestamp::now().unix_millis() / 1000;
    let claims = json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "agent-7", "scope": "call read",
        "iat": now, "exp": now + 3600, "jti": NEXT.fetch_add(1, Ordering::Relaxed),
    });
    let mut header = Header::new(key.alg);
    header.kid = Some(key.kid.clone());
    jsonwebtoken::encode(&header, &claims, &key.encoding).unwrap()
}

/// A request with a JWT accepted before: its digest is found among the tokens already seen.
#[divan::bench]
fn jwt_seen(b: Bencher) {
    let issuer = issuer();
    let app = app(HttpOptions {
        oauth: Some(issuer.oauth.clone()),
        ..HttpOptions::default()
    });
    let token = token(&issuer.keys[0]);
    request(&app, Some(&token));
    b.bench_local(|| request(&app, Some(&token)));
}

/// A new token's validation (signature, `iss`, `aud`, `exp`, `nbf`, the principal and scopes
/// from its claims), the issuer's keys already read. Each sample's token is new (made outside
/// the timing).
#[divan::bench(args = ["RS256", "ES256", "EdDSA"], sample_count = 200, sample_size = 1)]
fn jwt_new(b: Bencher, alg: &str) {
    let issuer = issuer();
    let key = issuer
        .keys
        .iter()
        .find(|k| format!("{:?}", k.alg) == alg)
        .unwrap();
    b.with_inputs(|| token(key)).bench_local_values(|token| {
        let principal = runtime().block_on(issuer.oauth.verify(&token)).unwrap();
        assert_eq!(&*principal.name, "agent-7");
    });
}
