//! Test support for toolwarden (dev-only, never shipped).
//!
//! - [`test_server_path`] finds the misbehaving MCP test server `tw-test-server` (building it
//!   once if needed) so integration tests can run it as a real child process.
//! - [`RecordingHost`] is a [`BackendHost`] that records everything a backend reports, with
//!   async waits for a condition on the record.
//! - [`AttemptKit`] builds an [`Attempt`] together with the stop signals and heartbeat a test
//!   drives by hand — tests play the engine.
//! - [`wait_until`], [`pid_alive`] and [`assert_all_gone`] assert that nothing was left running.
//!
//! The key design choice: tests observe real processes and real protocol traffic, never mocks,
//! because what breaks in the field (orphans, hung pipes, ignored cancels) only shows there.
#![deny(missing_docs)]
#![allow(
    clippy::expect_used,
    reason = "test support: a broken assumption must fail the test that relies on it, loudly"
)]

pub mod pg;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::Notify;
use toolwarden_core::{
    Attempt, AttemptMeta, Backend, BackendHost, Heartbeat, StopSignals,
    protocol::{
        CallId, CancelReason, OnStuck, ProgressInfo, ServerStateKind, SessionId, ToolSpec, TurnId,
    },
};

pub use toolwarden_process::{descendants, group_members};

/// The path of the `tw-test-server` binary next to the running test executable
/// (`target/<profile>/tw-test-server`), building it with
/// `cargo build -p toolwarden-testkit --bin tw-test-server` the first time if it is missing.
///
/// Panics with a clear message when it can neither find nor build it (this is test code).
pub fn test_server_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let profile_dir = profile_dir();
        let bin = profile_dir.join("tw-test-server");
        if !bin.exists() {
            build_test_server(&profile_dir);
        }
        assert!(
            bin.exists(),
            "tw-test-server not found at {} even after building it",
            bin.display()
        );
        bin
    })
    .clone()
}

/// The official `@modelcontextprotocol/server-everything`, as `scripts/setup-test-deps.sh`
/// installs it (pinned, into the workspace's `node_modules`).
///
/// Panics with a clear message when it is missing (this is test code: nothing is skipped).
pub fn everything_bin() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin = root.join("node_modules/.bin/mcp-server-everything");
    assert!(
        bin.exists(),
        "{} is missing: run scripts/setup-test-deps.sh (it installs the pinned \
         @modelcontextprotocol/server-everything into ./node_modules with npm)",
        bin.display()
    );
    bin
}

/// `target/<profile>` of the running test executable (`target/<profile>/deps/test-HASH`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe
        .parent()
        .expect("test executable has a parent")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

fn build_test_server(profile_dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target_dir = profile_dir
        .parent()
        .expect("profile dir has a parent (the target dir)");
    let profile = profile_dir
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("debug");
    let mut cmd = std::process::Command::new(cargo);
    cmd.args([
        "build",
        "-p",
        "toolwarden-testkit",
        "--bin",
        "tw-test-server",
    ])
    .env("CARGO_TARGET_DIR", target_dir)
    .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile == "release" {
        cmd.arg("--release");
    } else if profile != "debug" {
        cmd.args(["--profile", profile]);
    }
    let status = cmd.status().expect("run cargo build for tw-test-server");
    assert!(status.success(), "building tw-test-server failed: {status}");
}

/// Waits until `cond` holds, polling every 10 ms; panics with `what` after `timeout`.
pub async fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether process `pid` exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Asserts that every process in `pids` is gone within `timeout`.
pub async fn assert_all_gone(pids: &[u32], timeout: Duration) {
    let pids = pids.to_vec();
    wait_until(timeout, &format!("processes {pids:?} to be gone"), || {
        pids.iter().all(|p| !pid_alive(*p))
    })
    .await;
}

/// The live children of this (test) process whose command line contains `needle`.
/// Answers "did a test leave a server running?".
pub fn own_children_running(needle: &str) -> Vec<u32> {
    descendants(std::process::id())
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

/// One `late_result` report.
#[derive(Clone, Debug, PartialEq)]
pub struct LateResult {
    /// The call.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Whether the late answer was an error.
    pub is_error: bool,
    /// How long after the stop request it arrived.
    pub after: Duration,
}

/// Everything a backend reported to a [`RecordingHost`].
#[derive(Clone, Debug, Default)]
pub struct Record {
    /// Every `server_state` report, in order: (server, state, detail).
    pub states: Vec<(String, ServerStateKind, Option<String>)>,
    /// Every `server_protocol` report, in order: (server, revision).
    pub protocols: Vec<(String, String)>,
    /// The latest tool list per server, and how many times it was set.
    pub tools: Vec<(String, Vec<ToolSpec>)>,
    /// Every `set_abandoned` report, in order: (server, count).
    pub abandoned: Vec<(String, u64)>,
    /// Every late result.
    pub late: Vec<LateResult>,
}

impl Record {
    /// The states reported for `server`, in order.
    pub fn states_of(&self, server: &str) -> Vec<ServerStateKind> {
        self.states
            .iter()
            .filter(|(s, _, _)| s == server)
            .map(|(_, k, _)| *k)
            .collect()
    }

    /// The revisions `server` was reached in, start by start.
    pub fn protocols_of(&self, server: &str) -> Vec<String> {
        self.protocols
            .iter()
            .filter(|(s, _)| s == server)
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// The last state reported for `server`, with its detail.
    pub fn last_state(&self, server: &str) -> Option<(ServerStateKind, Option<String>)> {
        self.states
            .iter()
            .rev()
            .find(|(s, _, _)| s == server)
            .map(|(_, k, d)| (*k, d.clone()))
    }

    /// The latest tool list of `server`.
    pub fn tools_of(&self, server: &str) -> Option<&Vec<ToolSpec>> {
        self.tools
            .iter()
            .rev()
            .find(|(s, _)| s == server)
            .map(|(_, t)| t)
    }

    /// The tool names of `server`, sorted.
    pub fn tool_names(&self, server: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .tools_of(server)
            .map(|t| t.iter().map(|t| t.name.clone()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The last abandoned count reported for `server` (0 if none).
    pub fn abandoned_now(&self, server: &str) -> u64 {
        self.abandoned
            .iter()
            .rev()
            .find(|(s, _)| s == server)
            .map_or(0, |(_, n)| *n)
    }
}

/// A [`BackendHost`] that records every report and lets tests wait for conditions on them.
#[derive(Default)]
pub struct RecordingHost {
    record: Mutex<Record>,
    changed: Notify,
    backends: Mutex<Vec<(String, Arc<dyn Backend>)>>,
}

impl RecordingHost {
    /// A fresh host.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A copy of the record so far.
    pub fn record(&self) -> Record {
        self.record.lock().clone()
    }

    /// Waits until `cond` holds on the record; panics with `what` after `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        mut cond: impl FnMut(&Record) -> bool,
    ) -> Record {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            {
                let record = self.record.lock();
                if cond(&record) {
                    return record.clone();
                }
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                let record = self.record.lock();
                assert!(
                    cond(&record),
                    "timed out after {timeout:?} waiting for: {what}; record: {record:#?}"
                );
                return record.clone();
            }
        }
    }

    /// The backend last registered for `server` by `set_tools`.
    pub fn backend(&self, server: &str) -> Option<Arc<dyn Backend>> {
        self.backends
            .lock()
            .iter()
            .rev()
            .find(|(s, _)| s == server)
            .map(|(_, b)| b.clone())
    }

    fn update(&self, f: impl FnOnce(&mut Record)) {
        f(&mut self.record.lock());
        self.changed.notify_waiters();
    }
}

impl BackendHost for RecordingHost {
    fn set_tools(&self, server: &str, backend: Arc<dyn Backend>, tools: Vec<ToolSpec>) {
        self.backends.lock().push((server.to_owned(), backend));
        self.update(|r| r.tools.push((server.to_owned(), tools)));
    }

    fn server_state(&self, server: &str, state: ServerStateKind, detail: Option<String>) {
        self.update(|r| r.states.push((server.to_owned(), state, detail)));
    }

    fn set_abandoned(&self, server: &str, count: u64) {
        self.update(|r| r.abandoned.push((server.to_owned(), count)));
    }

    fn server_protocol(&self, server: &str, protocol: &str) {
        self.update(|r| r.protocols.push((server.to_owned(), protocol.to_owned())));
    }

    fn late_result(&self, meta: &AttemptMeta, tool: &str, is_error: bool, after: Duration) {
        let late = LateResult {
            call_id: meta.call_id.to_string(),
            tool: tool.to_owned(),
            is_error,
            after,
        };
        self.update(|r| r.late.push(late));
    }
}

/// One attempt plus the handles a test uses to play the engine: request a stop, force it,
/// read the progress that arrived.
pub struct AttemptKit {
    /// The stop signals handed to the backend.
    pub stop: StopSignals,
    /// The heartbeat handed to the backend.
    pub heartbeat: Heartbeat,
    progress: Arc<Mutex<Vec<ProgressInfo>>>,
}

impl AttemptKit {
    /// Builds an attempt of `tool` with `input` for call `call_id`; `on_stuck` as given.
    pub fn new(tool: &str, input: Value, call_id: &str, on_stuck: OnStuck) -> (Self, Attempt) {
        let progress: Arc<Mutex<Vec<ProgressInfo>>> = Arc::default();
        let sink = progress.clone();
        let heartbeat = Heartbeat::new(Some(Arc::new(move |p: &ProgressInfo| {
            sink.lock().push(p.clone())
        })));
        let stop = StopSignals::new();
        let attempt = Attempt {
            tool: tool.into(),
            input: Arc::new(input),
            meta: AttemptMeta {
                principal: "local".into(),
                session_id: SessionId::from("s1"),
                turn_id: TurnId::from("t1"),
                call_id: CallId::from(call_id),
                attempt: 1,
                traceparent: None,
            },
            stop: stop.clone(),
            heartbeat: heartbeat.clone(),
            on_stuck,
            deadline: None,
        };
        (
            Self {
                stop,
                heartbeat,
                progress,
            },
            attempt,
        )
    }

    /// Every progress report relayed so far.
    pub fn progress(&self) -> Vec<ProgressInfo> {
        self.progress.lock().clone()
    }

    /// Requests a cooperative stop with `reason`.
    pub fn cancel(&self, reason: CancelReason) {
        self.stop.request_stop(reason);
    }

    /// Forces the stop (what the engine does after `cancel_grace`).
    pub fn force(&self) {
        self.stop.force();
    }
}
