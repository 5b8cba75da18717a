//! The fault soak: `toolwarden serve` under a steady 300 calls/s for 60 s while its MCP server
//! crashes every 5 s and a stuck call forces a restart now and then; then SIGTERM. Every call
//! gets exactly one outcome, none hangs, nothing is left running, and the RSS of `serve` after
//! the soak stays within 20 % of its RSS after the warm-up. The figures are printed (the test's
//! output) and recorded in docs/PERFORMANCE.md.
//!
//! `TOOLWARDEN_SOAK_SECS` changes the soak's length (default 60).

use std::collections::BTreeMap;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::serve::{config, serve};
use crate::util::{Dir, Running, assert_no_process, marker};

const RATE: u64 = 300;
const WARM_UP: Duration = Duration::from_secs(20);
/// RSS is read under a calm load (no faults) after the warm-up and after the soak: the faults
/// make bursts of waiting calls whose memory the allocator gives back only as it goes on
/// working, so an idle process, or one just past a burst, reads high.
const CALM: Duration = Duration::from_secs(5);
const CRASH_EVERY: Duration = Duration::from_secs(5);
const STUCK_EVERY: Duration = Duration::from_secs(20);
/// No call may take longer than this: it waits at most `startup_timeout` (5 s) for its server,
/// then runs under a 10 s timeout.
const LONGEST_CALL: Duration = Duration::from_secs(30);

fn soak_length() -> Duration {
    let secs = std::env::var("TOOLWARDEN_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(secs)
}

/// `serve`'s resident set size, in KiB.
fn rss_kib(server: &Running) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// One call as a one-call turn; the status of its one result, or what went wrong.
async fn one_call(client: &reqwest::Client, url: &str, call: Value) -> Result<String, String> {
    let resp = client
        .post(format!("{url}/v1/turns"))
        .json(&json!({ "calls": [call] }))
        .send()
        .await
        .map_err(|e| format!("request failed: {e:?}"))?;
    if resp.status() != 200 {
        return Err(format!("HTTP {}", resp.status()));
    }
    let answer: Value = resp.json().await.map_err(|e| format!("bad JSON: {e}"))?;
    match answer["results"].as_array().map(Vec::as_slice) {
        Some([one]) => {
            let outcome = &one["toolwarden"];
            let status = outcome["status"].as_str().unwrap_or("?");
            Ok(
                match outcome["reason"].as_str().or(outcome["kind"].as_str()) {
                    Some(why) => format!("{status}{{{why}}}"),
                    None => status.to_owned(),
                },
            )
        }
        _ => Err(format!("not exactly one result: {answer}")),
    }
}

/// Sends calls at `RATE` per second for `length`, crashing the server and forcing restarts on
/// the way; every call's status, by status.
async fn load(
    url: &str,
    length: Duration,
    server: &Running,
    faults: bool,
) -> (BTreeMap<String, u64>, Vec<u64>) {
    // A client that keeps at most 32 idle connections, like a real agent's pool: the bursts of
    // the faults open many more, and the server's memory would otherwise follow how many of
    // those the test keeps open.
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(32)
        .build()
        .unwrap();
    let start = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    let mut n: u64 = 0;
    // RSS once a second.
    let mut rss = Vec::new();
    let mut next_crash = start + CRASH_EVERY;
    let mut next_stuck = start + Duration::from_secs(2);
    while start.elapsed() < length {
        let now = Instant::now();
        if n.is_multiple_of(RATE) {
            rss.push(rss_kib(server));
        }
        let call = if faults && now >= next_crash {
            next_crash += CRASH_EVERY;
            json!({"id": "crash", "name": "test__crash", "input": {}})
        } else if faults && now >= next_stuck {
            next_stuck += STUCK_EVERY;
            // Ignores its cancel and keeps reporting progress: stuck, so the server restarts.
            json!({"id": "stuck", "name": "test__hang", "input": {"progress_every_ms": 100}})
        } else {
            json!({"id": format!("c{n}"), "name": "test__echo", "input": {"text": format!("call {n}")}})
        };
        let (client, url) = (client.clone(), url.to_owned());
        calls.spawn(async move {
            let sent = Instant::now();
            let status = tokio::time::timeout(LONGEST_CALL, one_call(&client, &url, call))
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {LONGEST_CALL:?}")));
            (status, sent.elapsed(), sent - start)
        });
        n += 1;
        tokio::time::sleep_until(start + Duration::from_micros(n * 1_000_000 / RATE)).await;
    }
    let mut by_status = BTreeMap::new();
    let mut slowest = Duration::ZERO;
    // What went wrong when: the calls that did not end `ok`, by the half second they were sent in.
    let mut timeline: BTreeMap<u64, BTreeMap<String, u64>> = BTreeMap::new();
    while let Some(joined) = calls.join_next().await {
        let (status, took, sent_at) = joined.unwrap();
        let status =
            status.unwrap_or_else(|e| panic!("a call did not get exactly one outcome: {e}"));
        if status != "ok" {
            let bucket = timeline
                .entry(sent_at.as_millis() as u64 / 500 * 500)
                .or_default();
            *bucket.entry(status.clone()).or_insert(0) += 1;
        }
        *by_status.entry(status).or_insert(0) += 1;
        slowest = slowest.max(took);
    }
    eprintln!("soak: not ok, by when sent (ms): {timeline:?}");
    eprintln!(
        "soak: {n} calls in {:?}, slowest {slowest:?}: {by_status:?}; RSS each second (KiB): {rss:?}",
        start.elapsed()
    );
    (by_status, rss)
}

/// `serve`'s RSS under a calm load: the least of its readings once the load has run 2 s (the
/// floor it works at, not a burst).
async fn calm_rss(url: &str, server: &Running) -> u64 {
    let (statuses, rss) = load(url, CALM, server, false).await;
    assert_eq!(statuses.keys().collect::<Vec<_>>(), ["ok"], "{statuses:?}");
    rss.iter().skip(2).copied().min().unwrap()
}

#[tokio::test]
async fn a_fault_soak_gives_every_call_one_outcome_and_leaves_nothing_behind() {
    let dir = Dir::new();
    let mark = marker("soak");
    let extra = r#"
[defaults]
timeout = "10s"

# Every call goes through the server's crashes and restarts (its breaker would turn most of them
# away at once).
[tools."test__echo"]
breaker = { failures = 0 }

[tools."test__hang"]
timeout = "1s"
cancel_grace = "500ms"
on_stuck = "restart"
"#;
    let conf = config(&mark, extra).replacen("args = [", "startup_timeout = \"5s\"\nargs = [", 1);
    dir.create("toolwarden.toml", &conf);
    let (mut server, url) = serve(&dir, &[]).await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;

    // The warm-up has the faults too: what they allocate once (a restart's buffers, the pool of
    // connections, the allocator's arenas) is in place before the first measurement.
    load(&url, WARM_UP, &server, true).await;
    let rss_warm = calm_rss(&url, &server).await;

    let length = soak_length();
    let (soak, _) = load(&url, length, &server, true).await;
    let rss_after = calm_rss(&url, &server).await;
    let total: u64 = soak.values().sum();
    eprintln!(
        "soak: RSS {rss_warm} KiB after warm-up, {rss_after} KiB after the soak ({:+.1} %)",
        (rss_after as f64 / rss_warm as f64 - 1.0) * 100.0
    );
    assert!(total >= RATE * length.as_secs() * 9 / 10, "{total} calls");
    assert!(
        soak.get("ok").copied().unwrap_or(0) > total / 2,
        "most calls succeed between the faults: {soak:?}"
    );
    assert!(
        soak.keys().any(|s| s.starts_with("error")),
        "the faults happened: {soak:?}"
    );
    assert!(
        (rss_after as f64) <= rss_warm as f64 * 1.2,
        "RSS grew from {rss_warm} KiB to {rss_after} KiB"
    );

    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(20)).await.expect_code(0);
    assert_no_process(&mark, Duration::from_secs(3)).await;
}
