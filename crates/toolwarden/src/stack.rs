//! The wiring every local command shares: the config, the engine built from it, the `exec`
//! tool and the MCP servers, and their orderly shutdown.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::future::join_all;
use toolwarden_core::{Config, ConfigOrigin, Engine, ToolOrigin};
use toolwarden_exec::{ExecBackend, ExecConfigError, ExecSettings};
use toolwarden_http::TokenPrincipal;
use toolwarden_http::oauth::{JwksSource, OAuthSettings};
use toolwarden_mcp::{McpServer, ReadyError};
use toolwarden_protocol::{
    AuthToken, DurationValue, EventKind, Principal, Scope, Scopes, ServerConfig, ServerStateKind,
};
use toolwarden_redis::{Options as RedisOptions, RedisShared};
use toolwarden_store::{OpenError, Opened, StoreOptions};

use crate::exit::usage;
use crate::say::say;

/// The bearer token's variable when `[http] token_env` is not set.
pub(crate) const DEFAULT_TOKEN_ENV: &str = "TOOLWARDEN_TOKEN";
/// The HTTP API's address when `[http] listen` is not set.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:7420";
/// How long stopping the work may take beyond the longest `cancel_grace` before shutdown gives
/// up waiting (exec's forced stop takes at most one more second).
const SHUTDOWN_SLACK: Duration = Duration::from_secs(3);
/// Waiting for a server whose `startup_timeout` is `0` (no cap) is still bounded, by this.
const UNCAPPED_STARTUP_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Loads the config (`--config`, `$TOOLWARDEN_CONFIG`, `./toolwarden.toml`, built-in defaults)
/// and prints its warnings on stderr. A config error is a usage error (exit 2).
pub(crate) fn load_config(explicit: Option<&Path>) -> anyhow::Result<Config> {
    let mut config = match Config::load(explicit) {
        Ok(config) => config,
        Err(e) => usage!("{e}"),
    };
    // The binary registers no in-process tool: a `[tools]` key that is not `SERVER__…` or
    // `exec` applies to nothing.
    let unattached = config.unattached_tool_warnings(&[]);
    config.warnings.extend(unattached);
    // In file order, the environment's (no line) last, as the config's own are.
    config
        .warnings
        .sort_by_key(|w| w.line.unwrap_or(usize::MAX));
    for warning in &config.warnings {
        say!("warning: {warning}");
    }
    Ok(config)
}

/// The directory relative paths of the config resolve against: the config file's directory,
/// else the working directory.
pub(crate) fn base_dir(config: &Config) -> anyhow::Result<PathBuf> {
    let dir = match &config.origin {
        ConfigOrigin::File(path) => match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        },
        ConfigOrigin::Builtin => PathBuf::from("."),
    };
    std::fs::canonicalize(&dir).with_context(|| format!("cannot resolve {}", dir.display()))
}

/// The name of the variable holding the HTTP API's bearer token.
pub(crate) fn token_env(config: &Config) -> &str {
    config
        .file
        .http
        .token_env
        .as_deref()
        .unwrap_or(DEFAULT_TOKEN_ENV)
}

/// The bearer token, if its variable is set and not empty.
pub(crate) fn token(config: &Config) -> Option<String> {
    std::env::var(token_env(config))
        .ok()
        .filter(|t| !t.is_empty())
}

/// The configured listen address as written.
pub(crate) fn listen(config: &Config) -> &str {
    config.file.http.listen.as_deref().unwrap_or(DEFAULT_LISTEN)
}

/// Where `config` was read from, for messages.
pub(crate) fn describe_origin(config: &Config) -> String {
    match &config.origin {
        ConfigOrigin::File(path) => path.display().to_string(),
        ConfigOrigin::Builtin => "built-in defaults (no config file)".to_owned(),
    }
}

/// Where the audit trail is and how it is kept, as the config says (`None`: `[store] enabled =
/// false`).
pub(crate) fn store_options(
    config: &Config,
    base_dir: &Path,
) -> anyhow::Result<Option<StoreOptions>> {
    let store = &config.file.store;
    if store.enabled == Some(false) {
        return Ok(None);
    }
    let config_file = match &config.origin {
        ConfigOrigin::File(path) => Some(path.as_path()),
        ConfigOrigin::Builtin => None,
    };
    let path = match store.path.as_deref() {
        _ if store.url.is_some() => PathBuf::new(),
        Some("") => usage!(
            "{}",
            key_error(config, "store", "path", "must not be empty")
        ),
        Some(path) => base_dir.join(path),
        None => match toolwarden_store::default_path() {
            Some(path) => path,
            None => usage!(
                "{}",
                key_error(
                    config,
                    "store",
                    "path",
                    "no platform data directory to keep the audit trail in ($HOME is not set); set [store] path"
                )
            ),
        },
    };
    let mut options = StoreOptions::new(path);
    if let Some(url) = &store.url {
        options.url = Some(url.clone());
        options.replica = toolwarden_store::default_replica(config_file);
    }
    options.durability = store.durability.unwrap_or_default();
    if let Some(size) = store.max_payload {
        options.max_payload = usize::try_from(size.bytes()).unwrap_or(usize::MAX);
    }
    if let Some(keys) = &store.mask_keys {
        options.mask_keys = keys.clone();
    }
    if let Some(retain) = store.retain {
        let retain = retain.duration();
        options.retain = (!retain.is_zero()).then_some(retain);
    }
    if let Some(lease) = store.lease {
        options.lease = lease.duration();
    }
    Ok(Some(options))
}

/// Opens the audit trail. A directory that cannot be created is a config error (exit 2) naming
/// `store.path`; a damaged, newer or busy database is an error (exit 1) naming the file (or the
/// PostgreSQL database).
pub(crate) fn open_store(config: &Config, options: StoreOptions) -> anyhow::Result<Opened> {
    match toolwarden_store::open(options) {
        Ok(store) => Ok(store),
        Err(e @ OpenError::CreateDir { .. }) => {
            usage!("{}", key_error(config, "store", "path", &e.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// What a command can do when another process writes its audit trail (one process writes a
/// trail file at a time): `instead`, the command's own way out, follows the store's error.
pub(crate) fn trail_in_use(e: anyhow::Error, instead: &str) -> anyhow::Error {
    match e.downcast_ref::<OpenError>() {
        Some(OpenError::InUse { .. }) => anyhow::anyhow!("{e}; {instead}"),
        _ => e,
    }
}

/// One line about the audit trail: where it is, its durability, and what recovery recorded.
pub(crate) fn describe_store(stack: &Stack) -> String {
    let Some(store) = &stack.store else {
        return "audit trail: off ([store] enabled = false)".to_owned();
    };
    let durability = match store.store.durability() {
        toolwarden_protocol::StoreDurability::BeforeExecution => "before_execution",
        toolwarden_protocol::StoreDurability::Async => "async",
    };
    let recovered = match store.interrupted {
        0 => String::new(),
        1 => "; 1 call an earlier run left running was recorded as interrupted".to_owned(),
        n => format!("; {n} calls an earlier run left running were recorded as interrupted"),
    };
    format!("audit trail: {} ({durability}){recovered}", store.location)
}

/// How this replica takes a dead one over (the trail's survivor found it): it records the
/// events that end the dead replica's open calls as its own — so they reach the trail, every
/// replica's `/v1/events` and the dashboards — and frees at once what the dead one held in Redis.
fn survivor(engine: &Engine, redis: Option<RedisShared>) -> toolwarden_store::Survivor {
    let engine = engine.clone();
    let runtime = tokio::runtime::Handle::try_current().ok();
    let taken = prometheus_client::metrics::counter::Counter::<u64>::default();
    engine.metrics().register(
        "replica_takeovers",
        "Dead replicas (their lease ran out) whose open calls this replica recorded as interrupted",
        taken.clone(),
    );
    Box::new(move |takeover: toolwarden_store::Takeover| {
        taken.inc();
        let bus = engine.events();
        let mut last = 0;
        for event in takeover.events {
            last = bus.emit(&event.scope, event.kind);
        }
        if let (Some(redis), Some(name), Some(runtime)) = (&redis, takeover.name, &runtime) {
            let redis = redis.clone();
            runtime.spawn(async move {
                match redis.release_replica(&name).await {
                    Some(freed) => tracing::info!(replica = %name, freed, "freed what a dead replica held in Redis"),
                    None => tracing::warn!(replica = %name, "could not free what a dead replica held in Redis: it frees itself at its TTLs"),
                }
            });
        }
        last
    })
}

/// An engine, its `exec` tool and its MCP servers.
pub(crate) struct Stack {
    pub(crate) engine: Engine,
    pub(crate) config: Arc<Config>,
    pub(crate) base_dir: PathBuf,
    pub(crate) servers: Vec<Arc<McpServer>>,
    /// The audit trail, when the command records.
    pub(crate) store: Option<Opened>,
    /// The span exporter, when `[otel] endpoint` is set and the command records.
    traces: parking_lot::Mutex<Option<toolwarden_otel::ExportHandle>>,
}

/// Whether a command records its calls in the audit trail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecordCalls {
    /// Opens the trail (unless `[store] enabled = false`).
    Yes,
    /// Runs no call that needs recording (`check`).
    No,
}

impl Stack {
    /// Builds the engine from `config` (policies, headless, interaction ceiling), opens the audit
    /// trail when `record` says so, and registers `exec` when `[exec] enabled`. Starts no server.
    pub(crate) fn build(
        config: Config,
        headless: bool,
        record: RecordCalls,
    ) -> anyhow::Result<Stack> {
        let base_dir = base_dir(&config)?;
        let store = match record {
            RecordCalls::Yes => match store_options(&config, &base_dir)? {
                Some(options) => Some(open_store(&config, options)?),
                None => None,
            },
            RecordCalls::No => None,
        };
        let config = Arc::new(config);
        let mut builder = Engine::builder()
            .policies(config.clone())
            .headless(headless)
            .interaction_ceiling(config.interaction_ceiling());
        if let Some(store) = &store {
            builder = builder.store(store.store.clone());
            if let Some(wait) = config.file.store.wait {
                builder = builder.store_wait(wait.duration());
            }
        }
        if config.hooks.is_some() {
            let transport = crate::hooks::HookClient::new(secret_vars(&config))
                .map_err(|e| anyhow::anyhow!("cannot make the hooks' HTTP client: {e}"))?;
            builder = builder.hook_transport(Arc::new(transport));
        }
        let metrics = Arc::new(toolwarden_core::Metrics::new());
        let shared = match (&config.file.redis, record) {
            (Some(redis), RecordCalls::Yes) => Some(connect_redis(&config, redis, &metrics)?),
            _ => None,
        };
        if let Some(shared) = &shared {
            builder = builder.shared(Arc::new(shared.clone()));
        }
        let endpoint = config
            .file
            .otel
            .as_ref()
            .and_then(|o| o.endpoint.clone())
            .filter(|_| record == RecordCalls::Yes);
        // The exporter names attempt spans from the engine's registry, which exists only once
        // the engine that gets the exporter's sink is built.
        let built: Arc<std::sync::OnceLock<Engine>> = Arc::default();
        let traces = endpoint.map(|endpoint| {
            let engine = built.clone();
            let (sink, handle) = toolwarden_otel::start(
                toolwarden_otel::OtelOptions::new(endpoint),
                Arc::new(move |tool: &str| engine.get().and_then(|e| e.tool_backing(tool))),
            );
            builder = std::mem::take(&mut builder).trace_sink(sink.clone());
            (sink, handle)
        });
        let engine = builder.metrics(metrics).build();
        let _ = built.set(engine.clone());
        if let Some(shared) = &shared {
            shared.attach(engine.clone())?;
        }
        if let Some(liveness) = store.as_ref().and_then(|s| s.liveness.as_ref()) {
            if let Some(shared) = &shared {
                liveness.set_name(shared.replica());
            }
            liveness.survive_with(survivor(&engine, shared.clone()));
            // Back after being declared dead: the turns a survivor ended stop here (their
            // outcome is its `interrupted`; whatever they would still do is not recorded).
            let stopping = engine.clone();
            liveness.on_rejoin(Box::new(move |turns: &[String]| {
                for turn in turns {
                    let turn = toolwarden_protocol::TurnId::from(turn.as_str());
                    if stopping
                        .abort_turn(&turn, toolwarden_protocol::CancelReason::Shutdown)
                        .is_ok()
                    {
                        tracing::warn!(turn = %turn, "stopped a turn a survivor recorded as interrupted while this replica was declared dead");
                    }
                }
            }));
        }
        let traces = traces.map(|(sink, handle)| {
            sink.register_metrics(engine.metrics());
            handle
        });
        if let Some(exec) = config.file.exec.as_ref().filter(|e| e.enabled) {
            let mut settings = match ExecSettings::from_config(exec, &base_dir) {
                Ok(settings) => settings,
                Err(e) => usage!("{}", exec_error(&config, &e)),
            };
            // The tokens would let a command answer its own approvals over the API.
            for var in secret_vars(&config) {
                if !settings.env_remove.contains(&var) {
                    settings.env_remove.push(var);
                }
            }
            engine.add_tools(
                ToolOrigin::Exec,
                Arc::new(ExecBackend::new(settings)),
                vec![ExecBackend::tool_spec()],
            );
        }
        Ok(Stack {
            engine,
            config,
            base_dir,
            servers: Vec::new(),
            store,
            traces: parking_lot::Mutex::new(traces),
        })
    }

    /// The enabled servers of the config, by name.
    pub(crate) fn enabled_servers(&self) -> Vec<(String, ServerConfig)> {
        self.config
            .file
            .servers
            .iter()
            .filter(|(_, s)| s.enabled != Some(false))
            .map(|(name, s)| (name.clone(), s.clone()))
            .collect()
    }

    /// Starts the enabled servers `wanted` accepts; they report to the engine as they come up.
    /// The tools' pins are read back from the audit trail first, so that a definition a server
    /// changed since is noticed when it is first listed.
    pub(crate) async fn start_servers(&mut self, wanted: impl Fn(&str) -> bool) {
        if let Err(e) = self.engine.load_pins().await {
            tracing::warn!(
                error = %e.0,
                "the tool pins could not be read from the audit trail: each tool is pinned anew as its server lists it"
            );
        }
        let host = self.engine.host(self.config.prefixed());
        for (name, cfg) in self.enabled_servers() {
            if wanted(&name) {
                let server = McpServer::start(name, cfg, host.clone(), self.base_dir.clone());
                self.servers.push(server);
            }
        }
    }

    /// Waits for every started server to be up or to fail its start, each at most its
    /// `startup_timeout` (plus a second); answers in start order.
    pub(crate) async fn wait_ready(&self) -> Vec<(String, Result<(), ReadyError>)> {
        let waits = self.servers.iter().map(|server| {
            let name = server.server_name().to_owned();
            let bound = self
                .config
                .file
                .servers
                .get(&name)
                .and_then(|s| s.startup_timeout)
                .map_or(toolwarden_mcp::DEFAULT_STARTUP_TIMEOUT, |d| d.duration());
            let bound = if bound.is_zero() {
                UNCAPPED_STARTUP_WAIT
            } else {
                bound + Duration::from_secs(1)
            };
            async move { (name, server.wait_ready(bound).await) }
        });
        join_all(waits).await
    }

    /// How long shutting down may wait for running work to stop.
    pub(crate) fn shutdown_wait(&self) -> Duration {
        let grace = self
            .engine
            .tools()
            .iter()
            .map(|t| t.policy.cancel_grace)
            .max()
            .unwrap_or_default();
        grace + SHUTDOWN_SLACK
    }

    /// Ends every running call (`cancelled{shutdown}`), waits for their work to stop, then shuts
    /// every server down (process groups killed and reaped). Returns whether all work stopped
    /// within the wait.
    pub(crate) async fn shutdown(&self) -> bool {
        let stopped = self.engine.shutdown(self.shutdown_wait()).await;
        self.shutdown_servers().await;
        self.close_store().await;
        self.close_traces().await;
        stopped
    }

    /// Sends the spans still queued and stops the exporter. Idempotent.
    pub(crate) async fn close_traces(&self) {
        let handle = self.traces.lock().take();
        if let Some(handle) = handle {
            handle.shutdown().await;
        }
    }

    /// Commits what the audit trail still has queued and closes it. Idempotent.
    pub(crate) async fn close_store(&self) {
        if let Some(store) = &self.store {
            store.store.close().await;
        }
    }

    /// Shuts every server down now (requests in flight cancelled, process groups killed and
    /// reaped), without waiting for running calls to stop first. Idempotent.
    pub(crate) async fn shutdown_servers(&self) {
        join_all(self.servers.iter().map(|s| s.shutdown())).await;
    }
}

/// The state shared with other replicas through Redis (`[redis]`); a bad table is a usage error.
fn connect_redis(
    config: &Config,
    redis: &toolwarden_protocol::RedisConfig,
    metrics: &toolwarden_core::Metrics,
) -> anyhow::Result<RedisShared> {
    let mut options = match RedisOptions::from_config(redis) {
        Ok(options) => options,
        Err(e @ toolwarden_redis::OptionsError::ZeroTimeout) => {
            usage!("{}", key_error(config, "redis", "timeout", &e.to_string()))
        }
        Err(e) => usage!("{}", key_error(config, "redis", "url", &e.to_string())),
    };
    // The replica's name in other replicas' listings starts with its id in the trail, when set.
    options.label = std::env::var(toolwarden_store::REPLICA_ENV).ok();
    Ok(RedisShared::new(options, metrics.shared().clone())?)
}

/// A message about `[table] key` as a config diagnostic: `FILE:LINE: table.key: message`.
fn key_error(config: &Config, table: &str, key: &str, message: &str) -> String {
    let file = describe_origin(config);
    let line = match &config.origin {
        ConfigOrigin::File(path) => std::fs::read_to_string(path)
            .ok()
            .and_then(|src| line_of(&src, table, key)),
        ConfigOrigin::Builtin => None,
    };
    match line {
        Some(line) => format!("{file}:{line}: {table}.{key}: {message}"),
        None => format!("{file}: {table}.{key}: {message}"),
    }
}

/// Prints every server state change on stderr — one line each, with the tool count once a
/// server is up (the MCP backend logs its state changes only at `debug`) — until the engine is
/// gone. Start it before the servers, so that it sees every state they report.
pub(crate) fn report_servers(engine: &Engine) -> tokio::task::JoinHandle<()> {
    let events = engine
        .events()
        .subscribe_matching(|e| matches!(e.kind, EventKind::ServerState { .. }));
    tokio::spawn(print_server_states(engine.clone(), events))
}

async fn print_server_states(engine: Engine, mut events: toolwarden_core::Matching) {
    while let Some(event) = events.recv().await {
        let EventKind::ServerState {
            server,
            state,
            detail,
        } = &event.kind
        else {
            continue;
        };
        match state {
            ServerStateKind::Up => {
                let tools = engine.tools();
                let own = tools.iter().filter(|t| &t.backend == server).count();
                say!(
                    "toolwarden: server {server:?} is up: {own} tools ({} tools in all)",
                    tools.len()
                );
            }
            ServerStateKind::Down => say!(
                "toolwarden: server {server:?} is down{}",
                detail
                    .as_deref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default()
            ),
            ServerStateKind::Failed => say!(
                "toolwarden: server {server:?} cannot start{}; its tools' calls fail at once, and it is tried again on a backoff",
                detail
                    .as_deref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default()
            ),
            ServerStateKind::Restarted => say!(
                "toolwarden: server {server:?} restarted{}",
                detail
                    .as_deref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default()
            ),
            ServerStateKind::Starting => {}
        }
    }
}

/// An `[exec]` error as a config diagnostic: `FILE:LINE: exec.KEY: message`.
fn exec_error(config: &Config, err: &ExecConfigError) -> String {
    let key = match err {
        ExecConfigError::EmptyShell => "exec.shell",
        ExecConfigError::BaseDir { .. } => "exec",
        _ => "exec.allowed_roots",
    };
    let file = describe_origin(config);
    let line = match &config.origin {
        ConfigOrigin::File(path) => std::fs::read_to_string(path)
            .ok()
            .and_then(|src| line_of(&src, "exec", key.rsplit('.').next().unwrap_or(key))),
        ConfigOrigin::Builtin => None,
    };
    match line {
        Some(line) => format!("{file}:{line}: {key}: {err}"),
        None => format!("{file}: {key}: {err}"),
    }
}

/// The line of `key` in table `[table]` of a TOML text (a plain reading: good enough to point at
/// a key the loader already accepted).
fn line_of(src: &str, table: &str, key: &str) -> Option<usize> {
    let header = format!("[{table}]");
    let mut inside = false;
    for (i, line) in src.lines().enumerate() {
        let t = line.trim();
        if t.starts_with('[') {
            inside = t == header;
            if inside && key == table {
                return Some(i + 1);
            }
            continue;
        }
        let written = t.split('=').next().unwrap_or_default().trim();
        if inside && written == key {
            return Some(i + 1);
        }
    }
    None
}

/// The variable naming the principal of `toolwarden mcp` and `toolwarden call`.
pub(crate) const PRINCIPAL_ENV: &str = "TOOLWARDEN_PRINCIPAL";

/// Who runs `toolwarden mcp` or `toolwarden call` here: `--principal`, else
/// `$TOOLWARDEN_PRINCIPAL`, else the OS user's name. It has the scopes of the `[[auth.tokens]]`
/// entry of that name (as over HTTP: its `scopes`, else `call`), else every scope (whoever runs toolwarden here could run the tools
/// without it).
pub(crate) fn cli_principal(config: &Config, flag: Option<&str>) -> anyhow::Result<Principal> {
    let from_env = std::env::var(PRINCIPAL_ENV).ok().filter(|v| !v.is_empty());
    let (name, from) = match (flag, from_env) {
        (Some(name), _) => (name.to_owned(), "--principal"),
        (None, Some(name)) => (name, PRINCIPAL_ENV),
        (None, None) => (os_user(), "the OS user"),
    };
    if !toolwarden_core::config::principal_name_ok(&name) {
        usage!(
            "{from}: {name:?} is not a principal's name (1 to 128 characters without spaces or control characters)"
        );
    }
    let scopes = config
        .file
        .auth
        .tokens
        .iter()
        .find(|t| t.principal.as_deref() == Some(name.as_str()))
        .map_or_else(Scopes::all, entry_scopes);
    Ok(Principal::new(name, scopes))
}

/// The OS user's name (`local` when it has none).
fn os_user() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .filter(|n| toolwarden_core::config::principal_name_ok(n))
        .unwrap_or_else(|| toolwarden_protocol::LOCAL_PRINCIPAL.to_owned())
}

/// The scopes a `[[auth.tokens]]` entry grants: its `scopes`, else `call`.
pub(crate) fn entry_scopes(entry: &AuthToken) -> Scopes {
    match &entry.scopes {
        Some(names) => names.iter().filter_map(|n| Scope::parse(n)).collect(),
        None => [Scope::Call].into_iter().collect(),
    }
}

/// The token principals of `[[auth.tokens]]`. A `token_env` whose variable is not set is an
/// error: its principal could never be let in, and nothing else would say so. So is a token
/// given to two entries, or one that is also `[http] token_env`'s: it would name one principal
/// where the config names two.
pub(crate) fn token_principals(config: &Config) -> anyhow::Result<Vec<TokenPrincipal>> {
    let mut out: Vec<TokenPrincipal> = Vec::new();
    let single = token(config).filter(|t| !t.is_empty()).map(|t| {
        TokenPrincipal::new(
            &t,
            Principal::new(toolwarden_protocol::DEFAULT_PRINCIPAL, Scopes::all()),
        )
    });
    let taken = |out: &[TokenPrincipal], new: &TokenPrincipal| {
        out.iter()
            .chain(single.as_ref())
            .find(|t| t.digest() == new.digest())
            .map(|t| t.principal.name.clone())
    };
    for (i, entry) in config.file.auth.tokens.iter().enumerate() {
        let name = entry.principal.clone().unwrap_or_default();
        let principal = Principal::new(name, entry_scopes(entry));
        match (&entry.token_sha256, &entry.token_env) {
            (Some(hex), _) => match decode_hex(hex) {
                Some(digest) => out.push(TokenPrincipal::from_digest(digest, principal)),
                None => usage!("auth.tokens[{i}].token_sha256: expected 64 hex digits"),
            },
            (None, Some(var)) => match std::env::var(var).ok().filter(|t| !t.is_empty()) {
                Some(token) => out.push(TokenPrincipal::new(&token, principal)),
                None => usage!(
                    "{}: auth.tokens[{i}].token_env: the variable {var} (principal {:?}'s token) is not set",
                    describe_origin(config),
                    &*principal.name
                ),
            },
            (None, None) => usage!("auth.tokens[{i}]: needs token_sha256 or token_env"),
        }
        if let Some(new) = out.last()
            && let Some(other) = taken(&out[..out.len() - 1], new)
        {
            usage!(
                "{}: auth.tokens[{i}]: principal {:?}'s token is also {:?}'s; give each principal its own token",
                describe_origin(config),
                &*new.principal.name,
                &*other
            );
        }
    }
    Ok(out)
}

/// 32 bytes from 64 hex digits.
pub(crate) fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// `[auth.oauth]`, resolved against the config file's directory and the listen address.
pub(crate) fn oauth_settings(
    config: &Config,
    listen: &str,
) -> anyhow::Result<Option<OAuthSettings>> {
    let Some(oauth) = &config.file.auth.oauth else {
        return Ok(None);
    };
    let jwks = match (&oauth.jwks_url, &oauth.jwks_file) {
        (Some(url), _) => JwksSource::Url(url.clone()),
        (None, Some(file)) => JwksSource::File(base_dir(config)?.join(file)),
        (None, None) => usage!("[auth.oauth] needs jwks_url or jwks_file"),
    };
    Ok(Some(OAuthSettings {
        issuer: oauth.issuer.clone().unwrap_or_default(),
        audience: oauth.audience.clone().unwrap_or_default(),
        jwks,
        resource: oauth
            .resource
            .clone()
            .unwrap_or_else(|| format!("http://{listen}/mcp")),
        principal_claim: oauth
            .principal_claim
            .clone()
            .unwrap_or_else(|| "sub".into()),
        scopes_claim: oauth.scopes_claim.clone().unwrap_or_else(|| "scope".into()),
        leeway: oauth
            .leeway
            .map_or(Duration::from_secs(60), DurationValue::duration),
    }))
}

/// The variables that hold the API's tokens: no command toolwarden runs (exec, hooks) sees
/// them, or it could answer its own approvals over the API.
fn secret_vars(config: &Config) -> Vec<String> {
    std::iter::once(token_env(config).to_owned())
        .chain(
            config
                .file
                .auth
                .tokens
                .iter()
                .filter_map(|t| t.token_env.clone()),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_keys_are_found_by_line() {
        let src = "[defaults]\nshell = 1\n\n[exec]\nenabled = true\nallowed_roots = [\"x\"]\n";
        assert_eq!(line_of(src, "exec", "allowed_roots"), Some(6));
        assert_eq!(line_of(src, "exec", "shell"), None);
        assert_eq!(line_of(src, "exec", "exec"), Some(4));
    }
}
