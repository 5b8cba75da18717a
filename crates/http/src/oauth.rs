//! toolwarden as an OAuth 2.1 resource server (the MCP authorization spec): a bearer token that
//! is a JWT access token of the configured issuer names the principal (docs/AUTH.md).
//!
//! A token is accepted when its signature verifies with one of the issuer's keys (RS256, ES256 or
//! EdDSA — never `none`, never an HMAC, whose "secret" would be a public key), its `iss` is the
//! issuer, its `aud` contains the audience, and `exp`/`nbf` hold within the leeway. The keys come
//! from the issuer's JWKS (`jwks_url`, or `jwks_file`), read when the server starts and read
//! again when a token names a key id not in it (a rotated key), at most once every
//! [`REFETCH_EVERY`]. Signature checks are the `jsonwebtoken` crate's, over `aws-lc-rs`.
//!
//! A token already accepted is remembered (by its SHA-256) until it expires, so that an agent's
//! requests after its first cost a digest, not a signature check.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::{Mutex, RwLock};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use toolwarden_protocol::{Principal, Scope, Scopes, Timestamp};

/// The issuer's keys are read again for an unknown key id at most this often.
pub const REFETCH_EVERY: Duration = Duration::from_secs(10);

/// How long a read of `jwks_url` may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// How many accepted tokens are remembered (the memory is emptied when it is full).
const SEEN_TOKENS: usize = 10_000;

/// Where the issuer's signing keys are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JwksSource {
    /// A JWKS served over HTTP(S).
    Url(String),
    /// A JWKS in a file.
    File(PathBuf),
}

impl std::fmt::Display for JwksSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JwksSource::Url(url) => write!(f, "jwks_url {url}"),
            JwksSource::File(path) => write!(f, "jwks_file {}", path.display()),
        }
    }
}

/// `[auth.oauth]`, resolved.
#[derive(Clone, Debug)]
pub struct OAuthSettings {
    /// A token's `iss` must be this.
    pub issuer: String,
    /// A token's `aud` must contain this.
    pub audience: String,
    /// The issuer's keys.
    pub jwks: JwksSource,
    /// This server's public URL (what `/.well-known/oauth-protected-resource` describes).
    pub resource: String,
    /// The claim naming the principal (`sub` by default).
    pub principal_claim: String,
    /// The claim holding the scopes (`scope` by default; `scp` is read too).
    pub scopes_claim: String,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
}

/// Why a token was refused; the message is the 401's `error_description`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The token is not one this server accepts.
    #[error("{0}")]
    Invalid(String),
    /// The issuer's keys cannot be read, so no token can be checked now.
    #[error("{0}")]
    KeysUnavailable(String),
}

/// A verification key of the issuer and the one algorithm it verifies.
struct Key {
    decoding: DecodingKey,
    alg: Algorithm,
}

/// The issuer's keys, by key id (keys without one are tried by algorithm).
#[derive(Default)]
struct IssuerKeys {
    by_kid: HashMap<String, Arc<Key>>,
    unnamed: Vec<Arc<Key>>,
}

impl IssuerKeys {
    fn find(&self, kid: Option<&str>, alg: Algorithm) -> Option<Arc<Key>> {
        match kid {
            Some(kid) => self.by_kid.get(kid).cloned(),
            None => self
                .unnamed
                .iter()
                .chain(self.by_kid.values())
                .find(|k| k.alg == alg)
                .cloned(),
        }
    }
}

/// An accepted token, remembered until it expires.
struct AcceptedToken {
    principal: Principal,
    /// `exp` (Unix seconds) plus the leeway.
    until: i64,
}

/// The verifier: the settings, the keys, and the tokens already accepted.
pub struct OAuth {
    settings: OAuthSettings,
    client: reqwest::Client,
    keys: RwLock<Arc<IssuerKeys>>,
    /// When the keys were last read again for an unknown key id (the read at start does not
    /// count); held while a read runs, so a burst of tokens with a new key id reads them once.
    last_read: tokio::sync::Mutex<Option<Instant>>,
    reads: AtomicU64,
    seen: Mutex<HashMap<[u8; 32], AcceptedToken>>,
}

impl std::fmt::Debug for OAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuth")
            .field("issuer", &self.settings.issuer)
            .field("jwks", &self.settings.jwks)
            .finish_non_exhaustive()
    }
}

impl OAuth {
    /// A verifier that has read the issuer's keys once. When they cannot be read, it starts
    /// without them and says why (tokens are refused until a read succeeds).
    pub async fn start(settings: OAuthSettings) -> (Arc<OAuth>, Option<String>) {
        let oauth = Arc::new(OAuth {
            settings,
            client: reqwest::Client::builder()
                .timeout(FETCH_TIMEOUT)
                .build()
                .unwrap_or_default(),
            keys: RwLock::new(Arc::new(IssuerKeys::default())),
            last_read: tokio::sync::Mutex::new(None),
            reads: AtomicU64::new(0),
            seen: Mutex::new(HashMap::new()),
        });
        let warning = oauth.read_keys().await.err();
        (oauth, warning)
    }

    /// The settings it checks tokens against.
    pub fn settings(&self) -> &OAuthSettings {
        &self.settings
    }

    /// How many times the issuer's keys were read (or tried).
    pub fn key_reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// The RFC 9728 metadata of this resource.
    pub fn metadata(&self) -> Value {
        json!({
            "resource": self.settings.resource,
            "authorization_servers": [self.settings.issuer],
            "scopes_supported": Scope::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            "bearer_methods_supported": ["header"],
        })
    }

    /// Where the metadata is served: `/.well-known/oauth-protected-resource` inserted between
    /// the resource's origin and its path (RFC 9728 §3.1).
    pub fn metadata_url(&self) -> String {
        metadata_url(&self.settings.resource)
    }

    /// The `WWW-Authenticate` value of a 401: the metadata's URL, and for a refused token why.
    pub fn challenge(&self, refusal: Option<&Refusal>) -> String {
        let mut value = format!("Bearer resource_metadata=\"{}\"", self.metadata_url());
        if let Some(refusal) = refusal {
            let description = refusal.to_string().replace(['"', '\\'], "'");
            value.push_str(&format!(
                ", error=\"invalid_token\", error_description=\"{description}\""
            ));
        }
        value
    }

    /// The principal of an access token, or why it is refused.
    pub async fn verify(&self, token: &str) -> Result<Principal, Refusal> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Timestamp::now().unix_millis() / 1000;
        if let Some(seen) = self.seen.lock().get(&digest)
            && seen.until > now
        {
            return Ok(seen.principal.clone());
        }
        let header = jsonwebtoken::decode_header(token).map_err(|e| {
            Refusal::Invalid(format!(
                "the bearer token is not a token of this server ({e})"
            ))
        })?;
        let alg = header.alg;
        if !matches!(alg, Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA) {
            return Err(Refusal::Invalid(format!(
                "the token is signed with {alg:?}; this server accepts RS256, ES256 and EdDSA"
            )));
        }
        let kid = header.kid.as_deref();
        let key = match self.key(kid, alg) {
            Some(key) => key,
            None => {
                // A key this server has not seen: the issuer may have rotated its keys.
                self.read_again().await?;
                self.key(kid, alg).ok_or_else(|| {
                    Refusal::Invalid(match kid {
                        Some(kid) => format!("the token's key {kid:?} is not one of the issuer's"),
                        None => format!("the issuer has no {alg:?} key for a token without kid"),
                    })
                })?
            }
        };
        if key.alg != alg {
            return Err(Refusal::Invalid(format!(
                "the token says {alg:?}, but its key {:?} is for {:?}",
                kid.unwrap_or(""),
                key.alg
            )));
        }
        let mut validation = Validation::new(alg);
        validation.leeway = self.settings.leeway.as_secs();
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&[&self.settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &validation)
            .map_err(|e| Refusal::Invalid(self.why(&e)))?;
        let claims = data.claims;
        let principal = self.principal(&claims)?;
        let until = claims
            .get("exp")
            .and_then(Value::as_i64)
            .unwrap_or(now)
            .saturating_add(self.settings.leeway.as_secs() as i64);
        let mut seen = self.seen.lock();
        if seen.len() >= SEEN_TOKENS {
            seen.clear();
        }
        seen.insert(
            digest,
            AcceptedToken {
                principal: principal.clone(),
                until,
            },
        );
        Ok(principal)
    }

    fn key(&self, kid: Option<&str>, alg: Algorithm) -> Option<Arc<Key>> {
        self.keys.read().find(kid, alg)
    }

    /// Reads the keys again, unless they were read again (or tried) less than
    /// [`REFETCH_EVERY`] ago.
    async fn read_again(&self) -> Result<(), Refusal> {
        let mut last = self.last_read.lock().await;
        if last.is_some_and(|at| at.elapsed() < REFETCH_EVERY) {
            return if self.keys.read().by_kid.is_empty() && self.keys.read().unnamed.is_empty() {
                Err(Refusal::KeysUnavailable(format!(
                    "the issuer's keys ({}) could not be read; tried again in at most {}s",
                    self.settings.jwks,
                    REFETCH_EVERY.as_secs()
                )))
            } else {
                Ok(())
            };
        }
        *last = Some(Instant::now());
        self.read_keys().await.map_err(Refusal::KeysUnavailable)
    }

    /// Reads the JWKS and replaces the keys (kept as they were when the read fails).
    async fn read_keys(&self) -> Result<(), String> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let source = &self.settings.jwks;
        let text =
            match source {
                JwksSource::Url(url) => {
                    let response =
                        self.client.get(url).send().await.map_err(|e| {
                            format!("cannot read the issuer's keys ({source}): {e}")
                        })?;
                    if !response.status().is_success() {
                        return Err(format!(
                            "cannot read the issuer's keys ({source}): HTTP {}",
                            response.status()
                        ));
                    }
                    response
                        .text()
                        .await
                        .map_err(|e| format!("cannot read the issuer's keys ({source}): {e}"))?
                }
                JwksSource::File(path) => tokio::fs::read_to_string(path)
                    .await
                    .map_err(|e| format!("cannot read the issuer's keys ({source}): {e}"))?,
            };
        let keys = parse_jwks(&text).map_err(|e| format!("the issuer's keys ({source}): {e}"))?;
        *self.keys.write() = Arc::new(keys);
        Ok(())
    }

    /// The principal a token's claims name, with the scopes they grant.
    fn principal(&self, claims: &Map<String, Value>) -> Result<Principal, Refusal> {
        let claim = &self.settings.principal_claim;
        let name = claims
            .get(claim)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                Refusal::Invalid(format!(
                    "the token has no {claim:?} claim (a string) to name its principal"
                ))
            })?;
        if name == toolwarden_protocol::LOCAL_PRINCIPAL
            || name == toolwarden_protocol::DEFAULT_PRINCIPAL
        {
            // Those two hold every scope whatever a token says: an issuer's user of that name
            // must not become them.
            return Err(Refusal::Invalid(format!(
                "the token's {claim:?} claim is {name:?}, a name toolwarden reserves (\"local\" is loopback without authentication, \"default\" the token of [http] token_env)"
            )));
        }
        if !toolwarden_core::config::principal_name_ok(name) {
            return Err(Refusal::Invalid(format!(
                "the token's {claim:?} claim {name:?} is not a principal's name (1 to 128 characters without spaces or control characters)"
            )));
        }
        let mut scopes = Scopes::NONE;
        for claim in [self.settings.scopes_claim.as_str(), "scp"] {
            match claims.get(claim) {
                Some(Value::String(list)) => {
                    scopes = list
                        .split_whitespace()
                        .filter_map(Scope::parse)
                        .fold(scopes, Scopes::with);
                }
                Some(Value::Array(list)) => {
                    scopes = list
                        .iter()
                        .filter_map(Value::as_str)
                        .filter_map(Scope::parse)
                        .fold(scopes, Scopes::with);
                }
                _ => {}
            }
        }
        Ok(Principal::new(name, scopes))
    }

    /// Why `jsonwebtoken` refused a token, in words.
    fn why(&self, e: &jsonwebtoken::errors::Error) -> String {
        use jsonwebtoken::errors::ErrorKind;
        match e.kind() {
            ErrorKind::ExpiredSignature => "the token has expired".to_owned(),
            ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".to_owned(),
            ErrorKind::InvalidSignature => "the token's signature does not verify".to_owned(),
            ErrorKind::InvalidAudience => format!(
                "the token's audience (aud) does not include {:?}",
                self.settings.audience
            ),
            ErrorKind::InvalidIssuer => {
                format!("the token's issuer (iss) is not {:?}", self.settings.issuer)
            }
            ErrorKind::MissingRequiredClaim(claim) => {
                format!("the token has no {claim:?} claim")
            }
            ErrorKind::InvalidAlgorithm => "the token's algorithm does not match its key".into(),
            _ => format!("the token is not valid: {e}"),
        }
    }
}

/// The RFC 9728 metadata URL of `resource`.
pub fn metadata_url(resource: &str) -> String {
    const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";
    match resource.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let path = path.trim_end_matches('/');
            format!("{scheme}://{authority}{WELL_KNOWN}{path}")
        }
        None => WELL_KNOWN.to_owned(),
    }
}

/// The keys of a JWKS this server can use: RSA keys for RS256, P-256 keys for ES256, Ed25519
/// keys for EdDSA (a key whose `alg` says otherwise, or of another kind, is left out).
fn parse_jwks(text: &str) -> Result<IssuerKeys, String> {
    let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS: {e}"))?;
    let mut keys = IssuerKeys::default();
    for jwk in &set.keys {
        let alg = match (&jwk.algorithm, jwk.common.key_algorithm) {
            (AlgorithmParameters::RSA(_), None | Some(KeyAlgorithm::RS256)) => Algorithm::RS256,
            (AlgorithmParameters::EllipticCurve(ec), None | Some(KeyAlgorithm::ES256))
                if ec.curve == EllipticCurve::P256 =>
            {
                Algorithm::ES256
            }
            (AlgorithmParameters::OctetKeyPair(okp), None | Some(KeyAlgorithm::EdDSA))
                if okp.curve == EllipticCurve::Ed25519 =>
            {
                Algorithm::EdDSA
            }
            _ => continue,
        };
        let Ok(decoding) = DecodingKey::from_jwk(jwk) else {
            continue;
        };
        let key = Arc::new(Key { decoding, alg });
        match &jwk.common.key_id {
            Some(kid) => {
                keys.by_kid.insert(kid.clone(), key);
            }
            None => keys.unnamed.push(key),
        }
    }
    if keys.by_kid.is_empty() && keys.unnamed.is_empty() {
        return Err("it holds no RS256, ES256 or EdDSA key".to_owned());
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_urls_insert_the_well_known_path_after_the_origin() {
        assert_eq!(
            metadata_url("https://tw.example.com/mcp"),
            "https://tw.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_url("http://127.0.0.1:8080"),
            "http://127.0.0.1:8080/.well-known/oauth-protected-resource"
        );
        assert_eq!(
            metadata_url("http://127.0.0.1:8080/"),
            "http://127.0.0.1:8080/.well-known/oauth-protected-resource"
        );
    }

    /// A token naming key `kid`, whose signature nobody checks (its key is unknown).
    fn naming(kid: &str) -> String {
        fn b64(bytes: &[u8]) -> String {
            const A: &[u8; 64] =
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
            let mut out = String::new();
            for chunk in bytes.chunks(3) {
                let n = chunk
                    .iter()
                    .enumerate()
                    .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
                for i in 0..=chunk.len() {
                    out.push(char::from(A[((n >> (18 - 6 * i)) & 63) as usize]));
                }
            }
            out
        }
        let header = b64(format!(r#"{{"alg":"ES256","kid":"{kid}"}}"#).as_bytes());
        format!("{header}.{}.c2ln", b64(br#"{"sub":"x"}"#))
    }

    /// A verifier of issuer `https://issuer.test` for audience `tw` that has read a JWKS file
    /// of one P-256 key, `kid` "1" (the directory holds the file).
    async fn one_key_verifier() -> (tempfile::TempDir, Arc<OAuth>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(
            &path,
            r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"1",
               "x":"MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4",
               "y":"4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM"}]}"#,
        )
        .unwrap();
        let (oauth, warning) = OAuth::start(OAuthSettings {
            issuer: "https://issuer.test".into(),
            audience: "tw".into(),
            jwks: JwksSource::File(path),
            resource: "http://127.0.0.1:7420/mcp".into(),
            principal_claim: "sub".into(),
            scopes_claim: "scope".into(),
            leeway: Duration::from_secs(60),
        })
        .await;
        assert_eq!(warning, None);
        (dir, oauth)
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_key_ids_read_the_keys_again_at_most_once_every_ten_seconds() {
        let (_dir, oauth) = one_key_verifier().await;
        assert_eq!(oauth.key_reads(), 1, "read at start");
        // A key id the keys lack: read again at once (a rotation)…
        let refused = oauth.verify(&naming("2")).await.unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("\"2\" is not one of the issuer's")
        );
        assert_eq!(oauth.key_reads(), 2);
        // …but not again within ten seconds, whatever the key id.
        for kid in ["2", "3", "4"] {
            oauth.verify(&naming(kid)).await.unwrap_err();
        }
        assert_eq!(oauth.key_reads(), 2);
        tokio::time::advance(REFETCH_EVERY).await;
        oauth.verify(&naming("5")).await.unwrap_err();
        assert_eq!(oauth.key_reads(), 3);
        // A known key id reads nothing (the token is refused for its signature).
        let refused = oauth.verify(&naming("1")).await.unwrap_err();
        assert_eq!(oauth.key_reads(), 3);
        assert!(refused.to_string().contains("signature"), "{refused}");
    }

    #[tokio::test]
    async fn claims_name_the_principal_and_its_scopes_but_never_a_reserved_name() {
        let (_dir, oauth) = one_key_verifier().await;
        let claims = |v: Value| -> Map<String, Value> { serde_json::from_value(v).unwrap() };
        let p = oauth
            .principal(&claims(
                json!({"sub": "alice", "scope": "call bogus", "scp": ["read"]}),
            ))
            .unwrap();
        assert_eq!(&*p.name, "alice");
        assert_eq!(p.scopes, Scopes::NONE.with(Scope::Call).with(Scope::Read));
        for sub in ["local", "default", "two words", ""] {
            let refused = oauth.principal(&claims(json!({"sub": sub}))).unwrap_err();
            assert!(refused.to_string().contains("\"sub\""), "{refused}");
        }
        assert!(oauth.principal(&claims(json!({"sub": 7}))).is_err());
    }

    #[tokio::test]
    async fn unreadable_keys_are_a_warning_and_tokens_are_refused_until_they_can_be_read() {
        let (oauth, warning) = OAuth::start(OAuthSettings {
            issuer: "https://issuer.test".into(),
            audience: "tw".into(),
            jwks: JwksSource::File("/nonexistent/jwks.json".into()),
            resource: "http://127.0.0.1:7420/mcp".into(),
            principal_claim: "sub".into(),
            scopes_claim: "scope".into(),
            leeway: Duration::from_secs(60),
        })
        .await;
        let warning = warning.unwrap();
        assert!(
            warning.contains("jwks_file /nonexistent/jwks.json"),
            "{warning}"
        );
        let refused = oauth.verify(&naming("1")).await.unwrap_err();
        assert!(
            matches!(refused, Refusal::KeysUnavailable(_)),
            "{refused:?}"
        );
        let challenge = oauth.challenge(Some(&refused));
        assert!(challenge.starts_with(
            "Bearer resource_metadata=\"http://127.0.0.1:7420/.well-known/oauth-protected-resource/mcp\", error=\"invalid_token\""
        ), "{challenge}");
    }

    #[test]
    fn a_jwks_without_a_usable_key_is_refused() {
        let hmac = r#"{"keys":[{"kty":"oct","k":"c2VjcmV0","alg":"HS256","kid":"h"}]}"#;
        assert!(parse_jwks(hmac).err().unwrap().contains("no RS256"));
        assert!(parse_jwks("[]").err().unwrap().contains("not a JWKS"));
    }
}
