//! The load-time checks (docs/CONFIG.md, "Invariants and diagnostics"): the errors that make a
//! config unusable and the warnings about values that are used but not as written. Each points at
//! the table where the user wrote the value.

use std::time::Duration;

use toolwarden_protocol::{
    BackoffConfig, BreakerConfig, ConfigFile, DEFAULT_PRINCIPAL, DurationValue, LOCAL_PRINCIPAL,
    LoopConfig, MCP_REVISIONS, Policy, PolicyConfig, Scope, ServerConfig, SizeValue,
    format_duration,
};

use super::diag::{
    ConfigDiagnostic, ConfigError, ConfigErrorKind, Seg, SourceMap, closest, format_path, path,
};
use super::names::{EXEC_TOOL, RESERVED_SERVER, TOOL_TIMEOUT_ENV, ceiling};

/// Collects warnings and errors for one file.
pub(crate) struct Checker<'a> {
    file: &'a str,
    map: &'a SourceMap,
    pub(crate) warnings: Vec<ConfigDiagnostic>,
    errors: Vec<ConfigError>,
}

/// Where a timeout that applies to a table comes from, for messages.
#[derive(Clone, Copy)]
struct Inherited<'s> {
    timeout: Duration,
    from: &'s str,
}

impl<'a> Checker<'a> {
    pub(crate) fn new(file: &'a str, map: &'a SourceMap) -> Self {
        Self {
            file,
            map,
            warnings: Vec::new(),
            errors: Vec::new(),
        }
    }

    pub(crate) fn diag(&self, at: &[Seg], message: String) -> ConfigDiagnostic {
        ConfigDiagnostic {
            file: self.file.to_owned(),
            key: format_path(at),
            line: self.map.line(at),
            message,
        }
    }

    pub(crate) fn error(&self, kind: ConfigErrorKind, at: &[Seg], message: String) -> ConfigError {
        ConfigError {
            kind,
            diagnostic: self.diag(at, message),
        }
    }

    fn warn(&mut self, at: &[Seg], message: String) {
        let d = self.diag(at, message);
        self.warnings.push(d);
    }

    fn fail(&mut self, kind: ConfigErrorKind, at: &[Seg], message: String) {
        let e = self.error(kind, at, message);
        self.errors.push(e);
    }

    /// Runs every check. The first error in file order wins; warnings are kept for the caller.
    pub(crate) fn check(
        &mut self,
        file: &ConfigFile,
        timeout_from_env: bool,
    ) -> Result<(), ConfigError> {
        self.servers(file);
        self.prefix(file);
        self.tool_keys(file);
        self.policies(file, timeout_from_env);
        self.top_level(file);
        self.auth(file);
        self.rules_shell(file);
        match self
            .errors
            .iter()
            .min_by_key(|e| e.diagnostic.line.unwrap_or(usize::MAX))
        {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn servers(&mut self, file: &ConfigFile) {
        for (name, server) in &file.servers {
            let at = path(&["servers", name]);
            if name.is_empty() {
                self.fail(
                    ConfigErrorKind::InvalidServer,
                    &at,
                    "a server needs a non-empty name".to_owned(),
                );
            } else if name.contains("__") {
                self.fail(
                    ConfigErrorKind::InvalidServer,
                    &at,
                    format!(
                        "server name {name:?} must not contain \"__\": tools are exposed as SERVER__TOOL, split at the first \"__\"; rename it, e.g. {:?}",
                        name.replace("__", "_")
                    ),
                );
            } else if name == RESERVED_SERVER {
                self.fail(
                    ConfigErrorKind::InvalidServer,
                    &at,
                    format!(
                        "server name {name:?} is reserved for toolwarden's own tools ({RESERVED_SERVER}__status); choose another name"
                    ),
                );
            }
            match (&server.command, &server.url) {
                (Some(_), Some(_)) => self.fail(
                    ConfigErrorKind::InvalidServer,
                    &at,
                    format!(
                        "server {name:?} has both command and url: a server is either a child process (command) or a Streamable HTTP endpoint (url); keep one"
                    ),
                ),
                (None, None) => self.fail(
                    ConfigErrorKind::InvalidServer,
                    &at,
                    format!(
                        "server {name:?} has neither command nor url: set command = \"...\" to run it as a child process, or url = \"http://...\" to reach it over Streamable HTTP"
                    ),
                ),
                (Some(command), None) if command.trim().is_empty() => self.fail(
                    ConfigErrorKind::InvalidServer,
                    &path(&["servers", name, "command"]),
                    "command is empty: name the program that runs the server, e.g. \"npx\"".to_owned(),
                ),
                _ => {}
            }
            self.transport_fields(name, server);
            if let Some(v) = server.startup_timeout {
                self.duration(&path(&["servers", name, "startup_timeout"]), v);
            }
            if let Some(p) = &server.protocol
                && p != "auto"
                && !MCP_REVISIONS.contains(&p.as_str())
            {
                self.fail(
                    ConfigErrorKind::InvalidValue,
                    &path(&["servers", name, "protocol"]),
                    format!(
                        "unknown MCP revision {p:?}: expected \"auto\" or one of {}",
                        MCP_REVISIONS.join(", ")
                    ),
                );
            }
            if server.command.is_some() && !server.env_prompt.is_empty() {
                self.warn(
                    &path(&["servers", name, "env_prompt"]),
                    format!(
                        "env_prompt is not acted on yet: server {name:?} starts without asking anyone for {}; give the values in env (e.g. env = {{ VAR = \"${{VAR}}\" }})",
                        server.env_prompt.join(", ")
                    ),
                );
            }
        }
    }

    /// Keys that only one transport uses are warned about on the other: they would be ignored.
    fn transport_fields(&mut self, name: &str, server: &ServerConfig) {
        if server.url.is_some() && server.command.is_none() {
            let unused = [
                ("args", !server.args.is_empty()),
                ("env", !server.env.is_empty()),
                ("cwd", server.cwd.is_some()),
                ("env_prompt", !server.env_prompt.is_empty()),
            ];
            for (key, set) in unused {
                if set {
                    self.warn(
                        &path(&["servers", name, key]),
                        format!(
                            "{key} is ignored: server {name:?} is reached over HTTP (url); {key} only applies to a server run as a child process (command)"
                        ),
                    );
                }
            }
        }
        if server.command.is_some() && server.url.is_none() && !server.headers.is_empty() {
            self.warn(
                &path(&["servers", name, "headers"]),
                format!(
                    "headers is ignored: server {name:?} is run as a child process (command); headers only applies to a server reached over HTTP (url)"
                ),
            );
        }
    }

    fn prefix(&mut self, file: &ConfigFile) {
        if file.gateway.prefix != Some(false) {
            return;
        }
        let enabled: Vec<&str> = file
            .servers
            .iter()
            .filter(|(_, s)| s.enabled != Some(false))
            .map(|(n, _)| n.as_str())
            .collect();
        if enabled.len() > 1 {
            self.fail(
                ConfigErrorKind::Prefix,
                &path(&["gateway", "prefix"]),
                format!(
                    "prefix = false needs exactly one server, but {} are configured ({}): their tools' names could collide; remove prefix = false, or keep one server",
                    enabled.len(),
                    enabled.join(", ")
                ),
            );
        }
    }

    fn tool_keys(&mut self, file: &ConfigFile) {
        let prefixed = file.gateway.prefix != Some(false);
        for key in file.tools.keys() {
            let Some((server, tool)) = key.split_once("__") else {
                continue;
            };
            if server == RESERVED_SERVER {
                continue;
            }
            let at = path(&["tools", key]);
            let known = file.servers.contains_key(server);
            if prefixed && !known {
                let names: Vec<&str> = file.servers.keys().map(String::as_str).collect();
                let hint = match closest(server, names.iter().copied()) {
                    Some(near) => format!("did you mean [tools.\"{near}__{tool}\"]?"),
                    None if names.is_empty() => {
                        "no servers are configured; add [servers.NAME] or fix the name".to_owned()
                    }
                    None => format!("configured servers: {}", names.join(", ")),
                };
                self.fail(
                    ConfigErrorKind::UnknownServer,
                    &at,
                    format!(
                        "names server {server:?} (tools are named SERVER__TOOL), which is not configured; {hint}"
                    ),
                );
            } else if !prefixed && known {
                self.warn(
                    &at,
                    format!(
                        "applies to no tool: with [gateway] prefix = false, tools are exposed without their server's name; write [tools.\"{tool}\"]"
                    ),
                );
            }
        }
    }

    fn policies(&mut self, file: &ConfigFile, timeout_from_env: bool) {
        let ceiling = ceiling(file);
        let builtin = Inherited {
            timeout: Policy::default().timeout,
            from: "the built-in default",
        };
        let defaults_timeout = match (&file.defaults.timeout, timeout_from_env) {
            (Some(v), true) => Inherited {
                timeout: v.duration(),
                from: TOOL_TIMEOUT_ENV,
            },
            (Some(v), false) => Inherited {
                timeout: v.duration(),
                from: "[defaults]",
            },
            (None, _) => builtin,
        };

        // With TOOLWARDEN_TOOL_TIMEOUT, `[defaults].timeout` was written in the environment, not
        // in the file: it is checked there, and the table inherits it.
        let mut defaults = file.defaults.clone();
        let inherited = if timeout_from_env {
            // Checked where it was read (`env_override`); the table inherits it.
            defaults.timeout = None;
            defaults_timeout
        } else {
            builtin
        };
        self.policy(&path(&["defaults"]), &defaults, inherited, ceiling);

        for (name, server) in &file.servers {
            self.policy(
                &path(&["servers", name]),
                &server.policy(),
                defaults_timeout,
                ceiling,
            );
        }
        let exec_policy = file.exec.as_ref().map(|e| e.policy());
        if let Some(exec) = &exec_policy {
            self.policy(&path(&["exec"]), exec, defaults_timeout, ceiling);
        }

        for (key, layer) in &file.tools {
            let parent: Option<(PolicyConfig, String)> = if key == EXEC_TOOL {
                exec_policy.clone().map(|p| (p, "[exec]".to_owned()))
            } else {
                key.split_once("__")
                    .filter(|_| file.gateway.prefix != Some(false))
                    .and_then(|(s, _)| file.servers.get(s).map(|c| (s, c)))
                    .map(|(s, c)| {
                        (
                            c.policy(),
                            format!("[servers.{}]", format_path(&path(&[s]))),
                        )
                    })
            };
            let inherited = match &parent {
                Some((p, label)) => match p.timeout {
                    Some(t) => Inherited {
                        timeout: t.duration(),
                        from: label.as_str(),
                    },
                    None => defaults_timeout,
                },
                None => defaults_timeout,
            };
            self.policy(&path(&["tools", key]), layer, inherited, ceiling);
        }
    }

    /// One table of policy keys: negative numbers, ranges, and the clamps against the timeout
    /// that applies to the table (its own, else the one it inherits).
    fn policy(
        &mut self,
        at: &[Seg],
        p: &PolicyConfig,
        inherited: Inherited<'_>,
        ceiling: Duration,
    ) {
        let key = |k: &str| {
            let mut v = at.to_vec();
            v.push(Seg::Key(k.to_owned()));
            v
        };
        let durations = [
            ("timeout", p.timeout),
            ("idle_timeout", p.idle_timeout),
            ("attempt_timeout", p.attempt_timeout),
            ("max_timeout", p.max_timeout),
            ("cancel_grace", p.cancel_grace),
            ("cache_ttl", p.cache_ttl),
            ("approval_timeout", p.approval_timeout),
            ("task_after", p.task_after),
        ];
        for (k, v) in durations {
            if let Some(v) = v {
                self.duration(&key(k), v);
            }
        }
        if let Some(v) = p.retries {
            self.count(&key("retries"), v);
        }
        if let Some(BackoffConfig {
            initial,
            max,
            multiplier,
        }) = &p.backoff
        {
            let at = key("backoff");
            let sub = |k: &str| {
                let mut v = at.clone();
                v.push(Seg::Key(k.to_owned()));
                v
            };
            for (k, v) in [("initial", initial), ("max", max)] {
                if let Some(v) = v {
                    self.duration(&sub(k), *v);
                }
            }
            if let Some(m) = multiplier {
                if !m.is_finite() {
                    self.fail(
                        ConfigErrorKind::InvalidValue,
                        &sub("multiplier"),
                        format!("multiplier {m} is not a finite number: write e.g. 2.0"),
                    );
                } else if *m < 0.0 {
                    self.warn(
                        &sub("multiplier"),
                        format!("negative value {m} is treated as 0; write 0 or a positive number such as 2.0"),
                    );
                }
            }
        }
        if let Some(BreakerConfig {
            failures,
            window,
            open_for,
        }) = &p.breaker
        {
            let at = key("breaker");
            let sub = |k: &str| {
                let mut v = at.clone();
                v.push(Seg::Key(k.to_owned()));
                v
            };
            if let Some(v) = failures {
                self.count(&sub("failures"), *v);
            }
            for (k, v) in [("window", window), ("open_for", open_for)] {
                if let Some(v) = v {
                    self.duration(&sub(k), *v);
                }
            }
        }
        if let Some(LoopConfig {
            warn_after,
            block_after,
        }) = &p.loop_
        {
            let at = key("loop");
            for (k, v) in [("warn_after", warn_after), ("block_after", block_after)] {
                if let Some(v) = v {
                    let mut at = at.clone();
                    at.push(Seg::Key(k.to_owned()));
                    self.count(&at, *v);
                }
            }
        }
        if let Some(v) = p.max_input {
            self.size(&key("max_input"), v);
        }

        let (timeout, from) = match p.timeout {
            Some(t) => (t.duration(), String::new()),
            None => (inherited.timeout, format!(" (from {})", inherited.from)),
        };
        if !timeout.is_zero() {
            for (k, v) in [
                ("idle_timeout", p.idle_timeout),
                ("attempt_timeout", p.attempt_timeout),
            ] {
                if let Some(v) = v.map(DurationValue::duration).filter(|v| *v > timeout) {
                    self.warn(
                        &key(k),
                        format!(
                            "{k} {} is longer than timeout {}{from}; it is clamped to {}",
                            format_duration(v),
                            format_duration(timeout),
                            format_duration(timeout),
                        ),
                    );
                }
            }
        }
        if let Some(v) = p
            .task_after
            .map(DurationValue::duration)
            .filter(|v| !timeout.is_zero() && *v >= timeout)
        {
            self.warn(
                &key("task_after"),
                format!(
                    "task_after {} is not shorter than timeout {}{from}: with task = \"auto\", calls end before they could become tasks",
                    format_duration(v),
                    format_duration(timeout),
                ),
            );
        }
        if let Some(v) = p
            .approval_timeout
            .map(DurationValue::duration)
            .filter(|v| *v > ceiling)
        {
            self.warn(
                &key("approval_timeout"),
                format!(
                    "approval_timeout {} is longer than interaction_ceiling {}; it is clamped to {}",
                    format_duration(v),
                    format_duration(ceiling),
                    format_duration(ceiling),
                ),
            );
        }
    }

    /// Rules judge `exec` lines as POSIX sh and bash read them: another `[exec] shell` (zsh,
    /// fish, an interpreter) may run what they do not see.
    fn rules_shell(&mut self, file: &ConfigFile) {
        let Some(shell) = file.exec.as_ref().and_then(|e| e.shell.as_deref()) else {
            return;
        };
        let base = shell.rsplit('/').next().unwrap_or(shell);
        if matches!(base, "sh" | "bash" | "dash") {
            return;
        }
        let about_exec = file
            .rules
            .iter()
            .any(|r| r.when.is_some() && r.tools.iter().any(|g| crate::rules::glob(g, EXEC_TOOL)));
        if about_exec {
            self.warn(
                &path(&["exec", "shell"]),
                format!(
                    "rules judge exec lines as sh and bash read them, but commands run with {shell:?}, which may read a line otherwise: a rule's args.commands may not be what runs"
                ),
            );
        }
    }

    fn top_level(&mut self, file: &ConfigFile) {
        if let Some(v) = file.interaction_ceiling {
            let at = path(&["interaction_ceiling"]);
            if v.is_negative() {
                self.duration(&at, v);
            }
            if v.duration().is_zero() {
                self.warn(
                    &at,
                    "interaction_ceiling is 0s: no approval or confirm can be asked, so every call that needs one is denied at once; write e.g. \"15m\"".to_owned(),
                );
            }
        }
        if let Some(v) = file.exec.as_ref().and_then(|e| e.output_limit) {
            self.size(&path(&["exec", "output_limit"]), v);
        }
        if let Some(v) = file.gateway.request_timeout {
            let at = path(&["gateway", "request_timeout"]);
            self.duration(&at, v);
            if v.0 == 0 {
                self.fail(
                    ConfigErrorKind::InvalidValue,
                    &at,
                    "request_timeout must be positive: a forwarded request that a server never answers would wait forever; write e.g. \"30s\"".to_owned(),
                );
            }
        }
        if let Some(v) = file.http.max_body {
            self.size(&path(&["http", "max_body"]), v);
        }
        if let Some(v) = file.store.max_payload {
            self.size(&path(&["store", "max_payload"]), v);
        }
        if let Some(v) = file.store.retain {
            self.duration(&path(&["store", "retain"]), v);
        }
        if let Some(v) = file.store.wait {
            let at = path(&["store", "wait"]);
            self.duration(&at, v);
            if v.0 > 3_600_000 {
                self.fail(
                    ConfigErrorKind::InvalidValue,
                    &at,
                    "wait must be at most 1h: a call waiting for the audit trail holds its turn that long; write e.g. \"5s\" (0 ends such calls at once)".to_owned(),
                );
            }
        }
        if let Some(v) = file.store.lease {
            let at = path(&["store", "lease"]);
            self.duration(&at, v);
            if v.0 < 500 || v.0 > 3_600_000 {
                self.fail(
                    ConfigErrorKind::InvalidValue,
                    &at,
                    "lease must be between 500ms and 1h: a replica renews it three times per lease, and is declared dead once it has gone a whole lease without renewing; write e.g. \"5s\"".to_owned(),
                );
            } else if file.store.url.is_none() {
                self.fail(
                    ConfigErrorKind::InvalidValue,
                    &at,
                    "lease applies to a PostgreSQL trail shared by replicas ([store] url); an SQLite trail has one process, which recovers its own calls when it starts again".to_owned(),
                );
            }
        }
        if let Some(url) = &file.store.url {
            let at = path(&["store", "url"]);
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                self.fail(
                    ConfigErrorKind::InvalidValue,
                    &at,
                    "expected a PostgreSQL URL starting postgres:// or postgresql:// \
                     (postgres://user@host:5432/database)"
                        .to_owned(),
                );
            } else if file.store.path.is_some() {
                self.fail(
                    ConfigErrorKind::InvalidValue,
                    &at,
                    "set one of [store] path (an SQLite file) and url (a PostgreSQL database), not both"
                        .to_owned(),
                );
            }
        }
        if let Some(v) = file.redis.as_ref().and_then(|r| r.timeout) {
            self.duration(&path(&["redis", "timeout"]), v);
        }
        if let Some(endpoint) = file.otel.as_ref().and_then(|o| o.endpoint.as_deref()) {
            let message = match endpoint.split_once("://") {
                Some(("http", rest)) if !rest.is_empty() => None,
                Some(("https", _)) => Some(format!(
                    "{endpoint:?}: toolwarden sends spans over plain HTTP only; point it at a collector reached over http:// (a local OpenTelemetry Collector or agent that forwards over TLS)"
                )),
                _ => Some(format!(
                    "{endpoint:?} is not an http:// URL; write the collector's OTLP/HTTP address, e.g. \"http://127.0.0.1:4318\""
                )),
            };
            if let Some(message) = message {
                self.fail(
                    ConfigErrorKind::InvalidValue,
                    &path(&["otel", "endpoint"]),
                    message,
                );
            }
        }
    }

    /// `[[auth.tokens]]` and `[auth.oauth]` (docs/AUTH.md): every entry names a principal and
    /// exactly one source of its token, scopes are known names, and OAuth has what it checks
    /// tokens against.
    fn auth(&mut self, file: &ConfigFile) {
        let mut digests: Vec<(&str, usize)> = Vec::new();
        for (i, entry) in file.auth.tokens.iter().enumerate() {
            let at = vec![
                Seg::Key("auth".into()),
                Seg::Key("tokens".into()),
                Seg::Index(i),
            ];
            let key = |k: &str| {
                let mut p = at.clone();
                p.push(Seg::Key(k.into()));
                p
            };
            match entry.principal.as_deref() {
                None | Some("") => self.fail(
                    ConfigErrorKind::InvalidValue,
                    &at,
                    "a token entry needs principal = \"NAME\": the name its calls are recorded under"
                        .to_owned(),
                ),
                Some(name) if name == LOCAL_PRINCIPAL || name == DEFAULT_PRINCIPAL => self.fail(
                    ConfigErrorKind::InvalidValue,
                    &key("principal"),
                    format!(
                        "{name:?} is reserved (\"local\" is loopback without authentication, \"default\" is the token of [http] token_env); choose another name"
                    ),
                ),
                Some(name) if !principal_name_ok(name) => self.fail(
                    ConfigErrorKind::InvalidValue,
                    &key("principal"),
                    format!(
                        "{name:?}: a principal's name is 1 to 128 characters without spaces or control characters"
                    ),
                ),
                Some(_) => {}
            }
            match (&entry.token_sha256, &entry.token_env) {
                (None, None) => self.fail(
                    ConfigErrorKind::InvalidValue,
                    &at,
                    "a token entry needs one of token_sha256 (the hex SHA-256 of the token: `printf %s TOKEN | sha256sum`) and token_env (the variable that holds the token)".to_owned(),
                ),
                (Some(_), Some(_)) => self.fail(
                    ConfigErrorKind::InvalidValue,
                    &key("token_env"),
                    "set one of token_sha256 and token_env, not both".to_owned(),
                ),
                (Some(hex), None) => {
                    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                        self.fail(
                            ConfigErrorKind::InvalidValue,
                            &key("token_sha256"),
                            format!(
                                "expected 64 hex digits (the SHA-256 of the token: `printf %s TOKEN | sha256sum`), got {} characters",
                                hex.len()
                            ),
                        );
                    } else if let Some((_, first)) =
                        digests.iter().find(|(d, _)| d.eq_ignore_ascii_case(hex))
                    {
                        self.fail(
                            ConfigErrorKind::InvalidValue,
                            &key("token_sha256"),
                            format!(
                                "the same token as auth.tokens[{first}]: each token names one principal"
                            ),
                        );
                    } else {
                        digests.push((hex.as_str(), i));
                    }
                }
                (None, Some(var)) => {
                    if var.is_empty() || var.contains(['=', '\0']) {
                        self.fail(
                            ConfigErrorKind::InvalidValue,
                            &key("token_env"),
                            format!("{var:?} is not an environment variable's name"),
                        );
                    }
                }
            }
            for (j, scope) in entry.scopes.iter().flatten().enumerate() {
                if Scope::parse(scope).is_none() {
                    let mut p = key("scopes");
                    p.push(Seg::Index(j));
                    let names = Scope::ALL.map(Scope::as_str);
                    let hint = match closest(scope, names.into_iter()) {
                        Some(near) => format!("; did you mean {near:?}?"),
                        None => String::new(),
                    };
                    self.fail(
                        ConfigErrorKind::InvalidValue,
                        &p,
                        format!(
                            "unknown scope {scope:?}: expected {}{hint}",
                            names.join(", ")
                        ),
                    );
                }
            }
        }
        let Some(oauth) = &file.auth.oauth else {
            return;
        };
        let at = |k: &str| path(&["auth", "oauth", k]);
        for (key, value, what) in [
            (
                "issuer",
                &oauth.issuer,
                "the authorization server's issuer URL, as tokens carry it in iss",
            ),
            (
                "audience",
                &oauth.audience,
                "what tokens for this server carry in aud (often this server's URL)",
            ),
        ] {
            if value.as_deref().is_none_or(|v| v.trim().is_empty()) {
                self.fail(
                    ConfigErrorKind::InvalidValue,
                    &at(key),
                    format!("[auth.oauth] needs {key}: {what}"),
                );
            }
        }
        match (&oauth.jwks_url, &oauth.jwks_file) {
            (None, None) => self.fail(
                ConfigErrorKind::InvalidValue,
                &path(&["auth", "oauth"]),
                "[auth.oauth] needs jwks_url (where the issuer publishes its signing keys) or jwks_file".to_owned(),
            ),
            (Some(_), Some(_)) => self.fail(
                ConfigErrorKind::InvalidValue,
                &at("jwks_file"),
                "set one of jwks_url and jwks_file, not both".to_owned(),
            ),
            (Some(url), None) if !is_http_url(url) => self.fail(
                ConfigErrorKind::InvalidValue,
                &at("jwks_url"),
                format!("{url:?} is not an http:// or https:// URL"),
            ),
            _ => {}
        }
        if let Some(resource) = &oauth.resource
            && !is_http_url(resource)
        {
            self.fail(
                ConfigErrorKind::InvalidValue,
                &at("resource"),
                format!(
                    "{resource:?} is not an http:// or https:// URL; write this server's public URL, e.g. \"https://tools.example.com/mcp\""
                ),
            );
        }
        for (key, value) in [
            ("principal_claim", &oauth.principal_claim),
            ("scopes_claim", &oauth.scopes_claim),
        ] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                self.fail(
                    ConfigErrorKind::InvalidValue,
                    &at(key),
                    format!("{key} must name a claim"),
                );
            }
        }
        if let Some(v) = oauth.leeway {
            self.duration(&at("leeway"), v);
        }
    }

    /// A negative duration is an error: read as `0` it would turn a limit off (most durations'
    /// `0` means "no limit"), which a typo must never do.
    fn duration(&mut self, at: &[Seg], v: DurationValue) {
        if v.is_negative() {
            self.fail(ConfigErrorKind::InvalidValue, at, negative_duration(v));
        }
    }

    fn count(&mut self, at: &[Seg], v: i64) {
        if v < 0 {
            self.warn(
                at,
                format!("negative value {v} is treated as 0; write 0 or a positive number"),
            );
        } else if u32::try_from(v).is_err() {
            self.fail(
                ConfigErrorKind::InvalidValue,
                at,
                format!("{v} is too large: expected at most {}", u32::MAX),
            );
        }
    }

    fn size(&mut self, at: &[Seg], v: SizeValue) {
        if v.0 < 0 {
            self.warn(
                at,
                format!(
                    "negative size {} bytes is treated as 0; write 0 or a positive size such as \"1MiB\"",
                    v.0
                ),
            );
        }
    }
}

pub(crate) fn negative_duration(v: DurationValue) -> String {
    format!(
        "negative duration -{}: a duration cannot be negative (read as 0 it could turn a limit off); write a positive duration such as \"30s\"",
        format_duration(Duration::from_millis(v.0.unsigned_abs()))
    )
}

/// Whether `name` may be a principal's name: 1 to 128 characters, no whitespace or control
/// characters.
pub fn principal_name_ok(name: &str) -> bool {
    (1..=128).contains(&name.chars().count())
        && !name.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn is_http_url(url: &str) -> bool {
    matches!(url.split_once("://"), Some(("http" | "https", rest)) if !rest.is_empty())
}
