//! One connection to a server: a spawned stdio child or a Streamable HTTP endpoint, from spawn
//! or connect through the lifecycle (`server/discover`, else the `initialize` handshake) and
//! `tools/list`. What the supervisor needs to watch the
//! connection and tear it down — the child, its stderr, rmcp's service, why it ended — comes
//! out of `connect`, so the supervisor never deals with transports.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use parking_lot::Mutex;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CancelledNotificationParam, ClientNotification, CustomNotification, ProtocolVersion, RequestId,
    Tool,
};
use rmcp::service::{
    ClientInitializeError, ClientLifecycleMode, Peer, RoleClient, RunningService,
    serve_client_with_lifecycle_and_ct,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use toolwarden_process::GroupChild;
use toolwarden_protocol::ServerConfig;

use super::call_table::CallTable;
use super::frame::{self, Direct, Hooks};
use super::handler::ConnectionHandler;
use super::in_order::InOrder;
use super::link::Link;
use super::options::McpOptions;

/// How to reach a server, from its config.
#[derive(Clone, Debug)]
pub(crate) enum Endpoint {
    /// A child process speaking MCP on stdio.
    Stdio {
        program: PathBuf,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: PathBuf,
    },
    /// A Streamable HTTP endpoint.
    Http {
        url: String,
        headers: HashMap<HeaderName, HeaderValue>,
    },
}

impl Endpoint {
    /// Reads the transport part of a server's config. Relative `cwd` and relative commands
    /// with a `/` (`./server`, `bin/server`) are taken from `base_dir`; bare names go to `PATH`.
    pub(crate) fn from_config(cfg: &ServerConfig, base_dir: &Path) -> Result<Self, String> {
        match (&cfg.command, &cfg.url) {
            (Some(_), Some(_)) => Err("both `command` and `url` are set; set one".into()),
            (None, None) => Err("neither `command` nor `url` is set".into()),
            (Some(command), None) => {
                let cwd = match &cfg.cwd {
                    Some(dir) => base_dir.join(dir),
                    None => base_dir.to_path_buf(),
                };
                let program = if command.contains('/') {
                    base_dir.join(command)
                } else {
                    PathBuf::from(command)
                };
                Ok(Endpoint::Stdio {
                    program,
                    args: cfg.args.clone(),
                    env: cfg.env.clone(),
                    cwd,
                })
            }
            (None, Some(url)) => {
                let mut headers = HashMap::new();
                for (name, value) in &cfg.headers {
                    let name = HeaderName::try_from(name.as_str())
                        .map_err(|e| format!("bad header name {name:?}: {e}"))?;
                    let value = HeaderValue::try_from(value.as_str())
                        .map_err(|e| format!("bad value for header {name}: {e}"))?;
                    headers.insert(name, value);
                }
                Ok(Endpoint::Http {
                    url: url.clone(),
                    headers,
                })
            }
        }
    }

    pub(crate) fn is_stdio(&self) -> bool {
        matches!(self, Endpoint::Stdio { .. })
    }
}

/// Why a connection ended. Set once; calls in flight map it to their own end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ConnEnd {
    /// The server exited, crashed or closed its pipe.
    Crashed(String),
    /// We killed it to restart it (`on_stuck = "restart"`).
    Restart(String),
    /// toolwarden is shutting the server down.
    Shutdown,
    /// The HTTP session was lost.
    Lost(String),
}

/// Which era of MCP a connection speaks, as its lifecycle settled it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ServerEra {
    /// `initialize` and a session (revisions 2024-11-05 to 2025-11-25).
    Handshake,
    /// `server/discover` and a self-contained `_meta` on every request (2026-07-28 on).
    Stateless,
}

/// A live connection, shared by the calls that use it.
pub(crate) struct Conn {
    pub(crate) generation: u64,
    pub(crate) peer: Peer<RoleClient>,
    pub(crate) calls: Arc<CallTable>,
    pub(crate) stdio: bool,
    pub(crate) era: ServerEra,
    /// A stdio connection of a session-based revision sends its `tools/call` requests past
    /// rmcp (see `frame`).
    pub(crate) direct: Option<Direct>,
    end: watch::Sender<Option<ConnEnd>>,
}

impl Conn {
    /// Ends the connection with `why`, unless it already ended. Whether this call ended it.
    pub(crate) fn end_with(&self, why: ConnEnd) -> bool {
        self.end.send_if_modified(|end| {
            if end.is_none() {
                *end = Some(why);
                true
            } else {
                false
            }
        })
    }

    /// Resolves when the connection has ended, with why.
    pub(crate) async fn ended(&self) -> ConnEnd {
        let mut rx = self.end.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(end) => end.clone().unwrap_or(ConnEnd::Shutdown),
            Err(_) => ConnEnd::Shutdown,
        }
    }

    /// Why the connection ended, if it has.
    pub(crate) fn end(&self) -> Option<ConnEnd> {
        self.end.borrow().clone()
    }

    /// Whether a request is cancelled by closing its response stream (Streamable HTTP from
    /// 2026-07-28 on), after which nothing more can arrive for it.
    pub(crate) fn cancel_closes_stream(&self) -> bool {
        !self.stdio && self.era == ServerEra::Stateless
    }

    /// Cancels request `id` the way the connection's era and transport want it:
    /// - Streamable HTTP, 2026-07-28: rmcp's typed cancel, which closes the request's response
    ///   stream (that is the cancel; nothing is POSTed);
    /// - otherwise `notifications/cancelled` sent as a raw notification, so that rmcp keeps
    ///   the request pending and whatever the server still sends for it reaches us (see the
    ///   crate docs).
    pub(crate) async fn send_cancel(&self, id: RequestId, reason: &str) {
        let sent = if self.cancel_closes_stream() {
            let param = CancelledNotificationParam::new(Some(id.clone()), Some(reason.to_owned()));
            self.peer.notify_cancelled(param).await
        } else {
            let notification = ClientNotification::CustomNotification(CustomNotification::new(
                "notifications/cancelled",
                Some(json!({"requestId": id, "reason": reason})),
            ));
            self.peer.send_notification(notification).await
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, %id, "cancelling a request failed");
        }
    }
}

/// The last lines a server wrote on stderr, for the detail of a failure.
pub(crate) type StderrTail = Arc<Mutex<VecDeque<String>>>;

/// A spawned stdio server process.
pub(crate) struct Child {
    pub(crate) proc: GroupChild,
    pub(crate) stderr_tail: StderrTail,
    stderr_task: Option<tokio::task::JoinHandle<()>>,
}

impl Child {
    /// Once the process exited: lets the stderr logger read what is left (bounded).
    pub(crate) async fn settle_stderr(&mut self) {
        if let Some(task) = self.stderr_task.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_millis(300), task).await;
        }
    }

    /// What stderr said last, as a suffix for failure details (empty if nothing).
    pub(crate) fn stderr_note(&self) -> String {
        let tail = self.stderr_tail.lock();
        match tail.back() {
            Some(last) => format!("; last stderr line: {last}"),
            None => String::new(),
        }
    }
}

/// How a process ended, in words.
pub(crate) fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => format!("exited ({status})"),
    }
}

/// A connected session, owned by the server's supervisor.
pub(crate) struct ServerSession {
    pub(crate) conn: Arc<Conn>,
    /// Cancelling it stops rmcp's service loop (which closes the server's stdin).
    pub(crate) ct: CancellationToken,
    pub(crate) service: RunningService<RoleClient, ConnectionHandler>,
}

/// Which revision a server is spoken to in: its `protocol` key (see `docs/MCP-BACKEND.md`,
/// "Eras").
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// `"auto"`: the `initialize` handshake (2025-11-25) when the server takes it — a server of
    /// both eras included, so that nothing session-bound is lost for handshake clients —, else
    /// `server/discover` and 2026-07-28.
    Auto,
    /// A pinned revision with a handshake.
    Handshake(ProtocolVersion),
    /// 2026-07-28, pinned.
    Stateless,
}

impl Protocol {
    /// From a server's config: `auto` when absent. The value was checked when the config
    /// loaded; an unknown one is an error here too.
    pub(crate) fn from_config(written: Option<&str>) -> Result<Self, String> {
        match written {
            None | Some("auto") => Ok(Protocol::Auto),
            Some(v) if v == ProtocolVersion::V_2026_07_28.as_str() => Ok(Protocol::Stateless),
            Some(v) => ProtocolVersion::known_up_to(&ProtocolVersion::LATEST_WITH_INITIALIZE)
                .iter()
                .find(|known| known.as_str() == v)
                .map(|known| Protocol::Handshake(known.clone()))
                .ok_or_else(|| format!("unknown MCP revision {v:?} in `protocol`")),
        }
    }
}

/// How one connection's lifecycle runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Lifecycle {
    /// The `initialize` handshake, offering this revision.
    Handshake(ProtocolVersion),
    /// `server/discover`, offering 2026-07-28 (no fallback).
    Discover,
}

impl Lifecycle {
    fn mode(&self) -> ClientLifecycleMode {
        match self {
            Lifecycle::Handshake(_) => ClientLifecycleMode::Initialize,
            Lifecycle::Discover => ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        }
    }

    /// What `initialize` offers (unused by `server/discover`, which offers 2026-07-28).
    fn offer(&self) -> ProtocolVersion {
        match self {
            Lifecycle::Handshake(v) => v.clone(),
            Lifecycle::Discover => ProtocolVersion::LATEST_WITH_INITIALIZE,
        }
    }

    /// The lifecycle's request, for messages.
    fn method(&self) -> &'static str {
        match self {
            Lifecycle::Handshake(_) => "initialize",
            Lifecycle::Discover => "server/discover",
        }
    }
}

/// Why a start failed.
#[derive(Debug)]
pub(crate) enum StartError {
    /// The command could not be run at all (not found, not executable): retrying the same
    /// command will not help until something outside changes.
    Spawn(String),
    /// The server answered the lifecycle's request with a refusal (a JSON-RPC error, no
    /// revision in common), or closed the connection on it (a server of one era may exit on
    /// the other era's first request): it may not speak what was offered.
    Refused(String),
    /// Anything else: the connection, the lifecycle, `tools/list`.
    Other(String),
}

impl StartError {
    /// What went wrong, in words.
    pub(crate) fn detail(self) -> String {
        match self {
            StartError::Spawn(d) | StartError::Refused(d) | StartError::Other(d) => d,
        }
    }
}

/// A failed lifecycle as a [`StartError`]: a refusal when the server answered it.
fn lifecycle_failed(context: String, error: ClientInitializeError) -> StartError {
    let refused = matches!(
        error,
        ClientInitializeError::JsonRpcError(_)
            | ClientInitializeError::NoCompatibleProtocolVersion { .. }
            | ClientInitializeError::ExpectedInitResult(_)
            | ClientInitializeError::ConnectionClosed(_)
    );
    let detail = format!("{context}: {error}");
    if refused {
        StartError::Refused(detail)
    } else {
        StartError::Other(detail)
    }
}

impl From<String> for StartError {
    fn from(detail: String) -> Self {
        StartError::Other(detail)
    }
}

/// Spawns or connects, then the lifecycle (`server/discover` or `initialize`) and `tools/list`. A spawned child is put in
/// `child_slot` before anything is awaited, so the caller still holds it (to kill and reap it)
/// when this future fails or is dropped by the start-up timeout.
pub(crate) async fn connect(
    endpoint: &Endpoint,
    server: &Arc<str>,
    generation: u64,
    lifecycle: &Lifecycle,
    opts: &McpOptions,
    link: Arc<Link>,
    child_slot: &mut Option<Child>,
) -> Result<(ServerSession, Vec<Tool>), StartError> {
    let max_message_bytes = opts.max_message_bytes;
    let calls = CallTable::new(server.clone());
    let handler = ConnectionHandler {
        calls: calls.clone(),
        link,
        forward: opts.forward_client_features,
        offer: lifecycle.offer(),
    };
    let ct = CancellationToken::new();
    let mut direct = None;
    let service = match endpoint {
        Endpoint::Stdio {
            program,
            args,
            env,
            cwd,
        } => {
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args)
                .envs(env)
                .current_dir(cwd)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut proc = GroupChild::spawn(cmd).map_err(|e| {
                StartError::Spawn(format!(
                    "cannot run {} (in {}): {e}",
                    program.display(),
                    cwd.display()
                ))
            })?;
            let (Some(stdin), Some(stdout), Some(stderr)) =
                (proc.take_stdin(), proc.take_stdout(), proc.take_stderr())
            else {
                return Err(StartError::Other("the child's pipes are missing".into()));
            };
            let stderr_tail: StderrTail = Arc::default();
            let stderr_task = tokio::spawn(log_stderr(stderr, server.clone(), stderr_tail.clone()));
            *child_slot = Some(Child {
                proc,
                stderr_tail,
                stderr_task: Some(stderr_task),
            });
            let hooks = Hooks {
                on_bad: {
                    let calls = calls.clone();
                    Arc::new(move |bad| calls.bad_frame(bad))
                },
                on_progress: {
                    let calls = calls.clone();
                    Arc::new(move |progress| calls.progress_now(progress))
                },
            };
            let guarded = frame::guard(stdout, stdin, max_message_bytes, hooks);
            direct = Some(guarded.direct());
            let transport = InOrder::new(guarded, calls.clone());
            serve_client_with_lifecycle_and_ct(handler, transport, lifecycle.mode(), ct.clone())
                .await
                .map_err(|e| lifecycle_failed(format!("{} failed", lifecycle.method()), e))?
        }
        Endpoint::Http { url, headers } => {
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(headers.clone())
                .max_sse_event_size(max_message_bytes);
            // rmcp re-opens a broken response stream forever by default, so a call whose
            // server died would wait forever: give up after a few tries instead.
            let mut retry = ExponentialBackoff::default();
            retry.max_times = Some(3);
            retry.base_duration = std::time::Duration::from_millis(500);
            retry.max_delay = Some(std::time::Duration::from_secs(2));
            config.retry_config = Arc::new(retry);
            let transport = InOrder::new(
                StreamableHttpClientTransport::from_config(config),
                calls.clone(),
            );
            serve_client_with_lifecycle_and_ct(handler, transport, lifecycle.mode(), ct.clone())
                .await
                .map_err(|e| {
                    lifecycle_failed(
                        format!("cannot connect to {url} ({})", lifecycle.method()),
                        e,
                    )
                })?
        }
    };
    let era = match service.peer().peer_info() {
        Some(info) if !info.protocol_version.has_initialize() => ServerEra::Stateless,
        _ => ServerEra::Handshake,
    };
    let tools = service
        .peer()
        .list_all_tools()
        .await
        .map_err(|e| format!("tools/list failed: {e}"))?;
    let conn = Arc::new(Conn {
        generation,
        peer: service.peer().clone(),
        calls,
        stdio: endpoint.is_stdio(),
        era,
        // A 2026-07-28 request carries rmcp's per-request `_meta` envelope: through rmcp.
        direct: direct.filter(|_| era == ServerEra::Handshake),
        end: watch::Sender::new(None),
    });
    Ok((ServerSession { conn, ct, service }, tools))
}

/// Logs a server's stderr line by line (each line capped) and keeps the last few lines.
async fn log_stderr(stderr: impl AsyncRead + Unpin, server: Arc<str>, tail: StderrTail) {
    const MAX_LINE: usize = 4096;
    const TAIL: usize = 5;
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        let (take, complete) = {
            let Ok(buf) = reader.fill_buf().await else {
                break;
            };
            if buf.is_empty() {
                break;
            }
            let newline = buf.iter().position(|b| *b == b'\n');
            let take = newline.map_or(buf.len(), |i| i + 1);
            let room = MAX_LINE.saturating_sub(line.len());
            line.extend_from_slice(&buf[..take.min(room)]);
            (take, newline.is_some() || line.len() >= MAX_LINE)
        };
        reader.consume(take);
        if complete {
            let text = String::from_utf8_lossy(&line).trim_end().to_owned();
            line.clear();
            if text.is_empty() {
                continue;
            }
            tracing::info!(target: "toolwarden_mcp::stderr", server = %server, "{text}");
            let mut tail = tail.lock();
            if tail.len() == TAIL {
                tail.pop_front();
            }
            tail.push_back(text);
        }
    }
}
