//! `[hooks]` and `[[quotas]]` on the real binary (docs/RULES.md): a hook that allows, denies,
//! rewrites, times out, answers garbage or is down, each with its documented outcome; a quota of
//! 5/min turning the sixth call away with when to try again; two replicas sharing one quota
//! through Redis; bad hooks and quotas named by file, line and key.

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::scale_out::{prefix, redis_url, replica, stop_replica};
use crate::serve::config;
use crate::util::{Dir, Running, http, marker, toml_str};

/// A hook command: reads the call, decides by the echo's text.
const HOOK: &str = r#"input=$(cat)
case "$input" in
  *'"text":"deny'*) echo '{"decision":"deny","reason":"not on a Friday"}' ;;
  *'"text":"rewrite'*) echo '{"decision":"allow","args":{"text":"rewritten by the hook"}}' ;;
  *'"text":"badargs'*) echo '{"decision":"allow","args":{"text":5}}' ;;
  *'"text":"slow'*) sleep 30 ;;
  *'"text":"garbage'*) echo 'sure, why not' ;;
  *'"text":"unknown'*) echo '{"decision":"perhaps"}' ;;
  *'"text":"ask'*) echo '{"decision":"ask","reason":"a person should see this"}' ;;
  *'"text":"whoami'*) echo "{\"decision\":\"deny\",\"reason\":\"$(printf '%s' "$input" | tr -d '"{}' | tr ',' ' ')\"}" ;;
  *) echo '{"decision":"allow"}' ;;
esac
"#;

async fn start(dir: &Dir, mark: &str, extra: &str) -> (Running, String) {
    dir.create("toolwarden.toml", &config(mark, extra));
    let server = dir
        .command(&["serve", "--listen", "127.0.0.1:0", "--headless"])
        .spawn();
    let url = server.url().await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    (server, url)
}

async fn stop(server: Running, mark: &str) {
    crate::util::stop_clean(server, mark).await;
}

async fn call(url: &str, name: &str, input: Value) -> Value {
    crate::util::call_one(url, None, name, input).await
}

use crate::util::{outcome_of as outcome, text_of as text};

/// The events of the call that gave `result`, from the audit trail.
async fn events_of(url: &str, result: &Value) -> Vec<Value> {
    let t = &result["toolwarden"];
    let (turn, call) = (
        t["turn_id"].as_str().unwrap(),
        t["call_id"].as_str().unwrap(),
    );
    let body: Value =
        crate::util::get_json(&format!("{url}/v1/audit?turn={turn}&call={call}")).await;
    body["events"].as_array().cloned().unwrap_or_default()
}

/// A one-shot HTTP hook on an ephemeral loopback port: answers each request with `answer`.
async fn http_hook(answer: &'static str) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/decide", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut got = Vec::new();
                // Read the head and the body its content-length announces.
                loop {
                    let n = sock.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text[..end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if got.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let (status, body) = answer.split_once(' ').unwrap();
                let resp = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    (url, task)
}

#[tokio::test]
async fn hooks_allow_deny_rewrite_and_fail_as_documented() {
    let dir = Dir::new();
    let mark = marker("hooks");
    let script = dir.create("hook.sh", HOOK);
    let (ok_url, ok_task) = http_hook("200 {\"decision\":\"allow\"}").await;
    let (err_url, err_task) = http_hook("500 {\"oops\":true}").await;
    // A port nothing listens on: bound, then closed.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/decide", l.local_addr().unwrap())
    };
    let extra = format!(
        r#"
[hooks.review]
command = ["sh", {script}, {mark}]
tools = ["test__echo"]
timeout = "1s"

[hooks.http-ok]
url = {ok_url}
tools = ["test__sleep"]

# No total deadline: the hook is bounded by its own timeout alone.
[tools."test__sleep"]
timeout = "0s"

[hooks.http-500]
url = {err_url}
tools = ["test__progress"]

[hooks.down]
url = {down}
tools = ["test__cancels"]

[hooks.down-but-lenient]
url = {down}
tools = ["test__meta"]
on_error = "allow"
"#,
        script = toml_str(&script.display().to_string()),
        mark = toml_str(&mark),
        ok_url = toml_str(&ok_url),
        err_url = toml_str(&err_url),
        down = toml_str(&down),
    );
    let (server, url) = start(&dir, &mark, &extra).await;

    // Explain names the hooks a call of the tool meets, over HTTP and in `check`.
    let explained: Value =
        crate::util::get_json(&format!("{url}/v1/tools/test__echo/explain")).await;
    assert_eq!(explained["hooks"], json!(["review"]), "{explained}");
    let out = dir
        .command(&["check", "--offline", "--explain", "test__echo"])
        .run()
        .await;
    out.expect_code(0);
    assert!(out.stdout.contains("hook \"review\""), "{}", out.stdout);

    // Allows: the call runs.
    let r = call(&url, "test__echo", json!({"text": "hello"})).await;
    assert_eq!(r["toolwarden"]["status"], "ok", "{r}");
    assert_eq!(text(&r), "hello");

    // Denies: `denied{hook, rule}`, the hook's reason in the model's text.
    let r = call(&url, "test__echo", json!({"text": "deny me"})).await;
    assert_eq!(
        outcome(&r),
        ("denied".into(), "hook".into(), "rule".into()),
        "{r}"
    );
    assert!(text(&r).contains("not on a Friday"), "{r}");
    assert!(text(&r).contains("hook \"review\""), "{r}");

    // Rewrites: the tool gets the hook's arguments; the event keeps both.
    let r = call(&url, "test__echo", json!({"text": "rewrite me"})).await;
    assert_eq!(r["toolwarden"]["status"], "ok", "{r}");
    assert_eq!(text(&r), "rewritten by the hook");
    let events = events_of(&url, &r).await;
    let decision = events
        .iter()
        .find(|e| e["type"] == "hook_decision")
        .unwrap_or_else(|| panic!("no hook_decision: {events:?}"));
    assert_eq!(decision["hook"], "review", "{decision}");
    assert_eq!(decision["decision"], "allow", "{decision}");
    assert_eq!(decision["rewritten"], true, "{decision}");
    assert_eq!(decision["original_args"], json!({"text": "rewrite me"}));
    assert_eq!(decision["args"], json!({"text": "rewritten by the hook"}));
    // The decision is recorded before the call starts.
    let at = |t: &str| events.iter().position(|e| e["type"] == t).unwrap();
    assert!(at("hook_decision") < at("tool_start"), "{events:?}");

    // Rewrites into arguments the schema refuses: a failure, `on_error` (deny) decides.
    let r = call(&url, "test__echo", json!({"text": "badargs"})).await;
    assert_eq!(
        outcome(&r),
        ("denied".into(), "hook".into(), "hook_error".into()),
        "{r}"
    );
    assert!(text(&r).contains("schema"), "{r}");

    // Times out (its own 1s): hook_error, and the hook's command is gone.
    let r = call(&url, "test__echo", json!({"text": "slow"})).await;
    assert_eq!(
        outcome(&r),
        ("denied".into(), "hook".into(), "hook_error".into()),
        "{r}"
    );
    assert!(text(&r).contains("no answer within 1s"), "{r}");

    // Garbage, and a decision nobody knows: hook_error.
    for what in ["garbage", "unknown"] {
        let r = call(&url, "test__echo", json!({"text": what})).await;
        assert_eq!(
            outcome(&r),
            ("denied".into(), "hook".into(), "hook_error".into()),
            "{what}: {r}"
        );
    }

    // Asks: headless, nobody can answer.
    let r = call(&url, "test__echo", json!({"text": "ask"})).await;
    assert_eq!(outcome(&r).1, "headless", "{r}");

    // What the hook is told: the call's identity, principal and arguments.
    let r = call(&url, "test__echo", json!({"text": "whoami"})).await;
    let told = text(&r);
    for part in [
        "call_id:",
        "turn_id:",
        "session_id:",
        "principal:local",
        "tool:test__echo",
        "server:test",
        "args:text:whoami",
    ] {
        assert!(told.contains(part), "{part} in {told}");
    }

    // Over HTTP: a 2xx allow runs the call; a 500 is hook_error; down is hook_error, unless
    // `on_error = "allow"`.
    let r = call(&url, "test__sleep", json!({"ms": 1})).await;
    assert_eq!(r["toolwarden"]["status"], "ok", "{r}");
    let r = call(&url, "test__progress", json!({"every_ms": 1, "count": 1})).await;
    assert_eq!(
        outcome(&r),
        ("denied".into(), "hook".into(), "hook_error".into()),
        "{r}"
    );
    assert!(text(&r).contains("HTTP 500"), "{r}");
    let r = call(&url, "test__cancels", json!({})).await;
    assert_eq!(outcome(&r).2, "hook_error", "{r}");
    assert!(text(&r).contains("could not be reached"), "{r}");
    let r = call(&url, "test__meta", json!({})).await;
    assert_eq!(r["toolwarden"]["status"], "ok", "{r}");

    // Their latency and failures are metrics.
    let metrics = crate::util::get_text(&format!("{url}/metrics")).await;
    assert!(
        metrics.contains("toolwarden_hook_duration_seconds_count{hook=\"review\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("toolwarden_hook_failures_total{hook=\"review\",reason=\"timeout\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("toolwarden_denied_total{tool=\"test__echo\",decider=\"hook\"}"),
        "{metrics}"
    );

    stop(server, &mark).await;
    ok_task.abort();
    err_task.abort();
}

#[tokio::test]
async fn a_hook_runs_under_the_calls_total_deadline() {
    let dir = Dir::new();
    let mark = marker("hook-deadline");
    let script = dir.create("hook.sh", HOOK);
    let extra = format!(
        "[hooks.review]\ncommand = [\"sh\", {}, {}]\ntools = [\"test__echo\"]\ntimeout = \"20s\"\n\n[tools.\"test__echo\"]\ntimeout = \"500ms\"\n",
        toml_str(&script.display().to_string()),
        toml_str(&mark)
    );
    let (server, url) = start(&dir, &mark, &extra).await;
    let r = call(&url, "test__echo", json!({"text": "slow"})).await;
    assert_eq!(r["toolwarden"]["status"], "timeout", "{r}");
    assert_eq!(r["toolwarden"]["kind"], "total", "{r}");
    stop(server, &mark).await;
}

#[tokio::test]
async fn the_sixth_call_of_a_five_per_minute_quota_is_denied_with_when_to_retry() {
    let dir = Dir::new();
    let mark = marker("quota");
    let extra = "[[quotas]]\ntools = [\"test__echo\"]\nrate = \"5/min\"\n";
    let (server, url) = start(&dir, &mark, extra).await;
    for i in 0..5 {
        let r = call(&url, "test__echo", json!({"text": format!("n{i}")})).await;
        assert_eq!(r["toolwarden"]["status"], "ok", "call {i}: {r}");
    }
    let r = call(&url, "test__echo", json!({"text": "sixth"})).await;
    assert_eq!(
        outcome(&r),
        ("denied".into(), "quota".into(), "rate_limit".into()),
        "{r}"
    );
    let retry = r["toolwarden"]["retry_after_ms"].as_u64().unwrap();
    assert!((1..=12_000).contains(&retry), "{r}");
    assert!(text(&r).contains("Try again in"), "{r}");
    // Explain names the quota.
    let explained: Value =
        crate::util::get_json(&format!("{url}/v1/tools/test__echo/explain")).await;
    assert_eq!(explained["quotas"], json!([0]), "{explained}");
    // Another tool is not counted.
    let r = call(&url, "test__sleep", json!({"ms": 1})).await;
    assert_eq!(r["toolwarden"]["status"], "ok", "{r}");
    // The turn-away is an event, before the outcome.
    let r = call(&url, "test__echo", json!({"text": "seventh"})).await;
    let events = events_of(&url, &r).await;
    let exceeded = events
        .iter()
        .find(|e| e["type"] == "quota_exceeded")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(exceeded["quota"], 0, "{exceeded}");
    assert_eq!(exceeded["bucket"], "local", "{exceeded}");
    let metrics = crate::util::get_text(&format!("{url}/metrics")).await;
    assert!(
        metrics.contains("toolwarden_quota_tokens{quota=\"0\"}"),
        "{metrics}"
    );
    stop(server, &mark).await;
}

#[tokio::test]
async fn two_replicas_share_one_quota_through_redis() {
    let url = redis_url();
    let prefix = prefix("quota");
    let extra = "[[quotas]]\ntools = [\"exec\"]\nrate = \"5/min\"\nper = \"global\"\n";
    let a = replica(&url, &prefix, extra).await;
    let b = replica(&url, &prefix, extra).await;
    let mut ok = 0;
    let mut denied = 0;
    for i in 0..10 {
        let target = if i % 2 == 0 { &a.url } else { &b.url };
        let r = crate::scale_out::exec(target, &format!("q{i}"), "true", None).await;
        match r["status"].as_str() {
            Some("ok") => ok += 1,
            Some("denied") => {
                assert_eq!(r["decider"], "quota", "{r}");
                assert!(r["retry_after_ms"].as_u64().unwrap() >= 1, "{r}");
                denied += 1;
            }
            _ => panic!("{r}"),
        }
    }
    assert_eq!((ok, denied), (5, 5));
    stop_replica(a).await;
    stop_replica(b).await;
}

#[tokio::test]
async fn bad_hooks_and_quotas_are_named_by_file_line_and_key() {
    let cases = [
        (
            "[hooks.remote]\nurl = \"https://policy.example.com/decide\"\n",
            "hooks.remote.url",
            "allow_remote = true",
        ),
        (
            "[hooks.nothing]\ntools = [\"exec\"]\n",
            "hooks.nothing.url",
            "needs a url",
        ),
        (
            "[hooks.x]\nurl = \"http://127.0.0.1:9/\"\non_error = \"maybe\"\n",
            "on_error",
            "deny",
        ),
        (
            "[[quotas]]\nrate = \"5 per minute\"\n",
            "quotas[0].rate",
            "\"60/min\"",
        ),
        (
            "[[quotas]]\ntools = [\"exec\"]\n",
            "quotas[0].rate",
            "needs a rate",
        ),
        (
            "[[quotas]]\nrate = \"5/min\"\nper = \"team\"\n",
            "per",
            "principal",
        ),
    ];
    for (toml, key, says) in cases {
        let dir = Dir::new();
        dir.create("toolwarden.toml", toml);
        let out = dir.command(&["check"]).run().await;
        out.expect_code(2);
        assert!(
            out.stderr.contains("toolwarden.toml:"),
            "{toml}: {}",
            out.stderr
        );
        assert!(out.stderr.contains(key), "{toml}: {key} in {}", out.stderr);
        assert!(
            out.stderr.contains(says),
            "{toml}: {says} in {}",
            out.stderr
        );
    }
}

/// A call that a quota matches costs one script on Redis (and, for a concurrency cap, one
/// `ZREM` written behind it): counted by a Redis of this test alone.
#[tokio::test]
async fn a_quota_check_with_redis_is_one_round_trip_per_call() {
    use crate::scale_out::{Throwaway, command_counts, delta, exec, wait_health};
    let redis = Throwaway::start(None);
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let r = replica(
        &url,
        &prefix("quota-count"),
        "[[quotas]]\ntools = [\"exec\"]\nrate = \"1000/min\"\nconcurrency = 8\n",
    )
    .await;
    wait_health(&r, "ok").await;
    const N: u64 = 50;
    // The first call loads the script.
    assert_eq!(exec(&r.url, "warm", "true", None).await["status"], "ok");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let before = command_counts(&url).await;
    for i in 0..N {
        assert_eq!(
            exec(&r.url, &format!("q{i}"), "true", None).await["status"],
            "ok"
        );
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let after = command_counts(&url).await;
    let per_call = |name: &str| {
        (after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0)) as f64
            / N as f64
    };
    let counted = delta(&before, &after, N);
    println!("redis commands per call with a quota: {counted}");
    assert_eq!(per_call("evalsha"), 1.0, "{counted}");
    assert_eq!(per_call("zrem"), 1.0, "{counted}");
    assert_eq!(per_call("eval"), 0.0, "{counted}");
    stop_replica(r).await;
}

/// A hook that answers `ask` puts its name and reason in the question a person is asked; their
/// answer decides.
#[tokio::test]
async fn a_hooks_question_names_the_hook_and_its_reason() {
    let dir = Dir::new();
    let mark = marker("hook-ask");
    let script = dir.create("hook.sh", HOOK);
    dir.create(
        "toolwarden.toml",
        &config(
            &mark,
            &format!(
                "[hooks.review]\ncommand = [\"sh\", {}, {}]\ntools = [\"test__echo\"]\n",
                toml_str(&script.display().to_string()),
                toml_str(&mark)
            ),
        ),
    );
    // Not headless: the question waits for an answer over the API.
    let server = dir.command(&["serve", "--listen", "127.0.0.1:0"]).spawn();
    let url = server.url().await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    let asked = tokio::spawn({
        let url = url.clone();
        async move { call(&url, "test__echo", json!({"text": "ask me"})).await }
    });
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    let question = loop {
        let pending: Value = crate::util::get_json(&format!("{url}/v1/interactions")).await;
        if let Some(q) = pending["interactions"].get(0) {
            break q.clone();
        }
        assert!(tokio::time::Instant::now() < until, "nobody was asked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let message = question["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("(hook \"review\": a person should see this)"),
        "{question}"
    );
    let id = question["id"].as_str().unwrap();
    let answered = http()
        .post(format!("{url}/v1/interactions/{id}"))
        .json(&json!({"action": "approve"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    let r = asked.await.unwrap();
    assert_eq!(r["toolwarden"]["status"], "ok", "{r}");
    stop(server, &mark).await;
}
