//! `toolwarden check`: loads the config, starts its servers to learn their tools, and prints
//! every warning and the effective policy of every tool.

use std::path::Path;

use anyhow::Context as _;
use serde_json::{Value, json};
use toolwarden_core::ConfigDiagnostic;
use toolwarden_mcp::ReadyError;
use toolwarden_protocol::ServerStateKind;
use toolwarden_protocol::{DEFAULT_PRINCIPAL, LOCAL_PRINCIPAL, Scopes};

use crate::cli::CheckArgs;
use crate::client::{BackendColumns, snake, tool_table};
use crate::exit::Exit;
use crate::say::say;
use crate::signals::Signals;
use crate::stack::{self, Stack};

/// One server as the check found it.
struct ServerReport {
    name: String,
    state: ServerStateKind,
    detail: Option<String>,
    tools: usize,
    /// The MCP revision it was reached in.
    protocol: Option<String>,
}

pub(crate) async fn run(config_path: Option<&Path>, args: CheckArgs) -> anyhow::Result<Exit> {
    let mut signals = Signals::new().context("cannot install signal handlers")?;
    let config = stack::load_config(config_path)?;
    if let Some(tool) = &args.explain {
        return explain(&config, tool, &args);
    }
    let mut warnings: Vec<ConfigDiagnostic> = config.warnings.clone();
    for w in config.token_warnings(stack::token_env(&config), |var| std::env::var(var).ok()) {
        say!("warning: {w}");
        warnings.push(w);
    }
    let (principals, oauth) = principals(&config, args.offline).await;
    if let Some(why) = oauth["keys_error"].as_str() {
        let w = ConfigDiagnostic {
            file: stack::describe_origin(&config),
            key: "auth.oauth".to_owned(),
            line: None,
            message: format!(
                "{why}: `toolwarden serve` would start and refuse access tokens until it can read them"
            ),
        };
        say!("warning: {w}");
        warnings.push(w);
    }
    // Headless: a check runs no call, and must never wait for a person.
    let mut stack = Stack::build(config, true, stack::RecordCalls::No)?;
    let mut ready = Vec::new();
    if !args.offline {
        stack.start_servers(|_| true).await;
        tokio::select! {
            r = stack.wait_ready() => ready = r,
            stop = signals.recv() => {
                stack.shutdown().await;
                say!("error: interrupted while the servers started");
                std::process::exit(stop.exit_code());
            }
        }
    }

    let tools = stack.engine.tools();
    let states = stack.engine.servers();
    let mut servers = Vec::new();
    for (name, _) in stack.enabled_servers() {
        // What the wait saw decides: the server may already be on its next start attempt.
        let (state, detail) = match ready.iter().find(|(n, _)| *n == name).map(|(_, r)| r) {
            None => (
                ServerStateKind::Down,
                Some("not started (--offline)".to_owned()),
            ),
            Some(Ok(())) => (
                ServerStateKind::Up,
                states.get(&name).and_then(|s| s.detail.clone()),
            ),
            Some(Err(ReadyError::Down { detail, .. })) => {
                // `failed` (it cannot start) or `down`, as the server last said.
                let failed = states
                    .get(&name)
                    .is_some_and(|s| s.state == ServerStateKind::Failed);
                let state = if failed {
                    ServerStateKind::Failed
                } else {
                    ServerStateKind::Down
                };
                (state, Some(detail.clone()))
            }
            Some(Err(e)) => (ServerStateKind::Down, Some(e.to_string())),
        };
        let own: Vec<&str> = tools
            .iter()
            .filter(|t| t.backend == name)
            .map(|t| own_name(&stack, &name, &t.name))
            .collect();
        if state == ServerStateKind::Up {
            let found = stack.config.unknown_tool_warnings(&name, &own);
            for w in &found {
                say!("warning: {w}");
            }
            warnings.extend(found);
        }
        let protocol = states.get(&name).and_then(|s| s.protocol.clone());
        servers.push(ServerReport {
            name,
            state,
            detail,
            tools: own.len(),
            protocol,
        });
    }
    stack.shutdown().await;
    // Where the audit trail is (the check does not open it).
    let store = stack::store_options(&stack.config, &stack.base_dir)?;
    let store_json = match &store {
        Some(o) if o.url.is_some() => json!({
            "enabled": true,
            "url": toolwarden_store::shown_url(o.url.as_deref().unwrap_or_default()),
            "replica": o.replica,
            "durability": o.durability,
        }),
        Some(o) => json!({
            "enabled": true,
            "path": o.path.display().to_string(),
            "durability": o.durability,
            "exists": o.path.exists(),
        }),
        None => json!({"enabled": false}),
    };
    let store_line = match &store {
        Some(o) if o.url.is_some() => format!(
            "store: {} as replica {:?} ({})",
            toolwarden_store::shown_url(o.url.as_deref().unwrap_or_default()),
            o.replica,
            snake(&o.durability),
        ),
        Some(o) => format!(
            "store: {} ({}{})",
            o.path.display(),
            snake(&o.durability),
            if o.path.exists() {
                ""
            } else {
                "; created on first use"
            }
        ),
        None => "store: off ([store] enabled = false)".to_owned(),
    };

    let failed = !args.offline && servers.iter().any(|s| s.state != ServerStateKind::Up);
    if args.json {
        let report = json!({
            "config": stack::describe_origin(&stack.config),
            "ok": !failed,
            "warnings": warnings.iter().map(diagnostic_json).collect::<Vec<_>>(),
            "servers": servers.iter().map(|s| (s.name.clone(), json!({
                "state": snake(&s.state),
                "detail": s.detail,
                "tools": s.tools,
                "protocol": s.protocol,
            }))).collect::<serde_json::Map<String, Value>>(),
            "tools": tools,
            "store": store_json,
            "principals": principals,
            "oauth": oauth,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("config: {}", stack::describe_origin(&stack.config));
        println!("{store_line}");
        print!("{}", principals_text(&principals, &oauth));
        print!("{}", guards_text(&stack.config));
        if servers.is_empty() {
            println!("servers: none configured");
        } else {
            println!("servers:");
            for s in &servers {
                let detail = s
                    .detail
                    .as_deref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default();
                match s.state {
                    ServerStateKind::Up => println!(
                        "  {}: up, {} tools, MCP {}",
                        s.name,
                        s.tools,
                        s.protocol.as_deref().unwrap_or("?")
                    ),
                    _ if args.offline => println!("  {}{detail}", s.name),
                    other => println!(
                        "  {}: {}{detail}; its tools are unknown",
                        s.name,
                        snake(&other)
                    ),
                }
            }
        }
        println!();
        // The check's own findings: the engine's record of a state may lag a moment behind.
        let backend_states: Vec<BackendColumns> = tools
            .iter()
            .map(|t| match servers.iter().find(|s| s.name == t.backend) {
                Some(s) => BackendColumns {
                    state: Some(snake(&s.state)),
                    protocol: s.protocol.clone(),
                },
                None => BackendColumns {
                    state: Some("up".to_owned()),
                    protocol: None,
                },
            })
            .collect();
        print!("{}", tool_table(&tools, &backend_states));
        println!();
        match warnings.len() {
            0 => println!("no warnings"),
            1 => println!("1 warning (above, on stderr)"),
            n => println!("{n} warnings (above, on stderr)"),
        }
    }
    if failed {
        say!("error: a server did not start (see above); the config itself is valid");
        return Ok(Exit::Error);
    }
    Ok(Exit::Ok)
}

/// A server's own name for a tool exposed as `name`.
fn own_name<'a>(stack: &Stack, server: &str, name: &'a str) -> &'a str {
    if stack.config.prefixed() {
        name.strip_prefix(server)
            .and_then(|rest| rest.strip_prefix(toolwarden_core::PREFIX_SEPARATOR))
            .unwrap_or(name)
    } else {
        name
    }
}

fn diagnostic_json(d: &ConfigDiagnostic) -> Value {
    json!({
        "file": d.file,
        "key": d.key,
        "line": d.line,
        "message": d.message,
        "text": d.to_string(),
    })
}

/// Who may call, as the config says: each principal with its scopes and where its token comes
/// from, and `[auth.oauth]` with whether the issuer's keys can be read (not tried `offline`).
async fn principals(config: &toolwarden_core::Config, offline: bool) -> (Vec<Value>, Value) {
    let mut list: Vec<Value> = config
        .file
        .auth
        .tokens
        .iter()
        .map(|entry| {
            let token = match (&entry.token_sha256, &entry.token_env) {
                (Some(_), _) => json!({"sha256": true}),
                (None, Some(var)) => {
                    json!({"env": var, "set": std::env::var(var).is_ok_and(|t| !t.is_empty())})
                }
                (None, None) => Value::Null,
            };
            json!({
                "principal": entry.principal,
                "scopes": stack::entry_scopes(entry),
                "token": token,
            })
        })
        .collect();
    let single = stack::token(config).is_some();
    if single {
        let var = stack::token_env(config);
        list.push(
            json!({"principal": DEFAULT_PRINCIPAL, "scopes": Scopes::all(),
                         "token": {"env": var, "set": true}}),
        );
    }
    let oauth = match stack::oauth_settings(config, stack::listen(config)) {
        Ok(Some(settings)) => {
            let (keys, error) = if offline {
                ("not read (--offline)", None)
            } else {
                match toolwarden_http::oauth::OAuth::start(settings.clone()).await {
                    (_, None) => ("read", None),
                    (_, Some(why)) => ("cannot be read", Some(why)),
                }
            };
            json!({"issuer": settings.issuer, "audience": settings.audience,
                   "jwks": settings.jwks.to_string(), "resource": settings.resource, "keys": keys,
                   "keys_error": error})
        }
        _ => Value::Null,
    };
    if list.is_empty() && oauth.is_null() {
        list.push(
            json!({"principal": LOCAL_PRINCIPAL, "scopes": Scopes::all(), "token": Value::Null}),
        );
    }
    (list, oauth)
}

/// The principals, as `check` prints them.
/// The rules, hooks and quotas in force, a line each (nothing when there are none).
fn guards_text(config: &toolwarden_core::Config) -> String {
    let mut out = String::new();
    let file = &config.file;
    if !file.rules.is_empty() {
        out.push_str(&format!(
            "rules: {} (`check --explain TOOL` shows which decide a call)\n",
            file.rules.len()
        ));
    }
    if let Some(hooks) = &config.hooks {
        out.push_str("hooks:\n");
        for h in hooks.list() {
            let target = match &h.target {
                toolwarden_core::hooks::HookTarget::Url(url) => url.clone(),
                toolwarden_core::hooks::HookTarget::Command(argv) => argv.join(" "),
            };
            let tools = file
                .hooks
                .get(&h.name)
                .and_then(|c| c.tools.as_ref())
                .map_or("every tool".to_owned(), |t| t.join(", "));
            out.push_str(&format!(
                "  {}: {target} for {tools}; timeout {}, on error {}\n",
                h.name,
                toolwarden_protocol::format_duration(h.timeout),
                h.on_error.as_str()
            ));
        }
    }
    if let Some(quotas) = &config.quotas {
        out.push_str("quotas:\n");
        for (q, c) in quotas.list().iter().zip(&file.quotas) {
            let mut limits = Vec::new();
            if let Some(rate) = &c.rate {
                limits.push(rate.clone());
            }
            if let Some(n) = q.concurrency {
                limits.push(format!("{n} at once"));
            }
            let list = |g: &Option<Vec<String>>, all: &str| {
                g.as_ref().map_or(all.to_owned(), |g| g.join(", "))
            };
            out.push_str(&format!(
                "  quotas[{}]: {} per {} for {} (principals: {})\n",
                q.index,
                limits.join(", "),
                q.per.as_str(),
                list(&c.tools, "every tool"),
                list(&c.principals, "all")
            ));
        }
    }
    out
}

fn principals_text(principals: &[Value], oauth: &Value) -> String {
    let mut out = String::from("principals:\n");
    for p in principals {
        let scopes: Vec<&str> = p["scopes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let scopes = if scopes.is_empty() {
            "no scope".to_owned()
        } else {
            scopes.join(", ")
        };
        let token = &p["token"];
        let from = if token.is_null() {
            "loopback without authentication".to_owned()
        } else if token["sha256"] == true {
            "token by its SHA-256".to_owned()
        } else {
            let var = token["env"].as_str().unwrap_or_default();
            if token["set"] == true {
                format!("token from ${var}")
            } else {
                format!("token from ${var} (not set)")
            }
        };
        out.push_str(&format!(
            "  {}: {scopes}; {from}\n",
            p["principal"].as_str().unwrap_or_default()
        ));
    }
    if !oauth.is_null() {
        out.push_str(&format!(
            "  OAuth access tokens of {} for {} (keys: {}): principal and scopes from their claims\n",
            oauth["issuer"].as_str().unwrap_or_default(),
            oauth["audience"].as_str().unwrap_or_default(),
            oauth["keys"].as_str().unwrap_or_default(),
        ));
    }
    out
}

/// `check --explain TOOL`: every rule that matches a call of TOOL by `--principal` with
/// `--input`, and the decision (the rules', or the tool's `approval` when none matches).
fn explain(config: &toolwarden_core::Config, tool: &str, args: &CheckArgs) -> anyhow::Result<Exit> {
    let principal = stack::cli_principal(config, args.principal.as_deref())?;
    let input: Value = match args.input.as_deref() {
        None => json!({}),
        Some(text) => match serde_json::from_str(text) {
            Ok(v @ Value::Object(_)) => v,
            Ok(other) => crate::exit::usage!("--input: expected a JSON object, got {other}"),
            Err(e) => crate::exit::usage!("--input: malformed JSON: {e}"),
        },
    };
    // The server a SERVER__TOOL name belongs to, when the config has it.
    let server = tool
        .split_once("__")
        .map(|(s, _)| s)
        .filter(|s| config.file.servers.contains_key(*s));
    let annotations = toolwarden_protocol::ToolAnnotations::default();
    let approval = match server {
        Some(s) => config.policy_for(&tool[s.len() + 2..], Some(s), &annotations),
        None => config.policy_for(tool, None, &annotations),
    }
    .approval;
    let facts = toolwarden_core::rules::Facts {
        tool,
        args: &input,
        principal: &principal,
        session_id: None,
        annotations: Some(&annotations),
        server,
    };
    let e = toolwarden_core::rules::explain(config.rules.as_deref(), &facts, approval);
    // What decides past the rules: the hooks asked and the quotas taken from.
    let (hooks, quotas) = toolwarden_core::quotas::guards_of(
        config.hooks.as_deref(),
        config.quotas.as_deref(),
        tool,
        &principal.name,
    );
    if args.json {
        let mut body = serde_json::to_value(&e)?;
        body["hooks"] = json!(hooks);
        body["quotas"] = json!(quotas);
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(Exit::Ok);
    }
    println!(
        "{tool} called by {} with {}:",
        principal.name,
        serde_json::to_string(&input)?
    );
    if let Some(line) = &e.line {
        let commands: Vec<String> = line
            .commands
            .iter()
            .map(|c| format!("`{}`", c.argv.join(" ")))
            .collect();
        println!(
            "  the line's commands: {}",
            if commands.is_empty() {
                "none".to_owned()
            } else {
                commands.join(", ")
            }
        );
        if let Some(why) = &line.why_opaque {
            println!("  the line is opaque: {why}");
        }
    }
    if e.fallback {
        println!("  no rule matches: the tool's approval decides");
    }
    for m in &e.rules {
        println!(
            "  rules[{}] {}{}",
            m.index,
            m.decision.as_str(),
            m.reason
                .as_deref()
                .map(|r| format!(" — {r}"))
                .unwrap_or_default()
        );
    }
    println!("decision: {}", e.decision);
    if !hooks.is_empty() {
        println!(
            "then asked, in order (each may make it stricter, or rewrite the input): {}",
            hooks
                .iter()
                .map(|h| format!("hook {h:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if !quotas.is_empty() {
        println!(
            "and, allowed to run, it takes from: {}",
            quotas
                .iter()
                .map(|i| format!("quotas[{i}]"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(Exit::Ok)
}
