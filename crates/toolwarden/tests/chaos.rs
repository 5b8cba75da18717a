//! The chaos test (docs/SCALE-OUT.md, "Chaos"): three replicas started by `deploy/local.sh`
//! against a throwaway Redis and a throwaway PostgreSQL of this test's own, mixed calls through
//! all three at about 200 a second, and at fixed moments: one replica killed with `kill -9` (and
//! not restarted), Redis killed with `SIGKILL` and started again, PostgreSQL restarted. Then the
//! trail is read whole: every call in it has exactly one outcome and its turn one end; every call
//! a client got an answer for is in it with that answer, none of it missing; the dead replica's
//! open calls read `interrupted` within 10 s of its death; no call failed because of Redis; calls
//! during PostgreSQL's restart completed, or ended `error{store}` without running.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use std::sync::Mutex;
use tokio::time::Instant;

use crate::deploy::{Deployment, free_port, text};
use crate::scale_out::{Throwaway, prefix};
use crate::util::{Dir, http, kill_marked, marker, test_server, toml_str};

/// Calls started per second, over all replicas.
const RATE: u64 = 200;
/// When things happen, from the start of the load.
const KILL_REPLICA_AT: Duration = Duration::from_secs(6);
const KILL_REDIS_AT: Duration = Duration::from_secs(16);
const REDIS_AWAY_FOR: Duration = Duration::from_secs(2);
const RESTART_PG_AT: Duration = Duration::from_secs(26);
const LOAD_FOR: Duration = Duration::from_secs(36);
/// The longest a call may wait for the trail (`store.wait`, the default).
const STORE_WAIT: Duration = Duration::from_secs(5);

/// A throwaway PostgreSQL server (`initdb` into a temporary directory, `pg_ctl` to start and
/// restart it), run as the `postgres` user when the tests run as root; stopped when dropped.
struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
}

impl Postgres {
    fn start() -> Postgres {
        // Debian's newest server, as scripts/setup-test-deps.sh finds it, else pg_config's.
        let mut installed: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|b| b.join("initdb").exists())
            .collect();
        installed.sort_by_key(|b| {
            b.parent()
                .and_then(|v| v.file_name())
                .and_then(|v| v.to_str())
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        });
        let bin = installed
            .pop()
            .or_else(|| {
                Command::new("pg_config")
                    .arg("--bindir")
                    .output()
                    .ok()
                    .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
                    .filter(|b| b.join("initdb").exists())
            })
            .expect("PostgreSQL's server programs (initdb, pg_ctl): scripts/setup-test-deps.sh installs them");
        let dir = tempfile::Builder::new()
            .prefix("tw-chaos-pg")
            .tempdir_in("/tmp")
            .unwrap();
        if nix::unistd::geteuid().is_root() {
            let chown = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path())
                .output()
                .unwrap();
            assert!(chown.status.success(), "{}", text(&chown));
        }
        let pg = Postgres {
            dir,
            bin,
            port: free_port(),
        };
        let init = pg.run(
            "initdb",
            &[
                "-D",
                &pg.data(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        assert!(init.status.success(), "initdb: {}", text(&init));
        pg.ctl(&["start"]);
        pg
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// Runs one of PostgreSQL's programs, as `postgres` when this is root.
    fn run(&self, program: &str, args: &[&str]) -> Output {
        let path = self.bin.join(program);
        let mut cmd = if nix::unistd::geteuid().is_root() {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(&path);
            cmd
        } else {
            Command::new(&path)
        };
        cmd.args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap()
    }

    fn ctl(&self, action: &[&str]) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        let data = self.data();
        let mut args = vec!["-D", &data, "-w", "-t", "60", "-l", &log, "-o", &options];
        args.extend_from_slice(action);
        let out = self.run("pg_ctl", &args);
        assert!(
            out.status.success(),
            "pg_ctl {action:?}: {}\n{}",
            text(&out),
            std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
        );
    }

    /// A fast restart: open connections are ended, the server is back when this returns.
    fn restart(&self) {
        self.ctl(&["-m", "fast", "restart"]);
    }

    fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The rows of `sql` (tab-separated columns) in database `toolwarden`.
    fn query(&self, sql: &str) -> Vec<String> {
        let out = Command::new("psql")
            .arg(self.url("toolwarden"))
            .args(["-AtqF", "\t", "-c", sql])
            .output()
            .unwrap();
        assert!(out.status.success(), "psql: {}", text(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }
}

/// Kills the `exec` calls marked `mark` when dropped: their replica was killed, and nothing
/// else would stop them — also when the test fails half-way.
struct KillMarked(String);

impl Drop for KillMarked {
    fn drop(&mut self) {
        kill_marked(&self.0);
    }
}

/// One call the load started: where, when, and what its client got.
struct Sent {
    call_id: String,
    replica: usize,
    at: Duration,
    /// The call's `toolwarden` outcome, or why no answer came.
    answer: Result<Value, String>,
}

/// The call numbered `n`: mostly the test server's `echo`, some `exec`, a few short sleeps.
fn nth_call(n: u64) -> (String, Value) {
    match n % 10 {
        0..=5 => ("test__echo".to_owned(), json!({"text": format!("k{n}")})),
        6..=8 => ("exec".to_owned(), json!({"command": format!("echo k{n}")})),
        _ => ("test__sleep".to_owned(), json!({"ms": 200})),
    }
}

async fn send(
    client: reqwest::Client,
    url: String,
    call_id: String,
    n: u64,
) -> Result<Value, String> {
    let (tool, input) = nth_call(n);
    let resp = client
        .post(format!("{url}/v1/turns"))
        .json(
            &json!({"calls": [{"type": "tool_use", "id": call_id, "name": tool, "input": input}]}),
        )
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let body: Value = resp.json().await.map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("{status}: {body}"));
    }
    Ok(body["results"][0]["toolwarden"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_lose_one_and_live_through_redis_and_postgresql_restarts() {
    let pg = Postgres::start();
    let mut redis = Throwaway::start(None);
    let redis_port = redis.port;
    let until = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", redis_port)).is_err() {
        assert!(
            Instant::now() < until,
            "the throwaway redis-server never listened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let extra = Dir::new();
    extra.create(
        "extra.toml",
        &format!("[servers.test]\ncommand = {}\n", toml_str(&test_server())),
    );
    let deployment = Deployment {
        run_dir: Dir::new(),
        ports: vec![free_port(), free_port(), free_port()],
        envs: vec![
            (
                "REDIS_URL".into(),
                format!("redis://127.0.0.1:{redis_port}/0"),
            ),
            ("REDIS_PREFIX".into(), prefix("chaos")),
            ("POSTGRES_URL".into(), pg.url("toolwarden")),
            (
                "EXTRA_CONFIG".into(),
                extra.path().join("extra.toml").display().to_string(),
            ),
        ],
    };
    let up = deployment.run("up");
    assert!(
        up.status.success(),
        "{}\n{}",
        text(&up),
        (0..3).map(|i| deployment.log(i)).collect::<String>()
    );
    let client = http();
    // The test server is up everywhere before the load starts.
    for i in 0..3 {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = send(client.clone(), deployment.url(i), format!("warm{i}"), 0).await;
            if answer.as_ref().is_ok_and(|a| a["status"] == "ok") {
                break;
            }
            assert!(Instant::now() < until, "replica {i} not ready: {answer:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Long calls on the replica that will die: its survivor must end them.
    let mark = marker("chaos");
    let _orphans = KillMarked(mark.clone());
    let victim = 2;
    let mut doomed = Vec::new();
    for k in 0..3 {
        let resp = client
            .post(format!("{}/v1/turns", deployment.url(victim)))
            .json(
                &json!({"detach": true, "calls": [{"type": "tool_use", "id": format!("doomed{k}"),
                "name": "exec", "input": {"command": format!("sleep 60; : {mark}")}}]}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        let body: Value = resp.json().await.unwrap();
        doomed.push(body["turn_id"].as_str().unwrap().to_owned());
    }

    let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let live: Arc<Mutex<Vec<usize>>> = Arc::new(Mutex::new(vec![0, 1, 2]));
    let start = Instant::now();
    let load = {
        let (sent, live, client) = (sent.clone(), live.clone(), client.clone());
        let urls: Vec<String> = (0..3).map(|i| deployment.url(i)).collect();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut calls = Vec::new();
            let mut n = 0u64;
            while start.elapsed() < LOAD_FOR {
                tick.tick().await;
                let replica = {
                    let live = live.lock().unwrap();
                    live[(n as usize) % live.len()]
                };
                let call_id = format!("k{n}");
                let (sent, client, url) = (sent.clone(), client.clone(), urls[replica].clone());
                let at = start.elapsed();
                calls.push(tokio::spawn(async move {
                    let answer = send(client, url, call_id.clone(), n).await;
                    sent.lock().unwrap().push(Sent {
                        call_id,
                        replica,
                        at,
                        answer,
                    });
                }));
                n += 1;
            }
            for call in calls {
                let _ = call.await;
            }
        })
    };

    // kill -9 one replica, for good.
    tokio::time::sleep_until(start + KILL_REPLICA_AT).await;
    live.lock().unwrap().retain(|&r| r != victim);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(deployment.pid(victim)),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let killed_at = start.elapsed();
    kill_marked(&mark);
    // Its open calls read `interrupted` within 10 s, recorded by a survivor.
    let list = doomed
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(",");
    let interrupted_after = loop {
        let n = tokio::task::block_in_place(|| {
            pg.query(&format!(
                "SELECT count(*) FROM toolwarden_calls WHERE turn_id IN ({list}) AND status = 'interrupted'"
            ))
        });
        if n == ["3"] {
            break start.elapsed() - killed_at;
        }
        assert!(
            start.elapsed() - killed_at < Duration::from_secs(10),
            "the dead replica's calls were not interrupted within 10 s: {n:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // Redis killed and started again.
    tokio::time::sleep_until(start + KILL_REDIS_AT).await;
    redis.kill();
    let redis_down = start.elapsed();
    tokio::time::sleep(REDIS_AWAY_FOR).await;
    let redis = Throwaway::start(Some(redis_port));
    let redis_up = start.elapsed();

    // PostgreSQL restarted.
    tokio::time::sleep_until(start + RESTART_PG_AT).await;
    let pg_down = start.elapsed();
    tokio::task::block_in_place(|| pg.restart());
    let pg_up = start.elapsed();

    load.await.unwrap();
    let took = start.elapsed();
    // The survivors write what they hold and stop.
    let down = deployment.run("down");
    assert!(down.status.success(), "{}", text(&down));
    drop(redis);

    let sent = std::mem::take(&mut *sent.lock().unwrap());
    let answered: Vec<&Sent> = sent.iter().filter(|s| s.answer.is_ok()).collect();
    // Every call in the trail: one outcome; every turn: one end.
    let calls: HashMap<String, (String, i64, i64, String)> = pg
        .query(
            "SELECT c.call_id, coalesce(c.status, 'running'), \
             (SELECT count(*) FROM toolwarden_events e WHERE e.turn_id = c.turn_id \
              AND e.call_id = c.call_id AND e.type = 'tool_result'), \
             (SELECT count(*) FROM toolwarden_events e WHERE e.turn_id = c.turn_id \
              AND e.call_id = c.call_id AND e.type = 'tool_start'), c.replica \
             FROM toolwarden_calls c",
        )
        .into_iter()
        .map(|row| {
            let f: Vec<&str> = row.split('\t').collect();
            (
                f[0].to_owned(),
                (
                    f[1].to_owned(),
                    f[2].parse().unwrap(),
                    f[3].parse().unwrap(),
                    f[4].to_owned(),
                ),
            )
        })
        .collect();
    let not_one: Vec<_> = calls.iter().filter(|(_, c)| c.1 != 1).collect();
    assert!(
        not_one.is_empty(),
        "calls without exactly one outcome: {not_one:?}"
    );
    let turns_not_ended = pg.query(
        "SELECT t.turn_id FROM toolwarden_turns t WHERE (SELECT count(*) FROM toolwarden_events e \
         WHERE e.turn_id = t.turn_id AND e.type = 'turn_end') <> 1 \
         OR (SELECT count(*) FROM toolwarden_events e WHERE e.turn_id = t.turn_id \
         AND e.type = 'turn_start') <> 1",
    );
    assert!(
        turns_not_ended.is_empty(),
        "turns without one start and one end: {turns_not_ended:?}"
    );
    // Every answered call is in the trail with its answer; none failed because of Redis; during
    // PostgreSQL's restart a call completed or ended error{store} without running.
    let mut store_errors = 0;
    // A call the killed replica answered in its last moment: its answer goes out before its
    // outcome is committed, so the survivor, finding no outcome, records it `interrupted`. Only
    // calls to the killed replica, sent before it was killed (docs/SCALE-OUT.md, "Chaos").
    let mut answered_then_interrupted = 0;
    for s in &answered {
        let answer = s.answer.as_ref().unwrap();
        let status = answer["status"].as_str().unwrap_or_default();
        let recorded = calls
            .get(&s.call_id)
            .unwrap_or_else(|| panic!("{} answered {answer} but is not in the trail", s.call_id));
        if recorded.0 == "interrupted" && s.replica == victim && s.at <= killed_at {
            answered_then_interrupted += 1;
            continue;
        }
        assert_eq!(recorded.0, status, "{}: {answer}", s.call_id);
        match status {
            "ok" => assert!(recorded.2 >= 1, "{} ran without its tool_start", s.call_id),
            "error" if answer["reason"] == "store" => {
                assert_eq!(answer["attempts"], 0, "{answer}");
                assert!(
                    s.at + STORE_WAIT + Duration::from_secs(2) >= pg_down
                        && s.at <= pg_up + Duration::from_secs(2),
                    "error{{store}} outside PostgreSQL's restart: {} at {:?}: {answer}",
                    s.call_id,
                    s.at
                );
                store_errors += 1;
            }
            _ => panic!(
                "{} on replica {} at {:?}: {answer}",
                s.call_id, s.replica, s.at
            ),
        }
    }
    // Calls without an answer went to the killed replica as it died.
    for s in sent.iter().filter(|s| s.answer.is_err()) {
        assert_eq!(
            s.replica, victim,
            "{} at {:?} got no answer from a live replica: {:?}",
            s.call_id, s.at, s.answer
        );
    }
    let victim_name = format!("replica-{}", victim + 1);
    let dead = pg.query(&format!(
        "SELECT taken_over_by, interrupted FROM toolwarden_replicas WHERE replica = '{victim_name}' AND dead_at IS NOT NULL"
    ));
    assert_eq!(dead.len(), 1, "{dead:?}");
    // The survivors were never declared dead (no PostgreSQL or Redis restart made them so).
    let survivors = pg.query(
        "SELECT replica || ' ' || generation || ' ' || (dead_at IS NULL) FROM toolwarden_replicas \
         WHERE replica <> 'replica-3' ORDER BY replica",
    );
    assert_eq!(
        survivors,
        ["replica-1 1 true", "replica-2 1 true"],
        "a live replica was declared dead"
    );
    let summary = format!(
        "chaos: {} calls started in {:.1?} ({:.0}/s), {} answered ({} error{{store}}, {answered_then_interrupted} answered by the killed replica as it died and recorded interrupted), {} to the killed replica unanswered; \
         replica killed at {killed_at:.1?}, its calls interrupted {interrupted_after:.1?} later ({}); \
         Redis away {redis_down:.1?}–{redis_up:.1?}; PostgreSQL restarted {pg_down:.1?}–{pg_up:.1?}; {} calls in the trail, each with one outcome",
        sent.len(),
        took,
        sent.len() as f64 / LOAD_FOR.as_secs_f64(),
        answered.len(),
        store_errors,
        sent.len() - answered.len(),
        dead[0],
        calls.len(),
    );
    eprintln!("{summary}");
    assert!(
        answered.len() as u64 >= RATE * LOAD_FOR.as_secs() / 2,
        "too few calls answered: {summary}"
    );
}
