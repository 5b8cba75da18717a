//! `toolwarden call TOOL`: one governed call, its result on stdout, its outcome as the exit code.
//!
//! Locally (the default) the engine is built here from the config, with only the server the
//! tool needs; `--url` sends the call to a running `toolwarden serve` instead, so that it shares
//! that server's breakers, cache and sessions — the only way a one-off call can meet an open
//! breaker (exit 6), since a fresh process starts with every breaker closed.

use std::io::{IsTerminal as _, Read as _, Write as _};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use reqwest::Method;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolwarden_core::{Engine, TurnRequest};
use toolwarden_protocol::{
    CallResult, CancelReason, Event, EventKind, Scope, SessionId, ToolCall, TurnId, parse_duration,
};

use crate::cli::CallArgs;
use crate::client::{Api, segment};
use crate::exit::{Exit, usage};
use crate::progress::ProgressLine;
use crate::prompt;
use crate::say::say;
use crate::signals::{Signals, StopSignal};
use crate::stack::{self, Stack};

/// The call's id within its one-call turn.
const CALL_ID: &str = "cli";
/// After Ctrl-C, how long to wait for the cancelled call's outcome before exiting anyway.
const OUTCOME_AFTER_ABORT: Duration = Duration::from_secs(2);
/// How often the local progress line reads where the call is.
const POLL: Duration = Duration::from_millis(100);

pub(crate) async fn run(config_path: Option<&Path>, args: CallArgs) -> anyhow::Result<Exit> {
    let mut signals = Signals::new().context("cannot install signal handlers")?;
    let config = stack::load_config(config_path)?;
    let call = tool_call(&args)?;
    if args.session.as_deref().is_some_and(|s| s.trim().is_empty()) {
        usage!("--session: must not be empty");
    }
    let interactive =
        !args.headless && std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    let (result, stop) = match &args.url {
        Some(_) if args.principal.is_some() => usage!(
            "--principal: with --url the server decides who you are from your bearer token; leave --principal out"
        ),
        Some(url) => {
            let api = Api::new(&config, Some(url))?;
            remote(&api, call, &args, interactive, &mut signals).await?
        }
        None => local(config, call, &args, interactive, &mut signals).await?,
    };
    let Some(result) = result else {
        return Ok(match stop {
            Some(stop) => {
                say!("error: the call's outcome did not arrive after the interrupt");
                exit_of_signal(stop)
            }
            None => {
                say!("error: the server ended the call's stream before its outcome");
                Exit::Error
            }
        });
    };
    print_result(&result, args.json)?;
    Ok(match stop {
        // Interrupted is interrupted, even if the call ended otherwise just before.
        Some(stop) => exit_of_signal(stop),
        None => Exit::of_status(&result.outcome.status),
    })
}

fn exit_of_signal(stop: StopSignal) -> Exit {
    match stop {
        StopSignal::Interrupt => Exit::Interrupted,
        StopSignal::Terminate => Exit::Terminated,
    }
}

/// The call from the command line: input and deadline hints.
fn tool_call(args: &CallArgs) -> anyhow::Result<ToolCall> {
    let input = match args.input.as_deref() {
        None => json!({}),
        Some(text) => parse_input(text)?,
    };
    let mut call = ToolCall::new(CALL_ID, args.tool.clone(), input);
    call.timeout_ms = hint("--timeout", args.timeout.as_deref())?;
    call.idle_timeout_ms = hint("--idle-timeout", args.idle_timeout.as_deref())?;
    Ok(call)
}

/// `JSON`, `@FILE` or `@-` (stdin).
fn parse_input(text: &str) -> anyhow::Result<Value> {
    let (source, raw) = match text.strip_prefix('@') {
        Some("-") => {
            let mut raw = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut raw) {
                usage!("--input @-: cannot read stdin: {e}");
            }
            ("stdin".to_owned(), raw)
        }
        Some(file) => match std::fs::read_to_string(file) {
            Ok(raw) => (file.to_owned(), raw),
            Err(e) => usage!("--input @{file}: cannot read the file: {e}"),
        },
        None => ("--input".to_owned(), text.to_owned()),
    };
    match serde_json::from_str(&raw) {
        Ok(value) => Ok(value),
        Err(e) => usage!("{source}: not valid JSON: {e}"),
    }
}

/// A duration flag as milliseconds (`30s`, `250ms`, `2m`; `0` allowed).
fn hint(flag: &str, value: Option<&str>) -> anyhow::Result<Option<u64>> {
    let Some(value) = value else {
        return Ok(None);
    };
    match parse_duration(value) {
        Ok(ms) if ms >= 0 => Ok(Some(ms as u64)),
        Ok(_) => usage!("{flag}: {value:?} is negative"),
        Err(e) => usage!("{flag}: {e}"),
    }
}

/// The servers a tool needs: `SERVER__TOOL`'s server, or with `prefix = false` the one server.
/// A name no server's prefix matches may still be a mistyped tool of any of them: then every
/// server is started (`Needed::All`), so that the unknown-tool answer can list their tools.
fn needed_servers(stack: &Stack, tool: &str) -> Needed {
    let enabled: Vec<String> = stack
        .enabled_servers()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    if tool == toolwarden_core::config::EXEC_TOOL {
        return Needed::Named(Vec::new());
    }
    if !stack.config.prefixed() {
        return Needed::Named(enabled);
    }
    match tool.split_once(toolwarden_core::PREFIX_SEPARATOR) {
        Some((server, _)) if enabled.iter().any(|s| s == server) => {
            Needed::Named(vec![server.to_owned()])
        }
        _ => Needed::All(enabled),
    }
}

/// Which servers a local call starts.
enum Needed {
    /// The tool's own server(s): one that fails to start fails the call.
    Named(Vec<String>),
    /// Every server, only to know their tools: one that fails to start is a warning.
    All(Vec<String>),
}

/// Runs the call in a local engine. Returns its result (if it arrived) and the signal that
/// interrupted it, if one did.
async fn local(
    config: toolwarden_core::Config,
    call: ToolCall,
    args: &CallArgs,
    interactive: bool,
    signals: &mut Signals,
) -> anyhow::Result<(Option<Arc<CallResult>>, Option<StopSignal>)> {
    let principal = stack::cli_principal(&config, args.principal.as_deref())?;
    if !principal.may(Scope::Call) {
        usage!(
            "principal {:?} lacks scope `call` (its [[auth.tokens]] entry's scopes), which it needs to call tools",
            &*principal.name
        );
    }
    // Answering at the terminal is answering as this principal: without `approve`, approvals
    // fail fast as they do headless.
    let interactive = interactive && principal.may(Scope::Approve);
    let mut stack = Stack::build(config, !interactive, stack::RecordCalls::Yes)
        .map_err(|e| stack::trail_in_use(e, "stop it, run the call through it (`call --url`), or give this one its own [store] path"))?;
    let needed = needed_servers(&stack, &call.name);
    let (Needed::Named(names) | Needed::All(names)) = &needed;
    stack
        .start_servers(|name| names.iter().any(|n| n == name))
        .await;
    let ready = tokio::select! {
        ready = stack.wait_ready() => ready,
        stop = signals.recv() => {
            stack.shutdown().await;
            say!("error: interrupted while the servers started");
            return Ok((None, Some(stop)));
        }
    };
    let failed: Vec<String> = ready
        .into_iter()
        .filter_map(|(_, r)| r.err().map(|e| e.to_string()))
        .collect();
    if matches!(needed, Needed::All(_)) {
        for failure in &failed {
            say!("warning: {failure}");
        }
    } else if !failed.is_empty() {
        stack.shutdown().await;
        anyhow::bail!("{}", failed.join("; "));
    }

    let progress = ProgressLine::start(&call.name);
    if interactive {
        prompt::attach(stack.engine.interactions(), &progress);
    }
    let req = TurnRequest {
        principal,
        session_id: args.session.clone().map(SessionId::from),
        calls: vec![call],
        ..TurnRequest::default()
    };
    let handle = match stack.engine.start_turn(req) {
        Ok(handle) => handle,
        Err(e) => {
            progress.finish();
            stack.shutdown().await;
            anyhow::bail!("{e}");
        }
    };
    let turn_id = handle.turn_id().clone();
    let watcher = tokio::spawn(watch_local(
        stack.engine.clone(),
        turn_id.clone(),
        progress.clone(),
    ));
    let finish = handle.finish();
    tokio::pin!(finish);
    let (output, stop) = tokio::select! {
        out = &mut finish => (Some(out), None),
        stop = signals.recv() => {
            let reason = match stop {
                StopSignal::Interrupt => CancelReason::User,
                StopSignal::Terminate => CancelReason::Shutdown,
            };
            let _ = stack.engine.abort_turn(&turn_id, reason);
            let out = tokio::select! {
                out = tokio::time::timeout(OUTCOME_AFTER_ABORT, &mut finish) => out.ok(),
                again = signals.recv() => {
                    progress.finish();
                    std::process::exit(again.exit_code());
                }
            };
            (out, Some(stop))
        }
    };
    watcher.abort();
    progress.finish();
    let result = output.and_then(|mut out| out.results.pop());
    // Stopping the work (a cancelled or timed-out call's process group) finishes here; a second
    // signal skips the wait.
    tokio::select! {
        _ = stack.shutdown() => {}
        again = signals.recv() => std::process::exit(again.exit_code()),
    }
    Ok((result, stop))
}

/// Feeds the progress line from the engine's view of the running turn.
async fn watch_local(engine: Engine, turn_id: TurnId, progress: ProgressLine) {
    let mut tick = tokio::time::interval(POLL);
    loop {
        tick.tick().await;
        let turns = engine.active_turns();
        let Some(call) = turns
            .iter()
            .find(|t| t.turn_id == turn_id)
            .and_then(|t| t.calls.first())
        else {
            continue;
        };
        progress.set_phase(crate::client::snake(&call.state));
        if let Some(p) = &call.progress {
            progress.set_progress(p.clone());
        }
    }
}

/// Runs the call on a running server (`POST /v1/turns` as an event stream).
async fn remote(
    api: &Api,
    call: ToolCall,
    args: &CallArgs,
    interactive: bool,
    signals: &mut Signals,
) -> anyhow::Result<(Option<Arc<CallResult>>, Option<StopSignal>)> {
    let mut block =
        json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.input});
    if let Some(ms) = call.timeout_ms {
        block["timeout_ms"] = json!(ms);
    }
    if let Some(ms) = call.idle_timeout_ms {
        block["idle_timeout_ms"] = json!(ms);
    }
    let mut body = json!({"calls": [block]});
    if let Some(session) = &args.session {
        body["session_id"] = json!(session);
    }
    let resp = api
        .send(
            api.request(Method::POST, "/v1/turns")
                .header(reqwest::header::ACCEPT, "text/event-stream")
                .json(&body),
        )
        .await?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        anyhow::bail!("{}", api.refusal(status, &body));
    }

    let progress = ProgressLine::start(&call.name);
    let mut stream = SseEvents::new(resp);
    let mut turn_id: Option<TurnId> = None;
    let mut result: Option<Arc<CallResult>> = None;
    let mut stop: Option<StopSignal> = None;
    // The question being asked at the terminal, closed when the server says it is settled.
    let mut asking: Option<(String, CancellationToken)> = None;
    let deadline = tokio::time::sleep(Duration::MAX);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            next = stream.next() => {
                let event = match next {
                    Some(Ok(event)) => event,
                    Some(Err(e)) => {
                        progress.finish();
                        return Err(e);
                    }
                    None => break,
                };
                if turn_id.is_none() {
                    turn_id = event.scope.turn_id.clone();
                }
                match event.kind {
                    EventKind::ToolProgress { progress: info, .. } => {
                        progress.set_phase("running");
                        progress.set_progress(info);
                    }
                    EventKind::ToolStart { .. } => progress.set_phase("running"),
                    EventKind::InteractionRequested { interaction } => {
                        progress.set_phase("awaiting_approval");
                        if interactive {
                            let gone = CancellationToken::new();
                            asking = Some((interaction.id.to_string(), gone.clone()));
                            spawn_remote_prompt(api, *interaction, progress.clone(), gone);
                        } else {
                            // Nobody here can answer: say who can, and until when.
                            progress.note(&where_to_answer(api, &interaction, args.headless));
                        }
                    }
                    EventKind::InteractionAnswered { interaction_id, .. }
                    | EventKind::InteractionTimedOut { interaction_id, .. } => {
                        if let Some((id, gone)) = &asking
                            && id == interaction_id.as_str()
                        {
                            gone.cancel();
                        }
                    }
                    EventKind::ToolResult { result: r, .. } => result = Some(r),
                    EventKind::TurnEnd { .. } => break,
                    _ => {}
                }
            }
            got = signals.recv() => {
                if stop.is_some() {
                    progress.finish();
                    std::process::exit(got.exit_code());
                }
                stop = Some(got);
                match &turn_id {
                    Some(turn) => {
                        let path = format!("/v1/turns/{}/abort", segment(turn.as_str()));
                        let _ = api.send(api.request(Method::POST, &path)).await;
                    }
                    // Not started yet: closing the stream aborts it.
                    None => break,
                }
                deadline.as_mut().reset(tokio::time::Instant::now() + OUTCOME_AFTER_ABORT);
            }
            () = &mut deadline => break,
        }
    }
    if let Some((_, gone)) = &asking {
        gone.cancel();
    }
    progress.finish();
    Ok((result, stop))
}

/// Where a person answers `interaction` of a call made with `--url` when this terminal cannot.
/// `headless`: asked not to prompt (`--headless`), rather than without a terminal. With a
/// token, the curl names the variable that holds it (never the token).
fn where_to_answer(
    api: &Api,
    interaction: &toolwarden_protocol::Interaction,
    headless: bool,
) -> String {
    let base = api.base();
    let id = segment(interaction.id.as_str());
    let within =
        toolwarden_protocol::format_duration(Duration::from_millis(interaction.timeout_ms));
    let here = if headless {
        "and --headless asks nothing here"
    } else {
        "and this is no terminal to ask on"
    };
    let auth = api
        .token_var()
        .map(|var| format!(" -H \"authorization: Bearer ${var}\""))
        .unwrap_or_default();
    format!(
        "toolwarden: {} needs a person's answer ({}), {here}. \
         Answer it within {within} in the dashboard, {base}/, or with\n  \
         curl -X POST {base}/v1/interactions/{id} -H 'content-type: application/json'{auth} \
         -d '{{\"action\": \"approve\"}}'   (or \"deny\")\n\
         toolwarden: unanswered, it is denied when the time is up.",
        interaction.scope.tool.as_deref().unwrap_or("the call"),
        interaction.kind.as_str(),
    )
}

/// Asks a remote interaction at the terminal and posts the answer.
fn spawn_remote_prompt(
    api: &Api,
    interaction: toolwarden_protocol::Interaction,
    progress: ProgressLine,
    gone: CancellationToken,
) {
    let path = format!("/v1/interactions/{}", segment(interaction.id.as_str()));
    let req = api.request(Method::POST, &path);
    tokio::spawn(async move {
        let pending = || !gone.is_cancelled();
        if let Some(answer) = prompt::ask(&interaction, &progress, pending).await {
            let mut body = json!({"action": answer.action});
            if let Some(reason) = answer.reason {
                body["reason"] = json!(reason);
            }
            // A refusal (a token without `approve`, an answer too late) is said, not dropped:
            // the call would otherwise wait for its deadline in silence.
            match req.json(&body).send().await {
                Ok(resp) if resp.status().is_success() => {}
                Ok(resp) => {
                    let status = resp.status();
                    let body: serde_json::Value = resp.json().await.unwrap_or_default();
                    let message = body["error"]["message"].as_str().unwrap_or("");
                    say!("toolwarden: the server refused the answer ({status}): {message}");
                }
                Err(e) => say!("toolwarden: cannot send the answer: {e}"),
            }
        }
    });
}

/// Server-sent events of a response, parsed into [`Event`]s (`lost` notices and comments are
/// skipped).
struct SseEvents {
    body: futures::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buf: Vec<u8>,
    data: String,
}

impl SseEvents {
    fn new(resp: reqwest::Response) -> Self {
        Self {
            body: resp.bytes_stream().map(|r| r.map(|b| b.to_vec())).boxed(),
            buf: Vec::new(),
            data: String::new(),
        }
    }

    async fn next(&mut self) -> Option<anyhow::Result<Event>> {
        loop {
            while let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches(['\n', '\r']);
                if line.is_empty() {
                    if self.data.is_empty() {
                        continue;
                    }
                    let data = std::mem::take(&mut self.data);
                    let value: Value = match serde_json::from_str(&data) {
                        Ok(v) => v,
                        Err(e) => {
                            return Some(Err(anyhow::anyhow!("a bad event from the server: {e}")));
                        }
                    };
                    if value.get("type").and_then(Value::as_str) == Some("lost") {
                        continue;
                    }
                    return Some(
                        serde_json::from_value(value)
                            .map_err(|e| anyhow::anyhow!("an event of an unexpected shape: {e}")),
                    );
                }
                if let Some(rest) = line.strip_prefix("data:") {
                    if !self.data.is_empty() {
                        self.data.push('\n');
                    }
                    self.data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
                }
            }
            match self.body.next().await? {
                Ok(chunk) => self.buf.extend_from_slice(&chunk),
                Err(e) => return Some(Err(anyhow::anyhow!("the event stream broke: {e}"))),
            }
        }
    }
}

/// The result on stdout: its text (other blocks as JSON lines), or the whole result as JSON.
fn print_result(result: &CallResult, as_json: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if as_json {
        serde_json::to_writer_pretty(&mut out, result)?;
        writeln!(out)?;
    } else {
        for block in &result.content {
            match block.as_text() {
                Some(text) => {
                    out.write_all(text.as_bytes())?;
                    if !text.ends_with('\n') {
                        writeln!(out)?;
                    }
                }
                None => writeln!(out, "{}", block)?,
            }
        }
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_read_like_the_config() {
        assert_eq!(hint("--timeout", Some("30s")).unwrap(), Some(30_000));
        assert_eq!(hint("--timeout", Some("250ms")).unwrap(), Some(250));
        assert_eq!(hint("--timeout", Some("0")).unwrap(), Some(0));
        assert_eq!(hint("--timeout", None).unwrap(), None);
        assert!(hint("--timeout", Some("soon")).is_err());
        assert!(hint("--timeout", Some("-1s")).is_err());
    }

    #[test]
    fn input_is_json() {
        assert_eq!(parse_input("{\"a\": 1}").unwrap(), json!({"a": 1}));
        let err = parse_input("{oops").unwrap_err();
        assert!(err.downcast_ref::<crate::exit::UsageError>().is_some());
    }
}
