//! Config loading and policy resolution (docs/CONFIG.md).
//!
//! [`Config::load`] finds the config file (`--config FILE`, else `$TOOLWARDEN_CONFIG`, else
//! `./toolwarden.toml` if it exists, else the built-in defaults), parses it, expands `${VAR}` in
//! server definitions, applies `TOOLWARDEN_TOOL_TIMEOUT`, and checks the invariants of
//! docs/CONFIG.md. [`Config::policy_for`] then gives any tool its effective [`Policy`]: built-in
//! defaults → `[defaults]` → `[servers.NAME]` (or `[exec]`) → `[tools."NAME"]` → annotations, then
//! clamps. [`apply_hints`] applies a call's own deadline hints on top.
//!
//! The key design choice: **every diagnostic points at the file, the key and the line.** The file
//! is parsed once with `toml_edit`, which keeps byte spans; the typed [`ConfigFile`] is
//! deserialized from that same document, and a source map of every key's span turns the
//! deserializer's errors and this module's own checks into `file:line: key: message`. Warnings
//! (values used, but not as written) are kept on the [`Config`]; errors stop the load.

mod check;
mod diag;
mod expand;
mod names;
mod resolve;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use toolwarden_protocol::{
    ConfigFile, DurationValue, Policy, PolicyConfig, ToolAnnotations, parse_duration,
};

pub use check::principal_name_ok;
pub use diag::{ConfigDiagnostic, ConfigError, ConfigErrorKind};
pub use names::{
    CONFIG_ENV, DEFAULT_FILE, DEFAULT_INTERACTION_CEILING, EXEC_TOOL, TOOL_TIMEOUT_ENV,
};
pub use resolve::apply_hints;

use check::Checker;
use diag::{Seg, SourceMap, closest, format_path, guess_key_at_line, path, reword};
use expand::expand;
use names::{ENV_FILE, RESERVED_SERVER, ceiling};

/// Where a [`Config`] came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigOrigin {
    /// A config file (its path as given, or the label passed to [`Config::parse`]).
    File(PathBuf),
    /// No file: the built-in defaults (environment overrides still apply).
    Builtin,
}

/// A loaded, checked config.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file as parsed, `${VAR}` expanded (in enabled servers) and environment overrides
    /// applied. Values are as written: negative numbers stay negative here and are treated as
    /// `0` by [`Config::policy_for`].
    pub file: ConfigFile,
    /// Where it came from.
    pub origin: ConfigOrigin,
    /// Values that are used, but not as written (negative numbers, clamped timeouts, keys that
    /// apply to nothing), in file order.
    pub warnings: Vec<ConfigDiagnostic>,
    /// `[[rules]]`, compiled (`None`: there are none).
    pub rules: Option<Arc<crate::rules::Rules>>,
    /// `[hooks]`, compiled (`None`: there are none).
    pub hooks: Option<Arc<crate::hooks::HookSet>>,
    /// `[[quotas]]`, compiled (`None`: there are none).
    pub quotas: Option<Arc<crate::quotas::Quotas>>,
    label: String,
    map: SourceMap,
}

impl Config {
    /// The built-in defaults, with no file and no environment overrides.
    pub fn builtin() -> Config {
        Config {
            file: ConfigFile::default(),
            origin: ConfigOrigin::Builtin,
            warnings: Vec::new(),
            rules: None,
            hooks: None,
            quotas: None,
            label: "built-in defaults".to_owned(),
            map: SourceMap::empty(),
        }
    }

    /// Loads the config: `explicit` (`--config FILE`), else `$TOOLWARDEN_CONFIG`, else
    /// `./toolwarden.toml` if it exists, else the built-in defaults. Reads the process
    /// environment for `$TOOLWARDEN_CONFIG`, `TOOLWARDEN_TOOL_TIMEOUT` and `${VAR}`.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load_from(explicit, Path::new(""), &|name| std::env::var(name).ok())
    }

    /// [`Config::load`] with its surroundings given: `dir` is where `toolwarden.toml` is looked
    /// for, `env` answers for the environment.
    pub fn load_from(
        explicit: Option<&Path>,
        dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let from_env = env(CONFIG_ENV).filter(|v| !v.is_empty());
        let (path, named_by) = match (explicit, from_env) {
            (Some(p), _) => (p.to_path_buf(), Some("--config")),
            (None, Some(p)) => (PathBuf::from(p), Some("$TOOLWARDEN_CONFIG")),
            (None, None) => {
                let p = dir.join(DEFAULT_FILE);
                if !p.exists() {
                    let mut config = Self::parse("", "built-in defaults", env)?;
                    config.origin = ConfigOrigin::Builtin;
                    return Ok(config);
                }
                (p, None)
            }
        };
        let label = path.display().to_string();
        let src = std::fs::read_to_string(&path).map_err(|e| ConfigError {
            kind: ConfigErrorKind::Read,
            diagnostic: ConfigDiagnostic {
                file: label.clone(),
                key: String::new(),
                line: None,
                message: match named_by {
                    Some(by) => format!("cannot read the config file named by {by}: {e}"),
                    None => format!("cannot read the config file: {e}"),
                },
            },
        })?;
        let mut config = Self::parse(&src, &label, env)?;
        config.origin = ConfigOrigin::File(path);
        Ok(config)
    }

    /// Parses and checks a config file's text. `file_label` names it in diagnostics (and in
    /// [`ConfigOrigin::File`]); `env` answers for `${VAR}` and `TOOLWARDEN_TOOL_TIMEOUT`.
    pub fn parse(
        src: &str,
        file_label: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let doc = toml_edit::Document::parse(src.to_owned())
            .map_err(|e| syntax_error(src, file_label, &e))?;
        let map = SourceMap::new(src, &doc);
        let mut file: ConfigFile =
            toml_edit::de::from_document(doc).map_err(|e| schema_error(&map, file_label, &e))?;

        let timeout_from_env = env_override(&mut file, env)?;
        let mut checker = Checker::new(file_label, &map);
        checker.check(&file, timeout_from_env)?;
        expand_servers(&mut file, env, &checker)?;
        // An entry that does not compile, named by its table, entry and key.
        let bad = |table: &str, entry: Seg, key: &str, message: String| {
            checker.error(
                ConfigErrorKind::InvalidValue,
                &[Seg::Key(table.into()), entry, Seg::Key(key.into())],
                message,
            )
        };
        let rules = crate::rules::Rules::compile(&file.rules)
            .map_err(|e| bad("rules", Seg::Index(e.index), e.key, e.message))?
            .map(Arc::new);
        let hooks = crate::hooks::HookSet::compile(&file.hooks)
            .map_err(|e| bad("hooks", Seg::Key(e.name), e.key, e.message))?
            .map(Arc::new);
        let quotas = crate::quotas::Quotas::compile(&file.quotas)
            .map_err(|e| bad("quotas", Seg::Index(e.index), e.key, e.message))?
            .map(Arc::new);

        let mut warnings = checker.warnings;
        // File order; the environment's after the file's.
        warnings.sort_by_key(|w| (w.file != file_label, w.line.unwrap_or(usize::MAX)));
        Ok(Config {
            file,
            origin: ConfigOrigin::File(PathBuf::from(file_label)),
            warnings,
            rules,
            hooks,
            quotas,
            label: file_label.to_owned(),
            map,
        })
    }

    /// The effective policy of one tool: built-in defaults → `[defaults]` → `[servers.NAME]` (or
    /// `[exec]` for the exec tool) → `[tools."NAME"]` → annotations (for keys no layer set), then
    /// the clamps (idle and attempt timeouts at most the total; the approval deadline at most the
    /// interaction ceiling).
    ///
    /// For an MCP tool, `server` names its server and `tool` is the server's own name for it
    /// (without `SERVER__`, as backends see it). Otherwise (`server` is `None`) `tool` is the name
    /// the agent sees: `exec`, an in-process tool (defaults and its `[tools."NAME"]` only), or a
    /// `SERVER__TOOL` name, whose configured server is then found from the name.
    pub fn policy_for(
        &self,
        tool: &str,
        server: Option<&str>,
        annotations: &ToolAnnotations,
    ) -> Policy {
        let (middle, key) = self.layers_of(tool, server);
        let mut layers: Vec<&PolicyConfig> = vec![&self.file.defaults];
        layers.extend(middle.as_ref());
        layers.extend(self.file.tools.get(key.as_ref()));
        resolve::resolve(&layers, annotations, self.interaction_ceiling())
    }

    /// The effective policy of an in-process tool: built-in defaults → `[defaults]` → the layer
    /// its code set → `[tools."NAME"]` → annotations, then the invariants.
    pub fn policy_for_in_process(
        &self,
        tool: &str,
        code_layer: &PolicyConfig,
        annotations: &ToolAnnotations,
    ) -> Policy {
        let mut layers: Vec<&PolicyConfig> = vec![&self.file.defaults, code_layer];
        layers.extend(self.file.tools.get(tool));
        resolve::resolve(&layers, annotations, self.interaction_ceiling())
    }

    /// The server (or `[exec]`) layer of a tool, and its key in `[tools]`.
    fn layers_of<'t>(
        &self,
        tool: &'t str,
        server: Option<&str>,
    ) -> (Option<PolicyConfig>, Cow<'t, str>) {
        if let Some(server) = server {
            let layer = self.file.servers.get(server).map(|s| s.policy());
            return (layer, Cow::Owned(self.exposed_name(server, tool)));
        }
        if tool == EXEC_TOOL {
            return (
                self.file.exec.as_ref().map(|e| e.policy()),
                Cow::Borrowed(tool),
            );
        }
        let layer = tool
            .split_once("__")
            .filter(|_| self.prefixed())
            .and_then(|(s, _)| self.file.servers.get(s))
            .map(|s| s.policy());
        (layer, Cow::Borrowed(tool))
    }

    /// Whether MCP tools are exposed as `SERVER__TOOL` (`[gateway] prefix`, default `true`).
    pub fn prefixed(&self) -> bool {
        self.file.gateway.prefix != Some(false)
    }

    /// The name under which `server`'s tool `tool` is exposed: `SERVER__TOOL`, or `TOOL` with
    /// `[gateway] prefix = false`.
    pub fn exposed_name(&self, server: &str, tool: &str) -> String {
        if self.prefixed() {
            format!("{server}__{tool}")
        } else {
            tool.to_owned()
        }
    }

    /// Warnings for `[tools."NAME"]` entries that belong to `server` but name a tool it does not
    /// list, once its tools are known (servers may be down when the config loads). With
    /// `[gateway] prefix = false`, every entry that is not `exec`, a `toolwarden__` tool or
    /// listed is reported (the entries of in-process tools too: the caller may filter them).
    pub fn unknown_tool_warnings(&self, server: &str, listed: &[&str]) -> Vec<ConfigDiagnostic> {
        let prefixed = self.prefixed();
        self.file
            .tools
            .keys()
            .filter_map(|key| {
                let tool = if prefixed {
                    key.strip_prefix(server)?.strip_prefix("__")?
                } else {
                    let has_prefix = key
                        .split_once("__")
                        .is_some_and(|(s, _)| s == server || s == RESERVED_SERVER);
                    if key == EXEC_TOOL || has_prefix {
                        return None;
                    }
                    key.as_str()
                };
                if listed.contains(&tool) {
                    return None;
                }
                let hint = match closest(tool, listed.iter().copied()) {
                    Some(near) => format!(
                        "did you mean [tools.{}]?",
                        format_path(&path(&[&self.exposed_name(server, near)]))
                    ),
                    None if listed.is_empty() => "it lists no tools".to_owned(),
                    None => format!("it lists {}", short_list(listed, 10)),
                };
                let at = path(&["tools", key]);
                Some(ConfigDiagnostic {
                    file: self.label.clone(),
                    key: format_path(&at),
                    line: self.map.line(&at),
                    message: format!(
                        "server {server:?} does not list a tool {tool:?}, so these keys apply to no tool; {hint}"
                    ),
                })
            })
            .collect()
    }

    /// Warnings about `[[auth.tokens]]` that only the environment shows (`env` reads a
    /// variable): a `token_env` variable that is not set (`serve` would refuse to start), and a
    /// token shorter than 32 bytes, which could be guessed — theirs, or the single token's in
    /// `single_var` (`[http] token_env`, or its default).
    pub fn token_warnings(
        &self,
        single_var: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Vec<ConfigDiagnostic> {
        let mut out = Vec::new();
        if let Some(token) = env(single_var).filter(|t| !t.is_empty() && t.len() < 32) {
            let at = vec![Seg::Key("http".into()), Seg::Key("token_env".into())];
            out.push(ConfigDiagnostic {
                file: self.label.clone(),
                key: format_path(&at),
                line: self.map.line(&at),
                message: format!(
                    "the token in {single_var} (principal \"default\") is {} bytes long: a token shorter than 32 bytes could be guessed; make one with `openssl rand -hex 32`",
                    token.len()
                ),
            });
        }
        for (i, entry) in self.file.auth.tokens.iter().enumerate() {
            let Some(var) = &entry.token_env else {
                continue;
            };
            let at = vec![
                Seg::Key("auth".into()),
                Seg::Key("tokens".into()),
                Seg::Index(i),
                Seg::Key("token_env".into()),
            ];
            let who = entry.principal.as_deref().unwrap_or("?");
            let message = match env(var).filter(|t| !t.is_empty()) {
                None => format!(
                    "the variable {var} (principal {who:?}'s token) is not set: `toolwarden serve` refuses to start without it"
                ),
                Some(token) if token.len() < 32 => format!(
                    "principal {who:?}'s token is {} bytes long: a token shorter than 32 bytes could be guessed; make one with `openssl rand -hex 32`",
                    token.len()
                ),
                Some(_) => continue,
            };
            out.push(ConfigDiagnostic {
                file: self.label.clone(),
                key: format_path(&at),
                line: self.map.line(&at),
                message,
            });
        }
        out
    }

    /// Warnings for `[tools."NAME"]` entries that can name no tool at all: with tools exposed as
    /// `SERVER__TOOL`, a key that is neither `SERVER__…`, `exec`, nor one of `in_process` (the
    /// in-process tools the caller registers) applies to nothing — `[tools."sleep"]` for
    /// `test__sleep` — and its keys would be silently ignored. Known when the config loads, so
    /// the caller (which knows its in-process tools) reports them then.
    pub fn unattached_tool_warnings(&self, in_process: &[&str]) -> Vec<ConfigDiagnostic> {
        if !self.prefixed() {
            // Keys are the single server's own tool names: `unknown_tool_warnings` reports
            // those once its tools are known.
            return Vec::new();
        }
        let servers: Vec<&str> = self.file.servers.keys().map(String::as_str).collect();
        self.file
            .tools
            .keys()
            .filter(|key| {
                !key.contains("__") && key.as_str() != EXEC_TOOL && !in_process.contains(&key.as_str())
            })
            .map(|key| {
                // `test_sleep` for `test__sleep`: a server's name and one `_`.
                let split = servers.iter().find_map(|s| {
                    key.strip_prefix(s)
                        .and_then(|rest| rest.strip_prefix('_'))
                        .filter(|rest| !rest.is_empty())
                        .map(|rest| format!("{s}__{}", rest.trim_start_matches('_')))
                });
                let hint = match (split, servers.as_slice()) {
                    (Some(name), _) => format!("did you mean [tools.{}]?", format_path(&path(&[&name]))),
                    (None, []) => "no servers are configured".to_owned(),
                    (None, [only]) => format!(
                        "did you mean [tools.{}]?",
                        format_path(&path(&[&format!("{only}__{key}")]))
                    ),
                    (None, several) => format!(
                        "write [tools.\"SERVER__{key}\"] with one of the servers {}",
                        several.join(", ")
                    ),
                };
                let at = path(&["tools", key]);
                ConfigDiagnostic {
                    file: self.label.clone(),
                    key: format_path(&at),
                    line: self.map.line(&at),
                    message: format!(
                        "applies to no tool, so these keys are ignored: MCP tools are named SERVER__TOOL, the shell tool exec; {hint}"
                    ),
                }
            })
            .collect()
    }

    /// The deadline every interaction is capped at (`interaction_ceiling`, default 15m).
    pub fn interaction_ceiling(&self) -> Duration {
        ceiling(&self.file)
    }
}

fn short_list(names: &[&str], max: usize) -> String {
    let mut out = names
        .iter()
        .take(max)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > max {
        out.push_str(&format!(" and {} more", names.len() - max));
    }
    out
}

/// `TOOLWARDEN_TOOL_TIMEOUT` over `[defaults].timeout`. Returns whether it applied.
fn env_override(
    file: &mut ConfigFile,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<bool, ConfigError> {
    let Some(raw) = env(TOOL_TIMEOUT_ENV).filter(|v| !v.trim().is_empty()) else {
        return Ok(false);
    };
    let ms = parse_duration(&raw).map_err(|e| ConfigError {
        kind: ConfigErrorKind::Environment,
        diagnostic: ConfigDiagnostic {
            file: ENV_FILE.to_owned(),
            key: TOOL_TIMEOUT_ENV.to_owned(),
            line: None,
            message: e.to_string(),
        },
    })?;
    if ms < 0 {
        return Err(ConfigError {
            kind: ConfigErrorKind::Environment,
            diagnostic: ConfigDiagnostic {
                file: ENV_FILE.to_owned(),
                key: TOOL_TIMEOUT_ENV.to_owned(),
                line: None,
                message: check::negative_duration(DurationValue(ms)),
            },
        });
    }
    file.defaults.timeout = Some(DurationValue(ms));
    Ok(true)
}

/// Expands `${VAR}` in the definitions of enabled servers (a disabled server is not started, so
/// the variables it needs may well be unset).
fn expand_servers(
    file: &mut ConfigFile,
    env: &dyn Fn(&str) -> Option<String>,
    checker: &Checker<'_>,
) -> Result<(), ConfigError> {
    for (name, server) in file.servers.iter_mut() {
        if server.enabled == Some(false) {
            continue;
        }
        let one = |value: &mut String, at: Vec<Seg>| -> Result<(), ConfigError> {
            *value = expand(value, env)
                .map_err(|e| checker.error(ConfigErrorKind::Variable, &at, e.message()))?;
            Ok(())
        };
        let at = |keys: &[&str]| {
            let mut p = path(&["servers", name]);
            p.extend(keys.iter().map(|k| Seg::Key((*k).to_owned())));
            p
        };
        if let Some(command) = &mut server.command {
            one(command, at(&["command"]))?;
        }
        for (i, arg) in server.args.iter_mut().enumerate() {
            let mut p = at(&["args"]);
            p.push(Seg::Index(i));
            one(arg, p)?;
        }
        for (k, v) in server.env.iter_mut() {
            one(v, at(&["env", k]))?;
        }
        if let Some(cwd) = &mut server.cwd {
            one(cwd, at(&["cwd"]))?;
        }
        if let Some(url) = &mut server.url {
            one(url, at(&["url"]))?;
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(checker.error(
                    ConfigErrorKind::InvalidServer,
                    &at(&["url"]),
                    format!(
                        "url {url:?} is not an http:// or https:// URL: write the server's Streamable HTTP endpoint, e.g. \"http://127.0.0.1:3001/mcp\""
                    ),
                ));
            }
        }
        for (k, v) in server.headers.iter_mut() {
            one(v, at(&["headers", k]))?;
        }
    }
    Ok(())
}

fn syntax_error(src: &str, file: &str, e: &toml_edit::TomlError) -> ConfigError {
    let line = e.span().map(|s| {
        let end = s.start.min(src.len());
        src.as_bytes()[..end]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1
    });
    let message = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    ConfigError {
        kind: ConfigErrorKind::Syntax,
        diagnostic: ConfigDiagnostic {
            file: file.to_owned(),
            key: line.map(|l| guess_key_at_line(src, l)).unwrap_or_default(),
            line,
            message: match message.as_str() {
                "duplicate key" => "duplicate key: a key may be written once per table".to_owned(),
                _ => format!("invalid TOML: {message}"),
            },
        },
    }
}

fn schema_error(map: &SourceMap, file: &str, e: &toml_edit::de::Error) -> ConfigError {
    let start = e.span().map(|s| s.start);
    let (message, unknown_key) = reword(e.message());
    ConfigError {
        kind: if unknown_key {
            ConfigErrorKind::UnknownKey
        } else {
            ConfigErrorKind::InvalidValue
        },
        diagnostic: ConfigDiagnostic {
            file: file.to_owned(),
            key: start
                .and_then(|s| map.path_at(s))
                .map(format_path)
                .unwrap_or_default(),
            line: start.and_then(|s| map.line_of_offset(s)),
            message,
        },
    }
}
