//! Several replicas behaving as one through Redis (docs/SCALE-OUT.md): three real `serve`
//! processes on ephemeral ports, sharing a real Redis — `TOOLWARDEN_TEST_REDIS_URL`, else the
//! local one at 127.0.0.1:6379 (`scripts/setup-test-deps.sh` makes sure one answers). Each test
//! uses its own key prefix, so tests run in parallel on one Redis. The test of Redis going away
//! starts a throwaway `redis-server` of its own on a free port and kills it.

use std::net::TcpListener;
use std::time::Duration;

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::util::{Dir, Running, Sse, http, toml_str};

pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// The throwaway Redis `scripts/setup-test-deps.sh` started when none answered where it looked
/// (`./.test-redis-url`), else `TOOLWARDEN_TEST_REDIS_URL`, else 127.0.0.1:6379.
pub(crate) fn redis_url() -> String {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.test-redis-url");
    if let Ok(url) = std::fs::read_to_string(file)
        && !url.trim().is_empty()
    {
        return url.trim().to_owned();
    }
    std::env::var("TOOLWARDEN_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A key prefix of this test alone (in this run).
pub(crate) fn prefix(test: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("twtest:{test}:{}:{n}:", std::process::id())
}

pub(crate) struct Replica {
    pub(crate) _dir: Dir,
    pub(crate) server: Running,
    pub(crate) url: String,
}

/// One `serve` replica with `exec`, no audit trail, `[redis]` at `url`/`prefix` (with the default
/// `timeout` of 250 ms), and `extra`.
pub(crate) async fn replica(redis: &str, prefix: &str, extra: &str) -> Replica {
    replica_timed(redis, prefix, "250ms", extra).await
}

/// [`replica`] whose Redis operations may take `timeout` before it marks Redis unreachable.
pub(crate) async fn replica_timed(
    redis: &str,
    prefix: &str,
    timeout: &str,
    extra: &str,
) -> Replica {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        &format!(
            "[exec]\nenabled = true\ntimeout = \"60s\"\n\n[store]\npath = \"toolwarden.db\"\n\n[redis]\nurl = {}\nprefix = {}\ntimeout = {}\n\n{extra}",
            toml_str(redis),
            toml_str(prefix),
            toml_str(timeout)
        ),
    );
    let server = dir
        .command(&["serve", "--listen", "127.0.0.1:0", "--headless"])
        .spawn();
    let url = server.url().await;
    Replica {
        _dir: dir,
        server,
        url,
    }
}

/// Three replicas, each once Redis is reached. None of their tests is about Redis going away:
/// their operations may take 2 s (not 250 ms) before a replica counts Redis unreachable, so that
/// a machine loaded by the tests running beside them does not turn a slow answer into an outage
/// (an abort sent meanwhile would find no replica to carry it out).
pub(crate) async fn three(test: &str, extra: &str) -> [Replica; 3] {
    let (redis, prefix) = (redis_url(), prefix(test));
    let replicas = [
        replica_timed(&redis, &prefix, "2s", extra).await,
        replica_timed(&redis, &prefix, "2s", extra).await,
        replica_timed(&redis, &prefix, "2s", extra).await,
    ];
    for r in &replicas {
        wait_health(r, "ok").await;
    }
    replicas
}

pub(crate) async fn health(url: &str) -> (u16, Value) {
    let resp = http().get(format!("{url}/healthz")).send().await.unwrap();
    let code = resp.status().as_u16();
    (code, resp.json().await.unwrap())
}

/// Waits until `/healthz` says `status`; panics with the last answer and the replica's log.
pub(crate) async fn wait_health(r: &Replica, status: &str) -> Value {
    let until = Instant::now() + WAIT;
    loop {
        let (code, body) = health(&r.url).await;
        if body["status"] == status {
            assert_eq!(code, if status == "ok" { 200 } else { 503 }, "{body}");
            return body;
        }
        assert!(
            Instant::now() < until,
            "/healthz never said {status}: {code} {body}\n{}",
            r.server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One call of `exec` as a turn; its `toolwarden` outcome.
pub(crate) async fn exec(url: &str, id: &str, command: &str, timeout_ms: Option<u64>) -> Value {
    let mut call =
        json!({"type": "tool_use", "id": id, "name": "exec", "input": {"command": command}});
    if let Some(ms) = timeout_ms {
        call["timeout_ms"] = json!(ms);
    }
    let resp = http()
        .post(format!("{url}/v1/turns"))
        .json(&json!({"calls": [call]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    body["results"][0]["toolwarden"].clone()
}

#[tokio::test]
async fn a_breaker_tripped_through_one_replica_rejects_on_the_others() {
    let [a, b, c] = three(
        "breaker",
        "[tools.\"exec\"]\nbreaker = { failures = 1, window = \"60s\", open_for = \"60s\" }\n",
    )
    .await;
    // One timeout opens A's breaker.
    let tripped = exec(&a.url, "t1", "sleep 5", Some(100)).await;
    assert_eq!(tripped["status"], "timeout", "{tripped}");
    assert_eq!(
        exec(&a.url, "t2", "true", None).await["status"],
        "circuit_open"
    );
    // B and C learn it by pub/sub, at once; give the message a moment.
    for r in [&b, &c] {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let outcome = exec(&r.url, "t3", "echo hi", None).await;
            if outcome["status"] == "circuit_open" {
                assert!(
                    outcome["retry_after_ms"].as_u64().unwrap() > 50_000,
                    "{outcome}"
                );
                break;
            }
            assert_eq!(outcome["status"], "ok", "{outcome}");
            assert!(
                Instant::now() < until,
                "the breaker never opened on {}",
                r.url
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let metrics = http()
            .get(format!("{}/metrics", r.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("toolwarden_breaker_state{tool=\"exec\"} 2"),
            "{metrics}"
        );
        assert!(metrics.contains("toolwarden_redis_up 1"), "{metrics}");
    }
}

#[tokio::test]
async fn a_replica_started_later_finds_the_open_breaker() {
    let redis = redis_url();
    let prefix = prefix("breaker-late");
    let extra =
        "[tools.\"exec\"]\nbreaker = { failures = 1, window = \"60s\", open_for = \"60s\" }\n";
    let a = replica(&redis, &prefix, extra).await;
    wait_health(&a, "ok").await;
    assert_eq!(
        exec(&a.url, "t1", "sleep 5", Some(100)).await["status"],
        "timeout"
    );
    let b = replica(&redis, &prefix, extra).await;
    wait_health(&b, "ok").await;
    assert_eq!(
        exec(&b.url, "t2", "true", None).await["status"],
        "circuit_open"
    );
}

#[tokio::test]
async fn identical_cacheable_calls_on_two_replicas_run_the_tool_once() {
    let [a, b, _c] = three(
        "cache",
        "[tools.\"exec\"]\nidempotent = true\ncache_ttl = \"1m\"\n",
    )
    .await;
    let runs = Dir::new();
    let log = runs.path().join("runs.txt");
    let command = format!("echo run >> {}; sleep 1; echo done", log.display());
    let (on_a, on_b) = tokio::join!(
        exec(&a.url, "ca", &command, None),
        exec(&b.url, "cb", &command, None)
    );
    assert_eq!(
        (&on_a["status"], &on_b["status"]),
        (&json!("ok"), &json!("ok"))
    );
    let lines = std::fs::read_to_string(&log).unwrap();
    assert_eq!(lines, "run\n", "the tool ran more than once");
    let hits = [&on_a, &on_b]
        .iter()
        .filter(|o| o["provenance"]["cache_hit"] == true)
        .count();
    assert_eq!(hits, 1, "{on_a}\n{on_b}");
    // Later, the third replica is served from the shared cache too.
    let on_c = exec(&_c.url, "cc", &command, None).await;
    assert_eq!(on_c["provenance"]["cache_hit"], true, "{on_c}");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "run\n");
}

/// Starts a detached long turn on `url`; its id.
pub(crate) async fn detached(url: &str, command: &str) -> String {
    let resp = http()
        .post(format!("{url}/v1/turns"))
        .json(&json!({"detach": true, "calls": [{"type": "tool_use", "id": "long", "name": "exec", "input": {"command": command}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    body["turn_id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn an_abort_posted_to_one_replica_stops_the_call_on_another() {
    let [a, b, c] = three("abort", "").await;
    let resp = http()
        .post(format!("{}/v1/turns", a.url))
        .json(&json!({"calls": [{"type": "tool_use", "id": "long", "name": "exec", "input": {"command": "sleep 30"}}]}));
    let running =
        tokio::spawn(async move { resp.send().await.unwrap().json::<Value>().await.unwrap() });
    let turn_id = loop {
        let active: Value = http()
            .get(format!("{}/v1/turns/active", a.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if let Some(id) = active["turns"][0]["turn_id"].as_str() {
            break id.to_owned();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let resp = http()
        .post(format!("{}/v1/turns/{turn_id}/abort", c.url))
        .send()
        .await
        .unwrap();
    // On failure, what the three replicas logged (Redis going unreachable shows there).
    let all_logs = || logs(&[&a, &b, &c]);
    assert_eq!(resp.status(), 200, "{}", all_logs());
    let body = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .unwrap_or_else(|_| panic!("the turn on A did not end\n{}", all_logs()))
        .unwrap();
    let outcome = &body["results"][0]["toolwarden"];
    assert_eq!(
        (&outcome["status"], &outcome["reason"]),
        (&json!("cancelled"), &json!("user")),
        "{body}\n{}",
        all_logs()
    );
    // A turn nobody runs is a 404 on any replica, once every replica said so.
    let resp = http()
        .post(format!("{}/v1/turns/t_nobody/abort", b.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404, "{}", all_logs());
    // So is the finished turn.
    let resp = http()
        .post(format!("{}/v1/turns/{turn_id}/abort", c.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404, "{}", all_logs());
}

/// Principals hold across replicas: a principal sees its own turns on every replica and no one
/// else's (without `read`), aborts its own through any replica, and another principal's abort
/// sent to a third replica is refused there with 403 naming `abort` — the restriction travels
/// with the abort to the replica that runs the turn.
#[tokio::test]
async fn principals_see_and_abort_only_their_own_turns_across_replicas() {
    const ALICE: &str = "alice-replicas-0123456789abcdef012345";
    const BOB: &str = "bob-replicas-0123456789abcdef0123456789";
    const OPS: &str = "ops-replicas-0123456789abcdef0123456789";
    let extra = format!(
        r#"
[[auth.tokens]]
principal = "alice"
token_sha256 = "{}"

[[auth.tokens]]
principal = "bob"
token_sha256 = "{}"

[[auth.tokens]]
principal = "ops"
token_sha256 = "{}"
scopes = ["call", "read", "abort"]
"#,
        crate::auth::sha256_hex(ALICE),
        crate::auth::sha256_hex(BOB),
        crate::auth::sha256_hex(OPS),
    );
    let [a, b, c] = three("principals", &extra).await;
    let all_logs = || logs(&[&a, &b, &c]);
    let start = |url: &str, token: &'static str, id: &str| {
        let resp = http()
            .post(format!("{url}/v1/turns"))
            .bearer_auth(token)
            .json(&json!({"calls": [{"type": "tool_use", "id": id, "name": "exec", "input": {"command": "sleep 30"}}]}));
        tokio::spawn(async move { resp.send().await.unwrap().json::<Value>().await.unwrap() })
    };
    let active = |url: String, token: &'static str| async move {
        let body: Value = http()
            .get(format!("{url}/v1/turns/active"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["principal"].as_str().unwrap().to_owned(),
                    t["turn_id"].as_str().unwrap().to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    let alices = start(&a.url, ALICE, "alice-long");
    let bobs = start(&b.url, BOB, "bob-long");
    // Both turns running, as ops (`read`) sees them from the third replica.
    let until = Instant::now() + WAIT;
    let everyone = loop {
        let seen = active(c.url.clone(), OPS).await;
        if seen.len() == 2 {
            break seen;
        }
        assert!(Instant::now() < until, "{seen:?}\n{}", all_logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let turn_of = |who: &str| {
        everyone
            .iter()
            .find(|(p, _)| p == who)
            .map(|(_, t)| t.clone())
            .unwrap()
    };
    let (alice_turn, bob_turn) = (turn_of("alice"), turn_of("bob"));
    // Each sees only its own, from a replica that runs neither.
    assert_eq!(
        active(c.url.clone(), ALICE).await,
        vec![("alice".to_owned(), alice_turn.clone())]
    );
    assert_eq!(
        active(c.url.clone(), BOB).await,
        vec![("bob".to_owned(), bob_turn.clone())]
    );

    // Bob cannot abort Alice's turn, through C; the turn goes on.
    let abort = |url: &str, token: &'static str, turn: &str| {
        http()
            .post(format!("{url}/v1/turns/{turn}/abort"))
            .bearer_auth(token)
            .send()
    };
    let resp = abort(&c.url, BOB, &alice_turn).await.unwrap();
    assert_eq!(resp.status(), 403, "{}", all_logs());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["missing_scope"], "abort", "{body}");
    assert_eq!(active(c.url.clone(), ALICE).await.len(), 1);

    // Alice aborts her own through C, ops aborts Bob's through A.
    let resp = abort(&c.url, ALICE, &alice_turn).await.unwrap();
    assert_eq!(resp.status(), 200, "{}", all_logs());
    let resp = abort(&a.url, OPS, &bob_turn).await.unwrap();
    assert_eq!(resp.status(), 200, "{}", all_logs());
    for running in [alices, bobs] {
        let body = tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .unwrap_or_else(|_| panic!("a turn did not end\n{}", all_logs()))
            .unwrap();
        let outcome = &body["results"][0]["toolwarden"];
        assert_eq!(outcome["status"], "cancelled", "{body}");
    }
}

/// What `replicas` wrote to stderr, each under its URL.
fn logs(replicas: &[&Replica]) -> String {
    replicas
        .iter()
        .map(|r| format!("--- {}:\n{}", r.url, r.server.stderr()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The figure in docs/PERFORMANCE.md: 200 aborts posted to C of turns running on A, each timed
/// from sending the abort to C's answer (which comes once A has decided the call's outcome),
/// alternating with 200 aborts posted to A itself, for comparison.
#[tokio::test]
async fn abort_latency_across_replicas() {
    let [a, _b, c] = three("abort-latency", "").await;
    let (mut remote, mut local) = (Vec::with_capacity(200), Vec::with_capacity(200));
    for i in 0..400 {
        let turn_id = detached(&a.url, "sleep 30").await;
        let via = if i % 2 == 0 { &c.url } else { &a.url };
        let started = Instant::now();
        let resp = http()
            .post(format!("{via}/v1/turns/{turn_id}/abort"))
            .send()
            .await
            .unwrap();
        let took = started.elapsed();
        assert_eq!(resp.status(), 200);
        if i % 2 == 0 {
            remote.push(took);
        } else {
            local.push(took);
        }
    }
    for (name, took) in [
        ("posted to C, running on A", &mut remote),
        ("posted to A itself", &mut local),
    ] {
        took.sort();
        let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
        println!(
            "abort {name}, {} aborts: p50 {:?}, p99 {:?}, max {:?}",
            took.len(),
            at(0.5),
            at(0.99),
            took[took.len() - 1]
        );
    }
}

#[tokio::test]
async fn events_of_one_replica_appear_on_anothers_event_stream() {
    let [a, b, _c] = three("events", "").await;
    let resp = http()
        .get(format!("{}/v1/events", b.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut sse = Sse::new(resp);
    let outcome = exec(&a.url, "on-a", "echo hello", None).await;
    assert_eq!(outcome["status"], "ok");
    let mut seen = Vec::new();
    let until = Instant::now() + WAIT;
    while Instant::now() < until {
        let Some(event) = sse.next(Duration::from_secs(5)).await else {
            break;
        };
        if event.data["call_id"] == "on-a" {
            assert!(event.data["replica"].is_string(), "{:?}", event.data);
            seen.push(event.event.clone());
            if event.event == "tool_result" {
                break;
            }
        }
    }
    // In order, as A emitted them.
    assert_eq!(
        seen.first().map(String::as_str),
        Some("tool_start"),
        "{seen:?}"
    );
    assert_eq!(
        seen.last().map(String::as_str),
        Some("tool_result"),
        "{seen:?}"
    );
}

/// A throwaway `redis-server` on a free port, killed when dropped.
pub(crate) struct Throwaway {
    pub(crate) port: u16,
    child: Option<std::process::Child>,
}

impl Throwaway {
    pub(crate) fn start(port: Option<u16>) -> Throwaway {
        let port = port.unwrap_or_else(|| {
            TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        });
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (scripts/setup-test-deps.sh installs it)");
        Throwaway {
            port,
            child: Some(child),
        }
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        self.kill();
    }
}

#[tokio::test]
async fn redis_going_away_mid_load_fails_no_call_and_sharing_resumes_when_it_returns() {
    let mut redis = Throwaway::start(None);
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let prefix = prefix("outage");
    let extra =
        "[tools.\"exec\"]\nbreaker = { failures = 1, window = \"60s\", open_for = \"60s\" }\n";
    let a = replica(&url, &prefix, extra).await;
    let b = replica(&url, &prefix, extra).await;
    wait_health(&a, "ok").await;
    wait_health(&b, "ok").await;

    // Load on both replicas all along.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = [a.url.clone(), b.url.clone()].map(|u| {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                outcomes.push(exec(&u, &format!("l{n}"), "true", None).await);
            }
            outcomes
        })
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.kill();
    let degraded = wait_health(&a, "degraded").await;
    assert_eq!(degraded["redis"], "degraded", "{degraded}");
    assert!(degraded["redis_error"].is_string(), "{degraded}");
    wait_health(&b, "degraded").await;
    // The load's calls go on meanwhile; what they would have told Redis is counted as a
    // fallback once the first of them ends (on a loaded machine that may take a while).
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = http()
            .get(format!("{}/metrics", a.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(metrics.contains("toolwarden_redis_up 0"), "{metrics}");
        if metrics.contains("toolwarden_redis_fallbacks_total") {
            break;
        }
        if Instant::now() >= until {
            let active = crate::util::get_json(&format!("{}/v1/turns/active", a.url)).await;
            panic!("no fallback counted: {active}\n{}", a.server.stderr());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let _redis = Throwaway::start(Some(redis.port));
    wait_health(&a, "ok").await;
    wait_health(&b, "ok").await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for handle in load {
        for outcome in handle.await.unwrap() {
            total += 1;
            assert_eq!(outcome["status"], "ok", "a call failed: {outcome}");
        }
    }
    assert!(total > 10, "only {total} calls ran");

    // Shared again: a breaker tripped on A rejects on B.
    assert_eq!(
        exec(&a.url, "t1", "sleep 5", Some(100)).await["status"],
        "timeout"
    );
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let outcome = exec(&b.url, "t2", "true", None).await;
        if outcome["status"] == "circuit_open" {
            break;
        }
        assert!(
            Instant::now() < until,
            "B never learnt A's breaker: {outcome}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for r in [a, b] {
        stop_replica(r).await;
    }
}

pub(crate) async fn stop_replica(mut r: Replica) {
    r.server.signal(Signal::SIGTERM);
    r.server.wait(Duration::from_secs(15)).await.expect_code(0);
}

/// Redis commands by name (`INFO commandstats`), PINGs and INFO itself left out.
pub(crate) async fn command_counts(url: &str) -> std::collections::BTreeMap<String, u64> {
    let out = tokio::process::Command::new("redis-cli")
        .args(["-u", url, "INFO", "commandstats"])
        .output()
        .await
        .expect("redis-cli (scripts/setup-test-deps.sh installs it)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (!matches!(
                name,
                "ping" | "info" | "subscribe" | "hello" | "client|setinfo"
            ))
            .then(|| (name.to_owned(), calls))
        })
        .collect()
}

pub(crate) fn delta(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
    calls: u64,
) -> String {
    after
        .iter()
        .filter_map(|(name, n)| {
            let d = n - before.get(name).copied().unwrap_or(0);
            (d > 0).then(|| format!("{name} {:.2}", d as f64 / calls as f64))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Redis commands one call costs, counted by the server itself (`INFO commandstats` of a
/// Redis of this test alone), for docs/SCALE-OUT.md: a plain call, a cacheable call that misses,
/// and one served from the replica's own cache.
#[tokio::test]
async fn redis_commands_per_call() {
    let redis = Throwaway::start(None);
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let plain = replica(&url, &prefix("count-plain"), "").await;
    let cached = replica(
        &url,
        &prefix("count-cached"),
        "[tools.\"exec\"]\nidempotent = true\ncache_ttl = \"1m\"\n",
    )
    .await;
    wait_health(&plain, "ok").await;
    wait_health(&cached, "ok").await;
    const N: u64 = 100;
    // Let the outbox settle between phases: events are published behind the calls.
    let settle = || tokio::time::sleep(Duration::from_millis(700));
    settle().await;
    let t0 = command_counts(&url).await;
    for i in 0..N {
        assert_eq!(
            exec(&plain.url, &format!("p{i}"), "true", None).await["status"],
            "ok"
        );
    }
    settle().await;
    let t1 = command_counts(&url).await;
    for i in 0..N {
        let outcome = exec(&cached.url, &format!("m{i}"), &format!("echo {i}"), None).await;
        assert_eq!(outcome["status"], "ok");
    }
    settle().await;
    let t2 = command_counts(&url).await;
    for i in 0..N {
        let outcome = exec(&cached.url, &format!("h{i}"), &format!("echo {i}"), None).await;
        assert_eq!(outcome["provenance"]["cache_hit"], true, "{outcome}");
    }
    settle().await;
    let t3 = command_counts(&url).await;
    println!("redis commands per call, plain: {}", delta(&t0, &t1, N));
    println!(
        "redis commands per call, cacheable miss: {}",
        delta(&t1, &t2, N)
    );
    println!(
        "redis commands per call, local cache hit: {}",
        delta(&t2, &t3, N)
    );
    // A turn that names no session has a session only this replica sees: nothing of it goes to
    // Redis, only its events do.
    let plain = delta(&t0, &t1, N);
    assert!(
        !plain.contains("hmget") && !plain.contains("eval") && !plain.contains("zadd"),
        "{plain}"
    );
}
