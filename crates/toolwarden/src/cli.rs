//! The command line (docs/CLI.md), as clap derives it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// toolwarden governs the tool calls of AI agents: deadlines, cancels that stop the work,
/// retries, breakers, approvals with deadlines, no orphaned processes.
#[derive(Debug, Parser)]
#[command(name = "toolwarden", version, propagate_version = true)]
#[command(after_help = "\
Config: --config FILE, else $TOOLWARDEN_CONFIG, else ./toolwarden.toml, else built-in defaults.
Exit codes: 0 ok, 1 error, 2 usage or config error; `call` adds 3 timeout, 4 interaction needed
but headless, 5 denied, 6 circuit open, 130 interrupted. See docs/CLI.md.")]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every command accepts, before or after its name.
#[derive(Debug, Args)]
pub(crate) struct Global {
    /// The config file [default: $TOOLWARDEN_CONFIG, else ./toolwarden.toml, else built-in
    /// defaults].
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Log filter, e.g. `debug` or `toolwarden_mcp=debug` [default: $RUST_LOG, else `info` for
    /// serve and `warn` for the other commands].
    #[arg(long, global = true, value_name = "FILTER")]
    pub(crate) log_level: Option<String>,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Serve the HTTP turn API, and the MCP gateway over Streamable HTTP at /mcp.
    Serve(ServeArgs),
    /// Serve the MCP gateway over stdio (for Claude Desktop, Claude Code, any MCP client).
    Mcp(McpArgs),
    /// Make one governed tool call here, with the config's servers and exec.
    Call(CallArgs),
    /// Check the config: start its servers, print every warning and every tool's policy.
    Check(CheckArgs),
    /// List the tools of a running `toolwarden serve`, with policies and breaker states; or
    /// accept a changed tool's new definition (`tools accept NAME`).
    Tools(ToolsArgs),
    /// List the running turns of a running `toolwarden serve`.
    Turns(ClientArgs),
    /// Abort a running turn (or one of its calls) on a running `toolwarden serve`.
    Abort(AbortArgs),
    /// Show the audit trail: what was called, with what, by whom, how it ended (read from the
    /// store's file; works with or without a running server).
    Audit(AuditArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address of the HTTP API [default: [http] listen, else 127.0.0.1:7420]; port 0 picks a
    /// free port (the address bound is printed).
    #[arg(long, value_name = "ADDR")]
    pub(crate) listen: Option<String>,
    /// Nothing answers approvals: calls that need one are denied at once.
    #[arg(long)]
    pub(crate) headless: bool,
}

#[derive(Debug, Args)]
pub(crate) struct McpArgs {
    /// Who the client is: its calls are recorded under this name [default:
    /// $TOOLWARDEN_PRINCIPAL, else the OS user].
    #[arg(long, value_name = "NAME")]
    pub(crate) principal: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct CallArgs {
    /// The tool, as agents see it: `SERVER__TOOL`, `exec`, ...
    pub(crate) tool: String,
    /// The input: JSON, `@FILE` to read it from a file, or `@-` from stdin [default: {}].
    #[arg(long, value_name = "JSON|@FILE")]
    pub(crate) input: Option<String>,
    /// Total deadline of this call, e.g. `30s` (replaces the tool's `timeout`, capped at its
    /// `max_timeout`; `0` = no cap).
    #[arg(long, value_name = "DURATION")]
    pub(crate) timeout: Option<String>,
    /// Idle deadline of this call, e.g. `10s` (replaces the tool's `idle_timeout`; `0` = off).
    #[arg(long, value_name = "DURATION")]
    pub(crate) idle_timeout: Option<String>,
    /// Never ask at the terminal: a local call that needs an approval is denied at once (exit 4);
    /// with --url the server's own interactors may still answer it. Implied when stdin or stderr
    /// is not a terminal.
    #[arg(long)]
    pub(crate) headless: bool,
    /// Print the whole result (outcome, content, structured content) as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// The session the call belongs to (loop detection and exclusivity are per session).
    #[arg(long, value_name = "S")]
    pub(crate) session: Option<String>,
    /// Send the call to a running `toolwarden serve` at this URL instead of running it here,
    /// so that it shares that server's breakers, cache and sessions.
    #[arg(long, value_name = "URL")]
    pub(crate) url: Option<String>,
    /// Who makes the call (here; with --url the server's token decides) [default:
    /// $TOOLWARDEN_PRINCIPAL, else the OS user].
    #[arg(long, value_name = "NAME")]
    pub(crate) principal: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Do not start servers: check the file alone (tools of servers stay unknown).
    #[arg(long)]
    pub(crate) offline: bool,
    /// Explain what `[[rules]]` decide for a call of TOOL (with --principal and --input), and
    /// nothing else.
    #[arg(long, value_name = "TOOL")]
    pub(crate) explain: Option<String>,
    /// With --explain: who calls [default: $TOOLWARDEN_PRINCIPAL, else the OS user].
    #[arg(long, value_name = "NAME", requires = "explain")]
    pub(crate) principal: Option<String>,
    /// With --explain: the call's input, as JSON [default: {}].
    #[arg(long, value_name = "JSON", requires = "explain")]
    pub(crate) input: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ClientArgs {
    /// The server's base URL [default: http:// + [http] listen].
    #[arg(long, value_name = "URL")]
    pub(crate) url: Option<String>,
    /// Print the server's answer as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ToolsArgs {
    #[command(subcommand)]
    pub(crate) action: Option<ToolsAction>,
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ToolsAction {
    /// Accept the definition a server changed a pinned tool to (needs scope `admin`): it becomes
    /// the pinned one, and calls `on_tool_change = "block"` held run again.
    Accept {
        /// The tool, as agents call it (`SERVER__TOOL`).
        name: String,
        /// Accept only the change to this definition (`sha256:…`, as `tools --json` or the
        /// dashboard shows it): a server that changed the tool again since is not accepted.
        #[arg(long, value_name = "DIGEST")]
        digest: Option<String>,
        /// The server's base URL [default: http:// + [http] listen].
        #[arg(long, value_name = "URL")]
        url: Option<String>,
    },
}

#[derive(Debug, Args)]
pub(crate) struct AbortArgs {
    /// The turn (`t_...`).
    pub(crate) turn: String,
    /// One call of it; without it the whole turn is aborted.
    pub(crate) call: Option<String>,
    /// The server's base URL [default: http:// + [http] listen].
    #[arg(long, value_name = "URL")]
    pub(crate) url: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    /// Only calls of this principal's turns.
    #[arg(long, value_name = "NAME")]
    pub(crate) principal: Option<String>,
    /// Only calls of this session.
    #[arg(long, value_name = "S")]
    pub(crate) session: Option<String>,
    /// Only calls of this turn.
    #[arg(long, value_name = "T")]
    pub(crate) turn: Option<String>,
    /// Only calls with this id.
    #[arg(long, value_name = "C")]
    pub(crate) call: Option<String>,
    /// Only calls of this tool.
    #[arg(long, value_name = "NAME")]
    pub(crate) tool: Option<String>,
    /// Only calls that ended so: ok, error, timeout, cancelled, denied, circuit_open, invalid,
    /// interrupted; or running.
    #[arg(long, value_name = "STATUS")]
    pub(crate) status: Option<String>,
    /// Only calls started since this time (RFC 3339) or this long ago (`30m`, `2h`, `7d`).
    #[arg(long, value_name = "TIME|DURATION")]
    pub(crate) since: Option<String>,
    /// The most recent N calls [default: 50, at most 1000].
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub(crate) limit: u32,
    /// Keep running and print calls as they end (Ctrl-C stops).
    #[arg(long, short = 'f')]
    pub(crate) follow: bool,
    /// One JSON object per call and line (with its events), instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn config_is_accepted_before_and_after_the_command() {
        let before = Cli::try_parse_from(["toolwarden", "--config", "a.toml", "check"]).unwrap();
        let after = Cli::try_parse_from(["toolwarden", "check", "--config", "a.toml"]).unwrap();
        assert_eq!(before.global.config, Some(PathBuf::from("a.toml")));
        assert_eq!(after.global.config, Some(PathBuf::from("a.toml")));
    }
}
