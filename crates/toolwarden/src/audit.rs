//! `toolwarden audit`: the audit trail, read straight from its database (read-only, so it works
//! with or without a running `serve`): one line per call for people, one JSON object per call for
//! machines; `--follow` prints calls as they end.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;
use toolwarden_protocol::{AuditCall, AuditQuery, Timestamp, parse_duration};
use toolwarden_store::{RUNNING, TrailReader};

use crate::cli::AuditArgs;
use crate::exit::{Exit, usage};
use crate::signals::Signals;
use crate::stack;
use crate::table::Table;

/// How often `--follow` looks for new events.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

/// The outcome statuses the status filter accepts, and `running` (calls without an outcome yet).
const STATUSES: &[&str] = toolwarden_protocol::STATUS_FILTERS;

pub(crate) async fn run(config_path: Option<&Path>, args: AuditArgs) -> anyhow::Result<Exit> {
    let config = stack::load_config(config_path)?;
    let query = query(&args)?;
    let base = stack::base_dir(&config)?;
    let Some(options) = stack::store_options(&config, &base)? else {
        usage!(
            "{}: the audit trail is off ([store] enabled = false)",
            stack::describe_origin(&config)
        );
    };
    let reader = TrailReader::open(&options)?;
    let mut seen_end = reader.head()?;
    let page = reader.calls(&query)?;
    let mut calls = page.calls;
    // Newest first from the trail; oldest first on the screen.
    calls.reverse();
    let mut printed: HashSet<(String, String)> = HashSet::new();
    let first = if args.json {
        calls
            .iter()
            .map(|c| serde_json::to_string(c).map(|l| l + "\n"))
            .collect::<Result<String, _>>()?
    } else if calls.is_empty() && !args.follow {
        format!(
            "no calls recorded{}\n",
            if filtered(&query) { " that match" } else { "" }
        )
    } else {
        table(&calls, true)
    };
    if !emit(&first) {
        return Ok(Exit::Ok);
    }
    for call in &calls {
        if call.status.is_some() {
            printed.insert(key(call));
        }
    }
    if !args.follow {
        return Ok(Exit::Ok);
    }
    let mut signals = Signals::new().context("cannot install signal handlers")?;
    let mut tick = tokio::time::interval(FOLLOW_EVERY);
    loop {
        tokio::select! {
            _ = signals.recv() => return Ok(Exit::Ok),
            _ = tick.tick() => {}
        }
        let head = reader.head()?;
        if head <= seen_end {
            continue;
        }
        let page = reader.calls(&AuditQuery {
            after: Some(seen_end),
            limit: toolwarden_protocol::AUDIT_MAX_LIMIT,
            cursor: None,
            ..query.clone()
        })?;
        seen_end = head;
        let mut ended: Vec<AuditCall> = page
            .calls
            .into_iter()
            .filter(|c| c.status.is_some() && !printed.contains(&key(c)))
            .collect();
        ended.reverse();
        let mut text = String::new();
        for call in &ended {
            printed.insert(key(call));
            if args.json {
                text.push_str(&serde_json::to_string(call)?);
                text.push('\n');
            }
        }
        if !args.json && !ended.is_empty() {
            text = table(&ended, false);
        }
        if !emit(&text) {
            return Ok(Exit::Ok);
        }
    }
}

/// Writes to stdout; `false` once nobody reads it (`audit | head`), which ends the command.
fn emit(text: &str) -> bool {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}

fn key(call: &AuditCall) -> (String, String) {
    (call.turn_id.to_string(), call.call_id.to_string())
}

fn filtered(q: &AuditQuery) -> bool {
    q.principal.is_some()
        || q.session.is_some()
        || q.turn.is_some()
        || q.call.is_some()
        || q.tool.is_some()
        || q.status.is_some()
        || q.since.is_some()
}

/// The query the flags ask for; a bad value is a usage error naming its flag.
fn query(args: &AuditArgs) -> anyhow::Result<AuditQuery> {
    if let Some(status) = &args.status
        && !STATUSES.contains(&status.as_str())
    {
        usage!(
            "--status: expected one of {}, got {status:?}",
            STATUSES.join(", ")
        );
    }
    let since = match args.since.as_deref() {
        None => None,
        Some(text) => Some(match Timestamp::parse(text) {
            Some(t) => t,
            None => match parse_duration(text) {
                Ok(ms) if ms >= 0 => {
                    Timestamp::from_unix_millis(Timestamp::now().unix_millis() - ms)
                }
                _ => usage!(
                    "--since: expected an RFC 3339 time (2026-11-22T10:00:00Z) or a duration ago (30m, 2h, 7d), got {text:?}"
                ),
            },
        }),
    };
    if args.limit == 0 || args.limit > toolwarden_protocol::AUDIT_MAX_LIMIT {
        usage!(
            "--limit: expected a number from 1 to {}, got {}",
            toolwarden_protocol::AUDIT_MAX_LIMIT,
            args.limit
        );
    }
    if args.principal.as_deref().is_some_and(str::is_empty) {
        usage!("--principal: must not be empty");
    }
    Ok(AuditQuery {
        principal: args.principal.clone(),
        session: args.session.clone().map(Into::into),
        turn: args.turn.clone().map(Into::into),
        call: args.call.clone().map(Into::into),
        tool: args.tool.clone(),
        status: args.status.clone(),
        since,
        limit: args.limit,
        ..AuditQuery::default()
    })
}

/// What a call's outcome says beyond its status: `timeout (idle)`, `denied (loop_detector,
/// loop)`, and its detail.
fn outcome_of(call: &AuditCall) -> (String, String) {
    let Some(status) = &call.status else {
        return (RUNNING.to_owned(), String::new());
    };
    let result: Option<Value> = call
        .events
        .iter()
        .rev()
        .find(|e| e.kind == "tool_result")
        .and_then(|e| serde_json::from_str(e.body.get()).ok());
    let outcome = result.as_ref().map(|r| &r["outcome"]);
    let why: Vec<&str> = ["kind", "reason", "decider"]
        .iter()
        .filter_map(|k| outcome.and_then(|o| o[*k].as_str()))
        .collect();
    let shown = if why.is_empty() {
        status.clone()
    } else {
        format!("{status} ({})", why.join(", "))
    };
    let mut detail = outcome
        .and_then(|o| o["detail"].as_str())
        .unwrap_or_default()
        .replace('\n', " ");
    if detail.chars().count() > 80 {
        detail = detail.chars().take(79).collect::<String>() + "…";
    }
    (shown, detail)
}

/// Calls as a table: when, how long, how it ended, which tool, call, who, turn and session.
fn table(calls: &[AuditCall], header: bool) -> String {
    let mut t = Table::new(&[
        "STARTED",
        "DURATION",
        "STATUS",
        "TOOL",
        "CALL",
        "PRINCIPAL",
        "TURN",
        "SESSION",
        "DETAIL",
    ]);
    for call in calls {
        let (status, detail) = outcome_of(call);
        let started = call.started_at.to_string();
        t.row(vec![
            started.replace('T', " ").trim_end_matches('Z').to_owned(),
            call.duration_ms
                .map(|ms| toolwarden_protocol::format_duration(Duration::from_millis(ms)))
                .unwrap_or_else(|| "-".to_owned()),
            status,
            call.tool.clone().unwrap_or_default(),
            call.call_id.to_string(),
            call.principal.clone(),
            call.turn_id.to_string(),
            call.session_id
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            detail,
        ]);
    }
    let text = t.render();
    if header {
        text
    } else {
        text.lines().skip(1).map(|l| format!("{l}\n")).collect()
    }
}
