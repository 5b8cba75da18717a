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

struct Deployment {
    script: PathBuf,
    run_dir: Dir,
    ports: String,
    redis: String,
    prefix: String,
    store: TestSchema,
}

impl Deployment {
    fn run(&self, step: &str) -> Output {
        Command::new("bash")
            .arg(&self.script)
            .arg(step)
            .env("TOOLWARDEN_BIN", env!("CARGO_BIN_EXE_toolwarden"))
            .env("RUN_DIR", self.run_dir.path())
            .env("PORTS", &self.ports)
            .env("REDIS_URL", &self.redis)
            .env("REDIS_PREFIX", &self.prefix)
            .env("POSTGRES_URL", self.store.url())
            .output()
            .expect("bash runs deploy/local.sh")
    }

    fn log(&self, replica: u32) -> String {
        std::fs::read_to_string(
            self.run_dir
                .path()
                .join(format!("replica-{replica}/serve.log")),
        )
        .unwrap_or_default()
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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/local.sh");
    let d = Deployment {
        script,
        run_dir: Dir::new(),
        ports: format!("{} {} {}", free_port(), free_port(), free_port()),
        redis: redis_url(),
        prefix: prefix("deploy"),
        store: TestSchema::new(),
    };
    let up = d.run("up");
    assert!(
        up.status.success(),
        "{}\n{}",
        text(&up),
        (1..=3).map(|i| d.log(i)).collect::<String>()
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
    let rows = d
        .store
        .query("SELECT replica || ' ' || status FROM toolwarden_calls");
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
