//! Test helpers in the style of ripgrep's `tests/util.rs`: a temp dir and a command per test,
//! driving the real binary; plus the process checks that prove nothing was left running.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// No test command may run longer than this.
const RUN_LIMIT: Duration = Duration::from_secs(90);

/// The binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_toolwarden"))
}

/// `tw-test-server`, the misbehaving MCP server (built on first use).
pub fn test_server() -> String {
    toolwarden_testkit::test_server_path().display().to_string()
}

/// A unique word for this test, to find its processes by command line.
pub fn marker(name: &str) -> String {
    format!("twmark-{name}-{}", std::process::id())
}

/// A temporary directory a test runs in.
pub struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    pub fn new() -> Dir {
        Dir {
            dir: tempfile::Builder::new()
                .prefix("toolwarden-cli-")
                .tempdir()
                .expect("temp dir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `contents` to `name` in the directory.
    pub fn create(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create parent dir");
        }
        std::fs::write(&path, contents).expect("write file");
        path
    }

    /// `toolwarden ARGS...` run in this directory, with none of the caller's toolwarden
    /// variables. Its platform data dir is `data/` here, so that an audit trail without a
    /// configured `[store] path` never lands in the user's.
    pub fn command(&self, args: &[&str]) -> TestCommand {
        self.program(&bin().to_string_lossy(), args)
    }

    /// Any program (`cargo`, `sh`), with the same environment as [`Dir::command`].
    pub fn program(&self, program: &str, args: &[&str]) -> TestCommand {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(self.path())
            .env("XDG_DATA_HOME", self.path().join("data"))
            .env_remove("TOOLWARDEN_CONFIG")
            .env_remove("TOOLWARDEN_REPLICA")
            .env_remove("TOOLWARDEN_TOKEN")
            .env_remove("TOOLWARDEN_TOOL_TIMEOUT")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        TestCommand { cmd }
    }
}

pub struct TestCommand {
    cmd: Command,
}

/// What a finished command did.
#[derive(Debug)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// Asserts the exit code, showing everything the command wrote when it differs.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "exit code; stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

impl TestCommand {
    /// Gives the command this stdin and stderr (a terminal, in the prompt tests).
    pub fn stdio(&mut self, stdin: Stdio, stderr: Stdio) -> &mut Self {
        self.cmd.stdin(stdin).stderr(stderr);
        self
    }

    /// Gives the command this stdout (a file, in the stdio tests).
    pub fn stdout(&mut self, stdout: Stdio) -> &mut Self {
        self.cmd.stdout(stdout);
        self
    }

    pub fn env(&mut self, key: &str, value: &str) -> &mut Self {
        self.cmd.env(key, value);
        self
    }

    /// Runs it in `dir` instead of the test's directory.
    pub fn current_dir(&mut self, dir: &Path) -> &mut Self {
        self.cmd.current_dir(dir);
        self
    }

    /// Runs to completion (at most [`RUN_LIMIT`]).
    pub async fn run(&mut self) -> Output {
        self.run_within(RUN_LIMIT).await
    }

    /// Runs to completion, at most `limit`.
    pub async fn run_within(&mut self, limit: Duration) -> Output {
        let child = self.cmd.spawn().expect("spawn toolwarden");
        let out = tokio::time::timeout(limit, child.wait_with_output())
            .await
            .expect("toolwarden did not finish in time")
            .expect("wait for toolwarden");
        Output {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Starts it and collects its stdout and stderr lines as they come.
    pub fn spawn(&mut self) -> Running {
        let mut child = self.cmd.spawn().expect("spawn toolwarden");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        if let Some(pipe) = child.stdout.take() {
            readers.push(collect(pipe, stdout.clone()));
        }
        if let Some(pipe) = child.stderr.take() {
            readers.push(collect(pipe, stderr.clone()));
        }
        Running {
            child,
            stdout,
            stderr,
            readers,
        }
    }
}

fn collect(
    pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    into: Arc<Mutex<Vec<String>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            into.lock().push(line);
        }
    })
}

/// A running `toolwarden`; killed (SIGKILL) and reaped if the test drops it.
pub struct Running {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running child has a pid")
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().join("\n")
    }

    /// Its stdin, when the command was given a piped one (once).
    pub fn take_stdin(&mut self) -> tokio::process::ChildStdin {
        self.child.stdin.take().expect("a piped stdin, taken once")
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().join("\n")
    }

    /// Waits for a stderr line containing `needle`; returns it.
    pub async fn wait_stderr(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.stderr.lock().iter().find(|l| l.contains(needle)) {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no stderr line with {needle:?} within {timeout:?}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for a stdout line containing `needle`; returns it.
    pub async fn wait_stdout(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.stdout.lock().iter().find(|l| l.contains(needle)) {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no stdout line with {needle:?} within {timeout:?}; stdout:\n{}\nstderr:\n{}",
                self.stdout(),
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The base URL `serve` says it listens on.
    pub async fn url(&self) -> String {
        let line = self
            .wait_stderr("listening on http://", Duration::from_secs(30))
            .await;
        let at = line.find("http://").expect("a URL");
        line[at..].trim().to_owned()
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, signal).expect("send a signal");
    }

    /// Waits for the exit (at most `timeout`); the exit code, and all output read.
    pub async fn wait(&mut self, timeout: Duration) -> Output {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "toolwarden did not exit within {timeout:?}; stderr:\n{}",
                    self.stderr()
                )
            })
            .expect("wait");
        for reader in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        Output {
            code: status.code(),
            stdout: self.stdout(),
            stderr: self.stderr(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        // Reap it (tokio's orphan reaper would too, later).
        let _ = self.child.try_wait();
    }
}

/// Live processes (not zombies) whose command line contains `needle`.
pub fn pids_with(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(needle) && toolwarden_testkit::pid_alive(pid)
        {
            out.push(pid);
        }
    }
    out
}

/// Waits until some descendant of `root` has a command line containing `needle`; their pids.
/// (Descendants only: the command line of the `toolwarden` that started them often holds the
/// same text.)
pub async fn wait_for_process(root: u32, needle: &str, timeout: Duration) -> Vec<u32> {
    let deadline = Instant::now() + timeout;
    loop {
        let below = toolwarden_testkit::descendants(root);
        let pids: Vec<u32> = pids_with(needle)
            .into_iter()
            .filter(|p| below.contains(p))
            .collect();
        if !pids.is_empty() {
            return pids;
        }
        assert!(
            Instant::now() < deadline,
            "no process with {needle:?} appeared within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts that no process's command line contains `needle` (allowing `grace` for the
/// kernel to finish reaping).
pub async fn assert_no_process(needle: &str, grace: Duration) {
    let deadline = Instant::now() + grace;
    loop {
        let pids = pids_with(needle);
        if pids.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            for pid in &pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            panic!("processes with {needle:?} were left running: {pids:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Stops a `serve` with SIGTERM: it exits 0 within 15 s and leaves no process whose command line
/// holds `mark` (its servers, their children).
pub async fn stop_clean(mut server: Running, mark: &str) {
    server.signal(nix::sys::signal::Signal::SIGTERM);
    server.wait(Duration::from_secs(15)).await.expect_code(0);
    assert_no_process(mark, Duration::from_secs(2)).await;
}

/// One call as its own turn over `POST /v1/turns` (with `token`'s principal, if given): its
/// result, after checking the request was answered 200.
pub async fn call_one(url: &str, token: Option<&str>, name: &str, input: Value) -> Value {
    let mut req = http().post(format!("{url}/v1/turns")).json(
        &serde_json::json!({"calls": [{"type": "tool_use", "id": "c1", "name": name, "input": input}]}),
    );
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    body["results"][0].clone()
}

/// `GET url`'s JSON body (no token).
pub async fn get_json(url: &str) -> Value {
    http().get(url).send().await.unwrap().json().await.unwrap()
}

/// `GET url`'s text body (no token): `/metrics`.
pub async fn get_text(url: &str) -> String {
    http().get(url).send().await.unwrap().text().await.unwrap()
}

/// A result's `(status, decider, reason)`, empty where absent.
pub fn outcome_of(result: &Value) -> (String, String, String) {
    let t = &result["toolwarden"];
    let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
    (s(&t["status"]), s(&t["decider"]), s(&t["reason"]))
}

/// A result's first text, as the model reads it.
pub fn text_of(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// An HTTP client that ignores proxies (tests talk to 127.0.0.1).
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("HTTP client")
}

/// TOML for a string (quoted and escaped).
/// One JSON-RPC request of a stateless (2026-07-28) MCP client that declares tasks, to
/// `url`'s `/mcp`; its answer (read from JSON or from the event stream).
pub async fn mcp(url: &str, id: u64, method: &str, params: Value) -> Value {
    mcp_as(url, None, id, method, params).await
}

/// [`mcp`] with `token` as the bearer token.
pub async fn mcp_as(url: &str, token: Option<&str>, id: u64, method: &str, params: Value) -> Value {
    let capabilities = serde_json::json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    mcp_declaring(url, token, id, method, params, capabilities).await
}

/// [`mcp_as`] from a client that declares `capabilities` (e.g. `elicitation` besides tasks).
pub async fn mcp_declaring(
    url: &str,
    token: Option<&str>,
    id: u64,
    method: &str,
    mut params: Value,
    capabilities: Value,
) -> Value {
    const V: &str = "2026-07-28";
    params["_meta"] = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": V,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "toolwarden-tests", "version": "0"},
    });
    let name = params["name"]
        .as_str()
        .or(params["taskId"].as_str())
        .or(params["uri"].as_str())
        .unwrap_or_default()
        .to_owned();
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut req = http().post(format!("{url}/mcp"));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", V)
        .header("mcp-method", method)
        .header("mcp-name", name)
        .json(&body)
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        return v;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("id").is_some() && v.get("method").is_none())
        .unwrap_or_else(|| panic!("no answer to {method}: {text}"))
}

pub fn toml_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// Asserts that process group `pgid` (a command's shell and everything it started) is gone.
pub async fn assert_group_gone(pgid: u32, grace: Duration) {
    let deadline = Instant::now() + grace;
    loop {
        let alive: Vec<u32> = toolwarden_testkit::group_members(pgid)
            .into_iter()
            .filter(|p| toolwarden_testkit::pid_alive(*p))
            .collect();
        if alive.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("process group {pgid} was left running: {alive:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pseudo-terminal: what a program writes to its slave side is read here, what is typed here
/// reaches the program's stdin.
pub struct Terminal {
    master: std::fs::File,
    slave: Option<std::os::fd::OwnedFd>,
    screen: Arc<Mutex<String>>,
}

impl Terminal {
    pub fn open() -> Terminal {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let master = std::fs::File::from(pty.master);
        let reader = master.try_clone().expect("clone the master");
        let screen = Arc::new(Mutex::new(String::new()));
        let into = screen.clone();
        std::thread::spawn(move || {
            use std::io::Read as _;
            let mut reader = reader;
            let mut buf = [0u8; 4096];
            // Ends with EIO once every slave side is closed.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                into.lock().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Terminal {
            master,
            slave: Some(pty.slave),
            screen,
        }
    }

    /// The slave side as a program's stdin and stderr (ours is closed, so that the terminal
    /// hangs up when the program exits).
    pub fn stdio(&mut self) -> (Stdio, Stdio) {
        let slave = self.slave.take().expect("the slave side, once");
        let other = slave.try_clone().expect("clone the slave");
        (Stdio::from(slave), Stdio::from(other))
    }

    pub fn screen(&self) -> String {
        self.screen.lock().clone()
    }

    /// Waits until the screen shows `needle`.
    pub async fn wait_for(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.screen().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "the terminal did not show {needle:?} within {timeout:?}; it shows:\n{}",
                self.screen()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Types `text`.
    pub fn type_text(&self, text: &str) {
        use std::io::Write as _;
        (&self.master)
            .write_all(text.as_bytes())
            .expect("write to the terminal");
    }
}

/// One server-sent event: its `id:` (absent on comments-only or `lost` events), `event:` and
/// `data:` (JSON).
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: Option<u64>,
    pub event: String,
    pub data: Value,
}

/// Reads server-sent events from a streaming HTTP response (keep-alive comments skipped).
pub struct Sse {
    resp: reqwest::Response,
    buf: String,
}

impl Sse {
    pub fn new(resp: reqwest::Response) -> Sse {
        assert_eq!(
            resp.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("text/event-stream"),
            "not an event stream"
        );
        Sse {
            resp,
            buf: String::new(),
        }
    }

    /// The next event; `None` when the stream ends. Panics after `timeout` without one.
    pub async fn next(&mut self, timeout: Duration) -> Option<SseEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().parse().expect("a numeric id"));
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue; // a comment (keep-alive)
                }
                let data = serde_json::from_str(&data)
                    .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {data}"));
                return Some(SseEvent { id, event, data });
            }
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk())
                .await
                .unwrap_or_else(|_| panic!("no event within {timeout:?}"))
                .expect("read the event stream");
            match chunk {
                Some(bytes) => self.buf.push_str(&String::from_utf8_lossy(&bytes)),
                None => return None,
            }
        }
    }

    /// Reads events until `done` holds for all read so far (by this call); those events.
    pub async fn collect(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&[SseEvent]) -> bool,
    ) -> Vec<SseEvent> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        while !done(&seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(event) => seen.push(event),
                None => panic!("the stream ended; events so far: {seen:#?}"),
            }
        }
        seen
    }

    /// Reads events until one matches `pred`; that event.
    pub async fn until(
        &mut self,
        timeout: Duration,
        mut pred: impl FnMut(&SseEvent) -> bool,
    ) -> SseEvent {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = self
                .next(left)
                .await
                .expect("the stream ended before the expected event");
            if pred(&event) {
                return event;
            }
        }
    }
}

/// Kills every process (and its group) whose command line holds `mark`: the `exec` calls of a
/// replica that was killed, which nothing else would stop.
pub fn kill_marked(mark: &str) {
    for pid in pids_with(mark) {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
}
