//! Replicas that die (docs/SCALE-OUT.md, "When a replica dies"): real `serve` replicas sharing a
//! PostgreSQL trail (a schema of their own) and a Redis prefix, with a short lease. A replica
//! killed for good has its open calls recorded `interrupted` by a survivor; one paused past its
//! lease writes no second outcome when it resumes, and rejoins; what it held in Redis is freed
//! at once.

use std::time::Duration;

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::scale_out::{Replica, detached, exec, prefix, redis_url, stop_replica, wait_health};
use crate::util::{Dir, get_json, kill_marked, marker, toml_str};

/// The lease of these tests' replicas.
const LEASE: Duration = Duration::from_secs(1);

/// One `serve` replica named `name` with `exec`, its trail at `trail`, `[redis]` at `prefix`,
/// a one-second lease, and `extra`.
async fn on_trail(trail: &str, prefix: &str, name: &str, extra: &str) -> Replica {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        &format!(
            "[exec]\nenabled = true\ntimeout = \"60s\"\n\n[store]\nurl = {}\nlease = \"{}ms\"\n\n\
             [redis]\nurl = {}\nprefix = {}\n\n{extra}",
            toml_str(trail),
            LEASE.as_millis(),
            toml_str(&redis_url()),
            toml_str(prefix),
        ),
    );
    let server = dir
        .command(&["serve", "--listen", "127.0.0.1:0", "--headless"])
        .env("TOOLWARDEN_REPLICA", name)
        .spawn();
    let url = server.url().await;
    let replica = Replica {
        _dir: dir,
        server,
        url,
    };
    wait_health(&replica, "ok").await;
    replica
}

/// Waits until `url` (a replica's API) lists `turn` as running.
async fn wait_running(url: &str, turn: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let active = get_json(&format!("{url}/v1/turns/active")).await;
        let listed = active["turns"].as_array().is_some_and(|t| {
            t.iter()
                .any(|t| t["turn_id"] == turn && t["calls"][0]["state"] == "running")
        });
        if listed {
            return;
        }
        assert!(Instant::now() < until, "{turn} never ran: {active}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the trail (read through `url`) holds `turn`'s `tool_start`: the call ran, and
/// its replica's death leaves it open.
async fn wait_started(url: &str, turn: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let page = get_json(&format!("{url}/v1/audit?turn={turn}&limit=500")).await;
        let started = page["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["type"] == "tool_start"));
        if started {
            return;
        }
        assert!(
            Instant::now() < until,
            "{turn}'s start never reached the trail: {page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `tool_result` events of `turn` in the trail, as `url` reads it.
async fn results_of(url: &str, turn: &str) -> Vec<Value> {
    let page = get_json(&format!("{url}/v1/audit?turn={turn}&limit=500")).await;
    page["events"]
        .as_array()
        .unwrap_or_else(|| panic!("{page}"))
        .iter()
        .filter(|e| e["type"] == "tool_result")
        .cloned()
        .collect()
}

/// Waits until the trail (read through `url`) holds an outcome for `turn`'s call; answers it.
async fn wait_outcome(url: &str, turn: &str, within: Duration) -> Value {
    let until = Instant::now() + within;
    loop {
        let results = results_of(url, turn).await;
        if let Some(first) = results.first() {
            return first["outcome"].clone();
        }
        assert!(
            Instant::now() < until,
            "no outcome for {turn} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `replica`'s row in `url`'s `GET /v1/replicas`.
async fn replica_row(url: &str, replica: &str) -> Value {
    let listed = get_json(&format!("{url}/v1/replicas")).await;
    assert_eq!(listed["shared"], true, "{listed}");
    listed["replicas"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["replica"] == replica).cloned())
        .unwrap_or_else(|| panic!("{replica} not listed: {listed}"))
}

#[tokio::test]
async fn a_replica_killed_for_good_has_its_calls_interrupted_by_a_survivor() {
    let trail = toolwarden_testkit::pg::TestSchema::new();
    let prefix = prefix("die");
    let mut a = on_trail(trail.url(), &prefix, "a", "").await;
    let b = on_trail(trail.url(), &prefix, "b", "").await;
    assert_eq!(replica_row(&b.url, "a").await["state"], "live");
    let mark = marker("killed-for-good");
    let turn = detached(&a.url, &format!("sleep 30; : {mark}")).await;
    wait_running(&a.url, &turn).await;
    wait_started(&b.url, &turn).await;
    a.server.signal(Signal::SIGKILL);
    let killed = Instant::now();
    let _ = a.server.wait(Duration::from_secs(10)).await;
    kill_marked(&mark);
    // Read through the survivor: A never comes back. Within its lease (and the few rounds of
    // looking that take), B records the call as interrupted, naming both.
    let outcome = wait_outcome(&b.url, &turn, LEASE * 10).await;
    let took = killed.elapsed();
    assert_eq!(outcome["status"], "interrupted", "{outcome}");
    let detail = outcome["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("replica \"a\"") && detail.contains("replica \"b\" recorded this"),
        "{detail}"
    );
    assert!(detail.contains("while the call ran"), "{detail}");
    eprintln!("A's call was recorded interrupted {took:?} after A was killed");
    let turn_record = get_json(&format!("{}/v1/turns/{turn}", b.url)).await;
    assert_eq!(turn_record["state"], "ended", "{turn_record}");
    // Exactly one outcome, and A listed as dead, taken over by B.
    assert_eq!(results_of(&b.url, &turn).await.len(), 1);
    let row = replica_row(&b.url, "a").await;
    assert_eq!(
        (&row["state"], &row["taken_over_by"], &row["interrupted"]),
        (&json!("dead"), &json!("b"), &json!(1)),
        "{row}"
    );
    assert_eq!(replica_row(&b.url, "b").await["this"], true);
    let metrics = crate::util::get_text(&format!("{}/metrics", b.url)).await;
    assert!(
        metrics.contains("toolwarden_replica_takeovers_total 1"),
        "{metrics}"
    );
    stop_replica(b).await;
}

#[tokio::test]
async fn a_replica_paused_past_its_lease_writes_no_second_outcome_and_rejoins() {
    let trail = toolwarden_testkit::pg::TestSchema::new();
    let prefix = prefix("pause");
    let a = on_trail(trail.url(), &prefix, "a", "").await;
    let b = on_trail(trail.url(), &prefix, "b", "").await;
    let mark = marker("paused");
    // The call's process goes on while A is paused, and has ended when A resumes.
    let turn = detached(&a.url, &format!("sleep 1; echo done; : {mark}")).await;
    wait_running(&a.url, &turn).await;
    wait_started(&b.url, &turn).await;
    a.server.signal(Signal::SIGSTOP);
    let outcome = wait_outcome(&b.url, &turn, LEASE * 10).await;
    assert_eq!(outcome["status"], "interrupted", "{outcome}");
    assert_eq!(replica_row(&b.url, "a").await["state"], "dead");
    a.server.signal(Signal::SIGCONT);
    // A finds itself declared dead, waits for nothing more (B finished), and rejoins.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let row = replica_row(&b.url, "a").await;
        if row["state"] == "live" {
            break;
        }
        assert!(Instant::now() < until, "A never rejoined: {row}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A new call through A is recorded as usual.
    let fresh = exec(&a.url, "after", "echo again", None).await;
    assert_eq!(fresh["status"], "ok", "{fresh}");
    let fresh_turn = fresh["turn_id"].as_str().unwrap().to_owned();
    let recorded = wait_outcome(&b.url, &fresh_turn, Duration::from_secs(10)).await;
    assert_eq!(recorded["status"], "ok", "{recorded}");
    // The paused call ended on A (its process finished), but the trail keeps B's outcome alone.
    let results = results_of(&b.url, &turn).await;
    assert_eq!(results.len(), 1, "{results:#?}");
    assert_eq!(results[0]["outcome"]["status"], "interrupted");
    assert!(
        a.server.stderr().contains("rejoins"),
        "{}",
        a.server.stderr()
    );
    let row = replica_row(&b.url, "a").await;
    assert!(
        row["taken_over_by"].is_null() && row["interrupted"].is_null(),
        "a rejoined replica's row is a live one: {row}"
    );
    kill_marked(&mark);
    stop_replica(a).await;
    // Stopped cleanly (having written all it held): still one outcome, listed as stopped, and
    // nobody takes it over.
    let results = results_of(&b.url, &turn).await;
    assert_eq!(results.len(), 1, "{results:#?}");
    assert_eq!(replica_row(&b.url, "a").await["state"], "stopped");
    stop_replica(b).await;
}

#[tokio::test]
async fn a_replica_that_rejoined_is_taken_over_again_when_it_dies() {
    let trail = toolwarden_testkit::pg::TestSchema::new();
    let prefix = prefix("twice");
    let mut a = on_trail(trail.url(), &prefix, "a", "").await;
    let b = on_trail(trail.url(), &prefix, "b", "").await;
    let mark = marker("twice");
    // Paused past its lease, taken over, resumed: it rejoins.
    a.server.signal(Signal::SIGSTOP);
    let until = Instant::now() + LEASE * 10;
    while replica_row(&b.url, "a").await["state"] != "dead" {
        assert!(Instant::now() < until, "A was not declared dead");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.server.signal(Signal::SIGCONT);
    let until = Instant::now() + Duration::from_secs(20);
    while replica_row(&b.url, "a").await["state"] != "live" {
        assert!(Instant::now() < until, "A never rejoined");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Dies for good with a call running: taken over again.
    let turn = detached(&a.url, &format!("sleep 30; : {mark}")).await;
    wait_running(&a.url, &turn).await;
    // Its start is in the trail (A's writer reconnected after the pause first).
    wait_started(&b.url, &turn).await;
    a.server.signal(Signal::SIGKILL);
    let _ = a.server.wait(Duration::from_secs(10)).await;
    kill_marked(&mark);
    let until = Instant::now() + LEASE * 10;
    let outcome = loop {
        if let Some(first) = results_of(&b.url, &turn).await.first() {
            break first["outcome"].clone();
        }
        assert!(
            Instant::now() < until,
            "A's call was not taken over: {}\n--- B\n{}\n--- A\n{}",
            replica_row(&b.url, "a").await,
            b.server.stderr(),
            a.server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(outcome["status"], "interrupted", "{outcome}");
    let row = replica_row(&b.url, "a").await;
    assert_eq!(
        (&row["state"], &row["taken_over_by"]),
        (&json!("dead"), &json!("b")),
        "{row}"
    );
    stop_replica(b).await;
}

#[tokio::test]
async fn a_dead_replicas_probe_lease_is_released_at_once() {
    let trail = toolwarden_testkit::pg::TestSchema::new();
    let prefix = prefix("probe");
    let breaker =
        "[tools.\"exec\"]\nbreaker = { failures = 1, window = \"60s\", open_for = \"1s\" }\n";
    let mut a = on_trail(trail.url(), &prefix, "a", breaker).await;
    let b = on_trail(trail.url(), &prefix, "b", breaker).await;
    // One timeout opens the breaker (on both, through Redis); a second later A's call is the
    // half-open probe, holding its lease for as long as that call may take (a minute).
    let tripped = exec(&a.url, "t1", "sleep 5", Some(100)).await;
    assert_eq!(tripped["status"], "timeout", "{tripped}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mark = marker("probe");
    let turn = detached(&a.url, &format!("sleep 30; : {mark}")).await;
    wait_running(&a.url, &turn).await;
    let held = exec(&b.url, "t2", "true", None).await;
    assert_eq!(held["status"], "circuit_open", "{held}");
    a.server.signal(Signal::SIGKILL);
    let _ = a.server.wait(Duration::from_secs(10)).await;
    kill_marked(&mark);
    // Once A is declared dead, B probes at once: far sooner than the lease's minute.
    let until = Instant::now() + LEASE * 15;
    loop {
        let outcome = exec(&b.url, "t3", "true", None).await;
        if outcome["status"] == "ok" {
            break;
        }
        assert_eq!(outcome["status"], "circuit_open", "{outcome}");
        assert!(
            Instant::now() < until,
            "the probe lease was not released: {outcome}\n{}",
            b.server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        b.server
            .stderr()
            .contains("freed what a dead replica held in Redis"),
        "{}",
        b.server.stderr()
    );
    stop_replica(b).await;
}

#[tokio::test]
async fn a_dead_replicas_task_reads_as_interrupted_through_a_survivor() {
    let trail = toolwarden_testkit::pg::TestSchema::new();
    let prefix = prefix("task");
    let tasks = "[tools.\"exec\"]\ntask = \"always\"\n";
    let mut a = on_trail(trail.url(), &prefix, "a", tasks).await;
    let b = on_trail(trail.url(), &prefix, "b", tasks).await;
    let mark = marker("dead-task");
    let created = crate::util::mcp(
        &a.url,
        1,
        "tools/call",
        json!({"name": "exec", "arguments": {"command": format!("sleep 30; : {mark}")}}),
    )
    .await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let task = created["result"]["taskId"].as_str().unwrap().to_owned();
    let working = crate::util::mcp(&b.url, 2, "tasks/get", json!({"taskId": task})).await;
    assert_eq!(working["result"]["status"], "working", "{working}");
    a.server.signal(Signal::SIGKILL);
    let _ = a.server.wait(Duration::from_secs(10)).await;
    kill_marked(&mark);
    let until = Instant::now() + LEASE * 10;
    let got = loop {
        let got = crate::util::mcp(&b.url, 3, "tasks/get", json!({"taskId": task})).await;
        if got["result"]["status"] != "working" {
            break got;
        }
        assert!(Instant::now() < until, "the task still works: {got}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Failed, with the interrupted outcome naming the dead replica and its survivor.
    assert_eq!(got["result"]["status"], "failed", "{got}");
    let outcome = &got["result"]["error"]["data"]["toolwarden/outcome"];
    assert_eq!(outcome["status"], "interrupted", "{got}");
    assert!(
        outcome["detail"]
            .as_str()
            .is_some_and(|d| d.contains("replica \"a\"") && d.contains("replica \"b\"")),
        "{got}"
    );
    stop_replica(b).await;
}
