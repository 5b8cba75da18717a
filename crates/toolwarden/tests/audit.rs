//! The audit trail on the real binary: a crash mid-call (`kill -9`) and a restart, no event lost
//! under load, secrets never in the file, a trail that cannot be written, and bad files refused.
//! The scenarios that are not about SQLite's file run on both backends (`NAME::sqlite`,
//! `NAME::postgres`), and two replicas sharing one PostgreSQL database survive one's `kill -9`.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::serve::{config, serve, turn};
use toolwarden_testkit::pg::TestSchema;

use crate::util::{Dir, Sse, assert_no_process, http, marker, wait_for_process};

const STORE: &str = "[store]\npath = \"audit.db\"\n";

/// Where a test's trail lives: `audit.db` in the test's directory, or a PostgreSQL schema of
/// its own.
enum Trail {
    Sqlite,
    Postgres(TestSchema),
}

impl Trail {
    fn sqlite() -> Trail {
        Trail::Sqlite
    }

    fn postgres() -> Trail {
        Trail::Postgres(TestSchema::new())
    }

    /// The config's `[store]` section.
    fn section(&self) -> String {
        match self {
            Trail::Sqlite => STORE.to_owned(),
            Trail::Postgres(schema) => format!("[store]\nurl = {:?}\n", schema.url()),
        }
    }

    /// Everything the database holds, as bytes (the file and its WAL, or every row as text).
    fn contents(&self, dir: &Dir) -> Vec<u8> {
        match self {
            Trail::Sqlite => file_bytes(&dir.path().join("audit.db")),
            Trail::Postgres(schema) => schema
                .query(
                    "SELECT string_agg(t::text, ' ') FROM toolwarden_events t UNION ALL \
                     SELECT string_agg(t::text, ' ') FROM toolwarden_calls t",
                )
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" ")
                .into_bytes(),
        }
    }

    /// (events, highest seq, calls ok, events per turn) in the trail.
    fn counts(&self, dir: &Dir) -> (i64, i64, i64, HashMap<String, i64>) {
        match self {
            Trail::Sqlite => {
                let db = rusqlite::Connection::open(dir.path().join("audit.db")).unwrap();
                let (count, max): (i64, i64) = db
                    .query_row("SELECT count(*), max(seq) FROM events", [], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .unwrap();
                let per_turn = db
                    .prepare(
                        "SELECT t.turn_id, count(*) FROM events e \
                         JOIN turns t ON t.id = e.turn_row GROUP BY t.turn_id",
                    )
                    .unwrap()
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect();
                let ok: i64 = db
                    .query_row("SELECT count(*) FROM calls WHERE status = 'ok'", [], |r| {
                        r.get(0)
                    })
                    .unwrap();
                (count, max, ok, per_turn)
            }
            Trail::Postgres(schema) => {
                let one = |sql: &str| -> i64 {
                    schema.query(sql)[0]
                        .as_deref()
                        .unwrap_or("0")
                        .parse()
                        .unwrap()
                };
                let per_turn = schema
                    .query(
                        "SELECT turn_id || ' ' || count(*) FROM toolwarden_events \
                         WHERE turn_id IS NOT NULL GROUP BY turn_id",
                    )
                    .into_iter()
                    .flatten()
                    .map(|l| {
                        let (t, n) = l.rsplit_once(' ').unwrap();
                        (t.to_owned(), n.parse().unwrap())
                    })
                    .collect();
                (
                    one("SELECT count(*) FROM toolwarden_events"),
                    one("SELECT coalesce(max(seq), 0) FROM toolwarden_events"),
                    one("SELECT count(*) FROM toolwarden_calls WHERE status = 'ok'"),
                    per_turn,
                )
            }
        }
    }
}

/// Runs scenario `$name(Trail)` once per backend, as `$name::sqlite` and `$name::postgres`.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$name(super::Trail::sqlite()).await;
            }
            #[tokio::test]
            async fn postgres() {
                super::$name(super::Trail::postgres()).await;
            }
        }
    )*};
}

both_backends!(
    a_crash_mid_call_is_recorded_interrupted_and_events_resume_without_a_gap,
    under_load_every_calls_events_are_in_the_trail,
    an_api_key_input_never_reaches_the_database,
    a_local_call_is_recorded_and_audit_filters_and_follows,
);

async fn get(url: &str) -> (u16, Value) {
    let resp = http().get(url).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// Every event of the trail, through `GET /v1/audit`, page by page.
async fn all_events(url: &str, filter: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = 0u64;
    loop {
        let (status, page) = get(&format!("{url}/v1/audit?limit=1000&after={after}{filter}")).await;
        assert_eq!(status, 200, "{page}");
        out.extend(page["events"].as_array().unwrap().iter().cloned());
        match page["next"].as_u64() {
            Some(next) => after = next,
            None => return out,
        }
    }
}

/// The bytes of the database, its WAL and its pending files.
fn file_bytes(path: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(path).unwrap_or_default();
    for suffix in ["-wal", ".pending", ".pending.2"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        bytes.extend(std::fs::read(name).unwrap_or_default());
    }
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

async fn a_crash_mid_call_is_recorded_interrupted_and_events_resume_without_a_gap(trail: Trail) {
    let dir = Dir::new();
    let mark = marker("audit-crash");
    dir.create("toolwarden.toml", &config(&mark, &trail.section()));
    let (mut server, url) = serve(&dir, &[]).await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    let mut watcher = Sse::new(http().get(format!("{url}/v1/events")).send().await.unwrap());

    turn(
        &url,
        json!([{"id": "done", "name": "test__echo", "input": {"text": "before"}}]),
    )
    .await;
    let resp = http()
        .post(format!("{url}/v1/turns"))
        .json(&json!({"detach": true, "session_id": "crashing", "calls": [
            {"id": "h1", "name": "test__sleep", "input": {"ms": 600_000}},
            {"id": "h2", "name": "exec", "input": {"command": format!("sleep 600; echo {mark}")}},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let turn_id = resp.json::<Value>().await.unwrap()["turn_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Both backends run: the exec command exists, and both starts are committed.
    wait_for_process(server.pid(), &mark, Duration::from_secs(10)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while all_events(&url, &format!("&turn={turn_id}&type=tool_start"))
        .await
        .len()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "the two tool_start events were not committed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, running) = get(&format!("{url}/v1/turns/{turn_id}")).await;
    assert_eq!((status, running["state"].as_str()), (200, Some("running")));
    let seen = watcher
        .collect(Duration::from_secs(10), |events| {
            events
                .iter()
                .filter(|e| e.event == "tool_start" && e.data["turn_id"] == turn_id.as_str())
                .count()
                == 2
        })
        .await;
    let last_seen = seen.last().and_then(|e| e.id).unwrap();
    // Everything the watcher saw is recorded (the read waits for the trail to catch up).
    assert_eq!(
        all_events(&url, "")
            .await
            .last()
            .map(|e| e["seq"].as_u64().unwrap() >= last_seen),
        Some(true)
    );

    server.signal(Signal::SIGKILL);
    server.wait(Duration::from_secs(10)).await;
    // The exec command died with its parent.
    assert_no_process(&mark, Duration::from_secs(5)).await;

    let (mut server, url) = serve(&dir, &[]).await;
    server
        .wait_stderr(
            "2 calls an earlier run left running were recorded as interrupted",
            Duration::from_secs(10),
        )
        .await;

    // `toolwarden audit` reports them.
    let out = dir
        .command(&["audit", "--status", "interrupted", "--json"])
        .run()
        .await;
    out.expect_code(0);
    let rows: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut ids: Vec<&str> = rows
        .iter()
        .map(|r| r["call_id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, vec!["h1", "h2"]);
    assert!(
        rows.iter()
            .all(|r| r["status"] == "interrupted" && r["turn_id"] == turn_id.as_str())
    );
    let table = dir.command(&["audit"]).run().await;
    table.expect_code(0);
    assert_eq!(
        table.stdout.matches("interrupted").count(),
        2,
        "{}",
        table.stdout
    );
    assert!(table.stdout.contains("done"), "{}", table.stdout);

    // `/v1/audit` reports them.
    let interrupted = all_events(&url, "&status=interrupted&type=tool_result").await;
    assert_eq!(interrupted.len(), 2, "{interrupted:#?}");
    for e in &interrupted {
        assert_eq!(e["outcome"]["status"], "interrupted");
        assert!(
            e["content"][0]["text"]
                .as_str()
                .unwrap()
                .starts_with("[INTERRUPTED]")
        );
    }
    let (_, record) = get(&format!("{url}/v1/turns/{turn_id}")).await;
    assert_eq!(record["state"], "ended");
    assert_eq!(record["outcome"], "interrupted");
    assert_eq!(record["results"].as_array().unwrap().len(), 2);

    // Nothing recorded before the kill is missing: every event the watcher saw is there, as it
    // was, and `seq` has no hole.
    let stored = all_events(&url, "").await;
    let by_seq: HashMap<u64, &Value> = stored
        .iter()
        .map(|e| (e["seq"].as_u64().unwrap(), e))
        .collect();
    for e in &seen {
        let kept = by_seq
            .get(&e.id.unwrap())
            .unwrap_or_else(|| panic!("event {:?} is missing", e.id));
        assert_eq!(
            (&kept["type"], &kept["turn_id"]),
            (&e.data["type"], &e.data["turn_id"])
        );
    }
    let seqs: Vec<u64> = stored.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=*seqs.last().unwrap()).collect::<Vec<_>>());

    // A client that saw events up to `last_seen` resumes across the restart with no gap: the
    // rest of the old run, the recovery's records, then this run's events, live.
    let mut resumed = Sse::new(
        http()
            .get(format!("{url}/v1/events"))
            .header("last-event-id", last_seen.to_string())
            .send()
            .await
            .unwrap(),
    );
    let after = turn(
        &url,
        json!([{"id": "after", "name": "test__echo", "input": {"text": "after"}}]),
    )
    .await;
    let after_turn = after["turn_id"].as_str().unwrap().to_owned();
    let got = resumed
        .collect(Duration::from_secs(10), |events| {
            events
                .iter()
                .any(|e| e.event == "turn_end" && e.data["turn_id"] == after_turn.as_str())
        })
        .await;
    assert!(got.iter().all(|e| e.event != "lost"), "{got:#?}");
    let ids: Vec<u64> = got.iter().map(|e| e.id.unwrap()).collect();
    assert_eq!(
        ids,
        (last_seen + 1..last_seen + 1 + ids.len() as u64).collect::<Vec<_>>()
    );
    let recovered: Vec<&str> = got
        .iter()
        .filter(|e| e.data["turn_id"] == turn_id.as_str())
        .map(|e| e.event.as_str())
        .collect();
    assert_eq!(
        recovered.iter().filter(|t| **t == "tool_result").count(),
        2,
        "{recovered:?}"
    );
    assert_eq!(recovered.last(), Some(&"turn_end"));

    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(10)).await.expect_code(0);
}

async fn under_load_every_calls_events_are_in_the_trail(trail: Trail) {
    // The bounded version of the soak benchmark (docs/PERFORMANCE.md): calls at a steady rate for
    // 10 s through POST /v1/turns; then every call's four events are counted in the database.
    const RATE: u64 = 400;
    const SECONDS: u64 = 10;
    let dir = Dir::new();
    let mark = marker("audit-load");
    dir.create("toolwarden.toml", &config(&mark, &trail.section()));
    let (mut server, url) = serve(&dir, &[]).await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    let client = http();
    let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
    let started = Instant::now();
    for i in 0..RATE * SECONDS {
        tick.tick().await;
        let permit = limit.clone().acquire_owned().await.unwrap();
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let resp = client
                .post(format!("{url}/v1/turns"))
                .json(&json!({"calls": [{"id": "c", "name": "test__echo", "input": {"text": format!("n{i}")}}]}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let body: Value = resp.json().await.unwrap();
            drop(permit);
            assert_eq!(body["results"][0]["is_error"], false, "{body}");
            body["turn_id"].as_str().unwrap().to_owned()
        }));
    }
    let mut turns = Vec::new();
    for t in tasks {
        turns.push(t.await.unwrap());
    }
    let took = started.elapsed();
    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(20)).await.expect_code(0);

    let (count, max, ok, per_turn) = trail.counts(&dir);
    assert_eq!(count, max, "seq has holes: events were lost");
    for id in &turns {
        let n = per_turn
            .get(id)
            .unwrap_or_else(|| panic!("turn {id} is missing"));
        assert_eq!(*n, 4, "turn {id}");
    }
    assert_eq!(ok as usize, turns.len());
    eprintln!(
        "{} calls in {took:?} ({:.0}/s), {count} events, all stored",
        turns.len(),
        turns.len() as f64 / took.as_secs_f64()
    );
}

async fn an_api_key_input_never_reaches_the_database(trail: Trail) {
    let dir = Dir::new();
    let mark = marker("audit-redact");
    dir.create("toolwarden.toml", &config(&mark, &trail.section()));
    let (mut server, url) = serve(&dir, &[]).await;
    server
        .wait_stderr("server \"test\" is up", Duration::from_secs(30))
        .await;
    let key = "sk-live-an-api-key-that-must-not-be-stored";
    let answer = turn(
        &url,
        json!([{"id": "k", "name": "test__sleep",
                "input": {"ms": 1, "api_key": key, "headers": {"Authorization": format!("Bearer {key}x")}}}]),
    )
    .await;
    assert_eq!(answer["results"][0]["is_error"], false, "{answer}");
    let events = all_events(&url, "&type=tool_start").await;
    assert_eq!(events[0]["input"]["api_key"], "[MASKED]");
    assert_eq!(events[0]["input"]["headers"]["Authorization"], "[MASKED]");
    let bytes = trail.contents(&dir);
    assert!(contains(&bytes, "[MASKED]"));
    assert!(
        !contains(&bytes, key),
        "the api_key is in the database or its WAL"
    );
    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(10)).await.expect_code(0);
    assert!(!contains(&trail.contents(&dir), key));
}

#[tokio::test]
async fn a_trail_that_cannot_be_written_runs_nothing_and_healthz_says_degraded() {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        &format!("[exec]\nenabled = true\n{STORE}wait = \"300ms\"\n"),
    );
    let (mut server, url) = serve(&dir, &[]).await;
    let (status, health) = get(&format!("{url}/healthz")).await;
    assert_eq!((status, health["store"].as_str()), (200, Some("ok")));

    // Another program holds the database's write lock. The next call still commits its start
    // (to the pending file) and runs, recorded; moving it into the database fails, and from then
    // on the trail is degraded.
    let blocker = rusqlite::Connection::open(dir.path().join("audit.db")).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let first = turn(
        &url,
        json!([{"id": "first", "name": "exec", "input": {"command": "true"}}]),
    )
    .await;
    assert_eq!(first["results"][0]["toolwarden"]["status"], "ok", "{first}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while get(&format!("{url}/healthz")).await.0 != 503 {
        assert!(Instant::now() < deadline, "the store did not degrade");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let marker_file = dir.path().join("ran");
    let answer = turn(
        &url,
        json!([{"id": "w", "name": "exec",
                "input": {"command": format!("touch {}", marker_file.display())}}]),
    )
    .await;
    let result = &answer["results"][0];
    assert_eq!(result["toolwarden"]["status"], "error", "{answer}");
    // It waited `store.wait` for the trail, then ended without running.
    assert_eq!(result["toolwarden"]["reason"], "store");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("audit trail cannot be written") && text.contains("waited 300ms"),
        "{answer}"
    );
    assert!(!marker_file.exists(), "the command ran unrecorded");
    let (status, health) = get(&format!("{url}/healthz")).await;
    assert_eq!(
        (status, health["status"].as_str(), health["store"].as_str()),
        (503, Some("degraded"), Some("degraded"))
    );

    blocker.execute_batch("COMMIT").unwrap();
    drop(blocker);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, _) = get(&format!("{url}/healthz")).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the store did not recover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The refused call is recorded too, and the one that ran.
    let events = all_events(&url, "&call=w&type=tool_result").await;
    assert_eq!(events[0]["outcome"]["status"], "error");
    let events = all_events(&url, "&call=first&type=tool_result").await;
    assert_eq!(events[0]["outcome"]["status"], "ok");
    server.signal(Signal::SIGTERM);
    server.wait(Duration::from_secs(10)).await.expect_code(0);
}

#[tokio::test]
async fn bad_store_files_are_refused_by_name_and_left_untouched() {
    let dir = Dir::new();
    // A directory that cannot be created.
    dir.create("blocker", "a file, not a directory\n");
    dir.create(
        "toolwarden.toml",
        "[store]\npath = \"blocker/sub/audit.db\"\n",
    );
    let out = dir
        .command(&["serve", "--listen", "127.0.0.1:0"])
        .run()
        .await;
    out.expect_code(2);
    assert!(
        out.stderr.contains("toolwarden.toml:2: store.path:"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("blocker/sub/audit.db"),
        "{}",
        out.stderr
    );

    // Not a database.
    dir.create("toolwarden.toml", STORE);
    let junk = dir.create("audit.db", "notes, not a database\n");
    let out = dir
        .command(&["serve", "--listen", "127.0.0.1:0"])
        .run()
        .await;
    out.expect_code(1);
    assert!(
        out.stderr.contains(&junk.display().to_string()),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("left untouched"), "{}", out.stderr);
    assert_eq!(
        std::fs::read_to_string(&junk).unwrap(),
        "notes, not a database\n"
    );
    let audit = dir.command(&["audit"]).run().await;
    audit.expect_code(1);
    assert!(
        audit.stderr.contains(&junk.display().to_string()),
        "{}",
        audit.stderr
    );

    // Written by a newer toolwarden.
    std::fs::remove_file(&junk).unwrap();
    {
        let db = rusqlite::Connection::open(&junk).unwrap();
        db.execute_batch(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY); PRAGMA user_version = 42;",
        )
        .unwrap();
    }
    let before = std::fs::read(&junk).unwrap();
    let out = dir.command(&["call", "exec", "--input", "{}"]).run().await;
    out.expect_code(1);
    assert!(out.stderr.contains("newer toolwarden"), "{}", out.stderr);
    assert!(
        out.stderr.contains(&junk.display().to_string()),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read(&junk).unwrap(), before);

    // Nothing there yet.
    std::fs::remove_file(&junk).unwrap();
    let audit = dir.command(&["audit"]).run().await;
    audit.expect_code(1);
    assert!(
        audit.stderr.contains("there is no audit trail at"),
        "{}",
        audit.stderr
    );
}

async fn a_local_call_is_recorded_and_audit_filters_and_follows(trail: Trail) {
    let dir = Dir::new();
    dir.create(
        "toolwarden.toml",
        &format!("[exec]\nenabled = true\n{}", trail.section()),
    );
    let call = dir
        .command(&[
            "call",
            "exec",
            "--session",
            "cli-s",
            "--input",
            r#"{"command": "echo hi"}"#,
        ])
        .run()
        .await;
    call.expect_code(0);
    let out = dir.command(&["audit", "--session", "cli-s"]).run().await;
    out.expect_code(0);
    assert!(out.stdout.starts_with("STARTED"), "{}", out.stdout);
    assert!(
        out.stdout.contains(" ok ") && out.stdout.contains("exec") && out.stdout.contains("cli"),
        "{}",
        out.stdout
    );
    let none = dir.command(&["audit", "--tool", "nothing"]).run().await;
    none.expect_code(0);
    assert_eq!(none.stdout.trim(), "no calls recorded that match");
    let bad = dir.command(&["audit", "--since", "sometime"]).run().await;
    bad.expect_code(2);
    assert!(bad.stderr.contains("--since"), "{}", bad.stderr);

    // --follow prints a call when it ends.
    let follower = dir
        .command(&["audit", "--follow", "--json", "--since", "1m"])
        .spawn();
    tokio::time::sleep(Duration::from_millis(500)).await;
    dir.command(&["call", "exec", "--input", r#"{"command": "echo second"}"#])
        .run()
        .await
        .expect_code(0);
    let line = follower
        .wait_stdout("\"status\":\"ok\"", Duration::from_secs(10))
        .await;
    let _ = line;
    let deadline = Instant::now() + Duration::from_secs(10);
    while follower.stdout().lines().count() < 2 {
        assert!(Instant::now() < deadline, "{}", follower.stdout());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    follower.signal(Signal::SIGINT);
}

/// Waits until the trail behind `url` has `n` `tool_start` events of `turn_id`.
async fn starts_committed(url: &str, turn_id: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while all_events(url, &format!("&turn={turn_id}&type=tool_start"))
        .await
        .len()
        < n
    {
        assert!(
            Instant::now() < deadline,
            "the tool_start events of {turn_id} were not committed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Posts a detached turn of `calls`; its id.
async fn detached(url: &str, calls: Value) -> String {
    let resp = http()
        .post(format!("{url}/v1/turns"))
        .json(&json!({"detach": true, "calls": calls}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    resp.json::<Value>().await.unwrap()["turn_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The statuses of a turn's calls in the shared trail, by call id.
async fn statuses(url: &str, turn_id: &str) -> Vec<(String, Value)> {
    let (status, page) = get(&format!("{url}/v1/audit/calls?turn={turn_id}")).await;
    assert_eq!(status, 200, "{page}");
    let mut out: Vec<(String, Value)> = page["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["call_id"].as_str().unwrap().to_owned(),
                c["status"].clone(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[tokio::test]
async fn two_replicas_share_one_postgres_trail_and_a_killed_one_recovers_only_its_own_calls() {
    let schema = TestSchema::new();
    let section = format!("[store]\nurl = {:?}\n", schema.url());
    // Two replicas on one machine: each its own directory and config file, hence its own id.
    let (dir_a, dir_b) = (Dir::new(), Dir::new());
    let (mark_a, mark_b) = (marker("replica-a"), marker("replica-b"));
    dir_a.create("toolwarden.toml", &config(&mark_a, &section));
    dir_b.create("toolwarden.toml", &config(&mark_b, &section));
    let (mut a, url_a) = serve(&dir_a, &[]).await;
    let (mut b, url_b) = serve(&dir_b, &[]).await;
    for server in [&mut a, &mut b] {
        server
            .wait_stderr("server \"test\" is up", Duration::from_secs(30))
            .await;
    }
    let turn_a = detached(
        &url_a,
        json!([
            {"id": "a1", "name": "test__sleep", "input": {"ms": 600_000}},
            {"id": "a2", "name": "exec", "input": {"command": format!("sleep 600; echo {mark_a}")}},
        ]),
    )
    .await;
    let turn_b = detached(
        &url_b,
        json!([{"id": "b1", "name": "exec", "input": {"command": format!("sleep 600; echo {mark_b}")}}]),
    )
    .await;
    wait_for_process(a.pid(), &mark_a, Duration::from_secs(10)).await;
    wait_for_process(b.pid(), &mark_b, Duration::from_secs(10)).await;
    starts_committed(&url_a, &turn_a, 2).await;
    starts_committed(&url_b, &turn_b, 1).await;
    // One trail: each replica reads the other's calls.
    assert_eq!(
        statuses(&url_b, &turn_a).await,
        vec![("a1".into(), Value::Null), ("a2".into(), Value::Null)]
    );
    assert_eq!(
        statuses(&url_a, &turn_b).await,
        vec![("b1".into(), Value::Null)]
    );

    a.signal(Signal::SIGKILL);
    a.wait(Duration::from_secs(10)).await;
    assert_no_process(&mark_a, Duration::from_secs(5)).await;
    // While A is down its calls stay open, and B, still running, did not touch them.
    assert_eq!(
        statuses(&url_b, &turn_a).await,
        vec![("a1".into(), Value::Null), ("a2".into(), Value::Null)]
    );

    // A starts again with the same id: its two calls are interrupted, B's call is not.
    let (mut a, url_a) = serve(&dir_a, &[]).await;
    a.wait_stderr(
        "2 calls an earlier run left running were recorded as interrupted",
        Duration::from_secs(10),
    )
    .await;
    let interrupted = json!("interrupted");
    assert_eq!(
        statuses(&url_b, &turn_a).await,
        vec![
            ("a1".into(), interrupted.clone()),
            ("a2".into(), interrupted)
        ]
    );
    assert_eq!(
        statuses(&url_a, &turn_b).await,
        vec![("b1".into(), Value::Null)]
    );
    let (_, record) = get(&format!("{url_b}/v1/turns/{turn_b}")).await;
    assert_eq!(record["state"], "running");
    let (_, record) = get(&format!("{url_b}/v1/turns/{turn_a}")).await;
    assert_eq!(
        (&record["state"], &record["outcome"]),
        (&json!("ended"), &json!("interrupted"))
    );
    // B's command is still running: its process is alive.
    wait_for_process(b.pid(), &mark_b, Duration::from_secs(1)).await;

    // `toolwarden audit` (from A's directory) reads the shared trail: A's two interrupted calls.
    let out = dir_a
        .command(&["audit", "--status", "interrupted", "--json"])
        .run()
        .await;
    out.expect_code(0);
    let mut ids: Vec<String> = out
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["call_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, vec!["a1", "a2"]);

    // B shuts down: its call ends `cancelled`, recorded by B, seen through A.
    b.signal(Signal::SIGTERM);
    b.wait(Duration::from_secs(20)).await.expect_code(0);
    assert_eq!(
        statuses(&url_a, &turn_b).await,
        vec![("b1".into(), json!("cancelled"))]
    );
    assert_no_process(&mark_b, Duration::from_secs(5)).await;
    a.signal(Signal::SIGTERM);
    a.wait(Duration::from_secs(20)).await.expect_code(0);
}
