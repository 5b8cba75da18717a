//! `deploy/local.sh`, the walkthrough of docs/SCALE-OUT.md ("Deploying three replicas"), run as a
//! user runs it: `up` starts three replicas of the built binary on free ports against the test
//! Redis and a PostgreSQL schema of this test's own, `check` shows they act as one (it fails
//! otherwise), `down` stops them — also when the test fails half-way.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use toolwarden_testkit::pg::TestSchema;

use crate::scale_out::{prefix, redis_url};
use crate::util::Dir;

/// Three replicas of `deploy/local.sh` on `ports`, their files in `run_dir`, with `envs` (the
/// Redis and PostgreSQL to use, …); stopped (`down`) when dropped, also when a test fails
/// half-way.
pub(crate) struct Deployment {
    pub(crate) run_dir: Dir,
    pub(crate) ports: Vec<u16>,
    pub(crate) envs: Vec<(String, String)>,
}

impl Deployment {
    /// Runs `deploy/local.sh STEP`.
    pub(crate) fn run(&self, step: &str) -> Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/local.sh");
        let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
        Command::new("bash")
            .arg(script)
            .arg(step)
            .env("TOOLWARDEN_BIN", env!("CARGO_BIN_EXE_toolwarden"))
            .env("RUN_DIR", self.run_dir.path())
            .env("PORTS", ports.join(" "))
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("bash runs deploy/local.sh")
    }

    /// Replica `i`'s API (from 0).
    pub(crate) fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }

    /// Replica `i`'s process.
    pub(crate) fn pid(&self, i: usize) -> i32 {
        std::fs::read_to_string(self.file(i, "pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// Replica `i`'s log.
    pub(crate) fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.file(i, "serve.log")).unwrap_or_default()
    }

    fn file(&self, i: usize, name: &str) -> PathBuf {
        self.run_dir
            .path()
            .join(format!("replica-{}/{name}", i + 1))
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        self.run("down");
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_local_deployment_runs_three_replicas_that_act_as_one() {
    let store = TestSchema::new();
    let d = Deployment {
        run_dir: Dir::new(),
        ports: vec![free_port(), free_port(), free_port()],
        envs: vec![
            ("REDIS_URL".into(), redis_url()),
            ("REDIS_PREFIX".into(), prefix("deploy")),
            ("POSTGRES_URL".into(), store.url().to_owned()),
        ],
    };
    let up = d.run("up");
    assert!(
        up.status.success(),
        "{}\n{}",
        text(&up),
        (0..3).map(|i| d.log(i)).collect::<String>()
    );
    let check = d.run("check");
    assert!(check.status.success(), "{}", text(&check));
    let shown = String::from_utf8_lossy(&check.stdout);
    assert!(shown.contains("the three replicas act as one"), "{shown}");
    // Replica 3 named the replica that runs the turn after its id in the trail.
    assert!(shown.contains(r#""replica":"replica-1-"#), "{shown}");
    // One trail: the aborted call, run on replica 1, is in the shared PostgreSQL store under
    // replica 1's name.
    let down = d.run("down");
    assert!(down.status.success(), "{}", text(&down));
    let rows = store.query("SELECT replica || ' ' || status FROM toolwarden_calls");
    assert_eq!(
        rows,
        vec![Some("replica-1 cancelled".to_owned())],
        "calls in the trail"
    );
    for i in 1..=3 {
        assert!(
            !d.run_dir.path().join(format!("replica-{i}/pid")).exists(),
            "replica-{i} left a pid file"
        );
    }
}
