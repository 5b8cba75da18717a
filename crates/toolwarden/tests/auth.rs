//! Principals (docs/AUTH.md) on the real binary: two token principals and one whose JWT access
//! tokens a test issuer signs (keys made with `openssl` here, the issuer's JWKS served by the test
//! on 127.0.0.1). Each call is attributed to its principal in the trail, `/v1/audit`,
//! `toolwarden audit --principal` and `/v1/turns/active`; scopes hold on every door; bad tokens
//! get 401 with the OAuth challenge; a rotated key is read once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use parking_lot::Mutex;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::serve::config;
use crate::util::{Dir, Running, http, marker};

const AUDIENCE: &str = "toolwarden-test";

/// A signing key made by `openssl genpkey`, with its public JWK.
struct SigningKey {
    kid: String,
    alg: Algorithm,
    encoding: EncodingKey,
    jwk: Jwk,
}

impl SigningKey {
    fn new(dir: &Dir, kid: &str, alg: Algorithm) -> SigningKey {
        let args: &[&str] = match alg {
            Algorithm::ES256 => &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
            Algorithm::EdDSA => &["-algorithm", "ed25519"],
            Algorithm::RS256 => &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
            other => panic!("no key for {other:?}"),
        };
        let path = dir.path().join(format!("{kid}.pem"));
        let status = std::process::Command::new("openssl")
            .arg("genpkey")
            .args(args)
            .arg("-out")
            .arg(&path)
            .status()
            .expect("openssl (Debian package openssl) makes the test's keys");
        assert!(status.success(), "openssl genpkey failed");
        let pem = std::fs::read(&path).unwrap();
        let encoding = match alg {
            Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
            Algorithm::EdDSA => EncodingKey::from_ed_pem(&pem),
            _ => EncodingKey::from_rsa_pem(&pem),
        }
        .unwrap();
        let mut jwk = Jwk::from_encoding_key(&encoding, alg).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        SigningKey {
            kid: kid.to_owned(),
            alg,
            encoding,
            jwk,
        }
    }

    /// A token with these claims, signed by this key (its `kid` in the header).
    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
    }
}

/// The test's issuer: its JWKS at `/jwks`, counting the reads.
struct Issuer {
    url: String,
    keys: Arc<Mutex<Vec<Jwk>>>,
    reads: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Issuer {
    async fn start(keys: Vec<Jwk>) -> Issuer {
        let keys = Arc::new(Mutex::new(keys));
        let reads = Arc::new(AtomicUsize::new(0));
        let app = axum::Router::new().route(
            "/jwks",
            axum::routing::get({
                let (keys, reads) = (keys.clone(), reads.clone());
                move || {
                    reads.fetch_add(1, Ordering::SeqCst);
                    let set = JwkSet {
                        keys: keys.lock().clone(),
                    };
                    async move { axum::Json(set) }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Issuer {
            url,
            keys,
            reads,
            task,
        }
    }

    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }

    /// Claims of a token for `sub` with `scope`, valid for an hour.
    fn claims(&self, sub: &str, scope: &str) -> Value {
        let now = now();
        json!({"iss": self.url, "aud": AUDIENCE, "sub": sub, "scope": scope,
               "iat": now, "exp": now + 3600})
    }
}

impl Drop for Issuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn now() -> i64 {
    toolwarden_protocol::Timestamp::now().unix_millis() / 1000
}

pub(crate) fn sha256_hex(token: &str) -> String {
    let out = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(token.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

const ALICE: &str = "alice-token-0123456789abcdef0123456789";
const BOB: &str = "bob-token-0123456789abcdef0123456789abc";
const AUDITOR: &str = "auditor-token-0123456789abcdef01234567";
const OPS: &str = "ops-token-0123456789abcdef0123456789abcd";

/// `serve` with four token principals, OAuth of `issuer`, and `test__progress` asking approval.
async fn start(name: &str, issuer: &Issuer) -> (Dir, Running, String, String) {
    let dir = Dir::new();
    let mark = marker(name);
    let extra = format!(
        r#"
[tools."test__progress"]
approval = "ask"

[[auth.tokens]]
principal = "alice"
token_env = "TW_ALICE"

[[auth.tokens]]
principal = "bob"
token_env = "TW_BOB"
scopes = ["call", "read"]

[[auth.tokens]]
principal = "auditor"
token_sha256 = "{auditor}"
scopes = ["read"]

[[auth.tokens]]
principal = "ops"
token_env = "TW_OPS"
scopes = ["call", "abort", "approve", "read"]

[auth.oauth]
issuer = "{iss}"
audience = "{AUDIENCE}"
jwks_url = "{iss}/jwks"
"#,
        auditor = sha256_hex(AUDITOR),
        iss = issuer.url,
    );
    dir.create("toolwarden.toml", &config(&mark, &extra));
    let server = dir
        .command(&["serve", "--listen", "127.0.0.1:0"])
        .env("TW_ALICE", ALICE)
        .env("TW_BOB", BOB)
        .env("TW_OPS", OPS)
        .spawn();
    let url = server.url().await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    (dir, server, url, mark)
}

async fn stop(server: Running, mark: &str) {
    crate::util::stop_clean(server, mark).await;
}

async fn get(url: &str, token: Option<&str>) -> reqwest::Response {
    let mut req = http().get(url);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req.send().await.unwrap()
}

async fn post(url: &str, token: &str, body: Value) -> reqwest::Response {
    http()
        .post(url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// One `test__echo` call in session `s1` as `token`'s principal; its turn's answer.
async fn echo(url: &str, token: &str, text: &str) -> Value {
    let resp = post(
        &format!("{url}/v1/turns"),
        token,
        json!({"session_id": "s1", "calls": [
            {"type": "tool_use", "id": "c1", "name": "test__echo", "input": {"text": text}}
        ]}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

async fn forbidden(resp: reqwest::Response, scope: &str) -> Value {
    assert_eq!(resp.status(), 403);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "forbidden", "{body}");
    assert_eq!(body["error"]["missing_scope"], scope, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("`{scope}`")),
        "{body}"
    );
    body
}

#[tokio::test]
async fn every_call_is_its_principals_and_reads_follow_the_read_scope() {
    let dir = Dir::new();
    let key = SigningKey::new(&dir, "k1", Algorithm::ES256);
    let issuer = Issuer::start(vec![key.jwk.clone()]).await;
    let (dir, server, url, mark) = start("auth-attribution", &issuer).await;
    let carol = key.sign(&issuer.claims("carol", "call openid"));

    echo(&url, ALICE, "from alice").await;
    echo(&url, BOB, "from bob").await;
    echo(&url, &carol, "from carol").await;

    // A reader sees every principal's calls, each attributed.
    let calls: Value = get(&format!("{url}/v1/audit/calls"), Some(BOB))
        .await
        .json()
        .await
        .unwrap();
    let mut who: Vec<(String, String)> = calls["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let text = c["events"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["type"] == "tool_result")
                .map(|e| e["content"][0]["text"].as_str().unwrap().to_owned())
                .unwrap();
            (c["principal"].as_str().unwrap().to_owned(), text)
        })
        .collect();
    who.sort();
    assert_eq!(
        who,
        [
            ("alice".to_owned(), "from alice".to_owned()),
            ("bob".to_owned(), "from bob".to_owned()),
            ("carol".to_owned(), "from carol".to_owned()),
        ]
    );
    // Every event of a call names its principal.
    let events: Value = get(&format!("{url}/v1/audit?principal=carol"), Some(BOB))
        .await
        .json()
        .await
        .unwrap();
    let events = events["events"].as_array().unwrap();
    assert!(events.len() >= 4, "{events:?}");
    assert!(
        events.iter().all(|e| e["principal"] == "carol"),
        "{events:?}"
    );

    // Without `read`, one's own records only; another's is a 403 naming `read`.
    let own: Value = get(&format!("{url}/v1/audit/calls"), Some(ALICE))
        .await
        .json()
        .await
        .unwrap();
    let own = own["calls"].as_array().unwrap();
    assert_eq!(own.len(), 1, "{own:?}");
    assert_eq!(own[0]["principal"], "alice");
    forbidden(
        get(&format!("{url}/v1/audit?principal=bob"), Some(ALICE)).await,
        "read",
    )
    .await;

    // Session ids are each principal's own: alice's s1 and bob's s1 are two sessions.
    for (token, name) in [(ALICE, "alice"), (BOB, "bob")] {
        let status: Value = get(&format!("{url}/v1/sessions/s1/status"), Some(token))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(status["counts"]["ok"], 1, "{name}: {status}");
    }

    // A read-only principal cannot start a call.
    forbidden(
        post(
            &format!("{url}/v1/turns"),
            AUDITOR,
            json!({"calls": [{"type": "tool_use", "id": "c1", "name": "test__echo", "input": {}}]}),
        )
        .await,
        "call",
    )
    .await;
    // Nor over MCP, nor have a server read a resource; it may list the tools.
    for (method, params) in [
        ("tools/call", json!({"name": "test__echo", "arguments": {}})),
        ("resources/read", json!({"uri": "test://static/hello"})),
    ] {
        let answer = crate::util::mcp_as(&url, Some(AUDITOR), 1, method, params).await;
        assert_eq!(answer["error"]["code"], -32003, "{method}: {answer}");
        assert_eq!(
            answer["error"]["data"]["toolwarden/missing_scope"], "call",
            "{answer}"
        );
    }
    let listed = crate::util::mcp_as(&url, Some(AUDITOR), 2, "tools/list", json!({})).await;
    assert!(
        !listed["result"]["tools"].as_array().unwrap().is_empty(),
        "{listed}"
    );

    // The CLI reads the same attribution from the trail's file.
    stop(server, &mark).await;
    let out = dir.command(&["audit", "--principal", "carol"]).run().await;
    out.expect_code(0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].contains("PRINCIPAL"), "{}", out.stdout);
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert!(lines[1].contains("carol") && lines[1].contains("test__echo"));
    let json = dir
        .command(&["audit", "--principal", "alice", "--json"])
        .run()
        .await;
    json.expect_code(0);
    let rows: Vec<Value> = json
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "{}", json.stdout);
    assert_eq!(rows[0]["principal"], "alice");
}

/// Waits until `token`'s principal lists a running turn; its id.
async fn running_turn(url: &str, token: &str) -> String {
    for _ in 0..500 {
        let active: Value = get(&format!("{url}/v1/turns/active"), Some(token))
            .await
            .json()
            .await
            .unwrap();
        if let Some(turn) = active["turns"].as_array().and_then(|t| t.first()) {
            return turn["turn_id"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no running turn");
}

#[tokio::test]
async fn aborts_and_approvals_need_their_scopes() {
    let dir = Dir::new();
    let key = SigningKey::new(&dir, "k1", Algorithm::EdDSA);
    let issuer = Issuer::start(vec![key.jwk.clone()]).await;
    let (_dir, server, url, mark) = start("auth-scopes", &issuer).await;

    // Alice's long call, on its own task.
    let long = tokio::spawn({
        let url = url.clone();
        async move {
            post(
                &format!("{url}/v1/turns"),
                ALICE,
                json!({"calls": [{"type": "tool_use", "id": "c1", "name": "test__sleep",
                                  "input": {"ms": 30000}}]}),
            )
            .await
            .json::<Value>()
            .await
            .unwrap()
        }
    });
    let turn = running_turn(&url, ALICE).await;
    // Bob sees it (read) but may not abort it.
    let active: Value = get(&format!("{url}/v1/turns/active"), Some(BOB))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(active["turns"][0]["principal"], "alice", "{active}");
    forbidden(
        post(&format!("{url}/v1/turns/{turn}/abort"), BOB, json!({})).await,
        "abort",
    )
    .await;
    forbidden(
        post(
            &format!("{url}/v1/turns/{turn}/calls/c1/abort"),
            BOB,
            json!({}),
        )
        .await,
        "abort",
    )
    .await;
    // Another principal without `read` does not even see it.
    let carol = key.sign(&issuer.claims("carol", "call"));
    let hidden: Value = get(&format!("{url}/v1/turns/active"), Some(&carol))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(hidden["turns"], json!([]));
    // With the scope, it may.
    let resp = post(&format!("{url}/v1/turns/{turn}/abort"), OPS, json!({})).await;
    assert_eq!(resp.status(), 200);
    let answer = long.await.unwrap();
    assert_eq!(answer["results"][0]["is_error"], true, "{answer}");

    // Everyone may abort their own turn.
    let own = tokio::spawn({
        let (url, carol) = (url.clone(), carol.clone());
        async move {
            post(
                &format!("{url}/v1/turns"),
                &carol,
                json!({"calls": [{"type": "tool_use", "id": "c1", "name": "test__sleep",
                                  "input": {"ms": 30000}}]}),
            )
            .await
            .json::<Value>()
            .await
            .unwrap()
        }
    });
    let turn = running_turn(&url, &carol).await;
    let resp = post(&format!("{url}/v1/turns/{turn}/abort"), &carol, json!({})).await;
    assert_eq!(resp.status(), 200);
    own.await.unwrap();

    // An agent's token cannot answer its own call's approval; a principal with `approve` can.
    let asked = tokio::spawn({
        let url = url.clone();
        async move {
            post(
                &format!("{url}/v1/turns"),
                ALICE,
                json!({"calls": [{"type": "tool_use", "id": "c1", "name": "test__progress",
                                  "input": {"every_ms": 10, "count": 1}}]}),
            )
            .await
            .json::<Value>()
            .await
            .unwrap()
        }
    });
    let id = loop {
        let list: Value = get(&format!("{url}/v1/interactions"), Some(ALICE))
            .await
            .json()
            .await
            .unwrap();
        if let Some(i) = list["interactions"].as_array().and_then(|l| l.first()) {
            assert_eq!(i["principal"], "alice", "{i}");
            break i["id"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    forbidden(
        post(
            &format!("{url}/v1/interactions/{id}"),
            ALICE,
            json!({"action": "approve"}),
        )
        .await,
        "approve",
    )
    .await;
    let resp = post(
        &format!("{url}/v1/interactions/{id}"),
        OPS,
        json!({"action": "approve"}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let answer = asked.await.unwrap();
    assert_eq!(answer["results"][0]["is_error"], false, "{answer}");
    // The trail says who answered: the call is alice's, the answer ops'.
    let trail: Value = get(
        &format!("{url}/v1/audit?type=interaction_answered"),
        Some(OPS),
    )
    .await
    .json()
    .await
    .unwrap();
    let answered = &trail["events"][0];
    assert_eq!(
        (
            &answered["principal"],
            &answered["by"],
            &answered["answerer"]
        ),
        (&json!("alice"), &json!("http"), &json!("ops")),
        "{trail}"
    );
    stop(server, &mark).await;
}

#[tokio::test]
async fn bad_tokens_get_401_with_the_oauth_challenge_and_a_rotated_key_is_read_once() {
    let dir = Dir::new();
    let k1 = SigningKey::new(&dir, "k1", Algorithm::RS256);
    let k2 = SigningKey::new(&dir, "k2", Algorithm::ES256);
    let stranger = SigningKey::new(&dir, "k1", Algorithm::RS256);
    let issuer = Issuer::start(vec![k1.jwk.clone()]).await;
    let (_dir, server, url, mark) = start("auth-refusals", &issuer).await;
    let port = url.rsplit(':').next().unwrap();
    let metadata = format!(
        "resource_metadata=\"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp\""
    );

    // The metadata needs no token, and names the issuer.
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let meta: Value = get(&format!("{url}{path}"), None)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(meta["authorization_servers"], json!([issuer.url]));
        assert_eq!(meta["resource"], format!("http://127.0.0.1:{port}/mcp"));
    }

    let good = k1.sign(&issuer.claims("carol", "call"));
    assert_eq!(
        get(&format!("{url}/v1/tools"), Some(&good)).await.status(),
        200
    );
    let reads = issuer.reads();

    let now = now();
    let mut expired = issuer.claims("carol", "call");
    expired["exp"] = json!(now - 600);
    let mut wrong_audience = issuer.claims("carol", "call");
    wrong_audience["aud"] = json!("someone-else");
    let none = {
        let header = base64_engine(br#"{"alg":"none","typ":"JWT","kid":"k1"}"#);
        let claims = base64_engine(issuer.claims("carol", "call admin").to_string().as_bytes());
        format!("{header}.{claims}.")
    };
    for (what, token, says) in [
        ("expired", k1.sign(&expired), "expired"),
        (
            "wrongly signed",
            stranger.sign(&issuer.claims("carol", "call")),
            "signature",
        ),
        ("wrong audience", k1.sign(&wrong_audience), "audience"),
        ("alg=none", none, "not a token of this server"),
    ] {
        let resp = get(&format!("{url}/v1/tools"), Some(&token)).await;
        assert_eq!(resp.status(), 401, "{what}");
        let challenge = resp.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(challenge.starts_with("Bearer "), "{what}: {challenge}");
        assert!(challenge.contains(&metadata), "{what}: {challenge}");
        assert!(
            challenge.contains("error=\"invalid_token\""),
            "{what}: {challenge}"
        );
        let body: Value = resp.json().await.unwrap();
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{what}: {body}"
        );
    }
    // None of those made the server read the keys again (they name a known key).
    assert_eq!(issuer.reads(), reads);

    // No token, and a malformed header: 401 naming what is wrong, with the challenge.
    let resp = get(&format!("{url}/mcp"), None).await;
    assert_eq!(resp.status(), 401);
    assert!(
        resp.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .contains(&metadata)
    );
    let resp = http()
        .get(format!("{url}/v1/tools"))
        .header("authorization", "Basic YWxpY2U6cGFzcw==")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"Basic\" scheme"),
        "{body}"
    );

    // The issuer rotates to a new key: the first token that names it makes one read; later
    // ones need none.
    issuer.keys.lock().push(k2.jwk.clone());
    let rotated = k2.sign(&issuer.claims("dave", "call"));
    assert_eq!(
        get(&format!("{url}/v1/tools"), Some(&rotated))
            .await
            .status(),
        200
    );
    assert_eq!(issuer.reads(), reads + 1);
    let again = k2.sign(&issuer.claims("erin", "read"));
    assert_eq!(
        get(&format!("{url}/v1/tools"), Some(&again)).await.status(),
        200
    );
    assert_eq!(issuer.reads(), reads + 1);
    stop(server, &mark).await;
}

/// Unpadded base64url, for a token written by hand.
fn base64_engine(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

/// What the binary refuses or warns about before it serves: a token given to two principals
/// (or also `[http] token_env`'s), a short single token; and what a local principal's
/// `[[auth.tokens]]` scopes mean for `toolwarden call`, and exec never sees a token variable.
#[tokio::test]
async fn tokens_given_twice_are_refused_and_local_principals_keep_their_entrys_scopes() {
    let dir = Dir::new();
    let write = |extra: &str| {
        dir.create(
            "toolwarden.toml",
            &format!("[exec]\nenabled = true\n\n[store]\nenabled = false\n{extra}"),
        );
    };
    write(
        r#"
[[auth.tokens]]
principal = "alice"
token_env = "TW_ALICE"

[[auth.tokens]]
principal = "bob"
token_env = "TW_BOB"
"#,
    );
    let out = dir
        .command(&["serve", "--listen", "127.0.0.1:0"])
        .env("TW_ALICE", ALICE)
        .env("TW_BOB", ALICE)
        .run()
        .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("auth.tokens[1]: principal \"bob\"'s token is also \"alice\"'s"),
        "{}",
        out.stderr
    );
    let out = dir
        .command(&["serve", "--listen", "127.0.0.1:0"])
        .env("TW_ALICE", ALICE)
        .env("TW_BOB", BOB)
        .env("TOOLWARDEN_TOKEN", BOB)
        .run()
        .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("token is also \"default\"'s"),
        "{}",
        out.stderr
    );

    // A short single token is a warning of `check`.
    let out = dir
        .command(&["check"])
        .env("TW_ALICE", ALICE)
        .env("TW_BOB", BOB)
        .env("TOOLWARDEN_TOKEN", "short")
        .run()
        .await;
    assert!(
        out.stdout
            .contains("the token in TOOLWARDEN_TOKEN (principal \"default\") is 5 bytes long")
            || out
                .stderr
                .contains("the token in TOOLWARDEN_TOKEN (principal \"default\") is 5 bytes long"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );

    // `call` as a principal whose entry lacks `call` is refused; as one with it, exec runs
    // without any token variable in its environment.
    write(
        r#"
[[auth.tokens]]
principal = "auditor"
token_env = "TW_ALICE"
scopes = ["read"]

[[auth.tokens]]
principal = "bob"
token_env = "TW_BOB"
"#,
    );
    let out = dir
        .command(&[
            "call",
            "exec",
            "--input",
            r#"{"command": "env"}"#,
            "--principal",
            "auditor",
        ])
        .env("TW_ALICE", ALICE)
        .env("TW_BOB", BOB)
        .run()
        .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("principal \"auditor\" lacks scope `call`"),
        "{}",
        out.stderr
    );
    let out = dir
        .command(&[
            "call",
            "exec",
            "--input",
            r#"{"command": "env"}"#,
            "--principal",
            "bob",
        ])
        .env("TW_ALICE", ALICE)
        .env("TW_BOB", BOB)
        .env("TOOLWARDEN_TOKEN", OPS)
        .run()
        .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    for (var, token) in [
        ("TW_ALICE", ALICE),
        ("TW_BOB", BOB),
        ("TOOLWARDEN_TOKEN", OPS),
    ] {
        assert!(
            !out.stdout.contains(var) && !out.stdout.contains(token),
            "exec saw {var}: {}",
            out.stdout
        );
    }
    assert!(out.stdout.contains("PATH="), "{}", out.stdout);
}
